# What the trainer sees, exported (issue 14, item 1): the counters libprism publishes in the hint
# table's trainer line and prism-agent's prism_agent_trainer_* families.
#   test_trainer_line     in process: the line's layout and its compatibility with older trainers,
#                         the apply lag's bucket edges, drops by reason, apply lag and transfers as
#                         the client publishes them
prism_test(test_trainer_line SOURCES unit/test_trainer_line.c
           LIBS prism_client prism_hints prism_transfer prism_proto prism_kernels_cpu)
