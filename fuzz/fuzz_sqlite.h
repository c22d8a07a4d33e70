/*
 * fuzz/fuzz_sqlite.h -- the SQLite world shared by the stateful harnesses
 * (fuzz_migrate, fuzz_rollout): one in-memory database that every
 * connection of the process reaches by one plain path, whose connections
 * stay open for the whole run, reset to a template between inputs, under
 * SQLite's own fuzzing limits, with an exact check of SQLite's memory.
 *
 * - The library opens plain paths only (no URI, no SQLITE_OPEN_CREATE), so
 *   ks_fuzz_sqlite_init() makes SQLite's "memdb" VFS the process's
 *   default: a path starting with '/' names one database shared by every
 *   connection while one is open.  memdb keeps its rollback journal in
 *   memory and its xSync does nothing, so journal_mode=MEMORY and
 *   synchronous=OFF hold without a PRAGMA.
 * - Persistent connections.  Opening a connection parses the whole schema
 *   and the library's open checks it and prepares its statements: that
 *   was 40 to 50% of every input, so the harness opens its connections
 *   and the library's stores once, between ks_fuzz_sqlite_world_begin()
 *   and ks_fuzz_sqlite_world_seal(), and keeps them.  Objects an input
 *   opens itself (a policy, a context) still open and close per input.
 * - Reset.  ks_fuzz_sqlite_world_seal() copies the database as it is then
 *   (the schema the library created, and any rows) into a second memdb
 *   database, the template, attached to the keeper connection, and
 *   prepares for every table a DELETE and an INSERT ... SELECT from the
 *   template; ks_fuzz_sqlite_restore() runs them in one transaction
 *   (triggers off on the keeper only: keyshift_rollout_log refuses
 *   deletes), for the tables that changed since the last restore: an
 *   update hook on every connection notes them (every table has a rowid,
 *   checked, so the hook sees every change; sqlite_sequence, which it
 *   does not see, goes with any other).  The schema never changes, so no
 *   connection re-parses it; rowids and sqlite_sequence come back with
 *   the rows, so an input sees what it would see in a new database
 *   (libFuzzer needs each input to run alone).  sqlite3_deserialize and
 *   the backup API cannot be used: the first detaches a connection from
 *   the shared database, the second bumps the schema cookie and makes
 *   every connection re-parse.  A harness may also save start states
 *   (see "Start states" below) and restore one of them instead.
 * - Memory oracle.  ks_fuzz_sqlite_world_check() releases the page cache
 *   of every persistent connection (sqlite3_db_release_memory) and
 *   compares sqlite3_memory_used() with the value after the input before:
 *   equal, unless a persistent connection now holds more prepared
 *   statements (the library keeps statements on first use, up to its
 *   cache; at most a bounded number of inputs per run) or the database
 *   file grew past its high-water mark (memdb's buffer; the seal pads it
 *   so that this is rare) -- then that input sets the new baseline.
 * - Pages from a static pool (SQLITE_CONFIG_PAGECACHE, KS_FUZZ_SQLITE_PAGES
 *   slots): every write transaction of another connection empties a
 *   connection's page cache, so its pages were malloc'd and freed again
 *   input after input; under ASan each 4 KiB page was filled, then held
 *   in the quarantine, and new ones faulted in.  This halves the bytes
 *   SQLite mallocs per input (dhat over fuzz_rollout's corpus); a page
 *   past the pool's slots is malloc'd as before.  The memory oracle is
 *   unchanged: the pool is not counted in sqlite3_memory_used().
 * - SQLite's other allocations come from a pool of power-of-two blocks
 *   (SQLITE_CONFIG_MALLOC; see "SQLite's allocator" below) that ASan
 *   still guards by hand: redzones after every request and a quarantine
 *   of freed blocks, reported as use-after-poison.
 * - Limits as SQLite's own fuzz harness sets them: sqlite3_hard_heap_limit64
 *   for the process, and on every connection (an auto-extension, so the
 *   library's connections too) SQLITE_LIMIT_LENGTH and a progress handler
 *   whose per-input budget of virtual machine steps ends a runaway
 *   statement with a report and abort() (a finding, not a refusal the
 *   oracles would misread).
 *
 * Fuzz harness code: static functions only, like fuzz_drbg.h, but for
 * __asan_default_options, which ASan looks up by name.
 */
#ifndef KS_FUZZ_SQLITE_H
#define KS_FUZZ_SQLITE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "fuzz_check.h"

/* Functions only some harnesses call. */
#define KS_FUZZ_SQLITE_OPTIONAL __attribute__((unused))

/* SQLite's heap cap for the whole process (every database is in memory). */
#define KS_FUZZ_SQLITE_HEAP (256ll << 20)
/* Longest string or blob a connection accepts (values here are < 4 KiB). */
#define KS_FUZZ_SQLITE_LENGTH 100000
/* Virtual machine instructions between two calls of the progress handler
 * (SQLite counts them within one sqlite3_step, so only long steps call it). */
#define KS_FUZZ_SQLITE_PROGRESS_N 1000
/* Progress handler calls one input may take: 10^7 instructions in long
 * steps, well under a second here, where no input of the corpora needs
 * more than 16 calls. */
#define KS_FUZZ_SQLITE_PROGRESS_MAX 10000u

/* Connections open for the whole run (the keeper is the first). */
#define KS_FUZZ_SQLITE_MAX_CONNS 16
/* Tables the reset can restore. */
#define KS_FUZZ_SQLITE_MAX_RESET 32
/* Bytes the seal grows the database file by, then frees (see the file
 * comment): well above what one input of the corpora writes. */
