/* What client.c offers the other files of libprism's client (client_cuda.c) and nobody else:
 * hidden symbols, not part of include/prism/client.h.
 *
 * An extension keeps its own state on the client and is polled at the start of every client
 * call that may send (begin_step and the reports), so work it left on a GPU stream is sent once
 * the stream got there, without anyone waiting for it. */
#ifndef PRISM_CLIENT_CLIENT_EXT_H
#define PRISM_CLIENT_CLIENT_EXT_H

#include "hints.h"
#include "prism/client.h"

#define PRISM_CLIENT_HIDDEN __attribute__((visibility("hidden")))

typedef struct prism_client_ext {
    void *state;
    void (*poll)(prism_client *c, void *state);
    void (*destroy)(void *state); /* at prism_client_close */
} prism_client_ext;

/* The client's extension slot (one: the CUDA reports). */
PRISM_CLIENT_HIDDEN prism_client_ext *prism_client_extension(prism_client *c);

/* The checks every report makes (a client, a registered layout, ids in it at most once; ids NULL:
 * 0 .. n-1), refused calls counted, as prism_client_report_step. */
PRISM_CLIENT_HIDDEN prism_status prism_client_check_report(prism_client *c, const uint32_t *block_ids, size_t n,
                                                           prism_error *err);

/* prism_client_report_step_ex's check of the fractions (NULL: none; else n, for block_ids[i] or
 * block i), a refusal counted. */
PRISM_CLIENT_HIDDEN prism_status prism_client_check_fractions(prism_client *c, const prism_block_fractions *fractions,
                                                              const uint32_t *block_ids, size_t n, prism_error *err);

/* Counts a report dropped for `reason` (published in the hint table's trainer line), with the
 * text `why` kept for prism_client_last_error. */
PRISM_CLIENT_HIDDEN void prism_client_note_dropped(prism_client *c, prism_hints_drop reason, const char *why);

/* The reason a report is dropped when framing it fails with status s (not
 * PRISM_ERR_UNAVAILABLE, which is counted with the lost connection): PRISM_ERR_LIMIT too_big,
 * anything else (PRISM_ERR_NOMEM) no_memory. */
PRISM_CLIENT_HIDDEN prism_hints_drop prism_client_send_drop_reason(prism_status s);

#endif
