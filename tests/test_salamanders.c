/*
 * tests/test_salamanders.c -- the "invisible salamanders" attack on
 * AES-256-GCM (Dodis, Grubbs, Ristenpart, Woodage 2018; Len, Grubbs,
 * Ristenpart, "Partitioning oracle attacks", 2021) against keyshift's two
 * envelope formats (docs/format.md sections 7.6 and 7.12).
 *
 * GCM is not key-committing: its tag is T = E_K(J0) xor GHASH_H(A, C) with
 * H = E_K(0^128), and GHASH is a polynomial in H whose coefficients are the
 * AAD and ciphertext blocks.  Leave one ciphertext block x free: the tags
 * under two keys K1, K2 are equal when one linear equation in x over
 * GF(2^128) holds, so one (ciphertext, tag) decrypts validly under both
 * keys, to two different plaintexts.
 *
 * What the tests show:
 *   - the GF(2^128)/GHASH model below is right (a published GHASH answer,
 *     field identities, and libsodium's own tags on random messages);
 *   - the crafted ciphertext really decrypts under both keys with libsodium;
 *   - format v1 (K = DEK) falls to it: two envelopes that differ only in
 *     wrapped_dek both open through ks_open(), to different plaintexts.
 *     This is the known, specified limitation of v1 (docs/format.md 7.12,
 *     "Version 1 is not key-committing") and the reason v2 exists;
 *   - format v2 stops it: the same attack on the v2 message keys produces a
 *     ciphertext libsodium accepts under both keys, yet ks_open() refuses
 *     the second envelope, and the metrics show it was the key commitment,
 *     checked before the AEAD, that refused it.
 *
 * libsodium does not expose the raw AES block function, so the test gets
 * the two per-key GCM values it needs from libsodium's AEAD itself: E_K(J0)
 * is the tag of the empty message, and H is recovered from the tags of two
 * one-block AADs (see gcm_model_init).  The AES parts are skipped where
 * crypto_aead_aes256gcm_is_available() is 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include <keyshift/aad.h>
#include <keyshift/crypto.h>
#include <keyshift/envelope.h>

#include "mem_provider.h"

#define KEY_ID "app-key"
#define TENANT "acme"
#define PURPOSE "payments"
#define CONTEXT "payments:42:card"
#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

#define BLOCK 16
#define CT_BLOCKS 4     /* crafted ciphertext: 4 blocks (64 bytes) ... */
#define FREE_BLOCK 2    /* ... of which block 2 is solved for */
#define CT_LEN (CT_BLOCKS * BLOCK)
#define NONCE_LEN KS_AES256GCM_NONCE_LEN

/* ---- GF(2^128) in GCM's bit order ---------------------------------------
 *
 * A field element is a 16-byte block read as a polynomial whose x^0
 * coefficient is the most significant bit of byte 0 and whose x^127
 * coefficient is the least significant bit of byte 15 (NIST SP 800-38D,
 * 6.3).  It is held as two big-endian 64-bit halves: hi = bytes 0..7.
 */
typedef struct gf {
    uint64_t hi, lo;
} gf;

/* The multiplicative identity: only the x^0 bit, the top bit of byte 0. */
static const gf GF_ONE = {UINT64_C(1) << 63, 0};

/* Read a 16-byte block as a field element. */
static gf gf_load(const uint8_t b[BLOCK])
{
    gf r = {0, 0};
    for (int i = 0; i < 8; i++) {
        r.hi = (r.hi << 8) | b[i];
        r.lo = (r.lo << 8) | b[8 + i];
    }
    return r;
}

/* Write a field element as its 16-byte block. */
static void gf_store(gf a, uint8_t b[BLOCK])
{
    for (int i = 7; i >= 0; i--) {
        b[i] = (uint8_t)a.hi;
        b[8 + i] = (uint8_t)a.lo;
        a.hi >>= 8;
        a.lo >>= 8;
    }
}

/* Addition (and subtraction) in characteristic 2: xor. */
static gf gf_add(gf a, gf b)
{
    return (gf){a.hi ^ b.hi, a.lo ^ b.lo};
}

/* Whether a is the zero element. */
static int gf_is_zero(gf a)
{
    return (a.hi | a.lo) == 0;
}

/* Whether a == b. */
static int gf_eq(gf a, gf b)
{
    return gf_is_zero(gf_add(a, b));
}

