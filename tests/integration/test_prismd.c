/* Integration tests of prismd: the real built binary, started on a free loopback port with a
 * scratch data directory, spoken to over a real TCP socket with a minimal HTTP/1.1 client.
 * Every wait is bounded in tries and time, and every prismd started is stopped (or killed) on
 * every path: by the test, at exit, or by the kernel when the test binary itself is killed. */
#define _GNU_SOURCE
#include "config.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PRISMD_BIN "service/prismd"
#define POLL_MS 50
#define READY_TRIES 200  /* 200 x 50 ms: 10 s for prismd to answer /readyz with 200 */
#define STOP_TRIES 200   /* 200 x 50 ms: 10 s for prismd to exit after a signal */
#define CLI_TIMEOUT_S 10 /* for runs that are expected to exit by themselves */
#define HTTP_TIMEOUT_S 2
#define HTTP_MAX 65536

/* ------------------------------------------------------------------------------------------- */
/* Processes */

typedef struct prismd_proc {
    pid_t pid; /* 0: not running */
    int family;
    uint16_t port;
    uint16_t grpc_port; /* gRPC on 127.0.0.1, so that runs never meet on the default port */
    char data_dir[512];
    char log_path[512];
} prismd_proc;

#define MAX_LIVE 8
static pid_t live_pids[MAX_LIVE];

static void live_add(pid_t pid)
{
    for (size_t i = 0; i < MAX_LIVE; i++) {
        if (live_pids[i] == 0) {
            live_pids[i] = pid;
            return;
        }
    }
}

static void live_remove(pid_t pid)
{
    for (size_t i = 0; i < MAX_LIVE; i++) {
        if (live_pids[i] == pid)
            live_pids[i] = 0;
    }
}

/* atexit: no prismd outlives the test binary. */
static void kill_leftovers(void)
{
    for (size_t i = 0; i < MAX_LIVE; i++) {
        if (live_pids[i] > 0) {
            kill(live_pids[i], SIGKILL);
            waitpid(live_pids[i], NULL, 0);
            live_pids[i] = 0;
        }
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A port that was free a moment ago: bind port 0 on the loopback address, read it, close. */
static uint16_t free_port(int family)
{
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *a;
    }
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&ss, len) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    return port;
}

static void listen_text(const prismd_proc *p, char *out, size_t size)
{
    if (p->family == AF_INET6)
        snprintf(out, size, "[::1]:%u", (unsigned)p->port);
    else
        snprintf(out, size, "127.0.0.1:%u", (unsigned)p->port);
}

/* Prepares p for a run in scratch/name: a fresh port, data dir scratch/name/data (not created),
 * log file scratch/name.log. */
static void prismd_prepare(prismd_proc *p, const char *name, int family)
{
    memset(p, 0, sizeof *p);
    p->family = family;
    p->port = free_port(family);
    p->grpc_port = free_port(AF_INET);
    snprintf(p->data_dir, sizeof p->data_dir, "%s/%s/data", prism_scratch_dir(), name);
    snprintf(p->log_path, sizeof p->log_path, "%s/%s.log", prism_scratch_dir(), name);
}

/* Starts prismd on p's address and data dir with extra arguments (NULL-terminated, may be NULL);
 * stdout and stderr go to p->log_path. Returns 0 when the child was started. */
static int prismd_spawn(prismd_proc *p, const char *const *extra)
{
    char listen[64], grpc_listen[64];
    listen_text(p, listen, sizeof listen);
    snprintf(grpc_listen, sizeof grpc_listen, "127.0.0.1:%u", (unsigned)p->grpc_port);
    const char *argv[18];
    size_t n = 0;
    argv[n++] = prism_build_path(PRISMD_BIN);
    argv[n++] = "--http-listen";
    argv[n++] = listen;
    argv[n++] = "--grpc-listen";
    argv[n++] = grpc_listen;
    argv[n++] = "--data-dir";
    argv[n++] = p->data_dir;
    for (size_t i = 0; extra && extra[i] && n < 17; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    char bin[4096];
    snprintf(bin, sizeof bin, "%s", argv[0]);
    argv[0] = bin;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* Dies with the test binary even when that is SIGKILLed (a ctest timeout). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        int in = open("/dev/null", O_RDONLY);
        int out = open(p->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0)
            _exit(127);
        dup2(in, 0);
        dup2(out, 1);
        dup2(out, 2);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    p->pid = pid;
    live_add(pid);
    return 0;
}

/* Waits for p to exit by itself, at most tries x POLL_MS; returns its exit code (128 + signal
 * when killed by one), or -1 if it is still running. */
static int prismd_wait_exit(prismd_proc *p, int tries)
{
    for (int i = 0; i < tries && p->pid > 0; i++) {
        int status;
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid) {
            live_remove(p->pid);
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        sleep_ms(POLL_MS);
    }
    return -1;
}

/* Sends sig and waits up to STOP_TRIES x POLL_MS for the exit; kills it after that. Returns the
 * exit code, or -1 when it had to be killed (or was not running). */
static int prismd_stop(prismd_proc *p, int sig)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, sig);
    int code = prismd_wait_exit(p, STOP_TRIES);
    if (code < 0 && p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        live_remove(p->pid);
        p->pid = 0;
    }
    return code;
}

