/* What every fuzz target defines: libFuzzer's entry point, called once per input. The input is
 * not NUL-terminated; a target returns 0 and aborts (through a sanitizer or abort()) on a finding. */
#ifndef PRISM_FUZZ_H
#define PRISM_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with a message when cond is false: a broken invariant is a finding. */
#define FUZZ_CHECK(cond)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

#endif
