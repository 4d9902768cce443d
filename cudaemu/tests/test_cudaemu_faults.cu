/* The faults the emulation must report: CUDA's undefined behaviour that it can see (barriers not
 * reached by every thread, warp operations whose masks are wrong, hangs), device code given memory
 * the device cannot reach, and launch configurations no device accepts.
 *
 * For each kernel fault: the launch itself succeeds (the kernel runs later, as on a device);
 * cudaDeviceSynchronize answers the fault's error, again on a second call (it is sticky, like a
 * real device's), and so does every later call on the device; prism_cudaemu_last_fault names the
 * kernel and its launch site, and the offending call with the file:line where it is written; the
 * fault counter moves by one; work queued behind the fault never runs; cudaDeviceReset clears
 * all of it and the device runs kernels again. A launch configuration error is not sticky: the
 * launch and cudaGetLastError answer it once. */
#include "emu_test.h"

#include <stdlib.h>

namespace {

/* ---- where the offending calls are --------------------------------------------------------- */

enum Site {
    kNoSite,
    kEarlyReturnBarrier,
    kBarrierLeftByExit,
    kEvenBarrier,
    kOddBarrier,
    kHangShuffle,
    kHangBarrier,
    kShuffleAfterExit,
    kShuffleLeftByExit,
    kMaskWithoutCaller,
    kReadOutsideMask,
    kShuffleUpOutsideMask,
    kBadWidth,
    kWideMask,
    kNarrowMask,
    kShuffleOfMask,
    kBallotOfMask,
    kGridBarrier,
    kMissingLanes,
    kSites
};

/* The line of each site, recorded by AT() the first time a thread gets there: AT(site) is written
 * on the same line as the call, so __LINE__ is the call's line. */
int g_site_line[kSites];
#define AT(site)                                                                                   \
    do {                                                                                           \
        static const int at_line_ = (g_site_line[site] = __LINE__);                                \
        (void)at_line_;                                                                            \
    } while (0)

std::string site(Site s)
{
    return std::string(__FILE__) + ":" + std::to_string(g_site_line[s]);
}

/* ---- kernels with faults ------------------------------------------------------------------- */

/* Threads 0-15 return; the others reach a barrier that can then never complete. */
__global__ void early_return_kernel()
{
    if (threadIdx.x < 16)
        return;
    AT(kEarlyReturnBarrier); __syncthreads();
}

/* Threads 0-15 wait at a barrier; the others return without reaching it. */
__global__ void exit_during_barrier_kernel()
{
    if (threadIdx.x >= 16)
        return;
    AT(kBarrierLeftByExit); __syncthreads();
}

/* Even and odd threads wait at two different barriers. */
__global__ void two_barriers_kernel()
{
    if (threadIdx.x % 2 == 0) {
        AT(kEvenBarrier); __syncthreads();
    } else {
        AT(kOddBarrier); __syncthreads();
    }
}

/* Lanes 0-30 wait at a shuffle for lane 31, which waits at a barrier for them. */
__global__ void hang_kernel(int *out)
{
    if (threadIdx.x == 31) {
        AT(kHangBarrier); __syncthreads();
    } else {
        AT(kHangShuffle); out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
    }
}

/* Lanes 0-15 return, then the others shuffle with the whole warp's mask. */
__global__ void shuffle_after_exit_kernel(int *out)
{
    if (threadIdx.x < 16)
        return;
    AT(kShuffleAfterExit); out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 17);
}

/* Lanes 0-15 shuffle with the whole warp's mask, and lanes 16-31 return instead of joining. */
__global__ void shuffle_left_by_exit_kernel(int *out)
{
    if (threadIdx.x >= 16)
        return;
    AT(kShuffleLeftByExit); out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

/* Every lane shuffles with the mask of lanes 0-15, lanes 16-31 included. */
__global__ void mask_without_caller_kernel(int *out)
{
    AT(kMaskWithoutCaller); out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 3);
}

/* Lanes 0-15 read lane 20, outside their mask. */
__global__ void read_outside_mask_kernel(int *out)
{
    if (threadIdx.x >= 16)
        return;
    AT(kReadOutsideMask); out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 20);
}

/* Lanes 8-15 shift up by one: lane 8 reads lane 7, outside the mask 0x0000ff00. */
__global__ void shuffle_up_outside_mask_kernel(int *out)
{
    if (threadIdx.x < 8 || threadIdx.x >= 16)
        return;
    AT(kShuffleUpOutsideMask); out[threadIdx.x] = __shfl_up_sync(0x0000ff00u, (int)threadIdx.x, 1);
}

