/*
 * fuzz/struct/fuzz_open_struct.c -- fuzz_open with the structure-aware
 * mutator of fuzz/envelope_mutator.h: the same harness and oracles
 * (fuzz/fuzz_open.c, included whole), a different way of making inputs.
 * Built by fuzz/fuzz.mk for `make fuzz-struct` and the nightly run; not in
 * FUZZ_TARGETS, not built for OSS-Fuzz (its fuzz_open is the plain one).
 */
#include "../fuzz_open.c"

/* fuzz_open's envelope follows the flags byte and the context (its low six
 * bits give the context's length), as LLVMFuzzerTestOneInput splits it. */
static size_t ks_mut_envelope_offset(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    size_t ctx_len = data[0] & 0x3F;
    return 1 + ctx_len > size ? 1 : 1 + ctx_len;
}

#include "../envelope_mutator.h"
