/* The Conductor's rules (include/prism/transfer.h, DESIGN 9): the prefetch window, in-flight
 * slots, VRAM pressure only in backward and only strictly above the threshold, the optimizer
 * phase, the order in which rules answer, what zero limits mean, limits that tighten at once and
 * loosen only at the next step (every field), and bad limits refused naming the field. */
#include "testutil.h"

#include "prism/transfer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GIB ((uint64_t)1 << 30)

static prism_conductor *make(const prism_conductor_limits *l)
{
    prism_conductor *c = NULL;
    prism_error err = {0};
    prism_status st = prism_conductor_create(l, &c, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "create: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK && c != NULL);
    return c;
}

/* Field by field: the struct has padding, so never memcmp. */
static bool same_limits(const prism_conductor_limits *a, const prism_conductor_limits *b)
{
    return a->max_inflight_h2d == b->max_inflight_h2d && a->max_inflight_d2h == b->max_inflight_d2h &&
           a->prefetch_window == b->prefetch_window &&
           a->vram_pressure_threshold == b->vram_pressure_threshold &&
           a->suppress_prefetch_in_backward == b->suppress_prefetch_in_backward &&
           a->suppress_prefetch_in_optimizer == b->suppress_prefetch_in_optimizer;
}

static prism_conductor_verdict ask(const prism_conductor *c, prism_conductor_phase phase, uint32_t distance,
                                   uint64_t used, uint64_t total)
{
    prism_conductor_request r = {phase, distance, used, total};
    return prism_conductor_may_prefetch(c, &r);
}

static void test_defaults_match_prismd(void)
{
    prism_conductor_limits l = prism_conductor_default_limits();
    CU_ASSERT_EQUAL(l.max_inflight_h2d, 2);
    CU_ASSERT_EQUAL(l.max_inflight_d2h, 2);
    CU_ASSERT_EQUAL(l.prefetch_window, 2);
    CU_ASSERT_EQUAL(l.vram_pressure_threshold, 0.8);
    CU_ASSERT_TRUE(l.suppress_prefetch_in_backward);
    CU_ASSERT_TRUE(l.suppress_prefetch_in_optimizer);
    prism_conductor *c = make(NULL);
    prism_conductor_limits now, next;
    prism_conductor_get_limits(c, &now, &next);
    CU_ASSERT_TRUE(same_limits(&now, &l));
    CU_ASSERT_TRUE(same_limits(&next, &l));
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_D2H), 0);
    prism_conductor_destroy(c);
}

/* One question and its exact answer. */
typedef struct rule_case {
    const char *what;
    prism_conductor_phase phase;
    uint32_t distance;
    uint64_t used, total;
    prism_conductor_verdict want;
} rule_case;

static void run_rule_cases(const prism_conductor *c, const rule_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const rule_case *k = &cases[i];
        prism_conductor_verdict got = ask(c, k->phase, k->distance, k->used, k->total);
        if (got != k->want)
            fprintf(stderr, "%s: got %s, want %s\n", k->what, prism_conductor_verdict_name(got),
                    prism_conductor_verdict_name(k->want));
        CU_ASSERT_EQUAL(got, k->want);
    }
}

static void test_window_allows_distance_1_to_window(void)
{
    prism_conductor_limits l = prism_conductor_default_limits();
    l.prefetch_window = 3;
    prism_conductor *c = make(&l);
    static const rule_case cases[] = {
        {"distance 0 is the block in use", PRISM_CONDUCTOR_FORWARD, 0, 0, 0, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {"distance 1", PRISM_CONDUCTOR_FORWARD, 1, 0, 0, PRISM_CONDUCTOR_ALLOW},
        {"distance 3 = window", PRISM_CONDUCTOR_FORWARD, 3, 0, 0, PRISM_CONDUCTOR_ALLOW},
        {"distance 4 > window", PRISM_CONDUCTOR_FORWARD, 4, 0, 0, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {"backward distance 4", PRISM_CONDUCTOR_BACKWARD, 4, 0, 0, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {"huge distance", PRISM_CONDUCTOR_FORWARD, UINT32_MAX, 0, 0, PRISM_CONDUCTOR_REFUSE_WINDOW},
    };
    run_rule_cases(c, cases, sizeof cases / sizeof cases[0]);
    prism_conductor_destroy(c);
}

static void test_slots_refuse_when_h2d_in_flight_reach_the_limit(void)
{
    prism_conductor *c = make(NULL); /* 2 each way */
    prism_error err = {0};
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 2);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_SLOTS);
    CU_ASSERT_FALSE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 2);
    /* D2H slots are their own: full H2D does not touch them, and they do not gate prefetch. */
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_D2H));
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_D2H));
    CU_ASSERT_FALSE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_D2H));
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_H2D, &err), PRISM_OK);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_ALLOW);
    /* A demand transfer takes a slot whatever the count. */
    prism_conductor_acquire_anyway(c, PRISM_CONDUCTOR_H2D);
    prism_conductor_acquire_anyway(c, PRISM_CONDUCTOR_H2D);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 3);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_SLOTS);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_H2D, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_H2D, &err), PRISM_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(err.message, "release: no h2d slot is held");
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_D2H, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_D2H, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_D2H, &err), PRISM_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(err.message, "release: no d2h slot is held");
    prism_conductor_destroy(c);
}