#define KS_FUZZ_SQLITE_PAD (4 << 20)
/* SQLite's page cache: KS_FUZZ_SQLITE_PAGES slots of KS_FUZZ_SQLITE_SLOT
 * bytes (a 4 KiB page and SQLite's per-page header, which
 * SQLITE_CONFIG_PCACHE_HDRSZ gives: under 512 bytes), so that pages come
 * from a static pool instead of a malloc each. */
#define KS_FUZZ_SQLITE_PAGES 2048
#define KS_FUZZ_SQLITE_SLOT (4096 + 512)

static unsigned ks_fuzz_sqlite_ticks; /* progress calls in this input */

/* What a persistent connection may keep from one input to the next, and
 * so what may change sqlite3_memory_used() between two inputs without a
 * leak: prepared statements (count and bytes: the library keeps some on
 * first use, and SQLite re-prepares one when its plan may change), the
 * schema's bytes (SQLite caches a table's affinity string on first use)
 * and the database file's pages (memdb's buffer). */
typedef struct ks_fuzz_sqlite_kept {
    int stmts;
    int stmt_bytes;
    int schema_bytes;
    sqlite3_int64 pages;
} ks_fuzz_sqlite_kept;

/* The reset of one table of the template. */
typedef struct ks_fuzz_sqlite_table {
    char name[64];      /* the table's name (snapshots copy it by name) */
    sqlite3_stmt *del;  /* DELETE FROM main.<table> */
    sqlite3_stmt *ins;  /* INSERT ... SELECT from the template; NULL: it is empty there */
} ks_fuzz_sqlite_table;

/* The persistent world (one per process). */
static struct {
    int recording;                                /* between world_begin and world_seal */
    sqlite3 *conns[KS_FUZZ_SQLITE_MAX_CONNS];     /* conns[0]: the keeper */
    int n_conns;
    sqlite3 *tmpl;                                /* holds the template database open */
    ks_fuzz_sqlite_table reset[KS_FUZZ_SQLITE_MAX_RESET];
    int n_reset;
    int seq;                                      /* sqlite_sequence's index in reset, or -1 */
    int state;                                    /* what main holds: 0 the template, k + 1
                                                     snapshot k, -1 not known */
    int restoring;                                /* inside a restore: changes not tracked */
    unsigned long long changed;                   /* bit i: reset[i] changed since */
    unsigned long long version;                   /* row changes of main, ever */
    sqlite3_stmt *page_count;                     /* PRAGMA main.page_count on the keeper */
    sqlite3_stmt *begin, *commit;                 /* the reset's transaction, on the keeper */
    sqlite3_int64 mem;                            /* sqlite3_memory_used() after the last reset */
    ks_fuzz_sqlite_kept kept;                     /* what conns kept then */
    unsigned rebaselines;                         /* inputs that set a new baseline */
} ks_fuzz_sqlite_w;

/* Progress handler: count one tick; past the input's budget, report and
 * abort, as a libFuzzer timeout would, only sooner and with the cause. */
static int ks_fuzz_sqlite_progress(void *arg)
{
    (void)arg;
    if (++ks_fuzz_sqlite_ticks > KS_FUZZ_SQLITE_PROGRESS_MAX) {
        fprintf(stderr, "fuzz: SQLite progress budget of %u x %d steps exceeded\n",
                KS_FUZZ_SQLITE_PROGRESS_MAX, KS_FUZZ_SQLITE_PROGRESS_N);
        abort();
    }
    return 0;
}

/* Update hook of every connection: note that a table of main changed
 * since the last restore (one not known to the reset: every table). */
static void ks_fuzz_sqlite_changed(void *arg, int op, const char *db, const char *table, sqlite3_int64 rowid)
{
    (void)arg;
    (void)op;
    (void)rowid;
    if (ks_fuzz_sqlite_w.restoring || strcmp(db, "main") != 0) {
        return;
    }
    ks_fuzz_sqlite_w.version++;
    for (int i = 0; i < ks_fuzz_sqlite_w.n_reset; i++) {
        if (strcmp(ks_fuzz_sqlite_w.reset[i].name, table) == 0) {
            ks_fuzz_sqlite_w.changed |= 1ull << i;
            return;
        }
    }
    ks_fuzz_sqlite_w.changed = ~0ull;
}

/* How many row changes main has seen, ever (every connection's, and every
 * table a restore rewrote): equal counts mean equal contents, so a harness
 * may skip a check whose inputs did not change.  A change rolled back
 * still counts. */
KS_FUZZ_SQLITE_OPTIONAL static unsigned long long ks_fuzz_sqlite_version(void)
{
    return ks_fuzz_sqlite_w.version;
}

/* Auto-extension run on every new connection: set its fuzzing limits. */
static int ks_fuzz_sqlite_limits(sqlite3 *db, const char **err,
                                 const struct sqlite3_api_routines *api)
{
    (void)err;
    (void)api;
    if (ks_fuzz_sqlite_w.recording) {
        CHECK(ks_fuzz_sqlite_w.n_conns < KS_FUZZ_SQLITE_MAX_CONNS);
        ks_fuzz_sqlite_w.conns[ks_fuzz_sqlite_w.n_conns++] = db;
    }
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, KS_FUZZ_SQLITE_LENGTH);
    (void)sqlite3_update_hook(db, ks_fuzz_sqlite_changed, NULL);
    sqlite3_progress_handler(db, KS_FUZZ_SQLITE_PROGRESS_N, ks_fuzz_sqlite_progress, NULL);
    return SQLITE_OK;
}


