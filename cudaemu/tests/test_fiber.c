/* The fiber switch of the device emulation (cudaemu/src/fiber.h), built twice: with the x86-64
 * assembly switch and with POSIX ucontext (-DPRISM_CUDAEMU_UCONTEXT). A switch must keep what the
 * System V ABI says survives a call (rbx, rbp, r12-r15, the stack pointer, and so every local
 * the compiler keeps there or on the stack), start a fiber on its own stack with the alignment a
 * call needs, and be cheap enough for thousands of fibers. PRISM_FIBER_EXPECTED_KIND names the
 * switch this executable must have. */
#include "fiber.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static prism_fiber *g_main;

/* A fiber with its own malloc'd stack. */
typedef struct {
    prism_fiber *f;
    char *stack;
    size_t size;
} fiber_t;

static int fiber_make(fiber_t *t, size_t size, void (*entry)(void *), void *arg)
{
    t->size = size;
    t->stack = malloc(size);
    t->f = t->stack ? prism_fiber_create(t->stack, size, entry, arg) : NULL;
    return t->f != NULL;
}

static void fiber_free(fiber_t *t)
{
    prism_fiber_destroy(t->f);
    free(t->stack);
}

static void test_fiber_kind_is_the_one_built(void)
{
    CU_ASSERT_STRING_EQUAL(prism_fiber_kind(), PRISM_FIBER_EXPECTED_KIND);
}

/* ---- ping-pong: locals and callee-saved registers survive switches ----------------------------- */

enum { kRounds = 1000 };

typedef struct {
    fiber_t self;
    fiber_t *peer;      /* switched to after each round */
    uint64_t seed;
    uint64_t result[8]; /* the accumulators at the end */
    double sum;
    int regs_ok;        /* rounds in which the callee-saved registers came back intact */
} player_t;

/* One round's mixing of eight accumulators: a reference the fibers' results are checked against. */
static void mix(uint64_t acc[8], uint64_t seed, int round)
{
    for (int k = 0; k < 8; k++)
        acc[k] = (acc[k] ^ (seed + (uint64_t)round * (k + 1))) * 0x9e3779b97f4a7c15ull + (acc[(k + 1) % 8] >> 7);
}

/* Sets rbx and r12-r15 to values of its own, switches, and checks that they came back: the other
 * side sets them to other values before it switches back. 1 when they did. */
static int __attribute__((noinline)) switch_keeping_registers(prism_fiber *from, prism_fiber *to, uint64_t tag)
{
#if defined(__x86_64__)
    register uint64_t rbx __asm__("rbx") = tag ^ 0x1111111111111111ull;
    register uint64_t r12 __asm__("r12") = tag ^ 0x2222222222222222ull;
    register uint64_t r13 __asm__("r13") = tag ^ 0x3333333333333333ull;
    register uint64_t r14 __asm__("r14") = tag ^ 0x4444444444444444ull;
    register uint64_t r15 __asm__("r15") = tag ^ 0x5555555555555555ull;
    __asm__ volatile("" : "+r"(rbx), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15));
    prism_fiber_switch(from, to);
    __asm__ volatile("" : "+r"(rbx), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15));
    return rbx == (tag ^ 0x1111111111111111ull) && r12 == (tag ^ 0x2222222222222222ull) &&
           r13 == (tag ^ 0x3333333333333333ull) && r14 == (tag ^ 0x4444444444444444ull) &&
           r15 == (tag ^ 0x5555555555555555ull);
#else
    (void)tag;
    prism_fiber_switch(from, to);
    return 1;
#endif
}

static void player(void *arg)
{
    player_t *p = arg;
    uint64_t acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double sum = 0.0; /* a float local: no xmm register survives a call, so it lives on the stack */
    for (int round = 0; round < kRounds; round++) {
        mix(acc, p->seed, round);
        sum += (double)round * 0.5;
        p->regs_ok += switch_keeping_registers(p->self.f, p->peer->f, p->seed * (uint64_t)(round + 1));
    }
    memcpy(p->result, acc, sizeof acc);
    p->sum = sum;
    prism_fiber_switch(p->self.f, g_main); /* the end: never resumed */
    abort();
}

