/* prismd's one auth model (DESIGN 6), for REST and gRPC alike, and the job tokens provisioned
 * from a directory (as a Kubernetes Secret mounts them) or a JSON file.
 *
 * The rule, in prismd_auth_check: the admin token reads and changes every job and alone deletes
 * jobs; a job's token reads and changes that job; reads need no token unless prismd runs with
 * --require-read-token. A job's token is its provisioned one when there is one, else the one its
 * first Hello brought (trust on first use). A job without a token takes any caller, except that
 * when prismd has an admin token, REST changes of such a job (and, with --require-read-token,
 * reads) need the admin token. A token that is sent and matches neither is refused wherever
 * there is a token to check it against, also for reads that need none: bad credentials are
 * never silently ignored. Tokens are compared in constant time. */
#ifndef PRISMD_AUTH_H
#define PRISMD_AUTH_H

#include "prism/common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum prismd_access {
    PRISMD_ACCESS_READ,   /* REST GETs of a job, server-sent events, GetBlockMap, Watch */
    PRISMD_ACCESS_CHANGE, /* REST PATCH config, PUT overrides */
    PRISMD_ACCESS_AGENT,  /* a Connect Hello: as CHANGE, but a job without a token takes any agent */
    PRISMD_ACCESS_DELETE  /* DELETE /v1/jobs/JOB: the admin token alone */
} prismd_access;

typedef enum prismd_auth {
    PRISMD_AUTH_OK,
    PRISMD_AUTH_MISSING, /* no token, and one is needed: HTTP 401, gRPC UNAUTHENTICATED */
    PRISMD_AUTH_WRONG    /* a token that does not open this: HTTP 403, gRPC PERMISSION_DENIED */
} prismd_auth;

typedef struct prismd_auth_rule {
    const char *admin_token;  /* NULL: none */
    bool require_read_token;  /* --require-read-token */
} prismd_auth_rule;

/* True when a and b are equal strings; the time taken depends on their lengths only, never on
 * where they differ. NULL equals nothing. */
bool prismd_token_equal(const char *a, const char *b);

/* The rule above. job_token: the job's token in force (NULL: none); bearer: the call's token. */
prismd_auth prismd_auth_check(const prismd_auth_rule *rule, const char *job_token, const char *bearer,
                              prismd_access access);

/* The JSON error body of DESIGN 6 for a refusal (a != PRISMD_AUTH_OK), malloc'd: code
 * "unauthenticated" (HTTP 401) or "permission_denied" (HTTP 403), and a message naming the job
 * and the token needed. */
char *prismd_auth_answer(prismd_auth a, prismd_access access, const char *job_id);

/* ---- provisioned job tokens ---- */

typedef struct prismd_tokens prismd_tokens; /* immutable once loaded */

/* Loads the tokens of dir (one regular file per job: name = job id, content = token, trailing
 * white space dropped; names starting with '.' are skipped, as Kubernetes' "..data" links) and
 * of file (a JSON object {"JOB": "TOKEN", ...}). Either may be NULL. A job in both must have the
 * same token. NULL with err naming the file and the line or key at fault. */
prismd_tokens *prismd_tokens_load(const char *dir, const char *file, prism_error *err);
void prismd_tokens_free(prismd_tokens *t);

/* The job's provisioned token, or NULL. */
const char *prismd_tokens_find(const prismd_tokens *t, const char *job_id);
size_t prismd_tokens_count(const prismd_tokens *t);
/* True when a and b hold the same jobs with the same tokens (NULL holds none). */
bool prismd_tokens_same(const prismd_tokens *a, const prismd_tokens *b);

/* Hands a freshly loaded table from the thread that reads the files (main) to the policy
 * thread, which alone uses it. */
typedef struct prismd_token_box {
    pthread_mutex_t lock;
    prismd_tokens *pending;   /* loaded, not yet taken */
    bool has_pending;
    atomic_ullong loads_ok, loads_failed; /* for /metrics */
} prismd_token_box;

void prismd_token_box_init(prismd_token_box *b);
void prismd_token_box_destroy(prismd_token_box *b);
/* Takes t (NULL: no tokens at all); a table put earlier and not yet taken is freed. */
void prismd_token_box_put(prismd_token_box *b, prismd_tokens *t);
/* True with *out set (the caller owns it) when a new table was put since the last take. */
bool prismd_token_box_take(prismd_token_box *b, prismd_tokens **out);

/* A job id as prismd takes it (it names a directory): 1 to 128 letters, digits, '-', '_', '.',
 * starting with a letter or digit. */
bool prismd_job_id_valid(const char *id);

#endif
