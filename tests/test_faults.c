/*
 * tests/test_faults.c -- fault-injection sweeps with an all-or-nothing
 * oracle (docs/fuzzing.md, "Fault injection").
 *
 * For each operation (a migration batch in each mode, each rollout
 * transition and two rollbacks, an abort and a settings change, three
 * keyring updates, a census) and each
 * fault kind (keyshift's own allocations through the alloc_hook.h test
 * hook, SQLite's allocator, and xRead / xWrite / xTruncate / xSync /
 * xLock of the VFS shim of tests/fault_inject.h with SQLITE_IOERR_*,
 * SQLITE_FULL or SQLITE_BUSY), fail call N = 1, 2, ... until a run
 * completes with no fault fired.  At every fault point, with faults off:
 *   - the operation returned KS_OK or one of its documented errors;
 *   - PRAGMA integrity_check is "ok";
 *   - the database (or keyring file) holds exactly the state before or
 *     exactly the state after: every row is its original value or an
 *     envelope at the target that opens to its original plaintext, all
 *     rows alike (one batch), with a checkpoint that counts them; the
 *     rollout's phase and its log agree; the keyring file is byte for
 *     byte the old one or the new one, with no temporary file left;
 *   - a rollout or keyring change that returned an error was not made
 *     (a migration may commit its batch and then fail: it resumes);
 *   - running the operation again completes it;
 *   - SQLite's memory in use is back to its value before the run, and
 *     LeakSanitizer finds nothing after each sweep.
 * Every sweep prints its number of fault points; an operation whose
 * allocation or I/O points count zero fails the test.
 *
 * The fixtures are a few rows in one batch, in files under /dev/shm when
 * it is writable (the store fsyncs every commit), restored from a
 * template image before every run.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/crypto.h>
#include <keyshift/envelope.h>
#include <keyshift/keyring.h>
#include <keyshift/migrate.h>
#include <keyshift/rollout.h>
#include <keyshift/rowstore.h>

#include "../migrate/alloc_hook.h"
#include "fault_inject.h"
#include "mem_provider.h"
#include "test_files.h"

#if defined(__SANITIZE_ADDRESS__) && defined(__has_include)
#if __has_include(<sanitizer/lsan_interface.h>)
#include <sanitizer/lsan_interface.h>
#define KF_HAVE_LSAN 1
#endif
#endif

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define N_ROWS 3
#define ENV_CAP 512

/* ---- the fault kinds ------------------------------------------------------ */

/* One kind of a sweep: a kf_kind, or KIND_KS_ALLOC for keyshift's own
 * allocations (malloc & co. and sodium_malloc, alloc_hook.h). */
#define KIND_KS_ALLOC KF_N_KINDS
typedef struct kind {
    int kind;
    int rc;
    const char *name;
} kind;

static const kind KINDS[] = {
    {KIND_KS_ALLOC, 0, "keyshift-malloc"},
    {KF_SQLITE_MALLOC, 0, "sqlite-malloc"},
    {KF_READ, SQLITE_IOERR_READ, "xRead/IOERR"},
    {KF_WRITE, SQLITE_IOERR_WRITE, "xWrite/IOERR"},
    {KF_WRITE, SQLITE_FULL, "xWrite/FULL"},
    {KF_TRUNCATE, SQLITE_IOERR_TRUNCATE, "xTruncate/IOERR"},
    {KF_SYNC, SQLITE_IOERR_FSYNC, "xSync/IOERR"},
    {KF_LOCK, SQLITE_BUSY, "xLock/BUSY"},
    {KF_LOCK, SQLITE_IOERR_LOCK, "xLock/IOERR"},
};
#define N_KINDS (sizeof KINDS / sizeof KINDS[0])

/* Arm kind k at call n (0: disarm everything). */
static void arm(const kind *k, unsigned long n)
{
    ks_test_alloc_fail_at(0);
    kf_arm(KF_NONE, 0, 0);
    if (n == 0) {
        return;
    }
    if (k->kind == KIND_KS_ALLOC) {
        ks_test_alloc_fail_at(n);
    } else {
        kf_arm((kf_kind)k->kind, n, k->rc);
    }
}

/* How many calls the armed kind failed. */
static unsigned long fired(const kind *k)
{
    return k->kind == KIND_KS_ALLOC ? ks_test_alloc_fired() : kf_fired();
}

/* ---- the world -------------------------------------------------------------- */

/* What every operation shares: the directory, the provider, an oracle
 * context (used with faults off only), the original plaintexts, the
 * source envelopes, and the template images. */
