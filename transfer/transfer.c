/* The block transfer engine (DESIGN 9): the blocks and their quantized images, the counters, the
 * Conductor's slots, and the CPU backend. The CUDA backend's streams and events are in
 * transfer_cuda.cu; the contract of both is include/prism/transfer.h. */
#include "prism/transfer.h"
#ifdef PRISM_TRANSFER_HAVE_CUDA
#include "transfer_cuda.h"
#endif
#include "process_totals.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A block's codes + scales for one precision: codes at 0, zeros to a multiple of 16 bytes, then
 * the FP32 scales; one contiguous image, so one copy moves it. */
typedef struct transfer_image {
    uint8_t *data; /* host (pinned on CUDA); NULL until first made */
    size_t bytes;
    size_t code_bytes;
    size_t scales_offset;
    size_t groups; /* scales in the image */
    bool valid; /* made from the block's current weights */
    /* The last prepare's counts and elements (0 when none since registration / set_scale_mode). */
    prism_quant_counts counts;
    size_t counted_numel;
} transfer_image;

typedef struct transfer_block {
    bool present;
    size_t numel;
    uint16_t *host; /* the BF16 weights (pinned on CUDA) */
    /* Each group's largest finite |x| of the weights as registered (add_block), for STATIC
     * scales; one per group (the groups are the same in every low format). */
    float *reg_amax;
    size_t groups; /* scales per image: the same in every low format */
    /* DELAYED (allocated while it is the mode): a ring of the amax of the last hist_count (at
     * most the engine's hist_len) weight versions that were prepared, in any format, groups
     * floats each; hist_next is the slot the next version's goes to. cur_max: the history max
     * the current version's scales come from (valid when cur_ready); cur_pushed: the current
     * version's amax is in the ring. One history per block, whatever the formats fetched. */
    float *hist;
    float *cur_max;
    uint32_t hist_count;
    uint32_t hist_next;
    bool cur_ready;
    bool cur_pushed;
    transfer_image img[PRISM_PRECISION_COUNT]; /* [BF16] unused */
    uint64_t last_seq; /* the last transfer that read host or an image */
} transfer_block;

struct prism_transfer {
    prism_transfer_backend backend;
    prism_quant_spec spec; /* format set per precision */
    size_t max_numel;
    prism_conductor *conductor;
    transfer_block *blocks; /* indexed by block id */
    size_t capacity;
    uint64_t seq; /* the last transfer issued */
    prism_transfer_counters counters;
    prism_transfer_scale_mode scale_mode;
    uint32_t hist_len;  /* DELAYED: prepares of amax history */
    int32_t margin;     /* DELAYED: 2^margin */
    float *scratch;     /* a prepare's per-group amax (DELAYED), scratch_cap floats */
    size_t scratch_cap;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    transfer_cuda *cu;
#endif
};

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* ---- host memory ------------------------------------------------------------------------- */

static prism_status host_alloc(prism_transfer *t, size_t bytes, void **out, prism_error *err)
{
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA)
        return transfer_cuda_host_alloc(t->cu, bytes, out, err);
#else
    (void)t;
#endif
    /* 64-byte aligned like a cache line, so the kernels' vector paths apply. */
    *out = aligned_alloc(64, round_up(bytes ? bytes : 1, 64));
    if (!*out)
        return prism_error_set(err, PRISM_ERR_NOMEM, "host memory: %zu bytes not available", bytes);
    return PRISM_OK;
}

static void host_free(prism_transfer *t, void *p)
{
    if (!p)
        return;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        transfer_cuda_host_free(t->cu, p);
        return;
    }
#else
    (void)t;
#endif
    free(p);
}

/* ---- checks ------------------------------------------------------------------------------ */

static prism_status check_precision(prism_precision p, prism_error *err)
{
    if ((unsigned)p >= PRISM_PRECISION_COUNT)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "precision: %d is not bf16, int8, fp8_e4m3, fp8_e5m2 or int4", (int)p);
    return PRISM_OK;
}

static prism_status find_block(const prism_transfer *t, uint32_t block_id, transfer_block **out,
                               prism_error *err)
{
    if (!t)
        return prism_error_set(err, PRISM_ERR_INVALID, "transfer: NULL");
    if (block_id >= t->capacity || !t->blocks[block_id].present)
        return prism_error_set(err, PRISM_ERR_NOT_FOUND, "block_id: block %u is not registered",
                               (unsigned)block_id);
    *out = &t->blocks[block_id];
    return PRISM_OK;
}

