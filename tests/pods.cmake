# The pods are run (issue 14, item 7): prismd's and prism-agent's containers of the Helm chart
# (rendered by tests/deploy/helm_render, tests/helm.cmake) and of the kustomize base run here as
# the built binaries, their probes, ports, Services and the agent's way to prismd checked, and the
# checker shown to catch an unknown flag, a wrong port or path (tests/deploy/test_pods_run.py).
# A trainer on the Python binding says Hello to the agent, so the binding's environment is needed.
# The Dockerfile, checked without building an image (tests/deploy/test_dockerfile.py).
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_pods_run COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_pods_run.py)
  set_tests_properties(test_pods_run PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 600
    REQUIRED_FILES "${CMAKE_BINARY_DIR}/tests/deploy/helm_render;$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
add_test(NAME test_dockerfile COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_dockerfile.py)
set_tests_properties(test_dockerfile PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300
  REQUIRED_FILES "${CMAKE_BINARY_DIR}/tests/deploy/helm_render;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>;$<TARGET_FILE:prismctl>")
