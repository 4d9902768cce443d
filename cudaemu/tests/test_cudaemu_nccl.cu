/* The emulated NCCL against NCCL's documented semantics, with ranks as host threads on devices
 * 0..n-1 (one rank per device, as NCCL requires): communicators from ncclCommInitAll and from
 * ncclCommInitRank, all-gather, all-reduce (every reduction on every type Prism may use, on
 * small integers so that every result is exact), grouped send/recv all-to-all, byte for byte;
 * ranks that disagree (an asynchronous ncclInvalidUsage with a reason), and arguments NCCL refuses.
 * Each rank thread records what it saw; the main thread asserts (CUnit is not thread-safe). */
#include "emu_test.h"

#include <nccl.h>

#include <cmath>
#include <functional>
#include <thread>

namespace {

const int kMaxRanks = 4;

/* What one rank thread saw: failures with a message, and its results. */
struct RankLog {
    int failures = 0;
    std::string first;

    void fail(const std::string &what)
    {
        if (failures++ == 0)
            first = what;
    }
    void cuda(cudaError_t rc, const char *call)
    {
        if (rc != cudaSuccess)
            fail(std::string(call) + ": " + cudaGetErrorName(rc));
    }
    void nccl(ncclResult_t rc, const char *call)
    {
        if (rc != ncclSuccess)
            fail(std::string(call) + ": " + ncclGetErrorString(rc));
    }
};

#define RANK_CUDA(log, call) (log).cuda((call), #call)
#define RANK_NCCL(log, call) (log).nccl((call), #call)

/* Runs fn(rank, log) on n threads, one per rank, and asserts that none failed. */
void run_ranks(int n, const std::function<void(int, RankLog &)> &fn, const char *what)
{
    std::vector<RankLog> logs((size_t)n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; r++)
        threads.emplace_back([&, r] {
            logs[(size_t)r].cuda(cudaSetDevice(r), "cudaSetDevice");
            fn(r, logs[(size_t)r]);
        });
    for (std::thread &t : threads)
        t.join();
    for (int r = 0; r < n; r++) {
        if (logs[(size_t)r].failures)
            fprintf(stderr, "\n  %s, %d ranks: rank %d: %d failures, the first: %s", what, n, r,
                    logs[(size_t)r].failures, logs[(size_t)r].first.c_str());
        CU_ASSERT_EQUAL(logs[(size_t)r].failures, 0);
    }
}

/* Device memory holding `host`, and its contents back, from a rank thread. */
template <class T> T *to_device(RankLog &log, const std::vector<T> &host)
{
    T *p = nullptr;
    RANK_CUDA(log, cudaMalloc((void **)&p, host.size() * sizeof(T)));
    RANK_CUDA(log, cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <class T> std::vector<T> from_device(RankLog &log, const T *p, size_t n)
{
    std::vector<T> host(n);
    RANK_CUDA(log, cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

struct Comms {
    ncclComm_t c[kMaxRanks] = {};
    int n = 0;
    explicit Comms(int ranks) : n(ranks)
    {
        EMU_EXPECT(ncclCommInitAll(c, n, nullptr), ncclSuccess);
    }
    ~Comms()
    {
        for (int r = 0; r < n; r++)
            if (c[r])
                EMU_EXPECT(ncclCommDestroy(c[r]), ncclSuccess);
    }
};

/* ---- communicators ----------------------------------------------------------------------------- */

void test_comm_init_all_gives_one_rank_per_device()
{
    for (int n = 1; n <= kMaxRanks; n++) {
        Comms comms(n);
        for (int r = 0; r < n; r++) {
            int count = -1, rank = -1, device = -1;
            EMU_EXPECT(ncclCommCount(comms.c[r], &count), ncclSuccess);
            EMU_EXPECT(ncclCommUserRank(comms.c[r], &rank), ncclSuccess);
            EMU_EXPECT(ncclCommCuDevice(comms.c[r], &device), ncclSuccess);
            CU_ASSERT_EQUAL(count, n);
            CU_ASSERT_EQUAL(rank, r);
            CU_ASSERT_EQUAL(device, r);
        }
    }
    /* A device list: rank r on devlist[r]. */
    ncclComm_t c[2] = {};
    const int devlist[2] = {3, 1};
    EMU_EXPECT(ncclCommInitAll(c, 2, devlist), ncclSuccess);
    int device = -1;
    EMU_EXPECT(ncclCommCuDevice(c[0], &device), ncclSuccess);
    CU_ASSERT_EQUAL(device, 3);
    EMU_EXPECT(ncclCommCuDevice(c[1], &device), ncclSuccess);
    CU_ASSERT_EQUAL(device, 1);
    EMU_EXPECT(ncclCommDestroy(c[0]), ncclSuccess);
    EMU_EXPECT(ncclCommDestroy(c[1]), ncclSuccess);
}

void test_comm_init_refuses_bad_device_lists()
{
    ncclComm_t c[2] = {};
    const int same[2] = {0, 0}, missing[2] = {0, 7}, negative[2] = {-1, 0};
    EMU_EXPECT(ncclCommInitAll(c, 2, same), ncclInvalidUsage); /* two ranks on one device */
    EMU_EXPECT(ncclCommInitAll(c, 2, missing), ncclInvalidArgument);
    EMU_EXPECT(ncclCommInitAll(c, 2, negative), ncclInvalidArgument);
    EMU_EXPECT(ncclCommInitAll(c, 0, nullptr), ncclInvalidArgument);
    EMU_EXPECT(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument);
}

/* ncclCommInitRank from one thread per rank, with the id from ncclGetUniqueId; then an
 * all-reduce to show the communicator works. */
void test_comm_init_rank_from_threads()
{
    const int n = 3;
    ncclUniqueId id;
    EMU_EXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(n, [&](int r, RankLog &log) {
        ncclComm_t comm = nullptr;
        RANK_NCCL(log, ncclCommInitRank(&comm, n, id, r));
        if (!comm)
            return;
        int count = -1, rank = -1, device = -1;
        RANK_NCCL(log, ncclCommCount(comm, &count));
        RANK_NCCL(log, ncclCommUserRank(comm, &rank));
        RANK_NCCL(log, ncclCommCuDevice(comm, &device));
        if (count != n || rank != r || device != r)
            log.fail("count, rank or device");
        cudaStream_t s;
        RANK_CUDA(log, cudaStreamCreate(&s));
        int *buf = to_device(log, std::vector<int>{r + 1, 10 * (r + 1)});
        RANK_NCCL(log, ncclAllReduce(buf, buf, 2, ncclInt32, ncclSum, comm, s)); /* in place */
        RANK_CUDA(log, emu_wait_stream(s));
        const std::vector<int> got = from_device(log, buf, 2);
        if (got[0] != 6 || got[1] != 60)
            log.fail("in-place all-reduce: " + std::to_string(got[0]) + ", " + std::to_string(got[1]));
        RANK_CUDA(log, cudaFree(buf));
        RANK_CUDA(log, cudaStreamDestroy(s));
        RANK_NCCL(log, ncclCommDestroy(comm));
    }, "ncclCommInitRank");

    /* Two ranks on one device: every rank's init fails. */
    ncclUniqueId id2;
    EMU_EXPECT(ncclGetUniqueId(&id2), ncclSuccess);
    ncclResult_t rcs[2] = {ncclSuccess, ncclSuccess};
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; r++)
        threads.emplace_back([&, r] {
            cudaSetDevice(2);
            ncclComm_t comm = nullptr;
            rcs[r] = ncclCommInitRank(&comm, 2, id2, r);
        });
    for (std::thread &t : threads)
        t.join();
    CU_ASSERT_EQUAL(rcs[0], ncclInvalidUsage);
    CU_ASSERT_EQUAL(rcs[1], ncclInvalidUsage);
}

/* ---- collectives ------------------------------------------------------------------------------- */

/* Every rank contributes `count` elements; recv holds every rank's, in rank order. */
void test_all_gather_concatenates_in_rank_order()
{
    const size_t counts[] = {1, 13, 1000};
    for (int n = 1; n <= kMaxRanks; n++) {
        Comms comms(n);
        for (size_t count : counts)
            run_ranks(n, [&](int r, RankLog &log) {
                cudaStream_t s;
                RANK_CUDA(log, cudaStreamCreate(&s));
                std::vector<unsigned char> mine(count);
                for (size_t i = 0; i < count; i++)
                    mine[i] = (unsigned char)(r * 37 + i * 11);
                unsigned char *send = to_device(log, mine);
                unsigned char *recv = nullptr;
                RANK_CUDA(log, cudaMalloc((void **)&recv, count * n));
                RANK_NCCL(log, ncclAllGather(send, recv, count, ncclUint8, comms.c[r], s));
                RANK_CUDA(log, emu_wait_stream(s));
                const std::vector<unsigned char> got = from_device(log, recv, count * n);
                size_t wrong = 0;
                for (int src = 0; src < n; src++)
                    for (size_t i = 0; i < count; i++)
                        wrong += got[src * count + i] != (unsigned char)(src * 37 + i * 11);
                if (wrong)
                    log.fail(std::to_string(wrong) + " wrong bytes, count " + std::to_string(count));
                /* In place: each rank's contribution already at its offset of recv. */
                RANK_CUDA(log, cudaMemset(recv, 0, count * n));
                RANK_CUDA(log, cudaMemcpy(recv + r * count, send, count, cudaMemcpyDeviceToDevice));
                RANK_NCCL(log, ncclAllGather(recv + r * count, recv, count, ncclUint8, comms.c[r], s));
                RANK_CUDA(log, emu_wait_stream(s));
                if (from_device(log, recv, count * n) != got)
                    log.fail("in-place all-gather differs, count " + std::to_string(count));
                RANK_CUDA(log, cudaFree(send));
                RANK_CUDA(log, cudaFree(recv));
                RANK_CUDA(log, cudaStreamDestroy(s));
            }, "ncclAllGather");
    }
}

/* Rank r's element i: a small non-zero integer, so that every sum, product, maximum and minimum
 * of up to four ranks is exact in every type below. */
int element(int r, size_t i)
{
    const int v = (int)((r * 7 + i * 3) % 10) - 5;
    return v >= 0 ? v + 1 : v;
}

struct Reduction {
    ncclDataType_t type;
    ncclRedOp_t op;
    const char *name;
};

/* NCCL's definition of each reduction on the ranks' values, in double (every result is exact). */
double reduce_reference(ncclRedOp_t op, int n, size_t i)
{
    double acc = element(0, i);
    for (int r = 1; r < n; r++) {
        const double v = element(r, i);
        switch (op) {
        case ncclSum:
        case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    return op == ncclAvg ? acc / n : acc;
}

template <class T> T encode(double v);
template <> int encode<int>(double v) { return (int)v; }
template <> float encode<float>(double v) { return (float)v; }
template <> double encode<double>(double v) { return v; }
template <> int64_t encode<int64_t>(double v) { return (int64_t)v; }

template <class T> double decode(T v) { return (double)v; }

/* bf16: the high half of a binary32 (every value here is exact in it). */
struct Bf16 {
    uint16_t bits;
};
template <> Bf16 encode<Bf16>(double v)
{
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return Bf16{(uint16_t)(u >> 16)};
}
template <> double decode<Bf16>(Bf16 v)
{
    const uint32_t u = (uint32_t)v.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <class T> void check_all_reduce(const Comms &comms, const Reduction &red, size_t count)
{
    const int n = comms.n;
    run_ranks(n, [&](int r, RankLog &log) {
        cudaStream_t s;
        RANK_CUDA(log, cudaStreamCreate(&s));
        std::vector<T> mine(count);
        for (size_t i = 0; i < count; i++)
            mine[i] = encode<T>(element(r, i));
        T *send = to_device(log, mine);
        T *recv = nullptr;
        RANK_CUDA(log, cudaMalloc((void **)&recv, count * sizeof(T)));
        RANK_NCCL(log, ncclAllReduce(send, recv, count, red.type, red.op, comms.c[r], s));
        RANK_CUDA(log, emu_wait_stream(s));
        const std::vector<T> got = from_device(log, recv, count);
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < count; i++)
            if (decode(got[i]) != reduce_reference(red.op, n, i) && wrong++ == 0)
                first = i;
        if (wrong)
            log.fail(std::string(red.name) + ": " + std::to_string(wrong) + " wrong, element " +
                     std::to_string(first) + " is " + std::to_string(decode(got[first])) + ", expected " +
                     std::to_string(reduce_reference(red.op, n, first)));
        RANK_CUDA(log, cudaFree(send));
        RANK_CUDA(log, cudaFree(recv));
        RANK_CUDA(log, cudaStreamDestroy(s));
    }, red.name);
}

void test_all_reduce_of_every_reduction_is_exact()
{
    const Reduction reductions[] = {
        {ncclFloat32, ncclSum, "float sum"},   {ncclFloat32, ncclProd, "float prod"},
        {ncclFloat32, ncclMax, "float max"},   {ncclFloat32, ncclMin, "float min"},
        {ncclFloat32, ncclAvg, "float avg"},   {ncclInt32, ncclSum, "int32 sum"},
        {ncclInt32, ncclProd, "int32 prod"},   {ncclInt32, ncclMax, "int32 max"},
        {ncclInt32, ncclMin, "int32 min"},     {ncclInt64, ncclSum, "int64 sum"},
        {ncclFloat64, ncclSum, "double sum"},  {ncclFloat64, ncclMax, "double max"},
        {ncclFloat64, ncclMin, "double min"},  {ncclBfloat16, ncclSum, "bf16 sum"},
        {ncclBfloat16, ncclMax, "bf16 max"},
    };
    for (int n = 1; n <= kMaxRanks; n++) {
        Comms comms(n);
        for (const Reduction &red : reductions) {
            /* An average of integers divided by a rank count that is not a power of two is
             * rounded in ways that differ between NCCL versions: only powers of two here. */
            if (red.op == ncclAvg && (n & (n - 1)) != 0)
                continue;
            switch (red.type) {
            case ncclFloat32: check_all_reduce<float>(comms, red, 1001); break;
            case ncclInt32: check_all_reduce<int>(comms, red, 1001); break;
            case ncclInt64: check_all_reduce<int64_t>(comms, red, 1001); break;
            case ncclFloat64: check_all_reduce<double>(comms, red, 1001); break;
            default: check_all_reduce<Bf16>(comms, red, 1001); break;
            }
        }
    }
}

/* All-to-all as Prism's collectives do it: inside one group, each rank sends a chunk to every
 * rank (itself included) and receives one from each. */
void test_grouped_send_recv_all_to_all_is_byte_exact()
{
    const size_t chunk = 29;
    for (int n = 1; n <= kMaxRanks; n++) {
        Comms comms(n);
        run_ranks(n, [&](int r, RankLog &log) {
            cudaStream_t s;
            RANK_CUDA(log, cudaStreamCreate(&s));
            std::vector<unsigned char> mine(chunk * n);
            for (int to = 0; to < n; to++)
                for (size_t i = 0; i < chunk; i++)
                    mine[to * chunk + i] = (unsigned char)((r * 16 + to) ^ (i * 7));
            unsigned char *send = to_device(log, mine);
            unsigned char *recv = nullptr;
            RANK_CUDA(log, cudaMalloc((void **)&recv, chunk * n));
            RANK_NCCL(log, ncclGroupStart());
            for (int peer = 0; peer < n; peer++) {
                RANK_NCCL(log, ncclSend(send + peer * chunk, chunk, ncclUint8, peer, comms.c[r], s));
                RANK_NCCL(log, ncclRecv(recv + peer * chunk, chunk, ncclUint8, peer, comms.c[r], s));
            }
            RANK_NCCL(log, ncclGroupEnd());
            RANK_CUDA(log, emu_wait_stream(s));
            const std::vector<unsigned char> got = from_device(log, recv, chunk * n);
            size_t wrong = 0;
            for (int from = 0; from < n; from++)
                for (size_t i = 0; i < chunk; i++)
                    wrong += got[from * chunk + i] != (unsigned char)((from * 16 + r) ^ (i * 7));
            if (wrong)
                log.fail(std::to_string(wrong) + " wrong bytes");
            RANK_CUDA(log, cudaFree(send));
            RANK_CUDA(log, cudaFree(recv));
            RANK_CUDA(log, cudaStreamDestroy(s));
        }, "all-to-all");
    }
}

/* A collective runs when its stream gets there: rank 1's all-reduce cannot finish while rank 0's
 * stream is held, and both finish once it is released. */
void test_collective_waits_for_every_ranks_stream()
{
    Comms comms(2);
    cudaStream_t s[2];
    cudaEvent_t done[2];
    float *buf[2];
    for (int r = 0; r < 2; r++) {
        EMU_OK(cudaSetDevice(r));
        EMU_OK(cudaStreamCreate(&s[r]));
        EMU_OK(cudaEventCreateWithFlags(&done[r], cudaEventDisableTiming));
        EMU_OK(cudaMalloc((void **)&buf[r], 4 * sizeof(float)));
        const float v[4] = {1.0f + r, 2.0f, 3.0f, 4.0f * r};
        EMU_OK(cudaMemcpy(buf[r], v, sizeof v, cudaMemcpyHostToDevice));
    }
    EMU_OK(prism_cudaemu_stream_hold(s[0])); /* from device 1: a stream's handle is enough */
    for (int r = 0; r < 2; r++) {
        EMU_OK(cudaSetDevice(r));
        EMU_EXPECT(ncclAllReduce(buf[r], buf[r], 4, ncclFloat32, ncclSum, comms.c[r], s[r]), ncclSuccess);
        EMU_OK(cudaEventRecord(done[r], s[r]));
    }
    EMU_EXPECT(cudaEventQuery(done[1]), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(s[0]));
    for (int r = 0; r < 2; r++) {
        EMU_OK(cudaSetDevice(r));
        EMU_OK(emu_wait_event(done[r]));
        float got[4];
        EMU_OK(cudaMemcpy(got, buf[r], sizeof got, cudaMemcpyDeviceToHost));
        CU_ASSERT_EQUAL(got[0], 3.0f);
        CU_ASSERT_EQUAL(got[1], 4.0f);
        CU_ASSERT_EQUAL(got[2], 6.0f);
        CU_ASSERT_EQUAL(got[3], 4.0f);
        EMU_OK(cudaFree(buf[r]));
        EMU_OK(cudaEventDestroy(done[r]));
        EMU_OK(cudaStreamDestroy(s[r]));
    }
    EMU_OK(cudaSetDevice(0));
}

/* ---- disagreement and bad arguments ------------------------------------------------------------ */

/* Ranks that call the same collective with different counts: no data moves, every rank's stream
 * goes on, and every communicator of the clique answers ncclInvalidUsage with the reason. */
void test_mismatched_collective_is_an_async_invalid_usage()
{
    Comms comms(2);
    run_ranks(2, [&](int r, RankLog &log) {
        cudaStream_t s;
        RANK_CUDA(log, cudaStreamCreate(&s));
        float *send = to_device(log, std::vector<float>(8, 1.0f));
        float *recv = nullptr;
        RANK_CUDA(log, cudaMalloc((void **)&recv, 8 * sizeof(float)));
        RANK_NCCL(log, ncclAllReduce(send, recv, r == 0 ? 8 : 4, ncclFloat32, ncclSum, comms.c[r], s));
        RANK_CUDA(log, emu_wait_stream(s));
        const std::vector<float> got = from_device(log, recv, 8);
        uint32_t bits;
        memcpy(&bits, &got[0], 4);
        if (bits != 0xffffffffu) /* fresh device memory: nothing was written */
            log.fail("the receive buffer was written");
        RANK_CUDA(log, cudaFree(send));
        RANK_CUDA(log, cudaFree(recv));
        RANK_CUDA(log, cudaStreamDestroy(s));
    }, "mismatched all-reduce");
    for (int r = 0; r < 2; r++) {
        ncclResult_t async = ncclSuccess;
        EMU_EXPECT(ncclCommGetAsyncError(comms.c[r], &async), ncclSuccess);
        CU_ASSERT_EQUAL(async, ncclInvalidUsage);
        EMU_CONTAINS(ncclGetLastError(comms.c[r]), "the ranks' calls differ");
    }
}

/* A receive of another size than its send: ncclInvalidUsage, saying which ranks and sizes. */
void test_mismatched_send_recv_sizes_are_an_async_invalid_usage()
{
    Comms comms(2);
    run_ranks(2, [&](int r, RankLog &log) {
        cudaStream_t s;
        RANK_CUDA(log, cudaStreamCreate(&s));
        unsigned char *buf = to_device(log, std::vector<unsigned char>(8, (unsigned char)r));
        if (r == 0)
            RANK_NCCL(log, ncclSend(buf, 8, ncclUint8, 1, comms.c[r], s));
        else
            RANK_NCCL(log, ncclRecv(buf, 4, ncclUint8, 0, comms.c[r], s));
        RANK_CUDA(log, emu_wait_stream(s));
        RANK_CUDA(log, cudaFree(buf));
        RANK_CUDA(log, cudaStreamDestroy(s));
    }, "mismatched send/recv");
    ncclResult_t async = ncclSuccess;
    EMU_EXPECT(ncclCommGetAsyncError(comms.c[0], &async), ncclSuccess);
    CU_ASSERT_EQUAL(async, ncclInvalidUsage);
    EMU_CONTAINS(ncclGetLastError(comms.c[0]), "rank 1 receives 4 bytes from rank 0, which sends 8");
}

/* Buffers that are not the rank's device memory, or too small: ncclInvalidArgument at the call. */
void test_collectives_refuse_buffers_the_rank_cannot_use()
{
    Comms comms(2);
    std::vector<float> host(16);
    float *dev0 = nullptr, *dev1 = nullptr;
    EMU_OK(cudaSetDevice(1));
    EMU_OK(cudaMalloc((void **)&dev1, 16 * sizeof(float)));
    EMU_OK(cudaSetDevice(0));
    EMU_OK(cudaMalloc((void **)&dev0, 16 * sizeof(float)));
    ncclComm_t c0 = comms.c[0];
    EMU_EXPECT(ncclAllReduce(host.data(), dev0, 16, ncclFloat32, ncclSum, c0, nullptr), ncclInvalidArgument);
    EMU_CONTAINS(ncclGetLastError(c0), "sendbuff");
    EMU_CONTAINS(ncclGetLastError(c0), "is not 64 bytes of device 0 memory");
    EMU_EXPECT(ncclAllReduce(dev0, dev1, 16, ncclFloat32, ncclSum, c0, nullptr), ncclInvalidArgument);
    EMU_CONTAINS(ncclGetLastError(c0), "recvbuff");
    EMU_EXPECT(ncclAllGather(dev0, dev0, 16, ncclFloat32, c0, nullptr), ncclInvalidArgument); /* needs 2 x 16 */
    EMU_EXPECT(ncclAllReduce(dev0, dev0, 17, ncclFloat32, ncclSum, c0, nullptr), ncclInvalidArgument);
    EMU_EXPECT(ncclSend(host.data(), 16, ncclFloat32, 1, c0, nullptr), ncclInvalidArgument);
    EMU_EXPECT(ncclSend(dev0, 16, ncclFloat32, 2, c0, nullptr), ncclInvalidArgument); /* no rank 2 */
    EMU_EXPECT(ncclAllReduce(dev0, dev0, 16, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
    EMU_EXPECT(ncclGroupEnd(), ncclInvalidUsage); /* no group open */
    ncclResult_t async = ncclInternalError;
    EMU_EXPECT(ncclCommGetAsyncError(c0, &async), ncclSuccess);
    CU_ASSERT_EQUAL(async, ncclSuccess); /* refused calls are not asynchronous errors */
    EMU_OK(cudaFree(dev0));
    EMU_OK(cudaFree(dev1));
}

const prism_test_case cases[] = {
    EMU_CASE(test_comm_init_all_gives_one_rank_per_device),
    EMU_CASE(test_comm_init_refuses_bad_device_lists),
    EMU_CASE(test_comm_init_rank_from_threads),
    EMU_CASE(test_all_gather_concatenates_in_rank_order),
    EMU_CASE(test_all_reduce_of_every_reduction_is_exact),
    EMU_CASE(test_grouped_send_recv_all_to_all_is_byte_exact),
    EMU_CASE(test_collective_waits_for_every_ranks_stream),
    EMU_CASE(test_mismatched_collective_is_an_async_invalid_usage),
    EMU_CASE(test_mismatched_send_recv_sizes_are_an_async_invalid_usage),
    EMU_CASE(test_collectives_refuse_buffers_the_rank_cannot_use),
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"cudaemu_nccl", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
