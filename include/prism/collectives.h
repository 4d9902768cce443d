/* Quantized all-reduce and reduce-scatter (DESIGN 10): gradients travel as FP8/INT8/INT4 codes with
 * one FP32 scale per row and are summed in FP32.
 *
 * The row layout. Every tensor of a call is flattened and cut into rows of `row_width` elements;
 * a tensor's last row is padded with zeros (a tensor never shares a row with another, and a 1-D
 * tensor is never one scale per element). The rows of all tensors, in list order, are then padded
 * with empty rows to a multiple of the world size P, and rank r owns the r-th of P equal slices
 * (rows_per_rank rows each). Any length and any world size work.
 *
 * The algorithm, on every rank:
 *   1. quantize every row (per-row scale, nearest rounding) into one send buffer, slice by slice;
 *   2. all-to-all: slice k goes to rank k, so each rank receives its slice from every peer;
 *   3. dequantize and accumulate the P contributions of its slice in FP32, in rank order 0..P-1
 *      (so the sum does not depend on arrival order): acc = 0, then acc = acc + code * scale for
 *      each rank, the product and the sum each rounded to binary32 (never a fused multiply-add);
 *      a sum beyond the binary32 range saturates to +-FLT_MAX (no rank sent a non-finite value,
 *      so none is made up), and AVG then divides each sum by P (one correctly rounded division);
 *   4. reduce-scatter stops here (the owner's FP32 rows are the result); all-reduce requantizes the
 *      slice (new per-row scales) and
 *   5. all-gathers the slices, and every rank dequantizes all rows into its tensors.
 * Every rank dequantizes the same bytes, so an all-reduce's result is bit-identical on all ranks
 * (the owner of a slice too: it uses the requantized values, not its FP32 sums). Both backends run
 * these steps with the kernels of kernels.h / cuda.h, which give the same bits on the CPU and the
 * GPU, so the MPI and NCCL backends give the same result for the same inputs and world size.
 *
 * The wire. A slice of rows_per_rank rows is one block of codes, row after row (row_width bytes a
 * row, or row_width / 2 for INT4, two per byte, low nibble first), followed by one block of the
 * rows' FP32 scales (host byte order): slice_bytes = rows_per_rank x row_bytes. A tensor's padding
 * elements are code 0; an empty padding row is codes 0 and scale 1.0 (what quantizing a row of
 * zeros writes). The all-to-all and the all-gather carry slices in this form, on both backends.
 *
 * Before the data, every rank sends every other one a fixed 80-byte header: the call (all-reduce
 * or reduce-scatter), wire, op, scale_mode, row_width, the number of tensors, the row count, a
 * hash of the list of tensor sizes, its count of non-finite inputs, and whether it refused its own
 * arguments. Every rank then checks the same headers the same way, so a mismatch, or a bad
 * argument on one rank, is PRISM_ERR_INVALID on every rank (with the same message on the ranks
 * that were not at fault) instead of a hang or silent corruption. Dtypes may differ between ranks:
 * each rank reads and writes only its own tensors.
 *
 * Wire bytes per rank and call (B = code bytes per element: 1, or 1/2 for INT4; N = padded rows
 * x row_width; P ranks): all-to-all (P-1)/P x N x (B + 4/row_width) sent and as much received,
 * and the all-gather as much again: 2 (P-1)/P N (B + 4/row_width), against 2 (P-1)/P N x 2 for a
 * ring all-reduce in BF16. FP8 with rows of 256: 0.508 of BF16. The 80-byte headers are not
 * counted (see prism_coll_stats).
 *
 * NaN and Inf inputs are sent as code 0 and counted; the count of the whole job (the same on
 * every rank) comes back in prism_coll_stats.nonfinite, so an overflow check (AMP's loss scaler)
 * still sees them.
 *
 * A communicator is used by one thread at a time; calls on it are collective and must be made in
 * the same order on every rank. */
#ifndef PRISM_COLLECTIVES_H
#define PRISM_COLLECTIVES_H

#include "prism/common.h"
#include "prism/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PRISM_COLL_ROW_WIDTH_DEFAULT 256u
#define PRISM_COLL_ROW_WIDTH_MAX 65536u

typedef enum prism_coll_op {
    PRISM_COLL_SUM = 0,
    PRISM_COLL_AVG = 1 /* the sum divided by the world size (in FP32, before requantizing) */
} prism_coll_op;

