/* The configuration of DESIGN 4.1: defaults, the key table, the two file forms, every
 * rejection (each message must name the key), and that nothing is ever partially applied. */
#include "testutil.h"

#include "config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static prism_status load(const char *text, prism_config *out, prism_error *err)
{
    memset(err, 0, sizeof *err);
    return prism_config_load_buffer(text, strlen(text), "cfg.json", out, err);
}

/* Loads text, which must be valid. */
static prism_config load_ok(const char *text)
{
    prism_config cfg;
    prism_error err;
    prism_status st = load(text, &cfg, &err);
    if (st)
        fprintf(stderr, "load: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    return cfg;
}

static bool same_list(const prism_block_list *a, const prism_block_list *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++)
        if (a->ids[i] != b->ids[i])
            return false;
    return true;
}

static void assert_same_config(const prism_config *a, const prism_config *b)
{
    CU_ASSERT_EQUAL(a->enabled, b->enabled);
    CU_ASSERT_EQUAL(a->mode, b->mode);
    CU_ASSERT_EQUAL(a->bf16_threshold, b->bf16_threshold);
    CU_ASSERT_EQUAL(a->int8_threshold, b->int8_threshold);
    CU_ASSERT_EQUAL(a->ambiguous_default, b->ambiguous_default);
    CU_ASSERT_EQUAL(a->hysteresis_margin, b->hysteresis_margin);
    CU_ASSERT_EQUAL(a->grad_weight, b->grad_weight);
    CU_ASSERT_EQUAL(a->error_weight, b->error_weight);
    CU_ASSERT_EQUAL(a->grad_sensitivity_threshold, b->grad_sensitivity_threshold);
    CU_ASSERT_EQUAL(a->run_calibration, b->run_calibration);
    CU_ASSERT_EQUAL(a->calibration_samples, b->calibration_samples);
    CU_ASSERT_EQUAL(a->quant_error_threshold, b->quant_error_threshold);
    CU_ASSERT_EQUAL(a->warmup_steps, b->warmup_steps);
    CU_ASSERT_EQUAL(a->history_window, b->history_window);
    CU_ASSERT_EQUAL(a->update_interval_steps, b->update_interval_steps);
    CU_ASSERT_EQUAL(a->min_steps_between_switches, b->min_steps_between_switches);
    CU_ASSERT_TRUE(same_list(&a->force_bf16_blocks, &b->force_bf16_blocks));
    CU_ASSERT_TRUE(same_list(&a->force_int8_blocks, &b->force_int8_blocks));
    CU_ASSERT_EQUAL(a->log_decisions, b->log_decisions);
    CU_ASSERT_EQUAL(a->telemetry_enabled, b->telemetry_enabled);
    CU_ASSERT_FATAL(a->telemetry_file != NULL && b->telemetry_file != NULL);
    CU_ASSERT_STRING_EQUAL(a->telemetry_file, b->telemetry_file);
    CU_ASSERT_EQUAL(a->low_precision, b->low_precision);
    CU_ASSERT_EQUAL(a->apply_lag_steps, b->apply_lag_steps);
    CU_ASSERT_EQUAL(a->step_timeout_ms, b->step_timeout_ms);
    CU_ASSERT_EQUAL(a->world_size, b->world_size);
}

