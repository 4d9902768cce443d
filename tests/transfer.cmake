# Tests of agent/transfer: the Conductor's rules, the CPU backend against the kernels, and the
# CUDA backend against the CPU one (it skips without a device).
prism_test(test_conductor SOURCES unit/test_conductor.c LIBS prism_transfer)
prism_test(test_transfer SOURCES unit/test_transfer.c LIBS prism_transfer)
if(PRISM_HAVE_CUDA)
  prism_test(test_transfer_cuda SOURCES unit/test_transfer_cuda.c LIBS prism_transfer CUDA::cudart)
  set_tests_properties(test_transfer_cuda PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED: no CUDA device")
endif()
