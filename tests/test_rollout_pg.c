/*
 * tests/test_rollout_pg.c -- the PostgreSQL rollout store
 * (keyshift/rollout_store_pg.h, migrate/store/pg/rollout_pg*.c): the
 * rollout-store contract op by op (opening and the schema, find_column,
 * the rows, strict decoding, the append-only log, data_version and
 * snapshots, readers and metrics, the lock timeout, rollback of a failed
 * change, the documented privileges).  Racing, the whole lifecycle and
 * the policy are tests/test_rollout_pg_life.c's.
 *
 * The group setup starts a throw-away cluster (tests/pg_test.h); each
 * test starts from an empty public schema.  A second libpq connection
 * (the "admin") plays other processes: it corrupts rows and tries to
 * edit the log.  No test passes or fails on a measured duration.
 */
#define _POSIX_C_SOURCE 200809L
#include "rollout_pg_test.h"

/* A row for store ops: spec() as the store would be given it (planned
 * at now). */
static ks_rollout row(const char *table, const char *column, int64_t now)
{
    ks_rollout r = spec(table, column);
    r.phase = KS_PHASE_PLANNED;
    r.phase_since = r.created = r.updated = now;
    return r;
}

/* ---- the store's contract ------------------------------------------------------ */

/* Opening creates every table, the index and the triggers; a second
 * open finds them; a read-only store on a database without them reads
 * nothing and refuses to write. */
static void test_open_creates_schema(void **state)
{
    world *w = *state;
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM pg_class WHERE relname IN "
                                  "('keyshift_meta', 'keyshift_rollout', "
                                  "'keyshift_rollout_column', 'keyshift_rollout_log', "
                                  "'keyshift_readers', 'keyshift_metrics', "
                                  "'keyshift_rollout_version', 'keyshift_rollout_open')"),
                     8);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT value FROM keyshift_meta "
                                  "WHERE key = 'rollout_schema_version'"),
                     2);
    ks_rollout_store *again = open_store(w, 0);
    again->ops->close(again);
    /* read-only over the tables: reads work, writes refuse */
    ks_rollout_store *ro = open_store(w, 1);
    assert_int_equal(ro->ops->begin(ro), KS_ERR_INVALID_ARGUMENT);
    ks_rollout_reader r = reader("ro", "");
    assert_int_equal(ro->ops->reader_put(ro, &r, 1), KS_ERR_INVALID_ARGUMENT);
    ro->ops->close(ro);
    /* read-only without tables: nothing found, nothing created */
    ks_pg_test_exec(w->admin, "DROP SCHEMA public CASCADE");
    ks_pg_test_exec(w->admin, "CREATE SCHEMA public");
    ro = open_store(w, 1);
    ks_rollout got;
    size_t n = 9, total = 9;
    int64_t dv = -1;
    assert_int_equal(ro->ops->get(ro, 1, &got), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ro->ops->readers_live(ro, 0, &r, 1, &n, &total), KS_OK);
    assert_int_equal(n + total, 0);
    assert_int_equal(ro->ops->data_version(ro, &dv), KS_OK);
    assert_int_equal(dv, 0);
    assert_int_equal(ro->ops->begin(ro), KS_ERR_INVALID_ARGUMENT);
    ro->ops->close(ro);
    assert_int_equal(
        ks_pg_test_int(w->admin, "SELECT count(*) FROM pg_class WHERE relname = 'keyshift_rollout'"), 0);
    /* a schema newer than this library is refused */
    ro = open_store(w, 0);
    ro->ops->close(ro);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_meta SET value = 99 WHERE key = 'rollout_schema_version'");
    assert_int_equal(ks_rollout_store_pg_open(ks_pg_test_conninfo, 0, &ro, w->err, sizeof w->err),
                     KS_ERR_STORE);
    assert_null(ro);
    assert_non_null(strstr(w->err, "newer"));
    /* an unreachable server */
    assert_int_equal(ks_rollout_store_pg_open("host=/nonexistent-dir port=1", 0, &ro, w->err,
                                              sizeof w->err),
                     KS_ERR_UNAVAILABLE);
}

/* find_column: the catalog's spelling, folded ASCII-only; missing
 * tables and columns, keyshift's tables, primary-key and generated
 * columns refused. */
