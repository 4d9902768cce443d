/* NCCL's subset that Prism calls, for ranks that are threads of one process, each on an emulated
 * device of its own (as NCCL requires one rank per GPU). A communicator's calls are operations on
 * the stream they name, so they run when the stream gets there, like NCCL's kernels:
 *   collectives  each rank's call takes the communicator's next sequence number; the operations of
 *                one number meet, are checked to agree (same collective, count, type, operation),
 *                and the last to arrive moves the data for all of them
 *   send/recv    a send posts its buffer on the (sender, receiver) channel; the matching receive
 *                (the next on the channel) copies it, and the send completes once it has been
 *                read. Inside ncclGroupStart/End a rank's sends and receives are one operation
 *                that posts every send before it waits for any receive, so no order of calls
 *                deadlocks.
 * Disagreement between ranks (a mismatched collective, sizes that differ between a send and its
 * receive) is an asynchronous error: ncclCommGetAsyncError answers ncclInvalidUsage on every
 * communicator of the clique and ncclGetLastError says what differed; no data moves. */
#include "internal.h"

#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

struct ncclComm;

namespace prism_cudaemu {
namespace {

struct Clique;

struct Coll { /* one rank's part of one collective */
    int kind = 0; /* 1 all-gather, 2 all-reduce */
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclUint8;
    ncclRedOp_t redop = ncclSum;
};

struct Meeting {
    std::vector<Coll> parts;
    int arrived = 0;
    bool done = false;
};

struct Posting { /* a send waiting for its receive */
    const void *buf;
    size_t bytes;
    bool read = false;
};

struct Clique {
    int nranks = 0;
    int joined = 0;
    std::vector<int> devices;
    std::vector<ncclComm *> comms;
    std::map<uint64_t, Meeting> meetings;
    std::map<std::pair<int, int>, std::deque<std::shared_ptr<Posting>>> channels; /* (from, to) */
    ncclResult_t async = ncclSuccess;
    std::string last;
    bool failed_init = false;
};

struct P2p {
    bool send;
    int peer;
    const void *sbuf;
    void *rbuf;
    size_t bytes;
};

} /* namespace */
} /* namespace prism_cudaemu */

struct ncclComm {
    std::shared_ptr<prism_cudaemu::Clique> clique;
    int rank = 0;
    int device = 0;
    uint64_t next_coll = 0; /* under lock() */
    bool destroyed = false;
};

