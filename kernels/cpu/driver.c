/* The CPU drivers (cpu.h): argument checks, the cut of a call into ranges, threads, and the fixed
 * order in which range results are combined. The public *_cpu functions of kernels.h are here. */
#define _POSIX_C_SOURCE 200809L
#include "cpu.h"
#include "quant_core.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* Elements one thread's task covers: large enough that handing it out costs nothing, small enough
 * that two cores share a 1 MiB input. A multiple of PRISM_STATS_CHUNK and even (INT4 bytes). */
#define TASK_ELEMENTS ((size_t)64 * 1024)
/* Below this many elements a call stays on the caller's thread (a thread start costs ~20 us). */
#define THREAD_MIN_ELEMENTS ((size_t)512 * 1024)

void prism_moments_merge(prism_moments *a, const prism_moments *b)
{
    if (a->n == 0) {
        double sumsq = a->sumsq + b->sumsq;
        double max_abs = a->max_abs > b->max_abs ? a->max_abs : b->max_abs;
        uint64_t nonfinite = a->nonfinite + b->nonfinite;
        *a = *b;
        a->sumsq = sumsq;
        a->max_abs = max_abs;
        a->nonfinite = nonfinite;
        return;
    }
    if (b->n > 0) {
        double n = a->n + b->n;
        double delta = b->mean - a->mean;
        a->mean += delta * b->n / n;
        a->m2 += b->m2 + delta * delta * a->n * b->n / n;
        a->n = n;
    }
    a->sumsq += b->sumsq;
    if (b->max_abs > a->max_abs)
        a->max_abs = b->max_abs;
    a->nonfinite += b->nonfinite;
}

/* ---- threads ---------------------------------------------------------------------------- */

typedef void (*task_fn)(void *ctx, size_t task);

/* One call's tasks, handed out by an atomic counter. */
typedef struct pool_run {
    task_fn fn;
    void *ctx;
    size_t tasks;
    atomic_size_t next;
} pool_run;

static void run_share(pool_run *run)
{
    for (;;) {
        size_t t = atomic_fetch_add(&run->next, 1);
        if (t >= run->tasks)
            return;
        run->fn(run->ctx, t);
    }
}

/* A process-wide pool of worker threads, started on first need and kept: starting threads for
 * every call cost 20-50 us, as much as the whole work of a 1 MiB call. One call at a time uses
 * the pool (busy holds it); a call that finds it busy, or runs in a child after fork() (where
 * the workers do not exist until it starts its own), does its work on its own thread, which
 * gives the same results. */
typedef struct pool {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pid_t pid;          /* the process that started the workers */
    int workers;        /* started so far */
    int wanted;         /* workers that take part in the current run */
    int active;         /* of those, still working on it */
    unsigned long generation;
    bool busy;
    pool_run *run;
    unsigned long born[64]; /* generation when worker i started: it joins every later run */
} pool;

static pool the_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
                        0, 0, 0, 0, 0, false, NULL, {0}};

static void *pool_worker(void *arg)
{
    int index = (int)(intptr_t)arg;
    pthread_mutex_lock(&the_pool.lock);
    unsigned long seen = the_pool.born[index];
    for (;;) {
        while (the_pool.generation == seen)
            pthread_cond_wait(&the_pool.wake, &the_pool.lock);
        seen = the_pool.generation;
        if (index >= the_pool.wanted)
            continue;
        pool_run *run = the_pool.run;
        pthread_mutex_unlock(&the_pool.lock);
        run_share(run);
        pthread_mutex_lock(&the_pool.lock);
        if (--the_pool.active == 0)
            pthread_cond_signal(&the_pool.done);
    }
    return NULL;
}

/* In a child after fork(): the parent's workers, and any thread that held the lock or waited on
 * the conditions, are not here, so the pool starts over (glibc's condition variables wait for
 * such waiters otherwise). */
