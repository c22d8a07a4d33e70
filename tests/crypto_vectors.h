/*
 * tests/crypto_vectors.h -- loader for the cryptographic test vectors of
 * docs/format.md (Appendix C): fenced blocks whose info string is exactly
 * `ks-crypto-vector`, in the format of its section C.1.
 *
 * Test support code, not part of the library.  Everything here is static:
 * the header is included by tests/test_crypto_vectors.c only, and every
 * .c file in tests/ is linked into every test binary, so it must not be a .c.
 * What the two loaders share (the fence scanner, hex digits, names, error
 * messages, reading the file) lives in tests/vectors.c, declared in
 * tests/vectors.h; only the block format of Appendix C is here.
 *
 * The loader is strict, like tests/vectors.c for Appendix A: an unknown,
 * repeated (scalar), missing or not-allowed key, a blank line, a bad
 * string, number or hex digit, a wrong fixed length, a duplicate name, a
 * `base` that names no `ok` vector, or an unterminated fence makes the whole
 * load fail, so that a typo in the spec fails the tests instead of
 * silently dropping a vector or a check.
 */
#ifndef KS_TESTS_CRYPTO_VECTORS_H
#define KS_TESTS_CRYPTO_VECTORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "vectors.h" /* the loader's pieces, shared with the Appendix A loader */

/* A byte value of a vector: owned, p NULL when n is 0. */
typedef struct kcv_bytes {
    uint8_t *p;
    size_t n;
    int have; /* the key was present */
} kcv_bytes;

/* One vector of Appendix C. */
typedef struct kcv_vector {
    size_t line;          /* 1-based line of the opening fence */
    kcv_bytes name;       /* [a-z0-9-]+, NUL-terminated copy in name_z */
    char name_z[128];
    int expect_ok;        /* 1: expect ok; 0: expect auth-failed */
    int have_expect;
    kcv_bytes base;       /* auth-failed only: the ok vector it was made from */
    char base_z[128];
    uint32_t version, algorithm, key_version;
    int have_version, have_algorithm, have_key_version;
    /* strings */
    kcv_bytes tenant, key_id, purpose, context, plaintext;
    /* hex */
    kcv_bytes kek, dek, wrap_nonce, wrap_aad, wrapped_dek, nonce, message_key, commitment,
        data_aad, ciphertext, envelope;
} kcv_vector;

typedef struct kcv_set {
    kcv_vector *v;
    size_t count;
} kcv_set;

/* Kinds of value. */
enum { KCV_NAME, KCV_EXPECT, KCV_BASE, KCV_INT, KCV_STR, KCV_STR_OR_HEX, KCV_HEX };
/* Presence rules, per kind of vector. */
enum { KCV_REQ, KCV_V2, KCV_NO };

typedef struct kcv_key {
    const char *key;
    int kind;
    size_t off;      /* offsetof the kcv_bytes, or of the uint32_t for KCV_INT */
    size_t have_off; /* KCV_INT: offsetof its have_ flag */
    int in_ok, in_fail;
    size_t fixed_len; /* KCV_HEX: exact length, 0 when variable */
} kcv_key;