typedef struct world {
    char dir[200];
    char db[256];
    char keyring[256];
    ks_mem_provider mem;
    ks_ctx *oracle_ctx;
    char plain[N_ROWS][32];
    uint8_t env[N_ROWS][ENV_CAP];
    size_t env_len[N_ROWS];
    uint8_t *img_plain, *img_env; /* databases of plaintext rows / v1 envelopes */
    size_t img_plain_len, img_env_len;
    uint8_t *img_phase[6];        /* rollout databases: [0] none, [p] in phase p */
    size_t img_phase_len[6];
    int64_t log_rows[6];          /* their log rows */
    uint8_t *kr_before, *kr_after[3]; /* keyring files */
    size_t kr_before_len, kr_after_len[3];
} world;

static world W;

/* Replace the file at path with b[0, n) (mode 0600), removing any
 * journal of it. */
static void spill(const char *path, const uint8_t *b, size_t n)
{
    char j[300];
    snprintf(j, sizeof j, "%s-journal", path);
    (void)unlink(j);
    tf_spit(path, b, n, 0600);
}

/* Run sql on the database through a connection of its own. */
static void exec_sql(const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(W.db, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* ---- the oracle's views ----------------------------------------------------- */

/* The oracle's connection to the database, read-write as the next user
 * of the database would open it (a fault may leave a hot journal, which
 * only a writer can roll back), after checking that PRAGMA
 * integrity_check says "ok". */
static sqlite3 *oracle_open(void)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(W.db, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    return db;
}

/* One integer from sql on db (-1 when there is no row). */
static int64_t query_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    int rc = sqlite3_step(st);
    assert_true(rc == SQLITE_ROW || rc == SQLITE_DONE);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    return v;
}

/* Row value states. */
enum { ST_NEITHER = -1, ST_BEFORE = 0, ST_AFTER = 1 };

/* What a migration leaves: its source rows and the version it targets. */
typedef struct mig {
    ks_migrate_mode mode;
    uint32_t to_version;
} mig;

/* The state of row id whose stored value is v[0, n) of SQLite type t:
 * its original (BEFORE), an envelope at the target that opens to its
 * original plaintext (AFTER), or anything else (NEITHER). */
static int row_state(const mig *m, int64_t id, int t, const uint8_t *v, size_t n)
{
    size_t i = (size_t)(id - 1);
    const char *pt = W.plain[i];
    if (m->mode == KS_MIGRATE_ENCRYPT ? t == SQLITE_TEXT && n == strlen(pt) && memcmp(v, pt, n) == 0
                                      : t == SQLITE_BLOB && n == W.env_len[i] &&
                                            memcmp(v, W.env[i], n) == 0) {
        return ST_BEFORE;
    }
    ks_envelope e;
    if (t != SQLITE_BLOB || ks_envelope_parse(v, n, NULL, &e, NULL) != KS_OK ||
        e.key_version != m->to_version || e.key_id.len != 1 || e.key_id.ptr[0] != 'k') {
        return ST_NEITHER;
    }
    char ctx[32];
    ks_open_params op = {kf_row_context(id, ctx, sizeof ctx), BV("acme"), BV("db.cards")};
    uint8_t out[64];
    size_t out_len = 0;
    if (ks_open(W.oracle_ctx, v, n, &op, out, sizeof out, &out_len, NULL) != KS_OK ||
        out_len != strlen(pt) || memcmp(out, pt, out_len) != 0) {
        return ST_NEITHER;
    }
    return ST_AFTER;
}

/* The state of the whole migration: every row BEFORE and no checkpoint
 * with rows done, or every row AFTER and a checkpoint counting them
 * (complete when *complete is asked for); else NEITHER. */
static int migration_state(const mig *m, int *complete)
{
    sqlite3 *db = oracle_open();
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT id, card FROM payments ORDER BY id", -1, &st, NULL),
                     SQLITE_OK);
    int state = ST_NEITHER, rows = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(st, 0);
        int t = sqlite3_column_type(st, 1);
        const uint8_t *v = sqlite3_column_blob(st, 1);
        size_t n = (size_t)sqlite3_column_bytes(st, 1);
        int s = id >= 1 && id <= N_ROWS ? row_state(m, id, t, v, n) : ST_NEITHER;
        state = rows == 0 ? s : s == state ? state : ST_NEITHER;
        rows++;
    }
    sqlite3_finalize(st);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    if (rows != N_ROWS || state == ST_NEITHER) {
        return ST_NEITHER;
    }
    kf_checkpoint cp = {0, 0, 0};
    char err[256];
    assert_int_equal(ks_rowstore_sqlite_checkpoints(W.db, "payments", "card", kf_checkpoint_one, &cp, err,
                                                    sizeof err),
                     KS_OK);
    *complete = cp.complete;
    if (state == ST_BEFORE) {
        return cp.n == 0 || cp.done == 0 ? ST_BEFORE : ST_NEITHER;
    }
    return cp.n == 1 && cp.done == N_ROWS ? ST_AFTER : ST_NEITHER;
}

