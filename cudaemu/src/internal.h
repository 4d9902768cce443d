/* What the parts of libprism_cudaemu share: the devices, the memory registry, streams and their
 * operations, and the sanitizer annotations. Internal to cudaemu/src. */
#ifndef PRISM_CUDAEMU_INTERNAL_H
#define PRISM_CUDAEMU_INTERNAL_H

#include "prism_cudaemu/device.h"

#include <condition_variable>
#include <cstdarg>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace prism_cudaemu {

/* ---- sanitizer annotations, through weak symbols: present only in a sanitized process -------- */
extern "C" {
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size) __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old)
    __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
void *__tsan_get_current_fiber(void) __attribute__((weak));
void *__tsan_create_fiber(unsigned flags) __attribute__((weak));
void __tsan_destroy_fiber(void *fiber) __attribute__((weak));
void __tsan_switch_to_fiber(void *fiber, unsigned flags) __attribute__((weak));
void __tsan_acquire(void *addr) __attribute__((weak));
void __tsan_release(void *addr) __attribute__((weak));
}

inline bool tsan_on()
{
    return __tsan_create_fiber != nullptr;
}
inline void tsan_acquire(void *p)
{
    if (__tsan_acquire)
        __tsan_acquire(p);
}
inline void tsan_release(void *p)
{
    if (__tsan_release)
        __tsan_release(p);
}

/* ---- configuration (environment, read once) -------------------------------------------------- */

struct Config {
    int devices;          /* PRISM_CUDAEMU_DEVICES, 4 */
    int cc_major, cc_minor; /* PRISM_CUDAEMU_CC, "9.0" */
    int sms;              /* PRISM_CUDAEMU_SMS, 4 */
    size_t memory;        /* PRISM_CUDAEMU_MEMORY_MIB, 1024 (per device) */
    size_t stack;         /* PRISM_CUDAEMU_STACK_KIB, 256 (per emulated thread) */
    int workers;          /* PRISM_CUDAEMU_WORKERS, the processors */
    bool quiet;           /* PRISM_CUDAEMU_QUIET=1: faults are not printed on stderr */
};
const Config &config();

/* ---- memory ---------------------------------------------------------------------------------- */

enum class Mem { Host, Pinned, Device };

struct Alloc {
    size_t size;
    Mem kind;
    int device;
};

/* Where p lies: kind Host (not registered: pageable host memory) or the allocation holding
 * [p, p + bytes) (base set). A range that starts in an allocation and runs past its end is
 * reported with `overrun` set. */
struct Where {
    Mem kind;
    int device;
    const char *base;
    size_t size;
    bool overrun;
};
Where where(const void *p, size_t bytes);

/* ---- streams --------------------------------------------------------------------------------- */

struct Stream;

/* A point in a stream: done once the stream has completed operation `seq`. */
struct Ticket {
    std::shared_ptr<Stream> stream;
    uint64_t seq = 0;
};

struct Op {
    std::vector<Ticket> after;    /* done before this one starts */
    std::function<cudaError_t()> run; /* runs on the stream's worker */
    const char *what = "";
};

struct Stream : std::enable_shared_from_this<Stream> {
    int device = 0;
    bool blocking = true; /* not cudaStreamNonBlocking: ordered with the legacy default stream */
    bool legacy = false;
    std::deque<Op> queue;
    uint64_t queued = 0, completed = 0;
    int holds = 0;
    bool destroyed = false;
    std::thread worker;
};

/* One lock and one condition for every stream, event and communicator: simple, and the
 * emulation's work is in its operations, not in its bookkeeping. */
std::mutex &lock();
std::condition_variable &changed();

bool ticket_done(const Ticket &t); /* lock held */

/* Queues op on s (NULL: the current device's legacy default stream), with the ordering of the
 * legacy default stream; returns the ticket of its completion. `now`: the caller will wait for
 * it anyway, so when nothing is ahead of it, it runs in the caller's thread before this returns.
 * Lock not held. */
cudaError_t enqueue(cudaStream_t s, Op op, Ticket *done = nullptr, bool now = false);

/* The stream behind a handle, or nullptr with the error to return. */
std::shared_ptr<Stream> stream_of(cudaStream_t s, cudaError_t *rc);

/* ---- errors ---------------------------------------------------------------------------------- */

/* Sets the calling thread's last error (when rc is an error) and returns rc. */
cudaError_t set_error(cudaError_t rc);

/* The current device's sticky error (a kernel fault), cudaSuccess when none. */
cudaError_t sticky(int device);

/* Records a fault of a kernel on `device`: the report (also on stderr) and the sticky error. */
void device_fault(int device, cudaError_t rc, const std::string &report);

int current_device();

/* ---- kernels --------------------------------------------------------------------------------- */

/* Runs every block of a launch; called on the stream's worker. The report of a fault, or "". */
std::string run_launch(const Launch &l, int device);

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} /* namespace prism_cudaemu */

#endif
