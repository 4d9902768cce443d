/* The CUDA runtime subset Prism calls, as declared by the toolkit's cuda_runtime_api.h, on
 * emulated devices. Asynchronous like the real one: each stream has a worker thread that runs its
 * operations in order; the legacy default stream is ordered with every blocking stream of its
 * device; events are points in a stream that answer cudaErrorNotReady until the stream got there.
 * Memory is host memory with a registry that knows each allocation's kind (device, pinned),
 * device and exact size, so that copies of the wrong kind, a host pointer where a device one is
 * required, and ranges past an allocation's end are errors, and AddressSanitizer sees every
 * overrun. Fresh device memory is 0xff bytes (a NaN in every float format), never zeros. */
#include "internal.h"

#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace prism_cudaemu {

/* ---- configuration --------------------------------------------------------------------------- */

namespace {

long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = nullptr;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "prism-cudaemu: %s=%s is not a number from %ld to %ld; using %ld\n", name, v, lo, hi, dflt);
        return dflt;
    }
    return x;
}

Config load_config()
{
    Config c;
    c.devices = (int)env_long("PRISM_CUDAEMU_DEVICES", 4, 0, 16);
    c.cc_major = 9;
    c.cc_minor = 0;
    if (const char *cc = getenv("PRISM_CUDAEMU_CC")) {
        int ma = 0, mi = 0;
        if (sscanf(cc, "%d.%d", &ma, &mi) == 2 && ma >= 5 && ma <= 12 && mi >= 0 && mi <= 9) {
            c.cc_major = ma;
            c.cc_minor = mi;
        } else {
            fprintf(stderr, "prism-cudaemu: PRISM_CUDAEMU_CC=%s is not MAJOR.MINOR; using 9.0\n", cc);
        }
    }
    c.sms = (int)env_long("PRISM_CUDAEMU_SMS", 4, 1, 256);
    c.memory = (size_t)env_long("PRISM_CUDAEMU_MEMORY_MIB", 1024, 16, 1 << 20) << 20;
    c.stack = (size_t)env_long("PRISM_CUDAEMU_STACK_KIB", 256, 16, 1 << 16) << 10;
    long procs = (long)std::thread::hardware_concurrency();
    c.workers = (int)env_long("PRISM_CUDAEMU_WORKERS", procs > 0 ? procs : 2, 0, 256);
    c.quiet = env_long("PRISM_CUDAEMU_QUIET", 0, 0, 1) == 1;
    return c;
}

} /* namespace */

const Config &config()
{
    static const Config c = load_config();
    return c;
}

std::string format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char buf[1024];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof buf)
        return std::string(buf, n < 0 ? 0 : (size_t)n);
    std::string s((size_t)n, '\0');
    va_start(ap, fmt);
    vsnprintf(&s[0], (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- state ----------------------------------------------------------------------------------- */

namespace {

struct Device {
    cudaError_t sticky = cudaSuccess;
    std::string fault;
    size_t used = 0;
    std::shared_ptr<Stream> legacy;
};

struct Event {
    int device = 0;
    unsigned flags = 0;
    bool recorded = false;
    Ticket ticket;
    uint64_t generation = 0;
    double time = 0; /* seconds, when the stream reached the record */
    bool timed = false;
};

/* Everything, created at the first call and never destroyed: streams' workers are detached and
 * may still run while the process exits, as a real device's work may. */
struct State {
    std::mutex m;
    std::condition_variable cv;
    std::vector<Device> devices;
    std::map<const void *, std::shared_ptr<Stream>> streams; /* by handle */
    std::map<const void *, std::shared_ptr<Event>> events;
    std::vector<std::shared_ptr<Stream>> retired; /* destroyed, maybe with work left */
    std::mutex reg_m; /* the registry's own lock: copies look up pointers under it */
    std::map<uintptr_t, Alloc> allocs;
    std::atomic<unsigned long long> faults{0};
};

State &state()
{
    static State *s = [] {
        State *st = new State;
        st->devices.resize((size_t)config().devices);
        return st;
    }();
    return *s;
}

thread_local int tl_device = 0;
thread_local cudaError_t tl_error = cudaSuccess;

double now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} /* namespace */

std::mutex &lock()
{
    return state().m;
}

std::condition_variable &changed()
{
    return state().cv;
}

int current_device()
{
    return tl_device;
}

cudaError_t set_error(cudaError_t rc)
{
    if (rc != cudaSuccess && rc != cudaErrorNotReady)
        tl_error = rc;
    return rc;
}

cudaError_t sticky(int device)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.m);
    if (device < 0 || device >= (int)s.devices.size())
        return cudaSuccess;
    return s.devices[(size_t)device].sticky;
}

