/*
 * fuzz/fuzz_drbg.h -- a fixed-seed random source for fuzz harnesses.
 *
 * A harness that seals "genuine" envelopes at start-up must get the same
 * envelopes in every run and every build (libFuzzer, AFL++, replay), or
 * its committed seeds stop being genuine.  ks_fuzz_drbg_install() makes
 * libsodium's randombytes a ChaCha20 stream under a fixed seed (the label
 * plus a call counter).  Call it before sodium_init().  Test code only:
 * never do this outside a fuzz harness.
 */
#ifndef KS_FUZZ_DRBG_H
#define KS_FUZZ_DRBG_H

#include <stdint.h>
#include <string.h>

#include <sodium.h>

static const char *ks_fuzz_drbg_label = "keyshift fuzz fixed seed";
static uint64_t ks_fuzz_drbg_calls;

/* Fill buf from ChaCha20 under a seed that is fixed but for a call count. */
static void ks_fuzz_drbg_buf(void *const buf, const size_t n)
{
    uint8_t seed[randombytes_SEEDBYTES] = {0};
    size_t l = strlen(ks_fuzz_drbg_label);
    memcpy(seed, ks_fuzz_drbg_label, l < sizeof seed - 8 ? l : sizeof seed - 8);
    memcpy(seed + sizeof seed - sizeof ks_fuzz_drbg_calls, &ks_fuzz_drbg_calls,
           sizeof ks_fuzz_drbg_calls);
    ks_fuzz_drbg_calls++;
    randombytes_buf_deterministic(buf, n, seed);
}

/* One random 32-bit word from the stream. */
static uint32_t ks_fuzz_drbg_random(void)
{
    uint32_t v;
    ks_fuzz_drbg_buf(&v, sizeof v);
    return v;
}

/* The implementation's name. */
static const char *ks_fuzz_drbg_name(void)
{
    return "fuzz-fixed";
}

/* Install the fixed-seed source under label; 0 on success. */
static inline int ks_fuzz_drbg_install(const char *label)
{
    static randombytes_implementation impl = {ks_fuzz_drbg_name, ks_fuzz_drbg_random, NULL, NULL,
                                              ks_fuzz_drbg_buf, NULL};
    ks_fuzz_drbg_label = label;
    return randombytes_set_implementation(&impl);
}

/* The position in the stream (how many draws so far). */
static inline uint64_t ks_fuzz_drbg_tell(void)
{
    return ks_fuzz_drbg_calls;
}

/* Go back to position pos (from ks_fuzz_drbg_tell), so that every input
 * draws the same bytes whatever ran before it: a crash found in a long
 * run then replays alone. */
static inline void ks_fuzz_drbg_seek(uint64_t pos)
{
    ks_fuzz_drbg_calls = pos;
}

#endif /* KS_FUZZ_DRBG_H */
