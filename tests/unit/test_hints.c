/* The shared-memory hint table (client/hints.h) on real files: an empty table reads as version 0
 * with every block bf16; the reader switches exactly at a map's effective step; versions only go
 * up; the slot rule keeps the applied and the newest maps; files of another kind, version or size
 * are refused naming the field; a writer that died mid-write (odd seq) makes the reader give up
 * after its tries, and a restarted agent keeps the maps; an incompatible table is replaced by a
 * new file while an old mapping stays readable; and a reader racing a writer thread never sees a
 * torn map. */
#define _GNU_SOURCE
#include "testutil.h"

#include "hints.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A fresh path in the scratch directory for each test. */
static const char *table_path(void)
{
    static char path[512];
    static unsigned n;
    snprintf(path, sizeof path, "%s/hints-%u", prism_scratch_dir(), n++);
    return path;
}

static uint64_t inode_of(const char *path)
{
    struct stat st;
    CU_ASSERT_EQUAL_FATAL(stat(path, &st), 0);
    return (uint64_t)st.st_ino;
}

static void publish_ok(prism_hints *t, uint64_t version, uint64_t decided, uint64_t effective, const uint8_t *p,
                       uint32_t n)
{
    prism_error err = {0};
    prism_status s = prism_hints_publish_map(t, version, decided, effective, p, n, &err);
    if (s != PRISM_OK)
        fprintf(stderr, "publish v%llu: %s\n", (unsigned long long)version, err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
}

static void test_create_gives_an_empty_table_every_block_bf16(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 8, &err), PRISM_OK);
    struct stat st;
    CU_ASSERT_EQUAL(stat(path, &st), 0);
    CU_ASSERT_EQUAL(st.st_size, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0660);
    CU_ASSERT_EQUAL(agent.h->generation, 1);
    CU_ASSERT_EQUAL(agent.h->agent_pid, (uint64_t)getpid());
    CU_ASSERT_EQUAL(atomic_load(&agent.h->seq) % 2, 0);

    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    prism_hints_view v;
    memset(&v, 0x5a, sizeof v);
    uint8_t out[8];
    memset(out, 0xaa, sizeof out);
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 123, &v, out, 8, 4));
    CU_ASSERT_EQUAL(v.map_version, 0);
    CU_ASSERT_EQUAL(v.n_blocks, 0);
    CU_ASSERT_EQUAL(v.effective_step, 0);
    CU_ASSERT_FALSE(v.upstream_connected);
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(out[i], PRISM_PRECISION_BF16);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
    prism_hints_close(&agent); /* twice is fine */
}

static void test_reader_switches_exactly_at_effective_step(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 6, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    static const uint8_t m1[6] = {1, 1, 1, 1, 1, 1};
    static const uint8_t m2[6] = {0, 2, 3, 4, 1, 0};
    const uint8_t m3[2] = {4, 4};
    publish_ok(&agent, 1, 9, 10, m1, 6);
    publish_ok(&agent, 2, 19, 20, m2, 6);
    static const struct {
        uint64_t step, version, decided, effective;
        const uint8_t *want;
    } cases[] = {
        {0, 0, 0, 0, NULL}, {9, 0, 0, 0, NULL},   {10, 1, 9, 10, m1},
        {19, 1, 9, 10, m1}, {20, 2, 19, 20, m2}, {1000, 2, 19, 20, m2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_hints_view v;
        uint8_t out[6];
        CU_ASSERT_TRUE_FATAL(prism_hints_read(&trainer, cases[i].step, &v, out, 6, 4));
        CU_ASSERT_EQUAL(v.map_version, cases[i].version);
        CU_ASSERT_EQUAL(v.decided_step, cases[i].decided);
        CU_ASSERT_EQUAL(v.effective_step, cases[i].effective);
        CU_ASSERT_EQUAL(v.n_blocks, cases[i].want ? 6 : 0);
        for (int b = 0; b < 6; b++)
            CU_ASSERT_EQUAL(out[b], cases[i].want ? cases[i].want[b] : PRISM_PRECISION_BF16);
    }
    /* A map of 2 blocks in a table of 6: the rest read bf16; a smaller array gets its share. */
    publish_ok(&agent, 3, 29, 30, m3, 2);
    prism_hints_view v;
    uint8_t out[6];
    memset(out, 0xaa, sizeof out);
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 30, &v, out, 6, 4));
    CU_ASSERT_EQUAL(v.map_version, 3);
    CU_ASSERT_EQUAL(v.n_blocks, 2);
    const uint8_t want3[6] = {4, 4, 0, 0, 0, 0};
    CU_ASSERT_EQUAL(memcmp(out, want3, 6), 0);
    uint8_t one[1] = {0xaa};
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 25, &v, one, 1, 4));
    CU_ASSERT_EQUAL(v.map_version, 2);
    CU_ASSERT_EQUAL(one[0], 0);
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 25, &v, NULL, 0, 0)); /* no array, tries 0 = 1 */
    CU_ASSERT_EQUAL(v.map_version, 2);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

