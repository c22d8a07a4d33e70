/*
 * tests/test_crypto_vectors.c -- the cryptographic test vectors of
 * docs/format.md (Appendix C, section 7), and the loader that reads them
 * (tests/crypto_vectors.h).
 *
 * For every vector of $KS_SPEC (`make unit` sets it; unset, or a spec
 * without ```ks-crypto-vector blocks, fails):
 *
 *   1. the envelope parses (ks_envelope_parse), to exactly the listed field
 *      values for an ok vector;
 *   2. the listed wrap AAD and data AAD equal ks_aad_wrap / ks_aad_data for
 *      the parsed envelope and the listed context [F-CRYPTO-AAD-1..2];
 *   3. with libsodium called directly, independently of the library's
 *      crypto core: the local wrap, message key, commitment and ciphertext
 *      are recomputed from the listed inputs [F-CRYPTO-WRAP-1],
 *      [F-CRYPTO-KEY-1], [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2], [F-CRYPTO-AEAD-1], and a
 *      reference opener that follows [F-CRYPTO-OPEN-1] step by step opens
 *      every ok vector to its plaintext and fails every auth-failed vector;
 *      and each of the library's two AEAD engines (migrate/crypto/aead.h:
 *      OpenSSL, libsodium) gives and opens every ok vector's ciphertext;
 *   4. the library: a local keyring holding the KEK as version key_version
 *      (versions before it get random KEKs), its provider unwraps the
 *      listed wrapped DEK, and ks_open gives the plaintext, or
 *      KS_ERR_AUTH_FAILED for an auth-failed vector [F-CRYPTO-OPEN-1].
 *
 * The error table of section 7.10 is also checked against ks_err_name and
 * ks_err_is_retryable [F-CRYPTO-ERR-1].
 *
 * Check 4 runs the keyring (migrate/keys/keyring*.c) and the crypto core
 * (migrate/crypto/crypto.c), which every test binary links: nothing is skipped.
 * No test is timed.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, rmdir, unlink */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/aad.h>
#include <keyshift/crypto.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/keyring.h>
#include <keyshift/provider.h>

#include "../migrate/crypto/aead.h"
#include "crypto_vectors.h"
#include "envelope_eq.h"

/* ---- loading the spec ------------------------------------------------------------ */

/* Load every crypto vector of $KS_SPEC, failing the test when the variable
 * is unset, the file unreadable, the appendix malformed or empty. */
static void load_spec(kcv_set *vs, char **text_out, size_t *len_out)
{
    const char *path = getenv("KS_SPEC");
    if (path == NULL || path[0] == '\0') {
        fail_msg("KS_SPEC is not set (run the tests through `make unit`)");
    }
    size_t len = 0;
    char *text = NULL;
    const char *why = ks_test_read_file(path, &text, &len);
    if (why != NULL) {
        fail_msg("%s: cannot read: %s", path, why);
    }
    char err[512];
    if (kcv_parse(text, len, path, vs, err, sizeof err) != 0) {
        free(text);
        fail_msg("loading the spec's crypto vectors: %s", err);
    }
    if (vs->count == 0) {
        free(text);
        fail_msg("%s has no ```ks-crypto-vector blocks (Appendix C)", path);
    }
    if (text_out != NULL) {
        *text_out = text;
        *len_out = len;
    } else {
        free(text);
    }
}

static const kcv_vector *find_vector(const kcv_set *vs, const char *name)
{
    for (size_t i = 0; i < vs->count; i++) {
        if (strcmp(vs->v[i].name_z, name) == 0) {
            return &vs->v[i];
        }
    }
    return NULL;
}

static int bytes_eq(const kcv_bytes *a, const uint8_t *p, size_t n)
{
    return a->n == n && (n == 0 || memcmp(a->p, p, n) == 0);
}

/* ---- the reference opener: libsodium, section 7, nothing of the crypto core ----- */

enum { REF_OK = 0, REF_BINDING, REF_UNWRAP, REF_COMMITMENT, REF_AEAD, REF_UNAVAILABLE };

static const char *const ref_stage[] = {"ok", "tenant/purpose binding", "unwrap", "commitment",
                                        "AEAD tag", "algorithm unavailable"};

/* BLAKE2b-256("KSE" || 02 || u32be(algorithm) || DEK), unkeyed, zero salt,
 * the given 16-byte personalisation [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]:
 * a function of the DEK and the algorithm alone, never of the nonce. */
static void ref_derive(uint8_t out[32], const uint8_t dek[32], uint32_t alg, const char *personal)
{
    static const uint8_t salt[crypto_generichash_blake2b_SALTBYTES];
    uint8_t in[8 + 32] = {0x4b, 0x53, 0x45, 0x02, (uint8_t)(alg >> 24), (uint8_t)(alg >> 16),
                          (uint8_t)(alg >> 8), (uint8_t)alg};
    assert_true(strlen(personal) == crypto_generichash_blake2b_PERSONALBYTES);
    memcpy(in + 8, dek, 32);
    assert_int_equal(crypto_generichash_blake2b_salt_personal(out, 32, in, sizeof in, NULL, 0, salt,
                                                              (const uint8_t *)personal),
                     0);
    sodium_memzero(in, sizeof in);
}

