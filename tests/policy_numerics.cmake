# The numerics rules of the policy (issue 17, DESIGN 4.7): loss-spike rollback, a low format per
# block, the saturation rule; every expected value worked out by hand.
#   test_policy_numerics   the rules, table-driven, on the policy core alone
prism_test(test_policy_numerics SOURCES unit/test_policy_numerics.c LIBS prism_policy)
