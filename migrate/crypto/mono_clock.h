/*
 * migrate/crypto/mono_clock.h -- the monotonic clock, in whole seconds, that the
 * write-side DEK ages ([F-CRYPTO-NONCE-3]) and the read-side cache TTL are
 * measured on; in ns for latencies; in coarse ms for the rollout policy's
 * refresh period.  Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_MONO_CLOCK_H
#define KS_MIGRATE_MONO_CLOCK_H

#include <stdint.h>

/* Seconds on CLOCK_MONOTONIC (immune to wall-clock steps; read at tick
 * resolution, CLOCK_MONOTONIC_COARSE, where available), plus the test
 * offset below.  A vDSO read: cheap enough for every seal. */
uint64_t ks_mono_seconds(void);

/* Nanoseconds on CLOCK_MONOTONIC at full resolution (no test offset):
 * for latency histograms, where only differences matter. */
uint64_t ks_mono_ns(void);

/* Milliseconds on CLOCK_MONOTONIC at tick resolution (as
 * ks_mono_seconds; no test offset): the rollout policy's refresh period,
 * checked on every answer, where a tick's lag does not matter. */
uint64_t ks_mono_coarse_ms(void);

/* Tests only: move the clock forward by `seconds` for the whole process,
 * so that max_age and TTL expiry are tested without sleeping. */
void ks_mono_test_advance(uint64_t seconds);

#endif /* KS_MIGRATE_MONO_CLOCK_H */
