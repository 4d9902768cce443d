# agent/client: the shared-memory hint table (hints.c, the agent writes it, the trainer reads it),
# the local protocol between trainer and agent (local.h, header only), and libprism's client
# (client.c with its SHA-256 for the calibration fingerprint).
#
# Other code includes "hints.h", "local.h" and "sha256.h" through prism_hints (agent/ is its
# public include directory) and "prism/client.h" through prism_client.

add_library(prism_hints STATIC hints.c)
target_include_directories(prism_hints PUBLIC ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(prism_hints PUBLIC prism_common)

add_library(prism_client STATIC client.c sha256.c)
target_include_directories(prism_client PUBLIC ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(prism_client PUBLIC prism_hints prism_proto prism_kernels_cpu prism_common m)
# With CUDA: prism_client_report_step_cuda (include/prism/cuda.h), statistics computed on the GPU
# and reported once the stream got there. A C file that calls the CUDA runtime itself.
if(PRISM_HAVE_CUDA)
  target_sources(prism_client PRIVATE client_cuda.c)
  target_link_libraries(prism_client PUBLIC prism_cuda CUDA::cudart)
endif()
