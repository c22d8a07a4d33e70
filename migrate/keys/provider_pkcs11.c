/*
 * migrate/keys/provider_pkcs11.c -- the "pkcs11" key provider
 * (keyshift/pkcs11.h): its object model in the token, wrap, unwrap,
 * key_info and key management.  The connection (module, login, sessions,
 * deadlines, reconnects, fork) is p11_session.c; docs/providers.md
 * ("PKCS#11 provider") is the specification.
 *
 * Objects.  Version v of key_id is one AES secret key object:
 *   CKA_CLASS CKO_SECRET_KEY, CKA_KEY_TYPE CKK_AES, CKA_VALUE_LEN 32,
 *   CKA_TOKEN, CKA_PRIVATE, CKA_SENSITIVE true, CKA_EXTRACTABLE false,
 *   CKA_LABEL "keyshift:" key_id ":" v (decimal),
 *   CKA_ID    BE32(v) || key_id (4 + len(key_id) bytes: one ID per pair),
 *   CKA_ENCRYPT, CKA_DECRYPT by state (active: both; decrypt-only:
 *   decrypt; disabled: neither; destroyed: the object is deleted).
 * Each key_id has one CKO_DATA object (CKA_TOKEN, CKA_PRIVATE,
 * CKA_APPLICATION "keyshift", CKA_LABEL "keyshift-meta:" key_id) whose
 * CKA_VALUE is the metadata record of p11_meta.h: the primary and every
 * version's state, destroyed ones included.  The record is authoritative;
 * CKA_ENCRYPT and CKA_DECRYPT make the token enforce the same state, so
 * the state in effect is never more permissive than either.
 *
 * Changes write a new record (sequence number + 1) and then destroy the
 * old one; readers take the highest sequence number (equal ones: the
 * greater record bytes), so a reader never sees no record.  Changes made
 * by this process are serialised; two processes changing one key at once
 * are not: the last record written wins, each record being a valid
 * state, and the other change is lost.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "keyring_format.h"
#include "p11_meta.h"
#include "p11_internal.h"

#define IV_LEN 12
#define TAG_LEN 16
#define CT_LEN (KS_DEK_LEN + TAG_LEN)
#define KEK_LEN 32
#define KEY_LABEL_PREFIX "keyshift:"
#define META_LABEL_PREFIX "keyshift-meta:"
#define APPLICATION "keyshift"
/* Metadata objects one key may have at once (more: integrity). */
#define META_MAX_OBJECTS 16
/* Key objects one (key_id, version) search looks for: one is right. */
#define KEY_MAX_OBJECTS 4
/* Room for any label: the longer prefix, a key_id, ":" and a version. */
#define LABEL_CAP (sizeof META_LABEL_PREFIX + KS_KEY_ID_MAX + 12)

/* The CK_GCM_PARAMS of PKCS#11 2.40 errata and some vendors: no ulIvBits
 * (KS_PKCS11_GCM_NO_IVBITS). */
typedef struct gcm_params_no_ivbits {
    CK_BYTE_PTR pIv;
    CK_ULONG ulIvLen;
    CK_BYTE_PTR pAAD;
    CK_ULONG ulAADLen;
    CK_ULONG ulTagBits;
} gcm_params_no_ivbits;

static CK_BBOOL ck_true = CK_TRUE;
static CK_BBOOL ck_false = CK_FALSE;

/* A template attribute over an object of its own size. */
#define ATTR(t, v) {(t), (v), sizeof *(v)}

/* Nonzero when a view is {NULL, 0} or points at its bytes. */
static int view_ok(ks_bytes b)
{
    return b.ptr != NULL || b.len == 0;
}

/* A non-const pointer for a PKCS#11 input parameter the module only reads
 * (the API has no const); the cast through uintptr_t is deliberate. */
static CK_BYTE_PTR in_ptr(const void *p)
{
    return (CK_BYTE_PTR)(uintptr_t)p;
}

/* Whether a version in `state` may wrap (for_wrap) or unwrap [K-STATE-1]. */
static ks_err check_usable(uint8_t state, int for_wrap)
{
    switch (state) {
    case KS_KEY_ACTIVE:
        return KS_OK;
    case KS_KEY_DECRYPT_ONLY:
        return for_wrap ? KS_ERR_DENIED : KS_OK;
    case KS_KEY_DISABLED:
        return KS_ERR_DENIED;
    default:
        return KS_ERR_REVOKED;
    }
}

/* ---- names in the token --------------------------------------------------- */

/* The key object's CKA_ID: BE32(version) || key_id; its length. */
static size_t key_object_id(ks_bytes key_id, uint32_t version, uint8_t out[4 + KS_KEY_ID_MAX])
{
    out[0] = (uint8_t)(version >> 24);
    out[1] = (uint8_t)(version >> 16);
    out[2] = (uint8_t)(version >> 8);
    out[3] = (uint8_t)version;
    memcpy(out + 4, key_id.ptr, key_id.len);
    return 4 + key_id.len;
}

/* The key object's CKA_LABEL "keyshift:" key_id ":" version; its length. */
static size_t key_label(ks_bytes key_id, uint32_t version, char out[LABEL_CAP])
{
    const int n = snprintf(out, LABEL_CAP, KEY_LABEL_PREFIX "%.*s:%lu", (int)key_id.len,
                           (const char *)key_id.ptr, (unsigned long)version);
    return n > 0 ? (size_t)n : 0;
}

/* The metadata object's CKA_LABEL "keyshift-meta:" key_id; its length. */
static size_t meta_label(ks_bytes key_id, char out[LABEL_CAP])
{
    memcpy(out, META_LABEL_PREFIX, sizeof META_LABEL_PREFIX - 1);
    memcpy(out + sizeof META_LABEL_PREFIX - 1, key_id.ptr, key_id.len);
    return sizeof META_LABEL_PREFIX - 1 + key_id.len;
}

