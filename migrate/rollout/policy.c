/*
 * migrate/rollout/policy.c -- the application policy (keyshift/rollout.h,
 * ks_policy_*) and the canary bucket.
 *
 * A policy keeps, in memory, the latest rollout of every column scope and
 * every key-scoped rollout (a later one of the same key_id may list other
 * columns, so an earlier one can still govern a column).  Answers (write
 * target, may read, column encoding) pick the governing rollout with
 * ks_rollout_scope_find, with no query and no lock: each answering thread
 * marks a read section on a flag of its own (its thread index's, on a
 * cache line of its own), and a reload swaps in new rules only after
 * raising `swapping` and waiting until no flag is up (the flag and
 * `swapping` are sequentially consistent, so either the reload sees the
 * flag or the reader sees `swapping` and steps back until the swap is
 * done).  Threads answering at once thus write nothing they share; with
 * a mutex per answer, two threads answered more slowly than one.
 * Before answering, at most once per refresh_ms, the policy reads the
 * store's data_version (keyshift/rollout_store.h; SQLite's `PRAGMA
 * data_version`, which changes when another connection commits to the
 * database) and reloads the rollouts, in one read transaction (the
 * store's snapshot), only when it changed.  A failed refresh keeps the rollouts it had and makes
 * the call that triggered it fail (fail closed: the caller does not act on
 * an answer it could not check).
 *
 * The instance's own writes (registration, heartbeat, key list, health
 * samples) may wait on the database's write lock: SQLite's busy timeout,
 * PostgreSQL's lock_timeout.  A policy that registers gets a second
 * connection for them (ks_policy_open; the writer of
 * ks_policy_open_stores), guarded by its own mutex wmu, so that answers,
 * which need only mu and reads, never wait behind them.  Without one,
 * the writes share db and hold mu as well.  Lock order: wmu, then mu.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>

#include "../../format/rules.h"
#include "../crypto/mono_clock.h"
#include "../crypto/thread_index.h"
#include "rollout_internal.h"
#include "../alloc_hook.h"

/* The default least time between two checks of the database. */
#define REFRESH_DEFAULT_MS 1000u
/* Rollouts read per page while reloading. */
#define LOAD_PAGE 16u

/* A thread index's read-section flag (thread_index.h): 1 while its owner
 * reads the rules; the shared index's counts the threads in a section. */
typedef struct reader_flag {
    _Alignas(64) _Atomic uint64_t in;
} reader_flag;

struct ks_policy {
    pthread_mutex_t wmu;            /* guards the instance's writes and wdb, self, heartbeat,
                                       reported and ids */
    ks_rollout_db *wdb;             /* the writes' own connection; NULL: they use db */
    ks_rollout_reader self;         /* this instance, as registered */
    int heartbeat;                  /* registered in keyshift_readers */
    ks_health_sample reported;      /* the totals of the last ks_policy_report */
    int64_t *ids;                   /* a report's rollouts under way */
    size_t ids_cap;
    pthread_mutex_t mu;             /* guards everything below but the atomics; rules and
                                       n_rules change under mu and swap_rules() alone, so
                                       read sections may read them without mu */
    ks_rollout_db *db;
    uint32_t refresh_ms;
    int loaded;                     /* rules hold a successful load */
    int64_t data_version;           /* at that load */
    ks_rollout *rules;              /* the latest rollout of each column, every key-scoped one */
    size_t n_rules, rules_cap;
    ks_rollout *spare;              /* reload's array, swapped with rules on success: the two
                                       are kept, as page is (8 rules are 107 KiB) */
    size_t spare_cap;
    ks_rollout *page;               /* reload's buffer of LOAD_PAGE rollouts, kept: at 13.7 KiB
                                       a rollout, one page (219 KiB) is past malloc's mmap
                                       threshold, so allocating it per reload mapped and
                                       faulted in fresh pages every time */
    _Alignas(64) _Atomic uint64_t next_check_ms; /* ks_mono_coarse_ms() of the last successful
                                                    data_version check + refresh_ms (0
                                                    before): written under mu, read by
                                                    answers before taking it */
    _Atomic int swapping;           /* a reload is swapping the rules: sections wait */
    reader_flag readers[KS_THREAD_SLOTS + 1]; /* by thread index */
};

