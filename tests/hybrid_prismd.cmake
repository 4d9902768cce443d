# Hybrid devices in prismd (issue 15 item 3): per-class compute plans at decisions.
#   test_hybrid_prismd_unit  prism_policy_bump_version and the hybrid_* config keys
#   test_hybrid_store        the job_plan row of prismd's store, and the schema 2 -> 3 migration
#   test_hybrid_prismd       the real prismd with Python grpcio agents of two device classes: the
#                            plan (REST equals `prismctl plan` on the same inputs), pushed with the
#                            map to each class, kept, re-planned, refused, restored, metrics
prism_test(test_hybrid_prismd_unit SOURCES unit/test_hybrid_prismd.c LIBS prism_policy)
prism_test(test_hybrid_store SOURCES unit/test_hybrid_store.c LIBS prism_store)
add_test(NAME test_hybrid_prismd COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_hybrid_prismd.py)
set_tests_properties(test_hybrid_prismd PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300
  REQUIRED_FILES "$<TARGET_FILE:prismd>;$<TARGET_FILE:prismctl>")