static void pool_after_fork_in_child(void)
{
    pthread_mutex_init(&the_pool.lock, NULL);
    pthread_cond_init(&the_pool.wake, NULL);
    pthread_cond_init(&the_pool.done, NULL);
    the_pool.workers = 0;
    the_pool.busy = false;
    the_pool.run = NULL;
    the_pool.pid = getpid();
}

static pthread_once_t pool_atfork_once = PTHREAD_ONCE_INIT;

static void pool_register_atfork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork_in_child);
}

/* Under the lock: makes sure n workers exist (fewer when a thread cannot be started). */
static void pool_grow(int n)
{
    if (the_pool.pid != getpid()) { /* first use, or a child after fork(): none of ours run */
        the_pool.pid = getpid();
        the_pool.workers = 0;
    }
    while (the_pool.workers < n) {
        pthread_t id;
        pthread_attr_t attr;
        the_pool.born[the_pool.workers] = the_pool.generation;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&id, &attr, pool_worker, (void *)(intptr_t)the_pool.workers);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        the_pool.workers++;
    }
}

/* How many threads `elements` of work are worth: threads = 0 means automatic. */
static int threads_for(int threads, size_t elements)
{
    if (threads > 0)
        return threads;
    if (elements < THREAD_MIN_ELEMENTS)
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t worth = elements / (THREAD_MIN_ELEMENTS / 2);
    size_t n = cpus > 0 ? (size_t)cpus : 1;
    if (n > 64)
        n = 64;
    return (int)(worth < n ? worth : n);
}

/* Runs fn(ctx, t) for every t < tasks, on the caller and up to threads - 1 pool workers. Tasks
 * write only their own results, so who runs which, and in what order, changes nothing. */
static void run_tasks(int threads, size_t tasks, task_fn fn, void *ctx)
{
    pool_run run = {.fn = fn, .ctx = ctx, .tasks = tasks};
    atomic_init(&run.next, 0);
    if ((size_t)threads > tasks)
        threads = (int)tasks;
    if (threads > 64)
        threads = 64;
    int helpers = 0;
    if (threads > 1) {
        pthread_once(&pool_atfork_once, pool_register_atfork);
        pthread_mutex_lock(&the_pool.lock);
        if (!the_pool.busy) {
            pool_grow(threads - 1);
            helpers = the_pool.workers < threads - 1 ? the_pool.workers : threads - 1;
            if (helpers > 0) {
                the_pool.busy = true;
                the_pool.run = &run;
                the_pool.wanted = helpers;
                the_pool.active = helpers;
                the_pool.generation++;
                pthread_cond_broadcast(&the_pool.wake);
            }
        }
        pthread_mutex_unlock(&the_pool.lock);
    }
    run_share(&run);
    if (helpers > 0) {
        pthread_mutex_lock(&the_pool.lock);
        while (the_pool.active > 0)
            pthread_cond_wait(&the_pool.done, &the_pool.lock);
        the_pool.busy = false;
        the_pool.run = NULL;
        pthread_mutex_unlock(&the_pool.lock);
    }
}

/* ---- checks ----------------------------------------------------------------------------- */

static prism_status check_path(const prism_cpu_path **path, prism_error *err)
{
    if (!*path)
        *path = &prism_cpu_scalar;
    (void)err;
    return PRISM_OK;
}

/* ---- gradient statistics ---------------------------------------------------------------- */

typedef struct stats_job {
    const prism_cpu_path *path;
    const prism_tensor *tensors;
    const uint32_t *chunk_tensor; /* chunk -> tensor index */
    const size_t *first_chunk;    /* tensor -> its first chunk */
    size_t chunks;
    prism_moments *moments; /* one per chunk */
} stats_job;

#define STATS_TASK_CHUNKS (TASK_ELEMENTS / PRISM_STATS_CHUNK)

