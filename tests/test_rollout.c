/*
 * tests/test_rollout.c -- rollouts (keyshift/rollout.h): the schema and its
 * upgrade, the append-only log, every guard, racing transitions, reader
 * TTLs, the application policy (phases, canaries, data_version refresh)
 * and strict parsing of stored values.
 *
 * Every test works on a real SQLite file in a fresh mkdtemp directory.
 * Time is passed explicitly (`now`): no test sleeps or measures a duration.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/rollout.h>
#include <keyshift/rowstore.h>

#include "../migrate/rollout/rollout_internal.h"
#include "sqlite_test_util.h"

/* One test's world: a temporary directory holding db.sqlite with an
 * application table payments(id, tenant, card). */
typedef struct world {
    char dir[64];
    char path[96];
    char err[512];
    ks_rollout_db *db;
} world;

/* ---- helpers ---------------------------------------------------------------- */

/* Run sql on the database at path through a separate connection
 * (creating the file); returns SQLite's result. */
static int exec_rc(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    return rc;
}

/* As exec_rc, which must succeed. */
static void exec_sql(const char *path, const char *sql)
{
    assert_int_equal(exec_rc(path, sql), SQLITE_OK);
}

/* Create the directory and the application database. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    strcpy(w->dir, "/tmp/ks_rollout_XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    snprintf(w->path, sizeof w->path, "%s/db.sqlite", w->dir);
    exec_sql(w->path, "CREATE TABLE payments(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);");
    *state = w;
    return 0;
}

/* Close the store and remove the files and the directory. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_rollout_db_close(w->db);
    remove_db_dir(w->dir, w->path);
    free(w);
    return 0;
}

/* Open w->db read-write. */
static void open_db(world *w)
{
    ks_rollout_db_close(w->db);
    w->db = NULL;
    assert_int_equal(ks_rollout_db_open(w->path, 0, &w->db, w->err, sizeof w->err), KS_OK);
}

/* An envelope class. */
static ks_rollout_class cls(uint8_t version, uint32_t alg, const char *key_id, uint32_t kv)
{
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.version = version;
    c.algorithm = alg;
    strcpy(c.key_id, key_id);
    c.key_version = kv;
    return c;
}

/* The plaintext class. */
static ks_rollout_class plain(void)
{
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.is_plaintext = 1;
    return c;
}

/* A spec: payments.card from plaintext to payments-kek:2 (v2,
 * xchacha20-poly1305), soak 300 s, reader TTL 30 s, canary all. */
static ks_rollout spec(void)
{
    ks_rollout s;
    memset(&s, 0, sizeof s);
    strcpy(s.table, "payments");
    strcpy(s.column, "card");
    s.source = plain();
    s.target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    s.thresholds = (ks_thresholds){0.001, 0.001, 0.01, 10000, 10000, 1000, 300};
    s.min_soak_s = 300;
    s.reader_ttl_s = 30;
    return s;
}

/* Start spec s at now; returns its id. */
static int64_t start(world *w, const ks_rollout *s, int64_t now)
{
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, s, "alice", now, &id, w->err, sizeof w->err),
                     KS_OK);
    assert_true(id > 0);
    return id;
}

/* A reader holding keys. */
static ks_rollout_reader reader(const char *id, uint8_t max_format, const char *keys)
{
    ks_rollout_reader r;
    memset(&r, 0, sizeof r);
    strcpy(r.instance_id, id);
    strcpy(r.library_version, "0.1.0");
    r.max_format = max_format;
    r.algorithms = (1u << KS_ALG_AES256GCM) | (1u << KS_ALG_XCHACHA20POLY1305);
    strcpy(r.keys, keys);
    return r;
}

/* Facts at now with every external fact favourable (key active, census
 * empty, health OK). */
static ks_rollout_facts good_facts(int64_t now)
{
    return (ks_rollout_facts){.now = now, .target_key_state = KS_KEY_ACTIVE,
                              .source_key_state = KS_KEY_ACTIVE, .census_known = 1,
                              .health_known = 1, .health = KS_HEALTH_OK};
}

/* Ask the store to move rollout id from -> to with facts f; returns the
 * result, the reason in w->err. */
static ks_err move(world *w, int64_t id, ks_rollout_phase from, ks_rollout_phase to,
                   const ks_rollout_facts *f)
{
    ks_rollout_change c = {id, from, to, "alice", "test", 0};
    return ks_rollout_db_transition(w->db, &c, f, w->err, sizeof w->err);
}

/* The phase of rollout id. */
static ks_rollout_phase phase_of(world *w, int64_t id)
{
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    return r.phase;
}

/* keyshift_meta's schema_version. */
static int64_t schema_version(world *w)
{
    return query_int(w->path, "SELECT value FROM keyshift_meta WHERE key = 'schema_version'");
}

/* Open (and close) the row store on payments.card, as `migrate` would. */
static ks_err open_rowstore(world *w)
{
    ks_rowstore store;
    ks_rowstore_target t;
    memset(&t, 0, sizeof t);
    t.table = "payments";
    t.column = "card";
    ks_err err = ks_rowstore_sqlite_open(w->path, &t, NULL, &store, w->err, sizeof w->err);
    if (err == KS_OK)
        ks_rowstore_close(&store);
    return err;
}

/* ---- schema ----------------------------------------------------------------- */

/* A fresh database gets every table at schema version 4; opening again
 * changes nothing. */
static void test_schema_fresh(void **state)
{
    world *w = *state;
    open_db(w);
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                                        "AND name LIKE 'keyshift%'"),
                     8);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE type = "
                                        "'trigger'"),
                     2);
    open_db(w);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_meta"), 1);
}

/* A version 1 database made by the row store upgrades in place; the row
 * store still opens it afterwards, and its checkpoint tables stay. */
static void test_schema_upgrade_from_v1(void **state)
{
    world *w = *state;
    assert_int_equal(open_rowstore(w), KS_OK);
    exec_sql(w->path, "INSERT INTO keyshift_quarantine(tbl, col, id, error, time) VALUES('payments', 'card', 7, 'x', 1);");
    assert_int_equal(schema_version(w), 1);
    /* read-only: opens, finds nothing, changes nothing */
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_OK);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(schema_version(w), 1);
    open_db(w);
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_quarantine"), 1);
    assert_int_equal(open_rowstore(w), KS_OK);
}

/* An upgrade that fails half-way leaves nothing behind: one transaction. */
static void test_upgrade_atomic(void **state)
{
    world *w = *state;
    assert_int_equal(open_rowstore(w), KS_OK);
    exec_sql(w->path, "CREATE VIEW keyshift_rollout_log AS SELECT 1 AS x;");
    assert_int_not_equal(ks_rollout_db_open(w->path, 0, &w->db, w->err, sizeof w->err), KS_OK);
    assert_null(w->db);
    assert_int_equal(schema_version(w), 1);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE name IN "
                                        "('keyshift_rollout', 'keyshift_readers')"),
                     0);
    exec_sql(w->path, "DROP VIEW keyshift_rollout_log;");
    open_db(w);
    assert_int_equal(schema_version(w), 4);
}

/* A read-only store reads but refuses every change. */
static void test_read_only(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    ks_rollout_db_close(w->db);
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_OK);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    ks_rollout_facts f = good_facts(2000);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f),
                     KS_ERR_INVALID_ARGUMENT);
    ks_rollout_reader rd = reader("web-1", 2, "");
    assert_int_equal(ks_rollout_db_reader_register(w->db, &rd, 1), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "x", 1), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(phase_of(w, id), KS_PHASE_PLANNED);
}

/* A newer schema is refused by the rollout store and by the row store. */
static void test_schema_newer_refused(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE keyshift_meta(key TEXT PRIMARY KEY, value);"
                      "INSERT INTO keyshift_meta VALUES('schema_version', 6);");
    assert_int_equal(ks_rollout_db_open(w->path, 0, &w->db, w->err, sizeof w->err),
                     KS_ERR_STORE);
    assert_null(w->db);
    assert_non_null(strstr(w->err, "newer"));
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_ERR_STORE);
    assert_int_equal(open_rowstore(w), KS_ERR_STORE);
    /* a missing file is never created */
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none.sqlite", w->dir);
    assert_int_equal(ks_rollout_db_open(missing, 0, &w->db, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    assert_int_equal(access(missing, F_OK), -1);
}

/* The log refuses UPDATE and DELETE, whoever asks. */
static void test_log_append_only(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout_log"), 1);
    assert_int_not_equal(exec_rc(w->path, "UPDATE keyshift_rollout_log SET actor = 'mallory'"),
                         SQLITE_OK);
    assert_int_not_equal(exec_rc(w->path, "DELETE FROM keyshift_rollout_log"), SQLITE_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout_log WHERE actor "
                                        "= 'alice'"),
                     1);
    ks_rollout_log_entry e[2];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 2, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(e[0].from, 0);
    assert_int_equal(e[0].to, KS_PHASE_PLANNED);
    assert_string_equal(e[0].actor, "alice");
    assert_non_null(strstr(e[0].reason, "plaintext -> payments-kek:2"));
}

/* A note is appended in the current phase, in any phase, and refused
 * without a reason, with an unprintable one, or for an unknown rollout. */
static void test_log_note(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    assert_int_equal(ks_rollout_db_note(w->db, id, "bob", "ticket OPS-7", 1001), KS_OK);
    assert_int_equal(ks_rollout_db_note(w->db, id, "bob", "", 1002), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_note(w->db, id, "bob", NULL, 1002), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_note(w->db, id, "bob", "a\nb", 1002), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_note(w->db, id, "", "why", 1002), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_note(w->db, 99, "bob", "why", 1002), KS_ERR_NO_ROLLOUT);
    ks_rollout_log_entry e[3];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 3, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(e[1].from, KS_PHASE_PLANNED);
    assert_int_equal(e[1].to, KS_PHASE_PLANNED);
    assert_int_equal(e[1].time, 1001);
    assert_int_equal(e[1].automatic, 0);
    assert_string_equal(e[1].actor, "bob");
    assert_string_equal(e[1].reason, "ticket OPS-7");
}

/* ---- start ------------------------------------------------------------------- */

/* start checks the scope through the schema and keeps one open rollout
 * per scope. */
