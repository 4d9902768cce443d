/* The limit counters (mem_limits.h). */
#include "mem_limits.h"

#include <stdbool.h>

prismd_limit_counters prismd_limits;

/* Takes one of max slots counted in *active (0: no limit); false, counted in *refused, when
 * all are taken. */
static bool take_slot(atomic_ullong *active, atomic_ullong *refused, size_t max)
{
    unsigned long long now = atomic_fetch_add(active, 1);
    if (max && now >= max) {
        atomic_fetch_sub(active, 1);
        atomic_fetch_add(refused, 1);
        return false;
    }
    return true;
}

bool prismd_streamed_answer_acquire(const prismd_memory_limits *m)
{
    return take_slot(&prismd_limits.streamed_answers_active, &prismd_limits.streamed_answers_refused,
                     m ? m->max_streamed_answers : 0);
}

void prismd_streamed_answer_release(void)
{
    atomic_fetch_sub(&prismd_limits.streamed_answers_active, 1);
}

bool prismd_metrics_stream_acquire(const prismd_memory_limits *m)
{
    return take_slot(&prismd_limits.metrics_streams_active, &prismd_limits.metrics_streams_refused,
                     m ? m->max_metrics_streams : 0);
}

void prismd_metrics_stream_release(void)
{
    atomic_fetch_sub(&prismd_limits.metrics_streams_active, 1);
}
