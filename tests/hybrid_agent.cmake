# Hybrid devices, the agent's and the trainer's side (issue 15 item 4): the plan file beside the
# hint table and the client's plans, tensor statistics and layout cost figures (test_plans, C,
# the test plays the agent).
prism_test(test_plans SOURCES unit/test_plans.c LIBS prism_client prism_hints prism_proto)
