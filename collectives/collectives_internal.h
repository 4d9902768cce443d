/* Inside the quantized collectives (include/prism/collectives.h): the communicator, the backend
 * table and the host implementation of the element work, shared by collectives.c (the core that
 * runs the five steps), collectives_mpi.c, collectives_nccl.cu and the tests.
 *
 * A backend is two things behind one table: a memory space with the element work done in it
 * (host memory with the kernels of kernels.h, or device memory with those of cuda.h on a stream)
 * and a transport (MPI, NCCL). The core decides every byte and every rounding: which rows go
 * where, the order of the sums, AVG, the requantization; a backend only carries out the steps it
 * is given, so both backends put the same bytes on the wire and give the same results. */
#ifndef PRISM_COLLECTIVES_COLLECTIVES_INTERNAL_H
#define PRISM_COLLECTIVES_COLLECTIVES_INTERNAL_H

#include "prism/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What every rank sends every other one before the data (collectives.h: "Before the data").
 * Ten 64-bit words, 80 bytes, the same on every architecture Prism runs on (little-endian, LP64). */
typedef struct prism_coll_header {
    uint64_t magic;      /* PRISM_COLL_MAGIC | kind (1 all-reduce, 2 reduce-scatter) */
    uint64_t refused;    /* 0, or the prism_status this rank's own checks or set-up returned */
    uint64_t wire, op, scale_mode, row_width;
    uint64_t count;      /* tensors in the list */
    uint64_t rows;       /* layout rows */
    uint64_t sizes_hash; /* FNV-1a 64 of the tensors' numel values (as 64-bit little-endian) */
    uint64_t nonfinite;  /* NaN/Inf inputs this rank quantized */
} prism_coll_header;

#define PRISM_COLL_MAGIC UINT64_C(0x5052534d434f4c00) /* "PRSMCOL\0" */
#define PRISM_COLL_KIND_ALLREDUCE 1u
#define PRISM_COLL_KIND_REDUCE_SCATTER 2u

/* A quantize slot that is not counted into the header (the requantization of the FP32 sums,
 * which are finite by construction). */
#define PRISM_COLL_NO_SLOT ((size_t)-1)

typedef struct prism_coll_backend {
    const char *name; /* "mpi", "nccl", or a test's */

    /* Around each collective call (may be NULL): make the backend's device current, and put the
     * caller's back. end is called once for every begin that returned PRISM_OK. */
    prism_status (*begin)(prism_coll_comm *c, prism_error *err);
    void (*end)(prism_coll_comm *c);

    /* Memory of the backend's space. alloc gives at least `bytes` (bytes > 0) bytes, aligned for
     * any scalar type; release takes NULL. */
    prism_status (*alloc)(prism_coll_comm *c, void **p, size_t bytes, prism_error *err);
    void (*release)(prism_coll_comm *c, void *p);

    /* The element work, each the kernel of the same name on the backend's memory: quantize's
     * NaN/Inf count goes to c->counters[slot] (not counted when slot is PRISM_COLL_NO_SLOT). */
    prism_status (*quantize)(prism_coll_comm *c, const prism_quant_spec *spec, const prism_tensor *x,
                             uint8_t *codes, float *scales, size_t slot, prism_error *err);
    prism_status (*accumulate)(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                               const float *scales, size_t numel, float *acc, prism_error *err);
    prism_status (*dequantize)(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                               const float *scales, size_t numel, void *out, prism_dtype out_dtype,
                               prism_error *err);
    /* bytes bytes of dst set to 0. */
    prism_status (*zero)(prism_coll_comm *c, void *dst, size_t bytes, prism_error *err);
    /* n floats set to 1.0f (the scales of empty padding rows). */
    prism_status (*fill_ones)(prism_coll_comm *c, float *dst, size_t n, prism_error *err);
    /* acc[i] clamped to [-FLT_MAX, FLT_MAX], then divided by divisor when divisor > 1 (one
     * binary32 division, correctly rounded). */
    prism_status (*finish_sum)(prism_coll_comm *c, float *acc, size_t n, int divisor, prism_error *err);

    /* The transport. exchange_headers first adds c->counters[0 .. slots) into mine->nonfinite,
     * then gives every rank every rank's header (all: c->size entries, host memory, in rank
     * order). It is the one place where the host waits for the backend's queued work. */
    prism_status (*exchange_headers)(prism_coll_comm *c, prism_coll_header *mine, size_t slots,
                                     prism_coll_header *all, prism_error *err);
    /* Slice k of send (slice_bytes = rows * row_bytes) to rank k; slice k of recv from rank k. */
    prism_status (*alltoall)(prism_coll_comm *c, const uint8_t *send, uint8_t *recv, size_t row_bytes,
                             size_t rows, prism_error *err);
    /* In place: slice `rank` of buf is this rank's; afterwards slice k is rank k's. */
    prism_status (*allgather)(prism_coll_comm *c, uint8_t *buf, size_t row_bytes, size_t rows,
                              prism_error *err);

    /* Frees the backend's state (impl), after the core released the scratch. */
    void (*destroy)(prism_coll_comm *c);
} prism_coll_backend;

/* The communicator. The scratch buffers are in the backend's memory, allocated and released by
 * the core through the table, and owned by the communicator: grown to the largest call, never
 * shrunk, freed by prism_coll_comm_destroy. */
struct prism_coll_comm {
    const prism_coll_backend *be;
    void *impl; /* the backend's own state, freed by be->destroy */
    int rank, size;
    uint8_t *wire_a;  /* the all-to-all's send buffer, then the all-gather's (padded_rows rows) */
    uint8_t *wire_b;  /* the all-to-all's receive buffer (padded_rows rows) */
    float *acc;       /* the FP32 sums of this rank's slice (rows_per_rank x row_width) */
    uint64_t *counters; /* one NaN/Inf count per quantize call before the headers */
    size_t wire_a_cap, wire_b_cap, acc_cap, counters_cap; /* bytes */
    prism_coll_header *headers; /* host: size entries, for exchange_headers */
};

/* Makes a communicator around a backend's state (taking ownership of impl: on failure
 * be->destroy is called on it). */
prism_status prism_coll_comm_new(const prism_coll_backend *be, void *impl, int rank, int size,
                                 prism_coll_comm **out, prism_error *err);

/* The host memory space and its element work (kernels.h), for host transports (MPI, tests). */
prism_status prism_coll_host_alloc(prism_coll_comm *c, void **p, size_t bytes, prism_error *err);
void prism_coll_host_release(prism_coll_comm *c, void *p);
prism_status prism_coll_host_quantize(prism_coll_comm *c, const prism_quant_spec *spec, const prism_tensor *x,
                                      uint8_t *codes, float *scales, size_t slot, prism_error *err);
prism_status prism_coll_host_accumulate(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                                        const float *scales, size_t numel, float *acc, prism_error *err);
prism_status prism_coll_host_dequantize(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                                        const float *scales, size_t numel, void *out, prism_dtype out_dtype,
                                        prism_error *err);
prism_status prism_coll_host_zero(prism_coll_comm *c, void *dst, size_t bytes, prism_error *err);
prism_status prism_coll_host_fill_ones(prism_coll_comm *c, float *dst, size_t n, prism_error *err);
prism_status prism_coll_host_finish_sum(prism_coll_comm *c, float *acc, size_t n, int divisor, prism_error *err);
/* The sum of c->counters[0 .. slots), host memory. */
uint64_t prism_coll_host_nonfinite(const prism_coll_comm *c, size_t slots);

#ifdef __cplusplus
}
#endif

#endif
