/*
 * keyshift/envelope.h -- the envelope wire format: constants, limits, the
 * strict zero-copy parser and the canonical encoder.
 *
 * The normative definition is docs/format.md; clause ids such as [F-VARINT-2]
 * in comments and in the code refer to it.
 *
 * An envelope is   "KSE" || version || body
 * where body is the canonical proto3 wire encoding of that version's message.
 *
 * Ownership and lifetimes
 *   - The caller owns every struct passed in or out.
 *   - ks_envelope_parse() never allocates and never copies: every ks_bytes in
 *     the result points into the caller's input buffer, and is valid only as
 *     long as that buffer is, unmodified.
 *   - ks_envelope_encode() writes only into the caller's buffer.
 *   - All functions are reentrant and thread-safe; they keep no state.
 */
#ifndef KEYSHIFT_ENVELOPE_H
#define KEYSHIFT_ENVELOPE_H

#include <keyshift/common.h>
#include <keyshift/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Framing [F-FRAME] ------------------------------------------------ */

#define KS_MAGIC_0 0x4B /* 'K' */
#define KS_MAGIC_1 0x53 /* 'S' */
#define KS_MAGIC_2 0x45 /* 'E' */
#define KS_PREFIX_LEN 4 /* magic (3) + version (1) */

#define KS_FORMAT_V1 1  /* no purpose, no key commitment */
#define KS_FORMAT_V2 2  /* adds purpose (field 7) and commitment (field 8) */

/* ---- Algorithms [F-ALG] ------------------------------------------------ */

#define KS_ALG_AES256GCM 1          /* "aes-256-gcm", 12-byte nonce */
#define KS_ALG_XCHACHA20POLY1305 2  /* "xchacha20-poly1305", 24-byte nonce */

#define KS_AES256GCM_NONCE_LEN 12
#define KS_XCHACHA20POLY1305_NONCE_LEN 24
#define KS_TAG_LEN 16               /* AEAD tag; the minimum ciphertext length */
#define KS_COMMITMENT_LEN 32        /* v2 key commitment */

/* The algorithm's name ("aes-256-gcm", "xchacha20-poly1305"), or NULL when
 * alg is not defined by the format. Static storage. */
KS_API const char *ks_alg_name(uint32_t alg);

/* The algorithm id for a name, or 0 when the name is unknown. */
KS_API uint32_t ks_alg_from_name(const char *name);

/* The nonce length in bytes for alg, or 0 when alg is not defined. */
KS_API size_t ks_alg_nonce_len(uint32_t alg);

/* ---- Field numbers [F-FIELDS] ---------------------------------------- */

#define KS_FIELD_ALGORITHM 1
#define KS_FIELD_TENANT 2
#define KS_FIELD_KEY_ID 3
#define KS_FIELD_KEY_VERSION 4
#define KS_FIELD_WRAPPED_DEK 5
#define KS_FIELD_NONCE 6
#define KS_FIELD_PURPOSE 7
#define KS_FIELD_COMMITMENT 8
#define KS_FIELD_CIPHERTEXT 15

/* ---- Limits [F-LIMITS] -------------------------------------------------
 *
 * Compiled maximums.  A ks_limits may lower any of these, never raise them.
 * Lower bounds are fixed by the format and cannot be changed.
 */
#define KS_TENANT_MAX 64
#define KS_KEY_ID_MAX 256
#define KS_WRAPPED_DEK_MAX 1024
#define KS_PURPOSE_MAX 64
#define KS_CIPHERTEXT_DEFAULT_MAX (((size_t)1 << 20) + KS_TAG_LEN)     /* 1 MiB + 16 */
#define KS_CIPHERTEXT_HARD_MAX (((size_t)16 << 20) + KS_TAG_LEN)      /* 16 MiB + 16 */

/*
 * Per-call limits on variable-length fields.  Every member must lie in
 * [format minimum, compiled maximum]:
 *   max_tenant      in [1, KS_TENANT_MAX]
 *   max_key_id      in [1, KS_KEY_ID_MAX]
 *   max_wrapped_dek in [1, KS_WRAPPED_DEK_MAX]
 *   max_purpose     in [1, KS_PURPOSE_MAX]
 *   max_ciphertext  in [KS_TAG_LEN, KS_CIPHERTEXT_HARD_MAX]
 * A limits struct outside those ranges makes every call fail with
 * KS_ERR_INVALID_ARGUMENT before the input is looked at.
 */
