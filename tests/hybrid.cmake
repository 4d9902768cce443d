# Hybrid devices (issue 15, items 1, 2 and 5): the model of service/policy/hybrid.c and
# `prismctl plan`.
#   test_hybrid            every formula and rule of the model, table-driven, exact values
#                          worked out by hand (powers of two)
#   test_prismctl_plan     the real prismctl on real files: a worked example compared whole, the
#                          start that does not fit, and every bad PLAN.json key
prism_test(test_hybrid SOURCES unit/test_hybrid.c LIBS prism_policy)
add_test(NAME test_prismctl_plan COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_prismctl_plan.py)
set_tests_properties(test_prismctl_plan PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300
  REQUIRED_FILES "$<TARGET_FILE:prismctl>")