/* The image layout of numel elements in precision p (not bf16). */
static prism_status image_layout(const prism_transfer *t, prism_precision p, size_t numel,
                                 transfer_image *img, prism_error *err)
{
    prism_quant_spec spec = t->spec;
    spec.format = p;
    size_t groups = 0, code_bytes = 0;
    prism_status st = prism_quant_layout(&spec, numel, &groups, NULL, &code_bytes, err);
    if (st != PRISM_OK) {
        prism_error_prefix(err, "quant");
        return st;
    }
    img->code_bytes = code_bytes;
    img->groups = groups;
    img->scales_offset = round_up(code_bytes, 16);
    img->bytes = img->scales_offset + groups * sizeof(float);
    return PRISM_OK;
}

/* The scale options' ranges (those of the config keys scale_mode, amax_history_len and
 * scale_margin; amax_history_len 0 stands for the default). */
static prism_status check_scale_options(prism_transfer_scale_mode mode, uint32_t hist_len, int32_t margin,
                                        prism_error *err)
{
    if ((unsigned)mode >= PRISM_TRANSFER_SCALE_MODE_COUNT)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "scale_mode: %d is not current (0), pow2 (1), delayed (2) or static (3)",
                               (int)mode);
    if (hist_len > PRISM_TRANSFER_AMAX_HISTORY_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "amax_history_len: %u is above %d", (unsigned)hist_len,
                               PRISM_TRANSFER_AMAX_HISTORY_MAX);
    if (margin < -PRISM_TRANSFER_SCALE_MARGIN_MAX || margin > PRISM_TRANSFER_SCALE_MARGIN_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "scale_margin: %d is outside -%d to %d", (int)margin,
                               PRISM_TRANSFER_SCALE_MARGIN_MAX, PRISM_TRANSFER_SCALE_MARGIN_MAX);
    return PRISM_OK;
}

/* ---- the engine --------------------------------------------------------------------------- */

prism_status prism_transfer_create(const prism_transfer_options *o, prism_transfer **out,
                                   prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    *out = NULL;
    if (!o)
        return prism_error_set(err, PRISM_ERR_INVALID, "options: NULL");
    if (o->backend != PRISM_TRANSFER_CPU && o->backend != PRISM_TRANSFER_CUDA)
        return prism_error_set(err, PRISM_ERR_INVALID, "backend: %d is not cpu (%d) or cuda (%d)",
                               (int)o->backend, PRISM_TRANSFER_CPU, PRISM_TRANSFER_CUDA);
    if (o->staging_buffers > PRISM_TRANSFER_MAX_STAGING)
        return prism_error_set(err, PRISM_ERR_INVALID, "staging_buffers: %u is above %d",
                               o->staging_buffers, PRISM_TRANSFER_MAX_STAGING);
    if (o->max_block_bytes < 2)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "max_block_bytes: %zu is less than one BF16 element", o->max_block_bytes);
    prism_status st = check_scale_options(o->scale_mode, o->amax_history_len, o->scale_margin, err);
    if (st != PRISM_OK)
        return st;
#ifndef PRISM_TRANSFER_HAVE_CUDA
    if (o->backend == PRISM_TRANSFER_CUDA)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "backend: this build of Prism has no CUDA");
#endif
    prism_quant_spec spec = {.granularity = PRISM_GRANULARITY_BLOCK,
                             .group = PRISM_QUANT_BLOCK_DEFAULT,
                             .scale_mode = PRISM_SCALE_FP32,
                             .rounding = PRISM_ROUNDING_NEAREST};
    if (o->quant)
        spec = *o->quant;
    spec.format = PRISM_PRECISION_INT8;
    if (spec.granularity == PRISM_GRANULARITY_BLOCK && spec.group == 0)
        spec.group = PRISM_QUANT_BLOCK_DEFAULT;
    /* The enums and the group; whether a row length divides a block is checked per block. */
    st = prism_quant_layout(&spec, spec.granularity == PRISM_GRANULARITY_ROW ? spec.group : 1,
                                         NULL, NULL, NULL, err);
    if (st != PRISM_OK) {
        prism_error_prefix(err, "quant");
        return st;
    }
    prism_transfer *t = calloc(1, sizeof *t);
    if (!t)
        return prism_error_set(err, PRISM_ERR_NOMEM, "transfer: out of memory");
    t->backend = o->backend;
    t->spec = spec;
    t->max_numel = o->max_block_bytes / 2;
    t->conductor = o->conductor;
    t->scale_mode = o->scale_mode;
    t->hist_len = o->amax_history_len ? o->amax_history_len : PRISM_TRANSFER_AMAX_HISTORY_DEFAULT;
    t->margin = o->scale_margin;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        /* A staging buffer holds the largest image: 8-bit codes (padded) and a scale per group. */
        size_t groups = spec.granularity == PRISM_GRANULARITY_TENSOR
                            ? 1
                            : (t->max_numel + spec.group - 1) / spec.group;
        size_t staging_bytes = round_up(t->max_numel, 16) + groups * sizeof(float);
        st = transfer_cuda_create(o->device, o->staging_buffers ? o->staging_buffers : 2, staging_bytes,
                                  &t->cu, err);
        if (st != PRISM_OK) {
            free(t);
            return st;
        }
    }