/* ---- searching ------------------------------------------------------------ */

/* Find up to max objects matching tmpl[0, n) into h; their number in *found. */
static ks_err find(ks_p11_op *op, CK_ATTRIBUTE *tmpl, CK_ULONG n, CK_OBJECT_HANDLE *h, CK_ULONG max,
                   CK_ULONG *found)
{
    *found = 0;
    CK_RV rv = KS_P11_CALL(op, C_FindObjectsInit, op->s, tmpl, n);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    rv = KS_P11_CALL(op, C_FindObjects, op->s, h, max, found);
    const CK_RV fin = KS_P11_CALL(op, C_FindObjectsFinal, op->s);
    if (rv == CKR_OK && *found > max) {
        return KS_ERR_INTEGRITY;
    }
    return ks_p11_map(rv != CKR_OK ? rv : fin);
}

/* Read a byte-string attribute of h into buf[0, cap): its length in *len.
 * A length beyond cap (or the token's "unavailable") is an integrity
 * failure: nothing the token returns is used unchecked. */
static ks_err read_bytes(ks_p11_op *op, CK_OBJECT_HANDLE h, CK_ATTRIBUTE_TYPE type, uint8_t *buf,
                         size_t cap, size_t *len)
{
    CK_ATTRIBUTE a = {type, NULL, 0};
    CK_RV rv = KS_P11_CALL(op, C_GetAttributeValue, op->s, h, &a, 1);
    if (rv != CKR_OK) {
        return rv == CKR_OBJECT_HANDLE_INVALID ? KS_ERR_NOT_FOUND : ks_p11_map(rv);
    }
    if (a.ulValueLen == CK_UNAVAILABLE_INFORMATION || a.ulValueLen > cap) {
        return KS_ERR_INTEGRITY;
    }
    const CK_ULONG want = a.ulValueLen;
    a.pValue = buf;
    rv = KS_P11_CALL(op, C_GetAttributeValue, op->s, h, &a, 1);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    if (a.ulValueLen != want) {
        return KS_ERR_INTEGRITY;
    }
    *len = want;
    return KS_OK;
}

/* A loaded metadata record and the objects that hold it (all of the key's
 * records: a change destroys them once it has written its own). */
typedef struct meta_state {
    ks_p11meta m;
    CK_OBJECT_HANDLE objs[META_MAX_OBJECTS];
    CK_ULONG nobjs;
    uint8_t best[KS_P11META_MAX_LEN];
    size_t best_len;
} meta_state;

/* Nonzero when record (a, alen) is preferred to (b, blen): a higher
 * sequence number, or for equal ones the greater bytes. */
static int prefer(const ks_p11meta *a, const uint8_t *ab, size_t alen, const ks_p11meta *b,
                  const uint8_t *bb, size_t blen)
{
    if (a->seq != b->seq) {
        return a->seq > b->seq;
    }
    const size_t n = alen < blen ? alen : blen;
    const int c = memcmp(ab, bb, n);
    return c != 0 ? c > 0 : alen > blen;
}

/* Load key_id's record into *st: KS_ERR_NOT_FOUND when the key has none,
 * KS_ERR_INTEGRITY for a malformed one, one for another key, or too many. */
static ks_err load_meta(ks_p11_op *op, ks_bytes key_id, meta_state *st)
{
    char label[LABEL_CAP];
    CK_OBJECT_CLASS cls = CKO_DATA;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_TOKEN, &ck_true),
        {CKA_APPLICATION, in_ptr(APPLICATION), sizeof APPLICATION - 1},
        {CKA_LABEL, label, meta_label(key_id, label)},
    };
    CK_OBJECT_HANDLE h[META_MAX_OBJECTS + 1];
    CK_ULONG n = 0;
    ks_err e = find(op, tmpl, sizeof tmpl / sizeof tmpl[0], h, META_MAX_OBJECTS + 1, &n);
    if (e != KS_OK) {
        return e;
    }
    if (n == 0) {
        return KS_ERR_NOT_FOUND;
    }
    if (n > META_MAX_OBJECTS) {
        return KS_ERR_INTEGRITY;
    }
    ks_p11meta *cand = malloc(sizeof *cand);
    uint8_t *buf = malloc(KS_P11META_MAX_LEN);
    if (cand == NULL || buf == NULL) {
        free(cand);
        free(buf);
        return KS_ERR_NO_MEMORY;
    }
    st->nobjs = 0;
    st->best_len = 0;
    for (CK_ULONG i = 0; i < n && e == KS_OK; i++) {
        size_t len = 0;
        e = read_bytes(op, h[i], CKA_VALUE, buf, KS_P11META_MAX_LEN, &len);
        if (e == KS_ERR_NOT_FOUND) {
            e = KS_OK; /* destroyed meanwhile by another writer */
            continue;
        }
        if (e != KS_OK) {
            break;
        }
        if (ks_p11meta_parse(buf, len, cand) != KS_OK || cand->key_id_len != key_id.len ||
            memcmp(cand->key_id, key_id.ptr, key_id.len) != 0) {
            e = KS_ERR_INTEGRITY;
            break;
        }
        st->objs[st->nobjs++] = h[i];
        if (st->best_len == 0 || prefer(cand, buf, len, &st->m, st->best, st->best_len)) {
            st->m = *cand;
            memcpy(st->best, buf, len);
            st->best_len = len;
        }
    }
    free(cand);
    free(buf);
    if (e == KS_OK && st->nobjs == 0) {
        e = KS_ERR_NOT_FOUND;
    }
    return e;
}