/* AEAD decrypt [F-CRYPTO-ALG-1]; 0 when the tag verifies. */
static int ref_aead_open(uint32_t alg, const uint8_t key[32], ks_bytes nonce, const uint8_t *aad,
                         size_t aad_len, ks_bytes ct, uint8_t *pt)
{
    unsigned long long n = 0;
    if (alg == KS_ALG_AES256GCM) {
        return crypto_aead_aes256gcm_decrypt(pt, &n, NULL, ct.ptr, ct.len, aad, aad_len, nonce.ptr,
                                             key);
    }
    return crypto_aead_xchacha20poly1305_ietf_decrypt(pt, &n, NULL, ct.ptr, ct.len, aad, aad_len,
                                                      nonce.ptr, key);
}

/* Open env with the KEK of v, following [F-CRYPTO-OPEN-1]: returns the
 * stage that failed, or REF_OK with the plaintext in pt (env->ciphertext.len
 * - 16 bytes). */
static int ref_open(const kcv_vector *v, const ks_envelope *env, uint8_t *pt)
{
    /* 2. binding: the reader expects the vector's tenant and purpose */
    if (!ks_test_bytes_eq(env->tenant, kcv_view(&v->tenant)) ||
        (v->purpose.have && !ks_test_bytes_eq(env->purpose, kcv_view(&v->purpose)))) {
        return REF_BINDING;
    }
    /* 3. unwrap: the local provider's format [F-CRYPTO-WRAP-1] */
    uint8_t wa[KS_WRAP_AAD_MAX], da[KS_DATA_AAD_MAX], dek[32], k[32];
    size_t wa_len = 0, da_len = 0;
    assert_int_equal(ks_aad_wrap(env, wa, sizeof wa, &wa_len), KS_OK);
    unsigned long long dek_len = 0;
    if (env->wrapped_dek.len != KS_LOCAL_WRAPPED_LEN ||
        crypto_aead_xchacha20poly1305_ietf_decrypt(
            dek, &dek_len, NULL, env->wrapped_dek.ptr + 24, env->wrapped_dek.len - 24, wa, wa_len,
            env->wrapped_dek.ptr, v->kek.p) != 0 ||
        dek_len != 32) {
        return REF_UNWRAP;
    }
    /* 4. commitment, 5. message key */
    if (env->version == KS_FORMAT_V2) {
        uint8_t c[32];
        ref_derive(c, dek, env->algorithm, "keyshift.v2.cmmt");
        if (crypto_verify_32(c, env->commitment.ptr) != 0) {
            sodium_memzero(dek, sizeof dek);
            return REF_COMMITMENT;
        }
        ref_derive(k, dek, env->algorithm, "keyshift.v2.mkey");
    } else {
        memcpy(k, dek, 32);
    }
    sodium_memzero(dek, sizeof dek);
    /* 6. AEAD */
    assert_int_equal(ks_aad_data(env, kcv_view(&v->context), da, sizeof da, &da_len), KS_OK);
    if (env->algorithm == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
        sodium_memzero(k, sizeof k);
        return REF_UNAVAILABLE;
    }
    int rc = ref_aead_open(env->algorithm, k, env->nonce, da, da_len, env->ciphertext, pt);
    sodium_memzero(k, sizeof k);
    return rc == 0 ? REF_OK : REF_AEAD;
}

/* ---- checks 1 to 3 ------------------------------------------------------------------ */

/* Nonzero while a test deliberately breaks vectors: CHECK then stays quiet. */
static int g_quiet;

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            if (!g_quiet) {                                                                      \
                print_error("%s (line %zu): ", v->name_z, v->line);                              \
                print_error(__VA_ARGS__);                                                        \
                print_error("\n");                                                               \
            }                                                                                    \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* The library's AEAD engine e (migrate/crypto/aead.h) gives v's
 * ciphertext under the message key k, and opens it to v's plaintext. */
static int engine_ok(const kcv_vector *v, ks_aead_engine e, const uint8_t k[32])
{
    ks_aead_evp se = {0}, sd = {0};
    const uint64_t serial = ks_aead_serial();
    const ks_aead_key enc = {v->algorithm, k, NULL, &se, serial}, dec = {v->algorithm, k, NULL, &sd, serial};
    uint8_t *ct = malloc(v->plaintext.n + KS_TAG_LEN), *back = malloc(v->plaintext.n + 1);
    assert_non_null(ct);
    assert_non_null(back);
    int ok = ks_aead_encrypt(e, &enc, ct, v->plaintext.p, v->plaintext.n, v->data_aad.p, v->data_aad.n,
                             v->nonce.p) == 0 &&
             bytes_eq(&v->ciphertext, ct, v->plaintext.n + KS_TAG_LEN) &&
             ks_aead_decrypt(e, &dec, back, v->ciphertext.p, v->ciphertext.n, v->data_aad.p, v->data_aad.n,
                             v->nonce.p) == 0 &&
             bytes_eq(&v->plaintext, back, v->plaintext.n);
    ks_aead_evp_free(&se);
    ks_aead_evp_free(&sd);
    free(ct);
    free(back);
    return ok;
}