static void test_start_rules(void **state)
{
    world *w = *state;
    open_db(w);
    int64_t id = 0;
    ks_rollout s = spec();
    strcpy(s.table, "nope");
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    s = spec();
    strcpy(s.column, "card\"; DROP TABLE payments; --");
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    assert_non_null(strstr(w->err, "no column"));
    s = spec();
    strcpy(s.column, "id");
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    s = spec();
    strcpy(s.table, "keyshift_rollout");
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    s = spec();
    s.target = plain();
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    s = spec();
    s.source = s.target;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    s = spec();
    s.canary.kind = KS_CANARY_PERCENT;
    s.canary.percent = 101;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    s = spec();
    assert_int_equal(ks_rollout_db_start(w->db, &s, "bad\nactor", 1, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    /* names are matched as SQLite matches them, stored in its spelling */
    strcpy(s.table, "PAYMENTS");
    strcpy(s.column, "Card");
    id = start(w, &s, 1000);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_string_equal(r.table, "payments");
    assert_string_equal(r.column, "card");
    assert_int_equal(r.phase, KS_PHASE_PLANNED);
    assert_int_equal(r.phase_since, 1000);
    assert_true(r.source.is_plaintext);
    assert_true(ks_rollout_class_equal(&r.target, &s.target));
    assert_int_equal(r.min_soak_s, 300);
    assert_int_equal(r.thresholds.window_s, 300);
    assert_true(r.thresholds.max_provider_error_rate == 0.01);
    s = spec();
    assert_int_equal(ks_rollout_db_start(w->db, &s, "bob", 2, &id, w->err, sizeof w->err),
                     KS_ERR_ROLLOUT_EXISTS);
    assert_non_null(strstr(w->err, "planned"));
    assert_int_equal(ks_rollout_db_get(w->db, 999, &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "tenant", &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_rollout_db_latest(w->db, "Payments", "CARD", &r), KS_OK);
}

/* ---- guards (pure) ----------------------------------------------------------- */

/* Facts for a rollout in phase `from` since 1000, spec() otherwise. */
static ks_rollout_facts facts_in(ks_rollout_phase from, int64_t now)
{
    ks_rollout_facts f = good_facts(now);
    f.rollout = spec();
    f.rollout.id = 1;
    f.rollout.phase = from;
    f.rollout.phase_since = 1000;
    f.is_latest = 1;
    return f;
}

/* Expect the guard from f to `to` to give err with why containing needle. */
static void expect_guard(const ks_rollout_facts *f, ks_rollout_phase to, ks_err err,
                         const char *needle)
{
    char why[512];
    assert_int_equal(ks_rollout_guard(f, to, why, sizeof why), err);
    if (needle != NULL && strstr(why, needle) == NULL)
        fail_msg("why \"%s\" lacks \"%s\"", why, needle);
}

/* planned -> read-compat needs the target key present, not disabled or
 * destroyed. */
static void test_guard_read_compat(void **state)
{
    (void)state;
    ks_rollout_facts f = facts_in(KS_PHASE_PLANNED, 1000);
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_OK, NULL);
    f.target_key_state = KS_KEY_DECRYPT_ONLY;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_OK, NULL);
    f.target_key_state = KS_KEY_DISABLED;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_ERR_GUARD, "target key payments-kek:2 is disabled");
    f.target_key_state = KS_KEY_DESTROYED;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_ERR_GUARD, "is destroyed");
    f.target_key_state = KS_ROLLOUT_KEY_MISSING;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_ERR_GUARD, "does not exist");
    f.target_key_state = KS_ROLLOUT_KEY_UNKNOWN;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_ERR_GUARD, "was not checked");
    /* edges that do not exist */
    f = facts_in(KS_PHASE_PLANNED, 1000);
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_STATE, "no transition from planned to backfill");
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_STATE, NULL);
    f = facts_in(KS_PHASE_FINALIZED, 1000);
    expect_guard(&f, KS_PHASE_PLANNED, KS_ERR_STATE, NULL);
    expect_guard(&f, (ks_rollout_phase)9, KS_ERR_INVALID_ARGUMENT, NULL);
}

/* read-compat -> write-upgrade needs every live reader to support the
 * target and the soak to be over. */
static void test_guard_write_upgrade(void **state)
{
    (void)state;
    ks_rollout_reader rs[4] = {
        reader("web-1", 2, "payments-kek:1,payments-kek:2"),
        reader("web-7", 2, "payments-kek:1"),
        reader("web-8", 1, "payments-kek:2"),
        reader("web-9", 2, "other:2,payments-kek:20"),
    };
    rs[0].algorithms = 1u << KS_ALG_XCHACHA20POLY1305;
    ks_rollout_facts f = facts_in(KS_PHASE_READ_COMPAT, 1300);
    f.readers = rs;
    f.n_readers = 4;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_ERR_GUARD,
                 "3 live readers cannot read payments-kek:2 (v2, xchacha20-poly1305): web-7, "
                 "web-8, web-9");
    f.n_readers = 2;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_ERR_GUARD, "1 live reader cannot read");
    f.n_readers = 1;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_OK, NULL);
    rs[0].algorithms = 1u << KS_ALG_AES256GCM;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_ERR_GUARD, "web-1");
    rs[0].algorithms = 1u << KS_ALG_XCHACHA20POLY1305;
    f.now = 1040;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_ERR_GUARD,
                 "read-compat has lasted 40 s of the 300 s minimum soak");
    f.now = 1299;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_ERR_GUARD, "299 s of the 300 s");
    f.now = 1300;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_OK, NULL);
    f.n_readers = 0;
    expect_guard(&f, KS_PHASE_WRITE_UPGRADE, KS_OK, NULL);
    /* a plaintext target does not exist, but plaintext is read by all */
    ks_rollout_class p = plain();
    assert_true(ks_rollout_reader_supports(&rs[1], &p));
}

/* write-upgrade -> backfill needs an OK health verdict. */
static void test_guard_backfill(void **state)
{
    (void)state;
    ks_rollout_facts f = facts_in(KS_PHASE_WRITE_UPGRADE, 2000);
    expect_guard(&f, KS_PHASE_BACKFILL, KS_OK, NULL);
    f.health = KS_HEALTH_TRIPPED;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "tripped a threshold");
    f.health = KS_HEALTH_INSUFFICIENT;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "too few samples (fewer than 1000)");
    f.health_known = 0;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "not evaluated");
    /* rolling back is always allowed */
    f.health = KS_HEALTH_TRIPPED;
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_OK, NULL);
}

/* backfill -> finalized needs no source rows and a verify pass since
 * backfill began. */
static void test_guard_finalize(void **state)
{
    (void)state;
    ks_rollout_facts f = facts_in(KS_PHASE_BACKFILL, 5000);
    f.rollout.verified_at = 4000;
    expect_guard(&f, KS_PHASE_FINALIZED, KS_OK, NULL);
    f.rows_at_source = 1204;
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_GUARD, "1,204 rows are still at the source");
    f.rows_at_source = 1;
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_GUARD, "1 row is still at the source");
    f.rows_at_source = 0;
    f.census_known = 0;
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_GUARD, "census of payments.card was not computed");
    f.census_known = 1;
    f.rollout.verified_at = 999; /* before backfill began */
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_GUARD, "no `migrate verify` pass");
    f.rollout.verified_at = 0;
    expect_guard(&f, KS_PHASE_FINALIZED, KS_ERR_GUARD, "no `migrate verify` pass");
    expect_guard(&f, KS_PHASE_READ_COMPAT, KS_OK, NULL);
}

/* Rollbacks: to planned only without target rows; out of finalized only
 * for the latest rollout while the source key lives. */
static void test_guard_rollbacks(void **state)
{
    (void)state;
    ks_rollout_facts f = facts_in(KS_PHASE_READ_COMPAT, 5000);
    f.rows_at_target = 35;
    expect_guard(&f, KS_PHASE_PLANNED, KS_ERR_GUARD,
                 "rolling back to planned would make 35 rows unreadable");
    f.rows_at_target = 1;
    expect_guard(&f, KS_PHASE_PLANNED, KS_ERR_GUARD, "would make 1 row unreadable");
    f.census_known = 0;
    expect_guard(&f, KS_PHASE_PLANNED, KS_ERR_GUARD, "not computed");
    f.census_known = 1;
    f.rows_at_target = 0;
    expect_guard(&f, KS_PHASE_PLANNED, KS_OK, NULL);

    f = facts_in(KS_PHASE_FINALIZED, 5000);
    expect_guard(&f, KS_PHASE_BACKFILL, KS_OK, NULL); /* plaintext source */
    f.rollout.source = cls(1, KS_ALG_AES256GCM, "payments-kek", 1);
    f.source_key_state = KS_KEY_DISABLED;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_OK, NULL);
    f.source_key_state = KS_KEY_DESTROYED;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "source key payments-kek:1 was destroyed");
    f.source_key_state = KS_ROLLOUT_KEY_UNKNOWN;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "is unknown");
    f.source_key_state = KS_KEY_ACTIVE;
    f.is_latest = 0;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD, "a later rollout governs payments.card");
    /* an instance started after finalize with the target key alone would
     * not read the source that backfill (and its step back to read-compat,
     * which writes it) brings back */
    f.is_latest = 1;
    ks_rollout_reader rd[2] = {reader("web-old", 2, "payments-kek:1,payments-kek:2"),
                               reader("web-new", 2, "payments-kek:2")};
    f.readers = rd;
    f.n_readers = 2;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_ERR_GUARD,
                 "1 live reader cannot read payments-kek:1 (v1, aes-256-gcm): web-new");
    f.n_readers = 1;
    expect_guard(&f, KS_PHASE_BACKFILL, KS_OK, NULL);
}

/* Abort: planned always; read-compat only while no row is at the
 * target; never once the target may have been written. */
static void test_guard_abort(void **state)
{
    (void)state;
    char why[512];
    ks_rollout_facts f = facts_in(KS_PHASE_PLANNED, 5000);
    f.census_known = 0;
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_OK);
    f = facts_in(KS_PHASE_READ_COMPAT, 5000);
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_OK);
    f.rows_at_target = 1204;
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_GUARD);
    assert_non_null(strstr(why, "aborting would make 1,204 rows unreadable"));
    f.rows_at_target = 0;
    f.census_known = 0;
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_GUARD);
    assert_non_null(strstr(why, "census of payments.card was not computed"));
    f = facts_in(KS_PHASE_WRITE_UPGRADE, 5000);
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_STATE);
    assert_non_null(strstr(why, "roll it back to read-compat first"));
    f = facts_in(KS_PHASE_BACKFILL, 5000);
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_STATE);
    f = facts_in(KS_PHASE_FINALIZED, 5000);
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_STATE);
    assert_non_null(strstr(why, "finalized"));
    f.rollout.phase = (ks_rollout_phase)9;
    assert_int_equal(ks_rollout_abort_guard(&f, why, sizeof why), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_abort_guard(NULL, why, sizeof why), KS_ERR_INVALID_ARGUMENT);
}