static void test_find_column(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    char t[KS_ROLLOUT_IDENT_MAX + 1], c[KS_ROLLOUT_IDENT_MAX + 1];
    assert_int_equal(s->ops->find_column(s, "PAYMENTS", "Card", t, c, w->err, sizeof w->err),
                     KS_OK);
    assert_string_equal(t, "payments");
    assert_string_equal(c, "card");
    assert_int_equal(s->ops->find_column(s, "nope", "card", t, c, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    assert_int_equal(s->ops->find_column(s, "payments", "nope", t, c, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    assert_int_equal(s->ops->find_column(s, "KeyShift_rollout", "tbl", t, c, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(s->ops->find_column(s, "payments", "id", t, c, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(s->ops->find_column(s, "payments", "twice", t, c, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    /* a non-ASCII capital is not folded (as ks_rollout_name_cmp) */
    ks_pg_test_exec(w->admin, "CREATE TABLE \"\xc3\xa9t\xc3\xa9\"(id bigint PRIMARY KEY, v bytea)");
    assert_int_equal(s->ops->find_column(s, "\xc3\x89T\xc3\x89", "v", t, c, w->err, sizeof w->err),
                     KS_ERR_NO_TARGET);
    assert_int_equal(s->ops->find_column(s, "\xc3\xa9T\xc3\xa9", "V", t, c, w->err, sizeof w->err),
                     KS_OK);
    /* two spellings that fold alike: the exact one, else ambiguous */
    ks_pg_test_exec(w->admin, "CREATE TABLE \"Payments\"(id bigint PRIMARY KEY, card bytea)");
    assert_int_equal(s->ops->find_column(s, "Payments", "card", t, c, w->err, sizeof w->err),
                     KS_OK);
    assert_string_equal(t, "Payments");
    assert_int_equal(s->ops->find_column(s, "PAYMENTS", "card", t, c, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
}

/* insert, get, latest, list, find_open, later_count, set_phase,
 * set_canary, set_verified: what each returns; the open-rollout index
 * folds names; a key scope keeps its columns in order. */
static void test_rollout_rows(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    assert_int_equal(s->ops->begin(s), KS_OK);
    ks_rollout r = row("payments", "card", 100);
    int64_t id = 0, id2 = 0, n = -1;
    assert_int_equal(s->ops->insert(s, &r, &id), KS_OK);
    assert_true(id > 0);
    ks_rollout dup = row("PAYMENTS", "CARD", 100);
    assert_int_equal(s->ops->insert(s, &dup, &id2), KS_ERR_ROLLOUT_EXISTS);
    s->ops->rollback(s);
    /* the rollback undid the first insert too */
    ks_rollout got;
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_NO_ROLLOUT);

    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->insert(s, &r, &id), KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_string_equal(got.table, "payments");
    assert_int_equal(got.phase, KS_PHASE_PLANNED);
    assert_int_equal(got.created, 100);
    assert_true(ks_rollout_class_equal(&got.target, &r.target));
    assert_true(got.source.is_plaintext);
    assert_true(got.thresholds.max_auth_failure_rate == r.thresholds.max_auth_failure_rate);
    assert_int_equal(s->ops->latest(s, "Payments", "Card", &got), KS_OK);
    assert_int_equal(got.id, id);
    assert_int_equal(s->ops->latest(s, "payments", "tenant", &got), KS_ERR_NO_ROLLOUT);
    assert_int_equal(s->ops->find_open(s, "PAYMENTS", "card", NULL, 1, &id2), KS_OK);
    assert_int_equal(id2, id);
    assert_int_equal(s->ops->find_open(s, "payments", "tenant", NULL, 1, &id2), KS_OK);
    assert_int_equal(id2, 0);

    assert_int_equal(s->ops->begin(s), KS_OK);
    /* a wrong "from" changes nothing */
    assert_int_equal(s->ops->set_phase(s, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, 200),
                     KS_ERR_STORE);
    s->ops->rollback(s);
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->set_phase(s, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, 200), KS_OK);
    ks_rollout_canary cn = {.kind = KS_CANARY_TENANTS, .n_tenants = 2,
                            .tenants = {"acme", "globex"}};
    assert_int_equal(s->ops->set_canary(s, id, &cn, 210), KS_OK);
    assert_int_equal(s->ops->set_verified(s, id, NULL, NULL, 220), KS_OK);
    assert_int_equal(s->ops->set_verified(s, id + 100, NULL, NULL, 220), KS_ERR_STORE);
    s->ops->rollback(s);
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->set_phase(s, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, 200), KS_OK);
    assert_int_equal(s->ops->set_canary(s, id, &cn, 210), KS_OK);
    assert_int_equal(s->ops->set_verified(s, id, NULL, NULL, 220), KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(got.phase, KS_PHASE_READ_COMPAT);
    assert_int_equal(got.phase_since, 200);
    assert_int_equal(got.canary.kind, KS_CANARY_TENANTS);
    assert_int_equal(got.canary.n_tenants, 2);
    assert_string_equal(got.canary.tenants[1], "globex");
    assert_int_equal(got.verified_at, 220);
    assert_int_equal(got.updated, 220);

    /* a key scope listing payments.card: its columns in order */
    ks_rollout k = {.scope = KS_SCOPE_KEY, .source = cls("kk", 1), .target = cls("kk", 2),
                    .phase = KS_PHASE_PLANNED, .reader_ttl_s = 30, .n_columns = 2};
    ks_thresholds_default(&k.thresholds);
    snprintf(k.columns[0].table, sizeof k.columns[0].table, "payments");
    snprintf(k.columns[0].column, sizeof k.columns[0].column, "tenant");
    snprintf(k.columns[1].table, sizeof k.columns[1].table, "payments");
    snprintf(k.columns[1].column, sizeof k.columns[1].column, "card");
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->insert(s, &k, &id2), KS_OK);
    assert_int_equal(s->ops->set_verified(s, id2, "PAYMENTS", "Tenant", 300), KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    assert_int_equal(s->ops->latest_key(s, "kk", &got), KS_OK);
    assert_int_equal(got.id, id2);
    assert_int_equal(got.scope, KS_SCOPE_KEY);
    assert_int_equal(got.n_columns, 2);
    assert_string_equal(got.columns[0].column, "tenant");
    assert_int_equal(got.columns[0].verified_at, 300);
    assert_string_equal(got.columns[1].column, "card");
    assert_int_equal(s->ops->find_open(s, NULL, NULL, "kk", 0, &n), KS_OK);
    assert_int_equal(n, id2);
    assert_int_equal(s->ops->find_open(s, "payments", "tenant", NULL, 0, &n), KS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(s->ops->find_open(s, "payments", "TENANT", NULL, 1, &n), KS_OK);
    assert_int_equal(n, id2);
    /* the column rollout has a later key-scoped one listing its column */
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(s->ops->later_count(s, &got, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(s->ops->get(s, id2, &got), KS_OK);
    assert_int_equal(s->ops->later_count(s, &got, &n), KS_OK);
    assert_int_equal(n, 0);
    /* entering backfill clears the listed columns' verify times */
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->set_phase(s, id2, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, 400), KS_OK);
    assert_int_equal(s->ops->set_phase(s, id2, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, 401),
                     KS_OK);
    assert_int_equal(s->ops->set_phase(s, id2, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, 402),
                     KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    assert_int_equal(s->ops->get(s, id2, &got), KS_OK);
    assert_int_equal(got.columns[0].verified_at, 0);
    ks_rollout all[4];
    size_t m = 0;
    assert_int_equal(s->ops->list(s, 0, all, 4, &m), KS_OK);
    assert_int_equal(m, 2);
    assert_int_equal(all[1].n_columns, 2);
    assert_int_equal(s->ops->list(s, id, all, 4, &m), KS_OK);
    assert_int_equal(m, 1);
    assert_int_equal(all[0].id, id2);
}

/* A row the store cannot decode strictly is KS_ERR_STORE: an unknown
 * phase, a percent out of range, a histogram of the wrong length, a
 * NULL where a value must be. */
static void test_strict_rows(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    ks_rollout r = row("payments", "card", 100), got;
    int64_t id = 0;
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->insert(s, &r, &id), KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET phase = 'bogus'");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET phase = 'planned', canary_percent = 101");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET canary_percent = 0, src_format = 256");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET src_format = 0, window_s = 0");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET window_s = 60, canary_tenants = 'x'");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET canary_tenants = '', "
                  "max_auth_failure_rate = 'NaN'");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET max_auth_failure_rate = 0, "
                  "encoding = 'hex'");
    assert_int_equal(s->ops->get(s, id, &got), KS_ERR_STORE);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET encoding = 'binary'");
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    ks_health_sample h = {.time = 5, .seals = 1};
    assert_int_equal(s->ops->metrics_insert(s, id, "web-1", "app", &h), KS_OK);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_metrics SET seal_ns = '\\x00'");
    assert_int_equal(s->ops->metrics_sum(s, id, 0, NULL, &h), KS_ERR_STORE);
    assert_int_equal(h.seals, 0);
    ks_rollout_reader rd = reader("web-1", "k:1");
    assert_int_equal(s->ops->reader_put(s, &rd, 10), KS_OK);
    ks_pg_test_exec(w->admin, "UPDATE keyshift_readers SET max_format = 0");
    size_t n = 0, total = 0;
    assert_int_equal(s->ops->readers_live(s, 0, &rd, 1, &n, &total), KS_ERR_STORE);
    assert_int_equal(s->ops->log_append(s, id, 1, "alice", 0, KS_PHASE_PLANNED, "x", 0), KS_OK);
    ks_rollout_log_entry e;
    assert_int_equal(s->ops->log_list(s, 0, 0, &e, 1, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(e.from, 0);
    assert_int_equal(e.to, KS_PHASE_PLANNED);
    /* the log cannot be edited to be made bad, or at all */
    assert_int_equal(admin_try(w, "UPDATE keyshift_rollout_log SET to_phase = 'bogus'"),
                     PGRES_FATAL_ERROR);
}

/* The rollout's encoding: inserted and read back; a version 1 database
 * (no encoding column) reads as binary read-only without a change, and a
 * writer upgrades it to version 2 in place, keeping its rollouts. */
static void test_encoding_upgrade(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    ks_rollout r = row("payments", "card", 100), got;
    r.encoding = KS_ENCODING_BASE64;
    int64_t id = 0;
    assert_int_equal(s->ops->begin(s), KS_OK);
    assert_int_equal(s->ops->insert(s, &r, &id), KS_OK);
    assert_int_equal(s->ops->commit(s), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(got.encoding, KS_ENCODING_BASE64);
    assert_int_equal(s->ops->latest(s, "payments", "card", &got), KS_OK);
    assert_int_equal(got.encoding, KS_ENCODING_BASE64);
    ks_pg_test_exec(w->admin, "ALTER TABLE keyshift_rollout DROP COLUMN encoding");
    ks_pg_test_exec(w->admin, "UPDATE keyshift_meta SET value = 1 "
                              "WHERE key = 'rollout_schema_version'");
    ks_rollout_store *ro = open_store(w, 1);
    assert_int_equal(ro->ops->get(ro, id, &got), KS_OK);
    assert_int_equal(got.encoding, KS_ENCODING_BINARY);
    ro->ops->close(ro);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT value FROM keyshift_meta "
                                  "WHERE key = 'rollout_schema_version'"),
                     1);
    ks_rollout_store *rw = open_store(w, 0);
    assert_int_equal(rw->ops->get(rw, id, &got), KS_OK);
    assert_int_equal(got.encoding, KS_ENCODING_BINARY);
    rw->ops->close(rw);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT value FROM keyshift_meta "
                                  "WHERE key = 'rollout_schema_version'"),
                     2);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout "
                                  "WHERE encoding = 'binary'"),
                     1);
}

/* The samples' latency sums: stored and summed; a version 2 database
 * without the sum columns (as a library without them made it) sums them
 * as 0 read-only without a change, and a writer adds the columns in
 * place, keeping its samples (their sums 0) and the schema version (2);
 * a sample inserted as a library without the sums inserts it (its
 * columns by name) is still stored, with sums of 0, so older instances
 * keep working; a negative sum stored by hand is a bad row. */
static void test_metrics_sums_upgrade(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    ks_health_sample h = {.time = 100, .seals = 2, .opens = 1};
    h.seal_ns.bucket[3] = 2;
    h.open_ns.bucket[4] = 1;
    h.seal_ns_sum = 2500;
    h.open_ns_sum = UINT64_C(9000000000000);
    ks_health_sample sum;
    assert_int_equal(s->ops->metrics_insert(s, 1, "web-1", "app", &h), KS_OK);
    assert_int_equal(s->ops->metrics_sum(s, 1, 0, NULL, &sum), KS_OK);
    assert_true(sum.seal_ns_sum == 2500 && sum.open_ns_sum == UINT64_C(9000000000000));
    ks_pg_test_exec(w->admin, "ALTER TABLE keyshift_metrics DROP COLUMN seal_ns_sum, "
                              "DROP COLUMN open_ns_sum");
    ks_rollout_store *ro = open_store(w, 1);
    assert_int_equal(ro->ops->metrics_sum(ro, 1, 0, NULL, &sum), KS_OK);
    assert_int_equal(sum.seals, 2);
    assert_true(sum.seal_ns_sum == 0 && sum.open_ns_sum == 0);
    ro->ops->close(ro);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT value FROM keyshift_meta "
                                  "WHERE key = 'rollout_schema_version'"),
                     2);
    ks_rollout_store *rw = open_store(w, 0);
    assert_int_equal(rw->ops->metrics_insert(rw, 1, "web-1", "app", &h), KS_OK);
    assert_int_equal(rw->ops->metrics_sum(rw, 1, 0, NULL, &sum), KS_OK);
    assert_int_equal(sum.seals, 4);
    assert_true(sum.seal_ns_sum == 2500 && sum.open_ns_sum == UINT64_C(9000000000000));
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT value FROM keyshift_meta "
                                  "WHERE key = 'rollout_schema_version'"),
                     2);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_metrics "
                                  "WHERE seal_ns_sum = 0 AND open_ns_sum = 0"),
                     1);
    /* an older library's insert: the version 2 columns by name */
    ks_pg_test_exec(w->admin, "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, "
                              "time, seals, opens, auth_failures, parse_errors, provider_calls, "
                              "provider_errors, seal_ns, open_ns) SELECT rollout_id, 'old-1', "
                              "source, time, seals, opens, auth_failures, parse_errors, "
                              "provider_calls, provider_errors, seal_ns, open_ns FROM "
                              "keyshift_metrics WHERE instance_id = 'web-1' LIMIT 1");
    assert_int_equal(rw->ops->metrics_sum(rw, 1, 0, NULL, &sum), KS_OK);
    assert_int_equal(sum.seals, 6);
    assert_true(sum.seal_ns_sum == 2500 && sum.open_ns_sum == UINT64_C(9000000000000));
    ks_pg_test_exec(w->admin, "UPDATE keyshift_metrics SET open_ns_sum = -1");
    assert_int_equal(rw->ops->metrics_sum(rw, 1, 0, NULL, &sum), KS_ERR_STORE);
    rw->ops->close(rw);
}

