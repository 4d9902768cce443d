# GET /v1/jobs/{job}/ranks and the rank counts of GET /v1/jobs (issue 13, item 1): grpcio agents
# against the real prismd for the exact documents, and the real prism-agent with a libprism
# client (the Python binding, so PRISM_AGENT_TEST_ENV of agent.cmake) for the trainer counters.
# Without the binding's environment (ThreadSanitizer) the prism-agent part is skipped.
if(PRISM_PYTHON_TESTS)
  set(PRISM_RANKS_TEST_ENV ${PRISM_AGENT_TEST_ENV})
else()
  set(PRISM_RANKS_TEST_ENV "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" "PRISM_RANKS_NO_BINDING=1")
endif()
add_test(NAME test_ranks COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_ranks.py)
set_tests_properties(test_ranks PROPERTIES ENVIRONMENT "${PRISM_RANKS_TEST_ENV}" TIMEOUT 300)

# The rank facts' helpers (lagging, acked_current_map, bounded text), in process.
prism_test(test_rank_facts SOURCES unit/test_rank_facts.c ${PROJECT_SOURCE_DIR}/service/prismd/snapshot.c
           LIBS prism_store Threads::Threads)

# The trainer-side counters libprism publishes in the hint table for prism-agent, in process.
prism_test(test_trainer_counters SOURCES unit/test_trainer_counters.c
           LIBS prism_client prism_hints prism_proto prism_kernels_cpu)