namespace prism_cudaemu {
namespace {

std::map<std::string, std::shared_ptr<Clique>> &pending_cliques()
{
    static auto *m = new std::map<std::string, std::shared_ptr<Clique>>;
    return *m;
}

thread_local int tl_group = 0;
thread_local std::map<ncclComm *, std::pair<cudaStream_t, std::vector<P2p>>> tl_p2p;

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

void fail(Clique *c, ncclResult_t rc, const std::string &why) /* lock held */
{
    if (c->async == ncclSuccess) {
        c->async = rc;
        c->last = why;
    }
}

ncclResult_t check_buffer(const ncclComm *comm, const void *p, size_t bytes, const char *what)
{
    if (bytes == 0)
        return ncclSuccess;
    const Where w = where(p, bytes);
    if (w.kind != Mem::Device || w.device != comm->device || w.overrun) {
        std::lock_guard<std::mutex> g(lock());
        comm->clique->last = format("%s %p is not %zu bytes of device %d memory", what, p, bytes, comm->device);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Element i of p as T: binary32 for bf16 (widened exactly). */
template <class T> T load(const void *p, size_t i, ncclDataType_t t)
{
    if (t == ncclBfloat16) {
        uint32_t u = (uint32_t) static_cast<const uint16_t *>(p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return (T)f;
    }
    T v;
    memcpy(&v, static_cast<const char *>(p) + i * sizeof(T), sizeof v);
    return v;
}

template <class T> T reduce(T a, T b, ncclRedOp_t op)
{
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a < b ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return (T)(a + b); /* ncclSum, and ncclAvg before its division */
    }
}

/* out[i] = the ranks' elements i reduced in rank order in T (binary32 for bf16, rounded to
 * nearest even at the end; AVG divides the sum once). */
template <class T> void reduce_all(const std::vector<Coll> &parts, std::vector<char> &out)
{
    const Coll &c0 = parts[0];
    for (size_t i = 0; i < c0.count; i++) {
        T acc = load<T>(parts[0].send, i, c0.type);
        for (size_t r = 1; r < parts.size(); r++)
            acc = reduce(acc, load<T>(parts[r].send, i, c0.type), c0.redop);
        if (c0.redop == ncclAvg)
            acc = (T)(acc / (T)parts.size());
        if (c0.type == ncclBfloat16) {
            float f = (float)acc;
            uint32_t u;
            memcpy(&u, &f, 4);
            u += 0x7fffu + ((u >> 16) & 1u);
            const uint16_t h = (uint16_t)(u >> 16);
            memcpy(out.data() + 2 * i, &h, 2);
        } else {
            memcpy(out.data() + i * sizeof(T), &acc, sizeof(T));
        }
    }
}

/* The data movement of a collective whose parts have all arrived (lock not held: every rank's
 * buffers are stable, since their streams wait in this operation). */
void move(std::vector<Coll> &parts)
{
    const size_t n = parts.size();
    const Coll &c0 = parts[0];
    const size_t size = type_size(c0.type);
    if (c0.kind == 1) {
        const size_t bytes = c0.count * size;
        for (size_t dst = 0; dst < n; dst++)
            for (size_t src = 0; src < n; src++)
                memmove(static_cast<char *>(parts[dst].recv) + src * bytes, parts[src].send, bytes);
        return;
    }
    std::vector<char> out(c0.count * size);
    switch (c0.type) {
    case ncclInt8: reduce_all<int8_t>(parts, out); break;
    case ncclUint8: reduce_all<uint8_t>(parts, out); break;
    case ncclInt32: reduce_all<int32_t>(parts, out); break;
    case ncclUint32: reduce_all<uint32_t>(parts, out); break;
    case ncclInt64: reduce_all<int64_t>(parts, out); break;
    case ncclUint64: reduce_all<uint64_t>(parts, out); break;
    case ncclFloat64: reduce_all<double>(parts, out); break;
    default: reduce_all<float>(parts, out); break; /* float32, bf16 */
    }
    for (size_t r = 0; r < n; r++)
        memcpy(parts[r].recv, out.data(), out.size());
}

ncclResult_t enqueue_coll(ncclComm *comm, const Coll &part, cudaStream_t stream)
{
    if (!comm || comm->destroyed)
        return ncclInvalidArgument;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> g(lock());
        seq = comm->next_coll++;
    }
    std::shared_ptr<Clique> c = comm->clique;
    const int rank = comm->rank;
    Op op;
    op.what = "nccl collective";
    op.run = [c, seq, rank, part]() {
        std::unique_lock<std::mutex> g(lock());
        Meeting &m = c->meetings[seq];
        if (m.parts.empty())
            m.parts.resize((size_t)c->nranks);
        m.parts[(size_t)rank] = part;
        if (++m.arrived == c->nranks) {
            bool agree = true;
            for (const Coll &p : m.parts) {
                const Coll &q = m.parts[0];
                if (p.kind != q.kind || p.count != q.count || p.type != q.type || p.redop != q.redop)
                    agree = false;
            }
            if (!agree) {
                fail(c.get(), ncclInvalidUsage,
                     format("collective %llu: the ranks' calls differ (operation, count, type or reduction)",
                            (unsigned long long)seq));
            } else if (c->async == ncclSuccess) {
                std::vector<Coll> parts = m.parts;
                g.unlock();
                move(parts);
                g.lock();
            }
            m.done = true;
            changed().notify_all();
        }
        changed().wait(g, [&] { return c->meetings[seq].done; });
        if (--c->meetings[seq].arrived == 0)
            c->meetings.erase(seq);
        return cudaSuccess;
    };
    cudaError_t rc = enqueue(stream, std::move(op));
    return rc == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t enqueue_p2p(ncclComm *comm, cudaStream_t stream, std::vector<P2p> list)
{
    std::shared_ptr<Clique> c = comm->clique;
    const int me = comm->rank;
    Op op;
    op.what = "nccl send/recv";
    op.run = [c, me, list]() {
        std::unique_lock<std::mutex> g(lock());
        std::vector<std::shared_ptr<Posting>> mine;
        for (const P2p &p : list)
            if (p.send) {
                auto post = std::make_shared<Posting>(Posting{p.sbuf, p.bytes, false});
                c->channels[{me, p.peer}].push_back(post);
                mine.push_back(post);
            }
        changed().notify_all();
        for (const P2p &p : list) {
            if (p.send)
                continue;
            auto &ch = c->channels[{p.peer, me}];
            changed().wait(g, [&] { return !ch.empty() || c->async != ncclSuccess; });
            if (c->async != ncclSuccess)
                break;
            std::shared_ptr<Posting> post = ch.front();
            ch.pop_front();
            if (post->bytes != p.bytes) {
                fail(c.get(), ncclInvalidUsage,
                     format("rank %d receives %zu bytes from rank %d, which sends %zu", me, p.bytes, p.peer,
                            post->bytes));
            } else {
                g.unlock();
                memmove(p.rbuf, post->buf, p.bytes);
                g.lock();
            }
            post->read = true;
            changed().notify_all();
        }
        changed().wait(g, [&] {
            if (c->async != ncclSuccess)
                return true;
            for (const auto &post : mine)
                if (!post->read)
                    return false;
            return true;
        });
        return cudaSuccess;
    };
    cudaError_t rc = enqueue(stream, std::move(op));
    return rc == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId &id, int rank, int device)
{
    if (!out || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    *out = nullptr;
    const std::string key(id.internal, sizeof id.internal);
    std::shared_ptr<Clique> c;
    auto *comm = new ncclComm;
    comm->rank = rank;
    comm->device = device;
    {
        std::unique_lock<std::mutex> g(lock());
        auto &pending = pending_cliques();
        auto it = pending.find(key);
        if (it == pending.end()) {
            c = std::make_shared<Clique>();
            c->nranks = nranks;
            c->devices.assign((size_t)nranks, -1);
            c->comms.assign((size_t)nranks, nullptr);
            pending[key] = c;
        } else {
            c = it->second;
        }
        comm->clique = c;
        if (c->nranks != nranks || c->comms[(size_t)rank]) {
            c->failed_init = true;
            c->last = c->nranks != nranks ? format("rank %d says %d ranks, another %d", rank, nranks, c->nranks)
                                          : format("rank %d joined twice", rank);
        } else {
            for (int r = 0; r < nranks; r++)
                if (c->devices[(size_t)r] == device) {
                    c->failed_init = true;
                    c->last = format("ranks %d and %d are both on device %d (one rank per device)", r, rank,
                                     device);
                }
            c->devices[(size_t)rank] = device;
            c->comms[(size_t)rank] = comm;
        }
        c->joined++;
        if (c->joined == c->nranks || c->failed_init)
            pending.erase(key);
        changed().notify_all();
        changed().wait(g, [&] { return c->joined == c->nranks || c->failed_init; });
        if (c->failed_init) {
            delete comm;
            return ncclInvalidUsage;
        }
    }
    *out = comm;
    return ncclSuccess;
}

} /* namespace */
} /* namespace prism_cudaemu */

using namespace prism_cudaemu;

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static std::atomic<unsigned long long> counter{0};
    if (!id)
        return ncclInvalidArgument;
    memset(id->internal, 0, sizeof id->internal);
    snprintf(id->internal, sizeof id->internal, "prism-cudaemu %d %llu", (int)getpid(), ++counter);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    int device = current_device();
    if (cudaGetDevice(&device) != cudaSuccess)
        return ncclUnhandledCudaError;
    return init_rank(comm, nranks, id, rank, device);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1)
        return ncclInvalidArgument;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess)
        return ncclUnhandledCudaError;
    for (int r = 0; r < ndev; r++) {
        const int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= count)
            return ncclInvalidArgument;
    }
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    std::vector<std::thread> joiners;
    std::vector<ncclResult_t> rcs((size_t)ndev, ncclSuccess);
    for (int r = 0; r < ndev; r++)
        joiners.emplace_back([&, r] { rcs[(size_t)r] = init_rank(&comms[r], ndev, id, r, devlist ? devlist[r] : r); });
    for (std::thread &t : joiners)
        t.join();
    for (int r = 0; r < ndev; r++)
        if (rcs[(size_t)r] != ncclSuccess) {
            for (int q = 0; q < ndev; q++)
                if (rcs[(size_t)q] == ncclSuccess)
                    ncclCommDestroy(comms[q]);
            return rcs[(size_t)r];
        }
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(lock());
    comm->destroyed = true;
    comm->clique->comms[(size_t)comm->rank] = nullptr;
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    {
        std::lock_guard<std::mutex> g(lock());
        fail(comm->clique.get(), ncclRemoteError, format("rank %d aborted the communicator", comm->rank));
        changed().notify_all();
    }
    return ncclCommDestroy(comm);
}