static void test_pressure_only_in_backward_and_strictly_above_threshold(void)
{
    prism_conductor *c = make(NULL); /* threshold 0.8, both suppressions on */
    static const rule_case cases[] = {
        {"backward 80/100 is exactly the threshold", PRISM_CONDUCTOR_BACKWARD, 1, 80, 100, PRISM_CONDUCTOR_ALLOW},
        {"backward 81/100", PRISM_CONDUCTOR_BACKWARD, 1, 81, 100, PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {"backward 4/5 GiB exactly", PRISM_CONDUCTOR_BACKWARD, 1, 4 * GIB, 5 * GIB, PRISM_CONDUCTOR_ALLOW},
        {"backward 4 GiB + 1 byte of 5", PRISM_CONDUCTOR_BACKWARD, 1, 4 * GIB + 1, 5 * GIB,
         PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {"backward 79/100", PRISM_CONDUCTOR_BACKWARD, 1, 79, 100, PRISM_CONDUCTOR_ALLOW},
        {"backward full", PRISM_CONDUCTOR_BACKWARD, 1, 100, 100, PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {"backward used above total", PRISM_CONDUCTOR_BACKWARD, 1, 101, 100, PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {"backward total unknown", PRISM_CONDUCTOR_BACKWARD, 1, 99, 0, PRISM_CONDUCTOR_ALLOW},
        {"forward 99/100", PRISM_CONDUCTOR_FORWARD, 1, 99, 100, PRISM_CONDUCTOR_ALLOW},
    };
    run_rule_cases(c, cases, sizeof cases / sizeof cases[0]);

    /* The optimizer rule off: pressure does not apply in the optimizer phase either. */
    prism_conductor_limits l = prism_conductor_default_limits();
    l.suppress_prefetch_in_optimizer = false;
    prism_conductor *o = make(&l);
    CU_ASSERT_EQUAL(ask(o, PRISM_CONDUCTOR_OPTIMIZER, 1, 99, 100), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(o, PRISM_CONDUCTOR_BACKWARD, 1, 99, 100), PRISM_CONDUCTOR_REFUSE_PRESSURE);
    prism_conductor_destroy(o);

    /* The backward rule off: no pressure refusal anywhere. */
    l = prism_conductor_default_limits();
    l.suppress_prefetch_in_backward = false;
    prism_conductor *b = make(&l);
    CU_ASSERT_EQUAL(ask(b, PRISM_CONDUCTOR_BACKWARD, 1, 99, 100), PRISM_CONDUCTOR_ALLOW);
    prism_conductor_destroy(b);

    /* Another threshold. */
    l = prism_conductor_default_limits();
    l.vram_pressure_threshold = 0.5;
    prism_conductor *h = make(&l);
    CU_ASSERT_EQUAL(ask(h, PRISM_CONDUCTOR_BACKWARD, 1, 50, 100), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(h, PRISM_CONDUCTOR_BACKWARD, 1, 51, 100), PRISM_CONDUCTOR_REFUSE_PRESSURE);
    prism_conductor_destroy(h);
    prism_conductor_destroy(c);
}

static void test_optimizer_phase_refuses_whatever_the_memory(void)
{
    prism_conductor *c = make(NULL);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 100), PRISM_CONDUCTOR_REFUSE_OPTIMIZER);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_OPTIMIZER);
    prism_conductor_limits l = prism_conductor_default_limits();
    l.suppress_prefetch_in_optimizer = false;
    prism_conductor *o = make(&l);
    CU_ASSERT_EQUAL(ask(o, PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 100), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(o, PRISM_CONDUCTOR_OPTIMIZER, 3, 0, 100), PRISM_CONDUCTOR_REFUSE_WINDOW);
    prism_conductor_destroy(o);
    prism_conductor_destroy(c);
}

static void test_rules_answer_in_order_optimizer_pressure_window_slots(void)
{
    prism_conductor *c = make(NULL);
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D)); /* slots full */
    static const rule_case cases[] = {
        {"optimizer + window + slots", PRISM_CONDUCTOR_OPTIMIZER, 9, 99, 100, PRISM_CONDUCTOR_REFUSE_OPTIMIZER},
        {"pressure + window + slots", PRISM_CONDUCTOR_BACKWARD, 9, 99, 100, PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {"window + slots", PRISM_CONDUCTOR_BACKWARD, 9, 10, 100, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {"slots", PRISM_CONDUCTOR_FORWARD, 1, 99, 100, PRISM_CONDUCTOR_REFUSE_SLOTS},
    };
    run_rule_cases(c, cases, sizeof cases / sizeof cases[0]);
    prism_conductor_destroy(c);
}

static void test_zero_limits_mean_none_and_any_memory(void)
{
    prism_conductor_limits l = prism_conductor_default_limits();
    l.max_inflight_h2d = 0;
    l.max_inflight_d2h = 0;
    prism_conductor *s = make(&l);
    CU_ASSERT_EQUAL(ask(s, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_SLOTS);
    CU_ASSERT_FALSE(prism_conductor_try_acquire(s, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_FALSE(prism_conductor_try_acquire(s, PRISM_CONDUCTOR_D2H));
    prism_conductor_destroy(s);

    l = prism_conductor_default_limits();
    l.prefetch_window = 0;
    prism_conductor *w = make(&l);
    CU_ASSERT_EQUAL(ask(w, PRISM_CONDUCTOR_FORWARD, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_WINDOW);
    CU_ASSERT_TRUE(prism_conductor_try_acquire(w, PRISM_CONDUCTOR_H2D)); /* demand still goes */
    prism_conductor_destroy(w);

    l = prism_conductor_default_limits();
    l.vram_pressure_threshold = 0;
    prism_conductor *p = make(&l);
    CU_ASSERT_EQUAL(ask(p, PRISM_CONDUCTOR_BACKWARD, 1, 0, 100), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(p, PRISM_CONDUCTOR_BACKWARD, 1, 1, 100), PRISM_CONDUCTOR_REFUSE_PRESSURE);
    CU_ASSERT_EQUAL(ask(p, PRISM_CONDUCTOR_FORWARD, 1, 1, 100), PRISM_CONDUCTOR_ALLOW);
    prism_conductor_destroy(p);

    l = prism_conductor_default_limits();
    l.vram_pressure_threshold = 1;
    prism_conductor *one = make(&l);
    CU_ASSERT_EQUAL(ask(one, PRISM_CONDUCTOR_BACKWARD, 1, 100, 100), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(one, PRISM_CONDUCTOR_BACKWARD, 1, 101, 100), PRISM_CONDUCTOR_REFUSE_PRESSURE);
    prism_conductor_destroy(one);
}

/* For each field: a looser and a tighter value than the base. Handing in the looser one changes
 * nothing in the step; handing in the tighter one applies at once; either is in full force at the
 * next step. */
typedef struct field_case {
    const char *field;
    void (*loosen)(prism_conductor_limits *);
    void (*tighten)(prism_conductor_limits *);
} field_case;

static void loosen_h2d(prism_conductor_limits *l) { l->max_inflight_h2d = 5; }
static void tighten_h2d(prism_conductor_limits *l) { l->max_inflight_h2d = 1; }
static void loosen_d2h(prism_conductor_limits *l) { l->max_inflight_d2h = 5; }
static void tighten_d2h(prism_conductor_limits *l) { l->max_inflight_d2h = 1; }
static void loosen_window(prism_conductor_limits *l) { l->prefetch_window = 5; }
static void tighten_window(prism_conductor_limits *l) { l->prefetch_window = 1; }
static void loosen_vram(prism_conductor_limits *l) { l->vram_pressure_threshold = 0.95; }
static void tighten_vram(prism_conductor_limits *l) { l->vram_pressure_threshold = 0.5; }
static void loosen_backward(prism_conductor_limits *l) { l->suppress_prefetch_in_backward = false; }
static void tighten_backward(prism_conductor_limits *l) { l->suppress_prefetch_in_backward = true; }
static void loosen_optimizer(prism_conductor_limits *l) { l->suppress_prefetch_in_optimizer = false; }
static void tighten_optimizer(prism_conductor_limits *l) { l->suppress_prefetch_in_optimizer = true; }

static const field_case field_cases[] = {
    {"max_inflight_h2d", loosen_h2d, tighten_h2d},
    {"max_inflight_d2h", loosen_d2h, tighten_d2h},
    {"prefetch_window", loosen_window, tighten_window},
    {"vram_pressure_threshold", loosen_vram, tighten_vram},
    {"suppress_prefetch_in_backward", loosen_backward, tighten_backward},
    {"suppress_prefetch_in_optimizer", loosen_optimizer, tighten_optimizer},
};

/* The base the cases move from: defaults with both flags off, so that a flag can be tightened. */
static prism_conductor_limits field_base(void)
{
    prism_conductor_limits l = prism_conductor_default_limits();
    l.suppress_prefetch_in_backward = false;
    l.suppress_prefetch_in_optimizer = false;
    return l;
}

static void test_each_field_tightens_at_once_and_loosens_next_step(void)
{
    prism_error err = {0};
    for (size_t i = 0; i < sizeof field_cases / sizeof field_cases[0]; i++) {
        const field_case *f = &field_cases[i];
        prism_conductor_limits base = field_base();
        /* Flags start on when the case loosens them, off when it tightens them. */
        prism_conductor_limits start = base;
        f->tighten(&start);
        prism_conductor *c = make(&start);
        CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 10, &err), PRISM_OK);

        prism_conductor_limits looser = start, now, next;
        f->loosen(&looser);
        CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &looser, &err), PRISM_OK);
        prism_conductor_get_limits(c, &now, &next);
        if (!same_limits(&now, &start))
            fprintf(stderr, "%s: loosened within the step\n", f->field);
        CU_ASSERT_TRUE(same_limits(&now, &start));
        CU_ASSERT_TRUE(same_limits(&next, &looser));
        CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 11, &err), PRISM_OK);
        prism_conductor_get_limits(c, &now, NULL);
        CU_ASSERT_TRUE(same_limits(&now, &looser));

        /* Now tighten it back: at once, with no step. */
        CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &start, &err), PRISM_OK);
        prism_conductor_get_limits(c, &now, &next);
        if (!same_limits(&now, &start))
            fprintf(stderr, "%s: tightening waited for the step\n", f->field);
        CU_ASSERT_TRUE(same_limits(&now, &start));
        CU_ASSERT_TRUE(same_limits(&next, &start));
        CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 12, &err), PRISM_OK);
        prism_conductor_get_limits(c, &now, NULL);
        CU_ASSERT_TRUE(same_limits(&now, &start));
        prism_conductor_destroy(c);
    }
}

