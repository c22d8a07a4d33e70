/*
 * tests/test_app.c -- the application API (keyshift/app.h): round trips in
 * both formats and both algorithms, every error class, the rollout policy
 * on a SQLite database (the class each phase writes, the canary, reads a
 * phase refuses, the reader's registration and deregistration, health
 * reports from the background thread), batches, the pure parse, keys from
 * the environment, every allocation of ks_app_open failing in turn, and
 * many threads on one app.
 *
 * Keys come from the in-memory provider (tests/mem_provider.h), except in
 * the environment test, which uses a keyring file.  Databases are SQLite
 * files in a fresh mkdtemp directory.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/app.h>
#include <keyshift/keyring.h>
#include <keyshift/rollout.h>

#include "../migrate/alloc_hook.h"
#include "mem_provider.h"
#include "sqlite_test_util.h"

#define KEYS "payments-kek:1,payments-kek:2"

/* One test's world: keys in memory and a temporary directory holding
 * db.sqlite with payments(id, tenant, card) and orders(id, note). */
typedef struct world {
    ks_mem_provider mem;
    ks_provider prov;
    char dir[64];
    char path[96];
    char err[512];
    ks_rollout_db *db;
} world;

/* Run sql on the database at path (creating the file). */
static void exec_sql(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* Keys payments-kek:1 (primary), payments-kek:2 and other:1; the
 * database with keyshift's tables. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, "payments-kek", 1, 1, NULL), 0);
    assert_int_equal(ks_mem_add(&w->mem, "payments-kek", 2, 0, NULL), 0);
    assert_int_equal(ks_mem_add(&w->mem, "other", 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    strcpy(w->dir, "/tmp/ks_app_XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    snprintf(w->path, sizeof w->path, "%s/db.sqlite", w->dir);
    exec_sql(w->path, "CREATE TABLE payments(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);"
                      "CREATE TABLE orders(id INTEGER PRIMARY KEY, note BLOB);");
    assert_int_equal(ks_rollout_db_open(w->path, 0, &w->db, w->err, sizeof w->err), KS_OK);
    *state = w;
    return 0;
}

/* Close everything and remove the files. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_rollout_db_close(w->db);
    remove_db_dir(w->dir, w->path);
    ks_mem_cleanup(&w->mem);
    free(w);
    return 0;
}

/* Options over w's provider, sealing payments-kek by default in (format,
 * alg); no database. */
static ks_app_options opts(world *w, uint8_t format, uint32_t alg)
{
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.provider = &w->prov;
    o.default_key_id = "payments-kek";
    o.default_format = format;
    o.default_algorithm = alg;
    o.keys = KEYS;
    return o;
}

/* Open an app with o, which must succeed. */
static ks_app *app_open(world *w, const ks_app_options *o)
{
    ks_app *a = NULL;
    ks_err e = ks_app_open(o, &a, w->err, sizeof w->err);
    if (e != KS_OK) {
        fail_msg("ks_app_open: %s: %s", ks_err_name(e), w->err);
    }
    return a;
}

/* A record of payments.card. */
static ks_app_record rec(const char *tenant, const char *context)
{
    return (ks_app_record){"payments", "card",
                           {(const uint8_t *)tenant, strlen(tenant)},
                           {(const uint8_t *)context, strlen(context)},
                           {NULL, 0}};
}

/* Seal pt for r into out (cap 1024); its length. */
static size_t seal(ks_app *a, const ks_app_record *r, const char *pt, uint8_t *out,
                   ks_rollout_class *written)
{
    size_t n = 0;
    ks_err e = ks_app_seal(a, r, (const uint8_t *)pt, strlen(pt), out, 1024, &n, written);
    if (e != KS_OK) {
        fail_msg("ks_app_seal: %s", ks_err_name(e));
    }
    return n;
}

/* Open v for r, which must give want. */
static void opens_to(ks_app *a, const ks_app_record *r, const uint8_t *v, size_t len,
                     const char *want)
{
    uint8_t pt[1024];
    size_t n = 0;
    ks_err e = ks_app_open_value(a, r, v, len, pt, sizeof pt, &n, NULL, NULL);
    if (e != KS_OK) {
        fail_msg("ks_app_open_value: %s", ks_err_name(e));
    }
    assert_int_equal(n, strlen(want));
    assert_memory_equal(pt, want, n);
}

/* The result of opening v for r. */
static ks_err open_err(ks_app *a, const ks_app_record *r, const uint8_t *v, size_t len)
{
    uint8_t pt[1024];
    size_t n = 0;
    return ks_app_open_value(a, r, v, len, pt, sizeof pt, &n, NULL, NULL);
}

/* A class. */
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

/* Sleep ms milliseconds. */
static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- round trips and errors --------------------------------------------------- */

/* Without a database: every format and algorithm round-trips under the
 * default key's primary, the class written is the envelope's, and the
 * purpose is the column's name unless set. */
static void test_round_trips(void **state)
{
    world *w = *state;
    const uint32_t algs[] = {KS_ALG_XCHACHA20POLY1305, KS_ALG_AES256GCM};
    for (uint8_t f = 1; f <= 2; f++) {
        for (size_t i = 0; i < 2; i++) {
            if (algs[i] == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
                continue;
            }
            ks_app_options o = opts(w, f, algs[i]);
            ks_app *a = app_open(w, &o);
            ks_app_record r = rec("acme", "payments:1:card");
            uint8_t env[1024];
            ks_rollout_class c, rd;
            size_t n = seal(a, &r, "{\"card\":\"4111\"}", env, &c);
            assert_true(n <= ks_app_seal_max_len(strlen("{\"card\":\"4111\"}")));
                    ks_rollout_class want = cls(f, algs[i], "payments-kek", 1);
            assert_true(ks_rollout_class_equal(&c, &want));
            opens_to(a, &r, env, n, "{\"card\":\"4111\"}");
            uint8_t pt[64];
            size_t pn = 0;
            assert_int_equal(ks_app_open_value(a, &r, env, n, pt, sizeof pt, &pn, &rd, NULL),
                             KS_OK);
            assert_true(ks_rollout_class_equal(&rd, &want));
            ks_app_header h;
            assert_int_equal(ks_app_parse(env, n, &h, NULL), KS_OK);
            if (f == 2) {
                assert_int_equal(h.purpose.len, 4);
                assert_memory_equal(env + h.purpose.offset, "card", 4);
            } else {
                assert_int_equal(h.purpose.len, 0);
            }
            ks_app_close(a);
        }
    }
    ks_app_options o = opts(w, 2, 0);
    o.purpose = "card-number";
    o.default_key_version = 2;
    ks_app *a = app_open(w, &o);
    ks_app_record r = rec("t", ""); /* an empty context is a context too */
    uint8_t env[1024];
    ks_rollout_class c;
    size_t n = seal(a, &r, "x", env, &c);
    assert_int_equal(c.key_version, 2);
    ks_app_header h;
    assert_int_equal(ks_app_parse(env, n, &h, NULL), KS_OK);
    assert_memory_equal(env + h.purpose.offset, "card-number", 11);
    opens_to(a, &r, env, n, "x");
    /* A record's own purpose comes before the app's, and binds the open. */
    r.purpose = (ks_bytes){(const uint8_t *)"cvv", 3};
    n = seal(a, &r, "y", env, &c);
    assert_int_equal(ks_app_parse(env, n, &h, NULL), KS_OK);
    assert_int_equal(h.purpose.len, 3);
    assert_memory_equal(env + h.purpose.offset, "cvv", 3);
    opens_to(a, &r, env, n, "y");
    ks_app_record other = r;
    other.purpose = (ks_bytes){NULL, 0};
    uint8_t pt[16];
    size_t pn = 0;
    assert_int_equal(ks_app_open_value(a, &other, env, n, pt, sizeof pt, &pn, NULL, NULL),
                     KS_ERR_AUTH_FAILED);
    ks_app_close(a);
}

/* The class of every error this API gives, and their names. */
static void test_error_classes(void **state)
{
    (void)state;
    static const struct {
        ks_err e;
        ks_error_class c;
    } t[] = {
        {KS_OK, KS_ERROR_CLASS_OK},
        {KS_ERR_UNAVAILABLE, KS_ERROR_CLASS_RETRYABLE},
        {KS_ERR_TIMEOUT, KS_ERROR_CLASS_RETRYABLE},
        {KS_ERR_BUSY, KS_ERROR_CLASS_RETRYABLE},
        {KS_ERR_NO_MEMORY, KS_ERROR_CLASS_RETRYABLE},
        {KS_ERR_TRUNCATED, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_BAD_MAGIC, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_BAD_VALUE, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_AUTH_FAILED, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_PHASE, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_DENIED, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_REVOKED, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_NOT_FOUND, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_INVALID_ARGUMENT, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_BUFFER_TOO_SMALL, KS_ERROR_CLASS_REFUSED},
        {KS_ERR_INSECURE, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_BAD_PASSPHRASE, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_IO, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_NO_ROLLOUT, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_STATE, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_STORE, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_NO_TARGET, KS_ERROR_CLASS_CONFIGURATION},
        {KS_ERR_ALGORITHM_UNAVAILABLE, KS_ERROR_CLASS_CONFIGURATION},
        {(ks_err)250, KS_ERROR_CLASS_CONFIGURATION},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        assert_int_equal(ks_err_class(t[i].e), t[i].c);
    }
    assert_string_equal(ks_err_name(KS_ERR_PHASE), "phase");
    assert_string_equal(ks_error_class_name(KS_ERROR_CLASS_OK), "ok");
    assert_string_equal(ks_error_class_name(KS_ERROR_CLASS_RETRYABLE), "retryable");
    assert_string_equal(ks_error_class_name(KS_ERROR_CLASS_REFUSED), "refused");
    assert_string_equal(ks_error_class_name(KS_ERROR_CLASS_CONFIGURATION), "configuration");
    assert_null(ks_error_class_name((ks_error_class)9));
}

/* Malformed values, a wrong context, a provider that fails, no default
 * key, a short buffer and bad options each fail with their error. */
static void test_errors(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    ks_app *a = app_open(w, &o);
    ks_app_record r = rec("acme", "payments:1:card");
    uint8_t env[1024], pt[1024];
    size_t n = seal(a, &r, "secret", env, NULL), pn = 99;

    /* malformed: a changed header byte, a truncation, plaintext */
    uint8_t bad[1024];
    memcpy(bad, env, n);
    bad[3] = 9;
    ks_parse_error perr = {0, 0, 0};
    assert_int_equal(ks_app_open_value(a, &r, bad, n, pt, sizeof pt, &pn, NULL, &perr),
                     KS_ERR_UNSUPPORTED_VERSION);
    assert_int_equal(perr.code, KS_ERR_UNSUPPORTED_VERSION);
    assert_int_equal(perr.offset, 3);
    assert_int_equal(pn, 0);
    assert_int_equal(open_err(a, &r, env, n - 1), KS_ERR_TRUNCATED);
    assert_int_equal(open_err(a, &r, (const uint8_t *)"hello", 5), KS_ERR_BAD_MAGIC);
    assert_int_equal(ks_err_class(KS_ERR_TRUNCATED), KS_ERROR_CLASS_REFUSED);

    /* auth-failed: another context, another tenant, tampering */
    ks_app_record other = rec("acme", "payments:2:card");
    assert_int_equal(open_err(a, &other, env, n), KS_ERR_AUTH_FAILED);
    other = rec("globex", "payments:1:card");
    assert_int_equal(open_err(a, &other, env, n), KS_ERR_AUTH_FAILED);
    memcpy(bad, env, n);
    bad[n - 1] ^= 1;
    memset(pt, 0xAA, sizeof pt);
    assert_int_equal(ks_app_open_value(a, &r, bad, n, pt, sizeof pt, &pn, NULL, NULL),
                     KS_ERR_AUTH_FAILED);
    for (size_t i = 0; i < n; i++) {
        assert_true(pt[i] == 0 || pt[i] == 0xAA); /* no unauthenticated plaintext */
    }

    /* retryable: the provider is unavailable for a new tenant's DEK */
    ks_mem_fail(&w->mem, KS_MEM_WRAP, KS_ERR_UNAVAILABLE, 1000);
    ks_mem_fail(&w->mem, KS_MEM_KEY_INFO, KS_ERR_UNAVAILABLE, 1000);
    ks_app_record fresh = rec("initech", "c");
    size_t sn = 0;
    ks_err e = ks_app_seal(a, &fresh, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL);
    assert_int_equal(e, KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_err_class(e), KS_ERROR_CLASS_RETRYABLE);
    ks_mem_fail(&w->mem, KS_MEM_WRAP, KS_OK, 0);
    ks_mem_fail(&w->mem, KS_MEM_KEY_INFO, KS_OK, 0);
    assert_int_equal(ks_app_seal(a, &fresh, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL),
                     KS_OK);

    /* refused: a short buffer, bad arguments */
    assert_int_equal(ks_app_open_value(a, &r, env, n, pt, 2, &pn, NULL, NULL),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_app_seal(a, &r, (const uint8_t *)"secret", 6, bad, 10, &sn, NULL),
                     KS_ERR_BUFFER_TOO_SMALL);
    ks_app_record nocol = {"payments", NULL, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    assert_int_equal(ks_app_seal(a, &nocol, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_app_seal(NULL, &r, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL),
                     KS_ERR_INVALID_ARGUMENT);
    ks_app_record badtenant = rec("not a tenant!", "c");
    assert_int_equal(
        ks_app_seal(a, &badtenant, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL),
        KS_ERR_INVALID_ARGUMENT);
    ks_app_close(a);

    /* retryable on open: a fresh app (empty DEK cache) cannot unwrap */
    a = app_open(w, &o);
    ks_mem_fail(&w->mem, KS_MEM_UNWRAP, KS_ERR_TIMEOUT, 1);
    e = open_err(a, &r, env, n);
    assert_int_equal(e, KS_ERR_TIMEOUT);
    assert_int_equal(ks_err_class(e), KS_ERROR_CLASS_RETRYABLE);
    opens_to(a, &r, env, n, "secret"); /* and the retry succeeds */
    ks_app_close(a);

    /* configuration: no default key and no rollout; bad options */
    o.default_key_id = NULL;
    a = app_open(w, &o);
    e = ks_app_seal(a, &r, (const uint8_t *)"x", 1, bad, sizeof bad, &sn, NULL);
    assert_int_equal(e, KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_err_class(e), KS_ERROR_CLASS_CONFIGURATION);
    opens_to(a, &r, env, n, "secret"); /* opening needs no default */
    ks_app_close(a);
    ks_app *none = (ks_app *)1;
    o = opts(w, 2, 0);
    o.keyring = "some.keyring";
    assert_int_equal(ks_app_open(&o, &none, w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    assert_null(none);
    assert_non_null(strstr(w->err, "not several"));
    o = opts(w, 2, 0);
    o.database = w->path;
    assert_int_equal(ks_app_open(&o, &none, w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(w->err, "instance_id"));
    o = opts(w, 2, 0);
    o.keys = "b:1,a:1";
    assert_int_equal(ks_app_open(&o, &none, w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    o = opts(w, 2, 0);
    o.database = "/nonexistent/db.sqlite";
    o.instance_id = "web-1";
    e = ks_app_open(&o, &none, w->err, sizeof w->err);
    assert_int_equal(ks_err_class(e), KS_ERROR_CLASS_CONFIGURATION);
    assert_null(none);
    assert_int_equal(ks_app_open(NULL, &none, NULL, 0), KS_ERR_INVALID_ARGUMENT);
    ks_app_close(NULL);
}

/* ---- the policy on SQLite ------------------------------------------------------ */

/* Start a rollout of payments.card from payments-kek:1 to payments-kek:2
 * (v2, xchacha20-poly1305), canary tenant "canary-t", no soak. */
static int64_t start_rollout(world *w)
{
    ks_rollout s;
    memset(&s, 0, sizeof s);
    strcpy(s.table, "payments");
    strcpy(s.column, "card");
    s.source = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 1);
    s.target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    s.canary.kind = KS_CANARY_TENANTS;
    s.canary.n_tenants = 1;
    strcpy(s.canary.tenants[0], "canary-t");
    ks_thresholds_default(&s.thresholds);
    s.reader_ttl_s = 30;
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", time(NULL), &id, w->err,
                                         sizeof w->err),
                     KS_OK);
    return id;
}

/* Move rollout id from -> to now with favourable facts. */
static void move(world *w, int64_t id, ks_rollout_phase from, ks_rollout_phase to)
{
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.now = time(NULL);
    f.target_key_state = f.source_key_state = KS_KEY_ACTIVE;
    f.census_known = f.health_known = 1;
    f.health = KS_HEALTH_OK;
    ks_rollout_change c = {id, from, to, "alice", "test", 0};
    ks_err e = ks_rollout_db_transition(w->db, &c, &f, w->err, sizeof w->err);
    if (e != KS_OK) {
        fail_msg("transition: %s: %s", ks_err_name(e), w->err);
    }
    sleep_ms(60); /* past the policy's refresh period */
}

/* The live readers of w's database into out[0, 4); their number. */
static size_t live_readers(world *w, ks_rollout_reader *out)
{
    size_t n = 0;
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, time(NULL), out, 4, &n), KS_OK);
    return n;
}

/* Wait (up to 10 s) until app a made at least want reports. */
static void wait_reports(ks_app *a, uint64_t want)
{
    ks_app_stats st;
    for (int i = 0; i < 1000; i++) {
        ks_app_stats_get(a, &st);
        if (st.reports >= want) {
            return;
        }
        sleep_ms(10);
    }
    fail_msg("only %llu reports", (unsigned long long)st.reports);
}

/* With the default interval the policy still refreshes every
 * KS_APP_REFRESH_DEFAULT_MS (a phase change shows within about half a
 * second) while the background work, each a write to the rollout
 * database, waits KS_APP_INTERVAL_DEFAULT_MS. */
static void test_default_periods(void **state)
{
    world *w = *state;
    int64_t id = start_rollout(w);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-default";
    ks_app *a = app_open(w, &o);
    ks_app_record r = rec("t2", "payments:7:card");
    ks_app_options ot = opts(w, 2, 0); /* a writer of the target, no database */
    ot.default_key_version = 2;
    ks_app *tw = app_open(w, &ot);
    uint8_t te[1024];
    size_t tn = seal(tw, &r, "target", te, NULL);
    assert_int_equal(open_err(a, &r, te, tn), KS_ERR_PHASE); /* planned */
    move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT);
    sleep_ms(KS_APP_REFRESH_DEFAULT_MS + 200);
    opens_to(a, &r, te, tn, "target"); /* read-compat, seen within the refresh period */
    ks_app_stats st;
    ks_app_stats_get(a, &st);
    assert_int_equal(st.heartbeats, 0); /* the first tick is KS_APP_INTERVAL_DEFAULT_MS away */
    assert_int_equal(st.reports, 0);
    ks_app_close(tw);
    ks_app_close(a);
}

/* What each phase writes and reads, the canary, the registration with
 * the keys held, health reports and deregistration at close. */
static void test_policy_sqlite(void **state)
{
    world *w = *state;
    int64_t id = start_rollout(w);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-1";
    o.interval_ms = 20;
    ks_app *a = app_open(w, &o);
    ks_app_options ot = opts(w, 2, 0); /* a writer of the target, no database */
    ot.default_key_version = 2;
    ks_app *tw = app_open(w, &ot);

    ks_rollout_reader rd[4];
    assert_int_equal(live_readers(w, rd), 1);
    assert_string_equal(rd[0].instance_id, "web-1");
    assert_string_equal(rd[0].keys, KEYS);
    assert_int_equal(rd[0].max_format, 2);
    char keys[KS_READER_KEYS_MAX + 1];
    assert_int_equal(ks_app_keys(a, keys, sizeof keys), KS_OK);
    assert_string_equal(keys, KEYS);

    ks_rollout_class src = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 1);
    ks_rollout_class dst = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    ks_rollout_class c;
    ks_app_record r = rec("t2", "payments:7:card"), canary = rec("canary-t", "payments:8:card");
    uint8_t se[1024], te[1024], ce[1024];
    size_t tn = seal(tw, &r, "target", te, NULL);

    /* planned: write the source; the target is not readable yet */
    size_t sn = seal(a, &canary, "source", se, &c);
    assert_true(ks_rollout_class_equal(&c, &src));
    assert_int_equal(open_err(a, &r, te, tn), KS_ERR_PHASE);
    assert_int_equal(ks_err_class(KS_ERR_PHASE), KS_ERROR_CLASS_REFUSED);
    opens_to(a, &canary, se, sn, "source");

    /* read-compat: both read, the source written */
    move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT);
    opens_to(a, &r, te, tn, "target");
    seal(a, &canary, "x", ce, &c);
    assert_true(ks_rollout_class_equal(&c, &src));

    /* write-upgrade: the canary tenant writes the target, others the source */
    move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE);
    size_t cn = seal(a, &canary, "canary", ce, &c);
    assert_true(ks_rollout_class_equal(&c, &dst));
    sn = seal(a, &r, "other", se, &c);
    assert_true(ks_rollout_class_equal(&c, &src));
    opens_to(a, &canary, ce, cn, "canary");
    opens_to(a, &r, se, sn, "other");

    /* health: the background thread reports the growth of the counters */
    ks_app_stats st;
    ks_app_stats_get(a, &st);
    wait_reports(a, st.reports + 2);
    ks_health_sample sum;
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_true(sum.seals >= 2);
    assert_true(sum.opens >= 2);
    uint64_t hist = 0;
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++) {
        hist += sum.seal_ns.bucket[i];
    }
    assert_true(hist >= 2);
    ks_app_stats_get(a, &st);
    assert_true(st.heartbeats >= 1);
    assert_int_equal(st.heartbeat_errors + st.report_errors, 0);

    /* backfill: everyone writes the target */
    move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL);
    seal(a, &r, "x", ce, &c);
    assert_true(ks_rollout_class_equal(&c, &dst));

    /* finalized: the source is no longer read */
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "migrate", time(NULL)), KS_OK);
    move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED);
    size_t on = seal(tw, &r, "x", te, NULL);
    opens_to(a, &r, te, on, "x");
    ks_app_options os = opts(w, 2, 0); /* a writer of the source, no database */
    ks_app *sw = app_open(w, &os);
    sn = seal(sw, &r, "old", se, NULL);
    assert_int_equal(open_err(a, &r, se, sn), KS_ERR_PHASE);
    opens_to(sw, &r, se, sn, "old"); /* without a rollout: anything the keys open */

    /* a column no rollout governs: the default key */
    ks_app_record orders = {"orders", "note", {(const uint8_t *)"t", 1}, {NULL, 0}, {NULL, 0}};
    size_t n = 0;
    assert_int_equal(ks_app_seal(a, &orders, (const uint8_t *)"n", 1, ce, sizeof ce, &n, &c),
                     KS_OK);
    assert_true(ks_rollout_class_equal(&c, &src));

    ks_app_close(a);
    assert_int_equal(live_readers(w, rd), 0);
    ks_app_close(tw);
    ks_app_close(sw);
}

