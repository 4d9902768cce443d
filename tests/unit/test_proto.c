/* The wire contract (DESIGN section 5, proto/prism/v1/prism.proto) as protobuf-c compiles it:
 * every AgentMessage and ServiceMessage kind survives pack + unpack with every field intact,
 * optional scalars keep "absent" apart from zero, the Precision numbers are the C
 * prism_precision values, field numbers stay where they were published, malformed bytes are
 * rejected with NULL, and the service lists exactly Connect, GetBlockMap and Watch. */
#define _GNU_SOURCE /* memmem */
#include "testutil.h"

#include "prism/common.h"
#include "prism/v1/prism.pb-c.h"
#include "wire_check.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Helpers */

/* Packs msg into a fresh buffer (caller frees) and checks that pack wrote exactly the size
 * get_packed_size promised. */
static uint8_t *pack_message(const ProtobufCMessage *msg, size_t *len)
{
    size_t size = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(size ? size : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    *len = protobuf_c_message_pack(msg, buf);
    CU_ASSERT_EQUAL(*len, size);
    return buf;
}

static Prism__V1__AgentMessage *agent_round_trip(const Prism__V1__AgentMessage *in)
{
    size_t len;
    uint8_t *buf = pack_message(&in->base, &len);
    Prism__V1__AgentMessage *out = prism__v1__agent_message__unpack(NULL, len, buf);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    return out;
}

static Prism__V1__ServiceMessage *service_round_trip(const Prism__V1__ServiceMessage *in)
{
    size_t len;
    uint8_t *buf = pack_message(&in->base, &len);
    Prism__V1__ServiceMessage *out = prism__v1__service_message__unpack(NULL, len, buf);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    return out;
}

#define ASSERT_EXACT(actual, expected) CU_ASSERT_DOUBLE_EQUAL((actual), (expected), 0.0)

/* A SHA-256-sized fingerprint with a zero byte in it, to show bytes are not strings. */
static void fill_fingerprint(uint8_t fp[32])
{
    for (unsigned i = 0; i < 32; i++)
        fp[i] = (uint8_t)(i * 37u);
}

static void assert_fingerprint(ProtobufCBinaryData got)
{
    uint8_t want[32];
    fill_fingerprint(want);
    CU_ASSERT_EQUAL_FATAL(got.len, 32);
    CU_ASSERT_EQUAL(memcmp(got.data, want, 32), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Fixtures: each message is built from a table of expected values, and the unpacked copy is
 * compared against the same table. */

static const struct grad_row {
    uint32_t block_id;
    double l2_norm, max_abs, mean, variance;
    uint64_t numel, nonfinite;
} grad_rows[] = {
    {0, 0.1, 0.75, -1.5e-7, 3.25e-9, 5000000000ull, 0},
    {7, 12.5, 1e30, 0.0, 0.0, 1, 3},
    {4294967295u, 2.0, 0.5, 0.25, 0.125, 0, 18446744073709551615ull},
};
#define GRAD_ROWS (sizeof grad_rows / sizeof grad_rows[0])

typedef struct step_report_fixture {
    Prism__V1__BlockGradStats stats[GRAD_ROWS];
    Prism__V1__BlockGradStats *stats_ptrs[GRAD_ROWS];
    Prism__V1__StepReport report;
    Prism__V1__AgentMessage msg;
} step_report_fixture;

/* A StepReport for step 123456789012 with the grad_rows; with_loss says whether loss is set. */
static void step_report_fixture_init(step_report_fixture *f, bool with_loss, double loss)
{
    for (size_t i = 0; i < GRAD_ROWS; i++) {
        Prism__V1__BlockGradStats s = PRISM__V1__BLOCK_GRAD_STATS__INIT;
        s.block_id = grad_rows[i].block_id;
        s.l2_norm = grad_rows[i].l2_norm;
        s.max_abs = grad_rows[i].max_abs;
        s.mean = grad_rows[i].mean;
        s.variance = grad_rows[i].variance;
        s.numel = grad_rows[i].numel;
        s.nonfinite = grad_rows[i].nonfinite;
        f->stats[i] = s;
        f->stats_ptrs[i] = &f->stats[i];
    }
    Prism__V1__StepReport r = PRISM__V1__STEP_REPORT__INIT;
    r.step = 123456789012ull;
    r.n_blocks = GRAD_ROWS;
    r.blocks = f->stats_ptrs;
    if (with_loss) {
        r.optional_loss_case = PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
        r.loss = loss;
    }
    f->report = r;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
    m.step_report = &f->report;
    f->msg = m;
}

static void assert_step_report_blocks(const Prism__V1__StepReport *r)
{
    CU_ASSERT_EQUAL(r->step, 123456789012ull);
    CU_ASSERT_EQUAL_FATAL(r->n_blocks, GRAD_ROWS);
    for (size_t i = 0; i < GRAD_ROWS; i++) {
        const Prism__V1__BlockGradStats *s = r->blocks[i];
        CU_ASSERT_EQUAL(s->block_id, grad_rows[i].block_id);
        ASSERT_EXACT(s->l2_norm, grad_rows[i].l2_norm);
        ASSERT_EXACT(s->max_abs, grad_rows[i].max_abs);
        ASSERT_EXACT(s->mean, grad_rows[i].mean);
        ASSERT_EXACT(s->variance, grad_rows[i].variance);
        CU_ASSERT_EQUAL(s->numel, grad_rows[i].numel);
        CU_ASSERT_EQUAL(s->nonfinite, grad_rows[i].nonfinite);
    }
}

static const struct precision_row {
    uint32_t block_id;
    Prism__V1__Precision precision;
    bool has_sensitivity;
    double sensitivity;
    Prism__V1__SwitchReason reason;
    uint64_t last_switch_step;
} precision_rows[] = {
    {0, PRISM__V1__PRECISION__BF16, true, 0.875, PRISM__V1__SWITCH_REASON__REASON_SCORE, 40},
    {1, PRISM__V1__PRECISION__FP8_E4M3, false, 0.0, PRISM__V1__SWITCH_REASON__REASON_OVERRIDE,
     30},
    {2, PRISM__V1__PRECISION__INT8, true, 0.0, PRISM__V1__SWITCH_REASON__REASON_NONE, 0},
    {3, PRISM__V1__PRECISION__INT4, true, 0.1, PRISM__V1__SWITCH_REASON__REASON_LOSS_SPIKE,
     9000000000ull},
    {9, PRISM__V1__PRECISION__BF16, false, 0.0, PRISM__V1__SWITCH_REASON__REASON_NONFINITE, 50},
};
#define PRECISION_ROWS (sizeof precision_rows / sizeof precision_rows[0])

typedef struct precision_map_fixture {
    Prism__V1__BlockPrecision blocks[PRECISION_ROWS];
    Prism__V1__BlockPrecision *block_ptrs[PRECISION_ROWS];
    Prism__V1__PrecisionUpdate update;
} precision_map_fixture;

static void precision_map_fixture_init(precision_map_fixture *f, bool full)
{
    for (size_t i = 0; i < PRECISION_ROWS; i++) {
        Prism__V1__BlockPrecision b = PRISM__V1__BLOCK_PRECISION__INIT;
        b.block_id = precision_rows[i].block_id;
        b.precision = precision_rows[i].precision;
        if (precision_rows[i].has_sensitivity) {
            b.optional_sensitivity_case =
                PRISM__V1__BLOCK_PRECISION__OPTIONAL_SENSITIVITY_SENSITIVITY;
            b.sensitivity = precision_rows[i].sensitivity;
        }
        b.reason = precision_rows[i].reason;
        b.last_switch_step = precision_rows[i].last_switch_step;
        f->blocks[i] = b;
        f->block_ptrs[i] = &f->blocks[i];
    }
    Prism__V1__PrecisionUpdate u = PRISM__V1__PRECISION_UPDATE__INIT;
    u.job_id = "job-llama-7b";
    u.map_version = 17;
    u.decided_step = 5000000000ull;
    u.effective_step = 5000000001ull;
    u.full = full;
    u.n_blocks = PRECISION_ROWS;
    u.blocks = f->block_ptrs;
    f->update = u;
}

static void assert_block_precisions(size_t n, Prism__V1__BlockPrecision *const *blocks)
{
    CU_ASSERT_EQUAL_FATAL(n, PRECISION_ROWS);
    for (size_t i = 0; i < PRECISION_ROWS; i++) {
        const Prism__V1__BlockPrecision *b = blocks[i];
        CU_ASSERT_EQUAL(b->block_id, precision_rows[i].block_id);
        CU_ASSERT_EQUAL(b->precision, precision_rows[i].precision);
        if (precision_rows[i].has_sensitivity) {
            CU_ASSERT_EQUAL(b->optional_sensitivity_case,
                            PRISM__V1__BLOCK_PRECISION__OPTIONAL_SENSITIVITY_SENSITIVITY);
            ASSERT_EXACT(b->sensitivity, precision_rows[i].sensitivity);
        } else {
            CU_ASSERT_EQUAL(b->optional_sensitivity_case,
                            PRISM__V1__BLOCK_PRECISION__OPTIONAL_SENSITIVITY__NOT_SET);
        }
        CU_ASSERT_EQUAL(b->reason, precision_rows[i].reason);
        CU_ASSERT_EQUAL(b->last_switch_step, precision_rows[i].last_switch_step);
    }
}

static void assert_precision_update(const Prism__V1__PrecisionUpdate *u, bool full)
{
    CU_ASSERT_STRING_EQUAL(u->job_id, "job-llama-7b");
    CU_ASSERT_EQUAL(u->map_version, 17);
    CU_ASSERT_EQUAL(u->decided_step, 5000000000ull);
    CU_ASSERT_EQUAL(u->effective_step, 5000000001ull);
    CU_ASSERT_EQUAL(u->full, full);
    assert_block_precisions(u->n_blocks, u->blocks);
}

static const struct error_row {
    uint32_t block_id;
    double relative_error;
} error_rows[] = {{0, 0.0125}, {1, 0.0}, {2, 0.5}, {47, 1e-9}};
#define ERROR_ROWS (sizeof error_rows / sizeof error_rows[0])

static void fill_block_errors(Prism__V1__BlockError errs[ERROR_ROWS],
                              Prism__V1__BlockError *ptrs[ERROR_ROWS])
{
    for (size_t i = 0; i < ERROR_ROWS; i++) {
        Prism__V1__BlockError e = PRISM__V1__BLOCK_ERROR__INIT;
        e.block_id = error_rows[i].block_id;
        e.relative_error = error_rows[i].relative_error;
        errs[i] = e;
        ptrs[i] = &errs[i];
    }
}

static void assert_block_errors(size_t n, Prism__V1__BlockError *const *errs)
{
    CU_ASSERT_EQUAL_FATAL(n, ERROR_ROWS);
    for (size_t i = 0; i < ERROR_ROWS; i++) {
        CU_ASSERT_EQUAL(errs[i]->block_id, error_rows[i].block_id);
        ASSERT_EXACT(errs[i]->relative_error, error_rows[i].relative_error);
    }
}

/* ---------------------------------------------------------------------------------------------
 * AgentMessage kinds */

static void test_hello_round_trips_with_device_profile_and_layout(void)
{
    Prism__V1__LinearCost quant = PRISM__V1__LINEAR_COST__INIT;
    quant.fixed_seconds = 1.5e-5;
    quant.seconds_per_byte = 2.5e-12;
    Prism__V1__LinearCost cast = PRISM__V1__LINEAR_COST__INIT;
    cast.fixed_seconds = 4e-6;
    cast.seconds_per_byte = 1e-12;
    Prism__V1__DeviceProfile dev = PRISM__V1__DEVICE_PROFILE__INIT;
    dev.device_class = "train-h100";
    dev.device_name = "NVIDIA H100 80GB HBM3";
    dev.memory_bytes = 85899345920ull;
    dev.bf16_ops_per_second = 9.89e14;
    dev.fp16_ops_per_second = 9.9e14;
    dev.int8_ops_per_second = 1.979e15;
    dev.fp8_ops_per_second = 1.978e15;
    dev.quantize_cost = &quant;
    dev.cast_cost = &cast;
    dev.h2d_bytes_per_second = 5.5e10;

    uint64_t shape0[] = {2, 4096, 4096, 1, 4096};
    Prism__V1__BlockInfo b0 = PRISM__V1__BLOCK_INFO__INIT;
    b0.id = 0;
    b0.name = "model.layers.0";
    b0.param_bytes_bf16 = 33562624;
    b0.n_shape = 5;
    b0.shape = shape0;
    Prism__V1__BlockInfo b1 = PRISM__V1__BLOCK_INFO__INIT; /* no shape, size unknown */
    b1.id = 1;
    b1.name = "lm_head";
    Prism__V1__BlockInfo *blocks[] = {&b0, &b1};
    uint8_t fp[32];
    fill_fingerprint(fp);
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.fingerprint.data = fp;
    layout.fingerprint.len = sizeof fp;
    layout.model_id = "meta-llama/Llama-2-7b@rev1";
    layout.n_blocks = 2;
    layout.blocks = blocks;

    Prism__V1__Hello hello = PRISM__V1__HELLO__INIT;
    hello.job_id = "job-llama-7b";
    hello.rank = 3;
    hello.world_size = 8;
    hello.node = "gpu-node-12";
    hello.token = "s3cr3t-token";
    hello.device = &dev;
    hello.layout = &layout;
    Prism__V1__AgentMessage in = PRISM__V1__AGENT_MESSAGE__INIT;
    in.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    in.hello = &hello;

    Prism__V1__AgentMessage *out = agent_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HELLO);
    const Prism__V1__Hello *h = out->hello;
    CU_ASSERT_STRING_EQUAL(h->job_id, "job-llama-7b");
    CU_ASSERT_EQUAL(h->rank, 3);
    CU_ASSERT_EQUAL(h->world_size, 8);
    CU_ASSERT_STRING_EQUAL(h->node, "gpu-node-12");
    CU_ASSERT_STRING_EQUAL(h->token, "s3cr3t-token");

    CU_ASSERT_PTR_NOT_NULL_FATAL(h->device);
    const Prism__V1__DeviceProfile *d = h->device;
    CU_ASSERT_STRING_EQUAL(d->device_class, "train-h100");
    CU_ASSERT_STRING_EQUAL(d->device_name, "NVIDIA H100 80GB HBM3");
    CU_ASSERT_EQUAL(d->memory_bytes, 85899345920ull);
    ASSERT_EXACT(d->bf16_ops_per_second, 9.89e14);
    ASSERT_EXACT(d->fp16_ops_per_second, 9.9e14);
    ASSERT_EXACT(d->int8_ops_per_second, 1.979e15);
    ASSERT_EXACT(d->fp8_ops_per_second, 1.978e15);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d->quantize_cost);
    ASSERT_EXACT(d->quantize_cost->fixed_seconds, 1.5e-5);
    ASSERT_EXACT(d->quantize_cost->seconds_per_byte, 2.5e-12);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d->cast_cost);
    ASSERT_EXACT(d->cast_cost->fixed_seconds, 4e-6);
    ASSERT_EXACT(d->cast_cost->seconds_per_byte, 1e-12);
    ASSERT_EXACT(d->h2d_bytes_per_second, 5.5e10);

    CU_ASSERT_PTR_NOT_NULL_FATAL(h->layout);
    const Prism__V1__ModelLayout *l = h->layout;
    assert_fingerprint(l->fingerprint);
    CU_ASSERT_STRING_EQUAL(l->model_id, "meta-llama/Llama-2-7b@rev1");
    CU_ASSERT_EQUAL_FATAL(l->n_blocks, 2);
    CU_ASSERT_EQUAL(l->blocks[0]->id, 0);
    CU_ASSERT_STRING_EQUAL(l->blocks[0]->name, "model.layers.0");
    CU_ASSERT_EQUAL(l->blocks[0]->param_bytes_bf16, 33562624);
    CU_ASSERT_EQUAL_FATAL(l->blocks[0]->n_shape, 5);
    for (size_t i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(l->blocks[0]->shape[i], shape0[i]);
    CU_ASSERT_EQUAL(l->blocks[1]->id, 1);
    CU_ASSERT_STRING_EQUAL(l->blocks[1]->name, "lm_head");
    CU_ASSERT_EQUAL(l->blocks[1]->param_bytes_bf16, 0);
    CU_ASSERT_EQUAL(l->blocks[1]->n_shape, 0);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

static void test_step_report_round_trips_with_loss_present(void)
{
    step_report_fixture f;
    step_report_fixture_init(&f, true, 2.3125);
    Prism__V1__AgentMessage *out = agent_round_trip(&f.msg);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    CU_ASSERT_EQUAL(out->step_report->optional_loss_case,
                    PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS);
    ASSERT_EXACT(out->step_report->loss, 2.3125);
    assert_step_report_blocks(out->step_report);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

/* A loss of exactly 0 is a value, not "no loss": presence survives the wire. */
static void test_step_report_keeps_zero_loss_apart_from_absent_loss(void)
{
    step_report_fixture f;
    step_report_fixture_init(&f, true, 0.0);
    Prism__V1__AgentMessage *out = agent_round_trip(&f.msg);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    CU_ASSERT_EQUAL(out->step_report->optional_loss_case,
                    PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS);
    ASSERT_EXACT(out->step_report->loss, 0.0);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

static void test_step_report_round_trips_with_loss_absent(void)
{
    step_report_fixture f;
    step_report_fixture_init(&f, false, 0.0);
    Prism__V1__AgentMessage *out = agent_round_trip(&f.msg);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    CU_ASSERT_EQUAL(out->step_report->optional_loss_case,
                    PRISM__V1__STEP_REPORT__OPTIONAL_LOSS__NOT_SET);
    assert_step_report_blocks(out->step_report);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

static void test_calibration_report_round_trips_with_every_block_error(void)
{
    Prism__V1__BlockError errs[ERROR_ROWS];
    Prism__V1__BlockError *err_ptrs[ERROR_ROWS];
    fill_block_errors(errs, err_ptrs);
    uint8_t fp[32];
    fill_fingerprint(fp);
    Prism__V1__CalibrationReport cal = PRISM__V1__CALIBRATION_REPORT__INIT;
    cal.fingerprint.data = fp;
    cal.fingerprint.len = sizeof fp;
    cal.format = PRISM__V1__PRECISION__FP8_E4M3;
    cal.samples = 4;
    cal.n_errors = ERROR_ROWS;
    cal.errors = err_ptrs;
    Prism__V1__AgentMessage in = PRISM__V1__AGENT_MESSAGE__INIT;
    in.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION;
    in.calibration = &cal;

    Prism__V1__AgentMessage *out = agent_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION);
    assert_fingerprint(out->calibration->fingerprint);
    CU_ASSERT_EQUAL(out->calibration->format, PRISM__V1__PRECISION__FP8_E4M3);
    CU_ASSERT_EQUAL(out->calibration->samples, 4);
    assert_block_errors(out->calibration->n_errors, out->calibration->errors);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

static void test_ack_round_trips_map_version_and_applied_step(void)
{
    Prism__V1__Ack ack = PRISM__V1__ACK__INIT;
    ack.map_version = 17;
    ack.applied_step = 5000000001ull;
    Prism__V1__AgentMessage in = PRISM__V1__AGENT_MESSAGE__INIT;
    in.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_ACK;
    in.ack = &ack;

    Prism__V1__AgentMessage *out = agent_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_ACK);
    CU_ASSERT_EQUAL(out->ack->map_version, 17);
    CU_ASSERT_EQUAL(out->ack->applied_step, 5000000001ull);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

static void test_heartbeat_round_trips_time_and_last_step(void)
{
    Prism__V1__Heartbeat hb = PRISM__V1__HEARTBEAT__INIT;
    hb.unix_time_ms = 1732252800123ull;
    hb.last_step = 99;
    Prism__V1__AgentMessage in = PRISM__V1__AGENT_MESSAGE__INIT;
    in.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT;
    in.heartbeat = &hb;

    Prism__V1__AgentMessage *out = agent_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT);
    CU_ASSERT_EQUAL(out->heartbeat->unix_time_ms, 1732252800123ull);
    CU_ASSERT_EQUAL(out->heartbeat->last_step, 99);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

/* A heartbeat with every field at its default still says which kind it is: an empty submessage
 * is sent, so the oneof case survives. */
static void test_empty_heartbeat_keeps_its_oneof_case(void)
{
    Prism__V1__Heartbeat hb = PRISM__V1__HEARTBEAT__INIT;
    Prism__V1__AgentMessage in = PRISM__V1__AGENT_MESSAGE__INIT;
    in.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT;
    in.heartbeat = &hb;

    Prism__V1__AgentMessage *out = agent_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT);
    CU_ASSERT_EQUAL(out->heartbeat->unix_time_ms, 0);
    CU_ASSERT_EQUAL(out->heartbeat->last_step, 0);
    prism__v1__agent_message__free_unpacked(out, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * ServiceMessage kinds */

static uint32_t force_bf16[] = {0, 7, 4294967295u};
static uint32_t force_int8[] = {3};

static void fill_policy_config(Prism__V1__PolicyConfig *c)
{
    Prism__V1__PolicyConfig v = PRISM__V1__POLICY_CONFIG__INIT;
    v.enabled = true;
    v.mode = PRISM__V1__POLICY_MODE__MODE_STATIC;
    v.bf16_threshold = 0.6;
    v.int8_threshold = 0.3;
    v.ambiguous_default = PRISM__V1__AMBIGUOUS_DEFAULT__AMBIGUOUS_LOW;
    v.hysteresis_margin = 0.1;
    v.grad_weight = 0.7;
    v.error_weight = 0.3;
    v.grad_sensitivity_threshold = 2.0;
    v.run_calibration = true;
    v.calibration_samples = 4;
    v.quant_error_threshold = 0.05;
    v.warmup_steps = 10;
    v.history_window = 5;
    v.update_interval_steps = 11;
    v.min_steps_between_switches = 20;
    v.n_force_bf16_blocks = 3;
    v.force_bf16_blocks = force_bf16;
    v.n_force_int8_blocks = 1;
    v.force_int8_blocks = force_int8;
    v.log_decisions = true;
    v.telemetry_enabled = true;
    v.telemetry_file = "selective_precision_telemetry.jsonl";
    v.low_precision = PRISM__V1__PRECISION__FP8_E5M2;
    v.apply_lag_steps = 1;
    v.step_timeout_ms = 2000;
    v.world_size = 8;
    *c = v;
}

static void assert_policy_config(const Prism__V1__PolicyConfig *c)
{
    CU_ASSERT_EQUAL(c->enabled, true);
    CU_ASSERT_EQUAL(c->mode, PRISM__V1__POLICY_MODE__MODE_STATIC);
    ASSERT_EXACT(c->bf16_threshold, 0.6);
    ASSERT_EXACT(c->int8_threshold, 0.3);
    CU_ASSERT_EQUAL(c->ambiguous_default, PRISM__V1__AMBIGUOUS_DEFAULT__AMBIGUOUS_LOW);
    ASSERT_EXACT(c->hysteresis_margin, 0.1);
    ASSERT_EXACT(c->grad_weight, 0.7);
    ASSERT_EXACT(c->error_weight, 0.3);
    ASSERT_EXACT(c->grad_sensitivity_threshold, 2.0);
    CU_ASSERT_EQUAL(c->run_calibration, true);
    CU_ASSERT_EQUAL(c->calibration_samples, 4);
    ASSERT_EXACT(c->quant_error_threshold, 0.05);
    CU_ASSERT_EQUAL(c->warmup_steps, 10);
    CU_ASSERT_EQUAL(c->history_window, 5);
    CU_ASSERT_EQUAL(c->update_interval_steps, 11);
    CU_ASSERT_EQUAL(c->min_steps_between_switches, 20);
    CU_ASSERT_EQUAL_FATAL(c->n_force_bf16_blocks, 3);
    CU_ASSERT_EQUAL(c->force_bf16_blocks[0], 0);
    CU_ASSERT_EQUAL(c->force_bf16_blocks[1], 7);
    CU_ASSERT_EQUAL(c->force_bf16_blocks[2], 4294967295u);
    CU_ASSERT_EQUAL_FATAL(c->n_force_int8_blocks, 1);
    CU_ASSERT_EQUAL(c->force_int8_blocks[0], 3);
    CU_ASSERT_EQUAL(c->log_decisions, true);
    CU_ASSERT_EQUAL(c->telemetry_enabled, true);
    CU_ASSERT_STRING_EQUAL(c->telemetry_file, "selective_precision_telemetry.jsonl");
    CU_ASSERT_EQUAL(c->low_precision, PRISM__V1__PRECISION__FP8_E5M2);
    CU_ASSERT_EQUAL(c->apply_lag_steps, 1);
    CU_ASSERT_EQUAL(c->step_timeout_ms, 2000);
    CU_ASSERT_EQUAL(c->world_size, 8);
}

static void fill_runtime_hints(Prism__V1__RuntimeHints *h)
{
    Prism__V1__RuntimeHints v = PRISM__V1__RUNTIME_HINTS__INIT;
    v.map_version = 17;
    v.max_inflight_h2d = 2;
    v.max_inflight_d2h = 1;
    v.prefetch_window = 3;
    v.vram_pressure_threshold = 0.8;
    v.suppress_prefetch_in_backward = true;
    v.suppress_prefetch_in_optimizer = false;
    *h = v;
}

static void assert_runtime_hints(const Prism__V1__RuntimeHints *h)
{
    CU_ASSERT_EQUAL(h->map_version, 17);
    CU_ASSERT_EQUAL(h->max_inflight_h2d, 2);
    CU_ASSERT_EQUAL(h->max_inflight_d2h, 1);
    CU_ASSERT_EQUAL(h->prefetch_window, 3);
    ASSERT_EXACT(h->vram_pressure_threshold, 0.8);
    CU_ASSERT_EQUAL(h->suppress_prefetch_in_backward, true);
    CU_ASSERT_EQUAL(h->suppress_prefetch_in_optimizer, false);
}

typedef struct welcome_fixture {
    Prism__V1__PolicyConfig config;
    precision_map_fixture map;
    Prism__V1__BlockError errs[ERROR_ROWS];
    Prism__V1__BlockError *err_ptrs[ERROR_ROWS];
    Prism__V1__CalibrationErrors cached[2];
    Prism__V1__CalibrationErrors *cached_ptrs[2];
    Prism__V1__RuntimeHints hints;
    Prism__V1__Welcome welcome;
    Prism__V1__ServiceMessage msg;
} welcome_fixture;

/* A Welcome with a full config, the full map, cached errors for int8 (the error table) and
 * fp8_e4m3 (no blocks), and hints. */
static void welcome_fixture_init(welcome_fixture *f)
{
    fill_policy_config(&f->config);
    precision_map_fixture_init(&f->map, true);
    fill_block_errors(f->errs, f->err_ptrs);
    Prism__V1__CalibrationErrors c0 = PRISM__V1__CALIBRATION_ERRORS__INIT;
    c0.format = PRISM__V1__PRECISION__INT8;
    c0.n_errors = ERROR_ROWS;
    c0.errors = f->err_ptrs;
    Prism__V1__CalibrationErrors c1 = PRISM__V1__CALIBRATION_ERRORS__INIT;
    c1.format = PRISM__V1__PRECISION__FP8_E4M3;
    f->cached[0] = c0;
    f->cached[1] = c1;
    f->cached_ptrs[0] = &f->cached[0];
    f->cached_ptrs[1] = &f->cached[1];
    fill_runtime_hints(&f->hints);
    Prism__V1__Welcome w = PRISM__V1__WELCOME__INIT;
    w.config = &f->config;
    w.map = &f->map.update;
    w.calibration_needed = false;
    w.n_cached_errors = 2;
    w.cached_errors = f->cached_ptrs;
    w.hints = &f->hints;
    f->welcome = w;
    Prism__V1__ServiceMessage m = PRISM__V1__SERVICE_MESSAGE__INIT;
    m.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_WELCOME;
    m.welcome = &f->welcome;
    f->msg = m;
}

static void test_welcome_round_trips_config_map_cached_errors_and_hints(void)
{
    welcome_fixture f;
    welcome_fixture_init(&f);
    Prism__V1__ServiceMessage *out = service_round_trip(&f.msg);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__SERVICE_MESSAGE__KIND_WELCOME);
    const Prism__V1__Welcome *w = out->welcome;
    CU_ASSERT_PTR_NOT_NULL_FATAL(w->config);
    assert_policy_config(w->config);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w->map);
    assert_precision_update(w->map, true);
    CU_ASSERT_EQUAL(w->calibration_needed, false);
    CU_ASSERT_EQUAL_FATAL(w->n_cached_errors, 2);
    CU_ASSERT_EQUAL(w->cached_errors[0]->format, PRISM__V1__PRECISION__INT8);
    assert_block_errors(w->cached_errors[0]->n_errors, w->cached_errors[0]->errors);
    CU_ASSERT_EQUAL(w->cached_errors[1]->format, PRISM__V1__PRECISION__FP8_E4M3);
    CU_ASSERT_EQUAL(w->cached_errors[1]->n_errors, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w->hints);
    assert_runtime_hints(w->hints);
    prism__v1__service_message__free_unpacked(out, NULL);
}

/* A partial update (full = false) keeps blocks without a score apart from blocks scored 0. */
static void test_precision_update_round_trips_with_sensitivity_absent_and_zero(void)
{
    precision_map_fixture f;
    precision_map_fixture_init(&f, false);
    Prism__V1__ServiceMessage in = PRISM__V1__SERVICE_MESSAGE__INIT;
    in.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_UPDATE;
    in.update = &f.update;

    Prism__V1__ServiceMessage *out = service_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__SERVICE_MESSAGE__KIND_UPDATE);
    assert_precision_update(out->update, false);
    prism__v1__service_message__free_unpacked(out, NULL);
}

static void test_runtime_hints_round_trip_every_limit(void)
{
    Prism__V1__RuntimeHints hints;
    fill_runtime_hints(&hints);
    Prism__V1__ServiceMessage in = PRISM__V1__SERVICE_MESSAGE__INIT;
    in.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_HINTS;
    in.hints = &hints;

    Prism__V1__ServiceMessage *out = service_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__SERVICE_MESSAGE__KIND_HINTS);
    assert_runtime_hints(out->hints);
    prism__v1__service_message__free_unpacked(out, NULL);
}

static void test_error_round_trips_grpc_code_and_message(void)
{
    Prism__V1__Error err = PRISM__V1__ERROR__INIT;
    err.code = 7; /* PERMISSION_DENIED */
    err.message = "wrong token for job \"job-llama-7b\"";
    Prism__V1__ServiceMessage in = PRISM__V1__SERVICE_MESSAGE__INIT;
    in.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_ERROR;
    in.error = &err;

    Prism__V1__ServiceMessage *out = service_round_trip(&in);
    CU_ASSERT_EQUAL_FATAL(out->kind_case, PRISM__V1__SERVICE_MESSAGE__KIND_ERROR);
    CU_ASSERT_EQUAL(out->error->code, 7);
    CU_ASSERT_STRING_EQUAL(out->error->message, "wrong token for job \"job-llama-7b\"");
    prism__v1__service_message__free_unpacked(out, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * GetBlockMap and Watch messages */

static void test_block_map_round_trips_every_block(void)
{
    precision_map_fixture f;
    precision_map_fixture_init(&f, true);
    Prism__V1__BlockMap in = PRISM__V1__BLOCK_MAP__INIT;
    in.job_id = "job-llama-7b";
    in.map_version = 17;
    in.decided_step = 5000000000ull;
    in.effective_step = 5000000001ull;
    in.n_blocks = PRECISION_ROWS;
    in.blocks = f.block_ptrs;

    size_t len;
    uint8_t *buf = pack_message(&in.base, &len);
    Prism__V1__BlockMap *out = prism__v1__block_map__unpack(NULL, len, buf);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_STRING_EQUAL(out->job_id, "job-llama-7b");
    CU_ASSERT_EQUAL(out->map_version, 17);
    CU_ASSERT_EQUAL(out->decided_step, 5000000000ull);
    CU_ASSERT_EQUAL(out->effective_step, 5000000001ull);
    assert_block_precisions(out->n_blocks, out->blocks);
    prism__v1__block_map__free_unpacked(out, NULL);
}

static void test_block_map_request_and_watch_request_round_trip(void)
{
    Prism__V1__BlockMapRequest req = PRISM__V1__BLOCK_MAP_REQUEST__INIT;
    req.job_id = "job-a";
    size_t len;
    uint8_t *buf = pack_message(&req.base, &len);
    Prism__V1__BlockMapRequest *req_out = prism__v1__block_map_request__unpack(NULL, len, buf);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(req_out);
    CU_ASSERT_STRING_EQUAL(req_out->job_id, "job-a");
    prism__v1__block_map_request__free_unpacked(req_out, NULL);

    Prism__V1__WatchRequest watch = PRISM__V1__WATCH_REQUEST__INIT;
    watch.job_id = "job-b";
    watch.after_version = 42;
    buf = pack_message(&watch.base, &len);
    Prism__V1__WatchRequest *watch_out = prism__v1__watch_request__unpack(NULL, len, buf);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(watch_out);
    CU_ASSERT_STRING_EQUAL(watch_out->job_id, "job-b");
    CU_ASSERT_EQUAL(watch_out->after_version, 42);
    prism__v1__watch_request__free_unpacked(watch_out, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Enums and descriptors */

static void test_precision_numbers_equal_c_prism_precision(void)
{
    static const struct {
        Prism__V1__Precision wire;
        prism_precision c;
    } rows[] = {
        {PRISM__V1__PRECISION__BF16, PRISM_PRECISION_BF16},
        {PRISM__V1__PRECISION__INT8, PRISM_PRECISION_INT8},
        {PRISM__V1__PRECISION__FP8_E4M3, PRISM_PRECISION_FP8_E4M3},
        {PRISM__V1__PRECISION__FP8_E5M2, PRISM_PRECISION_FP8_E5M2},
        {PRISM__V1__PRECISION__INT4, PRISM_PRECISION_INT4},
    };
    CU_ASSERT_EQUAL(sizeof rows / sizeof rows[0], PRISM_PRECISION_COUNT);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        CU_ASSERT_EQUAL((int)rows[i].wire, (int)rows[i].c);
}

/* The wire enum has exactly the C formats, and each value's proto name is the C name in upper
 * case ("FP8_E4M3" for "fp8_e4m3"), so nothing can be added on one side only. */
static void test_precision_enum_names_match_c_precision_names(void)
{
    const ProtobufCEnumDescriptor *d = &prism__v1__precision__descriptor;
    CU_ASSERT_STRING_EQUAL(d->name, "prism.v1.Precision");
    CU_ASSERT_EQUAL_FATAL(d->n_values, PRISM_PRECISION_COUNT);
    for (int p = 0; p < PRISM_PRECISION_COUNT; p++) {
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(v);
        char upper[32];
        const char *c_name = prism_precision_name((prism_precision)p);
        size_t n = strlen(c_name);
        CU_ASSERT_FATAL(n < sizeof upper);
        for (size_t i = 0; i <= n; i++)
            upper[i] = (c_name[i] >= 'a' && c_name[i] <= 'z') ? (char)(c_name[i] - 'a' + 'A')
                                                             : c_name[i];
        CU_ASSERT_STRING_EQUAL(v->name, upper);
    }
}

/* Every field of every message at the number it was published with. A renumbered field fails
 * here; a new field must be added to this table, deliberately. */
static void test_field_numbers_match_the_published_contract(void)
{
    static const struct {
        const ProtobufCMessageDescriptor *desc;
        const char *fields; /* "name=number ..." */
    } rows[] = {
        {&prism__v1__linear_cost__descriptor, "fixed_seconds=1 seconds_per_byte=2"},
        {&prism__v1__device_profile__descriptor,
         "device_class=1 device_name=2 memory_bytes=3 bf16_ops_per_second=4 "
         "fp16_ops_per_second=5 int8_ops_per_second=6 fp8_ops_per_second=7 quantize_cost=8 "
         "cast_cost=9 h2d_bytes_per_second=10"},
        {&prism__v1__block_info__descriptor,
         "id=1 name=2 param_bytes_bf16=3 shape=4 flops=5 activation_bytes_bf16=6 state_bytes=7"},
        {&prism__v1__model_layout__descriptor, "fingerprint=1 model_id=2 blocks=3"},
        {&prism__v1__hello__descriptor,
         "job_id=1 rank=2 world_size=3 node=4 token=5 device=6 layout=7"},
        {&prism__v1__block_grad_stats__descriptor,
         "block_id=1 l2_norm=2 max_abs=3 mean=4 variance=5 numel=6 nonfinite=7 saturated_fraction=8 "
         "underflowed_fraction=9"},
        {&prism__v1__step_report__descriptor, "step=1 loss=2 blocks=3 tensor_stats=4"},
        {&prism__v1__block_tensor_stats__descriptor,
         "block_id=1 x_l2=2 x_max_abs=3 x_numel=4 w_l2=5 w_max_abs=6 w_numel=7 y_numel=8"},
        {&prism__v1__block_error__descriptor, "block_id=1 relative_error=2"},
        {&prism__v1__calibration_report__descriptor,
         "fingerprint=1 format=2 samples=3 errors=4"},
        {&prism__v1__ack__descriptor, "map_version=1 applied_step=2"},
        {&prism__v1__heartbeat__descriptor,
         "unix_time_ms=1 last_step=2 trainer_reports_dropped=3 trainer_late_switches=4"},
        {&prism__v1__agent_message__descriptor,
         "hello=1 step_report=2 calibration=3 ack=4 heartbeat=5"},
        {&prism__v1__policy_config__descriptor,
         "enabled=1 mode=2 bf16_threshold=3 int8_threshold=4 ambiguous_default=5 "
         "hysteresis_margin=6 grad_weight=7 error_weight=8 grad_sensitivity_threshold=9 "
         "run_calibration=10 calibration_samples=11 quant_error_threshold=12 warmup_steps=13 "
         "history_window=14 update_interval_steps=15 min_steps_between_switches=16 "
         "force_bf16_blocks=17 force_int8_blocks=18 log_decisions=19 telemetry_enabled=20 "
         "telemetry_file=21 low_precision=22 apply_lag_steps=23 step_timeout_ms=24 "
         "world_size=25 low_precision_auto=26 low_formats=27 scale_mode=28 amax_history_len=29 "
         "scale_margin=30"},
        {&prism__v1__block_precision__descriptor,
         "block_id=1 precision=2 sensitivity=3 reason=4 last_switch_step=5"},
        {&prism__v1__precision_update__descriptor,
         "job_id=1 map_version=2 decided_step=3 effective_step=4 full=5 blocks=6 compute_plan=7"},
        {&prism__v1__compute_plan__descriptor,
         "device_class=1 low_format=2 high_format=3 low_blocks=4 predicted_iteration_seconds=5 "
         "compute_seconds=6"},
        {&prism__v1__calibration_errors__descriptor, "format=1 errors=2"},
        {&prism__v1__runtime_hints__descriptor,
         "map_version=1 max_inflight_h2d=2 max_inflight_d2h=3 prefetch_window=4 "
         "vram_pressure_threshold=5 suppress_prefetch_in_backward=6 "
         "suppress_prefetch_in_optimizer=7"},
        {&prism__v1__welcome__descriptor,
         "config=1 map=2 calibration_needed=3 cached_errors=4 hints=5 calibration_formats=6"},
        {&prism__v1__error__descriptor, "code=1 message=2"},
        {&prism__v1__service_message__descriptor, "welcome=1 update=2 hints=3 error=4 config=5"},
        {&prism__v1__block_map_request__descriptor, "job_id=1"},
        {&prism__v1__block_map__descriptor,
         "job_id=1 map_version=2 decided_step=3 effective_step=4 blocks=5"},
        {&prism__v1__watch_request__descriptor, "job_id=1 after_version=2"},
        /* the binary trace (DESIGN 4.6): files users keep, read by later prismctl versions */
        {&prism__v1__trace_header__descriptor,
         "trace_version=1 job_id=2 segment=3 unix_time_ms=4 config_json=5 restored=6 gap_before=7"},
        {&prism__v1__trace_step__descriptor, "merged=1 ranks=2 map_version_bumped=3"},
        {&prism__v1__trace_record__descriptor, "header=1 layout=2 calibration=3 config_json=4 step=5"},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const char *p = rows[r].fields;
        unsigned listed = 0;
        char name[64];
        unsigned number;
        int used;
        while (sscanf(p, " %63[^=]=%u%n", name, &number, &used) == 2) {
            const ProtobufCFieldDescriptor *fd =
                protobuf_c_message_descriptor_get_field_by_name(rows[r].desc, name);
            if (!fd) {
                fprintf(stderr, "\n%s has no field %s\n", rows[r].desc->name, name);
                CU_FAIL("field missing");
            } else if (fd->id != number) {
                fprintf(stderr, "\n%s.%s is %u, published as %u\n", rows[r].desc->name, name,
                        fd->id, number);
                CU_FAIL("field renumbered");
            }
            listed++;
            p += used;
        }
        if (rows[r].desc->n_fields != listed)
            fprintf(stderr, "\n%s has %u fields, the table lists %u\n", rows[r].desc->name,
                    rows[r].desc->n_fields, listed);
        CU_ASSERT_EQUAL(rows[r].desc->n_fields, listed);
    }
}

static void test_policy_service_lists_connect_getblockmap_watch(void)
{
    static const struct {
        const char *method, *input, *output;
    } want[] = {
        {"Connect", "prism.v1.AgentMessage", "prism.v1.ServiceMessage"},
        {"GetBlockMap", "prism.v1.BlockMapRequest", "prism.v1.BlockMap"},
        {"Watch", "prism.v1.WatchRequest", "prism.v1.PrecisionUpdate"},
    };
    const ProtobufCServiceDescriptor *d = &prism__v1__policy_service__descriptor;
    CU_ASSERT_STRING_EQUAL(d->name, "prism.v1.PolicyService");
    CU_ASSERT_STRING_EQUAL(d->package, "prism.v1");
    CU_ASSERT_EQUAL_FATAL(d->n_methods, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ProtobufCMethodDescriptor *m = &d->methods[i];
        CU_ASSERT_STRING_EQUAL(m->name, want[i].method);
        CU_ASSERT_STRING_EQUAL(m->input->name, want[i].input);
        CU_ASSERT_STRING_EQUAL(m->output->name, want[i].output);
        CU_ASSERT_PTR_EQUAL(protobuf_c_service_descriptor_get_method_by_name(d, want[i].method),
                            m);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Malformed input */

/* An AgentMessage is one length-delimited field, so every strict, non-empty prefix of it ends
 * inside that field and must be rejected. */
static void test_every_truncation_of_a_step_report_is_rejected(void)
{
    step_report_fixture f;
    step_report_fixture_init(&f, true, 1.0);
    size_t len;
    uint8_t *buf = pack_message(&f.msg.base, &len);
    CU_ASSERT_FATAL(len > 10);
    for (size_t cut = 1; cut < len; cut++) {
        Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, cut, buf);
        CU_ASSERT_PTR_NULL(m);
        if (m)
            prism__v1__agent_message__free_unpacked(m, NULL);
    }
    free(buf);
}

static void test_every_truncation_of_a_welcome_is_rejected(void)
{
    welcome_fixture f;
    welcome_fixture_init(&f);
    size_t len;
    uint8_t *buf = pack_message(&f.msg.base, &len);
    CU_ASSERT_FATAL(len > 100);
    for (size_t cut = 1; cut < len; cut++) {
        Prism__V1__ServiceMessage *m = prism__v1__service_message__unpack(NULL, cut, buf);
        CU_ASSERT_PTR_NULL(m);
        if (m)
            prism__v1__service_message__free_unpacked(m, NULL);
    }
    free(buf);
}

/* Zero bytes are a valid, empty message: it unpacks, and says no kind. Receivers must check
 * kind_case. */
static void test_empty_bytes_unpack_to_a_message_with_no_kind(void)
{
    static const uint8_t none[1] = {0};
    Prism__V1__AgentMessage *a = prism__v1__agent_message__unpack(NULL, 0, none);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(a->kind_case, PRISM__V1__AGENT_MESSAGE__KIND__NOT_SET);
    prism__v1__agent_message__free_unpacked(a, NULL);
    Prism__V1__ServiceMessage *s = prism__v1__service_message__unpack(NULL, 0, none);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(s->kind_case, PRISM__V1__SERVICE_MESSAGE__KIND__NOT_SET);
    prism__v1__service_message__free_unpacked(s, NULL);
}

static void test_malformed_bytes_are_rejected_with_null(void)
{
    static const struct {
        const char *what;
        size_t len;
        uint8_t bytes[16];
    } rows[] = {
        {"length runs past the end", 3, {0x0a, 0x05, 0x01}},
        {"length varint cut off", 2, {0x0a, 0x80}},
        {"huge length", 11, {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
        {"tag varint never ends", 12,
         {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
        {"wire type 7 does not exist", 2, {0x0f, 0x00}},
        {"wire type 6 does not exist", 2, {0x0e, 0x00}},
        {"hello sent as a varint", 2, {0x08, 0x01}},
        {"step_report sent as fixed64", 9, {0x11, 1, 2, 3, 4, 5, 6, 7, 8}},
        {"fixed32 cut off", 3, {0x7d, 0x01, 0x02}},
        {"garbage inside hello", 4, {0x0a, 0x02, 0x0f, 0x00}},
        {"hello.rank with a length past the end", 5, {0x0a, 0x03, 0x12, 0x05, 0x41}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        Prism__V1__AgentMessage *m =
            prism__v1__agent_message__unpack(NULL, rows[i].len, rows[i].bytes);
        if (m) {
            fprintf(stderr, "\naccepted: %s\n", rows[i].what);
            prism__v1__agent_message__free_unpacked(m, NULL);
        }
        CU_ASSERT_PTR_NULL(m);
        Prism__V1__ServiceMessage *s =
            prism__v1__service_message__unpack(NULL, rows[i].len, rows[i].bytes);
        if (s) {
            fprintf(stderr, "\naccepted as ServiceMessage: %s\n", rows[i].what);
            prism__v1__service_message__free_unpacked(s, NULL);
        }
        CU_ASSERT_PTR_NULL(s);
    }
}

/* A field this build does not know (added by a newer peer) is skipped, not an error: the
 * compatibility rule depends on it. */
static void test_unknown_fields_are_skipped(void)
{
    /* heartbeat {unix_time_ms: 5, field 9 varint 1}, then AgentMessage field 100 varint 7 */
    static const uint8_t bytes[] = {0x2a, 0x04, 0x08, 0x05, 0x48, 0x01, 0xa0, 0x06, 0x07};
    Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, sizeof bytes, bytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT);
    CU_ASSERT_EQUAL(m->heartbeat->unix_time_ms, 5);
    CU_ASSERT_EQUAL(m->heartbeat->last_step, 0);
    prism__v1__agent_message__free_unpacked(m, NULL);
}

static uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Random bytes, and valid messages with random bytes flipped, never crash the decoder (the
 * sanitizer build checks the memory side), and whatever it accepts packs again into bytes it
 * accepts. */
static void test_random_and_corrupted_bytes_never_crash_the_decoder(void)
{
    welcome_fixture f;
    welcome_fixture_init(&f);
    size_t welcome_len;
    uint8_t *welcome = pack_message(&f.msg.base, &welcome_len);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint8_t buf[512];
    unsigned not_repackable = 0;
    for (int iter = 0; iter < 20000; iter++) {
        size_t len;
        if (iter % 2 == 0) {
            len = (size_t)(xorshift64(&seed) % 64);
            for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)xorshift64(&seed);
        } else {
            len = welcome_len < sizeof buf ? welcome_len : sizeof buf;
            memcpy(buf, welcome, len);
            for (int flips = 0; flips < 3; flips++)
                buf[xorshift64(&seed) % len] = (uint8_t)xorshift64(&seed);
        }
        const ProtobufCMessageDescriptor *desc = (iter / 2) % 2
                                                     ? &prism__v1__service_message__descriptor
                                                     : &prism__v1__agent_message__descriptor;
        ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, buf);
        if (!m)
            continue;
        size_t again_len;
        uint8_t *again = pack_message(m, &again_len);
        ProtobufCMessage *m2 = protobuf_c_message_unpack(desc, NULL, again_len, again);
        if (!m2)
            not_repackable++;
        else
            protobuf_c_message_free_unpacked(m2, NULL);
        free(again);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    free(welcome);
    CU_ASSERT_EQUAL(not_repackable, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Strings checked before unpacking (proto/wire_check.h) */

/* A Hello for job "jobAB" with one layout block named "blockCD", packed; the test then puts
 * bytes of its choice where "AB" or "CD" stand (same length, so the framing stays valid). */
static uint8_t *hello_with_marks(size_t *len)
{
    Prism__V1__BlockInfo b = PRISM__V1__BLOCK_INFO__INIT;
    b.id = 3;
    b.name = "blockCD";
    Prism__V1__BlockInfo *blocks[] = {&b};
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.n_blocks = 1;
    layout.blocks = blocks;
    Prism__V1__Hello h = PRISM__V1__HELLO__INIT;
    h.job_id = "jobAB";
    h.layout = &layout;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    m.hello = &h;
    return pack_message(&m.base, len);
}

static void put_mark(uint8_t *buf, size_t len, const char *mark, uint8_t b0, uint8_t b1)
{
    uint8_t *at = memmem(buf, len, mark, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    at[0] = b0;
    at[1] = b1;
}

/* Each row: two bytes put in the job id ("AB") or the block name ("CD"), and the path the
 * check must name ("" when the message is fine). */
static void test_strings_with_a_nul_or_bad_utf8_are_refused_by_path(void)
{
    static const struct {
        const char *mark;
        uint8_t b0, b1;
        const char *path;
    } rows[] = {
        {"AB", 'x', 'y', ""},                                  /* plain ASCII */
        {"AB", 0xc3, 0xa9, ""},                                /* U+00E9, two bytes */
        {"AB", 'x', 0x00, "hello.job_id"},                     /* "jobx\0": joined "jobx" before */
        {"AB", 0x00, 'y', "hello.job_id"},
        {"AB", 0xc0, 0x80, "hello.job_id"},                    /* overlong NUL */
        {"AB", 0xff, 'y', "hello.job_id"},                     /* never in UTF-8 */
        {"AB", 'x', 0x80, "hello.job_id"},                     /* a lone continuation byte */
        {"AB", 'x', 0xe2, "hello.job_id"},                     /* cut short at the end */
        {"CD", 0x00, 'D', "hello.layout.blocks.name"},         /* two submessages down */
        {"CD", 0xc1, 0xbf, "hello.layout.blocks.name"},        /* overlong U+007F */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        size_t len;
        uint8_t *buf = hello_with_marks(&len);
        put_mark(buf, len, rows[i].mark, rows[i].b0, rows[i].b1);
        char path[64] = "junk";
        bool ok = prism_proto_strings_ok(&prism__v1__agent_message__descriptor, buf, len, path, sizeof path);
        CU_ASSERT_EQUAL(ok, rows[i].path[0] == '\0');
        if (!ok)
            CU_ASSERT_STRING_EQUAL(path, rows[i].path);
        free(buf);
    }
}

/* Three- and four-byte forms: surrogates and code points past U+10FFFF are refused, the largest
 * valid ones pass. The job id "jobABCD" is packed and its last four bytes replaced. */
static void test_surrogates_and_code_points_past_the_last_are_refused(void)
{
    static const struct {
        uint8_t bytes[4];
        bool ok;
    } rows[] = {
        {{'a', 0xed, 0x9f, 0xbf}, true},  /* U+D7FF */
        {{'a', 0xed, 0xa0, 0x80}, false}, /* U+D800 */
        {{'a', 0xed, 0xbf, 0xbf}, false}, /* U+DFFF */
        {{'a', 0xef, 0xbf, 0xbf}, true},  /* U+FFFF */
        {{0xf4, 0x8f, 0xbf, 0xbf}, true}, /* U+10FFFF */
        {{0xf4, 0x90, 0x80, 0x80}, false}, /* U+110000 */
        {{0xf0, 0x8f, 0xbf, 0xbf}, false}, /* overlong U+FFFF */
        {{0xf8, 0x88, 0x80, 0x80}, false}, /* a five-byte lead */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        Prism__V1__BlockMapRequest r = PRISM__V1__BLOCK_MAP_REQUEST__INIT;
        r.job_id = "jobABCD";
        size_t len;
        uint8_t *buf = pack_message(&r.base, &len);
        uint8_t *at = memmem(buf, len, "ABCD", 4);
        CU_ASSERT_PTR_NOT_NULL_FATAL(at);
        memcpy(at, rows[i].bytes, 4);
        char path[32];
        CU_ASSERT_EQUAL(prism_proto_strings_ok(&prism__v1__block_map_request__descriptor, buf, len, path, sizeof path),
                        rows[i].ok);
        if (!rows[i].ok)
            CU_ASSERT_STRING_EQUAL(path, "job_id");
        free(buf);
    }
}

/* Bytes that are not a message are the unpacker's to refuse: the check passes them (every
 * truncation of a packed Hello, whose strings are fine). */
static void test_malformed_bytes_are_left_to_the_unpacker(void)
{
    size_t len;
    uint8_t *buf = hello_with_marks(&len);
    char path[64];
    for (size_t cut = 0; cut <= len; cut++)
        CU_ASSERT_TRUE(prism_proto_strings_ok(&prism__v1__agent_message__descriptor, buf, cut, path, sizeof path));
    free(buf);
}

/* --------------------------------------------------------------------------------------------- */

static const prism_test_case agent_cases[] = {
    {"test_hello_round_trips_with_device_profile_and_layout",
     test_hello_round_trips_with_device_profile_and_layout},
    {"test_step_report_round_trips_with_loss_present",
     test_step_report_round_trips_with_loss_present},
    {"test_step_report_keeps_zero_loss_apart_from_absent_loss",
     test_step_report_keeps_zero_loss_apart_from_absent_loss},
    {"test_step_report_round_trips_with_loss_absent",
     test_step_report_round_trips_with_loss_absent},
    {"test_calibration_report_round_trips_with_every_block_error",
     test_calibration_report_round_trips_with_every_block_error},
    {"test_ack_round_trips_map_version_and_applied_step",
     test_ack_round_trips_map_version_and_applied_step},
    {"test_heartbeat_round_trips_time_and_last_step", test_heartbeat_round_trips_time_and_last_step},
    {"test_empty_heartbeat_keeps_its_oneof_case", test_empty_heartbeat_keeps_its_oneof_case},
    {NULL, NULL},
};

static const prism_test_case service_cases[] = {
    {"test_welcome_round_trips_config_map_cached_errors_and_hints",
     test_welcome_round_trips_config_map_cached_errors_and_hints},
    {"test_precision_update_round_trips_with_sensitivity_absent_and_zero",
     test_precision_update_round_trips_with_sensitivity_absent_and_zero},
    {"test_runtime_hints_round_trip_every_limit", test_runtime_hints_round_trip_every_limit},
    {"test_error_round_trips_grpc_code_and_message", test_error_round_trips_grpc_code_and_message},
    {"test_block_map_round_trips_every_block", test_block_map_round_trips_every_block},
    {"test_block_map_request_and_watch_request_round_trip",
     test_block_map_request_and_watch_request_round_trip},
    {NULL, NULL},
};

static const prism_test_case contract_cases[] = {
    {"test_precision_numbers_equal_c_prism_precision",
     test_precision_numbers_equal_c_prism_precision},
    {"test_precision_enum_names_match_c_precision_names",
     test_precision_enum_names_match_c_precision_names},
    {"test_field_numbers_match_the_published_contract",
     test_field_numbers_match_the_published_contract},
    {"test_policy_service_lists_connect_getblockmap_watch",
     test_policy_service_lists_connect_getblockmap_watch},
    {NULL, NULL},
};

static const prism_test_case malformed_cases[] = {
    {"test_every_truncation_of_a_step_report_is_rejected",
     test_every_truncation_of_a_step_report_is_rejected},
    {"test_every_truncation_of_a_welcome_is_rejected",
     test_every_truncation_of_a_welcome_is_rejected},
    {"test_empty_bytes_unpack_to_a_message_with_no_kind",
     test_empty_bytes_unpack_to_a_message_with_no_kind},
    {"test_malformed_bytes_are_rejected_with_null", test_malformed_bytes_are_rejected_with_null},
    {"test_unknown_fields_are_skipped", test_unknown_fields_are_skipped},
    {"test_random_and_corrupted_bytes_never_crash_the_decoder",
     test_random_and_corrupted_bytes_never_crash_the_decoder},
    {"test_strings_with_a_nul_or_bad_utf8_are_refused_by_path",
     test_strings_with_a_nul_or_bad_utf8_are_refused_by_path},
    {"test_surrogates_and_code_points_past_the_last_are_refused",
     test_surrogates_and_code_points_past_the_last_are_refused},
    {"test_malformed_bytes_are_left_to_the_unpacker", test_malformed_bytes_are_left_to_the_unpacker},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {
    {"agent_message", agent_cases},
    {"service_message", service_cases},
    {"contract", contract_cases},
    {"malformed", malformed_cases},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
