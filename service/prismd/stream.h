/* A Connect or Watch call as the jobs see it: something to send packed messages on, and nothing
 * else. rpc.c owns the calls (their state, outbound queues and completion tags) and implements
 * this; jobs.c only sends. It is its own header so that the dependency runs one way: rpc.c drives
 * the jobs through jobs.h, and jobs.c reaches back only through this interface, never rpc.h. */
#ifndef PRISMD_STREAM_H
#define PRISMD_STREAM_H

#include <stddef.h>
#include <stdint.h>

typedef struct prismd_stream prismd_stream; /* a Connect or Watch call, defined in rpc.c */

/* Queues one packed ServiceMessage (Connect) or PrecisionUpdate (Watch) on a stream, copying
 * data; never blocks. A stream that is ending takes nothing, and one whose unsent bytes would
 * pass the stream buffer (--stream-buffer-bytes) is cut off with RESOURCE_EXHAUSTED instead. */
void prismd_stream_send(prismd_stream *s, const uint8_t *data, size_t len);

/* Ends a stream with a gRPC status (code, message) once what is queued on it has been sent; it
 * takes no more messages, and what its peer sends from then on is not acted on. */
void prismd_stream_end(prismd_stream *s, int code, const char *message);

/* A packed message to queue on several streams (a map update to every agent and watcher of a
 * job): its bytes are held once, however many streams queue it, and count once against
 * --total-stream-buffer-bytes. Create copies data; release drops the creator's reference (the
 * queues keep theirs). NULL when out of memory. */
typedef struct prismd_message prismd_message;
prismd_message *prismd_message_create(const uint8_t *data, size_t len);
void prismd_message_release(prismd_message *m);

/* prismd_stream_send of a shared message. */
void prismd_stream_send_message(prismd_stream *s, prismd_message *m);

#endif
