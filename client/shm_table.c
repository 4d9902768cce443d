/* Shared table files (shm_table.h): open and check, create and rename into place. */
#define _GNU_SOURCE
#include "shm_table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the shared tables are little-endian and mapped as native structs"
#endif

_Static_assert(sizeof(prism_shm_prefix) == 24, "the shared prefix");

size_t prism_shm_file_bytes(const prism_shm_kind *k, uint32_t max_blocks)
{
    return k->header_bytes + k->slots * (size_t)max_blocks;
}

static prism_status map_fd(int fd, size_t bytes, bool writable, const char *path, prism_shm_map *m,
                           prism_error *err)
{
    void *p = mmap(NULL, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return prism_error_set(err, PRISM_ERR_IO, "%s: mmap of %zu bytes: %s", path, bytes, strerror(errno));
    m->base = p;
    m->bytes = bytes;
    m->fd = fd;
    return PRISM_OK;
}

/* Checks a prefix against the file it came from; PRISM_ERR_INVALID naming the field. */
static prism_status check_prefix(const prism_shm_kind *k, const prism_shm_prefix *h, size_t file_size,
                                 uint32_t want_max_blocks, const char *path, prism_error *err)
{
    if (h->magic != k->magic)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: magic 0x%016llx is not %s (0x%016llx)", path,
                               (unsigned long long)h->magic, k->what, (unsigned long long)k->magic);
    if (h->layout_version != k->layout_version)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: layout_version %u, this build reads %u", path,
                               h->layout_version, k->layout_version);
    if (h->max_blocks == 0 || h->max_blocks > k->max_blocks_limit)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: max_blocks %u is outside [1, %u]", path, h->max_blocks,
                               k->max_blocks_limit);
    if (want_max_blocks && h->max_blocks != want_max_blocks)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: max_blocks %u, wanted %u", path, h->max_blocks,
                               want_max_blocks);
    size_t want = prism_shm_file_bytes(k, h->max_blocks);
    if (h->file_bytes != want)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: file_bytes %llu, max_blocks %u needs %zu", path,
                               (unsigned long long)h->file_bytes, h->max_blocks, want);
    if (file_size != want)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: file size %zu bytes, max_blocks %u needs %zu", path,
                               file_size, h->max_blocks, want);
    return PRISM_OK;
}

prism_status prism_shm_open(const prism_shm_kind *k, const char *path, uint32_t want_max_blocks, bool writable,
                            prism_shm_map *m, prism_error *err)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return prism_error_set(err, errno == ENOENT ? PRISM_ERR_NOT_FOUND : PRISM_ERR_IO, "%s: %s", path,
                               strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        prism_status s = prism_error_set(err, PRISM_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size < k->header_bytes) {
        close(fd);
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: size %lld is smaller than the header", path,
                               (long long)st.st_size);
    }
    prism_shm_map got = {NULL, 0, -1};
    prism_status s = map_fd(fd, (size_t)st.st_size, writable, path, &got, err);
    if (s != PRISM_OK) {
        close(fd);
        return s;
    }
    s = check_prefix(k, got.base, (size_t)st.st_size, want_max_blocks, path, err);
    if (s != PRISM_OK) {
        prism_shm_unmap(&got);
        return s;
    }
    *m = got;
    return PRISM_OK;
}

prism_status prism_shm_create(const prism_shm_kind *k, const char *path, uint32_t max_blocks, prism_shm_map *m,
                              prism_error *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: path too long", path);
    unlink(tmp); /* a leftover of an earlier agent with our pid */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
    if (fd < 0)
        return prism_error_set(err, PRISM_ERR_IO, "%s: create: %s", tmp, strerror(errno));
    size_t bytes = prism_shm_file_bytes(k, max_blocks);
    prism_status s = PRISM_OK;
    if (fchmod(fd, 0660) != 0 || ftruncate(fd, (off_t)bytes) != 0)
        s = prism_error_set(err, PRISM_ERR_IO, "%s: size %zu: %s", tmp, bytes, strerror(errno));
    prism_shm_map got = {NULL, 0, -1};
    if (s == PRISM_OK)
        s = map_fd(fd, bytes, true, tmp, &got, err);
    if (s != PRISM_OK) {
        close(fd);
        unlink(tmp);
        return s;
    }
    /* ftruncate gave zeros: the rest of the header and every slot are empty, seq 0. */
    prism_shm_prefix *h = got.base;
    h->magic = k->magic;
    h->layout_version = k->layout_version;
    h->max_blocks = max_blocks;
    h->file_bytes = bytes;
    if (k->init)
        k->init(got.base);
    if (rename(tmp, path) != 0) {
        s = prism_error_set(err, PRISM_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
        prism_shm_unmap(&got);
        unlink(tmp);
        return s;
    }
    *m = got;
    return PRISM_OK;
}

bool prism_shm_replaced(int fd, const char *path)
{
    struct stat now, mine;
    if (stat(path, &now) != 0 || fstat(fd, &mine) != 0)
        return true;
    return now.st_ino != mine.st_ino || now.st_dev != mine.st_dev;
}

void prism_shm_unmap(prism_shm_map *m)
{
    if (m->base) {
        munmap(m->base, m->bytes);
        close(m->fd);
    }
    m->base = NULL;
    m->bytes = 0;
    m->fd = -1;
}
