# The numerics config on the wire (issue 17, part C1): prismd's Welcome and config pushes reach
# every rank's client state through real prism-agents, calibration of every format under
# low_precision "auto", and the trainer's saturated / underflowed fractions in prismd's binary
# trace (test_numerics_wire: real prismd and agents, libprism through the Python binding).
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_numerics_wire COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_numerics_wire.py)
  set_tests_properties(test_numerics_wire PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 600
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