void device_fault(int device, cudaError_t rc, const std::string &report)
{
    State &s = state();
    {
        std::lock_guard<std::mutex> g(s.m);
        Device &d = s.devices[(size_t)device];
        if (d.sticky == cudaSuccess)
            d.sticky = rc;
        d.fault = report;
        s.faults++;
        s.cv.notify_all();
    }
    if (!config().quiet)
        fprintf(stderr, "prism-cudaemu: device %d: FAULT: %s\n", device, report.c_str());
}

/* ---- memory registry ------------------------------------------------------------------------- */

Where where(const void *p, size_t bytes)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.reg_m);
    Where w{Mem::Host, -1, nullptr, 0, false};
    const uintptr_t a = (uintptr_t)p;
    auto it = s.allocs.upper_bound(a);
    if (it == s.allocs.begin())
        return w;
    --it;
    const uintptr_t base = it->first;
    const size_t size = it->second.size;
    /* A pointer one past the end belongs to the allocation only for an empty range. */
    if (a > base + size || (a == base + size && bytes > 0 && size > 0))
        return w;
    if (size == 0 && a != base)
        return w;
    w.kind = it->second.kind;
    w.device = it->second.device;
    w.base = reinterpret_cast<const char *>(base);
    w.size = size;
    w.overrun = bytes > base + size - a;
    return w;
}

namespace {

void reg_add(void *p, size_t size, Mem kind, int device)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.reg_m);
    s.allocs[(uintptr_t)p] = Alloc{size, kind, device};
}

/* Removes the allocation that starts at p, if it has kind `kind`. */
bool reg_remove(void *p, Mem kind, Alloc *out)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.reg_m);
    auto it = s.allocs.find((uintptr_t)p);
    if (it == s.allocs.end() || it->second.kind != kind)
        return false;
    *out = it->second;
    s.allocs.erase(it);
    return true;
}

bool valid_device(int d)
{
    return d >= 0 && d < (int)state().devices.size();
}

cudaError_t device_alloc(void **p, size_t size, int device)
{
    if (!p)
        return cudaErrorInvalidValue;
    *p = nullptr;
    if (size == 0)
        return cudaSuccess;
    State &s = state();
    {
        std::lock_guard<std::mutex> g(s.m);
        Device &d = s.devices[(size_t)device];
        if (size > config().memory || d.used > config().memory - size)
            return cudaErrorMemoryAllocation;
        d.used += size;
    }
    void *m = malloc(size);
    if (!m) {
        std::lock_guard<std::mutex> g(s.m);
        s.devices[(size_t)device].used -= size;
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xff, size);
    reg_add(m, size, Mem::Device, device);
    *p = m;
    return cudaSuccess;
}

void device_release(void *p, const Alloc &a)
{
    State &s = state();
    {
        std::lock_guard<std::mutex> g(s.m);
        s.devices[(size_t)a.device].used -= a.size;
    }
    free(p);
}

} /* namespace */

/* ---- streams --------------------------------------------------------------------------------- */

bool ticket_done(const Ticket &t)
{
    return !t.stream || t.stream->completed >= t.seq;
}