const char *ncclGetErrorString(ncclResult_t rc)
{
    switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    if (!comm)
        return "";
    std::lock_guard<std::mutex> g(lock());
    return comm->clique->last.c_str();
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    if (!comm || !async)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(lock());
    *async = comm->clique->async;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = comm->clique->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream)
{
    if (!comm || type_size(type) == 0)
        return ncclInvalidArgument;
    const size_t bytes = count * type_size(type);
    ncclResult_t rc;
    if ((rc = check_buffer(comm, send, bytes, "sendbuff")) != ncclSuccess ||
        (rc = check_buffer(comm, recv, bytes * (size_t)comm->clique->nranks, "recvbuff")) != ncclSuccess)
        return rc;
    Coll part;
    part.kind = 1;
    part.send = send;
    part.recv = recv;
    part.count = count;
    part.type = type;
    return enqueue_coll(comm, part, stream);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    if (!comm || type_size(type) == 0 || (int)op < 0 || (int)op >= (int)ncclNumOps ||
        type == ncclFloat16 || type == ncclFloat8e4m3 || type == ncclFloat8e5m2)
        return ncclInvalidArgument; /* the types the emulation sums */
    const size_t bytes = count * type_size(type);
    ncclResult_t rc;
    if ((rc = check_buffer(comm, send, bytes, "sendbuff")) != ncclSuccess ||
        (rc = check_buffer(comm, recv, bytes, "recvbuff")) != ncclSuccess)
        return rc;
    Coll part;
    part.kind = 2;
    part.send = send;
    part.recv = recv;
    part.count = count;
    part.type = type;
    part.redop = op;
    return enqueue_coll(comm, part, stream);
}