static void test_publish_refuses_old_versions_and_bad_maps_naming_them(void)
{
    const char *path = table_path();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 4, &err), PRISM_OK);
    const uint8_t ok[4] = {1, 0, 1, 0};
    const uint8_t bad[4] = {1, 7, 0, 0};
    publish_ok(&agent, 5, 0, 1, ok, 4);
    static const struct {
        uint64_t version;
        const uint8_t *map;
        uint32_t n;
        prism_status status;
        const char *names;
    } cases[] = {
        {5, NULL, 0, PRISM_ERR_STATE, "map_version 5"},
        {4, NULL, 0, PRISM_ERR_STATE, "already holds version 5"},
        {0, NULL, 0, PRISM_ERR_INVALID, "map_version: 0"},
        {6, NULL, 5, PRISM_ERR_LIMIT, "n_blocks: 5"},
        {6, NULL, 2, PRISM_ERR_INVALID, "precisions: NULL"},
        {6, NULL, 4, PRISM_ERR_INVALID, "precisions[1]: 7"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint8_t *map = i == 5 ? bad : cases[i].map;
        err.message[0] = '\0';
        CU_ASSERT_EQUAL(prism_hints_publish_map(&agent, cases[i].version, 0, 1, map, cases[i].n, &err),
                        cases[i].status);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].names));
    }
    /* Nothing was written by the refused calls. */
    for (int s = 0; s < PRISM_HINTS_SLOTS; s++)
        CU_ASSERT_TRUE(agent.h->slots[s].map_version == 0 || agent.h->slots[s].map_version == 5);
    publish_ok(&agent, 6, 0, 1, ok, 4);
    prism_hints close_me = {0};
    prism_hints_close(&close_me); /* a zeroed struct */
    CU_ASSERT_EQUAL(prism_hints_publish_map(&close_me, 7, 0, 1, ok, 4, &err), PRISM_ERR_STATE);
    prism_hints_close(&agent);
}

static uint64_t slot_versions_mask(const prism_hints *t)
{
    uint64_t mask = 0;
    for (int s = 0; s < PRISM_HINTS_SLOTS; s++)
        mask |= 1ull << t->h->slots[s].map_version;
    return mask;
}

#define V(x) (1ull << (x))