__global__ void bad_width_kernel(int *out, int width)
{
    AT(kBadWidth); out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0, width);
}

/* Lanes 0-7 wait with the mask of lanes 0-15, and lanes 8-15 never join them: they shuffle among
 * themselves with a mask that overlaps it, and return. */
__global__ void overlapping_masks_kernel(int *out)
{
    const unsigned lane = threadIdx.x;
    if (lane < 8) {
        AT(kWideMask); out[lane] = __shfl_sync(0x0000ffffu, (int)lane, 0);
    } else if (lane < 16) {
        AT(kNarrowMask); out[lane] = __shfl_sync(0x0000ff00u, (int)lane, 8);
    }
}

/* Lanes 0-15 shuffle and lanes 16-31 vote, with the same mask. */
__global__ void different_warp_ops_kernel(int *out)
{
    if (threadIdx.x < 16) {
        AT(kShuffleOfMask); out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    } else {
        AT(kBallotOfMask); out[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
    }
}

/* Only block (1,2,0) of a 2 x 3 grid has a thread that skips the barrier. */
__global__ void one_bad_block_kernel(int *out)
{
    if (blockIdx.x == 1 && blockIdx.y == 2 && threadIdx.x == 5)
        return;
    AT(kGridBarrier); __syncthreads();
    out[(blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x] = 1;
}

/* A block of 40 threads: its second warp has lanes 0-7 only, and shuffles with all 32. */
__global__ void missing_lanes_kernel(int *out)
{
    if (threadIdx.x < 32)
        return;
    AT(kMissingLanes); out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

__global__ void write_kernel(int *a, int *b)
{
    a[threadIdx.x] = 7;
    b[threadIdx.x] = 7;
}

/* ---- the table ------------------------------------------------------------------------------- */

/* What a case's launch needs: a device buffer of 64 ints for the kernels that write. */
struct Launched {
    int line; /* of the launch */
    const char *kernel;
};

Launched launched(cudaError_t rc, const char *kernel, int line)
{
    EMU_OK(rc);
    return Launched{line, kernel};
}

#define LAUNCH_HERE(kernel, ...) launched(PRISM_CUDAEMU_LAUNCH(kernel, __VA_ARGS__), #kernel, __LINE__)

Launched launch_early_return(int *) { return LAUNCH_HERE(early_return_kernel, 1, 64, nullptr); }
Launched launch_exit_during_barrier(int *) { return LAUNCH_HERE(exit_during_barrier_kernel, 1, 64, nullptr); }
Launched launch_two_barriers(int *) { return LAUNCH_HERE(two_barriers_kernel, 1, 64, nullptr); }
Launched launch_hang(int *out) { return LAUNCH_HERE(hang_kernel, 1, 32, nullptr, out); }
Launched launch_shuffle_after_exit(int *out) { return LAUNCH_HERE(shuffle_after_exit_kernel, 1, 32, nullptr, out); }
Launched launch_shuffle_left_by_exit(int *out) { return LAUNCH_HERE(shuffle_left_by_exit_kernel, 1, 32, nullptr, out); }
Launched launch_mask_without_caller(int *out) { return LAUNCH_HERE(mask_without_caller_kernel, 1, 32, nullptr, out); }
Launched launch_read_outside_mask(int *out) { return LAUNCH_HERE(read_outside_mask_kernel, 1, 32, nullptr, out); }
Launched launch_up_outside_mask(int *out) { return LAUNCH_HERE(shuffle_up_outside_mask_kernel, 1, 32, nullptr, out); }
Launched launch_width_0(int *out) { return LAUNCH_HERE(bad_width_kernel, 1, 32, nullptr, out, 0); }
Launched launch_width_12(int *out) { return LAUNCH_HERE(bad_width_kernel, 1, 32, nullptr, out, 12); }
Launched launch_width_64(int *out) { return LAUNCH_HERE(bad_width_kernel, 1, 32, nullptr, out, 64); }
Launched launch_overlapping_masks(int *out) { return LAUNCH_HERE(overlapping_masks_kernel, 1, 32, nullptr, out); }
Launched launch_different_warp_ops(int *out) { return LAUNCH_HERE(different_warp_ops_kernel, 1, 32, nullptr, out); }
Launched launch_missing_lanes(int *out) { return LAUNCH_HERE(missing_lanes_kernel, 1, 40, nullptr, out); }
Launched launch_one_bad_block(int *out) { return LAUNCH_HERE(one_bad_block_kernel, dim3(2, 3), 8, nullptr, out); }

struct FaultCase {
    const char *name;
    Launched (*launch)(int *out);
    Site sites[2];        /* the calls whose file:line the report names */
    const char *words[2]; /* and what it says about them ("" for none) */
};

/* Every report starts with the kernel, its launch site and the faulting thread, then names the
 * offending call as "<call> at <file>:<line>" (a site's line), then says what went wrong. */
const FaultCase kFaults[] = {
    {"a barrier after some threads returned", launch_early_return, {kEarlyReturnBarrier, kNoSite},
     {"exited before reaching it", "every thread of the block must reach each barrier"}},
    {"threads that exit while others wait at a barrier", launch_exit_during_barrier, {kBarrierLeftByExit, kNoSite},
     {"exited while 16 threads wait at __syncthreads", "every thread of the block must reach each barrier"}},
    {"threads at two different barriers", launch_two_barriers, {kEvenBarrier, kOddBarrier},
     {"threads of the block wait at different barriers", ""}},
    {"lanes at a shuffle while another lane waits at a barrier", launch_hang, {kHangShuffle, kHangBarrier},
     {"block (0,0,0) hangs: ", "31 threads wait at __shfl_sync"}},
    {"a shuffle whose mask names an exited lane", launch_shuffle_after_exit, {kShuffleAfterExit, kNoSite},
     {"the mask 0xffffffff names lane 0, which has exited", ""}},
    {"lanes that exit while the rest of their mask waits at a shuffle", launch_shuffle_left_by_exit,
     {kShuffleLeftByExit, kNoSite}, {"exited while lanes 0x0000ffff wait for it at __shfl_xor_sync", "mask 0xffffffff"}},
    {"a mask that does not name the calling lane", launch_mask_without_caller, {kMaskWithoutCaller, kNoSite},
     {"the mask 0x0000ffff does not name the calling lane 16", ""}},
    {"a shuffle that reads a lane outside its mask", launch_read_outside_mask, {kReadOutsideMask, kNoSite},
     {"lane 0 reads lane 20, which is not in the mask 0x0000ffff", ""}},
    {"a shuffle up that reads below its mask", launch_up_outside_mask, {kShuffleUpOutsideMask, kNoSite},
     {"lane 8 reads lane 7, which is not in the mask 0x0000ff00", ""}},
    {"shuffle width 0", launch_width_0, {kBadWidth, kNoSite}, {"width 0 is not a power of two from 1 to 32", ""}},
    {"shuffle width 12", launch_width_12, {kBadWidth, kNoSite}, {"width 12 is not a power of two from 1 to 32", ""}},
    {"shuffle width 64", launch_width_64, {kBadWidth, kNoSite}, {"width 64 is not a power of two from 1 to 32", ""}},
    /* Lanes 8-15 never execute the shuffle of mask 0x0000ffff that lanes 0-7 wait at: the report
     * names that shuffle and its mask, whether it is made when the overlapping mask arrives or
     * when lanes 8-15 exit. */
    {"lanes that leave a mask for an overlapping one", launch_overlapping_masks, {kWideMask, kNoSite},
     {"mask 0x0000ffff", ""}},
    {"lanes of one mask at different warp operations", launch_different_warp_ops, {kShuffleOfMask, kBallotOfMask},
     {"lanes of mask 0xffffffff meet at different warp operations", ""}},
    {"a mask that names lanes past the end of the block", launch_missing_lanes, {kMissingLanes, kNoSite},
     {"the mask 0xffffffff names lane 8, which does not exist (the block has 40 threads)", ""}},
    {"one block of a grid that skips a barrier", launch_one_bad_block, {kGridBarrier, kNoSite},
     {"block (1,2,0) thread (", "exited"}},
};
const int kNumFaults = sizeof kFaults / sizeof kFaults[0];

/* Sets flag[0] = 1 (one thread: more would race, which ThreadSanitizer reports): queued behind a
 * fault, it must never run. */
__global__ void set_flag_kernel(int *flag)
{
    if (threadIdx.x + threadIdx.y + threadIdx.z + blockIdx.x + blockIdx.y + blockIdx.z == 0)
        flag[0] = 1;
}

/* After a fault (expected: `want`): the error is sticky and reported everywhere, nothing queued
 * behind it ran, and cudaDeviceReset gives back a working device. */
void check_sticky_then_reset(cudaError_t want, int *pinned_flag)
{
    EMU_EXPECT(cudaDeviceSynchronize(), want);
    EMU_EXPECT(cudaDeviceSynchronize(), want);
    EMU_EXPECT(cudaGetLastError(), want);
    EMU_EXPECT(cudaGetLastError(), want); /* not cleared by reading it: sticky */
    EMU_EXPECT(cudaPeekAtLastError(), want);
    void *p = nullptr;
    EMU_EXPECT(cudaMalloc(&p, 16), want);
    EMU_EXPECT(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1, nullptr, pinned_flag), want);
    CU_ASSERT_EQUAL(*(volatile int *)pinned_flag, 0);

    EMU_OK(cudaDeviceReset());
    CU_ASSERT_STRING_EQUAL(prism_cudaemu_last_fault(0), "");
    EMU_OK(cudaDeviceSynchronize());
    EMU_OK(cudaGetLastError());
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1, nullptr, pinned_flag));
    EMU_OK(cudaDeviceSynchronize());
    CU_ASSERT_EQUAL(*(volatile int *)pinned_flag, 1);
    *pinned_flag = 0;
}