/* A providers file that does not parse: ks_app_open says where, as
 * `keyshift providers check` does. */
static void test_registry_error_position(void **state)
{
    world *w = *state;
    char path[600];
    snprintf(path, sizeof path, "%s.providers", w->path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keyshift-providers 1\nprovider local\n", f);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.providers = path;
    ks_app *a = NULL;
    char err[512];
    assert_int_not_equal(ks_app_open(&o, &a, err, sizeof err), KS_OK);
    assert_null(a);
    assert_non_null(strstr(err, " at line 3, column 1"));
    assert_non_null(strstr(err, "is invalid: "));
    unlink(path);
}

/* Two apps of one process on one database and instance id (a service
 * that reloads by opening a new app before closing the old, as keyshift
 * serve does on SIGHUP): the row is the newer registration's, closing
 * the older app leaves it in place (the guards never lose sight of the
 * reader), and the last close deregisters.  Another instance id is its
 * own row. */
static void test_shared_registration(void **state)
{
    world *w = *state;
    (void)start_rollout(w);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "agent-1";
    o.keys = "payments-kek:1";
    ks_app *old = app_open(w, &o);
    ks_rollout_reader rd[4];
    assert_int_equal(live_readers(w, rd), 1);
    assert_string_equal(rd[0].keys, "payments-kek:1");
    o.keys = KEYS;
    ks_app *reloaded = app_open(w, &o);
    ks_app_options other = o;
    other.instance_id = "agent-2";
    ks_app *b = app_open(w, &other);
    assert_int_equal(live_readers(w, rd), 2);
    ks_app_close(old);
    assert_int_equal(live_readers(w, rd), 2);
    assert_string_equal(rd[0].instance_id, "agent-1");
    assert_string_equal(rd[0].keys, KEYS);
    ks_app_close(reloaded);
    assert_int_equal(live_readers(w, rd), 1);
    assert_string_equal(rd[0].instance_id, "agent-2");
    ks_app_close(b);
    assert_int_equal(live_readers(w, rd), 0);
}

/* Start a rollout of orders.note from plaintext to payments-kek:2 (v2,
 * xchacha20-poly1305) recorded with encoding enc; its id. */
static int64_t start_orders_rollout(world *w, ks_value_encoding enc)
{
    ks_rollout s;
    memset(&s, 0, sizeof s);
    strcpy(s.table, "orders");
    strcpy(s.column, "note");
    s.source.is_plaintext = 1;
    s.target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    ks_thresholds_default(&s.thresholds);
    s.reader_ttl_s = 30;
    s.encoding = enc;
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", time(NULL), &id, w->err,
                                         sizeof w->err),
                     KS_OK);
    return id;
}