/* Canonical key lists: exactly one spelling is accepted. */
static void test_keys_strict(void **state)
{
    (void)state;
    static const char *const good[] = {"", "k:1", "a:1,a:2,b:1", "a:b:7", "k:4294967295",
                                       "a:2,a:10", "a:9,ab:1"};
    static const char *const bad[] = {"k", "k:", ":1", "k:0", "k:01", "k:4294967296", "k:1,",
                                      ",k:1", "k:2,k:1", "k:1,k:1", "b:1,a:1", "k :1", "k:1 ",
                                      "k\n:1", "k:1,,k:2", "a:10,a:9", "k:-1", "k:99999999999"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (ks_rollout_keys_check(good[i]) != KS_OK)
            fail_msg("refused \"%s\"", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (ks_rollout_keys_check(bad[i]) != KS_ERR_BAD_VALUE)
            fail_msg("accepted \"%s\"", bad[i]);
    assert_true(ks_rollout_keys_holds("a:b:7,k:1", "a:b", 7));
    assert_false(ks_rollout_keys_holds("a:b:7,k:1", "a", 7));
    assert_false(ks_rollout_keys_holds("k:2,k:1", "k", 1)); /* not canonical */
    char big[KS_READER_KEYS_MAX + 8];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(ks_rollout_keys_check(big), KS_ERR_BAD_VALUE);
    assert_int_equal(ks_rollout_keys_check(NULL), KS_ERR_INVALID_ARGUMENT);
    /* building a list in any order gives the one canonical spelling */
    char list[64] = "";
    static const struct {
        const char *id;
        uint32_t v;
    } adds[] = {{"b", 1}, {"a", 10}, {"a:b", 7}, {"a", 9}, {"a", 10}};
    for (size_t i = 0; i < sizeof adds / sizeof adds[0]; i++)
        assert_int_equal(ks_rollout_keys_add(list, sizeof list, adds[i].id, adds[i].v), KS_OK);
    assert_string_equal(list, "a:9,a:10,a:b:7,b:1");
    assert_int_equal(ks_rollout_keys_check(list), KS_OK);
    assert_int_equal(ks_rollout_keys_add(list, 20, "c", 1), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_rollout_keys_add(list, sizeof list, "c d", 1), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_keys_add(list, sizeof list, "c", 0), KS_ERR_INVALID_ARGUMENT);
    assert_string_equal(list, "a:9,a:10,a:b:7,b:1");
    char unsorted[16] = "b:1,a:1";
    assert_int_equal(ks_rollout_keys_add(unsorted, sizeof unsorted, "c", 1), KS_ERR_BAD_VALUE);
    char one[8] = "";
    assert_int_equal(ks_rollout_keys_add(one, sizeof one, "k", 2), KS_OK);
    assert_string_equal(one, "k:2");
    assert_string_equal(ks_rollout_phase_name(KS_PHASE_WRITE_UPGRADE), "write-upgrade");
    assert_int_equal(ks_rollout_phase_from_name("read-compat"), KS_PHASE_READ_COMPAT);
    assert_int_equal(ks_rollout_phase_from_name("Read-Compat"), 0);
    assert_null(ks_rollout_phase_name(0));
}

/* ---- transitions through the store ------------------------------------------ */

/* The whole lifecycle through the store, with its log, and the store's
 * own facts (phase, readers, verify) taking part. */
static void test_lifecycle(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    ks_rollout_facts f = good_facts(1010);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_int_equal(phase_of(w, id), KS_PHASE_READ_COMPAT);
    f.now = 1100;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "90 s of the 300 s"));
    f.now = 1310;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, &f), KS_OK);
    /* a verify before finalizing; only in backfill */
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", 1400), KS_OK);
    f.rows_at_source = 3;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "3 rows are still at the source"));
    f.rows_at_source = 0;
    f.now = 1500;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_OK);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", 1501), KS_ERR_STATE);
    /* back to backfill clears the verify pass */
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_BACKFILL, &f), KS_OK);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.verified_at, 0);
    assert_int_equal(r.phase_since, 1500);
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    /* an unknown rollout, a stale "from" */
    assert_int_equal(move(w, 77, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_NO_ROLLOUT);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_ERR_STALE);
    /* the log, read in pages of 3: start + 5 transitions + verify */
    ks_rollout_log_entry e[3];
    size_t n = 0, total = 0;
    int64_t after = 0;
    int last_to = 0;
    do {
        assert_int_equal(ks_rollout_db_log(w->db, id, after, e, 3, &n), KS_OK);
        for (size_t i = 0; i < n; i++) {
            assert_true(e[i].id > after);
            after = e[i].id;
            last_to = e[i].to;
        }
        total += n;
    } while (n == 3);
    assert_int_equal(total, 7);
    assert_int_equal(last_to, KS_PHASE_BACKFILL);
    /* once finalized, a new rollout of the scope may start, and then the
     * old one may no longer leave finalized */
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_READ_COMPAT, &f), KS_OK);
    f.now = 1800;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, &f), KS_OK);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", 1800), KS_OK);
    f.now = 1900;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_OK);
    s = spec();
    s.source = s.target;
    s.target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 3);
    int64_t id2 = start(w, &s, 2000);
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_BACKFILL, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "a later rollout"));
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &r), KS_OK);
    assert_int_equal(r.id, id2);
    ks_rollout list[4];
    assert_int_equal(ks_rollout_db_list(w->db, 0, list, 4, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ks_rollout_db_list(w->db, id, list, 4, &n), KS_OK);
    assert_int_equal(n, 1);
}

/* Both racers read "planned"; exactly one advances. */
typedef struct racer {
    const char *path;
    int64_t id;
    ks_err result;
} racer;

/* Thread body: open an own handle and try planned -> read-compat. */
static void *race(void *arg)
{
    racer *r = arg;
    ks_rollout_db *db = NULL;
    if (ks_rollout_db_open(r->path, 0, &db, NULL, 0) != KS_OK) {
        r->result = KS_ERR_IO;
        return NULL;
    }
    ks_rollout_facts f = good_facts(2000);
    ks_rollout_change c = {r->id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, "racer", NULL, 0};
    char why[256];
    r->result = ks_rollout_db_transition(db, &c, &f, why, sizeof why);
    ks_rollout_db_close(db);
    return NULL;
}

/* Two handles racing the same transition: one wins, the other is told
 * the rollout moved; one log row. */
static void test_race(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    for (int round = 0; round < 4; round++) {
        racer a = {w->path, id, KS_OK}, b = {w->path, id, KS_OK};
        pthread_t ta, tb;
        assert_int_equal(pthread_create(&ta, NULL, race, &a), 0);
        assert_int_equal(pthread_create(&tb, NULL, race, &b), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        assert_true((a.result == KS_OK && b.result == KS_ERR_STALE) ||
                    (a.result == KS_ERR_STALE && b.result == KS_OK));
        assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout_log WHERE "
                                            "to_phase = 'read-compat'"),
                         round + 1);
        ks_rollout_facts f = good_facts(2001);
        assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_PLANNED, &f), KS_OK);
    }
}

/* Readers expire after the TTL; an old reader blocks write-upgrade until
 * then. */
static void test_reader_ttl(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout_reader old = reader("web-7", 2, "payments-kek:1");
    ks_rollout_reader now = reader("web-1", 2, "payments-kek:1,payments-kek:2");
    assert_int_equal(ks_rollout_db_reader_register(w->db, &old, 1000), KS_OK);
    assert_int_equal(ks_rollout_db_reader_register(w->db, &now, 1000), KS_OK);
    ks_rollout_reader got[2];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1030, got, 2, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(got[0].instance_id, "web-1");
    assert_string_equal(got[1].keys, "payments-kek:1");
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1030, got, 1, &n),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 2);
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1031, got, 2, &n), KS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ks_rollout_db_reader_heartbeat(w->db, "web-1", 1100), KS_OK);
    assert_int_equal(ks_rollout_db_reader_heartbeat(w->db, "web-2", 1100), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1110, got, 2, &n), KS_OK);
    assert_int_equal(n, 1);

    ks_rollout s = spec();
    s.min_soak_s = 0;
    int64_t id = start(w, &s, 1100);
    ks_rollout_facts f = good_facts(1100);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_int_equal(ks_rollout_db_reader_heartbeat(w->db, "web-7", 1100), KS_OK);
    f.now = 1120;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "1 live reader cannot read payments-kek:2"));
    assert_non_null(strstr(w->err, "web-7"));
    f.now = 1131; /* web-7's heartbeat is now 31 s old */
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "web-7"), KS_OK);
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "web-7"), KS_OK);
    assert_int_equal(ks_rollout_db_readers_live(w->db, 1000000, 1131, got, 2, &n), KS_OK);
    assert_int_equal(n, 1);
    /* bad registrations */
    ks_rollout_reader bad = reader("web 3", 2, "");
    assert_int_equal(ks_rollout_db_reader_register(w->db, &bad, 1), KS_ERR_INVALID_ARGUMENT);
    bad = reader("web-3", 2, "k:2,k:1");
    assert_int_equal(ks_rollout_db_reader_register(w->db, &bad, 1), KS_ERR_INVALID_ARGUMENT);
}

/* ---- strict reading of stored values ---------------------------------------- */

/* A stored key list that is not canonical, or a malformed reader row,
 * is refused when read back. */
static void test_corrupt_readers(void **state)
{
    world *w = *state;
    open_db(w);
    static const char *const rows[] = {
        "('a', 'v', 2, 6, 'k:2,k:1', 1, 1)", "('a', 'v', 2, 6, 'k:01', 1, 1)",
        "('a', 'v', 2, 6, 'k:1,', 1, 1)",    "('a', 'v', 2, 6, X'6B3A31', 1, 1)",
        "('a b', 'v', 2, 6, 'k:1', 1, 1)",   "('a', 'v', 0, 6, 'k:1', 1, 1)",
        "('a', 'v', 2, -1, 'k:1', 1, 1)",    "('a', 'v', 2, 6, 4, 1, 1)",
        "('a', 'v', 2, 6, 'k:1', 'x', 1)",   "('a', 'v' || char(10), 2, 6, 'k:1', 1, 1)",
    };
    ks_rollout_reader got[2];
    size_t n = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char sql[256];
        snprintf(sql, sizeof sql,
                 "DELETE FROM keyshift_readers; INSERT INTO keyshift_readers VALUES%s;", rows[i]);
        exec_sql(w->path, sql);
        if (ks_rollout_db_readers_live(w->db, 10, 1, got, 2, &n) != KS_ERR_STORE)
            fail_msg("accepted reader row %s", rows[i]);
    }
    exec_sql(w->path, "DELETE FROM keyshift_readers; INSERT INTO keyshift_readers VALUES('a', "
                      "'v', 2, 6, 'k:1', 1, 1);");
    assert_int_equal(ks_rollout_db_readers_live(w->db, 10, 1, got, 2, &n), KS_OK);
    assert_int_equal(n, 1);
}

/* A rollout row edited into nonsense is refused, never trusted. */
static void test_corrupt_rollout(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    static const char *const edits[] = {
        "phase = 'bogus'", "dst_key_id = 'bad key'", "dst_format = 3", "src_plaintext = 2",
        "canary_kind = 'tenants', canary_tenants = 'a,,b'", "canary_kind = 'x'",
        "canary_kind = 'percent', canary_percent = 101", "reader_ttl_s = 0",
        "canary_tenants = 'a'", "tbl = X'00'", "dst_key_version = 0", "window_s = 'x'",
        "max_auth_failure_rate = 'abc'", "src_plaintext = 0",
    };
    ks_rollout r;
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char sql[256];
        snprintf(sql, sizeof sql, "UPDATE keyshift_rollout SET %s;", edits[i]);
        exec_sql(w->path, "CREATE TABLE IF NOT EXISTS bk AS SELECT * FROM keyshift_rollout;");
        exec_sql(w->path, sql);
        if (ks_rollout_db_get(w->db, id, &r) != KS_ERR_STORE)
            fail_msg("accepted a rollout with %s", edits[i]);
        exec_sql(w->path, "DELETE FROM keyshift_rollout; INSERT INTO keyshift_rollout SELECT * "
                          "FROM bk; DROP TABLE bk;");
        assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    }
}

