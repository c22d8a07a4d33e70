/*
 * tests/fault_inject.h -- SQLite fault injection shared by
 * tests/test_faults.c and fuzz/fuzz_faults.c (docs/fuzzing.md, "Fault
 * injection"), in the style of SQLite's own test harness:
 *
 *   - an allocator (sqlite3_config(SQLITE_CONFIG_MALLOC), installed before
 *     sqlite3_initialize) that forwards to SQLite's default one but fails
 *     the Nth xMalloc / xRealloc once;
 *   - a VFS shim registered as the default over the VFS that was the
 *     default (unix, or memdb's underlying one), whose files fail xRead,
 *     xWrite, xTruncate, xSync or xLock from their Nth call on, with a
 *     chosen result code.  SQLITE_BUSY fails the Nth call only: the
 *     library's busy handler retries a lock, and a lock that stays busy
 *     would only measure the busy timeout.
 *
 * and what both oracles share about their fixture (a table payments with
 * the column card, rows whose context is "t:<id>", one checkpoint).
 *
 * One fault at a time: kf_arm(kind, n) arms it and resets the counts;
 * kf_fired() says how many calls it failed.  Not thread-safe beyond
 * atomic counters: the sweeps run the engine serially.
 *
 * Test support code: static inline only (see tests/envelope_eq.h).
 */
#ifndef KS_TESTS_FAULT_INJECT_H
#define KS_TESTS_FAULT_INJECT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include <keyshift/common.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

/* What a fault fails. */
typedef enum kf_kind {
    KF_NONE = 0,
    KF_SQLITE_MALLOC, /* SQLite's xMalloc / xRealloc: NULL */
    KF_READ,          /* xRead */
    KF_WRITE,         /* xWrite */
    KF_TRUNCATE,      /* xTruncate */
    KF_SYNC,          /* xSync */
    KF_LOCK,          /* xLock */
    KF_N_KINDS
} kf_kind;

/* A kind's name, for the sweep's report. */
static inline const char *kf_kind_name(kf_kind k)
{
    static const char *const names[KF_N_KINDS] = {"none",     "sqlite-malloc", "xRead", "xWrite",
                                                  "xTruncate", "xSync",         "xLock"};
    return k < KF_N_KINDS ? names[k] : "?";
}

/* The state of the one armed fault. */
typedef struct kf_state {
    atomic_int kind;        /* kf_kind */
    atomic_int rc;          /* the I/O kinds' result code */
    atomic_ulong at;        /* fail from (I/O) or at (malloc, BUSY) this call; 0: off */
    atomic_ulong calls;     /* calls of the armed kind since kf_arm */
    atomic_ulong fired;     /* calls failed */
    sqlite3_mem_methods mem;/* SQLite's own allocator */
    sqlite3_vfs *real_vfs;  /* the VFS under the shim */
    sqlite3_vfs vfs;        /* the shim */
} kf_state;

/* The one instance (each including program gets its own). */
static kf_state kf_g;

/* Arm a fault of kind k at call n (1: the next call) with result code rc
 * for the I/O kinds (SQLITE_IOERR_*, SQLITE_FULL or SQLITE_BUSY); kind
 * KF_NONE disarms.  Resets the counts. */
static inline void kf_arm(kf_kind k, unsigned long n, int rc)
{
    atomic_store(&kf_g.kind, KF_NONE);
    atomic_store(&kf_g.calls, 0);
    atomic_store(&kf_g.fired, 0);
    atomic_store(&kf_g.rc, rc);
    atomic_store(&kf_g.at, n);
    atomic_store(&kf_g.kind, (int)k);
}

/* How many calls the armed fault failed since kf_arm. */
static inline unsigned long kf_fired(void)
{
    return atomic_load(&kf_g.fired);
}

/* Count one call of kind k; nonzero when it must fail.  BUSY and the
 * allocator fail one call; the other I/O results every call from `at`. */
static inline int kf_hit(kf_kind k)
{
    if (atomic_load(&kf_g.kind) != (int)k) {
        return 0;
    }
    unsigned long n = atomic_fetch_add(&kf_g.calls, 1) + 1;
    unsigned long at = atomic_load(&kf_g.at);
    int once = k == KF_SQLITE_MALLOC || atomic_load(&kf_g.rc) == SQLITE_BUSY;
    if (at != 0 && (once ? n == at : n >= at)) {
        atomic_fetch_add(&kf_g.fired, 1);
        return 1;
    }
    return 0;
}

