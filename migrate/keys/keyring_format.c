/*
 * migrate/keys/keyring_format.c -- the strict keyring parser and its canonical
 * encoder (docs/keyring.md).
 *
 * The parser is the one place at which the bytes of a keyring file enter
 * the library; like parser/envelope.c it reads only through ks_cursor,
 * checks every length before use, stops at the first fault and reports it
 * with a code and an offset, never allocates and does work linear in the
 * input.  Each check names the clause it enforces.  The encoder applies
 * the same rules (the helpers below are shared), so that it refuses
 * exactly what the parser would reject [K-CONF-2].
 *
 * Nothing here includes libsodium: the sealed payload is only delimited,
 * and the body handed in is already plaintext.
 */
#include <assert.h>
#include <string.h>

#include "keyring_format.h"

#include "../../format/rules.h"
#include "../../parser/cursor.h"

/* ---- rules shared by the parser and the encoder --------------------------- */

/* Nonzero for a defined ks_key_state value [K-VER-2]. */
static int state_ok(uint64_t state)
{
    return state >= KS_KEY_ACTIVE && state <= KS_KEY_DESTROYED;
}

/* The material length a version in `state` carries [K-VER-3]. */
static size_t material_len(uint64_t state)
{
    return state == KS_KEY_DESTROYED ? 0 : KS_KEK_LEN;
}

/* The length rule of a key_id [K-KEY-2], [F-KEYID-1]. */
static ks_err check_id_len(uint64_t n)
{
    if (n > KS_KEY_ID_MAX) {
        return KS_ERR_TOO_LARGE;
    }
    return n == 0 ? KS_ERR_BAD_VALUE : KS_OK;
}

/* The rule on a key's version count [K-KEY-4]. */
static ks_err check_count(uint64_t count)
{
    if (count > KS_KEYRING_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE;
    }
    return count == 0 ? KS_ERR_BAD_VALUE : KS_OK;
}

/* The rule on a key's primary version number [K-KEY-5]. */
static ks_err check_primary(uint64_t primary, uint64_t count)
{
    return primary >= 1 && primary <= count ? KS_OK : KS_ERR_BAD_VALUE;
}

/* The rule on a version's state, given whether it is the primary
 * [K-VER-2], [K-KEY-5]. */
static ks_err check_state(uint64_t state, int is_primary)
{
    if (!state_ok(state)) {
        return KS_ERR_BAD_VALUE;
    }
    return is_primary && state != KS_KEY_ACTIVE ? KS_ERR_BAD_VALUE : KS_OK;
}

/* The first byte of a non-empty key_id outside [F-KEYID-1]'s class, or
 * its length when every byte is inside.  Reuses the envelope's character
 * table, so that the two formats cannot drift apart. */
static size_t id_charset_scan(ks_bytes id)
{
    assert(id.ptr != NULL && id.len != 0);
    return ks_rules_charset_scan(KS_RULE_KEY_ID, id.ptr, id.len);
}

/* See keyring_format.h. */
int ks_krf_key_id_cmp(ks_bytes a, ks_bytes b)
{
    assert(a.ptr != NULL && b.ptr != NULL);
    const size_t n = a.len < b.len ? a.len : b.len;
    const int c = memcmp(a.ptr, b.ptr, n);
    if (c != 0) {
        return c;
    }
    return a.len < b.len ? -1 : a.len > b.len;
}

/* See keyring_format.h. */
ks_err ks_krf_check_key_id(ks_bytes key_id)
{
    if (key_id.ptr == NULL || check_id_len(key_id.len) != KS_OK) {
        return KS_ERR_BAD_VALUE;
    }
    return id_charset_scan(key_id) == key_id.len ? KS_OK : KS_ERR_BAD_VALUE;
}

/* ---- the parser ------------------------------------------------------------- */

/* Fill *err (when not NULL) with a rejection and return its code. */
static ks_err reject(ks_parse_error *err, ks_err code, size_t offset, uint32_t field)
{
    assert(ks_err_is_rejection(code));
    if (err != NULL) {
        err->code = code;
        err->offset = offset;
        err->field = field;
    }
    return code;
}

/* Note the offset of the next element in *offset, then read it as an
 * n-byte big-endian unsigned integer (1 <= n <= 8).  KS_ERR_TRUNCATED,
 * cursor unchanged, when fewer than n bytes remain [K-ERR-2]. */