/* A sample: n seals, n opens, one auth failure, latencies in bucket b. */
static ks_health_sample sample(int64_t time, uint64_t n, size_t b)
{
    ks_health_sample s;
    memset(&s, 0, sizeof s);
    s.time = time;
    s.seals = n;
    s.opens = n;
    s.auth_failures = 1;
    s.provider_calls = 2;
    s.seal_ns.bucket[b] = n;
    s.open_ns.bucket[b] = n;
    s.seal_ns_sum = n * ks_histogram_bucket_bound(b > 0 ? b - 1 : 0);
    s.open_ns_sum = s.seal_ns_sum + 1;
    return s;
}

/* Samples are summed over the window; stored histograms must be BLOBs of
 * the exact length, counters and latency sums non-negative integers. */
static void test_metrics(void **state)
{
    world *w = *state;
    open_db(w);
    ks_health_sample a = sample(100, 10, 3), b = sample(200, 5, 23), sum;
    b.seal_ns.bucket[0] = UINT64_MAX;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &a), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "migrate-1", "migrate", &b), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 2, "web-1", "app", &a), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "cli", &a),
                     KS_ERR_INVALID_ARGUMENT);
    ks_health_sample huge = a;
    huge.opens = UINT64_MAX;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &huge),
                     KS_ERR_INVALID_ARGUMENT);
    huge = a;
    huge.open_ns_sum = (uint64_t)INT64_MAX + 1;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &huge),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_int_equal(sum.time, 200);
    assert_int_equal(sum.seals, 15);
    assert_int_equal(sum.auth_failures, 2);
    assert_int_equal(sum.provider_calls, 4);
    assert_int_equal(sum.seal_ns.bucket[3], 10);
    assert_int_equal(sum.seal_ns.bucket[23], 5);
    assert_true(sum.seal_ns.bucket[0] == UINT64_MAX);
    assert_true(sum.seal_ns_sum == a.seal_ns_sum + b.seal_ns_sum);
    assert_true(sum.open_ns_sum == a.open_ns_sum + b.open_ns_sum);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 150, &sum), KS_OK);
    assert_int_equal(sum.opens, 5);
    assert_true(sum.open_ns_sum == b.open_ns_sum);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 201, &sum), KS_OK);
    assert_int_equal(sum.opens, 0);
    assert_int_equal(sum.time, 0);
    /* saturation across rows */
    exec_sql(w->path, "UPDATE keyshift_metrics SET seals = 9223372036854775807");
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_true(sum.seals == (uint64_t)INT64_MAX * 2);
    static const char *const corrupt[] = {
        "seal_ns = substr(seal_ns, 1, 191)", "open_ns = seal_ns || X'00'",
        "seal_ns = 'text'",                  "opens = -1",
        "auth_failures = 1.5",               "seal_ns = NULL",
        "open_ns = zeroblob(0)",             "time = 'soon'",
        "seal_ns_sum = -1",                  "open_ns_sum = 2.5",
        "open_ns_sum = NULL",                "seal_ns_sum = X'07'",
    };
    for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
        char sql[256];
        snprintf(sql, sizeof sql,
                 "CREATE TABLE bk AS SELECT * FROM keyshift_metrics; "
                 "UPDATE keyshift_metrics SET %s WHERE rollout_id = 1 AND time = 200;",
                 corrupt[i]);
        int rc = exec_rc(w->path, sql);
        if (rc == SQLITE_OK) {
            if (ks_rollout_db_metrics_sum(w->db, 1, 0, &sum) != KS_ERR_STORE)
                fail_msg("accepted metrics with %s", corrupt[i]);
            assert_int_equal(sum.seals, 0);
        }
        exec_sql(w->path, "DELETE FROM keyshift_metrics; INSERT INTO keyshift_metrics SELECT * "
                          "FROM bk; DROP TABLE bk;");
    }
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
}

/* The sums of one source: the applications' health without the
 * migration's figures, and the migration's own. */
static void test_metrics_by_source(void **state)
{
    world *w = *state;
    open_db(w);
    ks_health_sample a = sample(100, 10, 3), b = sample(200, 5, 23), sum;
    b.auth_failures = 1980;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &a), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "migrate-1", "migrate", &b), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, "app", &sum), KS_OK);
    assert_int_equal(sum.seals, 10);
    assert_int_equal(sum.auth_failures, a.auth_failures);
    assert_int_equal(sum.time, 100);
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, "migrate", &sum), KS_OK);
    assert_int_equal(sum.seals, 5);
    assert_int_equal(sum.auth_failures, 1980);
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, NULL, &sum), KS_OK);
    assert_int_equal(sum.seals, 15);
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, "cli", &sum),
                     KS_ERR_INVALID_ARGUMENT);
}

/* ---- abort and settings ------------------------------------------------------ */

/* A rollout started with a target that does not exist is stuck in
 * planned: abort removes it (logged with actor and reason; the log stays)
 * and frees the scope for a new start; a stale, unguarded or badly
 * argued abort changes nothing. */
static void test_abort(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec(), r;
    s.target.key_version = 9; /* the typo */
    int64_t id = start(w, &s, 1000);
    ks_rollout_facts f = good_facts(1010);
    f.census_known = 0;
    f.target_key_state = KS_ROLLOUT_KEY_MISSING;
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_ERR_GUARD);
    /* a new start is refused while it is open */
    ks_rollout good = spec();
    int64_t other = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &good, "alice", 1020, &other, w->err,
                                         sizeof w->err),
                     KS_ERR_ROLLOUT_EXISTS);
    /* bad arguments and a stale phase */
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "bob", "", w->err,
                                         sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "bob", NULL, w->err,
                                         sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "", "typo", w->err,
                                         sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_READ_COMPAT, &f, "bob", "typo",
                                         w->err, sizeof w->err),
                     KS_ERR_STALE);
    assert_int_equal(ks_rollout_db_abort(w->db, 99, KS_PHASE_PLANNED, &f, "bob", "typo", w->err,
                                         sizeof w->err),
                     KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    /* the abort */
    f.now = 1030;
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "bob",
                                         "target version 9 is a typo", w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &r), KS_ERR_NO_ROLLOUT);
    ks_rollout_log_entry e[4];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_string_equal(e[1].actor, "bob");
    assert_int_equal(e[1].from, KS_PHASE_PLANNED);
    assert_int_equal(e[1].to, KS_PHASE_PLANNED);
    assert_int_equal(e[1].time, 1030);
    assert_non_null(strstr(e[1].reason, "plaintext to payments-kek:9"));
    assert_string_equal(e[2].reason, "aborted: target version 9 is a typo");
    assert_string_equal(e[2].actor, "bob");
    /* the scope is free; the new rollout has a new id */
    int64_t id2 = start(w, &good, 1040);
    assert_true(id2 > id);
    /* abort refused once the target may have been written */
    f = good_facts(1050);
    assert_int_equal(move(w, id2, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    f.now = 1400;
    assert_int_equal(move(w, id2, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(ks_rollout_db_abort(w->db, id2, KS_PHASE_WRITE_UPGRADE, &f, "bob", "no",
                                         w->err, sizeof w->err),
                     KS_ERR_STATE);
    assert_non_null(strstr(w->err, "roll it back to read-compat first"));
    assert_int_equal(move(w, id2, KS_PHASE_WRITE_UPGRADE, KS_PHASE_READ_COMPAT, &f), KS_OK);
    f.rows_at_target = 12;
    assert_int_equal(ks_rollout_db_abort(w->db, id2, KS_PHASE_READ_COMPAT, &f, "bob", "no",
                                         w->err, sizeof w->err),
                     KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "aborting would make 12 rows unreadable"));
    assert_int_equal(phase_of(w, id2), KS_PHASE_READ_COMPAT);
    /* after a rollback that left no row at the target */
    f.rows_at_target = 0;
    assert_int_equal(ks_rollout_db_abort(w->db, id2, KS_PHASE_READ_COMPAT, &f, "bob",
                                         "canary showed nothing", w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id2, &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout"), 0);
}

/* Thresholds and soak times of a live rollout can be changed, each change
 * logged with its old and new value; a finalized rollout's cannot, nor
 * can values start would refuse be set. */
static void test_set_settings(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec(), r;
    int64_t id = start(w, &s, 1000);
    ks_thresholds t = s.thresholds;
    char changes[512];
    t.min_samples = 10;
    t.max_open_p99_us = 0;
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, 60, 30, "bob", "app reports few",
                                                1100, changes, sizeof changes),
                     KS_OK);
    assert_string_equal(changes, "max_open_p99_us 10000 -> 0, min_samples 1000 -> 10, "
                                 "min_soak_s 300 -> 60");
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.thresholds.min_samples, 10);
    assert_int_equal(r.thresholds.max_open_p99_us, 0);
    assert_int_equal(r.min_soak_s, 60);
    assert_int_equal(r.reader_ttl_s, 30);
    assert_int_equal(r.updated, 1100);
    ks_rollout_log_entry e[4];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_string_equal(e[1].reason, "set: max_open_p99_us 10000 -> 0, min_samples 1000 -> 10, "
                                     "min_soak_s 300 -> 60");
    assert_string_equal(e[1].actor, "bob");
    assert_string_equal(e[2].reason, "app reports few");
    /* nothing changes: nothing is written */
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, 60, 30, "bob", "again", 1200,
                                                changes, sizeof changes),
                     KS_OK);
    assert_string_equal(changes, "");
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 3);
    /* a rate's change is exact */
    t.max_auth_failure_rate = 0.25;
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, 60, 45, "bob", NULL, 1300, changes,
                                                sizeof changes),
                     KS_OK);
    assert_string_equal(changes, "max_auth_failure_rate 0.001 -> 0.25, reader_ttl_s 30 -> 45");
    /* refused values */
    ks_thresholds bad = t;
    bad.window_s = 0;
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &bad, 60, 45, "bob", NULL, 1300, NULL,
                                                0),
                     KS_ERR_INVALID_ARGUMENT);
    bad = t;
    bad.max_parse_error_rate = NAN;
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &bad, 60, 45, "bob", NULL, 1300, NULL,
                                                0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, 60, 0, "bob", NULL, 1300, NULL, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_set_settings(w->db, 99, &t, 60, 45, "bob", NULL, 1300, NULL,
                                                0),
                     KS_ERR_NO_ROLLOUT);
    /* finalized: refused */
    exec_sql(w->path, "UPDATE keyshift_rollout SET phase = 'finalized'");
    t.min_samples = 5;
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, 60, 45, "bob", NULL, 1400, NULL,
                                                0),
                     KS_ERR_STATE);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.thresholds.min_samples, 10);
}

