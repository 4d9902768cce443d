/* Fuzz target "plans": the shared-memory plan file (client/plans.c) given a corrupt file. The
 * input is the whole file. The trainer's side maps it (prism_plans_open) and reads the plans of
 * several map versions; the agent's side then opens it as a restarted agent would
 * (prism_plans_create: a file it may keep keeps its slots, any other is replaced), publishes a
 * plan, and the trainer must read that plan back exactly. Whatever the file holds, a read gives a
 * consistent plan (every block byte high or a low precision, the class NUL-terminated, the
 * figures finite), no plan, or an inconsistent read that leaves the entry untouched. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "plans.h"

static char dir[64], path[128];

static void remove_dir(void)
{
    unlink(path);
    rmdir(dir);
}

static void write_file(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        struct stat st; /* tmpfs when there is one: the target writes the file twice per input */
        snprintf(dir, sizeof dir, "%s/prism-fuzz-plans-XXXXXX",
                 stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp");
        FUZZ_CHECK(mkdtemp(dir) != NULL);
        snprintf(path, sizeof path, "%s/prism-hints.plans", dir);
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

static void check_read(const prism_plans *t, uint64_t version)
{
    prism_plans_entry e;
    memset(&e, 0xa5, sizeof e);
    prism_plans_entry before = e;
    uint8_t out[64];
    prism_plans_found f = prism_plans_read(t, version, &e, out, sizeof out, 4);
    if (f != PRISM_PLANS_FOUND) {
        FUZZ_CHECK(memcmp(&e, &before, sizeof e) == 0);
        return;
    }
    FUZZ_CHECK(e.map_version == version);
    FUZZ_CHECK(e.low_format > PRISM_PRECISION_BF16 && e.low_format < PRISM_PRECISION_COUNT);
    FUZZ_CHECK(isfinite(e.predicted_iteration_seconds) && isfinite(e.compute_seconds));
    FUZZ_CHECK(memchr(e.device_class, '\0', sizeof e.device_class) != NULL);
    uint32_t low = 0;
    for (size_t i = 0; i < sizeof out; i++) {
        FUZZ_CHECK(out[i] < PRISM_PRECISION_COUNT);
        low += out[i] != 0;
        if (i >= e.n_blocks)
            FUZZ_CHECK(out[i] == 0);
    }
    FUZZ_CHECK(e.low_blocks == low);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_file(data, size);
    static const uint64_t versions[] = {0, 1, 2, 3, 7, UINT64_MAX - 1, UINT64_MAX};
    prism_plans t;
    prism_error err;
    if (prism_plans_open(&t, path, &err) == PRISM_OK) {
        for (size_t i = 0; i < sizeof versions / sizeof *versions; i++)
            check_read(&t, versions[i]);
        /* Every version a slot names, too. */
        for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
            check_read(&t, t.h->slots[i].map_version);
        FUZZ_CHECK(!prism_plans_replaced(&t, path));
        prism_plans_close(&t);
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
    prism_plans agent;
    if (prism_plans_create(&agent, path, max_blocks, &err) != PRISM_OK) {
        FUZZ_CHECK(err.message[0] != '\0');
        return 0;
    }
    uint8_t blocks[16];
    for (size_t i = 0; i < sizeof blocks; i++)
        blocks[i] = (uint8_t)(i % 3 == 0 ? 0 : i % 2 ? PRISM_PRECISION_INT8 : PRISM_PRECISION_FP8_E4M3);
    uint32_t n = max_blocks < sizeof blocks ? max_blocks : (uint32_t)sizeof blocks;
    prism_plans_entry e;
    memset(&e, 0, sizeof e);
    e.map_version = UINT64_MAX - 1;
    e.low_format = PRISM_PRECISION_FP8_E4M3;
    e.predicted_iteration_seconds = 0.5;
    snprintf(e.device_class, sizeof e.device_class, "fuzz");
    /* The versions a corrupt hint table holds may be anything: keep as many as the agent may
     * (PRISM_HINTS_SLOTS), taken from the slots themselves, duplicates and zeros included. */
    uint64_t keep[PRISM_HINTS_SLOTS];
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++)
        keep[i] = agent.h->slots[i].map_version;
    FUZZ_CHECK(prism_plans_publish(&agent, &e, blocks, n, keep, PRISM_HINTS_SLOTS, &err) == PRISM_OK);
    prism_plans trainer;
    FUZZ_CHECK(prism_plans_open(&trainer, path, &err) == PRISM_OK);
    prism_plans_entry got;
    uint8_t out[16];
    FUZZ_CHECK(prism_plans_read(&trainer, UINT64_MAX - 1, &got, out, sizeof out, 4) == PRISM_PLANS_FOUND);
    FUZZ_CHECK(memcmp(out, blocks, n) == 0);
    FUZZ_CHECK(got.n_blocks == n && got.low_format == PRISM_PRECISION_FP8_E4M3);
    FUZZ_CHECK(strcmp(got.device_class, "fuzz") == 0 && got.predicted_iteration_seconds == 0.5);
    prism_plans_close(&trainer);
    prism_plans_close(&agent);
    return 0;
}
