/*
 * tools/bench_pg.c -- `build/bin/bench pg` (part of `make bench`): the
 * migration engine over the PostgreSQL row store against a raw pass over
 * the same kind of table, in the same run, on a throw-away cluster
 * (tests/pg_cluster.sh: a Unix socket in a temporary directory, removed
 * at the end).
 *
 * Two tables of KS_BENCH_PG_ROWS rows (default MIG_ROWS_DEFAULT), id
 * bigint primary key, v bytea: t holds envelopes (MIG_VALUE bytes of
 * plaintext sealed under the bench's key, version 1), r random bytes of
 * the same size.  Each repetition (KS_BENCH_PG_REPS, default 3) runs, in
 * turn:
 *   - the raw pass over r: keyset scans of MIG_BATCH rows through the row
 *     store, each batch written back as new bytes of the same size in one
 *     transaction with the store's own batched compare-and-swap (one
 *     UPDATE ... FROM unnest(...) statement), one connection;
 *   - a rewrap of t to the other key version (ks_migrate_run, 1 worker);
 *   - the raw pass again, then a reencrypt of t to the other version;
 *   - a bare scan of t through the store against ks_census_run over it.
 * Goals (issue 15): rewrap at most 1.25 times the raw pass, reencrypt at
 * most 1.4 times, the census at least 0.8 times the scan's rows/s.  The
 * server's WAL bytes per row (pg_current_wal_lsn before and after) are
 * reported for the raw pass and the migrations.  Checkpoints are deleted
 * before each migration (alternating versions would otherwise find the
 * run before the last one finished).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sodium.h>

#include <keyshift/rowstore_pg.h>

#include "bench.h"

/* The cluster script, relative to the repository's root (make bench's
 * working directory); KS_BENCH_PG_CLUSTER overrides it. */
#define PG_CLUSTER_DEFAULT "tests/pg_cluster.sh"
#define PG_REPS_DEFAULT 3
#define PG_CONNINFO_MAX 1024

/* The cluster script's path. */
static const char *cluster_script(void)
{
    const char *s = getenv("KS_BENCH_PG_CLUSTER");
    return s != NULL && s[0] != '\0' ? s : PG_CLUSTER_DEFAULT;
}

/* Run the cluster script with verb and dir; its standard output (the
 * connection string, for start) into out[0, cap).  0 when it exited 0. */
static int cluster_run(const char *verb, const char *dir, char *out, size_t cap)
{
    char a_sh[] = "sh", a_script[512], a_verb[16], a_dir[512];
    snprintf(a_script, sizeof a_script, "%s", cluster_script());
    snprintf(a_verb, sizeof a_verb, "%s", verb);
    snprintf(a_dir, sizeof a_dir, "%s", dir);
    char *argv[] = {a_sh, a_script, a_verb, a_dir, NULL};
    return bench_spawn(argv, out, cap);
}

/* Run sql (no parameters) on c; 0 when it succeeded. */
static int pg_exec(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(res);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) {
        fprintf(stderr, "bench: pg: %s: %s", sql, PQerrorMessage(c));
    }
    PQclear(res);
    return ok ? 0 : -1;
}

/* One bigint from a query without parameters, or -1. */
static long long pg_int(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    long long v = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
        v = atoll(PQgetvalue(res, 0, 0));
    }
    PQclear(res);
    return v;
}