/* x * y, by SP 800-38D Algorithm 1: for each bit of x from x^0 up, add V
 * when the bit is set, then V = V * x, reducing by R = 11100001 || 0^120
 * (the polynomial x^128 + x^7 + x^2 + x + 1 in this bit order). */
static gf gf_mul(gf x, gf y)
{
    gf z = {0, 0};
    gf v = y;
    for (int i = 0; i < 128; i++) {
        uint64_t word = i < 64 ? x.hi : x.lo;
        if ((word >> (63 - (i & 63))) & 1) {
            z = gf_add(z, v);
        }
        uint64_t carry = v.lo & 1; /* the x^127 coefficient */
        v.lo = (v.lo >> 1) | (v.hi << 63);
        v.hi >>= 1;
        if (carry) {
            v.hi ^= UINT64_C(0xE1) << 56;
        }
    }
    return z;
}

/* a^e by square-and-multiply (e small: a power of H in GHASH). */
static gf gf_pow(gf a, unsigned e)
{
    gf r = GF_ONE;
    for (; e != 0; e >>= 1) {
        if (e & 1) {
            r = gf_mul(r, a);
        }
        a = gf_mul(a, a);
    }
    return r;
}

/* a^(2^k): k squarings.  The squaring map is a bijection of the field
 * (Frobenius), and a^(2^128) = a. */
static gf gf_square_n(gf a, unsigned k)
{
    while (k-- != 0) {
        a = gf_mul(a, a);
    }
    return a;
}

/* The unique square root of a: a^(2^127), since (a^(2^127))^2 = a^(2^128) = a. */
static gf gf_sqrt(gf a)
{
    return gf_square_n(a, 127);
}

/* The inverse of a nonzero a: a^(2^128 - 2) = a^(2 + 4 + ... + 2^127),
 * the product of a^(2^i) for i = 1..127 (Fermat in a field of 2^128
 * elements). */
static gf gf_inv(gf a)
{
    gf r = GF_ONE;
    gf s = a;
    for (int i = 1; i < 128; i++) {
        s = gf_mul(s, s);
        r = gf_mul(r, s);
    }
    return r;
}

/* ---- GHASH and the GCM tag ---------------------------------------------- */

/* Fold data[0, len) into the GHASH state x, block by block, the last block
 * zero-padded: x = (x xor block) * H. */
static gf ghash_update(gf x, gf h, const uint8_t *data, size_t len)
{
    for (size_t off = 0; off < len; off += BLOCK) {
        uint8_t block[BLOCK] = {0};
        size_t n = len - off < BLOCK ? len - off : BLOCK;
        memcpy(block, data + off, n);
        x = gf_mul(gf_add(x, gf_load(block)), h);
    }
    return x;
}

/* GHASH_H(A, C) as GCM uses it: A padded, C padded, then the length block
 * u64be(bits of A) || u64be(bits of C). */
static gf ghash(gf h, const uint8_t *aad, size_t aad_len, const uint8_t *ct, size_t ct_len)
{
    gf x = ghash_update((gf){0, 0}, h, aad, aad_len);
    x = ghash_update(x, h, ct, ct_len);
    gf lens = {(uint64_t)aad_len * 8, (uint64_t)ct_len * 8};
    return gf_mul(gf_add(x, lens), h);
}

/* What the tag equation needs of one (key, nonce): H = AES_K(0^128) and
 * AES_K(J0), J0 = nonce || 0^31 || 1. */
typedef struct gcm_model {
    uint8_t key[crypto_aead_aes256gcm_KEYBYTES];
    uint8_t nonce[NONCE_LEN];
    gf h;
    gf ek_j0;
} gcm_model;

/* The GCM tag under m: AES_K(J0) xor GHASH_H(A, C). */
static gf gcm_tag(const gcm_model *m, const uint8_t *aad, size_t aad_len, const uint8_t *ct,
                  size_t ct_len)
{
    return gf_add(m->ek_j0, ghash(m->h, aad, aad_len, ct, ct_len));
}

/* libsodium's tag for an empty message with associated data aad[0, len). */
static gf sodium_empty_tag(const gcm_model *m, const uint8_t *aad, size_t aad_len)
{
    uint8_t tag[crypto_aead_aes256gcm_ABYTES];
    unsigned long long clen = 0;
    assert_int_equal(crypto_aead_aes256gcm_encrypt(tag, &clen, NULL, 0, aad, aad_len, NULL,
                                                   m->nonce, m->key),
                     0);
    assert_int_equal(clen, sizeof tag);
    return gf_load(tag);
}