static void test_defaults_equal_design_4_1(void)
{
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_config_init(&c, &err), PRISM_OK);
    CU_ASSERT_EQUAL(c.enabled, true);
    CU_ASSERT_EQUAL(c.mode, PRISM_MODE_DYNAMIC);
    CU_ASSERT_EQUAL(c.bf16_threshold, 0.6);
    CU_ASSERT_EQUAL(c.int8_threshold, 0.3);
    CU_ASSERT_EQUAL(c.ambiguous_default, PRISM_AMBIGUOUS_BF16);
    CU_ASSERT_EQUAL(c.hysteresis_margin, 0.1);
    CU_ASSERT_EQUAL(c.grad_weight, 0.7);
    CU_ASSERT_EQUAL(c.error_weight, 0.3);
    CU_ASSERT_EQUAL(c.grad_sensitivity_threshold, 2.0);
    CU_ASSERT_EQUAL(c.run_calibration, true);
    CU_ASSERT_EQUAL(c.calibration_samples, 4);
    CU_ASSERT_EQUAL(c.quant_error_threshold, 0.05);
    CU_ASSERT_EQUAL(c.warmup_steps, 10);
    CU_ASSERT_EQUAL(c.history_window, 5);
    CU_ASSERT_EQUAL(c.update_interval_steps, 10);
    CU_ASSERT_EQUAL(c.min_steps_between_switches, 20);
    CU_ASSERT_EQUAL(c.force_bf16_blocks.count, 0);
    CU_ASSERT_EQUAL(c.force_int8_blocks.count, 0);
    CU_ASSERT_EQUAL(c.log_decisions, true);
    CU_ASSERT_EQUAL(c.telemetry_enabled, true);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c.telemetry_file);
    CU_ASSERT_STRING_EQUAL(c.telemetry_file, "selective_precision_telemetry.jsonl");
    CU_ASSERT_EQUAL(c.low_precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(c.apply_lag_steps, 1);
    CU_ASSERT_EQUAL(c.step_timeout_ms, 2000);
    CU_ASSERT_EQUAL(c.world_size, 0);
    /* issue 17 (DESIGN 4.7) */
    CU_ASSERT_EQUAL(c.loss_spike_factor, 0.0);
    CU_ASSERT_EQUAL(c.loss_spike_window, 20);
    CU_ASSERT_EQUAL(c.loss_spike_hold_steps, 100);
    CU_ASSERT_EQUAL_FATAL(c.low_formats.count, 3);
    CU_ASSERT_EQUAL(c.low_formats.formats[0], PRISM_PRECISION_INT4);
    CU_ASSERT_EQUAL(c.low_formats.formats[1], PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_EQUAL(c.low_formats.formats[2], PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(c.scale_mode, PRISM_SCALE_CURRENT);
    CU_ASSERT_EQUAL(c.amax_history_len, 16);
    CU_ASSERT_EQUAL(c.scale_margin, 0);
    CU_ASSERT_EQUAL(c.saturation_threshold, 1e-4);
    /* An empty document gives the defaults too. */
    prism_config d = load_ok("{}");
    assert_same_config(&c, &d);
    CU_ASSERT_EQUAL(prism_config_validate(&c, &err), PRISM_OK);
    prism_config_free(&d);
    prism_config_free(&c);
}

static void test_key_table_lists_design_keys_in_order(void)
{
    static const char *const names[] = {
        "enabled", "mode", "bf16_threshold", "int8_threshold", "ambiguous_default", "hysteresis_margin",
        "grad_weight", "error_weight", "grad_sensitivity_threshold", "run_calibration", "calibration_samples",
        "quant_error_threshold", "warmup_steps", "history_window", "update_interval_steps",
        "min_steps_between_switches", "force_bf16_blocks", "force_int8_blocks", "log_decisions",
        "telemetry_enabled", "telemetry_file", "low_precision", "apply_lag_steps", "step_timeout_ms",
        "world_size",
        /* issue 15: hybrid devices (prismd's per-class plans) */
        "hybrid", "hybrid_low_format", "hybrid_gamma", "hybrid_memory_fraction", "hybrid_fixed_classes",
        "hybrid_link_bytes_per_second", "hybrid_link_latency_seconds",
        /* issue 17: numerics */
        "loss_spike_factor", "loss_spike_window", "loss_spike_hold_steps", "low_formats", "scale_mode",
        "amax_history_len", "scale_margin", "saturation_threshold",
    };
    size_t n = 0;
    const prism_config_key *keys = prism_config_keys(&n);
    CU_ASSERT_EQUAL_FATAL(n, sizeof names / sizeof names[0]);
    for (size_t i = 0; i < n; i++) {
        CU_ASSERT_STRING_EQUAL(keys[i].name, names[i]);
        CU_ASSERT_PTR_NOT_NULL(keys[i].help);
        CU_ASSERT_PTR_NOT_NULL(keys[i].default_text);
    }
}

static void test_bare_object_sets_every_kind_of_key(void)
{
    prism_config c = load_ok("{\"enabled\": false, \"mode\": \"static\", \"bf16_threshold\": 0.8,"
                             " \"int8_threshold\": 0.2, \"ambiguous_default\": \"int8\", \"hysteresis_margin\": 0.05,"
                             " \"grad_weight\": 0.5, \"error_weight\": 0.5, \"grad_sensitivity_threshold\": 3,"
                             " \"run_calibration\": false, \"calibration_samples\": 8,"
                             " \"quant_error_threshold\": 0.1, \"warmup_steps\": 0, \"history_window\": 7,"
                             " \"update_interval_steps\": 3, \"min_steps_between_switches\": 0,"
                             " \"force_bf16_blocks\": [9, 2, 9], \"force_int8_blocks\": [4],"
                             " \"log_decisions\": false, \"telemetry_enabled\": false,"
                             " \"telemetry_file\": \"t.jsonl\", \"low_precision\": \"fp8_e5m2\","
                             " \"apply_lag_steps\": 0, \"step_timeout_ms\": 50, \"world_size\": 8}");
    CU_ASSERT_EQUAL(c.enabled, false);
    CU_ASSERT_EQUAL(c.mode, PRISM_MODE_STATIC);
    CU_ASSERT_EQUAL(c.bf16_threshold, 0.8);
    CU_ASSERT_EQUAL(c.int8_threshold, 0.2);
    CU_ASSERT_EQUAL(c.ambiguous_default, PRISM_AMBIGUOUS_LOW);
    CU_ASSERT_EQUAL(c.hysteresis_margin, 0.05);
    CU_ASSERT_EQUAL(c.grad_weight, 0.5);
    CU_ASSERT_EQUAL(c.error_weight, 0.5);
    CU_ASSERT_EQUAL(c.grad_sensitivity_threshold, 3.0); /* an integer for a number key */
    CU_ASSERT_EQUAL(c.run_calibration, false);
    CU_ASSERT_EQUAL(c.calibration_samples, 8);
    CU_ASSERT_EQUAL(c.quant_error_threshold, 0.1);
    CU_ASSERT_EQUAL(c.warmup_steps, 0);
    CU_ASSERT_EQUAL(c.history_window, 7);
    CU_ASSERT_EQUAL(c.update_interval_steps, 3);
    CU_ASSERT_EQUAL(c.min_steps_between_switches, 0);
    CU_ASSERT_EQUAL_FATAL(c.force_bf16_blocks.count, 2); /* sorted, repeats dropped */
    CU_ASSERT_EQUAL(c.force_bf16_blocks.ids[0], 2);
    CU_ASSERT_EQUAL(c.force_bf16_blocks.ids[1], 9);
    CU_ASSERT_EQUAL_FATAL(c.force_int8_blocks.count, 1);
    CU_ASSERT_EQUAL(c.force_int8_blocks.ids[0], 4);
    CU_ASSERT_TRUE(prism_block_list_contains(&c.force_bf16_blocks, 9));
    CU_ASSERT_FALSE(prism_block_list_contains(&c.force_bf16_blocks, 4));
    CU_ASSERT_EQUAL(c.log_decisions, false);
    CU_ASSERT_EQUAL(c.telemetry_enabled, false);
    CU_ASSERT_STRING_EQUAL(c.telemetry_file, "t.jsonl");
    CU_ASSERT_EQUAL(c.low_precision, PRISM_PRECISION_FP8_E5M2);
    CU_ASSERT_EQUAL(c.apply_lag_steps, 0);
    CU_ASSERT_EQUAL(c.step_timeout_ms, 50);
    CU_ASSERT_EQUAL(c.world_size, 8);
    prism_config_free(&c);
}

static void test_choice_keys_accept_every_listed_name(void)
{
    static const struct {
        const char *text;
        size_t offset;
        int want;
    } cases[] = {
        {"{\"mode\": \"off\"}", offsetof(prism_config, mode), PRISM_MODE_OFF},
        {"{\"mode\": \"static\"}", offsetof(prism_config, mode), PRISM_MODE_STATIC},
        {"{\"mode\": \"dynamic\"}", offsetof(prism_config, mode), PRISM_MODE_DYNAMIC},
        {"{\"ambiguous_default\": \"bf16\"}", offsetof(prism_config, ambiguous_default), PRISM_AMBIGUOUS_BF16},
        {"{\"ambiguous_default\": \"int8\"}", offsetof(prism_config, ambiguous_default), PRISM_AMBIGUOUS_LOW},
        {"{\"ambiguous_default\": \"low\"}", offsetof(prism_config, ambiguous_default), PRISM_AMBIGUOUS_LOW},
        {"{\"low_precision\": \"int8\"}", offsetof(prism_config, low_precision), PRISM_PRECISION_INT8},
        {"{\"low_precision\": \"fp8_e4m3\"}", offsetof(prism_config, low_precision), PRISM_PRECISION_FP8_E4M3},
        {"{\"low_precision\": \"fp8_e5m2\"}", offsetof(prism_config, low_precision), PRISM_PRECISION_FP8_E5M2},
        {"{\"low_precision\": \"int4\"}", offsetof(prism_config, low_precision), PRISM_PRECISION_INT4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c = load_ok(cases[i].text);
        int got;
        memcpy(&got, (const char *)&c + cases[i].offset, sizeof got);
        CU_ASSERT_EQUAL(got, cases[i].want);
        prism_config_free(&c);
    }
}

static void test_nested_training_config_is_accepted_and_other_keys_ignored(void)
{
    prism_config c = load_ok("{\"model\": {\"layers\": 48}, \"memory\": {\"offload\": true, \"stagehand\": {"
                             "\"prefetch\": 2, \"selective_precision\": {\"warmup_steps\": 3,"
                             " \"low_precision\": \"int4\"}}}, \"optimizer\": \"adamw\"}");
    CU_ASSERT_EQUAL(c.warmup_steps, 3);
    CU_ASSERT_EQUAL(c.low_precision, PRISM_PRECISION_INT4);
    CU_ASSERT_EQUAL(c.history_window, 5);
    CU_ASSERT_EQUAL(c.bf16_threshold, 0.6);
    prism_config_free(&c);
}

static void test_nested_form_errors_name_the_full_key_path(void)
{
    static const struct {
        const char *inner;
        const char *want;
    } cases[] = {
        {"{\"bf16_threshold\": \"high\"}", "memory.stagehand.selective_precision.bf16_threshold"},
        {"{\"history_window\": 0}", "memory.stagehand.selective_precision.history_window"},
        {"{\"bf16_treshold\": 0.5}", "memory.stagehand.selective_precision.bf16_treshold"},
        {"{\"int8_threshold\": 0.7}", "memory.stagehand.selective_precision.int8_threshold"},
        {"{\"force_bf16_blocks\": [1], \"force_int8_blocks\": [1]}",
         "memory.stagehand.selective_precision.force_int8_blocks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"memory\": {\"stagehand\": {\"selective_precision\": %s}}}",
                 cases[i].inner);
        prism_config c;
        prism_error err;
        CU_ASSERT_EQUAL(load(text, &c, &err), PRISM_ERR_INVALID);
        if (!strstr(err.message, cases[i].want))
            fprintf(stderr, "case %zu: message \"%s\" lacks \"%s\"\n", i, err.message, cases[i].want);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].want));
    }
}

