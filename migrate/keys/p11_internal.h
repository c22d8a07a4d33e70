/*
 * migrate/keys/p11_internal.h -- the "pkcs11" provider's internals, shared
 * by its two halves:
 *   p11_session.c      the module, the token, the login, the session pool,
 *                      deadlines, reconnects, fork() and the PKCS#11 error
 *                      mapping;
 *   provider_pkcs11.c  the object model (KEK objects and metadata
 *                      records), wrap, unwrap, key_info and key management.
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

#ifdef KS_TEST_HOOKS
/* Tests only: when set, called with the module's function list once it
 * is loaded; the list it returns is used instead (a test wraps calls to
 * count or fail them). */
extern CK_FUNCTION_LIST_PTR (*ks_p11_test_filter)(CK_FUNCTION_LIST_PTR f);
#endif

#endif /* KS_MIGRATE_P11_INTERNAL_H */
