/* prismd's auth rule (auth.c) case by case, the provisioned tokens as a directory (laid out as a
 * Kubernetes Secret volume) and as a JSON file, and the store's side of DELETE and idle expiry:
 * a deleted job is gone with its state and history, and activity times come back. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "auth.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OK PRISMD_AUTH_OK
#define MISSING PRISMD_AUTH_MISSING
#define WRONG PRISMD_AUTH_WRONG

static void test_auth_rule_table(void)
{
    static const struct {
        const char *admin;
        bool require_read;
        const char *job_token;
        const char *bearer;
        prismd_access access;
        prismd_auth expected;
    } cases[] = {
        /* reads: open, unless required; a wrong token is refused all the same */
        {"adm", false, "tok", NULL, PRISMD_ACCESS_READ, OK},
        {"adm", true, "tok", NULL, PRISMD_ACCESS_READ, MISSING},
        {"adm", false, "tok", "tok", PRISMD_ACCESS_READ, OK},
        {"adm", true, "tok", "adm", PRISMD_ACCESS_READ, OK},
        {"adm", false, "tok", "other", PRISMD_ACCESS_READ, WRONG},
        {NULL, false, "tok", "other", PRISMD_ACCESS_READ, WRONG},
        /* changes: the job's or the admin token */
        {"adm", false, "tok", NULL, PRISMD_ACCESS_CHANGE, MISSING},
        {"adm", false, "tok", "tok", PRISMD_ACCESS_CHANGE, OK},
        {"adm", false, "tok", "adm", PRISMD_ACCESS_CHANGE, OK},
        {"adm", false, "tok", "tokx", PRISMD_ACCESS_CHANGE, WRONG},
        {"adm", false, "tok", "to", PRISMD_ACCESS_CHANGE, WRONG},
        /* a job without a token: open where nothing could check a token, else the admin's */
        {NULL, false, NULL, NULL, PRISMD_ACCESS_CHANGE, OK},
        {NULL, true, NULL, "whatever", PRISMD_ACCESS_READ, OK},
        {"adm", false, NULL, NULL, PRISMD_ACCESS_CHANGE, MISSING},
        {"adm", true, NULL, NULL, PRISMD_ACCESS_READ, MISSING},
        {"adm", false, NULL, "x", PRISMD_ACCESS_CHANGE, WRONG},
        /* agents of a job without a token connect without one, also when there is an admin */
        {"adm", false, NULL, NULL, PRISMD_ACCESS_AGENT, OK},
        {"adm", false, "tok", NULL, PRISMD_ACCESS_AGENT, MISSING},
        {"adm", false, "tok", "adm", PRISMD_ACCESS_AGENT, OK},
        {NULL, false, "tok", "bad", PRISMD_ACCESS_AGENT, WRONG},
        /* deletion: the admin token alone */
        {"adm", false, "tok", "adm", PRISMD_ACCESS_DELETE, OK},
        {"adm", false, "tok", "tok", PRISMD_ACCESS_DELETE, WRONG},
        {"adm", false, "tok", NULL, PRISMD_ACCESS_DELETE, MISSING},
        {NULL, false, NULL, NULL, PRISMD_ACCESS_DELETE, MISSING},
        {NULL, false, NULL, "any", PRISMD_ACCESS_DELETE, WRONG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prismd_auth_rule rule = {cases[i].admin, cases[i].require_read};
        prismd_auth got = prismd_auth_check(&rule, cases[i].job_token, cases[i].bearer, cases[i].access);
        if (got != cases[i].expected)
            fprintf(stderr, "case %zu: got %d, expected %d\n", i, (int)got, (int)cases[i].expected);
        CU_ASSERT_EQUAL(got, cases[i].expected);
    }
}

static void test_token_equal(void)
{
    CU_ASSERT_TRUE(prismd_token_equal("abc", "abc"));
    CU_ASSERT_FALSE(prismd_token_equal("abc", "abd"));
    CU_ASSERT_FALSE(prismd_token_equal("abc", "abcd"));
    CU_ASSERT_FALSE(prismd_token_equal("", "a"));
    CU_ASSERT_FALSE(prismd_token_equal(NULL, "a"));
    CU_ASSERT_FALSE(prismd_token_equal(NULL, NULL));
}