/* Checks 1 to 3 for an ok vector; 0 when all pass. */
static int check_ok_static(const kcv_vector *v)
{
    ks_envelope e;
    ks_parse_error perr;
    ks_err rc = ks_envelope_parse(v->envelope.p, v->envelope.n, NULL, &e, &perr);
    CHECK(rc == KS_OK, "envelope does not parse: %s at %zu", ks_err_name(rc), perr.offset);

    /* 1. the listed fields */
    CHECK(e.version == v->version, "version %u, listed %u", e.version, v->version);
    CHECK(e.algorithm == v->algorithm, "algorithm %u, listed %u", e.algorithm, v->algorithm);
    CHECK(ks_test_bytes_eq(e.tenant, kcv_view(&v->tenant)), "tenant differs");
    CHECK(ks_test_bytes_eq(e.key_id, kcv_view(&v->key_id)), "key_id differs");
    CHECK(e.key_version == v->key_version, "key_version %u, listed %u", e.key_version,
          v->key_version);
    CHECK(ks_test_bytes_eq(e.wrapped_dek, kcv_view(&v->wrapped_dek)), "wrapped_dek differs");
    CHECK(ks_test_bytes_eq(e.nonce, kcv_view(&v->nonce)), "nonce differs");
    CHECK(ks_test_bytes_eq(e.purpose, kcv_view(&v->purpose)), "purpose differs");
    CHECK(ks_test_bytes_eq(e.commitment, kcv_view(&v->commitment)), "commitment differs");
    CHECK(ks_test_bytes_eq(e.ciphertext, kcv_view(&v->ciphertext)), "ciphertext differs");
    CHECK(v->ciphertext.n == v->plaintext.n + KS_TAG_LEN, "ciphertext is not plaintext + tag");

    /* 2. the AADs, as the library builds them */
    uint8_t wa[KS_WRAP_AAD_MAX], da[KS_DATA_AAD_MAX];
    size_t wa_len = 0, da_len = 0;
    CHECK(ks_aad_wrap(&e, wa, sizeof wa, &wa_len) == KS_OK, "ks_aad_wrap failed");
    CHECK(bytes_eq(&v->wrap_aad, wa, wa_len), "wrap_aad differs from ks_aad_wrap");
    CHECK(ks_aad_data(&e, kcv_view(&v->context), da, sizeof da, &da_len) == KS_OK,
          "ks_aad_data failed");
    CHECK(bytes_eq(&v->data_aad, da, da_len), "data_aad differs from ks_aad_data");

    /* 3. libsodium directly: the local wrap [F-CRYPTO-WRAP-1] */
    uint8_t wrapped[KS_LOCAL_WRAPPED_LEN];
    unsigned long long n = 0;
    memcpy(wrapped, v->wrap_nonce.p, 24);
    crypto_aead_xchacha20poly1305_ietf_encrypt(wrapped + 24, &n, v->dek.p, 32, v->wrap_aad.p,
                                               v->wrap_aad.n, NULL, v->wrap_nonce.p, v->kek.p);
    CHECK(n == 48 && bytes_eq(&v->wrapped_dek, wrapped, sizeof wrapped),
          "wrapped_dek is not wn || XChaCha20-Poly1305(kek, wn, dek, wrap_aad)");

    /* the message key and commitment [F-CRYPTO-KEY-1], [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2] */
    uint8_t k[32];
    if (v->version == 2) {
        uint8_t c[32];
        ref_derive(k, v->dek.p, v->algorithm, "keyshift.v2.mkey");
        ref_derive(c, v->dek.p, v->algorithm, "keyshift.v2.cmmt");
        CHECK(bytes_eq(&v->message_key, k, 32), "message_key is not BLAKE2b(KSE 02 || alg || dek, mkey)");
        CHECK(bytes_eq(&v->commitment, c, 32), "commitment is not BLAKE2b(KSE 02 || alg || dek, cmmt)");
    } else {
        memcpy(k, v->dek.p, 32);
    }

    /* the ciphertext [F-CRYPTO-AEAD-1] */
    if (v->algorithm == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
        print_message("%s: note: AES-256-GCM unavailable here; ciphertext not recomputed\n",
                      v->name_z);
        return 0;
    }
    uint8_t *ct = malloc(v->plaintext.n + KS_TAG_LEN);
    assert_non_null(ct);
    if (v->algorithm == KS_ALG_AES256GCM) {
        crypto_aead_aes256gcm_encrypt(ct, &n, v->plaintext.p, v->plaintext.n, v->data_aad.p,
                                      v->data_aad.n, NULL, v->nonce.p, k);
    } else {
        crypto_aead_xchacha20poly1305_ietf_encrypt(ct, &n, v->plaintext.p, v->plaintext.n,
                                                   v->data_aad.p, v->data_aad.n, NULL, v->nonce.p,
                                                   k);
    }
    int same = bytes_eq(&v->ciphertext, ct, (size_t)n);
    free(ct);
    CHECK(same, "ciphertext is not AEAD(K, nonce, data_aad, plaintext)");
    for (int eng = KS_AEAD_SODIUM; eng <= KS_AEAD_OPENSSL; eng++) {
        CHECK(engine_ok(v, (ks_aead_engine)eng, k), "the %s engine does not give (or open) the ciphertext",
              eng == KS_AEAD_SODIUM ? "libsodium" : "OpenSSL");
    }

    /* the reference opener */
    uint8_t *pt = malloc(v->plaintext.n + 1);
    assert_non_null(pt);
    int stage = ref_open(v, &e, pt);
    same = stage == REF_OK && bytes_eq(&v->plaintext, pt, v->plaintext.n);
    free(pt);
    CHECK(same, "the reference opener fails at: %s", ref_stage[stage]);
    return 0;
}