/* ---- operations ----------------------------------------------------------------- */

/* One operation of a sweep. */
typedef struct op op;
struct op {
    const char *name;
    int sqlite;                   /* nonzero: runs on the database (SQLite kinds apply) */
    int rerun_after;              /* nonzero: may run again from its after state */
    void (*restore)(const op *o); /* put the before state in place */
    ks_err (*run)(const op *o);   /* the operation (faults armed) */
    int (*state)(const op *o, int strict); /* ST_* (faults off); strict: the after
                                              state must be final (a migration's
                                              checkpoint complete) */
    const ks_err *errors;         /* its documented errors, 0-terminated */
    mig m;                        /* migrations */
    int from, to;                 /* rollout transitions (from 0: start) */
    int kr;                       /* keyring change 0, 1, 2 */
};

/* A migration, a rollout change and a census on a database: allocation,
 * store and I/O errors. */
static const ks_err DB_ERRORS[] = {KS_ERR_NO_MEMORY, KS_ERR_STORE, KS_ERR_FULL, KS_ERR_BUSY, 0};
/* A keyring change: allocation and file errors. */
static const ks_err KR_ERRORS[] = {KS_ERR_NO_MEMORY, KS_ERR_IO, 0};

/* Restore the database of a migration. */
static void mig_restore(const op *o)
{
    if (o->m.mode == KS_MIGRATE_ENCRYPT) {
        spill(W.db, W.img_plain, W.img_plain_len);
    } else {
        spill(W.db, W.img_env, W.img_env_len);
    }
}

/* A migration batch (kf_migrate_once): three rows, one batch. */
static ks_err mig_run(const op *o)
{
    ks_provider prov = ks_mem_provider_of(&W.mem);
    return kf_migrate_once(&prov, W.db, o->m.mode, o->m.to_version, 8);
}

/* The migration's state; strict: AFTER only with a complete checkpoint. */
static int mig_state(const op *o, int strict)
{
    int complete = 0;
    int s = migration_state(&o->m, &complete);
    return strict && s == ST_AFTER && !complete ? ST_NEITHER : s;
}

/* Restore the census's database (v1 envelopes). */
static void census_restore(const op *o)
{
    (void)o;
    spill(W.db, W.img_env, W.img_env_len);
}

/* A census, read-only; a wrong count is KS_ERR_INTEGRITY (never
 * documented: fails the sweep). */
static ks_err census_run(const op *o)
{
    (void)o;
    ks_rowstore store = {0};
    ks_rowstore_target t = kf_target();
    ks_sqlite_options so = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    char err[256];
    ks_err e = ks_rowstore_sqlite_open(W.db, &t, &so, &store, err, sizeof err);
    if (e != KS_OK) {
        return e;
    }
    ks_census c;
    memset(&c, 0, sizeof c);
    if ((e = ks_census_run(&store, &c)) == KS_OK) {
        if (c.rows != N_ROWS || c.n_classes != 1 || c.classes[0].rows != N_ROWS ||
            c.classes[0].key_version != 1) {
            e = KS_ERR_INTEGRITY;
        }
        ks_census_free(&c);
    }
    ks_rowstore_close(&store);
    return e;
}

/* The census changes nothing: the rows are as before (so "after" too). */
static int census_state(const op *o, int strict)
{
    (void)o;
    (void)strict;
    mig m = {KS_MIGRATE_REWRAP, 2};
    int complete = 0;
    return migration_state(&m, &complete) == ST_BEFORE ? ST_AFTER : ST_NEITHER;
}

/* Restore the rollout database in the phase the transition leaves. */
static void ro_restore(const op *o)
{
    spill(W.db, W.img_phase[o->from], W.img_phase_len[o->from]);
}

/* Facts with every external fact favourable at now. */
static ks_rollout_facts facts(int64_t now)
{
    return (ks_rollout_facts){.now = now, .target_key_state = KS_KEY_ACTIVE,
                              .source_key_state = KS_KEY_ACTIVE, .census_known = 1,
                              .health_known = 1, .health = KS_HEALTH_OK};
}

