/* Running kernels: the blocks of a launch on a pool of worker threads, the threads of a block as
 * fibers on one worker, and the block's synchronisation points.
 *
 * A worker runs one block at a time to its end. Its fibers run in turn: each runs until it
 * reaches a barrier, a warp operation that not all its lanes have reached, or its end, and the
 * scheduler then continues with the next fiber that can run. The last thread to arrive at a
 * barrier or warp operation completes it for all, so an operation's inputs are never overwritten
 * before everyone has read them. A block in which no fiber can run but some have not ended is a
 * hang, and reported as such: where every thread waits.
 *
 * Faults (CUDA's undefined behaviour that the emulation can see) end the block at once; the
 * launch's other blocks are skipped and the stream's device gets a sticky
 * cudaErrorLaunchFailure with the report, as a real device's failed kernel would.
 *
 * Under ThreadSanitizer each emulated thread is a TSan fiber, switched to without implied
 * synchronisation; the only happens-before edges between the threads of a block are those CUDA
 * gives: __syncthreads and __syncwarp (release on arrival, acquire on leaving). A missing
 * barrier therefore shows as a data race on the memory it should have ordered. The blocks of one
 * worker are ordered one after the other (their __shared__ memory and stacks are reused). */
#include "fiber.h"
#include "internal.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace prism_cudaemu {

__thread Regs *tl_regs;

namespace {

enum class St : unsigned char { Runnable, Barrier, Warp, Exited };

const char *op_name(WarpOp op)
{
    switch (op) {
    case kShflIdx: return "__shfl_sync";
    case kShflUp: return "__shfl_up_sync";
    case kShflDown: return "__shfl_down_sync";
    case kShflXor: return "__shfl_xor_sync";
    case kVoteAny: return "__any_sync";
    case kVoteAll: return "__all_sync";
    case kVoteBallot: return "__ballot_sync";
    case kSyncWarp: return "__syncwarp";
    }
    return "?";
}

struct Block;

struct Fiber {
    Regs regs;
    prism_fiber *ctx = nullptr;
    char *stack = nullptr; /* usable stack, above a guard page */
    size_t stack_size = 0;
    void *tsan = nullptr;
    void *asan_fake = nullptr;
    St state = St::Runnable;
    unsigned linear = 0, lane = 0, warp = 0;
    const char *file = nullptr; /* where it waits */
    int line = 0;
    WarpOp op = kSyncWarp;
    unsigned mask = 0, arg = 0;
    int width = 32;
    uint64_t value = 0, result = 0;
};

/* Lanes of one warp waiting at one warp operation with one mask. */
struct Group {
    WarpOp op;
    unsigned mask, arrived;
    const char *file;
    int line;
};

/* A warp's lanes that exist (the block may end mid-warp) and have exited, and the groups of its
 * lanes that wait at warp operations (at most one per lane: masks of waiting groups are
 * disjoint). */
struct WarpState {
    unsigned exists, exited;
    int count;
    Group groups[32];
};

struct Block {
    const Launch *launch;
    int device;
    uint3 idx;
    unsigned n;
    Fiber *fibers;
    unsigned exited = 0, at_barrier = 0;
    bool faulted = false;
    std::string fault;
    WarpState *warps;
    unsigned generation = 0;
    char barrier_sync[2];                 /* TSan sync objects: addresses only */
    char warp_sync[32][32][2];            /* per warp, per lowest lane of the mask, parity */
    unsigned warp_parity[32][32] = {};
    char *launch_sync;                    /* the launch's: start (acquired) and end (released) */
    char abandon_sync = 0;                /* released by every switch out of a fiber */
};

struct Worker {
    prism_fiber *main = nullptr;
    void *main_tsan = nullptr;
    void *main_fake = nullptr;
    const void *main_bottom = nullptr;
    size_t main_size = 0;
    std::vector<Fiber> fibers;
    WarpState warps[32];
    Block *block = nullptr;
    Fiber *current = nullptr;
    char retire_sync = 0; /* TSan: the blocks of this worker come one after the other */