#define KCV_B(f) offsetof(kcv_vector, f), 0
static const kcv_key kcv_keys[] = {
    {"name", KCV_NAME, KCV_B(name), KCV_REQ, KCV_REQ, 0},
    {"expect", KCV_EXPECT, 0, 0, KCV_REQ, KCV_REQ, 0},
    {"base", KCV_BASE, KCV_B(base), KCV_NO, KCV_REQ, 0},
    {"version", KCV_INT, offsetof(kcv_vector, version), offsetof(kcv_vector, have_version),
     KCV_REQ, KCV_REQ, 0},
    {"algorithm", KCV_INT, offsetof(kcv_vector, algorithm), offsetof(kcv_vector, have_algorithm),
     KCV_REQ, KCV_REQ, 0},
    {"tenant", KCV_STR, KCV_B(tenant), KCV_REQ, KCV_REQ, 0},
    {"key_id", KCV_STR, KCV_B(key_id), KCV_REQ, KCV_REQ, 0},
    {"key_version", KCV_INT, offsetof(kcv_vector, key_version),
     offsetof(kcv_vector, have_key_version), KCV_REQ, KCV_REQ, 0},
    {"purpose", KCV_STR, KCV_B(purpose), KCV_V2, KCV_V2, 0},
    {"context", KCV_STR_OR_HEX, KCV_B(context), KCV_REQ, KCV_REQ, 0},
    {"plaintext", KCV_STR, KCV_B(plaintext), KCV_REQ, KCV_NO, 0},
    {"kek", KCV_HEX, KCV_B(kek), KCV_REQ, KCV_REQ, 32},
    {"dek", KCV_HEX, KCV_B(dek), KCV_REQ, KCV_NO, 32},
    {"wrap_nonce", KCV_HEX, KCV_B(wrap_nonce), KCV_REQ, KCV_NO, 24},
    {"wrap_aad", KCV_HEX, KCV_B(wrap_aad), KCV_REQ, KCV_NO, 0},
    {"wrapped_dek", KCV_HEX, KCV_B(wrapped_dek), KCV_REQ, KCV_NO, 72},
    {"nonce", KCV_HEX, KCV_B(nonce), KCV_REQ, KCV_NO, 0},
    {"message_key", KCV_HEX, KCV_B(message_key), KCV_V2, KCV_NO, 32},
    {"commitment", KCV_HEX, KCV_B(commitment), KCV_V2, KCV_NO, 32},
    {"data_aad", KCV_HEX, KCV_B(data_aad), KCV_REQ, KCV_NO, 0},
    {"ciphertext", KCV_HEX, KCV_B(ciphertext), KCV_REQ, KCV_NO, 0},
    {"envelope", KCV_HEX, KCV_B(envelope), KCV_REQ, KCV_REQ, 0},
};
#undef KCV_B
#define KCV_NKEYS (sizeof kcv_keys / sizeof kcv_keys[0])

static inline int kcv_append(kcv_bytes *b, const void *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    uint8_t *q = realloc(b->p, b->n + n);
    if (q == NULL) {
        return -1;
    }
    memcpy(q + b->n, p, n);
    b->p = q;
    b->n += n;
    return 0;
}

/* Append the hex digits of v[0, n) to b; blanks ignored; each line must
 * hold whole bytes (stricter than the hex: lines of Appendix A). */
static inline int kcv_parse_hex(const ks_test_loader *ld, kcv_bytes *b, const char *v, size_t n)
{
    ks_test_hex h = {b->p, b->n, b->n, 0, 0};
    const int rc = ks_test_hex_add(ld, &h, v, n);
    b->p = h.bytes; /* b owns what was appended, even on failure */
    b->n = h.len;
    if (rc != 0) {
        return rc;
    }
    if (h.half) {
        return ks_test_fail(ld, "odd number of hex digits on a line", v, n);
    }
    b->have = 1;
    return 0;
}

/* A quoted string: "..." of printable ASCII other than '"' and '\'. */
static inline int kcv_parse_str(const ks_test_loader *ld, kcv_bytes *b, const char *v, size_t n)
{
    if (n < 2 || v[0] != '"' || v[n - 1] != '"') {
        return ks_test_fail(ld, "want a string in double quotes", v, n);
    }
    for (size_t i = 1; i + 1 < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
            return ks_test_fail(
                ld, "string holds a byte outside printable ASCII or a '\"' or '\\'", v, n);
        }
    }
    if (kcv_append(b, v + 1, n - 2) != 0) {
        return ks_test_fail(ld, "out of memory", NULL, 0);
    }
    b->have = 1;
    return 0;
}

/* A decimal number 0 .. 2^32-1, no sign, no leading zeros. */
static inline int kcv_parse_u32(const ks_test_loader *ld, uint32_t *out, const char *v, size_t n)
{
    uint64_t x = 0;
    if (n == 0 || n > 10 || (n > 1 && v[0] == '0')) {
        return ks_test_fail(ld, "want a decimal number", v, n);
    }
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') {
            return ks_test_fail(ld, "want a decimal number", v, n);
        }
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (x > UINT32_MAX) {
        return ks_test_fail(ld, "number above 2^32-1", v, n);
    }
    *out = (uint32_t)x;
    return 0;
}

/* A [a-z0-9-] name that fits name_z / base_z. */
static inline int kcv_name_ok(const char *p, size_t n)
{
    return n < 128 && ks_test_name_ok(p, n);
}

