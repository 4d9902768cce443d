# tests of agent/profile: the CPU profile always; the GPU profile where a CUDA device is there
# (its cases say "SKIPPED: no CUDA device" and pass otherwise, while the CPU cases still run).
prism_test(test_profile SOURCES unit/test_profile.c LIBS prism_profile)
if(PRISM_HAVE_CUDA)
  # The test asks the CUDA runtime for the device's memory and compute capability itself.
  target_compile_definitions(test_profile PRIVATE PRISM_TEST_HAVE_CUDA=1)
  target_link_libraries(test_profile PRIVATE CUDA::cudart)
  if(PRISM_CUDAEMU) # its GPU cases run there
    set_tests_properties(test_profile PROPERTIES LABELS cuda)
  endif()
endif()
