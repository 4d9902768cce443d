/* prism_dequantize_accumulate_cuda: acc[i] = acc[i] + decode(code i) * scale, the product and the
 * sum each rounded to binary32 (never fused), which is prism_dequantize_accumulate_cpu bit for
 * bit. The kernel is in decode.cuh. */
#include "decode.cuh"

using namespace prism_cu;

extern "C" prism_status prism_dequantize_accumulate_cuda(const prism_quant_spec *spec,
                                                         const uint8_t *codes, const float *scales,
                                                         size_t numel, float *acc,
                                                         prism_cuda_stream stream, prism_error *err)
{
    DecodeArgs a;
    prism_status st = decode_setup(spec, codes, scales, numel, acc, &a, err);
    if (st != PRISM_OK)
        return st;
    if (numel == 0)
        return PRISM_OK;
    return decode_format<PRISM_DTYPE_F32, true>(spec->format, a, as_stream(stream), err);
}
