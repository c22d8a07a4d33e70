/*
 * migrate/crypto/mono_clock.c -- see mono_clock.h.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <time.h>

#include "mono_clock.h"

/* The clock read: CLOCK_MONOTONIC_COARSE where it exists.  It is the same
 * clock as CLOCK_MONOTONIC (immune to wall-clock steps) at the kernel
 * tick's resolution (it may lag the fine reading by under one tick, a few
 * milliseconds), which whole seconds do not see; the vDSO serves it
 * without reading the TSC, a few times cheaper, and every seal and cached
 * open reads it. */
#ifdef CLOCK_MONOTONIC_COARSE
#define KS_MONO_CLOCK CLOCK_MONOTONIC_COARSE
#else
#define KS_MONO_CLOCK CLOCK_MONOTONIC
#endif

/* Added to every reading; only ks_mono_test_advance() changes it. */
static _Atomic uint64_t test_offset;

/* See mono_clock.h. */
uint64_t ks_mono_seconds(void)
{
    struct timespec ts;
    /* The monotonic clock cannot fail on Linux with a valid pointer; should it
     * ever, a huge reading makes every DEK and cache entry look expired,
     * never young. */
    if (clock_gettime(KS_MONO_CLOCK, &ts) != 0) {
        return UINT64_MAX / 2;
    }
    return (uint64_t)ts.tv_sec + atomic_load_explicit(&test_offset, memory_order_relaxed);
}

/* See mono_clock.h.  A failed read (impossible on Linux) gives 0, so a
 * latency computed across it is garbage but never negative: callers
 * subtract with the later reading first and clamp. */
uint64_t ks_mono_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* See mono_clock.h.  A failed read (impossible on Linux) gives 0: a
 * refresh then comes due at the next good reading. */
uint64_t ks_mono_coarse_ms(void)
{
    struct timespec ts;
    if (clock_gettime(KS_MONO_CLOCK, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* See mono_clock.h. */
void ks_mono_test_advance(uint64_t seconds)
{
    atomic_fetch_add_explicit(&test_offset, seconds, memory_order_relaxed);
}
