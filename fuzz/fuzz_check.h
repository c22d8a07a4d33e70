/*
 * fuzz/fuzz_check.h -- the oracle check shared by every fuzz harness.
 *
 * CHECK(cond) aborts with the file, line and condition when an oracle does
 * not hold, so libFuzzer, AFL++ and the replay main all report it as a
 * crash with the input that caused it.
 */
#ifndef KS_FUZZ_CHECK_H
#define KS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

/* Report a failed oracle and abort. */
static inline void ks_fuzz_fail(const char *file, int line, const char *cond)
{
    fprintf(stderr, "oracle failed at %s:%d: %s\n", file, line, cond);
    abort();
}

#define CHECK(cond)                                        \
    do {                                                   \
        if (!(cond)) {                                     \
            ks_fuzz_fail(__FILE__, __LINE__, #cond);       \
        }                                                  \
    } while (0)

#endif /* KS_FUZZ_CHECK_H */
