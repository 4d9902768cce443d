/* What the device emulation's tests share: CUnit through tests/support/testutil.h, a checked CUDA
 * call that reports file:line and goes on (never a longjmp past C++ destructors), device buffers
 * that free themselves, and the one way a test waits for the emulated device without blocking on
 * it: polling an event a bounded number of times. */
#ifndef PRISM_CUDAEMU_EMU_TEST_H
#define PRISM_CUDAEMU_EMU_TEST_H

#include <cuda_runtime.h>

#include <sched.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

extern "C" {
#include "testutil.h"
}

/* A CUDA call that must succeed: on failure the call, its error's name and file:line are printed
 * and the assertion fails; the test goes on. */
#define EMU_OK(call)                                                                               \
    do {                                                                                           \
        const cudaError_t emu_rc_ = (call);                                                        \
        if (emu_rc_ != cudaSuccess)                                                                \
            fprintf(stderr, "\n  %s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorName(emu_rc_)); \
        CU_ASSERT_EQUAL(emu_rc_, cudaSuccess);                                                     \
    } while (0)

/* A call that must answer exactly `want` (a cudaError_t, ncclResult_t or cublasStatus_t). */
#define EMU_EXPECT(call, want)                                                                     \
    do {                                                                                           \
        const long long emu_got_ = (long long)(call), emu_want_ = (long long)(want);               \
        if (emu_got_ != emu_want_)                                                                 \
            fprintf(stderr, "\n  %s:%d: %s: %lld, expected %s (%lld)", __FILE__, __LINE__, #call,  \
                    emu_got_, #want, emu_want_);                                                   \
        CU_ASSERT_EQUAL(emu_got_, emu_want_);                                                      \
    } while (0)

/* `hay` contains `needle`; prints both when it does not. */
#define EMU_CONTAINS(hay, needle)                                                                  \
    do {                                                                                           \
        const std::string emu_hay_(hay), emu_needle_(needle);                                      \
        const bool emu_found_ = emu_hay_.find(emu_needle_) != std::string::npos;                   \
        if (!emu_found_)                                                                           \
            fprintf(stderr, "\n  %s:%d: \"%s\" does not contain \"%s\"", __FILE__, __LINE__,       \
                    emu_hay_.c_str(), emu_needle_.c_str());                                        \
        CU_ASSERT_TRUE(emu_found_);                                                                \
    } while (0)

/* cudaMalloc'd memory of n T on the current device, freed by the destructor (unless released,
 * as a test must before cudaDeviceReset frees it behind the buffer's back). */
template <class T> struct DeviceBuffer {
    T *p = nullptr;
    size_t n = 0;

    explicit DeviceBuffer(size_t count) : n(count)
    {
        EMU_OK(cudaMalloc(reinterpret_cast<void **>(&p), count * sizeof(T)));
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    ~DeviceBuffer()
    {
        if (p)
            EMU_OK(cudaFree(p));
    }
    void put(const std::vector<T> &host)
    {
        CU_ASSERT_EQUAL(host.size(), n);
        EMU_OK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> get() const
    {
        std::vector<T> host(n);
        EMU_OK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    void release()
    {
        p = nullptr;
    }
};

/* Polls an event until it is done or the polls run out (yielding between polls, never sleeping):
 * cudaSuccess, or cudaErrorNotReady when the device never got there. The bound is many times
 * what a few small operations take on a loaded machine; a test that exhausts it fails instead of
 * hanging in cudaEventSynchronize. */
inline cudaError_t emu_wait_event(cudaEvent_t e, long polls = 20000000L)
{
    cudaError_t rc = cudaErrorNotReady;
    for (long i = 0; i < polls && (rc = cudaEventQuery(e)) == cudaErrorNotReady; i++)
        sched_yield();
    return rc;
}

/* Records an event on `stream` and waits for it as emu_wait_event does. */
inline cudaError_t emu_wait_stream(cudaStream_t stream)
{
    cudaEvent_t e;
    cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (rc != cudaSuccess)
        return rc;
    rc = cudaEventRecord(e, stream);
    if (rc == cudaSuccess)
        rc = emu_wait_event(e);
    cudaEventDestroy(e);
    return rc;
}

/* After a test: a device left with a sticky error (a fault the test did not expect, or did not
 * clear) fails that test and is reset, so that the tests after it start from a clean device. */
inline void emu_check_devices_clean()
{
    int count = 0, current = 0;
    cudaGetDevice(&current);
    if (cudaGetDeviceCount(&count) != cudaSuccess)
        count = 0;
    for (int d = 0; d < count; d++) {
        cudaSetDevice(d);
        const cudaError_t rc = cudaPeekAtLastError();
        if (rc != cudaSuccess) {
            fprintf(stderr, "\n  device %d left with %s: %s", d, cudaGetErrorName(rc), prism_cudaemu_last_fault(d));
            cudaDeviceReset();
        }
        CU_ASSERT_EQUAL(rc, cudaSuccess);
    }
    cudaSetDevice(current);
}

template <void (*F)()> void emu_isolated()
{
    F();
    emu_check_devices_clean();
}

/* A row of a prism_test_case table: the test, then the check that it left every device clean. */
#define EMU_CASE(fn) {#fn, emu_isolated<fn>}

#endif
