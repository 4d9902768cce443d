# Tests of the quantized collectives (collectives/, include/prism/collectives*.h):
#   test_collectives         one process: the layout, the checks, the bytes of the wire and the
#                            header checks, through a transport of its own (collectives/ internals)
#   test_collectives_mpi_N   the MPI backend under mpirun with N = 2, 3, 4 ranks: every format,
#                            op, dtype, size and adversarial content against an FP64 reference and
#                            an exact model of the algorithm, bit-identical results on all ranks
#   test_collectives_nccl_N  the NCCL backend with N = 1 to 4 ranks (threads, a GPU each) against
#                            the MPI backend on N ranks, byte for byte (it skips without N devices)
prism_test(test_collectives SOURCES unit/test_collectives.c LIBS prism_coll)
target_include_directories(test_collectives PRIVATE ${PROJECT_SOURCE_DIR}/collectives)

find_package(MPI REQUIRED COMPONENTS C)
add_executable(test_collectives_mpi unit/test_collectives_mpi.c)
target_link_libraries(test_collectives_mpi PRIVATE prism_coll_mpi MPI::MPI_C m)

# Open MPI refuses to run as root, and more ranks than cores, unless told; shared memory
# (vader) with its single-copy mechanism off, since containers often forbid the
# process_vm_readv it uses, and TCP as the fallback. Other MPIs ignore these variables.
set(PRISM_MPI_TEST_ENV
  "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  "OMPI_MCA_rmaps_base_oversubscribe=1" "OMPI_MCA_btl=self,vader,tcp"
  "OMPI_MCA_btl_vader_single_copy_mechanism=none")
if(PRISM_SANITIZE)
  # Open MPI keeps memory to the end by design, and unloads its components before exit, after
  # which their allocations have no names. So the test runs LeakSanitizer itself before
  # MPI_Finalize (leak_check_at_exit=0), with Open MPI's libraries suppressed by name (and only
  # those: a leak in Prism or the test is still an error).
  set(PRISM_MPI_LSAN_SUPP ${CMAKE_CURRENT_BINARY_DIR}/collectives_mpi.lsan.supp)
  file(WRITE ${PRISM_MPI_LSAN_SUPP}
    "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libpmix.so\nleak:libhwloc.so\n"
    "leak:libevent\nleak:mca_\nleak:libucp\nleak:libucs\nleak:libfabric\nleak:libibverbs\n")
  list(APPEND PRISM_MPI_TEST_ENV "LSAN_OPTIONS=suppressions=${PRISM_MPI_LSAN_SUPP}:leak_check_at_exit=0")
endif()
foreach(np 2 3 4)
  add_test(NAME test_collectives_mpi_${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:test_collectives_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_collectives_mpi_${np} PROPERTIES ENVIRONMENT "${PRISM_MPI_TEST_ENV}" TIMEOUT 300)
endforeach()

if(TARGET prism_coll_nccl)
  # mpirun -np N: the MPI backend on N processes; rank 0 also runs the NCCL backend with N ranks
  # as threads, one device each, and compares every rank's results byte for byte. With fewer
  # devices than N it says "SKIPPED: needs N CUDA devices".
  add_executable(test_collectives_nccl unit/test_collectives_nccl.c)
  target_link_libraries(test_collectives_nccl PRIVATE prism_testutil prism_coll_nccl prism_coll_mpi prism_cuda
    MPI::MPI_C CUDA::cudart Threads::Threads)
  set(PRISM_NCCL_RANKS 1 2 3 4)
  set(PRISM_NCCL_ENV ${PRISM_MPI_TEST_ENV})
  if(PRISM_TSAN)
    # Smaller under ThreadSanitizer: two ranks and a shorter big tensor; and Open MPI's TCP
    # transport, which takes its own locks in an order TSan reports, is left out.
    set(PRISM_NCCL_RANKS 2)
    target_compile_definitions(test_collectives_nccl PRIVATE TEST_BIG_NUMEL=65541)
    list(TRANSFORM PRISM_NCCL_ENV REPLACE "^OMPI_MCA_btl=.*" "OMPI_MCA_btl=self,vader")
  endif()
  foreach(np ${PRISM_NCCL_RANKS})
    add_test(NAME test_collectives_nccl_${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:test_collectives_nccl> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(test_collectives_nccl_${np} PROPERTIES
      SKIP_REGULAR_EXPRESSION "SKIPPED: needs [0-9]+ CUDA device"
      ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR};${PRISM_NCCL_ENV}"
      TIMEOUT 600 LABELS cuda)
  endforeach()
endif()
