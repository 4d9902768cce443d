#define _POSIX_C_SOURCE 200809L
#include "commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void prismd_commands_init(prismd_commands *q)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&q->answered, &attr);
    pthread_condattr_destroy(&attr);
}

void prismd_commands_destroy(prismd_commands *q)
{
    pthread_cond_destroy(&q->answered);
    pthread_mutex_destroy(&q->lock);
}

static char *error_json(const char *code, const char *message)
{
    char *out = NULL;
    size_t need = strlen(code) + strlen(message) + 64;
    out = malloc(need);
    if (out)
        snprintf(out, need, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}", code, message);
    return out;
}

static void command_free(prismd_command *c)
{
    free(c->job_id);
    free(c->auth);
    free(c->body);
    free(c->answer);
    free(c);
}

unsigned prismd_commands_run(prismd_commands *q, prismd_command_kind kind, const char *job_id, const char *auth,
                             const char *body, size_t body_len, int timeout_ms, char **answer)
{
    prismd_command *c = calloc(1, sizeof *c);
    if (c) {
        c->kind = kind;
        c->job_id = strdup(job_id);
        c->auth = auth ? strdup(auth) : NULL;
        c->body = malloc(body_len + 1);
        c->body_len = body_len;
    }
    if (!c || !c->job_id || (auth && !c->auth) || !c->body) {
        if (c)
            command_free(c);
        *answer = error_json("internal", "out of memory");
        return 500;
    }
    memcpy(c->body, body, body_len);
    c->body[body_len] = '\0';

    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q->lock);
    if (q->closed) {
        pthread_mutex_unlock(&q->lock);
        command_free(c);
        *answer = error_json("unavailable", "prismd is shutting down");
        return 503;
    }
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    int rc = 0;
    while (!c->done && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&q->answered, &q->lock, &deadline);
    unsigned status;
    if (c->done) {
        status = c->status;
        *answer = c->answer;
        c->answer = NULL;
        pthread_mutex_unlock(&q->lock);
        command_free(c);
    } else {
        /* Still queued or being run: the policy thread frees it when it answers. */
        c->done = true;
        pthread_mutex_unlock(&q->lock);
        *answer = error_json("unavailable", "the policy thread did not answer in time; the change was not applied");
        status = 503;
    }
    return status;
}

prismd_command *prismd_commands_take(prismd_commands *q)
{
    pthread_mutex_lock(&q->lock);
    prismd_command *all = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return all;
}

bool prismd_commands_abandoned(prismd_commands *q, prismd_command *c)
{
    pthread_mutex_lock(&q->lock);
    bool gone = c->done;
    pthread_mutex_unlock(&q->lock);
    return gone;
}

void prismd_commands_answer(prismd_commands *q, prismd_command *c, unsigned status, char *answer)
{
    pthread_mutex_lock(&q->lock);
    if (c->done) {
        /* The HTTP thread gave up waiting: nobody reads this answer. */
        pthread_mutex_unlock(&q->lock);
        free(answer);
        command_free(c);
        return;
    }
    c->status = status;
    c->answer = answer;
    c->done = true;
    pthread_cond_broadcast(&q->answered);
    pthread_mutex_unlock(&q->lock);
}

void prismd_commands_close(prismd_commands *q)
{
    pthread_mutex_lock(&q->lock);
    q->closed = true;
    prismd_command *c = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    while (c) {
        prismd_command *next = c->next;
        prismd_commands_answer(q, c, 503, error_json("unavailable", "prismd is shutting down"));
        c = next;
    }
}
