/* The C collectives' all-reduce on inputs read from files: the reference that
 * tests/python/test_torch_ddp.py holds prism.torch's DDP hook to, byte for byte. Run under
 * mpirun with P ranks as `coll_allreduce_files DIR`: rank r reads DIR/in.<r> and writes
 * DIR/out.<r> (written whole, then renamed into place).
 *
 * Every number in both files is a 64-bit little-endian unsigned word.
 *   in.<r>:  cases; then per case: wire (prism_precision), op (prism_coll_op), row_width, count;
 *            count x (dtype (prism_dtype), numel); then the count tensors' elements, one after
 *            the other (numel x 4 or 2 bytes each, as the machine stores them).
 *   out.<r>: per case: status (prism_status), bytes_sent, bytes_received, nonfinite (the
 *            prism_coll_stats of the call); then the tensors as the call left them, in the same
 *            form as their input.
 * Every rank runs every case with prism_coll_allreduce (FP32 scales) on one communicator made
 * from MPI_COMM_WORLD. The exit status is 0 when the files could be read and written (a call
 * that fails is written with its status, and its message printed on stderr). */
#include "prism/collectives.h"
#include "prism/collectives_mpi.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define TOOL_LEAK_CHECK 1
#endif

#define MAX_TENSORS 4096u
#define MAX_NUMEL (UINT64_C(1) << 28)

static size_t elem_size(uint64_t dtype)
{
    return dtype == PRISM_DTYPE_F32 ? 4 : (dtype == PRISM_DTYPE_BF16 || dtype == PRISM_DTYPE_F16) ? 2 : 0;
}

/* One word, false at the end of the file. */
static bool read_u64(FILE *f, uint64_t *v)
{
    uint8_t b[8];
    if (fread(b, 1, sizeof b, f) != sizeof b)
        return false;
    *v = 0;
    for (int i = 7; i >= 0; i--)
        *v = (*v << 8) | b[i];
    return true;
}

static bool write_u64(FILE *f, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return fwrite(b, 1, sizeof b, f) == sizeof b;
}

typedef struct one_case {
    prism_coll_spec spec;
    size_t count;
    prism_coll_tensor *tensors; /* owned, with each tensor's data */
} one_case;

static void case_free(one_case *c)
{
    for (size_t i = 0; c->tensors && i < c->count; i++)
        free(c->tensors[i].data);
    free(c->tensors);
    memset(c, 0, sizeof *c);
}

/* Reads one case; on failure prints why (naming the case) and returns false, having freed it. */
static bool read_case(FILE *f, size_t k, one_case *c)
{
    uint64_t wire, op, width, count;
    memset(c, 0, sizeof *c);
    if (!read_u64(f, &wire) || !read_u64(f, &op) || !read_u64(f, &width) || !read_u64(f, &count)) {
        fprintf(stderr, "case %zu: the file ends in its header\n", k);
        return false;
    }
    if (count > MAX_TENSORS || width > UINT32_MAX) {
        fprintf(stderr, "case %zu: %llu tensors, row width %llu: out of range\n", k, (unsigned long long)count,
                (unsigned long long)width);
        return false;
    }
    c->spec = (prism_coll_spec){.wire = (prism_precision)wire, .row_width = (uint32_t)width,
                                .op = (prism_coll_op)op, .scale_mode = PRISM_SCALE_FP32};
    c->count = (size_t)count;
    c->tensors = calloc(count ? count : 1, sizeof *c->tensors);
    if (!c->tensors) {
        fprintf(stderr, "case %zu: no memory\n", k);
        return false;
    }
    for (size_t i = 0; i < c->count; i++) {
        uint64_t dtype, numel;
        if (!read_u64(f, &dtype) || !read_u64(f, &numel) || !elem_size(dtype) || numel > MAX_NUMEL) {
            fprintf(stderr, "case %zu: tensor %zu: a bad or missing dtype or size\n", k, i);
            case_free(c);
            return false;
        }
        c->tensors[i] = (prism_coll_tensor){.numel = (size_t)numel, .dtype = (prism_dtype)dtype};
    }
    for (size_t i = 0; i < c->count; i++) {
        size_t bytes = c->tensors[i].numel * elem_size(c->tensors[i].dtype);
        c->tensors[i].data = malloc(bytes ? bytes : 1);
        if (!c->tensors[i].data || fread(c->tensors[i].data, 1, bytes, f) != bytes) {
            fprintf(stderr, "case %zu: tensor %zu: its %zu bytes are missing\n", k, i, bytes);
            case_free(c);
            return false;
        }
    }
    return true;
}

