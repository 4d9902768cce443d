/* prismctl's commands; each returns the process exit status (0 ok, 1 failure, 2 bad input). */
#ifndef PRISMCTL_H
#define PRISMCTL_H

int prismctl_replay(int argc, char **argv);

/* plan: the hybrid-devices model of issue 15 over a PLAN.json (service/policy/hybrid.h). */
int prismctl_plan(int argc, char **argv);

/* jobs, blocks, config, overrides: REST commands against a prismd (argv[0] is the command). */
int prismctl_rest(int argc, char **argv);

/* trace: download a job's binary trace (GET /v1/jobs/JOB/trace) to a file or stdout. */
int prismctl_trace(int argc, char **argv);

#endif