/* The server's WAL position in bytes. */
static long long wal_pos(PGconn *c)
{
    return pg_int(c, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint");
}

/* Fill table (id bigint primary key, v bytea) with rows random values of
 * len bytes, ids 1..rows, in one transaction (values bound in binary). */
static int fill(PGconn *c, const char *table, long rows, size_t len)
{
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE TABLE %s (id bigint PRIMARY KEY, v bytea)", table);
    if (pg_exec(c, sql) != 0 || pg_exec(c, "BEGIN") != 0) {
        return -1;
    }
    snprintf(sql, sizeof sql, "INSERT INTO %s (id, v) VALUES ($1::bigint, $2::bytea)", table);
    PGresult *res = PQprepare(c, table, sql, 2, NULL);
    int rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -1;
    PQclear(res);
    uint8_t *v = malloc(len);
    if (v == NULL) {
        return -1;
    }
    for (long i = 1; rc == 0 && i <= rows; i++) {
        char id[24];
        snprintf(id, sizeof id, "%ld", i);
        randombytes_buf(v, len);
        const char *vals[2] = {id, (const char *)v};
        int lens[2] = {0, (int)len}, fmts[2] = {0, 1};
        res = PQexecPrepared(c, table, 2, vals, lens, fmts, 0);
        rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -1;
        PQclear(res);
    }
    free(v);
    return rc == 0 ? pg_exec(c, "COMMIT") : -1;
}

/* The raw pass over st: every batch scanned, its values copied out
 * (views die at the store's next call), each changed in its first byte
 * (new bytes, same size), and written back in one transaction by the
 * store's cas_batch.  Seconds into *secs; 0 when every row swapped. */
static int raw_pass(const ks_rowstore *st, long rows, double *secs)
{
    ks_row *batch = malloc(MIG_BATCH * sizeof *batch);
    ks_value *ids = malloc(MIG_BATCH * sizeof *ids), *olds = malloc(MIG_BATCH * sizeof *olds);
    const ks_value **idp = malloc(MIG_BATCH * sizeof *idp), **oldp = malloc(MIG_BATCH * sizeof *oldp);
    ks_bytes *news = malloc(MIG_BATCH * sizeof *news);
    int *swapped = malloc(MIG_BATCH * sizeof *swapped);
    uint8_t *arena = malloc((size_t)MIG_BATCH * 2 * (MIG_VALUE + 256));
    int rc = -1;
    long done = 0;
    if (batch == NULL || ids == NULL || olds == NULL || idp == NULL || oldp == NULL || news == NULL ||
        swapped == NULL || arena == NULL || st->ops->cas_batch == NULL) {
        goto out;
    }
    ks_value after = {KS_VALUE_NULL, 0, {NULL, 0}};
    double t0 = now_s();
    for (;;) {
        size_t n = 0;
        if (st->ops->scan(st->self, &after, MIG_BATCH, batch, &n) != KS_OK) {
            goto out;
        }
        if (n == 0) {
            break;
        }
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            size_t len = batch[i].value.bytes.len;
            if (off + 2 * len > (size_t)MIG_BATCH * 2 * (MIG_VALUE + 256)) {
                goto out;
            }
            uint8_t *old = arena + off, *nv = arena + off + len;
            memcpy(old, batch[i].value.bytes.ptr, len);
            memcpy(nv, old, len);
            nv[0] ^= 0x5a;
            off += 2 * len;
            ids[i] = batch[i].id;
            olds[i] = batch[i].value;
            olds[i].bytes = (ks_bytes){old, len};
            idp[i] = &ids[i];
            oldp[i] = &olds[i];
            news[i] = (ks_bytes){nv, len};
        }
        after = ids[n - 1];
        if (st->ops->begin(st->self) != KS_OK ||
            st->ops->cas_batch(st->self, n, idp, oldp, news, swapped) != KS_OK ||
            st->ops->commit(st->self) != KS_OK) {
            st->ops->rollback(st->self);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            done += swapped[i] != 0;
        }
    }
    *secs = now_s() - t0;
    rc = done == rows ? 0 : -1;
out:
    free(batch);
    free(ids);
    free(olds);
    free(idp);
    free(oldp);
    free(news);
    free(swapped);
    free(arena);
    return rc;
}

/* A bare scan of every row of st (values only counted): rows into *n,
 * seconds into *secs. */
static int scan_pass(const ks_rowstore *st, long *n_rows, double *secs)
{
    ks_row *batch = malloc(MIG_BATCH * sizeof *batch);
    if (batch == NULL) {
        return -1;
    }
    ks_value after = {KS_VALUE_NULL, 0, {NULL, 0}};
    long total = 0;
    int rc = 0;
    double t0 = now_s();
    for (;;) {
        size_t n = 0;
        if (st->ops->scan(st->self, &after, MIG_BATCH, batch, &n) != KS_OK) {
            rc = -1;
            break;
        }
        if (n == 0) {
            break;
        }
        total += (long)n;
        after = batch[n - 1].id; /* an integer id: no view to keep */
    }
    *secs = now_s() - t0;
    *n_rows = total;
    free(batch);
    return rc;
}

/* Open the PostgreSQL row store of table.v at conninfo. */
static int pg_store(const char *conninfo, const char *table, ks_rowstore *st)
{
    ks_rowstore_target t = {table, "v", NULL, NULL, {NULL}, 0};
    char err[256];
    if (ks_rowstore_pg_open(conninfo, &t, NULL, st, err, sizeof err) != KS_OK) {
        fprintf(stderr, "bench: pg store %s: %s\n", table, err);
        return -1;
    }
    return 0;
}

