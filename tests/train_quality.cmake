# The training-quality experiment's smoke test (issue 16 item 2): bench/train_quality/run.py
# --smoke runs every configuration (a tiny model, a handful of steps, 2 DDP ranks with torch and
# gloo; real prismd and prism-agents for the Prism ones) and results.json, the plot and the
# README section are checked. Torch and gloo in many processes: the plain build only, like
# test_agents.
if(PRISM_PYTHON_TESTS AND NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  add_test(NAME test_train_quality COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_train_quality.py)
  set_tests_properties(test_train_quality PROPERTIES
    ENVIRONMENT "${PRISM_PY_TEST_ENV};PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>;$<TARGET_FILE:prismctl>"
    TIMEOUT 300)
endif()
