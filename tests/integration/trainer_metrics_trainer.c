/* The trainer of test_trainer_metrics.py: a real libprism trainer (the client, the block transfer
 * engine and the MPI collectives, linked into one program as a C trainer links them) driven by
 * the test one command at a time, so that the test can start, stop and kill its prism-agent
 * between two of its steps.
 *
 * Usage: mpirun -np 2 trainer_metrics_trainer DIR PORT
 * Every rank first runs the same collectives (below); then rank 0 connects to 127.0.0.1:PORT,
 * where the test listens, and answers each command line with one line:
 *   open JOB NODE? -         opens its client on DIR (rank 0 of a world of 1, reconnect 1 ms) and
 *                            registers four blocks: "ok"
 *   begin STEP               prism_client_begin_step: "version V"
 *   report STEP A B C D      a StepReport with those l2 norms: "ok" or "dropped"
 *   fill K                   reports until one is dropped (the agent is not reading), then K
 *                            more, each of which must be dropped too: "returned_ok N"
 *   transfer                 block transfers on the CPU backend (below): "ok"
 *   line                     the trainer line as the table holds it, read through a mapping of
 *                            its own: "key=value ..." (every field)
 *   quit                     closes the client: "bye", and exits 0
 * Anything else, or a failure, is "error MESSAGE" and exit 1. Ranks other than 0 exit after the
 * collectives. */
#define _GNU_SOURCE
#include "hints.h"
#include "local.h"
#include "prism/client.h"
#include "prism/collectives_mpi.h"
#include "prism/transfer.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <mpi.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static FILE *out;

static int fail(const char *what, const char *message)
{
    fprintf(out ? out : stderr, "error %s: %s\n", what, message);
    if (out)
        fflush(out);
    return 1;
}

/* The collectives the test expects (its COLLECTIVES table): all-reduces of 1000 FP32 elements in
 * INT8 (twice) and of 3000 in FP8 E4M3, and a reduce-scatter of 600 in INT4, rows of 256. */
static int run_collectives(void)
{
    prism_coll_comm *comm = NULL;
    prism_error err;
    if (prism_coll_comm_from_mpi(MPI_COMM_WORLD, &comm, &err) != PRISM_OK)
        return fail("comm", err.message);
    static float data[3000], slice[3000];
    for (size_t i = 0; i < 3000; i++)
        data[i] = (float)(i % 17) * 0.25f - 2.0f;
    static const struct {
        prism_precision wire;
        size_t numel;
        bool reduce_scatter;
    } calls[] = {{PRISM_PRECISION_INT8, 1000, false},
                 {PRISM_PRECISION_INT8, 1000, false},
                 {PRISM_PRECISION_FP8_E4M3, 3000, false},
                 {PRISM_PRECISION_INT4, 600, true}};
    int rc = 0;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0] && !rc; i++) {
        prism_coll_spec spec = {.wire = calls[i].wire, .row_width = 256, .op = PRISM_COLL_SUM,
                                .scale_mode = PRISM_SCALE_FP32};
        prism_coll_tensor t = {.data = data, .numel = calls[i].numel, .dtype = PRISM_DTYPE_F32};
        prism_status s = calls[i].reduce_scatter
                             ? prism_coll_reduce_scatter(comm, &spec, &t, 1, slice, 3000, NULL, &err)
                             : prism_coll_allreduce(comm, &spec, &t, 1, NULL, &err);
        if (s != PRISM_OK)
            rc = fail("collective", err.message);
    }
    prism_coll_comm_destroy(comm);
    return rc;
}

/* The transfers the test expects (its TRANSFERS table): one block of 1024 BF16 elements fetched
 * once in BF16, twice in INT8, once each in FP8 E4M3 and E5M2, and three times in INT4. */
static int run_transfers(void)
{
    enum { NUMEL = 1024 };
    static uint16_t weights[NUMEL], dst[NUMEL];
    for (unsigned i = 0; i < NUMEL; i++)
        weights[i] = (uint16_t)(0x3f80 + (i % 64));
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = NUMEL * 2};
    prism_transfer *t = NULL;
    prism_error err;
    if (prism_transfer_create(&o, &t, &err) != PRISM_OK)
        return fail("transfer", err.message);
    static const struct {
        prism_precision p;
        unsigned times;
    } runs[] = {{PRISM_PRECISION_BF16, 1}, {PRISM_PRECISION_INT8, 2}, {PRISM_PRECISION_FP8_E4M3, 1},
                {PRISM_PRECISION_FP8_E5M2, 1}, {PRISM_PRECISION_INT4, 3}};
    int rc = 0;
    if (prism_transfer_add_block(t, 0, weights, NUMEL, &err) != PRISM_OK)
        rc = fail("transfer", err.message);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0] && !rc; r++)
        for (unsigned k = 0; k < runs[r].times && !rc; k++) {
            prism_transfer_ticket ticket;
            if (prism_transfer_fetch(t, 0, runs[r].p, dst, NULL, &ticket, &err) != PRISM_OK)
                rc = fail("transfer", err.message);
        }
    prism_transfer_destroy(t);
    return rc;
}

static void print_array(const char *name, const uint64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(out, " %s.%zu=%" PRIu64, name, i, v[i]);
}