/*
 * Fill m for (key, nonce) from libsodium's tags alone (no raw AES is
 * exposed):
 *   - empty A, empty C: GHASH is (0 xor 0-length block) * H = 0, so the tag
 *     is AES_K(J0) itself;
 *   - one-block A = a, empty C: tag = AES_K(J0) xor a*H^2 xor L*H, with L
 *     the length block (128, 0).  For a = 1 and a = 0 everything but a*H^2
 *     cancels in the xor of the two tags: it is H^2, and H is its unique
 *     square root.
 * The a = 0 tag then checks the recovered H: it must be AES_K(J0) xor L*H.
 */
static void gcm_model_init(gcm_model *m, const uint8_t key[32], const uint8_t nonce[NONCE_LEN])
{
    uint8_t zero[BLOCK] = {0}, one[BLOCK];
    gf_store(GF_ONE, one);
    memcpy(m->key, key, sizeof m->key);
    memcpy(m->nonce, nonce, sizeof m->nonce);
    m->ek_j0 = sodium_empty_tag(m, NULL, 0);
    gf t_zero = sodium_empty_tag(m, zero, sizeof zero);
    gf t_one = sodium_empty_tag(m, one, sizeof one);
    m->h = gf_sqrt(gf_add(t_one, t_zero));
    gf lens = {BLOCK * 8, 0};
    assert_true(gf_eq(t_zero, gf_add(m->ek_j0, gf_mul(lens, m->h))));
}

/* ---- the attack ------------------------------------------------------------ */

/*
 * Make ct[0, CT_LEN) || tag (tag at ct + CT_LEN) valid under both m1 and m2
 * (same nonce) with associated data aad: random blocks, except block
 * FREE_BLOCK = x, solved from T1(x) = T2(x).  With x = 0 the tags are
 * G1, G2; x enters GHASH multiplied by H^e, e = CT_BLOCKS - FREE_BLOCK + 1
 * (one multiplication by H for its own block, one per later ciphertext
 * block, one for the length block).  So
 *     G1 xor x*H1^e = G2 xor x*H2^e   <=>   x = (G1 xor G2) / (H1^e xor H2^e).
 */
static void craft_salamander(const gcm_model *m1, const gcm_model *m2, const uint8_t *aad,
                             size_t aad_len, uint8_t ct[CT_LEN + BLOCK])
{
    uint8_t *free_block = ct + FREE_BLOCK * BLOCK;
    randombytes_buf(ct, CT_LEN);
    memset(free_block, 0, BLOCK);
    gf g1 = gcm_tag(m1, aad, aad_len, ct, CT_LEN);
    gf g2 = gcm_tag(m2, aad, aad_len, ct, CT_LEN);
    unsigned e = CT_BLOCKS - FREE_BLOCK + 1;
    gf denom = gf_add(gf_pow(m1->h, e), gf_pow(m2->h, e));
    assert_false(gf_is_zero(denom)); /* probability 2^-128 or so for random keys */
    gf x = gf_mul(gf_add(g1, g2), gf_inv(denom));
    gf_store(x, free_block);
    gf t1 = gcm_tag(m1, aad, aad_len, ct, CT_LEN);
    assert_true(gf_eq(t1, gcm_tag(m2, aad, aad_len, ct, CT_LEN)));
    gf_store(t1, ct + CT_LEN);
}

/* libsodium's decryption of ct[0, CT_LEN + 16) under m's key and nonce with
 * aad into pt[0, CT_LEN); returns libsodium's result (0: the tag verified). */
static int sodium_open(const gcm_model *m, const uint8_t *aad, size_t aad_len,
                       const uint8_t ct[CT_LEN + BLOCK], uint8_t pt[CT_LEN])
{
    unsigned long long plen = 0;
    int rc = crypto_aead_aes256gcm_decrypt(pt, &plen, NULL, ct, CT_LEN + BLOCK, aad, aad_len,
                                           m->nonce, m->key);
    if (rc == 0) {
        assert_int_equal(plen, CT_LEN);
    }
    return rc;
}

/* ---- envelopes ----------------------------------------------------------- */