/* Write st->m (its seq already advanced) as a new metadata object, then
 * destroy the objects it replaces.  A failure to destroy an old one
 * leaves it behind, harmlessly: the new record has the higher seq. */
static ks_err write_meta(ks_p11_op *op, meta_state *st)
{
    uint8_t rec[KS_P11META_MAX_LEN];
    size_t len = 0;
    ks_err e = ks_p11meta_encode(&st->m, rec, sizeof rec, &len);
    if (e != KS_OK) {
        return KS_ERR_INTEGRITY;
    }
    char label[LABEL_CAP];
    CK_OBJECT_CLASS cls = CKO_DATA;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_TOKEN, &ck_true),
        ATTR(CKA_PRIVATE, &ck_true),
        {CKA_APPLICATION, in_ptr(APPLICATION), sizeof APPLICATION - 1},
        {CKA_LABEL, label, meta_label((ks_bytes){st->m.key_id, st->m.key_id_len}, label)},
        {CKA_VALUE, rec, len},
    };
    CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
    const CK_RV rv = KS_P11_CALL(op, C_CreateObject, op->s, tmpl, sizeof tmpl / sizeof tmpl[0], &h);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    for (CK_ULONG i = 0; i < st->nobjs; i++) {
        if (ks_p11_tick(op) == CKR_OK) {
            (void)op->f->C_DestroyObject(op->s, st->objs[i]);
        }
    }
    st->objs[0] = h;
    st->nobjs = 1;
    return KS_OK;
}

/* Find the key objects of (key_id, version) into h[0, *n). */
static ks_err find_keys(ks_p11_op *op, ks_bytes key_id, uint32_t version, CK_OBJECT_HANDLE *h,
                        CK_ULONG *n)
{
    uint8_t id[4 + KS_KEY_ID_MAX];
    CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_TOKEN, &ck_true),
        {CKA_ID, id, key_object_id(key_id, version, id)},
    };
    return find(op, tmpl, sizeof tmpl / sizeof tmpl[0], h, KEY_MAX_OBJECTS, n);
}

/* The one key object of (key_id, version): KS_ERR_NOT_FOUND when there is
 * none, KS_ERR_INTEGRITY when there are several or it is not a 32-byte
 * AES key. */
static ks_err find_key(ks_p11_op *op, ks_bytes key_id, uint32_t version, CK_OBJECT_HANDLE *out)
{
    CK_OBJECT_HANDLE h[KEY_MAX_OBJECTS];
    CK_ULONG n = 0;
    ks_err e = find_keys(op, key_id, version, h, &n);
    if (e != KS_OK) {
        return e;
    }
    if (n == 0) {
        return KS_ERR_NOT_FOUND;
    }
    if (n > 1) {
        return KS_ERR_INTEGRITY;
    }
    CK_KEY_TYPE kt = 0;
    CK_ULONG vlen = 0;
    CK_ATTRIBUTE a[] = {ATTR(CKA_KEY_TYPE, &kt), ATTR(CKA_VALUE_LEN, &vlen)};
    const CK_RV rv = KS_P11_CALL(op, C_GetAttributeValue, op->s, h[0], a, 2);
    if (rv != CKR_OK) {
        return rv == CKR_OBJECT_HANDLE_INVALID ? KS_ERR_NOT_FOUND : ks_p11_map(rv);
    }
    if (a[0].ulValueLen != sizeof kt || a[1].ulValueLen != sizeof vlen || kt != CKK_AES ||
        vlen != KEK_LEN) {
        return KS_ERR_INTEGRITY;
    }
    *out = h[0];
    return KS_OK;
}

/* Destroy every key object of (key_id, version): the destroyed state, and
 * objects no record names (left by an interrupted change). */
static ks_err destroy_keys(ks_p11_op *op, ks_bytes key_id, uint32_t version)
{
    for (int round = 0; round < 4; round++) {
        CK_OBJECT_HANDLE h[KEY_MAX_OBJECTS];
        CK_ULONG n = 0;
        ks_err e = find_keys(op, key_id, version, h, &n);
        if (e != KS_OK || n == 0) {
            return e;
        }
        for (CK_ULONG i = 0; i < n; i++) {
            const CK_RV rv = KS_P11_CALL(op, C_DestroyObject, op->s, h[i]);
            if (rv != CKR_OK && rv != CKR_OBJECT_HANDLE_INVALID) {
                return ks_p11_map(rv);
            }
        }
    }
    return KS_ERR_INTEGRITY;
}

/* Generate version `version` of key_id in the token, active.  Objects
 * with its ID that no record names are destroyed first; a duplicate that
 * appears meanwhile (another process adding the same version) makes this
 * one back out: KS_ERR_UNAVAILABLE, retryable. */
static ks_err generate_key(ks_p11_op *op, ks_bytes key_id, uint32_t version)
{
    ks_err e = destroy_keys(op, key_id, version);
    if (e != KS_OK) {
        return e;
    }
    uint8_t id[4 + KS_KEY_ID_MAX];
    char label[LABEL_CAP];
    CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
    CK_KEY_TYPE kt = CKK_AES;
    CK_ULONG vlen = KEK_LEN;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_KEY_TYPE, &kt),
        ATTR(CKA_VALUE_LEN, &vlen),
        ATTR(CKA_TOKEN, &ck_true),
        ATTR(CKA_PRIVATE, &ck_true),
        ATTR(CKA_SENSITIVE, &ck_true),
        ATTR(CKA_EXTRACTABLE, &ck_false),
        ATTR(CKA_MODIFIABLE, &ck_true),
        ATTR(CKA_ENCRYPT, &ck_true),
        ATTR(CKA_DECRYPT, &ck_true),
        ATTR(CKA_WRAP, &ck_false),
        ATTR(CKA_UNWRAP, &ck_false),
        ATTR(CKA_SIGN, &ck_false),
        ATTR(CKA_VERIFY, &ck_false),
        ATTR(CKA_DERIVE, &ck_false),
        {CKA_LABEL, label, key_label(key_id, version, label)},
        {CKA_ID, id, key_object_id(key_id, version, id)},
    };
    CK_MECHANISM mech = {CKM_AES_KEY_GEN, NULL, 0};
    CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
    const CK_RV rv =
        KS_P11_CALL(op, C_GenerateKey, op->s, &mech, tmpl, sizeof tmpl / sizeof tmpl[0], &h);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    CK_OBJECT_HANDLE found[KEY_MAX_OBJECTS];
    CK_ULONG n = 0;
    e = find_keys(op, key_id, version, found, &n);
    if (e == KS_OK && n != 1) {
        e = KS_ERR_UNAVAILABLE;
    }
    if (e != KS_OK) {
        (void)op->f->C_DestroyObject(op->s, h);
    }
    return e;
}