typedef struct prism_coll_spec {
    prism_precision wire;        /* INT8, FP8_E4M3, FP8_E5M2 or INT4 */
    uint32_t row_width;          /* elements per row and scale; 0: PRISM_COLL_ROW_WIDTH_DEFAULT;
                                    a multiple of 8 (so every slice's scales are 4-byte aligned
                                    and an INT4 row is whole bytes), at most
                                    PRISM_COLL_ROW_WIDTH_MAX */
    prism_coll_op op;
    prism_scale_mode scale_mode; /* FP32 (amax / qmax) or POW2 */
} prism_coll_spec;

/* A tensor the call reads and (all-reduce) overwrites: contiguous, FP32, BF16 or FP16, in host
 * memory for the MPI backend and device memory for NCCL. */
typedef struct prism_coll_tensor {
    void *data;
    size_t numel;
    prism_dtype dtype;
} prism_coll_tensor;

/* The row layout of a list of tensors on P ranks. */
typedef struct prism_coll_layout {
    size_t rows;            /* rows of the tensors (each tensor's last one padded) */
    size_t padded_rows;     /* rows rounded up to a multiple of the world size */
    size_t rows_per_rank;   /* padded_rows / world */
    size_t row_bytes;       /* bytes of one row on the wire: codes + its FP32 scale */
    uint64_t wire_bytes;    /* bytes one rank sends in an all-reduce (the formula above);
                               a reduce-scatter sends half of it */
    uint32_t row_width;     /* the spec's, with 0 resolved: a reduce-scatter's output is
                               rows_per_rank x row_width floats */
} prism_coll_layout;

/* What a call did, on this rank. Filled on success (zeroed first, so a failed call leaves zeros).
 * With NCCL every figure is known when the call returns (the headers were read on the host),
 * although the data is there only once the stream has run. */
typedef struct prism_coll_stats {
    uint64_t bytes_sent;     /* payload bytes this rank sent to other ranks: layout.wire_bytes for
                                an all-reduce, half for a reduce-scatter (the 80-byte header per
                                peer is not counted) */
    uint64_t bytes_received; /* payload bytes received from other ranks: the same figure */
    uint64_t nonfinite;      /* NaN/Inf input elements on all ranks together (sent as 0) */
} prism_coll_stats;

/* A communicator: made from an MPI_Comm (prism/collectives_mpi.h) or an ncclComm_t
 * (prism/collectives_nccl.h); the backend's own communicator is duplicated or borrowed as those
 * headers say. It owns its scratch buffers (grown to the largest call, freed by destroy). */
typedef struct prism_coll_comm prism_coll_comm;

int prism_coll_rank(const prism_coll_comm *c);
int prism_coll_size(const prism_coll_comm *c);
/* Frees the communicator and its buffers (NULL: nothing). Local: not a collective call. */
void prism_coll_comm_destroy(prism_coll_comm *c);

/* The layout of tensors on `world` ranks with spec (nothing is sent; data pointers are not
 * read, so they may be NULL here). count may be 0 (tensors may then be NULL): every figure 0 but
 * row_width. PRISM_ERR_INVALID names the field at fault: spec, wire, row_width, op, scale_mode,
 * tensors, tensors[i].dtype, world; PRISM_ERR_LIMIT when the sizes overflow size_t. */
prism_status prism_coll_layout_of(const prism_coll_spec *spec, const prism_coll_tensor *tensors, size_t count,
                                  int world, prism_coll_layout *out, prism_error *err);

/* All-reduce, in place: every tensor becomes the (quantized) sum or average over all ranks, the
 * same bits on every rank. Every rank must pass the same spec and the same list of sizes (checked
 * through the headers: a mismatch, or arguments one rank refuses, is PRISM_ERR_INVALID on every
 * rank). stats may be NULL. Collective: every rank calls it. A transport failure is PRISM_ERR_IO
 * with the backend's message; after one the communicator should not be used again. */
prism_status prism_coll_allreduce(prism_coll_comm *c, const prism_coll_spec *spec, prism_coll_tensor *tensors,
                                  size_t count, prism_coll_stats *stats, prism_error *err);

/* Reduce-scatter: this rank's slice of the FP32 sum (or average), rows
 * [rank * rows_per_rank, (rank + 1) * rows_per_rank) of the layout, row_width values each,
 * padding included (zeros), written to out (out_len floats, at least rows_per_rank * row_width;
 * host memory for MPI, device memory for NCCL; only the first rows_per_rank * row_width are
 * written). The tensors are not changed. */
prism_status prism_coll_reduce_scatter(prism_coll_comm *c, const prism_coll_spec *spec,
                                       const prism_coll_tensor *tensors, size_t count, float *out, size_t out_len,
                                       prism_coll_stats *stats, prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
