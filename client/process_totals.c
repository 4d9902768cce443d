/* The process-wide totals of process_totals.h. */
#define _GNU_SOURCE
#include "process_totals.h"

#include <stdatomic.h>
#include <time.h>

static struct {
    _Atomic uint64_t transfers[PRISM_PRECISION_COUNT];
    _Atomic uint64_t transfer_bytes[PRISM_PRECISION_COUNT];
    _Atomic uint64_t transfer_bf16_bytes[PRISM_PRECISION_COUNT];
    _Atomic uint64_t collective_calls[PRISM_PRECISION_COUNT];
    _Atomic uint64_t collective_wire_bytes[PRISM_PRECISION_COUNT];
    _Atomic uint64_t collective_bf16_bytes[PRISM_PRECISION_COUNT];
    _Atomic uint64_t collective_ns[PRISM_PRECISION_COUNT];
} totals;

static void add(_Atomic uint64_t *v, uint64_t n)
{
    atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

static uint64_t get(_Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

void prism_totals_add_transfer(prism_precision precision, uint64_t image_bytes, uint64_t bf16_bytes)
{
    unsigned p = (unsigned)precision;
    if (p >= PRISM_PRECISION_COUNT)
        return;
    add(&totals.transfers[p], 1);
    add(&totals.transfer_bytes[p], image_bytes);
    add(&totals.transfer_bf16_bytes[p], bf16_bytes);
}

void prism_totals_add_collective(prism_precision wire, uint64_t wire_bytes, uint64_t bf16_bytes, uint64_t ns)
{
    unsigned p = (unsigned)wire;
    if (p >= PRISM_PRECISION_COUNT)
        return;
    add(&totals.collective_calls[p], 1);
    add(&totals.collective_wire_bytes[p], wire_bytes);
    add(&totals.collective_bf16_bytes[p], bf16_bytes);
    add(&totals.collective_ns[p], ns);
}

void prism_totals_read(prism_process_totals *out)
{
    for (unsigned p = 0; p < PRISM_PRECISION_COUNT; p++) {
        out->transfers[p] = get(&totals.transfers[p]);
        out->transfer_bytes[p] = get(&totals.transfer_bytes[p]);
        out->transfer_bf16_bytes[p] = get(&totals.transfer_bf16_bytes[p]);
        out->collective_calls[p] = get(&totals.collective_calls[p]);
        out->collective_wire_bytes[p] = get(&totals.collective_wire_bytes[p]);
        out->collective_bf16_bytes[p] = get(&totals.collective_bf16_bytes[p]);
        out->collective_ns[p] = get(&totals.collective_ns[p]);
    }
}

uint64_t prism_totals_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