/*
 * ASan's defaults for the stateful harnesses (an ASAN_OPTIONS of the
 * environment, as OSS-Fuzz's, still overrides them): a 16 MiB quarantine
 * instead of 256.  An input frees about 1 MB, mostly SQLite's, and a
 * 256 MiB quarantine handed out fresh pages that faulted in: 14% of
 * fuzz_rollout's replay time here (sys time 0.44 -> 0.17 s over 737
 * grown-corpus inputs).  A use after free within an input, or within
 * the last dozen inputs, is still caught.
 */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}

/*
 * SQLite's allocator in the fuzz builds (SQLITE_CONFIG_MALLOC, installed by
 * ks_fuzz_sqlite_init): blocks of 2^k bytes (k = KS_FUZZ_POOL_MIN_SHIFT ..
 * KS_FUZZ_POOL_MAX_SHIFT) carved from a static arena and recycled through
 * one free list per size, as SQLite's own memsys5 does (Debian's SQLite is
 * built without it, and with SQLITE_OMIT_LOOKASIDE, so every small object
 * of every statement step was an ASan malloc: a quarter of fuzz_rollout's
 * time, with libFuzzer's malloc hook and ASan's quarantine recycling).
 *
 * ASan still guards what it can guard here, by hand, through its public
 * poisoning interface: only the bytes SQLite asked for (rounded up to 8, as
 * xRoundup says) are addressable; the block's header and every byte past
 * the request (at least KS_FUZZ_POOL_REDZONE) are poisoned, so an
 * instrumented read past a column's bytes (keyshift's code, or an
 * interceptor such as memcpy) is reported as ASan reports a heap overflow.
 * A freed block is poisoned whole and waits in a FIFO quarantine of
 * KS_FUZZ_POOL_QUARANTINE blocks before it is reused, so a use after free
 * within the last few thousand frees is caught.  SQLite itself is not
 * instrumented: its own accesses were never checked, and still are not.
 *
 * Requests above the largest class (memdb's file buffer), and any once the
 * arena is used up, go to malloc as before.  SQLite's memory status stays
 * on (sqlite3_memory_used(), the hard heap limit), so SQLite calls xMalloc,
 * xFree and xRealloc under its own mutex: these functions are never
 * entered twice at once (checked).
 */
#include <sanitizer/asan_interface.h>
#include <stdatomic.h>

#define KS_FUZZ_POOL_MIN_SHIFT 5                     /* 32-byte blocks */
#define KS_FUZZ_POOL_MAX_SHIFT 16                    /* 64 KiB blocks */
#define KS_FUZZ_POOL_ARENA (96u << 20)               /* bytes: touched only as used */
#define KS_FUZZ_POOL_HDR 16                          /* block header, poisoned */
#define KS_FUZZ_POOL_REDZONE 16                      /* poisoned bytes after a request, at least */
#define KS_FUZZ_POOL_QUARANTINE 4096                 /* freed blocks held before reuse */
#define KS_FUZZ_POOL_SYSTEM 0xffu                    /* header class of a block from malloc */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KS_FUZZ_POOL_ASAN 1
#endif
#endif
/* The allocator's own functions: no ASan checks (they write headers and
 * free-list links inside poisoned blocks), and no coverage (its branches,
 * one per size class, are the allocator's, not the input's: they were
 * features libFuzzer kept inputs for). */
#ifdef KS_FUZZ_POOL_ASAN
#define KS_FUZZ_POOL_RAW __attribute__((no_sanitize("address", "coverage")))
#else
#define KS_FUZZ_POOL_RAW
#endif

/* The header before every block's bytes. */
typedef struct ks_fuzz_pool_hdr {
    uint32_t cls;   /* k, or KS_FUZZ_POOL_SYSTEM */
    uint32_t size;  /* the bytes SQLite may use (its request, rounded up to 8) */
    void *next;     /* a free block: the next one of its class */
} ks_fuzz_pool_hdr;

static struct {
    _Alignas(64) unsigned char arena[KS_FUZZ_POOL_ARENA];
    size_t top;                                        /* arena bytes carved so far */
    void *free_list[KS_FUZZ_POOL_MAX_SHIFT + 1];       /* blocks (headers) by class */
    void *quarantine[KS_FUZZ_POOL_QUARANTINE];         /* FIFO of freed blocks */
    size_t q_next;                                     /* the oldest slot */
    atomic_flag busy;                                  /* inside a call (never twice) */
} ks_fuzz_pool;

/* The request n rounded up to 8 (xRoundup). */
KS_FUZZ_POOL_RAW static int ks_fuzz_pool_roundup(int n)
{
    return (n + 7) & ~7;
}

/* Enter / leave one of the allocator's calls. */
KS_FUZZ_POOL_RAW static void ks_fuzz_pool_enter(void)
{
    CHECK(!atomic_flag_test_and_set(&ks_fuzz_pool.busy));
}
KS_FUZZ_POOL_RAW static void ks_fuzz_pool_leave(void)
{
    atomic_flag_clear(&ks_fuzz_pool.busy);
}

/* A block (its header) of class k, poisoned whole: from its free list,
 * else carved from the arena; NULL when the arena is used up. */
KS_FUZZ_POOL_RAW static ks_fuzz_pool_hdr *ks_fuzz_pool_take(unsigned k)
{
    ks_fuzz_pool_hdr *h = ks_fuzz_pool.free_list[k];
    if (h != NULL) {
        ks_fuzz_pool.free_list[k] = h->next;
        return h;
    }
    size_t bytes = (size_t)1 << k;
    if (bytes > sizeof ks_fuzz_pool.arena - ks_fuzz_pool.top) {
        return NULL;
    }
    h = (ks_fuzz_pool_hdr *)(void *)(ks_fuzz_pool.arena + ks_fuzz_pool.top);
    ks_fuzz_pool.top += bytes;
    ASAN_POISON_MEMORY_REGION(h, bytes); /* from now on, only a request's bytes are not */
    return h;
}