static void test_mixed_limits_apply_tighter_fields_now_and_the_last_ones_next_step(void)
{
    prism_error err = {0};
    prism_conductor *c = make(NULL); /* h2d 2, d2h 2, window 2, 0.8, on, on */
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 0, &err), PRISM_OK);
    prism_conductor_limits a = {.max_inflight_h2d = 1, .max_inflight_d2h = 4, .prefetch_window = 6,
                                .vram_pressure_threshold = 0.9, .suppress_prefetch_in_backward = true,
                                .suppress_prefetch_in_optimizer = false};
    CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &a, &err), PRISM_OK);
    prism_conductor_limits now;
    prism_conductor_get_limits(c, &now, NULL);
    CU_ASSERT_EQUAL(now.max_inflight_h2d, 1); /* tighter: now */
    CU_ASSERT_EQUAL(now.max_inflight_d2h, 2); /* looser: waits */
    CU_ASSERT_EQUAL(now.prefetch_window, 2);
    CU_ASSERT_EQUAL(now.vram_pressure_threshold, 0.8);
    CU_ASSERT_TRUE(now.suppress_prefetch_in_backward);
    CU_ASSERT_TRUE(now.suppress_prefetch_in_optimizer);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 3, 0, 0), PRISM_CONDUCTOR_REFUSE_WINDOW);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 0), PRISM_CONDUCTOR_REFUSE_OPTIMIZER);
    /* A second hand-in in the same step: a tighter window applies, a loosened h2d does not. */
    prism_conductor_limits b = a;
    b.max_inflight_h2d = 3;
    b.prefetch_window = 1;
    CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &b, &err), PRISM_OK);
    prism_conductor_get_limits(c, &now, NULL);
    CU_ASSERT_EQUAL(now.max_inflight_h2d, 1);
    CU_ASSERT_EQUAL(now.prefetch_window, 1);
    /* The next step: the last limits handed in, in full. */
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 1, &err), PRISM_OK);
    prism_conductor_get_limits(c, &now, NULL);
    CU_ASSERT_TRUE(same_limits(&now, &b));
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 0), PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT_EQUAL(ask(c, PRISM_CONDUCTOR_FORWARD, 2, 0, 0), PRISM_CONDUCTOR_REFUSE_WINDOW);
    /* Nothing handed in: the step after keeps them. */
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 2, &err), PRISM_OK);
    prism_conductor_get_limits(c, &now, NULL);
    CU_ASSERT_TRUE(same_limits(&now, &b));
    prism_conductor_destroy(c);
}

