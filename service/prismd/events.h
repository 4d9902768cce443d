/* Server-sent events (DESIGN 6): GET /v1/jobs/{job}/events streams one "map" event per new map
 * version of the job, a "decision" event per decision that left the map as it was (both
 * coalesced to the newest state), and a comment line as keep-alive. A connection with nothing
 * to send is suspended in libmicrohttpd and resumed when the policy thread publishes a
 * snapshot, so an open dashboard costs no thread. */
#ifndef PRISMD_EVENTS_H
#define PRISMD_EVENTS_H

#include "snapshot.h"

#include <microhttpd.h>

typedef struct prismd_events prismd_events;

prismd_events *prismd_events_create(prismd_snapshots *snapshots);
void prismd_events_destroy(prismd_events *e);

/* Why prismd_events_response gave no response. */
typedef enum prismd_events_refusal {
    PRISMD_EVENTS_NOMEM,    /* out of memory */
    PRISMD_EVENTS_FULL,     /* max_total streams are open */
    PRISMD_EVENTS_JOB_FULL, /* max_per_job streams of this job are open */
} prismd_events_refusal;

/* At most max_total streams open at once, and max_per_job of one job (0: no limit). Call before
 * the server starts. */
void prismd_events_set_limits(prismd_events *e, size_t max_total, size_t max_per_job);

/* Streams open now. */
size_t prismd_events_open_count(prismd_events *e);

/* The response of GET /v1/jobs/{job}/events for this connection, counted against the limits
 * until it ends; NULL with *refused saying why when the limits are reached or memory is out.
 * The job must exist in the current snapshot (the caller checks). */
struct MHD_Response *prismd_events_response(prismd_events *e, struct MHD_Connection *conn, const char *job_id,
                                            prismd_events_refusal *refused);

/* Shutdown: every stream ends (resumed, then closed by libmicrohttpd); call before stopping it. */
void prismd_events_close(prismd_events *e);

/* Resumes every waiting connection: call after each publish, and every few seconds so that
 * keep-alives go out. Thread-safe. */
void prismd_events_wake(prismd_events *e);

#endif