/* xMalloc: n bytes, 8-aligned (16 here), the rest of the block poisoned. */
KS_FUZZ_POOL_RAW static void *ks_fuzz_pool_malloc(int n)
{
    size_t size = (size_t)ks_fuzz_pool_roundup(n > 0 ? n : 1);
    unsigned k = KS_FUZZ_POOL_MIN_SHIFT;
    while (k <= KS_FUZZ_POOL_MAX_SHIFT && ((size_t)1 << k) < KS_FUZZ_POOL_HDR + size + KS_FUZZ_POOL_REDZONE) {
        k++;
    }
    ks_fuzz_pool_enter();
    ks_fuzz_pool_hdr *h = k <= KS_FUZZ_POOL_MAX_SHIFT ? ks_fuzz_pool_take(k) : NULL;
    ks_fuzz_pool_leave();
    if (h == NULL) {
        h = malloc(KS_FUZZ_POOL_HDR + size);
        if (h == NULL) {
            return NULL;
        }
        h->cls = KS_FUZZ_POOL_SYSTEM;
        h->size = (uint32_t)size;
        return (unsigned char *)h + KS_FUZZ_POOL_HDR;
    }
    h->cls = k;
    h->size = (uint32_t)size;
    h->next = NULL;
    ASAN_UNPOISON_MEMORY_REGION((unsigned char *)h + KS_FUZZ_POOL_HDR, size);
    return (unsigned char *)h + KS_FUZZ_POOL_HDR;
}

/* The header of p, a block of this allocator. */
KS_FUZZ_POOL_RAW static ks_fuzz_pool_hdr *ks_fuzz_pool_hdr_of(void *p)
{
    return (ks_fuzz_pool_hdr *)(void *)((unsigned char *)p - KS_FUZZ_POOL_HDR);
}

/* xSize: the bytes SQLite may use at p. */
KS_FUZZ_POOL_RAW static int ks_fuzz_pool_size(void *p)
{
    return p == NULL ? 0 : (int)ks_fuzz_pool_hdr_of(p)->size;
}

/* xFree: poison the bytes SQLite had (the rest of the block already is)
 * and queue the block; the oldest queued block goes back to its free
 * list. */
KS_FUZZ_POOL_RAW static void ks_fuzz_pool_free(void *p)
{
    if (p == NULL) {
        return;
    }
    ks_fuzz_pool_hdr *h = ks_fuzz_pool_hdr_of(p);
    if (h->cls == KS_FUZZ_POOL_SYSTEM) {
        free(h);
        return;
    }
    CHECK(h->cls >= KS_FUZZ_POOL_MIN_SHIFT && h->cls <= KS_FUZZ_POOL_MAX_SHIFT);
#ifdef KS_FUZZ_POOL_ASAN
    CHECK(!__asan_address_is_poisoned(p)); /* not freed twice */
#endif
    ASAN_POISON_MEMORY_REGION(p, h->size); /* the rest of the block already is */
    ks_fuzz_pool_enter();
    ks_fuzz_pool_hdr *old = ks_fuzz_pool.quarantine[ks_fuzz_pool.q_next];
    ks_fuzz_pool.quarantine[ks_fuzz_pool.q_next] = h;
    ks_fuzz_pool.q_next = (ks_fuzz_pool.q_next + 1) % KS_FUZZ_POOL_QUARANTINE;
    if (old != NULL) {
        old->next = ks_fuzz_pool.free_list[old->cls];
        ks_fuzz_pool.free_list[old->cls] = old;
    }
    ks_fuzz_pool_leave();
}

/* xRealloc: a new block, the old bytes copied, the old block freed. */
KS_FUZZ_POOL_RAW static void *ks_fuzz_pool_realloc(void *p, int n)
{
    if (p == NULL) {
        return ks_fuzz_pool_malloc(n);
    }
    void *q = ks_fuzz_pool_malloc(n);
    if (q == NULL) {
        return NULL;
    }
    int old = ks_fuzz_pool_size(p);
    memcpy(q, p, (size_t)(old < n ? old : n));
    ks_fuzz_pool_free(p);
    return q;
}

/* xInit and xShutdown: nothing to do. */
static int ks_fuzz_pool_init(void *arg)
{
    (void)arg;
    return SQLITE_OK;
}
static void ks_fuzz_pool_shutdown(void *arg)
{
    (void)arg;
}

/* Once per process: memdb as the default VFS, the heap cap, the limits. */
static void ks_fuzz_sqlite_init(void)
{
    static uint64_t pages[KS_FUZZ_SQLITE_PAGES * KS_FUZZ_SQLITE_SLOT / 8];
    static const sqlite3_mem_methods pool = {ks_fuzz_pool_malloc, ks_fuzz_pool_free, ks_fuzz_pool_realloc,
                                             ks_fuzz_pool_size,   ks_fuzz_pool_roundup, ks_fuzz_pool_init,
                                             ks_fuzz_pool_shutdown, NULL};
    CHECK(sqlite3_config(SQLITE_CONFIG_MALLOC, &pool) == SQLITE_OK);
    CHECK(sqlite3_config(SQLITE_CONFIG_PAGECACHE, pages, KS_FUZZ_SQLITE_SLOT,
                         KS_FUZZ_SQLITE_PAGES) == SQLITE_OK);
    CHECK(sqlite3_initialize() == SQLITE_OK);
    sqlite3_vfs *memdb = sqlite3_vfs_find("memdb");
    CHECK(memdb != NULL);
    CHECK(sqlite3_vfs_register(memdb, 1) == SQLITE_OK);
    CHECK(sqlite3_hard_heap_limit64(KS_FUZZ_SQLITE_HEAP) >= 0);
    /* sqlite3_auto_extension takes the entry point as void (*)(void) */
    CHECK(sqlite3_auto_extension((void (*)(void))(void *)ks_fuzz_sqlite_limits) == SQLITE_OK);
}