/* A rollout from plaintext: before write-upgrade, seal hands the
 * plaintext back unsealed and open reads plaintext as it is. */
static void test_policy_plaintext(void **state)
{
    world *w = *state;
    (void)start_orders_rollout(w, KS_ENCODING_BINARY);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-2";
    ks_app *a = app_open(w, &o);
    ks_app_record r = {"orders", "note", {(const uint8_t *)"t", 1}, {(const uint8_t *)"o:1", 3},
                       {NULL, 0}};
    uint8_t out[1024], pt[64];
    size_t n = 0, pn = 0;
    ks_rollout_class c, rc;
    assert_int_equal(ks_app_seal(a, &r, (const uint8_t *)"hello", 5, out, sizeof out, &n, &c),
                     KS_OK);
    assert_true(c.is_plaintext);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "hello", 5);
    assert_int_equal(ks_app_open_value(a, &r, out, n, pt, sizeof pt, &pn, &rc, NULL), KS_OK);
    assert_true(rc.is_plaintext);
    assert_int_equal(pn, 5);
    /* a text column: plaintext too, but one beginning "KSE" is malformed there */
    assert_int_equal(ks_app_seal_text(a, &r, (const uint8_t *)"hello", 5, out, sizeof out, &n,
                                      &c), KS_OK);
    assert_true(c.is_plaintext);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "hello", 5);
    assert_int_equal(ks_app_open_text(a, &r, (const uint8_t *)"KSE\x02", 4, pt, sizeof pt, &pn,
                                      &rc, NULL), KS_ERR_BAD_MAGIC);
    assert_int_equal(ks_app_open_text(a, &r, (const uint8_t *)"plain", 5, pt, sizeof pt, &pn,
                                      &rc, NULL), KS_OK);
    assert_true(rc.is_plaintext);
    assert_int_equal(pn, 5);
    ks_app_close(a);
}

