/*
 * tests/test_envelope.c -- unit tests of the envelope parser and encoder,
 * on inputs built here in C (the spec's own vectors are checked by
 * tests/test_spec_vectors.c).
 *
 * Inputs are built by a small independent writer (tbuf below), not by the
 * library's encoder, from a list of items: a field (tag, varint, bytes) or
 * raw bytes.  The writer records where every element starts, so expected
 * error offsets are computed from the layout rather than hard-coded.  Every
 * input handed to the parser lives in a heap block of exactly its length,
 * so AddressSanitizer catches any read past the end.
 *
 * No test is timed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>

#include "envelope_eq.h"
#include "../parser/envelope_head.h"

/* ---- bookkeeping: which rejection codes the C-built tests produced ---- */

#define N_REJECTIONS 11 /* KS_ERR_TRUNCATED .. KS_ERR_BAD_VALUE */
static unsigned g_hits[N_REJECTIONS + 1];

/* Record that a test saw the parser produce rejection `code` as expected. */
static void note_hit(ks_err code)
{
    if (code >= KS_ERR_TRUNCATED && code <= KS_ERR_BAD_VALUE) {
        g_hits[code]++;
    }
}

#define ANY_FIELD UINT32_MAX /* do not check err.field */

static const ks_envelope g_zero_env;

/* ---- test data pools ---------------------------------------------------- */

static const char k_name_chars[] =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";
static const char k_key_id_chars[] = "kms:eu-west-1/acct@42+rot=7_Q.Z-";

#define POOL_LEN (KS_CIPHERTEXT_HARD_MAX + 16384)
#define NAME_POOL_LEN (4 * KS_KEY_ID_MAX)
static uint8_t g_names[NAME_POOL_LEN];  /* valid tenant/purpose characters */
static uint8_t g_key_ids[NAME_POOL_LEN]; /* valid key_id characters */
static uint8_t *g_pool;                 /* opaque bytes, large enough for any field */

/* Offsets in g_pool of the opaque fields' bytes. */
#define POOL_WRAPPED 0
#define POOL_NONCE 3000
#define POOL_COMMIT 4000
#define POOL_CT 8192

/* Group setup: fill the pools. */
static int setup_pools(void **state)
{
    (void)state;
    for (size_t i = 0; i < NAME_POOL_LEN; i++) {
        g_names[i] = (uint8_t)k_name_chars[i % (sizeof k_name_chars - 1)];
        g_key_ids[i] = (uint8_t)k_key_id_chars[i % (sizeof k_key_id_chars - 1)];
    }
    g_pool = malloc(POOL_LEN);
    if (g_pool == NULL) {
        return -1;
    }
    uint32_t x = 0x9E3779B9u;
    for (size_t i = 0; i < POOL_LEN; i++) {
        x = x * 1664525u + 1013904223u;
        g_pool[i] = (uint8_t)(x >> 24);
    }
    return 0;
}

/* Group teardown: free the pools. */
static int teardown_pools(void **state)
{
    (void)state;
    free(g_pool);
    g_pool = NULL;
    return 0;
}

/* A view of p[0, n), absent when n is 0. */
static ks_bytes view(const uint8_t *p, size_t n)
{
    ks_bytes v = {n != 0 ? p : NULL, n};
    return v;
}

/* A view of a C string. */
static ks_bytes strview(const char *s)
{
    return view((const uint8_t *)s, strlen(s));
}

/* The nonce length of an algorithm, per the field table (not the library). */
static size_t nonce_len_of(uint32_t alg)
{
    return alg == KS_ALG_XCHACHA20POLY1305 ? 24 : 12;
}

/* The parameters of a valid envelope. */
typedef struct shape {
    const char *label;
    uint8_t version;
    uint32_t alg;
    size_t tenant, key_id;
    uint32_t key_version;
    size_t wrapped, purpose, ct;
} shape;

/* v1 and v2, both algorithms, one-, two- and three-byte lengths, 1- to
 * 5-byte key versions. */
static const shape g_shapes[] = {
    {"v1-aes", 1, 1, 9, 20, 7, 40, 0, 48},
    {"v1-xchacha-min", 1, 2, 1, 1, 1, 1, 0, 16},
    {"v2-aes", 2, 1, 12, 30, 300, 60, 6, 32},
    {"v2-xchacha-max-hdr", 2, 2, 64, 256, 0xFFFFFFFFu, 1024, 64, 1000},
    {"v1-aes-3byte-ct-len", 1, 1, 5, 128, 1u << 28, 200, 0, 16400},
    {"v2-xchacha-2byte", 2, 2, 3, 130, 128, 129, 1, 200},
};
#define N_SHAPES (sizeof g_shapes / sizeof g_shapes[0])

/* Build the field values of a shape, as views into the pools. */
static ks_envelope make_env(const shape *s)
{
    ks_envelope e;
    memset(&e, 0, sizeof e);
    e.version = s->version;
    e.algorithm = s->alg;
    e.tenant = view(g_names, s->tenant);
    e.key_id = view(g_key_ids + 1, s->key_id);
    e.key_version = s->key_version;
    e.wrapped_dek = view(g_pool + POOL_WRAPPED, s->wrapped);
    e.nonce = view(g_pool + POOL_NONCE, nonce_len_of(s->alg));
    if (s->version == KS_FORMAT_V2) {
        e.purpose = view(g_names + 7, s->purpose);
        e.commitment = view(g_pool + POOL_COMMIT, KS_COMMITMENT_LEN);
    }
    e.ciphertext = view(g_pool + POOL_CT, s->ct);
    return e;
}

/* A valid envelope of the given version and algorithm, small fields. */
static ks_envelope base_env(uint8_t version, uint32_t alg)
{
    shape s = {"base", version, alg, 6, 12, 3, 32, version == 2 ? 5 : 0, 24};
    return make_env(&s);
}

/* ---- the independent writer ---------------------------------------------- */

#define MAX_ITEMS 24
#define MAX_ELEMS (2 + 3 * MAX_ITEMS)

/* One thing to write: raw bytes, or a field (tag, varint, then data). */
typedef struct item {
    const uint8_t *raw;
    size_t raw_len;
    uint32_t number;
    unsigned wire;
    uint64_t value;      /* the varint after the tag: value or length */
    const uint8_t *data; /* bytes after the varint */
    size_t data_len;
} item;

/* One element of the written input: magic, version, tag, varint, data. */
typedef struct elem {
    size_t start, len;
    uint32_t field; /* field the parser is reading there; 0 in the prefix */
} elem;

/* A written input, with its layout. */
typedef struct tbuf {
    uint8_t *p; /* heap block of exactly len bytes (NULL when len is 0) */
    size_t len, cap;
    size_t nitems;
    size_t tag_off[MAX_ITEMS], val_off[MAX_ITEMS], data_off[MAX_ITEMS], end_off[MAX_ITEMS];
    elem el[MAX_ELEMS];
    size_t nel;
} tbuf;

/* A varint field. */
static item vf(uint32_t number, uint64_t v)
{
    item it;
    memset(&it, 0, sizeof it);
    it.number = number;
    it.wire = 0;
    it.value = v;
    return it;
}

/* A length-delimited field holding b. */
static item bf(uint32_t number, ks_bytes b)
{
    item it;
    memset(&it, 0, sizeof it);
    it.number = number;
    it.wire = 2;
    it.value = b.len;
    it.data = b.ptr;
    it.data_len = b.len;
    return it;
}

/* Raw bytes, written verbatim. */
static item rawi(const uint8_t *p, size_t n)
{
    item it;
    memset(&it, 0, sizeof it);
    it.raw = p;
    it.raw_len = n;
    return it;
}

/* The items of e in canonical order.  v2-only fields are written for v2,
 * and for v1 only when non-empty (so that v1 with a purpose is the bytes
 * the parser must reject). */
static size_t env_items(const ks_envelope *e, item *it)
{
    size_t n = 0;
    it[n++] = vf(1, e->algorithm);
    it[n++] = bf(2, e->tenant);
    it[n++] = bf(3, e->key_id);
    it[n++] = vf(4, e->key_version);
    it[n++] = bf(5, e->wrapped_dek);
    it[n++] = bf(6, e->nonce);
    if (e->version != KS_FORMAT_V1 || e->purpose.len != 0) {
        it[n++] = bf(7, e->purpose);
    }
    if (e->version != KS_FORMAT_V1 || e->commitment.len != 0) {
        it[n++] = bf(8, e->commitment);
    }
    it[n++] = bf(15, e->ciphertext);
    return n;
}

/* Insert x at index i of it[0, *n). */
static void items_insert(item *it, size_t *n, size_t i, item x)
{
    assert_true(*n < MAX_ITEMS && i <= *n);
    memmove(it + i + 1, it + i, (*n - i) * sizeof *it);
    it[i] = x;
    (*n)++;
}

/* Remove index i of it[0, *n). */
static void items_remove(item *it, size_t *n, size_t i)
{
    assert_true(i < *n);
    memmove(it + i, it + i + 1, (*n - i - 1) * sizeof *it);
    (*n)--;
}