/* Once per process, after ks_fuzz_sqlite_init(): open and return the
 * keeper connection on path (creating the database), and record every
 * connection opened from now until ks_fuzz_sqlite_world_seal() as
 * persistent.  The caller then builds its schema (through the keeper and
 * the library's opens) and opens what it keeps. */
static sqlite3 *ks_fuzz_sqlite_world_begin(const char *path)
{
    sqlite3 *keeper = NULL;
    ks_fuzz_sqlite_w.recording = 1;
    CHECK(sqlite3_open_v2(path, &keeper, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) == SQLITE_OK);
    CHECK(ks_fuzz_sqlite_w.n_conns == 1 && ks_fuzz_sqlite_w.conns[0] == keeper);
    int off = -1;
    CHECK(sqlite3_db_config(keeper, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, &off) == SQLITE_OK && off == 0);
    /* Grow the file (memdb's buffer) now, before any other connection
     * parses the schema, and leave fuzz_warm (empty) for the seal's
     * first writes.  Blobs of 64 KiB: SQLITE_LIMIT_LENGTH holds here too. */
    char *pad = sqlite3_mprintf("CREATE TABLE main.fuzz_pad(x);"
                                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d)"
                                " INSERT INTO main.fuzz_pad SELECT zeroblob(65536) FROM n;"
                                "DROP TABLE main.fuzz_pad; CREATE TABLE main.fuzz_warm(x);",
                                KS_FUZZ_SQLITE_PAD / 65536);
    CHECK(pad != NULL);
    CHECK(sqlite3_exec(keeper, pad, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_free(pad);
    return keeper;
}

/* Copy every page of src's main database into dst's; abort on failure. */
static void ks_fuzz_sqlite_copy(sqlite3 *dst, sqlite3 *src)
{
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    CHECK(b != NULL);
    CHECK(sqlite3_backup_step(b, -1) == SQLITE_DONE);
    CHECK(sqlite3_backup_finish(b) == SQLITE_OK);
}

/* Prepare sql on db, aborting on failure. */
static sqlite3_stmt *ks_fuzz_sqlite_prepare(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    CHECK(sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) == SQLITE_OK);
    CHECK(st != NULL);
    return st;
}

/* Run a prepared statement that returns no row, and reset it. */
static void ks_fuzz_sqlite_run(sqlite3_stmt *st)
{
    CHECK(sqlite3_step(st) == SQLITE_DONE);
    CHECK(sqlite3_reset(st) == SQLITE_OK);
}

/* Prepare the reset of every table of the template (see the file comment):
 * a DELETE, and for a table with rows there, an INSERT from it.  Every
 * table must have a rowid: SQLite's update hook, which tells the restore
 * what changed, does not see WITHOUT ROWID tables. */
static void ks_fuzz_sqlite_reset_prepare(sqlite3 *keeper)
{
    sqlite3_stmt *tables = ks_fuzz_sqlite_prepare(
        keeper, "SELECT name, sql LIKE '%WITHOUT ROWID%' FROM tmpl.sqlite_schema WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_stat%' ORDER BY name");
    ks_fuzz_sqlite_w.seq = -1;
    while (sqlite3_step(tables) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(tables, 0);
        CHECK(sqlite3_column_int(tables, 1) == 0);
        char *del = sqlite3_mprintf("DELETE FROM main.\"%w\"", name);
        char *cnt = sqlite3_mprintf("SELECT count(*) FROM tmpl.\"%w\"", name);
        CHECK(del != NULL && cnt != NULL);
        sqlite3_stmt *c = ks_fuzz_sqlite_prepare(keeper, cnt);
        CHECK(sqlite3_step(c) == SQLITE_ROW);
        int has_rows = sqlite3_column_int64(c, 0) > 0;
        CHECK(sqlite3_finalize(c) == SQLITE_OK);
        CHECK(ks_fuzz_sqlite_w.n_reset < KS_FUZZ_SQLITE_MAX_RESET);
        ks_fuzz_sqlite_table *t = &ks_fuzz_sqlite_w.reset[ks_fuzz_sqlite_w.n_reset];
        CHECK(strlen(name) < sizeof t->name);
        strcpy(t->name, name);
        if (strcmp(name, "sqlite_sequence") == 0) {
            ks_fuzz_sqlite_w.seq = ks_fuzz_sqlite_w.n_reset;
        }
        t->del = ks_fuzz_sqlite_prepare(keeper, del);
        if (has_rows) {
            char *ins = sqlite3_mprintf("INSERT INTO main.\"%w\" SELECT * FROM tmpl.\"%w\"", name, name);
            CHECK(ins != NULL);
            t->ins = ks_fuzz_sqlite_prepare(keeper, ins);
            sqlite3_free(ins);
        }
        ks_fuzz_sqlite_w.n_reset++;
        sqlite3_free(del);
        sqlite3_free(cnt);
    }
    CHECK(sqlite3_finalize(tables) == SQLITE_OK);
    ks_fuzz_sqlite_w.state = -1;
}