/* An update keeps the stored form where no rollout governs (plaintext
 * stays plaintext, an envelope its own class, nothing for NULL) and
 * follows the rollout where one does; may_read tells "no rollout" from
 * a refusal. */
static void test_update_and_may_read(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-3";
    o.interval_ms = 20;
    ks_app *a = app_open(w, &o);
    ks_app_options ov = opts(w, 1, KS_ALG_XCHACHA20POLY1305); /* an old v1 writer of key 2 */
    ov.default_key_version = 2;
    ks_app *old = app_open(w, &ov);
    ks_app_record r = rec("t1", "payments:1:card");
    uint8_t v1[1024], out[1024];
    size_t n1 = seal(old, &r, "old", v1, NULL), n = 0;
    ks_rollout_class c;
    int ok = 1;

    /* no rollout: the stored form is kept, the default key is not used */
    assert_int_equal(ks_app_seal_update(a, &r, v1, n1, (const uint8_t *)"new", 3, out, sizeof out,
                                        &n, &c),
                     KS_OK);
    ks_rollout_class want = cls(1, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    assert_true(ks_rollout_class_equal(&c, &want));
    opens_to(a, &r, out, n, "new");
    assert_int_equal(ks_app_seal_update(a, &r, (const uint8_t *)"plain", 5, (const uint8_t *)"new",
                                        3, out, sizeof out, &n, &c),
                     KS_OK);
    assert_true(c.is_plaintext);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "new", 3);
    assert_int_equal(ks_app_seal_update(a, &r, NULL, 0, (const uint8_t *)"new", 3, out,
                                        sizeof out, &n, &c),
                     KS_ERR_NO_ROLLOUT);
    uint8_t bad[8] = {KS_MAGIC_0, KS_MAGIC_1, KS_MAGIC_2, 0x7f};
    assert_int_equal(ks_app_seal_update(a, &r, bad, sizeof bad, (const uint8_t *)"new", 3, out,
                                        sizeof out, &n, &c),
                     KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_app_seal_update(a, &r, NULL, 1, (const uint8_t *)"new", 3, out,
                                        sizeof out, &n, &c),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_app_may_read(a, "payments", "card", v1, n1, &ok), KS_ERR_NOT_FOUND);
    assert_int_equal(ok, 0);
    assert_int_equal(ks_app_may_read(old, "payments", "card", v1, n1, &ok), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_app_may_read(a, "payments", NULL, v1, n1, &ok), KS_ERR_INVALID_ARGUMENT);

    /* a rollout from payments-kek:1 to 2 (v2), planned: its source is written */
    int64_t id = start_rollout(w);
    sleep_ms(60); /* past the policy's refresh period */
    assert_int_equal(ks_app_seal_update(a, &r, v1, n1, (const uint8_t *)"new", 3, out, sizeof out,
                                        &n, &c),
                     KS_OK);
    want = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 1);
    assert_true(ks_rollout_class_equal(&c, &want));
    assert_int_equal(ks_app_may_read(a, "payments", "card", out, n, &ok), KS_OK);
    assert_int_equal(ok, 1);
    assert_int_equal(ks_app_may_read(a, "payments", "card", v1, n1, &ok), KS_OK);
    assert_int_equal(ok, 0); /* v1 under key 2: neither source nor target */
    assert_int_equal(ks_app_may_read(a, "payments", "card", NULL, 0, &ok), KS_OK);
    assert_int_equal(ok, 1); /* SQL NULL holds nothing */
    assert_int_equal(ks_app_may_read(a, "orders", "note", v1, n1, &ok), KS_ERR_NOT_FOUND);
    (void)id;
    ks_app_close(old);
    ks_app_close(a);
}

