# prismd records each job's binary trace; GET /v1/jobs/{job}/trace and `prismctl trace` download it;
# `prismctl replay` of it prints prismd's own telemetry (issue 16 items 3 and 4): grpcio agents
# against the real prismd, across a kill -9 restart.
add_test(NAME test_trace_record COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_trace_record.py)
set_tests_properties(test_trace_record PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)
