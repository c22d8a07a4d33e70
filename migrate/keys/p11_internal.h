/*
 * migrate/keys/p11_internal.h -- the "pkcs11" provider's internals, shared
 * by its two halves:
 *   p11_session.c      the module, the token, the login, the session pool,
 *                      deadlines, reconnects, fork() and the PKCS#11 error
 *                      mapping;
 *   p11_objects.c      the object model: KEK objects and metadata records;
 *   provider_pkcs11.c  wrap, unwrap, key_info, key management and open.
 * Internal header (no KS_API).  The p11-kit header comes last: its
 * compatibility names are macros (value, count, ...), so code after it
 * avoids those identifiers.
 */
#ifndef KS_MIGRATE_P11_INTERNAL_H
#define KS_MIGRATE_P11_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <keyshift/pkcs11.h>
#include <keyshift/provider.h>

#include "p11_meta.h"

#include <p11-kit/pkcs11.h>
#include <p11-kit/uri.h>

/* The result a call "returns" when the deadline passed before it was
 * made: a vendor-defined value no module returns to us ("KS"). */
#define KS_P11_RV_TIMEOUT (CKR_VENDOR_DEFINED | 0x4B530001UL)
/* Idle sessions kept for reuse; more are closed when given back. */
#define KS_P11_POOL_MAX 32
/* CK_TOKEN_INFO.label: 32 bytes, space-padded. */
#define KS_P11_LABEL_LEN 32
/* The longest PIN accepted. */
#define KS_P11_PIN_MAX 256
/* The default deadline per call (ks_pkcs11_config.timeout_ms 0). */
#define KS_P11_DEFAULT_TIMEOUT_MS 10000u

typedef struct ks_p11 ks_p11;

struct ks_p11 {
    /* Fixed at open. */
    void *dl;                          /* dlopen handle of the module */
    CK_FUNCTION_LIST_PTR f;
    char label[KS_P11_LABEL_LEN];      /* space-padded, when selecting by label */
    int by_label;
    P11KitUri *uri;                    /* when selecting by URI */
    uint8_t *pin;                      /* sodium_malloc'd, no-access but at login */
    size_t pin_len;
    ks_pkcs11_gcm_layout gcm_layout;
    uint32_t timeout_ms;

    /* Guarded by mu. */
    pthread_mutex_t mu;
    int owns_init;                     /* we called C_Initialize: C_Finalize on destroy */
    pid_t pid;                         /* the process whose module state this is */
    int stale;                         /* set in a fork() child: re-initialise first */
    ks_err dead;                       /* a permanent failure (a PIN refused at re-login) */
    int connected;                     /* slot found, login session open, logged in */
    CK_SLOT_ID slot;
    CK_SESSION_HANDLE login_session;   /* keeps the login alive while the pool is empty */
    uint64_t gen;                      /* connection generation, bumped by every reconnect */
    CK_SESSION_HANDLE pool[KS_P11_POOL_MAX];
    size_t npool;
    int usage_attrs_refused;           /* the token refused C_SetAttributeValue of CKA_ENCRYPT */

    /* Serialises this process's key changes (admin ops). */
    pthread_mutex_t admin_mu;

    /* The registry of live providers, for the atfork child handler. */
    ks_p11 *reg_next;
    ks_p11 *reg_prev;
};

/* One provider call in progress: its session, its deadline, the last
 * PKCS#11 failure. */
typedef struct ks_p11_op {
    ks_p11 *p;
    CK_FUNCTION_LIST_PTR f;
    CK_SESSION_HANDLE s;
    uint64_t gen;                      /* the generation s belongs to */
    uint64_t deadline_ns;              /* on ks_mono_ns() */
    CK_RV rv;                          /* the last result other than CKR_OK */
} ks_p11_op;

/* The deadline check made before every PKCS#11 call: CKR_OK, or
 * KS_P11_RV_TIMEOUT once op's deadline has passed. */
CK_RV ks_p11_tick(const ks_p11_op *op);

/* Record rv in op->rv when it is a failure; return rv. */
CK_RV ks_p11_note(ks_p11_op *op, CK_RV rv);

/* Call op->f->fn(...) if the deadline allows, recording a failure. */
#define KS_P11_CALL(op, fn, ...)                                                              \
    ks_p11_note((op), ks_p11_tick(op) != CKR_OK ? KS_P11_RV_TIMEOUT : (op)->f->fn(__VA_ARGS__))

/* The ks_err for a PKCS#11 result (docs/providers.md, errors). */
ks_err ks_p11_map(CK_RV rv);