/* Make the token enforce `state` on key object h (CKA_ENCRYPT,
 * CKA_DECRYPT).  A token that refuses to change them leaves the record
 * alone to enforce the state; that is noted in the provider. */
static ks_err set_usage(ks_p11_op *op, CK_OBJECT_HANDLE h, ks_key_state state)
{
    CK_BBOOL enc = state == KS_KEY_ACTIVE ? CK_TRUE : CK_FALSE;
    CK_BBOOL dec = state == KS_KEY_ACTIVE || state == KS_KEY_DECRYPT_ONLY ? CK_TRUE : CK_FALSE;
    CK_ATTRIBUTE a[] = {ATTR(CKA_ENCRYPT, &enc), ATTR(CKA_DECRYPT, &dec)};
    const CK_RV rv = KS_P11_CALL(op, C_SetAttributeValue, op->s, h, a, 2);
    if (rv == CKR_ATTRIBUTE_READ_ONLY || rv == CKR_ACTION_PROHIBITED ||
        rv == CKR_ATTRIBUTE_TYPE_INVALID || rv == CKR_ATTRIBUTE_VALUE_INVALID) {
        op->rv = CKR_OK;
        pthread_mutex_lock(&op->p->mu);
        op->p->usage_attrs_refused = 1;
        pthread_mutex_unlock(&op->p->mu);
        return KS_OK;
    }
    return ks_p11_map(rv);
}

/* ---- wrap, unwrap, key_info ------------------------------------------------ */

/* The arguments of one wrap or unwrap. */
typedef struct wrap_call {
    ks_bytes key_id;
    uint32_t version;
    const uint8_t *dek_in; /* wrap */
    uint8_t *dek_out;      /* unwrap */
    ks_bytes aad;
    ks_bytes wrapped;      /* unwrap */
    uint8_t *out;          /* wrap: KS_PKCS11_WRAPPED_LEN bytes */
} wrap_call;

/* The record's state of the call's version, and its key object, when the
 * state allows the operation. */
static ks_err usable_key(ks_p11_op *op, const wrap_call *w, int for_wrap, CK_OBJECT_HANDLE *h)
{
    meta_state *st = malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = load_meta(op, w->key_id, st);
    if (e == KS_OK && w->version > st->m.nversions) {
        e = KS_ERR_NOT_FOUND;
    }
    if (e == KS_OK) {
        e = check_usable(st->m.states[w->version - 1], for_wrap);
    }
    free(st);
    return e != KS_OK ? e : find_key(op, w->key_id, w->version, h);
}

/* Start an AES-GCM operation (encrypt or decrypt) with iv and the call's
 * AAD, in the parameter layout the config names. */
static ks_err gcm_init(ks_p11_op *op, int encrypt, CK_OBJECT_HANDLE h, uint8_t iv[IV_LEN],
                       ks_bytes aad)
{
    CK_GCM_PARAMS p11kit = {0};
    gcm_params_no_ivbits old = {0};
    CK_MECHANISM mech = {CKM_AES_GCM, NULL, 0};
    if (op->p->gcm_layout == KS_PKCS11_GCM_NO_IVBITS) {
        old = (gcm_params_no_ivbits){iv, IV_LEN, in_ptr(aad.ptr), aad.len, TAG_LEN * 8};
        mech.pParameter = &old;
        mech.ulParameterLen = sizeof old;
    } else {
        p11kit.pIv = iv;
        p11kit.ulIvLen = IV_LEN;
        p11kit.ulIvBits = IV_LEN * 8;
        p11kit.pAAD = in_ptr(aad.ptr);
        p11kit.ulAADLen = aad.len;
        p11kit.ulTagBits = TAG_LEN * 8;
        mech.pParameter = &p11kit;
        mech.ulParameterLen = sizeof p11kit;
    }
    const CK_RV rv = encrypt ? KS_P11_CALL(op, C_EncryptInit, op->s, &mech, h)
                             : KS_P11_CALL(op, C_DecryptInit, op->s, &mech, h);
    return ks_p11_map(rv);
}

/* Wrap body: IV from the token, then AES-GCM of the DEK under the KEK. */
static ks_err wrap_body(ks_p11_op *op, void *arg)
{
    wrap_call *w = arg;
    CK_OBJECT_HANDLE h;
    ks_err e = usable_key(op, w, 1, &h);
    if (e != KS_OK) {
        return e;
    }
    uint8_t iv[IV_LEN];
    CK_RV rv = KS_P11_CALL(op, C_GenerateRandom, op->s, iv, IV_LEN);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    if ((e = gcm_init(op, 1, h, iv, w->aad)) != KS_OK) {
        return e;
    }
    uint8_t dek[KS_DEK_LEN];
    memcpy(dek, w->dek_in, KS_DEK_LEN);
    CK_ULONG len = CT_LEN;
    rv = KS_P11_CALL(op, C_Encrypt, op->s, dek, KS_DEK_LEN, w->out + IV_LEN, &len);
    sodium_memzero(dek, sizeof dek);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    if (len != CT_LEN) {
        op->rv = CKR_GENERAL_ERROR; /* do not reuse this session */
        return KS_ERR_INTEGRITY;
    }
    memcpy(w->out, iv, IV_LEN);
    return KS_OK;
}

