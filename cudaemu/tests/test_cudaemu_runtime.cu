/* The emulated CUDA runtime against the runtime API's documented semantics: work on a stream runs
 * in order and asynchronously (a held stream, prism_cudaemu_stream_hold, is the "GPU not there
 * yet" that real devices give by being slow); events and cudaStreamWaitEvent order streams; the
 * legacy default stream is ordered with blocking streams and not with cudaStreamNonBlocking ones;
 * copies are checked against where their pointers are; device memory is counted per device and
 * starts as 0xff bytes; cudaFreeAsync frees when its stream gets there; several devices each have
 * their own memory. Nothing here sleeps: every wait polls an event a bounded number of times
 * (emu_wait_event), and every "has not run yet" is checked while the stream it waits for is
 * held, so it cannot have run. */
#include "emu_test.h"

#include <stdlib.h>

#include <thread>

namespace {

/* log[0] counts the entries; entry k is log[1 + k]. */
__global__ void append_kernel(int *log, int value)
{
    log[1 + log[0]] = value;
    log[0]++;
}

__global__ void set_kernel(int *p, int value)
{
    p[threadIdx.x] = value;
}

/* ---- held streams, events and stream order --------------------------------------------------- */

void test_held_stream_keeps_events_and_queries_not_ready()
{
    cudaStream_t s;
    cudaEvent_t e, never;
    EMU_OK(cudaStreamCreate(&s));
    EMU_OK(cudaEventCreate(&e));
    EMU_OK(cudaEventCreate(&never));
    DeviceBuffer<int> x(32);
    EMU_OK(cudaStreamQuery(s)); /* nothing queued: done */
    EMU_OK(cudaEventQuery(never)); /* never recorded: done */

    EMU_OK(prism_cudaemu_stream_hold(s));
    EMU_OK(prism_cudaemu_stream_hold(s)); /* holds nest */
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 32, s, x.p, 5));
    EMU_OK(cudaEventRecord(e, s));
    EMU_EXPECT(cudaEventQuery(e), cudaErrorNotReady);
    EMU_EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_EXPECT(cudaEventQuery(e), cudaErrorNotReady); /* one hold left */
    EMU_EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
    EMU_OK(cudaGetLastError()); /* cudaErrorNotReady is an answer, not an error */
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_OK(emu_wait_event(e));
    EMU_OK(cudaStreamQuery(s));
    const std::vector<int> got = x.get();
    CU_ASSERT_EQUAL(got[0], 5);
    CU_ASSERT_EQUAL(got[31], 5);

    EMU_EXPECT(prism_cudaemu_stream_release(s), cudaErrorInvalidValue); /* not held */
    EMU_OK(cudaEventDestroy(e));
    EMU_OK(cudaEventDestroy(never));
    EMU_OK(cudaStreamDestroy(s));
    EMU_EXPECT(prism_cudaemu_stream_hold(s), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

/* Kernels, asynchronous copies and memsets on one stream run in the order they were queued: all
 * are queued while the stream is held, then it runs them. */
void test_work_on_a_stream_runs_in_order()
{
    const int n = 40;
    cudaStream_t s;
    EMU_OK(cudaStreamCreate(&s));
    DeviceBuffer<int> log(1 + n), x(1), copies(n), cleared(n);
    EMU_OK(cudaMemset(log.p, 0, sizeof(int)));
    EMU_OK(prism_cudaemu_stream_hold(s));
    for (int i = 0; i < n; i++) {
        EMU_OK(PRISM_CUDAEMU_LAUNCH(append_kernel, 1, 1, s, log.p, i * 3));
        EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, s, x.p, i));
        EMU_OK(cudaMemcpyAsync(copies.p + i, x.p, sizeof(int), cudaMemcpyDeviceToDevice, s));
        EMU_OK(cudaMemsetAsync(cleared.p + i, 0, sizeof(int), s));
        EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, s, x.p, -1));
    }
    EMU_EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_OK(emu_wait_stream(s));
    const std::vector<int> l = log.get(), c = copies.get(), z = cleared.get();
    CU_ASSERT_EQUAL(l[0], n);
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += l[1 + i] != i * 3 || c[i] != i || z[i] != 0;
    CU_ASSERT_EQUAL(wrong, 0);
    CU_ASSERT_EQUAL(x.get()[0], -1);
    EMU_OK(cudaStreamDestroy(s));
}