/* Append p[0, n) to b. */
static void tb_put(tbuf *b, const uint8_t *p, size_t n)
{
    if (n == 0) {
        return;
    }
    if (b->cap - b->len < n) {
        size_t cap = b->cap == 0 ? 256 : b->cap;
        while (cap - b->len < n) {
            cap *= 2;
        }
        uint8_t *q = realloc(b->p, cap);
        assert_non_null(q);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* Append the minimal varint of v to b. */
static void tb_varint(tbuf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    tb_put(b, tmp, n);
}

/* Record that the element [start, b->len) was just written. */
static void tb_elem(tbuf *b, size_t start, uint32_t field)
{
    if (b->len == start) {
        return;
    }
    assert_true(b->nel < MAX_ELEMS);
    b->el[b->nel].start = start;
    b->el[b->nel].len = b->len - start;
    b->el[b->nel].field = field;
    b->nel++;
}

/* Write "KSE", the version byte and the items; the result is an exact-size
 * heap block. */
static tbuf tb_build(uint8_t version, const item *it, size_t n)
{
    static const uint8_t magic[3] = {KS_MAGIC_0, KS_MAGIC_1, KS_MAGIC_2};
    tbuf b;
    memset(&b, 0, sizeof b);
    tb_put(&b, magic, 3);
    tb_elem(&b, 0, 0);
    tb_put(&b, &version, 1);
    tb_elem(&b, 3, 0);
    assert_true(n <= MAX_ITEMS);
    for (size_t i = 0; i < n; i++) {
        size_t start = b.len;
        b.tag_off[i] = start;
        if (it[i].raw != NULL) {
            tb_put(&b, it[i].raw, it[i].raw_len);
            tb_elem(&b, start, ANY_FIELD);
            b.val_off[i] = b.data_off[i] = b.end_off[i] = b.len;
            continue;
        }
        tb_varint(&b, (uint64_t)it[i].number << 3 | it[i].wire);
        tb_elem(&b, start, it[i].number);
        b.val_off[i] = b.len;
        tb_varint(&b, it[i].value);
        tb_elem(&b, b.val_off[i], it[i].number);
        b.data_off[i] = b.len;
        tb_put(&b, it[i].data, it[i].data_len);
        tb_elem(&b, b.data_off[i], it[i].number);
        b.end_off[i] = b.len;
    }
    b.nitems = n;
    if (b.len > 0) {
        uint8_t *q = realloc(b.p, b.len); /* exact size: ASan sees over-reads */
        assert_non_null(q);
        b.p = q;
        b.cap = b.len;
    }
    return b;
}

/* Build the canonical bytes of e. */
static tbuf tb_env(const ks_envelope *e)
{
    item it[MAX_ITEMS];
    size_t n = env_items(e, it);
    return tb_build(e->version, it, n);
}

/* Free a written input. */
static void tb_free(tbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* The index of the item holding field `number`, which must exist. */
static size_t item_index(const tbuf *b, const item *it, uint32_t number)
{
    for (size_t i = 0; i < b->nitems; i++) {
        if (it[i].raw == NULL && it[i].number == number) {
            return i;
        }
    }
    fail_msg("no item for field %u", (unsigned)number);
    return 0;
}

/* Where a parse of the first n bytes of b must fail: inside an element, at
 * its first byte; at an element boundary, at n.  *field is the field being
 * read there. */
static void trunc_expect(const tbuf *b, size_t n, size_t *off, uint32_t *field)
{
    for (size_t i = 0; i < b->nel; i++) {
        const elem *e = &b->el[i];
        if (e->start < n && n < e->start + e->len) {
            *off = e->start;
            *field = e->field;
            return;
        }
        if (e->start == n) {
            *off = n;
            *field = e->field;
            return;
        }
    }
    fail_msg("cut %zu is not inside the input", n);
}

/* ---- checking helpers ----------------------------------------------------- */

/* A heap copy of exactly p[0, n) (NULL when n is 0). */
static uint8_t *dup_exact(const uint8_t *p, size_t n)
{
    if (n == 0) {
        return NULL;
    }
    uint8_t *q = malloc(n);
    assert_non_null(q);
    memcpy(q, p, n);
    return q;
}

/* Print up to 48 bytes of p[0, n) in hex, for a failure message. */
static void dump_hex(const uint8_t *p, size_t n)
{
    char line[160];
    size_t k = 0;
    for (size_t i = 0; i < n && i < 48; i++) {
        k += (size_t)snprintf(line + k, sizeof line - k, "%02x", p[i]);
    }
    print_error("  input (%zu bytes): %s%s\n", n, line, n > 48 ? "..." : "");
}

/* Parse buf[0, len) (an exact heap block owned by the caller) and require
 * success; *out then holds views into buf. */
static void expect_ok_at(const uint8_t *buf, size_t len, const ks_limits *lim, ks_envelope *out,
                         const char *what, const char *file, int line)
{
    ks_parse_error err;
    memset(out, 0xA5, sizeof *out);
    memset(&err, 0, sizeof err);
    ks_err got = ks_envelope_parse(buf, len, lim, out, &err);
    if (got != KS_OK) {
        print_error("%s: want ok, got %s at %zu (field %u)\n", what, ks_err_name(got), err.offset,
                    (unsigned)err.field);
        dump_hex(buf, len);
        _fail(file, line);
    }
    if (!ks_test_views_inside(out, buf, len) || out->total_len != len ||
        out->header_len < KS_PREFIX_LEN || out->header_len >= len || out->ciphertext.ptr == NULL ||
        (size_t)(out->ciphertext.ptr - buf) + out->ciphertext.len != len) {
        print_error("%s: parsed, but a view is outside the input or total/header_len wrong "
                    "(total %zu, header %zu, len %zu)\n",
                    what, out->total_len, out->header_len, len);
        _fail(file, line);
    }
    ks_envelope again;
    if (ks_envelope_parse(buf, len, lim, &again, NULL) != KS_OK) {
        print_error("%s: parse with err == NULL failed\n", what);
        _fail(file, line);
    }
}
#define EXPECT_OK(buf, len, lim, out, what) expect_ok_at(buf, len, lim, out, what, __FILE__, __LINE__)

enum { FULL = 0, HEADER = 1 };

/* Parse an exact copy of buf[0, len) (whole, or header only) and require
 * rejection `code` at `off` for `field` (ANY_FIELD: not checked), with *out
 * cleared and *err filled. */
static void expect_reject_at(int mode, const uint8_t *buf, size_t len, const ks_limits *lim,
                             ks_err code, size_t off, uint32_t field, const char *what,
                             const char *file, int line)
{
    uint8_t *copy = dup_exact(buf, len);
    ks_envelope out;
    ks_parse_error err;
    memset(&out, 0xA5, sizeof out);
    memset(&err, 0xA5, sizeof err);
    ks_err got = mode == HEADER ? ks_envelope_parse_header(copy, len, lim, &out, &err)
                                : ks_envelope_parse(copy, len, lim, &out, &err);
    int bad = got != code || err.code != code || err.offset != off ||
              (field != ANY_FIELD && err.field != field);
    if (bad) {
        print_error("%s%s: want %s at %zu (field %d), got %s [err: %s at %zu, field %u]\n",
                    mode == HEADER ? "[header] " : "", what, ks_err_name(code), off,
                    field == ANY_FIELD ? -1 : (int)field, ks_err_name(got),
                    ks_err_name(err.code), err.offset, (unsigned)err.field);
        dump_hex(buf, len);
        free(copy);
        _fail(file, line);
    }
    if (memcmp(&out, &g_zero_env, sizeof out) != 0) {
        print_error("%s: rejected but *out not cleared\n", what);
        free(copy);
        _fail(file, line);
    }
    memset(&out, 0xA5, sizeof out);
    got = mode == HEADER ? ks_envelope_parse_header(copy, len, lim, &out, NULL)
                         : ks_envelope_parse(copy, len, lim, &out, NULL);
    free(copy);
    if (got != code || memcmp(&out, &g_zero_env, sizeof out) != 0) {
        print_error("%s: with err == NULL: got %s\n", what, ks_err_name(got));
        _fail(file, line);
    }
    note_hit(code);
}
#define EXPECT_REJECT(buf, len, lim, code, off, field, what) \
    expect_reject_at(FULL, buf, len, lim, code, off, field, what, __FILE__, __LINE__)
#define EXPECT_REJECT_HDR(buf, len, lim, code, off, field, what) \
    expect_reject_at(HEADER, buf, len, lim, code, off, field, what, __FILE__, __LINE__)

/*
 * Parsing an envelope shaped like a known one (parser/envelope_head.h)
 * must give exactly the whole parse's result on the same input and
 * limits: the same code, the same error (offset, field), and either the
 * same envelope, every view in the same place, or a cleared *out; and
 * *like must be 1 exactly when it succeeded on an input shaped like h
 * (ks_envelope_like()).  h is the shape of the envelope hdr, parsed under
 * lim.  Returns *like.
 */
static int expect_like_same_at(const uint8_t *buf, size_t len, const ks_limits *lim, const ks_envelope_head *h,
                               const uint8_t *hdr, const char *what, const char *file, int line)
{
    ks_envelope a, b;
    ks_parse_error ea, eb;
    int like = 7;
    memset(&a, 0xA5, sizeof a);
    memset(&b, 0x5A, sizeof b);
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0xA5, sizeof eb);
    const ks_err ga = ks_envelope_parse(buf, len, lim, &a, &ea);
    const ks_err gb = ks_envelope_parse_like(buf, len, lim, h, hdr, &b, &eb, &like);
    int bad = ga != gb || like != (gb == KS_OK && ks_envelope_like(buf, len, h, hdr));
    if (!bad && ga == KS_OK) {
        bad = !ks_test_result_eq(&a, &b);
    } else if (!bad) {
        bad = eb.code != ea.code || eb.offset != ea.offset || eb.field != ea.field ||
              memcmp(&b, &g_zero_env, sizeof b) != 0;
    }
    if (bad) {
        print_error("%s: whole parse %s at %zu (field %u), like a %zu-byte header %s at %zu (field %u), like %d\n",
                    what, ks_err_name(ga), ea.offset, (unsigned)ea.field, h->header_len, ks_err_name(gb),
                    eb.offset, (unsigned)eb.field, like);
        dump_hex(buf, len);
        _fail(file, line);
    }
    memset(&b, 0x5A, sizeof b);
    if (ks_envelope_parse_like(buf, len, lim, h, hdr, &b, NULL, NULL) != gb) {
        print_error("%s: parsed like with err and like NULL: another result\n", what);
        _fail(file, line);
    }
    return like;
}
#define EXPECT_LIKE_SAME(buf, len, lim, h, hdr, what) \
    expect_like_same_at(buf, len, lim, h, hdr, what, __FILE__, __LINE__)

/*
 * The encoder must agree with the parser: ks_envelope_check,
 * ks_envelope_encoded_len and ks_envelope_encode of e under lim all give
 * `code`; on error encode writes nothing; on success the bytes are `want`.
 */
static void expect_encoder_at(const ks_envelope *e, const ks_limits *lim, ks_err code,
                              const uint8_t *want, size_t want_len, const char *what,
                              const char *file, int line)
{
    size_t n = 12345;
    ks_err c1 = ks_envelope_check(e, lim);
    ks_err c2 = ks_envelope_encoded_len(e, lim, &n);
    size_t cap = (code == KS_OK ? want_len : 0) + 64;
    uint8_t *out = malloc(cap);
    assert_non_null(out);
    memset(out, 0xCC, cap);
    size_t out_len = 777;
    ks_err c3 = ks_envelope_encode(e, lim, out, cap, &out_len);
    int bad = c1 != code || c2 != code || c3 != code;
    if (!bad && code == KS_OK) {
        bad = n != want_len || out_len != want_len || memcmp(out, want, want_len) != 0;
        for (size_t i = want_len; i < cap; i++) {
            bad |= out[i] != 0xCC;
        }
    } else if (!bad) {
        for (size_t i = 0; i < cap; i++) {
            bad |= out[i] != 0xCC;
        }
    }
    free(out);
    if (bad) {
        print_error("%s: encoder: want %s; check %s, encoded_len %s (%zu, want %zu), encode %s "
                    "(%zu), or wrong bytes / bytes written on error\n",
                    what, ks_err_name(code), ks_err_name(c1), ks_err_name(c2), n, want_len,
                    ks_err_name(c3), out_len);
        _fail(file, line);
    }
}
#define EXPECT_ENCODER(e, lim, code, want, want_len, what) \
    expect_encoder_at(e, lim, code, want, want_len, what, __FILE__, __LINE__)

/* A valid envelope e must parse from its canonical bytes to equal values
 * with views at the written positions, and encode back to the same bytes. */
static void expect_valid_at(const ks_envelope *e, const ks_limits *lim, const char *what,
                            const char *file, int line)
{
    item it[MAX_ITEMS];
    size_t n = env_items(e, it);
    tbuf b = tb_build(e->version, it, n);
    ks_envelope got;
    expect_ok_at(b.p, b.len, lim, &got, what, file, line);
    const size_t ct = item_index(&b, it, 15);
    int bad = !ks_test_fields_eq(&got, e) || got.header_len != b.tag_off[ct] ||
              got.tenant.ptr != b.p + b.data_off[1] || got.key_id.ptr != b.p + b.data_off[2] ||
              got.wrapped_dek.ptr != b.p + b.data_off[4] || got.nonce.ptr != b.p + b.data_off[5] ||
              got.ciphertext.ptr != b.p + b.data_off[ct];
    if (!bad && e->version == KS_FORMAT_V2) {
        bad = got.purpose.ptr != b.p + b.data_off[6] || got.commitment.ptr != b.p + b.data_off[7];
    }
    if (bad) {
        print_error("%s: parsed values or view positions differ from what was written\n", what);
        tb_free(&b);
        _fail(file, line);
    }
    expect_encoder_at(e, lim, KS_OK, b.p, b.len, what, file, line);
    /* parse -> encode reproduces the input */
    expect_encoder_at(&got, lim, KS_OK, b.p, b.len, what, file, line);
    tb_free(&b);
}
#define EXPECT_VALID(e, lim, what) expect_valid_at(e, lim, what, __FILE__, __LINE__)

/* ---- error names, algorithms ------------------------------------------------ */

/* ks_err_name gives the stable name of every code and "unknown-error"
 * otherwise; ks_err_is_rejection is true exactly for 1..11. */
static void test_err_names(void **state)
{
    static const struct {
        ks_err code;
        const char *name;
    } names[] = {
        {KS_OK, "ok"},
        {KS_ERR_TRUNCATED, "truncated"},
        {KS_ERR_BAD_MAGIC, "bad-magic"},
        {KS_ERR_UNSUPPORTED_VERSION, "unsupported-version"},
        {KS_ERR_WIRE_TYPE, "wire-type"},
        {KS_ERR_NONCANONICAL_VARINT, "noncanonical-varint"},
        {KS_ERR_VARINT_OVERFLOW, "varint-overflow"},
        {KS_ERR_FIELD_ORDER, "field-order"},
        {KS_ERR_UNKNOWN_FIELD, "unknown-field"},
        {KS_ERR_MISSING_FIELD, "missing-field"},
        {KS_ERR_TOO_LARGE, "too-large"},
        {KS_ERR_BAD_VALUE, "bad-value"},
        {KS_ERR_INVALID_ARGUMENT, "invalid-argument"},
        {KS_ERR_BUFFER_TOO_SMALL, "buffer-too-small"},
        {KS_ERR_AUTH_FAILED, "auth-failed"},
        {KS_ERR_ALGORITHM_UNAVAILABLE, "algorithm-unavailable"},
        {KS_ERR_NO_MEMORY, "no-memory"},
        {KS_ERR_CRYPTO_INIT, "crypto-init"},
        {KS_ERR_UNAVAILABLE, "unavailable"},
        {KS_ERR_TIMEOUT, "timeout"},
        {KS_ERR_DENIED, "denied"},
        {KS_ERR_REVOKED, "revoked"},
        {KS_ERR_NOT_FOUND, "not-found"},
        {KS_ERR_INTEGRITY, "integrity"},
        {KS_ERR_INSECURE, "insecure"},
        {KS_ERR_IO, "io"},
        {KS_ERR_BAD_PASSPHRASE, "bad-passphrase"},
        {KS_ERR_EXISTS, "exists"},
        {KS_ERR_STATE, "state"},
        {KS_ERR_NO_TARGET, "no-target"},
        {KS_ERR_BUSY, "busy"},
        {KS_ERR_FULL, "full"},
        {KS_ERR_STORE, "store"},
        {KS_ERR_MISMATCH, "mismatch"},
        {KS_ERR_THRESHOLD, "threshold"},
        {KS_ERR_VERIFY_FAILED, "verify-failed"},
        {KS_ERR_STOPPED, "stopped"},
        {KS_ERR_UNSTABLE_ID, "unstable-id"},
        {KS_ERR_GUARD, "guard"},
        {KS_ERR_NO_ROLLOUT, "no-rollout"},
        {KS_ERR_ROLLOUT_EXISTS, "rollout-exists"},
        {KS_ERR_STALE, "stale"},
        {KS_ERR_PHASE, "phase"},
        {KS_ERR_CONFLICT, "conflict"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_string_equal(ks_err_name(names[i].code), names[i].name);
        assert_int_equal(ks_err_is_rejection(names[i].code) != 0,
                         names[i].code >= 1 && names[i].code <= 11);
        assert_int_equal(ks_err_is_retryable(names[i].code) != 0,
                         names[i].code == KS_ERR_UNAVAILABLE || names[i].code == KS_ERR_TIMEOUT);
    }
    static const int undefined[] = {12, 13, 20, 31, 34, 35, 63, 68, 95, 102, 127, 133, 159, 169, 191, 197, 223, 225, 255, 65536};
    for (size_t i = 0; i < sizeof undefined / sizeof undefined[0]; i++) {
        assert_string_equal(ks_err_name((ks_err)undefined[i]), "unknown-error");
    }
    assert_int_equal(KS_OK, 0);
    assert_int_equal(KS_ERR_BAD_VALUE, 11);
    assert_int_equal(KS_ERR_INVALID_ARGUMENT, 32);
    assert_int_equal(KS_ERR_BUFFER_TOO_SMALL, 33);
}

/* ks_alg_name, ks_alg_from_name and ks_alg_nonce_len agree with the field
 * table and reject everything else. */
static void test_algorithms(void **state)
{
    (void)state;
    assert_string_equal(ks_alg_name(1), "aes-256-gcm");
    assert_string_equal(ks_alg_name(2), "xchacha20-poly1305");
    assert_null(ks_alg_name(0));
    assert_null(ks_alg_name(3));
    assert_null(ks_alg_name(UINT32_MAX));
    assert_int_equal(ks_alg_from_name("aes-256-gcm"), KS_ALG_AES256GCM);
    assert_int_equal(ks_alg_from_name("xchacha20-poly1305"), KS_ALG_XCHACHA20POLY1305);
    assert_int_equal(ks_alg_from_name(NULL), 0);
    assert_int_equal(ks_alg_from_name(""), 0);
    assert_int_equal(ks_alg_from_name("AES-256-GCM"), 0);
    assert_int_equal(ks_alg_from_name("aes-256-gcm "), 0);
    assert_int_equal(ks_alg_from_name("aes-256"), 0);
    assert_int_equal(ks_alg_from_name("chacha20-poly1305"), 0);
    assert_int_equal(ks_alg_nonce_len(1), 12);
    assert_int_equal(ks_alg_nonce_len(2), 24);
    assert_int_equal(ks_alg_nonce_len(0), 0);
    assert_int_equal(ks_alg_nonce_len(3), 0);
    assert_int_equal(ks_alg_nonce_len(UINT32_MAX), 0);
    assert_int_equal(KS_TAG_LEN, 16);
    assert_int_equal(KS_COMMITMENT_LEN, 32);
}

/* ---- argument handling, limits -------------------------------------------- */

/* NULL out, NULL buffer with a length, empty input, NULL err. */
static void test_parse_arguments(void **state)
{
    (void)state;
    ks_envelope e = base_env(1, 1);
    tbuf b = tb_env(&e);
    ks_parse_error err;
    ks_envelope out;

    assert_int_equal(ks_envelope_parse(b.p, b.len, NULL, NULL, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_parse_header(b.p, b.len, NULL, NULL, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_parse(b.p, b.len, NULL, NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    /* Even with no output struct, a given err is filled. */
    memset(&err, 0xA5, sizeof err);
    assert_int_equal(ks_envelope_parse(b.p, b.len, NULL, NULL, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(err.code, KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(err.offset, 0);
    assert_int_equal(err.field, 0);

    for (int mode = FULL; mode <= HEADER; mode++) {
        memset(&out, 0xA5, sizeof out);
        memset(&err, 0xA5, sizeof err);
        ks_err got = mode == HEADER ? ks_envelope_parse_header(NULL, 5, NULL, &out, &err)
                                    : ks_envelope_parse(NULL, 5, NULL, &out, &err);
        assert_int_equal(got, KS_ERR_INVALID_ARGUMENT);
        assert_int_equal(err.code, KS_ERR_INVALID_ARGUMENT);
        assert_int_equal(err.offset, 0);
        assert_int_equal(err.field, 0);
        assert_memory_equal(&out, &g_zero_env, sizeof out);
    }
    /* An empty input is a truncated envelope, not an argument error. */
    EXPECT_REJECT(NULL, 0, NULL, KS_ERR_TRUNCATED, 0, 0, "empty input, NULL buffer");
    EXPECT_REJECT_HDR(NULL, 0, NULL, KS_ERR_TRUNCATED, 0, 0, "empty input, NULL buffer");
    EXPECT_REJECT(b.p, 0, NULL, KS_ERR_TRUNCATED, 0, 0, "empty input");

    /* err may be NULL on success. */
    assert_int_equal(ks_envelope_parse(b.p, b.len, NULL, &out, NULL), KS_OK);
    assert_int_equal(ks_envelope_parse_header(b.p, b.len, NULL, &out, NULL), KS_OK);
    tb_free(&b);
}

/* The limits of each member at, below and above its range. */
static void test_limits_check(void **state)
{
    (void)state;
    ks_limits d, l;
    ks_limits_default(&d);
    assert_int_equal(d.max_tenant, 64);
    assert_int_equal(d.max_key_id, 256);
    assert_int_equal(d.max_wrapped_dek, 1024);
    assert_int_equal(d.max_purpose, 64);
    assert_int_equal(d.max_ciphertext, (1u << 20) + 16);
    assert_int_equal(KS_CIPHERTEXT_HARD_MAX, (16u << 20) + 16);
    assert_int_equal(ks_limits_check(&d), KS_OK);
    assert_int_equal(ks_limits_check(NULL), KS_ERR_INVALID_ARGUMENT);

    /* every member in turn: {min, cap} valid, {min-1, cap+1, SIZE_MAX} invalid */
    static const size_t mins[5] = {1, 1, 1, 1, 16};
    static const size_t caps[5] = {64, 256, 1024, 64, (16u << 20) + 16};
    for (int m = 0; m < 5; m++) {
        const size_t good[2] = {mins[m], caps[m]};
        const size_t bad[3] = {mins[m] - 1, caps[m] + 1, SIZE_MAX};
        for (int k = 0; k < 5; k++) {
            l = d;
            size_t *member[5] = {&l.max_tenant, &l.max_key_id, &l.max_wrapped_dek, &l.max_purpose,
                                 &l.max_ciphertext};
            if (k < 2) {
                *member[m] = good[k];
                assert_int_equal(ks_limits_check(&l), KS_OK);
                assert_int_not_equal(ks_envelope_max_len(&l), 0);
                continue;
            }
            *member[m] = bad[k - 2];
            assert_int_equal(ks_limits_check(&l), KS_ERR_INVALID_ARGUMENT);
            assert_int_equal(ks_envelope_max_len(&l), 0);

            /* Every call refuses such limits before looking at the input. */
            ks_envelope e = base_env(2, 2);
            tbuf b = tb_env(&e);
            ks_envelope out;
            ks_parse_error err;
            memset(&out, 0xA5, sizeof out);
            assert_int_equal(ks_envelope_parse(b.p, b.len, &l, &out, &err), KS_ERR_INVALID_ARGUMENT);
            assert_int_equal(err.code, KS_ERR_INVALID_ARGUMENT);
            assert_int_equal(err.offset, 0);
            assert_memory_equal(&out, &g_zero_env, sizeof out);
            memset(&out, 0xA5, sizeof out);
            assert_int_equal(ks_envelope_parse_header(b.p, b.len, &l, &out, &err),
                             KS_ERR_INVALID_ARGUMENT);
            assert_memory_equal(&out, &g_zero_env, sizeof out);
            /* ... including an input that is not an envelope at all */
            assert_int_equal(ks_envelope_parse((const uint8_t *)"xyz", 3, &l, &out, &err),
                             KS_ERR_INVALID_ARGUMENT);
            EXPECT_ENCODER(&e, &l, KS_ERR_INVALID_ARGUMENT, NULL, 0, "bad limits");
            tb_free(&b);
        }
    }
}

/* ks_envelope_max_len is exactly the length of a v2 xchacha envelope with
 * every field at its limit and a 5-byte key version. */
static void test_max_len(void **state)
{
    (void)state;
    ks_limits lims[5];
    ks_limits_default(&lims[0]);
    lims[1] = lims[0];
    lims[1].max_ciphertext = KS_CIPHERTEXT_HARD_MAX;
    lims[2] = (ks_limits){8, 10, 4, 3, 16};
    lims[3] = (ks_limits){1, 1, 1, 1, 16};
    lims[4] = (ks_limits){64, 256, 1024, 64, 16383}; /* 2-byte ciphertext length */
    assert_int_equal(ks_envelope_max_len(NULL), ks_envelope_max_len(&lims[0]));
    for (size_t i = 0; i < 5; i++) {
        const ks_limits *l = &lims[i];
        shape s = {"max", 2, 2, l->max_tenant, l->max_key_id, UINT32_MAX, l->max_wrapped_dek,
                   l->max_purpose, l->max_ciphertext};
        ks_envelope e = make_env(&s);
        size_t n = 0;
        assert_int_equal(ks_envelope_encoded_len(&e, l, &n), KS_OK);
        assert_int_equal(n, ks_envelope_max_len(l));
        tbuf b = tb_env(&e);
        assert_int_equal(b.len, ks_envelope_max_len(l));
        EXPECT_VALID(&e, l, "every field at its limit");
        /* nothing valid is longer: the v1 and aes variants are shorter */
        s.alg = 1;
        e = make_env(&s);
        assert_int_equal(ks_envelope_encoded_len(&e, l, &n), KS_OK);
        assert_true(n < ks_envelope_max_len(l));
        tb_free(&b);
    }
    /* the defaults: 1 MiB + 16 of ciphertext with a 3-byte length */
    assert_int_equal(ks_envelope_max_len(NULL), 4 + 2 + 66 + 259 + 6 + 1027 + 26 + 66 + 34 +
                                                    1 + 3 + KS_CIPHERTEXT_DEFAULT_MAX);
}

/* ---- valid envelopes --------------------------------------------------------- */

/* Every shape parses to its values with zero-copy views and round-trips. */
static void test_valid_shapes(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_SHAPES; i++) {
        ks_envelope e = make_env(&g_shapes[i]);
        EXPECT_VALID(&e, NULL, g_shapes[i].label);
    }
    /* the 5-byte key version 2^32-1 is written ff ff ff ff 0f */
    ks_envelope e = make_env(&g_shapes[3]);
    tbuf b = tb_env(&e);
    static const uint8_t kv[6] = {0x20, 0xff, 0xff, 0xff, 0xff, 0x0f};
    assert_memory_equal(b.p + b.tag_off[3], kv, sizeof kv);
    ks_envelope out;
    EXPECT_OK(b.p, b.len, NULL, &out, "kv 2^32-1");
    assert_int_equal(out.key_version, UINT32_MAX);
    tb_free(&b);
    /* the 5-byte value 2^28 */
    e = base_env(1, 1);
    e.key_version = 1u << 28;
    EXPECT_VALID(&e, NULL, "key_version 2^28");
    /* v1 results have purpose and commitment absent */
    e = base_env(1, 2);
    b = tb_env(&e);
    EXPECT_OK(b.p, b.len, NULL, &out, "v1");
    assert_null(out.purpose.ptr);
    assert_int_equal(out.purpose.len, 0);
    assert_null(out.commitment.ptr);
    assert_int_equal(out.commitment.len, 0);
    assert_int_equal(out.version, 1);
    tb_free(&b);
}

/* Every view points inside the input; header_len is the ciphertext tag's
 * offset; the input is not modified. */
static void test_zero_copy(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_SHAPES; i++) {
        ks_envelope e = make_env(&g_shapes[i]);
        item it[MAX_ITEMS];
        size_t n = env_items(&e, it);
        tbuf b = tb_build(e.version, it, n);
        uint8_t *before = dup_exact(b.p, b.len);
        ks_envelope out;
        EXPECT_OK(b.p, b.len, NULL, &out, g_shapes[i].label);
        assert_true(ks_test_views_inside(&out, b.p, b.len));
        assert_int_equal(out.header_len, b.tag_off[n - 1]);
        assert_int_equal(b.p[out.header_len], 0x7a);
        assert_ptr_equal(out.ciphertext.ptr, b.p + b.data_off[n - 1]);
        assert_ptr_equal(out.tenant.ptr, b.p + b.data_off[1]);
        assert_ptr_equal(out.key_id.ptr, b.p + b.data_off[2]);
        assert_ptr_equal(out.wrapped_dek.ptr, b.p + b.data_off[4]);
        assert_ptr_equal(out.nonce.ptr, b.p + b.data_off[5]);
        if (e.version == 2) {
            assert_ptr_equal(out.purpose.ptr, b.p + b.data_off[6]);
            assert_ptr_equal(out.commitment.ptr, b.p + b.data_off[7]);
        }
        assert_memory_equal(before, b.p, b.len);
        free(before);
        tb_free(&b);
    }
}

/* ---- truncation -------------------------------------------------------------- */

/* Every proper prefix of every valid shape is rejected as truncated at the
 * start of the element it cuts (or at its end, on a boundary); a header
 * parse accepts exactly the prefixes that hold the ciphertext length. */
static void test_truncation_every_byte(void **state)
{
    (void)state;
    char what[128];
    for (size_t i = 0; i < N_SHAPES; i++) {
        ks_envelope e = make_env(&g_shapes[i]);
        tbuf b = tb_env(&e);
        const size_t hdr_end = b.data_off[b.nitems - 1]; /* first ciphertext byte */
        for (size_t n = 0; n < b.len; n++) {
            size_t off;
            uint32_t field;
            trunc_expect(&b, n, &off, &field);
            snprintf(what, sizeof what, "%s cut at %zu of %zu", g_shapes[i].label, n, b.len);
            EXPECT_REJECT(b.p, n, NULL, KS_ERR_TRUNCATED, off, field, what);
            if (n < hdr_end) {
                EXPECT_REJECT_HDR(b.p, n, NULL, KS_ERR_TRUNCATED, off, field, what);
            } else {
                uint8_t *copy = dup_exact(b.p, n);
                ks_envelope out;
                assert_int_equal(ks_envelope_parse_header(copy, n, NULL, &out, NULL), KS_OK);
                assert_null(out.ciphertext.ptr);
                assert_int_equal(out.ciphertext.len, 0);
                assert_int_equal(out.total_len, b.len);
                free(copy);
            }
        }
        tb_free(&b);
    }
}

/* ---- framing ----------------------------------------------------------------- */

/* Bad magic at each position, short inputs, unsupported versions, and a
 * body under the other version's label. */
static void test_prefix(void **state)
{
    (void)state;
    ks_envelope e = base_env(1, 1);
    tbuf b = tb_env(&e);
    for (size_t pos = 0; pos < 3; pos++) {
        uint8_t *c = dup_exact(b.p, b.len);
        c[pos] ^= 0x20; /* 'k', 's', 'e' */
        EXPECT_REJECT(c, b.len, NULL, KS_ERR_BAD_MAGIC, pos, 0, "bad magic");
        EXPECT_REJECT_HDR(c, b.len, NULL, KS_ERR_BAD_MAGIC, pos, 0, "bad magic");
        EXPECT_REJECT(c, pos + 1, NULL, KS_ERR_BAD_MAGIC, pos, 0, "short bad magic");
        free(c);
    }
    EXPECT_REJECT((const uint8_t *)"KX", 2, NULL, KS_ERR_BAD_MAGIC, 1, 0, "KX");
    EXPECT_REJECT((const uint8_t *)"\x00", 1, NULL, KS_ERR_BAD_MAGIC, 0, 0, "NUL");
    EXPECT_REJECT((const uint8_t *)"KS", 2, NULL, KS_ERR_TRUNCATED, 0, 0, "KS");
    EXPECT_REJECT((const uint8_t *)"KSE", 3, NULL, KS_ERR_TRUNCATED, 3, 0, "KSE");
    EXPECT_REJECT((const uint8_t *)"KSE\x01", 4, NULL, KS_ERR_TRUNCATED, 4, 1, "prefix only");
    EXPECT_REJECT((const uint8_t *)"KSE\x02", 4, NULL, KS_ERR_TRUNCATED, 4, 1, "prefix only v2");
    static const uint8_t versions[] = {0, 3, 4, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < sizeof versions; i++) {
        uint8_t *c = dup_exact(b.p, b.len);
        c[3] = versions[i];
        EXPECT_REJECT(c, b.len, NULL, KS_ERR_UNSUPPORTED_VERSION, 3, 0, "version");
        EXPECT_REJECT(c, 4, NULL, KS_ERR_UNSUPPORTED_VERSION, 3, 0, "version, prefix only");
        EXPECT_REJECT_HDR(c, b.len, NULL, KS_ERR_UNSUPPORTED_VERSION, 3, 0, "version");
        free(c);
    }
    /* a v1 body labelled v2 lacks purpose; a v2 body labelled v1 has one */
    uint8_t *c = dup_exact(b.p, b.len);
    c[3] = 2;
    EXPECT_REJECT(c, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[6], 7, "v1 body as v2");
    free(c);
    tb_free(&b);
    e = base_env(2, 1);
    b = tb_env(&e);
    c = dup_exact(b.p, b.len);
    c[3] = 1;
    EXPECT_REJECT(c, b.len, NULL, KS_ERR_UNKNOWN_FIELD, b.tag_off[6], 7, "v2 body as v1");
    free(c);
    tb_free(&b);
}

/* ---- limits ---------------------------------------------------------------- */

/* Set the length of the field `number` of e to n, with valid content. */
static void set_len(ks_envelope *e, uint32_t number, size_t n)
{
    switch (number) {
    case 2: e->tenant = view(g_names, n); break;
    case 3: e->key_id = view(g_key_ids, n); break;
    case 5: e->wrapped_dek = view(g_pool + POOL_WRAPPED, n); break;
    case 6: e->nonce = view(g_pool + POOL_NONCE, n); break;
    case 7: e->purpose = view(g_names + 3, n); break;
    case 8: e->commitment = view(g_pool + POOL_COMMIT, n); break;
    case 15: e->ciphertext = view(g_pool + POOL_CT, n); break;
    default: fail_msg("set_len: field %u", (unsigned)number);
    }
}

/* The item index of field `number` in a canonical v2 envelope. */
static size_t v2_index(uint32_t number)
{
    return number == 15 ? 8 : number - 1;
}

/*
 * Field `number` of a v2 envelope at length ok_len must be accepted and at
 * bad_len rejected with `code` at the field's length varint, by the parser
 * (whole and header-only) and by the encoder alike.
 */
static void expect_len_rule_at(const ks_limits *lim, uint32_t alg, uint32_t number, size_t ok_len,
                               size_t bad_len, ks_err code, const char *what, const char *file,
                               int line)
{
    ks_envelope e = base_env(2, alg);
    if (ok_len != SIZE_MAX) {
        set_len(&e, number, ok_len);
        expect_valid_at(&e, lim, what, file, line);
    }
    set_len(&e, number, bad_len);
    tbuf b = tb_env(&e);
    const size_t i = v2_index(number);
    expect_reject_at(FULL, b.p, b.len, lim, code, b.val_off[i], number, what, file, line);
    expect_reject_at(HEADER, b.p, b.len, lim, code, b.val_off[i], number, what, file, line);
    expect_encoder_at(&e, lim, code, NULL, 0, what, file, line);
    tb_free(&b);
}
#define EXPECT_LEN_RULE(lim, alg, number, ok_len, bad_len, code, what) \
    expect_len_rule_at(lim, alg, number, ok_len, bad_len, code, what, __FILE__, __LINE__)

/* Each length limit at max (accepted) and max+1 (too-large). */
static void test_limits_default(void **state)
{
    (void)state;
    EXPECT_LEN_RULE(NULL, 1, 2, 64, 65, KS_ERR_TOO_LARGE, "tenant 64/65");
    EXPECT_LEN_RULE(NULL, 1, 3, 256, 257, KS_ERR_TOO_LARGE, "key_id 256/257");
    EXPECT_LEN_RULE(NULL, 1, 5, 1024, 1025, KS_ERR_TOO_LARGE, "wrapped_dek 1024/1025");
    EXPECT_LEN_RULE(NULL, 1, 7, 64, 65, KS_ERR_TOO_LARGE, "purpose 64/65");
    EXPECT_LEN_RULE(NULL, 2, 15, KS_CIPHERTEXT_DEFAULT_MAX, KS_CIPHERTEXT_DEFAULT_MAX + 1,
                    KS_ERR_TOO_LARGE, "ciphertext 1MiB+16/+17");
    /* the hard cap is too large for the defaults */
    EXPECT_LEN_RULE(NULL, 2, 15, SIZE_MAX, KS_CIPHERTEXT_HARD_MAX, KS_ERR_TOO_LARGE,
                    "ciphertext hard cap under defaults");
    /* v1 too */
    ks_envelope e = base_env(1, 1);
    e.tenant = view(g_names, 65);
    tbuf b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_TOO_LARGE, b.val_off[1], 2, "v1 tenant 65");
    tb_free(&b);
    /* a length far above the limit and above the input (including one that
     * fits only in 32 bits) is too-large, at the length */
    static const uint8_t big_tenant[] = {'K', 'S', 'E', 1, 0x08, 0x01, 0x12, 0xff, 0xff, 0xff, 0xff, 0x0f};
    EXPECT_REJECT(big_tenant, sizeof big_tenant, NULL, KS_ERR_TOO_LARGE, 7, 2, "tenant len 2^32-1");
}

/* The hard cap is accepted with raised limits, the cap + 1 never. */
static void test_limits_hard_cap(void **state)
{
    (void)state;
    ks_limits raised;
    ks_limits_default(&raised);
    raised.max_ciphertext = KS_CIPHERTEXT_HARD_MAX;
    EXPECT_LEN_RULE(&raised, 1, 15, KS_CIPHERTEXT_HARD_MAX, KS_CIPHERTEXT_HARD_MAX + 1,
                    KS_ERR_TOO_LARGE, "ciphertext 16MiB+16/+17, raised");
    /* limits above the cap are refused outright */
    raised.max_ciphertext = KS_CIPHERTEXT_HARD_MAX + 1;
    assert_int_equal(ks_limits_check(&raised), KS_ERR_INVALID_ARGUMENT);
    ks_envelope e = base_env(1, 1);
    tbuf b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, &raised, KS_ERR_INVALID_ARGUMENT, 0, 0, "limits above cap");
    tb_free(&b);
}

/* Lowered limits move each boundary; minimal limits accept minimal fields. */
static void test_limits_lowered(void **state)
{
    (void)state;
    ks_limits l;
    ks_limits_default(&l);
    l.max_tenant = 8;
    EXPECT_LEN_RULE(&l, 1, 2, 8, 9, KS_ERR_TOO_LARGE, "max_tenant 8");
    ks_limits_default(&l);
    l.max_key_id = 10;
    EXPECT_LEN_RULE(&l, 1, 3, 10, 11, KS_ERR_TOO_LARGE, "max_key_id 10");
    ks_limits_default(&l);
    l.max_wrapped_dek = 4;
    EXPECT_LEN_RULE(&l, 2, 5, 4, 5, KS_ERR_TOO_LARGE, "max_wrapped_dek 4");
    ks_limits_default(&l);
    l.max_purpose = 3;
    EXPECT_LEN_RULE(&l, 2, 7, 3, 4, KS_ERR_TOO_LARGE, "max_purpose 3");
    ks_limits_default(&l);
    l.max_ciphertext = 16;
    EXPECT_LEN_RULE(&l, 1, 15, 16, 17, KS_ERR_TOO_LARGE, "max_ciphertext 16");
    ks_limits_default(&l);
    l.max_ciphertext = 1000;
    EXPECT_LEN_RULE(&l, 1, 15, 1000, 1001, KS_ERR_TOO_LARGE, "max_ciphertext 1000");

    l = (ks_limits){1, 1, 1, 1, 16};
    ks_envelope e = base_env(2, 1);
    set_len(&e, 2, 1);
    set_len(&e, 3, 1);
    set_len(&e, 5, 1);
    set_len(&e, 7, 1);
    set_len(&e, 15, 16);
    EXPECT_VALID(&e, &l, "minimal limits, minimal fields");
    /* the default-valid base is too large under them: tenant first */
    e = base_env(2, 1);
    tbuf b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, &l, KS_ERR_TOO_LARGE, b.val_off[1], 2, "minimal limits");
    EXPECT_ENCODER(&e, &l, KS_ERR_TOO_LARGE, NULL, 0, "minimal limits");
    tb_free(&b);
}

/* ---- varints ---------------------------------------------------------------- */

/* Replace item i of the canonical items of e with raw bytes and require
 * rejection `code` at b.tag_off[i] + rel (field `field`). */
static void expect_raw_at(const ks_envelope *e, size_t i, const uint8_t *raw, size_t raw_len,
                          ks_err code, size_t rel, uint32_t field, const char *what,
                          const char *file, int line)
{
    item it[MAX_ITEMS];
    size_t n = env_items(e, it);
    it[i] = rawi(raw, raw_len);
    tbuf b = tb_build(e->version, it, n);
    expect_reject_at(FULL, b.p, b.len, NULL, code, b.tag_off[i] + rel, field, what, file, line);
    tb_free(&b);
}
#define EXPECT_RAW(e, i, code, rel, field, what, ...)                                           \
    do {                                                                                        \
        static const uint8_t raw_[] = {__VA_ARGS__};                                            \
        expect_raw_at(e, i, raw_, sizeof raw_, code, rel, field, what, __FILE__, __LINE__);     \
    } while (0)

/* Replace item i with raw bytes and require acceptance. */
static void expect_raw_ok_at(const ks_envelope *e, size_t i, const uint8_t *raw, size_t raw_len,
                             const char *what, const char *file, int line)
{
    item it[MAX_ITEMS];
    size_t n = env_items(e, it);
    it[i] = rawi(raw, raw_len);
    tbuf b = tb_build(e->version, it, n);
    ks_envelope out;
    expect_ok_at(b.p, b.len, NULL, &out, what, file, line);
    tb_free(&b);
}
#define EXPECT_RAW_OK(e, i, what, ...)                                                          \
    do {                                                                                        \
        static const uint8_t raw_[] = {__VA_ARGS__};                                            \
        expect_raw_ok_at(e, i, raw_, sizeof raw_, what, __FILE__, __LINE__);                    \
    } while (0)

/* Non-minimal varints in tags, values and lengths. */
static void test_varint_noncanonical(void **state)
{
    (void)state;
    const ks_envelope e = base_env(1, 1); /* tenant 6, key_version 3 */
    const ks_envelope e2 = base_env(2, 2);
    const ks_err NC = KS_ERR_NONCANONICAL_VARINT;
    /* tags */
    EXPECT_RAW(&e, 0, NC, 0, 0, "alg tag 88 00", 0x88, 0x00, 0x01);
    EXPECT_RAW(&e, 1, NC, 0, 0, "tenant tag 92 00", 0x92, 0x80, 0x00, 0x06, 'a', 'b', 'c', 'd', 'e', 'f');
    EXPECT_RAW(&e, 6, NC, 0, 0, "ciphertext tag fa 00", 0xfa, 0x00, 0x10);
    /* values */
    EXPECT_RAW(&e, 0, NC, 1, 1, "algorithm 81 00", 0x08, 0x81, 0x00);
    EXPECT_RAW(&e, 0, NC, 1, 1, "algorithm 82 80 00", 0x08, 0x82, 0x80, 0x00);
    EXPECT_RAW(&e, 3, NC, 1, 4, "key_version 83 00", 0x20, 0x83, 0x00);
    EXPECT_RAW(&e, 3, NC, 1, 4, "key_version 83 80 80 80 00", 0x20, 0x83, 0x80, 0x80, 0x80, 0x00);
    EXPECT_RAW(&e, 3, NC, 1, 4, "key_version 0 as 80 00", 0x20, 0x80, 0x00);
    /* lengths */
    EXPECT_RAW(&e, 1, NC, 1, 2, "tenant len 86 00", 0x12, 0x86, 0x00, 'a', 'b', 'c', 'd', 'e', 'f');
    EXPECT_RAW(&e, 5, NC, 1, 6, "nonce len 8c 80 00", 0x32, 0x8c, 0x80, 0x00);
    EXPECT_RAW(&e2, 7, NC, 1, 8, "commitment len a0 00", 0x42, 0xa0, 0x00);
    EXPECT_RAW(&e, 6, NC, 1, 15, "ciphertext len 90 00", 0x7a, 0x90, 0x00);
    /* minimal multi-byte values are fine */
    EXPECT_RAW_OK(&e, 3, "key_version 128", 0x20, 0x80, 0x01);
    EXPECT_RAW_OK(&e, 3, "key_version 2^32-1", 0x20, 0xff, 0xff, 0xff, 0xff, 0x0f);
    EXPECT_RAW_OK(&e, 3, "key_version 2^28", 0x20, 0x80, 0x80, 0x80, 0x80, 0x01);
}

/* Varints beyond 32 bits, six-byte varints and truncated varints. */
static void test_varint_overflow_truncated(void **state)
{
    (void)state;
    const ks_envelope e = base_env(1, 1);
    const ks_err OV = KS_ERR_VARINT_OVERFLOW;
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 5th byte 0x10", 0x20, 0xff, 0xff, 0xff, 0xff, 0x10);
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 2^32", 0x20, 0x80, 0x80, 0x80, 0x80, 0x10);
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 5th byte 0x7f", 0x20, 0xff, 0xff, 0xff, 0xff, 0x7f);
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 6 bytes", 0x20, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01);
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 6 bytes, 5th 0x8f", 0x20, 0xff, 0xff, 0xff, 0xff, 0x8f,
               0x00);
    EXPECT_RAW(&e, 3, OV, 1, 4, "key_version 10 bytes", 0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
               0xff, 0xff, 0xff, 0x01);
    EXPECT_RAW(&e, 0, OV, 1, 1, "algorithm 2^32+1", 0x08, 0x81, 0x80, 0x80, 0x80, 0x10);
    EXPECT_RAW(&e, 1, OV, 1, 2, "tenant length 2^35-1", 0x12, 0xff, 0xff, 0xff, 0xff, 0x7f);
    EXPECT_RAW(&e, 6, OV, 1, 15, "ciphertext length 6 bytes", 0x7a, 0x90, 0x80, 0x80, 0x80, 0x80,
               0x00);
    EXPECT_RAW(&e, 1, OV, 0, 0, "tag 5th byte 0x10", 0x92, 0x80, 0x80, 0x80, 0x10);
    EXPECT_RAW(&e, 1, OV, 0, 0, "tag 6 bytes", 0x92, 0x80, 0x80, 0x80, 0x80, 0x00);

    /* the input ends inside a varint: truncated at its first byte */
    static const uint8_t t1[] = {'K', 'S', 'E', 1, 0x08};
    EXPECT_REJECT(t1, sizeof t1, NULL, KS_ERR_TRUNCATED, 5, 1, "no algorithm value");
    static const uint8_t t2[] = {'K', 'S', 'E', 1, 0x08, 0x81};
    EXPECT_REJECT(t2, sizeof t2, NULL, KS_ERR_TRUNCATED, 5, 1, "algorithm 81 then end");
    static const uint8_t t3[] = {'K', 'S', 'E', 1, 0x88};
    EXPECT_REJECT(t3, sizeof t3, NULL, KS_ERR_TRUNCATED, 4, 0, "tag 88 then end");
    static const uint8_t t4[] = {'K', 'S', 'E', 2, 0x08, 0x01, 0x12, 0xff, 0xff, 0xff, 0xff};
    EXPECT_REJECT(t4, sizeof t4, NULL, KS_ERR_TRUNCATED, 7, 2, "4 continuation bytes then end");
    ks_envelope e3 = base_env(1, 1);
    e3.key_version = UINT32_MAX;
    tbuf b = tb_env(&e3);
    for (size_t k = 1; k < 5; k++) {
        EXPECT_REJECT(b.p, b.val_off[3] + k, NULL, KS_ERR_TRUNCATED, b.val_off[3], 4,
                      "key_version cut");
    }
    tb_free(&b);
}

/* ---- field structure ------------------------------------------------------- */

/* Duplicated and decreasing fields are field-order; skipping one by
 * swapping two is missing-field. */
static void test_field_order(void **state)
{
    (void)state;
    char what[96];
    for (uint8_t v = 1; v <= 2; v++) {
        ks_envelope e = base_env(v, v);
        item base[MAX_ITEMS];
        const size_t nb = env_items(&e, base);
        /* a duplicate of each field right after it */
        for (size_t i = 0; i < nb; i++) {
            item it[MAX_ITEMS];
            size_t n = nb;
            memcpy(it, base, sizeof base);
            items_insert(it, &n, i + 1, base[i]);
            tbuf b = tb_build(v, it, n);
            snprintf(what, sizeof what, "v%u duplicate field %u", v, (unsigned)base[i].number);
            EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_FIELD_ORDER, b.tag_off[i + 1], base[i].number,
                          what);
            tb_free(&b);
        }
        /* every earlier field again, after each later one (decreasing) */
        for (size_t j = 1; j < nb; j++) {
            for (size_t i = 0; i < j; i++) {
                item it[MAX_ITEMS];
                size_t n = nb;
                memcpy(it, base, sizeof base);
                items_insert(it, &n, j + 1, base[i]);
                tbuf b = tb_build(v, it, n);
                snprintf(what, sizeof what, "v%u field %u after field %u", v,
                         (unsigned)base[i].number, (unsigned)base[j].number);
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_FIELD_ORDER, b.tag_off[j + 1],
                              base[i].number, what);
                tb_free(&b);
            }
        }
        /* two adjacent fields swapped: the first is skipped */
        for (size_t i = 0; i + 1 < nb; i++) {
            item it[MAX_ITEMS];
            memcpy(it, base, sizeof base);
            it[i] = base[i + 1];
            it[i + 1] = base[i];
            tbuf b = tb_build(v, it, nb);
            snprintf(what, sizeof what, "v%u fields %u and %u swapped", v, (unsigned)base[i].number,
                     (unsigned)base[i + 1].number);
            EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[i], base[i].number,
                          what);
            tb_free(&b);
        }
    }
}

/* Fields the version does not define, anywhere in the envelope. */
static void test_unknown_fields(void **state)
{
    (void)state;
    char what[96];
    static const uint32_t v1_unknown[] = {0, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 100, 1000, 65535,
                                          (1u << 29) - 1};
    static const uint32_t v2_unknown[] = {0, 9, 14, 16, 31, 1000, (1u << 29) - 1};
    static const uint8_t payload[4] = {'a', 'b', 'c', 'd'};
    for (uint8_t v = 1; v <= 2; v++) {
        const uint32_t *unk = v == 1 ? v1_unknown : v2_unknown;
        const size_t nunk = v == 1 ? sizeof v1_unknown / sizeof v1_unknown[0]
                                   : sizeof v2_unknown / sizeof v2_unknown[0];
        ks_envelope e = base_env(v, 1);
        item base[MAX_ITEMS];
        const size_t nb = env_items(&e, base);
        for (size_t u = 0; u < nunk; u++) {
            for (size_t pos = 0; pos <= nb; pos++) {
                for (unsigned wire = 0; wire < 8; wire++) {
                    /* unknown wins over a bad wire type [F-ERR-3] */
                    item it[MAX_ITEMS];
                    size_t n = nb;
                    memcpy(it, base, sizeof base);
                    item x = wire == 0 ? vf(unk[u], 1) : bf(unk[u], view(payload, sizeof payload));
                    x.wire = wire;
                    items_insert(it, &n, pos, x);
                    tbuf b = tb_build(v, it, n);
                    snprintf(what, sizeof what, "v%u field %u wire %u at item %zu", v,
                             (unsigned)unk[u], wire, pos);
                    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_UNKNOWN_FIELD, b.tag_off[pos], unk[u],
                                  what);
                    tb_free(&b);
                }
            }
        }
    }
    /* the v2-only fields, in v1, where v2 has them */
    ks_envelope e = base_env(1, 2);
    e.purpose = strview("backup");
    tbuf b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_UNKNOWN_FIELD, b.tag_off[6], 7, "v1 with purpose");
    tb_free(&b);
    e = base_env(1, 2);
    e.commitment = view(g_pool + POOL_COMMIT, 32);
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_UNKNOWN_FIELD, b.tag_off[6], 8, "v1 with commitment");
    tb_free(&b);
    /* field number 0 as the first byte of the body: tag 00 and 02 */
    static const uint8_t z0[] = {'K', 'S', 'E', 1, 0x00, 0x01};
    EXPECT_REJECT(z0, sizeof z0, NULL, KS_ERR_UNKNOWN_FIELD, 4, 0, "tag 00");
    static const uint8_t z2[] = {'K', 'S', 'E', 2, 0x02, 0x00};
    EXPECT_REJECT(z2, sizeof z2, NULL, KS_ERR_UNKNOWN_FIELD, 4, 0, "tag 02");
}

