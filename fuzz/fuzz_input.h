/*
 * fuzz/fuzz_input.h -- a byte cursor over a fuzz input, shared by the
 * harnesses that decode their input field by field (fuzz_migrate,
 * fuzz_rollout).
 *
 * Reads past the end give zeros, so every input, however short, decodes
 * to something meaningful instead of being rejected.
 */
#ifndef KS_FUZZ_INPUT_H
#define KS_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

/* A cursor over the input p[0, n); off is the next byte. */
typedef struct ks_fuzz_input {
    const uint8_t *p;
    size_t n, off;
} ks_fuzz_input;

/* The next byte, or 0 at the end. */
static inline uint8_t ks_fuzz_next(ks_fuzz_input *in)
{
    return in->off < in->n ? in->p[in->off++] : 0;
}

#endif /* KS_FUZZ_INPUT_H */