/* Stream b waits for an event of stream a: its work after the wait does not run while a is held
 * (its work before the wait does), and sees a's result once a runs. */
void test_stream_wait_event_orders_two_streams()
{
    cudaStream_t a, b;
    cudaEvent_t a_done, b_before, b_after;
    EMU_OK(cudaStreamCreate(&a));
    EMU_OK(cudaStreamCreate(&b));
    EMU_OK(cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming));
    EMU_OK(cudaEventCreateWithFlags(&b_before, cudaEventDisableTiming));
    EMU_OK(cudaEventCreateWithFlags(&b_after, cudaEventDisableTiming));
    DeviceBuffer<int> flag(1);
    int *seen = nullptr; /* pinned: the copy into it is asynchronous */
    EMU_OK(cudaMallocHost((void **)&seen, sizeof(int)));
    *seen = -1;
    EMU_OK(cudaMemset(flag.p, 0, sizeof(int)));

    EMU_OK(prism_cudaemu_stream_hold(a));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, a, flag.p, 1));
    EMU_OK(cudaEventRecord(a_done, a));
    EMU_OK(cudaEventRecord(b_before, b));
    EMU_OK(cudaStreamWaitEvent(b, a_done, 0));
    EMU_OK(cudaMemcpyAsync(seen, flag.p, sizeof(int), cudaMemcpyDeviceToHost, b));
    EMU_OK(cudaEventRecord(b_after, b));
    EMU_OK(emu_wait_event(b_before));
    EMU_EXPECT(cudaEventQuery(b_after), cudaErrorNotReady);
    EMU_EXPECT(cudaStreamQuery(b), cudaErrorNotReady);
    CU_ASSERT_EQUAL(*(volatile int *)seen, -1);
    EMU_OK(prism_cudaemu_stream_release(a));
    EMU_OK(emu_wait_event(b_after));
    CU_ASSERT_EQUAL(*seen, 1);

    /* The wait is for the record made before it: recording the event again elsewhere later does
     * not release b. */
    cudaStream_t c;
    EMU_OK(cudaStreamCreate(&c));
    EMU_OK(prism_cudaemu_stream_hold(a));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, a, flag.p, 2));
    EMU_OK(cudaEventRecord(a_done, a));
    EMU_OK(cudaStreamWaitEvent(b, a_done, 0));
    EMU_OK(cudaMemcpyAsync(seen, flag.p, sizeof(int), cudaMemcpyDeviceToHost, b));
    EMU_OK(cudaEventRecord(b_after, b));
    EMU_OK(cudaEventRecord(a_done, c)); /* c has nothing queued: this record is done at once */
    EMU_OK(emu_wait_event(a_done));
    EMU_EXPECT(cudaEventQuery(b_after), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(a));
    EMU_OK(emu_wait_event(b_after));
    CU_ASSERT_EQUAL(*seen, 2);
    EMU_OK(cudaStreamDestroy(c));

    /* A wait for an event never recorded waits for nothing. */
    cudaEvent_t never;
    EMU_OK(cudaEventCreate(&never));
    EMU_OK(cudaStreamWaitEvent(b, never, 0));
    EMU_OK(emu_wait_stream(b));
    EMU_EXPECT(cudaStreamWaitEvent(b, never, 1), cudaErrorInvalidValue);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    EMU_OK(cudaFreeHost(seen));
    for (cudaEvent_t e : {a_done, b_before, b_after, never})
        EMU_OK(cudaEventDestroy(e));
    EMU_OK(cudaStreamDestroy(a));
    EMU_OK(cudaStreamDestroy(b));
}

/* The legacy default stream waits for the work already queued on every blocking stream of its
 * device, and blocking streams wait for the work already queued on it; a cudaStreamNonBlocking
 * stream waits for neither. */
