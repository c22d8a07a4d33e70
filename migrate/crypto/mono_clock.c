/*
 * migrate/crypto/mono_clock.c -- see mono_clock.h.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <time.h>

#include "mono_clock.h"

/* Added to every reading; only ks_mono_test_advance() changes it. */
static _Atomic uint64_t test_offset;

/* See mono_clock.h. */
uint64_t ks_mono_seconds(void)
{
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer; should it
     * ever, a huge reading makes every DEK and cache entry look expired,
     * never young. */
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return UINT64_MAX / 2;
    }
    return (uint64_t)ts.tv_sec + atomic_load_explicit(&test_offset, memory_order_relaxed);
}

/* See mono_clock.h. */
void ks_mono_test_advance(uint64_t seconds)
{
    atomic_fetch_add_explicit(&test_offset, seconds, memory_order_relaxed);
}