/* One line of a ks-crypto-vector block. */
static inline int kcv_line(const ks_test_loader *ld, kcv_vector *d, const char *line, size_t n)
{
    const char *key, *val;
    size_t klen, vlen;
    if (ks_test_key_value(ld, "ks-crypto-vector", line, n, &key, &klen, &val, &vlen) != 0) {
        return -1;
    }
    for (size_t k = 0; k < KCV_NKEYS; k++) {
        const kcv_key *K = &kcv_keys[k];
        if (!ks_test_equals(key, klen, K->key)) {
            continue;
        }
        char *base = (char *)d;
        switch (K->kind) {
        case KCV_NAME:
        case KCV_BASE: {
            kcv_bytes *b = (kcv_bytes *)(void *)(base + K->off);
            if (b->have) {
                return ks_test_fail(ld, "repeated key", key, klen);
            }
            if (!kcv_name_ok(val, vlen)) {
                return ks_test_fail(ld, "want a [a-z0-9-] name", val, vlen);
            }
            char *z = K->kind == KCV_NAME ? d->name_z : d->base_z;
            memcpy(z, val, vlen);
            z[vlen] = '\0';
            b->have = 1;
            return 0;
        }
        case KCV_EXPECT:
            if (d->have_expect) {
                return ks_test_fail(ld, "repeated key", key, klen);
            }
            if (ks_test_equals(val, vlen, "ok")) {
                d->expect_ok = 1;
            } else if (ks_test_equals(val, vlen, ks_err_name(KS_ERR_AUTH_FAILED))) {
                d->expect_ok = 0;
            } else {
                return ks_test_fail(ld, "expect: want 'ok' or 'auth-failed'", val, vlen);
            }
            d->have_expect = 1;
            return 0;
        case KCV_INT: {
            int *have = (int *)(void *)(base + K->have_off);
            if (*have) {
                return ks_test_fail(ld, "repeated key", key, klen);
            }
            *have = 1;
            return kcv_parse_u32(ld, (uint32_t *)(void *)(base + K->off), val, vlen);
        }
        case KCV_STR:
        case KCV_STR_OR_HEX: {
            /* a context that is not printable ASCII is written in hex, on one line */
            kcv_bytes *b = (kcv_bytes *)(void *)(base + K->off);
            if (b->have) {
                return ks_test_fail(ld, "repeated key", key, klen);
            }
            if (K->kind == KCV_STR_OR_HEX && vlen > 0 && val[0] != '"') {
                return kcv_parse_hex(ld, b, val, vlen);
            }
            return kcv_parse_str(ld, b, val, vlen);
        }
        default: /* KCV_HEX: lines concatenate */
            return kcv_parse_hex(ld, (kcv_bytes *)(void *)(base + K->off), val, vlen);
        }
    }
    return ks_test_fail(ld, "unknown key in ks-crypto-vector block", key, klen);
}

static inline void kcv_vector_free(kcv_vector *v)
{
    kcv_bytes *all[] = {&v->tenant,     &v->key_id,      &v->purpose,    &v->context,
                        &v->plaintext,  &v->kek,         &v->dek,        &v->wrap_nonce,
                        &v->wrap_aad,   &v->wrapped_dek, &v->nonce,      &v->message_key,
                        &v->commitment, &v->data_aad,    &v->ciphertext, &v->envelope};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(all[i]->p);
        all[i]->p = NULL;
        all[i]->n = 0;
    }
}

static inline void kcv_free(kcv_set *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t i = 0; i < s->count; i++) {
        kcv_vector_free(&s->v[i]);
    }
    free(s->v);
    s->v = NULL;
    s->count = 0;
}

/* Check a finished block against the presence and length rules. */
static inline int kcv_finish(const ks_test_loader *ld, kcv_vector *d)
{
    if (!d->name.have) {
        return ks_test_fail(ld, "block without name:", NULL, 0);
    }
    if (!d->have_expect) {
        return ks_test_fail(ld, "block without expect:", d->name_z, strlen(d->name_z));
    }
    if (!d->have_version || (d->version != 1 && d->version != 2)) {
        return ks_test_fail(ld, "version: want 1 or 2", d->name_z, strlen(d->name_z));
    }
    if (!d->have_algorithm || ks_alg_nonce_len(d->algorithm) == 0) {
        return ks_test_fail(ld, "algorithm: want 1 or 2", d->name_z, strlen(d->name_z));
    }
    if (!d->have_key_version || d->key_version == 0) {
        return ks_test_fail(ld, "key_version: want 1 .. 2^32-1", d->name_z, strlen(d->name_z));
    }
    char *base = (char *)d;
    for (size_t k = 0; k < KCV_NKEYS; k++) {
        const kcv_key *K = &kcv_keys[k];
        if (K->kind == KCV_EXPECT || K->kind == KCV_INT) {
            continue;
        }
        const kcv_bytes *b = (const kcv_bytes *)(const void *)(base + K->off);
        int rule = d->expect_ok ? K->in_ok : K->in_fail;
        int want = rule == KCV_REQ || (rule == KCV_V2 && d->version == 2);
        if (want && !b->have) {
            return ks_test_fail(ld, "missing key", K->key, strlen(K->key));
        }
        if (!want && b->have) {
            return ks_test_fail(ld, "key not allowed in this vector", K->key, strlen(K->key));
        }
        if (want && K->kind == KCV_HEX && K->fixed_len != 0 && b->n != K->fixed_len) {
            return ks_test_fail(ld, "wrong length", K->key, strlen(K->key));
        }
    }
    if (d->nonce.have && d->nonce.n != ks_alg_nonce_len(d->algorithm)) {
        return ks_test_fail(ld, "nonce length does not match the algorithm", d->name_z,
                            strlen(d->name_z));
    }
    return 0;
}