static void test_steps_must_increase(void)
{
    prism_error err = {0};
    prism_conductor *c = make(NULL);
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 5, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 5, &err), PRISM_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(err.message, "step: 5 is not after the step already begun (5)");
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 4, &err), PRISM_ERR_STATE);
    CU_ASSERT_EQUAL(prism_conductor_begin_step(c, 7, &err), PRISM_OK);
    prism_conductor_destroy(c);
}

typedef struct bad_case {
    void (*spoil)(prism_conductor_limits *);
    const char *message;
} bad_case;

static void bad_h2d(prism_conductor_limits *l) { l->max_inflight_h2d = 65; }
static void bad_d2h(prism_conductor_limits *l) { l->max_inflight_d2h = 1000; }
static void bad_window(prism_conductor_limits *l) { l->prefetch_window = UINT32_MAX; }
static void bad_vram_low(prism_conductor_limits *l) { l->vram_pressure_threshold = -0.25; }
static void bad_vram_high(prism_conductor_limits *l) { l->vram_pressure_threshold = 1.5; }
static void bad_vram_nan(prism_conductor_limits *l) { l->vram_pressure_threshold = NAN; }

static const bad_case bad_cases[] = {
    {bad_h2d, "max_inflight_h2d: 65 is above 64"},
    {bad_d2h, "max_inflight_d2h: 1000 is above 64"},
    {bad_window, "prefetch_window: 4294967295 is above 64"},
    {bad_vram_low, "vram_pressure_threshold: -0.25 is not a fraction from 0 to 1"},
    {bad_vram_high, "vram_pressure_threshold: 1.5 is not a fraction from 0 to 1"},
    {bad_vram_nan, "vram_pressure_threshold: nan is not a fraction from 0 to 1"},
};