/* The rollout fixture's spec: payments.card from plaintext to k:2. */
static ks_rollout ro_spec(void)
{
    ks_rollout s;
    memset(&s, 0, sizeof s);
    strcpy(s.table, "payments");
    strcpy(s.column, "card");
    s.source.is_plaintext = 1;
    s.target.version = 2;
    s.target.algorithm = KS_ALG_XCHACHA20POLY1305;
    strcpy(s.target.key_id, "k");
    s.target.key_version = 2;
    s.thresholds = (ks_thresholds){0.001, 0.001, 0.01, 10000, 10000, 1000, 300};
    s.min_soak_s = 300;
    s.reader_ttl_s = 30;
    return s;
}

/* The time of each phase's transition in the fixture's walk. */
static const int64_t PHASE_TIME[6] = {1000, 1000, 1010, 1310, 1320, 1500};

/* A rollout change: open the store, start or transition, close. */
static ks_err ro_run(const op *o)
{
    ks_rollout_db *db = NULL;
    char err[512];
    ks_err e = ks_rollout_db_open(W.db, 0, &db, err, sizeof err);
    if (e != KS_OK) {
        return e;
    }
    if (o->from == 0) {
        ks_rollout s = ro_spec();
        int64_t id = 0;
        e = ks_rollout_db_start(db, &s, "alice", 1000, &id, err, sizeof err);
    } else {
        ks_rollout_facts f = facts(o->to > o->from ? PHASE_TIME[o->to] : 1600);
        ks_rollout_change c = {1, (ks_rollout_phase)o->from, (ks_rollout_phase)o->to, "alice",
                               "sweep", 0};
        e = ks_rollout_db_transition(db, &c, &f, err, sizeof err);
    }
    ks_rollout_db_close(db);
    return e;
}

/* BEFORE: the rollout in `from` with the fixture's log; AFTER: in `to`
 * with one more log row ending in `to`. */
static int ro_state(const op *o, int strict)
{
    (void)strict;
    sqlite3 *db = oracle_open();
    int64_t rows = query_int(db, "SELECT count(*) FROM keyshift_rollout_log");
    int64_t n = query_int(db, "SELECT count(*) FROM keyshift_rollout");
    int s = ST_NEITHER;
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM keyshift_rollout r JOIN keyshift_rollout_log l"
             " ON l.id = (SELECT max(id) FROM keyshift_rollout_log)"
             " WHERE r.id = 1 AND r.phase = '%s' AND l.to_phase = '%s'",
             ks_rollout_phase_name(o->to), ks_rollout_phase_name(o->to));
    if (rows == W.log_rows[o->from] + 1 && n == 1 && query_int(db, sql) == 1) {
        s = ST_AFTER;
    } else if (o->from == 0) {
        s = rows == 0 && n == 0 ? ST_BEFORE : ST_NEITHER;
    } else {
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM keyshift_rollout WHERE id = 1 AND phase = '%s'",
                 ks_rollout_phase_name(o->from));
        s = rows == W.log_rows[o->from] && n == 1 && query_int(db, sql) == 1 ? ST_BEFORE
                                                                              : ST_NEITHER;
    }
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    return s;
}

/* A rollout abort (o->to 0) or settings change (o->to 1) of rollout 1
 * in phase o->from: open the store, change, close.  The abort's census
 * is the fixture's (no row at the target); the change sets min_samples
 * from 1000 to 10. */
static ks_err ro_fix_run(const op *o)
{
    ks_rollout_db *db = NULL;
    char err[512];
    ks_err e = ks_rollout_db_open(W.db, 0, &db, err, sizeof err);
    if (e != KS_OK) {
        return e;
    }
    if (o->to == 0) {
        ks_rollout_facts f = facts(1600);
        e = ks_rollout_db_abort(db, 1, (ks_rollout_phase)o->from, &f, "alice", "sweep", err,
                                sizeof err);
    } else {
        ks_rollout s = ro_spec();
        s.thresholds.min_samples = 10;
        e = ks_rollout_db_set_settings(db, 1, &s.thresholds, s.min_soak_s, s.reader_ttl_s,
                                       "alice", NULL, 1600, NULL, 0);
    }
    ks_rollout_db_close(db);
    return e;
}

/* BEFORE: rollout 1 in o->from with min_samples 1000 and the fixture's
 * log; AFTER: an abort's rollout gone with two more log rows, the last
 * "aborted: sweep"; a change's min_samples 10 with one more log row
 * naming it. */
