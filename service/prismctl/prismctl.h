/* prismctl's commands; each returns the process exit status (0 ok, 1 failure, 2 bad input). */
#ifndef PRISMCTL_H
#define PRISMCTL_H

#include <stdbool.h>
#include <stddef.h>

int prismctl_replay(int argc, char **argv);

/* plan: the hybrid-devices model of issue 15 over a PLAN.json (service/policy/hybrid.h). */
int prismctl_plan(int argc, char **argv);

/* jobs, blocks, config, overrides: REST commands against a prismd (argv[0] is the command). */
int prismctl_rest(int argc, char **argv);

/* trace: download a job's binary trace (GET /v1/jobs/JOB/trace) to a file or stdout. */
int prismctl_trace(int argc, char **argv);

/* The URL of path (which starts with '/') on server, into out: server's trailing '/'s are
 * dropped, so "http://h:8080/" works as "http://h:8080". Returns what snprintf returns. */
int prismctl_url(char *out, size_t len, const char *server, const char *path);

/* Whether id is a job id prismd accepts (auth.c's prismd_job_id_valid): 1 to 128 letters,
 * digits, '-', '_' or '.', starting with a letter or digit. */
bool prismctl_job_id_valid(const char *id);

#endif