/* One test's world: the in-memory provider with KEY_ID version 1 and a
 * context over it. */
typedef struct world {
    ks_mem_provider mem;
    ks_provider prov;
    ks_ctx *ctx;
} world;

/* cmocka setup: a fresh world. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, KEY_ID, 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    *state = w;
    return 0;
}

/* cmocka teardown: free the world. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&w->mem);
    free(w);
    return 0;
}

/* Skip the calling test, with a message, where libsodium has no AES-GCM. */
static void require_aes(void)
{
    if (!crypto_aead_aes256gcm_is_available()) {
        print_message("skipped: crypto_aead_aes256gcm_is_available() is 0 (no hardware AES)\n");
        skip();
    }
}

/* An aes-256-gcm envelope of the given version for tenant TENANT, key
 * KEY_ID v1, nonce, (v2) purpose PURPOSE and commitment, and ciphertext
 * ct; wrapped_dek not yet set. */
static ks_envelope envelope_of(uint8_t version, const uint8_t nonce[NONCE_LEN],
                               const uint8_t *commitment, const uint8_t ct[CT_LEN + BLOCK])
{
    ks_envelope e;
    memset(&e, 0, sizeof e);
    e.version = version;
    e.algorithm = KS_ALG_AES256GCM;
    e.tenant = BV(TENANT);
    e.key_id = BV(KEY_ID);
    e.key_version = 1;
    e.nonce = (ks_bytes){nonce, NONCE_LEN};
    if (version == KS_FORMAT_V2) {
        e.purpose = BV(PURPOSE);
        e.commitment = (ks_bytes){commitment, KS_COMMITMENT_LEN};
    }
    e.ciphertext = (ks_bytes){ct, CT_LEN + BLOCK};
    return e;
}

/* The data AAD [F-CRYPTO-AAD-1] of e with context CONTEXT, into aad. */
static size_t data_aad(const ks_envelope *e, uint8_t aad[KS_DATA_AAD_MAX])
{
    size_t len = 0;
    assert_int_equal(ks_aad_data(e, BV(CONTEXT), aad, KS_DATA_AAD_MAX, &len), KS_OK);
    return len;
}

/* A malloc'd encoded envelope. */
typedef struct encoded {
    uint8_t *buf;
    size_t len;
} encoded;

/* Have the provider wrap dek for e (with e's wrap AAD, as a writer would),
 * set e's wrapped_dek, and encode e canonically. */
static encoded wrap_and_encode(world *w, ks_envelope e, const uint8_t dek[KS_DEK_LEN])
{
    uint8_t aad[KS_WRAP_AAD_MAX], wrapped[KS_WRAPPED_DEK_MAX];
    size_t aad_len = 0, wlen = 0;
    assert_int_equal(ks_aad_wrap(&e, aad, sizeof aad, &aad_len), KS_OK);
    assert_int_equal(w->prov.ops->wrap(w->prov.self, e.key_id, e.key_version, dek, KS_DEK_LEN,
                                       (ks_bytes){aad, aad_len}, wrapped, sizeof wrapped, &wlen, 0),
                     KS_OK);
    e.wrapped_dek = (ks_bytes){wrapped, wlen};
    encoded out = {NULL, 0};
    assert_int_equal(ks_envelope_encoded_len(&e, NULL, &out.len), KS_OK);
    out.buf = malloc(out.len);
    assert_non_null(out.buf);
    size_t n = 0;
    assert_int_equal(ks_envelope_encode(&e, NULL, out.buf, out.len, &n), KS_OK);
    assert_int_equal(n, out.len);
    return out;
}

/* ks_open of env with context CONTEXT and expected tenant TENANT (and, for
 * v2, purpose PURPOSE) into pt[0, CT_LEN). */
static ks_err open_env(world *w, encoded env, uint8_t version, uint8_t pt[CT_LEN])
{
    ks_open_params p = {BV(CONTEXT), BV(TENANT), {NULL, 0}};
    if (version == KS_FORMAT_V2) {
        p.purpose = BV(PURPOSE);
    }
    size_t n = 0;
    ks_err err = ks_open(w->ctx, env.buf, env.len, &p, pt, CT_LEN, &n, NULL);
    if (err == KS_OK) {
        assert_int_equal(n, CT_LEN);
    }
    return err;
}

