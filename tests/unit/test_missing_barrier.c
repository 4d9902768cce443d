/* The race detection of the emulated build is real: the finishing kernel of
 * kernels/cuda/relative_error.cu with its first __syncthreads removed (CMake writes that copy into
 * the build directory) must be reported by ThreadSanitizer as a data race in that kernel, and the
 * kernel as written must not. Both run as child processes (relative_error_main.c); registered in
 * the emulated ThreadSanitizer build only, where a race is an error (exit status 66). */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static void run(const char *name, prism_proc_result *r)
{
    char *const argv[] = {(char *)prism_build_path(name), NULL};
    CU_ASSERT_EQUAL_FATAL(prism_run_process(argv, NULL, 240, r), 0);
}

static void test_the_kernel_as_written_has_no_race(void)
{
    prism_proc_result r;
    run("tests/relative_error_main", &r);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    CU_ASSERT_PTR_NULL(strstr(r.err, "ThreadSanitizer"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "relative error "));
    prism_proc_result_free(&r);
}

static void test_a_missing_syncthreads_is_reported_as_a_race_in_the_kernel(void)
{
    prism_proc_result r;
    run("tests/relative_error_missing_barrier", &r);
    CU_ASSERT_EQUAL(r.exit_code, 66);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "WARNING: ThreadSanitizer: data race"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "error_finish_kernel"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "relative_error_missing_barrier.cu"));
    prism_proc_result_free(&r);
}

static const prism_test_case cases[] = {
    {"test_the_kernel_as_written_has_no_race", test_the_kernel_as_written_has_no_race},
    {"test_a_missing_syncthreads_is_reported_as_a_race_in_the_kernel",
     test_a_missing_syncthreads_is_reported_as_a_race_in_the_kernel},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"missing_barrier", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
