/* The transfer engine's CUDA backend against its CPU backend, byte for byte (nearest rounding;
 * the CUDA dequantize is bit-identical to the CPU one): many blocks of different sizes fetched
 * back to back in every precision through 2 staging buffers (and 1 and 3), so that copies and
 * dequantizes overlap and staging buffers are reused while earlier fetches run; tickets waited
 * on by a consumer stream and by the host; dst_stream ordering; update_block while copies of the
 * old weights are in flight; demand fetches pacing themselves on the Conductor's slots.
 *
 * Without a device, main prints "SKIPPED: no CUDA device" and every GPU case returns at once;
 * the one host-only case (creating a CUDA engine fails cleanly) runs anyway. */
#include "testutil.h"

#include "prism/cuda.h"
#include "prism/transfer.h"

#include <cuda_runtime_api.h>
#ifdef PRISM_CUDAEMU
#include "prism_cudaemu.h" /* the emulated device's stream hold: a consumer that is behind */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BLOCKS 24

static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        prism_error err = {0};
        if (prism_cuda_device_count(&count, &err) != PRISM_OK)
            count = 0;
    }
    return count;
}

static bool skip_without_device(void)
{
    if (device_count() > 0)
        return false;
    printf("(SKIPPED: no CUDA device) ");
    return true;
}

/* Block b's length: around group boundaries and up to 1M + 3, with odd ones for INT4. */
static size_t block_len(int b)
{
    static const size_t lens[] = {1, 7, 128, 129, 1000, 4099, 65536, 65541, 1048576 + 3, 300000, 257, 2048};
    return lens[b % (int)(sizeof lens / sizeof lens[0])] + (size_t)(b / 12) * 5;
}

static uint16_t *make_weights(size_t n, uint32_t seed)
{
    uint16_t *w = malloc(n * sizeof *w);
    CU_ASSERT_FATAL(w != NULL);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        w[i] = prism_f32_to_bf16(u * (float)(1 + (i / 128) % 9) * 0.01f);
    }
    if (n > 10)
        w[n / 2] = 0x7fc0; /* one NaN: code 0 on both backends */
    return w;
}

typedef struct pair {
    prism_transfer *cpu, *cuda;
    uint16_t *weights[N_BLOCKS];
    void *dev[N_BLOCKS];       /* one device dst per block */
    uint16_t *host_dst;        /* CPU fetch */
    uint16_t *back;            /* copied back from the device */
    size_t max_len;
} pair;

static void pair_open(pair *p, unsigned staging, prism_conductor *conductor)
{
    memset(p, 0, sizeof *p);
    for (int b = 0; b < N_BLOCKS; b++)
        if (block_len(b) > p->max_len)
            p->max_len = block_len(b);
    prism_error err = {0};
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = p->max_len * 2};
    CU_ASSERT_FATAL(prism_transfer_create(&o, &p->cpu, &err) == PRISM_OK);
    o.backend = PRISM_TRANSFER_CUDA;
    o.staging_buffers = staging;
    o.conductor = conductor;
    prism_status st = prism_transfer_create(&o, &p->cuda, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "create cuda: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    for (int b = 0; b < N_BLOCKS; b++) {
        size_t n = block_len(b);
        p->weights[b] = make_weights(n, (uint32_t)b + 1);
        CU_ASSERT_FATAL(prism_transfer_add_block(p->cpu, (uint32_t)b, p->weights[b], n, &err) == PRISM_OK);
        CU_ASSERT_FATAL(prism_transfer_add_block(p->cuda, (uint32_t)b, p->weights[b], n, &err) == PRISM_OK);
        CU_ASSERT_FATAL(cudaMalloc(&p->dev[b], n * 2) == cudaSuccess);
        CU_ASSERT_FATAL(cudaMemset(p->dev[b], 0xa5, n * 2) == cudaSuccess);
    }
    p->host_dst = malloc(p->max_len * 2);
    p->back = malloc(p->max_len * 2);
    CU_ASSERT_FATAL(p->host_dst && p->back);
}