/* Skipping each field: missing-field at the next field's tag with the
 * skipped number; skipping the ciphertext ends the input early. */
static void test_missing_fields(void **state)
{
    (void)state;
    char what[96];
    for (uint8_t v = 1; v <= 2; v++) {
        ks_envelope e = base_env(v, 2);
        item base[MAX_ITEMS];
        const size_t nb = env_items(&e, base);
        for (size_t i = 0; i < nb; i++) {
            item it[MAX_ITEMS];
            size_t n = nb;
            memcpy(it, base, sizeof base);
            items_remove(it, &n, i);
            tbuf b = tb_build(v, it, n);
            snprintf(what, sizeof what, "v%u without field %u", v, (unsigned)base[i].number);
            if (i + 1 < nb) {
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[i], base[i].number,
                              what);
                EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[i],
                                  base[i].number, what);
            } else {
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_TRUNCATED, b.len, 15, what);
            }
            tb_free(&b);
        }
        /* two fields skipped: the first is reported */
        item it[MAX_ITEMS];
        size_t n = nb;
        memcpy(it, base, sizeof base);
        items_remove(it, &n, 2);
        items_remove(it, &n, 2);
        tbuf b = tb_build(v, it, n);
        EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[2], 3, "no key_id, no kv");
        tb_free(&b);
        /* only the ciphertext */
        n = nb;
        memcpy(it, base, sizeof base);
        it[0] = base[nb - 1];
        n = 1;
        b = tb_build(v, it, n);
        EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, 4, 1, "only ciphertext");
        tb_free(&b);
    }
}

