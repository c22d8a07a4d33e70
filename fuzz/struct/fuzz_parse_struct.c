/*
 * fuzz/struct/fuzz_parse_struct.c -- fuzz_parse with the structure-aware
 * mutator of fuzz/envelope_mutator.h: the same harness and oracles
 * (fuzz/fuzz_parse.c, included whole), a different way of making inputs.
 * Built by fuzz/fuzz.mk for `make fuzz-struct` and the nightly run; not in
 * FUZZ_TARGETS, not built for OSS-Fuzz (its fuzz_parse is the plain one).
 */
#include "../fuzz_parse.c"

/* fuzz_parse's whole input is the envelope. */
static size_t ks_mut_envelope_offset(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}

#include "../envelope_mutator.h"