/* ---- the allocator ------------------------------------------------------- */

/* xMalloc: SQLite's own unless this call fails. */
static inline void *kf_malloc(int n)
{
    return kf_hit(KF_SQLITE_MALLOC) ? NULL : kf_g.mem.xMalloc(n);
}

/* xRealloc: as xMalloc (a failed realloc leaves p as it was). */
static inline void *kf_realloc(void *p, int n)
{
    return kf_hit(KF_SQLITE_MALLOC) ? NULL : kf_g.mem.xRealloc(p, n);
}

/* xFree, xSize, xRoundup, xInit, xShutdown: SQLite's own. */
static inline void kf_free(void *p)
{
    kf_g.mem.xFree(p);
}

/* See kf_free. */
static inline int kf_size(void *p)
{
    return kf_g.mem.xSize(p);
}

/* See kf_free. */
static inline int kf_roundup(int n)
{
    return kf_g.mem.xRoundup(n);
}

/* See kf_free. */
static inline int kf_mem_init(void *arg)
{
    (void)arg;
    return kf_g.mem.xInit(kf_g.mem.pAppData);
}

/* See kf_free. */
static inline void kf_mem_shutdown(void *arg)
{
    (void)arg;
    kf_g.mem.xShutdown(kf_g.mem.pAppData);
}

/* ---- the VFS shim -------------------------------------------------------- */

/* A shim file: the real file follows it in the same allocation. */
typedef struct kf_file {
    sqlite3_file base;
    sqlite3_file *real;
} kf_file;

#define KF_REAL(f) (((kf_file *)(f))->real)

/* xClose: close the real file. */
static inline int kf_close(sqlite3_file *f)
{
    return KF_REAL(f)->pMethods != NULL ? KF_REAL(f)->pMethods->xClose(KF_REAL(f)) : SQLITE_OK;
}

/* xRead: faulted (KF_READ). */
static inline int kf_read(sqlite3_file *f, void *buf, int n, sqlite3_int64 off)
{
    return kf_hit(KF_READ) ? atomic_load(&kf_g.rc)
                           : KF_REAL(f)->pMethods->xRead(KF_REAL(f), buf, n, off);
}

/* xWrite: faulted (KF_WRITE). */
static inline int kf_write(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off)
{
    return kf_hit(KF_WRITE) ? atomic_load(&kf_g.rc)
                            : KF_REAL(f)->pMethods->xWrite(KF_REAL(f), buf, n, off);
}

/* xTruncate: faulted (KF_TRUNCATE). */
static inline int kf_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    return kf_hit(KF_TRUNCATE) ? atomic_load(&kf_g.rc)
                               : KF_REAL(f)->pMethods->xTruncate(KF_REAL(f), size);
}

/* xSync: faulted (KF_SYNC). */
static inline int kf_sync(sqlite3_file *f, int flags)
{
    return kf_hit(KF_SYNC) ? atomic_load(&kf_g.rc) : KF_REAL(f)->pMethods->xSync(KF_REAL(f), flags);
}

/* xFileSize: forwarded. */
static inline int kf_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return KF_REAL(f)->pMethods->xFileSize(KF_REAL(f), size);
}

/* xLock: faulted (KF_LOCK). */
static inline int kf_lock(sqlite3_file *f, int level)
{
    return kf_hit(KF_LOCK) ? atomic_load(&kf_g.rc) : KF_REAL(f)->pMethods->xLock(KF_REAL(f), level);
}

/* xUnlock: forwarded (never faulted: SQLite ignores its errors). */
static inline int kf_unlock(sqlite3_file *f, int level)
{
    return KF_REAL(f)->pMethods->xUnlock(KF_REAL(f), level);
}

/* xCheckReservedLock: forwarded. */
static inline int kf_check_reserved(sqlite3_file *f, int *out)
{
    return KF_REAL(f)->pMethods->xCheckReservedLock(KF_REAL(f), out);
}

/* xFileControl: forwarded. */
static inline int kf_file_control(sqlite3_file *f, int op, void *arg)
{
    return KF_REAL(f)->pMethods->xFileControl(KF_REAL(f), op, arg);
}

/* xSectorSize: forwarded. */
static inline int kf_sector_size(sqlite3_file *f)
{
    return KF_REAL(f)->pMethods->xSectorSize(KF_REAL(f));
}

/* xDeviceCharacteristics: forwarded. */
static inline int kf_device_chars(sqlite3_file *f)
{
    return KF_REAL(f)->pMethods->xDeviceCharacteristics(KF_REAL(f));
}