/* Every wrong wire type on every field, including groups (3, 4), the
 * fixed types (1, 5) and the undefined 6 and 7. */
static void test_wire_types(void **state)
{
    (void)state;
    char what[96];
    for (uint8_t v = 1; v <= 2; v++) {
        ks_envelope e = base_env(v, 1);
        item base[MAX_ITEMS];
        const size_t nb = env_items(&e, base);
        for (size_t i = 0; i < nb; i++) {
            for (unsigned wire = 0; wire < 8; wire++) {
                if (wire == base[i].wire) {
                    continue;
                }
                item it[MAX_ITEMS];
                memcpy(it, base, sizeof base);
                it[i].wire = wire;
                tbuf b = tb_build(v, it, nb);
                snprintf(what, sizeof what, "v%u field %u wire %u", v, (unsigned)base[i].number,
                         wire);
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_WIRE_TYPE, b.tag_off[i], base[i].number,
                              what);
                EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_WIRE_TYPE, b.tag_off[i], base[i].number,
                                  what);
                tb_free(&b);
            }
        }
    }
}

/* ---- value rules ------------------------------------------------------------ */

/* Nonce lengths that do not match the algorithm, both directions. */
static void test_nonce_mismatch(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 11, 12, 13, 16, 23, 24, 25, 32};
    for (uint32_t alg = 1; alg <= 2; alg++) {
        for (uint8_t v = 1; v <= 2; v++) {
            for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
                ks_envelope e = base_env(v, alg);
                set_len(&e, 6, lens[i]);
                if (lens[i] == nonce_len_of(alg)) {
                    EXPECT_VALID(&e, NULL, "nonce matches");
                    continue;
                }
                tbuf b = tb_env(&e);
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[5], 6, "nonce length");
                EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[5], 6,
                                  "nonce length");
                EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, "nonce length");
                tb_free(&b);
            }
        }
    }
}

