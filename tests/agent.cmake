# prism-agent with real processes: test_agent (its command line, bad frames on its socket, backoff
# while prismd is unreachable, /metrics, SIGTERM, the hint table kept across its restart) and
# test_agents (prismd, 4 agents and 4 PyTorch trainers together; prismd and an agent killed
# mid-run). Both drive the trainer's side through the Python binding of libprism, so they run
# with PRISM_PY_TEST_ENV, as test_python_kernels does.
set(PRISM_AGENT_TEST_ENV ${PRISM_PY_TEST_ENV} "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}"
  "PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_agent COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_agent.py)
  set_tests_properties(test_agent PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 300
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
# Four trainers with torch and gloo: a minute of wall time, so only in the plain build (the
# sanitizer build runs the same agent code through test_agent).
if(NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  add_test(NAME test_agents COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_agents.py)
  set_tests_properties(test_agents PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 600
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
# Hybrid devices end to end (issue 15): prismd, 4 agents with --profile-file (2 fast, 2 slow) and
# 4 demo trainers with --hybrid; plain build only, like test_agents.
if(PRISM_PYTHON_TESTS AND NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  add_test(NAME test_hybrid_cluster COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_hybrid_cluster.py)
  set_tests_properties(test_hybrid_cluster PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 600
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
