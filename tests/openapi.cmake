# prismd's OpenAPI contract (service/prismd/openapi.json, issue 13): the document and what prismd
# serves from it (test_openapi), and every answer test_prismd received over its raw sockets,
# recorded to a file and checked against the document once test_prismd is done (the Python tests
# check theirs as they go: tests/integration/openapi_check.py). Node.js and web/node_modules are
# needed (scripts/install-deps.sh).
add_test(NAME test_openapi COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_openapi.py)
set_tests_properties(test_openapi PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)

set(PRISM_OPENAPI_ANSWERS ${CMAKE_BINARY_DIR}/test_prismd_answers.jsonl)
set_property(TEST test_prismd APPEND PROPERTY ENVIRONMENT "PRISM_OPENAPI_ANSWERS=${PRISM_OPENAPI_ANSWERS}")
set_tests_properties(test_prismd PROPERTIES FIXTURES_SETUP prismd_answers)
add_test(NAME test_prismd_openapi
  COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/openapi_check.py ${PRISM_OPENAPI_ANSWERS})
set_tests_properties(test_prismd_openapi PROPERTIES FIXTURES_REQUIRED prismd_answers TIMEOUT 120)
