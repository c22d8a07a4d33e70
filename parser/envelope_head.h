/*
 * parser/envelope_head.h -- resuming a strict parse after a known head.
 * Internal to the library (no KS_API, hidden in the shared library).
 *
 * An envelope's head is its prefix and fields 1 to 5 (algorithm, tenant,
 * key_id, key_version, wrapped_dek): the bytes [0, end of wrapped_dek).
 * Every envelope sealed under one DEK for one tenant has the same head,
 * so a reader that keeps the head of an envelope the parser accepted can
 * skip those fields in the next one when its first bytes are equal.
 *
 * The parser is a function of the bytes it has read (and the limits): at
 * the end of a head it has checked exactly those bytes, and what follows
 * is parsed from the same state, the nonce length of the head's
 * algorithm.  So ks_envelope_parse_resume() gives exactly the result of
 * ks_envelope_parse() on the same input and limits, rejections and their
 * offsets included (tests/test_parse.c compares the two over every
 * one-byte change of the vectors; fuzz/fuzz_parse.c over its corpus).
 */
#ifndef KS_PARSER_ENVELOPE_HEAD_H
#define KS_PARSER_ENVELOPE_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/envelope.h>

/* What a head parsed to, as offsets from the envelope's first byte. */
typedef struct ks_envelope_head {
    uint8_t version;
    uint32_t algorithm;
    uint32_t key_version;
    uint32_t tenant_off, tenant_len;
    uint32_t key_id_off, key_id_len;
    uint32_t wrapped_off, wrapped_len;
    size_t len; /* the head's length: the end of the wrapped_dek field */
} ks_envelope_head;

/* The head of e, which ks_envelope_parse() or ks_envelope_parse_header()
 * accepted from buf, into *h. */
void ks_envelope_head_of(const uint8_t *buf, const ks_envelope *e, ks_envelope_head *h);

/*
 * ks_envelope_parse(buf, len, lim, out, err) for an input whose first
 * h->len bytes are those from which h was made, parsed then under the
 * same limits (lim; NULL: the defaults).  The caller compares those
 * bytes; the head's fields are taken from h and the rest is parsed with
 * the same rules and checks, in the same order.  KS_ERR_INVALID_ARGUMENT
 * (a caller error, as ks_envelope_parse reports one) for a NULL out, h
 * or buf, an input shorter than the head, a head that does not end with
 * its wrapped DEK, or limits out of range.
 */
ks_err ks_envelope_parse_resume(const uint8_t *buf, size_t len, const ks_limits *lim,
                                const ks_envelope_head *h, ks_envelope *out, ks_parse_error *err);

#endif /* KS_PARSER_ENVELOPE_HEAD_H */