#endif
    *out = t;
    return PRISM_OK;
}

/* Looks at what has finished on the GPU and gives the Conductor back the slots of the copies that
 * are done. Nothing to do on the CPU, where a transfer ends inside its call. */
static prism_status reap(prism_transfer *t, prism_error *err)
{
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        unsigned done = 0;
        prism_status st = transfer_cuda_poll(t->cu, &done, err);
        for (unsigned i = 0; i < done && t->conductor; i++)
            prism_conductor_release(t->conductor, PRISM_CONDUCTOR_H2D, NULL);
        return st;
    }
#else
    (void)t;
    (void)err;
#endif
    return PRISM_OK;
}

prism_status prism_transfer_synchronize(prism_transfer *t, prism_error *err)
{
    if (!t)
        return prism_error_set(err, PRISM_ERR_INVALID, "transfer: NULL");
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        prism_status st = transfer_cuda_synchronize(t->cu, err);
        if (st != PRISM_OK)
            return st;
    }
#endif
    return reap(t, err);
}

void prism_transfer_destroy(prism_transfer *t)
{
    if (!t)
        return;
    prism_transfer_synchronize(t, NULL);
    for (size_t i = 0; i < t->capacity; i++) {
        transfer_block *b = &t->blocks[i];
        host_free(t, b->host);
        for (int p = 0; p < PRISM_PRECISION_COUNT; p++) {
            host_free(t, b->img[p].data);
        }
        free(b->reg_amax);
        free(b->hist);
        free(b->cur_max);
    }
    free(t->blocks);
    free(t->scratch);
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->cu)
        transfer_cuda_destroy(t->cu);
#endif
    free(t);
}

const char *prism_transfer_backend_name(const prism_transfer *t)
{
    return t && t->backend == PRISM_TRANSFER_CUDA ? "cuda" : "cpu";
}

/* ---- blocks ------------------------------------------------------------------------------- */

/* A block's DELAYED state for hist_len versions of `groups` amax: *hist and *cur_max, both freed
 * on failure. */
static prism_status delayed_alloc(size_t groups, uint32_t hist_len, float **hist, float **cur_max,
                                  prism_error *err)
{
    *hist = NULL;
    *cur_max = NULL;
    if (groups > SIZE_MAX / sizeof(float) / hist_len)
        return prism_error_set(err, PRISM_ERR_NOMEM, "amax history: too large");
    *hist = malloc((size_t)hist_len * groups * sizeof(float));
    *cur_max = malloc(groups * sizeof(float));
    if (!*hist || !*cur_max) {
        free(*hist);
        free(*cur_max);
        *hist = *cur_max = NULL;
        return prism_error_set(err, PRISM_ERR_NOMEM, "amax history: %zu floats not available",
                               (size_t)hist_len * groups + groups);
    }
    return PRISM_OK;
}

/* Each group's largest finite |x| of numel BF16 weights (0 when none), the groups of the engine's
 * spec: consecutive runs of the layout's group length (the last one shorter under BLOCK), the
 * amax the kernels take a group's scale from. */
static void group_amax(const prism_transfer *t, const uint16_t *bf16, size_t numel, float *out)
{
    prism_quant_spec spec = t->spec;
    spec.format = PRISM_PRECISION_INT8;
    size_t groups = 0, len = 0;
    prism_status st = prism_quant_layout(&spec, numel, &groups, &len, NULL, NULL);
    assert(st == PRISM_OK && len > 0); /* add_block made the same layout */
    (void)st;
    for (size_t g = 0; g < groups; g++) {
        float m = 0.0f;
        size_t end = (g + 1) * len < numel ? (g + 1) * len : numel;
        for (size_t i = g * len; i < end; i++) {
            float v = fabsf(prism_bf16_to_f32(bf16[i]));
            if (isfinite(v) && v > m)
                m = v;
        }
        out[g] = m;
    }
}