void test_legacy_default_stream_orders_with_blocking_streams_only()
{
    cudaStream_t blocking, nonblocking;
    EMU_OK(cudaStreamCreate(&blocking));
    EMU_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
    cudaEvent_t on_legacy, on_blocking, on_nonblocking;
    EMU_OK(cudaEventCreateWithFlags(&on_legacy, cudaEventDisableTiming));
    EMU_OK(cudaEventCreateWithFlags(&on_blocking, cudaEventDisableTiming));
    EMU_OK(cudaEventCreateWithFlags(&on_nonblocking, cudaEventDisableTiming));
    DeviceBuffer<int> x(3);

    /* A blocking stream held with work queued: the legacy stream waits for it, the non-blocking
     * stream does not. */
    EMU_OK(prism_cudaemu_stream_hold(blocking));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, blocking, x.p, 1));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, nullptr, x.p + 1, 2));
    EMU_OK(cudaEventRecord(on_legacy, nullptr));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, nonblocking, x.p + 2, 3));
    EMU_OK(cudaEventRecord(on_nonblocking, nonblocking));
    EMU_OK(emu_wait_event(on_nonblocking));
    EMU_EXPECT(cudaEventQuery(on_legacy), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(blocking));
    EMU_OK(emu_wait_event(on_legacy));

    /* The legacy stream held with work queued: a blocking stream's later work waits for it, the
     * non-blocking stream's does not. */
    EMU_OK(prism_cudaemu_stream_hold(nullptr));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, nullptr, x.p + 1, 20));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, blocking, x.p, 10));
    EMU_OK(cudaEventRecord(on_blocking, blocking));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 1, nonblocking, x.p + 2, 30));
    EMU_OK(cudaEventRecord(on_nonblocking, nonblocking));
    EMU_OK(emu_wait_event(on_nonblocking));
    EMU_EXPECT(cudaEventQuery(on_blocking), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(nullptr));
    EMU_OK(emu_wait_event(on_blocking));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<int> got = x.get();
    CU_ASSERT_EQUAL(got[0], 10);
    CU_ASSERT_EQUAL(got[1], 20);
    CU_ASSERT_EQUAL(got[2], 30);

    for (cudaEvent_t e : {on_legacy, on_blocking, on_nonblocking})
        EMU_OK(cudaEventDestroy(e));
    EMU_OK(cudaStreamDestroy(blocking));
    EMU_OK(cudaStreamDestroy(nonblocking));
}

/* An event answers for its last record: re-recorded on an idle stream, it is done even though
 * its earlier record, on a held stream, is not. */
void test_event_answers_for_its_last_record()
{
    cudaStream_t held, idle;
    cudaEvent_t e;
    EMU_OK(cudaStreamCreate(&held));
    EMU_OK(cudaStreamCreate(&idle));
    EMU_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EMU_OK(prism_cudaemu_stream_hold(held));
    EMU_OK(cudaEventRecord(e, held));
    EMU_EXPECT(cudaEventQuery(e), cudaErrorNotReady);
    EMU_OK(cudaEventRecord(e, idle));
    EMU_OK(emu_wait_event(e));
    EMU_OK(cudaEventRecord(e, held)); /* and back on the held stream */
    EMU_EXPECT(cudaEventQuery(e), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(held));
    EMU_OK(emu_wait_event(e));
    EMU_OK(cudaEventDestroy(e));
    EMU_OK(cudaStreamDestroy(held));
    EMU_OK(cudaStreamDestroy(idle));
}