static char *prismd_log(const prismd_proc *p)
{
    char *text = prism_read_file(p->log_path, NULL);
    return text ? text : strdup("");
}

/* ------------------------------------------------------------------------------------------- */
/* A minimal HTTP/1.1 client: one request per connection, "Connection: close", read to EOF. */

typedef struct http_response {
    int status;
    char content_type[128];
    char allow[128];
    char body[HTTP_MAX];
    size_t body_len;
} http_response;

static void header_value(const char *headers, const char *name, char *out, size_t size)
{
    out[0] = '\0';
    size_t nlen = strlen(name);
    for (const char *line = headers; line && *line;) {
        const char *eol = strstr(line, "\r\n");
        if (!eol || eol == line)
            return;
        if (strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
            const char *v = line + nlen + 1;
            while (*v == ' ')
                v++;
            size_t len = (size_t)(eol - v);
            if (len >= size)
                len = size - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            return;
        }
        line = eol + 2;
    }
}

/* Appends one answer to the file named by PRISM_OPENAPI_ANSWERS (ctest sets it), one JSON line
 * of openapi_check.py's form, for the test that validates every answer against prismd's OpenAPI
 * document after this one (tests/openapi.cmake). A request path or body that is not UTF-8 is
 * written as "<not UTF-8>", which the check refuses. */
static void record_answer(const char *method, const char *path, const http_response *res)
{
    const char *file = getenv("PRISM_OPENAPI_ANSWERS");
    if (!file || !file[0])
        return;
    json_t *p = json_string(path), *b = json_stringn(res->body, res->body_len);
    json_t *headers = res->allow[0] ? json_pack("{s:s}", "allow", res->allow) : json_object();
    json_t *line = json_pack("{s:s, s:o, s:i, s:s, s:o, s:o}", "method", method, "path",
                             p ? p : json_string("<not UTF-8>"), "status", res->status, "content_type",
                             res->content_type, "body", b ? b : json_string("<not UTF-8>"), "headers", headers);
    FILE *f = line ? fopen(file, "a") : NULL;
    if (f) {
        json_dumpf(line, f, JSON_COMPACT);
        fputc('\n', f);
        fclose(f);
    }
    json_decref(line);
}

/* Returns 0 and fills res when a whole response came back, -1 otherwise. */
static int http_request(const prismd_proc *p, const char *method, const char *path,
                        http_response *res)
{
    memset(res, 0, sizeof *res);
    res->status = -1;
    int fd = socket(p->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {HTTP_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (p->family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        a->sin6_port = htons(p->port);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a->sin_port = htons(p->port);
        len = sizeof *a;
    }
    if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
        close(fd);
        return -1;
    }
    char req[1024];
    int req_len = snprintf(req, sizeof req,
                           "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                           "Content-Length: 0\r\n\r\n",
                           method, path);
    if (send(fd, req, (size_t)req_len, MSG_NOSIGNAL) != req_len) {
        close(fd);
        return -1;
    }
    static char buf[HTTP_MAX + 4096];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0)
            break; /* EOF, error or the receive timeout */
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';

    int status;
    if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
        return -1;
    const char *end = strstr(buf, "\r\n\r\n");
    if (!end)
        return -1;
    const char *headers = strstr(buf, "\r\n") + 2;
    header_value(headers, "Content-Type", res->content_type, sizeof res->content_type);
    header_value(headers, "Allow", res->allow, sizeof res->allow);
    char clen[32];
    header_value(headers, "Content-Length", clen, sizeof clen);
    const char *body = end + 4;
    size_t body_len = got - (size_t)(body - buf);
    if (!clen[0] || strtoul(clen, NULL, 10) != body_len || body_len >= sizeof res->body)
        return -1;
    memcpy(res->body, body, body_len);
    res->body[body_len] = '\0';
    res->body_len = body_len;
    res->status = status;
    record_answer(method, path, res);
    return 0;
}

/* Polls /readyz until it answers 200, at most READY_TRIES x POLL_MS, giving up early if the
 * process exits; res keeps the last answer. Not /healthz: that answers 200 as soon as the HTTP
 * server runs, while gRPC and the policy thread are still starting (/readyz turns 200 12 to 60 ms
 * later on an idle 2-CPU machine, over 200 ms later under load), and every test wants a prismd
 * that serves. */
static bool prismd_wait_ready(prismd_proc *p, http_response *res)
{
    for (int i = 0; i < READY_TRIES && p->pid > 0; i++) {
        if (http_request(p, "GET", "/readyz", res) == 0 && res->status == 200)
            return true;
        if (prismd_wait_exit(p, 1) >= 0)
            return false;
    }
    return false;
}

/* Starts prismd and waits until it is ready; on failure prints its last /readyz answer and its
 * log, and stops it. */
static bool prismd_start(prismd_proc *p, const char *const *extra)
{
    static http_response res;
    if (p->port == 0 || prismd_spawn(p, extra) != 0)
        return false;
    if (prismd_wait_ready(p, &res))
        return true;
    char *log = prismd_log(p);
    fprintf(stderr, "\nprismd did not become ready (last /readyz: %d %s); its log:\n%s\n",
            res.status, res.body, log);
    free(log);
    prismd_stop(p, SIGKILL);
    return false;
}