    ~Worker()
    {
        for (Fiber &f : fibers) {
            if (f.ctx)
                prism_fiber_destroy(f.ctx);
            if (f.tsan && __tsan_destroy_fiber)
                __tsan_destroy_fiber(f.tsan);
            if (f.stack)
                munmap(f.stack - page(), f.stack_size + page());
        }
        if (main)
            prism_fiber_destroy(main);
    }
    static size_t page()
    {
        static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
        return p;
    }
};

/* The worker of this thread: a plain pointer for the hot paths, owned by tl_worker_owner, which
 * frees it when the thread ends. */
__thread Worker *tl_worker;
thread_local std::unique_ptr<Worker> tl_worker_owner;

Worker *worker()
{
    if (!tl_worker) {
        tl_worker_owner.reset(new Worker);
        tl_worker = tl_worker_owner.get();
        tl_worker->main = prism_fiber_self();
        tl_worker->fibers.reserve(1024); /* never moved: each fiber's context points at it */
    }
    return tl_worker;
}

void fiber_entry(void *arg);

/* Into fiber f from the worker's own context, until f yields or ends. */
void switch_in(Worker *w, Fiber *f)
{
    tl_regs = &f->regs;
    w->current = f;
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(&w->main_fake, f->stack, f->stack_size);
    if (f->tsan)
        __tsan_switch_to_fiber(f->tsan, 1 /* __tsan_switch_to_fiber_no_sync */);
    prism_fiber_switch(w->main, f->ctx);
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(w->main_fake, nullptr, nullptr);
    w->current = nullptr;
    tl_regs = nullptr;
}

/* Back to the worker's context; returns when the scheduler switches to f again. `last`: f has
 * ended and never runs again. */
void switch_out(Worker *w, Fiber *f, bool last)
{
    /* Should the block fault, the worker takes over what its threads did up to their last
     * switch (run_block), so that its clean-up is ordered after them; no fiber acquires this. */
    if (w->block)
        tsan_release(&w->block->abandon_sync);
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(last ? nullptr : &f->asan_fake, w->main_bottom, w->main_size);
    if (w->main_tsan)
        __tsan_switch_to_fiber(w->main_tsan, 1);
    prism_fiber_switch(f->ctx, w->main);
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(f->asan_fake, &w->main_bottom, &w->main_size);
}

Fiber *self()
{
    Worker *w = tl_worker;
    if (!w || !w->current) {
        fprintf(stderr, "prism-cudaemu: a device function was called outside a kernel\n");
        abort();
    }
    return w->current;
}

/* Ends the block with a report (printf-style); never returns: the fiber is abandoned, so nothing
 * with a destructor may live on its stack here, which is why the report is formatted straight
 * into the block. */
[[noreturn]] __attribute__((format(printf, 2, 3))) void fault(Fiber *f, const char *fmt, ...)
{
    Worker *w = tl_worker;
    Block *b = w->block;
    if (!b->faulted) {
        b->faulted = true;
        char head[96], what[768];
        snprintf(head, sizeof head, "block (%u,%u,%u) thread (%u,%u,%u): ", b->idx.x, b->idx.y, b->idx.z,
                 f->regs.thread_idx.x, f->regs.thread_idx.y, f->regs.thread_idx.z);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        b->fault.assign(head).append(what);
    }
    /* What this thread did is ordered before the worker's report and the launch's end. */
    tsan_release(&w->retire_sync);
    tsan_release(b->launch_sync + 1);
    for (;;)
        switch_out(w, f, false);
}

/* The waits of a block that cannot go on, for a hang's report. */
std::string waits(const Block *b)
{
    std::map<std::string, unsigned> at;
    for (unsigned i = 0; i < b->n; i++) {
        const Fiber &f = b->fibers[i];
        if (f.state == St::Barrier)
            at[format("__syncthreads at %s:%d", f.file, f.line)]++;
        else if (f.state == St::Warp)
            at[format("%s at %s:%d (mask 0x%08x, warp %u)", op_name(f.op), f.file, f.line, f.mask, f.warp)]++;
    }
    std::string s;
    for (const auto &kv : at)
        s += format("%s%u threads wait at %s", s.empty() ? "" : "; ", kv.second, kv.first.c_str());
    return s;
}

/* Releases the threads at the barrier once all have arrived (called by the last one). */
void barrier_complete(Block *b, Fiber *last)
{
    const char *file = last->file;
    int line = last->line;
    for (unsigned i = 0; i < b->n; i++) {
        const Fiber &f = b->fibers[i];
        if (f.line != line || strcmp(f.file, file) != 0)
            fault(last, "threads of the block wait at different barriers: __syncthreads at %s:%d "
                               "and at %s:%d (a barrier must be the same one for every thread)",
                               f.file, f.line, file, line);
    }
    b->at_barrier = 0;
    b->generation++;
    for (unsigned i = 0; i < b->n; i++)
        b->fibers[i].state = St::Runnable;
}

uint64_t group_result(Block *b, unsigned warp, const Fiber *t, Fiber *caller)
{
    const unsigned i = t->lane;
    const unsigned mask = t->mask;
    Fiber *lanes = b->fibers + (size_t)warp * 32;
    switch (t->op) {
    case kVoteAny:
    case kVoteAll:
    case kVoteBallot: {
        unsigned ballot = 0;
        for (unsigned l = 0; l < 32; l++)
            if ((mask >> l & 1u) && lanes[l].value)
                ballot |= 1u << l;
        if (t->op == kVoteBallot)
            return ballot;
        if (t->op == kVoteAny)
            return ballot != 0;
        return ballot == mask;
    }
    case kSyncWarp:
        return 0;
    default:
        break;
    }
    /* shfl.sync of PTX ISA: b = arg[4:0]; c = ((32 - width) << 8) | (up ? 0 : 31). */
    const int bval = (int)(t->arg & 31u);
    const int segmask = (32 - t->width) & 31;
    const int cval = t->op == kShflUp ? 0 : 31;
    const int lane = (int)i;
    const int max_lane = (lane & segmask) | (cval & ~segmask);
    const int min_lane = lane & segmask;
    int j = lane;
    bool pval = false;
    switch (t->op) {
    case kShflUp: j = lane - bval; pval = j >= max_lane; break;
    case kShflDown: j = lane + bval; pval = j <= max_lane; break;
    case kShflXor: j = lane ^ bval; pval = j <= max_lane; break;
    default: j = min_lane | (bval & ~segmask); pval = j <= max_lane; break;
    }
    if (!pval)
        j = lane; /* out of the lane's segment: its own value */
    if (!(mask >> j & 1u))
        fault(caller, "%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x "
                             "(its value is undefined)",
                             op_name(t->op), t->file, t->line, lane, j, mask);
    return lanes[j].value;
}

} /* namespace */