static int ro_fix_state(const op *o, int strict)
{
    (void)strict;
    sqlite3 *db = oracle_open();
    int64_t rows = query_int(db, "SELECT count(*) FROM keyshift_rollout_log");
    int64_t n = query_int(db, "SELECT count(*) FROM keyshift_rollout");
    int64_t last_abort = query_int(db, "SELECT count(*) FROM keyshift_rollout_log WHERE id = "
                                       "(SELECT max(id) FROM keyshift_rollout_log) AND "
                                       "reason = 'aborted: sweep'");
    int64_t last_set = query_int(db, "SELECT count(*) FROM keyshift_rollout_log WHERE id = "
                                     "(SELECT max(id) FROM keyshift_rollout_log) AND "
                                     "reason = 'set: min_samples 1000 -> 10'");
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM keyshift_rollout WHERE id = 1 AND phase = '%s' AND "
             "min_samples = %d", ks_rollout_phase_name(o->from), o->to == 0 ? 1000 : 10);
    int64_t changed = query_int(db, sql);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM keyshift_rollout WHERE id = 1 AND phase = '%s' AND "
             "min_samples = 1000", ks_rollout_phase_name(o->from));
    int64_t before = query_int(db, sql);
    int s = ST_NEITHER;
    if (rows == W.log_rows[o->from] && n == 1 && before == 1) {
        s = ST_BEFORE;
    } else if (o->to == 0 && rows == W.log_rows[o->from] + 2 && n == 0 && last_abort == 1) {
        s = ST_AFTER;
    } else if (o->to == 1 && rows == W.log_rows[o->from] + 1 && n == 1 && changed == 1 &&
               last_set == 1) {
        s = ST_AFTER;
    }
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    return s;
}

/* Restore the keyring file. */
static void kr_restore(const op *o)
{
    (void)o;
    spill(W.keyring, W.kr_before, W.kr_before_len);
}

/* The material of the version the add-version change adds. */
static const uint8_t KEK3[KS_KEK_LEN] = "test_faults kek of k, version 3";

/* A keyring change: open, change, close.  0: add version 3 (imported:
 * fixed material, so the after state is one file), 1: promote version 2,
 * 2: make version 2 (not the primary) decrypt-only. */
static ks_err kr_run(const op *o)
{
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    ks_err e = ks_keyring_open(W.keyring, (ks_bytes){NULL, 0}, &kr, &pe);
    if (e != KS_OK) {
        return e;
    }
    uint32_t v = 0;
    switch (o->kr) {
    case 0:
        e = ks_keyring_import_version(kr, BV("k"), KEK3, &v);
        break;
    case 1:
        e = ks_keyring_promote(kr, BV("k"), 2);
        break;
    default:
        e = ks_keyring_set_state(kr, BV("k"), 2, KS_KEY_DECRYPT_ONLY);
        break;
    }
    ks_keyring_close(kr);
    return e;
}

/* Nonzero when the directory holds nothing but the database (and its
 * journal: the database sweeps' business), the keyring and its lock file:
 * no temporary keyring file left behind. */
static int dir_clean(void)
{
    DIR *d = opendir(W.dir);
    assert_non_null(d);
    int clean = 1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strcmp(n, ".") != 0 && strcmp(n, "..") != 0 && strcmp(n, "db.sqlite") != 0 &&
            strcmp(n, "db.sqlite-journal") != 0 && strcmp(n, "keys.ksk") != 0 &&
            strcmp(n, "keys.ksk.lock") != 0) {
            clean = 0;
        }
    }
    closedir(d);
    return clean;
}

/* Nonzero when the keyring file of n bytes holds k with three versions,
 * 1 the primary: the add-version change's result, whose new version's
 * `created` time [K-VER-4] makes its bytes differ from run to run. */
static int kr_added(size_t n)
{
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    ks_keyring_key key;
    int ok = n == W.kr_after_len[0] &&
             ks_keyring_open(W.keyring, (ks_bytes){NULL, 0}, &kr, &pe) == KS_OK &&
             ks_keyring_count(kr) == 1 && ks_keyring_key_at(kr, 0, &key) == KS_OK &&
             key.versions == 3 && key.primary == 1;
    ks_keyring_close(kr);
    return ok;
}

/* The keyring file byte for byte the old one or the new one (for
 * add-version: the new one but for its time), no temporary file left. */
static int kr_state(const op *o, int strict)
{
    (void)strict;
    size_t n = 0;
    uint8_t *b = tf_slurp(W.keyring, &n);
    int s = n == W.kr_before_len && memcmp(b, W.kr_before, n) == 0 ? ST_BEFORE
            : o->kr == 0 ? (kr_added(n) ? ST_AFTER : ST_NEITHER)
            : n == W.kr_after_len[o->kr] && memcmp(b, W.kr_after[o->kr], n) == 0 ? ST_AFTER
                                                                                 : ST_NEITHER;
    free(b);
    return dir_clean() ? s : ST_NEITHER;
}

