# What GET /v1/jobs says of each job's map and last decision, and the server-sent decision event
# (issue 13, plan13 Round 2): grpcio agents against the real prismd, across kill -9 restarts.
add_test(NAME test_jobs_summary COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_jobs_summary.py)
set_tests_properties(test_jobs_summary PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)