/* The charsets of the field table, written out independently. */
static int in_name_charset(unsigned c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
}

/* key_id adds / @ + = to the name charset. */
static int in_key_id_charset(unsigned c)
{
    return in_name_charset(c) || c == '/' || c == '@' || c == '+' || c == '=';
}

/* Every byte value at the start, middle and end of tenant, key_id and
 * purpose: accepted exactly when in the field's charset, else bad-value at
 * that byte. */
static void test_charsets(void **state)
{
    (void)state;
    char what[96];
    static const uint32_t fields[3] = {2, 3, 7};
    for (size_t f = 0; f < 3; f++) {
        for (unsigned c = 0; c < 256; c++) {
            const int ok = fields[f] == 3 ? in_key_id_charset(c) : in_name_charset(c);
            for (size_t pos = 0; pos < 5; pos += 2) {
                uint8_t val[5] = {'a', 'B', '7', 'x', 'Z'};
                val[pos] = (uint8_t)c;
                ks_envelope e = base_env(2, 1);
                if (fields[f] == 2) {
                    e.tenant = view(val, 5);
                } else if (fields[f] == 3) {
                    e.key_id = view(val, 5);
                } else {
                    e.purpose = view(val, 5);
                }
                snprintf(what, sizeof what, "field %u byte 0x%02x at %zu", (unsigned)fields[f], c,
                         pos);
                if (ok) {
                    EXPECT_VALID(&e, NULL, what);
                    continue;
                }
                tbuf b = tb_env(&e);
                const size_t i = v2_index(fields[f]);
                EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[i] + pos, fields[f],
                              what);
                EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[i] + pos,
                                  fields[f], what);
                EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, what);
                tb_free(&b);
            }
        }
    }
    /* the key_id specials, all at once, in key_id; each one in tenant and
     * purpose is rejected at its position; the first bad byte wins */
    ks_envelope e = base_env(2, 2);
    e.key_id = strview("a/b@c+d=e.f_g:h-i/");
    EXPECT_VALID(&e, NULL, "key_id specials");
    e = base_env(1, 1);
    e.tenant = strview("acme/prod");
    tbuf b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[1] + 4, 2, "'/' in v1 tenant");
    tb_free(&b);
    e = base_env(2, 1);
    e.purpose = strview("x@y/z");
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[6] + 1, 7, "first bad byte");
    tb_free(&b);
    e = base_env(2, 1);
    e.tenant = view(g_names, 64);
    e.key_id = strview("key id");
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[2] + 3, 3, "space in key_id");
    tb_free(&b);
}