static void stats_task(void *ctx, size_t task)
{
    stats_job *job = ctx;
    size_t c0 = task * STATS_TASK_CHUNKS;
    size_t c1 = c0 + STATS_TASK_CHUNKS < job->chunks ? c0 + STATS_TASK_CHUNKS : job->chunks;
    for (size_t c = c0; c < c1; c++) {
        uint32_t t = job->chunk_tensor[c];
        const prism_tensor *x = &job->tensors[t];
        size_t begin = (c - job->first_chunk[t]) * PRISM_STATS_CHUNK;
        size_t end = begin + PRISM_STATS_CHUNK < x->numel ? begin + PRISM_STATS_CHUNK : x->numel;
        job->path->stats_chunk(x, begin, end, &job->moments[c]);
    }
}

prism_status prism_grad_stats_blocks_with(const prism_cpu_path *path, int threads,
                                          const prism_tensor *tensors, const size_t *block_start,
                                          size_t blocks, prism_grad_stats *out, prism_error *err)
{
    check_path(&path, err);
    size_t count;
    prism_status st = prism_check_blocks(tensors, block_start, blocks, out, &count, err);
    if (st != PRISM_OK || blocks == 0)
        return st;
    size_t chunks = 0, elements = 0;
    for (size_t t = 0; t < count; t++) {
        chunks += tensors[t].numel / PRISM_STATS_CHUNK + (tensors[t].numel % PRISM_STATS_CHUNK != 0);
        elements += tensors[t].numel;
    }
    prism_moments *moments = calloc(chunks ? chunks : 1, sizeof *moments);
    uint32_t *chunk_tensor = malloc((chunks ? chunks : 1) * sizeof *chunk_tensor);
    size_t *first_chunk = malloc((count ? count : 1) * sizeof *first_chunk);
    if (!moments || !chunk_tensor || !first_chunk) {
        free(moments);
        free(chunk_tensor);
        free(first_chunk);
        return prism_error_set(err, PRISM_ERR_NOMEM, "grad_stats: no memory for %zu chunks", chunks);
    }
    size_t c = 0;
    for (size_t t = 0; t < count; t++) {
        first_chunk[t] = c;
        size_t n = tensors[t].numel / PRISM_STATS_CHUNK + (tensors[t].numel % PRISM_STATS_CHUNK != 0);
        for (size_t k = 0; k < n; k++)
            chunk_tensor[c++] = (uint32_t)t;
    }
    stats_job job = {path, tensors, chunk_tensor, first_chunk, chunks, moments};
    size_t tasks = chunks / STATS_TASK_CHUNKS + (chunks % STATS_TASK_CHUNKS != 0);
    run_tasks(threads_for(threads, elements), tasks, stats_task, &job);

    /* Chunks into their tensor, tensors into their block, each in order. */
    for (size_t b = 0; b < blocks; b++) {
        prism_moments block = {0};
        uint64_t numel = 0;
        for (size_t t = block_start[b]; t < block_start[b + 1]; t++) {
            prism_moments tensor = {0};
            size_t end = t + 1 < count ? first_chunk[t + 1] : chunks;
            for (size_t k = first_chunk[t]; k < end; k++)
                prism_moments_merge(&tensor, &moments[k]);
            prism_moments_merge(&block, &tensor);
            numel += tensors[t].numel;
        }
        out[b].l2_norm = sqrt(block.sumsq);
        out[b].max_abs = block.max_abs;
        out[b].mean = block.n > 0 ? block.mean : 0.0;
        out[b].variance = block.n > 0 ? block.m2 / block.n : 0.0;
        out[b].numel = numel;
        out[b].nonfinite = block.nonfinite;
    }
    free(moments);
    free(chunk_tensor);
    free(first_chunk);
    return PRISM_OK;
}

prism_status prism_grad_stats_blocks_cpu(const prism_tensor *tensors, const size_t *block_start,
                                         size_t blocks, prism_grad_stats *out, prism_error *err)
{
    return prism_grad_stats_blocks_with(prism_cpu_best(), 0, tensors, block_start, blocks, out, err);
}

prism_status prism_grad_stats_cpu(const prism_tensor *tensors, size_t count, prism_grad_stats *out,
                                  prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "grad_stats: out is NULL");
    memset(out, 0, sizeof *out);
    size_t start[2] = {0, count};
    return prism_grad_stats_blocks_cpu(tensors, start, 1, out, err);
}