/* The line as an agent reads it, through a mapping of its own. */
static int print_line(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, PRISM_LOCAL_HINTS_NAME);
    prism_hints t;
    prism_error err;
    if (prism_hints_open(&t, path, &err) != PRISM_OK)
        return fail("line", err.message);
    prism_hints_trainer l;
    bool ok = prism_hints_read_trainer(&t, &l);
    prism_hints_close(&t);
    if (!ok)
        return fail("line", "no consistent read");
    const prism_hints_trainer_ext *x = &l.ext;
    fprintf(out, "applied_version=%" PRIu64 " applied_step=%" PRIu64 " published=%" PRIu64
                 " reports_dropped=%" PRIu64 " late_switches=%" PRIu64 " reports_sent=%" PRIu64,
            l.applied_version, l.applied_step, l.published, l.reports_dropped, l.late_switches, x->reports_sent);
    print_array("dropped", x->dropped, PRISM_HINTS_DROP_REASONS);
    print_array("lag_buckets", x->lag_buckets, PRISM_HINTS_LAG_BUCKETS);
    fprintf(out, " lag_count=%" PRIu64 " lag_sum_ns=%" PRIu64, x->lag_count, x->lag_sum_ns);
    print_array("transfers", x->transfers, PRISM_PRECISION_COUNT);
    print_array("transfer_bytes", x->transfer_bytes, PRISM_PRECISION_COUNT);
    print_array("transfer_bf16_bytes", x->transfer_bf16_bytes, PRISM_PRECISION_COUNT);
    print_array("allreduce_calls", x->allreduce_calls, PRISM_PRECISION_COUNT);
    print_array("allreduce_wire_bytes", x->allreduce_wire_bytes, PRISM_PRECISION_COUNT);
    print_array("allreduce_bf16_bytes", x->allreduce_bf16_bytes, PRISM_PRECISION_COUNT);
    print_array("allreduce_ns", x->allreduce_ns, PRISM_PRECISION_COUNT);
    fputc('\n', out);
    return 0;
}

static prism_status report(prism_client *c, uint64_t step, const double norms[4])
{
    static const uint32_t ids[4] = {0, 1, 2, 3};
    prism_grad_stats st[4];
    for (int i = 0; i < 4; i++)
        st[i] = (prism_grad_stats){.l2_norm = norms[i], .max_abs = norms[i], .mean = 0, .variance = 0.01,
                                   .numel = 16};
    prism_error err;
    return prism_client_report_step(c, step, NULL, ids, st, 4, &err);
}

static int serve(const char *dir, FILE *in)
{
    static const uint64_t shape[] = {2, 4, 4};
    static const prism_block_layout blocks[] = {
        {"b0", 32, shape, 3, 0, 0, 0}, {"b1", 32, shape, 3, 0, 0, 0}, {"b2", 32, shape, 3, 0, 0, 0}, {"b3", 32, shape, 3, 0, 0, 0}};
    prism_client *c = NULL;
    char line[512];
    while (fgets(line, sizeof line, in)) {
        char cmd[32] = "", arg[256] = "";
        unsigned long long step = 0;
        double n[4] = {0};
        prism_error err;
        if (sscanf(line, "%31s", cmd) != 1)
            return fail("command", "empty");
        if (strcmp(cmd, "open") == 0 && sscanf(line, "open %255s", arg) == 1 && !c) {
            prism_client_options o = {.dir = dir, .job_id = arg, .rank = 0, .world_size = 1,
                                      .reconnect_interval_ms = 1};
            prism_model_layout layout = {.model_id = "trainer-metrics", .quant = {.format = PRISM_PRECISION_INT8,
                                         .granularity = PRISM_GRANULARITY_BLOCK}, .blocks = blocks, .n_blocks = 4};
            if (prism_client_open(&o, &c, &err) != PRISM_OK || prism_client_register(c, &layout, &err) != PRISM_OK)
                return fail("open", err.message);
            fprintf(out, "ok\n");
        } else if (strcmp(cmd, "begin") == 0 && sscanf(line, "begin %llu", &step) == 1 && c) {
            fprintf(out, "version %" PRIu64 "\n", prism_client_begin_step(c, step));
        } else if (strcmp(cmd, "report") == 0 &&
                   sscanf(line, "report %llu %lf %lf %lf %lf", &step, &n[0], &n[1], &n[2], &n[3]) == 5 && c) {
            fprintf(out, "%s\n", report(c, step, n) == PRISM_OK ? "ok" : "dropped");
        } else if (strcmp(cmd, "fill") == 0 && sscanf(line, "fill %llu", &step) == 1 && c) {
            static const double norms[4] = {1, 1, 1, 1};
            uint64_t returned_ok = 0;
            prism_status s = PRISM_OK;
            for (unsigned i = 0; i < 1000000 && (s = report(c, 1000 + i, norms)) == PRISM_OK; i++)
                returned_ok++;
            if (s == PRISM_OK)
                return fail("fill", "the socket never filled");
            for (unsigned long long k = 0; k < step; k++)
                if (report(c, 1000, norms) == PRISM_OK)
                    return fail("fill", "a report went out to an agent that is not reading");
            fprintf(out, "returned_ok %" PRIu64 "\n", returned_ok);
        } else if (strcmp(cmd, "transfer") == 0) {
            if (run_transfers())
                return 1;
            fprintf(out, "ok\n");
        } else if (strcmp(cmd, "line") == 0) {
            if (print_line(dir))
                return 1;
        } else if (strcmp(cmd, "quit") == 0) {
            prism_client_close(c);
            fprintf(out, "bye\n");
            fflush(out);
            return 0;
        } else {
            return fail("command", line);
        }
        fflush(out);
    }
    prism_client_close(c);
    return fail("command", "the test hung up");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = argc == 3 ? run_collectives() : fail("usage", "trainer_metrics_trainer DIR PORT");
    MPI_Finalize();
    if (rc || rank != 0)
        return rc;

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return fail("connect", "cannot reach the test");
    FILE *in = fdopen(fd, "r");
    out = fdopen(dup(fd), "w");
    if (!in || !out)
        return fail("connect", "fdopen");
    fprintf(out, "ready\n");
    fflush(out);
    rc = serve(argv[1], in);
    fclose(in);
    fclose(out);
    return rc;
}