static void test_nested_form_missing_section_names_the_path(void)
{
    static const struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"{\"memory\": {\"stagehand\": {\"prefetch\": 2}}}", "memory.stagehand.selective_precision"},
        {"{\"memory\": {\"offload\": true}}", "memory.stagehand"},
        {"{\"memory\": {\"stagehand\": {\"selective_precision\": 5}}}", "memory.stagehand.selective_precision"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c;
        prism_error err;
        CU_ASSERT_EQUAL(load(cases[i].text, &c, &err), PRISM_ERR_INVALID);
        if (!strstr(err.message, cases[i].want))
            fprintf(stderr, "case %zu: message \"%s\" lacks \"%s\"\n", i, err.message, cases[i].want);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].want));
    }
}

static void test_unknown_key_is_rejected_with_nearest_key_hint(void)
{
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL(load("{\"bf16_treshold\": 0.5}", &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "bf16_treshold"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "did you mean bf16_threshold"));
    CU_ASSERT_EQUAL(load("{\"history_windows\": 3}", &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "did you mean history_window"));
    /* Far from every key: named, without a hint. */
    CU_ASSERT_EQUAL(load("{\"completely_unrelated\": 1}", &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "completely_unrelated"));
    CU_ASSERT_PTR_NULL(strstr(err.message, "did you mean"));
}

