/* Doubles as text (telemetry.h's prism_buf_append_double): the shortest decimal that reads back
 * as exactly the same double, written as printf's %.15g writes it when 15 digits or fewer suffice,
 * else as %.16g, else as %.17g (the plain search "the first of %.15g, %.16g, %.17g that strtod
 * reads back", which is what tests/unit/test_number_text.c checks it against).
 *
 * The digits come from integer arithmetic, not from printf and strtod (which cost ~0.4 us a
 * double, most of a 10,000-block telemetry record's time). The method is Ulf Adams' Ryu (PLDI
 * 2018): x = m * 2^e is bracketed by the halfway points to its neighbours, all three are scaled by
 * a power of ten with 128-bit multiplications by tables of powers of five (pow5_gen.c writes them
 * at build time), and decimal digits are dropped while the bracket still tells the candidates
 * apart; the last dropped digit rounds (ties to even, as printf does). That gives the fewest
 * digits that read back as x and, among the candidates of that length, the one nearest x.
 *
 * Nearest-of-the-shortest is what the plain search writes whenever x's bracket is symmetric. It
 * is not only at a power of two, where the gap below x is half the gap above: there, a 16- or
 * 17-digit result may sit above x while printf's rounding of x lies below it and outside the
 * bracket. Those values (at most 2,046 doubles) take the printf path, as all values did before. */
#define _DEFAULT_SOURCE /* stpcpy */
#include "telemetry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prism_pow5.h"

/* Exact powers of ten as doubles (10^22 is the largest that is). */
static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Writes what printf's %.Pg writes for a value whose P significant digits (rounded) are d[0..P)
 * and whose decimal exponent is x10: trailing zeros of the fraction dropped, the exponent form
 * when x10 < -4 or x10 >= P (at least two exponent digits); then ".0" when that is an integer, so
 * that a number real in type reads as real. Returns the end of the text, where it writes a NUL. */
static char *render_g(char *out, bool negative, const char *d, int p, int x10)
{
    int k = p;
    while (k > 1 && d[k - 1] == '0')
        k--;
    char *o = out;
    if (negative)
        *o++ = '-';
    if (x10 < -4 || x10 >= p) {
        *o++ = d[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)(k - 1));
            o += k - 1;
        }
        *o++ = 'e';
        *o++ = x10 < 0 ? '-' : '+';
        int e = x10 < 0 ? -x10 : x10;
        if (e >= 100)
            *o++ = (char)('0' + e / 100);
        *o++ = (char)('0' + e / 10 % 10);
        *o++ = (char)('0' + e % 10);
    } else if (x10 >= 0) {
        memcpy(o, d, (size_t)(x10 + 1));
        o += x10 + 1;
        if (k > x10 + 1) {
            *o++ = '.';
            memcpy(o, d + x10 + 1, (size_t)(k - x10 - 1));
            o += k - x10 - 1;
        } else {
            *o++ = '.';
            *o++ = '0';
        }
    } else {
        *o++ = '0';
        *o++ = '.';
        for (int z = 0; z < -x10 - 1; z++)
            *o++ = '0';
        memcpy(o, d, (size_t)k);
        o += k;
    }
    *o = '\0';
    return o;
}

/* The value the digits d[0..p) x 10^(x10 - p + 1) read back as (what strtod gives for render_g's
 * text): one exact multiplication or division when the digits fit 53 bits and the power of ten is
 * exact (so correctly rounded, as strtod), else strtod itself. */
static double read_back(const char *text, bool negative, const char *d, int p, int x10)
{
    uint64_t mant = 0;
    for (int i = 0; i < p; i++)
        mant = mant * 10 + (uint64_t)(d[i] - '0');
    int e = x10 - p + 1;
    if (mant < (UINT64_C(1) << 53) && e >= -22 && e <= 22) {
        double v = e >= 0 ? (double)mant * pow10_exact[e] : (double)mant / pow10_exact[-e];
        return negative ? -v : v;
    }
    return strtod(text, NULL);
}

/* Rounds the 17 digits of d17 (x rounded to 17 significant digits) to p (15 or 16) digits into
 * out, as rounding x itself would. false when the 17 digits cannot tell (their tail is exactly
 * half a unit of the last digit kept: x may lie either side). */
static bool round_digits(const char *d17, int p, char *out, int *x10)
{
    int tail = p == 16 ? d17[16] - '0' : (d17[15] - '0') * 10 + (d17[16] - '0');
    int half = p == 16 ? 5 : 50;
    if (tail == half)
        return false;
    memcpy(out, d17, (size_t)p);
    if (tail > half) {
        int i = p - 1;
        while (i >= 0 && out[i] == '9')
            out[i--] = '0';
        if (i < 0) {
            out[0] = '1'; /* 99..9 rounds up to 10..0: one more power of ten */
            (*x10)++;
        } else {
            out[i]++;
        }
    }
    return true;
}