static void test_bad_limits_are_refused_naming_the_field_and_change_nothing(void)
{
    prism_conductor *c = make(NULL);
    prism_conductor_limits before, after, next;
    prism_conductor_get_limits(c, &before, NULL);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        prism_conductor_limits l = prism_conductor_default_limits();
        l.max_inflight_h2d = 0; /* a tighter field beside the bad one must not apply either */
        bad_cases[i].spoil(&l);
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_conductor_check_limits(&l, &err), PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, bad_cases[i].message);
        memset(&err, 0, sizeof err);
        CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &l, &err), PRISM_ERR_INVALID);
        CU_ASSERT_EQUAL(err.status, PRISM_ERR_INVALID);
        prism_conductor_get_limits(c, &after, &next);
        CU_ASSERT_TRUE(same_limits(&after, &before));
        CU_ASSERT_TRUE(same_limits(&next, &before));
        prism_conductor *none = c; /* must be set to NULL */
        CU_ASSERT_EQUAL(prism_conductor_create(&l, &none, &err), PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NULL(none);
    }
    /* The edges are accepted. */
    prism_error err = {0};
    prism_conductor_limits l = (prism_conductor_limits){64, 64, 64, 1.0, false, false};
    CU_ASSERT_EQUAL(prism_conductor_check_limits(&l, &err), PRISM_OK);
    l = (prism_conductor_limits){0, 0, 0, 0.0, true, true};
    CU_ASSERT_EQUAL(prism_conductor_check_limits(&l, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_check_limits(NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "limits: NULL");
    prism_conductor_destroy(c);
}

static void test_names(void)
{
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name(PRISM_CONDUCTOR_ALLOW), "allow");
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name(PRISM_CONDUCTOR_REFUSE_OPTIMIZER), "optimizer");
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name(PRISM_CONDUCTOR_REFUSE_PRESSURE), "pressure");
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name(PRISM_CONDUCTOR_REFUSE_WINDOW), "window");
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name(PRISM_CONDUCTOR_REFUSE_SLOTS), "slots");
    CU_ASSERT_STRING_EQUAL(prism_conductor_verdict_name((prism_conductor_verdict)5), "?");
    CU_ASSERT_STRING_EQUAL(prism_conductor_phase_name(PRISM_CONDUCTOR_FORWARD), "forward");
    CU_ASSERT_STRING_EQUAL(prism_conductor_phase_name(PRISM_CONDUCTOR_BACKWARD), "backward");
    CU_ASSERT_STRING_EQUAL(prism_conductor_phase_name(PRISM_CONDUCTOR_OPTIMIZER), "optimizer");
    CU_ASSERT_STRING_EQUAL(prism_conductor_phase_name((prism_conductor_phase)3), "?");
}