namespace {

void stream_loop(Stream *st)
{
    State &s = state();
    std::unique_lock<std::mutex> g(s.m);
    for (;;) {
        s.cv.wait(g, [&] {
            if (st->queue.empty())
                return st->destroyed;
            if (st->holds > 0 || st->completed + st->queue.size() != st->queued)
                return false; /* held, or an operation run in its caller's thread is not done */
            for (const Ticket &t : st->queue.front().after)
                if (!ticket_done(t))
                    return false;
            return true;
        });
        if (st->queue.empty())
            return; /* destroyed and drained */
        Op op = std::move(st->queue.front());
        st->queue.pop_front();
        const bool skip = s.devices[(size_t)st->device].sticky != cudaSuccess;
        g.unlock();
        if (!skip) /* after a fault nothing else runs on the device, as on a real one */
            op.run();
        op = Op();
        g.lock();
        st->completed++;
        s.cv.notify_all();
    }
}

std::shared_ptr<Stream> new_stream(int device, bool blocking, bool legacy)
{
    auto st = std::make_shared<Stream>();
    st->device = device;
    st->blocking = blocking;
    st->legacy = legacy;
    std::thread([raw = st.get(), keep = st] { stream_loop(raw); }).detach();
    return st;
}

/* The legacy default stream of a device, made at first use. Lock held. */
std::shared_ptr<Stream> legacy_of(int device)
{
    Device &d = state().devices[(size_t)device];
    if (!d.legacy)
        d.legacy = new_stream(device, true, true);
    return d.legacy;
}

bool is_default(cudaStream_t s)
{
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

} /* namespace */

std::shared_ptr<Stream> stream_of(cudaStream_t s, cudaError_t *rc)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.m);
    *rc = cudaSuccess;
    if (is_default(s)) {
        if (!valid_device(tl_device)) {
            *rc = cudaErrorNoDevice;
            return nullptr;
        }
        return legacy_of(tl_device);
    }
    auto it = st.streams.find(s);
    if (it == st.streams.end()) {
        *rc = cudaErrorInvalidResourceHandle;
        return nullptr;
    }
    return it->second;
}

cudaError_t enqueue(cudaStream_t handle, Op op, Ticket *done, bool now)
{
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(handle, &rc);
    if (!s)
        return rc;
    State &st = state();
    std::unique_lock<std::mutex> g(st.m);
    if (s->legacy) {
        for (const auto &kv : st.streams) {
            const std::shared_ptr<Stream> &o = kv.second;
            if (o->device == s->device && o->blocking && o->queued > o->completed)
                op.after.push_back(Ticket{o, o->queued});
        }
        for (const std::shared_ptr<Stream> &o : st.retired) /* destroyed, their work still runs */
            if (o->device == s->device && o->blocking && o->queued > o->completed)
                op.after.push_back(Ticket{o, o->queued});
    } else if (s->blocking) {
        std::shared_ptr<Stream> l = legacy_of(s->device);
        if (l->queued > l->completed)
            op.after.push_back(Ticket{l, l->queued});
    }
    bool ready = now && s->queue.empty() && s->holds == 0 && s->completed == s->queued &&
                 st.devices[(size_t)s->device].sticky == cudaSuccess;
    for (const Ticket &t : op.after)
        ready = ready && ticket_done(t);
    const uint64_t seq = ++s->queued;
    if (done)
        *done = Ticket{s, seq};
    if (!ready) {
        s->queue.push_back(std::move(op));
        st.cv.notify_all();
        return cudaSuccess;
    }
    /* Nothing before it: run it here rather than wake the worker and wait for it (the stream
     * counts it as queued meanwhile, so nothing after it starts first). */
    g.unlock();
    op.run();
    op = Op();
    g.lock();
    s->completed++;
    st.cv.notify_all();
    return cudaSuccess;
}

namespace {

cudaError_t wait_ticket(const Ticket &t)
{
    State &s = state();
    std::unique_lock<std::mutex> g(s.m);
    s.cv.wait(g, [&] { return ticket_done(t); });
    return t.stream ? s.devices[(size_t)t.stream->device].sticky : cudaSuccess;
}

/* Waits for every stream of a device. */
cudaError_t drain(int device)
{
    State &s = state();
    std::unique_lock<std::mutex> g(s.m);
    s.cv.wait(g, [&] {
        for (const auto &kv : s.streams)
            if (kv.second->device == device && kv.second->completed < kv.second->queued)
                return false;
        for (const auto &r : s.retired)
            if (r->device == device && r->completed < r->queued)
                return false;
        const auto &l = s.devices[(size_t)device].legacy;
        return !l || l->completed >= l->queued;
    });
    return s.devices[(size_t)device].sticky;
}

/* The entry checks of most calls: a device, and no sticky error on it. */
cudaError_t usable()
{
    if (!valid_device(tl_device))
        return cudaErrorNoDevice;
    return sticky(tl_device);
}

#define EMU_CHECK(expr)                                                                            \
    do {                                                                                           \
        cudaError_t emu_rc_ = (expr);                                                              \
        if (emu_rc_ != cudaSuccess)                                                                \
            return set_error(emu_rc_);                                                             \
    } while (0)

} /* namespace */