static ncclResult_t p2p(bool send, const void *sbuf, void *rbuf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    if (!comm || type_size(type) == 0 || peer < 0 || peer >= comm->clique->nranks)
        return ncclInvalidArgument;
    const size_t bytes = count * type_size(type);
    ncclResult_t rc = check_buffer(comm, send ? sbuf : rbuf, bytes, send ? "sendbuff" : "recvbuff");
    if (rc != ncclSuccess)
        return rc;
    P2p p{send, peer, sbuf, rbuf, bytes};
    if (tl_group > 0) {
        auto &slot = tl_p2p[comm];
        slot.first = stream;
        slot.second.push_back(p);
        return ncclSuccess;
    }
    return enqueue_p2p(comm, stream, {p});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(true, sendbuff, nullptr, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(false, nullptr, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart()
{
    tl_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd()
{
    if (tl_group == 0)
        return ncclInvalidUsage;
    if (--tl_group > 0)
        return ncclSuccess;
    auto batches = std::move(tl_p2p);
    tl_p2p.clear();
    ncclResult_t rc = ncclSuccess;
    for (auto &kv : batches) {
        ncclResult_t r = enqueue_p2p(kv.first, kv.second.first, std::move(kv.second.second));
        if (r != ncclSuccess && rc == ncclSuccess)
            rc = r;
    }
    return rc;
}

} /* extern "C" */
