/* prism-agent's parts and what they share (DESIGN 1, 2).
 *
 * Threads:
 *   main      parses the options, measures the device, then runs the local socket (socket.c):
 *             trainers connect, their frames are checked and handed to the upstream thread
 *             through the inbox. It also waits for SIGTERM/SIGINT (signalfd) and stops the rest.
 *   upstream  owns the Connect stream to prismd (upstream.c) and is the one writer of the hint
 *             table: it drives the gRPC completion queue, forwards the inbox, applies maps, sends
 *             Acks and Heartbeats, and reconnects with exponential backoff and jitter.
 *   metrics   libmicrohttpd's thread (metrics.c): /metrics, /healthz, /readyz, from the counters
 *             below, which every thread updates with relaxed atomics. */
#ifndef PRISM_AGENT_AGENT_H
#define PRISM_AGENT_AGENT_H

#include "hints.h"
#include "log.h"
#include "plans.h"
#include "profile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct agent_options {
    const char *prismd;          /* gRPC target of prismd */
    const char *dir;             /* the directory shared with the trainer */
    char *token;                 /* from --token-file; NULL: none */
    char *tls_ca;                /* PEM roots from --tls-ca; NULL: plaintext */
    char node[256];
    /* The numeric options, each checked against its range in main.c's table. */
    uint64_t max_blocks;
    uint64_t backoff_initial_ms;
    uint64_t backoff_max_ms;
    uint64_t heartbeat_ms;
    uint64_t queue_bytes;        /* unsent upstream bytes at most; reports past it are dropped */
    uint64_t max_message_bytes;
    uint64_t profile_budget_ms;
    bool metrics;                /* false: --metrics-listen off */
    struct sockaddr_storage metrics_addr;
    socklen_t metrics_addr_len;
    char metrics_text[64];
    int device;                  /* -1: CPU profile; else the CUDA device measured */
    bool device_auto;            /* --device auto */
    const char *device_class;    /* NULL: the profile's own */
    const char *profile_file;    /* --profile-file: the DeviceProfile from JSON, nothing measured */
    prism_log_level log_level;
    bool help, version;
} agent_options;

/* Why a report from the trainer did not reach prismd. */
typedef enum agent_drop {
    AGENT_DROP_DISCONNECTED, /* no live stream to prismd */
    AGENT_DROP_QUEUE_FULL,   /* the stream's unsent bytes were at --queue-bytes */
    AGENT_DROP_INBOX_FULL,   /* the upstream thread was behind the local socket */
    AGENT_DROPS
} agent_drop;

extern const char *const agent_drop_names[AGENT_DROPS];

/* Why a compute plan that came with a map was not written to the plan file: its low format is
 * not one the trainer runs (int8, fp8_e4m3), it is another device class's plan than this
 * agent's profile's, or the plan file refused it. */
enum { AGENT_PLAN_LOW_FORMAT, AGENT_PLAN_DEVICE_CLASS, AGENT_PLAN_FILE, AGENT_PLAN_IGNORED_REASONS };
extern const char *const agent_plan_ignored_names[AGENT_PLAN_IGNORED_REASONS];