/* ---- kernels --------------------------------------------------------------------------------- */

cudaError_t launch(Launch *l)
{
    struct Owner { /* the closure is freed whatever happens */
        Launch l;
        ~Owner() { l.destroy(l.closure); }
    };
    std::shared_ptr<Owner> owner(new Owner{*l});
    EMU_CHECK(usable());
    const dim3 b = l->block, gr = l->grid;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        (uint64_t)b.x * b.y * b.z > 1024 || gr.x == 0 || gr.y == 0 || gr.z == 0 || gr.x > 0x7fffffffu ||
        gr.y > 65535 || gr.z > 65535)
        return set_error(cudaErrorInvalidConfiguration);
    if (l->param_bytes > 32764)
        return set_error(cudaErrorInvalidValue);
    const int device = tl_device;
    Op op;
    op.what = "kernel";
    op.run = [owner, device]() {
        const Launch &k = owner->l;
        for (int i = 0; i < k.n_pointers; i++) {
            const void *p = k.pointers[i];
            if (!p)
                continue;
            const Where w = where(p, 0);
            if (w.kind == Mem::Host || (w.kind == Mem::Device && w.device != device)) {
                device_fault(device, cudaErrorIllegalAddress,
                             format("kernel %s (%s:%d): pointer argument %d (%p) is %s, not memory device %d can "
                                    "reach",
                                    k.name, k.file, k.line, i + 1, p,
                                    w.kind == Mem::Host ? "host memory" : format("device %d memory", w.device).c_str(),
                                    device));
                return cudaErrorIllegalAddress;
            }
        }
        std::string fault = run_launch(k, device);
        if (!fault.empty()) {
            device_fault(device, cudaErrorLaunchFailure, fault);
            return cudaErrorLaunchFailure;
        }
        return cudaSuccess;
    };
    EMU_CHECK(enqueue(l->stream, std::move(op)));
    return cudaSuccess;
}

} /* namespace prism_cudaemu */

using namespace prism_cudaemu;

/* ---- the C API ------------------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return set_error(cudaErrorInvalidValue);
    *count = config().devices;
    if (*count == 0)
        return set_error(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return set_error(cudaErrorInvalidValue);
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (config().devices == 0)
        return set_error(cudaErrorNoDevice);
    if (!valid_device(device))
        return set_error(cudaErrorInvalidDevice);
    tl_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return set_error(cudaErrorInvalidValue);
    if (config().devices == 0)
        return set_error(cudaErrorNoDevice);
    if (!valid_device(device))
        return set_error(cudaErrorInvalidDevice);
    const Config &c = config();
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "Prism emulated device %d (sm_%d%d)", device, c.cc_major, c.cc_minor);
    prop->totalGlobalMem = c.memory;
    prop->sharedMemPerBlock = 48 << 10;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 64 << 10;
    prop->major = c.cc_major;
    prop->minor = c.cc_minor;
    prop->multiProcessorCount = c.sms;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->sharedMemPerMultiprocessor = 228 << 10;
    prop->regsPerMultiprocessor = 65536;
    prop->unifiedAddressing = 1;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 2;
    prop->pciDeviceID = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return set_error(cudaErrorInvalidValue);
    if (config().devices == 0)
        return set_error(cudaErrorNoDevice);
    if (!valid_device(device))
        return set_error(cudaErrorInvalidDevice);
    const Config &c = config();
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = c.sms; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *value = c.cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = c.cc_minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrConcurrentKernels: *value = 1; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    default: return set_error(cudaErrorNotSupported); /* an attribute the emulation does not model */
    }
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    const cudaError_t s = valid_device(tl_device) ? sticky(tl_device) : cudaSuccess;
    if (s != cudaSuccess)
        return s;
    const cudaError_t rc = tl_error;
    tl_error = cudaSuccess;
    return rc;
}

cudaError_t cudaPeekAtLastError(void)
{
    const cudaError_t s = valid_device(tl_device) ? sticky(tl_device) : cudaSuccess;
    return s != cudaSuccess ? s : tl_error;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    default: return "unknown error";
    }
}

cudaError_t cudaDeviceSynchronize(void)
{
    EMU_CHECK(valid_device(tl_device) ? cudaSuccess : cudaErrorNoDevice);
    return set_error(drain(tl_device));
}