/* A destroyed stream's queued work still runs; its handle is gone at once. */
void test_destroyed_stream_finishes_its_work()
{
    cudaStream_t s;
    EMU_OK(cudaStreamCreate(&s));
    DeviceBuffer<int> log(1 + 20);
    EMU_OK(cudaMemset(log.p, 0, sizeof(int)));
    for (int i = 0; i < 20; i++)
        EMU_OK(PRISM_CUDAEMU_LAUNCH(append_kernel, 1, 1, s, log.p, i));
    EMU_OK(cudaStreamDestroy(s));
    EMU_EXPECT(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<int> l = log.get();
    CU_ASSERT_EQUAL(l[0], 20);
    CU_ASSERT_EQUAL(l[20], 19);
}

/* ---- events' timing -------------------------------------------------------------------------- */

void test_event_elapsed_time_answers_as_documented()
{
    cudaStream_t s;
    cudaEvent_t start, stop, untimed, unrecorded;
    EMU_OK(cudaStreamCreate(&s));
    EMU_OK(cudaEventCreate(&start));
    EMU_OK(cudaEventCreate(&stop));
    EMU_OK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    EMU_OK(cudaEventCreate(&unrecorded));
    DeviceBuffer<int> x(256);
    float ms = -1.0f;

    EMU_OK(prism_cudaemu_stream_hold(s));
    EMU_OK(cudaEventRecord(start, s));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 256, s, x.p, 1));
    EMU_OK(cudaEventRecord(stop, s));
    EMU_OK(cudaEventRecord(untimed, s));
    EMU_EXPECT(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
    CU_ASSERT_EQUAL(ms, -1.0f);
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_OK(emu_wait_event(untimed));
    EMU_OK(cudaEventElapsedTime(&ms, start, stop));
    CU_ASSERT(ms >= 0.0f);
    float back = 1.0f;
    EMU_OK(cudaEventElapsedTime(&back, stop, start));
    CU_ASSERT_EQUAL(back, -ms);

    EMU_EXPECT(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaEventElapsedTime(&ms, untimed, stop), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaEventElapsedTime(&ms, start, unrecorded), cudaErrorInvalidResourceHandle);
    EMU_EXPECT(cudaEventElapsedTime(nullptr, start, stop), cudaErrorInvalidValue);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    for (cudaEvent_t e : {start, stop, untimed, unrecorded})
        EMU_OK(cudaEventDestroy(e));
    EMU_OK(cudaStreamDestroy(s));
}

/* ---- copies ---------------------------------------------------------------------------------- */

struct CopyCase {
    const char *what;
    int dst, src; /* 0 host (malloc), 1 pinned, 2 device, 3 device + 8 bytes (runs past the end) */
    cudaMemcpyKind kind;
    cudaError_t want;
};

void test_memcpy_checks_kind_and_range()
{
    const size_t bytes = 64;
    void *host = malloc(bytes), *pinned = nullptr, *dev = nullptr;
    EMU_OK(cudaMallocHost(&pinned, bytes));
    EMU_OK(cudaMalloc(&dev, bytes));
    memset(host, 0x11, bytes);
    memset(pinned, 0x22, bytes);
    void *const where[4] = {host, pinned, dev, static_cast<char *>(dev) + 8};
    const CopyCase cases[] = {
        {"host to device", 2, 0, cudaMemcpyHostToDevice, cudaSuccess},
        {"pinned to device", 2, 1, cudaMemcpyHostToDevice, cudaSuccess},
        {"device to host", 0, 2, cudaMemcpyDeviceToHost, cudaSuccess},
        {"device to pinned", 1, 2, cudaMemcpyDeviceToHost, cudaSuccess},
        {"host to host", 0, 1, cudaMemcpyHostToHost, cudaSuccess},
        {"default, either way", 0, 2, cudaMemcpyDefault, cudaSuccess},
        {"host to device from device memory", 2, 2, cudaMemcpyHostToDevice, cudaErrorInvalidValue},
        {"host to device into host memory", 0, 1, cudaMemcpyHostToDevice, cudaErrorInvalidValue},
        {"device to host into device memory", 2, 2, cudaMemcpyDeviceToHost, cudaErrorInvalidValue},
        {"device to host from host memory", 0, 1, cudaMemcpyDeviceToHost, cudaErrorInvalidValue},
        {"device to device from host memory", 2, 0, cudaMemcpyDeviceToDevice, cudaErrorInvalidValue},
        {"host to host from device memory", 0, 2, cudaMemcpyHostToHost, cudaErrorInvalidValue},
        {"past the end of the destination", 3, 0, cudaMemcpyHostToDevice, cudaErrorInvalidValue},
        {"past the end of the source", 0, 3, cudaMemcpyDeviceToHost, cudaErrorInvalidValue},
        {"a kind that does not exist", 2, 0, (cudaMemcpyKind)7, cudaErrorInvalidMemcpyDirection},
    };
    int ok = 0;
    for (const CopyCase &c : cases) {
        const cudaError_t sync = cudaMemcpy(where[c.dst], where[c.src], bytes, c.kind);
        const cudaError_t last = cudaGetLastError();
        const cudaError_t async = cudaMemcpyAsync(where[c.dst], where[c.src], bytes, c.kind, nullptr);
        const cudaError_t last_async = cudaGetLastError();
        EMU_OK(cudaDeviceSynchronize());
        const bool good = sync == c.want && last == c.want && async == c.want && last_async == c.want;
        if (!good)
            fprintf(stderr, "\n  %s: %s and %s (last %s, %s), expected %s", c.what, cudaGetErrorName(sync),
                    cudaGetErrorName(async), cudaGetErrorName(last), cudaGetErrorName(last_async),
                    cudaGetErrorName(c.want));
        ok += good;
    }
    CU_ASSERT_EQUAL(ok, (int)(sizeof cases / sizeof cases[0]));
    /* A copy of nothing is always fine; the bytes of a good copy arrive. */
    EMU_OK(cudaMemcpy(dev, host, 0, cudaMemcpyDeviceToHost));
    EMU_OK(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice));
    EMU_OK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    CU_ASSERT_EQUAL(memcmp(host, pinned, bytes), 0);
    EMU_EXPECT(cudaMemset(host, 0, bytes), cudaErrorInvalidValue);
    EMU_EXPECT(cudaMemset(static_cast<char *>(dev) + 1, 0, bytes), cudaErrorInvalidValue);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EMU_OK(cudaFree(dev));
    EMU_OK(cudaFreeHost(pinned));
    free(host);
}