/* A libpq key=value string names a PostgreSQL database, not a SQLite
 * file: a server that cannot be reached is unavailable (retryable). */
static void test_pg_keyword_string(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    char db[160];
    snprintf(db, sizeof db, "host=%s/nosocket dbname=postgres connect_timeout=2", w->dir);
    o.database = db;
    o.instance_id = "web-4";
    ks_app *a = NULL;
    assert_int_equal(ks_app_open(&o, &a, w->err, sizeof w->err), KS_ERR_UNAVAILABLE);
    assert_null(a);
    assert_non_null(strstr(w->err, "PostgreSQL"));
    assert_non_null(strstr(w->err, "cannot connect"));
}

/* ---- batches, parse, environment, threads --------------------------------------- */

/* A batch seals and opens like single calls; a failed item has its own
 * error and does not stop the others. */
static void test_batch(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    ks_app *a = app_open(w, &o);
    enum { N = 8 };
    ks_app_item items[N];
    uint8_t outs[N][512], pts[N][512];
    char ctx[N][16], msg[N][16];
    for (size_t i = 0; i < N; i++) {
        snprintf(ctx[i], sizeof ctx[i], "p:%zu", i);
        snprintf(msg[i], sizeof msg[i], "value %zu", i);
        items[i] = (ks_app_item){{(const uint8_t *)"acme", 4},
                                 {(const uint8_t *)ctx[i], strlen(ctx[i])},
                                 {NULL, 0},
                                 {(const uint8_t *)msg[i], strlen(msg[i])},
                                 outs[i], sizeof outs[i], 0, KS_ERR_STORE, {0}};
    }
    assert_int_equal(ks_app_seal_batch(a, "payments", "card", items, N), KS_OK);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(items[i].err, KS_OK);
        assert_int_equal(items[i].cls.key_version, 1);
        items[i].in = (ks_bytes){outs[i], items[i].out_len};
        items[i].out = pts[i];
        items[i].cap = sizeof pts[i];
    }
    outs[3][items[3].in.len - 1] ^= 1;
    items[5].in.len = 2;
    assert_int_equal(ks_app_open_batch(a, "payments", "card", items, N), KS_ERR_AUTH_FAILED);
    for (size_t i = 0; i < N; i++) {
        ks_err want = i == 3 ? KS_ERR_AUTH_FAILED : i == 5 ? KS_ERR_TRUNCATED : KS_OK;
        assert_int_equal(items[i].err, want);
        if (want == KS_OK) {
            assert_int_equal(items[i].out_len, strlen(msg[i]));
            assert_memory_equal(pts[i], msg[i], items[i].out_len);
        }
    }
    assert_int_equal(ks_app_seal_batch(a, "payments", "card", NULL, 0), KS_OK);
    assert_int_equal(ks_app_seal_batch(a, NULL, "card", items, N), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_app_open_batch(NULL, "payments", "card", items, N),
                     KS_ERR_INVALID_ARGUMENT);
    ks_app_close(a);
}

/* The pure parse: fields and where they lie; rejections with offsets. */
static void test_parse(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, KS_ALG_XCHACHA20POLY1305);
    ks_app *a = app_open(w, &o);
    ks_app_record r = rec("acme", "ctx");
    uint8_t env[1024];
    size_t n = seal(a, &r, "hello", env, NULL);
    ks_app_close(a);
    ks_app_header h;
    assert_int_equal(ks_app_parse(env, n, &h, NULL), KS_OK);
    assert_int_equal(h.version, 2);
    assert_int_equal(h.algorithm, KS_ALG_XCHACHA20POLY1305);
    assert_int_equal(h.key_version, 1);
    assert_int_equal(h.key_id.len, 12);
    assert_memory_equal(env + h.key_id.offset, "payments-kek", 12);
    assert_int_equal(h.tenant.len, 4);
    assert_memory_equal(env + h.tenant.offset, "acme", 4);
    assert_int_equal(h.nonce.len, 24);
    assert_int_equal(h.commitment.len > 0, 1);
    assert_int_equal(h.ciphertext.len, 5 + 16);
    assert_int_equal(h.ciphertext.offset + h.ciphertext.len, n);
    assert_int_equal(h.total_len, n);
    assert_true(h.header_len < h.ciphertext.offset);
    ks_parse_error perr;
    assert_int_equal(ks_app_parse(env, n - 1, &h, &perr), KS_ERR_TRUNCATED);
    assert_int_equal(perr.code, KS_ERR_TRUNCATED);
    assert_int_equal(ks_app_parse((const uint8_t *)"KSX", 3, &h, &perr), KS_ERR_BAD_MAGIC);
    assert_int_equal(perr.code, KS_ERR_BAD_MAGIC);
    assert_int_equal(ks_app_parse(NULL, 1, &h, NULL), KS_ERR_INVALID_ARGUMENT);
}

