/*
 * parser/envelope_head.h -- parsing an envelope shaped like a known one.
 * Internal to the library (no KS_API, hidden in the shared library).
 *
 * An envelope's head is its prefix and fields 1 to 5 (algorithm, tenant,
 * key_id, key_version, wrapped_dek); its header runs on to the ciphertext
 * field's tag (the nonce, and for version 2 the purpose and commitment).
 * Every envelope sealed under one DEK for one tenant (and purpose) has
 * the same header but for the nonce's value, and the commitment's when
 * it is forged: so a reader that keeps the header of an envelope the
 * parser accepted, its shape, can skip those fields in the next one when
 * its bytes are equal outside those two values.
 *
 * The parser is a function of the bytes it has read (and the limits),
 * and it never reads the nonce's or the commitment's value (docs/format.md
 * [F-NONCE-1], [F-COMMIT-1]: their lengths are fixed, their content
 * opaque): an input
 * equal to an accepted header outside those values reaches its ciphertext
 * field in the state the accepted one did, with every header field in the
 * same place.  So ks_envelope_parse_like() gives exactly the result of
 * ks_envelope_parse() on the same input and limits, rejections and their
 * offsets included (tests/test_envelope.c compares the two over every
 * one-byte change of the vectors; fuzz/fuzz_parse.c over its corpus).
 */
#ifndef KS_PARSER_ENVELOPE_HEAD_H
#define KS_PARSER_ENVELOPE_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/envelope.h>

/* What an accepted envelope's header parsed to, as offsets from its first
 * byte: its shape.  The bytes from which it was made are needed with it. */
typedef struct ks_envelope_head {
    uint8_t version;
    uint32_t algorithm;
    uint32_t key_version;
    uint32_t tenant_off, tenant_len;
    uint32_t key_id_off, key_id_len;
    uint32_t wrapped_off, wrapped_len;
    size_t len;                         /* the head's length: the end of the wrapped_dek field */
    uint32_t nonce_off, nonce_len;      /* the nonce's value */
    uint32_t purpose_off, purpose_len;  /* version 2; else 0 */
    uint32_t commitment_off;            /* version 2: its value's, KS_COMMITMENT_LEN bytes; else 0 */
    size_t header_len;                  /* the ciphertext field's tag's offset */
} ks_envelope_head;

/* The most bytes of a header after its head: the nonce, purpose and
 * commitment fields, each with a one-byte tag and length. */
#define KS_ENVELOPE_TAIL_MAX (2 + KS_XCHACHA20POLY1305_NONCE_LEN + 2 + KS_PURPOSE_MAX + 2 + KS_COMMITMENT_LEN)

/* The shape of e, which ks_envelope_parse() or ks_envelope_parse_header()
 * accepted from buf, into *h. */
void ks_envelope_head_of(const uint8_t *buf, const ks_envelope *e, ks_envelope_head *h);

/* Nonzero when buf[0, len) is shaped like h (made from hdr, as
 * ks_envelope_parse_like() takes them): equal to hdr[0, h->header_len)
 * outside the nonce's and commitment's values, with bytes after it.  An
 * envelope parsed from such a buf has h's header fields. */
int ks_envelope_like(const uint8_t *buf, size_t len, const ks_envelope_head *h, const uint8_t *hdr);

/*
 * ks_envelope_parse(buf, len, lim, out, err), in a fraction of the work
 * when buf is shaped like h: h made from the header hdr[0, h->header_len)
 * parsed under the same limits (lim; NULL: the defaults), and buf equal
 * to it outside the nonce's and commitment's values, with at least one
 * byte after it.  Then the header's fields are taken from h, only the
 * ciphertext field is parsed, and *like (when not NULL) is 1 on success;
 * otherwise the whole envelope is parsed, and *like is 0.  h and hdr NULL
 * parse the whole envelope.
 */
ks_err ks_envelope_parse_like(const uint8_t *buf, size_t len, const ks_limits *lim, const ks_envelope_head *h,
                              const uint8_t *hdr, ks_envelope *out, ks_parse_error *err, int *like);

#endif /* KS_PARSER_ENVELOPE_HEAD_H */
