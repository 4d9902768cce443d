/* prismd's store keeps a job's hybrid plan (issue 15 item 3): the job_plan row is written in the
 * transaction of the decision's state, read back with the job, replaced by the next one, deleted
 * with the job; a schema 2 store is migrated to 3. Real SQLite files, exact values. */
#include "testutil.h"

#include "store.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fresh_dir(const char *name)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", prism_scratch_dir(), name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    return dir;
}

/* One value of SQL from the store's file, as text (the caller's buffer). */
static const char *query(const char *dir, const char *sql, char *out, size_t len)
{
    char path[600];
    snprintf(path, sizeof path, "%s/prism.db", dir);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    out[0] = '\0';
    CU_ASSERT_FATAL(sqlite3_open(path, &db) == SQLITE_OK);
    CU_ASSERT_FATAL(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(out, len, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

static void exec_sql(const char *dir, const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/prism.db", dir);
    sqlite3 *db = NULL;
    CU_ASSERT_FATAL(sqlite3_open(path, &db) == SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

typedef struct seen {
    int jobs, rows;
    uint64_t decided_step, effective_step;
    prism_policy_progress state; /* of the restored policy */
    prismd_plan_row row;
    char status[32], message[128], plan[256];
} seen;

static bool collect(void *ctx, prismd_saved_job *job)
{
    seen *s = ctx;
    s->jobs++;
    s->decided_step = job->decided_step;
    s->effective_step = job->effective_step;
    prism_policy_progress_get(job->policy, &s->state);
    if (job->has_plan_row) {
        s->rows++;
        s->row = job->plan;
        snprintf(s->status, sizeof s->status, "%s", job->plan.status);
        snprintf(s->message, sizeof s->message, "%s", job->plan.message);
        snprintf(s->plan, sizeof s->plan, "%s", job->plan.plan_json ? job->plan.plan_json : "(null)");
    }
    prism_policy_destroy(job->policy);
    return true;
}

static seen load(prismd_store *store, const prism_config *cfg)
{
    seen s = {0};
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, cfg, collect, &s, &err), PRISM_OK);
    return s;
}

static void test_the_plan_row_is_saved_with_the_state_restored_replaced_and_deleted(void)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    const char *dir = fresh_dir("hybrid-plan-row");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 2, &cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(p != NULL);
    /* A state without a plan row: none is kept. */
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 4, 5, NULL, 0, NULL, NAN, NULL, &err), PRISM_OK);
    seen s = load(store, &cfg);
    CU_ASSERT_EQUAL(s.jobs, 1);
    CU_ASSERT_EQUAL(s.rows, 0);
    prismd_plan_row row = {7, 12, 15, "planned", "", "{\"iteration_seconds\":0.5}"};
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 12, 15, NULL, 0, NULL, NAN, &row, &err), PRISM_OK);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    s = load(store, &cfg);
    CU_ASSERT_EQUAL(s.rows, 1);
    CU_ASSERT_EQUAL(s.row.map_version, 7);
    CU_ASSERT_EQUAL(s.row.decided_step, 12);
    CU_ASSERT_EQUAL(s.row.effective_step, 15);
    CU_ASSERT_STRING_EQUAL(s.status, "planned");
    CU_ASSERT_STRING_EQUAL(s.message, "");
    CU_ASSERT_STRING_EQUAL(s.plan, "{\"iteration_seconds\":0.5}");
    /* A state saved without a row leaves the row; a refused attempt replaces it (the plan stays). */
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 14, 17, NULL, 0, NULL, NAN, NULL, &err), PRISM_OK);
    prismd_plan_row refused = {7, 12, 15, "refused", "class \"t4\" does not fit", "{\"iteration_seconds\":0.5}"};
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 16, 19, NULL, 0, NULL, NAN, &refused, &err),
                          PRISM_OK);
    s = load(store, &cfg);
    CU_ASSERT_EQUAL(s.rows, 1);
    CU_ASSERT_STRING_EQUAL(s.status, "refused");
    CU_ASSERT_STRING_EQUAL(s.message, "class \"t4\" does not fit");
    /* No plan in force: a NULL plan. */
    prismd_plan_row none = {0, 0, 0, "none", "", NULL};
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 18, 21, NULL, 0, NULL, NAN, &none, &err), PRISM_OK);
    s = load(store, &cfg);
    CU_ASSERT_STRING_EQUAL(s.plan, "(null)");
    CU_ASSERT_EQUAL_FATAL(prismd_store_delete_job(store, "job-1", &err), PRISM_OK);
    char out[64];
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT count(*) FROM job_plan", out, sizeof out), "0");
    prism_policy_destroy(p);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static void test_a_schema_2_store_is_migrated_to_3(void)
{
    prism_error err;
    const char *dir = fresh_dir("hybrid-schema-2");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    prismd_store_close(store);
    char out[64];
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT value FROM meta WHERE key='schema_version'", out, sizeof out), "3");
    /* What a prismd of schema 2 left: no job_plan table. */
    exec_sql(dir, "DROP TABLE job_plan; UPDATE meta SET value = '2' WHERE key = 'schema_version'");
    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    prismd_store_close(store);
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT value FROM meta WHERE key='schema_version'", out, sizeof out), "3");
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT count(*) FROM job_plan", out, sizeof out), "0");
}

