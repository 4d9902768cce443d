# Quantization with caller-given scales, its saturation and underflow counts and the delayed
# scale (issue 17, item 3): the CPU definitions and every CPU path against the reference.
prism_test(test_kernels_scaled SOURCES unit/test_kernels_scaled.c LIBS prism_kernels_cpu)
target_include_directories(test_kernels_scaled PRIVATE ${PROJECT_SOURCE_DIR}/kernels)

# The Python binding of the three functions (python/prism/kernels.py), exact values.
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_python_kernels_scaled
    COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_kernels_scaled.py)
  set_tests_properties(test_python_kernels_scaled PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 300)
endif()