typedef struct ks_limits {
    size_t max_tenant;
    size_t max_key_id;
    size_t max_wrapped_dek;
    size_t max_purpose;
    size_t max_ciphertext;
} ks_limits;

/* The defaults: every compiled maximum, except max_ciphertext which is
 * KS_CIPHERTEXT_DEFAULT_MAX (1 MiB + 16). */
KS_API void ks_limits_default(ks_limits *out);

/* KS_OK when every member of lim is in range, else KS_ERR_INVALID_ARGUMENT. */
KS_API KS_WUR ks_err ks_limits_check(const ks_limits *lim);

/* The largest envelope, in bytes, that can be valid under lim (NULL means
 * the defaults), or 0 if lim is invalid.  A reader may refuse any input
 * longer than this before reading it in full. */
KS_API size_t ks_envelope_max_len(const ks_limits *lim);

/* ---- The parsed envelope ---------------------------------------------- */

/*
 * A parsed envelope: scalar fields by value, byte fields as views into the
 * parsed buffer.  For a v1 envelope, purpose and commitment are absent
 * ({NULL, 0}).
 *
 * header_len is the offset of the ciphertext field's tag: bytes
 * [0, header_len) hold the prefix and every header field.
 * total_len is the length of the whole envelope.
 */
typedef struct ks_envelope {
    uint8_t version;        /* KS_FORMAT_V1 or KS_FORMAT_V2 */
    uint32_t algorithm;     /* KS_ALG_* */
    ks_bytes tenant;
    ks_bytes key_id;
    uint32_t key_version;   /* 1 .. 2^32-1 */
    ks_bytes wrapped_dek;
    ks_bytes nonce;
    ks_bytes purpose;       /* v2 only */
    ks_bytes commitment;    /* v2 only */
    ks_bytes ciphertext;    /* ciphertext || tag */
    size_t header_len;
    size_t total_len;
} ks_envelope;

/*
 * Where and why an input was rejected.  offset is the byte offset, from the
 * start of the input, of the first byte of the element that is wrong or
 * incomplete (a tag, a varint, a length, a value byte), or the input length
 * when the input ends where another element must begin.
 * field is the field number being read, or 0 in the prefix or before a tag
 * was decoded.
 */
typedef struct ks_parse_error {
    ks_err code;
    size_t offset;
    uint32_t field;
} ks_parse_error;

/*
 * Parse exactly one envelope from buf[0, len) under lim (NULL: defaults).
 *
 * Accepts only the canonical form of docs/format.md; on success fills *out
 * and returns KS_OK.  On failure returns the error code, clears *out, and,
 * if err is not NULL, fills *err.  Never reads outside buf[0, len), never
 * allocates, does O(len) work and touches the ciphertext bytes not at all.
 * buf may be NULL only when len is 0.
 */
KS_API KS_WUR ks_err ks_envelope_parse(const uint8_t *buf, size_t len, const ks_limits *lim,
                                       ks_envelope *out, ks_parse_error *err);

/*
 * Parse only the header of an envelope whose first len bytes are in buf:
 * every field up to and including the ciphertext field's tag and length.
 * The ciphertext bytes themselves need not be present.
 *
 * On success, out->ciphertext is {NULL, 0} when the ciphertext is not within
 * buf, else a view of it; out->total_len is the length the whole envelope
 * has.  Bytes beyond total_len are not looked at, so a caller that holds
 * the whole envelope must still call ks_envelope_parse() to check that
 * nothing follows.  Errors as for ks_envelope_parse(), except that a
 * ciphertext that extends past len is not an error.
 */
KS_API KS_WUR ks_err ks_envelope_parse_header(const uint8_t *buf, size_t len, const ks_limits *lim,
                                              ks_envelope *out, ks_parse_error *err);

/* ---- The canonical encoder ------------------------------------------- */