/* A schema-2 store that holds a job and its state (no job_plan table): migrated, the job and its
 * state load unchanged, and a plan row can then be kept with the state. */
static void test_a_schema_2_store_with_a_job_and_its_state_loads_after_migration(void)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    cfg.warmup_steps = 1;
    cfg.update_interval_steps = 1;
    const char *dir = fresh_dir("hybrid-schema-2-job");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-2", NULL, 3, &cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(p != NULL);
    prism_block_stats b[2] = {{0, 1.0, 1.0, 0.0, 0.0, 4, 0, false, 0, 0}, {1, 2.0, 2.0, 0.0, 0.0, 4, 0, false, 0, 0}};
    prism_step_result r;
    CU_ASSERT_FATAL(prism_policy_add_step(p, 9, NULL, b, 2, &r, &err) == PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-2", p, 9, 12, NULL, 0, NULL, NAN, NULL, &err), PRISM_OK);
    prism_policy_progress want;
    prism_policy_progress_get(p, &want);
    prism_policy_destroy(p);
    prismd_store_close(store);
    /* What a prismd of schema 2 left. */
    exec_sql(dir, "DROP TABLE job_plan; UPDATE meta SET value = '2' WHERE key = 'schema_version'");
    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    char out[64];
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT value FROM meta WHERE key='schema_version'", out, sizeof out), "3");
    seen s = load(store, &cfg);
    CU_ASSERT_EQUAL(s.jobs, 1);
    CU_ASSERT_EQUAL(s.rows, 0);
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT world_size FROM jobs WHERE id='job-2'", out, sizeof out), "3");
    CU_ASSERT_STRING_EQUAL(query(dir, "SELECT decided_step || ',' || effective_step || ',' || map_version FROM job_state"
                                      " WHERE job_id='job-2'", out, sizeof out),
                           "9,12,0");
    CU_ASSERT_EQUAL(s.state.steps_collected, want.steps_collected);
    CU_ASSERT_EQUAL(s.state.last_step, 9);
    CU_ASSERT_EQUAL(s.decided_step, 9);
    CU_ASSERT_EQUAL(s.effective_step, 12);
    prism_policy *q = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(q != NULL);
    prismd_plan_row row = {1, 9, 12, "planned", "", "{\"iteration_seconds\":0.25}"};
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-2", q, 9, 12, NULL, 0, NULL, NAN, &row, &err), PRISM_OK);
    s = load(store, &cfg);
    CU_ASSERT_EQUAL(s.rows, 1);
    CU_ASSERT_STRING_EQUAL(s.plan, "{\"iteration_seconds\":0.25}");
    prism_policy_destroy(q);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static const prism_test_case cases[] = {
    {"test_the_plan_row_is_saved_with_the_state_restored_replaced_and_deleted",
     test_the_plan_row_is_saved_with_the_state_restored_replaced_and_deleted},
    {"test_a_schema_2_store_is_migrated_to_3", test_a_schema_2_store_is_migrated_to_3},
    {"test_a_schema_2_store_with_a_job_and_its_state_loads_after_migration",
     test_a_schema_2_store_with_a_job_and_its_state_loads_after_migration},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"hybrid_store", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