/* Values outside their rule: algorithm, key_version, empty bytes fields,
 * commitment and ciphertext lengths. */
static void test_bad_values(void **state)
{
    (void)state;
    char what[96];
    static const uint32_t algs[] = {0, 3, 4, 127, 128, 255, 0x10000, UINT32_MAX};
    for (uint8_t v = 1; v <= 2; v++) {
        for (size_t i = 0; i < sizeof algs / sizeof algs[0]; i++) {
            ks_envelope e = base_env(v, 1);
            e.algorithm = algs[i];
            tbuf b = tb_env(&e);
            snprintf(what, sizeof what, "v%u algorithm %u", v, (unsigned)algs[i]);
            EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[0], 1, what);
            EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[0], 1, what);
            EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, what);
            tb_free(&b);
        }
        ks_envelope e = base_env(v, 2);
        e.key_version = 0;
        tbuf b = tb_env(&e);
        EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[3], 4, "key_version 0");
        EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, "key_version 0");
        tb_free(&b);
        /* empty variable-length fields */
        static const uint32_t bytes_fields[] = {2, 3, 5, 7, 15};
        for (size_t k = 0; k < sizeof bytes_fields / sizeof bytes_fields[0]; k++) {
            if (v == 1 && bytes_fields[k] == 7) {
                continue;
            }
            e = base_env(v, 1);
            set_len(&e, bytes_fields[k], 0);
            item it[MAX_ITEMS];
            size_t n = env_items(&e, it);
            b = tb_build(v, it, n);
            const size_t i = item_index(&b, it, bytes_fields[k]);
            snprintf(what, sizeof what, "v%u empty field %u", v, (unsigned)bytes_fields[k]);
            EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[i], bytes_fields[k], what);
            EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, what);
            tb_free(&b);
        }
        /* ciphertext 15 (shorter than the tag), and 1 */
        static const size_t short_ct[] = {1, 15};
        for (size_t k = 0; k < 2; k++) {
            e = base_env(v, 1);
            set_len(&e, 15, short_ct[k]);
            item it[MAX_ITEMS];
            size_t n = env_items(&e, it);
            b = tb_build(v, it, n);
            EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[n - 1], 15, "short ct");
            EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[n - 1], 15, "short ct");
            EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, "short ct");
            tb_free(&b);
        }
        e = base_env(v, 1);
        set_len(&e, 15, 16);
        EXPECT_VALID(&e, NULL, "ciphertext 16");
    }
    /* commitment: exactly 32 */
    static const size_t commit[] = {0, 1, 31, 33, 64};
    for (size_t k = 0; k < sizeof commit / sizeof commit[0]; k++) {
        ks_envelope e = base_env(2, 1);
        set_len(&e, 8, commit[k]);
        tbuf b = tb_env(&e);
        snprintf(what, sizeof what, "commitment %zu", commit[k]);
        EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[7], 8, what);
        EXPECT_REJECT_HDR(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[7], 8, what);
        EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, what);
        tb_free(&b);
    }
}

/* ---- parsing like a known envelope ------------------------------------------ */

/* Nonzero when byte off of an envelope shaped like h lies in its nonce's
 * or commitment's value, which the parser does not read. */
static int in_opaque(const ks_envelope_head *h, size_t off)
{
    return (off >= h->nonce_off && off < (size_t)h->nonce_off + h->nonce_len) ||
           (h->commitment_off != 0 && off >= h->commitment_off && off < (size_t)h->commitment_off + KS_COMMITMENT_LEN);
}

/* Every input made from a valid envelope: each truncation, each byte set
 * to values that are tags, lengths, continuation bits and charset edges,
 * and each one-byte extension; under the defaults and under limits
 * lowered to the edge of the envelope's own purpose and ciphertext.
 * Parsing it like the envelope gives what the whole parse gives
 * (EXPECT_LIKE_SAME), and a change to the nonce's or commitment's value
 * alone is still parsed like it. */
static void test_parse_like(void **state)
{
    (void)state;
    static const uint8_t vals[] = {0x00, 0x01, 0x02, 0x0C, 0x0F, 0x10, 0x18, 0x20, 0x32, 0x3A,
                                   0x40, 0x42, 0x7A, 0x7F, 0x80, 0x81, 0xFF};
    char what[160];
    for (size_t i = 0; i < N_SHAPES; i++) {
        ks_envelope e = make_env(&g_shapes[i]);
        tbuf b = tb_env(&e);
        ks_limits low;
        ks_limits_default(&low);
        const ks_limits *lims[2] = {NULL, &low};
        for (size_t l = 0; l < 2; l++) {
            ks_envelope ok;
            assert_int_equal(ks_envelope_parse(b.p, b.len, lims[l], &ok, NULL), KS_OK);
            if (l == 0) { /* the edges: this envelope's own purpose and ciphertext lengths */
                low.max_purpose = ok.purpose.len != 0 ? ok.purpose.len : low.max_purpose;
                low.max_ciphertext = ok.ciphertext.len;
            }
            ks_envelope_head h;
            ks_envelope_head_of(b.p, &ok, &h);
            assert_true(h.len > 0 && h.len < h.header_len && h.header_len < b.len);
            uint8_t *buf = malloc(b.len + 1);
            assert_non_null(buf);
            for (size_t n = 0; n <= b.len; n++) {
                uint8_t *copy = dup_exact(b.p, n);
                snprintf(what, sizeof what, "%s (limits %zu) cut at %zu", g_shapes[i].label, l, n);
                assert_int_equal(EXPECT_LIKE_SAME(copy, n, lims[l], &h, b.p, what), n == b.len);
                free(copy);
            }
            for (size_t off = 0; off <= b.len; off++) {
                for (size_t k = 0; k <= sizeof vals; k++) {
                    if (off == b.len && k == sizeof vals) {
                        continue; /* no byte to flip past the end */
                    }
                    const size_t n = off == b.len ? b.len + 1 : b.len;
                    memcpy(buf, b.p, b.len);
                    buf[off] = k < sizeof vals ? vals[k] : (uint8_t)(b.p[off] ^ 1);
                    uint8_t *copy = dup_exact(buf, n);
                    snprintf(what, sizeof what, "%s (limits %zu) byte %zu = %02x", g_shapes[i].label, l, off,
                             buf[off]);
                    const int like = EXPECT_LIKE_SAME(copy, n, lims[l], &h, b.p, what);
                    if (in_opaque(&h, off)) {
                        assert_int_equal(like, 1);
                    }
                    free(copy);
                }
            }
            free(buf);
        }
        tb_free(&b);
    }
}

/* Missing arguments parse the whole envelope (the same result, never
 * like); out-of-range limits and a NULL out are invalid-argument. */
