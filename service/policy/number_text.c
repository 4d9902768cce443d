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
 * bracket. Those values (1,834 powers of two and their negatives, out of all doubles) take the
 * printf path, as all values did before.
 *
 * The search and the writing are two calls (telemetry.h's prism_number_prepare and
 * prism_number_text) so that a writer of several numbers can search all of them first: each
 * search is one long dependent chain, and side by side they overlap in the processor. */
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
        while (*digits % 10 == 0) { /* a result on vm with its zeros kept */
            *digits /= 10;
            removed++;
        }
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
        /* Never a trailing zero here: vr + 1 ending in 0 would have let the loop drop one more. */
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

/* Writes c's eight decimal digits (c < 10^8, leading zeros included) at o. On a little-endian
 * machine all eight at once in one 64-bit word: its two 32-bit lanes hold the two halves of four
 * digits, each lane splits into two 16-bit lanes of two digits, each of those into two bytes of
 * one digit (a multiply and shift divides every lane by 100, then by 10: x * 10486 >> 20 is
 * x / 100 rounded down for x < 10^4, x * 103 >> 10 is x / 10 for x < 100), then '0' is added to
 * every byte. Elsewhere two digits at a time. */
static inline __attribute__((always_inline)) void write_8_digits(char *o, uint32_t c)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t fours = (uint64_t)(c / 10000) | (uint64_t)(c % 10000) << 32;
    uint64_t hundreds = (fours * 10486 >> 20) & UINT64_C(0x0000007f0000007f);
    uint64_t twos = hundreds | (fours - hundreds * 100) << 16;
    uint64_t tens = (twos * 103 >> 10) & UINT64_C(0x000f000f000f000f);
    uint64_t ones = tens | (twos - tens * 10) << 8;
    ones |= UINT64_C(0x3030303030303030);
    memcpy(o, &ones, 8);
#else
    uint32_t high = c / 10000, low = c % 10000;
    memcpy(o, digit_pairs + 2 * (high / 100), 2);
    memcpy(o + 2, digit_pairs + 2 * (high % 100), 2);
    memcpy(o + 4, digit_pairs + 2 * (low / 100), 2);
    memcpy(o + 6, digit_pairs + 2 * (low % 100), 2);
#endif
}

/* Writes v's n decimal digits at d: its eight-digit groups from the right (each split off v
 * directly, so that no group waits on another), the rest two at a time. */
static inline __attribute__((always_inline)) void write_digits(char *d, uint64_t v, int n)
{
    char *o = d + n;
    if (v >= 100000000) {
        uint64_t rest = v / 100000000;
        write_8_digits(o - 8, (uint32_t)(v - rest * 100000000));
        o -= 8;
        if (rest >= 100000000) {
            uint64_t top = v / UINT64_C(10000000000000000);
            write_8_digits(o - 8, (uint32_t)(rest - top * 100000000));
            o -= 8;
            rest = top;
        }
        v = rest;
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

void prism_number_prepare(double x, prism_number *num)
{
    num->x = x;
    num->digits = 0;
    num->e10 = 0;
    num->n = 0;
    num->symmetric = true;
    if (isfinite(x) && x != 0) {
        shortest_digits(x, &num->digits, &num->e10, &num->symmetric);
        num->n = decimal_length(num->digits);
    }
}

size_t prism_double_text(double x, char *out)
{
    prism_number num;
    prism_number_prepare(x, &num);
    return prism_number_text(&num, out);
}

size_t prism_number_text(const prism_number *num, char *out)
{
    double x = num->x;
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
    uint64_t digits = num->digits;
    int n = num->n, e10 = num->e10;
    if (!num->symmetric && n >= 16) {
        printf_shortest(x, out);
        return strlen(out);
    }
    /* The digits go straight to their places (written as 8-byte words by write_8_digits; a
     * staging buffer read back as 16 bytes would wait on those stores). */
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
        write_digits(o, digits, n); /* an integer: its zeros (when x10 + 1 > n, at most 14), then ".0" */
        o += n;
        memcpy(o, "000000000000000", 15);
        o += x10 + 1 - n;
        memcpy(o, ".0", 2);
        o += 2;
    } else {
        write_digits(o + 1, digits, n); /* ddd.ddd: the integer digits move one to the left */
        for (int i = 0; i <= x10; i++)  /* usually one or two bytes: cheaper than memmove */
            o[i] = o[i + 1];
        o[x10 + 1] = '.';
        o += n + 1;
    }
    *o = '\0';
    return (size_t)(o - out);
}

size_t prism_u64_text(uint64_t x, char *out)
{
    if (x >= pow10_u64[17]) { /* beyond write_digits' 17 digits: rare (ids are 32-bit) */
        int n = snprintf(out, 24, "%llu", (unsigned long long)x);
        return (size_t)n;
    }
    int n = x ? decimal_length(x) : 1;
    write_digits(out, x, n);
    out[n] = '\0';
    return (size_t)n;
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
