/* prism_dequantize_cuda: prism_dequantize_cpu's outputs, bit for bit (the kernel is in
 * decode.cuh, shared with the accumulating variant). */
#include "decode.cuh"

using namespace prism_cu;

extern "C" prism_status prism_dequantize_cuda(const prism_quant_spec *spec, const uint8_t *codes,
                                              const float *scales, size_t numel, void *out,
                                              prism_dtype out_dtype, prism_cuda_stream stream,
                                              prism_error *err)
{
    DecodeArgs a;
    prism_status st = decode_setup(spec, codes, scales, numel, out, &a, err);
    if (st != PRISM_OK)
        return st;
    int dtype;
    memcpy(&dtype, &out_dtype, sizeof dtype); /* as an int: see dtype_bytes */
    if (dtype_bytes(dtype) == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "out_dtype: unknown dtype %d", dtype);
    if (numel == 0)
        return PRISM_OK;
    cudaStream_t s = as_stream(stream);
    switch (out_dtype) {
    case PRISM_DTYPE_F32: return decode_format<PRISM_DTYPE_F32, false>(spec->format, a, s, err);
    case PRISM_DTYPE_BF16: return decode_format<PRISM_DTYPE_BF16, false>(spec->format, a, s, err);
    default: return decode_format<PRISM_DTYPE_F16, false>(spec->format, a, s, err);
    }
}