/* The plain search's text for a normal x or a zero, from printf: one %.16e rendering gives x's 17 digits;
 * the 15- and 16-digit texts are derived from them (printf's own when the 17 digits cannot tell
 * how x rounds) and checked by reading them back. text holds PRISM_DOUBLE_TEXT_MAX bytes. */
static void printf_shortest(double x, char *text)
{
    char e17[40], d17[17];
    snprintf(e17, sizeof e17, "%.16e", x);
    bool negative = e17[0] == '-';
    const char *m = e17 + (negative ? 1 : 0); /* d.dddddddddddddddde[+-]XX */
    d17[0] = m[0];
    memcpy(d17 + 1, m + 2, 16);
    int x17 = atoi(m + 19);
    bool done = false;
    for (int p = 15; p <= 16 && !done; p++) {
        char d[17];
        int x10 = x17;
        if (round_digits(d17, p, d, &x10)) {
            render_g(text, negative, d, p, x10);
            done = read_back(text, negative, d, p, x10) == x;
        } else {
            snprintf(text, PRISM_DOUBLE_TEXT_MAX, "%.*g", p, x);
            done = strtod(text, NULL) == x;
        }
    }
    if (!done)
        render_g(text, negative, d17, 17, x17);
    else if (!strpbrk(text, ".e")) /* printf's text of an integer: as render_g ends it */
        strcat(text, ".0");
}

/* ceil(log2(5^e)) for e >= 1 (1 for e = 0): the bit length of 5^e, for 0 <= e <= 3528. */
static int pow5_bits(int e)
{
    return (int)(((uint32_t)e * 1217359u) >> 19) + 1;
}

/* floor(log10(2^e)) for 0 <= e <= 1650. */
static int log10_pow2(int e)
{
    return (int)(((uint32_t)e * 78913u) >> 18);
}

/* floor(log10(5^e)) for 0 <= e <= 2620. */
static int log10_pow5(int e)
{
    return (int)(((uint32_t)e * 732923u) >> 20);
}

/* True when 5^p divides v (v > 0). */
static bool divisible_by_pow5(uint64_t v, int p)
{
    int count = 0;
    while (count < p && v % 5 == 0) {
        v /= 5;
        count++;
    }
    return count >= p;
}

/* True when 2^p divides v (0 <= p < 64). */
static bool divisible_by_pow2(uint64_t v, int p)
{
    return (v & ((UINT64_C(1) << p) - 1)) == 0;
}

/* floor(m * f / 2^shift) for m < 2^56, f = {low, high} < 2^127, 64 <= shift < 192: the 192-bit
 * product's bits from shift on. */
static uint64_t mul_shift(uint64_t m, const uint64_t f[2], int shift)
{
    unsigned __int128 low = (unsigned __int128)m * f[0];
    unsigned __int128 high = (unsigned __int128)m * f[1];
    return (uint64_t)(((low >> 64) + high) >> (shift - 64));
}

/* x's shortest round-trip digits for a finite, nonzero x: *digits is the decimal integer, *e10
 * the power of ten it is scaled by (x reads back from digits * 10^e10), *symmetric whether x's
 * bracket was symmetric (false at a power of two above the smallest normal). */