static bool write_case(FILE *f, const one_case *c, prism_status st, const prism_coll_stats *stats)
{
    bool ok = write_u64(f, (uint64_t)st) && write_u64(f, stats->bytes_sent) &&
              write_u64(f, stats->bytes_received) && write_u64(f, stats->nonfinite);
    for (size_t i = 0; ok && i < c->count; i++) {
        size_t bytes = c->tensors[i].numel * elem_size(c->tensors[i].dtype);
        ok = fwrite(c->tensors[i].data, 1, bytes, f) == bytes;
    }
    return ok;
}

/* This rank's whole run: every case of in.<rank> into out.<rank>. The files come from one writer
 * and hold the same cases; a rank that cannot read or write its file returns nonzero, and main
 * then ends the job with MPI_Abort, so the other ranks, waiting in a call, do not hang. */
static int run(prism_coll_comm *comm, const char *dir, int rank)
{
    char in_path[4096], out_path[4096], tmp_path[4200];
    snprintf(in_path, sizeof in_path, "%s/in.%d", dir, rank);
    snprintf(out_path, sizeof out_path, "%s/out.%d", dir, rank);
    snprintf(tmp_path, sizeof tmp_path, "%s/out.%d.tmp", dir, rank);
    FILE *in = fopen(in_path, "rb");
    if (!in) {
        perror(in_path);
        return 1;
    }
    FILE *out = fopen(tmp_path, "wb");
    if (!out) {
        perror(tmp_path);
        fclose(in);
        return 1;
    }
    uint64_t cases = 0;
    int rc = read_u64(in, &cases) ? 0 : 1;
    for (size_t k = 0; rc == 0 && k < cases; k++) {
        one_case c;
        if (!read_case(in, k, &c)) {
            rc = 1;
            break;
        }
        prism_error err = {0};
        prism_coll_stats stats;
        prism_status st = prism_coll_allreduce(comm, &c.spec, c.tensors, c.count, &stats, &err);
        if (st != PRISM_OK)
            fprintf(stderr, "rank %d: case %zu: %s\n", rank, k, err.message);
        if (!write_case(out, &c, st, &stats)) {
            fprintf(stderr, "%s: a write failed\n", tmp_path);
            rc = 1;
        }
        case_free(&c);
    }
    fclose(in);
    if (fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "%s: closing failed\n", tmp_path);
        rc = 1;
    }
    if (rc == 0 && rename(tmp_path, out_path) != 0) {
        perror(out_path);
        rc = 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    /* What MPI_Init allocates is Open MPI's (test_collectives_mpi.c says why it is not watched);
     * everything after it is, up to MPI_Finalize. */
#ifdef TOOL_LEAK_CHECK
    __lsan_disable();
#endif
    MPI_Init(&argc, &argv);
#ifdef TOOL_LEAK_CHECK
    __lsan_enable();
#endif
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc != 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np P %s DIR (reads DIR/in.<rank>, writes DIR/out.<rank>)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    prism_coll_comm *comm = NULL;
    prism_error err = {0};
    if (prism_coll_comm_from_mpi(MPI_COMM_WORLD, &comm, &err) != PRISM_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int rc = run(comm, argv[1], rank);
    if (rc != 0)
        MPI_Abort(MPI_COMM_WORLD, rc);
    prism_coll_comm_destroy(comm);
    int leaks = 0;
#ifdef TOOL_LEAK_CHECK
    leaks = __lsan_do_recoverable_leak_check();
#endif
    MPI_Finalize();
    return leaks ? 1 : 0;
}