static void test_slot_reuse_keeps_the_applied_and_the_newest_map(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    const uint8_t m[2] = {1, 1};
    for (uint64_t v = 1; v <= 4; v++)
        publish_ok(&agent, v, v * 10, v * 10 + 1, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(1) | V(2) | V(3) | V(4));
    /* The trainer still uses version 1: version 2, the lowest other than 1 and 4, makes room. */
    prism_hints_write_applied(&trainer, 1, 11);
    publish_ok(&agent, 5, 50, 51, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(1) | V(3) | V(4) | V(5));
    publish_ok(&agent, 6, 60, 61, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(1) | V(4) | V(5) | V(6));
    /* The trainer moves to 6, the newest: 1 is free again. */
    prism_hints_write_applied(&trainer, 6, 61);
    publish_ok(&agent, 7, 70, 71, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(4) | V(5) | V(6) | V(7));
    publish_ok(&agent, 8, 80, 81, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(5) | V(6) | V(7) | V(8));
    publish_ok(&agent, 9, 90, 91, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(6) | V(7) | V(8) | V(9));
    /* The trainer died mid-write (applied_seq odd): the newest two are kept. */
    atomic_fetch_add(&trainer.h->applied_seq, 1);
    publish_ok(&agent, 10, 100, 101, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(7) | V(8) | V(9) | V(10));
    publish_ok(&agent, 11, 110, 111, m, 2);
    CU_ASSERT_EQUAL(slot_versions_mask(&agent), V(8) | V(9) | V(10) | V(11));
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

/* A corrupt table (found by fuzzing): three slots hold the version the trainer applied. The
 * agent keeps one of them and the newest, writes the new map into a real slot, and the trainer
 * reads it. */
static void test_publish_into_a_table_with_duplicate_applied_versions(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    const uint8_t m[2] = {1, 1};
    for (uint64_t v = 1; v <= 4; v++)
        publish_ok(&agent, v, v * 10, v * 10 + 1, m, 2);
    agent.h->slots[0].map_version = 1;
    agent.h->slots[1].map_version = 9;
    agent.h->slots[2].map_version = 1;
    agent.h->slots[3].map_version = 1;
    prism_hints_write_applied(&trainer, 1, 11);
    const uint8_t next[2] = {PRISM_PRECISION_INT4, PRISM_PRECISION_FP8_E4M3};
    publish_ok(&agent, 10, 100, 101, next, 2);
    CU_ASSERT_EQUAL(agent.h->slots[0].map_version, 1);
    CU_ASSERT_EQUAL(agent.h->slots[1].map_version, 9);
    CU_ASSERT_EQUAL(agent.h->slots[2].map_version, 10);
    CU_ASSERT_EQUAL(agent.h->slots[3].map_version, 1);
    prism_hints_view view;
    uint8_t out[2];
    CU_ASSERT_TRUE_FATAL(prism_hints_read(&trainer, 101, &view, out, 2, 4));
    CU_ASSERT_EQUAL(view.map_version, 10);
    CU_ASSERT_EQUAL(out[0], PRISM_PRECISION_INT4);
    CU_ASSERT_EQUAL(out[1], PRISM_PRECISION_FP8_E4M3);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

static void test_applied_version_round_trips(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    uint64_t v = 99, s = 99;
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &v, &s));
    CU_ASSERT_EQUAL(v, 0);
    CU_ASSERT_EQUAL(s, 0);
    prism_hints_write_applied(&trainer, 7, 42);
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &v, &s));
    CU_ASSERT_EQUAL(v, 7);
    CU_ASSERT_EQUAL(s, 42);
    CU_ASSERT_EQUAL(agent.h->trainer_pid, (uint64_t)getpid());
    atomic_fetch_add(&trainer.h->applied_seq, 1); /* mid-write */
    CU_ASSERT_FALSE(prism_hints_read_applied(&agent, &v, &s));
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