/* ---- quantize --------------------------------------------------------------------------- */

typedef struct quant_job {
    const prism_cpu_path *path;
    const prism_quant_spec *spec;
    const prism_tensor *x;
    uint8_t *codes;
    float *scales;
    size_t group_len, groups, task_groups;
    float scale;        /* per tensor: the one scale */
    float *task_amax;   /* per tensor, first pass: one per task */
    uint64_t *task_bad; /* NaN/Inf per task */
} quant_job;

static size_t range_end(size_t task, size_t per, size_t total)
{
    size_t end = (task + 1) * per;
    return end < total ? end : total;
}

static void amax_task(void *ctx, size_t task)
{
    quant_job *job = ctx;
    job->path->amax(job->x, task * TASK_ELEMENTS, range_end(task, TASK_ELEMENTS, job->x->numel),
                    &job->task_amax[task], &job->task_bad[task]);
}

static void quantize_range_task(void *ctx, size_t task)
{
    quant_job *job = ctx;
    job->path->quantize_range(job->spec, job->x, task * TASK_ELEMENTS,
                              range_end(task, TASK_ELEMENTS, job->x->numel), job->scale, job->codes);
}

static void quantize_groups_task(void *ctx, size_t task)
{
    quant_job *job = ctx;
    job->task_bad[task] = 0;
    job->path->quantize_groups(job->spec, job->group_len, job->x, task * job->task_groups,
                               range_end(task, job->task_groups, job->groups), job->scales,
                               job->codes, &job->task_bad[task]);
}

prism_status prism_quantize_with(const prism_cpu_path *path, int threads,
                                 const prism_quant_spec *spec, const prism_tensor *x,
                                 uint8_t *codes, float *scales, uint64_t *nonfinite,
                                 prism_error *err)
{
    check_path(&path, err);
    prism_status st = prism_check_tensor(x, "input", 0, err);
    if (st != PRISM_OK)
        return st;
    size_t groups, group_len, code_bytes;
    st = prism_quant_layout(spec, x->numel, &groups, &group_len, &code_bytes, err);
    if (st != PRISM_OK)
        return st;
    if (nonfinite)
        *nonfinite = 0;
    if (x->numel == 0)
        return PRISM_OK;
    if (!codes || !scales)
        return prism_error_set(err, PRISM_ERR_INVALID, "quantize: codes or scales is NULL");
    if (spec->format == PRISM_PRECISION_INT4 && x->numel % 2)
        codes[code_bytes - 1] = 0; /* the unused high nibble */

    quant_job job = {.path = path, .spec = spec, .x = x, .codes = codes, .scales = scales,
                     .group_len = group_len, .groups = groups};
    int nthreads = threads_for(threads, x->numel);
    uint64_t bad = 0;
    if (spec->granularity == PRISM_GRANULARITY_TENSOR) {
        size_t tasks = x->numel / TASK_ELEMENTS + (x->numel % TASK_ELEMENTS != 0);
        job.task_amax = malloc(tasks * sizeof *job.task_amax);
        job.task_bad = malloc(tasks * sizeof *job.task_bad);
        if (!job.task_amax || !job.task_bad) {
            free(job.task_amax);
            free(job.task_bad);
            return prism_error_set(err, PRISM_ERR_NOMEM, "quantize: no memory for %zu tasks", tasks);
        }
        run_tasks(nthreads, tasks, amax_task, &job);
        float amax = 0.0f;
        for (size_t t = 0; t < tasks; t++) {
            amax = job.task_amax[t] > amax ? job.task_amax[t] : amax;
            bad += job.task_bad[t];
        }
        scales[0] = job.scale =
            prism_qc_scale(amax, (int)spec->format, spec->scale_mode == PRISM_SCALE_POW2);
        run_tasks(nthreads, tasks, quantize_range_task, &job);
        free(job.task_amax);
        free(job.task_bad);
    } else {
        /* Tasks of whole groups, about TASK_ELEMENTS each; an even number of groups when INT4
         * groups are odd, so no two tasks share a byte. */
        size_t per = TASK_ELEMENTS / group_len;
        if (per == 0)
            per = 1;
        if (spec->format == PRISM_PRECISION_INT4 && group_len % 2 && per % 2)
            per++;
        job.task_groups = per;
        size_t tasks = groups / per + (groups % per != 0);
        job.task_bad = malloc(tasks * sizeof *job.task_bad);
        if (!job.task_bad)
            return prism_error_set(err, PRISM_ERR_NOMEM, "quantize: no memory for %zu tasks", tasks);
        run_tasks(nthreads, tasks, quantize_groups_task, &job);
        for (size_t t = 0; t < tasks; t++)
            bad += job.task_bad[t];
        free(job.task_bad);
    }
    if (nonfinite)
        *nonfinite = bad;
    return PRISM_OK;
}

