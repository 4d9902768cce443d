/* What prismd's hybrid plans need of the policy core (issue 15 item 3): a map version committed
 * without a precision change (prism_policy_bump_version), and the hybrid_* config keys of the
 * one config table (defaults, ranges, null or names, round trip through JSON). Exact values. */
#include "testutil.h"

#include "config.h"
#include "hybrid_json.h"
#include "policy.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static prism_status apply(prism_config *cfg, const char *text, prism_error *err)
{
    json_error_t jerr;
    json_t *obj = json_loads(text, 0, &jerr);
    CU_ASSERT_FATAL(obj != NULL);
    prism_status st = prism_config_apply_json(cfg, obj, "", cfg, err);
    json_decref(obj);
    return st;
}

static void test_bump_version_commits_a_new_map_with_the_same_precisions(void)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    CU_ASSERT_FATAL(apply(&cfg, "{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"force_int8_blocks\": [1],"
                                " \"apply_lag_steps\": 2}", &err) == PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(p != NULL);
    prism_block_stats b[2] = {{0, 1.0, 1.0, 0.0, 0.0, 4, 0, false, 0, 0}, {1, 1.0, 1.0, 0.0, 0.0, 4, 0, false, 0, 0}};
    prism_step_result r;
    CU_ASSERT_FATAL(prism_policy_add_step(p, 5, NULL, b, 2, &r, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(r.map_version, 1); /* block 1 forced low: one change */
    CU_ASSERT_EQUAL(prism_policy_find_block(p, 1)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_FATAL(prism_policy_add_step(p, 6, NULL, b, 2, &r, &err) == PRISM_OK);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_FALSE(r.map_changed);
    CU_ASSERT_EQUAL(prism_policy_bump_version(p), 2);
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 2);
    CU_ASSERT_EQUAL(prism_policy_find_block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(prism_policy_find_block(p, 1)->precision, PRISM_PRECISION_INT8);
    prism_policy_progress progress;
    prism_policy_progress_get(p, &progress);
    CU_ASSERT_EQUAL(progress.map_version, 2);
    /* The next version that a change makes follows the bumped one: block 0 forced low too. */
    CU_ASSERT_FATAL(apply(&cfg, "{\"force_int8_blocks\": [0, 1]}", &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_policy_set_config(p, &cfg, &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_policy_add_step(p, 7, NULL, b, 2, &r, &err) == PRISM_OK);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_TRUE(r.map_changed);
    CU_ASSERT_EQUAL(r.map_version, 3);
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 3);
    CU_ASSERT_EQUAL(r.change_count, 1);
    CU_ASSERT_EQUAL(prism_policy_find_block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_policy_destroy(p);
    prism_config_free(&cfg);
}

static void test_hybrid_keys_have_their_defaults(void)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    CU_ASSERT_FALSE(cfg.hybrid);
    CU_ASSERT_EQUAL(cfg.hybrid_low_format, PRISM_HYBRID_LOW_AUTO);
    CU_ASSERT_EQUAL(cfg.hybrid_gamma, 4.0);
    CU_ASSERT_EQUAL(cfg.hybrid_memory_fraction, 0.9);
    CU_ASSERT_FALSE(cfg.hybrid_fixed_classes.given);
    CU_ASSERT_EQUAL(cfg.hybrid_fixed_classes.count, 0);
    CU_ASSERT_EQUAL(cfg.hybrid_link_bytes_per_second, 12.5e9);
    CU_ASSERT_EQUAL(cfg.hybrid_link_latency_seconds, 1e-5);
    json_t *j = prism_config_to_json(&cfg);
    CU_ASSERT_TRUE(json_is_null(json_object_get(j, "hybrid_fixed_classes")));
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "hybrid_low_format")), "auto");
    json_decref(j);
    prism_config_free(&cfg);
}

static void test_hybrid_keys_are_set_copied_and_written_back(void)
{
    prism_config cfg, copy;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    CU_ASSERT_FATAL(apply(&cfg, "{\"hybrid\": true, \"hybrid_low_format\": \"int8\", \"hybrid_gamma\": 0,"
                                " \"hybrid_memory_fraction\": 1, \"hybrid_fixed_classes\": [\"a100\", \"t4\", \"a100\"],"
                                " \"hybrid_link_bytes_per_second\": 1e9, \"hybrid_link_latency_seconds\": 0}",
                          &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_config_copy(&copy, &cfg, &err) == PRISM_OK);
    prism_config_free(&cfg);
    CU_ASSERT_TRUE(copy.hybrid);
    CU_ASSERT_EQUAL(copy.hybrid_low_format, PRISM_HYBRID_LOW_INT8);
    CU_ASSERT_EQUAL(copy.hybrid_gamma, 0.0);
    CU_ASSERT_EQUAL(copy.hybrid_memory_fraction, 1.0);
    CU_ASSERT_TRUE(copy.hybrid_fixed_classes.given);
    CU_ASSERT_EQUAL_FATAL(copy.hybrid_fixed_classes.count, 3);
    CU_ASSERT_STRING_EQUAL(copy.hybrid_fixed_classes.names[1], "t4");
    CU_ASSERT_EQUAL(copy.hybrid_link_bytes_per_second, 1e9);
    json_t *j = prism_config_to_json(&copy);
    char *text = json_dumps(json_object_get(j, "hybrid_fixed_classes"), JSON_ENCODE_ANY | JSON_COMPACT);
    CU_ASSERT_STRING_EQUAL(text, "[\"a100\",\"t4\",\"a100\"]");
    free(text);
    json_decref(j);
    /* [] is given and empty: no class fixed; null goes back to the rule. */
    CU_ASSERT_FATAL(apply(&copy, "{\"hybrid_fixed_classes\": []}", &err) == PRISM_OK);
    CU_ASSERT_TRUE(copy.hybrid_fixed_classes.given);
    CU_ASSERT_EQUAL(copy.hybrid_fixed_classes.count, 0);
    CU_ASSERT_FATAL(apply(&copy, "{\"hybrid_fixed_classes\": null}", &err) == PRISM_OK);
    CU_ASSERT_FALSE(copy.hybrid_fixed_classes.given);
    prism_config_free(&copy);
}

static void test_bad_hybrid_values_are_refused_naming_the_key(void)
{
    static const struct {
        const char *json, *message;
    } cases[] = {
        {"{\"hybrid\": 1}", "hybrid: expected true or false, got an integer"},
        {"{\"hybrid_low_format\": \"fp8_e5m2\"}", "hybrid_low_format: \"fp8_e5m2\" is not one of \"auto\", \"int8\", \"fp8_e4m3\""},
        {"{\"hybrid_gamma\": -1}", "hybrid_gamma: -1 is outside [0, inf]"},
        {"{\"hybrid_memory_fraction\": 0}", "hybrid_memory_fraction: 0 is outside (0, 1]"},
        {"{\"hybrid_memory_fraction\": 1.5}", "hybrid_memory_fraction: 1.5 is outside (0, 1]"},
        {"{\"hybrid_link_bytes_per_second\": 0}", "hybrid_link_bytes_per_second: 0 is outside (0, inf]"},
        {"{\"hybrid_link_latency_seconds\": -0.5}", "hybrid_link_latency_seconds: -0.5 is outside [0, inf]"},
        {"{\"hybrid_fixed_classes\": \"t4\"}", "hybrid_fixed_classes: expected null or an array of names, got a string"},
        {"{\"hybrid_fixed_classes\": [\"t4\", 3]}", "hybrid_fixed_classes[1]: expected a string, got an integer"},
        {"{\"hybrid_fixed_classes\": [\"\"]}", "hybrid_fixed_classes[0]: the name is empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_config cfg;
        prism_error err;
        CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
        CU_ASSERT_EQUAL(apply(&cfg, cases[i].json, &err), PRISM_ERR_INVALID);
        if (strcmp(err.message, cases[i].message) != 0)
            fprintf(stderr, "case %zu: got \"%s\"\n", i, err.message);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
        CU_ASSERT_FALSE(cfg.hybrid_fixed_classes.given); /* nothing partially applied */
        prism_config_free(&cfg);
    }
}

static const prism_test_case cases[] = {
    {"test_bump_version_commits_a_new_map_with_the_same_precisions",
     test_bump_version_commits_a_new_map_with_the_same_precisions},
    {"test_hybrid_keys_have_their_defaults", test_hybrid_keys_have_their_defaults},
    {"test_hybrid_keys_are_set_copied_and_written_back", test_hybrid_keys_are_set_copied_and_written_back},
    {"test_bad_hybrid_values_are_refused_naming_the_key", test_bad_hybrid_values_are_refused_naming_the_key},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"hybrid_prismd", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