/* BLAKE2b-256("KSE" 02 || u32be(1) || dek, salt 0^16, personal) -- the v2
 * (aes-256-gcm) message key or
 * commitment [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2], computed here
 * independently of the library. */
static void v2_derive(const uint8_t dek[KS_DEK_LEN], const char personal[16], uint8_t out[32])
{
    /* "KSE" || 02 || u32be(1, aes-256-gcm) || DEK */
    uint8_t in[8 + KS_DEK_LEN] = {0x4b, 0x53, 0x45, 0x02, 0, 0, 0, 1};
    static const uint8_t salt[crypto_generichash_blake2b_SALTBYTES] = {0};
    memcpy(in + 8, dek, KS_DEK_LEN);
    assert_int_equal(crypto_generichash_blake2b_salt_personal(out, 32, in, sizeof in, NULL, 0, salt,
                                                              (const unsigned char *)personal),
                     0);
    sodium_memzero(in, sizeof in);
}

/* ---- tests ----------------------------------------------------------------- */

/*
 * The field and GHASH, without AES: McGrew and Viega's GCM test case 2
 * (AES-128, key 0, one zero plaintext block) gives H, the ciphertext block
 * and GHASH_H({}, C); and the identities 1*a = a, a*a^-1 = 1,
 * sqrt(a)^2 = a hold on random elements.
 */
static void test_gf_and_ghash(void **state)
{
    (void)state;
    static const uint8_t h_b[BLOCK] = {0x66, 0xe9, 0x4b, 0xd4, 0xef, 0x8a, 0x2c, 0x3b,
                                       0x88, 0x4c, 0xfa, 0x59, 0xca, 0x34, 0x2b, 0x2e};
    static const uint8_t c_b[BLOCK] = {0x03, 0x88, 0xda, 0xce, 0x60, 0xb6, 0xa3, 0x92,
                                       0xf3, 0x28, 0xc2, 0xb9, 0x71, 0xb2, 0xfe, 0x78};
    static const uint8_t want[BLOCK] = {0xf3, 0x8c, 0xbb, 0x1a, 0xd6, 0x92, 0x23, 0xdc,
                                        0xc3, 0x45, 0x7a, 0xe5, 0xb6, 0xb0, 0xf8, 0x85};
    uint8_t got[BLOCK];
    gf_store(ghash(gf_load(h_b), NULL, 0, c_b, sizeof c_b), got);
    assert_memory_equal(got, want, BLOCK);

    for (int i = 0; i < 16; i++) {
        uint8_t r[BLOCK];
        randombytes_buf(r, sizeof r);
        gf a = gf_load(r);
        if (gf_is_zero(a)) {
            continue;
        }
        uint8_t back[BLOCK];
        gf_store(a, back);
        assert_memory_equal(back, r, BLOCK);
        assert_true(gf_eq(gf_mul(GF_ONE, a), a));
        assert_true(gf_eq(gf_mul(a, gf_inv(a)), GF_ONE));
        gf s = gf_sqrt(a);
        assert_true(gf_eq(gf_mul(s, s), a));
        assert_true(gf_eq(gf_pow(a, 3), gf_mul(a, gf_mul(a, a))));
    }
}

/* The model reproduces libsodium: for random keys, nonces, AADs and
 * messages of lengths that are and are not multiples of 16, the tag
 * computed here equals the tag libsodium appends. */
static void test_gcm_model_matches_libsodium(void **state)
{
    (void)state;
    require_aes();
    static const size_t lens[][2] = {{0, 1}, {13, 16}, {16, 31}, {37, 64}, {100, 5}};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint8_t key[32], nonce[NONCE_LEN], aad[100], msg[64], ct[64 + BLOCK];
        randombytes_buf(key, sizeof key);
        randombytes_buf(nonce, sizeof nonce);
        randombytes_buf(aad, sizeof aad);
        randombytes_buf(msg, sizeof msg);
        size_t alen = lens[i][0], mlen = lens[i][1];
        gcm_model m;
        gcm_model_init(&m, key, nonce);
        unsigned long long clen = 0;
        assert_int_equal(crypto_aead_aes256gcm_encrypt(ct, &clen, msg, mlen, aad, alen, NULL,
                                                       nonce, key),
                         0);
        uint8_t tag[BLOCK];
        gf_store(gcm_tag(&m, aad, alen, ct, mlen), tag);
        assert_memory_equal(tag, ct + mlen, BLOCK);
    }
}

