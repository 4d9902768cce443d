/* The limit counters (mem_limits.h). */
#include "mem_limits.h"

#include <stdbool.h>

prismd_limit_counters prismd_limits;

bool prismd_streamed_answer_acquire(const prismd_memory_limits *m)
{
    unsigned long long now = atomic_fetch_add(&prismd_limits.streamed_answers_active, 1);
    if (m && m->max_streamed_answers && now >= m->max_streamed_answers) {
        atomic_fetch_sub(&prismd_limits.streamed_answers_active, 1);
        atomic_fetch_add(&prismd_limits.streamed_answers_refused, 1);
        return false;
    }
    return true;
}

void prismd_streamed_answer_release(void)
{
    atomic_fetch_sub(&prismd_limits.streamed_answers_active, 1);
}