static void test_parse_like_arguments(void **state)
{
    (void)state;
    ks_envelope e = make_env(&g_shapes[0]);
    tbuf b = tb_env(&e);
    ks_envelope ok, out;
    assert_int_equal(ks_envelope_parse(b.p, b.len, NULL, &ok, NULL), KS_OK);
    ks_envelope_head h;
    ks_envelope_head_of(b.p, &ok, &h);
    assert_true(ks_envelope_like(b.p, b.len, &h, b.p));
    assert_false(ks_envelope_like(b.p, h.header_len, &h, b.p)); /* nothing after the header */
    assert_false(ks_envelope_like(NULL, b.len, &h, b.p) || ks_envelope_like(b.p, b.len, NULL, b.p) ||
                 ks_envelope_like(b.p, b.len, &h, NULL));
    int like = 7;
    assert_int_equal(ks_envelope_parse_like(b.p, b.len, NULL, NULL, b.p, &out, NULL, &like), KS_OK);
    assert_int_equal(like, 0);
    assert_int_equal(ks_envelope_parse_like(b.p, b.len, NULL, &h, NULL, &out, NULL, &like), KS_OK);
    assert_int_equal(like, 0);
    ks_parse_error pe = {KS_OK, 7, 7};
    assert_int_equal(ks_envelope_parse_like(b.p, b.len, NULL, &h, b.p, NULL, &pe, &like), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pe.code, KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(like, 0);
    const ks_limits bad = {0, 0, 0, 0, 0};
    assert_int_equal(ks_envelope_parse_like(b.p, b.len, &bad, &h, b.p, &out, &pe, &like), KS_ERR_INVALID_ARGUMENT);
    assert_true(pe.code == KS_ERR_INVALID_ARGUMENT && pe.offset == 0 && pe.field == 0 &&
                memcmp(&out, &g_zero_env, sizeof out) == 0 && like == 0);
    tb_free(&b);
}

/* Nothing may follow the ciphertext; a header parse does not look. */
static void test_trailing_bytes(void **state)
{
    (void)state;
    for (uint8_t v = 1; v <= 2; v++) {
        ks_envelope e = base_env(v, 1);
        item it[MAX_ITEMS];
        size_t n = env_items(&e, it);
        const item ct = it[n - 1];
        struct {
            item extra;
            ks_err code;
            uint32_t field;
        } cases[5];
        static const uint8_t zero[1] = {0x00};
        static const uint8_t cont[1] = {0x80};
        cases[0].extra = rawi(zero, 1);
        cases[0].code = KS_ERR_UNKNOWN_FIELD;
        cases[0].field = 0;
        cases[1].extra = ct; /* the ciphertext again */
        cases[1].code = KS_ERR_FIELD_ORDER;
        cases[1].field = 15;
        cases[2].extra = vf(1, 1); /* algorithm again */
        cases[2].code = KS_ERR_FIELD_ORDER;
        cases[2].field = 1;
        cases[3].extra = vf(16, 1);
        cases[3].code = KS_ERR_UNKNOWN_FIELD;
        cases[3].field = 16;
        cases[4].extra = rawi(cont, 1); /* start of a varint */
        cases[4].code = KS_ERR_TRUNCATED;
        cases[4].field = 0;
        for (size_t k = 0; k < 5; k++) {
            item x[MAX_ITEMS];
            size_t m = n;
            memcpy(x, it, sizeof it);
            items_insert(x, &m, m, cases[k].extra);
            tbuf b = tb_build(v, x, m);
            const size_t end = b.tag_off[n];
            EXPECT_REJECT(b.p, b.len, NULL, cases[k].code, end, cases[k].field, "trailing bytes");
            ks_envelope out;
            memset(&out, 0xA5, sizeof out);
            assert_int_equal(ks_envelope_parse_header(b.p, b.len, NULL, &out, NULL), KS_OK);
            assert_int_equal(out.total_len, end);
            assert_int_equal(out.ciphertext.len, ct.data_len);
            tb_free(&b);
        }
    }
}

/* Bytes after the ciphertext that are not a tag of a single field: a
 * second envelope (4B is field 9), a non-minimal or overlong tag. */
static void test_trailing_tags(void **state)
{
    (void)state;
    ks_envelope e = base_env(2, 2);
    tbuf one = tb_env(&e);
    const struct {
        const uint8_t *p;
        size_t n;
        ks_err code;
        uint32_t field;
    } tails[] = {
        {one.p, one.len, KS_ERR_UNKNOWN_FIELD, 9},
        {(const uint8_t *)"\xfa\x00\x10", 3, KS_ERR_NONCANONICAL_VARINT, 0},
        {(const uint8_t *)"\xff\xff\xff\xff\x1f", 5, KS_ERR_VARINT_OVERFLOW, 0},
        {(const uint8_t *)"\xff\xff\xff", 3, KS_ERR_TRUNCATED, 0},
        {(const uint8_t *)"\xfa\x80\x80\x80\x80\x01", 6, KS_ERR_VARINT_OVERFLOW, 0},
    };
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
        const size_t len = one.len + tails[k].n;
        uint8_t *two = malloc(len);
        assert_non_null(two);
        memcpy(two, one.p, one.len);
        memcpy(two + one.len, tails[k].p, tails[k].n);
        EXPECT_REJECT(two, len, NULL, tails[k].code, one.len, tails[k].field, "trailing tag");
        free(two);
    }
    tb_free(&one);
}

/* When an input has several faults, the first in reading order wins
 * ([F-ERR-3] and its listed consequences). */
static void test_check_order(void **state)
{
    (void)state;
    ks_envelope e = base_env(1, 1);
    item base[MAX_ITEMS];
    const size_t nb = env_items(&e, base);
    item it[MAX_ITEMS];
    size_t n;

    /* a duplicate with a bad wire type is field-order */
    memcpy(it, base, sizeof base);
    n = nb;
    items_insert(it, &n, 2, base[1]);
    it[2].wire = 0;
    tbuf b = tb_build(1, it, n);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_FIELD_ORDER, b.tag_off[2], 2, "dup, bad wire");
    tb_free(&b);

    /* a skipped field followed by a bad wire type is missing-field */
    memcpy(it, base, sizeof base);
    n = nb;
    items_remove(it, &n, 1);
    it[1].wire = 5;
    b = tb_build(1, it, n);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_MISSING_FIELD, b.tag_off[1], 2, "skip, bad wire");
    tb_free(&b);

    /* a non-minimal zero algorithm is noncanonical-varint, not bad-value */
    static const uint8_t alg0[] = {'K', 'S', 'E', 1, 0x08, 0x80, 0x00};
    EXPECT_REJECT(alg0, sizeof alg0, NULL, KS_ERR_NONCANONICAL_VARINT, 5, 1, "alg 80 00");

    /* a truncated tenant is truncated even if its bytes break the charset */
    static const uint8_t tt[] = {'K', 'S', 'E', 1, 0x08, 0x01, 0x12, 0x05, 'a', ' ', '/'};
    EXPECT_REJECT(tt, sizeof tt, NULL, KS_ERR_TRUNCATED, 8, 2, "truncated bad tenant");

    /* an earlier fault hides later ones */
    e = base_env(2, 1);
    e.algorithm = 9;
    e.tenant = strview("a b");
    e.key_version = 0;
    set_len(&e, 8, 3);
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, 5, 1, "bad alg first");
    EXPECT_ENCODER(&e, NULL, KS_ERR_BAD_VALUE, NULL, 0, "bad alg first");
    tb_free(&b);
    e = base_env(2, 1);
    e.tenant = strview("a b");
    set_len(&e, 15, 3);
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.data_off[1] + 1, 2, "tenant before ct");
    uint8_t *c = dup_exact(b.p, b.len - 1); /* and cut short */
    EXPECT_REJECT(c, b.len - 1, NULL, KS_ERR_BAD_VALUE, b.data_off[1] + 1, 2, "tenant, cut");
    free(c);
    tb_free(&b);
    /* nonce length is judged against the algorithm just read */
    e = base_env(1, 2);
    e.nonce = view(g_pool, 12);
    b = tb_env(&e);
    EXPECT_REJECT(b.p, b.len, NULL, KS_ERR_BAD_VALUE, b.val_off[5], 6, "xchacha, 12");
    tb_free(&b);
}

/* A length that runs past the end of the input: truncated at the value. */
static void test_value_past_end(void **state)
{
    (void)state;
    for (uint8_t v = 1; v <= 2; v++) {
        ks_envelope e = base_env(v, 2);
        item it[MAX_ITEMS];
        const size_t n = env_items(&e, it);
        for (size_t i = 0; i < n; i++) {
            if (it[i].wire != 2) {
                continue;
            }
            tbuf b = tb_build(v, it, i + 1); /* the input ends with field i */
            /* claim one more byte than there is, keeping the length valid
             * where it can be */
            uint8_t *c = dup_exact(b.p, b.len - 1);
            EXPECT_REJECT(c, b.len - 1, NULL, KS_ERR_TRUNCATED, b.data_off[i], it[i].number,
                          "value past end");
            if (it[i].number != 15) {
                EXPECT_REJECT_HDR(c, b.len - 1, NULL, KS_ERR_TRUNCATED, b.data_off[i],
                                  it[i].number, "value past end");
            }
            free(c);
            tb_free(&b);
        }
    }
    /* a ciphertext length within the limit but far beyond the input */
    static const uint8_t tiny[] = {'K', 'S', 'E', 1, 0x08, 0x01, 0x12, 0x01, 'a', 0x1a, 0x01, 'b',
                                   0x20, 0x01, 0x2a, 0x01, 0xff, 0x32, 0x0c, 0, 1, 2, 3, 4, 5, 6,
                                   7, 8, 9, 10, 11, 0x7a, 0x80, 0x80, 0x40, 0xee};
    EXPECT_REJECT(tiny, sizeof tiny, NULL, KS_ERR_TRUNCATED, sizeof tiny - 1, 15, "1 MiB claimed");
    ks_envelope out;
    assert_int_equal(ks_envelope_parse_header(tiny, sizeof tiny, NULL, &out, NULL), KS_OK);
    assert_int_equal(out.total_len, sizeof tiny - 1 + (1u << 20));
    assert_null(out.ciphertext.ptr);
}

/* ---- header-only parsing ------------------------------------------------------ */

/* The header prefix parses with the ciphertext absent and total_len right;
 * the whole envelope gives the ciphertext view; values match a full parse. */
static void test_parse_header(void **state)
{
    (void)state;
    for (size_t s = 0; s < N_SHAPES; s++) {
        ks_envelope e = make_env(&g_shapes[s]);
        tbuf b = tb_env(&e);
        const size_t ct = b.nitems - 1;
        ks_envelope full, hdr;
        EXPECT_OK(b.p, b.len, NULL, &full, g_shapes[s].label);

        /* exactly the header */
        uint8_t *c = dup_exact(b.p, b.data_off[ct]);
        memset(&hdr, 0xA5, sizeof hdr);
        assert_int_equal(ks_envelope_parse_header(c, b.data_off[ct], NULL, &hdr, NULL), KS_OK);
        assert_null(hdr.ciphertext.ptr);
        assert_int_equal(hdr.ciphertext.len, 0);
        assert_int_equal(hdr.total_len, b.len);
        assert_int_equal(hdr.header_len, b.tag_off[ct]);
        assert_true(ks_test_views_inside(&hdr, c, b.data_off[ct]));
        hdr.ciphertext = full.ciphertext;
        assert_true(ks_test_fields_eq(&hdr, &full));
        free(c);

        /* header and part of the ciphertext */
        const size_t part = b.data_off[ct] + (b.len - b.data_off[ct]) / 2;
        c = dup_exact(b.p, part);
        assert_int_equal(ks_envelope_parse_header(c, part, NULL, &hdr, NULL), KS_OK);
        assert_null(hdr.ciphertext.ptr);
        assert_int_equal(hdr.total_len, b.len);
        free(c);

        /* the whole envelope */
        memset(&hdr, 0xA5, sizeof hdr);
        assert_int_equal(ks_envelope_parse_header(b.p, b.len, NULL, &hdr, NULL), KS_OK);
        assert_true(ks_test_result_eq(&hdr, &full));
        assert_ptr_equal(hdr.ciphertext.ptr, b.p + b.data_off[ct]);

        /* header cut short: rejected like a full parse */
        size_t off;
        uint32_t field;
        trunc_expect(&b, b.tag_off[ct], &off, &field);
        EXPECT_REJECT_HDR(b.p, b.tag_off[ct], NULL, KS_ERR_TRUNCATED, off, field, "no ct tag");
        trunc_expect(&b, b.val_off[ct], &off, &field);
        EXPECT_REJECT_HDR(b.p, b.val_off[ct], NULL, KS_ERR_TRUNCATED, off, field, "no ct length");
        tb_free(&b);
    }
    /* too-large ciphertext length is caught in header mode, before the bytes */
    ks_envelope e = base_env(2, 1);
    set_len(&e, 15, KS_CIPHERTEXT_DEFAULT_MAX + 1);
    tbuf b = tb_env(&e);
    EXPECT_REJECT_HDR(b.p, b.data_off[8], NULL, KS_ERR_TOO_LARGE, b.val_off[8], 15, "hdr too large");
    ks_limits l;
    ks_limits_default(&l);
    l.max_ciphertext = KS_CIPHERTEXT_HARD_MAX;
    ks_envelope hdr;
    uint8_t *c = dup_exact(b.p, b.data_off[8]);
    assert_int_equal(ks_envelope_parse_header(c, b.data_off[8], &l, &hdr, NULL), KS_OK);
    assert_int_equal(hdr.total_len, b.len);
    free(c);
    tb_free(&b);
}

/* ---- encoder --------------------------------------------------------------- */

/* A way to break a valid envelope, and what parser and encoder must say. */
typedef struct mutation {
    const char *label;
    uint8_t version;      /* of the base envelope */
    int kind;
    ks_err code;
} mutation;

