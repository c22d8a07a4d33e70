/*
 * tools/bench/bench_pg.c -- `build/bin/bench pg` (part of `make bench`): the
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
 * Goals: rewrap at most 1.25 times the raw pass, reencrypt at
 * most 1.4 times, the census at least 0.8 times the scan's rows/s.  The
 * server's WAL bytes per row (pg_current_wal_lsn before and after) are
 * reported for the raw pass and the migrations.  Checkpoints are deleted
 * before each migration (alternating versions would otherwise find the
 * run before the last one finished).
 *
 * Workers (pg_workers): a rewrap of a fresh copy w of t (same rows, same
 * batch) to version 2 through ks_migrate_run_workers with 1, 2 and 4
 * workers, each worker a connection of its own, the table cut into
 * WK_CHUNKS chunks; the order of the three rotates over the repetitions
 * (KS_BENCH_PG_WORKERS_REPS, default WK_REPS_DEFAULT).  Each run starts
 * after a CHECKPOINT, so that each pays the same full-page images in its
 * WAL.  Goal: 2 workers give at least 1.4 times the rows/s of
 * 1.  Besides rows/s and WAL per row, each worker count's CPU per row is
 * reported: the client's (getrusage) and the server's (its processes'
 * times from /proc: Linux only, else -1), with the machine's load
 * average, since the server shares the client's cores and the machine
 * may run other work: together they tell whether a figure was bound by
 * the cores or by waiting.  KS_BENCH_PG_WORKERS_ONLY=1 skips the
 * one-connection lines (the table is encrypted all the same).
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sodium.h>

#include <keyshift/chunks_pg.h>
#include <keyshift/rowstore_pg.h>
#include <keyshift/workers.h>

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
    ks_rowstore_target t = {table, "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
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

/* ---- workers ------------------------------------------------------------- */

/* Chunks of the workers' table: enough for 4 workers to share the work
 * evenly to the end (a chunk is a few batches). */
#define WK_CHUNKS 16
/* Repetitions of the workers' runs (KS_BENCH_PG_WORKERS_REPS): more than
 * the others', since each run is short and the machine is shared. */
#define WK_REPS_DEFAULT 5
/* Worker counts measured; the goal compares the second with the first. */
#define WK_COUNTS 3
static const unsigned wk_counts[WK_COUNTS] = {1, 2, 4};

/* What the workers' open callback needs: where, and which table. */
typedef struct wk_target {
    const char *conninfo;
} wk_target;

