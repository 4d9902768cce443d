# prism.torch's DDP communication hook (issue 16 item 1): gloo ranks on loopback against the C
# collectives' MPI all-reduce on the same inputs, byte for byte (coll_allreduce_files, run by the
# test under mpirun), the error against an FP64 all-reduce, map mode, wire byte counts, and a real
# DDP model trained with the hook (tests/python/test_torch_ddp.py, one ctest per world size).
add_executable(coll_allreduce_files unit/coll_allreduce_files.c)
target_link_libraries(coll_allreduce_files PRIVATE prism_coll_mpi MPI::MPI_C)
if(PRISM_PYTHON_TESTS)
  foreach(np 2 3 4)
    add_test(NAME test_torch_ddp_${np}
      COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_ddp.py --ranks ${np})
    set_tests_properties(test_torch_ddp_${np} PROPERTIES
      ENVIRONMENT "${PRISM_PY_TEST_ENV};${PRISM_MPI_TEST_ENV};PRISM_COLL_FILES=$<TARGET_FILE:coll_allreduce_files>;MPIEXEC=${MPIEXEC_EXECUTABLE}"
      REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:coll_allreduce_files>" TIMEOUT 600)
  endforeach()
endif()
