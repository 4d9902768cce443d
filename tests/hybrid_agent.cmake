# Hybrid devices, the agent's and the trainer's side (issue 15 item 4): the plan file beside the
# hint table and the client's plans, tensor statistics and layout cost figures (test_plans, C,
# the test plays the agent), and prism-agent with --profile-file and compute plans from a fake
# prismd (test_agent_plans, Python grpcio, a real prism-agent, libprism through ctypes, a real
# prismd for the ranks answer).
prism_test(test_plans SOURCES unit/test_plans.c LIBS prism_client prism_hints prism_proto)
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_agent_plans COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_agent_plans.py)
  set_tests_properties(test_agent_plans PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 300
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
