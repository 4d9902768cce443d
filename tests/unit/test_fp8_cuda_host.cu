/* quant_core.h's FP8 conversions against cuda_fp8.h's, on the host (no GPU needed): the CUDA
 * kernels round to FP8 with the hardware conversion on sm_89 and newer and with
 * prism_qc_fp8_encode elsewhere, and the CPU reference always with prism_qc_fp8_encode, so the
 * two must agree on every input. cuda_fp8.h's host path is NVIDIA's specification of that
 * conversion (__nv_cvt_float_to_fp8 with __NV_SATFINITE; the device instruction
 * cvt.rn.satfinite.e4m3x2/e5m2x2.f32 that sm_89 runs is what it emulates).
 *
 * Every one of the 2^32 binary32 bit patterns is converted to both formats, on as many threads
 * as the machine has; every one of the 256 codes of each format is decoded. */
#include "quant_core.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

extern "C" {
#include "testutil.h"
}

namespace {

/* Patterns [begin, end) of one format: how many disagree, and the first that does. */
struct Sweep {
    uint64_t wrong = 0;
    uint32_t first = 0;
};

Sweep sweep(uint64_t begin, uint64_t end, int format)
{
    const __nv_fp8_interpretation_t interp = format == PRISM_QC_E4M3 ? __NV_E4M3 : __NV_E5M2;
    Sweep s;
    for (uint64_t u = begin; u < end; u++) {
        const float x = prism_qc_float((uint32_t)u);
        const uint8_t ours = prism_qc_fp8_encode(x, format);
        const uint8_t theirs = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, interp);
        if (ours != theirs && s.wrong++ == 0)
            s.first = (uint32_t)u;
    }
    return s;
}

void check_every_float(int format)
{
    const uint64_t total = (uint64_t)1 << 32;
    unsigned threads = std::thread::hardware_concurrency();
    if (threads == 0)
        threads = 2;
    if (threads > 64)
        threads = 64;
    std::vector<Sweep> results(threads);
    std::vector<std::thread> pool;
    const uint64_t per = total / threads + 1;
    for (unsigned t = 0; t < threads; t++) {
        const uint64_t begin = per * t, end = begin + per < total ? begin + per : total;
        pool.emplace_back([&results, t, begin, end, format] { results[t] = sweep(begin, end, format); });
    }
    uint64_t wrong = 0;
    for (unsigned t = 0; t < threads; t++) {
        pool[t].join();
        if (results[t].wrong && wrong == 0) {
            const uint32_t u = results[t].first;
            const float x = prism_qc_float(u);
            std::fprintf(stderr, "\n  0x%08x (%.9g): prism 0x%02x, cuda_fp8.h 0x%02x", u, (double)x,
                         prism_qc_fp8_encode(x, format),
                         (unsigned)__nv_cvt_float_to_fp8(x, __NV_SATFINITE,
                                                         format == PRISM_QC_E4M3 ? __NV_E4M3 : __NV_E5M2));
        }
        wrong += results[t].wrong;
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

void test_fp8_e4m3_encode_matches_cuda_fp8_for_every_float()
{
    check_every_float(PRISM_QC_E4M3);
}

void test_fp8_e5m2_encode_matches_cuda_fp8_for_every_float()
{
    check_every_float(PRISM_QC_E5M2);
}

/* Decoding is exact on both sides; NaN codes only have to give a NaN (cuda_fp8.h's is the
 * canonical one, prism keeps the sign). */
void test_fp8_decode_matches_cuda_fp8_for_every_code()
{
    for (int format : {PRISM_QC_E4M3, PRISM_QC_E5M2}) {
        const __nv_fp8_interpretation_t interp = format == PRISM_QC_E4M3 ? __NV_E4M3 : __NV_E5M2;
        unsigned wrong = 0;
        for (unsigned code = 0; code < 256; code++) {
            const float ours = prism_qc_fp8_decode((uint8_t)code, format);
            const float theirs = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, interp)));
            const bool same = std::isnan(theirs) ? std::isnan(ours)
                                                 : prism_qc_bits(ours) == prism_qc_bits(theirs);
            if (!same && wrong++ < 5)
                std::fprintf(stderr, "\n  format %d code 0x%02x: prism %.9g, cuda_fp8.h %.9g", format, code,
                             (double)ours, (double)theirs);
        }
        CU_ASSERT_EQUAL(wrong, 0);
    }
}

/* The quantizer's nearest rounding on top of the encoder: 0x80 (negative zero) becomes 0, which
 * is the fix-up the CUDA kernels apply to the hardware conversion's result. */
void test_fp8_nearest_code_is_the_conversion_without_negative_zero()
{
    for (int format : {PRISM_QC_E4M3, PRISM_QC_E5M2}) {
        const __nv_fp8_interpretation_t interp = format == PRISM_QC_E4M3 ? __NV_E4M3 : __NV_E5M2;
        unsigned wrong = 0;
        for (uint32_t u = 0; u < (1u << 24); u++) { /* every exponent, 15 mantissa bits, both signs */
            const uint32_t bits = (u & 0x800000u) << 8 | (u & 0x7fffffu) << 8 | (u & 0xffu);
            const float x = prism_qc_float(bits);
            if (prism_qc_nonfinite(x))
                continue;
            uint8_t c = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, interp);
            c = (c & 0x7fu) ? c : 0;
            wrong += prism_qc_code_nearest(x, format) != c;
        }
        CU_ASSERT_EQUAL(wrong, 0);
    }
}

const prism_test_case cases[] = {
    {"test_fp8_e4m3_encode_matches_cuda_fp8_for_every_float", test_fp8_e4m3_encode_matches_cuda_fp8_for_every_float},
    {"test_fp8_e5m2_encode_matches_cuda_fp8_for_every_float", test_fp8_e5m2_encode_matches_cuda_fp8_for_every_float},
    {"test_fp8_decode_matches_cuda_fp8_for_every_code", test_fp8_decode_matches_cuda_fp8_for_every_code},
    {"test_fp8_nearest_code_is_the_conversion_without_negative_zero",
     test_fp8_nearest_code_is_the_conversion_without_negative_zero},
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"fp8_cuda_host", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