/* Unwrap body: AES-GCM decryption of the blob; a failed tag is
 * auth-failed whatever the token calls it. */
static ks_err unwrap_body(ks_p11_op *op, void *arg)
{
    wrap_call *w = arg;
    CK_OBJECT_HANDLE h;
    ks_err e = usable_key(op, w, 0, &h);
    if (e != KS_OK) {
        return e;
    }
    if (w->wrapped.len != KS_PKCS11_WRAPPED_LEN) {
        return KS_ERR_AUTH_FAILED;
    }
    uint8_t iv[IV_LEN];
    memcpy(iv, w->wrapped.ptr, IV_LEN);
    if ((e = gcm_init(op, 0, h, iv, w->aad)) != KS_OK) {
        return e;
    }
    uint8_t pt[CT_LEN];
    CK_ULONG len = sizeof pt;
    const CK_RV rv =
        KS_P11_CALL(op, C_Decrypt, op->s, in_ptr(w->wrapped.ptr + IV_LEN), CT_LEN, pt, &len);
    if (rv == CKR_OK && len == KS_DEK_LEN) {
        memcpy(w->dek_out, pt, KS_DEK_LEN);
    } else if (rv == CKR_OK) {
        op->rv = CKR_GENERAL_ERROR; /* do not reuse this session */
        e = KS_ERR_AUTH_FAILED;
    } else if (rv == CKR_ENCRYPTED_DATA_INVALID || rv == CKR_ENCRYPTED_DATA_LEN_RANGE ||
               rv == CKR_GENERAL_ERROR || rv == CKR_FUNCTION_FAILED) {
        e = KS_ERR_AUTH_FAILED;
    } else {
        e = ks_p11_map(rv);
    }
    sodium_memzero(pt, sizeof pt);
    return e;
}

/* Nonzero when key_id is a valid [F-KEYID-1] id. */
static int id_ok(ks_bytes key_id)
{
    return ks_krf_check_key_id(key_id) == KS_OK;
}

