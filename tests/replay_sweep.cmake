# Replay of recorded runs (issue 16, items 4 and 5): `prismctl replay` of binary traces, the
# one-pass JSONL replay, --sweep and --record.
#   test_replay_binary     binary traces written with the writers prismd uses: equal to the JSONL
#                          replay of the same steps, configs/headers/version bumps applied as
#                          prismd applied them, every bad record named by number and byte
prism_test(test_replay_binary SOURCES integration/test_replay_binary.c LIBS prism_trace_bin)
add_dependencies(test_replay_binary prismctl)
#   test_number_text       prism_buf_append_double (the telemetry records' numbers, made faster for
#                          replay) writes exactly what the plain %.15g/%.16g/%.17g search writes
prism_test(test_number_text SOURCES unit/test_number_text.c LIBS prism_policy)
#   test_replay_sweep      --sweep: each line equal to a separate replay of its config, a table of
#                          exact values, every bad argument named; --record's round trip
prism_test(test_replay_sweep SOURCES integration/test_replay_sweep.c LIBS prism_policy)
add_dependencies(test_replay_sweep prismctl)
#   test_replay_parse      the fast path for JSONL step lines against the strict parser: the same
#                          records bit for bit, every error left to the strict parser
prism_test(test_replay_parse SOURCES unit/test_replay_parse.c ${PROJECT_SOURCE_DIR}/service/prismctl/replay_load.c
           LIBS prism_trace_bin)
target_include_directories(test_replay_parse PRIVATE ${PROJECT_SOURCE_DIR}/service/prismctl)
#   test_replay_reference  bench/bench_replay.sh's three replays (the plain-Python reference,
#                          prismctl on JSONL, prismctl on binary) print the same records on a
#                          small trace of the benchmark's kind
add_test(NAME test_replay_reference COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_replay_reference.py)
set_tests_properties(test_replay_reference PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300
  REQUIRED_FILES "$<TARGET_FILE:prismctl>")