prism_status prism_quantize_cpu(const prism_quant_spec *spec, const prism_tensor *x, uint8_t *codes,
                                float *scales, uint64_t *nonfinite, prism_error *err)
{
    return prism_quantize_with(prism_cpu_best(), 0, spec, x, codes, scales, nonfinite, err);
}

/* ---- quantize, counted; quantize with given scales ------------------------------------- */

typedef struct counted_job {
    const prism_cpu_path *path;
    const prism_quant_spec *spec;
    const prism_tensor *x;
    uint8_t *codes;
    const float *given; /* the caller's scales, or NULL: computed into scales */
    float *scales;
    float *amax; /* per group, may be NULL */
    size_t group_len, groups, task_groups;
    float scale;                     /* per tensor: the one scale */
    float *task_amax;                /* per tensor: one per task */
    uint64_t *task_bad;              /* per tensor, computed scale: the amax pass's NaN/Inf */
    prism_quant_counts *task_counts; /* one per task */
} counted_job;

static void counted_amax_task(void *ctx, size_t task)
{
    counted_job *job = ctx;
    job->path->amax(job->x, task * TASK_ELEMENTS, range_end(task, TASK_ELEMENTS, job->x->numel),
                    &job->task_amax[task], &job->task_bad[task]);
}

static void counted_range_task(void *ctx, size_t task)
{
    counted_job *job = ctx;
    job->path->quantize_range_counted(job->spec, job->x, task * TASK_ELEMENTS,
                                      range_end(task, TASK_ELEMENTS, job->x->numel), job->scale,
                                      job->codes, &job->task_amax[task], &job->task_counts[task]);
}

static void counted_groups_task(void *ctx, size_t task)
{
    counted_job *job = ctx;
    job->path->quantize_groups_counted(job->spec, job->group_len, job->x, task * job->task_groups,
                                       range_end(task, job->task_groups, job->groups), job->given,
                                       job->scales, job->codes, job->amax, &job->task_counts[task]);
}

/* The counted quantization of both public functions: checks (given scales included, before
 * anything is written), then tasks as prism_quantize_with cuts them: per tensor, ranges of
 * TASK_ELEMENTS under the one scale (after an amax pass when it is computed); per row or block,
 * whole groups. Counts are summed and amax taken over the tasks in task order. */