/* ---- the application policy -------------------------------------------------- */

/* Encode an envelope of class c (tenant "t1") into buf; returns its
 * length. */
static size_t envelope(const ks_rollout_class *c, uint8_t *buf, size_t cap)
{
    static const uint8_t wrapped[72], nonce[24], commitment[32], ct[20];
    ks_envelope e;
    memset(&e, 0, sizeof e);
    e.version = c->version;
    e.algorithm = c->algorithm;
    e.tenant = (ks_bytes){(const uint8_t *)"t1", 2};
    e.key_id = (ks_bytes){(const uint8_t *)c->key_id, strlen(c->key_id)};
    e.key_version = c->key_version;
    e.wrapped_dek = (ks_bytes){wrapped, sizeof wrapped};
    e.nonce = (ks_bytes){nonce, ks_alg_nonce_len(c->algorithm)};
    if (c->version == KS_FORMAT_V2) {
        e.purpose = (ks_bytes){(const uint8_t *)"card", 4};
        e.commitment = (ks_bytes){commitment, sizeof commitment};
    }
    e.ciphertext = (ks_bytes){ct, sizeof ct};
    size_t len = 0;
    assert_int_equal(ks_envelope_encode(&e, NULL, buf, cap, &len), KS_OK);
    return len;
}

/* Open a policy on w with refresh_ms; heartbeat off. */
static ks_policy *policy(world *w, uint32_t refresh_ms, const char *instance)
{
    ks_policy_options o = {instance, 2,
                           (1u << KS_ALG_AES256GCM) | (1u << KS_ALG_XCHACHA20POLY1305),
                           "payments-kek:1,payments-kek:2", refresh_ms, 0};
    ks_policy *p = NULL;
    assert_int_equal(ks_policy_open(w->path, &o, &p), KS_OK);
    return p;
}

/* May p read value (NULL: SQL NULL) of payments.card? */
static int may(ks_policy *p, const uint8_t *v, size_t len)
{
    int ok = -1;
    ks_bytes b = {v, len};
    assert_int_equal(ks_policy_may_read(p, "payments", "card", v != NULL ? &b : NULL, &ok), KS_OK);
    assert_true(ok == 0 || ok == 1);
    return ok;
}

/* Does p write the target of spec() for tenant (else the source)? */
static int writes_target(ks_policy *p, const char *tenant)
{
    ks_rollout_class c;
    ks_rollout s = spec();
    ks_bytes t = {(const uint8_t *)tenant, strlen(tenant)};
    assert_int_equal(ks_policy_write_target(p, "payments", "card", t, &c), KS_OK);
    return ks_rollout_class_equal(&c, &s.target);
}

/* Each phase answers per the phase table of docs/rollout.md; a second connection's
 * change is seen after a refresh, not before. */
static void test_policy_phases(void **state)
{
    world *w = *state;
    open_db(w);
    ks_policy *p = policy(w, 3600000, "app-1");
    ks_rollout_class out;
    int ok = 1;
    assert_int_equal(ks_policy_write_target(p, "payments", "card", (ks_bytes){NULL, 0}, &out),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(ks_policy_may_read(p, "payments", "card", NULL, &ok), KS_ERR_NOT_FOUND);
    assert_int_equal(ok, 0);

    ks_rollout s = spec();
    s.source = cls(1, KS_ALG_AES256GCM, "payments-kek", 1);
    int64_t id = start(w, &s, 1000);
    uint8_t src[512], dst[512], other[512], bad[512];
    size_t src_len = envelope(&s.source, src, sizeof src);
    size_t dst_len = envelope(&s.target, dst, sizeof dst);
    ks_rollout_class o = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 3);
    size_t other_len = envelope(&o, other, sizeof other);
    memcpy(bad, dst, dst_len);
    bad[4] ^= 0x80; /* the algorithm's tag: malformed header */
    static const uint8_t text[] = "4111 1111 1111 1111";

    /* not refreshed yet: the policy still knows no rollout */
    assert_int_equal(ks_policy_write_target(p, "payments", "card", (ks_bytes){NULL, 0}, &out),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    /* planned: source only */
    assert_false(writes_target(p, "t1"));
    assert_true(may(p, src, src_len));
    assert_false(may(p, dst, dst_len));
    assert_false(may(p, text, sizeof text - 1));
    assert_true(may(p, NULL, 0));
    /* read-compat: write the source, read both */
    ks_rollout_facts f = good_facts(2000);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_false(may(p, dst, dst_len)); /* not seen before the refresh */
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_false(writes_target(p, "t1"));
    assert_true(may(p, src, src_len));
    assert_true(may(p, dst, dst_len));
    assert_false(may(p, other, other_len));
    assert_false(may(p, bad, dst_len));
    assert_false(may(p, dst, 3)); /* "KSE" alone: truncated */
    assert_false(may(p, text, sizeof text - 1));
    /* write-upgrade (canary all): the target */
    f.now = 3000;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_true(writes_target(p, "t1"));
    assert_true(writes_target(p, ""));
    assert_true(may(p, src, src_len));
    assert_true(may(p, dst, dst_len));
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, &f), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_true(writes_target(p, "t9"));
    assert_true(may(p, src, src_len));
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", 3001), KS_OK);
    f.now = 3002;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_true(writes_target(p, "t1"));
    assert_false(may(p, src, src_len));
    assert_true(may(p, dst, dst_len));
    assert_true(may(p, NULL, 0));
    assert_int_equal(ks_policy_write_target(p, "PAYMENTS", "CARD", (ks_bytes){NULL, 0}, &out),
                     KS_OK);
    assert_int_equal(ks_policy_write_target(p, "payments", "tenant", (ks_bytes){NULL, 0}, &out),
                     KS_ERR_NOT_FOUND);
    ks_policy_close(p);
}

/* A tenant-list canary writes the target only for the listed tenants; a
 * percent canary by the documented hash, stable across handles and close
 * to the fraction over 10,000 tenants. */
static void test_policy_canary(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    s.canary.kind = KS_CANARY_TENANTS;
    s.canary.n_tenants = 2;
    strcpy(s.canary.tenants[0], "acme");
    strcpy(s.canary.tenants[1], "globex");
    int64_t id = start(w, &s, 1000);
    ks_rollout_facts f = good_facts(2000);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_ERR_GUARD);
    f.now = 2300;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    ks_policy *p = policy(w, 0, "app-1");
    assert_true(writes_target(p, "acme"));
    assert_true(writes_target(p, "globex"));
    assert_false(writes_target(p, "acme2"));
    assert_false(writes_target(p, "Acme"));
    assert_false(writes_target(p, ""));
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.canary.n_tenants, 2);
    assert_string_equal(r.canary.tenants[1], "globex");

    /* percent: 30 % */
    ks_rollout_canary c;
    memset(&c, 0, sizeof c);
    c.kind = KS_CANARY_PERCENT;
    c.percent = 30;
    assert_int_equal(ks_rollout_db_set_canary(w->db, id, &c, "alice", 2400), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    ks_policy *q = policy(w, 0, "app-2");
    int in = 0;
    for (int i = 0; i < 10000; i++) {
        char t[32];
        snprintf(t, sizeof t, "tenant-%d", i);
        int a = writes_target(p, t);
        assert_int_equal(a, writes_target(q, t));
        in += a;
    }
    assert_true(in > 2800 && in < 3200);
    /* the documented formula, computed independently */
    uint8_t msg[15 + 8 + 4], h[32];
    memcpy(msg, "keyshift-canary", 15);
    for (int i = 0; i < 8; i++)
        msg[15 + i] = (uint8_t)((uint64_t)id >> (56 - 8 * i));
    memcpy(msg + 23, "acme", 4);
    assert_int_equal(crypto_generichash(h, sizeof h, msg, sizeof msg, NULL, 0), 0);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | h[i];
    assert_int_equal(ks_rollout_canary_bucket(id, (ks_bytes){(const uint8_t *)"acme", 4}),
                     v % 10000);
    /* 0 % and 100 % */
    c.percent = 0;
    assert_int_equal(ks_rollout_db_set_canary(w->db, id, &c, "alice", 2500), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_false(writes_target(p, "tenant-1"));
    c.percent = 100;
    assert_int_equal(ks_rollout_db_set_canary(w->db, id, &c, "alice", 2600), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_true(writes_target(p, "tenant-1"));
    assert_false(writes_target(p, "")); /* no tenant: never a percent canary */
    /* the canary change is logged, not a transition */
    ks_rollout_log_entry e[8];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 8, &n), KS_OK);
    assert_int_equal(n, 6);
    assert_int_equal(e[5].from, KS_PHASE_WRITE_UPGRADE);
    assert_int_equal(e[5].to, KS_PHASE_WRITE_UPGRADE);
    assert_string_equal(e[5].reason, "canary: 100%");
    ks_policy_close(q);
    ks_policy_close(p);
}

/* Open a policy on w with options o, which must succeed. */
static ks_policy *registered(world *w, const ks_policy_options *o)
{
    ks_policy *p = NULL;
    assert_int_equal(ks_policy_open(w->path, o, &p), KS_OK);
    return p;
}

/* The readers registered on w (whatever their heartbeat) into got[0,
 * max); returns their number. */
static size_t live(world *w, ks_rollout_reader *got, size_t max)
{
    size_t n = 0;
    assert_int_equal(ks_rollout_db_readers_live(w->db, 1u << 30, 0, got, max, &n), KS_OK);
    return n;
}

/* A heartbeat on its own thread, and whether it has returned. */
typedef struct hb_call {
    ks_policy *p;
    ks_err err;
    atomic_int done;
} hb_call;

/* Thread body: one ks_policy_heartbeat. */
static void *heartbeat_call(void *arg)
{
    hb_call *c = arg;
    c->err = ks_policy_heartbeat(c->p);
    atomic_store(&c->done, 1);
    return NULL;
}

/* A heartbeat waiting for the write lock (held by another connection)
 * holds up no answer and no refresh: the instance's writes have a
 * connection of their own.  With one shared connection, the refresh
 * below would wait out the busy timeout. */
static void test_policy_answers_while_heartbeat_waits(void **state)
{
    world *w = *state;
    open_db(w);
    ks_policy_options o = {"app-7", 2, 1u << KS_ALG_XCHACHA20POLY1305, "", 50, 1};
    ks_policy *p = registered(w, &o);
    sqlite3 *lock = NULL;
    assert_int_equal(sqlite3_open_v2(w->path, &lock, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(lock, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    hb_call c = {.p = p};
    atomic_init(&c.done, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, heartbeat_call, &c), 0);
    const struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL); /* the heartbeat is in its busy wait by now */
    ks_rollout_class cl;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ks_policy_refresh(p), KS_OK);
        assert_int_equal(ks_policy_write_target(p, "payments", "card", (ks_bytes){NULL, 0}, &cl),
                         KS_ERR_NOT_FOUND);
    }
    assert_int_equal(atomic_load(&c.done), 0); /* answered while it waited */
    assert_int_equal(sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(c.err, KS_OK);
    assert_int_equal(sqlite3_close(lock), SQLITE_OK);
    ks_policy_close(p);
}

