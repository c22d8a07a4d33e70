/*
 * migrate/keys/provider_pkcs11.c -- the "pkcs11" key provider
 * (keyshift/pkcs11.h): wrap, unwrap, key_info, key management and open.
 * The object model is p11_objects.c; the connection (module, login,
 * sessions, deadlines, reconnects, fork) is p11_session.c;
 * docs/providers.md ("PKCS#11 provider") is the specification.
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
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "keyring_format.h"
#include "p11_meta.h"
#include "p11_internal.h"
#include "provider_internal.h"
#include "../alloc_hook.h"

#define IV_LEN 12
#define TAG_LEN 16
#define CT_LEN (KS_DEK_LEN + TAG_LEN)

/* The CK_GCM_PARAMS of PKCS#11 2.40 errata and some vendors: no ulIvBits
 * (KS_PKCS11_GCM_NO_IVBITS). */
typedef struct gcm_params_no_ivbits {
    CK_BYTE_PTR pIv;
    CK_ULONG ulIvLen;
    CK_BYTE_PTR pAAD;
    CK_ULONG ulAADLen;
    CK_ULONG ulTagBits;
} gcm_params_no_ivbits;

/* Nonzero when a view is {NULL, 0} or points at its bytes. */
static int view_ok(ks_bytes b)
{
    return b.ptr != NULL || b.len == 0;
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

/* Load key_id's record into *st when it has a version `version`
 * (KS_ERR_NOT_FOUND otherwise). */
static ks_err load_version(ks_p11_op *op, ks_bytes key_id, uint32_t version, ks_p11_meta_state *st)
{
    const ks_err e = ks_p11_load_meta(op, key_id, st);
    return e == KS_OK && version > st->m.nversions ? KS_ERR_NOT_FOUND : e;
}

/* The record's state of the call's version, and its key object, when the
 * state allows the operation. */
static ks_err usable_key(ks_p11_op *op, const wrap_call *w, int for_wrap, CK_OBJECT_HANDLE *h)
{
    ks_p11_meta_state *st = malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = load_version(op, w->key_id, w->version, st);
    if (e == KS_OK) {
        e = ks_key_state_usable(st->m.states[w->version - 1], for_wrap);
    }
    free(st);
    return e != KS_OK ? e : ks_p11_find_key(op, w->key_id, w->version, h);
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
        old = (gcm_params_no_ivbits){iv, IV_LEN, ks_p11_in_ptr(aad.ptr), aad.len, TAG_LEN * 8};
        mech.pParameter = &old;
        mech.ulParameterLen = sizeof old;
    } else {
        p11kit.pIv = iv;
        p11kit.ulIvLen = IV_LEN;
        p11kit.ulIvBits = IV_LEN * 8;
        p11kit.pAAD = ks_p11_in_ptr(aad.ptr);
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
        KS_P11_CALL(op, C_Decrypt, op->s, ks_p11_in_ptr(w->wrapped.ptr + IV_LEN), CT_LEN, pt, &len);
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
    ks_p11_meta_state *st = malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = ks_p11_load_meta(op, c->key_id, st);
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

/* Run an admin body under the provider's admin lock, with a ks_p11_meta_state
 * allocated for it (passed as arg->... through a pair). */
typedef struct admin_run {
    admin_call *c;
    ks_p11_meta_state *st;
    ks_err (*fn)(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st);
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
                         ks_err (*fn)(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st))
{
    ks_p11_meta_state *st = malloc(sizeof *st);
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
static ks_err create_fn(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st)
{
    ks_err e = ks_p11_load_meta(op, c->key_id, st);
    if (e == KS_OK) {
        return KS_ERR_EXISTS;
    }
    if (e != KS_ERR_NOT_FOUND) {
        return e;
    }
    if ((e = ks_p11_generate_key(op, c->key_id, 1)) != KS_OK) {
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
    e = ks_p11_write_meta(op, st);
    if (e != KS_OK) {
        (void)ks_p11_destroy_keys(op, c->key_id, 1);
    }
    return e;
}

/* add_version body: the next version in the token, then the record. */
static ks_err add_version_fn(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st)
{
    ks_err e = ks_p11_load_meta(op, c->key_id, st);
    if (e != KS_OK) {
        return e;
    }
    if (st->m.nversions >= KS_P11META_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE;
    }
    const uint32_t v = st->m.nversions + 1;
    if ((e = ks_p11_generate_key(op, c->key_id, v)) != KS_OK) {
        return e;
    }
    st->m.states[v - 1] = KS_KEY_ACTIVE;
    st->m.nversions = v;
    st->m.seq++;
    e = ks_p11_write_meta(op, st);
    if (e != KS_OK) {
        (void)ks_p11_destroy_keys(op, c->key_id, v);
        return e;
    }
    c->version = v;
    return KS_OK;
}

/* promote body [K-STATE-3]: an active version only. */
static ks_err promote_fn(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st)
{
    ks_err e = load_version(op, c->key_id, c->version, st);
    if (e != KS_OK) {
        return e;
    }
    if (st->m.states[c->version - 1] != KS_KEY_ACTIVE) {
        return KS_ERR_STATE;
    }
    if (st->m.primary == c->version) {
        return KS_OK;
    }
    st->m.primary = c->version;
    st->m.seq++;
    return ks_p11_write_meta(op, st);
}

/* set_state body [K-STATE-2..3].  Among active, decrypt-only and
 * disabled: the key object's usage first, then the record.  Destroyed:
 * the record first (the revocation is durable before the material goes),
 * then the object. */
static ks_err set_state_fn(ks_p11_op *op, admin_call *c, ks_p11_meta_state *st)
{
    ks_err e = load_version(op, c->key_id, c->version, st);
    if (e != KS_OK) {
        return e;
    }
    const uint8_t cur = st->m.states[c->version - 1];
    if (cur == c->state) {
        /* In effect already; a destroy interrupted before the object went
         * is finished now. */
        return cur == KS_KEY_DESTROYED ? ks_p11_destroy_keys(op, c->key_id, c->version) : KS_OK;
    }
    if (cur == KS_KEY_DESTROYED || (c->version == st->m.primary && c->state != KS_KEY_ACTIVE)) {
        return KS_ERR_STATE;
    }
    if (c->state != KS_KEY_DESTROYED) {
        CK_OBJECT_HANDLE h;
        if ((e = ks_p11_find_key(op, c->key_id, c->version, &h)) != KS_OK ||
            (e = ks_p11_set_usage(op, h, c->state)) != KS_OK) {
            return e;
        }
    }
    st->m.states[c->version - 1] = (uint8_t)c->state;
    st->m.seq++;
    if ((e = ks_p11_write_meta(op, st)) != KS_OK) {
        return e;
    }
    return c->state == KS_KEY_DESTROYED ? ks_p11_destroy_keys(op, c->key_id, c->version) : KS_OK;
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
    ks_p11_list_call l = {.key_id = key_id};
    ks_err e = ks_p11_run(self, timeout_ms, ks_p11_list_body, &l);
    if (e == KS_OK && l.n > 1) {
        qsort(l.recs, l.n, sizeof l.recs[0], ks_p11_rec_cmp);
    }
    for (size_t i = 0; e == KS_OK && i < l.n; i++) {
        const ks_p11meta *r = l.recs[i];
        int stop = 0;
        for (uint32_t v = 1; v <= r->nversions && !stop; v++) {
            ks_key_entry ent = {{r->key_id, r->key_id_len}, v, (ks_key_state)r->states[v - 1],
                                v == r->primary, 0 /* the token keeps no creation time */};
            stop = fn(arg, &ent) != 0;
        }
        if (stop) {
            break;
        }
    }
    ks_p11_list_clear(&l);
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
