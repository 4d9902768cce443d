/* The command queue of DESIGN 7: REST mutations (config PATCH, overrides PUT) are handed to the
 * policy thread, which owns the jobs, and the HTTP thread waits (bounded) for the answer. */
#ifndef PRISMD_COMMANDS_H
#define PRISMD_COMMANDS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum prismd_command_kind {
    PRISMD_COMMAND_PATCH_CONFIG,   /* body: an object of policy config keys */
    PRISMD_COMMAND_PUT_OVERRIDES,  /* body: {"force_bf16_blocks": [...], "force_int8_blocks": [...]} */
    PRISMD_COMMAND_DELETE_JOB      /* no body: the job, its state and its files go (admin token) */
} prismd_command_kind;

typedef struct prismd_command {
    struct prismd_command *next;
    prismd_command_kind kind;
    char *job_id;
    char *auth;        /* bearer token of the request, or NULL */
    char *body;
    size_t body_len;
    /* the answer, filled by the policy thread */
    bool done;
    unsigned status;   /* HTTP status */
    char *answer;      /* JSON body, malloc'd */
} prismd_command;

typedef struct prismd_commands {
    pthread_mutex_t lock;
    pthread_cond_t answered;
    prismd_command *head, *tail;
    bool closed;       /* shutting down: new commands are answered 503 at once */
} prismd_commands;

void prismd_commands_init(prismd_commands *q);
void prismd_commands_destroy(prismd_commands *q);

/* HTTP thread: queues the command and waits up to timeout_ms for its answer. Returns the HTTP
 * status and sets *answer (malloc'd JSON). */
unsigned prismd_commands_run(prismd_commands *q, prismd_command_kind kind, const char *job_id, const char *auth,
                             const char *body, size_t body_len, int timeout_ms, char **answer);

/* Policy thread: takes every queued command (the caller answers each with prismd_commands_answer). */
prismd_command *prismd_commands_take(prismd_commands *q);

/* Policy thread: true when the HTTP thread stopped waiting for c (its answer will be dropped). */
bool prismd_commands_abandoned(prismd_commands *q, prismd_command *c);

/* Policy thread: sets the answer and wakes the waiting HTTP thread. Takes answer. */
void prismd_commands_answer(prismd_commands *q, prismd_command *c, unsigned status, char *answer);

/* Shutdown: answers what is queued with 503 and refuses new commands. */
void prismd_commands_close(prismd_commands *q);

#endif