void syncthreads(const char *file, int line)
{
    Fiber *f = self();
    Worker *w = tl_worker;
    Block *b = w->block;
    if (b->exited)
        for (unsigned i = 0; i < b->n; i++)
            if (b->fibers[i].state == St::Exited)
                fault(f, "__syncthreads at %s:%d: thread (%u,%u,%u) exited before reaching it (every thread of "
                                "the block must reach each barrier)",
                      file, line, b->fibers[i].regs.thread_idx.x, b->fibers[i].regs.thread_idx.y,
                      b->fibers[i].regs.thread_idx.z);
    f->file = file;
    f->line = line;
    f->state = St::Barrier;
    char *sync = &b->barrier_sync[b->generation & 1];
    tsan_release(sync);
    if (++b->at_barrier == b->n)
        barrier_complete(b, f);
    else
        switch_out(w, f, false);
    tsan_acquire(sync);
}

uint64_t warp_op(const char *file, int line, WarpOp op, unsigned mask, uint64_t value, unsigned arg, int width)
{
    Fiber *f = self();
    Worker *w = tl_worker;
    Block *b = w->block;
    const unsigned warp = f->warp, lane = f->lane;
    if (!(mask >> lane & 1u))
        fault(f, "%s at %s:%d: the mask 0x%08x does not name the calling lane %u", op_name(op), file, line,
                        mask, lane);
    if (op <= kShflXor && (width < 1 || width > 32 || (width & (width - 1)) != 0))
        fault(f, "%s at %s:%d: width %d is not a power of two from 1 to 32", op_name(op), file, line, width);
    WarpState &ws = b->warps[warp];
    if (mask & ~ws.exists)
        fault(f, "%s at %s:%d: the mask 0x%08x names lane %d, which does not exist (the block has %u "
                        "threads)",
                        op_name(op), file, line, mask, __builtin_ctz(mask & ~ws.exists), b->n);
    if (mask & ws.exited)
        fault(f, "%s at %s:%d: the mask 0x%08x names lane %d, which has exited", op_name(op), file, line,
                        mask, __builtin_ctz(mask & ws.exited));
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;

    Group *g = nullptr;
    for (int gi = 0; gi < ws.count; gi++) {
        Group &h = ws.groups[gi];
        if (h.mask == mask) {
            if (h.op != op)
                fault(f, "lanes of mask 0x%08x meet at different warp operations: %s at %s:%d and %s at "
                                "%s:%d",
                                mask, op_name(h.op), h.file, h.line, op_name(op), file, line);
            g = &h;
        }
    }
    if (!g) {
        g = &ws.groups[ws.count++];
        *g = Group{op, mask, 0, file, line};
    }
    g->arrived |= 1u << lane;
    const unsigned low = (unsigned)__builtin_ctz(mask);
    char *sync = &b->warp_sync[warp][low][b->warp_parity[warp][low] & 1];
    if (op == kSyncWarp)
        tsan_release(sync);
    if (g->arrived == mask) {
        Fiber *lanes = b->fibers + (size_t)warp * 32;
        for (unsigned l = 0; l < 32; l++)
            if (mask >> l & 1u)
                lanes[l].result = group_result(b, warp, &lanes[l], f);
        for (unsigned l = 0; l < 32; l++)
            if (mask >> l & 1u)
                lanes[l].state = St::Runnable;
        b->warp_parity[warp][low]++;
        *g = ws.groups[--ws.count]; /* the order of waiting groups does not matter */
    } else {
        f->state = St::Warp;
        switch_out(w, f, false);
    }
    if (op == kSyncWarp)
        tsan_acquire(sync);
    return f->result;
}