static void test_ping_pong_keeps_locals_and_callee_saved_registers(void)
{
    player_t a = {0}, b = {0};
    a.seed = 0xa5a5a5a5ull;
    b.seed = 0x5a5a5a5a12345ull;
    a.peer = &b.self;
    b.peer = &a.self;
    CU_ASSERT_FATAL(fiber_make(&a.self, 64 << 10, player, &a));
    CU_ASSERT_FATAL(fiber_make(&b.self, 64 << 10, player, &b));
    /* a plays first; after its last round it switches to b, which plays its last round and
     * switches to a, which ends by switching here. b is then one step short of its end. */
    prism_fiber_switch(g_main, a.self.f);
    prism_fiber_switch(g_main, b.self.f);
    for (player_t *p = &a; p; p = p == &a ? &b : NULL) {
        uint64_t want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        for (int round = 0; round < kRounds; round++)
            mix(want, p->seed, round);
        CU_ASSERT_EQUAL(memcmp(p->result, want, sizeof want), 0);
        CU_ASSERT_EQUAL(p->sum, 0.5 * (kRounds - 1) * kRounds / 2);
        CU_ASSERT_EQUAL(p->regs_ok, kRounds);
    }
    fiber_free(&a.self);
    fiber_free(&b.self);
}

/* ---- deep recursion on a fiber's stack ---------------------------------------------------------- */

typedef struct {
    fiber_t self;
    int depth;
    uint64_t sum;
    int on_stack;  /* a local of the deepest frame lies inside the fiber's stack */
    int aligned;   /* frames are 16-byte aligned, as calls need */
    char text[32]; /* snprintf of a double: uses aligned SSE stores on the stack */
} recursion_t;

static recursion_t *g_rec;

static uint64_t __attribute__((noinline)) descend(int level)
{
    volatile uint64_t frame[6]; /* keeps each frame in memory, and the recursion real */
    for (int k = 0; k < 6; k++)
        frame[k] = (uint64_t)level * (k + 1);
    g_rec->aligned &= ((uintptr_t)__builtin_frame_address(0) % 16) == 0;
    if (level == g_rec->depth / 2) /* half way down: away and back */
        prism_fiber_switch(g_rec->self.f, g_main);
    uint64_t below = 0;
    if (level < g_rec->depth) {
        below = descend(level + 1);
    } else {
        const char *here = (const char *)frame;
        g_rec->on_stack = here >= g_rec->self.stack && here < g_rec->self.stack + g_rec->self.size;
        snprintf(g_rec->text, sizeof g_rec->text, "%.3f", 1.5 + level);
    }
    return below + frame[0] + frame[5];
}

static void recursion_entry(void *arg)
{
    recursion_t *r = arg;
    r->sum = descend(1);
    prism_fiber_switch(r->self.f, g_main);
    abort();
}

static void test_deep_recursion_on_a_fiber_stack(void)
{
    recursion_t r = {0};
    r.depth = 50000;
    r.aligned = 1;
    g_rec = &r;
    CU_ASSERT_FATAL(fiber_make(&r.self, 16 << 20, recursion_entry, &r));
    prism_fiber_switch(g_main, r.self.f); /* to half way */
    CU_ASSERT_EQUAL(r.sum, 0);
    prism_fiber_switch(g_main, r.self.f); /* to the end */
    /* Each level adds level * 1 + level * 6. */
    CU_ASSERT_EQUAL(r.sum, 7ull * (uint64_t)r.depth * (uint64_t)(r.depth + 1) / 2);
    CU_ASSERT_TRUE(r.on_stack);
    CU_ASSERT_TRUE(r.aligned);
    CU_ASSERT_STRING_EQUAL(r.text, "50001.500");
    fiber_free(&r.self);
}

/* ---- many fibers, chains, and reset -------------------------------------------------------------- */

enum { kMany = 1000, kManyRounds = 50 };

typedef struct {
    fiber_t self;
    int index;
    uint64_t count;
} counter_t;

