/* prismd's gRPC server (DESIGN 5, 7) on the gRPC core C API: Connect, GetBlockMap and Watch of
 * prism.v1.PolicyService, driven by the one policy thread that owns every job. */
#ifndef PRISMD_RPC_H
#define PRISMD_RPC_H

#include "jobs.h"

typedef struct prismd_rpc prismd_rpc;

typedef struct prismd_rpc_options {
    const char *listen;          /* "127.0.0.1:50051", "[::1]:50051", "0.0.0.0:50051" */
    size_t max_message_bytes;    /* larger messages are refused with RESOURCE_EXHAUSTED */
    size_t stream_buffer_bytes;  /* unsent bytes a stream may hold before it is cut off (0: 64 MiB) */
    size_t total_stream_buffer_bytes; /* unsent bytes of all calls: queues, GetBlockMap answers (0: none) */
    prismd_jobs_limits limits;
    prismd_store *store;         /* jobs are restored from it and saved to it; the caller closes it */
    prismd_snapshots *snapshots; /* where the policy thread publishes what REST shows */
    prismd_commands *commands;   /* REST mutations the policy thread runs */
    const char *tls_cert, *tls_key; /* PEM; both set: TLS only */
} prismd_rpc_options;

/* Binds, starts the policy thread and returns; NULL with err filled when the address cannot be
 * had. The thread owns the jobs from then on. */
prismd_rpc *prismd_rpc_start(const prismd_rpc_options *opts, const prism_config *defaults, prism_error *err);

/* Ends every stream with UNAVAILABLE, stops accepting, waits (bounded) for calls to finish,
 * joins the thread and frees everything. */
void prismd_rpc_stop(prismd_rpc *r);

#endif