/* The hints prismd sent, as the client reads them, become the limits field for field; hints
 * never received give the defaults. */
static void test_limits_from_the_hints_prismd_sent(void)
{
    prism_client_runtime_hints h = {.map_version = 3,
                                    .max_inflight_h2d = 4,
                                    .max_inflight_d2h = 1,
                                    .prefetch_window = 6,
                                    .suppress_prefetch_in_backward = true,
                                    .suppress_prefetch_in_optimizer = false,
                                    .vram_pressure_threshold = 0.7};
    prism_conductor_limits l = prism_conductor_limits_from_hints(&h);
    CU_ASSERT_EQUAL(l.max_inflight_h2d, 4);
    CU_ASSERT_EQUAL(l.max_inflight_d2h, 1);
    CU_ASSERT_EQUAL(l.prefetch_window, 6);
    CU_ASSERT_EQUAL(l.vram_pressure_threshold, 0.7);
    CU_ASSERT_TRUE(l.suppress_prefetch_in_backward);
    CU_ASSERT_FALSE(l.suppress_prefetch_in_optimizer);
    /* All zero but a map version: prismd said "nothing in flight, no prefetch". */
    prism_client_runtime_hints zero = {.map_version = 1};
    l = prism_conductor_limits_from_hints(&zero);
    CU_ASSERT_EQUAL(l.max_inflight_h2d, 0);
    CU_ASSERT_EQUAL(l.prefetch_window, 0);
    /* Nothing received yet (or NULL): the defaults. */
    prism_client_runtime_hints none = {0};
    prism_conductor_limits d = prism_conductor_default_limits();
    l = prism_conductor_limits_from_hints(&none);
    CU_ASSERT_EQUAL(l.max_inflight_h2d, d.max_inflight_h2d);
    CU_ASSERT_EQUAL(l.max_inflight_d2h, d.max_inflight_d2h);
    CU_ASSERT_EQUAL(l.prefetch_window, d.prefetch_window);
    CU_ASSERT_EQUAL(l.vram_pressure_threshold, d.vram_pressure_threshold);
    l = prism_conductor_limits_from_hints(NULL);
    CU_ASSERT_EQUAL(l.prefetch_window, d.prefetch_window);
}

static const prism_test_case cases[] = {
    {"test_limits_from_the_hints_prismd_sent", test_limits_from_the_hints_prismd_sent},
    {"test_defaults_match_prismd", test_defaults_match_prismd},
    {"test_window_allows_distance_1_to_window", test_window_allows_distance_1_to_window},
    {"test_slots_refuse_when_h2d_in_flight_reach_the_limit", test_slots_refuse_when_h2d_in_flight_reach_the_limit},
    {"test_pressure_only_in_backward_and_strictly_above_threshold",
     test_pressure_only_in_backward_and_strictly_above_threshold},
    {"test_optimizer_phase_refuses_whatever_the_memory", test_optimizer_phase_refuses_whatever_the_memory},
    {"test_rules_answer_in_order_optimizer_pressure_window_slots",
     test_rules_answer_in_order_optimizer_pressure_window_slots},
    {"test_zero_limits_mean_none_and_any_memory", test_zero_limits_mean_none_and_any_memory},
    {"test_each_field_tightens_at_once_and_loosens_next_step", test_each_field_tightens_at_once_and_loosens_next_step},
    {"test_mixed_limits_apply_tighter_fields_now_and_the_last_ones_next_step",
     test_mixed_limits_apply_tighter_fields_now_and_the_last_ones_next_step},
    {"test_steps_must_increase", test_steps_must_increase},
    {"test_bad_limits_are_refused_naming_the_field_and_change_nothing",
     test_bad_limits_are_refused_naming_the_field_and_change_nothing},
    {"test_names", test_names},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"conductor", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
