/* The standalone driver of the fuzz targets for builds without libFuzzer (gcc included): runs
 * LLVMFuzzerTestOneInput once on every file named on the command line, and on every regular file
 * of every directory named there (in name order, so that a failure is reproducible). With the
 * sanitizer build this replays the committed corpora on every CI run. Exits 0 when every input
 * ran, 1 when a file could not be read or nothing at all was found; a finding aborts the process
 * as it would under libFuzzer. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path, size_t *ran)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f) || !buf;
    fclose(f);
    if (failed) {
        fprintf(stderr, "fuzz replay: %s: cannot read\n", path);
        free(buf);
        return 1;
    }
    /* An exact-size copy, so that ASan sees a read one byte past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    (*ran)++;
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, size_t *ran)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz replay: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (count == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **bigger = realloc(names, ncap * sizeof *names);
            if (!bigger) {
                rc = 1;
                break;
            }
            names = bigger;
            cap = ncap;
        }
        size_t need = strlen(dir) + strlen(e->d_name) + 2;
        names[count] = malloc(need);
        if (!names[count]) {
            rc = 1;
            break;
        }
        snprintf(names[count], need, "%s/%s", dir, e->d_name);
        count++;
    }
    closedir(d);
    if (count)
        qsort(names, count, sizeof *names, compare_names);
    for (size_t i = 0; i < count; i++) {
        struct stat sb;
        if (rc == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode))
            rc = run_file(names[i], ran);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    size_t ran = 0;
    int rc = 0;
    for (int i = 1; rc == 0 && i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "fuzz replay: %s: %s\n", argv[i], strerror(errno));
            rc = 1;
        } else if (S_ISDIR(sb.st_mode)) {
            rc = run_dir(argv[i], &ran);
        } else {
            rc = run_file(argv[i], &ran);
        }
    }
    if (rc == 0 && ran == 0) {
        fprintf(stderr, "fuzz replay: no input found\n");
        rc = 1;
    }
    if (rc == 0)
        printf("fuzz replay: %zu inputs ran\n", ran);
    return rc;
}
