/*
 * fuzz/fuzz_differential.c -- the strict parser against nanopb.
 *
 * nanopb (generated from format/envelope.proto and .options) is an
 * independent, lenient protobuf decoder.  The body after the 4-byte prefix
 * is decoded with keyshift_EnvelopeV1_fields or keyshift_EnvelopeV2_fields
 * chosen by the version byte; the ciphertext is an FT_CALLBACK field whose
 * callback records a zero-copy view (pb_istream_from_buffer keeps the next
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "fuzz_differential: oracle failed at %s:%d: %s\n", __FILE__,    \
                    __LINE__, #cond);                                                       \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

/* What the ciphertext callback saw. */
typedef struct ct_state {
    const uint8_t *body;     /* the buffer the main stream reads */
    size_t body_len;
    int calls;               /* occurrences of field 15 (last one wins) */
    int in_buffer;           /* last occurrence was length-delimited, in body */
    ks_bytes view;           /* last occurrence's bytes, as a view into body */
} ct_state;

/* Decode callback for field 15.  nanopb calls it with a substream limited
 * to the field's bytes; for pb_istream_from_buffer, stream->state points at
 * the next byte, so the view is (state, bytes_left).  For a field 15 with a
 * scalar wire type nanopb copies the value to a stack buffer first, so the
 * view would not point into body: recorded as in_buffer = 0. */
static bool ct_decode(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    ct_state *st = *arg;
    (void)field;
    const uint8_t *p = stream->state;
    const uintptr_t up = (uintptr_t)p, ub = (uintptr_t)st->body;
    st->calls++;
    st->in_buffer = up >= ub && up - ub <= st->body_len && stream->bytes_left <= st->body_len - (up - ub);
    st->view.ptr = stream->bytes_left == 0 ? NULL : p;
    st->view.len = stream->bytes_left;
    return pb_read(stream, NULL, stream->bytes_left);
}

/* Encode callback for field 15: write the recorded view as a bytes field. */
static bool ct_encode(pb_ostream_t *stream, const pb_field_t *field, void *const *arg)
{
    const ks_bytes *v = *arg;
    return pb_encode_tag_for_field(stream, field) && pb_encode_string(stream, v->ptr, v->len);
}

/* nanopb's result, in one shape for both versions. */
typedef struct nano_env {
    bool has[16];          /* indexed by field number */
    ks_envelope env;       /* views point into the nanopb struct or body */
} nano_env;

#define VIEW_OF(member) ((ks_bytes){(member).size ? (member).bytes : NULL, (member).size})

static void from_v1(const keyshift_EnvelopeV1 *m, nano_env *n)
{
    n->has[1] = m->has_algorithm, n->env.algorithm = m->algorithm;
    n->has[2] = m->has_tenant, n->env.tenant = VIEW_OF(m->tenant);
    n->has[3] = m->has_key_id, n->env.key_id = VIEW_OF(m->key_id);
    n->has[4] = m->has_key_version, n->env.key_version = m->key_version;
    n->has[5] = m->has_wrapped_dek, n->env.wrapped_dek = VIEW_OF(m->wrapped_dek);
    n->has[6] = m->has_nonce, n->env.nonce = VIEW_OF(m->nonce);
}

static void from_v2(const keyshift_EnvelopeV2 *m, nano_env *n)
{
    n->has[1] = m->has_algorithm, n->env.algorithm = m->algorithm;
    n->has[2] = m->has_tenant, n->env.tenant = VIEW_OF(m->tenant);
    n->has[3] = m->has_key_id, n->env.key_id = VIEW_OF(m->key_id);
    n->has[4] = m->has_key_version, n->env.key_version = m->key_version;
    n->has[5] = m->has_wrapped_dek, n->env.wrapped_dek = VIEW_OF(m->wrapped_dek);
    n->has[6] = m->has_nonce, n->env.nonce = VIEW_OF(m->nonce);
    n->has[7] = m->has_purpose, n->env.purpose = VIEW_OF(m->purpose);
    n->has[8] = m->has_commitment, n->env.commitment = VIEW_OF(m->commitment);
}

static int bytes_eq(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Same values (byte contents, not pointers: nanopb copies). */
static int values_eq(const ks_envelope *a, const ks_envelope *b)
{
    return a->version == b->version && a->algorithm == b->algorithm &&
           bytes_eq(a->tenant, b->tenant) && bytes_eq(a->key_id, b->key_id) &&
           a->key_version == b->key_version && bytes_eq(a->wrapped_dek, b->wrapped_dek) &&
           bytes_eq(a->nonce, b->nonce) && bytes_eq(a->purpose, b->purpose) &&
           bytes_eq(a->commitment, b->commitment) && bytes_eq(a->ciphertext, b->ciphertext);
}

/* Union of the two messages, so one buffer serves both. */
typedef union nano_msg {
    keyshift_EnvelopeV1 v1;
    keyshift_EnvelopeV2 v2;
} nano_msg;

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
    const pb_msgdesc_t *fields =
        version == KS_FORMAT_V1 ? keyshift_EnvelopeV1_fields : keyshift_EnvelopeV2_fields;

    ct_state ct = {body, body_len, 0, 0, {NULL, 0}};
    nano_msg msg;
    memset(&msg, 0, sizeof msg);
    pb_callback_t *cb = version == KS_FORMAT_V1 ? &msg.v1.ciphertext : &msg.v2.ciphertext;
    cb->funcs.decode = ct_decode;
    cb->arg = &ct;

    pb_istream_t in = pb_istream_from_buffer(body, body_len);
    const bool nok = pb_decode_ex(&in, fields, &msg, PB_DECODE_NOINIT);

    nano_env n;
    memset(&n, 0, sizeof n);
    if (nok) {
        if (version == KS_FORMAT_V1) {
            from_v1(&msg.v1, &n);
        } else {
            from_v2(&msg.v2, &n);
        }
        n.env.version = version;
        n.has[15] = ct.calls > 0;
        n.env.ciphertext = ct.view;
        CHECK(in.bytes_left == 0);
    }

    /* Oracle A: strict => nanopb, equal values. */
    if (se == KS_OK) {
        CHECK(nok);
        for (int f = 1; f <= 8; f++) {
            CHECK(n.has[f] == (f <= 6 || version == KS_FORMAT_V2));
        }
        CHECK(n.has[15] && ct.calls == 1 && ct.in_buffer);
        CHECK(values_eq(&strict, &n.env));
        CHECK(n.env.ciphertext.ptr == strict.ciphertext.ptr); /* the same zero-copy view */
    }
    if (!nok) {
        return 0;
    }

    /* Oracle B: nanopb accepts, re-encodes to the same body, and its values
     * pass the rules => strict accepts. */
    int all_present = n.has[15] && ct.in_buffer;
    for (int f = 1; f <= 8; f++) {
        all_present &= n.has[f] == (f <= 6 || version == KS_FORMAT_V2);
    }
    if (!all_present || ks_envelope_check(&n.env, NULL) != KS_OK) {
        return 0;
    }
    uint8_t *re = malloc(body_len ? body_len : 1);
    CHECK(re != NULL);
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
    CHECK(values_eq(&strict, &n.env));
    return 0;
}
