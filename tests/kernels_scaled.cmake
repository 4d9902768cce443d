# Quantization with caller-given scales, its saturation and underflow counts and the delayed
# scale (issue 17, item 3): the CPU definitions and every CPU path against the reference.
prism_test(test_kernels_scaled SOURCES unit/test_kernels_scaled.c LIBS prism_kernels_cpu)
target_include_directories(test_kernels_scaled PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