/*
 * Check that env would parse back under lim (NULL: defaults): the version
 * is 1 or 2, every field follows its rule, v2-only fields are empty in v1.
 * header_len and total_len are ignored.  Returns KS_OK, or the code the
 * parser would give for the encoded bytes: KS_ERR_UNSUPPORTED_VERSION,
 * KS_ERR_UNKNOWN_FIELD (a non-empty purpose or commitment in v1, checked
 * first), then, in field order, KS_ERR_BAD_VALUE or KS_ERR_TOO_LARGE (an
 * empty required field is bad-value, since the encoder always writes every
 * field); KS_ERR_INVALID_ARGUMENT for bad limits or a view whose ptr is
 * NULL while its len is not 0.
 */
KS_API KS_WUR ks_err ks_envelope_check(const ks_envelope *env, const ks_limits *lim);

/* Check env, then store in *out_len the exact length of its encoding. */
KS_API KS_WUR ks_err ks_envelope_encoded_len(const ks_envelope *env, const ks_limits *lim,
                                             size_t *out_len);

/*
 * Check env, then write its canonical encoding to buf[0, cap) and store
 * its length in *out_len.  Returns KS_ERR_BUFFER_TOO_SMALL, writing
 * nothing, when cap is below the encoded length.  buf must not overlap any
 * view in env.  The result parses back to the same field values, and
 * parsing then encoding any accepted input gives the same bytes.
 */
KS_API KS_WUR ks_err ks_envelope_encode(const ks_envelope *env, const ks_limits *lim, uint8_t *buf,
                                        size_t cap, size_t *out_len);

/* ---- The text form [F-TEXT] ----------------------------------------------
 *
 * Stores that keep envelopes in a text column (a PostgreSQL text or
 * varchar, a SQLite TEXT) hold the envelope's canonical standard base64
 * (docs/format.md section 10): RFC 4648 alphabet, '=' padding, no
 * whitespace, pad bits zero.  "KSE" encodes to "S1NF", so every text
 * envelope begins with those four characters.
 */
#define KS_TEXT_MAGIC "S1NF"
#define KS_TEXT_MAGIC_LEN 4

/* Nonzero when text[0, len) begins with "S1NF": a reader must then treat
 * the value as a text envelope, and a value that then fails to decode or
 * to parse is malformed, never plaintext [F-TEXT-4]. */
KS_API int ks_envelope_text_is_candidate(const uint8_t *text, size_t len);

/* The length of the text form of len envelope bytes, 4 * ceil(len / 3);
 * 0 for 0 and for a len whose text would not fit in a size_t. */
KS_API size_t ks_envelope_text_len(size_t len);

/* The capacity ks_envelope_text_decode() needs for a text of text_len
 * characters: text_len / 4 * 3. */
KS_API size_t ks_envelope_text_decoded_max(size_t text_len);

/*
 * Decode the text form text[0, len) into buf[0, cap), storing the decoded
 * length in *out_len.  Accepts only canonical base64 [F-TEXT-1]; checks
 * in the order of [F-TEXT-2]: too-large at 0 when len is above
 * ks_envelope_text_len(ks_envelope_max_len(lim)) (NULL lim: defaults),
 * then buffer-too-small (a caller error, nothing read) when cap is below
 * ks_envelope_text_decoded_max(len), then truncated at len when len is
 * not a multiple of 4, then bad-value at the offset of the first bad
 * character.  On a rejection *err (if not NULL) has the code and offset,
 * field 0, *out_len is 0 and nothing decoded is left in buf.  The decoded
 * bytes are not parsed: pass them to ks_envelope_parse(), whose offsets
 * then count from the first decoded byte.  Reads text once, left to right,
 * through the parser's cursor; allocates nothing.
 */
KS_API KS_WUR ks_err ks_envelope_text_decode(const uint8_t *text, size_t len, const ks_limits *lim,
                                             uint8_t *buf, size_t cap, size_t *out_len,
                                             ks_parse_error *err);

/*
 * Write the canonical text form of env[0, len) (an encoded envelope) to
 * buf[0, cap) and store its length, ks_envelope_text_len(len), in
 * *out_len.  KS_ERR_BUFFER_TOO_SMALL, nothing written, when cap is below
 * it; KS_ERR_INVALID_ARGUMENT for NULL pointers with nonzero lengths.
 * Decoding the result gives back env exactly.
 */
KS_API KS_WUR ks_err ks_envelope_text_encode(const uint8_t *env, size_t len, uint8_t *buf,
                                             size_t cap, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ENVELOPE_H */
