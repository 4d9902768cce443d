# agent/profile: the DeviceProfile prism-agent measures at start (DESIGN 11). profile.c is the
# whole of it without CUDA (the CPU profile; device >= 0 is PRISM_ERR_UNAVAILABLE); with a
# toolkit, profile_cuda.cu adds the GPU profile (cuBLAS, cuBLASLt, prism_quantize_cuda) and
# PRISM_PROFILE_CUDA tells profile.c it is there.
add_library(prism_profile STATIC ${CMAKE_CURRENT_SOURCE_DIR}/profile.c)
target_include_directories(prism_profile PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(prism_profile PUBLIC prism_kernels_cpu Threads::Threads)
if(PRISM_HAVE_CUDA)
  target_sources(prism_profile PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/profile_cuda.cu)
  target_compile_definitions(prism_profile PRIVATE PRISM_PROFILE_CUDA=1)
  target_link_libraries(prism_profile PUBLIC prism_cuda CUDA::cublas CUDA::cublasLt)
  set_target_properties(prism_profile PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  # As kernels/CMakeLists.txt: the host half gets the C++ warnings that apply, and nvcc's and
  # the host compiler's warnings fail the build like the C ones.
  target_compile_options(prism_profile PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:--threads=0>"
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow,-Wformat=2>)
  if(PRISM_WERROR)
    target_compile_options(prism_profile PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
endif()