cudaError_t cudaDeviceReset(void)
{
    EMU_CHECK(valid_device(tl_device) ? cudaSuccess : cudaErrorNoDevice);
    const int device = tl_device;
    (void)drain(device);
    State &s = state();
    std::vector<std::pair<void *, Alloc>> gone;
    {
        std::lock_guard<std::mutex> g(s.reg_m);
        for (auto it = s.allocs.begin(); it != s.allocs.end();) {
            if (it->second.device == device && it->second.kind == Mem::Device) {
                gone.emplace_back(reinterpret_cast<void *>(it->first), it->second);
                it = s.allocs.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto &p : gone)
        device_release(p.first, p.second);
    std::lock_guard<std::mutex> g(s.m);
    s.devices[(size_t)device].sticky = cudaSuccess;
    s.devices[(size_t)device].fault.clear();
    tl_error = cudaSuccess;
    return cudaSuccess;
}

/* ---- memory ---------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t size)
{
    EMU_CHECK(usable());
    return set_error(device_alloc(p, size, tl_device));
}

cudaError_t cudaFree(void *p)
{
    EMU_CHECK(usable());
    if (!p)
        return cudaSuccess;
    const Where w = where(p, 0);
    if (w.kind != Mem::Device || w.base != p)
        return set_error(cudaErrorInvalidValue);
    (void)drain(w.device); /* cudaFree waits for the device, so no queued work reads freed memory */
    Alloc a;
    if (!reg_remove(p, Mem::Device, &a))
        return set_error(cudaErrorInvalidValue);
    device_release(p, a);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t stream)
{
    EMU_CHECK(usable());
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(stream, &rc);
    if (!s)
        return set_error(rc);
    return set_error(device_alloc(p, size, s->device));
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t stream)
{
    EMU_CHECK(usable());
    if (!p)
        return cudaSuccess;
    const Where w = where(p, 0);
    if (w.kind != Mem::Device || w.base != p)
        return set_error(cudaErrorInvalidValue);
    Op op;
    op.what = "cudaFreeAsync";
    op.run = [p]() {
        Alloc a;
        if (reg_remove(p, Mem::Device, &a))
            device_release(p, a);
        return cudaSuccess;
    };
    return set_error(enqueue(stream, std::move(op)));
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
    EMU_CHECK(usable());
    if (!p)
        return set_error(cudaErrorInvalidValue);
    *p = malloc(size ? size : 1);
    if (!*p)
        return set_error(cudaErrorMemoryAllocation);
    reg_add(*p, size, Mem::Pinned, tl_device);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return set_error(cudaErrorInvalidValue);
    return cudaMallocHost(p, size);
}

cudaError_t cudaFreeHost(void *p)
{
    EMU_CHECK(usable());
    if (!p)
        return cudaSuccess;
    const Where w = where(p, 0);
    if (w.kind != Mem::Pinned || w.base != p)
        return set_error(cudaErrorInvalidValue);
    for (int d = 0; d < config().devices; d++)
        (void)drain(d); /* as cudaFree: no queued copy reads it any more */
    Alloc a;
    if (!reg_remove(p, Mem::Pinned, &a))
        return set_error(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    EMU_CHECK(usable());
    if (!free_bytes || !total)
        return set_error(cudaErrorInvalidValue);
    State &s = state();
    std::lock_guard<std::mutex> g(s.m);
    *total = config().memory;
    *free_bytes = config().memory - s.devices[(size_t)tl_device].used;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
    if (!attr)
        return set_error(cudaErrorInvalidValue);
    const Where w = where(p, 0);
    memset(attr, 0, sizeof *attr);
    attr->device = w.device < 0 ? tl_device : w.device;
    switch (w.kind) {
    case Mem::Host: attr->type = cudaMemoryTypeUnregistered; break;
    case Mem::Pinned:
        attr->type = cudaMemoryTypeHost;
        attr->hostPointer = const_cast<void *>(p);
        attr->devicePointer = const_cast<void *>(p);
        break;
    case Mem::Device:
        attr->type = cudaMemoryTypeDevice;
        attr->devicePointer = const_cast<void *>(p);
        break;
    }
    return cudaSuccess;
}

namespace {

/* The checks of a copy: the kind against where the pointers are, and both ranges inside their
 * allocations. *pageable: a side is pageable host memory (then the copy is synchronous). */
cudaError_t copy_check(void *dst, const void *src, size_t count, cudaMemcpyKind kind, bool *pageable)
{
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    const Where d = where(dst, count), s = where(src, count);
    if (d.overrun || s.overrun)
        return cudaErrorInvalidValue;
    const bool d_dev = d.kind == Mem::Device, s_dev = s.kind == Mem::Device;
    switch (kind) {
    case cudaMemcpyHostToHost:
        if (d_dev || s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyHostToDevice:
        if (!d_dev || s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToHost:
        if (d_dev || !s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToDevice:
        if (!d_dev || !s_dev)
            return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    *pageable = d.kind == Mem::Host || s.kind == Mem::Host;
    return cudaSuccess;
}

cudaError_t copy(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool sync)
{
    EMU_CHECK(usable());
    bool pageable = false;
    EMU_CHECK(copy_check(dst, src, count, kind, &pageable));
    if (count == 0)
        return cudaSuccess;
    Op op;
    op.what = "memcpy";
    op.run = [dst, src, count]() {
        memmove(dst, src, count);
        return cudaSuccess;
    };
    Ticket t;
    EMU_CHECK(enqueue(stream, std::move(op), &t, sync || pageable));
    /* Pageable memory: the real runtime stages it before returning (host to device) or returns
     * once the copy is done (device to host); either way the caller may reuse it at once. */
    if (sync || pageable)
        EMU_CHECK(wait_ticket(t));
    return cudaSuccess;
}

cudaError_t fill(void *p, int value, size_t count, cudaStream_t stream, bool sync)
{
    EMU_CHECK(usable());
    if (count == 0)
        return cudaSuccess;
    const Where w = where(p, count);
    if (w.kind != Mem::Device || w.overrun)
        return set_error(cudaErrorInvalidValue);
    Op op;
    op.what = "memset";
    op.run = [p, value, count]() {
        memset(p, value, count);
        return cudaSuccess;
    };
    Ticket t;
    EMU_CHECK(enqueue(stream, std::move(op), &t, sync));
    if (sync)
        EMU_CHECK(wait_ticket(t));
    return cudaSuccess;
}

} /* namespace */

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return copy(dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy(dst, src, count, kind, stream, false);
}

cudaError_t cudaMemset(void *p, int value, size_t count)
{
    return fill(p, value, count, nullptr, true);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    return fill(p, value, count, stream, false);
}

/* ---- streams --------------------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    EMU_CHECK(usable());
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return set_error(cudaErrorInvalidValue);
    std::shared_ptr<Stream> s = new_stream(tl_device, !(flags & cudaStreamNonBlocking), false);
    State &st = state();
    std::lock_guard<std::mutex> g(st.m);
    *out = reinterpret_cast<cudaStream_t>(s.get());
    st.streams[s.get()] = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (is_default(stream))
        return set_error(cudaErrorInvalidResourceHandle);
    State &st = state();
    std::lock_guard<std::mutex> g(st.m);
    auto it = st.streams.find(stream);
    if (it == st.streams.end())
        return set_error(cudaErrorInvalidResourceHandle);
    /* Queued work still runs; the worker ends once it has. */
    it->second->destroyed = true;
    /* Forget the destroyed streams that have finished; keep this one until it has. */
    std::vector<std::shared_ptr<Stream>> keep;
    for (auto &r : st.retired)
        if (r->completed < r->queued)
            keep.push_back(r);
    st.retired.swap(keep);
    st.retired.push_back(it->second);
    st.streams.erase(it);
    st.cv.notify_all();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    EMU_CHECK(valid_device(tl_device) ? cudaSuccess : cudaErrorNoDevice);
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(stream, &rc);
    if (!s)
        return set_error(rc);
    Ticket t;
    {
        std::lock_guard<std::mutex> g(state().m);
        t = Ticket{s, s->queued};
    }
    return set_error(wait_ticket(t));
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    EMU_CHECK(usable());
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(stream, &rc);
    if (!s)
        return set_error(rc);
    std::lock_guard<std::mutex> g(state().m);
    return s->completed >= s->queued ? cudaSuccess : cudaErrorNotReady;
}

/* ---- events ---------------------------------------------------------------------------------- */

namespace {

std::shared_ptr<Event> event_of(cudaEvent_t e)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.m);
    auto it = s.events.find(e);
    return it == s.events.end() ? nullptr : it->second;
}

} /* namespace */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    EMU_CHECK(usable());
    if (!out || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return set_error(cudaErrorInvalidValue);
    auto e = std::make_shared<Event>();
    e->device = tl_device;
    e->flags = flags;
    State &s = state();
    std::lock_guard<std::mutex> g(s.m);
    *out = reinterpret_cast<cudaEvent_t>(e.get());
    s.events[e.get()] = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out)
{
    return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    State &s = state();
    std::lock_guard<std::mutex> g(s.m);
    if (!s.events.erase(e))
        return set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    EMU_CHECK(usable());
    std::shared_ptr<Event> e = event_of(event);
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(state().m);
        gen = ++e->generation;
        e->timed = false; /* until the stream gets to this record (the operation may run at once) */
    }
    Op op;
    op.what = "event";
    op.run = [e, gen]() {
        std::lock_guard<std::mutex> g(state().m);
        if (e->generation == gen) {
            e->time = now();
            e->timed = true;
        }
        return cudaSuccess;
    };
    Ticket t;
    EMU_CHECK(enqueue(stream, std::move(op), &t));
    std::lock_guard<std::mutex> g(state().m);
    if (e->generation == gen) {
        e->ticket = t;
        e->recorded = true;
    }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    EMU_CHECK(usable());
    std::shared_ptr<Event> e = event_of(event);
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> g(state().m);
    if (!e->recorded || ticket_done(e->ticket))
        return cudaSuccess;
    return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    EMU_CHECK(usable());
    std::shared_ptr<Event> e = event_of(event);
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    Ticket t;
    {
        std::lock_guard<std::mutex> g(state().m);
        if (!e->recorded)
            return cudaSuccess;
        t = e->ticket;
    }
    return set_error(wait_ticket(t));
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    EMU_CHECK(usable());
    if (!ms)
        return set_error(cudaErrorInvalidValue);
    std::shared_ptr<Event> a = event_of(start), b = event_of(end);
    if (!a || !b)
        return set_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> g(state().m);
    if ((a->flags | b->flags) & cudaEventDisableTiming)
        return set_error(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded)
        return set_error(cudaErrorInvalidResourceHandle);
    if (!ticket_done(a->ticket) || !ticket_done(b->ticket) || !a->timed || !b->timed)
        return cudaErrorNotReady;
    *ms = (float)((b->time - a->time) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    EMU_CHECK(usable());
    if (flags != 0)
        return set_error(cudaErrorInvalidValue);
    std::shared_ptr<Event> e = event_of(event);
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    Op op;
    op.what = "wait";
    {
        std::lock_guard<std::mutex> g(state().m);
        if (!e->recorded)
            return cudaSuccess; /* waiting for an event never recorded waits for nothing */
        op.after.push_back(e->ticket);
    }
    op.run = []() { return cudaSuccess; };
    return set_error(enqueue(stream, std::move(op)));
}

/* ---- the emulation's own hooks (prism_cudaemu.h) ----------------------------------------------- */

cudaError_t prism_cudaemu_stream_hold(cudaStream_t stream)
{
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(stream, &rc);
    if (!s)
        return rc;
    std::lock_guard<std::mutex> g(state().m);
    s->holds++;
    return cudaSuccess;
}

cudaError_t prism_cudaemu_stream_release(cudaStream_t stream)
{
    cudaError_t rc;
    std::shared_ptr<Stream> s = stream_of(stream, &rc);
    if (!s)
        return rc;
    std::lock_guard<std::mutex> g(state().m);
    if (s->holds == 0)
        return cudaErrorInvalidValue;
    s->holds--;
    state().cv.notify_all();
    return cudaSuccess;
}

const char *prism_cudaemu_last_fault(int device)
{
    if (!valid_device(device))
        return "";
    std::lock_guard<std::mutex> g(state().m);
    return state().devices[(size_t)device].fault.c_str();
}

unsigned long long prism_cudaemu_fault_count(void)
{
    return state().faults.load();
}

size_t prism_cudaemu_device_bytes_in_use(int device)
{
    if (!valid_device(device))
        return 0;
    std::lock_guard<std::mutex> g(state().m);
    return state().devices[(size_t)device].used;
}

} /* extern "C" */
