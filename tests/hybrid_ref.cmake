# Issue 15: the independent Python reference of the hybrid-device model (tests/hybrid/plan_ref.py),
# pinned by hand-worked values, and `prismctl plan` compared with it on 300 seeded random PLANs,
# every number to the last bit.
add_test(NAME test_plan_ref_unit COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hybrid/test_plan_ref_unit.py)
set_tests_properties(test_plan_ref_unit PROPERTIES TIMEOUT 60)
add_test(NAME test_plan_differential COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hybrid/test_plan_differential.py)
set_tests_properties(test_plan_differential PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 600)
