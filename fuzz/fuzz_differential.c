/*
 * fuzz/fuzz_differential.c -- the strict parser against nanopb.
 *
 * nanopb (generated from format/envelope.proto and .options) is an
 * independent, lenient protobuf decoder.  The body after the 4-byte prefix
 * is decoded with keyshift_EnvelopeV1_fields or keyshift_EnvelopeV2_fields
 * chosen by the version byte (tests/nanopb_env.h); the ciphertext is an
 * FT_CALLBACK field whose callback records a zero-copy view (pb_istream_from_buffer keeps the next
 * byte's address in stream->state).
 *
 * Oracles (abort() on failure):
 *   A. strict accepts => nanopb accepts, with equal field values, the same
 *      ciphertext view, and every field present.
 *   B. nanopb accepts AND re-encoding its struct with pb_encode gives the
 *      identical body bytes AND its values pass the field rules (every field
 *      of the version present, ks_envelope_check() == KS_OK)  =>  strict
 *      accepts, with the same values.
 * Everything else is allowed divergence (docs/fuzzing.md lists it).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pb_decode.h>
#include <pb_encode.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "envelope.pb.h"

#include "../tests/envelope_eq.h"
#include "../tests/nanopb_env.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

/* Encode callback for field 15: write the recorded view as a bytes field. */
static bool ct_encode(pb_ostream_t *stream, const pb_field_t *field, void *const *arg)
{
    const ks_bytes *v = *arg;
    return pb_encode_tag_for_field(stream, field) && pb_encode_string(stream, v->ptr, v->len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_envelope strict;
    ks_parse_error pe;
    const ks_err se = ks_envelope_parse(data, size, NULL, &strict, &pe);

    /* nanopb has no notion of the prefix: the strict parser alone judges
     * it, and nanopb sees only bodies of a known version. */
    if (size < KS_PREFIX_LEN || data[0] != KS_MAGIC_0 || data[1] != KS_MAGIC_1 ||
        data[2] != KS_MAGIC_2 || (data[3] != KS_FORMAT_V1 && data[3] != KS_FORMAT_V2)) {
        CHECK(se != KS_OK);
        return 0;
    }
    const uint8_t version = data[3];
    const uint8_t *body = data + KS_PREFIX_LEN;
    const size_t body_len = size - KS_PREFIX_LEN;
    const pb_msgdesc_t *fields = ks_nanopb_fields(version);

    ks_nanopb_ct ct;
    ks_nanopb_msg msg;
    pb_istream_t in;
    const bool nok = ks_nanopb_decode(version, body, body_len, &msg, &ct, &in);

    ks_nanopb_env n;
    memset(&n, 0, sizeof n);
    if (nok) {
        ks_nanopb_to_env(version, &msg, &ct, &n);
        CHECK(in.bytes_left == 0);
    }

    /* Oracle A: strict => nanopb, equal values. */
    if (se == KS_OK) {
        CHECK(nok);
        CHECK(ks_nanopb_header_present(&n));
        CHECK(n.has[15] && ct.calls == 1 && ct.in_buffer);
        CHECK(ks_test_fields_eq(&strict, &n.env));
        CHECK(n.env.ciphertext.ptr == strict.ciphertext.ptr); /* the same zero-copy view */
    }
    if (!nok) {
        return 0;
    }

    /* Oracle B: nanopb accepts, re-encodes to the same body, and its values
     * pass the rules => strict accepts. */
    const int all_present = n.has[15] && ct.in_buffer && ks_nanopb_header_present(&n);
    if (!all_present || ks_envelope_check(&n.env, NULL) != KS_OK) {
        return 0;
    }
    uint8_t *re = malloc(body_len ? body_len : 1);
    CHECK(re != NULL);
    pb_callback_t *cb = ks_nanopb_ct_slot(&msg, version);
    cb->funcs.encode = ct_encode;
    cb->arg = &n.env.ciphertext;
    pb_ostream_t out = pb_ostream_from_buffer(re, body_len);
    const bool eok = pb_encode(&out, fields, &msg);
    const int same = eok && out.bytes_written == body_len && memcmp(re, body, body_len) == 0;
    free(re);
    if (!same) {
        return 0;
    }
    if (se != KS_OK) {
        fprintf(stderr, "fuzz_differential: nanopb accepts canonical input, strict says %s at %zu\n",
                ks_err_name(se), pe.offset);
    }
    CHECK(se == KS_OK);
    CHECK(ks_test_fields_eq(&strict, &n.env));
    return 0;
}
