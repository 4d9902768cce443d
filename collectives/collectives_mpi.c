/* The MPI backend (include/prism/collectives_mpi.h): host memory and the CPU kernels from
 * collectives.c, and the transport on a duplicate of the caller's communicator. Slices move as
 * rows_per_rank elements of a contiguous datatype of one row (row_bytes bytes), so a count never
 * overflows MPI's int before the memory does. */
#include "prism/collectives_mpi.h"

#include "collectives_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct mpi_impl {
    MPI_Comm comm;          /* the duplicate, MPI_ERRORS_RETURN */
    MPI_Datatype row_type;  /* row_type_bytes contiguous bytes; MPI_DATATYPE_NULL until needed */
    size_t row_type_bytes;
} mpi_impl;

static prism_status mpi_failed(prism_error *err, int rc, const char *call)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return prism_error_set(err, PRISM_ERR_IO, "%s: %s", call, text);
}

/* Runs an MPI call; a failure becomes the caller's PRISM_ERR_IO, naming the call. */
#define MPI_CHECK(call)                                                                            \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS)                                                                \
            return mpi_failed(err, mpi_rc_, #call);                                                \
    } while (0)

static bool mpi_finalized(void)
{
    int done = 0;
    MPI_Finalized(&done);
    return done != 0;
}

/* The datatype of one row of row_bytes bytes, made once per row size, and the row count as an
 * int. Every rank has the same layout by now (the headers agreed), so a refusal here happens on
 * every rank alike. */
static prism_status row_type(prism_coll_comm *c, size_t row_bytes, size_t rows, int *count, prism_error *err)
{
    mpi_impl *m = c->impl;
    if (rows > INT_MAX || row_bytes > INT_MAX)
        return prism_error_set(err, PRISM_ERR_LIMIT, "mpi: %zu rows of %zu bytes per rank exceed MPI's int counts",
                               rows, row_bytes);
    if (m->row_type_bytes != row_bytes) {
        if (m->row_type != MPI_DATATYPE_NULL)
            MPI_CHECK(MPI_Type_free(&m->row_type));
        m->row_type = MPI_DATATYPE_NULL;
        m->row_type_bytes = 0;
        MPI_CHECK(MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &m->row_type));
        MPI_CHECK(MPI_Type_commit(&m->row_type));
        m->row_type_bytes = row_bytes;
    }
    *count = (int)rows;
    return PRISM_OK;
}

static prism_status mpi_exchange_headers(prism_coll_comm *c, prism_coll_header *mine, size_t slots,
                                         prism_coll_header *all, prism_error *err)
{
    mpi_impl *m = c->impl;
    mine->nonfinite += prism_coll_host_nonfinite(c, slots);
    MPI_CHECK(MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, m->comm));
    return PRISM_OK;
}

static prism_status mpi_alltoall(prism_coll_comm *c, const uint8_t *send, uint8_t *recv, size_t row_bytes,
                                 size_t rows, prism_error *err)
{
    mpi_impl *m = c->impl;
    int n = 0;
    prism_status st = row_type(c, row_bytes, rows, &n, err);
    if (st != PRISM_OK)
        return st;
    MPI_CHECK(MPI_Alltoall(send, n, m->row_type, recv, n, m->row_type, m->comm));
    return PRISM_OK;
}

static prism_status mpi_allgather(prism_coll_comm *c, uint8_t *buf, size_t row_bytes, size_t rows,
                                  prism_error *err)
{
    mpi_impl *m = c->impl;
    int n = 0;
    prism_status st = row_type(c, row_bytes, rows, &n, err);
    if (st != PRISM_OK)
        return st;
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n, m->row_type, m->comm));
    return PRISM_OK;
}

static void mpi_destroy(prism_coll_comm *c)
{
    mpi_impl *m = c->impl;
    if (!m)
        return;
    if (!mpi_finalized()) {
        if (m->row_type != MPI_DATATYPE_NULL)
            MPI_Type_free(&m->row_type);
        if (m->comm != MPI_COMM_NULL)
            MPI_Comm_free(&m->comm);
    }
    free(m);
    c->impl = NULL;
}

static const prism_coll_backend mpi_backend = {
    .name = "mpi",
    .alloc = prism_coll_host_alloc,
    .release = prism_coll_host_release,
    .quantize = prism_coll_host_quantize,
    .accumulate = prism_coll_host_accumulate,
    .dequantize = prism_coll_host_dequantize,
    .zero = prism_coll_host_zero,
    .fill_ones = prism_coll_host_fill_ones,
    .finish_sum = prism_coll_host_finish_sum,
    .exchange_headers = mpi_exchange_headers,
    .alltoall = mpi_alltoall,
    .allgather = mpi_allgather,
    .destroy = mpi_destroy,
};

prism_status prism_coll_comm_from_mpi(MPI_Comm comm, prism_coll_comm **out, prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    *out = NULL;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || mpi_finalized())
        return prism_error_set(err, PRISM_ERR_STATE, "mpi: MPI is not initialised (MPI_Init first, MPI_Finalize after)");
    if (comm == MPI_COMM_NULL)
        return prism_error_set(err, PRISM_ERR_INVALID, "comm: MPI_COMM_NULL");
    int inter = 0;
    MPI_CHECK(MPI_Comm_test_inter(comm, &inter));
    if (inter)
        return prism_error_set(err, PRISM_ERR_INVALID, "comm: an intercommunicator (an intracommunicator is needed)");

    mpi_impl *m = calloc(1, sizeof *m);
    if (!m)
        return prism_error_set(err, PRISM_ERR_NOMEM, "mpi: no memory for a communicator");
    m->comm = MPI_COMM_NULL;
    m->row_type = MPI_DATATYPE_NULL;
    int rc = MPI_Comm_dup(comm, &m->comm);
    int rank = 0, size = 0;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_name(m->comm, "prism_coll");
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(m->comm, &rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(m->comm, &size);
    if (rc != MPI_SUCCESS) {
        prism_coll_comm tmp = {.impl = m};
        mpi_destroy(&tmp);
        return mpi_failed(err, rc, "MPI_Comm_dup");
    }
    return prism_coll_comm_new(&mpi_backend, m, rank, size, out, err);
}