/* Keys from KEYSHIFT_KEYRING: the versions held are listed from the
 * keyring (active and decrypt-only) and registered; a change of the file
 * is reloaded by the background thread and registered again. */
static void test_env_keyring(void **state)
{
    world *w = *state;
    char kpath[128];
    snprintf(kpath, sizeof kpath, "%s/app.keyring", w->dir);
    assert_int_equal(ks_keyring_init(kpath, (ks_bytes){NULL, 0}), KS_OK);
    ks_keyring *kr = NULL;
    assert_int_equal(ks_keyring_open(kpath, (ks_bytes){NULL, 0}, &kr, NULL), KS_OK);
    assert_int_equal(ks_keyring_create(kr, (ks_bytes){(const uint8_t *)"env-kek", 7}), KS_OK);
    uint32_t v = 0;
    assert_int_equal(ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)"env-kek", 7}, &v),
                     KS_OK);
    assert_int_equal(ks_keyring_set_state(kr, (ks_bytes){(const uint8_t *)"env-kek", 7}, 2,
                                          KS_KEY_DISABLED),
                     KS_OK);
    ks_keyring_close(kr);
    unsetenv("KEYSHIFT_PROVIDERS");
    unsetenv("KEYSHIFT_PASSPHRASE");
    setenv("KEYSHIFT_KEYRING", kpath, 1);
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.database = w->path;
    o.instance_id = "env-1";
    o.default_key_id = "env-kek";
    o.interval_ms = 20;
    ks_app *a = app_open(w, &o);
    char keys[KS_READER_KEYS_MAX + 1];
    assert_int_equal(ks_app_keys(a, keys, sizeof keys), KS_OK);
    assert_string_equal(keys, "env-kek:1");
    assert_int_equal(ks_app_keys(a, keys, 3), KS_ERR_BUFFER_TOO_SMALL);
    ks_rollout_reader rd[4];
    assert_int_equal(live_readers(w, rd), 1);
    assert_string_equal(rd[0].keys, "env-kek:1");
    ks_app_record r = rec("acme", "c");
    uint8_t env[1024], env3[1024];
    ks_rollout_class c;
    size_t n = seal(a, &r, "from env", env, &c);
    assert_int_equal(c.key_version, 1);
    opens_to(a, &r, env, n, "from env");

    /* an operator adds version 3 and promotes it: the app reloads the
     * keyring, registers the new list and seals under the new primary */
    assert_int_equal(ks_keyring_open(kpath, (ks_bytes){NULL, 0}, &kr, NULL), KS_OK);
    assert_int_equal(ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)"env-kek", 7}, &v),
                     KS_OK);
    assert_int_equal(v, 3);
    sleep_ms(50); /* the two writes get distinct modification times */
    assert_int_equal(ks_keyring_promote(kr, (ks_bytes){(const uint8_t *)"env-kek", 7}, 3), KS_OK);
    ks_keyring_close(kr);
    size_t n3 = 0;
    for (int i = 0; i < 1000; i++) { /* until the reload after the promotion */
        n3 = seal(a, &r, "after reload", env3, &c);
        if (c.key_version == 3) {
            break;
        }
        sleep_ms(10);
    }
    assert_int_equal(c.key_version, 3);
    for (int i = 0; i < 1000; i++) { /* registered right after the swap */
        assert_int_equal(ks_app_keys(a, keys, sizeof keys), KS_OK);
        if (strcmp(keys, "env-kek:1,env-kek:3") == 0) {
            break;
        }
        sleep_ms(10);
    }
    assert_string_equal(keys, "env-kek:1,env-kek:3");
    assert_int_equal(live_readers(w, rd), 1);
    assert_string_equal(rd[0].keys, "env-kek:1,env-kek:3");
    ks_app_stats st;
    ks_app_stats_get(a, &st);
    assert_true(st.key_reloads >= 1);
    assert_true(st.key_changes >= 1);
    assert_int_equal(st.reload_errors, 0);
    opens_to(a, &r, env3, n3, "after reload");
    opens_to(a, &r, env, n, "from env"); /* sealed under the first generation */
    ks_app_close(a);

    /* a sealed keyring opened without its passphrase: a sentence that says so */
    unlink(kpath);
    assert_int_equal(ks_keyring_init(kpath, (ks_bytes){(const uint8_t *)"pw", 2}), KS_OK);
    memset(&o, 0, sizeof o);
    o.keyring = kpath;
    o.passphrase = (ks_bytes){(const uint8_t *)"wrong", 5};
    ks_app *sealed = NULL;
    assert_int_equal(ks_app_open(&o, &sealed, w->err, sizeof w->err), KS_ERR_BAD_PASSPHRASE);
    assert_non_null(strstr(w->err, "wrong or missing passphrase"));
    o.keyring = "/nonexistent/app.keyring";
    o.passphrase = (ks_bytes){NULL, 0};
    assert_int_equal(ks_app_open(&o, &sealed, w->err, sizeof w->err), KS_ERR_IO);
    assert_non_null(strstr(w->err, "No such file or directory"));
    unsetenv("KEYSHIFT_KEYRING");
    ks_app *none = NULL;
    memset(&o, 0, sizeof o);
    assert_int_equal(ks_app_open(&o, &none, w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(w->err, "KEYSHIFT_KEYRING"));
    unlink(kpath);
}

/* Each of ks_app_open's own allocations failing in turn: the open fails
 * with no-memory and leaves nothing behind (no reader registered,
 * nothing leaked: LeakSanitizer checks at exit), until a run in which no
 * fault fires opens normally. */
static void test_open_alloc_faults(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-f";
    o.interval_ms = 3600000; /* no tick while a fault is armed */
    unsigned long n = 1;
    for (;; n++) {
        ks_app *a = NULL;
        ks_test_alloc_fail_at(n);
        ks_err e = ks_app_open(&o, &a, w->err, sizeof w->err);
        unsigned long fired = ks_test_alloc_fired();
        ks_test_alloc_fail_at(0);
        if (fired == 0) {
            assert_int_equal(e, KS_OK);
            ks_app_close(a);
            break;
        }
        if (e == KS_OK) { /* a fault some lower layer absorbed */
            ks_app_close(a);
            continue;
        }
        assert_int_equal(e, KS_ERR_NO_MEMORY);
        assert_null(a);
        ks_rollout_reader rd[4];
        assert_int_equal(live_readers(w, rd), 0);
    }
    assert_true(n > 3);
    printf("ks_app_open: %lu allocation fault points\n", n - 1);
}