prism_status prism_transfer_add_block(prism_transfer *t, uint32_t block_id, const uint16_t *bf16,
                                      size_t numel, prism_error *err)
{
    if (!t)
        return prism_error_set(err, PRISM_ERR_INVALID, "transfer: NULL");
    if (block_id >= PRISM_TRANSFER_MAX_BLOCKS)
        return prism_error_set(err, PRISM_ERR_INVALID, "block_id: %u is above the limit %u",
                               (unsigned)block_id, PRISM_TRANSFER_MAX_BLOCKS - 1);
    if (numel == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "numel: block %u has no elements",
                               (unsigned)block_id);
    if (!bf16)
        return prism_error_set(err, PRISM_ERR_INVALID, "bf16: NULL for block %u", (unsigned)block_id);
    if (numel > t->max_numel)
        return prism_error_set(err, PRISM_ERR_LIMIT,
                               "numel: block %u has %zu elements (%zu bytes of BF16), above "
                               "max_block_bytes %zu",
                               (unsigned)block_id, numel, numel * 2, t->max_numel * 2);
    if (block_id < t->capacity && t->blocks[block_id].present)
        return prism_error_set(err, PRISM_ERR_STATE, "block_id: block %u is already registered",
                               (unsigned)block_id);
    transfer_image layout[PRISM_PRECISION_COUNT] = {{0}};
    for (int p = 1; p < PRISM_PRECISION_COUNT; p++) {
        prism_status st = image_layout(t, (prism_precision)p, numel, &layout[p], err);
        if (st != PRISM_OK) {
            prism_error_prefix(err, "block %u", (unsigned)block_id);
            return st;
        }
    }
    if (block_id >= t->capacity) {
        size_t cap = t->capacity ? t->capacity : 16;
        while (cap <= block_id)
            cap *= 2;
        if (cap > PRISM_TRANSFER_MAX_BLOCKS)
            cap = PRISM_TRANSFER_MAX_BLOCKS;
        transfer_block *grown = realloc(t->blocks, cap * sizeof *grown);
        if (!grown)
            return prism_error_set(err, PRISM_ERR_NOMEM, "blocks: out of memory");
        memset(grown + t->capacity, 0, (cap - t->capacity) * sizeof *grown);
        t->blocks = grown;
        t->capacity = cap;
    }
    transfer_block *b = &t->blocks[block_id];
    size_t groups = layout[PRISM_PRECISION_INT8].groups;
    float *reg_amax = malloc(groups * sizeof *reg_amax), *hist = NULL, *cur_max = NULL;
    if (!reg_amax)
        return prism_error_set(err, PRISM_ERR_NOMEM, "block %u: %zu group maxima not available", (unsigned)block_id,
                               groups);
    prism_status st = PRISM_OK;
    if (t->scale_mode == PRISM_TRANSFER_SCALE_DELAYED)
        st = delayed_alloc(groups, t->hist_len, &hist, &cur_max, err);
    void *host = NULL;
    if (st == PRISM_OK)
        st = host_alloc(t, numel * 2, &host, err);
    if (st != PRISM_OK) {
        free(reg_amax);
        free(hist);
        free(cur_max);
        return st;
    }
    memcpy(host, bf16, numel * 2);
    group_amax(t, bf16, numel, reg_amax);
    memset(b, 0, sizeof *b);
    b->present = true;
    b->numel = numel;
    b->host = host;
    b->reg_amax = reg_amax;
    b->groups = groups;
    b->hist = hist;
    b->cur_max = cur_max;
    for (int p = 1; p < PRISM_PRECISION_COUNT; p++)
        b->img[p] = layout[p];
    return PRISM_OK;
}

prism_status prism_transfer_update_block(prism_transfer *t, uint32_t block_id,
                                         const uint16_t *bf16, size_t numel, prism_error *err)
{
    transfer_block *b = NULL;
    prism_status st = find_block(t, block_id, &b, err);
    if (st != PRISM_OK)
        return st;
    if (!bf16)
        return prism_error_set(err, PRISM_ERR_INVALID, "bf16: NULL for block %u", (unsigned)block_id);
    if (numel != b->numel)
        return prism_error_set(err, PRISM_ERR_INVALID, "numel: block %u has %zu elements, not %zu",
                               (unsigned)block_id, b->numel, numel);
#ifdef PRISM_TRANSFER_HAVE_CUDA
    /* The old weights and images may still be on their way to the GPU. */
    if (t->backend == PRISM_TRANSFER_CUDA) {
        st = transfer_cuda_wait(t->cu, b->last_seq, true, err);
        if (st != PRISM_OK)
            return st;
    }
#endif
    memcpy(b->host, bf16, numel * 2);
    for (int p = 1; p < PRISM_PRECISION_COUNT; p++)
        b->img[p].valid = false;
    b->cur_ready = false; /* a new weight version */
    b->cur_pushed = false;
    return PRISM_OK;
}

