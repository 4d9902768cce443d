# The transfer engine's scale modes (issue 17): current, pow2, delayed and static images against
# the kernels, the per-prepare counts and counters, set_scale_mode (CPU backend).
prism_test(test_transfer_scales SOURCES unit/test_transfer_scales.c LIBS prism_transfer)

# prism.Transfer's scale modes from Python: the same against prism.kernels.
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_python_transfer_scales
           COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_transfer_scales.py)
  set_tests_properties(test_python_transfer_scales PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 300)
endif()