/* What one thread of test_threads does. */
typedef struct thread_arg {
    ks_app *app;
    int index;
    int failures;
} thread_arg;

/* Seal and open 200 values of its own tenant and of a shared one. */
static void *thread_main(void *p)
{
    thread_arg *t = p;
    char tenant[16], ctx[32], msg[32];
    snprintf(tenant, sizeof tenant, "t%d", t->index % 3);
    for (int i = 0; i < 200; i++) {
        snprintf(ctx, sizeof ctx, "payments:%d:%d", t->index, i);
        snprintf(msg, sizeof msg, "value %d/%d", t->index, i);
        ks_app_record r = {"payments", "card", {(const uint8_t *)tenant, strlen(tenant)},
                           {(const uint8_t *)ctx, strlen(ctx)}, {NULL, 0}};
        uint8_t env[512], pt[512];
        size_t n = 0, pn = 0;
        if (ks_app_seal(t->app, &r, (const uint8_t *)msg, strlen(msg), env, sizeof env, &n,
                        NULL) != KS_OK ||
            ks_app_open_value(t->app, &r, env, n, pt, sizeof pt, &pn, NULL, NULL) != KS_OK ||
            pn != strlen(msg) || memcmp(pt, msg, pn) != 0) {
            t->failures++;
        }
    }
    return NULL;
}

/* Eight threads on one app with a rollout under way and the background
 * thread reporting every 5 ms: every value round-trips. */
static void test_threads(void **state)
{
    world *w = *state;
    int64_t id = start_rollout(w);
    move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-t";
    o.interval_ms = 5;
    ks_app *a = app_open(w, &o);
    enum { T = 8 };
    pthread_t th[T];
    thread_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (thread_arg){a, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    ks_app_close(a);
    ks_health_sample sum;
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, T * 200); /* the final report at close counts the rest */
    assert_int_equal(sum.opens, T * 200);
}

/* ---- columns of base64 text ------------------------------------------------------ */

/* A text column (docs/format.md section 10): ks_app_seal_text writes the
 * envelope's canonical base64, ks_app_open_text opens it to the same
 * plaintext and class; a non-canonical text is refused with the
 * decoder's error and character offset, nothing opened; a value not
 * beginning "S1NF" or "KSE" is plaintext: bad-magic where no rollout
 * reads plaintext, copied out where one does; one beginning "KSE" (a
 * binary envelope) is bad-magic at 0 whatever the rollout. */
static void test_text(void **state)
{
    world *w = *state;
    ks_app_options o = opts(w, 2, 0);
    ks_app *a = app_open(w, &o);
    ks_app_record r = rec("acme", "payments:7:card");
    const char *msg = "{\"card\":\"4111\"}";
    size_t len = strlen(msg), n = 0, pn = 0;
    uint8_t text[4096], pt[4096];
    ks_rollout_class c, rd;
    assert_true(ks_app_seal_text_max_len(len) <= sizeof text);
    assert_int_equal(ks_app_seal_text(a, &r, (const uint8_t *)msg, len, text,
                                      ks_app_seal_text_max_len(len), &n, &c), KS_OK);
    assert_memory_equal(text, "S1NF", 4);
    assert_int_equal(n % 4, 0);
    assert_int_equal(ks_app_open_text(a, &r, text, n, pt, n, &pn, &rd, NULL), KS_OK);
    assert_int_equal(pn, len);
    assert_memory_equal(pt, msg, len);
    assert_true(ks_rollout_class_equal(&c, &rd));
    assert_int_equal(ks_app_seal_text(a, &r, (const uint8_t *)msg, len, text, n - 1, &n, &c),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_app_seal_text(a, &r, (const uint8_t *)msg, len, text, sizeof text, &n,
                                      &c), KS_OK);
    /* another context: the envelope decodes and fails as a binary one would */
    ks_app_record other = rec("acme", "payments:8:card");
    assert_int_equal(ks_app_open_text(a, &other, text, n, pt, sizeof pt, &pn, NULL, NULL),
                     KS_ERR_AUTH_FAILED);
    /* not canonical: a line break, an URL-safe character */
    ks_parse_error pe;
    text[n] = '\n';
    assert_int_equal(ks_app_open_text(a, &r, text, n + 1, pt, sizeof pt, &pn, NULL, &pe),
                     KS_ERR_TRUNCATED);
    assert_int_equal(pe.offset, n + 1);
    uint8_t saved = text[9];
    text[9] = '-';
    assert_int_equal(ks_app_open_text(a, &r, text, n, pt, sizeof pt, &pn, NULL, &pe),
                     KS_ERR_BAD_VALUE);
    assert_int_equal(pe.offset, 9);
    assert_int_equal(pn, 0);
    text[9] = saved;
    /* plaintext, with no rollout to read it */
    assert_int_equal(ks_app_open_text(a, &r, (const uint8_t *)"KSE\x02", 4, pt, sizeof pt, &pn,
                                      NULL, &pe), KS_ERR_BAD_MAGIC);
    assert_int_equal(pe.offset, 0);
    assert_int_equal(ks_app_open_text(a, &r, (const uint8_t *)"S1Nx", 4, pt, sizeof pt, &pn,
                                      NULL, &pe), KS_ERR_BAD_MAGIC);
    assert_int_equal(pe.offset, 3);
    assert_int_equal(ks_app_open_text(a, &r, (const uint8_t *)"S1", 2, pt, sizeof pt, &pn,
                                      NULL, &pe), KS_ERR_TRUNCATED);
    assert_int_equal(ks_app_open_text(NULL, &r, text, n, pt, sizeof pt, &pn, NULL, NULL),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_app_seal_text(a, &r, (const uint8_t *)msg, len, NULL, 4, &n, NULL),
                     KS_ERR_INVALID_ARGUMENT);
    ks_app_close(a);
}

/* The column's encoding decides the form of ks_app_seal, ks_app_open_value,
 * ks_app_seal_update and ks_app_may_read: the rollout's record where one
 * covers the column, else the default_encoding option.  A base64 column
 * reads only the text form (a binary envelope there is malformed), and a
 * binary column keeps the binary one. */