/* xShmMap: forwarded (WAL mode). */
static inline int kf_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **pp)
{
    return KF_REAL(f)->pMethods->xShmMap(KF_REAL(f), pg, sz, extend, pp);
}

/* xShmLock: forwarded. */
static inline int kf_shm_lock(sqlite3_file *f, int offset, int n, int flags)
{
    return KF_REAL(f)->pMethods->xShmLock(KF_REAL(f), offset, n, flags);
}

/* xShmBarrier: forwarded. */
static inline void kf_shm_barrier(sqlite3_file *f)
{
    KF_REAL(f)->pMethods->xShmBarrier(KF_REAL(f));
}

/* xShmUnmap: forwarded. */
static inline int kf_shm_unmap(sqlite3_file *f, int del)
{
    return KF_REAL(f)->pMethods->xShmUnmap(KF_REAL(f), del);
}

/* xFetch: forwarded. */
static inline int kf_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
    return KF_REAL(f)->pMethods->xFetch(KF_REAL(f), off, n, pp);
}

/* xUnfetch: forwarded. */
static inline int kf_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return KF_REAL(f)->pMethods->xUnfetch(KF_REAL(f), off, p);
}

/* The shim's methods, version 3 (every real VFS of SQLite 3.x has 3). */
static const sqlite3_io_methods kf_io = {
    3,           kf_close,          kf_read,        kf_write,          kf_truncate,
    kf_sync,     kf_file_size,      kf_lock,        kf_unlock,         kf_check_reserved,
    kf_file_control, kf_sector_size, kf_device_chars, kf_shm_map,     kf_shm_lock,
    kf_shm_barrier, kf_shm_unmap,   kf_fetch,       kf_unfetch,
};

/* xOpen: open the real file behind the shim's. */
static inline int kf_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
    kf_file *kf = (kf_file *)f;
    kf->real = (sqlite3_file *)(kf + 1);
    memset(kf->real, 0, (size_t)kf_g.real_vfs->szOsFile);
    (void)vfs;
    int rc = kf_g.real_vfs->xOpen(kf_g.real_vfs, name, kf->real, flags, out);
    f->pMethods = kf->real->pMethods != NULL ? &kf_io : NULL;
    return rc;
}

/* The other VFS methods: the real VFS's. */
static inline int kf_delete(sqlite3_vfs *vfs, const char *name, int sync_dir)
{
    (void)vfs;
    return kf_g.real_vfs->xDelete(kf_g.real_vfs, name, sync_dir);
}

/* See kf_delete. */
static inline int kf_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
    (void)vfs;
    return kf_g.real_vfs->xAccess(kf_g.real_vfs, name, flags, out);
}

/* See kf_delete. */
static inline int kf_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out)
{
    (void)vfs;
    return kf_g.real_vfs->xFullPathname(kf_g.real_vfs, name, n, out);
}

/* See kf_delete. */
static inline int kf_randomness(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return kf_g.real_vfs->xRandomness(kf_g.real_vfs, n, out);
}

/* See kf_delete. */
static inline int kf_sleep(sqlite3_vfs *vfs, int us)
{
    (void)vfs;
    return kf_g.real_vfs->xSleep(kf_g.real_vfs, us);
}

/* See kf_delete. */
static inline int kf_current_time(sqlite3_vfs *vfs, double *out)
{
    (void)vfs;
    return kf_g.real_vfs->xCurrentTime(kf_g.real_vfs, out);
}

/* See kf_delete. */
static inline int kf_last_error(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return kf_g.real_vfs->xGetLastError(kf_g.real_vfs, n, out);
}

/* See kf_delete. */
static inline int kf_current_time64(sqlite3_vfs *vfs, sqlite3_int64 *out)
{
    (void)vfs;
    return kf_g.real_vfs->xCurrentTimeInt64(kf_g.real_vfs, out);
}

/*
 * Install the allocator and register the VFS shim as the default.  Call
 * once, before anything else touches SQLite (sqlite3_config must precede
 * sqlite3_initialize).  Returns SQLITE_OK or SQLite's error.
 */
