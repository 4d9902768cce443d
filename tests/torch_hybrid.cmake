# prism.torch for hybrid devices (issue 15 item 4): cost figures, the low Linear, tensor
# statistics and compute plans without an agent; then through libprism's plan calls, with a test
# that plays the agent and with a real prism-agent under a Python grpcio stand-in for prismd
# (those skip when the loaded libprism lacks prism_client_get_plan).
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_torch_hybrid COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_hybrid.py)
  set_tests_properties(test_torch_hybrid PROPERTIES
    ENVIRONMENT "${PRISM_PY_TEST_ENV};PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>" TIMEOUT 300)
endif()