static void pair_close(pair *p)
{
    prism_transfer_destroy(p->cpu);
    prism_transfer_destroy(p->cuda);
    for (int b = 0; b < N_BLOCKS; b++) {
        cudaFree(p->dev[b]);
        free(p->weights[b]);
    }
    free(p->host_dst);
    free(p->back);
}

/* Block b's device dst against the CPU backend's fetch of the same block and precision. */
static bool same_as_cpu(pair *p, int b, prism_precision prec)
{
    size_t n = block_len(b);
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_transfer_fetch(p->cpu, (uint32_t)b, prec, p->host_dst, NULL, NULL, &err) == PRISM_OK);
    CU_ASSERT_FATAL(cudaMemcpy(p->back, p->dev[b], n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    if (memcmp(p->back, p->host_dst, n * 2) == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        if (p->back[i] != p->host_dst[i]) {
            fprintf(stderr, "block %d (%zu elements) %s: element %zu is 0x%04x on the GPU, 0x%04x on the CPU\n", b, n,
                    prism_precision_name(prec), i, p->back[i], p->host_dst[i]);
            break;
        }
    return false;
}

/* Every block back to back in one precision, the host waiting only at the end. */
static void fetch_all_then_compare(pair *p, prism_precision prec)
{
    prism_error err = {0};
    prism_transfer_ticket tickets[N_BLOCKS];
    for (int b = 0; b < N_BLOCKS; b++) {
        prism_status st = prism_transfer_fetch(p->cuda, (uint32_t)b, prec, p->dev[b], NULL, &tickets[b], &err);
        if (st != PRISM_OK)
            fprintf(stderr, "fetch %d: %s\n", b, err.message);
        CU_ASSERT_FATAL(st == PRISM_OK);
    }
    for (int b = 0; b < N_BLOCKS; b++)
        CU_ASSERT_EQUAL(prism_transfer_ticket_wait(p->cuda, &tickets[b], &err), PRISM_OK);
    for (int b = 0; b < N_BLOCKS; b++) {
        bool done = false;
        CU_ASSERT_EQUAL(prism_transfer_ticket_query(p->cuda, &tickets[b], &done, &err), PRISM_OK);
        CU_ASSERT_TRUE(done);
        CU_ASSERT_TRUE(same_as_cpu(p, b, prec));
    }
}

static void test_every_precision_matches_the_cpu_through_each_staging_count(void)
{
    if (skip_without_device())
        return;
    static const unsigned stagings[] = {2, 1, 3};
    static const prism_precision precs[] = {PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                            PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
    for (size_t s = 0; s < sizeof stagings / sizeof stagings[0]; s++) {
        pair p;
        pair_open(&p, stagings[s], NULL);
        for (size_t k = 0; k < sizeof precs / sizeof precs[0]; k++)
            fetch_all_then_compare(&p, precs[k]);
        /* Counters agree with the CPU engine's for the same fetches (the CPU also fetched each
         * block once per precision in same_as_cpu). */
        prism_transfer_counters a, c;
        prism_transfer_get_counters(p.cpu, &a);
        prism_transfer_get_counters(p.cuda, &c);
        CU_ASSERT_EQUAL(memcmp(a.fetches, c.fetches, sizeof a.fetches), 0);
        CU_ASSERT_EQUAL(memcmp(a.wire_bytes, c.wire_bytes, sizeof a.wire_bytes), 0);
        CU_ASSERT_EQUAL(memcmp(a.bf16_bytes, c.bf16_bytes, sizeof a.bf16_bytes), 0);
        CU_ASSERT_EQUAL(a.prepares, c.prepares);
        CU_ASSERT_EQUAL(a.nonfinite, c.nonfinite);
        pair_close(&p);
    }
}

/* Precisions mixed from one fetch to the next, into the same few destinations, each fetch
 * ordered after the consumer's use of its dst (dst_stream) and the consumer waiting for it. */
static void test_mixed_precisions_with_a_consumer_stream(void)
{
    if (skip_without_device())
        return;
    pair p;
    pair_open(&p, 2, NULL);
    cudaStream_t consumer;
    CU_ASSERT_FATAL(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
    prism_error err = {0};
    for (int round = 0; round < 3; round++) {
        for (int b = 0; b < N_BLOCKS; b++) {
            prism_precision prec = (prism_precision)((b + round) % PRISM_PRECISION_COUNT);
            prism_transfer_ticket tk;
            CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)b, prec, p.dev[b], (prism_cuda_stream)consumer,
                                                 &tk, &err) == PRISM_OK);
            CU_ASSERT_FATAL(prism_transfer_ticket_wait_stream(p.cuda, &tk, (prism_cuda_stream)consumer, &err) ==
                            PRISM_OK);
        }
        CU_ASSERT_FATAL(cudaStreamSynchronize(consumer) == cudaSuccess);
        for (int b = 0; b < N_BLOCKS; b++)
            CU_ASSERT_TRUE(same_as_cpu(&p, b, (prism_precision)((b + round) % PRISM_PRECISION_COUNT)));
    }
    cudaStreamDestroy(consumer);
    pair_close(&p);
}

/* Two fetches into the same dst, no dst_stream, the host waiting only at the end: the later one
 * is what the dst holds, whichever streams wrote them (a BF16 copy after a dequantize, a
 * dequantize after a BF16 copy, two dequantizes). */
static void test_a_later_fetch_into_the_same_dst_wins(void)
{
    if (skip_without_device())
        return;
    static const prism_precision orders[][2] = {
        {PRISM_PRECISION_INT8, PRISM_PRECISION_BF16},
        {PRISM_PRECISION_BF16, PRISM_PRECISION_FP8_E4M3},
        {PRISM_PRECISION_INT4, PRISM_PRECISION_FP8_E5M2},
    };
    pair p;
    pair_open(&p, 2, NULL);
    prism_error err = {0};
    for (size_t k = 0; k < sizeof orders / sizeof orders[0]; k++) {
        /* Every block's dst gets block 8 (the largest) first, then its own block. */
        for (int b = 0; b < N_BLOCKS; b++) {
            if (block_len(8) <= block_len(b) || b == 8)
                continue;
            void *big = NULL;
            CU_ASSERT_FATAL(cudaMalloc(&big, block_len(8) * 2) == cudaSuccess);
            CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, 8, orders[k][0], big, NULL, NULL, &err) == PRISM_OK);
            CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)b, orders[k][1], big, NULL, NULL, &err) ==
                            PRISM_OK);
            CU_ASSERT_FATAL(prism_transfer_synchronize(p.cuda, &err) == PRISM_OK);
            CU_ASSERT_FATAL(cudaMemcpy(p.dev[b], big, block_len(b) * 2, cudaMemcpyDeviceToDevice) == cudaSuccess);
            CU_ASSERT_TRUE(same_as_cpu(&p, b, orders[k][1]));
            cudaFree(big);
        }
    }
    pair_close(&p);
}

