# Tests of transfer/: the Conductor's rules, the CPU backend against the kernels, and the
# CUDA backend against the CPU one (it skips without a device).
prism_test(test_conductor SOURCES unit/test_conductor.c LIBS prism_transfer)
prism_test(test_transfer SOURCES unit/test_transfer.c LIBS prism_transfer)
if(PRISM_HAVE_CUDA)
  prism_test(test_transfer_cuda SOURCES unit/test_transfer_cuda.c LIBS prism_transfer CUDA::cudart)
  set_tests_properties(test_transfer_cuda PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED: no CUDA device"
    LABELS cuda)
endif()

# prism.Transfer from Python: the CPU backend against the kernels (the CUDA case skips without a GPU).
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_python_transfer COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_transfer.py)
  set_tests_properties(test_python_transfer PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 300)
  if(PRISM_CUDAEMU)
    # No torch CUDA here: the CUDA cases get their device memory from the emulated runtime itself.
    set_property(TEST test_python_transfer APPEND PROPERTY ENVIRONMENT "PRISM_CUDART=$<TARGET_FILE:prism_cudaemu>")
    set_tests_properties(test_python_transfer PROPERTIES LABELS cuda)
  endif()
endif()