static void shortest_digits(double x, uint64_t *digits, int *e10, bool *symmetric)
{
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint64_t fraction = bits & ((UINT64_C(1) << 52) - 1);
    int biased = (int)(bits >> 52 & 0x7ff);
    /* x = m2 * 2^e2, with two more bits of room below so that the halfway points are integers. */
    uint64_t m2 = biased ? fraction | UINT64_C(1) << 52 : fraction;
    int e2 = (biased ? biased : 1) - 1023 - 52 - 2;
    bool even = (m2 & 1) == 0; /* round-half-even reading: the bracket's ends read back as x */
    /* The bracket [mv - lower, mv + 2] around mv = 4 * m2: the gap below is half the gap above
     * at a power of two (fraction 0) above the smallest normal. */
    uint64_t mv = 4 * m2;
    int lower = fraction != 0 || biased <= 1 ? 2 : 1;
    *symmetric = lower == 2;

    /* vr, vp, vm: mv, mv + 2 and mv - lower, times 2^e2 / 10^q, rounded down; the *_zeros flags:
     * whether the digits dropped by that scaling (vm's, vr's) were all zero. */
    uint64_t vr, vp, vm;
    int q;
    bool vm_zeros = false, vr_zeros = false;
    if (e2 >= 0) {
        q = log10_pow2(e2) - (e2 > 3);
        *e10 = q;
        int shift = -e2 + q + 125 + pow5_bits(q) - 1;
        const uint64_t *f = prism_pow5_inv[q];
        vr = mul_shift(mv, f, shift);
        vp = mul_shift(mv + 2, f, shift);
        vm = mul_shift(mv - (uint64_t)lower, f, shift);
        if (q <= 21) {
            /* The scaling divided by 5^q (and 2^q, which e2 >= q covers): exact only when 5^q
             * divides. At most one of mv, mv + 2 and mv - lower is a multiple of 5. */
            if (mv % 5 == 0)
                vr_zeros = divisible_by_pow5(mv, q);
            else if (even)
                vm_zeros = divisible_by_pow5(mv - (uint64_t)lower, q);
            else
                vp -= divisible_by_pow5(mv + 2, q); /* an excluded upper end must not count */
        }
    } else {
        q = log10_pow5(-e2) - (-e2 > 1);
        *e10 = q + e2;
        int i = -e2 - q;
        int shift = q - (pow5_bits(i) - 125);
        const uint64_t *f = prism_pow5[i];
        vr = mul_shift(mv, f, shift);
        vp = mul_shift(mv + 2, f, shift);
        vm = mul_shift(mv - (uint64_t)lower, f, shift);
        if (q <= 1) {
            /* Divided by 2^q at most: mv has two trailing zero bits, mv + 2 one, mv - lower one
             * when lower is 2. */
            vr_zeros = true;
            if (even)
                vm_zeros = lower == 2;
            else
                vp--;
        } else if (q < 63) {
            vr_zeros = divisible_by_pow2(mv, q);
        }
    }

    /* Drop digits while vp and vm still differ in what remains. */
    int removed = 0;
    unsigned last = 0; /* the last digit dropped from vr */
    if (vm_zeros || vr_zeros) {
        while (vp / 10 > vm / 10) {
            vm_zeros &= vm % 10 == 0;
            vr_zeros &= last == 0;
            last = (unsigned)(vr % 10);
            vr /= 10;
            vp /= 10;
            vm /= 10;
            removed++;
        }
        if (vm_zeros) /* vm is exact: its trailing zeros may go too, the bracket still holds */
            while (vm % 10 == 0) {
                vr_zeros &= last == 0;
                last = (unsigned)(vr % 10);
                vr /= 10;
                vp /= 10;
                vm /= 10;
                removed++;
            }
        if (vr_zeros && last == 5 && vr % 2 == 0)
            last = 4; /* exactly half way: to even */
        *digits = vr + ((vr == vm && (!even || !vm_zeros)) || last >= 5);
    } else {
        if (vp / 100 > vm / 100) { /* the common case drops two digits or more: two at once */
            last = (unsigned)(vr % 100 >= 50 ? 5 : 0);
            vr /= 100;
            vp /= 100;
            vm /= 100;
            removed += 2;
        }
        while (vp / 10 > vm / 10) {
            last = (unsigned)(vr % 10);
            vr /= 10;
            vp /= 10;
            vm /= 10;
            removed++;
        }
        *digits = vr + (vr == vm || last >= 5);
    }
    *e10 += removed;
}

/* "00" to "99": two digits at a time. */
static const char digit_pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                  "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                  "8081828384858687888990919293949596979899";

/* 10^0 to 10^17. */
static const uint64_t pow10_u64[] = {UINT64_C(1),
                                     UINT64_C(10),
                                     UINT64_C(100),
                                     UINT64_C(1000),
                                     UINT64_C(10000),
                                     UINT64_C(100000),
                                     UINT64_C(1000000),
                                     UINT64_C(10000000),
                                     UINT64_C(100000000),
                                     UINT64_C(1000000000),
                                     UINT64_C(10000000000),
                                     UINT64_C(100000000000),
                                     UINT64_C(1000000000000),
                                     UINT64_C(10000000000000),
                                     UINT64_C(100000000000000),
                                     UINT64_C(1000000000000000),
                                     UINT64_C(10000000000000000),
                                     UINT64_C(100000000000000000)};

/* The number of decimal digits of v (1 <= v < 10^17: the shortest digits have at most 17):
 * log10(2) x its bit length (1233 / 4096 ~ 0.30103), one too low at most, then one comparison. */
static int decimal_length(uint64_t v)
{
    int guess = (64 - __builtin_clzll(v)) * 1233 >> 12; /* floor or floor - 1 of log10(v), + 1 */
    return guess + (v >= pow10_u64[guess]);
}

