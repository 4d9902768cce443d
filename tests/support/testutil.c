#define _GNU_SOURCE
#include "testutil.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int prism_test_main(int argc, char **argv, const prism_test_suite *suites)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 2;
    for (const prism_test_suite *s = suites; s->name; s++) {
        CU_pSuite suite = CU_add_suite(s->name, NULL, NULL);
        if (!suite)
            return 2;
        for (const prism_test_case *c = s->cases; c->name; c++) {
            if (only && strcmp(only, c->name) != 0)
                continue;
            if (!CU_add_test(suite, c->name, c->fn))
                return 2;
        }
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    unsigned ran = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    prism_scratch_cleanup();
    if (ran == 0) {
        fprintf(stderr, "no test ran\n");
        return 1;
    }
    return failed ? 1 : 0;
}

static void append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t ncap = (*cap ? *cap * 2 : 4096);
        while (ncap < *len + n + 1)
            ncap *= 2;
        *buf = realloc(*buf, ncap);
        if (!*buf)
            abort();
        *cap = ncap;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int prism_run_process(char *const argv[], const char *stdin_text, int timeout_s,
                      prism_proc_result *res)
{
    memset(res, 0, sizeof *res);
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    signal(SIGPIPE, SIG_IGN);
    size_t in_left = stdin_text ? strlen(stdin_text) : 0;
    const char *in_p = stdin_text;
    if (in_left == 0) {
        close(in[1]);
        in[1] = -1;
    }
    size_t ocap = 0, ecap = 0;
    append(&res->out, &res->out_len, &ocap, "", 0);
    append(&res->err, &res->err_len, &ecap, "", 0);
    double deadline = now_s() + timeout_s;
    int open_fds = 2;
    while (open_fds > 0) {
        struct pollfd p[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
        int left_ms = (int)((deadline - now_s()) * 1000);
        if (left_ms <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        if (poll(p, 3, left_ms) < 0 && errno != EINTR)
            break;
        char buf[65536];
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n <= 0) {
                close(p[i].fd);
                if (i == 0)
                    out[0] = -1;
                else
                    err[0] = -1;
                open_fds--;
            } else if (i == 0) {
                append(&res->out, &res->out_len, &ocap, buf, (size_t)n);
            } else {
                append(&res->err, &res->err_len, &ecap, buf, (size_t)n);
            }
        }
        if (in[1] >= 0 && (p[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = write(in[1], in_p, in_left);
            if (n > 0) {
                in_p += n;
                in_left -= (size_t)n;
            }
            if (n <= 0 || in_left == 0) {
                close(in[1]);
                in[1] = -1;
            }
        }
    }
    if (out[0] >= 0)
        close(out[0]);
    if (err[0] >= 0)
        close(err[0]);
    if (in[1] >= 0)
        close(in[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    res->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return 0;
}

void prism_proc_result_free(prism_proc_result *res)
{
    free(res->out);
    free(res->err);
    memset(res, 0, sizeof *res);
}

const char *prism_build_path(const char *name)
{
    static char path[4096];
    const char *dir = getenv("PRISM_BUILD_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ".", name);
    return path;
}

static char scratch[256];

const char *prism_scratch_dir(void)
{
    if (!scratch[0]) {
        snprintf(scratch, sizeof scratch, "/tmp/prism-test-XXXXXX");
        if (!mkdtemp(scratch))
            abort();
    }
    return scratch;
}

void prism_scratch_cleanup(void)
{
    if (!scratch[0])
        return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", scratch);
    scratch[0] = '\0';
}

const char *prism_write_file(const char *dir, const char *name, const char *text)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        abort();
    fputs(text, f);
    fclose(f);
    return path;
}

char *prism_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        append(&buf, &n, &cap, chunk, got);
    fclose(f);
    if (!buf)
        append(&buf, &n, &cap, "", 0);
    if (len)
        *len = n;
    return buf;
}
