/* Fuzz target "hints": the shared-memory hint table (client/hints.c) given a corrupt file. The
 * input is the whole file. The trainer's side maps it (prism_hints_open) and reads it at several
 * steps; the agent's side then opens it as a restarted agent would (prism_hints_create: a table
 * it may keep keeps its slots, any other is replaced), publishes a map into it and reads the
 * trainer's write-back. Whatever the file holds, a read gives a consistent view or false. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "hints.h"

static char dir[64], path[128];

static void remove_dir(void)
{
    unlink(path);
    rmdir(dir);
}

static void write_file(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        /* tmpfs when there is one: the target writes the file twice per input. */
        struct stat st;
        snprintf(dir, sizeof dir, "%s/prism-fuzz-hints-XXXXXX",
                 stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp");
        FUZZ_CHECK(mkdtemp(dir) != NULL);
        snprintf(path, sizeof path, "%s/prism-hints", dir);
        atexit(remove_dir);
    }
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        FUZZ_CHECK(n > 0);
        done += (size_t)n;
    }
    close(fd);
}

static void check_read(const prism_hints *t, uint64_t step)
{
    prism_hints_view view;
    memset(&view, 0xa5, sizeof view);
    uint8_t out[64];
    if (!prism_hints_read(t, step, &view, out, sizeof out, 4))
        return;
    FUZZ_CHECK(view.map_version == 0 || view.effective_step <= step);
    size_t n = view.n_blocks < sizeof out ? view.n_blocks : sizeof out;
    for (size_t i = n; i < sizeof out; i++)
        FUZZ_CHECK(out[i] == PRISM_PRECISION_BF16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_file(data, size);
    static const uint64_t steps[] = {0, 1, 7, 1000, UINT64_MAX >> 1, UINT64_MAX};
    prism_hints t;
    prism_error err;
    if (prism_hints_open(&t, path, &err) == PRISM_OK) {
        for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
            check_read(&t, steps[i]);
        FUZZ_CHECK(!prism_hints_replaced(&t, path));
        prism_hints_write_applied(&t, 3, 5);
        prism_hints_close(&t);
    } else {
        FUZZ_CHECK(err.message[0] != '\0');
    }

    /* The agent's side: a max_blocks the file may agree with, so that its slots can be kept. */
    uint32_t max_blocks = 16;
    if (size >= 16) {
        uint32_t m = (uint32_t)data[12] | (uint32_t)data[13] << 8 | (uint32_t)data[14] << 16 |
                     (uint32_t)data[15] << 24;
        if (m >= 1 && m <= 4096)
            max_blocks = m;
    }
    write_file(data, size);
    prism_hints agent;
    if (prism_hints_create(&agent, path, max_blocks, &err) != PRISM_OK) {
        FUZZ_CHECK(err.message[0] != '\0');
        return 0;
    }
    uint8_t map[16];
    for (size_t i = 0; i < sizeof map; i++)
        map[i] = (uint8_t)(i % PRISM_PRECISION_COUNT);
    uint32_t n = max_blocks < sizeof map ? max_blocks : (uint32_t)sizeof map;
    prism_status st = prism_hints_publish_map(&agent, UINT64_MAX - 1, 10, 12, map, n, &err);
    FUZZ_CHECK(st == PRISM_OK || st == PRISM_ERR_STATE);
    prism_runtime_hints rh = {.map_version = 1, .max_inflight_h2d = 2, .vram_pressure_threshold = 0.5};
    prism_hints_set_runtime(&agent, &rh);
    prism_hints_set_status(&agent, true, false, true, 4, PRISM_PRECISION_INT8);
    uint64_t v, s;
    (void)prism_hints_read_applied(&agent, &v, &s);
    prism_hints trainer;
    FUZZ_CHECK(prism_hints_open(&trainer, path, &err) == PRISM_OK);
    prism_hints_view view;
    uint8_t out[16];
    FUZZ_CHECK(prism_hints_read(&trainer, 12, &view, out, sizeof out, 4));
    if (st == PRISM_OK) {
        FUZZ_CHECK(view.map_version == UINT64_MAX - 1);
        FUZZ_CHECK(memcmp(out, map, n) == 0);
    }
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
    return 0;
}
