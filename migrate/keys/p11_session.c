/*
 * migrate/keys/p11_session.c -- the "pkcs11" provider's connection to its
 * token (p11_internal.h): loading the module, C_Initialize, finding the
 * token by label or RFC 7512 URI, the one login, the session pool,
 * per-call deadlines, one reconnect on a lost session or token, fork()
 * and the mapping of PKCS#11 results to ks_err.
 *
 * Sessions.  The provider logs in once, on a session of its own that it
 * keeps open (a token logs the application out when its last session
 * closes).  Calls take an idle session from a mutex-guarded free list, or
 * open one, and give it back; sessions share the login.  A session whose
 * call failed is closed, so that no half-done operation is reused.
 *
 * fork().  An atfork child handler marks every live provider stale; the
 * first call in the child then calls C_Initialize again (never C_Finalize
 * on the parent's state, and never closes the parent's session handles),
 * finds the token and logs in again with the PIN, which the provider keeps
 * for that purpose in sodium_malloc'd memory, no-access except during a
 * login, wiped and freed by destroy.
 *
 * Deadlines.  Every PKCS#11 call is preceded by a deadline check
 * (KS_P11_CALL); a call already made cannot be cancelled, so a token that
 * hangs inside one holds the caller past its deadline: a deployment that
 * must bound that needs an out-of-process provider.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "../crypto/mono_clock.h"
#include "p11_internal.h"
#include "../alloc_hook.h"

#ifdef KS_TEST_HOOKS
CK_FUNCTION_LIST_PTR (*ks_p11_test_filter)(CK_FUNCTION_LIST_PTR f);
#endif

/* ---- the registry of live providers (fork) ------------------------------ */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static ks_p11 *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* atfork prepare: hold the registry so that no open or destroy is
 * half-way through the list when the address space is copied.  No
 * provider lock is taken here: calls hold those only briefly or while
 * reconnecting, and the child re-initialises them anyway. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&registry_mu);
}

/* atfork parent: release the registry. */
static void fork_parent(void)
{
    pthread_mutex_unlock(&registry_mu);
}

/* atfork child: only this thread exists.  Every provider's locks may have
 * been held by threads the child does not have, so they are initialised
 * afresh, and every provider is marked stale: its module state, sessions
 * and login belong to the parent. */
static void fork_child(void)
{
    for (ks_p11 *p = registry; p != NULL; p = p->reg_next) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_mutex_init(&p->admin_mu, NULL);
        p->stale = 1;
    }
    pthread_mutex_unlock(&registry_mu);
}

