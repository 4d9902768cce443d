# prismd's /metrics families for dashboards and alerts (issue 14, plan14 "New from prismd"):
# prism_ready, prism_store_write_duration_seconds and the prism_job_* families, exact values
# through a job's life, grpcio agents against the real prismd (promtool checks each answer).
add_test(NAME test_prismd_metrics COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_prismd_metrics.py)
set_tests_properties(test_prismd_metrics PROPERTIES ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 300)
