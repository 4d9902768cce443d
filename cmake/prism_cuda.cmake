# How a target's .cu sources are compiled: by nvcc (the CUDA language, flags in each target's
# CMakeLists), or in an emulated build (-DPRISM_CUDAEMU=ON) by the C++ compiler against the
# device emulation of cudaemu/ (cudaemu/README.md). Every target with .cu sources calls
# prism_cuda_target(TARGET) in the directory that defines it, after its sources are known.
#   HW_FP8  the kernels take the sm_89+ FP8 conversion path (common.cuh's PRISM_CUDA_HW_FP8), as
#           nvcc's sm_89 and sm_90 code does; emulated builds otherwise take the software one.
function(prism_cuda_target target)
  cmake_parse_arguments(P "HW_FP8" "" "" ${ARGN})
  if(NOT PRISM_CUDAEMU)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  foreach(src ${sources})
    if(src MATCHES "\\.cu$")
      set_source_files_properties(${src} PROPERTIES LANGUAGE CXX)
    endif()
  endforeach()
  # As nvcc is told -fmad=false: no a*b+c contracted into a fused multiply-add. C++17 as the
  # CUDA targets ask; #pragma unroll is nvcc's and means nothing to g++.
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:-std=c++17;-ffp-contract=off;-Wall;-Wextra;-Wshadow;-Wformat=2;-Wno-unknown-pragmas>")
  if(PRISM_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Werror>")
  endif()
  if(P_HW_FP8)
    target_compile_definitions(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:PRISM_CUDA_HW_FP8=1>")
  endif()
  target_link_libraries(${target} PUBLIC prism_cudaemu)
endfunction()