/* The log is append-only for every connection: UPDATE, DELETE and
 * TRUNCATE by another one fail and change nothing. */
static void test_log_append_only(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s;
    assert_int_equal(s->ops->log_append(s, 1, 10, "alice", 0, KS_PHASE_PLANNED, "start", 0), KS_OK);
    assert_int_equal(s->ops->log_append(s, 1, 11, "bob", KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT,
                                        NULL, 1),
                     KS_OK);
    assert_int_equal(admin_try(w, "UPDATE keyshift_rollout_log SET reason = 'forged'"),
                     PGRES_FATAL_ERROR);
    assert_int_equal(admin_try(w, "DELETE FROM keyshift_rollout_log"), PGRES_FATAL_ERROR);
    assert_int_equal(admin_try(w, "TRUNCATE keyshift_rollout_log"), PGRES_FATAL_ERROR);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout_log"), 2);
    ks_rollout_log_entry e[4];
    size_t n = 0;
    assert_int_equal(s->ops->log_list(s, 1, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(e[1].actor, "bob");
    assert_int_equal(e[1].from, KS_PHASE_PLANNED);
    assert_int_equal(e[1].automatic, 1);
    assert_string_equal(e[1].reason, "");
    assert_int_equal(s->ops->log_list(s, 1, e[0].id, e, 4, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(s->ops->log_list(s, 2, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 0);
}

/* data_version changes when another connection commits a change of a
 * rollout, not when it only heartbeats; snapshot holds one view. */
static void test_data_version_snapshot(void **state)
{
    world *w = *state;
    ks_rollout_store *s = w->s, *o = open_store(w, 0);
    int64_t v0 = 0, v1 = 0, v2 = 0, id = 0;
    assert_int_equal(s->ops->data_version(s, &v0), KS_OK);
    ks_rollout r = row("payments", "card", 100), got;
    assert_int_equal(o->ops->begin(o), KS_OK);
    assert_int_equal(o->ops->insert(o, &r, &id), KS_OK);
    assert_int_equal(s->ops->data_version(s, &v1), KS_OK);
    assert_int_equal(v1, v0); /* not committed yet */
    assert_int_equal(o->ops->commit(o), KS_OK);
    assert_int_equal(s->ops->data_version(s, &v1), KS_OK);
    assert_true(v1 != v0);
    ks_rollout_reader rd = reader("web-1", "k:1");
    assert_int_equal(o->ops->reader_put(o, &rd, 10), KS_OK);
    assert_int_equal(o->ops->reader_heartbeat(o, "web-1", 11), KS_OK);
    assert_int_equal(s->ops->data_version(s, &v2), KS_OK);
    assert_int_equal(v2, v1);
    /* a snapshot does not see a commit made after it began */
    assert_int_equal(s->ops->snapshot(s, 1), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(o->ops->begin(o), KS_OK);
    assert_int_equal(o->ops->set_phase(o, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, 200), KS_OK);
    assert_int_equal(o->ops->commit(o), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(got.phase, KS_PHASE_PLANNED);
    assert_int_equal(s->ops->snapshot(s, 0), KS_OK);
    assert_int_equal(s->ops->get(s, id, &got), KS_OK);
    assert_int_equal(got.phase, KS_PHASE_READ_COMPAT);
    assert_int_equal(s->ops->data_version(s, &v2), KS_OK);
    assert_true(v2 != v1);
    /* a direct change by someone else bumps it too */
    ks_pg_test_exec(w->admin, "UPDATE keyshift_rollout SET updated = updated + 1");
    assert_int_equal(s->ops->data_version(s, &v1), KS_OK);
    assert_true(v1 != v2);
    o->ops->close(o);
}

/* Readers: put (insert or replace), heartbeat (KS_ERR_NOT_FOUND when
 * gone), delete, live by heartbeat and TTL through the rollout layer;
 * metrics: the sum of a window. */
static void test_readers_metrics(void **state)
{
    world *w = *state;
    wrap(w);
    ks_rollout_reader a = reader("web-2", "k:1"), b = reader("web-1", ""), out[4];
    assert_int_equal(ks_rollout_db_reader_register(w->db, &a, 1000), KS_OK);
    assert_int_equal(ks_rollout_db_reader_register(w->db, &b, 1000), KS_OK);
    b.max_format = 1;
    assert_int_equal(ks_rollout_db_reader_register(w->db, &b, 1010), KS_OK); /* replaced */
    size_t n = 0;
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1020, out, 4, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(out[0].instance_id, "web-1");
    assert_int_equal(out[0].max_format, 1);
    assert_int_equal(out[0].started, 1010);
    /* web-2 expires at 1031; its heartbeat brings it back */
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1035, out, 4, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].instance_id, "web-1");
    assert_int_equal(ks_rollout_db_reader_heartbeat(w->db, "web-2", 1036), KS_OK);
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, 1040, out, 4, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "web-2"), KS_OK);
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "web-2"), KS_OK);
    assert_int_equal(ks_rollout_db_reader_heartbeat(w->db, "web-2", 1041), KS_ERR_NOT_FOUND);

    ks_health_sample s1 = {.time = 100, .seals = 10, .opens = 5, .auth_failures = 1};
    ks_health_sample s2 = {.time = 200, .seals = 7, .opens = 1, .provider_calls = 3};
    s1.seal_ns.bucket[3] = 10;
    s2.seal_ns.bucket[3] = 2;
    s2.open_ns.bucket[KS_HIST_BUCKETS - 1] = UINT64_MAX;
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "web-1", "app", &s1), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 1, "mig", "migrate", &s2), KS_OK);
    assert_int_equal(ks_rollout_db_metrics_insert(w->db, 2, "web-1", "app", &s1), KS_OK);
    ks_health_sample sum;
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 0, &sum), KS_OK);
    assert_int_equal(sum.seals, 17);
    assert_int_equal(sum.opens, 6);
    assert_int_equal(sum.auth_failures, 1);
    assert_int_equal(sum.provider_calls, 3);
    assert_int_equal(sum.seal_ns.bucket[3], 12);
    assert_true(sum.open_ns.bucket[KS_HIST_BUCKETS - 1] == UINT64_MAX);
    assert_int_equal(sum.time, 200);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 150, &sum), KS_OK);
    assert_int_equal(sum.seals, 7);
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, 1, 201, &sum), KS_OK);
    assert_int_equal(sum.seals, 0);
    assert_int_equal(sum.time, 0);
    /* one source: the applications' health apart from the migration's */
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, "app", &sum), KS_OK);
    assert_int_equal(sum.seals, 10);
    assert_int_equal(sum.auth_failures, 1);
    assert_int_equal(ks_rollout_db_metrics_sum_source(w->db, 1, 0, "migrate", &sum), KS_OK);
    assert_int_equal(sum.seals, 7);
    assert_int_equal(sum.provider_calls, 3);
}