static void test_wrong_types_are_rejected_naming_the_key(void)
{
    static const struct {
        const char *text;
        const char *key;
    } cases[] = {
        /* bool */
        {"{\"enabled\": \"yes\"}", "enabled"},
        {"{\"enabled\": 1}", "enabled"},
        {"{\"run_calibration\": null}", "run_calibration"},
        /* int */
        {"{\"warmup_steps\": 5.5}", "warmup_steps"},
        {"{\"warmup_steps\": \"5\"}", "warmup_steps"},
        {"{\"history_window\": 5.5}", "history_window"},
        {"{\"history_window\": \"5\"}", "history_window"},
        {"{\"min_steps_between_switches\": true}", "min_steps_between_switches"},
        {"{\"step_timeout_ms\": [2000]}", "step_timeout_ms"},
        /* number */
        {"{\"bf16_threshold\": \"0.6\"}", "bf16_threshold"},
        {"{\"grad_weight\": true}", "grad_weight"},
        {"{\"quant_error_threshold\": null}", "quant_error_threshold"},
        /* choice */
        {"{\"mode\": \"fast\"}", "mode"},
        {"{\"mode\": 2}", "mode"},
        {"{\"ambiguous_default\": \"maybe\"}", "ambiguous_default"},
        {"{\"low_precision\": \"fp16\"}", "low_precision"},
        {"{\"low_precision\": \"bf16\"}", "low_precision"},
        /* string */
        {"{\"telemetry_file\": 5}", "telemetry_file"},
        {"{\"telemetry_file\": [\"a\"]}", "telemetry_file"},
        /* block list */
        {"{\"force_bf16_blocks\": 3}", "force_bf16_blocks"},
        {"{\"force_bf16_blocks\": [\"a\"]}", "force_bf16_blocks"},
        {"{\"force_int8_blocks\": [1.5]}", "force_int8_blocks"},
        {"{\"force_int8_blocks\": {\"0\": 1}}", "force_int8_blocks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c;
        prism_error err;
        prism_status st = load(cases[i].text, &c, &err);
        if (st != PRISM_ERR_INVALID || !strstr(err.message, cases[i].key))
            fprintf(stderr, "case %zu (%s): status %d message \"%s\"\n", i, cases[i].text, (int)st, err.message);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].key));
    }
}

static void test_values_out_of_range_are_rejected_naming_the_key(void)
{
    static const struct {
        const char *text;
        const char *key;
    } cases[] = {
        {"{\"history_window\": 0}", "history_window"},
        {"{\"history_window\": -1}", "history_window"},
        {"{\"update_interval_steps\": 0}", "update_interval_steps"},
        {"{\"update_interval_steps\": -3}", "update_interval_steps"},
        {"{\"calibration_samples\": 0}", "calibration_samples"},
        {"{\"step_timeout_ms\": 0}", "step_timeout_ms"},
        {"{\"step_timeout_ms\": -5}", "step_timeout_ms"},
        {"{\"warmup_steps\": -1}", "warmup_steps"},
        {"{\"min_steps_between_switches\": -1}", "min_steps_between_switches"},
        {"{\"apply_lag_steps\": -1}", "apply_lag_steps"},
        {"{\"grad_weight\": 1.5}", "grad_weight"},
        {"{\"grad_weight\": -0.1}", "grad_weight"},
        {"{\"error_weight\": 1.01}", "error_weight"},
        {"{\"error_weight\": -1}", "error_weight"},
        {"{\"bf16_threshold\": 1.5}", "bf16_threshold"},
        {"{\"bf16_threshold\": -0.5}", "bf16_threshold"},
        {"{\"int8_threshold\": -0.1}", "int8_threshold"},
        {"{\"hysteresis_margin\": 2}", "hysteresis_margin"},
        {"{\"grad_sensitivity_threshold\": 0}", "grad_sensitivity_threshold"},
        {"{\"grad_sensitivity_threshold\": -1.0}", "grad_sensitivity_threshold"},
        {"{\"quant_error_threshold\": 0}", "quant_error_threshold"},
        {"{\"quant_error_threshold\": -0.05}", "quant_error_threshold"},
        {"{\"force_bf16_blocks\": [-1]}", "force_bf16_blocks"},
        {"{\"force_int8_blocks\": [3, -2]}", "force_int8_blocks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c;
        prism_error err;
        prism_status st = load(cases[i].text, &c, &err);
        if (st != PRISM_ERR_INVALID || !strstr(err.message, cases[i].key))
            fprintf(stderr, "case %zu (%s): status %d message \"%s\"\n", i, cases[i].text, (int)st, err.message);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].key));
    }
}

static void test_values_at_range_edges_are_accepted(void)
{
    prism_config c = load_ok("{\"grad_weight\": 0, \"error_weight\": 1, \"bf16_threshold\": 1,"
                             " \"int8_threshold\": 0, \"hysteresis_margin\": 0, \"history_window\": 1,"
                             " \"update_interval_steps\": 1, \"calibration_samples\": 1, \"warmup_steps\": 0,"
                             " \"min_steps_between_switches\": 0, \"step_timeout_ms\": 1,"
                             " \"quant_error_threshold\": 1}");
    CU_ASSERT_EQUAL(c.grad_weight, 0.0);
    CU_ASSERT_EQUAL(c.error_weight, 1.0);
    CU_ASSERT_EQUAL(c.bf16_threshold, 1.0);
    CU_ASSERT_EQUAL(c.int8_threshold, 0.0);
    CU_ASSERT_EQUAL(c.history_window, 1);
    CU_ASSERT_EQUAL(c.step_timeout_ms, 1);
    prism_config_free(&c);
}