/* The provider's wrap (keyshift/provider.h). */
static ks_err p11_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                       size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len,
                       uint32_t timeout_ms)
{
    if (self == NULL || key_version == 0 || dek == NULL || dek_len != KS_DEK_LEN || out == NULL ||
        out_len == NULL || !view_ok(aad) || aad.len == 0 || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    if (cap < KS_PKCS11_WRAPPED_LEN) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    wrap_call w = {.key_id = key_id, .version = key_version, .dek_in = dek, .aad = aad, .out = out};
    const ks_err e = ks_p11_run(self, timeout_ms, wrap_body, &w);
    if (e != KS_OK) {
        memset(out, 0, KS_PKCS11_WRAPPED_LEN);
        return e;
    }
    *out_len = KS_PKCS11_WRAPPED_LEN;
    return KS_OK;
}

/* The provider's unwrap (keyshift/provider.h).  dek is zeroed first and
 * again on any failure. */
static ks_err p11_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                         ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    if (dek != NULL) {
        sodium_memzero(dek, dek_len);
    }
    if (self == NULL || key_version == 0 || dek == NULL || dek_len != KS_DEK_LEN ||
        !view_ok(wrapped) || !view_ok(aad) || aad.len == 0 || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    wrap_call w = {.key_id = key_id, .version = key_version, .dek_out = dek, .aad = aad,
                   .wrapped = wrapped};
    const ks_err e = ks_p11_run(self, timeout_ms, unwrap_body, &w);
    if (e != KS_OK) {
        sodium_memzero(dek, dek_len);
    }
    return e;
}

/* The arguments of key_info. */
typedef struct info_call {
    ks_bytes key_id;
    uint32_t version;
    ks_key_info *out;
} info_call;

/* key_info body: the record says everything. */
static ks_err info_body(ks_p11_op *op, void *arg)
{
    info_call *c = arg;
    meta_state *st = malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = load_meta(op, c->key_id, st);
    const uint32_t v = c->version != 0 ? c->version : st->m.primary;
    if (e == KS_OK && v > st->m.nversions) {
        e = KS_ERR_NOT_FOUND;
    }
    if (e == KS_OK) {
        c->out->version = v;
        c->out->state = (ks_key_state)st->m.states[v - 1];
        c->out->is_primary = v == st->m.primary;
    }
    free(st);
    return e;
}

/* The provider's key_info (keyshift/provider.h): version 0 is the primary. */
static ks_err p11_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                           uint32_t timeout_ms)
{
    if (self == NULL || out == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    info_call c = {key_id, key_version, out};
    return ks_p11_run(self, timeout_ms, info_body, &c);
}

/* ---- key management ---------------------------------------------------------- */

/* The arguments of one key change. */
typedef struct admin_call {
    ks_bytes key_id;
    uint32_t version;     /* promote, set_state; add_version: the new number */
    ks_key_state state;   /* set_state */
} admin_call;

/* Run an admin body under the provider's admin lock, with a meta_state
 * allocated for it (passed as arg->... through a pair). */
typedef struct admin_run {
    admin_call *c;
    meta_state *st;
    ks_err (*fn)(ks_p11_op *op, admin_call *c, meta_state *st);
} admin_run;

/* The body wrapper of admin_exec. */
static ks_err admin_body(ks_p11_op *op, void *arg)
{
    admin_run *r = arg;
    return r->fn(op, r->c, r->st);
}

/* Run fn as a provider call, serialised with this process's other key
 * changes. */
static ks_err admin_exec(ks_p11 *p, admin_call *c, uint32_t timeout_ms,
                         ks_err (*fn)(ks_p11_op *op, admin_call *c, meta_state *st))
{
    meta_state *st = malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    admin_run r = {c, st, fn};
    pthread_mutex_lock(&p->admin_mu);
    const ks_err e = ks_p11_run(p, timeout_ms, admin_body, &r);
    pthread_mutex_unlock(&p->admin_mu);
    free(st);
    return e;
}

/* create body: version 1 in the token, then the first record. */
static ks_err create_fn(ks_p11_op *op, admin_call *c, meta_state *st)
{
    ks_err e = load_meta(op, c->key_id, st);
    if (e == KS_OK) {
        return KS_ERR_EXISTS;
    }
    if (e != KS_ERR_NOT_FOUND) {
        return e;
    }
    if ((e = generate_key(op, c->key_id, 1)) != KS_OK) {
        return e;
    }
    memset(&st->m, 0, sizeof st->m);
    st->m.seq = 1;
    memcpy(st->m.key_id, c->key_id.ptr, c->key_id.len);
    st->m.key_id_len = c->key_id.len;
    st->m.nversions = 1;
    st->m.primary = 1;
    st->m.states[0] = KS_KEY_ACTIVE;
    st->nobjs = 0;
    e = write_meta(op, st);
    if (e != KS_OK) {
        (void)destroy_keys(op, c->key_id, 1);
    }
    return e;
}

/* add_version body: the next version in the token, then the record. */
static ks_err add_version_fn(ks_p11_op *op, admin_call *c, meta_state *st)
{
    ks_err e = load_meta(op, c->key_id, st);
    if (e != KS_OK) {
        return e;
    }
    if (st->m.nversions >= KS_P11META_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE;
    }
    const uint32_t v = st->m.nversions + 1;
    if ((e = generate_key(op, c->key_id, v)) != KS_OK) {
        return e;
    }
    st->m.states[v - 1] = KS_KEY_ACTIVE;
    st->m.nversions = v;
    st->m.seq++;
    e = write_meta(op, st);
    if (e != KS_OK) {
        (void)destroy_keys(op, c->key_id, v);
        return e;
    }
    c->version = v;
    return KS_OK;
}

/* promote body [K-STATE-3]: an active version only. */
static ks_err promote_fn(ks_p11_op *op, admin_call *c, meta_state *st)
{
    ks_err e = load_meta(op, c->key_id, st);
    if (e != KS_OK) {
        return e;
    }
    if (c->version > st->m.nversions) {
        return KS_ERR_NOT_FOUND;
    }
    if (st->m.states[c->version - 1] != KS_KEY_ACTIVE) {
        return KS_ERR_STATE;
    }
    if (st->m.primary == c->version) {
        return KS_OK;
    }
    st->m.primary = c->version;
    st->m.seq++;
    return write_meta(op, st);
}

/* set_state body [K-STATE-2..3].  Among active, decrypt-only and
 * disabled: the key object's usage first, then the record.  Destroyed:
 * the record first (the revocation is durable before the material goes),
 * then the object. */
static ks_err set_state_fn(ks_p11_op *op, admin_call *c, meta_state *st)
{
    ks_err e = load_meta(op, c->key_id, st);
    if (e != KS_OK) {
        return e;
    }
    if (c->version > st->m.nversions) {
        return KS_ERR_NOT_FOUND;
    }
    const uint8_t cur = st->m.states[c->version - 1];
    if (cur == c->state) {
        /* In effect already; a destroy interrupted before the object went
         * is finished now. */
        return cur == KS_KEY_DESTROYED ? destroy_keys(op, c->key_id, c->version) : KS_OK;
    }
    if (cur == KS_KEY_DESTROYED || (c->version == st->m.primary && c->state != KS_KEY_ACTIVE)) {
        return KS_ERR_STATE;
    }
    if (c->state != KS_KEY_DESTROYED) {
        CK_OBJECT_HANDLE h;
        if ((e = find_key(op, c->key_id, c->version, &h)) != KS_OK ||
            (e = set_usage(op, h, c->state)) != KS_OK) {
            return e;
        }
    }
    st->m.states[c->version - 1] = (uint8_t)c->state;
    st->m.seq++;
    if ((e = write_meta(op, st)) != KS_OK) {
        return e;
    }
    return c->state == KS_KEY_DESTROYED ? destroy_keys(op, c->key_id, c->version) : KS_OK;
}

/* The provider's create (ks_provider_admin_ops). */
static ks_err p11_create(void *self, ks_bytes key_id, uint32_t timeout_ms)
{
    if (self == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_BAD_VALUE;
    }
    admin_call c = {.key_id = key_id};
    return admin_exec(self, &c, timeout_ms, create_fn);
}

/* The provider's add_version (ks_provider_admin_ops). */
static ks_err p11_add_version(void *self, ks_bytes key_id, uint32_t *version, uint32_t timeout_ms)
{
    if (self == NULL || version == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    admin_call c = {.key_id = key_id};
    const ks_err e = admin_exec(self, &c, timeout_ms, add_version_fn);
    if (e == KS_OK) {
        *version = c.version;
    }
    return e;
}

/* The provider's promote (ks_provider_admin_ops). */
static ks_err p11_promote(void *self, ks_bytes key_id, uint32_t version, uint32_t timeout_ms)
{
    if (self == NULL || version == 0 || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    admin_call c = {.key_id = key_id, .version = version};
    return admin_exec(self, &c, timeout_ms, promote_fn);
}

/* The provider's set_state (ks_provider_admin_ops). */
static ks_err p11_set_state(void *self, ks_bytes key_id, uint32_t version, ks_key_state state,
                            uint32_t timeout_ms)
{
    if (self == NULL || version == 0 || state < KS_KEY_ACTIVE || state > KS_KEY_DESTROYED ||
        !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    admin_call c = {.key_id = key_id, .version = version, .state = state};
    return admin_exec(self, &c, timeout_ms, set_state_fn);
}

/* ---- listing ----------------------------------------------------------------- */

/* The records a listing collected: one per key, the preferred one. */
typedef struct list_call {
    ks_bytes key_id;       /* empty: every key */
    ks_p11meta **recs;
    size_t n, cap;
} list_call;

/* Free the records of a listing (also between attempts). */
static void list_clear(list_call *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->recs[i]);
    }
    free(l->recs);
    l->recs = NULL;
    l->n = l->cap = 0;
}

/* Nonzero when record a is preferred to b, as load_meta prefers them: a
 * record's bytes are its canonical encoding, so ties compare encodings. */
static int preferred_record(const ks_p11meta *a, const ks_p11meta *b)
{
    if (a->seq != b->seq) {
        return a->seq > b->seq;
    }
    uint8_t *x = malloc(KS_P11META_MAX_LEN), *y = malloc(KS_P11META_MAX_LEN);
    size_t xl = 0, yl = 0;
    int r = 0;
    if (x != NULL && y != NULL && ks_p11meta_encode(a, x, KS_P11META_MAX_LEN, &xl) == KS_OK &&
        ks_p11meta_encode(b, y, KS_P11META_MAX_LEN, &yl) == KS_OK) {
        r = prefer(a, x, xl, b, y, yl);
    }
    free(x);
    free(y);
    return r;
}

/* Add rec (taking it) to the listing, or keep the preferred of it and the
 * record already there for its key. */
static ks_err list_add(list_call *l, ks_p11meta *rec)
{
    for (size_t i = 0; i < l->n; i++) {
        ks_p11meta *r = l->recs[i];
        if (r->key_id_len == rec->key_id_len && memcmp(r->key_id, rec->key_id, r->key_id_len) == 0) {
            if (preferred_record(rec, r)) {
                l->recs[i] = rec;
                free(r);
            } else {
                free(rec);
            }
            return KS_OK;
        }
    }
    if (l->n == l->cap) {
        const size_t cap = l->cap != 0 ? 2 * l->cap : 16;
        ks_p11meta **nr = realloc(l->recs, cap * sizeof *nr);
        if (nr == NULL) {
            free(rec);
            return KS_ERR_NO_MEMORY;
        }
        l->recs = nr;
        l->cap = cap;
    }
    l->recs[l->n++] = rec;
    return KS_OK;
}

/* Read one metadata object h of a full listing into the listing: its
 * label must be "keyshift-meta:" followed by its record's key_id. */
static ks_err list_object(ks_p11_op *op, list_call *l, CK_OBJECT_HANDLE h, uint8_t *buf)
{
    uint8_t label[LABEL_CAP];
    size_t llen = 0, len = 0;
    ks_err e = read_bytes(op, h, CKA_LABEL, label, sizeof label, &llen);
    if (e == KS_OK) {
        e = read_bytes(op, h, CKA_VALUE, buf, KS_P11META_MAX_LEN, &len);
    }
    if (e == KS_ERR_NOT_FOUND) {
        return KS_OK; /* destroyed meanwhile */
    }
    if (e != KS_OK) {
        return e;
    }
    ks_p11meta *rec = malloc(sizeof *rec);
    if (rec == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    const size_t plen = sizeof META_LABEL_PREFIX - 1;
    if (ks_p11meta_parse(buf, len, rec) != KS_OK || llen != plen + rec->key_id_len ||
        memcmp(label, META_LABEL_PREFIX, plen) != 0 ||
        memcmp(label + plen, rec->key_id, rec->key_id_len) != 0) {
        free(rec);
        return KS_ERR_INTEGRITY;
    }
    return list_add(l, rec);
}

/* list body: one key's record, or every keyshift metadata object. */
static ks_err list_body(ks_p11_op *op, void *arg)
{
    list_call *l = arg;
    list_clear(l);
    if (l->key_id.len != 0) {
        meta_state *st = malloc(sizeof *st);
        ks_p11meta *rec = malloc(sizeof *rec);
        if (st == NULL || rec == NULL) {
            free(st);
            free(rec);
            return KS_ERR_NO_MEMORY;
        }
        ks_err e = load_meta(op, l->key_id, st);
        if (e == KS_OK) {
            *rec = st->m;
            e = list_add(l, rec);
        } else {
            free(rec);
        }
        free(st);
        return e;
    }
    CK_OBJECT_CLASS cls = CKO_DATA;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_TOKEN, &ck_true),
        {CKA_APPLICATION, in_ptr(APPLICATION), sizeof APPLICATION - 1},
    };
    /* Collect every handle first: object reads cannot run inside a search. */
    const size_t max = (size_t)KS_KEYRING_MAX_KEYS * META_MAX_OBJECTS;
    CK_OBJECT_HANDLE *h = calloc(max + 1, sizeof *h);
    uint8_t *buf = malloc(KS_P11META_MAX_LEN);
    if (h == NULL || buf == NULL) {
        free(h);
        free(buf);
        return KS_ERR_NO_MEMORY;
    }
    CK_ULONG n = 0;
    CK_RV rv = KS_P11_CALL(op, C_FindObjectsInit, op->s, tmpl, sizeof tmpl / sizeof tmpl[0]);
    ks_err e = ks_p11_map(rv);
    while (e == KS_OK && n <= max) {
        CK_ULONG got = 0;
        rv = KS_P11_CALL(op, C_FindObjects, op->s, h + n, (CK_ULONG)(max + 1 - n), &got);
        if (rv != CKR_OK || got > max + 1 - n) {
            e = rv != CKR_OK ? ks_p11_map(rv) : KS_ERR_INTEGRITY;
        } else if (got == 0) {
            break;
        }
        n += got;
    }
    if (rv != KS_P11_RV_TIMEOUT && e != KS_ERR_INVALID_ARGUMENT) {
        (void)KS_P11_CALL(op, C_FindObjectsFinal, op->s);
    }
    if (e == KS_OK && n > max) {
        e = KS_ERR_INTEGRITY;
    }
    for (CK_ULONG i = 0; e == KS_OK && i < n; i++) {
        e = list_object(op, l, h[i], buf);
    }
    free(h);
    free(buf);
    return e;
}

/* qsort order of records: key_id bytewise, a proper prefix first [K-KEY-3]. */
static int rec_cmp(const void *a, const void *b)
{
    const ks_p11meta *x = *(ks_p11meta *const *)a, *y = *(ks_p11meta *const *)b;
    const size_t n = x->key_id_len < y->key_id_len ? x->key_id_len : y->key_id_len;
    const int c = memcmp(x->key_id, y->key_id, n);
    if (c != 0) {
        return c;
    }
    return (x->key_id_len > y->key_id_len) - (x->key_id_len < y->key_id_len);
}

/* The provider's list (ks_provider_admin_ops): records are collected in
 * the token call, and fn runs after it, once per version. */
static ks_err p11_list(void *self, ks_bytes key_id, ks_key_list_fn fn, void *arg,
                       uint32_t timeout_ms)
{
    if (self == NULL || fn == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (key_id.len != 0 && !id_ok(key_id)) {
        return KS_ERR_NOT_FOUND;
    }
    list_call l = {.key_id = key_id};
    ks_err e = ks_p11_run(self, timeout_ms, list_body, &l);
    if (e == KS_OK && l.n > 1) {
        qsort(l.recs, l.n, sizeof l.recs[0], rec_cmp);
    }
    for (size_t i = 0; e == KS_OK && i < l.n; i++) {
        const ks_p11meta *r = l.recs[i];
        int stop = 0;
        for (uint32_t v = 1; v <= r->nversions && !stop; v++) {
            ks_key_entry ent = {{r->key_id, r->key_id_len}, v, (ks_key_state)r->states[v - 1],
                                v == r->primary};
            stop = fn(arg, &ent) != 0;
        }
        if (stop) {
            break;
        }
    }
    list_clear(&l);
    return e;
}

/* ---- the provider ------------------------------------------------------------ */

/* The provider's destroy: everything of ks_p11_stop. */
static void p11_destroy(void *self)
{
    ks_p11_stop(self);
}

static const ks_provider_admin_ops p11_admin = {
    .create = p11_create,
    .add_version = p11_add_version,
    .promote = p11_promote,
    .set_state = p11_set_state,
    .list = p11_list,
};

static const ks_provider_ops p11_ops = {
    .wrap = p11_wrap,
    .unwrap = p11_unwrap,
    .key_info = p11_key_info,
    .destroy = p11_destroy,
    .admin = &p11_admin,
};

/* Copy the config into a new provider (PIN into sodium_malloc'd memory,
 * label space-padded, URI parsed). */
static ks_err configure(ks_p11 *p, const ks_pkcs11_config *cfg)
{
    p->gcm_layout = cfg->gcm_layout;
    p->timeout_ms = cfg->timeout_ms != 0 ? cfg->timeout_ms : KS_P11_DEFAULT_TIMEOUT_MS;
    if (cfg->token_label != NULL) {
        const size_t n = strlen(cfg->token_label);
        if (n == 0 || n > KS_P11_LABEL_LEN) {
            return KS_ERR_INVALID_ARGUMENT;
        }
        memset(p->label, ' ', sizeof p->label);
        memcpy(p->label, cfg->token_label, n);
        p->by_label = 1;
    } else {
        p->uri = p11_kit_uri_new();
        if (p->uri == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        if (p11_kit_uri_parse(cfg->token_uri, P11_KIT_URI_FOR_TOKEN, p->uri) != P11_KIT_URI_OK) {
            return KS_ERR_INVALID_ARGUMENT;
        }
    }
    p->pin = sodium_malloc(cfg->pin.len);
    if (p->pin == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    memcpy(p->pin, cfg->pin.ptr, cfg->pin.len);
    p->pin_len = cfg->pin.len;
    sodium_mprotect_noaccess(p->pin);
    return KS_OK;
}

/* See keyshift/pkcs11.h. */
ks_err ks_pkcs11_open(const ks_pkcs11_config *cfg, ks_provider *out)
{
    if (cfg == NULL || out == NULL || (cfg->token_label == NULL) == (cfg->token_uri == NULL) ||
        cfg->pin.ptr == NULL || cfg->pin.len == 0 || cfg->pin.len > KS_P11_PIN_MAX ||
        (cfg->gcm_layout != KS_PKCS11_GCM_P11KIT && cfg->gcm_layout != KS_PKCS11_GCM_NO_IVBITS)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (sodium_init() < 0) {
        return KS_ERR_UNAVAILABLE;
    }
    ks_p11 *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&p->admin_mu, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = configure(p, cfg);
    if (e == KS_OK) {
        e = ks_p11_start(p, cfg->module != NULL ? cfg->module : KS_PKCS11_DEFAULT_MODULE);
    }
    if (e != KS_OK) {
        ks_p11_stop(p);
        return e;
    }
    *out = (ks_provider){&p11_ops, p, "pkcs11"};
    return KS_OK;
}