/* Runs prismd with argv (NULL-terminated, without the program) until it exits by itself. */
static void run_prismd(const char *const *args, prism_proc_result *res)
{
    char bin[4096];
    snprintf(bin, sizeof bin, "%s", prism_build_path(PRISMD_BIN));
    const char *argv[24];
    size_t n = 0;
    argv[n++] = bin;
    for (size_t i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (prism_run_process((char *const *)argv, NULL, CLI_TIMEOUT_S, res) != 0) {
        memset(res, 0, sizeof *res);
        res->exit_code = -1;
        res->out = strdup("");
        res->err = strdup("");
    }
}

static bool contains(const char *haystack, const char *needle)
{
    return haystack && strstr(haystack, needle) != NULL;
}

/* How many times needle occurs in haystack (not overlapping). */
static int occurrences(const char *haystack, const char *needle)
{
    int n = 0;
    for (const char *at = haystack; at && (at = strstr(at, needle)) != NULL; at += strlen(needle))
        n++;
    return n;
}

/* ------------------------------------------------------------------------------------------- */
/* Command line */

static void test_help_exits_0_and_lists_every_option(void)
{
    static const char *const expected[] = {
        "--http-listen ADDR:PORT", "--data-dir DIR", "--config FILE", "--log-level LEVEL",
        "-h, --help", "--version", "(default: 127.0.0.1:8080)", "(default: ./prism-data)",
        "(default: info)", "GET /healthz", "GET /readyz", "GET /v1/config/defaults",
        "bf16_threshold", NULL};
    static const char *const forms[][2] = {{"--help", NULL}, {"-h", NULL}};
    for (size_t f = 0; f < 2; f++) {
        prism_proc_result res;
        run_prismd(forms[f], &res);
        CU_ASSERT_EQUAL(res.exit_code, 0);
        CU_ASSERT_STRING_EQUAL(res.err, "");
        CU_ASSERT_EQUAL(strncmp(res.out, "Usage: prismd [OPTION]...\n", 26), 0);
        for (size_t i = 0; expected[i]; i++) {
            if (!contains(res.out, expected[i]))
                fprintf(stderr, "\n%s: missing %s\n", forms[f][0], expected[i]);
            CU_ASSERT_TRUE(contains(res.out, expected[i]));
        }
        prism_proc_result_free(&res);
    }
}

static void test_version_prints_name_and_version(void)
{
    static const char *const args[] = {"--version", NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    CU_ASSERT_EQUAL(res.exit_code, 0);
    unsigned major, minor, patch;
    char nl = 0;
    CU_ASSERT_EQUAL(sscanf(res.out, "prismd %u.%u.%u%c", &major, &minor, &patch, &nl), 4);
    CU_ASSERT_EQUAL(nl, '\n');
    CU_ASSERT_STRING_EQUAL(res.err, "");
    prism_proc_result_free(&res);
}

typedef struct usage_case {
    const char *args[4];
    const char *stderr_text;
} usage_case;

/* Every usage error: exit 2, nothing on stdout, exactly one line on stderr naming flag and value. */
static void test_bad_options_exit_2_naming_flag_and_value(void)
{
#define ADDR_HELP                                                                                  \
    " is not ADDR:PORT (ADDR an IPv4 address a.b.c.d or an IPv6 address in brackets such as "    \
    "[::1]; PORT 1-65535)\n"
    static const usage_case cases[] = {
        {{"--bogus", NULL}, "prismd: unknown option \"--bogus\" (see prismd --help)\n"},
        {{"--bogus=1", NULL}, "prismd: unknown option \"--bogus\" (see prismd --help)\n"},
        {{"-x", NULL}, "prismd: unknown option \"-x\" (see prismd --help)\n"},
        {{"serve", NULL}, "prismd: unexpected argument \"serve\" (see prismd --help)\n"},
        {{"--http-listen", "abc", NULL}, "prismd: --http-listen: \"abc\"" ADDR_HELP},
        {{"--http-listen=127.0.0.1", NULL}, "prismd: --http-listen: \"127.0.0.1\"" ADDR_HELP},
        {{"--http-listen=127.0.0.1:0", NULL}, "prismd: --http-listen: \"127.0.0.1:0\"" ADDR_HELP},
        {{"--http-listen=127.0.0.1:65536", NULL},
         "prismd: --http-listen: \"127.0.0.1:65536\"" ADDR_HELP},
        {{"--http-listen=256.0.0.1:80", NULL}, "prismd: --http-listen: \"256.0.0.1:80\"" ADDR_HELP},
        {{"--http-listen=localhost:80", NULL}, "prismd: --http-listen: \"localhost:80\"" ADDR_HELP},
        {{"--http-listen=::1:80", NULL}, "prismd: --http-listen: \"::1:80\"" ADDR_HELP},
        {{"--http-listen=[::1]", NULL}, "prismd: --http-listen: \"[::1]\"" ADDR_HELP},
        {{"--http-listen=[::1]:8x", NULL}, "prismd: --http-listen: \"[::1]:8x\"" ADDR_HELP},
        {{"--grpc-listen", "abc", NULL}, "prismd: --grpc-listen: \"abc\"" ADDR_HELP},
        {{"--max-blocks", "0", NULL}, "prismd: --max-blocks: \"0\" is not an integer from 1 to 10000000\n"},
        {{"--max-message-bytes=lots", NULL},
         "prismd: --max-message-bytes: \"lots\" is not an integer from 1024 to 1073741824\n"},
        {{"--auto-create", "maybe", NULL}, "prismd: --auto-create: \"maybe\" is not true or false\n"},
        {{"--data-dir", NULL}, "prismd: --data-dir: missing value DIR\n"},
        {{"--http-listen", "--log-level", "debug", NULL},
         "prismd: --http-listen: missing value ADDR:PORT\n"},
        {{"--data-dir=", NULL}, "prismd: --data-dir: the directory name is empty\n"},
        {{"--log-level=verbose", NULL},
         "prismd: --log-level: \"verbose\" is not one of debug, info, warn, error\n"},
        {{"--log-level", "INFO", NULL},
         "prismd: --log-level: \"INFO\" is not one of debug, info, warn, error\n"},
        {{"--help=yes", NULL}, "prismd: --help takes no value (got \"yes\")\n"},
    };
#undef ADDR_HELP
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_proc_result res;
        run_prismd(cases[i].args, &res);
        if (res.exit_code != 2 || strcmp(res.err, cases[i].stderr_text) != 0)
            fprintf(stderr, "\ncase %s: exit %d, stderr %s", cases[i].args[0], res.exit_code,
                    res.err);
        CU_ASSERT_EQUAL(res.exit_code, 2);
        CU_ASSERT_STRING_EQUAL(res.err, cases[i].stderr_text);
        CU_ASSERT_STRING_EQUAL(res.out, "");
        prism_proc_result_free(&res);
    }
}

typedef struct config_case {
    const char *file_name;
    const char *text;
    const char *at;        /* follows the file's path in stderr, e.g. ":3:1: JSON syntax error" */
    const char *parts[2];  /* each must appear in stderr too */
} config_case;

static void test_bad_config_exits_2_naming_key_or_position(void)
{
    static const config_case cases[] = {
        {"unknown-key.json", "{\"bf16_treshold\": 0.5}\n", ":", {"bf16_treshold", "unknown key"}},
        {"nested-unknown.json",
         "{\"memory\": {\"stagehand\": {\"selective_precision\": {\"histroy_window\": 3}}}}\n",
         ":", {"histroy_window", "unknown key"}},
        {"syntax.json", "{\n  \"bf16_threshold\": 0.5,\n}\n", ":3:1: JSON syntax error", {NULL, NULL}},
        {"order.json", "{\"int8_threshold\": 0.7, \"bf16_threshold\": 0.6}\n", ":",
         {"int8_threshold", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s",
                 prism_write_file(prism_scratch_dir(), cases[i].file_name, cases[i].text));
        char data_dir[4096];
        snprintf(data_dir, sizeof data_dir, "%s/bad-config-data", prism_scratch_dir());
        const char *args[] = {"--config", path, "--data-dir", data_dir, NULL};
        prism_proc_result res;
        run_prismd(args, &res);
        CU_ASSERT_EQUAL(res.exit_code, 2);
        CU_ASSERT_EQUAL(strncmp(res.err, "prismd: --config: ", 18), 0);
        const char *nl = strchr(res.err, '\n');
        CU_ASSERT_TRUE(nl != NULL && (size_t)(nl - res.err) + 1 == res.err_len); /* one line */
        char at[4200];
        snprintf(at, sizeof at, "%s%s", path, cases[i].at);
        const char *parts[] = {at, cases[i].parts[0], cases[i].parts[1]};
        for (size_t k = 0; k < 3 && parts[k]; k++) {
            const char *part = parts[k];
            if (!contains(res.err, part))
                fprintf(stderr, "\n%s: stderr lacks \"%s\": %s", cases[i].file_name, part,
                        res.err);
            CU_ASSERT_TRUE(contains(res.err, part));
        }
        struct stat st;
        CU_ASSERT_NOT_EQUAL(stat(data_dir, &st), 0); /* a bad config creates nothing */
        prism_proc_result_free(&res);
    }
}

static void test_missing_config_file_exits_2_naming_it(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/no-such-config.json", prism_scratch_dir());
    const char *args[] = {"--config", path, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    CU_ASSERT_EQUAL(res.exit_code, 2);
    char expected[4200];
    snprintf(expected, sizeof expected, "prismd: --config: %s", path);
    CU_ASSERT_EQUAL(strncmp(res.err, expected, strlen(expected)), 0);
    prism_proc_result_free(&res);
}

/* ------------------------------------------------------------------------------------------- */
/* HTTP */

static http_response g_res; /* large: kept out of the stack */

static void test_healthz_answers_200_status_ok(void)
{
    prismd_proc p;
    prismd_prepare(&p, "healthz", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/healthz", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_STRING_EQUAL(g_res.content_type, "application/json");
    CU_ASSERT_STRING_EQUAL(g_res.body, "{\"status\":\"ok\"}");
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

/* Once ready (prismd_start waits for it: the store open, gRPC listening, the policy thread
 * running), prismd stays ready and says which data dir it serves. */
static void test_readyz_answers_200_ready_with_data_dir(void)
{
    prismd_proc p;
    prismd_prepare(&p, "readyz", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/readyz", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_STRING_EQUAL(g_res.content_type, "application/json");
    char expected[1024];
    snprintf(expected, sizeof expected, "{\"status\":\"ready\",\"data_dir\":\"%s\"}", p.data_dir);
    CU_ASSERT_STRING_EQUAL(g_res.body, expected);
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

/* The served config has every key of the policy table, with the defaults of DESIGN 4.1. */
static void test_config_defaults_serves_policy_defaults(void)
{
    prismd_proc p;
    prismd_prepare(&p, "defaults", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/v1/config/defaults", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_STRING_EQUAL(g_res.content_type, "application/json");
    CU_ASSERT_PTR_NOT_NULL(strstr(g_res.body, "{\n  \"enabled\": true,\n")); /* pretty, in order */
    CU_ASSERT_PTR_NOT_NULL(strstr(g_res.body, "\n  \"bf16_threshold\": 0.6,\n")); /* as written */
    json_error_t jerr;
    json_t *cfg = json_loads(g_res.body, 0, &jerr);
    CU_ASSERT_TRUE(json_is_object(cfg));
    CU_ASSERT_TRUE(json_is_real(json_object_get(cfg, "bf16_threshold")));
    CU_ASSERT_EQUAL(json_real_value(json_object_get(cfg, "bf16_threshold")), 0.6);
    CU_ASSERT_TRUE(json_is_integer(json_object_get(cfg, "history_window")));
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(cfg, "history_window")), 5);
    const char *mode = json_string_value(json_object_get(cfg, "mode"));
    CU_ASSERT_STRING_EQUAL(mode ? mode : "(none)", "dynamic");
    size_t nkeys = 0;
    const prism_config_key *keys = prism_config_keys(&nkeys);
    CU_ASSERT_EQUAL(json_object_size(cfg), nkeys);
    for (size_t i = 0; i < nkeys; i++)
        CU_ASSERT_PTR_NOT_NULL(json_object_get(cfg, keys[i].name));
    json_decref(cfg);
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

static void test_config_file_sets_served_defaults(void)
{
    const char *path = prism_write_file(
        prism_scratch_dir(), "good.json",
        "{\"memory\": {\"stagehand\": {\"selective_precision\": "
        "{\"bf16_threshold\": 0.7, \"history_window\": 8}}}}\n");
    char config[4096];
    snprintf(config, sizeof config, "--config=%s", path);
    const char *const extra[] = {config, NULL};
    prismd_proc p;
    prismd_prepare(&p, "good-config", AF_INET);
    if (!prismd_start(&p, extra)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/v1/config/defaults", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    json_t *cfg = json_loads(g_res.body, 0, NULL);
    CU_ASSERT_EQUAL(json_real_value(json_object_get(cfg, "bf16_threshold")), 0.7);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(cfg, "history_window")), 8);
    CU_ASSERT_EQUAL(json_real_value(json_object_get(cfg, "int8_threshold")), 0.3);
    json_decref(cfg);
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

/* Checks an error answer: status, content type and the body of DESIGN 6, exactly. */
static void assert_error_body(int status, const char *code, const char *message)
{
    CU_ASSERT_EQUAL(g_res.status, status);
    CU_ASSERT_STRING_EQUAL(g_res.content_type, "application/json");
    json_t *body = json_loads(g_res.body, 0, NULL);
    CU_ASSERT_EQUAL(json_object_size(body), 1);
    json_t *error = json_object_get(body, "error");
    CU_ASSERT_EQUAL(json_object_size(error), 2);
    const char *got_code = json_string_value(json_object_get(error, "code"));
    const char *got_message = json_string_value(json_object_get(error, "message"));
    CU_ASSERT_STRING_EQUAL(got_code ? got_code : "(none)", code);
    CU_ASSERT_STRING_EQUAL(got_message ? got_message : "(none)", message);
    json_decref(body);
}

static void test_unknown_path_answers_404_not_found(void)
{
    prismd_proc p;
    prismd_prepare(&p, "not-found", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/nope", &g_res), 0);
    assert_error_body(404, "not_found", "no route for GET /nope");
    CU_ASSERT_EQUAL(http_request(&p, "DELETE", "/v1/nothing", &g_res), 0);
    assert_error_body(404, "not_found", "no route for DELETE /v1/nothing");
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/index.htm", &g_res), 0);
    assert_error_body(404, "not_found", "no route for GET /index.htm");
    /* / is the dashboard (or the page saying it was not built), not JSON. */
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_STRING_EQUAL(g_res.content_type, "text/html; charset=utf-8");
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

static void test_other_method_on_known_path_answers_405(void)
{
    prismd_proc p;
    prismd_prepare(&p, "method", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "POST", "/healthz", &g_res), 0);
    assert_error_body(405, "method_not_allowed",
                      "POST is not allowed on /healthz (allowed: GET, HEAD)");
    CU_ASSERT_STRING_EQUAL(g_res.allow, "GET, HEAD");
    CU_ASSERT_EQUAL(http_request(&p, "PUT", "/v1/config/defaults", &g_res), 0);
    assert_error_body(405, "method_not_allowed",
                      "PUT is not allowed on /v1/config/defaults (allowed: GET, HEAD)");
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

static void test_ipv6_loopback_listen_serves_healthz(void)
{
    prismd_proc p;
    prismd_prepare(&p, "ipv6", AF_INET6);
    if (p.port == 0) {
        fprintf(stderr, "\n  (no IPv6 loopback on this machine: nothing to check)\n");
        return;
    }
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start on [::1]");
        return;
    }
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/healthz", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_STRING_EQUAL(g_res.body, "{\"status\":\"ok\"}");
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
    char *log = prismd_log(&p);
    char expected[128];
    snprintf(expected, sizeof expected, "msg=\"listening\" grpc=127.0.0.1:%u http=[::1]:%u ",
             (unsigned)p.grpc_port, (unsigned)p.port);
    CU_ASSERT_TRUE(contains(log, expected));
    free(log);
}

/* ------------------------------------------------------------------------------------------- */
/* Data directory, lock, signals, logs */

static void test_data_dir_is_created_with_mode_0750_and_locked(void)
{
    prismd_proc p;
    prismd_prepare(&p, "mkdir", AF_INET);
    snprintf(p.data_dir, sizeof p.data_dir, "%s/mkdir/a/b/data", prism_scratch_dir());
    struct stat st;
    CU_ASSERT_NOT_EQUAL(stat(p.data_dir, &st), 0);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    CU_ASSERT_EQUAL(stat(p.data_dir, &st), 0);
    CU_ASSERT_TRUE(S_ISDIR(st.st_mode));
    CU_ASSERT_EQUAL(st.st_mode & 07777, 0750); /* the test runs with umask 022 */
    char lock_path[1024];
    snprintf(lock_path, sizeof lock_path, "%s/prismd.lock", p.data_dir);
    char *pid_text = prism_read_file(lock_path, NULL);
    char expected[32];
    snprintf(expected, sizeof expected, "%ld\n", (long)p.pid);
    CU_ASSERT_STRING_EQUAL(pid_text ? pid_text : "(no lock file)", expected);
    free(pid_text);
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

static void test_second_prismd_on_same_data_dir_exits_1_naming_it(void)
{
    prismd_proc p;
    prismd_prepare(&p, "locked", AF_INET);
    if (!prismd_start(&p, NULL)) {
        CU_FAIL("prismd did not start");
        return;
    }
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", (unsigned)free_port(AF_INET));
    const char *args[] = {"--http-listen", listen, "--data-dir", p.data_dir, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    CU_ASSERT_EQUAL(res.exit_code, 1);
    char expected[4096];
    snprintf(expected, sizeof expected,
             "level=error msg=\"cannot lock data dir\" data_dir=%s error=\"data dir %s is in use "
             "by another prismd (pid %ld holds %s/prismd.lock)\"\n",
             p.data_dir, p.data_dir, (long)p.pid, p.data_dir);
    if (!contains(res.err, expected))
        fprintf(stderr, "\nstderr: %s\nexpected: %s", res.err, expected);
    CU_ASSERT_TRUE(contains(res.err, expected));
    prism_proc_result_free(&res);
    /* The first one is unaffected. */
    CU_ASSERT_EQUAL(http_request(&p, "GET", "/readyz", &g_res), 0);
    CU_ASSERT_EQUAL(g_res.status, 200);
    CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
}

static void test_uncreatable_data_dir_exits_1_naming_it(void)
{
    const char *file = prism_write_file(prism_scratch_dir(), "plain-file", "x\n");
    char data_dir[4096];
    snprintf(data_dir, sizeof data_dir, "%s/data", file);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", (unsigned)free_port(AF_INET));
    const char *args[] = {"--http-listen", listen, "--data-dir", data_dir, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    CU_ASSERT_EQUAL(res.exit_code, 1);
    char expected[8400];
    snprintf(expected, sizeof expected,
             "level=error msg=\"cannot create data dir\" data_dir=%s error=\"cannot create %s: "
             "Not a directory\"\n",
             data_dir, data_dir);
    if (!contains(res.err, expected))
        fprintf(stderr, "\nstderr: %s\nexpected: %s", res.err, expected);
    CU_ASSERT_TRUE(contains(res.err, expected));
    prism_proc_result_free(&res);
}

/* A taken gRPC port: exit 1 with the address named, and the HTTP side does not linger. */
static void test_taken_grpc_port_exits_1_naming_address(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CU_ASSERT_EQUAL(bind(fd, (struct sockaddr *)&a, len), 0);
    CU_ASSERT_EQUAL(listen(fd, 1), 0);
    CU_ASSERT_EQUAL(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char grpc_addr[64], http_addr[64], data_dir[4096];
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    snprintf(http_addr, sizeof http_addr, "127.0.0.1:%u", (unsigned)free_port(AF_INET));
    snprintf(data_dir, sizeof data_dir, "%s/grpc-port-taken", prism_scratch_dir());
    const char *args[] = {"--grpc-listen", grpc_addr, "--http-listen", http_addr, "--data-dir", data_dir, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    close(fd);
    CU_ASSERT_EQUAL(res.exit_code, 1);
    char expected[256];
    snprintf(expected, sizeof expected, "level=error msg=\"cannot listen\" grpc=%s error=", grpc_addr);
    if (!contains(res.err, expected))
        fprintf(stderr, "\nstderr: %s\nexpected: %s", res.err, expected);
    CU_ASSERT_TRUE(contains(res.err, expected));
    prism_proc_result_free(&res);
}

static void test_taken_port_exits_1_naming_address(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CU_ASSERT_EQUAL(bind(fd, (struct sockaddr *)&a, len), 0);
    CU_ASSERT_EQUAL(listen(fd, 1), 0);
    CU_ASSERT_EQUAL(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char listen_addr[64], data_dir[4096];
    snprintf(listen_addr, sizeof listen_addr, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    snprintf(data_dir, sizeof data_dir, "%s/port-taken", prism_scratch_dir());
    const char *args[] = {"--http-listen", listen_addr, "--data-dir", data_dir, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    close(fd);
    CU_ASSERT_EQUAL(res.exit_code, 1);
    char expected[256];
    snprintf(expected, sizeof expected, "level=error msg=\"cannot listen\" http=%s error=",
             listen_addr);
    if (!contains(res.err, expected))
        fprintf(stderr, "\nstderr: %s\nexpected: %s", res.err, expected);
    CU_ASSERT_TRUE(contains(res.err, expected));
    CU_ASSERT_TRUE(contains(res.err, "Address already in use"));
    prism_proc_result_free(&res);
}

/* A taken --health-listen port: exit 1 naming the address and libmicrohttpd's bind error, not
 * a warning logged before it (the health listener once logged one about its thread pool at
 * every start, which then stood in for the bind error). */
static void test_taken_health_port_exits_1_naming_bind_error(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CU_ASSERT_EQUAL(bind(fd, (struct sockaddr *)&a, len), 0);
    CU_ASSERT_EQUAL(listen(fd, 1), 0);
    CU_ASSERT_EQUAL(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char health_addr[64], http_addr[64], grpc_addr[64], data_dir[4096];
    snprintf(health_addr, sizeof health_addr, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    snprintf(http_addr, sizeof http_addr, "127.0.0.1:%u", (unsigned)free_port(AF_INET));
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%u", (unsigned)free_port(AF_INET));
    snprintf(data_dir, sizeof data_dir, "%s/health-port-taken", prism_scratch_dir());
    const char *args[] = {"--health-listen", health_addr, "--http-listen", http_addr, "--grpc-listen", grpc_addr,
                          "--data-dir", data_dir, NULL};
    prism_proc_result res;
    run_prismd(args, &res);
    close(fd);
    CU_ASSERT_EQUAL(res.exit_code, 1);
    char expected[256];
    snprintf(expected, sizeof expected, "level=error msg=\"cannot listen\" health=%s error=\"Failed to bind to port %u",
             health_addr, (unsigned)ntohs(a.sin_port));
    if (!contains(res.err, expected))
        fprintf(stderr, "\nstderr: %s\nexpected: %s", res.err, expected);
    CU_ASSERT_TRUE(contains(res.err, expected));
    CU_ASSERT_FALSE(contains(res.err, "thread pool"));
    prism_proc_result_free(&res);
}

/* SIGTERM and SIGINT both make prismd exit by itself with exit 0 (prismd_stop waits for that,
 * up to STOP_TRIES x POLL_MS, and kills it past that: -1), and the lock goes with it: a second
 * prismd can take the same data dir straight after. How fast it stops is not asserted. */
static void test_stop_signals_exit_0_and_release_the_lock(void)
{
    static const int signals[] = {SIGTERM, SIGINT};
    static const char *const names[] = {"SIGTERM", "SIGINT"};
    for (size_t i = 0; i < 2; i++) {
        prismd_proc p;
        prismd_prepare(&p, "signals", AF_INET);
        if (!prismd_start(&p, NULL)) {
            CU_FAIL("prismd did not start");
            return;
        }
        CU_ASSERT_EQUAL(prismd_stop(&p, signals[i]), 0);
        char *log = prismd_log(&p);
        char expected[1024];
        snprintf(expected, sizeof expected, "level=info msg=\"stopping\" signal=%s\n", names[i]);
        CU_ASSERT_TRUE(contains(log, expected));
        snprintf(expected, sizeof expected, "level=info msg=\"stopped\" data_dir=%s\n",
                 p.data_dir);
        CU_ASSERT_TRUE(contains(log, expected));
        free(log);
    }
}

/* Start-up and shutdown are logged at info; requests only at debug. Every line is logfmt. The
 * request asked is /healthz, which prismd_start does not ask, so the one such line is this
 * request's own; prismd writes it (one write, flushed) before it answers, and the log is read once
 * prismd has exited. */
static void test_logs_are_logfmt_with_requests_at_debug_only(void)
{
    static const char *const levels[] = {"debug", "info"};
    for (size_t i = 0; i < 2; i++) {
        const char *const extra[] = {"--log-level", levels[i], NULL};
        prismd_proc p;
        prismd_prepare(&p, i == 0 ? "log-debug" : "log-info", AF_INET);
        if (!prismd_start(&p, extra)) {
            CU_FAIL("prismd did not start");
            return;
        }
        CU_ASSERT_EQUAL(http_request(&p, "GET", "/healthz", &g_res), 0);
        CU_ASSERT_EQUAL(g_res.status, 200);
        CU_ASSERT_EQUAL(prismd_stop(&p, SIGTERM), 0);
        char *log = prismd_log(&p);
        char expected[1024];
        snprintf(expected, sizeof expected,
                 " level=info msg=\"listening\" grpc=127.0.0.1:%u http=127.0.0.1:%u data_dir=%s tls=off\n",
                 (unsigned)p.grpc_port, (unsigned)p.port, p.data_dir);
        CU_ASSERT_TRUE(contains(log, expected));
        CU_ASSERT_TRUE(contains(log, " level=info msg=\"starting\" version="));
        const char *request =
            " level=debug msg=\"request\" method=GET path=/healthz status=200 client=127.0.0.1:";
        CU_ASSERT_EQUAL(occurrences(log, request), i == 0 ? 1 : 0);
        CU_ASSERT_FALSE(contains(log, " level=warn "));
        CU_ASSERT_FALSE(contains(log, " level=error "));
        int lines = 0;
        for (const char *line = log; *line; lines++) {
            unsigned y, mo, d, h, mi, s, ms;
            char z = 0;
            CU_ASSERT_EQUAL(sscanf(line, "ts=%4u-%2u-%2uT%2u:%2u:%2u.%3u%c", &y, &mo, &d, &h, &mi,
                                   &s, &ms, &z),
                            8);
            CU_ASSERT_EQUAL(z, 'Z');
            const char *nl = strchr(line, '\n');
            line = nl ? nl + 1 : line + strlen(line);
        }
        CU_ASSERT_TRUE(lines >= 4); /* starting, listening, stopping, stopped */
        free(log);
    }
}

static const prism_test_case cli_cases[] = {
    {"test_help_exits_0_and_lists_every_option", test_help_exits_0_and_lists_every_option},
    {"test_version_prints_name_and_version", test_version_prints_name_and_version},
    {"test_bad_options_exit_2_naming_flag_and_value", test_bad_options_exit_2_naming_flag_and_value},
    {"test_bad_config_exits_2_naming_key_or_position",
     test_bad_config_exits_2_naming_key_or_position},
    {"test_missing_config_file_exits_2_naming_it", test_missing_config_file_exits_2_naming_it},
    {NULL, NULL}};

static const prism_test_case http_cases[] = {
    {"test_healthz_answers_200_status_ok", test_healthz_answers_200_status_ok},
    {"test_readyz_answers_200_ready_with_data_dir", test_readyz_answers_200_ready_with_data_dir},
    {"test_config_defaults_serves_policy_defaults", test_config_defaults_serves_policy_defaults},
    {"test_config_file_sets_served_defaults", test_config_file_sets_served_defaults},
    {"test_unknown_path_answers_404_not_found", test_unknown_path_answers_404_not_found},
    {"test_other_method_on_known_path_answers_405", test_other_method_on_known_path_answers_405},
    {"test_ipv6_loopback_listen_serves_healthz", test_ipv6_loopback_listen_serves_healthz},
    {NULL, NULL}};

static const prism_test_case lifecycle_cases[] = {
    {"test_data_dir_is_created_with_mode_0750_and_locked",
     test_data_dir_is_created_with_mode_0750_and_locked},
    {"test_second_prismd_on_same_data_dir_exits_1_naming_it",
     test_second_prismd_on_same_data_dir_exits_1_naming_it},
    {"test_uncreatable_data_dir_exits_1_naming_it", test_uncreatable_data_dir_exits_1_naming_it},
    {"test_taken_port_exits_1_naming_address", test_taken_port_exits_1_naming_address},
    {"test_taken_health_port_exits_1_naming_bind_error", test_taken_health_port_exits_1_naming_bind_error},
    {"test_taken_grpc_port_exits_1_naming_address", test_taken_grpc_port_exits_1_naming_address},
    {"test_stop_signals_exit_0_and_release_the_lock", test_stop_signals_exit_0_and_release_the_lock},
    {"test_logs_are_logfmt_with_requests_at_debug_only",
     test_logs_are_logfmt_with_requests_at_debug_only},
    {NULL, NULL}};

static const prism_test_suite suites[] = {{"prismd command line", cli_cases},
                                          {"prismd http", http_cases},
                                          {"prismd lifecycle", lifecycle_cases},
                                          {NULL, NULL}};

int main(int argc, char **argv)
{
    umask(022);
    signal(SIGPIPE, SIG_IGN);
    const char *answers = getenv("PRISM_OPENAPI_ANSWERS");
    if (answers && answers[0]) { /* this run's answers only */
        FILE *f = fopen(answers, "w");
        if (f)
            fclose(f);
    }
    atexit(kill_leftovers);
    return prism_test_main(argc, argv, suites);
}