static void test_update_block_while_old_weights_are_in_flight(void)
{
    if (skip_without_device())
        return;
    pair p;
    pair_open(&p, 2, NULL);
    prism_error err = {0};
    int big = 8; /* the 1M + 3 block */
    size_t n = block_len(big);
    uint16_t *fresh = make_weights(n, 777);
    for (int k = 0; k < 4; k++) {
        prism_precision prec = k % 2 ? PRISM_PRECISION_INT8 : PRISM_PRECISION_BF16;
        CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)big, prec, p.dev[big], NULL, NULL, &err) == PRISM_OK);
        /* The old weights may still be on the bus: the update must wait for them. */
        uint16_t *w = k % 2 ? p.weights[big] : fresh;
        CU_ASSERT_FATAL(prism_transfer_update_block(p.cuda, (uint32_t)big, w, n, &err) == PRISM_OK);
        CU_ASSERT_FATAL(prism_transfer_update_block(p.cpu, (uint32_t)big, w, n, &err) == PRISM_OK);
        CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)big, PRISM_PRECISION_FP8_E5M2, p.dev[big], NULL, NULL,
                                             &err) == PRISM_OK);
        CU_ASSERT_FATAL(prism_transfer_synchronize(p.cuda, &err) == PRISM_OK);
        CU_ASSERT_TRUE(same_as_cpu(&p, big, PRISM_PRECISION_FP8_E5M2));
    }
    free(fresh);
    pair_close(&p);
}