/* A scratch buffer of n floats owned by the engine (grown as needed, never shrunk). */
static prism_status scratch(prism_transfer *t, size_t n, float **out, prism_error *err)
{
    if (n > t->scratch_cap) {
        float *grown = realloc(t->scratch, n * sizeof *grown);
        if (!grown)
            return prism_error_set(err, PRISM_ERR_NOMEM, "amax scratch: %zu floats not available", n);
        t->scratch = grown;
        t->scratch_cap = n;
    }
    *out = t->scratch;
    return PRISM_OK;
}

/* DELAYED: the scales of the block's current weight version in format spec->format, from the
 * max of its history's amax (the versions before it; for the first version, its own amax, found
 * by a pass that only reads), the same max for every format of the version; one pass that makes
 * the codes and, at the version's first prepare, its amax, which then enters the history. */
static prism_status quantize_delayed(prism_transfer *t, transfer_block *b, const prism_quant_spec *spec,
                                     const prism_tensor *x, float *scales, prism_quant_counts *counts,
                                     prism_error *err)
{
    size_t g_count = b->groups;
    assert(b->hist && b->cur_max); /* allocated while the mode is DELAYED */
    if (!b->cur_ready) {
        if (b->hist_count == 0) {
            group_amax(t, b->host, b->numel, b->cur_max);
        } else {
            for (size_t g = 0; g < g_count; g++) {
                float m = 0.0f;
                for (uint32_t h = 0; h < b->hist_count; h++) {
                    float v = b->hist[(size_t)h * g_count + g];
                    if (v > m)
                        m = v;
                }
                b->cur_max[g] = m;
            }
        }
        b->cur_ready = true;
        b->cur_pushed = false;
    }
    for (size_t g = 0; g < g_count; g++)
        scales[g] = prism_quant_scale_delayed(b->cur_max[g], t->margin, spec->format);
    float *amax = NULL;
    if (!b->cur_pushed) {
        prism_status st = scratch(t, g_count, &amax, err);
        if (st != PRISM_OK)
            return st;
    }
    prism_status st = prism_quantize_scaled_cpu(spec, x, scales, b->img[spec->format].data, amax, counts, err);
    if (st != PRISM_OK || b->cur_pushed)
        return st;
    memcpy(b->hist + (size_t)b->hist_next * g_count, amax, g_count * sizeof(float));
    b->hist_next = (b->hist_next + 1) % t->hist_len;
    if (b->hist_count < t->hist_len)
        b->hist_count++;
    b->cur_pushed = true;
    return PRISM_OK;
}

/* Makes the block's image for p from its weights under the engine's scale mode, unless it is
 * already made, and keeps the prepare's counts (block and engine totals). */
static prism_status prepare_image(prism_transfer *t, transfer_block *b, prism_precision p,
                                  prism_error *err)
{
    transfer_image *img = &b->img[p];
    if (p == PRISM_PRECISION_BF16 || img->valid)
        return PRISM_OK;
    if (!img->data) {
        void *data = NULL;
        prism_status st = host_alloc(t, img->bytes, &data, err);
        if (st != PRISM_OK)
            return st;
        img->data = data;
    }
    prism_quant_spec spec = t->spec;
    spec.format = p;
    if (t->scale_mode == PRISM_TRANSFER_SCALE_POW2)
        spec.scale_mode = PRISM_SCALE_POW2;
    prism_tensor x = {b->host, b->numel, PRISM_DTYPE_BF16};
    float *scales = (float *)(void *)(img->data + img->scales_offset);
    prism_quant_counts counts = {0};
    memset(img->data + img->code_bytes, 0, img->scales_offset - img->code_bytes);
    prism_status st = PRISM_OK;
    switch (t->scale_mode) {
    case PRISM_TRANSFER_SCALE_DELAYED:
        st = quantize_delayed(t, b, &spec, &x, scales, &counts, err);
        break;
    case PRISM_TRANSFER_SCALE_STATIC:
        /* The FP32 scales of the weights as registered: prism_quant_scale_delayed with margin 0
         * of a group's amax is amax / qmax, and 1 for amax 0, as the kernels' own. */
        for (size_t g = 0; g < img->groups; g++)
            scales[g] = prism_quant_scale_delayed(b->reg_amax[g], 0, p);
        st = prism_quantize_scaled_cpu(&spec, &x, scales, img->data, NULL, &counts, err);
        break;
    default: /* CURRENT, POW2 */
        st = prism_quantize_counted_cpu(&spec, &x, img->data, scales, &counts, err);
        break;
    }
    if (st != PRISM_OK)
        return st;
    img->valid = true;
    img->counts = counts;
    img->counted_numel = b->numel;
    t->counters.prepares++;
    t->counters.nonfinite += counts.nonfinite;
    t->counters.quantized[p] += b->numel;
    t->counters.saturated[p] += counts.saturated;
    t->counters.underflowed[p] += counts.underflowed;
    return PRISM_OK;
}