static void counter_entry(void *arg)
{
    counter_t *c = arg;
    for (int round = 0;; round++) {
        c->count += (uint64_t)(c->index + round);
        prism_fiber_switch(c->self.f, g_main);
    }
}

static void test_many_fibers_each_keep_their_state(void)
{
    counter_t *cs = calloc(kMany, sizeof *cs);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cs);
    int made = 0;
    for (int i = 0; i < kMany; i++) {
        cs[i].index = i;
        made += fiber_make(&cs[i].self, 16 << 10, counter_entry, &cs[i]);
    }
    CU_ASSERT_EQUAL_FATAL(made, kMany);
    for (int round = 0; round < kManyRounds; round++)
        for (int i = 0; i < kMany; i++)
            prism_fiber_switch(g_main, cs[i].self.f);
    int wrong = 0;
    for (int i = 0; i < kMany; i++)
        wrong += cs[i].count != (uint64_t)i * kManyRounds + (uint64_t)(kManyRounds - 1) * kManyRounds / 2;
    CU_ASSERT_EQUAL(wrong, 0);
    for (int i = 0; i < kMany; i++)
        fiber_free(&cs[i].self);
    free(cs);
}

/* Fibers that switch straight to the next one: main -> 0 -> 1 -> ... -> n-1 -> main. */
enum { kChain = 100 };
static fiber_t g_chain[kChain];
static int g_order[kChain], g_visits;

static void chain_entry(void *arg)
{
    const int i = (int)(intptr_t)arg;
    g_order[g_visits++] = i;
    prism_fiber_switch(g_chain[i].f, i + 1 < kChain ? g_chain[i + 1].f : g_main);
    abort();
}

/* A fiber that ended (switched away for the last time) starts again from the top once reset. */
static int g_runs[2];
static fiber_t g_again;

static void again_entry(void *arg)
{
    g_runs[(intptr_t)arg]++;
    prism_fiber_switch(g_again.f, g_main);
    abort();
}

static void test_chain_of_switches_and_reset(void)
{
    g_visits = 0;
    for (int i = 0; i < kChain; i++)
        CU_ASSERT_FATAL(fiber_make(&g_chain[i], 16 << 10, chain_entry, (void *)(intptr_t)i));
    prism_fiber_switch(g_main, g_chain[0].f);
    CU_ASSERT_EQUAL(g_visits, kChain);
    int in_order = 0;
    for (int i = 0; i < kChain; i++)
        in_order += g_order[i] == i;
    CU_ASSERT_EQUAL(in_order, kChain);
    for (int i = 0; i < kChain; i++)
        fiber_free(&g_chain[i]);

    CU_ASSERT_FATAL(fiber_make(&g_again, 16 << 10, again_entry, (void *)(intptr_t)0));
    prism_fiber_switch(g_main, g_again.f);
    prism_fiber_reset(g_again.f, again_entry, (void *)(intptr_t)1);
    prism_fiber_switch(g_main, g_again.f);
    prism_fiber_reset(g_again.f, again_entry, (void *)(intptr_t)1);
    prism_fiber_switch(g_main, g_again.f);
    CU_ASSERT_EQUAL(g_runs[0], 1);
    CU_ASSERT_EQUAL(g_runs[1], 2);
    fiber_free(&g_again);
}

static const prism_test_case cases[] = {
    {"test_fiber_kind_is_the_one_built", test_fiber_kind_is_the_one_built},
    {"test_ping_pong_keeps_locals_and_callee_saved_registers", test_ping_pong_keeps_locals_and_callee_saved_registers},
    {"test_deep_recursion_on_a_fiber_stack", test_deep_recursion_on_a_fiber_stack},
    {"test_many_fibers_each_keep_their_state", test_many_fibers_each_keep_their_state},
    {"test_chain_of_switches_and_reset", test_chain_of_switches_and_reset},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"cudaemu_fiber_" PRISM_FIBER_EXPECTED_KIND, cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    g_main = prism_fiber_self();
    const int rc = prism_test_main(argc, argv, suites);
    prism_fiber_destroy(g_main);
    return rc;
}