static prism_status quantize_counted_run(const prism_cpu_path *path, int threads,
                                         const prism_quant_spec *spec, const prism_tensor *x,
                                         int scaled, const float *given, float *scales,
                                         uint8_t *codes, float *amax, prism_quant_counts *counts,
                                         prism_error *err)
{
    check_path(&path, err);
    prism_status st = prism_check_tensor(x, "input", 0, err);
    if (st != PRISM_OK)
        return st;
    size_t groups, group_len, code_bytes;
    st = prism_quant_layout(spec, x->numel, &groups, &group_len, &code_bytes, err);
    if (st != PRISM_OK)
        return st;
    if (x->numel && (!codes || !(scaled ? given != NULL : scales != NULL)))
        return prism_error_set(err, PRISM_ERR_INVALID, "quantize: codes or scales is NULL");
    if (scaled && x->numel) {
        for (size_t g = 0; g < groups; g++)
            if (!(given[g] > 0.0f) || prism_qc_nonfinite(given[g]))
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "scales[%zu]: %g is not a finite scale > 0", g,
                                       (double)given[g]);
    }
    prism_quant_counts total = {0};
    if (x->numel == 0) {
        if (counts)
            *counts = total;
        return PRISM_OK;
    }
    if (spec->format == PRISM_PRECISION_INT4 && x->numel % 2)
        codes[code_bytes - 1] = 0; /* the unused high nibble */

    counted_job job = {.path = path, .spec = spec, .x = x, .codes = codes, .given = given,
                       .scales = scales, .amax = amax, .group_len = group_len, .groups = groups};
    int nthreads = threads_for(threads, x->numel);
    size_t tasks;
    if (spec->granularity == PRISM_GRANULARITY_TENSOR) {
        tasks = x->numel / TASK_ELEMENTS + (x->numel % TASK_ELEMENTS != 0);
    } else {
        size_t per = TASK_ELEMENTS / group_len;
        if (per == 0)
            per = 1;
        if (spec->format == PRISM_PRECISION_INT4 && group_len % 2 && per % 2)
            per++;
        job.task_groups = per;
        tasks = groups / per + (groups % per != 0);
    }
    job.task_counts = malloc(tasks * sizeof *job.task_counts);
    job.task_amax = malloc(tasks * sizeof *job.task_amax);
    job.task_bad = malloc(tasks * sizeof *job.task_bad);
    if (!job.task_counts || !job.task_amax || !job.task_bad) {
        free(job.task_counts);
        free(job.task_amax);
        free(job.task_bad);
        return prism_error_set(err, PRISM_ERR_NOMEM, "quantize: no memory for %zu tasks", tasks);
    }
    if (spec->granularity == PRISM_GRANULARITY_TENSOR) {
        if (given) {
            job.scale = given[0];
        } else {
            run_tasks(nthreads, tasks, counted_amax_task, &job);
            float most = 0.0f;
            for (size_t t = 0; t < tasks; t++)
                most = job.task_amax[t] > most ? job.task_amax[t] : most;
            scales[0] = job.scale =
                prism_qc_scale(most, (int)spec->format, spec->scale_mode == PRISM_SCALE_POW2);
        }
        run_tasks(nthreads, tasks, counted_range_task, &job);
        float most = 0.0f;
        for (size_t t = 0; t < tasks; t++)
            most = job.task_amax[t] > most ? job.task_amax[t] : most;
        if (amax)
            amax[0] = most;
    } else {
        run_tasks(nthreads, tasks, counted_groups_task, &job);
    }
    for (size_t t = 0; t < tasks; t++) {
        total.saturated += job.task_counts[t].saturated;
        total.underflowed += job.task_counts[t].underflowed;
        total.nonfinite += job.task_counts[t].nonfinite;
    }
    free(job.task_counts);
    free(job.task_amax);
    free(job.task_bad);
    if (counts)
        *counts = total;
    return PRISM_OK;
}

prism_status prism_quantize_counted_with(const prism_cpu_path *path, int threads,
                                         const prism_quant_spec *spec, const prism_tensor *x,
                                         uint8_t *codes, float *scales,
                                         prism_quant_counts *counts, prism_error *err)
{
    return quantize_counted_run(path, threads, spec, x, 0, NULL, scales, codes, NULL, counts, err);
}

prism_status prism_quantize_scaled_with(const prism_cpu_path *path, int threads,
                                        const prism_quant_spec *spec, const prism_tensor *x,
                                        const float *scales, uint8_t *codes, float *amax,
                                        prism_quant_counts *counts, prism_error *err)
{
    return quantize_counted_run(path, threads, spec, x, 1, scales, NULL, codes, amax, counts, err);
}