/* Writes c's eight decimal digits (c < 10^8, leading zeros included) at o: two halves of four,
 * each two pairs, so no division waits on more than one other. */
static void write_8_digits(char *o, uint32_t c)
{
    uint32_t high = c / 10000, low = c % 10000;
    memcpy(o, digit_pairs + 2 * (high / 100), 2);
    memcpy(o + 2, digit_pairs + 2 * (high % 100), 2);
    memcpy(o + 4, digit_pairs + 2 * (low / 100), 2);
    memcpy(o + 6, digit_pairs + 2 * (low % 100), 2);
}

/* Writes v's n decimal digits at d: eight-digit groups split off from the right, the rest two at
 * a time. */
static void write_digits(char *d, uint64_t v, int n)
{
    char *o = d + n;
    while (v >= 100000000) {
        o -= 8;
        write_8_digits(o, (uint32_t)(v % 100000000));
        v /= 100000000;
    }
    uint32_t w = (uint32_t)v;
    while (w >= 100) {
        o -= 2;
        memcpy(o, digit_pairs + 2 * (w % 100), 2);
        w /= 100;
    }
    if (w >= 10) {
        o -= 2;
        memcpy(o, digit_pairs + 2 * w, 2);
    } else {
        *--o = (char)('0' + w);
    }
}

size_t prism_double_text(double x, char *out)
{
    if (!isfinite(x)) {
        memcpy(out, "null", 5);
        return 4;
    }
    char *o = out;
    if (signbit(x))
        *o++ = '-';
    if (x == 0) {
        memcpy(o, "0.0", 4);
        return (size_t)(o + 3 - out);
    }
    uint64_t digits;
    int e10;
    bool symmetric;
    shortest_digits(x, &digits, &e10, &symmetric);
    while (digits % 10 == 0) { /* rare: a rounding up that ended in zeros */
        digits /= 10;
        e10++;
    }
    int n = decimal_length(digits);
    if (!symmetric && n >= 16) {
        printf_shortest(x, out);
        return strlen(out);
    }
    /* As %.Pg writes it: P = 15 up to 15 digits (its zeros dropped), P = n for 16 or 17 digits
     * and for subnormals (whose exponent form the search from one digit writes); the exponent
     * form when x10 < -4 or x10 >= P, else the fixed form, ".0" after an integer. */
    int x10 = e10 + n - 1;
    int p = n > 15 || fpclassify(x) == FP_SUBNORMAL ? n : 15;
    if (x10 < -4 || x10 >= p) {
        write_digits(o + 1, digits, n); /* d.ddd: the first digit moves in front of the point */
        o[0] = o[1];
        if (n > 1) {
            o[1] = '.';
            o += n + 1;
        } else {
            o += 1;
        }
        *o++ = 'e';
        *o++ = x10 < 0 ? '-' : '+';
        int e = x10 < 0 ? -x10 : x10;
        if (e >= 100)
            *o++ = (char)('0' + e / 100);
        memcpy(o, digit_pairs + 2 * (e % 100), 2);
        o += 2;
    } else if (x10 < 0) {
        memcpy(o, "0.0000", 6); /* "0." and the -x10 - 1 zeros (at most 3) */
        o += 1 - x10;
        write_digits(o, digits, n);
        o += n;
    } else if (n <= x10 + 1) {
        write_digits(o, digits, n); /* an integer: its zeros, then ".0" */
        o += n;
        memset(o, '0', (size_t)(x10 + 1 - n));
        o += x10 + 1 - n;
        memcpy(o, ".0", 2);
        o += 2;
    } else {
        write_digits(o + 1, digits, n); /* ddd.ddd: the integer digits move one to the left */
        memmove(o, o + 1, (size_t)(x10 + 1));
        o[x10 + 1] = '.';
        o += n + 1;
    }
    *o = '\0';
    return (size_t)(o - out);
}

size_t prism_double_text_printf(double x, char *out)
{
    if (!isfinite(x)) {
        memcpy(out, "null", 5);
        return 4;
    }
    if (fpclassify(x) == FP_SUBNORMAL) {
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(out, PRISM_DOUBLE_TEXT_MAX, "%.*g", digits, x);
            if (strtod(out, NULL) == x)
                break;
        }
        size_t len = strlen(out);
        if (!strpbrk(out, ".e")) {
            memcpy(out + len, ".0", 3);
            len += 2;
        }
        return len;
    }
    printf_shortest(x, out);
    return strlen(out);
}

prism_status prism_buf_append_double(prism_buf *b, double x)
{
    char text[PRISM_DOUBLE_TEXT_MAX];
    return prism_buf_append(b, text, prism_double_text(x, text));
}
