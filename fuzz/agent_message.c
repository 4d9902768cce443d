/* Fuzz target "agent_message": protobuf-c decoding of prism.v1.AgentMessage and the jobs'
 * handling of it (prismd_jobs_agent_message, service/prismd/jobs.c), in-process: no sockets and
 * no gRPC, four Connect streams of the harness's own that check and count what is sent on them.
 *
 * Input: a sequence of operations, each a header byte and its arguments:
 *   header & 3        the stream (0..3) it is about
 *   (header >> 2) & 7 0, 1, 2: one AgentMessage: a 2-byte little-endian length, then its bytes
 *                     3: the stream ends (prismd_jobs_stream_gone); its next message starts over
 *                     4: time passes: one byte, in units of 50 ms, then prismd_jobs_tick
 *                     5: GetBlockMap: a 1-byte length, then a packed BlockMapRequest
 *                     6: Watch on the stream: a 1-byte length, then a packed WatchRequest
 *                     7: the stream's read failed (prismd_jobs_stream_broken)
 *   header & 0x20     the call's metadata carries the token "demo-secret" (else none)
 * so that a Hello followed by reports, calibration, acks and a second agent is reachable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "prismd_harness.h"

#define STREAMS 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    harness h;
    harness_init(&h);
    prismd_stream streams[STREAMS];
    prismd_peer peers[STREAMS];
    bool ended[STREAMS] = {false};
    memset(streams, 0, sizeof streams);
    memset(peers, 0, sizeof peers);
    char token[] = HARNESS_JOB_TOKEN;
    size_t pos = 0;
    while (pos < size) {
        uint8_t header = data[pos++];
        size_t k = header & 3;
        uint8_t op = (header >> 2) & 7;
        peers[k].auth = header & 0x20 ? token : NULL;
        if (op <= 2) {
            if (size - pos < 2)
                break;
            size_t len = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
            pos += 2;
            if (len > size - pos)
                len = size - pos;
            /* The message in a buffer of its own size, so that ASan sees a read past its end. */
            uint8_t *msg = malloc(len ? len : 1);
            FUZZ_CHECK(msg != NULL);
            memcpy(msg, data + pos, len);
            pos += len;
            if (ended[k] || streams[k].watch) {
                /* rpc.c reads nothing more from a call the jobs ended, and no AgentMessage from a
                 * Watch call: a new Connect call takes its place. */
                prismd_jobs_stream_gone(h.jobs, &streams[k], &peers[k]);
                memset(&streams[k], 0, sizeof streams[k]);
                memset(&peers[k], 0, sizeof peers[k]);
                peers[k].auth = header & 0x20 ? token : NULL;
                ended[k] = false;
            }
            prismd_status end = {0};
            if (!prismd_jobs_agent_message(h.jobs, &streams[k], &peers[k], msg, len, h.now_ms, &end)) {
                FUZZ_CHECK(end.code != 0 && end.message[0] != '\0');
                ended[k] = true;
            }
            free(msg);
        } else if (op == 3) {
            prismd_jobs_stream_gone(h.jobs, &streams[k], &peers[k]);
            memset(&streams[k], 0, sizeof streams[k]);
            memset(&peers[k], 0, sizeof peers[k]);
            ended[k] = false;
        } else if (op == 4) {
            if (pos >= size)
                break;
            h.now_ms += 50 * (int64_t)data[pos++];
            prismd_jobs_tick(h.jobs, h.now_ms);
        } else if (op == 5 || op == 6) {
            if (pos >= size)
                break;
            size_t len = data[pos++];
            if (len > size - pos)
                len = size - pos;
            uint8_t *req = malloc(len ? len : 1);
            FUZZ_CHECK(req != NULL);
            memcpy(req, data + pos, len);
            pos += len;
            prismd_status end = {0};
            if (op == 5) {
                uint8_t *out = NULL;
                size_t out_len = 0;
                if (prismd_jobs_get_block_map(h.jobs, peers[k].auth, req, len, &out, &out_len, &end))
                    free(out);
                else
                    FUZZ_CHECK(end.code != 0);
            } else if (!peers[k].job && !ended[k]) {
                /* A Watch is a call of its own: a stream that is no Connect yet becomes one. */
                streams[k].watch = true;
                if (!prismd_jobs_watch(h.jobs, &streams[k], &peers[k], req, len, &end)) {
                    FUZZ_CHECK(end.code != 0);
                    streams[k].watch = false;
                }
            }
            free(req);
        } else {
            prismd_jobs_stream_broken(h.jobs);
        }
    }
    h.now_ms += 60000;
    prismd_jobs_tick(h.jobs, h.now_ms);
    /* PRISM_FUZZ_VERBOSE=1 says what an input reached (to check the seeds). */
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("PRISM_FUZZ_VERBOSE") != NULL;
    if (verbose) {
        const prismd_jobs_counters *c = prismd_jobs_counters_get(h.jobs);
        fprintf(stderr, "accepted %llu rejected %llu late %llu repeated %llu decisions %llu updates %llu "
                "refused %llu; sends %zu %zu %zu %zu\n", (unsigned long long)c->reports_accepted,
                (unsigned long long)c->reports_rejected, (unsigned long long)c->reports_dropped_late,
                (unsigned long long)c->reports_dropped_repeated, (unsigned long long)c->decisions,
                (unsigned long long)c->updates_sent, (unsigned long long)c->streams_refused, streams[0].sends,
                streams[1].sends, streams[2].sends, streams[3].sends);
    }
    for (size_t k = 0; k < STREAMS; k++)
        prismd_jobs_stream_gone(h.jobs, &streams[k], &peers[k]);
    harness_free(&h);
    return 0;
}