static inline int kf_install(void)
{
    int rc = sqlite3_config(SQLITE_CONFIG_GETMALLOC, &kf_g.mem);
    if (rc != SQLITE_OK) {
        return rc;
    }
    sqlite3_mem_methods m = {kf_malloc,  kf_free,         kf_realloc, kf_size,
                             kf_roundup, kf_mem_init,     kf_mem_shutdown, NULL};
    if ((rc = sqlite3_config(SQLITE_CONFIG_MALLOC, &m)) != SQLITE_OK ||
        (rc = sqlite3_initialize()) != SQLITE_OK) {
        return rc;
    }
    kf_g.real_vfs = sqlite3_vfs_find(NULL);
    if (kf_g.real_vfs == NULL || kf_g.real_vfs->iVersion < 2) {
        return SQLITE_ERROR;
    }
    sqlite3_vfs *v = &kf_g.vfs;
    memset(v, 0, sizeof *v);
    v->iVersion = 2;
    v->szOsFile = (int)sizeof(kf_file) + kf_g.real_vfs->szOsFile;
    v->mxPathname = kf_g.real_vfs->mxPathname;
    v->zName = "ks-fault";
    v->xOpen = kf_open;
    v->xDelete = kf_delete;
    v->xAccess = kf_access;
    v->xFullPathname = kf_full_pathname;
    v->xRandomness = kf_randomness;
    v->xSleep = kf_sleep;
    v->xCurrentTime = kf_current_time;
    v->xGetLastError = kf_last_error;
    v->xCurrentTimeInt64 = kf_current_time64;
    return sqlite3_vfs_register(v, 1);
}

/* ---- the fixtures' shared parts ---------------------------------------- */

/* The store's target of the fixtures: payments.card, tenant constant. */
static inline ks_rowstore_target kf_target(void)
{
    ks_rowstore_target t;
    memset(&t, 0, sizeof t);
    t.table = "payments";
    t.column = "card";
    return t;
}

/* The context of row id, "t:<id>" (the template "t:{id}"), in buf. */
static inline ks_bytes kf_row_context(int64_t id, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "t:%lld", (long long)id);
    return (ks_bytes){(const uint8_t *)buf, n > 0 ? (size_t)n : 0};
}

/* The fixtures' migration: mode to k:to_version, tenant "acme", purpose
 * "db.cards", context "t:{id}", batch rows a batch, on the calling thread
 * (serial: the same allocations in the same order every run). */
static inline ks_migrate_params kf_migrate_params(ks_migrate_mode mode, uint32_t to_version,
                                                  size_t batch)
{
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    p.mode = mode;
    p.to_key_id = (ks_bytes){(const uint8_t *)"k", 1};
    p.to_key_version = to_version;
    p.tenant = (ks_bytes){(const uint8_t *)"acme", 4};
    p.purpose = (ks_bytes){(const uint8_t *)"db.cards", 8};
    p.context_template = (ks_bytes){(const uint8_t *)"t:{id}", 6};
    p.batch_size = batch;
    p.max_failure_rate = -1;
    p.serial = 1;
    return p;
}

/* A migration batch as the sweeps run it, so that a fault can land
 * anywhere from the context's creation to the store's close: a fresh
 * context over provider, the store at path opened, kf_migrate_params'
 * migration run, the store closed, the context freed. */
static inline ks_err kf_migrate_once(const ks_provider *provider, const char *path,
                                     ks_migrate_mode mode, uint32_t to_version, size_t batch)
{
    ks_ctx *ctx = NULL;
    ks_err e = ks_ctx_new(provider, NULL, &ctx);
    if (e != KS_OK) {
        return e;
    }
    ks_rowstore store = {0};
    ks_rowstore_target t = kf_target();
    if ((e = ks_rowstore_sqlite_open(path, &t, NULL, &store, NULL, 0)) == KS_OK) {
        ks_migrate_params p = kf_migrate_params(mode, to_version, batch);
        e = ks_migrate_run(ctx, &store, &p, NULL, NULL, NULL, NULL);
        ks_rowstore_close(&store);
    }
    ks_ctx_free(ctx);
    return e;
}

/* The checkpoints kf_checkpoint_one saw: how many, and the last one's
 * rows done and whether it is complete. */
typedef struct kf_checkpoint {
    int n;
    uint64_t done;
    int complete;
} kf_checkpoint;

/* ks_rowstore_sqlite_checkpoints callback: note the checkpoint. */
static inline int kf_checkpoint_one(void *arg, ks_bytes table, ks_bytes column,
                                    const ks_checkpoint *cp)
{
    (void)table;
    (void)column;
    kf_checkpoint *s = arg;
    s->n++;
    s->done = cp->done;
    s->complete = cp->state.len == 8 && memcmp(cp->state.ptr, "complete", 8) == 0;
    return 0;
}

#endif /* KS_TESTS_FAULT_INJECT_H */
