/* Shared helpers for Prism's CUnit tests: a table-driven runner, running a real binary and
 * capturing what it prints, and scratch files. */
#ifndef PRISM_TESTUTIL_H
#define PRISM_TESTUTIL_H

#include <CUnit/CUnit.h>
#include <stddef.h>

typedef struct prism_test_case {
    const char *name;
    void (*fn)(void);
} prism_test_case;

typedef struct prism_test_suite {
    const char *name;
    const prism_test_case *cases; /* terminated by {NULL, NULL} */
} prism_test_suite;

/* Registers the suites (terminated by {NULL, NULL}), runs them verbosely and returns the
 * process exit status: 0 when every assertion passed. A first argument selects one test by
 * name. */
int prism_test_main(int argc, char **argv, const prism_test_suite *suites);

typedef struct prism_proc_result {
    int exit_code;   /* exit status, or 128 + signal */
    char *out;       /* everything written to stdout, NUL-terminated */
    size_t out_len;
    char *err;       /* everything written to stderr, NUL-terminated */
    size_t err_len;
} prism_proc_result;

/* Runs argv[0] (a path) with argv, feeding stdin_text (may be NULL) and collecting stdout and
 * stderr; gives up and kills the child after timeout_s seconds. Returns 0 on success. */
int prism_run_process(char *const argv[], const char *stdin_text, int timeout_s,
                      prism_proc_result *res);
void prism_proc_result_free(prism_proc_result *res);

/* Path of a built binary: $PRISM_BUILD_DIR/name (falls back to ./name). Static buffer. */
const char *prism_build_path(const char *name);

/* A fresh scratch directory under /tmp, removed by prism_scratch_cleanup. Static buffer. */
const char *prism_scratch_dir(void);
void prism_scratch_cleanup(void);

/* Writes text to dir/name and returns the full path (static buffer, overwritten per call). */
const char *prism_write_file(const char *dir, const char *name, const char *text);

/* Reads a whole file; NULL if it cannot. Caller frees. */
char *prism_read_file(const char *path, size_t *len);

#endif