/* Abort removes the rollout and its listed columns, keeps its log (with
 * the actor and reason) and frees the scope; set changes the thresholds
 * and soak times, logging old and new values. */
static void test_abort_and_set(void **state)
{
    world *w = *state;
    wrap(w);
    ks_pg_test_exec(w->admin, "CREATE TABLE orders(id bigint PRIMARY KEY, card bytea)");
    ks_rollout sp = spec("payments", "card"), got;
    int64_t id = 0, id2 = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_OK);
    ks_thresholds t = sp.thresholds;
    t.min_samples = 10;
    char changes[256];
    assert_int_equal(ks_rollout_db_set_settings(w->db, id, &t, sp.min_soak_s, 45, "bob",
                                                "few samples", 1010, changes, sizeof changes),
                     KS_OK);
    assert_non_null(strstr(changes, "min_samples"));
    assert_non_null(strstr(changes, "-> 10"));
    assert_int_equal(ks_rollout_db_get(w->db, id, &got), KS_OK);
    assert_int_equal(got.thresholds.min_samples, 10);
    assert_int_equal(got.reader_ttl_s, 45);
    ks_rollout_facts f = {.now = 1020};
    assert_int_equal(ks_rollout_db_abort(w->db, id, KS_PHASE_PLANNED, &f, "bob", "typo", w->err,
                                         sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id, &got), KS_ERR_NO_ROLLOUT);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout_log "
                                              "WHERE actor = 'bob' AND reason = 'aborted: typo'"),
                     1);
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1030, &id2, w->err, sizeof w->err),
                     KS_OK);
    assert_true(id2 > id);
    /* a key scope's columns go with it */
    ks_rollout ks = sp;
    ks.table[0] = ks.column[0] = '\0';
    ks.scope = KS_SCOPE_KEY;
    ks.source = cls("k", 1);
    ks.target = cls("k", 2);
    ks.n_columns = 1;
    strcpy(ks.columns[0].table, "orders");
    strcpy(ks.columns[0].column, "card");
    int64_t id3 = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &ks, "alice", 1040, &id3, w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_abort(w->db, id3, KS_PHASE_PLANNED, &f, "bob", "wrong key",
                                         w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout_column"), 0);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout"), 1);
}