prism_status prism_transfer_prepare(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                    prism_error *err)
{
    transfer_block *b = NULL;
    prism_status st = find_block(t, block_id, &b, err);
    if (st == PRISM_OK)
        st = check_precision(precision, err);
    if (st == PRISM_OK)
        st = prepare_image(t, b, precision, err);
    return st;
}

prism_status prism_transfer_wire_bytes(const prism_transfer *t, uint32_t block_id,
                                       prism_precision precision, size_t *bytes, prism_error *err)
{
    transfer_block *b = NULL;
    prism_status st = find_block(t, block_id, &b, err);
    if (st == PRISM_OK)
        st = check_precision(precision, err);
    if (st != PRISM_OK)
        return st;
    if (!bytes)
        return prism_error_set(err, PRISM_ERR_INVALID, "bytes: NULL");
    *bytes = precision == PRISM_PRECISION_BF16 ? b->numel * 2 : b->img[precision].bytes;
    return PRISM_OK;
}

/* ---- fetch -------------------------------------------------------------------------------- */

/* A slot for a demand fetch: a free one; else, while the engine's own copies hold slots, the
 * oldest of them waited for; else one taken anyway. */
static prism_status acquire_demand(prism_transfer *t, prism_error *err)
{
    prism_conductor *c = t->conductor;
#ifndef PRISM_TRANSFER_HAVE_CUDA
    (void)err;
#endif
    while (!prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D)) {
        bool waited = false;
#ifdef PRISM_TRANSFER_HAVE_CUDA
        if (t->backend == PRISM_TRANSFER_CUDA) {
            prism_status st = transfer_cuda_wait_oldest_copy(t->cu, &waited, err);
            if (st == PRISM_OK)
                st = reap(t, err);
            if (st != PRISM_OK)
                return st;
        }
#endif
        if (!waited) {
            prism_conductor_acquire_anyway(c, PRISM_CONDUCTOR_H2D);
            t->counters.demand_over_limit++;
            break;
        }
        t->counters.demand_waits++;
    }
    return PRISM_OK;
}

/* The transfer itself, once the slot is held: the CPU does it now, CUDA queues it. */
static prism_status issue(prism_transfer *t, transfer_block *b, prism_precision p, void *dst,
                          prism_cuda_stream dst_stream, uint64_t seq, prism_error *err)
{
    const transfer_image *img = &b->img[p];
    prism_quant_spec spec = t->spec;
    spec.format = p;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        transfer_cuda_job job = {.seq = seq,
                                 .dst = dst,
                                 .dst_stream = dst_stream,
                                 .numel = b->numel};
        if (p == PRISM_PRECISION_BF16) {
            job.src = b->host;
            job.bytes = b->numel * 2;
        } else {
            job.src = img->data;
            job.bytes = img->bytes;
            job.spec = &spec;
            job.scales_offset = img->scales_offset;
        }
        return transfer_cuda_issue(t->cu, &job, err);
    }
#else
    (void)dst_stream;
    (void)seq;
#endif
    if (p == PRISM_PRECISION_BF16) {
        memcpy(dst, b->host, b->numel * 2);
        return PRISM_OK;
    }
    return prism_dequantize_cpu(&spec, img->data, (const float *)(const void *)(img->data + img->scales_offset),
                                b->numel, dst, PRISM_DTYPE_BF16, err);
}