void test_each_kernel_fault_is_reported_with_its_file_and_line()
{
    int *flag = nullptr; /* pinned host memory: outlives cudaDeviceReset, which frees device memory */
    EMU_OK(cudaMallocHost((void **)&flag, sizeof(int)));
    *flag = 0;
    for (int c = 0; c < kNumFaults; c++) {
        const FaultCase &f = kFaults[c];
        int *out = nullptr; /* freed by the reset */
        EMU_OK(cudaMalloc((void **)&out, 64 * sizeof(int)));
        const unsigned long long faults_before = prism_cudaemu_fault_count();
        /* The kernel that would run after the faulty one: held back until it is queued. */
        EMU_OK(prism_cudaemu_stream_hold(nullptr));
        const Launched l = f.launch(out);
        EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1, nullptr, flag));
        EMU_OK(prism_cudaemu_stream_release(nullptr));
        EMU_EXPECT(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
        CU_ASSERT_EQUAL(prism_cudaemu_fault_count(), faults_before + 1);

        const std::string report = prism_cudaemu_last_fault(0);
        const std::string launch_site = std::string("kernel ") + l.kernel + " (" + __FILE__ + ":" +
                                        std::to_string(l.line) + "), block (";
        const unsigned failures = CU_get_number_of_failures();
        EMU_CONTAINS(report.substr(0, launch_site.size()), launch_site);
        for (Site s : f.sites)
            if (s != kNoSite)
                EMU_CONTAINS(report, " at " + site(s));
        for (const char *w : f.words)
            EMU_CONTAINS(report, w);
        if (CU_get_number_of_failures() != failures)
            fprintf(stderr, "\n  (the case: %s)", f.name);
        check_sticky_then_reset(cudaErrorLaunchFailure, flag);
    }
    EMU_OK(cudaFreeHost(flag));
}