/* Checks 1 and 3 for an auth-failed vector; 0 when all pass. */
static int check_fail_static(const kcv_set *vs, const kcv_vector *v)
{
    const kcv_vector *b = find_vector(vs, v->base_z);
    CHECK(b != NULL && b->expect_ok, "base %s is not an ok vector", v->base_z);
    /* The change is real: not the base opened as the base is. */
    CHECK(!bytes_eq(&v->envelope, b->envelope.p, b->envelope.n) ||
              !bytes_eq(&v->context, b->context.p, b->context.n) ||
              !bytes_eq(&v->tenant, b->tenant.p, b->tenant.n) ||
              !bytes_eq(&v->purpose, b->purpose.p, b->purpose.n),
          "identical to its base %s", v->base_z);

    ks_envelope e;
    ks_parse_error perr;
    ks_err rc = ks_envelope_parse(v->envelope.p, v->envelope.n, NULL, &e, &perr);
    CHECK(rc == KS_OK, "envelope does not parse (%s at %zu): the failure must be cryptographic",
          ks_err_name(rc), perr.offset);
    CHECK(e.version == v->version && e.algorithm == v->algorithm &&
              ks_test_bytes_eq(e.key_id, kcv_view(&v->key_id)) && e.key_version == v->key_version,
          "version, algorithm, key_id or key_version differ from the envelope's");

    uint8_t *pt = malloc(e.ciphertext.len);
    assert_non_null(pt);
    int stage = ref_open(v, &e, pt);
    free(pt);
    if (stage == REF_UNAVAILABLE) {
        print_message("%s: note: AES-256-GCM unavailable here; AEAD step not run\n", v->name_z);
        return 0;
    }
    CHECK(stage != REF_OK, "the reference opener opens it");
    print_message("%s: the reference opener fails at: %s\n", v->name_z, ref_stage[stage]);
    return 0;
}

/* Checks 1 to 3 for every vector of the spec, and its coverage. */
static void test_spec_static(void **state)
{
    (void)state;
    kcv_set vs;
    load_spec(&vs, NULL, NULL);
    int failed = 0, seen[3][3] = {{0}}, empty = 0, fails = 0;
    for (size_t i = 0; i < vs.count; i++) {
        const kcv_vector *v = &vs.v[i];
        if (v->expect_ok) {
            failed += check_ok_static(v);
            seen[v->version][v->algorithm] = 1;
            empty |= v->plaintext.n == 0;
        } else {
            failed += check_fail_static(&vs, v);
            fails++;
        }
    }
    print_message("%zu crypto vectors checked, %d failed\n", vs.count, failed);
    kcv_free(&vs);
    assert_int_equal(failed, 0);
    /* Appendix C covers v1 and v2 with both algorithms, an empty plaintext
     * and failures. */
    assert_true(seen[1][1] && seen[1][2] && seen[2][1] && seen[2][2]);
    assert_true(empty);
    assert_true(fails > 0);
}

/* ---- check 4: the library ------------------------------------------------------- */

/* A reference provider, in the test: the local provider's wrap format
 * [F-CRYPTO-WRAP-1] over the one KEK of a vector, held as version
 * key_version of key_id (every other key or version is not-found).  It lets
 * ks_open be checked without the keyring, and the keyring without ks_open. */
typedef struct ref_provider {
    const kcv_vector *v;
} ref_provider;

static ks_err ref_check_key(const ref_provider *rp, ks_bytes key_id, uint32_t key_version)
{
    return ks_test_bytes_eq(key_id, kcv_view(&rp->v->key_id)) &&
                   key_version == rp->v->key_version
               ? KS_OK
               : KS_ERR_NOT_FOUND;
}

static ks_err ref_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                       size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len,
                       uint32_t timeout_ms)
{
    const ref_provider *rp = self;
    (void)timeout_ms;
    ks_err rc = ref_check_key(rp, key_id, key_version);
    if (rc != KS_OK) {
        return rc;
    }
    if (dek_len != KS_DEK_LEN) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (cap < KS_LOCAL_WRAPPED_LEN) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    unsigned long long n = 0;
    randombytes_buf(out, 24);
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + 24, &n, dek, dek_len, aad.ptr, aad.len, NULL,
                                               out, rp->v->kek.p);
    *out_len = KS_LOCAL_WRAPPED_LEN;
    return KS_OK;
}

static ks_err ref_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                         ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    const ref_provider *rp = self;
    (void)timeout_ms;
    memset(dek, 0, dek_len);
    ks_err rc = ref_check_key(rp, key_id, key_version);
    if (rc != KS_OK) {
        return rc;
    }
    if (dek_len != KS_DEK_LEN) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    unsigned long long n = 0;
    if (wrapped.len != KS_LOCAL_WRAPPED_LEN ||
        crypto_aead_xchacha20poly1305_ietf_decrypt(dek, &n, NULL, wrapped.ptr + 24,
                                                   wrapped.len - 24, aad.ptr, aad.len,
                                                   wrapped.ptr, rp->v->kek.p) != 0) {
        memset(dek, 0, dek_len);
        return KS_ERR_AUTH_FAILED;
    }
    return KS_OK;
}

static ks_err ref_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                           uint32_t timeout_ms)
{
    const ref_provider *rp = self;
    (void)timeout_ms;
    ks_err rc = ref_check_key(rp, key_id, key_version == 0 ? rp->v->key_version : key_version);
    if (rc == KS_OK) {
        out->version = rp->v->key_version;
        out->state = KS_KEY_ACTIVE;
        out->is_primary = 1;
    }
    return rc;
}