/* Counters for /metrics: monotonic totals and gauges, relaxed atomics. */
typedef struct agent_stats {
    _Atomic uint64_t upstream_connected;      /* gauge: a Welcome on the live stream */
    _Atomic uint64_t upstream_attempts;       /* Connect calls started */
    _Atomic uint64_t upstream_welcomes;       /* of them, welcomed */
    _Atomic uint64_t upstream_failures;       /* calls that ended, by any status */
    _Atomic uint64_t backoff_ms;              /* gauge: the wait before the next attempt */
    _Atomic uint64_t messages_sent[6];        /* by AgentMessage kind (1..5) */
    _Atomic uint64_t bytes_sent;
    _Atomic uint64_t messages_received[6];    /* by ServiceMessage kind (1..5) */
    _Atomic uint64_t reports_received;        /* StepReports from the trainer */
    _Atomic uint64_t reports_dropped[AGENT_DROPS];
    _Atomic uint64_t map_version;             /* gauge: newest map in the hint table */
    _Atomic uint64_t map_effective_step;      /* gauge */
    _Atomic uint64_t maps_applied;            /* maps written to the hint table */
    _Atomic uint64_t blocks_out_of_range;     /* map entries past --max-blocks, ignored */
    _Atomic uint64_t last_step;               /* gauge: last StepReport's step */
    _Atomic uint64_t trainer_connected;       /* gauge: connections open on the local socket */
    _Atomic uint64_t trainer_connections;     /* accepted */
    _Atomic uint64_t trainer_frames;          /* frames read */
    _Atomic uint64_t trainer_frames_rejected; /* frames that closed their connection */
    _Atomic uint64_t ready;                   /* gauge: hint table open and socket listening */
    _Atomic uint64_t plan_map_version;        /* gauge: the map version of the plan last written (0: none) */
    _Atomic uint64_t plan_low_blocks;         /* gauge: blocks planned low in it */
    _Atomic uint64_t plans_written;           /* compute plans written to the plan file */
    _Atomic uint64_t plans_ignored[AGENT_PLAN_IGNORED_REASONS]; /* compute plans not written, by reason */
    _Atomic uint64_t plans_withdrawn;         /* plans of a held map cleared (its Welcome came without one) */
} agent_stats;

/* What the agent knows of its trainer, for /metrics: the hint table's trainer line as the
 * upstream thread last read it (every tick), and who the trainer said it is in its Hello. One
 * mutex, so a scrape sees one whole line (a histogram's buckets agree with its count). */
typedef struct agent_trainer {
    pthread_mutex_t mu;
    prism_hints_trainer line; /* line.published 0: the trainer published no counters yet */
    bool said_hello;
    char *job;                /* the Hello's job_id (owned; NULL before a Hello) */
    uint32_t rank;
} agent_trainer;

/* One frame from the trainer, for the upstream thread: a serialized AgentMessage and its kind. */
typedef struct agent_frame {
    struct agent_frame *next;
    int kind; /* PRISM__V1__AGENT_MESSAGE__KIND_* */
    size_t len;
    uint8_t data[];
} agent_frame;

/* Frames from the socket thread to the upstream thread, bounded in bytes. */
typedef struct agent_inbox {
    pthread_mutex_t mu;
    agent_frame *head, *tail;
    size_t bytes, max_bytes;
} agent_inbox;

typedef struct agent {
    agent_options opts;
    agent_stats stats;
    agent_trainer trainer;
    agent_inbox inbox;
    prism_hints hints;
    prism_plans plans;               /* the plan file beside the hint table (plans.h) */
    prism_device_profile profile;
    atomic_bool stop;
} agent;

/* The inbox: put takes the frame (freed when refused: false); take empties the list and hands
 * it over in arrival order. */
void agent_inbox_init(agent_inbox *in, size_t max_bytes);
bool agent_inbox_put(agent_inbox *in, agent_frame *f);
agent_frame *agent_inbox_take(agent_inbox *in);
void agent_inbox_destroy(agent_inbox *in);

/* upstream.c: starts the thread; stop sets a->stop first, then joins. The stream is closed with
 * the call's status (or cancelled after 2 s), and the hint table says upstream_connected 0. */
prism_status agent_upstream_start(agent *a, pthread_t *thread, prism_error *err);

/* socket.c: listens on DIR/prism-agent.sock (refusing to take over a live agent's socket). */
prism_status agent_socket_listen(agent *a, int *fd, char *path, size_t path_len, prism_error *err);
/* Serves trainers on the listening socket until a signal arrives on sigfd; returns the signal. */
int agent_socket_serve(agent *a, int listen_fd, int sigfd);

/* metrics.c: the HTTP endpoint; NULL with err when it cannot listen. */
struct agent_metrics;
struct agent_metrics *agent_metrics_start(agent *a, prism_error *err);
void agent_metrics_stop(struct agent_metrics *m);

#endif