/* A writer that cannot get the write lock within the store's
 * lock_timeout gets KS_ERR_BUSY (SQLSTATE 55P03), its transaction rolled
 * back, and can begin once the holder commits. */
static void test_lock_timeout_busy(void **state)
{
    world *w = *state;
    ks_rollout_store *o = open_store(w, 0);
    assert_int_equal(w->s->ops->begin(w->s), KS_OK);
    assert_int_equal(o->ops->begin(o), KS_ERR_BUSY); /* after KS_ROLLOUT_PG_LOCK_TIMEOUT_MS */
    assert_int_equal(w->s->ops->commit(w->s), KS_OK);
    assert_int_equal(o->ops->begin(o), KS_OK);
    assert_int_equal(o->ops->commit(o), KS_OK);
    /* commit without a transaction is refused */
    assert_int_equal(o->ops->commit(o), KS_ERR_INVALID_ARGUMENT);
    o->ops->close(o);
}

/* A change whose log row cannot be written leaves nothing behind: the
 * rollout layer rolls the store's transaction back (here another
 * process's trigger refuses the log row), and the next change works. */
static void test_failed_change_rolls_back(void **state)
{
    world *w = *state;
    wrap(w);
    ks_pg_test_exec(w->admin, "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                  "$f$BEGIN RAISE EXCEPTION 'refused'; END$f$");
    ks_pg_test_exec(w->admin, "CREATE TRIGGER refuse BEFORE INSERT ON keyshift_rollout_log "
                  "FOR EACH ROW EXECUTE FUNCTION refuse()");
    int64_t id = 0;
    long long v0 = ks_pg_test_int(w->admin, "SELECT version FROM keyshift_rollout_version");
    ks_rollout sp = spec("payments", "card");
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_ERR_STORE);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout"), 0);
    /* the counter's bump was rolled back with the insert */
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT version FROM keyshift_rollout_version"), v0);
    ks_pg_test_exec(w->admin, "DROP TRIGGER refuse ON keyshift_rollout_log");
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout_log"), 1);
}