/* What one answering thread of test_policy_answers_during_reloads does
 * and what it saw. */
typedef struct answerer {
    ks_policy *p;
    pthread_barrier_t *start;
    const ks_rollout_class *source, *target;
    const uint8_t *dst;         /* an envelope of the target class */
    size_t dst_len;
    int rounds;
    int bad;                    /* out: an answer that was neither class, or an error */
} answerer;

/* Ask write target, may read and column encoding `rounds` times, each
 * answer checked against the only classes the rollout ever names. */
static void *answer_loop(void *arg)
{
    answerer *a = arg;
    pthread_barrier_wait(a->start);
    ks_bytes b = {a->dst, a->dst_len};
    for (int i = 0; i < a->rounds; i++) {
        ks_rollout_class c;
        ks_value_encoding enc;
        int ok = -1;
        if (ks_policy_write_target(a->p, "payments", "card", (ks_bytes){(const uint8_t *)"t1", 2}, &c) !=
                KS_OK ||
            (!ks_rollout_class_equal(&c, a->source) && !ks_rollout_class_equal(&c, a->target)) ||
            ks_policy_may_read(a->p, "payments", "card", &b, &ok) != KS_OK || (ok != 0 && ok != 1) ||
            ks_policy_column_encoding(a->p, "payments", "card", &enc) != KS_OK ||
            enc != KS_ENCODING_BINARY)
            a->bad++;
        ks_err enc_err = KS_ERR_STORE;
        enc = KS_ENCODING_BASE64;
        if (ks_policy_write_plan(a->p, "payments", "card", NULL, (ks_bytes){(const uint8_t *)"t1", 2}, &c,
                                 &enc, &enc_err) != KS_OK ||
            (!ks_rollout_class_equal(&c, a->source) && !ks_rollout_class_equal(&c, a->target)) ||
            enc_err != KS_OK || enc != KS_ENCODING_BINARY)
            a->bad++;
    }
    return NULL;
}

/* Answers on many threads at once, each on its own read-section flag
 * (more threads than thread indices: some share the last), while the
 * rollout moves through its phases and every commit makes a refresh swap
 * in newly loaded rules: every answer is one of the rollout's classes
 * (TSan checks the sections against the swaps). */
static void test_policy_answers_during_reloads(void **state)
{
    enum { THREADS = 70 };
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    ks_policy *p = policy(w, 1, "app-1"); /* a refresh due every millisecond */
    uint8_t dst[512];
    size_t dst_len = envelope(&s.target, dst, sizeof dst);
    pthread_barrier_t start_line;
    assert_int_equal(pthread_barrier_init(&start_line, NULL, THREADS + 1), 0);
    answerer a[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (answerer){p, &start_line, &s.source, &s.target, dst, dst_len, 200, 0};
        assert_int_equal(pthread_create(&t[i], NULL, answer_loop, &a[i]), 0);
    }
    pthread_barrier_wait(&start_line);
    ks_rollout_facts f = good_facts(2000);
    const ks_rollout_phase path[] = {KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE,
                                     KS_PHASE_BACKFILL};
    for (size_t i = 1; i < sizeof path / sizeof path[0]; i++) {
        f.now = 2000 + (int64_t)i * 1000;
        assert_int_equal(move(w, id, path[i - 1], path[i], &f), KS_OK);
        assert_int_equal(ks_policy_refresh(p), KS_OK);
    }
    for (int i = 0; i < 20; i++) { /* commits that change no rule: reloads all the same */
        ks_rollout_reader r = reader("other", 2, "payments-kek:2");
        assert_int_equal(ks_rollout_db_reader_register(w->db, &r, 5000 + i), KS_OK);
        assert_int_equal(ks_policy_refresh(p), KS_OK);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(a[i].bad, 0);
    }
    assert_int_equal(pthread_barrier_destroy(&start_line), 0);
    assert_true(writes_target(p, "t1")); /* backfill, after a last refresh */
    ks_policy_close(p);
}

/* With heartbeat on, the policy registers its instance with what it
 * supports, refreshes it, and deregisters on close. */
static void test_policy_heartbeat(void **state)
{
    world *w = *state;
    open_db(w);
    ks_policy_options o = {"app-9", 2, 1u << KS_ALG_XCHACHA20POLY1305, "payments-kek:2", 0, 1};
    ks_policy *p = registered(w, &o);
    ks_rollout_reader got[2];
    assert_int_equal(live(w, got, 2), 1);
    assert_string_equal(got[0].instance_id, "app-9");
    assert_string_equal(got[0].keys, "payments-kek:2");
    assert_string_equal(got[0].library_version, ks_version());
    assert_int_equal(got[0].max_format, 2);
    /* removed by an operator: the next heartbeat registers again */
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "app-9"), KS_OK);
    assert_int_equal(ks_policy_heartbeat(p), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_readers"), 1);
    ks_policy_close(p);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_readers"), 0);
    /* bad options */
    o.keys = "payments-kek:2,payments-kek:1";
    assert_int_equal(ks_policy_open(w->path, &o, &p), KS_ERR_INVALID_ARGUMENT);
    o.keys = NULL;
    o.instance_id = "app 9";
    assert_int_equal(ks_policy_open(w->path, &o, &p), KS_ERR_INVALID_ARGUMENT);
    o.instance_id = "app-9";
    o.max_format = 3;
    assert_int_equal(ks_policy_open(w->path, &o, &p), KS_ERR_INVALID_ARGUMENT);
    assert_null(p);
}

/* ks_policy_set_keys replaces the registered key list at once (so a
 * guard sees the new version), refuses a list that is not canonical
 * without touching the registry, and works without a heartbeat. */
static void test_policy_set_keys(void **state)
{
    world *w = *state;
    open_db(w);
    ks_policy_options o = {"app-7", 2, 1u << KS_ALG_XCHACHA20POLY1305, "payments-kek:1", 0, 1};
    ks_policy *p = registered(w, &o);
    ks_rollout s = spec();
    ks_rollout_reader got[2];
    assert_int_equal(live(w, got, 2), 1);
    assert_false(ks_rollout_reader_supports(&got[0], &s.target));

    assert_int_equal(ks_policy_set_keys(p, "payments-kek:1,payments-kek:2"), KS_OK);
    assert_int_equal(live(w, got, 2), 1);
    assert_string_equal(got[0].keys, "payments-kek:1,payments-kek:2");
    assert_true(ks_rollout_reader_supports(&got[0], &s.target));
    assert_int_equal(got[0].max_format, 2);

    /* not canonical, or not a list: refused, the registry unchanged */
    assert_int_equal(ks_policy_set_keys(p, "payments-kek:2,payments-kek:1"),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_set_keys(p, "payments-kek:01"), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_set_keys(p, "payments-kek"), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_set_keys(NULL, ""), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(live(w, got, 2), 1);
    assert_string_equal(got[0].keys, "payments-kek:1,payments-kek:2");

    /* removed by an operator: the heartbeat registers the new list */
    assert_int_equal(ks_policy_set_keys(p, NULL), KS_OK);
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "app-7"), KS_OK);
    assert_int_equal(ks_policy_heartbeat(p), KS_OK);
    assert_int_equal(live(w, got, 2), 1);
    assert_string_equal(got[0].keys, "");
    ks_policy_close(p);

    /* without a heartbeat nothing is registered */
    o.heartbeat = 0;
    p = registered(w, &o);
    assert_int_equal(ks_policy_set_keys(p, "payments-kek:2"), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_readers"), 0);
    ks_policy_close(p);
}

/* ks_policy_report writes the growth of the totals (latency sums too)
 * since the previous report, to rollouts under way only, and no row for
 * an interval that grew nothing; a reset source counts from zero. */
static void test_policy_report(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec();
    int64_t id = start(w, &s, 1000);
    ks_policy *p = policy(w, 0, "app-1");
    ks_health_sample t;
    memset(&t, 0, sizeof t);
    t.seals = 10;
    t.opens = 20;
    t.auth_failures = 1;
    t.open_ns.bucket[3] = 20;
    t.open_ns_sum = 20 * 2000;
    assert_int_equal(ks_policy_report(p, &t), KS_OK); /* planned: nothing written */
    ks_health_sample sum;
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_int_equal(sum.seals + sum.opens, 0);
    ks_rollout_facts f = good_facts(1000);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    t.seals = 15;
    t.opens = 50;
    t.open_ns.bucket[3] = 50;
    t.open_ns_sum = 50 * 2000 + 90;
    assert_int_equal(ks_policy_report(p, &t), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, 5);
    assert_int_equal(sum.opens, 30);
    assert_int_equal(sum.auth_failures, 0);
    assert_int_equal(sum.open_ns.bucket[3], 30);
    assert_int_equal(sum.open_ns_sum, 30 * 2000 + 90);
    assert_int_equal(sum.seal_ns_sum, 0);
    ks_health_sample reset;
    memset(&reset, 0, sizeof reset);
    reset.opens = 4;
    assert_int_equal(ks_policy_report(p, &reset), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_int_equal(sum.opens, 34);
    /* an idle interval (the same totals again) stores no row; the next
     * growth is counted whole */
    long rows = query_int(w->path, "SELECT count(*) FROM keyshift_metrics");
    assert_int_equal(ks_policy_report(p, &reset), KS_OK);
    assert_int_equal(ks_policy_report(p, &reset), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_metrics"), rows);
    reset.seal_ns.bucket[0] = 1; /* a bucket alone is growth */
    assert_int_equal(ks_policy_report(p, &reset), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_metrics"), rows + 1);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_int_equal(sum.opens, 34);
    assert_int_equal(sum.seal_ns.bucket[0], 1);
    assert_int_equal(ks_policy_report(NULL, &t), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_report(p, NULL), KS_ERR_INVALID_ARGUMENT);
    ks_policy_close(p);
}

/* ---- key scopes ------------------------------------------------------------- */

/* A key-scoped spec: every payments-kek envelope of payments.card and
 * orders.card (created here) from key version 1 to 2 (v2,
 * xchacha20-poly1305). */
static ks_rollout key_spec(world *w)
{
    exec_sql(w->path, "CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, card BLOB, "
                      "note TEXT);");
    ks_rollout s = spec();
    s.table[0] = s.column[0] = '\0';
    s.scope = KS_SCOPE_KEY;
    s.source = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 1);
    s.n_columns = 2;
    strcpy(s.columns[0].table, "payments");
    strcpy(s.columns[0].column, "card");
    strcpy(s.columns[1].table, "ORDERS");
    strcpy(s.columns[1].column, "Card");
    return s;
}

/* A key-scoped rollout's listed columns go with it. */
static void test_abort_key_scope(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = key_spec(w);
    int64_t id = start(w, &s, 1000);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout_column"), 2);
    ks_rollout_facts f = good_facts(1010);
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "bob", "wrong key",
                                         w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout_column"), 0);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_latest_key(w->db, "payments-kek", &r), KS_ERR_NO_ROLLOUT);
    start(w, &s, 1020);
}

/* Move rollout id from planned to backfill with favourable facts, the
 * soak counted from now. */
static void to_backfill(world *w, int64_t id, int64_t now)
{
    ks_rollout_facts f = good_facts(now);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    f.now = now + 400;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, &f), KS_OK);
}