static void test_column_encoding(void **state)
{
    world *w = *state;
    int64_t id = start_orders_rollout(w, KS_ENCODING_BASE64);
    ks_rollout_class target = cls(2, KS_ALG_XCHACHA20POLY1305, "payments-kek", 2);
    ks_app_options o = opts(w, 2, 0);
    o.database = w->path;
    o.instance_id = "web-enc";
    o.interval_ms = 20;
    ks_app *a = app_open(w, &o);
    ks_value_encoding enc = KS_ENCODING_BASE64;
    assert_int_equal(ks_app_column_encoding(a, "orders", "note", &enc), KS_OK);
    assert_int_equal(enc, KS_ENCODING_BASE64);
    assert_int_equal(ks_app_column_encoding(a, "ORDERS", "Note", &enc), KS_OK);
    assert_int_equal(enc, KS_ENCODING_BASE64);
    assert_int_equal(ks_app_column_encoding(a, "payments", "card", &enc), KS_OK);
    assert_int_equal(enc, KS_ENCODING_BINARY); /* no rollout: the default */
    assert_int_equal(ks_app_column_encoding(a, NULL, "card", &enc), KS_ERR_INVALID_ARGUMENT);

    /* planned: plaintext is written and read as it is */
    ks_app_record r = {"orders", "note", {(const uint8_t *)"t", 1}, {(const uint8_t *)"o:1", 3},
                       {NULL, 0}};
    uint8_t out[1024], bin[1024];
    ks_rollout_class c;
    size_t n = seal(a, &r, "hello", out, &c);
    assert_true(c.is_plaintext);
    assert_int_equal(n, 5);
    opens_to(a, &r, out, n, "hello");

    /* backfill: the target, as base64 text, which open and may_read decode */
    move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT);
    move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE);
    move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL);
    n = seal(a, &r, "secret", out, &c);
    assert_true(ks_rollout_class_equal(&c, &target));
    assert_true(n <= ks_app_seal_max_len(6));
    assert_memory_equal(out, "S1NF", 4);
    opens_to(a, &r, out, n, "secret");
    int ok = 0;
    assert_int_equal(ks_app_may_read(a, "orders", "note", out, n, &ok), KS_OK);
    assert_int_equal(ok, 1);
    size_t bn = 0;
    assert_int_equal(ks_envelope_text_decode(out, n, NULL, bin, sizeof bin, &bn, NULL), KS_OK);
    assert_int_equal(open_err(a, &r, bin, bn), KS_ERR_BAD_MAGIC); /* [F-TEXT-4] */
    assert_int_equal(ks_app_may_read(a, "orders", "note", bin, bn, &ok), KS_OK);
    assert_int_equal(ok, 0);
    out[n - 2] = out[n - 2] == 'A' ? 'B' : 'A'; /* not canonical, or another envelope */
    assert_int_not_equal(open_err(a, &r, out, n), KS_OK);
    uint8_t up[1024];
    size_t un = 0;
    assert_int_equal(ks_app_seal_update(a, &r, out, n, (const uint8_t *)"new", 3, up,
                                        sizeof up, &un, &c), KS_OK);
    assert_memory_equal(up, "S1NF", 4);
    opens_to(a, &r, up, un, "new");
    ks_app_item items[2] = {
        {{(const uint8_t *)"t", 1}, {(const uint8_t *)"o:1", 3}, {NULL, 0},
         {(const uint8_t *)"b1", 2}, out, sizeof out, 0, KS_OK, {0}},
        {{(const uint8_t *)"t", 1}, {(const uint8_t *)"o:1", 3}, {NULL, 0},
         {(const uint8_t *)"b2", 2}, bin, sizeof bin, 0, KS_OK, {0}},
    };
    assert_int_equal(ks_app_seal_batch(a, "orders", "note", items, 2), KS_OK);
    assert_memory_equal(out, "S1NF", 4);
    assert_memory_equal(bin, "S1NF", 4);
    ks_app_close(a);

    /* no database: default_encoding chooses; a bad one is refused */
    ks_app_options od = opts(w, 2, 0);
    od.default_encoding = KS_ENCODING_BASE64;
    ks_app *d = app_open(w, &od);
    assert_int_equal(ks_app_column_encoding(d, "payments", "card", &enc), KS_OK);
    assert_int_equal(enc, KS_ENCODING_BASE64);
    ks_app_record pr = rec("t2", "payments:9:card");
    n = seal(d, &pr, "plain-db", out, &c);
    assert_memory_equal(out, "S1NF", 4);
    opens_to(d, &pr, out, n, "plain-db");
    ks_app_close(d);
    od.default_encoding = (ks_value_encoding)7;
    ks_app *bad = NULL;
    assert_int_equal(ks_app_open(&od, &bad, w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    assert_null(bad);
}

/* ks_app_metrics and ks_app_health_sample: the contexts' counters and
 * health totals, zero for NULL app. */
static void test_metrics(void **state)
{
    world *w = *state;
    ks_app_metrics(NULL, NULL); /* a no-op */
    ks_metrics m;
    memset(&m, 0xAB, sizeof m);
    ks_app_metrics(NULL, &m);
    assert_int_equal(m.seals, 0);
    assert_int_equal(m.wraps, 0);
    ks_app_options o = opts(w, 2, 0);
    ks_app *a = app_open(w, &o);
    ks_app_metrics(a, &m);
    assert_int_equal(m.seals + m.opens + m.wraps + m.unwraps, 0);
    ks_app_record r = rec("acme", "payments:1:card");
    uint8_t env[1024];
    ks_rollout_class c;
    size_t n = seal(a, &r, "4111", env, &c);
    opens_to(a, &r, env, n, "4111");
    opens_to(a, &r, env, n, "4111");
    ks_app_metrics(a, &m);
    assert_int_equal(m.seals, 1);
    assert_int_equal(m.opens, 2);
    assert_int_equal(m.wraps, 1);
    /* the health totals: the same counts, each timed, with a latency sum */
    ks_health_sample h;
    ks_app_health_sample(a, &h);
    assert_int_equal(h.seals, 1);
    assert_int_equal(h.opens, 2);
    assert_int_equal(h.provider_calls, m.wraps + m.unwraps);
    uint64_t timed_seals = 0, timed_opens = 0;
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++) {
        timed_seals += h.seal_ns.bucket[i];
        timed_opens += h.open_ns.bucket[i];
    }
    assert_int_equal(timed_seals, 1);
    assert_int_equal(timed_opens, 2);
    assert_true(h.seal_ns_sum > 0 && h.open_ns_sum > 0);
    assert_int_equal(h.time, 0);

    /* A sound header over a body the strict parse refuses (one byte
     * past the ciphertext): classed by its header, refused with the
     * parser's code and offset, and counted as that parse error. */
    uint8_t longer[1025], pt[1024];
    memcpy(longer, env, n);
    longer[n] = 0;
    ks_parse_error perr = {0, 0, 0};
    size_t pn = 99;
    ks_err err = ks_app_open_value(a, &r, longer, n + 1, pt, sizeof pt, &pn, NULL, &perr);
    assert_true(err > KS_OK && err < 32);
    assert_int_equal(perr.code, err);
    assert_true(perr.offset > 0 && perr.offset <= n);
    assert_int_equal(pn, 0);
    ks_app_metrics(a, &m);
    assert_int_equal(m.parse_errors[err], 1);
    assert_int_equal(m.opens, 2);
    ks_app_close(a);
    memset(&h, 0xAB, sizeof h);
    ks_app_health_sample(NULL, &h);
    assert_true(h.seals == 0 && h.seal_ns_sum == 0 && h.open_ns.bucket[0] == 0);
    ks_app_health_sample(NULL, NULL); /* a no-op */
}

#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_round_trips), cmocka_unit_test(test_error_classes),
        T(test_errors),      T(test_policy_sqlite), T(test_default_periods),
        T(test_shared_registration),
        T(test_registry_error_position),
        T(test_policy_plaintext), T(test_batch),
        T(test_parse),       T(test_env_keyring),
        T(test_open_alloc_faults), T(test_threads),
        T(test_update_and_may_read), T(test_pg_keyword_string),
        T(test_text), T(test_column_encoding), T(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