static void test_tokens_from_a_secret_volume_and_a_file(void)
{
    const char *dir = prism_scratch_dir();
    char secret[512], stamp[600], path[700], link[700];
    snprintf(secret, sizeof secret, "%s/secret", dir);
    snprintf(stamp, sizeof stamp, "%s/..2026_11_26_00_00_00.1", secret);
    CU_ASSERT_FATAL(mkdir(secret, 0700) == 0 && mkdir(stamp, 0700) == 0);
    prism_write_file(stamp, "job-a", "tok-a\n");
    prism_write_file(stamp, "job-b", "tok-b");
    snprintf(link, sizeof link, "%s/..data", secret);
    CU_ASSERT_FATAL(symlink("..2026_11_26_00_00_00.1", link) == 0);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "..data/job-%c", 'a' + i);
        snprintf(link, sizeof link, "%s/job-%c", secret, 'a' + i);
        CU_ASSERT_FATAL(symlink(path, link) == 0);
    }
    const char *file = prism_write_file(dir, "tokens.json", "{\"job-b\": \"tok-b\", \"job-c\": \"tok-c\"}");
    char file_copy[600];
    snprintf(file_copy, sizeof file_copy, "%s", file);
    prism_error err;
    prismd_tokens *t = prismd_tokens_load(secret, file_copy, &err);
    CU_ASSERT_FATAL(t != NULL);
    CU_ASSERT_EQUAL(prismd_tokens_count(t), 3);
    CU_ASSERT_STRING_EQUAL(prismd_tokens_find(t, "job-a"), "tok-a");
    CU_ASSERT_STRING_EQUAL(prismd_tokens_find(t, "job-b"), "tok-b");
    CU_ASSERT_STRING_EQUAL(prismd_tokens_find(t, "job-c"), "tok-c");
    CU_ASSERT_PTR_NULL(prismd_tokens_find(t, "job-d"));
    prismd_tokens_free(t);
    /* One job, two tokens: refused, naming the file and the key. */
    file = prism_write_file(dir, "tokens.json", "{\"job-a\": \"not-tok-a\"}");
    snprintf(file_copy, sizeof file_copy, "%s", file);
    CU_ASSERT_PTR_NULL(prismd_tokens_load(secret, file_copy, &err));
    char expected[800];
    snprintf(expected, sizeof expected, "%s: key \"job-a\": job job-a has another token already", file_copy);
    CU_ASSERT_STRING_EQUAL(err.message, expected);
    /* An empty token file in the directory: refused, naming it. */
    prism_write_file(secret, "job-e", "\n");
    CU_ASSERT_PTR_NULL(prismd_tokens_load(secret, NULL, &err));
    snprintf(expected, sizeof expected, "%s/job-e: job job-e: the token must be 1 to 4096 printable characters "
             "without spaces", secret);
    CU_ASSERT_STRING_EQUAL(err.message, expected);
    prism_scratch_cleanup();
}

typedef struct seen {
    char ids[8][32];
    int64_t times[8];
    int n;
} seen;

static void collect_activity(void *ctx, const char *job_id, int64_t last_active_ms)
{
    seen *s = ctx;
    if (s->n < 8) {
        snprintf(s->ids[s->n], sizeof s->ids[s->n], "%s", job_id);
        s->times[s->n++] = last_active_ms;
    }
}

static bool collect_job(void *ctx, prismd_saved_job *job)
{
    collect_activity(ctx, job->id, 0);
    prism_policy_destroy(job->policy);
    return true;
}

static void test_store_deletes_a_job_and_keeps_activity(void)
{
    const char *dir = prism_scratch_dir();
    prism_error err;
    prism_config cfg;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    prismd_store *s = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(s != NULL);
    CU_ASSERT_EQUAL(prismd_store_save_job(s, "job-a", "tok", 1, &cfg, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_save_job(s, "job-b", NULL, 1, &cfg, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_save_activity(s, "job-a", 1000, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_save_activity(s, "job-b", 2000, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_save_activity(s, "job-b", 3000, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_delete_job(s, "job-a", &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_delete_job(s, "no-such-job", &err), PRISM_OK);
    prismd_store_close(s);
    /* Reopened: job-a is gone with its activity; job-b's latest time is there. */
    s = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(s != NULL);
    seen jobs = {0}, activity = {0};
    CU_ASSERT_EQUAL(prismd_store_load_jobs(s, &cfg, collect_job, &jobs, &err), PRISM_OK);
    CU_ASSERT_EQUAL(jobs.n, 1);
    CU_ASSERT_STRING_EQUAL(jobs.ids[0], "job-b");
    CU_ASSERT_EQUAL(prismd_store_load_activity(s, collect_activity, &activity, &err), 1);
    CU_ASSERT_STRING_EQUAL(activity.ids[0], "job-b");
    CU_ASSERT_EQUAL(activity.times[0], 3000);
    prismd_store_close(s);
    prism_config_free(&cfg);
    prism_scratch_cleanup();
}

static const prism_test_case cases[] = {
    {"test_auth_rule_table", test_auth_rule_table},
    {"test_token_equal", test_token_equal},
    {"test_tokens_from_a_secret_volume_and_a_file", test_tokens_from_a_secret_volume_and_a_file},
    {"test_store_deletes_a_job_and_keeps_activity", test_store_deletes_a_job_and_keeps_activity},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    static const prism_test_suite suites[] = {{"auth", cases}, {NULL, NULL}};
    return prism_test_main(argc, argv, suites);
}