static const ks_provider_ops ref_provider_ops = {ref_wrap, ref_unwrap, ref_key_info, NULL, NULL};

/* A temporary local keyring. */
typedef struct keyring_env {
    char dir[4096];
    char path[4200];
    ks_keyring *kr;
    ks_provider prov;
    int have_prov;
} keyring_env;

static void keyring_teardown(keyring_env *ke)
{
    if (ke->have_prov) {
        ks_provider_destroy(&ke->prov);
        ke->have_prov = 0;
    }
    ks_keyring_close(ke->kr);
    ke->kr = NULL;
    if (ke->dir[0] != '\0') {
        char lock[4300];
        snprintf(lock, sizeof lock, "%s.lock", ke->path);
        unlink(lock);
        unlink(ke->path);
        if (rmdir(ke->dir) != 0) {
            print_message("note: could not remove the temporary keyring directory\n");
        }
        ke->dir[0] = '\0';
    }
}

/* A keyring, in a fresh temporary directory, in which v->key_id holds
 * v->kek as version v->key_version (the versions before it random), and
 * its provider.  0, or 1 with a message; keyring_teardown() either way. */
static int keyring_setup(const kcv_vector *v, keyring_env *ke)
{
    memset(ke, 0, sizeof *ke);
    const char *tmp = getenv("TMPDIR");
    snprintf(ke->dir, sizeof ke->dir, "%s/ks-crypto-vectors-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(ke->dir) == NULL) {
        ke->dir[0] = '\0';
        CHECK(0, "mkdtemp failed");
    }
    snprintf(ke->path, sizeof ke->path, "%s/keyring", ke->dir);
    const ks_bytes none = {NULL, 0};
    ks_err rc = ks_keyring_init(ke->path, none);
    CHECK(rc == KS_OK, "ks_keyring_init: %s", ks_err_name(rc));
    ks_parse_error perr;
    rc = ks_keyring_open(ke->path, none, &ke->kr, &perr);
    CHECK(rc == KS_OK, "ks_keyring_open: %s", ks_err_name(rc));
    /* Version 1 is created with random material; the fixed KEK must land
     * on key_version, so the vectors need key_version >= 2. */
    CHECK(v->key_version >= 2 && v->key_version <= 16, "key_version %u: want 2 .. 16",
          v->key_version);
    rc = ks_keyring_create(ke->kr, kcv_view(&v->key_id));
    CHECK(rc == KS_OK, "ks_keyring_create: %s", ks_err_name(rc));
    uint32_t got = 1;
    while (got < v->key_version) {
        uint8_t kek[KS_KEK_LEN];
        if (got + 1 == v->key_version) {
            memcpy(kek, v->kek.p, KS_KEK_LEN);
        } else {
            randombytes_buf(kek, sizeof kek);
        }
        uint32_t prev = got;
        rc = ks_keyring_import_version(ke->kr, kcv_view(&v->key_id), kek, &got);
        sodium_memzero(kek, sizeof kek);
        CHECK(rc == KS_OK, "ks_keyring_import_version: %s", ks_err_name(rc));
        CHECK(got == prev + 1, "ks_keyring_import_version gave version %u after %u", got, prev);
    }
    rc = ks_keyring_provider(ke->kr, &ke->prov);
    CHECK(rc == KS_OK, "ks_keyring_provider: %s", ks_err_name(rc));
    ke->have_prov = 1;
    return 0;
}

/* Open v's envelope with ks_open over prov (a fresh context) and compare
 * with the expectation; 0 when it matches. */
static int check_open(const kcv_vector *v, const ks_provider *prov, const char *via)
{
    ks_ctx *ctx = NULL;
    ks_err rc = ks_ctx_new(prov, NULL, &ctx);
    CHECK(rc == KS_OK, "ks_ctx_new (%s): %s", via, ks_err_name(rc));
    const int aes_missing =
        v->algorithm == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available();
    ks_open_params op = {kcv_view(&v->context), kcv_view(&v->tenant), kcv_view(&v->purpose)};
    size_t cap = v->envelope.n; /* more than any plaintext in it */
    uint8_t *pt = malloc(cap);
    assert_non_null(pt);
    memset(pt, 0xA5, cap);
    size_t pt_len = 0;
    ks_parse_error perr;
    int bad = 0;
    rc = ks_open(ctx, v->envelope.p, v->envelope.n, &op, pt, cap, &pt_len, &perr);
    if (aes_missing) {
        if (rc != KS_ERR_ALGORITHM_UNAVAILABLE) {
            print_error("%s: ks_open (%s) without AES-256-GCM: %s, want algorithm-unavailable\n",
                        v->name_z, via, ks_err_name(rc));
            bad = 1;
        }
    } else if (v->expect_ok) {
        if (rc != KS_OK || !bytes_eq(&v->plaintext, pt, pt_len)) {
            print_error("%s: ks_open (%s): %s%s\n", v->name_z, via, ks_err_name(rc),
                        rc == KS_OK ? ", wrong plaintext" : "");
            bad = 1;
        }
    } else {
        if (rc != KS_ERR_AUTH_FAILED) {
            print_error("%s: ks_open (%s): %s, want auth-failed\n", v->name_z, via,
                        ks_err_name(rc));
            bad = 1;
        }
        /* No plaintext is released: the buffer holds only what it held
         * before (A5) or zeros. */
        for (size_t i = 0; i < cap && !bad; i++) {
            if (pt[i] != 0 && pt[i] != 0xA5) {
                print_error("%s: ks_open (%s) failed but wrote byte %zu of the output\n",
                            v->name_z, via, i);
                bad = 1;
            }
        }
    }
    free(pt);
    ks_ctx_free(ctx);
    return bad;
}