/* ---- memory the device cannot reach ---------------------------------------------------------- */

void test_kernel_given_host_memory_faults_with_illegal_address()
{
    int *flag = nullptr;
    EMU_OK(cudaMallocHost((void **)&flag, sizeof(int)));
    *flag = 0;
    int *host = static_cast<int *>(malloc(32 * sizeof(int)));
    int *dev = nullptr;
    EMU_OK(cudaMalloc((void **)&dev, 32 * sizeof(int)));
    for (int i = 0; i < 32; i++)
        host[i] = -1;
    /* Pointer arguments are counted from 1: the host pointer first, then second. */
    for (int which = 1; which <= 2; which++) {
        if (which == 2)
            EMU_OK(cudaMalloc((void **)&dev, 32 * sizeof(int))); /* the reset freed the first */
        EMU_OK(prism_cudaemu_stream_hold(nullptr));
        const Launched l = which == 1 ? LAUNCH_HERE(write_kernel, 1, 32, nullptr, host, dev)
                                      : LAUNCH_HERE(write_kernel, 1, 32, nullptr, dev, host);
        EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1, nullptr, flag));
        EMU_OK(prism_cudaemu_stream_release(nullptr));
        EMU_EXPECT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
        const std::string report = prism_cudaemu_last_fault(0);
        EMU_CONTAINS(report, std::string("kernel write_kernel (") + __FILE__ + ":" + std::to_string(l.line) + ")");
        EMU_CONTAINS(report, "pointer argument " + std::to_string(which));
        EMU_CONTAINS(report, "is host memory, not memory device 0 can reach");
        int untouched = 0; /* the kernel never ran: the host array is as it was */
        for (int i = 0; i < 32; i++)
            untouched += host[i] == -1;
        CU_ASSERT_EQUAL(untouched, 32);
        check_sticky_then_reset(cudaErrorIllegalAddress, flag);
    }
    free(host);
    EMU_OK(cudaFreeHost(flag));
}

