/* prism_buf_append_double (number_text.c) finds x's shortest digits with integer arithmetic
 * (Ryu's method) and renders them as printf would: it must write exactly what the plain search
 * writes (%.15g, %.16g, %.17g, the first that strtod reads back as the value; from one digit up
 * for subnormals). This test keeps that plain search as the reference and compares the two on
 * values of every kind: random bit patterns over the whole range, short decimals, integers,
 * values next to powers of ten, every power of two and its neighbours (where the bracket around x
 * is lopsided and number_text.c hands the long ones to printf), ties of the 17-digit rounding,
 * signed zeros, the extremes and subnormals. prism_double_text_printf (the way it was done before,
 * bench_policy's baseline) must write the same. */
#include "testutil.h"

#include "telemetry.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reference(double x, char *text, size_t cap)
{
    if (!isfinite(x)) {
        snprintf(text, cap, "null");
        return;
    }
    for (int digits = fpclassify(x) == FP_SUBNORMAL ? 1 : 15; digits <= 17; digits++) {
        snprintf(text, cap, "%.*g", digits, x);
        if (strtod(text, NULL) == x)
            break;
    }
    if (!strpbrk(text, ".eEn"))
        strcat(text, ".0");
}

static uint64_t state = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void)
{
    /* splitmix64: a fixed sequence, the same on every run */
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t mismatches;

static void check(double x)
{
    char want[64];
    reference(x, want, sizeof want);
    prism_buf b = {0};
    CU_ASSERT_FATAL(prism_buf_append_double(&b, x) == PRISM_OK);
    if (strcmp(b.data, want) != 0 && mismatches++ < 10)
        fprintf(stderr, "%a: got %s, want %s\n", x, b.data, want);
    prism_buf_free(&b);
    /* bench_policy's baseline writes the same */
    char old[PRISM_DOUBLE_TEXT_MAX];
    size_t n = prism_double_text_printf(x, old);
    if ((n != strlen(want) || strcmp(old, want) != 0) && mismatches++ < 10)
        fprintf(stderr, "%a: the printf path wrote %s, want %s\n", x, old, want);
}

static void test_number_text_equals_the_plain_shortest_search(void)
{
    mismatches = 0;
    const double fixed[] = {0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 25.0, 30.2, 1e15, 1e16, 1e17, 9.999999999999999e14,
                            999999999999999.9, 1e-4, 1e-5, 0.00012345, 123456789012345678.0, DBL_MAX, -DBL_MAX,
                            DBL_MIN, DBL_TRUE_MIN, 5e-324, 2.2250738585072009e-308, 1700000000.5, 0.3, 2.0 / 3.0,
                            1e23, 9007199254740993.0, 5e-310,
                            NAN, INFINITY};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        check(fixed[i]);
    for (int i = 0; i < 200000; i++) {
        uint64_t bits = next_u64();
        double x;
        memcpy(&x, &bits, sizeof x);
        check(x); /* any double: NaN and Inf included */
    }
    for (int i = 0; i < 200000; i++)
        check((double)(next_u64() >> 11) / 9007199254740992.0); /* [0, 1): sensitivities, scores */
    for (int i = 0; i < 100000; i++) {
        /* short decimals k / 10^j and k * 10^j, integers */
        double k = (double)(next_u64() % 100000000);
        int j = (int)(next_u64() % 23);
        check(k / pow(10, j));
        check(k * pow(10, j));
        check((double)(next_u64() >> (next_u64() % 64)));
    }
    for (int e = -30; e <= 30; e++) {
        /* next to powers of ten, both sides */
        double p = pow(10, e);
        double x = p;
        for (int s = 0; s < 50; s++) {
            check(x);
            x = nextafter(x, 0);
        }
        x = p;
        for (int s = 0; s < 50; s++) {
            check(x);
            x = nextafter(x, INFINITY);
        }
    }
    for (int i = 0; i < 100000; i++) {
        /* 17-digit texts ending in 5 or 50: the ties the derivation leaves to printf */
        char t[64];
        snprintf(t, sizeof t, "%llu%s5e%d", (unsigned long long)(next_u64() % 1000000000000000ull),
                 i % 2 ? "" : "0", (int)(next_u64() % 40) - 20);
        check(strtod(t, NULL));
    }
    for (int e = -1074; e <= 1023; e++) {
        /* every power of two and its neighbours, both signs */
        double p = ldexp(1.0, e);
        check(p);
        check(-p);
        check(nextafter(p, 0));
        check(nextafter(p, INFINITY));
    }
    for (int i = 0; i < 100000; i++) {
        /* subnormals: random fractions with a zero exponent */
        uint64_t bits = next_u64() & ((UINT64_C(1) << 52) - 1);
        double x;
        memcpy(&x, &bits, sizeof x);
        check(x);
    }
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* prism_u64_text writes what %llu writes. */
static void test_integer_text_equals_printf(void)
{
    const uint64_t fixed[] = {0, 1, 9, 10, 99, 100, 4294967295u, UINT64_C(99999999), UINT64_C(100000000),
                              UINT64_C(99999999999999999), UINT64_C(100000000000000000), UINT64_MAX};
    size_t bad = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] + 200000; i++) {
        uint64_t x = i < sizeof fixed / sizeof fixed[0] ? fixed[i] : next_u64() >> (next_u64() % 64);
        char want[32], got[32];
        snprintf(want, sizeof want, "%llu", (unsigned long long)x);
        size_t n = prism_u64_text(x, got);
        if ((n != strlen(want) || strcmp(got, want) != 0) && bad++ < 10)
            fprintf(stderr, "%llu: got %s\n", (unsigned long long)x, got);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static const prism_test_case cases[] = {
    {"test_number_text_equals_the_plain_shortest_search", test_number_text_equals_the_plain_shortest_search},
    {"test_integer_text_equals_printf", test_integer_text_equals_printf},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"number_text", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
