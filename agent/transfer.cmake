# Block transfer and the Conductor (DESIGN 9): prism_transfer, one API over a CPU backend
# (transfer.c, always) and a CUDA one (transfer_cuda.cu, when the toolkit was found).
add_library(prism_transfer STATIC ${CMAKE_CURRENT_SOURCE_DIR}/transfer.c
  ${CMAKE_CURRENT_SOURCE_DIR}/conductor.c)
target_include_directories(prism_transfer PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(prism_transfer PUBLIC prism_kernels_cpu prism_common)
if(PRISM_HAVE_CUDA)
  target_sources(prism_transfer PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/transfer_cuda.cu)
  target_compile_definitions(prism_transfer PRIVATE PRISM_TRANSFER_HAVE_CUDA=1)
  target_link_libraries(prism_transfer PUBLIC prism_cuda CUDA::cudart)
  set_target_properties(prism_transfer PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  # As kernels/CMakeLists.txt compiles its .cu files: IEEE arithmetic spelled out (no kernels
  # here, but the flags stay uniform), the host compiler's warnings, and warnings as errors.
  target_compile_options(prism_transfer PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:-fmad=false;-prec-div=true;-prec-sqrt=true;-ftz=false>"
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow,-Wformat=2>)
  if(PRISM_WERROR)
    target_compile_options(prism_transfer PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
endif()