/* ks_worker_open_fn: a store on w.v and its chunk coordinator. */
static ks_err wk_open(void *arg, unsigned worker, ks_rowstore *store, ks_chunks *chunks)
{
    const wk_target *t = arg;
    (void)worker;
    char err[256];
    ks_rowstore_target tg = {"w", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
    ks_err e = ks_rowstore_pg_open(t->conninfo, &tg, NULL, store, err, sizeof err);
    if (e == KS_OK) {
        e = ks_chunks_pg_open(store, chunks, err, sizeof err);
    }
    if (e != KS_OK) {
        fprintf(stderr, "bench: pg workers: %s: %s\n", ks_err_name(e), err);
    }
    return e;
}

/* Make w a fresh copy of t (envelopes under version 1), with no
 * migration state, analyzed, and checkpoint the server. */
static int wk_fresh_table(PGconn *c)
{
    return pg_exec(c, "DROP TABLE IF EXISTS w") != 0 ||
                   pg_exec(c, "CREATE TABLE w (id bigint PRIMARY KEY, v bytea)") != 0 ||
                   pg_exec(c, "INSERT INTO w SELECT id, v FROM t ORDER BY id") != 0 ||
                   pg_exec(c, "DELETE FROM keyshift_migration") != 0 ||
                   pg_exec(c, "DROP TABLE IF EXISTS keyshift_chunk") != 0 ||
                   pg_exec(c, "VACUUM ANALYZE w") != 0 || pg_exec(c, "CHECKPOINT") != 0
               ? -1
               : 0;
}

/* The CPU seconds of process pid from /proc/<pid>/stat: its own (utime +
 * stime) and, with children nonzero, those of its reaped children (cutime
 * + cstime) too; its parent's pid into *ppid.  -1 when unreadable. */
static double proc_cpu_s(long pid, int children, long *ppid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command may hold spaces */
    unsigned long long ut, st;
    long long cut, cst;
    if (p == NULL || sscanf(p + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
                            ppid, &ut, &st, &cut, &cst) != 5) {
        return -1;
    }
    double ticks = (double)ut + (double)st + (children ? (double)(cut + cst) : 0.0);
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

/* The CPU seconds the server has used so far: the postmaster's (pid in
 * the first line of dir/data/postmaster.pid), its exited children's
 * (backends of closed connections) and its live children's (the admin
 * connection's backend, the checkpointer, the WAL writer, ...).  Linux
 * only; -1 elsewhere. */
static double server_cpu_s(const char *dir)
{
    char path[600];
    long pm = -1, pp = 0;
    snprintf(path, sizeof path, "%s/data/postmaster.pid", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL || fscanf(f, "%ld", &pm) != 1) {
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    fclose(f);
    double total = proc_cpu_s(pm, 1, &pp);
    DIR *d = opendir("/proc");
    if (d == NULL || total < 0) {
        if (d != NULL) {
            closedir(d);
        }
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = atol(e->d_name);
        double c = pid > 0 && pid != pm ? proc_cpu_s(pid, 0, &pp) : -1;
        if (c >= 0 && pp == pm) {
            total += c;
        }
    }
    closedir(d);
    return total;
}

/* This process's CPU seconds (every thread). */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* What one run of the workers took. */
typedef struct wk_figures {
    double secs;        /* wall */
    long long wal;      /* the server's WAL bytes */
    double server_cpu;  /* the server's CPU seconds (-1: unknown) */
    double client_cpu;  /* this process's CPU seconds */
} wk_figures;

/* One timed rewrap of a fresh w to version 2 with n workers on the
 * cluster in dir: its figures into *f; 0 when every row was done. */
static int wk_run(const ks_provider *prov, PGconn *c, const char *conninfo, const char *dir,
                  unsigned n, long rows, wk_figures *f)
{
    ks_ctx *ctx = NULL;
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = MIG_DEK_MESSAGES;
    if (wk_fresh_table(c) != 0 || ks_ctx_new(prov, &cfg, &ctx) != KS_OK) {
        return -1;
    }
    ks_migrate_params p = mig_params(KS_MIGRATE_REWRAP, MIG_KEY, 2);
    ks_workers_options o = {0};
    o.workers = n;
    o.chunk_ids = (uint64_t)(rows + WK_CHUNKS - 1) / WK_CHUNKS;
    o.idle_ms = 10; /* the last chunks' wait must not pad a short run */
    wk_target tg = {conninfo};
    ks_workers_result res;
    long long w0 = wal_pos(c);
    double s0 = server_cpu_s(dir), c0 = self_cpu_s(), t0 = now_s();
    ks_err err = ks_migrate_run_workers(ctx, &p, &o, wk_open, &tg, NULL, NULL, NULL, &res);
    f->secs = now_s() - t0;
    f->client_cpu = self_cpu_s() - c0;
    f->wal = wal_pos(c) - w0;
    struct timespec ts = {0, 200 * 1000000L}; /* the workers' backends exit after their */
    nanosleep(&ts, NULL);                      /* connections close */
    double s1 = server_cpu_s(dir);
    f->server_cpu = s0 >= 0 && s1 >= 0 ? s1 - s0 : -1;
    ks_ctx_free(ctx);
    if (err != KS_OK || (long)res.summary.done != rows) {
        fprintf(stderr, "bench: pg workers (%u): %s, %llu of %ld rows\n", n, ks_err_name(err),
                (unsigned long long)res.summary.done, rows);
        return -1;
    }
    return 0;
}

/* The machine's 1-minute load average, or -1 where it cannot be read. */
static double load_1min(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &l) != 1) {
            l = -1;
        }
        fclose(f);
    }
    return l;
}

