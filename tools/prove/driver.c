/*
 * tools/prove/driver.c -- the entry point of `make prove`'s Eva analysis
 * (tools/prove.mk, docs/fuzzing.md "Proof").
 *
 * Never compiled by the build: Frama-C's Eva runs it as an abstract
 * interpreter, where Frama_C_interval() and Frama_C_make_unknown() stand
 * for every value at once.  One run covers every input of every length
 * from 0 to KS_PROVE_MAX_LEN bytes.
 */
#include <__fc_builtin.h>

#include <keyshift/envelope.h>

#include "../../parser/envelope_head.h"

#ifndef KS_PROVE_MAX_LEN
#define KS_PROVE_MAX_LEN 96
#endif

static uint8_t input[KS_PROVE_MAX_LEN];
static uint8_t output[KS_PROVE_MAX_LEN];

/* The parser, its three entry points, default limits. */
static void prove_parse(size_t len)
{
    ks_envelope env;
    ks_parse_error err;

    ks_err e = ks_envelope_parse(input, len, NULL, &env, &err);
    if (e == KS_OK) {
        size_t n = 0;
        /* The round trip of fuzz_parse: encode into a buffer of any size. */
        size_t cap = Frama_C_interval(0, KS_PROVE_MAX_LEN);
        /* One state per version, so that the encoder's field table and
         * its row count stay paired. */
        /*@ split env.version; */
        (void)ks_envelope_encode(&env, NULL, output, cap, &n);
    }
    (void)ks_envelope_parse_header(input, len, NULL, &env, NULL);
    /* The parse of an envelope shaped like a known one
     * (parser/envelope_head.h): the shape of the same input, when its
     * header parses. */
    if (ks_envelope_parse_header(input, len, NULL, &env, &err) == KS_OK) {
        ks_envelope_head h;
        int like = 0;
        ks_envelope_head_of(input, &env, &h);
        (void)ks_envelope_parse_like(input, len, NULL, &h, input, &env, &err, &like);
    }
}

int main(void)
{
    /* One call per length, each analysed on its own: the cursor's
     * pos <= len is a relation, which an interval for len would lose. */
    /*@ loop unroll KS_PROVE_MAX_LEN + 1; */
    for (size_t len = 0; len <= KS_PROVE_MAX_LEN; len++) {
        Frama_C_make_unknown((char *)input, len);
        prove_parse(len);
    }
    return 0;
}