static void test_int8_threshold_must_be_below_bf16_threshold(void)
{
    static const char *const texts[] = {
        "{\"int8_threshold\": 0.6}",                          /* equal to the default bf16 */
        "{\"int8_threshold\": 0.7}",
        "{\"bf16_threshold\": 0.3}",                          /* equal to the default int8 */
        "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.5}",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        prism_config c;
        prism_error err;
        CU_ASSERT_EQUAL(load(texts[i], &c, &err), PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "int8_threshold"));
    }
    /* Checked on the result as a whole: moving both in one object works in either order. */
    prism_config a = load_ok("{\"int8_threshold\": 0.7, \"bf16_threshold\": 0.9}");
    CU_ASSERT_EQUAL(a.int8_threshold, 0.7);
    CU_ASSERT_EQUAL(a.bf16_threshold, 0.9);
    prism_config_free(&a);
    prism_config b = load_ok("{\"bf16_threshold\": 0.2, \"int8_threshold\": 0.1}");
    CU_ASSERT_EQUAL(b.bf16_threshold, 0.2);
    prism_config_free(&b);
}

static void test_block_in_both_force_lists_is_rejected_naming_block(void)
{
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL(load("{\"force_bf16_blocks\": [1, 17], \"force_int8_blocks\": [17, 3]}", &c, &err),
                    PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "force_int8_blocks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "17"));
    /* validate() on a config built by hand says the same. */
    prism_config d = load_ok("{\"force_bf16_blocks\": [5]}");
    prism_config e = load_ok("{\"force_int8_blocks\": [5]}");
    prism_block_list saved = d.force_int8_blocks;
    d.force_int8_blocks = e.force_int8_blocks;
    CU_ASSERT_EQUAL(prism_config_validate(&d, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "force_int8_blocks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "5"));
    d.force_int8_blocks = saved;
    prism_config_free(&d);
    prism_config_free(&e);
}

static void test_syntax_error_gives_source_line_and_column(void)
{
    static const struct {
        const char *text;
        int line;
    } cases[] = {
        {"{\n \"mode\": ,\n}", 2},
        {"{\"mode\": \"off\"", 1},
        {"{\n\n\n  \"warmup_steps\": 3,,\n}", 4},
        {"", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c;
        prism_error err;
        CU_ASSERT_EQUAL(load(cases[i].text, &c, &err), PRISM_ERR_INVALID);
        int line = -1, column = -1;
        int got = sscanf(err.message, "cfg.json:%d:%d:", &line, &column);
        if (got != 2 || line != cases[i].line)
            fprintf(stderr, "case %zu: message \"%s\"\n", i, err.message);
        CU_ASSERT_EQUAL(got, 2);
        CU_ASSERT_EQUAL(line, cases[i].line);
    }
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL(load("{\n \"mode\": ,\n}", &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(strncmp(err.message, "cfg.json:2:", 11), 0);
}

static void test_duplicate_keys_are_a_syntax_error(void)
{
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL(load("{\"mode\": \"off\",\n \"mode\": \"static\"}", &c, &err), PRISM_ERR_INVALID);
    int line = -1, column = -1;
    CU_ASSERT_EQUAL(sscanf(err.message, "cfg.json:%d:%d:", &line, &column), 2);
    CU_ASSERT_EQUAL(line, 2);
}

static void test_top_level_that_is_not_an_object_is_rejected(void)
{
    static const char *const texts[] = {"[1, 2]", "5", "\"mode\"", "null"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        prism_config c;
        prism_error err;
        CU_ASSERT_EQUAL(load(texts[i], &c, &err), PRISM_ERR_INVALID);
        CU_ASSERT_EQUAL(strncmp(err.message, "cfg.json", 8), 0);
    }
}

static void test_failed_apply_leaves_the_target_unchanged(void)
{
    static const char *const bad[] = {
        "{\"warmup_steps\": 3, \"history_window\": 0}",
        "{\"history_window\": 0, \"warmup_steps\": 3}",
        "{\"warmup_steps\": 3, \"bf16_treshold\": 0.5}",
        "{\"warmup_steps\": 3, \"force_bf16_blocks\": [1], \"force_int8_blocks\": [1]}",
        "{\"warmup_steps\": 3, \"int8_threshold\": 0.65}",
        "{\"force_int8_blocks\": [7, 8], \"mode\": \"sometimes\"}",
        "{\"telemetry_file\": \"other.jsonl\", \"enabled\": 0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        prism_config cfg = load_ok("{\"force_int8_blocks\": [2], \"warmup_steps\": 6}");
        prism_config before;
        prism_error err;
        CU_ASSERT_EQUAL_FATAL(prism_config_copy(&before, &cfg, &err), PRISM_OK);
        json_error_t jerr;
        json_t *obj = json_loads(bad[i], 0, &jerr);
        CU_ASSERT_FATAL(obj != NULL);
        /* In place (out aliases base) ... */
        CU_ASSERT_EQUAL(prism_config_apply_json(&cfg, obj, "", &cfg, &err), PRISM_ERR_INVALID);
        assert_same_config(&cfg, &before);
        /* ... and into a separate target, which keeps what it held. */
        prism_config other = load_ok("{\"history_window\": 9}");
        prism_config other_before;
        CU_ASSERT_EQUAL_FATAL(prism_config_copy(&other_before, &other, &err), PRISM_OK);
        CU_ASSERT_EQUAL(prism_config_apply_json(&cfg, obj, "", &other, &err), PRISM_ERR_INVALID);
        assert_same_config(&other, &other_before);
        assert_same_config(&cfg, &before);
        json_decref(obj);
        prism_config_free(&other);
        prism_config_free(&other_before);
        prism_config_free(&before);
        prism_config_free(&cfg);
    }
}

static void test_apply_json_layers_keys_on_a_base(void)
{
    prism_config base = load_ok("{\"force_int8_blocks\": [2], \"warmup_steps\": 6}");
    json_error_t jerr;
    json_t *obj = json_loads("{\"history_window\": 3}", 0, &jerr);
    CU_ASSERT_FATAL(obj != NULL);
    prism_config out;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_config_apply_json(&base, obj, "", &out, &err), PRISM_OK);
    CU_ASSERT_EQUAL(out.history_window, 3);
    CU_ASSERT_EQUAL(out.warmup_steps, 6);
    CU_ASSERT_EQUAL_FATAL(out.force_int8_blocks.count, 1);
    CU_ASSERT_EQUAL(out.force_int8_blocks.ids[0], 2);
    CU_ASSERT_EQUAL(base.history_window, 5); /* the base is not touched */
    json_decref(obj);
    /* A prefix goes in front of key names in messages. */
    obj = json_loads("{\"history_window\": \"x\"}", 0, &jerr);
    CU_ASSERT_EQUAL(prism_config_apply_json(&base, obj, "a.b.", &out, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "a.b.history_window"));
    json_decref(obj);
    prism_config_free(&out);
    prism_config_free(&base);
}

static void test_to_json_round_trips(void)
{
    static const char *const texts[] = {
        "{}",
        "{\"enabled\": false, \"mode\": \"off\", \"bf16_threshold\": 0.9, \"int8_threshold\": 0.1,"
        " \"ambiguous_default\": \"int8\", \"grad_sensitivity_threshold\": 1.5, \"force_bf16_blocks\": [3, 1],"
        " \"force_int8_blocks\": [0], \"telemetry_file\": \"x.jsonl\", \"low_precision\": \"int4\","
        " \"apply_lag_steps\": 2, \"step_timeout_ms\": 7, \"world_size\": 3, \"hysteresis_margin\": 0.3}",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        prism_config c = load_ok(texts[i]);
        json_t *obj = prism_config_to_json(&c);
        CU_ASSERT_FATAL(obj != NULL);
        size_t nkeys = 0;
        prism_config_keys(&nkeys);
        CU_ASSERT_EQUAL(json_object_size(obj), nkeys);
        char *text = json_dumps(obj, 0);
        CU_ASSERT_FATAL(text != NULL);
        prism_config back = load_ok(text);
        assert_same_config(&c, &back);
        free(text);
        json_decref(obj);
        prism_config_free(&back);
        prism_config_free(&c);
    }
}

static void test_load_file_reads_a_file_and_names_it_in_errors(void)
{
    const char *dir = prism_scratch_dir();
    const char *good = prism_write_file(dir, "good.json", "{\"warmup_steps\": 4}\n");
    prism_config c;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_config_load_file(good, &c, &err), PRISM_OK);
    CU_ASSERT_EQUAL(c.warmup_steps, 4);
    prism_config_free(&c);
    char bad_path[1024];
    snprintf(bad_path, sizeof bad_path, "%s", prism_write_file(dir, "bad.json", "{\n  \"warmup_steps\": x\n}\n"));
    CU_ASSERT_EQUAL(prism_config_load_file(bad_path, &c, &err), PRISM_ERR_INVALID);
    char want[1100];
    snprintf(want, sizeof want, "%s:2:", bad_path);
    CU_ASSERT_EQUAL(strncmp(err.message, want, strlen(want)), 0);
    snprintf(bad_path, sizeof bad_path, "%s/missing.json", dir);
    CU_ASSERT_EQUAL(prism_config_load_file(bad_path, &c, &err), PRISM_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "missing.json"));
}

static void test_copy_is_deep(void)
{
    prism_config a = load_ok("{\"force_bf16_blocks\": [4], \"telemetry_file\": \"a.jsonl\"}");
    prism_config b;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_config_copy(&b, &a, &err), PRISM_OK);
    CU_ASSERT_PTR_NOT_EQUAL(a.force_bf16_blocks.ids, b.force_bf16_blocks.ids);
    CU_ASSERT_PTR_NOT_EQUAL(a.telemetry_file, b.telemetry_file);
    prism_config_free(&a);
    CU_ASSERT_EQUAL(b.force_bf16_blocks.ids[0], 4);
    CU_ASSERT_STRING_EQUAL(b.telemetry_file, "a.jsonl");
    prism_config_free(&b);
}

/* telemetry_file is a file name inside the job's directory, never a path. */
static void test_telemetry_file_must_be_a_plain_file_name(void)
{
    static const char *const bad[] = {"{\"telemetry_file\": \"../../etc/x\"}", "{\"telemetry_file\": \"/tmp/t.jsonl\"}",
                                      "{\"telemetry_file\": \"..\"}", "{\"telemetry_file\": \"\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        prism_config cfg;
        prism_error err;
        CU_ASSERT_EQUAL(prism_config_load_buffer(bad[i], strlen(bad[i]), "cfg.json", &cfg, &err), PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "cfg.json: telemetry_file: "));
    }
    prism_config cfg;
    prism_error err;
    const char *good = "{\"telemetry_file\": \"job-7.jsonl\"}";
    CU_ASSERT_EQUAL_FATAL(prism_config_load_buffer(good, strlen(good), "cfg.json", &cfg, &err), PRISM_OK);
    CU_ASSERT_STRING_EQUAL(cfg.telemetry_file, "job-7.jsonl");
    prism_config_free(&cfg);
}

static void test_numerics_keys_set_every_value_and_read_back(void)
{
    prism_config c = load_ok("{\"loss_spike_factor\": 1.5, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": 0,"
                             " \"low_precision\": \"auto\", \"low_formats\": [\"fp8_e5m2\", \"int8\"],"
                             " \"scale_mode\": \"delayed\", \"amax_history_len\": 1024, \"scale_margin\": -32,"
                             " \"saturation_threshold\": 1}");
    CU_ASSERT_EQUAL(c.loss_spike_factor, 1.5);
    CU_ASSERT_EQUAL(c.loss_spike_window, 2);
    CU_ASSERT_EQUAL(c.loss_spike_hold_steps, 0);
    CU_ASSERT_EQUAL(c.low_precision, PRISM_LOW_AUTO);
    CU_ASSERT_EQUAL_FATAL(c.low_formats.count, 2);
    CU_ASSERT_EQUAL(c.low_formats.formats[0], PRISM_PRECISION_FP8_E5M2);
    CU_ASSERT_EQUAL(c.low_formats.formats[1], PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(c.scale_mode, PRISM_SCALE_DELAYED);
    CU_ASSERT_EQUAL(c.amax_history_len, 1024);
    CU_ASSERT_EQUAL(c.scale_margin, -32);
    CU_ASSERT_EQUAL(c.saturation_threshold, 1.0);
    /* "auto" names itself; the one concrete format for old consumers is the last of the list. */
    CU_ASSERT_STRING_EQUAL(prism_low_precision_name(c.low_precision), "auto");
    CU_ASSERT_EQUAL(prism_config_low_format(&c), PRISM_PRECISION_INT8);
    json_t *j = prism_config_to_json(&c);
    CU_ASSERT_FATAL(j != NULL);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "low_precision")), "auto");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "scale_mode")), "delayed");
    json_t *lf = json_object_get(j, "low_formats");
    CU_ASSERT_EQUAL_FATAL(json_array_size(lf), 2);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_array_get(lf, 0)), "fp8_e5m2");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_array_get(lf, 1)), "int8");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "scale_margin")), -32);
    /* and back through the loader */
    char *text = json_dumps(j, 0);
    prism_config d = load_ok(text);
    CU_ASSERT_EQUAL(d.low_precision, PRISM_LOW_AUTO);
    CU_ASSERT_EQUAL(d.low_formats.count, 2);
    CU_ASSERT_EQUAL(d.low_formats.formats[0], PRISM_PRECISION_FP8_E5M2);
    CU_ASSERT_EQUAL(d.scale_margin, -32);
    CU_ASSERT_EQUAL(d.loss_spike_factor, 1.5);
    free(text);
    json_decref(j);
    prism_config_free(&d);
    prism_config_free(&c);
    /* The other edges and choices. */
    prism_config e = load_ok("{\"loss_spike_factor\": 1e6, \"loss_spike_window\": 100000,"
                             " \"loss_spike_hold_steps\": 1000000000, \"amax_history_len\": 1, \"scale_margin\": 32,"
                             " \"saturation_threshold\": 0, \"scale_mode\": \"static\","
                             " \"low_formats\": [\"int8\", \"fp8_e4m3\", \"fp8_e5m2\", \"int4\"]}");
    CU_ASSERT_EQUAL(e.loss_spike_factor, 1e6);
    CU_ASSERT_EQUAL(e.loss_spike_window, 100000);
    CU_ASSERT_EQUAL(e.loss_spike_hold_steps, 1000000000);
    CU_ASSERT_EQUAL(e.amax_history_len, 1);
    CU_ASSERT_EQUAL(e.scale_margin, 32);
    CU_ASSERT_EQUAL(e.saturation_threshold, 0.0);
    CU_ASSERT_EQUAL(e.scale_mode, PRISM_SCALE_STATIC);
    CU_ASSERT_EQUAL(e.low_formats.count, 4);
    CU_ASSERT_EQUAL(e.low_formats.formats[3], PRISM_PRECISION_INT4);
    CU_ASSERT_EQUAL(prism_config_low_format(&e), PRISM_PRECISION_INT8); /* not auto: low_precision */
    prism_config_free(&e);
    prism_config f = load_ok("{\"scale_mode\": \"pow2\"}");
    CU_ASSERT_EQUAL(f.scale_mode, PRISM_SCALE_POW2);
    prism_config_free(&f);
}

