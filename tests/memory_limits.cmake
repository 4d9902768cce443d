# What one client may make prismd hold (issue 12, item 5): RSS under each attack, with a stated
# bound, against the real prismd on loopback.
add_test(NAME test_memory_limits COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_memory_limits.py)
set_tests_properties(test_memory_limits PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 300)

# The telemetry files' rotation and streaming reader, on their own.
prism_test(test_telemetry_files
  SOURCES unit/test_telemetry_files.c ${PROJECT_SOURCE_DIR}/service/prismd/telemetry_files.c)
target_include_directories(test_telemetry_files PRIVATE ${PROJECT_SOURCE_DIR}/service/prismd)
