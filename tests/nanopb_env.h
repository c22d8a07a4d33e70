/*
 * tests/nanopb_env.h -- nanopb, the independent second decoder, as used by
 * the spec-vector tests (tests/test_spec_vectors.c) and the differential
 * fuzz harness (fuzz/fuzz_differential.c): decode an envelope body with the
 * message of its version (generated from format/envelope.proto and
 * .options) and turn the result into a ks_envelope to compare with the
 * strict parser's.  Test support code, not part of the library: static
 * inline only.  (tools/bench/bench.c deliberately does not use it: its baseline
 * is a bare pb_decode call.)
 *
 * The ciphertext is an FT_CALLBACK field whose callback records a
 * zero-copy view: pb_istream_from_buffer keeps the next byte's address in
 * stream->state.  The other views of the result point into the nanopb
 * message, which copies.
 */
#ifndef KS_TESTS_NANOPB_ENV_H
#define KS_TESTS_NANOPB_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <pb_decode.h>

#include <keyshift/envelope.h>

#include "envelope.pb.h"

/* What the ciphertext callback saw. */
typedef struct ks_nanopb_ct {
    const uint8_t *body;     /* the buffer the main stream reads */
    size_t body_len;
    int calls;               /* occurrences of field 15 (last one wins) */
    int in_buffer;           /* last occurrence was length-delimited, in body */
    ks_bytes view;           /* last occurrence's bytes, as a view into body */
} ks_nanopb_ct;

/* Union of the two messages, so one buffer serves both versions. */
typedef union ks_nanopb_msg {
    keyshift_EnvelopeV1 v1;
    keyshift_EnvelopeV2 v2;
} ks_nanopb_msg;

/* nanopb's result, in one shape for both versions. */
typedef struct ks_nanopb_env {
    bool has[16];          /* indexed by field number */
    ks_envelope env;       /* views point into the nanopb message or body */
} ks_nanopb_env;

/* Decode callback for field 15.  nanopb calls it with a substream limited
 * to the field's bytes; for pb_istream_from_buffer, stream->state points at
 * the next byte, so the view is (state, bytes_left).  For a field 15 with a
 * scalar wire type nanopb copies the value to a stack buffer first, so the
 * view would not point into body: recorded as in_buffer = 0, and the view
 * must then not be read. */
static inline bool ks_nanopb_ct_decode(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    ks_nanopb_ct *st = *arg;
    (void)field;
    const uint8_t *p = stream->state;
    const uintptr_t up = (uintptr_t)p, ub = (uintptr_t)st->body;
    st->calls++;
    st->in_buffer = up >= ub && up - ub <= st->body_len &&
                    stream->bytes_left <= st->body_len - (up - ub);
    st->view.ptr = stream->bytes_left == 0 ? NULL : p;
    st->view.len = stream->bytes_left;
    return pb_read(stream, NULL, stream->bytes_left);
}

/* The message descriptor of a format version's body (KS_FORMAT_V1, else
 * v2): one place that maps versions to messages, for decoding and for
 * re-encoding. */
static inline const pb_msgdesc_t *ks_nanopb_fields(uint8_t version)
{
    return version == KS_FORMAT_V1 ? keyshift_EnvelopeV1_fields : keyshift_EnvelopeV2_fields;
}

/* The ciphertext callback slot of msg for a version: where the decode (or
 * encode) callback and its argument go. */
static inline pb_callback_t *ks_nanopb_ct_slot(ks_nanopb_msg *msg, uint8_t version)
{
    return version == KS_FORMAT_V1 ? &msg->v1.ciphertext : &msg->v2.ciphertext;
}

/* Decode body[0, body_len) as the body of a `version` envelope: msg is
 * zeroed, the ciphertext callback records into *ct, and *in is left as the
 * stream (for bytes_left and PB_GET_ERROR).  Returns pb_decode's verdict. */
static inline bool ks_nanopb_decode(uint8_t version, const uint8_t *body, size_t body_len,
                                    ks_nanopb_msg *msg, ks_nanopb_ct *ct, pb_istream_t *in)
{
    memset(ct, 0, sizeof *ct);
    ct->body = body;
    ct->body_len = body_len;
    memset(msg, 0, sizeof *msg);
    pb_callback_t *cb = ks_nanopb_ct_slot(msg, version);
    cb->funcs.decode = ks_nanopb_ct_decode;
    cb->arg = ct;
    *in = pb_istream_from_buffer(body, body_len);
    return pb_decode_ex(in, ks_nanopb_fields(version), msg, PB_DECODE_NOINIT);
}

/* A nanopb bytes member as a view; empty is {NULL, 0}, as the parser gives. */
#define KS_NANOPB_VIEW(member) ((ks_bytes){(member).size ? (member).bytes : NULL, (member).size})

/* The fields v1 and v2 share, from message m (of either type) into *n. */
#define KS_NANOPB_COMMON(m, n)                                                       \
    do {                                                                             \
        (n)->has[1] = (m).has_algorithm, (n)->env.algorithm = (m).algorithm;         \
        (n)->has[2] = (m).has_tenant, (n)->env.tenant = KS_NANOPB_VIEW((m).tenant);  \
        (n)->has[3] = (m).has_key_id, (n)->env.key_id = KS_NANOPB_VIEW((m).key_id);  \
        (n)->has[4] = (m).has_key_version, (n)->env.key_version = (m).key_version;   \
        (n)->has[5] = (m).has_wrapped_dek;                                           \
        (n)->env.wrapped_dek = KS_NANOPB_VIEW((m).wrapped_dek);                      \
        (n)->has[6] = (m).has_nonce, (n)->env.nonce = KS_NANOPB_VIEW((m).nonce);     \
    } while (0)

/* Convert a decoded message of `version` and what the ciphertext callback
 * saw into *n: presence by field number, values as a ks_envelope (version
 * set, header_len and total_len 0: nanopb knows no encoding positions), so
 * that it compares with the parser's result by ks_test_fields_eq. */
static inline void ks_nanopb_to_env(uint8_t version, const ks_nanopb_msg *msg,
                                    const ks_nanopb_ct *ct, ks_nanopb_env *n)
{
    memset(n, 0, sizeof *n);
    if (version == KS_FORMAT_V1) {
        KS_NANOPB_COMMON(msg->v1, n);
    } else {
        KS_NANOPB_COMMON(msg->v2, n);
        n->has[7] = msg->v2.has_purpose, n->env.purpose = KS_NANOPB_VIEW(msg->v2.purpose);
        n->has[8] = msg->v2.has_commitment, n->env.commitment = KS_NANOPB_VIEW(msg->v2.commitment);
    }
    n->env.version = version;
    n->has[15] = ct->calls > 0;
    n->env.ciphertext = ct->view;
}

#undef KS_NANOPB_COMMON
#undef KS_NANOPB_VIEW

/* Nonzero when exactly the header fields of n's version were present:
 * fields 1..6 always, 7 and 8 in v2 only.  The format requires every one,
 * and nanopb, being lenient, does not. */
static inline int ks_nanopb_header_present(const ks_nanopb_env *n)
{
    for (int f = 1; f <= 8; f++) {
        if (n->has[f] != (f <= 6 || n->env.version == KS_FORMAT_V2)) {
            return 0;
        }
    }
    return 1;
}

#endif /* KS_TESTS_NANOPB_ENV_H */
