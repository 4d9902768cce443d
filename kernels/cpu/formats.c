/* The public scalar conversions and the quantization layout (kernels.h), all on quant_core.h. */
#include "checks.h"
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

prism_status prism_check_tensor(const prism_tensor *x, const char *what, size_t index,
                                prism_error *err)
{
    if (!x)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s %zu: tensor is NULL", what, index);
    if (prism_dtype_size(x->dtype) == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s %zu: unknown dtype %d", what, index,
                               (int)x->dtype);
    if (x->numel && !x->data)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s %zu: %zu elements but no data", what,
                               index, x->numel);
    return PRISM_OK;
}

prism_status prism_check_blocks(const prism_tensor *tensors, const size_t *block_start,
                                size_t blocks, const void *out, size_t *count, prism_error *err)
{
    *count = 0;
    if (blocks && (!block_start || !out))
        return prism_error_set(err, PRISM_ERR_INVALID, "grad_stats: block_start or out is NULL");
    if (blocks == 0)
        return PRISM_OK;
    if (block_start[0] != 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "block_start[0] is %zu, not 0", block_start[0]);
    for (size_t b = 0; b < blocks; b++)
        if (block_start[b + 1] < block_start[b])
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "block_start[%zu] = %zu is below block_start[%zu] = %zu", b + 1,
                                   block_start[b + 1], b, block_start[b]);
    size_t n = block_start[blocks];
    if (n && !tensors)
        return prism_error_set(err, PRISM_ERR_INVALID, "grad_stats: %zu tensors but tensors is NULL", n);
    if (n > UINT32_MAX)
        return prism_error_set(err, PRISM_ERR_LIMIT, "grad_stats: %zu tensors in one call (limit %u)",
                               n, UINT32_MAX);
    for (size_t t = 0; t < n; t++) {
        prism_status st = prism_check_tensor(&tensors[t], "tensor", t, err);
        if (st != PRISM_OK)
            return st;
    }
    *count = n;
    return PRISM_OK;
}

prism_status prism_check_pair(const prism_tensor *a, const prism_tensor *b, const void *out,
                              prism_error *err)
{
    prism_status st = prism_check_tensor(a, "tensor a", 0, err);
    if (st == PRISM_OK)
        st = prism_check_tensor(b, "tensor b", 0, err);
    if (st != PRISM_OK)
        return st;
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "relative_error: out is NULL");
    if (a->numel != b->numel)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "relative_error: a has %zu elements and b has %zu", a->numel, b->numel);
    return PRISM_OK;
}

float prism_quant_scale_delayed(float hist_max, int margin, prism_precision format)
{
    return prism_qc_scale_delayed(hist_max, margin, (int)format);
}