/* One H2D slot: prefetches beyond it are refused while a copy is in flight, demand fetches wait
 * for the engine's oldest copy, and every slot comes back. */
static void test_slots_pace_demand_fetches_and_refuse_prefetches(void)
{
    if (skip_without_device())
        return;
    prism_error err = {0};
    prism_conductor_limits l = prism_conductor_default_limits();
    l.max_inflight_h2d = 1;
    l.prefetch_window = 64;
    prism_conductor *c = NULL;
    CU_ASSERT_FATAL(prism_conductor_create(&l, &c, &err) == PRISM_OK);
    pair p;
    pair_open(&p, 2, c);
    for (int b = 0; b < N_BLOCKS; b++)
        CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)b, PRISM_PRECISION_INT8, p.dev[b], NULL, NULL,
                                             &err) == PRISM_OK);
    CU_ASSERT(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D) <= 1);
    prism_conductor_request why = {PRISM_CONDUCTOR_FORWARD, 1, 0, 0};
    prism_transfer_ticket tk;
    int big = 8;
    CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, (uint32_t)big, PRISM_PRECISION_BF16, p.dev[big], NULL, NULL,
                                         &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_transfer_prefetch(p.cuda, 0, PRISM_PRECISION_INT8, p.dev[0], NULL, &why, &tk, &err) ==
                    PRISM_OK);
    /* Either the 2 MiB copy was still in flight (refused) or it had finished (started). */
    CU_ASSERT(tk.verdict == PRISM_CONDUCTOR_REFUSE_SLOTS || tk.verdict == PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_FATAL(prism_transfer_synchronize(p.cuda, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);
    for (int b = 0; b < N_BLOCKS; b++)
        CU_ASSERT_TRUE(same_as_cpu(&p, b, b == big ? PRISM_PRECISION_BF16 : PRISM_PRECISION_INT8));
    prism_transfer_counters n;
    prism_transfer_get_counters(p.cuda, &n);
    CU_ASSERT_EQUAL(n.demand_over_limit, 0);
    printf("(demand waits %llu, prefetch %s) ", (unsigned long long)n.demand_waits,
           prism_conductor_verdict_name(tk.verdict));
    pair_close(&p);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);
    prism_conductor_destroy(c);
}

static void test_cuda_engine_without_a_device_is_unavailable(void)
{
    if (device_count() > 0)
        return;
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CUDA, .max_block_bytes = 1024};
    prism_transfer *t = NULL;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_transfer_create(&o, &t, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NULL(t);
}

static void test_bad_device_index_is_refused(void)
{
    if (skip_without_device())
        return;
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CUDA, .device = device_count(), .max_block_bytes = 1024};
    prism_transfer *t = NULL;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_transfer_create(&o, &t, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(strncmp(err.message, "device: ", 8), 0);
}

#ifdef PRISM_CUDAEMU
/* The paths a real GPU takes only by chance, made certain by holding the consumer's stream: a
 * fetch ordered after the consumer's use of its dst is not done while the consumer is behind
 * (its ticket says so; for BF16 its slot stays taken, so a prefetch is refused for slots), and
 * once the consumer moves on the fetch completes with the CPU's bytes and gives its slot back. */
