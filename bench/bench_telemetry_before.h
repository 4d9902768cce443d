/* bench_policy's baseline: the telemetry record writer before issue 18 (bench_telemetry_before.c). */
#ifndef PRISM_BENCH_TELEMETRY_BEFORE_H
#define PRISM_BENCH_TELEMETRY_BEFORE_H

#include "telemetry.h"

/* prism_telemetry_append as it was written before issue 18: the same bytes, the old way. */
prism_status telemetry_append_before(prism_buf *b, const prism_policy *p, const prism_summary *s, double timestamp,
                                     const double *loss);

#endif