/* The workers' repetitions (t holds envelopes under version 1) on the
 * cluster in dir: rows/s, WAL and CPU per row for each worker count, and
 * the goal line of 2 workers against 1. */
static int pg_workers(const ks_provider *prov, PGconn *c, const char *conninfo, const char *dir,
                      long rows, int reps)
{
    double t[WK_COUNTS][MIG_REPS_MAX], ratio2[MIG_REPS_MAX], ratio4[MIG_REPS_MAX];
    wk_figures sum[WK_COUNTS];
    memset(sum, 0, sizeof sum);
    double load0 = load_1min();
    for (int i = 0; i < reps; i++) {
        for (int k = 0; k < WK_COUNTS; k++) {
            int j = (k + i) % WK_COUNTS; /* rotate the order over the repetitions */
            wk_figures f;
            if (wk_run(prov, c, conninfo, dir, wk_counts[j], rows, &f) != 0) {
                return -1;
            }
            t[j][i] = f.secs;
            sum[j].wal += f.wal;
            sum[j].client_cpu += f.client_cpu;
            sum[j].server_cpu = sum[j].server_cpu < 0 || f.server_cpu < 0 ? -1 : sum[j].server_cpu + f.server_cpu;
        }
        ratio2[i] = t[0][i] / t[1][i]; /* rows/s of 2 over rows/s of 1 */
        ratio4[i] = t[0][i] / t[2][i];
    }
    double med[WK_COUNTS], load1 = load_1min();
    for (int j = 0; j < WK_COUNTS; j++) {
        med[j] = median(t[j], reps);
    }
    mig_goal("pg-workers-2", "rows_per_s_2_workers/rows_per_s_1_worker", ratio2, reps, 1.40, 0, rows,
             med[1], med[0]);
    double all = (double)rows * reps;
    for (int j = 0; j < WK_COUNTS; j++) {
        printf("{\"bench\":\"pg-workers\",\"mode\":\"rewrap\",\"workers\":%u,\"rows\":%ld,\"batch\":%d,"
               "\"chunks\":%d,\"reps\":%d,\"s\":%.3f,\"rows_per_s\":%.0f,\"rows_per_s_over_1\":%.3f,"
               "\"wal_bytes_per_row\":%.0f,\"server_cpu_us_per_row\":%.1f,"
               "\"client_cpu_us_per_row\":%.1f,\"load_1min_before\":%.2f,\"load_1min_after\":%.2f}\n",
               wk_counts[j], rows, MIG_BATCH, WK_CHUNKS, reps, med[j], (double)rows / med[j],
               j == 0 ? 1.0 : median(j == 1 ? ratio2 : ratio4, reps), (double)sum[j].wal / all,
               sum[j].server_cpu < 0 ? -1.0 : sum[j].server_cpu * 1e6 / all,
               sum[j].client_cpu * 1e6 / all, load0, load1);
    }
    return pg_exec(c, "DROP TABLE w");
}

/* The repetitions named by environment variable name (1 ..
 * MIG_REPS_MAX), else def. */
static int env_reps_or(const char *name, int def)
{
    const char *v = getenv(name);
    int n = v != NULL ? atoi(v) : 0;
    return n <= 0 ? def : n < MIG_REPS_MAX ? n : MIG_REPS_MAX;
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
    int reps = env_reps_or("KS_BENCH_PG_REPS", PG_REPS_DEFAULT);
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
    const char *only = getenv("KS_BENCH_PG_WORKERS_ONLY");
    rc = only != NULL && strcmp(only, "1") == 0 ? 0 : pg_reps(&prov, c, conninfo, rows, reps);
    if (rc == 0) {
        rc = pg_workers(&prov, c, conninfo, cdir, rows, env_reps_or("KS_BENCH_PG_WORKERS_REPS", WK_REPS_DEFAULT));
    }
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