enum {
    M_VERSION_0, M_VERSION_3, M_VERSION_255, M_V1_PURPOSE, M_V1_COMMITMENT, M_ALG_0, M_ALG_3,
    M_KVER_0, M_TENANT_EMPTY, M_TENANT_CHARSET, M_KEY_ID_CHARSET, M_PURPOSE_CHARSET,
    M_TENANT_LONG, M_KEY_ID_LONG, M_WRAPPED_LONG, M_PURPOSE_LONG, M_CT_LONG, M_NONCE_24_AES,
    M_NONCE_12_XCHACHA, M_COMMIT_31, M_COMMIT_33, M_V2_NO_PURPOSE, M_V2_NO_COMMIT, M_CT_15,
    M_WRAPPED_EMPTY, M_TWO_ERRORS, M_NULL_TENANT, M_NULL_KEY_ID, M_NULL_WRAPPED, M_NULL_NONCE,
    M_NULL_PURPOSE, M_NULL_COMMIT, M_NULL_CT, M_NULL_PURPOSE_V1
};

/* Apply mutation kind to e. */
static void mutate(ks_envelope *e, int kind)
{
    static const uint8_t bad_tenant[] = "acme prod";
    switch (kind) {
    case M_VERSION_0: e->version = 0; break;
    case M_VERSION_3: e->version = 3; break;
    case M_VERSION_255: e->version = 255; break;
    case M_V1_PURPOSE: e->purpose = strview("backup"); break;
    case M_V1_COMMITMENT: set_len(e, 8, 32); break;
    case M_ALG_0: e->algorithm = 0; break;
    case M_ALG_3: e->algorithm = 3; break;
    case M_KVER_0: e->key_version = 0; break;
    case M_TENANT_EMPTY: e->tenant = view(NULL, 0); break;
    case M_TENANT_CHARSET: e->tenant = view(bad_tenant, 9); break;
    case M_KEY_ID_CHARSET: e->key_id = strview("key#1"); break;
    case M_PURPOSE_CHARSET: e->purpose = strview("a/b"); break;
    case M_TENANT_LONG: set_len(e, 2, 65); break;
    case M_KEY_ID_LONG: set_len(e, 3, 257); break;
    case M_WRAPPED_LONG: set_len(e, 5, 1025); break;
    case M_PURPOSE_LONG: set_len(e, 7, 65); break;
    case M_CT_LONG: set_len(e, 15, KS_CIPHERTEXT_DEFAULT_MAX + 1); break;
    case M_NONCE_24_AES: e->algorithm = 1; set_len(e, 6, 24); break;
    case M_NONCE_12_XCHACHA: e->algorithm = 2; set_len(e, 6, 12); break;
    case M_COMMIT_31: set_len(e, 8, 31); break;
    case M_COMMIT_33: set_len(e, 8, 33); break;
    case M_V2_NO_PURPOSE: e->purpose = view(NULL, 0); break;
    case M_V2_NO_COMMIT: e->commitment = view(NULL, 0); break;
    case M_CT_15: set_len(e, 15, 15); break;
    case M_WRAPPED_EMPTY: set_len(e, 5, 0); break;
    case M_TWO_ERRORS: set_len(e, 2, 65); e->key_id = strview("a b"); break;
    case M_NULL_TENANT: e->tenant.ptr = NULL; break;
    case M_NULL_KEY_ID: e->key_id.ptr = NULL; break;
    case M_NULL_WRAPPED: e->wrapped_dek.ptr = NULL; break;
    case M_NULL_NONCE: e->nonce.ptr = NULL; break;
    case M_NULL_PURPOSE: e->purpose.ptr = NULL; break;
    case M_NULL_COMMIT: e->commitment.ptr = NULL; break;
    case M_NULL_CT: e->ciphertext.ptr = NULL; break;
    case M_NULL_PURPOSE_V1: e->purpose.ptr = NULL; e->purpose.len = 3; break;
    default: fail_msg("mutation %d", kind);
    }
}

/* The encoder rejects every invalid struct with the code the parser gives
 * for the same fields written out, and writes nothing. */
static void test_encode_rejects(void **state)
{
    (void)state;
    static const mutation ms[] = {
        {"version 0", 1, M_VERSION_0, KS_ERR_UNSUPPORTED_VERSION},
        {"version 3", 2, M_VERSION_3, KS_ERR_UNSUPPORTED_VERSION},
        {"version 255", 1, M_VERSION_255, KS_ERR_UNSUPPORTED_VERSION},
        {"v1 with purpose", 1, M_V1_PURPOSE, KS_ERR_UNKNOWN_FIELD},
        {"v1 with commitment", 1, M_V1_COMMITMENT, KS_ERR_UNKNOWN_FIELD},
        {"algorithm 0", 2, M_ALG_0, KS_ERR_BAD_VALUE},
        {"algorithm 3", 1, M_ALG_3, KS_ERR_BAD_VALUE},
        {"key_version 0", 1, M_KVER_0, KS_ERR_BAD_VALUE},
        {"empty tenant", 2, M_TENANT_EMPTY, KS_ERR_BAD_VALUE},
        {"tenant charset", 1, M_TENANT_CHARSET, KS_ERR_BAD_VALUE},
        {"key_id charset", 2, M_KEY_ID_CHARSET, KS_ERR_BAD_VALUE},
        {"purpose charset", 2, M_PURPOSE_CHARSET, KS_ERR_BAD_VALUE},
        {"tenant 65", 1, M_TENANT_LONG, KS_ERR_TOO_LARGE},
        {"key_id 257", 2, M_KEY_ID_LONG, KS_ERR_TOO_LARGE},
        {"wrapped_dek 1025", 1, M_WRAPPED_LONG, KS_ERR_TOO_LARGE},
        {"purpose 65", 2, M_PURPOSE_LONG, KS_ERR_TOO_LARGE},
        {"ciphertext 1MiB+17", 1, M_CT_LONG, KS_ERR_TOO_LARGE},
        {"aes with 24-byte nonce", 1, M_NONCE_24_AES, KS_ERR_BAD_VALUE},
        {"xchacha with 12-byte nonce", 2, M_NONCE_12_XCHACHA, KS_ERR_BAD_VALUE},
        {"commitment 31", 2, M_COMMIT_31, KS_ERR_BAD_VALUE},
        {"commitment 33", 2, M_COMMIT_33, KS_ERR_BAD_VALUE},
        {"v2 without purpose", 2, M_V2_NO_PURPOSE, KS_ERR_BAD_VALUE},
        {"v2 without commitment", 2, M_V2_NO_COMMIT, KS_ERR_BAD_VALUE},
        {"ciphertext 15", 1, M_CT_15, KS_ERR_BAD_VALUE},
        {"empty wrapped_dek", 1, M_WRAPPED_EMPTY, KS_ERR_BAD_VALUE},
        {"tenant too long and key_id bad", 2, M_TWO_ERRORS, KS_ERR_TOO_LARGE},
        {"NULL tenant", 1, M_NULL_TENANT, KS_ERR_INVALID_ARGUMENT},
        {"NULL key_id", 2, M_NULL_KEY_ID, KS_ERR_INVALID_ARGUMENT},
        {"NULL wrapped_dek", 1, M_NULL_WRAPPED, KS_ERR_INVALID_ARGUMENT},
        {"NULL nonce", 2, M_NULL_NONCE, KS_ERR_INVALID_ARGUMENT},
        {"NULL purpose", 2, M_NULL_PURPOSE, KS_ERR_INVALID_ARGUMENT},
        {"NULL commitment", 2, M_NULL_COMMIT, KS_ERR_INVALID_ARGUMENT},
        {"NULL ciphertext", 1, M_NULL_CT, KS_ERR_INVALID_ARGUMENT},
        {"v1 NULL purpose len 3", 1, M_NULL_PURPOSE_V1, KS_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        ks_envelope e = base_env(ms[i].version, ms[i].version);
        mutate(&e, ms[i].kind);
        EXPECT_ENCODER(&e, NULL, ms[i].code, NULL, 0, ms[i].label);
        if (ms[i].code == KS_ERR_INVALID_ARGUMENT) {
            continue; /* not expressible as bytes */
        }
        /* the parser says the same of these fields written out */
        tbuf b = tb_env(&e);
        ks_envelope out;
        ks_parse_error err;
        ks_err got = ks_envelope_parse(b.p, b.len, NULL, &out, &err);
        if (got != ms[i].code) {
            print_error("%s: parser says %s, encoder %s\n", ms[i].label, ks_err_name(got),
                        ks_err_name(ms[i].code));
            tb_free(&b);
            fail();
        }
        note_hit(got);
        tb_free(&b);
    }
    /* header_len and total_len are ignored */
    ks_envelope e = base_env(2, 2);
    e.header_len = 3;
    e.total_len = SIZE_MAX;
    EXPECT_VALID(&e, NULL, "junk header_len/total_len");
    /* lowered limits apply to the encoder */
    ks_limits l;
    ks_limits_default(&l);
    l.max_tenant = 5;
    e = base_env(1, 1); /* tenant 6 */
    EXPECT_ENCODER(&e, &l, KS_ERR_TOO_LARGE, NULL, 0, "tenant 6 over max_tenant 5");
}

/* Capacity and argument handling of the encoder. */
static void test_encode_buffer(void **state)
{
    (void)state;
    for (size_t s = 0; s < N_SHAPES; s++) {
        ks_envelope e = make_env(&g_shapes[s]);
        tbuf b = tb_env(&e);
        size_t need = 0;
        assert_int_equal(ks_envelope_encoded_len(&e, NULL, &need), KS_OK);
        assert_int_equal(need, b.len);
        uint8_t *buf = malloc(need + 8);
        assert_non_null(buf);
        static const size_t shortfall[] = {1, 2, 16};
        for (size_t k = 0; k < 3; k++) {
            memset(buf, 0xCC, need + 8);
            size_t out_len = 4242;
            assert_int_equal(ks_envelope_encode(&e, NULL, buf, need - shortfall[k], &out_len),
                             KS_ERR_BUFFER_TOO_SMALL);
            for (size_t i = 0; i < need + 8; i++) {
                assert_int_equal(buf[i], 0xCC);
            }
        }
        size_t out_len = 0;
        assert_int_equal(ks_envelope_encode(&e, NULL, NULL, 0, &out_len), KS_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(ks_envelope_encode(&e, NULL, NULL, need, &out_len), KS_ERR_INVALID_ARGUMENT);
        /* exact size */
        memset(buf, 0xCC, need + 8);
        assert_int_equal(ks_envelope_encode(&e, NULL, buf, need, &out_len), KS_OK);
        assert_int_equal(out_len, need);
        assert_memory_equal(buf, b.p, need);
        for (size_t i = need; i < need + 8; i++) {
            assert_int_equal(buf[i], 0xCC);
        }
        free(buf);
        tb_free(&b);
    }
    ks_envelope e = base_env(1, 1);
    size_t n;
    uint8_t buf[256];
    assert_int_equal(ks_envelope_check(NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_encoded_len(NULL, NULL, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_encoded_len(&e, NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_encode(NULL, NULL, buf, sizeof buf, &n), KS_ERR_INVALID_ARGUMENT);
    /* A NULL out_len is refused before anything is written. */
    memset(buf, 0xCC, sizeof buf);
    assert_int_equal(ks_envelope_encode(&e, NULL, buf, sizeof buf, NULL), KS_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof buf; i++) {
        assert_int_equal(buf[i], 0xCC);
    }
    assert_int_equal(ks_envelope_check(&e, NULL), KS_OK);
}

/* ---- coverage of the error names --------------------------------------------- */

/* Every rejection code was produced by some test above (runs last). */
static void test_every_error_hit(void **state)
{
    (void)state;
    int missing = 0;
    for (int code = KS_ERR_TRUNCATED; code <= KS_ERR_BAD_VALUE; code++) {
        if (g_hits[code] == 0) {
            print_error("no C-built test produced %s\n", ks_err_name((ks_err)code));
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

/* Run the group. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_names),
        cmocka_unit_test(test_algorithms),
        cmocka_unit_test(test_parse_arguments),
        cmocka_unit_test(test_limits_check),
        cmocka_unit_test(test_max_len),
        cmocka_unit_test(test_valid_shapes),
        cmocka_unit_test(test_zero_copy),
        cmocka_unit_test(test_truncation_every_byte),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_limits_default),
        cmocka_unit_test(test_limits_hard_cap),
        cmocka_unit_test(test_limits_lowered),
        cmocka_unit_test(test_varint_noncanonical),
        cmocka_unit_test(test_varint_overflow_truncated),
        cmocka_unit_test(test_field_order),
        cmocka_unit_test(test_unknown_fields),
        cmocka_unit_test(test_missing_fields),
        cmocka_unit_test(test_wire_types),
        cmocka_unit_test(test_nonce_mismatch),
        cmocka_unit_test(test_charsets),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_trailing_tags),
        cmocka_unit_test(test_check_order),
        cmocka_unit_test(test_value_past_end),
        cmocka_unit_test(test_parse_header),
        cmocka_unit_test(test_encode_rejects),
        cmocka_unit_test(test_encode_buffer),
        cmocka_unit_test(test_parse_like),
        cmocka_unit_test(test_parse_like_arguments),
        cmocka_unit_test(test_every_error_hit),
    };
    return cmocka_run_group_tests_name("envelope", tests, setup_pools, teardown_pools);
}