/* One timed migration of st to version in mode, its checkpoints deleted
 * first (outside the time): 0 when every row was done. */
static int pg_migrate(const ks_provider *prov, PGconn *c, const ks_rowstore *st, ks_migrate_mode mode,
                      uint32_t version, long rows, double *secs)
{
    ks_metrics m;
    ks_checkpoint cp;
    if (pg_exec(c, "DELETE FROM keyshift_migration") != 0 ||
        mig_run_store(prov, st, mode, MIG_KEY, version, MIG_DEK_MESSAGES, 0, secs, &m, &cp) != 0) {
        return -1;
    }
    return (long)cp.done == rows ? 0 : -1;
}

/* The repetitions: raw against rewrap, raw against reencrypt, scan
 * against census; the goal lines and the WAL figures. */
static int pg_reps(const ks_provider *prov, PGconn *c, const char *conninfo, long rows, int reps)
{
    double raw[2 * MIG_REPS_MAX], rewrap[MIG_REPS_MAX], reenc[MIG_REPS_MAX], scan[MIG_REPS_MAX],
        census[MIG_REPS_MAX];
    double r_rewrap[MIG_REPS_MAX], r_reenc[MIG_REPS_MAX], r_census[MIG_REPS_MAX];
    long long wal_raw = 0, wal_rewrap = 0, wal_reenc = 0;
    ks_rowstore st_t = {0}, st_r = {0};
    int rc = -1;
    if (pg_store(conninfo, "t", &st_t) != 0 || pg_store(conninfo, "r", &st_r) != 0) {
        goto out;
    }
    uint32_t version = 1;
    for (int i = 0; i < reps; i++) {
        /* each pair in both orders over the repetitions (odd ones run the
         * contender first), so that neither side always meets the cache
         * the other warmed */
        int first = i % 2 == 0;
        long long w0 = wal_pos(c);
        if (first && raw_pass(&st_r, rows, &raw[2 * i]) != 0) {
            goto out;
        }
        long long w1 = wal_pos(c);
        version = version == 1 ? 2 : 1;
        if (pg_migrate(prov, c, &st_t, KS_MIGRATE_REWRAP, version, rows, &rewrap[i]) != 0) {
            goto out;
        }
        long long w2 = wal_pos(c);
        if (!first && raw_pass(&st_r, rows, &raw[2 * i]) != 0) {
            goto out;
        }
        if (first && raw_pass(&st_r, rows, &raw[2 * i + 1]) != 0) {
            goto out;
        }
        version = version == 1 ? 2 : 1;
        long long w3 = wal_pos(c);
        if (pg_migrate(prov, c, &st_t, KS_MIGRATE_REENCRYPT, version, rows, &reenc[i]) != 0) {
            goto out;
        }
        long long w4 = wal_pos(c);
        if (!first && raw_pass(&st_r, rows, &raw[2 * i + 1]) != 0) {
            goto out;
        }
        if (first) {
            wal_raw += w1 - w0;
        }
        wal_rewrap += w2 - w1;
        wal_reenc += w4 - w3;
        long n = 0;
        ks_census cs;
        double t0 = 0;
        if (!first && scan_pass(&st_t, &n, &scan[i]) != 0) {
            goto out;
        }
        t0 = now_s();
        if (ks_census_run(&st_t, &cs) != KS_OK) {
            goto out;
        }
        census[i] = now_s() - t0;
        ks_census_free(&cs);
        if (first && scan_pass(&st_t, &n, &scan[i]) != 0) {
            goto out;
        }
        if (n != rows) {
            goto out;
        }
        r_rewrap[i] = rewrap[i] / raw[2 * i];
        r_reenc[i] = reenc[i] / raw[2 * i + 1];
        r_census[i] = scan[i] / census[i]; /* census rows/s over scan rows/s */
    }
    double raw_m = median(raw, 2 * reps), rewrap_m = median(rewrap, reps), reenc_m = median(reenc, reps);
    double scan_m = median(scan, reps), census_m = median(census, reps);
    mig_goal("pg-rewrap", "rewrap_s/raw_s", r_rewrap, reps, 1.25, 1, rows, rewrap_m, raw_m);
    mig_goal("pg-reencrypt", "reencrypt_s/raw_s", r_reenc, reps, 1.40, 1, rows, reenc_m, raw_m);
    mig_goal("pg-census", "census_rows_per_s/scan_rows_per_s", r_census, reps, 0.80, 0, rows, census_m,
             scan_m);
    int raw_reps = (reps + 1) / 2; /* the WAL of the raw passes run first */
    printf("{\"bench\":\"pg-wal\",\"rows\":%ld,\"reps\":%d,\"raw_bytes_per_row\":%.0f,"
           "\"rewrap_bytes_per_row\":%.0f,\"reencrypt_bytes_per_row\":%.0f}\n",
           rows, reps, (double)wal_raw / ((double)rows * raw_reps),
           (double)wal_rewrap / ((double)rows * reps), (double)wal_reenc / ((double)rows * reps));
    rc = 0;
out:
    ks_rowstore_close(&st_t);
    ks_rowstore_close(&st_r);
    return rc;
}

