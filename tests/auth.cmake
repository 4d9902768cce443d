# prismd's auth model and job lifecycle (issue 12, items 6 and 11): provisioned job tokens,
# DELETE /v1/jobs/JOB, idle expiry, the REST and gRPC auth matrix, a second agent for a rank.
add_test(NAME test_auth COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_auth.py)
set_tests_properties(test_auth PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 300)

# The rule itself, the token loader and the store's side of DELETE and expiry, in process.
prism_test(test_auth_rule SOURCES unit/test_auth_rule.c ${PROJECT_SOURCE_DIR}/service/prismd/auth.c
           LIBS prism_store Threads::Threads)