/* ---- memory ---------------------------------------------------------------------------------- */

void test_free_refuses_what_cudaMalloc_did_not_return()
{
    void *host = malloc(64), *pinned = nullptr, *dev = nullptr;
    EMU_OK(cudaMallocHost(&pinned, 64));
    EMU_OK(cudaMalloc(&dev, 64));
    EMU_EXPECT(cudaFree(host), cudaErrorInvalidValue);
    EMU_EXPECT(cudaFree(pinned), cudaErrorInvalidValue);
    EMU_EXPECT(cudaFree(static_cast<char *>(dev) + 4), cudaErrorInvalidValue);
    EMU_EXPECT(cudaFreeHost(dev), cudaErrorInvalidValue);
    EMU_EXPECT(cudaFreeHost(host), cudaErrorInvalidValue);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EMU_OK(cudaFree(nullptr));
    EMU_OK(cudaFree(dev));
    EMU_EXPECT(cudaFree(dev), cudaErrorInvalidValue); /* twice */
    EMU_OK(cudaFreeHost(pinned));
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    free(host);
}

void test_fresh_device_memory_reads_as_0xff_bytes()
{
    const size_t bytes = 4099;
    unsigned char *dev = nullptr, *dev_async = nullptr;
    EMU_OK(cudaMalloc((void **)&dev, bytes));
    EMU_OK(cudaMallocAsync((void **)&dev_async, bytes, nullptr));
    std::vector<unsigned char> host(bytes, 0), host_async(bytes, 0);
    EMU_OK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
    EMU_OK(cudaMemcpy(host_async.data(), dev_async, bytes, cudaMemcpyDeviceToHost));
    size_t ff = 0;
    for (size_t i = 0; i < bytes; i++)
        ff += (host[i] == 0xff) + (host_async[i] == 0xff);
    CU_ASSERT_EQUAL(ff, 2 * bytes);
    EMU_OK(cudaFree(dev));
    EMU_OK(cudaFreeAsync(dev_async, nullptr));
    EMU_OK(cudaDeviceSynchronize());
}

