# What the trainer sees, exported (issue 14, item 1): the counters libprism publishes in the hint
# table's trainer line and prism-agent's prism_agent_trainer_* families.
#   test_trainer_line     in process: the line's layout and its compatibility with older trainers,
#                         the apply lag's bucket edges, drops by reason, apply lag and transfers as
#                         the client publishes them
prism_test(test_trainer_line SOURCES unit/test_trainer_line.c
           LIBS prism_client prism_hints prism_transfer prism_proto prism_kernels_cpu)
#   test_trainer_metrics  real processes: prismd, two prism-agents and a C trainer linked with
#                         libprism's client, block transfer and MPI collectives under mpirun -np 2
#                         (trainer_metrics_trainer.c, driven one command at a time over loopback);
#                         every prism_agent_trainer_* family of the second agent's /metrics, exact
add_executable(trainer_metrics_trainer integration/trainer_metrics_trainer.c)
target_link_libraries(trainer_metrics_trainer PRIVATE prism_client prism_hints prism_transfer prism_coll_mpi
  MPI::MPI_C)
add_test(NAME test_trainer_metrics COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_trainer_metrics.py)
# PRISM_MPI_TEST_ENV: collectives.cmake's (Open MPI as root, oversubscribed, vader without
# single copy; LeakSanitizer's suppressions of Open MPI in the sanitizer build).
set_tests_properties(test_trainer_metrics PROPERTIES TIMEOUT 300
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR};PRISM_MPIEXEC=${MPIEXEC_EXECUTABLE};PRISM_MPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG};PRISM_TRAINER_METRICS_TRAINER=$<TARGET_FILE:trainer_metrics_trainer>;${PRISM_MPI_TEST_ENV}"
  REQUIRED_FILES "$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>;$<TARGET_FILE:trainer_metrics_trainer>")