/* The start states a harness saved (see "Start states" below): per
 * snapshot, the INSERT of each table that has rows there. */
#define KS_FUZZ_SQLITE_MAX_SNAPS 32
static struct {
    int n;
    sqlite3_stmt *ins[KS_FUZZ_SQLITE_MAX_SNAPS][KS_FUZZ_SQLITE_MAX_RESET]; /* NULL: no rows */
} ks_fuzz_sqlite_snaps;

/* The INSERT that fills table i in state (0 the template, k + 1 snapshot
 * k), or NULL when it is empty there. */
static sqlite3_stmt *ks_fuzz_sqlite_fill(int state, int i)
{
    CHECK(state >= 0 && state <= ks_fuzz_sqlite_snaps.n && i >= 0 && i < ks_fuzz_sqlite_w.n_reset);
    return state == 0 ? ks_fuzz_sqlite_w.reset[i].ins : ks_fuzz_sqlite_snaps.ins[state - 1][i];
}

/* Bring main to state (0 the template, k + 1 snapshot k), in one
 * transaction on the keeper, rewriting only the tables that may differ:
 * those changed since the last restore (the update hook of every
 * connection; sqlite_sequence, which the hook does not see, with any
 * other), and those the two states fill differently.  Clearing a table
 * that is already empty still journals its root page, so an empty table
 * is left alone. */
static void ks_fuzz_sqlite_restore(int state)
{
    unsigned long long changed = ks_fuzz_sqlite_w.changed;
    int from = ks_fuzz_sqlite_w.state;
    if (changed != 0 && ks_fuzz_sqlite_w.seq >= 0) {
        changed |= 1ull << ks_fuzz_sqlite_w.seq;
    }
    ks_fuzz_sqlite_w.restoring = 1;
    ks_fuzz_sqlite_run(ks_fuzz_sqlite_w.begin);
    for (int i = 0; i < ks_fuzz_sqlite_w.n_reset; i++) {
        const ks_fuzz_sqlite_table *t = &ks_fuzz_sqlite_w.reset[i];
        sqlite3_stmt *had = from < 0 ? NULL : ks_fuzz_sqlite_fill(from, i);
        sqlite3_stmt *want = ks_fuzz_sqlite_fill(state, i);
        int dirty = from < 0 || (changed >> i & 1);
        if (!dirty && (from == state || (had == NULL && want == NULL))) {
            continue; /* as the state has it already */
        }
        if (dirty || had != NULL) {
            ks_fuzz_sqlite_run(t->del);
        }
        if (want != NULL) {
            ks_fuzz_sqlite_run(want);
        }
        ks_fuzz_sqlite_w.version++;
    }
    ks_fuzz_sqlite_run(ks_fuzz_sqlite_w.commit);
    ks_fuzz_sqlite_w.restoring = 0;
    ks_fuzz_sqlite_w.changed = 0;
    ks_fuzz_sqlite_w.state = state;
}

/* Per input (and at the seal): bring the database back to the template. */
static void ks_fuzz_sqlite_world_reset(void)
{
    ks_fuzz_sqlite_restore(0);
}

/* Release every persistent connection's page cache (and check that no
 * statement of theirs holds a read open between inputs). */
static void ks_fuzz_sqlite_release(void)
{
    for (int i = 0; i < ks_fuzz_sqlite_w.n_conns; i++) {
        sqlite3 *db = ks_fuzz_sqlite_w.conns[i];
        CHECK(sqlite3_db_release_memory(db) == SQLITE_OK);
        for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st != NULL; st = sqlite3_next_stmt(db, st)) {
            CHECK(!sqlite3_stmt_busy(st));
        }
    }
}

/* Measure what the persistent connections keep into *k (a walk of every
 * statement and the schema: only when the memory moved). */
static void ks_fuzz_sqlite_measure(ks_fuzz_sqlite_kept *k)
{
    memset(k, 0, sizeof *k);
    CHECK(sqlite3_step(ks_fuzz_sqlite_w.page_count) == SQLITE_ROW);
    k->pages = sqlite3_column_int64(ks_fuzz_sqlite_w.page_count, 0);
    CHECK(sqlite3_reset(ks_fuzz_sqlite_w.page_count) == SQLITE_OK);
    for (int i = 0; i < ks_fuzz_sqlite_w.n_conns; i++) {
        sqlite3 *db = ks_fuzz_sqlite_w.conns[i];
        int cur = 0, hw = 0;
        for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st != NULL; st = sqlite3_next_stmt(db, st)) {
            k->stmts++;
        }
        CHECK(sqlite3_db_status(db, SQLITE_DBSTATUS_STMT_USED, &cur, &hw, 0) == SQLITE_OK);
        k->stmt_bytes += cur;
        CHECK(sqlite3_db_status(db, SQLITE_DBSTATUS_SCHEMA_USED, &cur, &hw, 0) == SQLITE_OK);
        k->schema_bytes += cur;
    }
}

/* Take the memory baseline: what SQLite holds with every persistent
 * connection's page cache released, and what those connections keep. */
static void ks_fuzz_sqlite_baseline(void)
{
    ks_fuzz_sqlite_release();
    ks_fuzz_sqlite_measure(&ks_fuzz_sqlite_w.kept);
    ks_fuzz_sqlite_w.mem = sqlite3_memory_used();
    ks_fuzz_sqlite_ticks = 0;
}

/* Once per process: the persistent connections are open.  Save the
 * database as the template (attached to the keeper as "tmpl"), pad the
 * file, prepare the reset, reset once and take the memory baseline. */
