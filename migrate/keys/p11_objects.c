/*
 * migrate/keys/p11_objects.c -- the "pkcs11" provider's object model in the
 * token (docs/providers.md, "PKCS#11 provider"; p11_internal.h): object
 * names and IDs, searches, the per-key metadata records (loading the
 * preferred one, replacing it), KEK objects (finding exactly one,
 * generating, destroying, usage flags) and the collection of a listing.
 *
 * Everything read from the token is checked before use: attribute
 * lengths against their buffers, records through the strict parser of
 * p11_meta.c, a record's key_id against the label it was found by.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p11_meta.h"
#include "p11_internal.h"
#include "../alloc_hook.h"

#define KEY_LABEL_PREFIX "keyshift:"
#define META_LABEL_PREFIX "keyshift-meta:"
#define APPLICATION "keyshift"
#define KEK_LEN 32
/* Key objects one (key_id, version) search looks for: one is right. */
#define KEY_MAX_OBJECTS 4
/* Room for any label: the longer prefix, a key_id, ":" and a version. */
#define LABEL_CAP (sizeof META_LABEL_PREFIX + KS_KEY_ID_MAX + 12)

static CK_BBOOL ck_true = CK_TRUE;
static CK_BBOOL ck_false = CK_FALSE;

/* A template attribute over an object of its own size. */
#define ATTR(t, v) {(t), (v), sizeof *(v)}

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
ks_err ks_p11_load_meta(ks_p11_op *op, ks_bytes key_id, ks_p11_meta_state *st)
{
    char label[LABEL_CAP];
    CK_OBJECT_CLASS cls = CKO_DATA;
    CK_ATTRIBUTE tmpl[] = {
        ATTR(CKA_CLASS, &cls),
        ATTR(CKA_TOKEN, &ck_true),
        {CKA_APPLICATION, ks_p11_in_ptr(APPLICATION), sizeof APPLICATION - 1},
        {CKA_LABEL, label, meta_label(key_id, label)},
    };
    CK_OBJECT_HANDLE h[KS_P11_META_MAX_OBJECTS + 1];
    CK_ULONG n = 0;
    ks_err e = find(op, tmpl, sizeof tmpl / sizeof tmpl[0], h, KS_P11_META_MAX_OBJECTS + 1, &n);
    if (e != KS_OK) {
        return e;
    }
    if (n == 0) {
        return KS_ERR_NOT_FOUND;
    }
    if (n > KS_P11_META_MAX_OBJECTS) {
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
ks_err ks_p11_write_meta(ks_p11_op *op, ks_p11_meta_state *st)
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
        {CKA_APPLICATION, ks_p11_in_ptr(APPLICATION), sizeof APPLICATION - 1},
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
ks_err ks_p11_find_key(ks_p11_op *op, ks_bytes key_id, uint32_t version, CK_OBJECT_HANDLE *out)
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
ks_err ks_p11_destroy_keys(ks_p11_op *op, ks_bytes key_id, uint32_t version)
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
ks_err ks_p11_generate_key(ks_p11_op *op, ks_bytes key_id, uint32_t version)
{
    ks_err e = ks_p11_destroy_keys(op, key_id, version);
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
    if (e != KS_OK && ks_p11_tick(op) == CKR_OK) {
        (void)op->f->C_DestroyObject(op->s, h); /* keep the first failure in op->rv */
    }
    return e;
}

/* Make the token enforce `state` on key object h (CKA_ENCRYPT,
 * CKA_DECRYPT).  A token that refuses to change them leaves the record
 * alone to enforce the state; that is noted in the provider. */
ks_err ks_p11_set_usage(ks_p11_op *op, CK_OBJECT_HANDLE h, ks_key_state state)
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

/* ---- listing ----------------------------------------------------------------- */


/* Free the records of a listing (also between attempts). */
void ks_p11_list_clear(ks_p11_list_call *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->recs[i]);
    }
    free(l->recs);
    l->recs = NULL;
    l->n = l->cap = 0;
}

/* Nonzero when record a is preferred to b, as ks_p11_load_meta prefers them: a
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
static ks_err list_add(ks_p11_list_call *l, ks_p11meta *rec)
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
static ks_err list_object(ks_p11_op *op, ks_p11_list_call *l, CK_OBJECT_HANDLE h, uint8_t *buf)
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
ks_err ks_p11_list_body(ks_p11_op *op, void *arg)
{
    ks_p11_list_call *l = arg;
    ks_p11_list_clear(l);
    if (l->key_id.len != 0) {
        ks_p11_meta_state *st = malloc(sizeof *st);
        ks_p11meta *rec = malloc(sizeof *rec);
        if (st == NULL || rec == NULL) {
            free(st);
            free(rec);
            return KS_ERR_NO_MEMORY;
        }
        ks_err e = ks_p11_load_meta(op, l->key_id, st);
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
        {CKA_APPLICATION, ks_p11_in_ptr(APPLICATION), sizeof APPLICATION - 1},
    };
    /* Collect every handle first: object reads cannot run inside a search. */
    const size_t max = (size_t)KS_KEYRING_MAX_KEYS * KS_P11_META_MAX_OBJECTS;
    CK_OBJECT_HANDLE *h = calloc(max + 1, sizeof *h);
    uint8_t *buf = malloc(KS_P11META_MAX_LEN);
    if (h == NULL || buf == NULL) {
        free(h);
        free(buf);
        return KS_ERR_NO_MEMORY;
    }
    CK_ULONG n = 0;
    const CK_RV init = KS_P11_CALL(op, C_FindObjectsInit, op->s, tmpl, sizeof tmpl / sizeof tmpl[0]);
    ks_err e = ks_p11_map(init);
    while (e == KS_OK && n <= max) {
        const CK_ULONG room = (CK_ULONG)(max + 1 - n);
        CK_ULONG got = 0;
        const CK_RV rv = KS_P11_CALL(op, C_FindObjects, op->s, h + n, room, &got);
        if (rv != CKR_OK) {
            e = ks_p11_map(rv);
        } else if (got > room) {
            e = KS_ERR_INTEGRITY; /* more handles than the room we gave */
        } else if (got == 0) {
            break;
        } else {
            n += got;
        }
    }
    if (init == CKR_OK) {
        const CK_RV fin = KS_P11_CALL(op, C_FindObjectsFinal, op->s);
        if (e == KS_OK) {
            e = ks_p11_map(fin);
        }
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
int ks_p11_rec_cmp(const void *a, const void *b)
{
    const ks_p11meta *x = *(ks_p11meta *const *)a, *y = *(ks_p11meta *const *)b;
    const size_t n = x->key_id_len < y->key_id_len ? x->key_id_len : y->key_id_len;
    const int c = memcmp(x->key_id, y->key_id, n);
    if (c != 0) {
        return c;
    }
    return (x->key_id_len > y->key_id_len) - (x->key_id_len < y->key_id_len);
}
