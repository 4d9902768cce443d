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
# wire="map" with maps that differ between ranks (a rank a step late): the ranks agree on each
# bucket's formats, a parameter whose format differs goes unquantized, no hang, no exception
# (tests/python/test_torch_ddp_maps.py).
if(PRISM_PYTHON_TESTS)
  foreach(np 2 4)
    add_test(NAME test_torch_ddp_maps_${np}
      COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_ddp_maps.py --ranks ${np})
    set_tests_properties(test_torch_ddp_maps_${np} PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
      REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 600)
  endforeach()
endif()
# The hook's scale modes (issue 17): current, pow2, delayed, static and the job's, worked out
# step by step with the kernels on one rank; the same bits on every rank of two
# (tests/python/test_torch_ddp_scales.py).
if(PRISM_PYTHON_TESTS)
  add_test(NAME test_torch_ddp_scales COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_ddp_scales.py)
  set_tests_properties(test_torch_ddp_scales PROPERTIES ENVIRONMENT "${PRISM_PY_TEST_ENV}"
    REQUIRED_FILES "$<TARGET_FILE:prism>" TIMEOUT 600)
endif()
