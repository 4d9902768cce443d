# Replay of recorded runs (issue 16, items 4 and 5): `prismctl replay` of binary traces, the
# one-pass JSONL replay, --sweep and --record.
#   test_replay_binary     binary traces written with the writers prismd uses: equal to the JSONL
#                          replay of the same steps, configs/headers/version bumps applied as
#                          prismd applied them, every bad record named by number and byte
prism_test(test_replay_binary SOURCES integration/test_replay_binary.c LIBS prism_trace_bin)
add_dependencies(test_replay_binary prismctl)