/* Register the atfork handlers, once per process. */
static void atfork_init(void)
{
    (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Add p to the registry. */
static void registry_add(ks_p11 *p)
{
    pthread_once(&atfork_once, atfork_init);
    pthread_mutex_lock(&registry_mu);
    p->reg_prev = NULL;
    p->reg_next = registry;
    if (registry != NULL) {
        registry->reg_prev = p;
    }
    registry = p;
    pthread_mutex_unlock(&registry_mu);
}

/* Remove p from the registry (a no-op when it is not in it).  Returns
 * another live provider on the same module, or NULL: the module's state
 * is shared by the whole process, so the last user finalises it. */
static ks_p11 *registry_remove(ks_p11 *p)
{
    pthread_mutex_lock(&registry_mu);
    if (p->reg_prev != NULL) {
        p->reg_prev->reg_next = p->reg_next;
    } else if (registry == p) {
        registry = p->reg_next;
    }
    if (p->reg_next != NULL) {
        p->reg_next->reg_prev = p->reg_prev;
    }
    p->reg_next = p->reg_prev = NULL;
    ks_p11 *other = NULL;
    for (ks_p11 *q = registry; q != NULL; q = q->reg_next) {
        if (q->f == p->f) {
            other = q;
            break;
        }
    }
    if (other != NULL && p->owns_init) {
        /* The module stays initialised for the other provider; whoever is
         * last finalises it. */
        pthread_mutex_lock(&other->mu);
        other->owns_init = 1;
        pthread_mutex_unlock(&other->mu);
    }
    pthread_mutex_unlock(&registry_mu);
    return other;
}

/* ---- deadlines and errors ------------------------------------------------ */

/* See p11_internal.h. */
CK_RV ks_p11_tick(const ks_p11_op *op)
{
    return ks_mono_ns() > op->deadline_ns ? KS_P11_RV_TIMEOUT : CKR_OK;
}

/* See p11_internal.h. */
CK_RV ks_p11_note(ks_p11_op *op, CK_RV rv)
{
    if (rv != CKR_OK) {
        op->rv = rv;
    }
    return rv;
}

/* Nonzero for a result after which one reconnect is attempted: the
 * session, the login or the token itself went away. */
static int needs_reconnect(CK_RV rv)
{
    switch (rv) {
    case CKR_DEVICE_REMOVED:
    case CKR_TOKEN_NOT_PRESENT:
    case CKR_SESSION_HANDLE_INVALID:
    case CKR_SESSION_CLOSED:
    case CKR_DEVICE_ERROR:
    case CKR_USER_NOT_LOGGED_IN:
    case CKR_CRYPTOKI_NOT_INITIALIZED:
        return 1;
    default:
        return 0;
    }
}

/* See p11_internal.h. */
ks_err ks_p11_map(CK_RV rv)
{
    switch (rv) {
    case CKR_OK:
        return KS_OK;
    case KS_P11_RV_TIMEOUT:
        return KS_ERR_TIMEOUT;
    case CKR_PIN_INCORRECT:
    case CKR_PIN_INVALID:
    case CKR_PIN_LEN_RANGE:
    case CKR_PIN_EXPIRED:
    case CKR_PIN_LOCKED:
    case CKR_USER_NOT_LOGGED_IN:
    case CKR_KEY_FUNCTION_NOT_PERMITTED:
        return KS_ERR_DENIED;
    case CKR_USER_PIN_NOT_INITIALIZED:
        /* Not a verdict on the PIN: SoftHSM2 answers it to a correct PIN
         * while another process rewrites the token's files.  Retryable,
         * like any other failure of the token; the PIN stays usable. */
        return KS_ERR_UNAVAILABLE;
    case CKR_HOST_MEMORY:
    case CKR_DEVICE_MEMORY:
        return KS_ERR_NO_MEMORY;
    case CKR_OBJECT_HANDLE_INVALID:
    case CKR_KEY_HANDLE_INVALID:
        return KS_ERR_NOT_FOUND;
    default:
        /* Lost sessions and tokens (after the one reconnect), and any
         * other failure of the token: it may answer later. */
        return KS_ERR_UNAVAILABLE;
    }
}

/* ---- the token ----------------------------------------------------------- */

/* Nonzero when the token in *ti is the one p's config selects. */
static int token_matches(const ks_p11 *p, const CK_TOKEN_INFO *ti)
{
    if (p->by_label) {
        return memcmp(ti->label, p->label, KS_P11_LABEL_LEN) == 0;
    }
    return p11_kit_uri_match_token_info(p->uri, ti) == 1;
}

/* Find the one slot whose token p selects into p->slot: KS_ERR_UNAVAILABLE
 * when none does, KS_ERR_INVALID_ARGUMENT when several do (a KEK must
 * never be looked for in the wrong token). */
static ks_err find_slot(ks_p11 *p, ks_p11_op *op, CK_TOKEN_INFO *found)
{
    CK_ULONG n = 0;
    CK_RV rv = KS_P11_CALL(op, C_GetSlotList, CK_TRUE, NULL, &n);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    if (n == 0) {
        return KS_ERR_UNAVAILABLE;
    }
    if (n > 4096) {
        return KS_ERR_UNAVAILABLE;
    }
    CK_SLOT_ID *slots = calloc(n, sizeof *slots);
    if (slots == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    CK_ULONG got = n;
    rv = KS_P11_CALL(op, C_GetSlotList, CK_TRUE, slots, &got);
    ks_err e = rv == CKR_OK ? KS_ERR_UNAVAILABLE : ks_p11_map(rv);
    int matches = 0;
    for (CK_ULONG i = 0; rv == CKR_OK && i < got && i < n; i++) {
        CK_TOKEN_INFO ti;
        const CK_RV r = KS_P11_CALL(op, C_GetTokenInfo, slots[i], &ti);
        if (r == KS_P11_RV_TIMEOUT) {
            e = KS_ERR_TIMEOUT;
            matches = 0;
            break;
        }
        if (r != CKR_OK || !token_matches(p, &ti)) {
            continue; /* a token removed meanwhile, or another token */
        }
        if (++matches == 1) {
            p->slot = slots[i];
            *found = ti;
        }
    }
    free(slots);
    if (matches > 1) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return matches == 1 ? KS_OK : e;
}

/* KS_OK when the token offers CKM_AES_GCM and CKM_AES_KEY_GEN. */
static ks_err check_mechanisms(ks_p11 *p, ks_p11_op *op)
{
    CK_ULONG n = 0;
    CK_RV rv = KS_P11_CALL(op, C_GetMechanismList, p->slot, NULL, &n);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    if (n == 0 || n > 65536) {
        return KS_ERR_UNAVAILABLE;
    }
    CK_MECHANISM_TYPE *m = calloc(n, sizeof *m);
    if (m == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    CK_ULONG got = n;
    rv = KS_P11_CALL(op, C_GetMechanismList, p->slot, m, &got);
    int gcm = 0, gen = 0;
    for (CK_ULONG i = 0; rv == CKR_OK && i < got && i < n; i++) {
        gcm |= m[i] == CKM_AES_GCM;
        gen |= m[i] == CKM_AES_KEY_GEN;
    }
    free(m);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    return gcm && gen ? KS_OK : KS_ERR_UNAVAILABLE;
}

/* Log in as the user on p->login_session with the kept PIN, once.  A
 * token at its final try or locked is refused before trying.  A refused
 * PIN makes p dead: it is never tried again, in this process or after a
 * reconnect. */
static ks_err login(ks_p11 *p, ks_p11_op *op, const CK_TOKEN_INFO *ti)
{
    if ((ti->flags & (CKF_USER_PIN_FINAL_TRY | CKF_USER_PIN_LOCKED)) != 0) {
        p->dead = KS_ERR_DENIED;
        return KS_ERR_DENIED;
    }
    CK_RV rv = ks_p11_tick(op);
    if (rv == CKR_OK) {
        sodium_mprotect_readonly(p->pin);
        CK_UTF8CHAR pin[KS_P11_PIN_MAX];
        memcpy(pin, p->pin, p->pin_len);
        sodium_mprotect_noaccess(p->pin);
        rv = ks_p11_note(op, op->f->C_Login(p->login_session, CKU_USER, pin, p->pin_len));
        sodium_memzero(pin, sizeof pin);
    }
    if (rv == CKR_OK || rv == CKR_USER_ALREADY_LOGGED_IN) {
        /* Already: another provider of this process logged in (the login
         * state belongs to the application, not to a session). */
        return KS_OK;
    }
    const ks_err e = ks_p11_map(rv);
    if (e == KS_ERR_DENIED) {
        p->dead = KS_ERR_DENIED;
    }
    return e;
}

/* Under p->mu: find the token, open the login session and log in. */
static ks_err connect_locked(ks_p11 *p, ks_p11_op *op, int check_mechs)
{
    CK_TOKEN_INFO ti;
    memset(&ti, 0, sizeof ti);
    ks_err e = find_slot(p, op, &ti);
    if (e == KS_OK && check_mechs) {
        e = check_mechanisms(p, op);
    }
    if (e != KS_OK) {
        return e;
    }
    CK_SESSION_HANDLE s = CK_INVALID_HANDLE;
    CK_RV rv = KS_P11_CALL(op, C_OpenSession, p->slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL,
                           NULL, &s);
    if (rv != CKR_OK) {
        return ks_p11_map(rv);
    }
    p->login_session = s;
    e = login(p, op, &ti);
    if (e != KS_OK) {
        (void)p->f->C_CloseSession(s);
        p->login_session = CK_INVALID_HANDLE;
        return e;
    }
    p->connected = 1;
    return KS_OK;
}

/* C_Initialize with OS locking; an already initialised module is accepted
 * (then someone else finalises it). */
static ks_err initialize(ks_p11 *p, ks_p11_op *op)
{
    CK_C_INITIALIZE_ARGS args;
    memset(&args, 0, sizeof args);
    args.flags = CKF_OS_LOCKING_OK;
    const CK_RV rv = KS_P11_CALL(op, C_Initialize, &args);
    if (rv == CKR_OK) {
        p->owns_init = 1;
        return KS_OK;
    }
    if (rv == CKR_CRYPTOKI_ALREADY_INITIALIZED) {
        op->rv = CKR_OK;
        return KS_OK;
    }
    return rv == KS_P11_RV_TIMEOUT ? KS_ERR_TIMEOUT : KS_ERR_UNAVAILABLE;
}

/* Under p->mu, in a fork() child: forget the parent's sessions (never
 * closed: their handles are the parent's), initialise the module again
 * and connect. */
static ks_err reinit_locked(ks_p11 *p, ks_p11_op *op)
{
    p->npool = 0;
    p->login_session = CK_INVALID_HANDLE;
    p->connected = 0;
    p->gen++;
    p->owns_init = 0;
    p->pid = getpid();
    p->stale = 0;
    const ks_err e = initialize(p, op);
    return e != KS_OK ? e : connect_locked(p, op, 0);
}

/* Under p->mu: drop the connection of generation gen (closing its idle
 * sessions and the login session) and connect again, once.  Sessions of
 * the old generation still in use are abandoned, not closed, when given
 * back: their handle numbers may already name new sessions. */
static ks_err reconnect_locked(ks_p11 *p, ks_p11_op *op, uint64_t gen)
{
    if (gen != p->gen && p->connected) {
        return KS_OK; /* another thread reconnected meanwhile */
    }
    for (size_t i = 0; i < p->npool; i++) {
        (void)p->f->C_CloseSession(p->pool[i]);
    }
    p->npool = 0;
    if (p->login_session != CK_INVALID_HANDLE) {
        (void)p->f->C_CloseSession(p->login_session);
        p->login_session = CK_INVALID_HANDLE;
    }
    p->connected = 0;
    p->gen++;
    ks_err e = connect_locked(p, op, 0);
    if (e == KS_ERR_UNAVAILABLE && op->rv == CKR_CRYPTOKI_NOT_INITIALIZED) {
        /* Someone finalised the module under us: initialise it again. */
        e = initialize(p, op);
        if (e == KS_OK) {
            e = connect_locked(p, op, 0);
        }
    }
    return e;
}

/* ---- the session pool ---------------------------------------------------- */

/* Take a session for op: re-initialise after fork(), connect if needed,
 * then an idle session or a new one. */
static ks_err acquire(ks_p11 *p, ks_p11_op *op)
{
    ks_err e = KS_OK;
    pthread_mutex_lock(&p->mu);
    if (p->dead != KS_OK) {
        e = p->dead;
    } else if (p->stale || p->pid != getpid()) {
        e = reinit_locked(p, op);
    } else if (!p->connected) {
        e = reconnect_locked(p, op, p->gen);
    }
    op->s = CK_INVALID_HANDLE;
    if (e == KS_OK && p->npool > 0) {
        op->s = p->pool[--p->npool];
    }
    op->gen = p->gen;
    const CK_SLOT_ID slot = p->slot;
    pthread_mutex_unlock(&p->mu);
    if (e != KS_OK || op->s != CK_INVALID_HANDLE) {
        return e;
    }
    const CK_RV rv =
        KS_P11_CALL(op, C_OpenSession, slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &op->s);
    if (rv != CKR_OK) {
        op->s = CK_INVALID_HANDLE;
        return ks_p11_map(rv);
    }
    return KS_OK;
}

/* Give op's session back: to the pool when the call went well and the
 * connection is the same, else closed (or abandoned: see reconnect). */
static void release(ks_p11 *p, ks_p11_op *op, int ok)
{
    if (op->s == CK_INVALID_HANDLE) {
        return;
    }
    int close = 0;
    pthread_mutex_lock(&p->mu);
    const int current = op->gen == p->gen && !p->stale;
    if (ok && current && p->npool < KS_P11_POOL_MAX) {
        p->pool[p->npool++] = op->s;
    } else {
        close = current;
    }
    pthread_mutex_unlock(&p->mu);
    if (close) {
        (void)op->f->C_CloseSession(op->s);
    }
    op->s = CK_INVALID_HANDLE;
}

/*
 * After a lookup found no object (KS_ERR_NOT_FOUND): nonzero when the
 * token itself is gone rather than the object, i.e. C_GetTokenInfo on its
 * slot fails or names another token.  A module whose token is a store
 * that went away (SoftHSM2's token directory removed) answers lookups
 * with nothing but fails C_GetTokenInfo; a hardware token pulled out
 * answers CKR_DEVICE_REMOVED before this is ever asked.  The caller then
 * treats it as a lost token: one reconnect, then unavailable -- never a
 * not-found that would say the key does not exist.
 */
static int token_gone(ks_p11 *p, ks_p11_op *op)
{
    CK_TOKEN_INFO ti;
    const CK_RV r = KS_P11_CALL(op, C_GetTokenInfo, p->slot, &ti);
    return r != CKR_OK ? r != KS_P11_RV_TIMEOUT : !token_matches(p, &ti);
}

/* See p11_internal.h. */
ks_err ks_p11_run(ks_p11 *p, uint32_t timeout_ms, ks_p11_body body, void *arg)
{
    const uint32_t ms = timeout_ms != 0 ? timeout_ms : p->timeout_ms;
    ks_p11_op op = {.p = p, .f = p->f, .s = CK_INVALID_HANDLE};
    op.deadline_ns = ks_mono_ns() + (uint64_t)ms * 1000000u;
    ks_err e = KS_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        op.rv = CKR_OK;
        e = acquire(p, &op);
        if (e == KS_OK) {
            op.rv = CKR_OK;
            e = body(&op, arg);
            if (e == KS_ERR_NOT_FOUND && token_gone(p, &op)) {
                op.rv = CKR_TOKEN_NOT_PRESENT;
                e = KS_ERR_UNAVAILABLE;
            }
            release(p, &op, e == KS_OK || op.rv == CKR_OK);
        }
        if (e == KS_OK || attempt == 1 || !needs_reconnect(op.rv)) {
            return e;
        }
        const CK_RV first = op.rv;
        pthread_mutex_lock(&p->mu);
        const ks_err r = p->stale ? KS_OK : reconnect_locked(p, &op, op.gen);
        pthread_mutex_unlock(&p->mu);
        if (r != KS_OK) {
            /* The token did not come back: a lost one is unavailable, a
             * login that does not come back is denied. */
            return r == KS_ERR_TIMEOUT ? r : (r == KS_ERR_DENIED ? r : ks_p11_map(first));
        }
    }
    return e;
}

/* ---- start and stop ------------------------------------------------------ */

/* See p11_internal.h. */
ks_err ks_p11_start(ks_p11 *p, const char *module)
{
    p->login_session = CK_INVALID_HANDLE;
    p->pid = getpid();
    p->dl = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    if (p->dl == NULL) {
        return KS_ERR_UNAVAILABLE;
    }
    CK_C_GetFunctionList get;
    void *sym = dlsym(p->dl, "C_GetFunctionList");
    if (sym == NULL) {
        return KS_ERR_UNAVAILABLE;
    }
    memcpy(&get, &sym, sizeof get); /* object to function pointer, without a cast */
    CK_FUNCTION_LIST_PTR f = NULL;
    if (get(&f) != CKR_OK || f == NULL) {
        return KS_ERR_UNAVAILABLE;
    }
#ifdef KS_TEST_HOOKS
    if (ks_p11_test_filter != NULL) {
        f = ks_p11_test_filter(f);
    }
#endif
    p->f = f;
    ks_p11_op op = {.p = p, .f = f, .s = CK_INVALID_HANDLE};
    op.deadline_ns = ks_mono_ns() + (uint64_t)p->timeout_ms * 1000000u;
    ks_err e = initialize(p, &op);
    if (e == KS_OK) {
        pthread_mutex_lock(&p->mu);
        e = connect_locked(p, &op, 1);
        pthread_mutex_unlock(&p->mu);
    }
    if (e == KS_OK) {
        registry_add(p);
    }
    return e;
}

/* See p11_internal.h. */
void ks_p11_stop(ks_p11 *p)
{
    if (p == NULL) {
        return;
    }
    const ks_p11 *other = p->f != NULL ? registry_remove(p) : NULL;
    if (p->f != NULL && !p->stale && p->pid == getpid()) {
        for (size_t i = 0; i < p->npool; i++) {
            (void)p->f->C_CloseSession(p->pool[i]);
        }
        if (p->login_session != CK_INVALID_HANDLE) {
            if (other == NULL) {
                (void)p->f->C_Logout(p->login_session);
            }
            (void)p->f->C_CloseSession(p->login_session);
        }
        if (p->owns_init && other == NULL) {
            (void)p->f->C_Finalize(NULL);
        }
    }
    if (p->dl != NULL) {
        dlclose(p->dl);
    }
    if (p->pin != NULL) {
        sodium_free(p->pin); /* wipes */
    }
    if (p->uri != NULL) {
        p11_kit_uri_free(p->uri);
    }
    pthread_mutex_destroy(&p->admin_mu);
    pthread_mutex_destroy(&p->mu);
    sodium_memzero(p, sizeof *p);
    free(p);
}
