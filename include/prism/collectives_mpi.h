/* The MPI backend of the quantized collectives (prism/collectives.h): tensors in host memory, the
 * element work on the CPU (kernels.h), MPI_Alltoall and MPI_Allgather on MPI_BYTE-made row types.
 * Any MPI-3 library; Debian's OpenMPI is the one tested. */
#ifndef PRISM_COLLECTIVES_MPI_H
#define PRISM_COLLECTIVES_MPI_H

#include <mpi.h>

#include "prism/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over the ranks of `comm`. Collective over comm (it calls MPI_Comm_dup), so that
 * Prism's messages never mix with the caller's; the duplicate returns its errors
 * (MPI_ERRORS_RETURN) and every MPI failure becomes PRISM_ERR_IO with MPI_Error_string's text.
 * MPI must be initialised (PRISM_ERR_STATE otherwise) and comm an intracommunicator
 * (PRISM_ERR_INVALID naming comm). The communicator is used by one thread at a time, which need
 * not be MPI's main thread only if MPI was initialised with a thread level that allows it.
 * prism_coll_comm_destroy frees the duplicate (before MPI_Finalize; after it, it is left alone). */
prism_status prism_coll_comm_from_mpi(MPI_Comm comm, prism_coll_comm **out, prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
