# The numerics rules of the policy (issue 17, DESIGN 4.7): loss-spike rollback, a low format per
# block, the saturation rule; every expected value worked out by hand.
#   test_policy_numerics   the rules, table-driven, on the policy core alone
prism_test(test_policy_numerics SOURCES unit/test_policy_numerics.c LIBS prism_policy)
#   test_numerics_prismd   prismd's wiring: NaN losses left out, a spike's rollback at a decision of
#                          its own on every rank, saturation figures reaching the policy
add_test(NAME test_numerics_prismd COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_numerics_prismd.py)
set_tests_properties(test_numerics_prismd PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)
