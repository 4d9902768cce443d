/* Fibers (fiber.h). The x86-64 switch follows the System V ABI: a function call may clobber every
 * register but rbx, rbp, r12-r15 and the stack pointer, so those are all a switch keeps. (The ABI
 * also keeps MXCSR's and the x87 control word's control bits; the fibers of a worker all run with
 * the thread's, which nothing in a kernel changes, so they are not switched: their loads stall
 * the pipeline, and a switch is the emulation's most frequent operation.) A new fiber's stack is laid out as if it had
 * switched away at its start: its saved registers hold entry and arg, and its return address is
 * a small trampoline that calls entry(arg) with a 16-byte aligned stack. */
#define _GNU_SOURCE
#include "fiber.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && !defined(PRISM_CUDAEMU_UCONTEXT)

struct prism_fiber {
    void *sp;
    void *stack;
    size_t size;
};

void prism_cudaemu_switch_sp(void **save, void *next);
void prism_cudaemu_fiber_trampoline(void);

__asm__(".text\n"
        ".globl prism_cudaemu_switch_sp\n"
        ".hidden prism_cudaemu_switch_sp\n"
        ".type prism_cudaemu_switch_sp,@function\n"
        "prism_cudaemu_switch_sp:\n"
        "  .cfi_startproc\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size prism_cudaemu_switch_sp, .-prism_cudaemu_switch_sp\n"
        ".globl prism_cudaemu_fiber_trampoline\n"
        ".hidden prism_cudaemu_fiber_trampoline\n"
        ".type prism_cudaemu_fiber_trampoline,@function\n"
        "prism_cudaemu_fiber_trampoline:\n"
        "  movq %r13, %rdi\n"
        "  callq *%r12\n"
        "  ud2\n"
        ".size prism_cudaemu_fiber_trampoline, .-prism_cudaemu_fiber_trampoline\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");

const char *prism_fiber_kind(void)
{
    return "asm";
}

prism_fiber *prism_fiber_self(void)
{
    return calloc(1, sizeof(prism_fiber));
}

void prism_fiber_reset(prism_fiber *f, void (*entry)(void *), void *arg)
{
    /* After the trampoline's `ret` pops its address, rsp is top (16-byte aligned), as a call
     * instruction needs. Below the return address: rbp, rbx, r12, r13, r14, r15. */
    uintptr_t top = ((uintptr_t)f->stack + f->size - 64) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = (uint64_t)(uintptr_t)prism_cudaemu_fiber_trampoline;
    *--sp = 0;                          /* rbp: the end of the frame chain */
    *--sp = 0;                          /* rbx */
    *--sp = (uint64_t)(uintptr_t)entry; /* r12 */
    *--sp = (uint64_t)(uintptr_t)arg;   /* r13 */
    *--sp = 0;                          /* r14 */
    *--sp = 0;                          /* r15 */
    f->sp = sp;
}

prism_fiber *prism_fiber_create(void *stack, size_t size, void (*entry)(void *), void *arg)
{
    prism_fiber *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->stack = stack;
    f->size = size;
    prism_fiber_reset(f, entry, arg);
    return f;
}

void prism_fiber_destroy(prism_fiber *f)
{
    free(f);
}

void prism_fiber_switch(prism_fiber *from, prism_fiber *to)
{
    prism_cudaemu_switch_sp(&from->sp, to->sp);
}

#else /* ucontext */

#include <ucontext.h>

struct prism_fiber {
    ucontext_t uc;
    void *stack;
    size_t size;
    void (*entry)(void *);
    void *arg;
};

const char *prism_fiber_kind(void)
{
    return "ucontext";
}

/* makecontext passes int arguments only: the fiber's address in two halves. */
static void start(int hi, int lo)
{
    prism_fiber *f = (prism_fiber *)(uintptr_t)(((uint64_t)(unsigned)hi << 32) | (unsigned)lo);
    f->entry(f->arg);
    abort(); /* entry never returns */
}

prism_fiber *prism_fiber_self(void)
{
    return calloc(1, sizeof(prism_fiber));
}

void prism_fiber_reset(prism_fiber *f, void (*entry)(void *), void *arg)
{
    f->entry = entry;
    f->arg = arg;
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->size;
    f->uc.uc_link = NULL;
    uint64_t p = (uint64_t)(uintptr_t)f;
    makecontext(&f->uc, (void (*)(void))start, 2, (int)(unsigned)(p >> 32), (int)(unsigned)p);
}

prism_fiber *prism_fiber_create(void *stack, size_t size, void (*entry)(void *), void *arg)
{
    prism_fiber *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->stack = stack;
    f->size = size;
    prism_fiber_reset(f, entry, arg);
    return f;
}

void prism_fiber_destroy(prism_fiber *f)
{
    free(f);
}

void prism_fiber_switch(prism_fiber *from, prism_fiber *to)
{
    swapcontext(&from->uc, &to->uc);
}

#endif