/* The domain separation of the canary hash. */
static const char canary_domain[] = "keyshift-canary";

/* Set once this file has called sodium_init(). */
static _Atomic int sodium_called;

/* See rollout.h.  crypto_generichash is BLAKE2b; libsodium's portable
 * implementation is used if sodium_init() could not select another, so
 * the result never depends on it.  sodium_init() takes libsodium's global
 * mutex on every call, so it is called once here, not per tenant: per
 * call, it held two threads sealing in a percent canary to 1.55 times one
 * thread's rate. */
uint32_t ks_rollout_canary_bucket(int64_t rollout_id, ks_bytes tenant)
{
    uint8_t id[8], out[32];
    crypto_generichash_state st;
    if (!atomic_load_explicit(&sodium_called, memory_order_acquire)) {
        int init = sodium_init();
        (void)init; /* -1 only leaves the portable implementation in use */
        atomic_store_explicit(&sodium_called, 1, memory_order_release);
    }
    ks_be_put(id, (uint64_t)rollout_id, 8);
    crypto_generichash_init(&st, NULL, 0, sizeof out);
    crypto_generichash_update(&st, (const uint8_t *)canary_domain, sizeof canary_domain - 1);
    crypto_generichash_update(&st, id, sizeof id);
    if (tenant.len > 0 && tenant.ptr != NULL)
        crypto_generichash_update(&st, tenant.ptr, tenant.len);
    crypto_generichash_final(&st, out, sizeof out);
    return (uint32_t)(ks_be_get(out, 8) % 10000u);
}

/* ---- loading ---------------------------------------------------------------- */

/* Put r into rules[0, *n) (capacity *cap, grown): a column-scoped rollout
 * replaces the rule of the same column (rollouts come in id order, so the
 * later one wins); a key-scoped one is added. */
static ks_err keep_latest(ks_rollout **rules, size_t *n, size_t *cap, const ks_rollout *r)
{
    for (size_t i = 0; r->scope == KS_SCOPE_COLUMN && i < *n; i++) {
        if ((*rules)[i].scope == KS_SCOPE_COLUMN &&
            ks_rollout_name_cmp((*rules)[i].table, r->table) == 0 &&
            ks_rollout_name_cmp((*rules)[i].column, r->column) == 0) {
            (*rules)[i] = *r;
            return KS_OK;
        }
    }
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        ks_rollout *np = realloc(*rules, ncap * sizeof *np);
        if (np == NULL)
            return KS_ERR_NO_MEMORY;
        *rules = np;
        *cap = ncap;
    }
    (*rules)[(*n)++] = *r;
    return KS_OK;
}

/* ---- read sections ------------------------------------------------------------ */

/* Enter a read section of p's rules on this thread's flag; returns the
 * flag's index for read_exit().  Raise the flag, then look at swapping
 * (both sequentially consistent: see the top of this file); during a
 * swap, lower it and wait for the swap to end. */
static uint32_t read_enter(ks_policy *p)
{
    const uint32_t i = ks_thread_index();
    _Atomic uint64_t *f = &p->readers[i].in;
    for (;;) {
        if (i == KS_THREAD_SHARED)
            atomic_fetch_add(f, 1);
        else
            atomic_store(f, 1);
        if (!atomic_load(&p->swapping))
            return i;
        if (i == KS_THREAD_SHARED)
            atomic_fetch_sub_explicit(f, 1, memory_order_release);
        else
            atomic_store_explicit(f, 0, memory_order_release);
        while (atomic_load_explicit(&p->swapping, memory_order_acquire))
            sched_yield();
    }
}

/* Leave the read section read_enter() entered on flag i: what the
 * section read happens before the next swap. */
static void read_exit(ks_policy *p, uint32_t i)
{
    assert(i <= KS_THREAD_SHARED);
    if (i == KS_THREAD_SHARED)
        atomic_fetch_sub_explicit(&p->readers[i].in, 1, memory_order_release);
    else
        atomic_store_explicit(&p->readers[i].in, 0, memory_order_release);
}

/* With mu held: make rules[0, n) (capacity cap) p's rules, and the old
 * array the spare, once no read section can be reading it.  Sections
 * are a few hundred ns long; a thread preempted inside one makes the
 * reload wait for it, yielding. */