/* 4a. The crypto core: ks_open over the reference provider. */
static void test_spec_open_reference_provider(void **state)
{
    (void)state;
    kcv_set vs;
    load_spec(&vs, NULL, NULL);
    int failed = 0;
    for (size_t i = 0; i < vs.count; i++) {
        ref_provider rp = {&vs.v[i]};
        ks_provider prov = {&ref_provider_ops, &rp, "test-reference"};
        failed += check_open(&vs.v[i], &prov, "reference provider");
    }
    print_message("%zu crypto vectors through ks_open and the reference provider, %d failed\n",
                  vs.count, failed);
    kcv_free(&vs);
    assert_int_equal(failed, 0);
}

/* 4b, for one vector: the keyring's provider unwraps the envelope's
 * wrapped DEK with its wrap AAD exactly when the reference opener does,
 * to the listed DEK (or the base's). */
static int check_keyring_unwrap(const kcv_set *vs, const kcv_vector *v)
{
    keyring_env ke;
    if (keyring_setup(v, &ke) != 0) {
        keyring_teardown(&ke);
        return 1;
    }
    ks_envelope e;
    ks_parse_error perr;
    uint8_t wa[KS_WRAP_AAD_MAX], dek[KS_DEK_LEN];
    size_t wa_len = 0;
    int bad = ks_envelope_parse(v->envelope.p, v->envelope.n, NULL, &e, &perr) != KS_OK ||
              ks_aad_wrap(&e, wa, sizeof wa, &wa_len) != KS_OK;
    const kcv_vector *ref = v->expect_ok ? v : find_vector(vs, v->base_z);
    if (!bad) {
        /* What the reference says: the local wrap under the fixed KEK. */
        uint8_t want[KS_DEK_LEN];
        unsigned long long n = 0;
        int opens = e.wrapped_dek.len == KS_LOCAL_WRAPPED_LEN &&
                    crypto_aead_xchacha20poly1305_ietf_decrypt(
                        want, &n, NULL, e.wrapped_dek.ptr + 24, e.wrapped_dek.len - 24, wa,
                        wa_len, e.wrapped_dek.ptr, v->kek.p) == 0;
        ks_bytes aad = {wa, wa_len};
        ks_err rc = ke.prov.ops->unwrap(ke.prov.self, e.key_id, e.key_version, e.wrapped_dek, aad,
                                        dek, sizeof dek, 0);
        if (opens && (rc != KS_OK || ref == NULL || !bytes_eq(&ref->dek, dek, sizeof dek))) {
            print_error("%s: the local provider's unwrap: %s%s\n", v->name_z, ks_err_name(rc),
                        rc == KS_OK ? ", wrong DEK" : "");
            bad = 1;
        }
        if (!opens && rc != KS_ERR_AUTH_FAILED) {
            print_error("%s: the local provider's unwrap: %s, want auth-failed\n", v->name_z,
                        ks_err_name(rc));
            bad = 1;
        }
        sodium_memzero(want, sizeof want);
        sodium_memzero(dek, sizeof dek);
    }
    keyring_teardown(&ke);
    return bad;
}

/* 4b. The keyring: its provider against the wrapped DEKs of Appendix C. */
static void test_spec_keyring_unwrap(void **state)
{
    (void)state;
    kcv_set vs;
    load_spec(&vs, NULL, NULL);
    int failed = 0;
    for (size_t i = 0; i < vs.count; i++) {
        failed += check_keyring_unwrap(&vs, &vs.v[i]);
    }
    print_message("%zu wrapped DEKs through the local provider, %d failed\n", vs.count, failed);
    kcv_free(&vs);
    assert_int_equal(failed, 0);
}

/* 4c. Both: ks_open with a keyring that holds the KEK at key_version. */
static void test_spec_open_keyring(void **state)
{
    (void)state;
    kcv_set vs;
    load_spec(&vs, NULL, NULL);
    int failed = 0;
    for (size_t i = 0; i < vs.count; i++) {
        keyring_env ke;
        const kcv_vector *v = &vs.v[i];
        if (keyring_setup(v, &ke) != 0) {
            failed++;
        } else {
            failed += check_open(v, &ke.prov, "local keyring");
        }
        keyring_teardown(&ke);
    }
    print_message("%zu crypto vectors through ks_open and the local keyring, %d failed\n",
                  vs.count, failed);
    kcv_free(&vs);
    assert_int_equal(failed, 0);
}

/* ---- the error table of section 7.10 -------------------------------------------- */

/* Every row "| code | `name` | meaning | retried |" of the table in
 * section 7.10 matches ks_err_name and ks_err_is_retryable. */
