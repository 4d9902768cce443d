/* What the prismd fuzz targets (rest, agent_message) share: a prismd_jobs run in-process with
 * no sockets, gRPC or store, on streams of the harness's own that count what they are sent. */
#ifndef PRISM_FUZZ_PRISMD_HARNESS_H
#define PRISM_FUZZ_PRISMD_HARNESS_H

#include "commands.h"
#include "jobs.h"
#include "snapshot.h"
#include "stream.h"

/* The stream interface of stream.h, as the harness implements it: sends are counted and the
 * bytes dropped (after a check that they are a packed message of the expected type). */
struct prismd_stream {
    bool watch;          /* sends are PrecisionUpdates (Watch), else ServiceMessages (Connect) */
    size_t sends;
    size_t bytes;
    bool ended;          /* prismd_stream_end was called (a replaced agent, a deleted job) */
};

#define HARNESS_ADMIN_TOKEN "admin-secret"
#define HARNESS_JOB_TOKEN "demo-secret"

typedef struct harness {
    prismd_snapshots snapshots;
    prismd_commands commands;
    prismd_jobs *jobs;
    int64_t now_ms;
} harness;

/* Sets up h with a jobs object of small limits (4 jobs, 64 blocks each, auto-create, the admin
 * token above, no store and no data dir). Aborts when it cannot. */
void harness_init(harness *h);
void harness_free(harness *h);

/* Packs and hands one AgentMessage to the jobs on stream s; returns what the jobs return. */
bool harness_send(harness *h, prismd_stream *s, prismd_peer *peer, const void *msg);

/* The demo state the REST target starts from: job "demo" (token HARNESS_JOB_TOKEN, 4 blocks,
 * named, some steps reported and decided) and tokenless job "open" (1 block), published. */
void harness_populate(harness *h, prismd_stream *streams, prismd_peer *peers);

#endif