void test_mem_get_info_counts_every_byte()
{
    size_t free0 = 0, total = 0, free1 = 0, total1 = 0;
    EMU_OK(cudaMemGetInfo(&free0, &total));
    cudaDeviceProp prop;
    EMU_OK(cudaGetDeviceProperties(&prop, 0));
    CU_ASSERT_EQUAL(total, prop.totalGlobalMem);
    CU_ASSERT_EQUAL(total - free0, prism_cudaemu_device_bytes_in_use(0));
    const size_t sizes[] = {1, 3 << 20, 4097};
    void *p[3];
    size_t sum = 0;
    for (int i = 0; i < 3; i++) {
        EMU_OK(cudaMalloc(&p[i], sizes[i]));
        sum += sizes[i];
        EMU_OK(cudaMemGetInfo(&free1, &total1));
        CU_ASSERT_EQUAL(free1, free0 - sum);
        CU_ASSERT_EQUAL(total1, total);
    }
    /* More than is free: refused, and nothing counted. */
    void *big = nullptr;
    EMU_EXPECT(cudaMalloc(&big, free1 + 1), cudaErrorMemoryAllocation);
    CU_ASSERT_PTR_NULL(big);
    EMU_EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
    EMU_OK(cudaMemGetInfo(&free1, &total1));
    CU_ASSERT_EQUAL(free1, free0 - sum);
    /* Zero bytes: success, a null pointer, nothing counted. */
    void *none = &big;
    EMU_OK(cudaMalloc(&none, 0));
    CU_ASSERT_PTR_NULL(none);
    for (int i = 0; i < 3; i++)
        EMU_OK(cudaFree(p[i]));
    EMU_OK(cudaMemGetInfo(&free1, &total1));
    CU_ASSERT_EQUAL(free1, free0);
}

/* cudaFreeAsync gives the memory back when its stream gets there, not when it is called. */
void test_free_async_frees_when_the_stream_gets_there()
{
    cudaStream_t s;
    EMU_OK(cudaStreamCreate(&s));
    const size_t before = prism_cudaemu_device_bytes_in_use(0), bytes = 1 << 16;
    void *p = nullptr;
    EMU_OK(cudaMallocAsync(&p, bytes, s));
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(0), before + bytes);
    EMU_OK(prism_cudaemu_stream_hold(s));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 64, s, static_cast<int *>(p), 9));
    EMU_OK(cudaFreeAsync(p, s));
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(0), before + bytes);
    EMU_EXPECT(cudaStreamQuery(s), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_OK(emu_wait_stream(s));
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(0), before);
    EMU_EXPECT(cudaFreeAsync(p, s), cudaErrorInvalidValue); /* gone */
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EMU_OK(cudaStreamDestroy(s));
}

/* ---- devices --------------------------------------------------------------------------------- */

int expected_device_count()
{
    const char *env = getenv("PRISM_CUDAEMU_DEVICES");
    return env && *env ? atoi(env) : 4;
}

void test_devices_have_their_own_memory()
{
    int count = 0, current = -1;
    EMU_OK(cudaGetDeviceCount(&count));
    CU_ASSERT_EQUAL(count, expected_device_count());
    if (count < 3)
        return;
    EMU_EXPECT(cudaSetDevice(count), cudaErrorInvalidDevice);
    EMU_EXPECT(cudaSetDevice(-1), cudaErrorInvalidDevice);
    EMU_EXPECT(cudaGetLastError(), cudaErrorInvalidDevice);
    EMU_OK(cudaGetDevice(&current));
    CU_ASSERT_EQUAL(current, 0);

    const size_t in_use[3] = {prism_cudaemu_device_bytes_in_use(0), prism_cudaemu_device_bytes_in_use(1),
                              prism_cudaemu_device_bytes_in_use(2)};
    EMU_OK(cudaSetDevice(2));
    void *p2 = nullptr;
    EMU_OK(cudaMalloc(&p2, 4096));
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(2), in_use[2] + 4096);
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(0), in_use[0]);
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(1), in_use[1]);
    cudaPointerAttributes attr;
    EMU_OK(cudaPointerGetAttributes(&attr, p2));
    CU_ASSERT_EQUAL(attr.type, cudaMemoryTypeDevice);
    CU_ASSERT_EQUAL(attr.device, 2);
    int host_int = 0;
    EMU_OK(cudaPointerGetAttributes(&attr, &host_int));
    CU_ASSERT_EQUAL(attr.type, cudaMemoryTypeUnregistered);

    /* The current device is the host thread's: another thread starts on device 0. */
    int other = -1;
    std::thread([&other] { cudaGetDevice(&other); }).join();
    CU_ASSERT_EQUAL(other, 0);

    /* A pointer of another device is freed on its own device, whichever is current. */
    EMU_OK(cudaSetDevice(0));
    EMU_OK(cudaFree(p2));
    CU_ASSERT_EQUAL(prism_cudaemu_device_bytes_in_use(2), in_use[2]);
}