static ks_err read_be(ks_cursor *c, size_t n, uint64_t *out, size_t *offset)
{
    ks_bytes v;
    assert(n >= 1 && n <= 8);
    *offset = ks_cursor_offset(c);
    if (ks_cursor_read_view(c, n, &v) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    *out = ks_be_get(v.ptr, n);
    return KS_OK;
}

/* Note the offset of the next element in *offset, then read a view of its
 * n bytes [K-ERR-2]. */
static ks_err read_bytes(ks_cursor *c, size_t n, ks_bytes *out, size_t *offset)
{
    *offset = ks_cursor_offset(c);
    return ks_cursor_read_view(c, n, out);
}

/* Check the prefix [K-FRAME-1..3]; the mode byte goes to *mode.  As for
 * envelopes, every magic byte present is compared before the length is,
 * so a short foreign file is bad-magic rather than truncated. */
static ks_err parse_prefix(ks_cursor *c, uint8_t *mode, size_t *offset)
{
    static const uint8_t magic[3] = {KS_KRF_MAGIC_0, KS_KRF_MAGIC_1, KS_KRF_MAGIC_2};
    const size_t avail = ks_cursor_remaining(c);
    uint64_t v;
    ks_bytes m;

    for (size_t i = 0; i < sizeof magic && i < avail; i++) {
        if (c->buf[i] != magic[i]) {
            *offset = i;
            return KS_ERR_BAD_MAGIC; /* [K-FRAME-1] */
        }
    }
    if (read_bytes(c, sizeof magic, &m, offset) != KS_OK) {
        return KS_ERR_TRUNCATED; /* [K-FRAME-1] */
    }
    if (read_be(c, 1, &v, offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (v != KS_KRF_FORMAT_V1) {
        return KS_ERR_UNSUPPORTED_VERSION; /* [K-FRAME-2] */
    }
    if (read_be(c, 1, &v, offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (v != KS_KRF_MODE_PLAIN && v != KS_KRF_MODE_SEALED) {
        return KS_ERR_BAD_VALUE; /* [K-FRAME-3] */
    }
    *mode = (uint8_t)v;
    return KS_OK;
}

/* Nonzero when an Argon2id opslimit is one a reader accepts [K-SEAL-2]. */
static int opslimit_ok(uint64_t v)
{
    return v >= KS_KRF_OPSLIMIT_MIN && v <= KS_KRF_OPSLIMIT_MAX;
}

/* Nonzero when an Argon2id memlimit is one a reader accepts [K-SEAL-2]. */
static int memlimit_ok(uint64_t v)
{
    return v >= KS_KRF_MEMLIMIT_MIN && v <= KS_KRF_MEMLIMIT_MAX;
}

/* Read the sealed header after the prefix [K-SEAL-1], [K-SEAL-2], and
 * delimit the secretbox [K-SEAL-3].  The cost parameters are untrusted
 * bytes: each is checked as soon as it is read. */
static ks_err parse_sealed(ks_cursor *c, ks_krf_header *out, size_t *offset)
{
    if (read_bytes(c, KS_KRF_SALT_LEN, &out->salt, offset) != KS_OK ||
        read_be(c, 8, &out->opslimit, offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (!opslimit_ok(out->opslimit)) {
        return KS_ERR_BAD_VALUE; /* [K-SEAL-2] */
    }
    if (read_be(c, 8, &out->memlimit, offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (!memlimit_ok(out->memlimit)) {
        return KS_ERR_BAD_VALUE; /* [K-SEAL-2] */
    }
    if (read_bytes(c, KS_KRF_NONCE_LEN, &out->nonce, offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    /* [K-SEAL-3] The box holds the MAC and at least the key count. */
    *offset = ks_cursor_offset(c);
    if (ks_cursor_remaining(c) < KS_KRF_MAC_LEN + KS_KRF_COUNT_LEN) {
        return KS_ERR_TRUNCATED;
    }
    return KS_OK;
}

/* See keyring_format.h. */
ks_err ks_krf_parse_header(const uint8_t *buf, size_t len, ks_krf_header *out, ks_parse_error *err)
{
    size_t offset = 0;
    ks_err e;

    assert(out != NULL);
    memset(out, 0, sizeof *out);
    assert(buf != NULL || len == 0);
    ks_cursor c = ks_cursor_init(buf, len);
    if ((e = parse_prefix(&c, &out->mode, &offset)) == KS_OK && out->mode == KS_KRF_MODE_SEALED) {
        e = parse_sealed(&c, out, &offset);
    }
    if (e != KS_OK) {
        memset(out, 0, sizeof *out);
        return reject(err, e, offset, 0);
    }
    out->payload_offset = ks_cursor_offset(&c);
    e = ks_cursor_read_view(&c, ks_cursor_remaining(&c), &out->payload);
    assert(e == KS_OK);
    return KS_OK;
}

/* State of one body parse. */
typedef struct body_parse {
    const ks_krf_visitor *vis;
    ks_krf_summary sum;
    ks_bytes prev_id;   /* the previous key's id, for [K-KEY-3] */
    uint32_t key_index; /* 1-based index of the key being read; 0 outside */
    size_t offset;      /* where the element being read starts */
    ks_err cb_err;      /* what a visitor callback returned, if it failed */
} body_parse;

/*
 * Read version `number` of a key whose primary is `primary` [K-VER-1..3].
 * The number must be the next one: a smaller one is a duplicate or a step
 * back (field-order), a larger one skips a version (missing-field).
 */
static ks_err parse_version(ks_cursor *c, uint32_t number, uint32_t primary, body_parse *st,
                            ks_krf_version *v)
{
    uint64_t x, state, mlen;
    ks_bytes mat;
    ks_err e;

    if (read_be(c, 4, &x, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (x != number) {
        return x < number ? KS_ERR_FIELD_ORDER : KS_ERR_MISSING_FIELD; /* [K-VER-1] */
    }
    if (read_be(c, 1, &state, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if ((e = check_state(state, number == primary)) != KS_OK) {
        return e; /* [K-VER-2], [K-KEY-5] */
    }
    if (read_be(c, 8, &v->created, &st->offset) != KS_OK ||
        read_be(c, 1, &mlen, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (mlen != material_len(state)) {
        return KS_ERR_BAD_VALUE; /* [K-VER-3] */
    }
    if (read_bytes(c, (size_t)mlen, &mat, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    v->state = (uint8_t)state;
    v->material = mat.ptr;
    return KS_OK;
}

/* Read a key's id [K-KEY-2] and check its order [K-KEY-3]. */
static ks_err parse_key_id(ks_cursor *c, body_parse *st, ks_bytes *id)
{
    uint64_t n;
    size_t len_at;
    ks_err e;

    if (read_be(c, 2, &n, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    len_at = st->offset;
    if ((e = check_id_len(n)) != KS_OK) {
        return e; /* [K-KEY-2] */
    }
    if (read_bytes(c, (size_t)n, id, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    const size_t bad = id_charset_scan(*id);
    if (bad != id->len) {
        st->offset += bad;
        return KS_ERR_BAD_VALUE; /* [K-KEY-2], [F-KEYID-1] */
    }
    if (st->key_index > 1 && ks_krf_key_id_cmp(st->prev_id, *id) >= 0) {
        st->offset = len_at;
        return KS_ERR_FIELD_ORDER; /* [K-KEY-3] */
    }
    return KS_OK;
}

/* Read a key record's header: id, version count and primary [K-KEY-2..5]. */
static ks_err parse_key_header(ks_cursor *rec, body_parse *st, ks_krf_key *key)
{
    uint64_t count, primary;
    ks_err e;

    if ((e = parse_key_id(rec, st, &key->key_id)) != KS_OK) {
        return e;
    }
    if (read_be(rec, 4, &count, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if ((e = check_count(count)) != KS_OK) {
        return e; /* [K-KEY-4] */
    }
    if (read_be(rec, 4, &primary, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if ((e = check_primary(primary, count)) != KS_OK) {
        return e; /* [K-KEY-5] */
    }
    key->count = (uint32_t)count;
    key->primary = (uint32_t)primary;
    key->versions = NULL;
    return KS_OK;
}

/* Note what a visitor callback returned; a failure ends the parse with
 * the callback's code, which is not a rejection. */
static ks_err visit(body_parse *st, ks_err e)
{
    st->cb_err = e;
    return e;
}

/* Read one key record [K-KEY-1..5]: its length, then, inside exactly that
 * many bytes, its header and its versions. */
static ks_err parse_key(ks_cursor *c, body_parse *st)
{
    uint64_t rlen;
    ks_cursor rec;
    ks_krf_key key;
    ks_err e;

    if (read_be(c, 4, &rlen, &st->offset) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    if (rlen > KS_KRF_RECORD_MAX) {
        return KS_ERR_TOO_LARGE; /* [K-KEY-1] */
    }
    st->offset = ks_cursor_offset(c);
    if (ks_cursor_read_sub(c, (size_t)rlen, &rec) != KS_OK) {
        return KS_ERR_TRUNCATED; /* [K-KEY-1] */
    }
    if ((e = parse_key_header(&rec, st, &key)) != KS_OK) {
        return e;
    }
    if (st->vis != NULL && visit(st, st->vis->key(st->vis->ctx, &key)) != KS_OK) {
        return st->cb_err;
    }
    for (uint32_t n = 1; n <= key.count; n++) {
        ks_krf_version v;
        if ((e = parse_version(&rec, n, key.primary, st, &v)) != KS_OK) {
            return e;
        }
        st->sum.versions++;
        st->sum.material += v.material != NULL;
        if (st->vis != NULL && visit(st, st->vis->version(st->vis->ctx, &v)) != KS_OK) {
            return st->cb_err;
        }
    }
    if (!ks_cursor_is_empty(&rec)) {
        st->offset = ks_cursor_offset(&rec);
        return KS_ERR_UNKNOWN_FIELD; /* [K-KEY-1] the record holds nothing else */
    }
    st->prev_id = key.key_id;
    st->sum.id_bytes += key.key_id.len;
    return KS_OK;
}

/* See keyring_format.h. */
ks_err ks_krf_parse_body(const uint8_t *body, size_t len, size_t base, const ks_krf_visitor *vis,
                         ks_krf_summary *sum, ks_parse_error *err)
{
    body_parse st;
    uint64_t count;
    ks_err e = KS_OK;

    assert(body != NULL || len == 0);
    assert(vis == NULL || (vis->key != NULL && vis->version != NULL));
    memset(&st, 0, sizeof st);
    st.vis = vis;
    ks_cursor c = ks_cursor_init(body, len);
    c.base = base;
    if (read_be(&c, 4, &count, &st.offset) != KS_OK) {
        return reject(err, KS_ERR_TRUNCATED, st.offset, 0);
    }
    if (count > KS_KEYRING_MAX_KEYS) {
        return reject(err, KS_ERR_TOO_LARGE, st.offset, 0); /* [K-BODY-1] */
    }
    for (uint32_t i = 1; i <= count; i++) {
        st.key_index = i;
        if ((e = parse_key(&c, &st)) != KS_OK) {
            break;
        }
    }
    if (e != KS_OK) {
        return st.cb_err != KS_OK ? e : reject(err, e, st.offset, st.key_index);
    }
    if (!ks_cursor_is_empty(&c)) {
        return reject(err, KS_ERR_UNKNOWN_FIELD, ks_cursor_offset(&c), 0); /* [K-BODY-2] */
    }
    st.sum.keys = (size_t)count;
    if (sum != NULL) {
        *sum = st.sum;
    }
    return KS_OK;
}

/* ---- the encoder -------------------------------------------------------------- */

/* Write v as n big-endian bytes at *p and advance *p. */
static void put_be(uint8_t **p, uint64_t v, size_t n)
{
    ks_be_put(*p, v, n);
    *p += n;
}

/* Check version `number` of a key whose primary is `primary` as the parser
 * would [K-VER-2], [K-VER-3], [K-KEY-5]; material must be there exactly
 * when the version is not destroyed. */
static ks_err check_version(const ks_krf_version *v, uint32_t number, uint32_t primary)
{
    ks_err e = check_state(v->state, number == primary);
    if (e != KS_OK) {
        return e;
    }
    return (v->material == NULL) == (v->state == KS_KEY_DESTROYED) ? KS_OK
                                                                  : KS_ERR_INVALID_ARGUMENT;
}

/* Check key k, whose predecessor is prev (NULL for the first key), in the
 * parser's order of checks, and compute the length of its record after
 * the record's own length field [K-KEY-1..5]. */
static ks_err check_key(const ks_krf_key *k, const ks_krf_key *prev, size_t *rlen)
{
    ks_err e;

    if ((k->key_id.ptr == NULL) != (k->key_id.len == 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((e = check_id_len(k->key_id.len)) != KS_OK) {
        return e;
    }
    if (id_charset_scan(k->key_id) != k->key_id.len) {
        return KS_ERR_BAD_VALUE;
    }
    if (prev != NULL && ks_krf_key_id_cmp(prev->key_id, k->key_id) >= 0) {
        return KS_ERR_FIELD_ORDER;
    }
    if ((e = check_count(k->count)) != KS_OK || (e = check_primary(k->primary, k->count)) != KS_OK) {
        return e;
    }
    if (k->versions == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    size_t n = KS_KRF_KEY_FIXED_LEN - 4 + k->key_id.len;
    for (uint32_t i = 0; i < k->count; i++) {
        if ((e = check_version(&k->versions[i], i + 1, k->primary)) != KS_OK) {
            return e;
        }
        n += KS_KRF_VERSION_HDR_LEN + material_len(k->versions[i].state);
    }
    assert(n <= KS_KRF_RECORD_MAX);
    *rlen = n;
    return KS_OK;
}

/* See keyring_format.h. */
ks_err ks_krf_body_len(const ks_krf_key *keys, size_t n, size_t *len)
{
    size_t total = KS_KRF_COUNT_LEN;
    ks_err e;

    if ((keys == NULL && n != 0) || len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (n > KS_KEYRING_MAX_KEYS) {
        return KS_ERR_TOO_LARGE; /* [K-BODY-1] */
    }
    for (size_t i = 0; i < n; i++) {
        size_t rlen;
        if ((e = check_key(&keys[i], i > 0 ? &keys[i - 1] : NULL, &rlen)) != KS_OK) {
            return e;
        }
        total += 4 + rlen;
    }
    assert(total <= KS_KRF_BODY_MAX);
    *len = total;
    return KS_OK;
}

/* Write one version (checked by check_version()). */
static void put_version(uint8_t **p, const ks_krf_version *v, uint32_t number)
{
    const size_t mlen = material_len(v->state);
    put_be(p, number, 4);
    put_be(p, v->state, 1);
    put_be(p, v->created, 8);
    put_be(p, mlen, 1);
    if (mlen != 0) {
        memcpy(*p, v->material, mlen);
        *p += mlen;
    }
}

/* Write one key record, its length first (checked by check_key()). */
static void put_key(uint8_t **p, const ks_krf_key *k)
{
    uint8_t *const len_at = *p;
    *p += 4;
    put_be(p, k->key_id.len, 2);
    memcpy(*p, k->key_id.ptr, k->key_id.len);
    *p += k->key_id.len;
    put_be(p, k->count, 4);
    put_be(p, k->primary, 4);
    for (uint32_t i = 0; i < k->count; i++) {
        put_version(p, &k->versions[i], i + 1);
    }
    uint8_t *q = len_at;
    put_be(&q, (uint64_t)(*p - len_at - 4), 4);
}

/* See keyring_format.h. */
ks_err ks_krf_encode_body(const ks_krf_key *keys, size_t n, uint8_t *out, size_t cap,
                          size_t *out_len)
{
    size_t len = 0;
    ks_err e;

    if ((out == NULL && cap != 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((e = ks_krf_body_len(keys, n, &len)) != KS_OK) {
        return e;
    }
    if (cap < len) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    uint8_t *p = out;
    put_be(&p, n, 4);
    for (size_t i = 0; i < n; i++) {
        put_key(&p, &keys[i]);
    }
    assert((size_t)(p - out) == len);
    *out_len = len;
    return KS_OK;
}

/* See keyring_format.h. */
ks_err ks_krf_encode_header(const ks_krf_header *h, uint8_t *out, size_t cap, size_t *out_len)
{
    if (h == NULL || (out == NULL && cap != 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const int sealed = h->mode == KS_KRF_MODE_SEALED;
    if (!sealed && h->mode != KS_KRF_MODE_PLAIN) {
        return KS_ERR_BAD_VALUE; /* [K-FRAME-3] */
    }
    if (sealed && (h->salt.len != KS_KRF_SALT_LEN || h->salt.ptr == NULL ||
                   h->nonce.len != KS_KRF_NONCE_LEN || h->nonce.ptr == NULL)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (sealed && (!opslimit_ok(h->opslimit) || !memlimit_ok(h->memlimit))) {
        return KS_ERR_BAD_VALUE; /* [K-SEAL-2] */
    }
    const size_t len = sealed ? KS_KRF_SEALED_HDR_LEN : KS_KRF_PREFIX_LEN;
    if (cap < len) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    uint8_t *p = out;
    *p++ = KS_KRF_MAGIC_0;
    *p++ = KS_KRF_MAGIC_1;
    *p++ = KS_KRF_MAGIC_2;
    *p++ = KS_KRF_FORMAT_V1;
    *p++ = h->mode;
    if (sealed) {
        memcpy(p, h->salt.ptr, KS_KRF_SALT_LEN);
        p += KS_KRF_SALT_LEN;
        put_be(&p, h->opslimit, 8);
        put_be(&p, h->memlimit, 8);
        memcpy(p, h->nonce.ptr, KS_KRF_NONCE_LEN);
        p += KS_KRF_NONCE_LEN;
    }
    assert((size_t)(p - out) == len);
    *out_len = len;
    return KS_OK;
}
