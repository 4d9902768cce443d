# prismd's gRPC side and job handling against hostile or careless callers (issue 12): unknown
# methods, step ids past the bound, calibration cache writes of another model, partly applied
# reports, scores and summaries across kill -9. Python grpcio against the real prismd.
add_test(NAME test_grpc_hardening
  COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_grpc_hardening.py)
set_tests_properties(test_grpc_hardening PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 300)