static prism_status start(prism_transfer *t, uint32_t block_id, prism_precision precision, void *dst,
                          prism_cuda_stream dst_stream, const prism_conductor_request *why,
                          prism_transfer_ticket *ticket, prism_error *err)
{
    transfer_block *b = NULL;
    prism_status st = find_block(t, block_id, &b, err);
    if (st == PRISM_OK)
        st = check_precision(precision, err);
    if (st != PRISM_OK)
        return st;
    if (!dst)
        return prism_error_set(err, PRISM_ERR_INVALID, "dst: NULL");
    if (why && (unsigned)why->phase > PRISM_CONDUCTOR_OPTIMIZER)
        return prism_error_set(err, PRISM_ERR_INVALID, "phase: %d is not forward, backward or optimizer",
                               (int)why->phase);
    if (ticket)
        *ticket = (prism_transfer_ticket){0, PRISM_CONDUCTOR_ALLOW};
    st = reap(t, err);
    if (st != PRISM_OK)
        return st;

    bool slot = false;
    if (why && t->conductor) {
        prism_conductor_verdict v = prism_conductor_may_prefetch(t->conductor, why);
        if (v == PRISM_CONDUCTOR_ALLOW && !prism_conductor_try_acquire(t->conductor, PRISM_CONDUCTOR_H2D))
            v = PRISM_CONDUCTOR_REFUSE_SLOTS;
        if (v != PRISM_CONDUCTOR_ALLOW) {
            t->counters.refused[v]++;
            if (ticket)
                ticket->verdict = v;
            return PRISM_OK;
        }
        slot = true;
    } else if (why && why->distance == 0) {
        t->counters.refused[PRISM_CONDUCTOR_REFUSE_WINDOW]++;
        if (ticket)
            ticket->verdict = PRISM_CONDUCTOR_REFUSE_WINDOW;
        return PRISM_OK;
    }

    st = prepare_image(t, b, precision, err);
    if (st == PRISM_OK && !why && t->conductor) {
        st = acquire_demand(t, err);
        slot = st == PRISM_OK;
    }
    uint64_t seq = t->seq + 1;
    if (st == PRISM_OK)
        st = issue(t, b, precision, dst, dst_stream, seq, err);
    /* The CPU's transfer is over; a failed one never started. CUDA's slot goes back at reap. */
    if (slot && (st != PRISM_OK || t->backend == PRISM_TRANSFER_CPU))
        prism_conductor_release(t->conductor, PRISM_CONDUCTOR_H2D, NULL);
    if (st != PRISM_OK)
        return st;

    t->seq = seq;
    b->last_seq = seq;
    size_t wire = precision == PRISM_PRECISION_BF16 ? b->numel * 2 : b->img[precision].bytes;
    t->counters.fetches[precision]++;
    t->counters.wire_bytes[precision] += wire;
    t->counters.bf16_bytes[precision] += b->numel * 2;
    prism_totals_add_transfer(precision, wire, (uint64_t)b->numel * 2); /* for the agent (DESIGN 12) */
    if (why)
        t->counters.prefetches++;
    if (ticket)
        ticket->seq = seq;
    return PRISM_OK;
}

prism_status prism_transfer_fetch(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                  void *dst, prism_cuda_stream dst_stream,
                                  prism_transfer_ticket *ticket, prism_error *err)
{
    return start(t, block_id, precision, dst, dst_stream, NULL, ticket, err);
}

prism_status prism_transfer_prefetch(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                     void *dst, prism_cuda_stream dst_stream,
                                     const prism_conductor_request *why,
                                     prism_transfer_ticket *ticket, prism_error *err)
{
    if (!why)
        return prism_error_set(err, PRISM_ERR_INVALID, "why: NULL (a prefetch says its phase and distance)");
    return start(t, block_id, precision, dst, dst_stream, why, ticket, err);
}

/* ---- tickets ------------------------------------------------------------------------------ */

static prism_status check_ticket(const prism_transfer *t, const prism_transfer_ticket *ticket,
                                 prism_error *err)
{
    if (!t)
        return prism_error_set(err, PRISM_ERR_INVALID, "transfer: NULL");
    if (!ticket)
        return prism_error_set(err, PRISM_ERR_INVALID, "ticket: NULL");
    if (ticket->seq > t->seq)
        return prism_error_set(err, PRISM_ERR_INVALID, "ticket: %llu was not issued by this engine",
                               (unsigned long long)ticket->seq);
    return PRISM_OK;
}

prism_status prism_transfer_ticket_query(prism_transfer *t, const prism_transfer_ticket *ticket,
                                         bool *done, prism_error *err)
{
    prism_status st = check_ticket(t, ticket, err);
    if (st != PRISM_OK)
        return st;
    if (!done)
        return prism_error_set(err, PRISM_ERR_INVALID, "done: NULL");
    *done = true;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        st = transfer_cuda_query(t->cu, ticket->seq, done, err);
        if (st == PRISM_OK)
            st = reap(t, err);
    }
#endif
    return st;
}

prism_status prism_transfer_ticket_wait(prism_transfer *t, const prism_transfer_ticket *ticket,
                                        prism_error *err)
{
    prism_status st = check_ticket(t, ticket, err);
    if (st != PRISM_OK)
        return st;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA) {
        st = transfer_cuda_wait(t->cu, ticket->seq, false, err);
        if (st == PRISM_OK)
            st = reap(t, err);
    }