unsigned active_mask()
{
    Fiber *f = self();
    const WarpState &ws = tl_worker->block->warps[f->warp];
    return ws.exists & ~ws.exited;
}

namespace {

/* The end of a thread: what waits for it can never complete. */
void thread_exit(Worker *w, Fiber *f)
{
    Block *b = w->block;
    f->state = St::Exited;
    b->exited++;
    b->warps[f->warp].exited |= 1u << f->lane;
    if (b->at_barrier)
        for (unsigned i = 0; i < b->n; i++)
            if (b->fibers[i].state == St::Barrier)
                fault(f, "exited while %u threads wait at __syncthreads at %s:%d (every thread of the "
                                "block must reach each barrier)",
                                b->at_barrier, b->fibers[i].file, b->fibers[i].line);
    const WarpState &ws = b->warps[f->warp];
    for (int gi = 0; gi < ws.count; gi++)
        if (const Group &g = ws.groups[gi]; g.mask >> f->lane & 1u)
            fault(f, "exited while lanes 0x%08x wait for it at %s at %s:%d (mask 0x%08x)", g.arrived,
                            op_name(g.op), g.file, g.line, g.mask);
}

void fiber_entry(void *arg)
{
    Fiber *f = static_cast<Fiber *>(arg);
    Worker *w = tl_worker;
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(nullptr, &w->main_bottom, &w->main_size);
    Block *b = w->block;
    tsan_acquire(&w->retire_sync);
    tsan_acquire(b->launch_sync);
    b->launch->run(b->launch->closure);
    thread_exit(w, f);
    tsan_release(&w->retire_sync);
    tsan_release(b->launch_sync + 1);
    switch_out(w, f, true);
    abort(); /* an ended fiber is never switched to again */
}

bool prepare(Worker *w, unsigned n, std::string *why)
{
    const size_t page = Worker::page();
    const size_t size = (config().stack + page - 1) / page * page;
    while (w->fibers.size() < n) {
        w->fibers.emplace_back();
        Fiber &f = w->fibers.back();
        void *m = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) {
            w->fibers.pop_back();
            *why = "out of memory for the stacks of a block";
            return false;
        }
        mprotect(m, page, PROT_NONE); /* a guard page below: an overflow faults */
        f.stack = static_cast<char *>(m) + page;
        f.stack_size = size;
        f.ctx = prism_fiber_create(f.stack, f.stack_size, fiber_entry, &f);
        if (!f.ctx) {
            *why = "out of memory for a fiber";
            return false;
        }
        if (tsan_on())
            f.tsan = __tsan_create_fiber(0);
    }
    if (tsan_on() && !w->main_tsan)
        w->main_tsan = __tsan_get_current_fiber();
    return true;
}

