/* prism_pow5_gen: a build tool (never installed) that writes the tables of powers of five that
 * number_text.c's shortest-digits conversion multiplies by, as a C header:
 *
 *   prism_pow5_gen OUT.h
 *
 * Both tables hold 128-bit values as {low 64 bits, high 64 bits}; pow5_bits(e) is the bit length
 * of 5^e (number_text.c computes it the same way, and this tool checks the two agree):
 *   prism_pow5[i]     = floor(5^i / 2^(pow5_bits(i) - 125)), i in [0, PRISM_POW5_COUNT):
 *                       the 125 leading bits of 5^i (5^i shifted left when it is shorter);
 *   prism_pow5_inv[q] = floor(2^(pow5_bits(q) - 1 + 125) / 5^q) + 1, q in [0, PRISM_POW5_INV_COUNT):
 *                       2^(...) / 5^q rounded up, so that multiplying by it never undershoots.
 * The arithmetic is exact: 5^i as a multi-word integer, the quotient by binary long division.
 * OUT.h is replaced only when its text changes. Exit status 0, or 1 with a message on stderr. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POW5_COUNT 326     /* 5^325: the largest power number_text.c asks for (subnormals) */
#define POW5_INV_COUNT 292 /* 1/5^291: the largest (values near DBL_MAX) */
#define WORDS 40           /* 32-bit words: 1,280 bits, more than 2^(pow5_bits(291) + 124) needs */

typedef struct big {
    uint32_t w[WORDS]; /* little-endian words */
} big;

static int pow5_bits(int e)
{
    return (int)(((uint32_t)e * 1217359u) >> 19) + 1;
}

static void big_mul_small(big *a, uint32_t m)
{
    uint64_t carry = 0;
    for (int i = 0; i < WORDS; i++) {
        uint64_t v = (uint64_t)a->w[i] * m + carry;
        a->w[i] = (uint32_t)v;
        carry = v >> 32;
    }
    if (carry) {
        fprintf(stderr, "prism_pow5_gen: overflow\n");
        exit(1);
    }
}

static int big_bit_length(const big *a)
{
    for (int i = WORDS - 1; i >= 0; i--)
        if (a->w[i])
            for (int b = 31; b >= 0; b--)
                if (a->w[i] >> b & 1)
                    return i * 32 + b + 1;
    return 0;
}

static bool big_bit(const big *a, int bit)
{
    return bit >= 0 && bit < WORDS * 32 && (a->w[bit / 32] >> (bit % 32) & 1);
}

/* a >= b */
static bool big_geq(const big *a, const big *b)
{
    for (int i = WORDS - 1; i >= 0; i--)
        if (a->w[i] != b->w[i])
            return a->w[i] > b->w[i];
    return true;
}

static void big_sub(big *a, const big *b)
{
    uint64_t borrow = 0;
    for (int i = 0; i < WORDS; i++) {
        uint64_t v = (uint64_t)a->w[i] - b->w[i] - borrow;
        a->w[i] = (uint32_t)v;
        borrow = v >> 63;
    }
}

static void big_shl1(big *a)
{
    for (int i = WORDS - 1; i > 0; i--)
        a->w[i] = a->w[i] << 1 | a->w[i - 1] >> 31;
    a->w[0] <<= 1;
}

/* The bits [from, from + 128) of a as a 128-bit value (bits below 0 read as 0). */
static void take128(const big *a, int from, uint64_t out[2])
{
    out[0] = out[1] = 0;
    for (int k = 0; k < 128; k++)
        if (big_bit(a, from + k))
            out[k / 64] |= UINT64_C(1) << (k % 64);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: prism_pow5_gen OUT.h\n");
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out)
        return 1;
#define PUT(...) fprintf(out, __VA_ARGS__)
    PUT("/* Written by prism_pow5_gen (service/policy/pow5_gen.c): do not edit. */\n");
    PUT("#define PRISM_POW5_COUNT %d\n#define PRISM_POW5_INV_COUNT %d\n", POW5_COUNT, POW5_INV_COUNT);

    PUT("static const uint64_t prism_pow5[PRISM_POW5_COUNT][2] = {\n");
    big p = {{1}};
    for (int i = 0; i < POW5_COUNT; i++) {
        int bits = big_bit_length(&p);
        if (bits != pow5_bits(i)) {
            fprintf(stderr, "prism_pow5_gen: 5^%d has %d bits, pow5_bits says %d\n", i, bits, pow5_bits(i));
            return 1;
        }
        uint64_t v[2];
        take128(&p, bits - 125, v);
        PUT("    {UINT64_C(%" PRIu64 "), UINT64_C(%" PRIu64 ")},\n", v[0], v[1]);
        big_mul_small(&p, 5);
    }
    PUT("};\n");

    PUT("static const uint64_t prism_pow5_inv[PRISM_POW5_INV_COUNT][2] = {\n");
    big d = {{1}};
    for (int q = 0; q < POW5_INV_COUNT; q++) {
        /* floor(2^top / 5^q) by long division, one bit of the dividend at a time. */
        int top = pow5_bits(q) - 1 + 125;
        big rem = {{0}}, quo = {{0}};
        for (int bit = top; bit >= 0; bit--) {
            big_shl1(&rem);
            if (bit == top)
                rem.w[0] |= 1;
            big_shl1(&quo);
            if (big_geq(&rem, &d)) {
                big_sub(&rem, &d);
                quo.w[0] |= 1;
            }
        }
        if (big_bit_length(&quo) > 127) {
            fprintf(stderr, "prism_pow5_gen: 2^%d / 5^%d does not fit 127 bits\n", top, q);
            return 1;
        }
        uint64_t v[2];
        take128(&quo, 0, v);
        v[1] += ++v[0] == 0; /* + 1, carried */
        PUT("    {UINT64_C(%" PRIu64 "), UINT64_C(%" PRIu64 ")},\n", v[0], v[1]);
        big_mul_small(&d, 5);
    }
    PUT("};\n");
#undef PUT
    if (fclose(out) != 0)
        return 1;

    FILE *old = fopen(argv[1], "rb");
    if (old) {
        char *prev = malloc(len + 1);
        size_t got = prev ? fread(prev, 1, len + 1, old) : 0;
        fclose(old);
        bool same = prev && got == len && memcmp(prev, text, len) == 0;
        free(prev);
        if (same) {
            free(text);
            return 0;
        }
    }
    FILE *f = fopen(argv[1], "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "prism_pow5_gen: cannot write %s\n", argv[1]);
        return 1;
    }
    free(text);
    return 0;
}
