/*
 * tools/kms-aws/sigv4.h -- AWS Signature Version 4 (header signing) for the
 * keyshift-kms-aws plugin.
 *
 * Every function writes into caller-owned buffers and checks each length
 * before it writes; none allocates.  Secrets (the secret access key copy in
 * kSecret and every derived key) live on the stack and are wiped with
 * sodium_memzero() on every path.  Call sodium_init() first.
 *
 * Encoding rules (RFC 3986 unreserved set A-Z a-z 0-9 - . _ ~ is left as
 * is; every other byte becomes %XX with upper-case hex):
 *   - the canonical URI is the caller's raw (not yet encoded) absolute path,
 *     each byte encoded once, '/' kept; no dot-segment normalisation, so a
 *     path with "//", "/./" or "/../" is refused rather than signed wrongly;
 *   - the canonical query string is each raw name and value encoded, sorted
 *     by encoded name then encoded value, joined as n=v with '&';
 *   - header names are lower-cased, values trimmed and inner runs of spaces
 *     collapsed to one, sorted by name; a name given twice is refused.
 */
#ifndef KS_KMS_AWS_SIGV4_H
#define KS_KMS_AWS_SIGV4_H

#include <stddef.h>
#include <stdint.h>

#define SIGV4_MAX_HEADERS 16
#define SIGV4_MAX_PARAMS 16
#define SIGV4_HEX_LEN 64          /* a SHA-256 or HMAC-SHA256 value in hex */
#define SIGV4_KEY_LEN 32
#define SIGV4_FIELD_MAX 4096      /* any one name, value, path or secret */

/* One header or one query parameter (name and value as NUL-terminated
 * strings; for a parameter, raw: sigv4 encodes it). */
typedef struct {
    const char *name;
    const char *value;
} sigv4_pair;

/* The request being signed.  headers must include host and x-amz-date
 * (and x-amz-security-token when a session token is used); they are all
 * signed.  payload_hash, when not NULL, is the SHA-256 of the payload in
 * 64 lower-case hex digits, used instead of hashing payload. */
typedef struct {
    const char *method;
    const char *path;
    const sigv4_pair *query;
    size_t nquery;
    const sigv4_pair *headers;
    size_t nheaders;
    const uint8_t *payload;
    size_t payload_len;
    const char *payload_hash;
} sigv4_request;

/* Who signs, and the scope: amz_date is the X-Amz-Date value
 * (YYYYMMDDTHHMMSSZ); its first eight characters are the scope's date. */
typedef struct {
    const char *access_key_id;
    const char *secret_access_key;
    const char *region;
    const char *service;
    const char *amz_date;
} sigv4_signer;

/* Percent-encode in[0..len) into out (cap bytes, NUL-terminated), keeping
 * '/' when keep_slash.  *out_len gets the length.  0, or -1 if out is too
 * small. */
int sigv4_uri_encode(const uint8_t *in, size_t len, int keep_slash, char *out, size_t cap, size_t *out_len);

/* The canonical request for req into out (cap bytes, NUL-terminated), its
 * signed-headers list into signed_headers (sh_cap bytes).  0, or -1 if the
 * request is malformed or a buffer too small. */
int sigv4_canonical_request(const sigv4_request *req, char *out, size_t cap, size_t *out_len,
                            char *signed_headers, size_t sh_cap);

/* The string to sign for a canonical request.  0 or -1. */
int sigv4_string_to_sign(const sigv4_signer *s, const char *creq, size_t creq_len, char *out, size_t cap,
                         size_t *out_len);

/* kSigning for s (HMAC chain from "AWS4"+secret over date, region,
 * service, "aws4_request").  0 or -1; out is zeroed on failure. */
int sigv4_signing_key(const sigv4_signer *s, uint8_t out[SIGV4_KEY_LEN]);

/* hex(HMAC-SHA256(key, sts)) into hex (SIGV4_HEX_LEN + 1 bytes). */
void sigv4_signature(const uint8_t key[SIGV4_KEY_LEN], const char *sts, size_t sts_len,
                     char hex[SIGV4_HEX_LEN + 1]);

/* The whole signing: the Authorization header value for req, signed by s,
 * into out (cap bytes).  0, or -1 if anything is malformed or too long. */
int sigv4_authorization(const sigv4_signer *s, const sigv4_request *req, char *out, size_t cap);

/* Whether s can be a region or service in the scope: 1..64 of [a-z0-9-]. */
int sigv4_scope_part_ok(const char *s);

/* Lower-case hex of n bytes into hex (2n + 1 bytes). */
void sigv4_hex(const uint8_t *in, size_t n, char *hex);

#endif