/* A role with only the privileges docs/rollout.md lists (the tables
 * made by another role) runs a rollout, registers a reader and reports
 * samples; it cannot edit the log. */
static void test_least_privilege(void **state)
{
    world *w = *state;
    ks_pg_test_exec(w->admin, "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'ks_app') THEN "
                  "DROP OWNED BY ks_app; DROP ROLE ks_app; END IF; END$$");
    ks_pg_test_exec(w->admin, "CREATE ROLE ks_app LOGIN");
    ks_pg_test_exec(w->admin, "GRANT USAGE ON SCHEMA public TO ks_app");
    ks_pg_test_exec(w->admin, "GRANT SELECT, INSERT, UPDATE ON keyshift_rollout, keyshift_rollout_column, "
                  "keyshift_readers, keyshift_metrics TO ks_app");
    ks_pg_test_exec(w->admin, "GRANT SELECT, INSERT ON keyshift_rollout_log TO ks_app");
    ks_pg_test_exec(w->admin, "GRANT SELECT ON keyshift_meta TO ks_app");
    ks_pg_test_exec(w->admin, "GRANT SELECT, UPDATE ON keyshift_rollout_version TO ks_app");
    ks_pg_test_exec(w->admin, "GRANT DELETE ON keyshift_readers TO ks_app");
    char conninfo[sizeof ks_pg_test_conninfo + 16];
    snprintf(conninfo, sizeof conninfo, "%s user=ks_app", ks_pg_test_conninfo);
    ks_rollout_store *as = NULL;
    ks_rollout_db *db = NULL;
    assert_int_equal(ks_rollout_store_pg_open(conninfo, 0, &as, w->err, sizeof w->err), KS_OK);
    assert_int_equal(ks_rollout_db_wrap(as, &db), KS_OK);
    ks_rollout sp = spec("payments", "card");
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(db, &sp, "app", 1000, &id, w->err, sizeof w->err), KS_OK);
    ks_rollout_facts f = {.now = 1100, .target_key_state = KS_KEY_ACTIVE};
    ks_rollout_change c = {id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, "app", "go", 0};
    assert_int_equal(ks_rollout_db_transition(db, &c, &f, w->err, sizeof w->err), KS_OK);
    ks_rollout_reader r = reader("web-1", "k:1");
    assert_int_equal(ks_rollout_db_reader_register(db, &r, 1100), KS_OK);
    assert_int_equal(ks_rollout_db_reader_deregister(db, "web-1"), KS_OK);
    ks_health_sample h = {.time = 1100, .seals = 1};
    assert_int_equal(ks_rollout_db_metrics_insert(db, id, "web-1", "app", &h), KS_OK);
    ks_rollout_log_entry e[4];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(db, id, 0, e, 4, &n), KS_OK);
    assert_int_equal(n, 2);
    ks_rollout_db_close(db);
    PGconn *app = PQconnectdb(conninfo);
    assert_int_equal(PQstatus(app), CONNECTION_OK);
    PGresult *res = PQexec(app, "DELETE FROM keyshift_rollout_log");
    assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
    PQclear(res);
    PQfinish(app);
    ks_pg_test_exec(w->admin, "DROP OWNED BY ks_app");
    ks_pg_test_exec(w->admin, "DROP ROLE ks_app");
}

/* Run the tests on one throw-away cluster. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_creates_schema, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_find_column, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_rollout_rows, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_strict_rows, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_encoding_upgrade, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_metrics_sums_upgrade, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_log_append_only, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_data_version_snapshot, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_readers_metrics, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_abort_and_set, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_lock_timeout_busy, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_failed_change_rolls_back, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_least_privilege, world_setup, world_teardown),
    };
    return cmocka_run_group_tests(tests, ks_pg_test_group_setup, ks_pg_test_group_teardown);
}