#endif
    return st;
}

prism_status prism_transfer_ticket_wait_stream(prism_transfer *t, const prism_transfer_ticket *ticket,
                                               prism_cuda_stream stream, prism_error *err)
{
    prism_status st = check_ticket(t, ticket, err);
    if (st != PRISM_OK)
        return st;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    if (t->backend == PRISM_TRANSFER_CUDA)
        st = transfer_cuda_wait_stream(t->cu, ticket->seq, stream, err);
#else
    (void)stream;
#endif
    return st;
}

void prism_transfer_get_counters(const prism_transfer *t, prism_transfer_counters *out)
{
    *out = t->counters;
}

prism_status prism_transfer_set_scale_mode(prism_transfer *t, prism_transfer_scale_mode mode,
                                           uint32_t amax_history_len, int32_t scale_margin,
                                           prism_error *err)
{
    if (!t)
        return prism_error_set(err, PRISM_ERR_INVALID, "transfer: NULL");
    prism_status st = check_scale_options(mode, amax_history_len, scale_margin, err);
    if (st != PRISM_OK)
        return st;
    uint32_t hist_len = amax_history_len ? amax_history_len : PRISM_TRANSFER_AMAX_HISTORY_DEFAULT;
    if (mode == t->scale_mode && hist_len == t->hist_len && scale_margin == t->margin)
        return PRISM_OK;
#ifdef PRISM_TRANSFER_HAVE_CUDA
    /* Images about to be made again may still be on their way to the GPU. */
    if (t->backend == PRISM_TRANSFER_CUDA) {
        st = transfer_cuda_synchronize(t->cu, err);
        if (st == PRISM_OK)
            st = reap(t, err);
        if (st != PRISM_OK)
            return st;
    }
#endif
    /* Under DELAYED every block starts a history of hist_len versions: all allocated first, so
     * that running out of memory changes nothing. */
    float **fresh = NULL; /* hist and cur_max of block i at 2i, 2i + 1 */
    if (mode == PRISM_TRANSFER_SCALE_DELAYED && t->capacity) {
        fresh = calloc(2 * t->capacity, sizeof *fresh);
        if (!fresh)
            return prism_error_set(err, PRISM_ERR_NOMEM, "amax history: out of memory");
        for (size_t i = 0; i < t->capacity && st == PRISM_OK; i++)
            if (t->blocks[i].present)
                st = delayed_alloc(t->blocks[i].groups, hist_len, &fresh[2 * i], &fresh[2 * i + 1], err);
        if (st != PRISM_OK) {
            for (size_t i = 0; i < 2 * t->capacity; i++)
                free(fresh[i]);
            free(fresh);
            return st;
        }
    }
    for (size_t i = 0; i < t->capacity; i++) {
        transfer_block *b = &t->blocks[i];
        if (!b->present)
            continue;
        for (int p = 1; p < PRISM_PRECISION_COUNT; p++) {
            transfer_image *img = &b->img[p];
            img->valid = false;
            img->counts = (prism_quant_counts){0};
            img->counted_numel = 0;
        }
        free(b->hist);
        free(b->cur_max);
        b->hist = fresh ? fresh[2 * i] : NULL;
        b->cur_max = fresh ? fresh[2 * i + 1] : NULL;
        b->hist_count = 0;
        b->hist_next = 0;
        b->cur_ready = false;
        b->cur_pushed = false;
    }
    free(fresh);
    t->scale_mode = mode;
    t->hist_len = hist_len;
    t->margin = scale_margin;
    return PRISM_OK;
}

prism_status prism_transfer_block_counts(const prism_transfer *t, uint32_t block_id,
                                         prism_precision precision, prism_quant_counts *counts,
                                         size_t *numel, prism_error *err)
{
    transfer_block *b = NULL;
    prism_status st = find_block(t, block_id, &b, err);
    if (st == PRISM_OK)
        st = check_precision(precision, err);
    if (st != PRISM_OK)
        return st;
    if (precision == PRISM_PRECISION_BF16)
        return prism_error_set(err, PRISM_ERR_INVALID, "precision: bf16 is not quantized");
    if (counts)
        *counts = b->img[precision].counts;
    if (numel)
        *numel = b->img[precision].counted_numel;
    return PRISM_OK;
}

const char *prism_transfer_scale_mode_name(prism_transfer_scale_mode mode)
{
    static const char *const names[PRISM_TRANSFER_SCALE_MODE_COUNT] = {"current", "pow2", "delayed", "static"};
    return (unsigned)mode < PRISM_TRANSFER_SCALE_MODE_COUNT ? names[mode] : "?";
}
