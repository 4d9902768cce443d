# prismd's binary traces when things go wrong (review fixes of issue 16 item 3): GET .../trace never
# answers 200 with a hole and never blocks on what is not a segment file; the writer never overwrites
# a file and marks lost records in the next header; prismctl trace's arguments; --max-streamed-answers.
add_test(NAME test_trace_robust COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_trace_robust.py)
set_tests_properties(test_trace_robust PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)
