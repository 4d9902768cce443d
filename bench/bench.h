/* What the benchmarks of prism-bench share (prism_bench.c, bench_transfer.c). */
#ifndef PRISM_BENCH_H
#define PRISM_BENCH_H

/* CLOCK_MONOTONIC in seconds. */
double bench_now_seconds(void);

/* One timed run of a benchmark: 0, or -1 after printing why it failed. */
typedef int (*bench_timed_fn)(void *ctx);

/* The median of 3 to 50 timings of fn after one untimed warm-up; their count fills about
 * `budget` seconds. -1 when a run failed. */
double bench_median_time(bench_timed_fn fn, void *ctx, double budget);

/* prism-bench transfer (bench_transfer.c). */
int bench_transfer_main(int argc, char **argv);

/* prism-bench scales (bench_scales.c): the scale modes of DESIGN 4.7 on the same inputs. */
int bench_scales_main(int argc, char **argv);

/* prism-bench allreduce (bench_allreduce.c), in builds with the MPI backend of the collectives
 * (PRISM_BENCH_MPI). */
int bench_allreduce_main(int argc, char **argv);

#endif
