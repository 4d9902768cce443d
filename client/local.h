/* The local protocol between a trainer (libprism's client) and its prism-agent, over a Unix
 * stream socket in the directory they share.
 *
 * One way, trainer to agent: a stream of frames, each a 4-byte little-endian length followed by
 * that many bytes of a serialized prism.v1.AgentMessage. The trainer sends:
 *   Hello              first on every connection: job_id, rank, world_size, layout (with its
 *                      fingerprint). node, token and device are the agent's to fill.
 *   StepReport         one per step.
 *   CalibrationReport  when the hint table says calibration_needed.
 * The agent answers through the hint table only, never on the socket, so the trainer never has
 * to read. A frame longer than PRISM_LOCAL_MAX_FRAME, or one that does not parse, closes the
 * connection (the agent logs and counts it); the trainer reconnects and says Hello again. */
#ifndef PRISM_CLIENT_LOCAL_H
#define PRISM_CLIENT_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#define PRISM_LOCAL_FRAME_HEADER 4
#define PRISM_LOCAL_MAX_FRAME (64u << 20)

/* Default socket name, and the hint table's name beside it, in the shared directory. */
#define PRISM_LOCAL_SOCKET_NAME "prism-agent.sock"
#define PRISM_LOCAL_HINTS_NAME "prism-hints"
/* The plan file (plans.h) in the same directory: the compute plan that came with each map. Its
 * name is the hint table's followed by PRISM_LOCAL_PLANS_SUFFIX, on both sides: a trainer whose
 * hint table is "NAME" (prism_client_options.hints_name) looks for "NAME.plans", so two agents
 * that share a directory under two hint table names have two plan files. The default is the
 * default hint table's: "prism-hints.plans". */
#define PRISM_LOCAL_PLANS_SUFFIX ".plans"
#define PRISM_LOCAL_PLANS_NAME PRISM_LOCAL_HINTS_NAME PRISM_LOCAL_PLANS_SUFFIX

static inline void prism_local_put_len(uint8_t out[PRISM_LOCAL_FRAME_HEADER], uint32_t len)
{
    out[0] = (uint8_t)len;
    out[1] = (uint8_t)(len >> 8);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 24);
}

static inline uint32_t prism_local_get_len(const uint8_t in[PRISM_LOCAL_FRAME_HEADER])
{
    return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
}

#endif