static void test_spec_error_table(void **state)
{
    (void)state;
    kcv_set vs;
    char *text = NULL;
    size_t len = 0;
    load_spec(&vs, &text, &len);
    kcv_free(&vs);
    const char *start = NULL;
    for (size_t i = 0; i + 1 < len && start == NULL; i++) {
        if ((i == 0 || text[i - 1] == '\n') && strncmp(text + i, "### 7.10 Errors", 15) == 0) {
            start = text + i;
        }
    }
    if (start == NULL) {
        free(text);
        fail_msg("no section '### 7.10 Errors' in the spec");
    }
    const char *end = text + len;
    size_t rows = 0;
    int bad = 0;
    for (const char *p = strchr(start, '\n'); p != NULL && p + 1 < end; p = strchr(p + 1, '\n')) {
        const char *line = p + 1;
        if (strncmp(line, "###", 3) == 0 || strncmp(line, "## ", 3) == 0) {
            break;
        }
        unsigned code = 0;
        char name[64], retried[16];
        /* | 64 | `auth-failed` | ... | never | */
        if (sscanf(line, "| %u | `%63[a-z-]` |", &code, name) != 2) {
            continue;
        }
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t ll = nl != NULL ? (size_t)(nl - line) : (size_t)(end - line);
        /* the last cell */
        size_t e = ll;
        while (e > 0 && (line[e - 1] == ' ' || line[e - 1] == '|' || line[e - 1] == '\r')) {
            e--;
        }
        size_t b = e;
        while (b > 0 && line[b - 1] != '|') {
            b--;
        }
        while (b < e && line[b] == ' ') {
            b++;
        }
        snprintf(retried, sizeof retried, "%.*s", (int)(e - b), line + b);
        rows++;
        if (strcmp(ks_err_name((ks_err)code), name) != 0) {
            print_error("section 7.10: code %u is '%s' in the spec, '%s' in the library\n", code,
                        name, ks_err_name((ks_err)code));
            bad = 1;
        }
        const int yes = strcmp(retried, "yes") == 0;
        if (yes != (ks_err_is_retryable((ks_err)code) != 0)) {
            print_error("section 7.10: %s: retried '%s' in the spec, library disagrees\n", name,
                        retried);
            bad = 1;
        }
    }
    free(text);
    assert_false(bad);
    assert_true(rows >= 10);
}

/* ---- the loader itself ---------------------------------------------------------- */

#define KCV_OK_V1                                                                                \
    "name: t-ok\n"                                                                               \
    "expect: ok\n"                                                                               \
    "version: 1\n"                                                                               \
    "algorithm: 1\n"                                                                             \
    "tenant: \"acme\"\n"                                                                         \
    "key_id: \"k/1\"\n"                                                                          \
    "key_version: 3\n"                                                                           \
    "context: \"\"\n"                                                                            \
    "plaintext: \"hi there\"\n"                                                                  \
    "kek: 000102030405060708090a0b0c0d0e0f 101112131415161718191a1b1c1d1e1f\n"                   \
    "dek: 000102030405060708090a0b0c0d0e0f\n"                                                    \
    "dek: 101112131415161718191a1b1c1d1e1f\n"                                                    \
    "wrap_nonce: 000102030405060708090a0b0c0d0e0f1011121314151617\n"                             \
    "wrap_aad: 00\n"                                                                             \
    "wrapped_dek: 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n"            \
    "wrapped_dek: 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n"            \
    "wrapped_dek: 0001020304050607\n"                                                            \
    "nonce: 000102030405060708090a0b\n"                                                          \
    "data_aad: 00\n"                                                                             \
    "ciphertext: 00\n"                                                                           \
    "envelope: 4b 53 45 01\n"

#define KCV_FAIL_V1                                                                              \
    "name: t-fail\n"                                                                             \
    "expect: auth-failed\n"                                                                      \
    "base: t-ok\n"                                                                               \
    "version: 1\n"                                                                               \
    "algorithm: 2\n"                                                                             \
    "tenant: \"acme\"\n"                                                                         \
    "key_id: \"k/1\"\n"                                                                          \
    "key_version: 3\n"                                                                           \
    "context: c3a9\n"                                                                            \
    "kek: 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n"                    \
    "envelope: 4b534501\n"

/* Well-formed blocks load as written; other fences are skipped. */
static void test_loader_accepts(void **state)
{
    (void)state;
    static const char md[] = "# t\n"
                             "```ks-vector\nname: x\n```\n"
                             "~~~\n```ks-crypto-vector\nnot a vector\n```\n~~~\n"
                             "```ks-crypto-vector\n" KCV_OK_V1 "```\n"
                             "text\n"
                             "  ```ks-crypto-vector\r\n" KCV_FAIL_V1 "  ```\r\n";
    kcv_set vs;
    char err[256];
    if (kcv_parse(md, sizeof md - 1, "self", &vs, err, sizeof err) != 0) {
        fail_msg("%s", err);
    }
    assert_int_equal(vs.count, 2);
    const kcv_vector *a = &vs.v[0], *b = &vs.v[1];
    assert_string_equal(a->name_z, "t-ok");
    assert_int_equal(a->line, 10);
    assert_true(a->expect_ok);
    assert_int_equal(a->version, 1);
    assert_int_equal(a->key_version, 3);
    assert_int_equal(a->tenant.n, 4);
    assert_memory_equal(a->tenant.p, "acme", 4);
    assert_true(a->context.have);
    assert_int_equal(a->context.n, 0);
    assert_null(a->context.p);
    assert_int_equal(a->kek.n, 32);
    assert_int_equal(a->dek.n, 32);
    assert_int_equal(a->dek.p[16], 0x10);
    assert_int_equal(a->wrapped_dek.n, 72);
    assert_int_equal(a->envelope.n, 4);
    assert_false(a->purpose.have);
    assert_false(b->expect_ok);
    assert_string_equal(b->base_z, "t-ok");
    assert_int_equal(b->context.n, 2); /* a context in hex (C.1) */
    assert_memory_equal(b->context.p, "\xc3\xa9", 2);
    assert_false(b->plaintext.have);
    kcv_free(&vs);
}

