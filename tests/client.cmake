# tests of client/: SHA-256 against the FIPS examples, the hint table (files, slots, the
# seqlock under a concurrent writer), and the libprism client against a test that plays the agent
# with a real Unix socket and a real hint table.
prism_test(test_sha256 SOURCES unit/test_sha256.c LIBS prism_client)
prism_test(test_hints SOURCES unit/test_hints.c LIBS prism_hints Threads::Threads)
prism_test(test_client SOURCES unit/test_client.c LIBS prism_client prism_hints prism_proto prism_kernels_cpu)
if(PRISM_HAVE_CUDA)
  # prism_client_report_step_cuda, in the same test (the case checks nothing without a GPU).
  target_compile_definitions(test_client PRIVATE PRISM_TEST_CUDA)
  target_link_libraries(test_client PRIVATE prism_cuda CUDA::cudart)
  if(PRISM_CUDAEMU) # its CUDA cases run there (on a GPU-less nvcc build they check nothing)
    set_tests_properties(test_client PROPERTIES LABELS cuda)
    # A failed calloc and a failed cudaGetDevice, made certain for one case (test_client.c's
    # __wrap_ functions pass every other call through).
    target_link_options(test_client PRIVATE "LINKER:--wrap=calloc,--wrap=cudaGetDevice")
  endif()
endif()

# The client from Python (python/prism/client.py) against a test that plays the agent.
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_python_client COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_client.py)
  set_tests_properties(test_python_client PROPERTIES
    ENVIRONMENT "${PRISM_PY_TEST_ENV};PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 300)
endif()