/* The attack on raw AES-256-GCM: one (ciphertext, tag) that libsodium
 * accepts under two random keys, with the v1 data AAD of a real envelope,
 * decrypting to two different plaintexts. */
static void test_raw_gcm_two_keys(void **state)
{
    (void)state;
    require_aes();
    uint8_t k1[32], k2[32], nonce[NONCE_LEN], ct[CT_LEN + BLOCK];
    uint8_t aad[KS_DATA_AAD_MAX], pt1[CT_LEN], pt2[CT_LEN];
    randombytes_buf(k1, sizeof k1);
    randombytes_buf(k2, sizeof k2);
    randombytes_buf(nonce, sizeof nonce);
    ks_envelope e = envelope_of(KS_FORMAT_V1, nonce, NULL, ct);
    size_t aad_len = data_aad(&e, aad);
    gcm_model m1, m2;
    gcm_model_init(&m1, k1, nonce);
    gcm_model_init(&m2, k2, nonce);
    craft_salamander(&m1, &m2, aad, aad_len, ct);
    assert_int_equal(sodium_open(&m1, aad, aad_len, ct, pt1), 0);
    assert_int_equal(sodium_open(&m2, aad, aad_len, ct, pt2), 0);
    assert_memory_not_equal(pt1, pt2, CT_LEN);
    /* Not a lucky tag that anything passes: a third key fails. */
    uint8_t k3[32];
    gcm_model m3;
    randombytes_buf(k3, sizeof k3);
    gcm_model_init(&m3, k3, nonce);
    assert_int_not_equal(sodium_open(&m3, aad, aad_len, ct, pt1), 0);
}

/*
 * Format v1 is not key-committing (docs/format.md 7.12, the specified
 * limitation): K = DEK, and the data AAD does not cover wrapped_dek.  An
 * insider who can wrap DEKs crafts one ciphertext for two DEKs and writes
 * two envelopes, identical but for wrapped_dek; ks_open() accepts both,
 * and they show different plaintexts.
 */
static void test_v1_opens_under_two_deks(void **state)
{
    world *w = *state;
    require_aes();
    uint8_t dek1[KS_DEK_LEN], dek2[KS_DEK_LEN], nonce[NONCE_LEN], ct[CT_LEN + BLOCK];
    uint8_t aad[KS_DATA_AAD_MAX], pt1[CT_LEN], pt2[CT_LEN], raw[CT_LEN];
    randombytes_buf(dek1, sizeof dek1);
    randombytes_buf(dek2, sizeof dek2);
    randombytes_buf(nonce, sizeof nonce);
    ks_envelope e = envelope_of(KS_FORMAT_V1, nonce, NULL, ct);
    size_t aad_len = data_aad(&e, aad);
    gcm_model m1, m2;
    gcm_model_init(&m1, dek1, nonce); /* v1: the message key is the DEK */
    gcm_model_init(&m2, dek2, nonce);
    craft_salamander(&m1, &m2, aad, aad_len, ct);

    encoded env1 = wrap_and_encode(w, e, dek1);
    encoded env2 = wrap_and_encode(w, e, dek2);
    assert_int_equal(open_env(w, env1, KS_FORMAT_V1, pt1), KS_OK);
    assert_int_equal(open_env(w, env2, KS_FORMAT_V1, pt2), KS_OK);
    assert_memory_not_equal(pt1, pt2, CT_LEN);
    /* Each is exactly the raw GCM decryption under its DEK. */
    assert_int_equal(sodium_open(&m1, aad, aad_len, ct, raw), 0);
    assert_memory_equal(pt1, raw, CT_LEN);
    assert_int_equal(sodium_open(&m2, aad, aad_len, ct, raw), 0);
    assert_memory_equal(pt2, raw, CT_LEN);
    ks_metrics m;
    ks_ctx_metrics(w->ctx, &m);
    assert_int_equal(m.opens, 2);
    assert_int_equal(m.auth_failures, 0);
    free(env1.buf);
    free(env2.buf);
}

/*
 * Format v2 closes it.  The same attack on the v2 message keys K1', K2'
 * (with the v2 data AAD, which holds DEK1's commitment, so both envelopes
 * must carry that commitment for the one ciphertext to serve both) gives a
 * ciphertext that raw AES-GCM accepts under K2' too; but ks_open()
 * recomputes the commitment from DEK2, it does not match, and the AEAD is
 * never run.  An envelope carrying DEK2's own commitment instead fails at
 * the AEAD, since the commitment is inside the data AAD.
 */