#define MIG(nm, mode, v) {nm, 1, 1, mig_restore, mig_run, mig_state, DB_ERRORS, {mode, v}, 0, 0, 0}
#define RO(nm, f, t) {nm, 1, 0, ro_restore, ro_run, ro_state, DB_ERRORS, {0, 0}, f, t, 0}
#define KR(nm, i) {nm, 0, 0, kr_restore, kr_run, kr_state, KR_ERRORS, {0, 0}, 0, 0, i}
#define RF(nm, f, what) {nm, 1, 0, ro_restore, ro_fix_run, ro_fix_state, DB_ERRORS, {0, 0}, f, what, 0}

static const op OPS[] = {
    MIG("migrate encrypt", KS_MIGRATE_ENCRYPT, 2),
    MIG("migrate rewrap", KS_MIGRATE_REWRAP, 2),
    MIG("migrate reencrypt", KS_MIGRATE_REENCRYPT, 2),
    RO("rollout start", 0, KS_PHASE_PLANNED),
    RO("rollout planned -> read-compat", KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT),
    RO("rollout read-compat -> write-upgrade", KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE),
    RO("rollout write-upgrade -> backfill", KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL),
    RO("rollout backfill -> finalized", KS_PHASE_BACKFILL, KS_PHASE_FINALIZED),
    RO("rollback finalized -> backfill", KS_PHASE_FINALIZED, KS_PHASE_BACKFILL),
    RO("rollback backfill -> read-compat", KS_PHASE_BACKFILL, KS_PHASE_READ_COMPAT),
    RF("rollout abort in read-compat", KS_PHASE_READ_COMPAT, 0),
    RF("rollout set in write-upgrade", KS_PHASE_WRITE_UPGRADE, 1),
    KR("keyring add-version", 0),
    KR("keyring promote", 1),
    KR("keyring set-state", 2),
    {"census", 1, 1, census_restore, census_run, census_state, DB_ERRORS, {0, 0}, 0, 0, 0},
};
#define N_OPS (sizeof OPS / sizeof OPS[0])

/* ---- the fixtures ------------------------------------------------------------- */

/* Build the templates: plaintext rows, v1 envelopes, the rollout walk,
 * the keyring before and after each change. */
