# Quantized all-reduce and reduce-scatter (DESIGN 10, include/prism/collectives.h). prism_coll is
# the core (collectives.c): layout, wire, headers, the order of the sums, and the host memory
# space with the CPU kernels. Two backends behind its table: prism_coll_mpi (host memory, MPI),
# and prism_coll_nccl (device memory, the CUDA kernels and NCCL) when the toolkit and NCCL are
# there. None of them is in libprism.so (lib/) yet; all are position-independent
# (CMAKE_POSITION_INDEPENDENT_CODE), so lib/ can take them whole.
add_library(prism_coll STATIC ${CMAKE_CURRENT_SOURCE_DIR}/collectives.c)
target_include_directories(prism_coll PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(prism_coll PUBLIC prism_kernels_cpu prism_common)

find_package(MPI REQUIRED COMPONENTS C)
add_library(prism_coll_mpi STATIC ${CMAKE_CURRENT_SOURCE_DIR}/collectives_mpi.c)
target_link_libraries(prism_coll_mpi PUBLIC prism_coll MPI::MPI_C)

set(PRISM_HAVE_NCCL OFF)
if(PRISM_HAVE_CUDA)
  find_library(PRISM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(PRISM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(PRISM_NCCL_LIBRARY AND PRISM_NCCL_INCLUDE_DIR)
    set(PRISM_HAVE_NCCL ON)
    add_library(prism_coll_nccl STATIC ${CMAKE_CURRENT_SOURCE_DIR}/collectives_nccl.cu)
    target_include_directories(prism_coll_nccl SYSTEM PUBLIC ${PRISM_NCCL_INCLUDE_DIR})
    target_link_libraries(prism_coll_nccl PUBLIC prism_coll prism_cuda CUDA::cudart ${PRISM_NCCL_LIBRARY})
    set_target_properties(prism_coll_nccl PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    # As kernels/CMakeLists.txt compiles its .cu files: IEEE arithmetic spelled out (the AVG
    # division must be the CPU's correctly rounded one), the host compiler's warnings, and
    # warnings as errors.
    target_compile_options(prism_coll_nccl PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:-fmad=false;-prec-div=true;-prec-sqrt=true;-ftz=false>"
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow,-Wformat=2>)
    if(PRISM_WERROR)
      target_compile_options(prism_coll_nccl PRIVATE
        "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
    endif()
  endif()
endif()
message(STATUS "prism: collectives MPI ON, NCCL ${PRISM_HAVE_NCCL}")
