/*
 * migrate/keys/p11_meta.c -- the pkcs11 provider's metadata record
 * (p11_meta.h): a strict parser over ks_cursor and its canonical encoder.
 * The record comes from the token, so it is untrusted input: bounded,
 * canonical, exact length.
 */
#include <string.h>

#include "p11_meta.h"

#include "../../parser/cursor.h"
#include "keyring_format.h"

static const uint8_t meta_magic[4] = {'K', 'S', 'P', 'M'};

/* Read a big-endian integer of n (<= 8) bytes; the cursor is unchanged on
 * KS_ERR_TRUNCATED. */
static ks_err read_be(ks_cursor *c, size_t n, uint64_t *out)
{
    ks_bytes b;
    const ks_err e = ks_cursor_read_view(c, n, &b);
    if (e != KS_OK) {
        return e;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        v = (v << 8) | b.ptr[i];
    }
    *out = v;
    return KS_OK;
}

/* Check the fields of m against the record's rules, the same for the
 * parser and the encoder, in the order the parser meets them. */
static ks_err check_key_id(const ks_p11meta *m)
{
    if (m->key_id_len > KS_KEY_ID_MAX) {
        return KS_ERR_TOO_LARGE;
    }
    return ks_krf_check_key_id((ks_bytes){m->key_id, m->key_id_len});
}

/* The version-count, primary and state rules (after the key_id). */
static ks_err check_versions(const ks_p11meta *m)
{
    if (m->nversions > KS_P11META_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE;
    }
    if (m->nversions == 0 || m->primary == 0 || m->primary > m->nversions) {
        return KS_ERR_BAD_VALUE;
    }
    for (uint32_t i = 0; i < m->nversions; i++) {
        if (m->states[i] < KS_KEY_ACTIVE || m->states[i] > KS_KEY_DESTROYED) {
            return KS_ERR_BAD_VALUE;
        }
    }
    return m->states[m->primary - 1] == KS_KEY_ACTIVE ? KS_OK : KS_ERR_BAD_VALUE;
}

/* See p11_meta.h. */
ks_err ks_p11meta_parse(const uint8_t *buf, size_t len, ks_p11meta *out)
{
    if ((buf == NULL && len != 0) || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (len > KS_P11META_MAX_LEN) {
        return KS_ERR_TOO_LARGE;
    }
    ks_cursor c = ks_cursor_init(buf, len);
    ks_bytes b;
    uint64_t v;
    uint8_t ver;
    ks_err e;

    if ((e = ks_cursor_read_view(&c, sizeof meta_magic, &b)) != KS_OK) {
        return e;
    }
    if (memcmp(b.ptr, meta_magic, sizeof meta_magic) != 0) {
        return KS_ERR_BAD_MAGIC;
    }
    if ((e = ks_cursor_read_u8(&c, &ver)) != KS_OK) {
        return e;
    }
    if (ver != KS_P11META_VERSION) {
        return KS_ERR_UNSUPPORTED_VERSION;
    }
    if ((e = read_be(&c, 8, &out->seq)) != KS_OK) {
        return e;
    }
    if (out->seq == 0) {
        return KS_ERR_BAD_VALUE;
    }
    if ((e = read_be(&c, 2, &v)) != KS_OK) {
        return e;
    }
    if (v > KS_KEY_ID_MAX) {
        return KS_ERR_TOO_LARGE;
    }
    if ((e = ks_cursor_read_view(&c, (size_t)v, &b)) != KS_OK) {
        return e;
    }
    out->key_id_len = b.len;
    if (b.len != 0) {
        memcpy(out->key_id, b.ptr, b.len);
    }
    if ((e = check_key_id(out)) != KS_OK) {
        return e;
    }
    if ((e = read_be(&c, 4, &v)) != KS_OK) {
        return e;
    }
    if (v > KS_P11META_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE;
    }
    out->nversions = (uint32_t)v;
    if ((e = read_be(&c, 4, &v)) != KS_OK) {
        return e;
    }
    out->primary = (uint32_t)v;
    if ((e = ks_cursor_read_view(&c, out->nversions, &b)) != KS_OK) {
        return e;
    }
    if (b.len != 0) {
        memcpy(out->states, b.ptr, b.len);
    }
    if ((e = check_versions(out)) != KS_OK) {
        return e;
    }
    return ks_cursor_is_empty(&c) ? KS_OK : KS_ERR_BAD_VALUE;
}

/* See p11_meta.h. */
size_t ks_p11meta_len(const ks_p11meta *m)
{
    return KS_P11META_FIXED_LEN + m->key_id_len + m->nversions;
}

/* Write v as n big-endian bytes at *p and advance it. */
static void put_be(uint8_t **p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        (*p)[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    }
    *p += n;
}

/* See p11_meta.h. */
ks_err ks_p11meta_encode(const ks_p11meta *m, uint8_t *out, size_t cap, size_t *out_len)
{
    if (m == NULL || out == NULL || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err e;
    if (m->seq == 0) {
        return KS_ERR_BAD_VALUE;
    }
    if ((e = check_key_id(m)) != KS_OK || (e = check_versions(m)) != KS_OK) {
        return e;
    }
    const size_t n = ks_p11meta_len(m);
    if (cap < n) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    uint8_t *p = out;
    memcpy(p, meta_magic, sizeof meta_magic);
    p += sizeof meta_magic;
    *p++ = KS_P11META_VERSION;
    put_be(&p, m->seq, 8);
    put_be(&p, m->key_id_len, 2);
    memcpy(p, m->key_id, m->key_id_len);
    p += m->key_id_len;
    put_be(&p, m->nversions, 4);
    put_be(&p, m->primary, 4);
    memcpy(p, m->states, m->nversions);
    *out_len = n;
    return KS_OK;
}