static void build_world(void)
{
    static const uint8_t kek1[32] = "test_faults kek of k, version 1";
    static const uint8_t kek2[32] = "test_faults kek of k, version 2";
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(W.dir, sizeof W.dir, "%s/ks_faults_XXXXXX", base);
    assert_non_null(mkdtemp(W.dir));
    snprintf(W.db, sizeof W.db, "%s/db.sqlite", W.dir);
    snprintf(W.keyring, sizeof W.keyring, "%s/keys.ksk", W.dir);
    ks_mem_init(&W.mem);
    assert_int_equal(ks_mem_add(&W.mem, "k", 1, 1, kek1), 0);
    assert_int_equal(ks_mem_add(&W.mem, "k", 2, 0, kek2), 0);
    ks_provider prov = ks_mem_provider_of(&W.mem);
    assert_int_equal(ks_ctx_new(&prov, NULL, &W.oracle_ctx), KS_OK);

    /* plaintext rows; the store's tables made by one open */
    exec_sql("CREATE TABLE payments(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);");
    for (int i = 0; i < N_ROWS; i++) {
        snprintf(W.plain[i], sizeof W.plain[i], "4111-0000-0000-%04d", i + 1);
        char sql[128];
        snprintf(sql, sizeof sql, "INSERT INTO payments VALUES(%d, 'acme', '%s');", i + 1,
                 W.plain[i]);
        exec_sql(sql);
    }
    ks_rowstore store = {0};
    ks_rowstore_target t = kf_target();
    char err[512];
    assert_int_equal(ks_rowstore_sqlite_open(W.db, &t, NULL, &store, err, sizeof err), KS_OK);
    ks_rowstore_close(&store);
    ks_rollout_db *rdb = NULL;
    assert_int_equal(ks_rollout_db_open(W.db, 0, &rdb, err, sizeof err), KS_OK);
    ks_rollout_db_close(rdb);
    W.img_plain = tf_slurp(W.db, &W.img_plain_len);

    /* the rollout walk over the plaintext database */
    W.img_phase[0] = tf_slurp(W.db, &W.img_phase_len[0]);
    for (int p = KS_PHASE_PLANNED; p <= KS_PHASE_FINALIZED; p++) {
        op o = RO("walk", p - 1, p);
        assert_int_equal(ro_run(&o), KS_OK);
        if (p == KS_PHASE_BACKFILL) {
            assert_int_equal(ks_rollout_db_open(W.db, 0, &rdb, err, sizeof err), KS_OK);
            assert_int_equal(ks_rollout_db_record_verify(rdb, 1, "migrate", 1400), KS_OK);
            ks_rollout_db_close(rdb);
        }
        W.img_phase[p] = tf_slurp(W.db, &W.img_phase_len[p]);
        sqlite3 *db = oracle_open();
        W.log_rows[p] = query_int(db, "SELECT count(*) FROM keyshift_rollout_log");
        assert_int_equal(sqlite3_close(db), SQLITE_OK);
    }

    /* v1 envelopes of the same plaintexts */
    spill(W.db, W.img_plain, W.img_plain_len);
    for (int i = 0; i < N_ROWS; i++) {
        char ctx[32];
        ks_seal_params sp = {2, KS_ALG_XCHACHA20POLY1305, BV("acme"), BV("k"), 1, BV("db.cards"),
                             kf_row_context(i + 1, ctx, sizeof ctx)};
        assert_int_equal(ks_seal(W.oracle_ctx, &sp, (const uint8_t *)W.plain[i], strlen(W.plain[i]),
                                 W.env[i], ENV_CAP, &W.env_len[i]),
                         KS_OK);
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_open_v2(W.db, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
        assert_int_equal(
            sqlite3_prepare_v2(db, "UPDATE payments SET card = ?1 WHERE id = ?2", -1, &st, NULL),
            SQLITE_OK);
        sqlite3_bind_blob(st, 1, W.env[i], (int)W.env_len[i], SQLITE_STATIC);
        sqlite3_bind_int(st, 2, i + 1);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
        assert_int_equal(sqlite3_close(db), SQLITE_OK);
    }
    W.img_env = tf_slurp(W.db, &W.img_env_len);

    /* the keyring: k with versions 1 (primary) and 2; each change's result */
    assert_int_equal(ks_keyring_init(W.keyring, (ks_bytes){NULL, 0}), KS_OK);
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    uint32_t v = 0;
    assert_int_equal(ks_keyring_open(W.keyring, (ks_bytes){NULL, 0}, &kr, &pe), KS_OK);
    assert_int_equal(ks_keyring_import_version(kr, BV("k"), kek1, &v), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_keyring_create(kr, BV("k")), KS_OK);
    assert_int_equal(ks_keyring_import_version(kr, BV("k"), kek2, &v), KS_OK);
    ks_keyring_close(kr);
    W.kr_before = tf_slurp(W.keyring, &W.kr_before_len);
    for (int i = 0; i < 3; i++) {
        op o = KR("build", i);
        kr_restore(&o);
        assert_int_equal(kr_run(&o), KS_OK);
        W.kr_after[i] = tf_slurp(W.keyring, &W.kr_after_len[i]);
    }
}

/* Remove the files and free the templates. */
static void free_world(void)
{
    char j[300];
    snprintf(j, sizeof j, "%s-journal", W.db);
    (void)unlink(j);
    (void)unlink(W.db);
    (void)unlink(W.keyring);
    snprintf(j, sizeof j, "%s.lock", W.keyring);
    (void)unlink(j);
    (void)rmdir(W.dir);
    free(W.img_plain);
    free(W.img_env);
    for (int i = 0; i < 6; i++) {
        free(W.img_phase[i]);
    }
    free(W.kr_before);
    for (int i = 0; i < 3; i++) {
        free(W.kr_after[i]);
    }
    ks_ctx_free(W.oracle_ctx);
    ks_mem_cleanup(&W.mem);
}

/* ---- the sweep ------------------------------------------------------------------ */

/* Nonzero when e is KS_OK or one of o's documented errors. */
static int allowed(const op *o, ks_err e)
{
    for (const ks_err *p = o->errors; *p != 0; p++) {
        if (*p == e) {
            return 1;
        }
    }
    return e == KS_OK;
}

/* The step between the fault points of SQLite's allocator: its sweeps
 * are most of the run time (about 1,500 allocations an operation, mostly
 * opening the connection), so `make unit` tries every sixth;
 * KS_FAULTS_STRIDE=1 tries every one, as the nightly workflow does
 * (docs/fuzzing.md, "Fault injection").  Every other kind tries every
 * point. */
static unsigned long stride(const kind *k)
{
    const char *v = getenv("KS_FAULTS_STRIDE");
    unsigned long s = v != NULL ? strtoul(v, NULL, 10) : 6;
    return k->kind == KF_SQLITE_MALLOC && s > 1 ? s : 1;
}

/* Fail call n = 1, 1 + stride, ... of kind k during operation o until a
 * run fires no fault; check the oracle at every point.  Returns the
 * number of fault points. */
static unsigned long sweep(const op *o, const kind *k, unsigned long *committed_on_error)
{
    unsigned long n, points = 0, step = stride(k);
    for (n = 1;; n += step) {
        o->restore(o);
        sqlite3_int64 mem0 = sqlite3_memory_used();
        arm(k, n);
        ks_err e = o->run(o);
        unsigned long f = fired(k);
        arm(k, 0);
        if (sqlite3_memory_used() != mem0) {
            fail_msg("%s, %s at %lu: SQLite memory %lld, was %lld", o->name, k->name, n,
                     (long long)sqlite3_memory_used(), (long long)mem0);
        }
        if (!allowed(o, e)) {
            fail_msg("%s, %s at %lu: %s is not a documented error", o->name, k->name, n,
                     ks_err_name(e));
        }
        int s = o->state(o, f == 0);
        if (f == 0 && e != KS_OK) {
            fail_msg("%s, %s at %lu: no fault fired, yet it returned %s", o->name, k->name, n,
                     ks_err_name(e));
        }
        if (s == ST_NEITHER || (e == KS_OK && s != ST_AFTER)) {
            fail_msg("%s, %s at %lu: returned %s, but the state is %s", o->name, k->name, n,
                     ks_err_name(e), s == ST_NEITHER ? "neither before nor after" : "before");
        }
        if (f == 0) {
            break;
        }
        points++;
        if (e != KS_OK && s == ST_AFTER && o->run != census_run) {
            /* A migration resumes, so an error after its batch committed is
             * harmless; a rollout or keyring change reported as failed but
             * in effect would be retried: a second version, a stale move. */
            if (!o->rerun_after) {
                fail_msg("%s, %s at %lu: returned %s, but the change was made", o->name, k->name,
                         n, ks_err_name(e));
            }
            (*committed_on_error)++;
        }
        if (s == ST_BEFORE || o->rerun_after) {
            ks_err e2 = o->run(o);
            if (e2 != KS_OK || o->state(o, 1) != ST_AFTER) {
                fail_msg("%s, %s at %lu: the run after the fault returned %s", o->name, k->name, n,
                         ks_err_name(e2));
            }
        }
    }
    return points;
}

/* Every operation under every kind that applies; print the counts. */
static void test_sweeps(void **state)
{
    (void)state;
    build_world();
    unsigned long total = 0;
    for (size_t i = 0; i < N_OPS; i++) {
        const op *o = &OPS[i];
        const char *only = getenv("KS_FAULTS_ONLY");
        if (only != NULL && strstr(o->name, only) == NULL) {
            continue;
        }
        unsigned long alloc = 0, io = 0, committed = 0;
        char line[512];
        int len = snprintf(line, sizeof line, "fault sweep: %-38s", o->name);
        for (size_t j = 0; j < N_KINDS; j++) {
            const kind *k = &KINDS[j];
            if (!o->sqlite && k->kind != KIND_KS_ALLOC) {
                continue;
            }
            unsigned long pts = sweep(o, k, &committed);
            if (k->kind == KIND_KS_ALLOC || k->kind == KF_SQLITE_MALLOC) {
                alloc += pts;
            } else {
                io += pts;
            }
            if (pts == 0 && (k->kind == KIND_KS_ALLOC || k->kind == KF_SQLITE_MALLOC)) {
                fail_msg("%s: no %s fault point (a sweep that never fires proves nothing)",
                         o->name, k->name);
            }
#ifdef KF_HAVE_LSAN
            if (__lsan_do_recoverable_leak_check() != 0) {
                fail_msg("%s, %s: LeakSanitizer found a leak", o->name, k->name);
            }
#endif
            if (len > 0 && (size_t)len < sizeof line) {
                len += snprintf(line + len, sizeof line - (size_t)len, " %s %lu", k->name, pts);
            }
            if (getenv("KS_FAULTS_VERBOSE") != NULL) {
                fprintf(stderr, "%s, %s: %lu points\n", o->name, k->name, pts);
            }
        }
        if (o->sqlite && io == 0) {
            fail_msg("%s: no I/O fault point", o->name);
        }
        printf("%s; committed with an error: %lu\n", line, committed);
        fflush(stdout);
        total += alloc + io;
    }
    printf("fault sweep: %lu fault points in all\n", total);
    free_world();
}

/* Install the SQLite allocator and the VFS shim before anything
 * initialises SQLite, then run the sweeps. */
int main(void)
{
    if (kf_install() != SQLITE_OK || sodium_init() < 0) {
        fprintf(stderr, "test_faults: cannot install the fault injection\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