prism_status prism_quantize_counted_cpu(const prism_quant_spec *spec, const prism_tensor *x,
                                        uint8_t *codes, float *scales, prism_quant_counts *counts,
                                        prism_error *err)
{
    return prism_quantize_counted_with(prism_cpu_best(), 0, spec, x, codes, scales, counts, err);
}

prism_status prism_quantize_scaled_cpu(const prism_quant_spec *spec, const prism_tensor *x,
                                       const float *scales, uint8_t *codes, float *amax,
                                       prism_quant_counts *counts, prism_error *err)
{
    return prism_quantize_scaled_with(prism_cpu_best(), 0, spec, x, scales, codes, amax, counts,
                                      err);
}

/* ---- dequantize and accumulate ---------------------------------------------------------- */

typedef struct decode_job {
    const prism_cpu_path *path;
    prism_precision format;
    size_t group_len, numel;
    const uint8_t *codes;
    const float *scales;
    void *out;
    prism_dtype dtype;
    float *acc;
} decode_job;

static void dequantize_task(void *ctx, size_t task)
{
    decode_job *job = ctx;
    job->path->dequantize_range(job->format, job->group_len, job->codes, job->scales,
                                task * TASK_ELEMENTS, range_end(task, TASK_ELEMENTS, job->numel),
                                job->out, job->dtype);
}

static void accumulate_task(void *ctx, size_t task)
{
    decode_job *job = ctx;
    job->path->accumulate_range(job->format, job->group_len, job->codes, job->scales,
                                task * TASK_ELEMENTS, range_end(task, TASK_ELEMENTS, job->numel),
                                job->acc);
}

static prism_status decode_setup(const prism_quant_spec *spec, const uint8_t *codes,
                                 const float *scales, size_t numel, const void *out,
                                 decode_job *job, prism_error *err)
{
    size_t groups, group_len;
    prism_status st = prism_quant_layout(spec, numel, &groups, &group_len, NULL, err);
    if (st != PRISM_OK)
        return st;
    if (numel && (!codes || !scales || !out))
        return prism_error_set(err, PRISM_ERR_INVALID, "dequantize: codes, scales or output is NULL");
    job->format = spec->format;
    job->group_len = group_len;
    job->numel = numel;
    job->codes = codes;
    job->scales = scales;
    return PRISM_OK;
}

prism_status prism_dequantize_with(const prism_cpu_path *path, int threads,
                                   const prism_quant_spec *spec, const uint8_t *codes,
                                   const float *scales, size_t numel, void *out,
                                   prism_dtype out_dtype, prism_error *err)
{
    check_path(&path, err);
    decode_job job = {.path = path, .out = out, .dtype = out_dtype};
    prism_status st = decode_setup(spec, codes, scales, numel, out, &job, err);
    if (st != PRISM_OK)
        return st;
    if (prism_dtype_size(out_dtype) == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "out_dtype: unknown dtype %d", (int)out_dtype);
    size_t tasks = numel / TASK_ELEMENTS + (numel % TASK_ELEMENTS != 0);
    run_tasks(threads_for(threads, numel), tasks, dequantize_task, &job);
    return PRISM_OK;
}

prism_status prism_dequantize_cpu(const prism_quant_spec *spec, const uint8_t *codes,
                                  const float *scales, size_t numel, void *out, prism_dtype out_dtype,
                                  prism_error *err)
{
    return prism_dequantize_with(prism_cpu_best(), 0, spec, codes, scales, numel, out, out_dtype, err);
}

prism_status prism_dequantize_accumulate_with(const prism_cpu_path *path, int threads,
                                              const prism_quant_spec *spec, const uint8_t *codes,
                                              const float *scales, size_t numel, float *acc,
                                              prism_error *err)
{
    check_path(&path, err);
    decode_job job = {.path = path, .acc = acc};
    prism_status st = decode_setup(spec, codes, scales, numel, acc, &job, err);
    if (st != PRISM_OK)
        return st;
    size_t tasks = numel / TASK_ELEMENTS + (numel % TASK_ELEMENTS != 0);
    run_tasks(threads_for(threads, numel), tasks, accumulate_task, &job);
    return PRISM_OK;
}