/* See bench.h. */
int bench_pg(void)
{
    char dir[512], cdir[512] = "", conninfo[PG_CONNINFO_MAX], unused[PG_CONNINFO_MAX];
    ks_keyring *kr = NULL;
    ks_ctx *ctx0 = NULL;
    ks_provider prov;
    PGconn *c = NULL;
    int rc = -1, started = 0;
    long rows = MIG_ROWS_DEFAULT;
    const char *env_rows = getenv("KS_BENCH_PG_ROWS");
    if (env_rows != NULL && atol(env_rows) > 0) {
        rows = atol(env_rows);
    }
    int reps = PG_REPS_DEFAULT;
    const char *env_reps = getenv("KS_BENCH_PG_REPS");
    if (env_reps != NULL && atoi(env_reps) > 0) {
        reps = atoi(env_reps) < MIG_REPS_MAX ? atoi(env_reps) : MIG_REPS_MAX;
    }
    double t_setup = now_s();
    if (bench_keyring(dir, sizeof dir, &kr, &ctx0) != 0 || ks_keyring_provider(kr, &prov) != KS_OK) {
        fprintf(stderr, "bench: pg: cannot set up the keyring\n");
        goto done;
    }
    /* its own directory: the script gives it to the cluster's user */
    snprintf(cdir, sizeof cdir, "%s/keyshift-bench-pg-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(cdir) == NULL || cluster_run("start", cdir, conninfo, sizeof conninfo) != 0) {
        fprintf(stderr, "bench: pg: cannot start a cluster with %s\n", cluster_script());
        goto done;
    }
    started = 1;
    c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK || fill(c, "t", rows, MIG_VALUE) != 0) {
        fprintf(stderr, "bench: pg: cannot fill the table\n");
        goto done;
    }
    ks_rowstore st = {0};
    ks_metrics m;
    ks_checkpoint cp;
    double secs = 0;
    if (pg_store(conninfo, "t", &st) != 0 ||
        mig_run_store(&prov, &st, KS_MIGRATE_ENCRYPT, MIG_KEY, 1, MIG_DEK_MESSAGES, 0, &secs, &m, &cp) != 0) {
        ks_rowstore_close(&st);
        goto done;
    }
    ks_rowstore_close(&st);
    uint32_t v2 = 0;
    long long env_len = pg_int(c, "SELECT octet_length(v) FROM t WHERE id = 1");
    if (env_len <= 0 || fill(c, "r", rows, (size_t)env_len) != 0 ||
        ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)MIG_KEY, sizeof MIG_KEY - 1}, &v2) != KS_OK ||
        v2 != 2 || pg_exec(c, "VACUUM ANALYZE") != 0) {
        fprintf(stderr, "bench: pg: cannot set up the tables\n");
        goto done;
    }
    printf("{\"bench\":\"pg-setup\",\"rows\":%ld,\"value_bytes\":%d,\"envelope_bytes\":%lld,\"batch\":%d,"
           "\"reps\":%d,\"workers\":1,\"server\":\"%s\",\"encrypt_s\":%.3f,\"setup_s\":%.3f}\n",
           rows, MIG_VALUE, env_len, MIG_BATCH, reps, PQparameterStatus(c, "server_version"), secs,
           now_s() - t_setup);
    rc = pg_reps(&prov, c, conninfo, rows, reps);
done:
    PQfinish(c);
    if (started) {
        (void)cluster_run("stop", cdir, unused, sizeof unused);
    } else if (cdir[0] != '\0') {
        rmdir(cdir);
    }
    ks_ctx_free(ctx0);
    ks_keyring_close(kr);
    bench_tree_remove(dir);
    return rc;
}
