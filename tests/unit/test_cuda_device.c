/* Device discovery through prism_cuda. On a machine without a GPU (or driver) the calls must
 * say so with PRISM_ERR_UNAVAILABLE and a message, and the GPU-only checks report themselves
 * as skipped; with a GPU they check what the device says about itself. */
#include "prism/cuda.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

/* Whether this machine has a usable device; asks once. */
static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        prism_error err = {0};
        if (prism_cuda_device_count(&count, &err) != PRISM_OK)
            count = 0;
    }
    return count;
}

static void skip_without_device(void)
{
    printf("(SKIPPED: no CUDA device) ");
}

static void test_device_count_is_positive_or_unavailable_with_message(void)
{
    prism_error err = {0};
    int count = -1;
    prism_status st = prism_cuda_device_count(&count, &err);
    if (st == PRISM_OK) {
        CU_ASSERT(count >= 1);
        return;
    }
    CU_ASSERT_EQUAL(st, PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(err.status, PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(count, 0);
    CU_ASSERT(strlen(err.message) > 0);
    printf("(%s) ", err.message);
}

static void test_device_count_rejects_null_count(void)
{
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_cuda_device_count(NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "prism_cuda_device_count: count is NULL");
}

static void test_device_name_of_device_0_is_not_empty(void)
{
    char name[256];
    prism_error err = {0};
    prism_status st = prism_cuda_device_name(0, name, sizeof name, &err);
    if (device_count() == 0) {
        CU_ASSERT_EQUAL(st, PRISM_ERR_UNAVAILABLE);
        CU_ASSERT(strlen(err.message) > 0);
        CU_ASSERT_STRING_EQUAL(name, "");
        skip_without_device();
        return;
    }
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    CU_ASSERT(strlen(name) > 0);
    printf("(%s) ", name);
}

static void test_device_name_is_cut_to_the_buffer(void)
{
    if (device_count() == 0) {
        skip_without_device();
        return;
    }
    char full[256], cut[4];
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_cuda_device_name(0, full, sizeof full, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_cuda_device_name(0, cut, sizeof cut, &err), PRISM_OK);
    CU_ASSERT_EQUAL(strlen(cut), strlen(full) < 3 ? strlen(full) : 3);
    CU_ASSERT_EQUAL(strncmp(cut, full, 3), 0);
}

static void test_device_name_rejects_bad_arguments(void)
{
    char name[64] = "x";
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_cuda_device_name(0, NULL, 64, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_cuda_device_name(0, name, 0, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(name, "x");
    CU_ASSERT_EQUAL(prism_cuda_device_name(-1, name, sizeof name, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "CUDA device -1 does not exist");
    CU_ASSERT_STRING_EQUAL(name, "");
}

static void test_device_name_past_the_last_device_is_invalid(void)
{
    int count = device_count();
    if (count == 0) {
        skip_without_device();
        return;
    }
    char name[64];
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_cuda_device_name(count, name, sizeof name, &err), PRISM_ERR_INVALID);
    CU_ASSERT(strstr(err.message, "cudaGetDeviceProperties") != NULL);
}

static const prism_test_case device_cases[] = {
    {"test_device_count_is_positive_or_unavailable_with_message",
     test_device_count_is_positive_or_unavailable_with_message},
    {"test_device_count_rejects_null_count", test_device_count_rejects_null_count},
    {"test_device_name_of_device_0_is_not_empty", test_device_name_of_device_0_is_not_empty},
    {"test_device_name_is_cut_to_the_buffer", test_device_name_is_cut_to_the_buffer},
    {"test_device_name_rejects_bad_arguments", test_device_name_rejects_bad_arguments},
    {"test_device_name_past_the_last_device_is_invalid",
     test_device_name_past_the_last_device_is_invalid},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"cuda_device", device_cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU-only checks below pass without running)\n");
    return prism_test_main(argc, argv, suites);
}
