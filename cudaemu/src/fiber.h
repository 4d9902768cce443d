/* Fibers: stacks of their own and a switch between them, for the emulated CUDA threads of one
 * block on one worker thread (exec.cpp). On x86-64 the switch is a few instructions of assembly
 * (the callee-saved registers, the SSE and x87 control words, the stack pointer); elsewhere, or
 * with PRISM_CUDAEMU_UCONTEXT defined, it is POSIX ucontext (swapcontext also saves the signal
 * mask, a system call per switch). */
#ifndef PRISM_CUDAEMU_FIBER_H
#define PRISM_CUDAEMU_FIBER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct prism_fiber prism_fiber;

/* A context: a fiber, or the thread's own stack (prism_fiber_self). */
prism_fiber *prism_fiber_self(void);

/* A fiber that will run entry(arg) on [stack, stack + size) at its first switch. entry must
 * never return: a fiber ends by switching away for the last time. NULL when out of memory. */
prism_fiber *prism_fiber_create(void *stack, size_t size, void (*entry)(void *), void *arg);

/* Makes an existing fiber start entry(arg) from the top of its stack again at its next switch. */
void prism_fiber_reset(prism_fiber *f, void (*entry)(void *), void *arg);

void prism_fiber_destroy(prism_fiber *f);

/* Saves the running context into `from` and continues `to`. */
void prism_fiber_switch(prism_fiber *from, prism_fiber *to);

/* "asm" or "ucontext": which switch this build uses. */
const char *prism_fiber_kind(void);

#ifdef __cplusplus
}
#endif

#endif