/* Verify both columns of key_spec's rollout id at now, then finalize it
 * (census empty). */
static void finalize_key(world *w, int64_t id, int64_t now)
{
    assert_int_equal(ks_rollout_db_record_verify_column(w->db, id, "payments", "card", "m", now),
                     KS_OK);
    assert_int_equal(ks_rollout_db_record_verify_column(w->db, id, "orders", "card", "m", now),
                     KS_OK);
    ks_rollout_facts f = good_facts(now + 100);
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_OK);
}

/* Start spec s at now, which must fail with want and a message holding
 * text (when given). */
static void start_refused(world *w, const ks_rollout *s, ks_err want, const char *text)
{
    int64_t id = 7;
    assert_int_equal(ks_rollout_db_start(w->db, s, "alice", 1, &id, w->err, sizeof w->err), want);
    assert_int_equal(id, 0);
    if (text != NULL && strstr(w->err, text) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", w->err, text);
}

/* Key scopes: what start refuses (plaintext source, another key_id, bad
 * or repeated columns, overlaps naming the rollout), and what it stores
 * (the schema's spellings, in order). */
static void test_key_scope_start(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = key_spec(w), b;
    b = s;
    b.source = plain();
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, "plaintext has no key_id");
    b = s;
    strcpy(b.target.key_id, "other-kek");
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, "keeps its key_id");
    b = s;
    strcpy(b.columns[1].table, "PAYMENTS");
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, "listed twice");
    b = s;
    strcpy(b.columns[1].table, "keyshift_rollout");
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, "reserved");
    b = s;
    strcpy(b.columns[1].column, "nope");
    start_refused(w, &b, KS_ERR_NO_TARGET, "no column");
    b = s;
    b.n_columns = 0;
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, "1 to 16 columns");
    b = s;
    strcpy(b.table, "payments");
    start_refused(w, &b, KS_ERR_INVALID_ARGUMENT, NULL);

    /* an open column rollout of payments.card overlaps */
    ks_rollout c = spec();
    int64_t col_id = start(w, &c, 100);
    start_refused(w, &s, KS_ERR_ROLLOUT_EXISTS, "rollout 1 of payments.card is in planned");
    ks_rollout_facts f = good_facts(200);
    assert_int_equal(move(w, col_id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    assert_int_equal(move(w, col_id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, &f),
                     KS_ERR_GUARD); /* soak */
    exec_sql(w->path, "UPDATE keyshift_rollout SET phase = 'finalized' WHERE id = 1;");
    int64_t id = start(w, &s, 300);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.scope, KS_SCOPE_KEY);
    assert_string_equal(r.table, "");
    assert_int_equal(r.n_columns, 2);
    assert_string_equal(r.columns[0].table, "payments");
    assert_string_equal(r.columns[1].table, "orders");
    assert_string_equal(r.columns[1].column, "card");
    assert_true(ks_rollout_scope_covers(&r, "Orders", "CARD"));
    assert_false(ks_rollout_scope_covers(&r, "orders", "note"));
    assert_int_equal(ks_rollout_db_latest_key(w->db, "payments-kek", &b), KS_OK);
    assert_int_equal(b.id, id);
    assert_int_equal(ks_rollout_db_latest_key(w->db, "other-kek", &b), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &b), KS_OK);
    assert_int_equal(b.id, col_id); /* the column's own, not the key scope */
    assert_int_equal(ks_rollout_db_latest(w->db, "", "", &b), KS_ERR_INVALID_ARGUMENT);

    /* the same key again, or a column rollout of a listed column: refused */
    start_refused(w, &s, KS_ERR_ROLLOUT_EXISTS, "key payments-kek (payments.card, orders.card)");
    c = spec();
    strcpy(c.table, "orders");
    start_refused(w, &c, KS_ERR_ROLLOUT_EXISTS, "rollout 2 of key payments-kek");
    /* another key over the same columns does not overlap */
    b = s;
    strcpy(b.source.key_id, "orders-kek");
    strcpy(b.target.key_id, "orders-kek");
    int64_t other = start(w, &b, 400);
    /* a later rollout touching a column makes the earlier not the latest */
    ks_rollout list[4];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_list(w->db, 0, list, 4, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(list[2].id, other);
    assert_int_equal(list[2].n_columns, 2);
    /* the column rows are checked when read back */
    exec_sql(w->path, "INSERT INTO keyshift_rollout_column(rollout_id, tbl, col) "
                      "VALUES(3, '', 'x');");
    assert_int_equal(ks_rollout_db_get(w->db, other, &b), KS_ERR_STORE);
}

/* Key-scope guards: the census counts every column (pure guard), and
 * finalize needs a verify of every listed column since backfill began,
 * naming those without one. */
static void test_key_scope_guards(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = key_spec(w);
    int64_t id = start(w, &s, 1000);
    ks_rollout_facts f = good_facts(2000);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, &f), KS_OK);
    f.census_known = 0;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_PLANNED, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "census of key payments-kek (payments.card, orders.card)"));
    f.census_known = 1;
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_PLANNED, &f), KS_OK);
    to_backfill(w, id, 2000);
    /* verify: column by column only, of listed columns only */
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", 2500),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rollout_db_record_verify_column(w->db, id, "orders", "note", "migrate",
                                                        2500),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(ks_rollout_db_record_verify_column(w->db, id, "PAYMENTS", "card",
                                                        "migrate", 2500),
                     KS_OK);
    f.now = 2600;
    f.rows_at_source = 3;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "3 rows are still at the source"));
    f.rows_at_source = 0;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "for 1 of 2 columns: orders.card"));
    assert_int_equal(ks_rollout_db_record_verify_column(w->db, id, "orders", "card", "migrate",
                                                        2601),
                     KS_OK);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.columns[0].verified_at, 2500);
    assert_int_equal(r.columns[1].verified_at, 2601);
    f.now = 2700;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_OK);
    /* back to backfill: every column's verify is cleared */
    f.now = 2800;
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_BACKFILL, &f), KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.columns[0].verified_at + r.columns[1].verified_at, 0);
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "for 2 of 2 columns: payments.card, orders.card"));
    ks_rollout_log_entry log[16];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, log, 16, &n), KS_OK);
    assert_int_equal(n, 10);
    assert_string_equal(log[6].reason, "migrate verify passed for payments.card");
    /* a later column rollout of a listed column: no longer the latest */
    finalize_key(w, id, 2900);
    ks_rollout c = spec();
    strcpy(c.table, "orders");
    c.source = s.target;
    c.target = cls(2, KS_ALG_XCHACHA20POLY1305, "orders-kek", 1);
    (void)start(w, &c, 3100);
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_BACKFILL, &f), KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "a later rollout governs key payments-kek"));
}

/* Take the latency sum columns out of keyshift_metrics, as a library
 * without them created the version 4 tables. */
static const char no_sums[] =
    "ALTER TABLE keyshift_metrics DROP COLUMN seal_ns_sum;"
    "ALTER TABLE keyshift_metrics DROP COLUMN open_ns_sum;";

/* Turn the version 4 tables back into what version 3 of this library
 * created: no keyshift_rollout.encoding, no latency sums. */
static const char v4_to_v3[] =
    "ALTER TABLE keyshift_metrics DROP COLUMN seal_ns_sum;"
    "ALTER TABLE keyshift_metrics DROP COLUMN open_ns_sum;"
    "ALTER TABLE keyshift_rollout DROP COLUMN encoding;"
    "UPDATE keyshift_meta SET value = 3 WHERE key = 'schema_version';";

/* Turn the version 4 tables back into what version 2 of this library
 * created: no keyshift_rollout_column, no scope_key_id, no encoding, no
 * latency sums, the old index. */
static const char v3_to_v2[] =
    "ALTER TABLE keyshift_metrics DROP COLUMN seal_ns_sum;"
    "ALTER TABLE keyshift_metrics DROP COLUMN open_ns_sum;"
    "ALTER TABLE keyshift_rollout DROP COLUMN encoding;"
    "DROP TABLE keyshift_rollout_column; DROP INDEX keyshift_rollout_open;"
    "DROP INDEX keyshift_rollout_by_key; ALTER TABLE keyshift_rollout DROP COLUMN scope_key_id;"
    "CREATE UNIQUE INDEX keyshift_rollout_open ON keyshift_rollout(tbl COLLATE NOCASE,"
    " col COLLATE NOCASE) WHERE phase <> 'finalized';"
    "UPDATE keyshift_rollout SET phase = 'backfill';"
    "UPDATE keyshift_meta SET value = 2 WHERE key = 'schema_version';";

/* A version 2 database: read-only, its rollout is read as column-scoped
 * and nothing changes; a writer upgrades it to version 4 in place, keeps
 * the rollout (and its open-rollout rule) and can start key scopes. */
static void test_schema_upgrade_from_v2(void **state)
{
    world *w = *state;
    assert_int_equal(open_rowstore(w), KS_OK);
    open_db(w);
    ks_rollout s = spec();
    (void)start(w, &s, 10);
    ks_rollout_db_close(w->db);
    w->db = NULL;
    exec_sql(w->path, v3_to_v2);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info("
                                        "'keyshift_rollout') WHERE name = 'scope_key_id'"),
                     0);
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_OK);
    ks_rollout r, list[2];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &r), KS_OK);
    assert_int_equal(r.phase, KS_PHASE_BACKFILL);
    assert_int_equal(r.scope, KS_SCOPE_COLUMN);
    assert_int_equal(r.encoding, KS_ENCODING_BINARY);
    assert_int_equal(ks_rollout_db_list(w->db, 0, list, 2, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ks_rollout_db_latest_key(w->db, "payments-kek", &r), KS_ERR_NO_ROLLOUT);
    assert_int_equal(schema_version(w), 2);
    open_db(w);
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(ks_rollout_db_get(w->db, 1, &r), KS_OK);
    assert_int_equal(r.scope, KS_SCOPE_COLUMN);
    start_refused(w, &s, KS_ERR_ROLLOUT_EXISTS, "rollout 1 of payments.card is in backfill");
    s = key_spec(w);
    start_refused(w, &s, KS_ERR_ROLLOUT_EXISTS, "rollout 1 of payments.card");
    s.columns[0] = s.columns[1];
    s.n_columns = 1;
    (void)start(w, &s, 20);
    open_db(w); /* opening again changes nothing */
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(open_rowstore(w), KS_OK);
}

/* The encoding recorded with a rollout: stored and read back on start,
 * get, latest and list; a bad one refused at start and, stored by hand,
 * read as a malformed row.  A version 3 database (no encoding column)
 * reads as binary, read-only without a change; a writer upgrades it to
 * version 4 in place and keeps its rollout. */