static void test_status_and_runtime_hints_reach_the_reader(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    prism_hints_set_status(&agent, true, true, false, 6, PRISM_PRECISION_FP8_E5M2);
    prism_runtime_hints rh = {.map_version = 3, .max_inflight_h2d = 2, .max_inflight_d2h = 1, .prefetch_window = 4,
                              .suppress_prefetch_in_backward = 1, .suppress_prefetch_in_optimizer = 0,
                              .vram_pressure_threshold = 0.875};
    prism_hints_set_runtime(&agent, &rh);
    prism_hints_view v;
    CU_ASSERT_TRUE_FATAL(prism_hints_read(&trainer, 0, &v, NULL, 0, 4));
    CU_ASSERT_TRUE(v.upstream_connected);
    CU_ASSERT_TRUE(v.calibration_needed);
    CU_ASSERT_FALSE(v.run_calibration);
    CU_ASSERT_EQUAL(v.calibration_samples, 6);
    CU_ASSERT_EQUAL(v.low_precision, PRISM_PRECISION_FP8_E5M2);
    CU_ASSERT_EQUAL(v.hints.map_version, 3);
    CU_ASSERT_EQUAL(v.hints.max_inflight_h2d, 2);
    CU_ASSERT_EQUAL(v.hints.max_inflight_d2h, 1);
    CU_ASSERT_EQUAL(v.hints.prefetch_window, 4);
    CU_ASSERT_EQUAL(v.hints.suppress_prefetch_in_backward, 1);
    CU_ASSERT_EQUAL(v.hints.suppress_prefetch_in_optimizer, 0);
    CU_ASSERT_EQUAL(v.hints.vram_pressure_threshold, 0.875);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

/* Writes a file that is a valid table of max_blocks, then lets the caller spoil one thing. */
static void write_table(const char *path, uint32_t max_blocks, uint64_t magic, uint32_t layout_version,
                        uint64_t file_bytes, size_t real_size)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL_FATAL(ftruncate(fd, (off_t)real_size), 0);
    prism_hints_header h;
    memset(&h, 0, sizeof h);
    h.magic = magic;
    h.layout_version = layout_version;
    h.max_blocks = max_blocks;
    h.file_bytes = file_bytes;
    size_t n = real_size < sizeof h ? real_size : sizeof h;
    CU_ASSERT_EQUAL_FATAL(pwrite(fd, &h, n, 0), (ssize_t)n);
    close(fd);
}

static void test_open_refuses_other_files_naming_the_field(void)
{
    const size_t good = PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8;
    static const struct {
        uint64_t magic;
        uint32_t layout_version, max_blocks;
        uint64_t file_bytes;
        size_t real_size;
        const char *names;
    } cases[] = {
        {0x1122334455667788ull, 1, 8, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8, 0, "magic 0x1122334455667788"},
        {PRISM_HINTS_MAGIC, 2, 8, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8, 0, "layout_version 2"},
        {PRISM_HINTS_MAGIC, 1, 0, PRISM_HINTS_HEADER_BYTES, 0, "max_blocks 0"},
        {PRISM_HINTS_MAGIC, 1, 8, 4096, 0, "file_bytes 4096"},
        {PRISM_HINTS_MAGIC, 1, 8, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8, 4096, "file size 4096"},
        {PRISM_HINTS_MAGIC, 1, 8, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 8, 100, "smaller than the header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = table_path();
        write_table(path, cases[i].max_blocks, cases[i].magic, cases[i].layout_version, cases[i].file_bytes,
                    cases[i].real_size ? cases[i].real_size : good);
        prism_hints t;
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_hints_open(&t, path, &err), PRISM_ERR_INVALID);
        if (!strstr(err.message, cases[i].names))
            fprintf(stderr, "case %zu: %s\n", i, err.message);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].names));
        CU_ASSERT_PTR_NULL(t.h);
    }
    prism_hints t;
    prism_error err;
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no-such-table", prism_scratch_dir());
    CU_ASSERT_EQUAL(prism_hints_open(&t, missing, &err), PRISM_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "no-such-table"));
    CU_ASSERT_EQUAL(prism_hints_create(&t, missing, 0, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "max_blocks 0"));
    CU_ASSERT_EQUAL(prism_hints_create(&t, missing, PRISM_HINTS_MAX_BLOCKS_LIMIT + 1, &err), PRISM_ERR_INVALID);
}

/* A writer that died mid-write leaves seq odd: readers give up after their tries and keep what
 * they had; a restarted agent makes seq even and keeps every map. */