/* Runs block `index` of the launch on this thread. "" or the fault's report. */
std::string run_block(const Launch &l, int device, uint64_t index, char *launch_sync)
{
    Worker *w = worker();
    const unsigned n = l.block.x * l.block.y * l.block.z;
    std::string why;
    if (!prepare(w, n, &why))
        return why;
    Block b;
    b.launch = &l;
    b.device = device;
    b.idx.x = (unsigned)(index % l.grid.x);
    b.idx.y = (unsigned)(index / l.grid.x % l.grid.y);
    b.idx.z = (unsigned)(index / ((uint64_t)l.grid.x * l.grid.y));
    b.n = n;
    b.fibers = w->fibers.data();
    b.warps = w->warps;
    for (unsigned wi = 0; wi < (n + 31) / 32; wi++) {
        const unsigned lanes = n - wi * 32 < 32 ? n - wi * 32 : 32;
        w->warps[wi].exists = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
        w->warps[wi].exited = 0;
        w->warps[wi].count = 0;
    }
    b.launch_sync = launch_sync;
    for (unsigned i = 0; i < n; i++) {
        Fiber &f = w->fibers[i];
        f.regs.thread_idx.x = i % l.block.x;
        f.regs.thread_idx.y = i / l.block.x % l.block.y;
        f.regs.thread_idx.z = i / (l.block.x * l.block.y);
        f.regs.block_idx = b.idx;
        f.regs.block_dim = l.block;
        f.regs.grid_dim = l.grid;
        f.linear = i;
        f.lane = i % 32;
        f.warp = i / 32;
        f.state = St::Runnable;
        f.asan_fake = nullptr;
        prism_fiber_reset(f.ctx, fiber_entry, &f);
    }
    w->block = &b;
    for (;;) {
        bool ran = false;
        for (unsigned i = 0; i < n && !b.faulted; i++) {
            if (w->fibers[i].state == St::Runnable) {
                switch_in(w, &w->fibers[i]);
                ran = true;
            }
        }
        if (b.faulted || b.exited == n)
            break;
        if (!ran) {
            b.faulted = true;
            b.fault = format("block (%u,%u,%u) hangs: %s", b.idx.x, b.idx.y, b.idx.z, waits(&b).c_str());
            break;
        }
    }
    w->block = nullptr;
    if (b.faulted) {
        tsan_acquire(&w->retire_sync); /* the faulting fiber's report (fault() released it) */
        tsan_acquire(&b.abandon_sync); /* and what the threads it abandons did */
        tsan_release(b.launch_sync + 1);
        /* The fibers that did not end are abandoned: their stacks are clean for the next block,
         * and under TSan they get fresh fibers (an abandoned one keeps its frames). */
        for (unsigned i = 0; i < n; i++) {
            Fiber &f = w->fibers[i];
            if (__asan_unpoison_memory_region)
                __asan_unpoison_memory_region(f.stack, f.stack_size);
            if (f.tsan && f.state != St::Exited) {
                __tsan_destroy_fiber(f.tsan);
                f.tsan = __tsan_create_fiber(0);
            }
        }
    }
    return b.fault;
}

