/* The local socket of prism-agent (agent.h, local.h): trainers connect to DIR/prism-agent.sock
 * and send length-prefixed AgentMessages. This thread reads them, checks each one parses and is
 * a kind a trainer may send, and hands it to the upstream thread. A connection that sends a bad
 * frame is closed (the trainer's client reconnects and says Hello again); nothing a trainer sends
 * can stop the agent. The same poll loop watches a signalfd, so SIGTERM/SIGINT end it. */
#define _GNU_SOURCE
#include "agent.h"
#include "local.h"

#include "prism/v1/prism.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Trainers connected at once: one is the sidecar model; a few more let a restarted trainer
 * connect while the old connection is still being noticed as closed. */
#define MAX_CONNECTIONS 8

typedef struct conn {
    int fd;
    uint8_t *buf;
    size_t len, cap;
    unsigned id;
} conn;

static prism_status unix_address(const char *dir, struct sockaddr_un *sa, char *path, size_t path_len,
                                 prism_error *err)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path, sizeof sa->sun_path, "%s/%s", dir, PRISM_LOCAL_SOCKET_NAME);
    if (n < 0 || (size_t)n >= sizeof sa->sun_path)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "--dir: \"%.200s/%s\" is longer than a Unix socket path may be (%zu bytes)", dir,
                               PRISM_LOCAL_SOCKET_NAME, sizeof sa->sun_path - 1);
    snprintf(path, path_len, "%s", sa->sun_path);
    return PRISM_OK;
}