prism_status prism_dequantize_accumulate_cpu(const prism_quant_spec *spec, const uint8_t *codes,
                                             const float *scales, size_t numel, float *acc,
                                             prism_error *err)
{
    return prism_dequantize_accumulate_with(prism_cpu_best(), 0, spec, codes, scales, numel, acc, err);
}

/* ---- relative error --------------------------------------------------------------------- */

typedef struct error_job {
    const prism_cpu_path *path;
    const prism_tensor *a, *b;
    size_t chunks;
    double *sums; /* two per chunk */
    int *bad;     /* one per chunk */
} error_job;

static void error_task(void *ctx, size_t task)
{
    error_job *job = ctx;
    size_t c0 = task * STATS_TASK_CHUNKS;
    size_t c1 = range_end(task, STATS_TASK_CHUNKS, job->chunks);
    for (size_t c = c0; c < c1; c++)
        job->path->error_chunk(job->a, job->b, c * PRISM_STATS_CHUNK,
                               range_end(c, PRISM_STATS_CHUNK, job->a->numel), &job->sums[2 * c],
                               &job->bad[c]);
}

prism_status prism_relative_error_with(const prism_cpu_path *path, int threads,
                                       const prism_tensor *a, const prism_tensor *b, double *out,
                                       prism_error *err)
{
    check_path(&path, err);
    prism_status st = prism_check_pair(a, b, out, err);
    if (st != PRISM_OK)
        return st;
    size_t chunks = a->numel / PRISM_STATS_CHUNK + (a->numel % PRISM_STATS_CHUNK != 0);
    error_job job = {.path = path, .a = a, .b = b, .chunks = chunks};
    job.sums = malloc((chunks ? chunks : 1) * 2 * sizeof *job.sums);
    job.bad = malloc((chunks ? chunks : 1) * sizeof *job.bad);
    if (!job.sums || !job.bad) {
        free(job.sums);
        free(job.bad);
        return prism_error_set(err, PRISM_ERR_NOMEM, "relative_error: no memory for %zu chunks", chunks);
    }
    size_t tasks = chunks / STATS_TASK_CHUNKS + (chunks % STATS_TASK_CHUNKS != 0);
    run_tasks(threads_for(threads, a->numel), tasks, error_task, &job);
    double diff = 0, norm = 0;
    int bad = 0;
    for (size_t c = 0; c < chunks; c++) {
        diff += job.sums[2 * c];
        norm += job.sums[2 * c + 1];
        bad |= job.bad[c];
    }
    free(job.sums);
    free(job.bad);
    if (bad)
        *out = NAN;
    else if (norm == 0)
        *out = diff == 0 ? 0.0 : INFINITY;
    else
        *out = sqrt(diff / norm);
    return PRISM_OK;
}

prism_status prism_relative_error_cpu(const prism_tensor *a, const prism_tensor *b, double *out,
                                      prism_error *err)
{
    return prism_relative_error_with(prism_cpu_best(), 0, a, b, out, err);
}

/* ---- path choice ------------------------------------------------------------------------ */

static const prism_cpu_path *best_path;
static pthread_once_t best_path_once = PTHREAD_ONCE_INIT;

/* The fastest path the CPU runs, then PRISM_CPU_PATH: "scalar" picks the reference, "avx2" the
 * AVX2 path where the CPU runs it; anything else (or avx2 on a CPU without it) keeps the
 * detected one. */
static void choose_best_path(void)
{
    const prism_cpu_path *detected = &prism_cpu_scalar;
#if PRISM_CPU_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        detected = &prism_cpu_avx2;
#endif
    const char *want = getenv("PRISM_CPU_PATH");
    best_path = detected;
    if (want && strcmp(want, "scalar") == 0)
        best_path = &prism_cpu_scalar;
}

const prism_cpu_path *prism_cpu_best(void)
{
    pthread_once(&best_path_once, choose_best_path);
    return best_path;
}
