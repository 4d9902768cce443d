# Quantization with caller-given scales, its saturation and underflow counts and the delayed
# scale (issue 17, item 3): the CPU definitions and every CPU path against the reference.
prism_test(test_kernels_scaled SOURCES unit/test_kernels_scaled.c LIBS prism_kernels_cpu)
target_include_directories(test_kernels_scaled PRIVATE ${PROJECT_SOURCE_DIR}/kernels)

# The Python binding of the three functions (python/prism/kernels.py), exact values.
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_python_kernels_scaled
    COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_kernels_scaled.py)
  set_tests_properties(test_python_kernels_scaled PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 300)
endif()

# prism-bench scales' command line and one tiny run whose lines name the format, the mode, the
# GB/s, the copy ratio, the error against current's and the fractions (not its timings).
if(PRISM_BENCH)
  add_test(NAME prism_bench_scales_help COMMAND prism-bench scales --help)
  set_tests_properties(prism_bench_scales_help PROPERTIES PASS_REGULAR_EXPRESSION "usage: prism-bench scales")
  add_test(NAME prism_bench_scales_bad_option COMMAND prism-bench scales --steps 1)
  set_tests_properties(prism_bench_scales_bad_option PROPERTIES
    PASS_REGULAR_EXPRESSION "--steps: '1' is not an integer from 2 to 1000000")
  add_test(NAME prism_bench_scales_tiny
    COMMAND prism-bench scales --size 1 --steps 8 --format fp8_e4m3 --seconds 0.01)
  set_tests_properties(prism_bench_scales_tiny PROPERTIES PASS_REGULAR_EXPRESSION
    "cpu +fp8_e4m3 +static +1 MiB +[0-9.]+ us +[0-9.]+ GB/s +copy +[0-9.]+ GB/s +ratio +[0-9.]+ +relerr [0-9.e+-]+ +vs current +[0-9.]+ +saturated [0-9.e+-]+ +underflowed [0-9.e+-]+")
endif()

# The CUDA kernels of the same (prism_quantize_scaled_cuda, prism_quantize_counted_cuda) against
# the CPU, bit for bit; on the device emulation as test_kernels_cuda is, and skipped without a GPU.
if(PRISM_HAVE_CUDA)
  prism_test(test_kernels_scaled_cuda SOURCES unit/test_kernels_scaled_cuda.c LIBS prism_cuda prism_kernels_cpu)
  set_tests_properties(test_kernels_scaled_cuda PROPERTIES
    SKIP_REGULAR_EXPRESSION "SKIPPED: no CUDA device" LABELS cuda)
  if(PRISM_CUDAEMU)
    target_compile_definitions(test_kernels_scaled_cuda PRIVATE TEST_BIG_LEN=${PRISM_EMU_BIG_LEN})
    if(PRISM_TSAN)
      target_compile_definitions(test_kernels_scaled_cuda PRIVATE TEST_CASE_STRIDE=7)
    endif()
    # As sm_75 to sm_86 run the kernels (the software FP8 conversion).
    prism_test(test_kernels_scaled_cuda_sm80 SOURCES unit/test_kernels_scaled_cuda.c
      LIBS prism_cuda_sm80 prism_kernels_cpu)
    target_compile_definitions(test_kernels_scaled_cuda_sm80 PRIVATE TEST_BIG_LEN=${PRISM_EMU_BIG_LEN}
      TEST_CASE_STRIDE=7)
    set_property(TEST test_kernels_scaled_cuda_sm80 APPEND PROPERTY ENVIRONMENT "PRISM_CUDAEMU_CC=8.0")
    set_tests_properties(test_kernels_scaled_cuda_sm80 PROPERTIES LABELS cuda)
  endif()
endif()
