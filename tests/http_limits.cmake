# prismd's HTTP limits and input handling (issue 12, items 1, 9 and 10): the real prismd, raw
# sockets on loopback (attackers from 127.0.0.2, probes from 127.0.0.1).
add_test(NAME test_http_limits COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_http_limits.py)
set_tests_properties(test_http_limits PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 600
                     REQUIRED_FILES "$<TARGET_FILE:prismd>")
add_test(NAME test_http_input COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_http_input.py)
set_tests_properties(test_http_input PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 300
                     REQUIRED_FILES "$<TARGET_FILE:prismd>")