static void test_numerics_keys_bad_values_are_refused_naming_the_key(void)
{
    static const struct {
        const char *text;
        const char *want; /* in the message */
    } cases[] = {
        {"{\"loss_spike_factor\": -0.5}", "loss_spike_factor"},
        {"{\"loss_spike_factor\": 1000001}", "loss_spike_factor"},
        {"{\"loss_spike_factor\": \"2\"}", "loss_spike_factor"},
        {"{\"loss_spike_window\": 1}", "loss_spike_window"},
        {"{\"loss_spike_window\": 100001}", "loss_spike_window"},
        {"{\"loss_spike_window\": 2.5}", "loss_spike_window"},
        {"{\"loss_spike_hold_steps\": -1}", "loss_spike_hold_steps"},
        {"{\"loss_spike_hold_steps\": 1000000001}", "loss_spike_hold_steps"},
        {"{\"low_precision\": \"AUTO\"}", "low_precision"},
        {"{\"low_formats\": []}", "low_formats: 0 formats"},
        {"{\"low_formats\": \"int8\"}", "low_formats"},
        {"{\"low_formats\": [\"int8\", \"bf16\"]}", "low_formats[1]"},
        {"{\"low_formats\": [\"int8\", \"fp16\"]}", "low_formats[1]"},
        {"{\"low_formats\": [4]}", "low_formats[0]"},
        {"{\"low_formats\": [\"int4\", \"int8\", \"int4\"]}", "low_formats[2]: \"int4\" repeats low_formats[0]"},
        {"{\"low_formats\": [\"int4\", \"int8\", \"fp8_e4m3\", \"fp8_e5m2\", \"int8\"]}", "low_formats: 5 formats"},
        {"{\"scale_mode\": \"amax\"}", "scale_mode"},
        {"{\"scale_mode\": 1}", "scale_mode"},
        {"{\"amax_history_len\": 0}", "amax_history_len"},
        {"{\"amax_history_len\": 1025}", "amax_history_len"},
        {"{\"scale_margin\": -33}", "scale_margin"},
        {"{\"scale_margin\": 33}", "scale_margin"},
        {"{\"scale_margin\": 0.5}", "scale_margin"},
        {"{\"saturation_threshold\": 1.5}", "saturation_threshold"},
        {"{\"saturation_threshold\": -1e-9}", "saturation_threshold"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config c;
        prism_error err;
        prism_status st = load(cases[i].text, &c, &err);
        if (st != PRISM_ERR_INVALID || !strstr(err.message, cases[i].want))
            fprintf(stderr, "case %zu (%s): status %d message \"%s\"\n", i, cases[i].text, (int)st, err.message);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].want));
    }
    /* Nothing partially applied: a good key beside a bad list leaves the base as it was. */
    prism_config base = load_ok("{}");
    json_t *obj = json_loads("{\"loss_spike_factor\": 3, \"low_formats\": [\"int8\", \"int8\"]}", 0, NULL);
    prism_error err;
    CU_ASSERT_EQUAL(prism_config_apply_json(&base, obj, "", &base, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(base.loss_spike_factor, 0.0);
    CU_ASSERT_EQUAL(base.low_formats.count, 3);
    json_decref(obj);
    /* validate() on a list built by hand. */
    base.low_formats.count = 0;
    CU_ASSERT_EQUAL(prism_config_validate(&base, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "low_formats"));
    base.low_formats.count = 2;
    base.low_formats.formats[0] = PRISM_PRECISION_INT8;
    base.low_formats.formats[1] = PRISM_PRECISION_BF16;
    CU_ASSERT_EQUAL(prism_config_validate(&base, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "low_formats[1]"));
    base.low_formats.formats[1] = PRISM_PRECISION_INT8;
    CU_ASSERT_EQUAL(prism_config_validate(&base, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "low_formats[1]"));
    prism_config_free(&base);
}

static const prism_test_case cases[] = {
    {"test_defaults_equal_design_4_1", test_defaults_equal_design_4_1},
    {"test_key_table_lists_design_keys_in_order", test_key_table_lists_design_keys_in_order},
    {"test_bare_object_sets_every_kind_of_key", test_bare_object_sets_every_kind_of_key},
    {"test_choice_keys_accept_every_listed_name", test_choice_keys_accept_every_listed_name},
    {"test_nested_training_config_is_accepted_and_other_keys_ignored",
     test_nested_training_config_is_accepted_and_other_keys_ignored},
    {"test_nested_form_errors_name_the_full_key_path", test_nested_form_errors_name_the_full_key_path},
    {"test_nested_form_missing_section_names_the_path", test_nested_form_missing_section_names_the_path},
    {"test_unknown_key_is_rejected_with_nearest_key_hint", test_unknown_key_is_rejected_with_nearest_key_hint},
    {"test_wrong_types_are_rejected_naming_the_key", test_wrong_types_are_rejected_naming_the_key},
    {"test_values_out_of_range_are_rejected_naming_the_key", test_values_out_of_range_are_rejected_naming_the_key},
    {"test_values_at_range_edges_are_accepted", test_values_at_range_edges_are_accepted},
    {"test_int8_threshold_must_be_below_bf16_threshold", test_int8_threshold_must_be_below_bf16_threshold},
    {"test_block_in_both_force_lists_is_rejected_naming_block",
     test_block_in_both_force_lists_is_rejected_naming_block},
    {"test_syntax_error_gives_source_line_and_column", test_syntax_error_gives_source_line_and_column},
    {"test_duplicate_keys_are_a_syntax_error", test_duplicate_keys_are_a_syntax_error},
    {"test_top_level_that_is_not_an_object_is_rejected", test_top_level_that_is_not_an_object_is_rejected},
    {"test_failed_apply_leaves_the_target_unchanged", test_failed_apply_leaves_the_target_unchanged},
    {"test_apply_json_layers_keys_on_a_base", test_apply_json_layers_keys_on_a_base},
    {"test_to_json_round_trips", test_to_json_round_trips},
    {"test_load_file_reads_a_file_and_names_it_in_errors", test_load_file_reads_a_file_and_names_it_in_errors},
    {"test_copy_is_deep", test_copy_is_deep},
    {"test_telemetry_file_must_be_a_plain_file_name", test_telemetry_file_must_be_a_plain_file_name},
    {"test_numerics_keys_set_every_value_and_read_back", test_numerics_keys_set_every_value_and_read_back},
    {"test_numerics_keys_bad_values_are_refused_naming_the_key",
     test_numerics_keys_bad_values_are_refused_naming_the_key},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"config", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