/* ---- the pool of workers --------------------------------------------------------------------- */

struct Run {
    const Launch *l;
    int device;
    uint64_t blocks;
    std::atomic<uint64_t> next{0};
    uint64_t done = 0; /* under lock() */
    std::atomic<bool> faulted{false};
    std::string fault;
    char sync[2] = {0, 0};
};

void work(Run &r, uint64_t i);

struct Pool {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Run>> runs;
    std::vector<std::thread> threads;
    bool stop = false;

    Pool()
    {
        for (int i = 0; i < config().workers; i++)
            threads.emplace_back([this] { loop(); });
    }
    ~Pool()
    {
        {
            std::lock_guard<std::mutex> g(m);
            stop = true;
        }
        cv.notify_all();
        for (std::thread &t : threads)
            t.join();
    }
    void loop()
    {
        std::unique_lock<std::mutex> g(m);
        for (;;) {
            cv.wait(g, [this] { return stop || !runs.empty(); });
            if (stop)
                return;
            std::shared_ptr<Run> r = runs.front();
            const uint64_t i = r->next++;
            if (i >= r->blocks) {
                if (!runs.empty() && runs.front() == r)
                    runs.pop_front();
            } else {
                g.unlock();
                work(*r, i);
                g.lock();
            }
            drop(std::move(r));
        }
    }
    /* A worker lets go of a run under lock(), where the launching thread last reads it (and
     * writes its fault): when the worker's reference is the last, the run is freed after those
     * accesses in an order ThreadSanitizer sees. GCC 12's shared_ptr frees on a last release
     * that it detects with a double-word atomic load, which TSan does not take as the acquire it
     * is, and reported the free as racing with the launcher's writes. */
    static void drop(std::shared_ptr<Run> r)
    {
        std::lock_guard<std::mutex> g(lock());
        r.reset();
    }
};

void work(Run &r, uint64_t i)
{
    if (!r.faulted) {
        std::string f = run_block(*r.l, r.device, i, r.sync);
        if (!f.empty()) {
            std::lock_guard<std::mutex> g(lock());
            if (!r.faulted) {
                r.fault = f;
                r.faulted = true;
            }
        }
    }
    std::lock_guard<std::mutex> g(lock());
    r.done++;
    changed().notify_all();
}

Pool &pool()
{
    static Pool p;
    return p;
}

} /* namespace */

std::string run_launch(const Launch &l, int device)
{
    auto r = std::make_shared<Run>();
    r->l = &l;
    r->device = device;
    r->blocks = (uint64_t)l.grid.x * l.grid.y * l.grid.z;
    tsan_release(&r->sync[0]);
    if (r->blocks >= 4) { /* fewer: the pool's wake-ups would cost more than they save */
        Pool &p = pool();
        {
            std::lock_guard<std::mutex> g(p.m);
            p.runs.push_back(r);
        }
        p.cv.notify_all();
    }
    for (uint64_t i; (i = r->next++) < r->blocks;)
        work(*r, i);
    {
        std::unique_lock<std::mutex> g(lock());
        changed().wait(g, [&] { return r->done == r->blocks; });
    }
    tsan_acquire(&r->sync[1]);
    std::lock_guard<std::mutex> g(lock());
    return r->fault.empty() ? std::string()
                            : format("kernel %s (%s:%d), ", l.name, l.file, l.line) + r->fault;
}

} /* namespace prism_cudaemu */