/* Every malformed appendix is refused as a whole. */
static void test_loader_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        /* unknown key */
        "```ks-crypto-vector\n" KCV_OK_V1 "colour: \"red\"\n```\n",
        /* repeated scalar */
        "```ks-crypto-vector\n" KCV_OK_V1 "key_version: 3\n```\n",
        "```ks-crypto-vector\n" KCV_OK_V1 "tenant: \"acme\"\n```\n",
        /* v2-only key in v1 */
        "```ks-crypto-vector\n" KCV_OK_V1 "purpose: \"p\"\n```\n",
        /* key not allowed in an ok vector */
        "```ks-crypto-vector\n" KCV_OK_V1 "base: t-ok\n```\n",
        /* wrong fixed length (a 33rd kek byte) */
        "```ks-crypto-vector\n" KCV_OK_V1 "kek: 00\n```\n",
        /* blank line */
        "```ks-crypto-vector\n" KCV_OK_V1 "\n```\n",
        /* bad hex, odd hex; a context given twice, as a string then in hex */
        "```ks-crypto-vector\n" KCV_OK_V1 "envelope: 0g\n```\n",
        "```ks-crypto-vector\n" KCV_OK_V1 "context: 00\n```\n",
        "```ks-crypto-vector\n" KCV_OK_V1 "envelope: 0\n```\n",
        /* a base that names no ok vector */
        "```ks-crypto-vector\n" KCV_FAIL_V1 "```\n",
        /* duplicate name */
        "```ks-crypto-vector\n" KCV_OK_V1 "```\n```ks-crypto-vector\n" KCV_OK_V1 "```\n",
        /* unterminated */
        "```ks-crypto-vector\n" KCV_OK_V1,
        "~~~\n```ks-crypto-vector\n" KCV_OK_V1 "```\n",
        /* unknown expectation */
        "```ks-crypto-vector\nexpect: bad-value\n```\n",
        /* missing key (no envelope) */
        "```ks-crypto-vector\nname: a\nexpect: auth-failed\nbase: a\nversion: 1\nalgorithm: 1\n"
        "tenant: \"t\"\nkey_id: \"k\"\nkey_version: 1\ncontext: \"\"\n"
        "kek: 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n```\n",
        /* string without quotes, with a backslash */
        "```ks-crypto-vector\nname: a\ntenant: acme\n```\n",
        "```ks-crypto-vector\nname: a\ntenant: \"a\\b\"\n```\n",
        /* numbers */
        "```ks-crypto-vector\nname: a\nversion: 01\n```\n",
        "```ks-crypto-vector\nname: a\nkey_version: 4294967296\n```\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kcv_set vs;
        char err[256];
        if (kcv_parse(bad[i], strlen(bad[i]), "bad", &vs, err, sizeof err) == 0) {
            kcv_free(&vs);
            fail_msg("malformed appendix %zu was accepted", i);
        }
        assert_int_equal(vs.count, 0);
        assert_true(err[0] != '\0');
    }
}

/* The static checks are not vacuous: a vector with one wrong byte in any
 * derived value fails them. */
static void test_static_checks_detect_errors(void **state)
{
    (void)state;
    kcv_set vs;
    load_spec(&vs, NULL, NULL);
    kcv_vector *v = NULL;
    for (size_t i = 0; i < vs.count && v == NULL; i++) {
        if (vs.v[i].expect_ok && vs.v[i].version == 2 &&
            vs.v[i].algorithm == KS_ALG_XCHACHA20POLY1305) {
            v = &vs.v[i];
        }
    }
    assert_non_null(v);
    assert_int_equal(check_ok_static(v), 0);
    g_quiet = 1;
    kcv_bytes *fields[] = {&v->wrap_aad,   &v->data_aad,   &v->wrapped_dek,
                           &v->message_key, &v->commitment, &v->ciphertext};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        fields[i]->p[fields[i]->n - 1] ^= 0x01;
        assert_int_equal(check_ok_static(v), 1);
        fields[i]->p[fields[i]->n - 1] ^= 0x01;
    }
    v->plaintext.p[0] ^= 0x01;
    assert_int_equal(check_ok_static(v), 1);
    v->plaintext.p[0] ^= 0x01;
    g_quiet = 0;
    assert_int_equal(check_ok_static(v), 0);
    kcv_free(&vs);
}

int main(void)
{
    if (sodium_init() < 0) {
        fprintf(stderr, "sodium_init failed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_accepts),
        cmocka_unit_test(test_loader_rejects),
        cmocka_unit_test(test_spec_static),
        cmocka_unit_test(test_static_checks_detect_errors),
        cmocka_unit_test(test_spec_error_table),
        cmocka_unit_test(test_spec_open_reference_provider),
        cmocka_unit_test(test_spec_keyring_unwrap),
        cmocka_unit_test(test_spec_open_keyring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