static void swap_rules(ks_policy *p, ks_rollout *rules, size_t cap, size_t n)
{
    atomic_store(&p->swapping, 1);
    for (size_t i = 0; i <= KS_THREAD_SHARED; i++)
        while (atomic_load(&p->readers[i].in) != 0)
            sched_yield();
    p->spare = p->rules;
    p->spare_cap = p->rules_cap;
    p->rules = rules;
    p->rules_cap = cap;
    p->n_rules = n;
    atomic_store_explicit(&p->swapping, 0, memory_order_release);
}

/* ---- loading, continued ---------------------------------------------------------- */

/* Read every rollout in one read transaction and keep the latest of each
 * scope in p (replacing what it had only on success).  The new rules are
 * built in the spare array, which no read section reads. */
static ks_err reload(ks_policy *p)
{
    ks_rollout *page = p->page;
    ks_rollout *rules = p->spare;
    size_t n_rules = 0, cap = p->spare_cap, n = 0;
    int64_t after = 0;
    ks_err err = ks_rollout_db_snapshot(p->db, 1);
    if (err != KS_OK)
        return err;
    do {
        err = ks_rollout_db_list(p->db, after, page, LOAD_PAGE, &n);
        for (size_t i = 0; err == KS_OK && i < n; i++)
            err = keep_latest(&rules, &n_rules, &cap, &page[i]);
        if (n > 0)
            after = page[n - 1].id;
    } while (err == KS_OK && n == LOAD_PAGE);
    ks_err end = ks_rollout_db_snapshot(p->db, 0);
    if (err == KS_OK)
        err = end;
    if (err != KS_OK) {
        p->spare = rules; /* it may have grown; what it holds is not used */
        p->spare_cap = cap;
        return err;
    }
    swap_rules(p, rules, cap, n_rules);
    p->loaded = 1;
    return KS_OK;
}

/* With p locked: when forced or refresh_ms has passed since the last
 * check, read data_version and reload when it changed. */
static ks_err refresh_locked(ks_policy *p, int force)
{
    uint64_t now = ks_mono_coarse_ms();
    if (!force && p->loaded && now < atomic_load_explicit(&p->next_check_ms, memory_order_relaxed))
        return KS_OK;
    int64_t dv = 0;
    ks_err err = ks_rollout_db_data_version(p->db, &dv);
    if (err == KS_OK && (!p->loaded || dv != p->data_version))
        err = reload(p);
    if (err == KS_OK) {
        p->data_version = dv;
        atomic_store_explicit(&p->next_check_ms, now + p->refresh_ms, memory_order_relaxed);
    }
    return err;
}

/* Refresh p when a check is due, taking mu only then: between checks an
 * answer reads the clock (the coarse one: a few ns) and one shared word
 * that only a check writes. */
static ks_err refresh_when_due(ks_policy *p)
{
    if (ks_mono_coarse_ms() < atomic_load_explicit(&p->next_check_ms, memory_order_relaxed))
        return KS_OK;
    pthread_mutex_lock(&p->mu);
    ks_err err = refresh_locked(p, 0);
    pthread_mutex_unlock(&p->mu);
    return err;
}

/* ---- open and close -------------------------------------------------------- */

/* Check opts and fill p->self from them. */
static ks_err take_options(ks_policy *p, const ks_policy_options *o)
{
    ks_rollout_reader *r = &p->self;
    const char *keys = o->keys != NULL ? o->keys : "";
    if (o->instance_id == NULL || strlen(o->instance_id) > KS_INSTANCE_ID_MAX ||
        strlen(keys) > KS_READER_KEYS_MAX || ks_rollout_keys_check(keys) != KS_OK ||
        (o->max_format != KS_FORMAT_V1 && o->max_format != KS_FORMAT_V2))
        return KS_ERR_INVALID_ARGUMENT;
    if (!ks_rollout_charset_ok(o->instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME))
        return KS_ERR_INVALID_ARGUMENT;
    strcpy(r->instance_id, o->instance_id);
    strcpy(r->keys, keys);
    const char *v = ks_version();
    assert(strlen(v) <= KS_LIBRARY_VERSION_MAX);
    strcpy(r->library_version, v);
    r->max_format = o->max_format;
    r->algorithms = o->algorithms;
    p->heartbeat = o->heartbeat != 0;
    p->refresh_ms = o->refresh_ms != 0 ? o->refresh_ms : REFRESH_DEFAULT_MS;
    return KS_OK;
}