prism_status agent_socket_listen(agent *a, int *out, char *path, size_t path_len, prism_error *err)
{
    struct sockaddr_un sa;
    prism_status st = unix_address(a->opts.dir, &sa, path, path_len, err);
    if (st)
        return st;
    /* A socket file left by an agent that died is removed; one a live agent answers on is not. */
    struct stat info;
    if (lstat(sa.sun_path, &info) == 0) {
        if (!S_ISSOCK(info.st_mode))
            return prism_error_set(err, PRISM_ERR_IO, "%s exists and is not a socket", sa.sun_path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (probe >= 0)
            close(probe);
        if (live)
            return prism_error_set(err, PRISM_ERR_IO, "%s: another prism-agent is listening there", sa.sun_path);
        unlink(sa.sun_path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return prism_error_set(err, PRISM_ERR_IO, "socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        close(fd);
        return prism_error_set(err, PRISM_ERR_IO, "cannot listen on %s: %s", sa.sun_path, strerror(e));
    }
    chmod(sa.sun_path, 0660);
    *out = fd;
    return PRISM_OK;
}

static void conn_close(agent *a, conn *c, const char *why)
{
    char id[16];
    snprintf(id, sizeof id, "%u", c->id);
    prism_log(why ? PRISM_LOG_WARN : PRISM_LOG_INFO, why ? "trainer connection closed" : "trainer disconnected",
              "connection", id, "reason", why ? why : "closed by the trainer", LOG_END);
    close(c->fd);
    free(c->buf);
    memset(c, 0, sizeof *c);
    c->fd = -1;
    atomic_fetch_sub_explicit(&a->stats.trainer_connected, 1, memory_order_relaxed);
}

/* Checks one frame and passes it on. Returns a reason to close the connection, or NULL. */
static const char *take_frame(agent *a, const uint8_t *data, size_t len)
{
    atomic_fetch_add_explicit(&a->stats.trainer_frames, 1, memory_order_relaxed);
    Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, len, data);
    if (!m)
        return "a frame that is not a prism.v1.AgentMessage";
    const char *bad = NULL;
    switch (m->kind_case) {
    case PRISM__V1__AGENT_MESSAGE__KIND_HELLO:
        if (!m->hello->job_id || !m->hello->job_id[0])
            bad = "a Hello without job_id";
        break;
    case PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT:
        atomic_fetch_add_explicit(&a->stats.reports_received, 1, memory_order_relaxed);
        atomic_store_explicit(&a->stats.last_step, m->step_report->step, memory_order_relaxed);
        break;
    case PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION: break;
    default: bad = "a message kind trainers do not send (only Hello, StepReport, CalibrationReport)";
    }
    int kind = (int)m->kind_case;
    prism__v1__agent_message__free_unpacked(m, NULL);
    if (bad)
        return bad;
    agent_frame *f = malloc(sizeof *f + len);
    if (!f)
        return "out of memory";
    f->kind = kind;
    f->len = len;
    memcpy(f->data, data, len);
    if (!agent_inbox_put(&a->inbox, f) && kind == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT)
        atomic_fetch_add_explicit(&a->stats.reports_dropped[AGENT_DROP_INBOX_FULL], 1, memory_order_relaxed);
    return NULL;
}

/* Reads what the socket has and takes every whole frame. Returns a reason to close, or NULL. */
static const char *conn_read(agent *a, conn *c, bool *eof)
{
    for (;;) {
        if (c->cap - c->len < 65536) {
            size_t cap = c->cap ? c->cap * 2 : 131072;
            if (cap > PRISM_LOCAL_MAX_FRAME + PRISM_LOCAL_FRAME_HEADER + 65536)
                cap = PRISM_LOCAL_MAX_FRAME + PRISM_LOCAL_FRAME_HEADER + 65536;
            if (cap > c->cap) {
                uint8_t *buf = realloc(c->buf, cap);
                if (!buf)
                    return "out of memory";
                c->buf = buf;
                c->cap = cap;
            }
        }
        ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (n == 0) {
            *eof = true;
            break;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            *eof = true;
            break;
        }
        c->len += (size_t)n;
        size_t at = 0;
        while (c->len - at >= PRISM_LOCAL_FRAME_HEADER) {
            uint32_t len = prism_local_get_len(c->buf + at);
            if (len > PRISM_LOCAL_MAX_FRAME)
                return "a frame longer than the 64 MiB limit";
            if (c->len - at - PRISM_LOCAL_FRAME_HEADER < len)
                break;
            const char *bad = take_frame(a, c->buf + at + PRISM_LOCAL_FRAME_HEADER, len);
            if (bad)
                return bad;
            at += PRISM_LOCAL_FRAME_HEADER + len;
        }
        memmove(c->buf, c->buf + at, c->len - at);
        c->len -= at;
    }
    if (*eof && c->len)
        return "the connection ended inside a frame";
    return NULL;
}

int agent_socket_serve(agent *a, int listen_fd, int sigfd)
{
    conn conns[MAX_CONNECTIONS];
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        conns[i] = (conn){.fd = -1};
    unsigned next_id = 1;
    int sig = 0;
    while (!sig) {
        struct pollfd pfd[MAX_CONNECTIONS + 2];
        size_t map[MAX_CONNECTIONS];
        nfds_t n = 0;
        pfd[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
        for (size_t i = 0; i < MAX_CONNECTIONS; i++)
            if (conns[i].fd >= 0) {
                map[n - 2] = i;
                pfd[n++] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
            }
        if (poll(pfd, n, -1) < 0) {
            if (errno == EINTR)
                continue;
            prism_log(PRISM_LOG_ERROR, "poll failed", "error", strerror(errno), LOG_END);
            break;
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
                sig = (int)si.ssi_signo;
        }
        for (nfds_t k = 2; k < n; k++) {
            if (!pfd[k].revents)
                continue;
            conn *c = &conns[map[k - 2]];
            bool eof = false;
            const char *bad = conn_read(a, c, &eof);
            if (bad) {
                atomic_fetch_add_explicit(&a->stats.trainer_frames_rejected, 1, memory_order_relaxed);
                conn_close(a, c, bad);
            } else if (eof) {
                conn_close(a, c, NULL);
            }
        }
        if (pfd[1].revents & POLLIN) {
            int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                conn *slot = NULL;
                for (size_t i = 0; i < MAX_CONNECTIONS && !slot; i++)
                    if (conns[i].fd < 0)
                        slot = &conns[i];
                if (!slot) {
                    prism_log(PRISM_LOG_WARN, "trainer connection refused: too many connections", LOG_END);
                    close(fd);
                } else {
                    *slot = (conn){.fd = fd, .id = next_id++};
                    atomic_fetch_add_explicit(&a->stats.trainer_connections, 1, memory_order_relaxed);
                    atomic_fetch_add_explicit(&a->stats.trainer_connected, 1, memory_order_relaxed);
                    char id[16];
                    snprintf(id, sizeof id, "%u", slot->id);
                    prism_log(PRISM_LOG_INFO, "trainer connected", "connection", id, LOG_END);
                }
            }
        }
    }
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        if (conns[i].fd >= 0) {
            close(conns[i].fd);
            free(conns[i].buf);
        }
    return sig;
}