static void test_odd_seq_makes_reader_give_up_and_restart_keeps_the_maps(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 3, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    const uint8_t m1[3] = {1, 2, 3}, m2[3] = {4, 4, 0};
    publish_ok(&agent, 1, 4, 5, m1, 3);
    publish_ok(&agent, 2, 9, 10, m2, 3);
    prism_hints_set_status(&agent, true, false, true, 4, PRISM_PRECISION_INT8);
    uint64_t inode = inode_of(path);

    atomic_fetch_add(&agent.h->seq, 1); /* the agent "dies" in the middle of a write */
    prism_hints_close(&agent);
    prism_hints_view v = {.map_version = 77};
    uint8_t out[3] = {9, 9, 9};
    CU_ASSERT_FALSE(prism_hints_read(&trainer, 10, &v, out, 3, 1000));
    CU_ASSERT_EQUAL(v.map_version, 77); /* untouched */

    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 3, &err), PRISM_OK);
    CU_ASSERT_EQUAL(inode_of(path), inode); /* the same file, in place */
    CU_ASSERT_EQUAL(agent.h->generation, 2);
    CU_ASSERT_EQUAL(atomic_load(&agent.h->seq) % 2, 0);
    CU_ASSERT_FALSE(prism_hints_replaced(&trainer, path));
    CU_ASSERT_TRUE_FATAL(prism_hints_read(&trainer, 10, &v, out, 3, 4));
    CU_ASSERT_EQUAL(v.map_version, 2);
    CU_ASSERT_EQUAL(memcmp(out, m2, 3), 0);
    CU_ASSERT_TRUE(v.upstream_connected);
    CU_ASSERT_EQUAL(v.calibration_samples, 4);
    CU_ASSERT_TRUE_FATAL(prism_hints_read(&trainer, 5, &v, out, 3, 4));
    CU_ASSERT_EQUAL(v.map_version, 1);
    CU_ASSERT_EQUAL(memcmp(out, m1, 3), 0);
    /* Versions continue from the kept maps. */
    CU_ASSERT_EQUAL(prism_hints_publish_map(&agent, 2, 0, 0, m1, 3, &err), PRISM_ERR_STATE);
    publish_ok(&agent, 3, 20, 21, m1, 3);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

/* A table of another size is replaced by a new file renamed over the path: the trainer's mapping
 * of the old one stays readable, and prism_hints_replaced tells it to reopen. */
static void test_incompatible_table_is_replaced_not_reset_in_place(void)
{
    const char *path = table_path();
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 4, &err), PRISM_OK);
    const uint8_t m[4] = {1, 1, 2, 2};
    publish_ok(&agent, 1, 0, 1, m, 4);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    uint64_t inode = inode_of(path);
    prism_hints_close(&agent);

    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 16, &err), PRISM_OK);
    CU_ASSERT_NOT_EQUAL(inode_of(path), inode);
    CU_ASSERT_EQUAL(agent.h->generation, 1);
    CU_ASSERT_TRUE(prism_hints_replaced(&trainer, path));
    prism_hints_view v;
    uint8_t out[4];
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 1, &v, out, 4, 4)); /* the old file, still mapped */
    CU_ASSERT_EQUAL(v.map_version, 1);
    CU_ASSERT_EQUAL(memcmp(out, m, 4), 0);
    prism_hints_close(&trainer);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);
    CU_ASSERT_EQUAL(trainer.h->max_blocks, 16);
    CU_ASSERT_TRUE(prism_hints_read(&trainer, 1, &v, out, 4, 4));
    CU_ASSERT_EQUAL(v.map_version, 0);
    /* A file of another kind is replaced the same way. */
    prism_hints_close(&agent);
    prism_hints_close(&trainer);
    write_table(path, 16, 0x42, 1, PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 16,
                PRISM_HINTS_HEADER_BYTES + PRISM_HINTS_SLOTS * 16);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 16, &err), PRISM_OK);
    CU_ASSERT_EQUAL(agent.h->magic, PRISM_HINTS_MAGIC);
    prism_hints_close(&agent);
}

/* ---- a writer thread against a reader thread -------------------------------------------- */

#define RACE_BLOCKS (256 * 1024)
#define RACE_MAPS 20000
#define RACE_SECONDS 3.0

