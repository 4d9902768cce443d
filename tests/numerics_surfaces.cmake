# Where users see the numerics state of issue 17 (DESIGN 4.7): prismd's store keeps it, REST,
# /metrics, prismctl blocks and the dashboard show it.
#   test_store_numerics   W, holds, counters, candidates and saturation figures saved and restored
#                         exactly; a row written before issue 17 still loads; damaged blobs refused
prism_test(test_store_numerics SOURCES unit/test_store_numerics.c LIBS prism_store)