static void test_v2_commitment_stops_it(void **state)
{
    world *w = *state;
    require_aes();
    uint8_t dek1[KS_DEK_LEN], dek2[KS_DEK_LEN], nonce[NONCE_LEN], ct[CT_LEN + BLOCK];
    uint8_t k1[32], k2[32], c1[KS_COMMITMENT_LEN], c2[KS_COMMITMENT_LEN];
    uint8_t aad[KS_DATA_AAD_MAX], pt1[CT_LEN], pt2[CT_LEN], raw[CT_LEN];
    randombytes_buf(dek1, sizeof dek1);
    randombytes_buf(dek2, sizeof dek2);
    randombytes_buf(nonce, sizeof nonce);
    v2_derive(dek1, "keyshift.v2.mkey", k1);
    v2_derive(dek2, "keyshift.v2.mkey", k2);
    v2_derive(dek1, "keyshift.v2.cmmt", c1);
    v2_derive(dek2, "keyshift.v2.cmmt", c2);
    ks_envelope e = envelope_of(KS_FORMAT_V2, nonce, c1, ct);
    size_t aad_len = data_aad(&e, aad);
    gcm_model m1, m2;
    gcm_model_init(&m1, k1, nonce);
    gcm_model_init(&m2, k2, nonce);
    craft_salamander(&m1, &m2, aad, aad_len, ct);
    /* The AEAD alone would accept both keys. */
    assert_int_equal(sodium_open(&m1, aad, aad_len, ct, pt1), 0);
    assert_int_equal(sodium_open(&m2, aad, aad_len, ct, raw), 0);
    assert_memory_not_equal(pt1, raw, CT_LEN);

    encoded env1 = wrap_and_encode(w, e, dek1);
    encoded env2 = wrap_and_encode(w, e, dek2);
    memset(pt2, 0, sizeof pt2);
    assert_int_equal(open_env(w, env1, KS_FORMAT_V2, pt2), KS_OK);
    assert_memory_equal(pt2, pt1, CT_LEN);

    /* A failure before decryption leaves the output untouched (crypto.h):
     * a marker that survives shows the AEAD never ran. */
    ks_metrics before, after;
    uint8_t marker[CT_LEN];
    memset(marker, 0xA5, sizeof marker);
    memcpy(pt2, marker, sizeof pt2);
    ks_ctx_metrics(w->ctx, &before);
    assert_int_equal(open_env(w, env2, KS_FORMAT_V2, pt2), KS_ERR_AUTH_FAILED);
    ks_ctx_metrics(w->ctx, &after);
    assert_int_equal(after.auth_failures, before.auth_failures + 1);
    assert_int_equal(after.auth_fail_commitment, before.auth_fail_commitment + 1);
    assert_int_equal(after.auth_fail_aead, before.auth_fail_aead);
    assert_int_equal(after.auth_fail_unwrap, before.auth_fail_unwrap);
    assert_memory_equal(pt2, marker, CT_LEN);

    /* DEK2 with its own, honest commitment: a different data AAD, so the
     * crafted tag no longer verifies and the AEAD refuses it. */
    e.commitment = (ks_bytes){c2, sizeof c2};
    encoded env3 = wrap_and_encode(w, e, dek2);
    ks_ctx_metrics(w->ctx, &before);
    assert_int_equal(open_env(w, env3, KS_FORMAT_V2, pt2), KS_ERR_AUTH_FAILED);
    ks_ctx_metrics(w->ctx, &after);
    assert_int_equal(after.auth_fail_commitment, before.auth_fail_commitment);
    assert_int_equal(after.auth_fail_aead, before.auth_fail_aead + 1);
    uint8_t zero[CT_LEN] = {0};
    assert_memory_equal(pt2, zero, CT_LEN); /* decryption ran: output wiped */
    free(env1.buf);
    free(env2.buf);
    free(env3.buf);
}

/* The tests, each in a fresh world. */
int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_gf_and_ghash),
        T(test_gcm_model_matches_libsodium),
        T(test_raw_gcm_two_keys),
        T(test_v1_opens_under_two_deks),
        T(test_v2_commitment_stops_it),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