/* A fault on device 1 leaves device 0 working, and device 1's reset is its own. */
void test_a_fault_is_sticky_only_on_its_device()
{
    EMU_OK(cudaSetDevice(1));
    int *out1 = nullptr;
    EMU_OK(cudaMalloc((void **)&out1, 64 * sizeof(int)));
    const Launched l = launch_hang(out1);
    EMU_EXPECT(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    EMU_CONTAINS(prism_cudaemu_last_fault(1), std::string("kernel hang_kernel (") + __FILE__ + ":" +
                                                  std::to_string(l.line) + ")");
    CU_ASSERT_STRING_EQUAL(prism_cudaemu_last_fault(0), "");

    EMU_OK(cudaSetDevice(0));
    EMU_OK(cudaDeviceSynchronize());
    /* The last error is the host thread's, whatever the device: device 1's synchronisation set
     * it, reading it clears it, and device 0 has no sticky error to report after that. */
    EMU_EXPECT(cudaGetLastError(), cudaErrorLaunchFailure);
    EMU_OK(cudaGetLastError());
    DeviceBuffer<int> out0(1);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1, nullptr, out0.p));
    EMU_OK(cudaDeviceSynchronize());
    CU_ASSERT_EQUAL(out0.get()[0], 1);

    EMU_OK(cudaSetDevice(1));
    EMU_EXPECT(cudaGetLastError(), cudaErrorLaunchFailure);
    EMU_OK(cudaDeviceReset());
    CU_ASSERT_STRING_EQUAL(prism_cudaemu_last_fault(1), "");
    EMU_OK(cudaDeviceSynchronize());
    EMU_OK(cudaSetDevice(0));
}

/* ---- launch configurations ------------------------------------------------------------------- */

struct BadConfig {
    dim3 grid, block;
};

void test_launch_configuration_errors_are_reported_once()
{
    /* Limits of every device since compute capability 2.0: 1,024 threads a block, block
     * dimensions 1,024 x 1,024 x 64, grid dimensions 2^31 - 1 x 65,535 x 65,535, none zero. */
    const BadConfig bad[] = {
        {dim3(1), dim3(1025)},          {dim3(1), dim3(32, 32, 2)},   {dim3(1), dim3(1, 1, 65)},
        {dim3(1), dim3(1, 1025, 1)},    {dim3(1), dim3(0, 1, 1)},     {dim3(1), dim3(4, 0, 1)},
        {dim3(0), dim3(32)},            {dim3(1, 0, 1), dim3(32)},    {dim3(1, 1, 0), dim3(32)},
        {dim3(1, 65536, 1), dim3(32)},  {dim3(1, 1, 65536), dim3(32)}};
    DeviceBuffer<int> out(1);
    int reported = 0;
    for (const BadConfig &c : bad) {
        const cudaError_t rc = PRISM_CUDAEMU_LAUNCH(set_flag_kernel, c.grid, c.block, nullptr, out.p);
        const cudaError_t last = cudaGetLastError();
        const cudaError_t again = cudaGetLastError();
        const cudaError_t sync = cudaDeviceSynchronize();
        const bool ok = rc == cudaErrorInvalidConfiguration && last == cudaErrorInvalidConfiguration &&
                        again == cudaSuccess && sync == cudaSuccess;
        if (!ok)
            fprintf(stderr, "\n  grid (%u,%u,%u) block (%u,%u,%u): launch %s, last %s, again %s, sync %s", c.grid.x,
                    c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, cudaGetErrorName(rc),
                    cudaGetErrorName(last), cudaGetErrorName(again), cudaGetErrorName(sync));
        reported += ok;
    }
    CU_ASSERT_EQUAL(reported, (int)(sizeof bad / sizeof bad[0]));
    CU_ASSERT_STRING_EQUAL(prism_cudaemu_last_fault(0), "");
    /* The largest legal shapes still launch. */
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, 1024, nullptr, out.p));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, 1, dim3(1, 16, 64), nullptr, out.p));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(set_flag_kernel, dim3(1, 1, 65535), 1, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    EMU_OK(cudaGetLastError());
}

const prism_test_case cases[] = {
    EMU_CASE(test_each_kernel_fault_is_reported_with_its_file_and_line),
    EMU_CASE(test_kernel_given_host_memory_faults_with_illegal_address),
    EMU_CASE(test_a_fault_is_sticky_only_on_its_device),
    EMU_CASE(test_launch_configuration_errors_are_reported_once),
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"cudaemu_faults", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