/* A kernel on device 0 given device 1's memory: an illegal address, on device 0 only. */
void test_kernel_given_another_devices_memory_faults()
{
    EMU_OK(cudaSetDevice(1));
    int *p1 = nullptr;
    EMU_OK(cudaMalloc((void **)&p1, 32 * sizeof(int)));
    EMU_OK(cudaSetDevice(0));
    const int line = __LINE__; EMU_OK(PRISM_CUDAEMU_LAUNCH(set_kernel, 1, 32, nullptr, p1, 1));
    EMU_EXPECT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    const std::string report = prism_cudaemu_last_fault(0);
    EMU_CONTAINS(report, std::string("kernel set_kernel (") + __FILE__ + ":" + std::to_string(line) + ")");
    EMU_CONTAINS(report, "pointer argument 1");
    EMU_CONTAINS(report, "is device 1 memory, not memory device 0 can reach");
    EMU_OK(cudaDeviceReset());
    EMU_OK(cudaSetDevice(1));
    EMU_OK(cudaDeviceSynchronize());
    std::vector<int> back(32, 0);
    EMU_OK(cudaMemcpy(back.data(), p1, 32 * sizeof(int), cudaMemcpyDeviceToHost));
    CU_ASSERT_EQUAL(back[0], -1); /* 0xff bytes: the kernel never wrote it */
    EMU_OK(cudaFree(p1));
    EMU_OK(cudaSetDevice(0));
}

/* ---- error names and strings ----------------------------------------------------------------- */

struct ErrorText {
    cudaError_t rc;
    const char *name, *text;
};

void test_error_names_and_strings_are_the_runtimes()
{
    /* As the CUDA runtime spells them. */
    const ErrorText table[] = {
        {cudaSuccess, "cudaSuccess", "no error"},
        {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
        {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
        {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
        {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
        {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
        {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
        {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
        {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
        {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
        {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
        {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    };
    for (const ErrorText &e : table) {
        CU_ASSERT_STRING_EQUAL(cudaGetErrorName(e.rc), e.name);
        CU_ASSERT_STRING_EQUAL(cudaGetErrorString(e.rc), e.text);
    }
}

const prism_test_case cases[] = {
    EMU_CASE(test_held_stream_keeps_events_and_queries_not_ready),
    EMU_CASE(test_work_on_a_stream_runs_in_order),
    EMU_CASE(test_stream_wait_event_orders_two_streams),
    EMU_CASE(test_legacy_default_stream_orders_with_blocking_streams_only),
    EMU_CASE(test_event_answers_for_its_last_record),
    EMU_CASE(test_destroyed_stream_finishes_its_work),
    EMU_CASE(test_event_elapsed_time_answers_as_documented),
    EMU_CASE(test_memcpy_checks_kind_and_range),
    EMU_CASE(test_free_refuses_what_cudaMalloc_did_not_return),
    EMU_CASE(test_fresh_device_memory_reads_as_0xff_bytes),
    EMU_CASE(test_mem_get_info_counts_every_byte),
    EMU_CASE(test_free_async_frees_when_the_stream_gets_there),
    EMU_CASE(test_devices_have_their_own_memory),
    EMU_CASE(test_kernel_given_another_devices_memory_faults),
    EMU_CASE(test_error_names_and_strings_are_the_runtimes),
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"cudaemu_runtime", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