typedef struct race {
    const char *path;
    atomic_bool done;
    uint64_t published;
    uint64_t reads, failures, torn, went_back;
} race;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *race_writer(void *arg)
{
    race *r = arg;
    prism_hints agent;
    prism_error err;
    if (prism_hints_create(&agent, r->path, RACE_BLOCKS, &err) != PRISM_OK) {
        atomic_store(&r->done, true);
        return NULL;
    }
    static uint8_t map[RACE_BLOCKS];
    double end = now_s() + RACE_SECONDS;
    for (uint64_t v = 1; v <= RACE_MAPS && now_s() < end; v++) {
        memset(map, (int)(v % 5), sizeof map);
        if (prism_hints_publish_map(&agent, v, v, 0, map, RACE_BLOCKS, &err) != PRISM_OK)
            break;
        r->published = v;
    }
    atomic_store(&r->done, true);
    prism_hints_close(&agent);
    return NULL;
}

static void *race_reader(void *arg)
{
    race *r = arg;
    prism_hints trainer;
    prism_error err;
    static uint8_t out[RACE_BLOCKS];
    uint64_t last = 0;
    while (prism_hints_open(&trainer, r->path, &err) != PRISM_OK)
        if (atomic_load(&r->done))
            return NULL;
    while (!atomic_load(&r->done)) {
        prism_hints_view v;
        if (!prism_hints_read(&trainer, 1, &v, out, RACE_BLOCKS, 2)) {
            r->failures++;
            continue;
        }
        r->reads++;
        if (v.map_version < last)
            r->went_back++;
        last = v.map_version;
        if (v.map_version > 0 && v.n_blocks != RACE_BLOCKS)
            r->torn++;
        uint8_t want = (uint8_t)(v.map_version % 5);
        for (size_t i = 0; i < RACE_BLOCKS; i++)
            if (out[i] != want) {
                r->torn++;
                break;
            }
        if (r->reads % 64 == 0)
            prism_hints_write_applied(&trainer, v.map_version, 1);
    }
    prism_hints_close(&trainer);
    return NULL;
}

static void test_concurrent_reader_never_sees_a_torn_map(void)
{
    race r = {.path = table_path()};
    atomic_init(&r.done, false);
    pthread_t w, rd;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&w, NULL, race_writer, &r), 0);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&rd, NULL, race_reader, &r), 0);
    pthread_join(w, NULL);
    pthread_join(rd, NULL);
    printf("\n    %llu maps published, %llu consistent reads, %llu gave up\n", (unsigned long long)r.published,
           (unsigned long long)r.reads, (unsigned long long)r.failures);
    CU_ASSERT_TRUE(r.published > 100);
    CU_ASSERT_TRUE(r.reads > 0);
    CU_ASSERT_EQUAL(r.torn, 0);
    CU_ASSERT_EQUAL(r.went_back, 0);
}

static const prism_test_case cases[] = {
    {"test_create_gives_an_empty_table_every_block_bf16", test_create_gives_an_empty_table_every_block_bf16},
    {"test_reader_switches_exactly_at_effective_step", test_reader_switches_exactly_at_effective_step},
    {"test_publish_refuses_old_versions_and_bad_maps_naming_them", test_publish_refuses_old_versions_and_bad_maps_naming_them},
    {"test_slot_reuse_keeps_the_applied_and_the_newest_map", test_slot_reuse_keeps_the_applied_and_the_newest_map},
    {"test_publish_into_a_table_with_duplicate_applied_versions", test_publish_into_a_table_with_duplicate_applied_versions},
    {"test_applied_version_round_trips", test_applied_version_round_trips},
    {"test_status_and_runtime_hints_reach_the_reader", test_status_and_runtime_hints_reach_the_reader},
    {"test_open_refuses_other_files_naming_the_field", test_open_refuses_other_files_naming_the_field},
    {"test_odd_seq_makes_reader_give_up_and_restart_keeps_the_maps", test_odd_seq_makes_reader_give_up_and_restart_keeps_the_maps},
    {"test_incompatible_table_is_replaced_not_reset_in_place", test_incompatible_table_is_replaced_not_reset_in_place},
    {"test_concurrent_reader_never_sees_a_torn_map", test_concurrent_reader_never_sees_a_torn_map},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"hints", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