static void ks_fuzz_sqlite_world_seal(const char *tmpl_path)
{
    sqlite3 *keeper = ks_fuzz_sqlite_w.conns[0];
    ks_fuzz_sqlite_w.recording = 0;
    CHECK(sqlite3_open_v2(tmpl_path, &ks_fuzz_sqlite_w.tmpl, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                          NULL) == SQLITE_OK);
    ks_fuzz_sqlite_copy(ks_fuzz_sqlite_w.tmpl, keeper);
    char *attach = sqlite3_mprintf("ATTACH '%q' AS tmpl", tmpl_path);
    CHECK(attach != NULL);
    CHECK(sqlite3_exec(keeper, attach, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_free(attach);
    /* A connection's first write cursor allocates a page of scratch space
     * (btree.c, allocateTempSpace) that it keeps until it closes: let
     * every persistent connection open one now, not in some input. */
    for (int i = 0; i < ks_fuzz_sqlite_w.n_conns; i++) {
        CHECK(sqlite3_exec(ks_fuzz_sqlite_w.conns[i], "DELETE FROM main.fuzz_warm WHERE rowid = -1",
                           NULL, NULL, NULL) == SQLITE_OK);
    }
    ks_fuzz_sqlite_reset_prepare(keeper);
    ks_fuzz_sqlite_w.page_count = ks_fuzz_sqlite_prepare(keeper, "PRAGMA main.page_count");
    ks_fuzz_sqlite_w.begin = ks_fuzz_sqlite_prepare(keeper, "BEGIN IMMEDIATE");
    ks_fuzz_sqlite_w.commit = ks_fuzz_sqlite_prepare(keeper, "COMMIT");
    ks_fuzz_sqlite_world_reset();
    ks_fuzz_sqlite_baseline();
}

/* Statements a harness prepares on its own persistent connections, kept
 * for the whole run like the library keeps its own. */
#define KS_FUZZ_SQLITE_MAX_STMTS 16
static struct {
    sqlite3 *db;
    const char *sql;
    sqlite3_stmt *st;
} ks_fuzz_sqlite_stmts[KS_FUZZ_SQLITE_MAX_STMTS];

/* The statement for sql (a string literal: found by its address) on db, a
 * persistent connection: prepared on first use, then reused.  Release it
 * with ks_fuzz_sqlite_done. */
static sqlite3_stmt *ks_fuzz_sqlite_stmt(sqlite3 *db, const char *sql)
{
    for (size_t i = 0; i < KS_FUZZ_SQLITE_MAX_STMTS; i++) {
        if (ks_fuzz_sqlite_stmts[i].sql == sql && ks_fuzz_sqlite_stmts[i].db == db) {
            return ks_fuzz_sqlite_stmts[i].st;
        }
        if (ks_fuzz_sqlite_stmts[i].sql == NULL) {
            ks_fuzz_sqlite_stmts[i].st = ks_fuzz_sqlite_prepare(db, sql);
            ks_fuzz_sqlite_stmts[i].db = db;
            ks_fuzz_sqlite_stmts[i].sql = sql;
            return ks_fuzz_sqlite_stmts[i].st;
        }
    }
    CHECK(!"more statements than KS_FUZZ_SQLITE_MAX_STMTS");
    return NULL;
}

/* Done with st (from ks_fuzz_sqlite_stmt): reset, so that it holds no
 * read open and no binding to the caller's buffers. */
static void ks_fuzz_sqlite_done(sqlite3_stmt *st)
{
    (void)sqlite3_reset(st);
    CHECK(sqlite3_clear_bindings(st) == SQLITE_OK);
}

/* Per input, after it closed what it opened, the database left as the
 * input left it (the next input's ks_fuzz_sqlite_restore brings its start
 * state): the memory oracle (see the file comment), and the next input's
 * whole progress budget. */
KS_FUZZ_SQLITE_OPTIONAL static void ks_fuzz_sqlite_world_check_kept(void)
{
    ks_fuzz_sqlite_release();
    sqlite3_int64 mem = sqlite3_memory_used();
    if (mem != ks_fuzz_sqlite_w.mem) {
        ks_fuzz_sqlite_kept k, *was = &ks_fuzz_sqlite_w.kept;
        ks_fuzz_sqlite_measure(&k);
        if (memcmp(&k, was, sizeof k) == 0) {
            fprintf(stderr, "fuzz: sqlite3_memory_used() %lld after the input, %lld before\n",
                    (long long)mem, (long long)ks_fuzz_sqlite_w.mem);
            CHECK(mem == ks_fuzz_sqlite_w.mem);
        }
        /* statements only accumulate, up to the library's caches; the file
         * only grows (its free pages are reused, never given back) */
        CHECK(k.stmts >= was->stmts && k.pages >= was->pages);
        ks_fuzz_sqlite_w.rebaselines++;
        *was = k;
    }
    ks_fuzz_sqlite_w.mem = mem;
    ks_fuzz_sqlite_ticks = 0;
}

/* Per input, after it closed what it opened: reset the database to the
 * template, then the memory oracle, as ks_fuzz_sqlite_world_check_kept. */
KS_FUZZ_SQLITE_OPTIONAL static void ks_fuzz_sqlite_world_check(void)
{
    ks_fuzz_sqlite_world_reset();
    ks_fuzz_sqlite_world_check_kept();
}

/* At exit: finalize the statements of ks_fuzz_sqlite_stmt, so that their
 * connections can close. */
static void ks_fuzz_sqlite_stmts_finalize(void)
{
    for (size_t i = 0; i < KS_FUZZ_SQLITE_MAX_STMTS; i++) {
        sqlite3_finalize(ks_fuzz_sqlite_stmts[i].st);
        ks_fuzz_sqlite_stmts[i].st = NULL;
        ks_fuzz_sqlite_stmts[i].sql = NULL;
    }
}

/*
 * Start states.  A harness may save the database as it is at some point
 * of an input (after the seal) as snapshot k, k = 0, 1, ... in order:
 * every table's rows are copied, by name, into tables "k/<name>" of a
 * private in-memory database attached to the keeper as "snap" (never
 * seen by the library's connections), and an INSERT ... SELECT back is
 * prepared for each table that has rows.  An input may then start from
 * snapshot k instead of the template: ks_fuzz_sqlite_restore(k + 1), at
 * the input's start, rewrites in one transaction the tables the input
 * before changed or the two states fill differently, which costs a few
 * statements instead of the operations that built the state.  The rows
 * come back in their order (rowid order), with the same INTEGER PRIMARY
 * KEYs and sqlite_sequence; a table without one gets new rowids in the
 * same order.
 * The schema never changes, so no connection re-parses it, and the memory
 * oracle is untouched: the snapshots are read only, and the database's
 * contents live in memdb's buffer, which the seal sized.
 */

/* Save the database as snapshot number ks_fuzz_sqlite_snaps.n (returned),
 * between the seal and the first input of the run. */
KS_FUZZ_SQLITE_OPTIONAL static int ks_fuzz_sqlite_snap_save(void)
{
    sqlite3 *keeper = ks_fuzz_sqlite_w.conns[0];
    int k = ks_fuzz_sqlite_snaps.n;
    CHECK(k < KS_FUZZ_SQLITE_MAX_SNAPS && ks_fuzz_sqlite_w.n_reset > 0);
    if (k == 0) {
        CHECK(sqlite3_exec(keeper, "ATTACH ':memory:' AS snap", NULL, NULL, NULL) == SQLITE_OK);
    }
    for (int i = 0; i < ks_fuzz_sqlite_w.n_reset; i++) {
        const char *name = ks_fuzz_sqlite_w.reset[i].name;
        char *copy = sqlite3_mprintf("CREATE TABLE snap.\"%d/%w\" AS SELECT * FROM main.\"%w\"", k, name, name);
        char *cnt = sqlite3_mprintf("SELECT count(*) FROM snap.\"%d/%w\"", k, name);
        char *ins = sqlite3_mprintf("INSERT INTO main.\"%w\" SELECT * FROM snap.\"%d/%w\"", name, k, name);
        CHECK(copy != NULL && cnt != NULL && ins != NULL);
        CHECK(sqlite3_exec(keeper, copy, NULL, NULL, NULL) == SQLITE_OK);
        sqlite3_stmt *c = ks_fuzz_sqlite_prepare(keeper, cnt);
        CHECK(sqlite3_step(c) == SQLITE_ROW);
        if (sqlite3_column_int64(c, 0) > 0) {
            ks_fuzz_sqlite_snaps.ins[k][i] = ks_fuzz_sqlite_prepare(keeper, ins);
        }
        CHECK(sqlite3_finalize(c) == SQLITE_OK);
        sqlite3_free(copy);
        sqlite3_free(cnt);
        sqlite3_free(ins);
    }
    ks_fuzz_sqlite_snaps.n++;
    return k;
}

/* After the last snapshot, between inputs: take the memory baseline again
 * (the snapshots and their statements are SQLite's from now on, for the
 * whole run). */
KS_FUZZ_SQLITE_OPTIONAL static void ks_fuzz_sqlite_snap_seal(void)
{
    ks_fuzz_sqlite_baseline();
}

/* At exit, after the harness closed what it opened between world_begin
 * and world_seal: finalize the harness's statements, close the keeper and
 * the template, and check that SQLite holds no memory any more (every
 * connection and statement of the run is gone). */
static void ks_fuzz_sqlite_world_end(void)
{
    ks_fuzz_sqlite_stmts_finalize();
    for (int i = 0; i < ks_fuzz_sqlite_w.n_reset; i++) {
        sqlite3_finalize(ks_fuzz_sqlite_w.reset[i].del);
        sqlite3_finalize(ks_fuzz_sqlite_w.reset[i].ins);
    }
    for (int k = 0; k < ks_fuzz_sqlite_snaps.n; k++) {
        for (int i = 0; i < ks_fuzz_sqlite_w.n_reset; i++) {
            sqlite3_finalize(ks_fuzz_sqlite_snaps.ins[k][i]);
            ks_fuzz_sqlite_snaps.ins[k][i] = NULL;
        }
    }
    ks_fuzz_sqlite_snaps.n = 0;
    ks_fuzz_sqlite_w.n_reset = 0;
    sqlite3_finalize(ks_fuzz_sqlite_w.page_count);
    sqlite3_finalize(ks_fuzz_sqlite_w.begin);
    sqlite3_finalize(ks_fuzz_sqlite_w.commit);
    CHECK(sqlite3_close(ks_fuzz_sqlite_w.conns[0]) == SQLITE_OK);
    CHECK(sqlite3_close(ks_fuzz_sqlite_w.tmpl) == SQLITE_OK);
    ks_fuzz_sqlite_w.n_conns = 0;
    sqlite3_reset_auto_extension(); /* its list is SQLite's last allocation */
    if (sqlite3_memory_used() != 0) {
        fprintf(stderr, "fuzz: SQLite still holds %lld bytes at exit\n", (long long)sqlite3_memory_used());
        CHECK(sqlite3_memory_used() == 0);
    }
}

#endif /* KS_FUZZ_SQLITE_H */