static void test_encoding_record(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout s = spec(), r, list[2];
    s.encoding = KS_ENCODING_BASE64;
    int64_t id = start(w, &s, 10);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.encoding, KS_ENCODING_BASE64);
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &r), KS_OK);
    assert_int_equal(r.encoding, KS_ENCODING_BASE64);
    size_t n = 0;
    assert_int_equal(ks_rollout_db_list(w->db, 0, list, 2, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].encoding, KS_ENCODING_BASE64);
    ks_rollout o = spec();
    strcpy(o.table, "orders");
    o.encoding = (ks_value_encoding)2;
    start_refused(w, &o, KS_ERR_INVALID_ARGUMENT, "encoding");
    ks_policy_options po;
    memset(&po, 0, sizeof po);
    po.instance_id = "enc-1";
    po.max_format = 2;
    ks_policy *p = NULL;
    assert_int_equal(ks_policy_open(w->path, &po, &p), KS_OK);
    ks_value_encoding e = KS_ENCODING_BINARY;
    assert_int_equal(ks_policy_column_encoding(p, "PAYMENTS", "card", &e), KS_OK);
    assert_int_equal(e, KS_ENCODING_BASE64);
    assert_int_equal(ks_policy_column_encoding(p, "orders", "card", &e), KS_ERR_NOT_FOUND);
    assert_int_equal(e, KS_ENCODING_BINARY);
    assert_int_equal(ks_policy_column_encoding(p, NULL, "card", &e), KS_ERR_INVALID_ARGUMENT);
    /* the write plan gives the same encoding answers beside the target */
    ks_rollout_class c, c2;
    ks_err enc_err = KS_OK;
    const ks_bytes t1 = {(const uint8_t *)"t1", 2};
    assert_int_equal(ks_policy_write_plan(p, "PAYMENTS", "card", NULL, t1, &c, &e, &enc_err), KS_OK);
    assert_int_equal(enc_err, KS_OK);
    assert_int_equal(e, KS_ENCODING_BASE64);
    assert_int_equal(ks_policy_write_target(p, "PAYMENTS", "card", t1, &c2), KS_OK);
    assert_true(ks_rollout_class_equal(&c, &c2));
    assert_int_equal(ks_policy_write_plan(p, "orders", "card", NULL, t1, &c, &e, &enc_err),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(enc_err, KS_ERR_NOT_FOUND);
    assert_int_equal(e, KS_ENCODING_BINARY);
    assert_int_equal(ks_policy_write_plan(p, NULL, "card", NULL, t1, &c, &e, &enc_err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(enc_err, KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_write_plan(p, "payments", "card", "bad key id", t1, &c, &e, &enc_err),
                     KS_ERR_INVALID_ARGUMENT);
    ks_policy_close(p);
    ks_rollout_db_close(w->db);
    w->db = NULL;
    exec_sql(w->path, "UPDATE keyshift_rollout SET encoding = 'hex';");
    open_db(w);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_ERR_STORE);
    ks_rollout_db_close(w->db);
    w->db = NULL;
    exec_sql(w->path, v4_to_v3);
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.encoding, KS_ENCODING_BINARY);
    assert_int_equal(schema_version(w), 3);
    open_db(w);
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.encoding, KS_ENCODING_BINARY);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_rollout WHERE "
                                        "encoding = 'binary'"),
                     1);
}

/* A version 4 database without the latency sums (as a library without
 * them made it): read-only, its samples sum with sums of 0 and nothing
 * changes; a writer adds the two columns in place, keeping every sample
 * (their sums 0) and the schema version (4), and stores the sums of new
 * samples; a sample inserted as a library without the sums inserts it
 * (its columns by name) is still stored, with sums of 0, so older
 * instances keep working on the database. */
static void test_metrics_sums_upgrade(void **state)
{
    world *w = *state;
    open_db(w);
    ks_health_sample a = sample(100, 10, 3), b = sample(200, 4, 5), sum;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &a), KS_OK);
    ks_rollout_db_close(w->db);
    w->db = NULL;
    exec_sql(w->path, no_sums);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info("
                                        "'keyshift_metrics') WHERE name LIKE '%_sum'"),
                     0);
    assert_int_equal(ks_rollout_db_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &w->db, w->err,
                                        sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, 10);
    assert_true(sum.seal_ns_sum == 0 && sum.open_ns_sum == 0);
    ks_rollout_db_close(w->db);
    w->db = NULL;
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info("
                                        "'keyshift_metrics') WHERE name LIKE '%_sum'"),
                     0);
    open_db(w);
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info("
                                        "'keyshift_metrics') WHERE name LIKE '%_sum'"),
                     2);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_metrics WHERE "
                                        "seal_ns_sum = 0 AND open_ns_sum = 0"),
                     1);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &b), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, 14);
    assert_true(sum.seal_ns_sum == b.seal_ns_sum && sum.open_ns_sum == b.open_ns_sum);
    /* an older library's insert: the version 4 columns by name */
    exec_sql(w->path, "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, "
                      "seals, opens, auth_failures, parse_errors, provider_calls, "
                      "provider_errors, seal_ns, open_ns) SELECT rollout_id, 'old-1', source, "
                      "time, seals, opens, auth_failures, parse_errors, provider_calls, "
                      "provider_errors, seal_ns, open_ns FROM keyshift_metrics "
                      "WHERE instance_id = 'web-1' AND time = 100;");
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, 24);
    assert_true(sum.seal_ns_sum == b.seal_ns_sum && sum.open_ns_sum == b.open_ns_sum);
    open_db(w); /* opening again changes nothing */
    assert_int_equal(schema_version(w), 4);
    assert_int_equal(open_rowstore(w), KS_OK);
}

/* May p read value of table.column? */
static int may_at(ks_policy *p, const char *table, const char *column, const uint8_t *v,
                  size_t len, ks_err want)
{
    int ok = -1;
    ks_bytes b = {v, len};
    assert_int_equal(ks_policy_may_read(p, table, column, &b, &ok), want);
    return ok;
}

/* The policy by key: a key-scoped rollout judges its key's envelopes in
 * its columns (after the column's own, older rollout), a write for the
 * key follows it, and a write without a key is refused where only a key
 * scope covers the column. */
static void test_policy_by_key(void **state)
{
    world *w = *state;
    open_db(w);
    ks_rollout c = spec(); /* payments.card: plaintext -> payments-kek:1 v2 */
    c.target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 1);
    int64_t col_id = start(w, &c, 100);
    exec_sql(w->path, "UPDATE keyshift_rollout SET phase = 'finalized';");
    ks_rollout s = key_spec(w);
    int64_t id = start(w, &s, 1000);
    assert_true(id > col_id);
    ks_policy *p = policy(w, 3600000, "app-1");
    uint8_t src[512], dst[512], other[512];
    size_t src_len = envelope(&s.source, src, sizeof src);
    size_t dst_len = envelope(&s.target, dst, sizeof dst);
    ks_rollout_class o = cls(1, KS_ALG_AES256GCM, "orders-kek", 1);
    size_t other_len = envelope(&o, other, sizeof other);
    static const uint8_t text[] = "4111";
    ks_rollout_class out;
    ks_bytes t1 = {(const uint8_t *)"t1", 2};

    /* planned: the key's source only; plaintext by the finalized column rollout */
    assert_true(may_at(p, "payments", "card", src, src_len, KS_OK));
    assert_false(may_at(p, "payments", "card", dst, dst_len, KS_OK));
    assert_false(may_at(p, "payments", "card", text, 4, KS_OK));
    assert_true(may_at(p, "orders", "card", src, src_len, KS_OK));
    assert_false(may_at(p, "orders", "card", dst, dst_len, KS_OK));
    assert_false(may_at(p, "orders", "card", other, other_len, KS_ERR_NOT_FOUND));
    assert_false(may_at(p, "orders", "note", src, src_len, KS_ERR_NOT_FOUND));
    assert_int_equal(ks_policy_write_target(p, "payments", "card", t1, &out), KS_OK);
    assert_true(ks_rollout_class_equal(&out, &s.source)); /* followed to the key scope */
    assert_int_equal(ks_policy_write_target(p, "orders", "card", t1, &out), KS_ERR_STATE);
    assert_int_equal(ks_policy_write_target_key(p, "orders", "card", "payments-kek", t1, &out),
                     KS_OK);
    assert_true(ks_rollout_class_equal(&out, &s.source));
    assert_int_equal(ks_policy_write_target_key(p, "orders", "card", "orders-kek", t1, &out),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(ks_policy_write_target_key(p, "orders", "card", "bad key", t1, &out),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_policy_write_target_key(p, "payments", "card", "orders-kek", t1, &out),
                     KS_OK); /* the column's rule, followed: the key scope's source */
    assert_true(ks_rollout_class_equal(&out, &s.source));

    /* backfill: both read, the target written, in every listed column */
    to_backfill(w, id, 2000);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_true(may_at(p, "orders", "card", src, src_len, KS_OK));
    assert_true(may_at(p, "orders", "card", dst, dst_len, KS_OK));
    assert_int_equal(ks_policy_write_target(p, "payments", "card", t1, &out), KS_OK);
    assert_true(ks_rollout_class_equal(&out, &s.target));
    assert_int_equal(ks_policy_write_target_key(p, "orders", "card", "payments-kek", t1, &out),
                     KS_OK);
    assert_true(ks_rollout_class_equal(&out, &s.target));
    /* finalized: the target only */
    finalize_key(w, id, 2500);
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_false(may_at(p, "payments", "card", src, src_len, KS_OK));
    assert_true(may_at(p, "payments", "card", dst, dst_len, KS_OK));
    assert_false(may_at(p, "orders", "card", src, src_len, KS_OK));
    ks_policy_close(p);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_schema_fresh),
        T(test_schema_upgrade_from_v1),
        T(test_schema_newer_refused),
        T(test_upgrade_atomic),
        T(test_read_only),
        T(test_log_append_only),
        T(test_log_note),
        T(test_start_rules),
        cmocka_unit_test(test_guard_read_compat),
        cmocka_unit_test(test_guard_write_upgrade),
        cmocka_unit_test(test_guard_backfill),
        cmocka_unit_test(test_guard_finalize),
        cmocka_unit_test(test_guard_rollbacks),
        cmocka_unit_test(test_guard_abort),
        cmocka_unit_test(test_keys_strict),
        T(test_lifecycle),
        T(test_race),
        T(test_reader_ttl),
        T(test_corrupt_readers),
        T(test_corrupt_rollout),
        T(test_metrics),
        T(test_metrics_by_source),
        T(test_abort),
        T(test_abort_key_scope),
        T(test_set_settings),
        T(test_policy_report),
        T(test_policy_phases),
        T(test_policy_canary),
        T(test_policy_heartbeat),
        T(test_policy_answers_while_heartbeat_waits),
        T(test_policy_answers_during_reloads),
        T(test_policy_set_keys),
        T(test_key_scope_start),
        T(test_key_scope_guards),
        T(test_schema_upgrade_from_v2), T(test_encoding_record), T(test_metrics_sums_upgrade),
        T(test_policy_by_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
