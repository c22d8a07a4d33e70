/*
 * migrate/crypto/open_parsed.h -- ks_open for a caller that has already
 * parsed the envelope, and the parse an open makes.  Internal (no
 * KS_API, hidden in the shared library): the application layer
 * (migrate/app/) parses a stored value once to learn its class for the
 * rollout's phase check, then opens it without a second parse.
 */
#ifndef KS_MIGRATE_CRYPTO_OPEN_PARSED_H
#define KS_MIGRATE_CRYPTO_OPEN_PARSED_H

#include <keyshift/crypto.h>

/*
 * ks_open of buf, given e, which ks_envelope_parse (the whole envelope,
 * not ks_envelope_parse_header) filled from exactly that buffer: the
 * same checks in the same order [F-CRYPTO-OPEN-1], the same counts and
 * latency histogram, the same errors but the parse's (there is none to
 * make).  e's views point into buf, which must stay unchanged until the
 * call returns.
 */
KS_WUR ks_err ks_crypto_open_parsed(ks_ctx *ctx, const uint8_t *buf, const ks_envelope *e,
                                    const ks_open_params *p, uint8_t *pt, size_t cap, size_t *pt_len);

/*
 * ks_envelope_parse(buf, len, NULL, e, perr) for an open on ctx from the
 * calling thread, with the same result: when buf is shaped like the
 * envelopes whose keys the thread's shard used last, only its ciphertext
 * field is parsed (parser/envelope_head.h).  ctx NULL: a plain parse.
 */
KS_WUR ks_err ks_crypto_parse(ks_ctx *ctx, const uint8_t *buf, size_t len, ks_envelope *e,
                              ks_parse_error *perr);

#endif /* KS_MIGRATE_CRYPTO_OPEN_PARSED_H */