/* ks_test_scan_blocks() callbacks: the vector of the block at hand (owned
 * until it moves into out), and where finished vectors go. */
typedef struct kcv_scan {
    kcv_vector d;
    kcv_set *out;
} kcv_scan;

static inline int kcv_block_open(void *arg, const ks_test_loader *ld)
{
    kcv_scan *s = (kcv_scan *)arg;
    kcv_vector_free(&s->d);
    memset(&s->d, 0, sizeof s->d);
    s->d.line = ld->line;
    return 0;
}

static inline int kcv_block_line(void *arg, const ks_test_loader *ld, const char *line, size_t n)
{
    return kcv_line(ld, &((kcv_scan *)arg)->d, line, n);
}

/* A closing fence: check the vector, refuse a duplicate name, keep it. */
static inline int kcv_block_close(void *arg, const ks_test_loader *ld)
{
    kcv_scan *s = (kcv_scan *)arg;
    kcv_set *out = s->out;
    int rc = kcv_finish(ld, &s->d);
    for (size_t i = 0; rc == 0 && i < out->count; i++) {
        if (strcmp(out->v[i].name_z, s->d.name_z) == 0) {
            rc = ks_test_fail(ld, "duplicate vector name", s->d.name_z, strlen(s->d.name_z));
        }
    }
    if (rc == 0) {
        kcv_vector *g = (kcv_vector *)realloc(out->v, (out->count + 1) * sizeof *g);
        if (g == NULL) {
            return ks_test_fail(ld, "out of memory", NULL, 0);
        }
        out->v = g;
        out->v[out->count++] = s->d; /* ownership moves */
        memset(&s->d, 0, sizeof s->d);
    }
    return rc;
}

/* Parse every ks-crypto-vector block of text[0, len) (the fence scanner of
 * tests/vectors.c).  0, or -1 with a message in err. */
static inline int kcv_parse(const char *text, size_t len, const char *origin, kcv_set *out,
                            char *err, size_t errlen)
{
    static const ks_test_block_ops ops = {"ks-crypto-vector", kcv_block_open, kcv_block_line,
                                          kcv_block_close};
    ks_test_loader ld = {origin, 0, err, errlen};
    kcv_scan s;
    memset(&s, 0, sizeof s);
    s.out = out;
    out->v = NULL;
    out->count = 0;
    if (err != NULL && errlen > 0) {
        err[0] = '\0';
    }
    int rc = ks_test_scan_blocks(text, len, &ld, &ops, &s);
    /* Every base names an ok vector. */
    for (size_t i = 0; rc == 0 && i < out->count; i++) {
        if (out->v[i].expect_ok) {
            continue;
        }
        int found = 0;
        for (size_t j = 0; j < out->count; j++) {
            found |= out->v[j].expect_ok && strcmp(out->v[j].name_z, out->v[i].base_z) == 0;
        }
        if (!found) {
            ld.line = out->v[i].line;
            rc = ks_test_fail(&ld, "base: no ok vector has that name", out->v[i].base_z,
                              strlen(out->v[i].base_z));
        }
    }
    kcv_vector_free(&s.d);
    if (rc != 0) {
        kcv_free(out);
    }
    return rc;
}

/* A view of a vector's bytes. */
static inline ks_bytes kcv_view(const kcv_bytes *b)
{
    ks_bytes v = {b->n != 0 ? b->p : NULL, b->n};
    return v;
}

#endif /* KS_TESTS_CRYPTO_VECTORS_H */
