/* The CPU reference kernels: exact conversions (every f16 code checked), and the block gradient
 * statistics of DESIGN 3 on values whose figures are exact in binary. */
#include "testutil.h"

#include "prism/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void test_bf16_to_f32_known_values(void)
{
    static const struct {
        uint16_t bits;
        float want;
    } cases[] = {{0x3f80, 1.0f}, {0xc000, -2.0f}, {0x4040, 3.0f}, {0x3e80, 0.25f}, {0x0000, 0.0f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CU_ASSERT_EQUAL(prism_bf16_to_f32(cases[i].bits), cases[i].want);
    CU_ASSERT_EQUAL(prism_bf16_to_f32(0x0001), ldexpf(1.0f, -133)); /* smallest subnormal */
    CU_ASSERT_TRUE(isinf(prism_bf16_to_f32(0x7f80)) && prism_bf16_to_f32(0x7f80) > 0);
    CU_ASSERT_TRUE(isinf(prism_bf16_to_f32(0xff80)) && prism_bf16_to_f32(0xff80) < 0);
    CU_ASSERT_TRUE(isnan(prism_bf16_to_f32(0x7fc0)));
    CU_ASSERT_TRUE(signbit(prism_bf16_to_f32(0x8000)));
}

/* Every one of the 65,536 f16 codes against the definition: (-1)^s * m * 2^(e-25), with the
 * implicit bit for normal numbers. */
static void test_f16_to_f32_every_code(void)
{
    unsigned wrong = 0;
    for (uint32_t code = 0; code < 65536; code++) {
        uint16_t bits = (uint16_t)code;
        float got = prism_f16_to_f32(bits);
        unsigned e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
        bool negative = bits >> 15;
        if (e == 0x1f) {
            bool ok = m ? isnan(got) : (isinf(got) && (got < 0) == negative);
            wrong += !ok;
            continue;
        }
        double want = ldexp((double)(e ? m + 1024 : m), (e ? (int)e : 1) - 25);
        if (negative)
            want = -want;
        if ((double)got != want || (signbit(got) != 0) != negative) {
            if (wrong < 5)
                fprintf(stderr, "f16 0x%04x: got %.9g, want %.9g\n", code, (double)got, want);
            wrong++;
        }
    }
    CU_ASSERT_EQUAL(wrong, 0);
    CU_ASSERT_EQUAL(prism_f16_to_f32(0x7bff), 65504.0f);
    CU_ASSERT_EQUAL(prism_f16_to_f32(0x0001), ldexpf(1.0f, -24));
}

static prism_grad_stats stats_of(const prism_tensor *t, size_t n)
{
    prism_grad_stats s;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_cpu(t, n, &s, &err), PRISM_OK);
    return s;
}

static void assert_stats(prism_grad_stats s, double l2, double max_abs, double mean, double variance, uint64_t numel,
                         uint64_t nonfinite)
{
    CU_ASSERT_EQUAL(s.l2_norm, l2);
    CU_ASSERT_EQUAL(s.max_abs, max_abs);
    CU_ASSERT_EQUAL(s.mean, mean);
    CU_ASSERT_EQUAL(s.variance, variance);
    CU_ASSERT_EQUAL(s.numel, numel);
    CU_ASSERT_EQUAL(s.nonfinite, nonfinite);
}

static void test_grad_stats_of_one_f32_tensor(void)
{
    const float x[] = {1, -2, 3, -4};
    prism_tensor t = {x, 4, PRISM_DTYPE_F32};
    /* sum of squares 30; mean -0.5; deviations 1.5 -1.5 3.5 -3.5: squares sum 29, /4 */
    assert_stats(stats_of(&t, 1), sqrt(30.0), 4.0, -0.5, 7.25, 4, 0);
}

static void test_grad_stats_leave_nonfinite_elements_out_and_count_them(void)
{
    const float x[] = {1, NAN, 3, INFINITY, -INFINITY};
    prism_tensor t = {x, 5, PRISM_DTYPE_F32};
    assert_stats(stats_of(&t, 1), sqrt(10.0), 3.0, 2.0, 1.0, 5, 3);
    const float all_bad[] = {NAN, INFINITY};
    prism_tensor u = {all_bad, 2, PRISM_DTYPE_F32};
    assert_stats(stats_of(&u, 1), 0.0, 0.0, 0.0, 0.0, 2, 2);
}

/* [1, 2] f32, [3] bf16, [4] f16: the figures of [1, 2, 3, 4] (Chan's merge across tensors). */
static void test_grad_stats_merge_tensors_of_every_dtype(void)
{
    const float a[] = {1, 2};
    const uint16_t b[] = {0x4040};      /* bf16 3.0 */
    const uint16_t c[] = {0x4400};      /* f16 4.0 */
    prism_tensor t[] = {{a, 2, PRISM_DTYPE_F32}, {b, 1, PRISM_DTYPE_BF16}, {c, 1, PRISM_DTYPE_F16}};
    assert_stats(stats_of(t, 3), sqrt(30.0), 4.0, 2.5, 1.25, 4, 0);
}

/* A large offset: E[x^2] - E[x]^2 in float would lose the variance; Welford keeps it exact. */
static void test_grad_stats_variance_survives_a_large_offset(void)
{
    const float x[] = {1000001, 1000002, 1000003, 1000004};
    prism_tensor t = {x, 4, PRISM_DTYPE_F32};
    prism_grad_stats s = stats_of(&t, 1);
    CU_ASSERT_EQUAL(s.mean, 1000002.5);
    CU_ASSERT_EQUAL(s.variance, 1.25);
}

static void test_grad_stats_of_nothing_are_zero(void)
{
    assert_stats(stats_of(NULL, 0), 0, 0, 0, 0, 0, 0);
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_BF16};
    assert_stats(stats_of(&empty, 1), 0, 0, 0, 0, 0, 0);
}

static void test_grad_stats_refuse_missing_data_and_unknown_dtypes(void)
{
    const float x[] = {1};
    prism_tensor t[] = {{x, 1, PRISM_DTYPE_F32}, {NULL, 3, PRISM_DTYPE_F32}};
    prism_grad_stats s;
    prism_error err;
    CU_ASSERT_EQUAL(prism_grad_stats_cpu(t, 2, &s, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "tensor 1: 3 elements but no data");
    prism_tensor u = {x, 1, (prism_dtype)9};
    CU_ASSERT_EQUAL(prism_grad_stats_cpu(&u, 1, &s, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "tensor 0: unknown dtype 9");
}

static const prism_test_case cases[] = {
    {"test_bf16_to_f32_known_values", test_bf16_to_f32_known_values},
    {"test_f16_to_f32_every_code", test_f16_to_f32_every_code},
    {"test_grad_stats_of_one_f32_tensor", test_grad_stats_of_one_f32_tensor},
    {"test_grad_stats_leave_nonfinite_elements_out_and_count_them",
     test_grad_stats_leave_nonfinite_elements_out_and_count_them},
    {"test_grad_stats_merge_tensors_of_every_dtype", test_grad_stats_merge_tensors_of_every_dtype},
    {"test_grad_stats_variance_survives_a_large_offset", test_grad_stats_variance_survives_a_large_offset},
    {"test_grad_stats_of_nothing_are_zero", test_grad_stats_of_nothing_are_zero},
    {"test_grad_stats_refuse_missing_data_and_unknown_dtypes", test_grad_stats_refuse_missing_data_and_unknown_dtypes},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_cpu", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