/* A policy with opts taken and its mutexes made, no database yet. */
static ks_err policy_new(const ks_policy_options *opts, ks_policy **out)
{
    *out = NULL;
    ks_policy *p = aligned_alloc(_Alignof(ks_policy), sizeof *p); /* the flags' lines */
    if (p == NULL)
        return KS_ERR_NO_MEMORY;
    memset(p, 0, sizeof *p);
    ks_err err = take_options(p, opts);
    if (err == KS_OK && (p->page = malloc(LOAD_PAGE * sizeof *p->page)) == NULL)
        err = KS_ERR_NO_MEMORY;
    if (err == KS_OK && pthread_mutex_init(&p->mu, NULL) != 0)
        err = KS_ERR_NO_MEMORY;
    if (err == KS_OK && pthread_mutex_init(&p->wmu, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        err = KS_ERR_NO_MEMORY;
    }
    if (err != KS_OK) {
        free(p->page);
        free(p);
        return err;
    }
    *out = p;
    return KS_OK;
}

/* The connection the instance's writes use: its own, else db. */
static ks_rollout_db *writer_db(const ks_policy *p)
{
    return p->wdb != NULL ? p->wdb : p->db;
}

/* With p->db (and p->wdb when it has one) open (err, the result of
 * opening them): register the instance when asked, load the rollouts,
 * and hand p out (or close it). */
static ks_err policy_finish(ks_policy *p, ks_err err, ks_policy **out)
{
    if (err == KS_OK && p->heartbeat)
        err = ks_rollout_db_reader_register(writer_db(p), &p->self, (int64_t)time(NULL));
    if (err != KS_OK)
        p->heartbeat = 0; /* not registered: nothing to deregister */
    if (err == KS_OK)
        err = refresh_locked(p, 1); /* not shared yet: no lock needed */
    if (err != KS_OK) {
        ks_policy_close(p);
        return err;
    }
    *out = p;
    return KS_OK;
}

/* See rollout.h. */
ks_err ks_policy_open(const char *path, const ks_policy_options *opts, ks_policy **out)
{
    if (out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (path == NULL || opts == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_policy *p;
    ks_err err = policy_new(opts, &p);
    if (err != KS_OK)
        return err;
    err = ks_rollout_db_open(path, 0, &p->db, NULL, 0);
    if (err == KS_OK && p->heartbeat)
        err = ks_rollout_db_open(path, 0, &p->wdb, NULL, 0);
    return policy_finish(p, err, out);
}

/* Close the stores a failed open was given (writer may be NULL). */
static void stores_close(ks_rollout_store *store, ks_rollout_store *writer)
{
    if (store != NULL)
        store->ops->close(store);
    if (writer != NULL)
        writer->ops->close(writer);
}

/* See rollout_store.h: as ks_policy_open, over stores it owns (the
 * rollout layer wraps them; closed here on any failure). */
ks_err ks_policy_open_stores(ks_rollout_store *store, ks_rollout_store *writer,
                             const ks_policy_options *opts, ks_policy **out)
{
    if (out != NULL)
        *out = NULL;
    if (store == NULL || store == writer || out == NULL || opts == NULL) {
        stores_close(store, writer != store ? writer : NULL);
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_policy *p;
    ks_err err = policy_new(opts, &p);
    if (err != KS_OK) {
        stores_close(store, writer);
        return err;
    }
    err = ks_rollout_db_wrap(store, &p->db); /* closes store on failure */
    if (writer != NULL) {
        ks_err w = err == KS_OK ? ks_rollout_db_wrap(writer, &p->wdb) : KS_OK;
        if (err != KS_OK)
            writer->ops->close(writer);
        err = err != KS_OK ? err : w;
    }
    return policy_finish(p, err, out);
}

/* See rollout_store.h: one store for answers and writes. */
ks_err ks_policy_open_store(ks_rollout_store *store, const ks_policy_options *opts,
                            ks_policy **out)
{
    return ks_policy_open_stores(store, NULL, opts, out);
}

/* See rollout.h. */
void ks_policy_close(ks_policy *p)
{
    if (p == NULL)
        return;
    if (p->heartbeat && writer_db(p) != NULL) {
        /* best effort: a reader left behind expires after the TTL */
        ks_err err = ks_rollout_db_reader_deregister(writer_db(p), p->self.instance_id);
        (void)err;
    }
    ks_rollout_db_close(p->wdb);
    ks_rollout_db_close(p->db);
    free(p->page);
    free(p->rules);
    free(p->spare);
    free(p->ids);
    pthread_mutex_destroy(&p->wmu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* See rollout.h. */
ks_err ks_policy_refresh(ks_policy *p)
{
    if (p == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&p->mu);
    ks_err err = refresh_locked(p, 1);
    pthread_mutex_unlock(&p->mu);
    return err;
}

/* Take the locks of the instance's writes (wmu; mu too when they share
 * db) and return their connection. */
static ks_rollout_db *writer_lock(ks_policy *p)
{
    pthread_mutex_lock(&p->wmu);
    if (p->wdb != NULL)
        return p->wdb;
    pthread_mutex_lock(&p->mu);
    return p->db;
}

/* Release what writer_lock took. */
static void writer_unlock(ks_policy *p)
{
    if (p->wdb == NULL)
        pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->wmu);
}

/* See rollout_internal.h. */
void ks_policy_leave_registration(ks_policy *p)
{
    pthread_mutex_lock(&p->wmu);
    p->heartbeat = 0;
    pthread_mutex_unlock(&p->wmu);
}

/* See rollout.h.  The write waits on the database, not on answers. */
ks_err ks_policy_heartbeat(ks_policy *p)
{
    if (p == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_db *w = writer_lock(p);
    ks_err err = KS_OK;
    if (p->heartbeat) {
        int64_t now = (int64_t)time(NULL);
        err = ks_rollout_db_reader_heartbeat(w, p->self.instance_id, now);
        if (err == KS_ERR_NOT_FOUND)
            err = ks_rollout_db_reader_register(w, &p->self, now);
    }
    writer_unlock(p);
    return err;
}

/* See rollout.h.  The list is checked before the lock; on a failed
 * registration the old list is put back, since the registry still holds
 * it and a later heartbeat would not correct it. */
ks_err ks_policy_set_keys(ks_policy *p, const char *keys)
{
    const char *k = keys != NULL ? keys : "";
    if (p == NULL || strnlen(k, KS_READER_KEYS_MAX + 1) > KS_READER_KEYS_MAX ||
        ks_rollout_keys_check(k) != KS_OK)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_db *w = writer_lock(p);
    char old[KS_READER_KEYS_MAX + 1];
    strcpy(old, p->self.keys);
    strcpy(p->self.keys, k);
    ks_err err = KS_OK;
    if (p->heartbeat)
        err = ks_rollout_db_reader_register(w, &p->self, (int64_t)time(NULL));
    if (err != KS_OK)
        strcpy(p->self.keys, old);
    writer_unlock(p);
    return err;
}

/* Nonzero when health samples matter to r: it is under way (not planned,
 * not finalized). */
static int under_way(const ks_rollout *r)
{
    return r->phase != KS_PHASE_PLANNED && r->phase != KS_PHASE_FINALIZED;
}

/* Nonzero when d counts nothing: every counter, bucket and latency sum
 * 0.  Such a sample adds nothing to any sum the guards, `rollout
 * metrics` or the recording rules read, so it is not stored: an idle
 * instance would otherwise add a row to every rollout under way at each
 * report (at a 500 ms period: 172,800 rows a day, some 80 MB of the
 * application's database). */
static int sample_empty(const ks_health_sample *d)
{
    uint64_t any = d->seals | d->opens | d->auth_failures | d->parse_errors | d->provider_calls |
                   d->provider_errors | d->seal_ns_sum | d->open_ns_sum;
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++)
        any |= d->seal_ns.bucket[i] | d->open_ns.bucket[i];
    return any == 0;
}

/* With the writer's locks held: refresh when due and copy the ids of
 * the rollouts under way into p->ids (*n of them), taking mu for it when
 * the writes have their own connection. */
static ks_err ids_under_way(ks_policy *p, size_t *n)
{
    *n = 0;
    if (p->wdb != NULL)
        pthread_mutex_lock(&p->mu);
    ks_err err = refresh_locked(p, 0);
    if (err == KS_OK && p->n_rules > p->ids_cap) {
        int64_t *ni = realloc(p->ids, p->n_rules * sizeof *ni);
        if (ni == NULL) {
            err = KS_ERR_NO_MEMORY;
        } else {
            p->ids = ni;
            p->ids_cap = p->n_rules;
        }
    }
    for (size_t i = 0; err == KS_OK && i < p->n_rules; i++) {
        if (under_way(&p->rules[i]))
            p->ids[(*n)++] = p->rules[i].id;
    }
    if (p->wdb != NULL)
        pthread_mutex_unlock(&p->mu);
    return err;
}

/* See rollout.h.  The rollouts under way are copied under mu; the
 * inserts wait on the database, not on answers. */
ks_err ks_policy_report(ks_policy *p, const ks_health_sample *totals)
{
    if (p == NULL || totals == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_db *w = writer_lock(p);
    ks_health_sample d;
    ks_health_growth(&d, totals, &p->reported);
    d.time = (int64_t)time(NULL);
    size_t n = 0;
    ks_err err = ids_under_way(p, &n);
    for (size_t i = 0; err == KS_OK && !sample_empty(&d) && i < n; i++)
        err = ks_rollout_db_metrics_insert(w, p->ids[i], p->self.instance_id, "app", &d);
    if (err == KS_OK)
        p->reported = *totals; /* on failure the next report carries this interval too */
    writer_unlock(p);
    return err;
}

/* ---- answers ------------------------------------------------------------------ */

/* Nonzero when tenant writes the target of r in write-upgrade. */
static int in_canary(const ks_rollout *r, ks_bytes tenant)
{
    const ks_rollout_canary *c = &r->canary;
    if (c->kind == KS_CANARY_ALL)
        return 1;
    if (tenant.len == 0 || tenant.ptr == NULL)
        return 0;
    if (c->kind == KS_CANARY_PERCENT)
        return ks_rollout_canary_bucket(r->id, tenant) < c->percent * 100u;
    for (size_t i = 0; i < c->n_tenants; i++)
        if (strlen(c->tenants[i]) == tenant.len &&
            memcmp(c->tenants[i], tenant.ptr, tenant.len) == 0)
            return 1;
    return 0;
}

/* An answer computed from the governing rollout r, in a read section. */
typedef ks_err (*answer_fn)(const ks_rollout *r, void *ctx);

/* Refresh when due, find the rule governing values of table.column under
 * key_id (NULL: values without one; ks_rollout_scope_find) and answer
 * from it in a read section (no copy of the rollout per record):
 * KS_ERR_NOT_FOUND when no rollout governs. */
static ks_err with_rule(ks_policy *p, const char *table, const char *column, const char *key_id,
                        answer_fn answer, void *ctx)
{
    ks_err err = refresh_when_due(p);
    if (err != KS_OK)
        return err;
    const uint32_t i = read_enter(p);
    const ks_rollout *r = ks_rollout_scope_find(p->rules, p->n_rules, table, column, key_id);
    err = r != NULL ? answer(r, ctx) : KS_ERR_NOT_FOUND;
    read_exit(p, i);
    return err;
}

/* What ks_policy_write_target asks and where the answer goes. */
typedef struct write_q {
    ks_bytes tenant;
    ks_rollout_class *out;
    const ks_rollout *rules;      /* every rule, to follow an answer to a key-scoped rollout */
    size_t n_rules;
    const char *table, *column;
} write_q;

/* The class to write under r for the tenant of ctx (a write_q). */
static ks_err answer_write(const ks_rollout *r, void *ctx)
{
    write_q *q = ctx;
    int target;
    switch (r->phase) {
    case KS_PHASE_PLANNED:
    case KS_PHASE_READ_COMPAT:
        target = 0;
        break;
    case KS_PHASE_WRITE_UPGRADE:
        target = in_canary(r, q->tenant);
        break;
    case KS_PHASE_BACKFILL:
    case KS_PHASE_FINALIZED:
        target = 1;
        break;
    default:
        return KS_ERR_STORE; /* read_rollout admits no other phase */
    }
    *q->out = target ? r->target : r->source;
    return KS_OK;
}

/* The class to write under r, then (once) under the later rollout that
 * governs the key_id of that answer, if another does: a column-scoped
 * rollout names a class under a key that a later key-scoped rollout of
 * the column may be moving.  That rollout answers under the same key_id,
 * so one step settles it. */
static ks_err answer_write_followed(const ks_rollout *r, void *ctx)
{
    write_q *q = ctx;
    ks_err err = answer_write(r, ctx);
    if (err != KS_OK || q->out->is_plaintext)
        return err;
    const ks_rollout *g =
        ks_rollout_scope_find(q->rules, q->n_rules, q->table, q->column, q->out->key_id);
    assert(g != NULL); /* r itself covers the column */
    return g != r ? answer_write(g, ctx) : KS_OK;
}

/* The question and answer of a write target, checked, in a read section:
 * the rule for key_id (NULL: the column's own) answers, followed once.
 * Without a column rule, a key-scoped rule covering the column makes the
 * answer unknowable without a key: KS_ERR_STATE. */
static ks_err write_answer(ks_policy *p, write_q *q, const char *key_id)
{
    const ks_rollout *r = ks_rollout_scope_find(p->rules, p->n_rules, q->table, q->column, key_id);
    if (r != NULL)
        return answer_write_followed(r, q);
    for (size_t i = 0; key_id == NULL && i < p->n_rules; i++)
        if (ks_rollout_scope_covers(&p->rules[i], q->table, q->column))
            return KS_ERR_STATE;
    return KS_ERR_NOT_FOUND;
}

/* The column encoding answer, in a read section: the rules hold the
 * latest rollout of each scope; the one of highest id among those
 * covering the column recorded its form last.  KS_ERR_NOT_FOUND (*out
 * untouched) when none covers it. */
static ks_err latest_encoding(const ks_policy *p, const char *table, const char *column,
                              ks_value_encoding *out)
{
    const ks_rollout *latest = NULL;
    for (size_t i = 0; i < p->n_rules; i++)
        if (ks_rollout_scope_covers(&p->rules[i], table, column) &&
            (latest == NULL || p->rules[i].id > latest->id))
            latest = &p->rules[i];
    if (latest == NULL)
        return KS_ERR_NOT_FOUND;
    *out = latest->encoding;
    return KS_OK;
}

/* Answer a write target for key_id (NULL: ks_policy_write_target) after
 * refreshing when due; with enc, the column's encoding too, from the same
 * read section, its answer in *enc_err (a failed refresh: that error). */
static ks_err write_target(ks_policy *p, const char *table, const char *column,
                           const char *key_id, ks_bytes tenant, ks_rollout_class *out,
                           ks_value_encoding *enc, ks_err *enc_err)
{
    if (p == NULL || table == NULL || column == NULL || out == NULL ||
        (tenant.ptr == NULL && tenant.len > 0))
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = refresh_when_due(p);
    if (err != KS_OK) {
        if (enc != NULL)
            *enc_err = err;
        return err;
    }
    const uint32_t i = read_enter(p);
    if (enc != NULL)
        *enc_err = latest_encoding(p, table, column, enc);
    write_q q = {tenant, out, p->rules, p->n_rules, table, column};
    err = write_answer(p, &q, key_id);
    read_exit(p, i);
    return err;
}

/* See rollout.h. */
ks_err ks_policy_write_target(ks_policy *p, const char *table, const char *column,
                              ks_bytes tenant, ks_rollout_class *out)
{
    return write_target(p, table, column, NULL, tenant, out, NULL, NULL);
}

/* See rollout.h. */
ks_err ks_policy_write_target_key(ks_policy *p, const char *table, const char *column,
                                  const char *key_id, ks_bytes tenant, ks_rollout_class *out)
{
    if (!ks_rollout_charset_ok(key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    return write_target(p, table, column, key_id, tenant, out, NULL, NULL);
}

/* Classify value into *c: plaintext unless it starts with "KSE", then by
 * its header.  0 when the header is malformed. */
static int classify(const ks_bytes *value, ks_rollout_class *c)
{
    memset(c, 0, sizeof *c);
    if (value->len < 3 || value->ptr[0] != KS_MAGIC_0 || value->ptr[1] != KS_MAGIC_1 ||
        value->ptr[2] != KS_MAGIC_2) {
        c->is_plaintext = 1;
        return 1;
    }
    ks_envelope e;
    if (ks_envelope_parse_header(value->ptr, value->len, NULL, &e, NULL) != KS_OK ||
        e.key_id.len > KS_KEY_ID_MAX)
        return 0;
    c->version = e.version;
    c->algorithm = e.algorithm;
    memcpy(c->key_id, e.key_id.ptr, e.key_id.len);
    c->key_id[e.key_id.len] = '\0';
    c->key_version = e.key_version;
    return 1;
}

/* What ks_policy_may_read asks and where the answer goes. */
typedef struct read_q {
    int is_null;                 /* an SQL NULL */
    int classified;              /* c holds the value's class (else: malformed) */
    const ks_rollout_class *c;   /* the caller's class, or own */
    int *ok;
} read_q;

/* Whether r lets the value of ctx (a read_q) be read. */
static ks_err answer_read(const ks_rollout *r, void *ctx)
{
    read_q *q = ctx;
    if (q->is_null) {
        *q->ok = 1; /* SQL NULL: nothing to read */
        return KS_OK;
    }
    if (!q->classified)
        return KS_OK;
    int is_source = ks_rollout_class_equal(q->c, &r->source);
    int is_target = ks_rollout_class_equal(q->c, &r->target);
    switch (r->phase) {
    case KS_PHASE_PLANNED:
        *q->ok = is_source;
        break;
    case KS_PHASE_READ_COMPAT:
    case KS_PHASE_WRITE_UPGRADE:
    case KS_PHASE_BACKFILL:
        *q->ok = is_source || is_target;
        break;
    case KS_PHASE_FINALIZED:
        *q->ok = is_target;
        break;
    }
    return KS_OK;
}

/* The answer to q under the rule of table.column: an envelope is judged
 * by the rule of its key_id; plaintext, NULL and a malformed value by the
 * column's own. */
static ks_err may_read(ks_policy *p, const char *table, const char *column, read_q *q)
{
    const char *key_id = q->classified && !q->c->is_plaintext ? q->c->key_id : NULL;
    return with_rule(p, table, column, key_id, answer_read, q);
}

/* See rollout.h.  The value is classified before the read section. */
ks_err ks_policy_may_read(ks_policy *p, const char *table, const char *column,
                          const ks_bytes *value, int *ok)
{
    if (ok != NULL)
        *ok = 0;
    if (p == NULL || table == NULL || column == NULL || ok == NULL ||
        (value != NULL && value->ptr == NULL && value->len > 0))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_class own;
    read_q q = {value == NULL, value != NULL && classify(value, &own), &own, ok};
    return may_read(p, table, column, &q);
}

/* See rollout_internal.h: ks_policy_may_read of a value already classed. */
ks_err ks_policy_may_read_class(ks_policy *p, const char *table, const char *column,
                                const ks_rollout_class *c, int *ok)
{
    if (ok != NULL)
        *ok = 0;
    if (p == NULL || table == NULL || column == NULL || c == NULL || ok == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    read_q q = {0, 1, c, ok}; /* the caller's class, not a copy */
    return may_read(p, table, column, &q);
}

/* See rollout.h. */
ks_err ks_policy_column_encoding(ks_policy *p, const char *table, const char *column,
                                 ks_value_encoding *out)
{
    if (out != NULL)
        *out = KS_ENCODING_BINARY;
    if (p == NULL || table == NULL || column == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = refresh_when_due(p);
    if (err != KS_OK)
        return err;
    const uint32_t s = read_enter(p);
    err = latest_encoding(p, table, column, out);
    read_exit(p, s);
    return err;
}

/* See rollout_internal.h. */
ks_err ks_policy_write_plan(ks_policy *p, const char *table, const char *column,
                            const char *key_id, ks_bytes tenant, ks_rollout_class *out,
                            ks_value_encoding *enc, ks_err *enc_err)
{
    if (enc != NULL)
        *enc = KS_ENCODING_BINARY;
    if (enc_err != NULL)
        *enc_err = KS_ERR_INVALID_ARGUMENT;
    if (enc == NULL || enc_err == NULL ||
        (key_id != NULL && !ks_rollout_charset_ok(key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID)))
        return KS_ERR_INVALID_ARGUMENT;
    return write_target(p, table, column, key_id, tenant, out, enc, enc_err);
}