static void test_fetches_wait_for_a_consumer_that_is_behind(void)
{
    prism_error err = {0};
    prism_conductor_limits l = prism_conductor_default_limits();
    l.max_inflight_h2d = 1;
    l.prefetch_window = 64;
    prism_conductor *c = NULL;
    CU_ASSERT_FATAL(prism_conductor_create(&l, &c, &err) == PRISM_OK);
    pair p;
    pair_open(&p, 2, c);
    cudaStream_t consumer;
    CU_ASSERT_FATAL(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
    CU_ASSERT_FATAL(prism_cudaemu_stream_hold(consumer) == cudaSuccess);
    for (int b = 0; b < 2; b++) {
        const prism_precision prec = b == 0 ? PRISM_PRECISION_INT8 : PRISM_PRECISION_BF16;
        prism_transfer_ticket tk;
        CU_ASSERT_FATAL(prism_transfer_fetch(p.cuda, 4, prec, p.dev[4], (prism_cuda_stream)consumer, &tk, &err) ==
                        PRISM_OK);
        bool done = true;
        CU_ASSERT_EQUAL(prism_transfer_ticket_query(p.cuda, &tk, &done, &err), PRISM_OK);
        CU_ASSERT_FALSE(done);
        if (prec == PRISM_PRECISION_BF16) {
            /* A BF16 block's copy goes straight into dst, so it is what waits for the consumer,
             * and holds its slot meanwhile. (A quantized block's copy into staging waits for
             * nothing of the consumer's: only its dequantize into dst does.) */
            CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 1);
            prism_conductor_request why = {PRISM_CONDUCTOR_FORWARD, 1, 0, 0};
            prism_transfer_ticket pre;
            CU_ASSERT_FATAL(prism_transfer_prefetch(p.cuda, 5, prec, p.dev[5], NULL, &why, &pre, &err) ==
                            PRISM_OK);
            CU_ASSERT_EQUAL(pre.verdict, PRISM_CONDUCTOR_REFUSE_SLOTS);
        }
        CU_ASSERT_FATAL(prism_cudaemu_stream_release(consumer) == cudaSuccess);
        CU_ASSERT_EQUAL(prism_transfer_ticket_wait(p.cuda, &tk, &err), PRISM_OK);
        CU_ASSERT_EQUAL(prism_transfer_ticket_query(p.cuda, &tk, &done, &err), PRISM_OK);
        CU_ASSERT_TRUE(done);
        CU_ASSERT_TRUE(same_as_cpu(&p, 4, prec));
        CU_ASSERT_FATAL(prism_transfer_synchronize(p.cuda, &err) == PRISM_OK);
        CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);
        if (b == 0)
            CU_ASSERT_FATAL(prism_cudaemu_stream_hold(consumer) == cudaSuccess);
    }
    CU_ASSERT(cudaStreamDestroy(consumer) == cudaSuccess);
    pair_close(&p);
    prism_conductor_destroy(c);
}
#endif

static const prism_test_case cases[] = {
    {"test_every_precision_matches_the_cpu_through_each_staging_count",
     test_every_precision_matches_the_cpu_through_each_staging_count},
    {"test_mixed_precisions_with_a_consumer_stream", test_mixed_precisions_with_a_consumer_stream},
    {"test_a_later_fetch_into_the_same_dst_wins", test_a_later_fetch_into_the_same_dst_wins},
    {"test_update_block_while_old_weights_are_in_flight", test_update_block_while_old_weights_are_in_flight},
    {"test_slots_pace_demand_fetches_and_refuse_prefetches", test_slots_pace_demand_fetches_and_refuse_prefetches},
    {"test_cuda_engine_without_a_device_is_unavailable", test_cuda_engine_without_a_device_is_unavailable},
    {"test_bad_device_index_is_refused", test_bad_device_index_is_refused},
#ifdef PRISM_CUDAEMU
    {"test_fetches_wait_for_a_consumer_that_is_behind", test_fetches_wait_for_a_consumer_that_is_behind},
#endif
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"transfer_cuda", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU-only checks below pass without running)\n");
    return prism_test_main(argc, argv, suites);
}