/* A provider call's body: runs with op->s a logged-in R/W session. */
typedef ks_err (*ks_p11_body)(ks_p11_op *op, void *arg);

/*
 * Run body with a session of p's pool, within timeout_ms (0: p's
 * default).  Re-initialises first in a fork() child.  When the body (or
 * opening its session) fails with a result that says the session, the
 * login or the token went away, reconnects once and runs the body once
 * more; a second such failure is returned as mapped (KS_ERR_UNAVAILABLE,
 * or KS_ERR_DENIED for a login that did not come back).  A session whose
 * body failed is closed rather than reused.
 */
ks_err ks_p11_run(ks_p11 *p, uint32_t timeout_ms, ks_p11_body body, void *arg);

/* Load, initialise, find the token, check its mechanisms and log in
 * (ks_pkcs11_open's work on a zeroed p whose config fields and mutexes
 * are set). */
ks_err ks_p11_start(ks_p11 *p, const char *module);

/* Log out, close, finalise if ours, unload and free everything of p
 * (p itself too, and its mutexes).  Safe on a partly started p. */
void ks_p11_stop(ks_p11 *p);

/* ---- the object model (p11_objects.c) ----------------------------------- */

/* Metadata objects one key may have at once (more: integrity). */
#define KS_P11_META_MAX_OBJECTS 16

/* A loaded metadata record and the objects that hold it (all of the key's
 * records: a change destroys them once it has written its own). */
typedef struct ks_p11_meta_state {
    ks_p11meta m;
    CK_OBJECT_HANDLE objs[KS_P11_META_MAX_OBJECTS];
    CK_ULONG nobjs;
    uint8_t best[KS_P11META_MAX_LEN];
    size_t best_len;
} ks_p11_meta_state;

/* A non-const pointer for a PKCS#11 input parameter the module only reads
 * (the API has no const); the cast through uintptr_t is deliberate. */
static inline CK_BYTE_PTR ks_p11_in_ptr(const void *p)
{
    return (CK_BYTE_PTR)(uintptr_t)p;
}

/* Load key_id's preferred record (highest seq; equal ones: the greater
 * bytes) into *st, with every metadata object of the key: KS_ERR_NOT_FOUND
 * when it has none, KS_ERR_INTEGRITY for a malformed record, one naming
 * another key, or too many objects. */
ks_err ks_p11_load_meta(ks_p11_op *op, ks_bytes key_id, ks_p11_meta_state *st);

/* Write st->m (its seq already advanced) as a new metadata object, then
 * destroy the objects st held; st then holds the new one. */
ks_err ks_p11_write_meta(ks_p11_op *op, ks_p11_meta_state *st);

/* The one KEK object of (key_id, version): KS_ERR_NOT_FOUND, or
 * KS_ERR_INTEGRITY for several or one that is not a 32-byte AES key. */
ks_err ks_p11_find_key(ks_p11_op *op, ks_bytes key_id, uint32_t version, CK_OBJECT_HANDLE *out);

/* Destroy every KEK object of (key_id, version). */
ks_err ks_p11_destroy_keys(ks_p11_op *op, ks_bytes key_id, uint32_t version);

/* Generate the KEK object of (key_id, version), active. */
ks_err ks_p11_generate_key(ks_p11_op *op, ks_bytes key_id, uint32_t version);

/* Set CKA_ENCRYPT and CKA_DECRYPT of KEK object h for `state`. */
ks_err ks_p11_set_usage(ks_p11_op *op, CK_OBJECT_HANDLE h, ks_key_state state);

/* The records a listing collected: one per key, the preferred one. */
typedef struct ks_p11_list_call {
    ks_bytes key_id;       /* empty: every key */
    ks_p11meta **recs;
    size_t n, cap;
} ks_p11_list_call;

/* Free a listing's records. */
void ks_p11_list_clear(ks_p11_list_call *l);

/* A ks_p11_body collecting the preferred record of l->key_id, or of every
 * key when it is empty, into l (arg). */
ks_err ks_p11_list_body(ks_p11_op *op, void *arg);

/* qsort order of ks_p11meta pointers: key_id bytewise, a proper prefix
 * first [K-KEY-3]. */
int ks_p11_rec_cmp(const void *a, const void *b);

#ifdef KS_TEST_HOOKS
/* Tests only: when set, called with the module's function list once it
 * is loaded; the list it returns is used instead (a test wraps calls to
 * count or fail them). */
extern CK_FUNCTION_LIST_PTR (*ks_p11_test_filter)(CK_FUNCTION_LIST_PTR f);
#endif

#endif /* KS_MIGRATE_P11_INTERNAL_H */
