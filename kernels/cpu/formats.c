/* The public scalar conversions and the quantization layout (kernels.h), all on quant_core.h. */
#include "cpu.h"
#include "quant_core.h"

float prism_bf16_to_f32(uint16_t bits)
{
    return prism_qc_bf16_to_f32(bits);
}

float prism_f16_to_f32(uint16_t bits)
{
    return prism_qc_f16_to_f32(bits);
}

uint16_t prism_f32_to_bf16(float x)
{
    return prism_qc_f32_to_bf16(x);
}

uint16_t prism_f32_to_f16(float x)
{
    return prism_qc_f32_to_f16(x);
}

static bool is_fp8(prism_precision format)
{
    return format == PRISM_PRECISION_FP8_E4M3 || format == PRISM_PRECISION_FP8_E5M2;
}

uint8_t prism_f32_to_fp8(float x, prism_precision format)
{
    return is_fp8(format) ? prism_qc_fp8_encode(x, (int)format) : 0;
}

float prism_fp8_to_f32(uint8_t code, prism_precision format)
{
    return is_fp8(format) ? prism_qc_fp8_decode(code, (int)format) : 0.0f;
}

void prism_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    prism_qc_philox(ctr, key, out);
}

float prism_quant_qmax(prism_precision format)
{
    return prism_qc_qmax((int)format);
}

size_t prism_dtype_size(prism_dtype dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return 4;
    case PRISM_DTYPE_BF16:
    case PRISM_DTYPE_F16: return 2;
    default: return 0;
    }
}

prism_status prism_quant_layout(const prism_quant_spec *spec, size_t numel, size_t *groups,
                                size_t *group_len, size_t *code_bytes, prism_error *err)
{
    if (!spec)
        return prism_error_set(err, PRISM_ERR_INVALID, "quantization spec is NULL");
    switch (spec->format) {
    case PRISM_PRECISION_INT8:
    case PRISM_PRECISION_FP8_E4M3:
    case PRISM_PRECISION_FP8_E5M2:
    case PRISM_PRECISION_INT4: break;
    case PRISM_PRECISION_BF16:
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "format: bf16 is not a quantized format (int8, fp8_e4m3, fp8_e5m2, int4)");
    default:
        return prism_error_set(err, PRISM_ERR_INVALID, "format: unknown precision %d", (int)spec->format);
    }
    if (spec->scale_mode != PRISM_SCALE_FP32 && spec->scale_mode != PRISM_SCALE_POW2)
        return prism_error_set(err, PRISM_ERR_INVALID, "scale_mode: unknown value %d (fp32 0, pow2 1)",
                               (int)spec->scale_mode);
    if (spec->rounding != PRISM_ROUNDING_NEAREST && spec->rounding != PRISM_ROUNDING_STOCHASTIC)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "rounding: unknown value %d (nearest 0, stochastic 1)", (int)spec->rounding);
    size_t len, count;
    switch (spec->granularity) {
    case PRISM_GRANULARITY_TENSOR:
        len = numel;
        count = numel ? 1 : 0;
        break;
    case PRISM_GRANULARITY_ROW:
        if (spec->group == 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "group: the row length must be at least 1");
        if (numel % spec->group)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "group: %zu elements are not a whole number of rows of %zu", numel,
                                   spec->group);
        len = spec->group;
        count = numel / len;
        break;
    case PRISM_GRANULARITY_BLOCK:
        len = spec->group ? spec->group : PRISM_QUANT_BLOCK_DEFAULT;
        count = numel / len + (numel % len != 0);
        break;
    default:
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "granularity: unknown value %d (tensor 0, row 1, block 2)",
                               (int)spec->granularity);
    }
    if (groups)
        *groups = count;
    if (group_len)
        *group_len = len;
    if (code_bytes)
        *code_bytes = spec->format == PRISM_PRECISION_INT4 ? numel / 2 + numel % 2 : numel;
    return PRISM_OK;
}
