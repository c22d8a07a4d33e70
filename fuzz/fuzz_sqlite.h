/*
 * fuzz/fuzz_sqlite.h -- the SQLite world shared by the stateful harnesses
 * (fuzz_migrate, fuzz_rollout): an in-memory database that every
 * connection of the process reaches by one plain path, restored per input
 * from a template image built once, under SQLite's own fuzzing limits.
 *
 * - The library opens plain paths only (no URI, no SQLITE_OPEN_CREATE), so
 *   ks_fuzz_sqlite_init() makes SQLite's "memdb" VFS the process's
 *   default: a path starting with '/' names one database shared by every
 *   connection while one is open, gone when the last one closes.  memdb
 *   keeps its rollback journal in memory and its xSync does nothing, so
 *   journal_mode=MEMORY and synchronous=OFF hold without a PRAGMA.
 * - Template: ks_fuzz_sqlite_template_save() copies a database built at
 *   start-up (the schema the library itself creates) into a private
 *   in-memory connection; ks_fuzz_sqlite_template_load() copies it back
 *   into an input's fresh database with the backup API (a few pages), so
 *   no input pays for CREATE TABLE or schema upgrades.  sqlite3_deserialize
 *   cannot be used: it detaches the connection from the shared database.
 * - Limits as SQLite's own fuzz harness sets them: sqlite3_hard_heap_limit64
 *   for the process, and on every connection (an auto-extension, so the
 *   library's connections too) SQLITE_LIMIT_LENGTH and a progress handler
 *   whose per-input budget of virtual machine steps ends a runaway
 *   statement with a report and abort() (a finding, not a refusal the
 *   oracles would misread).
 *
 * Fuzz harness code: static functions only, like fuzz_drbg.h.
 */
#ifndef KS_FUZZ_SQLITE_H
#define KS_FUZZ_SQLITE_H

#include <stdio.h>
#include <stdlib.h>

#include <sqlite3.h>

#include "fuzz_check.h"

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

static unsigned ks_fuzz_sqlite_ticks; /* progress calls in this input */
static sqlite3 *ks_fuzz_sqlite_tmpl;  /* the template, private, in memory */

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

/* Auto-extension run on every new connection: set its fuzzing limits. */
static int ks_fuzz_sqlite_limits(sqlite3 *db, const char **err,
                                 const struct sqlite3_api_routines *api)
{
    (void)err;
    (void)api;
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, KS_FUZZ_SQLITE_LENGTH);
    sqlite3_progress_handler(db, KS_FUZZ_SQLITE_PROGRESS_N, ks_fuzz_sqlite_progress, NULL);
    return SQLITE_OK;
}

/* Once per process: memdb as the default VFS, the heap cap, the limits. */
static void ks_fuzz_sqlite_init(void)
{
    CHECK(sqlite3_initialize() == SQLITE_OK);
    sqlite3_vfs *memdb = sqlite3_vfs_find("memdb");
    CHECK(memdb != NULL);
    CHECK(sqlite3_vfs_register(memdb, 1) == SQLITE_OK);
    CHECK(sqlite3_hard_heap_limit64(KS_FUZZ_SQLITE_HEAP) >= 0);
    /* sqlite3_auto_extension takes the entry point as void (*)(void) */
    CHECK(sqlite3_auto_extension((void (*)(void))(void *)ks_fuzz_sqlite_limits) == SQLITE_OK);
}

/* Copy every page of src's main database into dst's; abort on failure. */
static void ks_fuzz_sqlite_copy(sqlite3 *dst, sqlite3 *src)
{
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    CHECK(b != NULL);
    CHECK(sqlite3_backup_step(b, -1) == SQLITE_DONE);
    CHECK(sqlite3_backup_finish(b) == SQLITE_OK);
}

/* Once per process: keep src's database (built through the library, so
 * with its exact schema) as the template, and copy it out once so that
 * the template connection's page cache holds every page before the first
 * input measures sqlite3_memory_used(). */
static void ks_fuzz_sqlite_template_save(sqlite3 *src)
{
    sqlite3 *scratch = NULL;
    CHECK(sqlite3_open_v2(":memory:", &ks_fuzz_sqlite_tmpl, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
    ks_fuzz_sqlite_copy(ks_fuzz_sqlite_tmpl, src);
    CHECK(sqlite3_open_v2(":memory:", &scratch, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
    ks_fuzz_sqlite_copy(scratch, ks_fuzz_sqlite_tmpl);
    CHECK(sqlite3_close(scratch) == SQLITE_OK);
}

/* Per input: make dst's (fresh, empty) database the template, and give the
 * input its whole progress budget. */
static void ks_fuzz_sqlite_template_load(sqlite3 *dst)
{
    ks_fuzz_sqlite_ticks = 0;
    ks_fuzz_sqlite_copy(dst, ks_fuzz_sqlite_tmpl);
}

#endif /* KS_FUZZ_SQLITE_H */
