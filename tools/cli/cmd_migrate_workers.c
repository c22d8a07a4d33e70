/*
 * tools/cli/cmd_migrate_workers.c -- `keyshift migrate run --workers N` on
 * PostgreSQL, and the chunks that `keyshift migrate status` lists
 * (docs/migration.md section 11).
 *
 * A run with workers is ks_migrate_run_workers (keyshift/workers.h) over
 * N connections, each a store (ks_rowstore_pg_open through
 * ks_cli_store_open, with the rollout's write gate when one governs the
 * column) and a chunk coordinator bound to it.  The same command on
 * several hosts joins the same migration.  This file adds what a
 * command line needs around it:
 *
 *  - one progress report over all the workers, drawn by the driver's
 *    progress callback (one call at a time, under the driver's lock):
 *    the migration's counts are its chunks' summed counts, read on the
 *    run's own connection every REFRESH_S seconds (so the workers of
 *    other processes count too), plus what this process's workers added
 *    since; the total is a count of the table; the rate and the ETA
 *    leave out the time throttled;
 *  - throttling: the driver's gate (asked by every worker before each
 *    claim and after each committed batch, outside any transaction) is
 *    one check of the run's throttle (tools/cli/throttle.h: the pause flag,
 *    --throttle-query, --max-replica-lag), serialized by this file's
 *    mutex, so that every worker waits within one batch of the condition
 *    turning true, keeping its chunk's lease, and goes on when it turns
 *    false;
 *  - the exit code and a message per outcome, as the single-connection
 *    run gives them (ks_cli_migrate_advice).
 *
 * Lock order: the driver's lock (progress) before this file's mutex,
 * never the other way (the gate takes only the mutex).  No output ever
 * carries plaintext or key material: counts, chunk ids, row ids, owner
 * names and error names only.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keyshift/chunks_pg.h>
#include <keyshift/rowstore_pg.h>
#include <keyshift/workers.h>

#include "cmd_migrate_textfile.h"
#include "cmd_migrate_workers.h"

/* Seconds between two reads of the chunks' summary for the progress. */
#define REFRESH_S 2.0
/* Seconds between two redraws of the bar, and two health samples. */
#define DRAW_S 0.1
#define HEALTH_S 5.0
/* The longest --chunk-ids and --lease. */
#define CHUNK_IDS_MAX 1000000000000ull
#define LEASE_MAX_S 86400u

/* See cmd_migrate_workers.h. */
int ks_cli_workers_parse(const char *workers, const char *chunk_ids, const char *lease, int pg,
                         ks_cli_workers *out)
{
    static const char cmd[] = "migrate run";
    memset(out, 0, sizeof *out);
    if (workers == NULL) {
        if (chunk_ids != NULL || lease != NULL) {
            return ks_cli_usage_error(cmd, "--chunk-ids and --lease are options of --workers");
        }
        return EX_OK;
    }
    size_t n;
    if (ks_cli_parse_size(workers, 1, KS_WORKERS_MAX, &n) != 0) {
        return ks_cli_usage_error(cmd, "--workers must be a number from 1 to %u",
                                  (unsigned)KS_WORKERS_MAX);
    }
    if (!pg) {
        if (n > 1 || chunk_ids != NULL || lease != NULL) {
            return ks_cli_usage_error(cmd, "--workers needs a PostgreSQL --db: SQLite has one "
                                           "writer at a time, so more workers would only wait "
                                           "for each other (run without --workers)");
        }
        return EX_OK; /* --workers 1 on SQLite: the single-connection run */
    }
    out->workers = (unsigned)n;
    if (chunk_ids != NULL) {
        size_t k;
        if (ks_cli_parse_size(chunk_ids, 1, (size_t)CHUNK_IDS_MAX, &k) != 0) {
            return ks_cli_usage_error(cmd, "--chunk-ids must be a number from 1 to %llu",
                                      (unsigned long long)CHUNK_IDS_MAX);
        }
        out->chunk_ids = k;
    }
    if (lease != NULL) {
        uint32_t s;
        if (ks_cli_parse_duration(lease, &s) != 0 || s < 1 || s > LEASE_MAX_S) {
            return ks_cli_usage_error(cmd, "--lease must be a duration from 1s to 1d (30s, 2m)");
        }
        out->lease_ms = s * 1000u;
    }
    return EX_OK;
}

/* The counts of a migration, copied out of the library's views. */
typedef struct tally {
    uint64_t done, skipped, raced, quarantined, wrong_state;
} tally;

/* Rows looked at, whatever became of them (raced rows are looked at
 * again in a later pass). */
static uint64_t looked_at(const tally *t)
{
    return t->done + t->skipped + t->quarantined + t->wrong_state;
}

/* One run with workers: its options, its throttle and its progress. */
typedef struct wrun {
    const ks_cli_workers_env *env;
    ks_ctx *ctx;
    unsigned workers;
    int open_rc;            /* the exit code of a store that did not open (messaged) */
    /* the gate: the throttle, serialized */
    pthread_mutex_t mu;
    /* the progress, under the driver's lock */
    const ks_rowstore *store; /* the run's own connection */
    ks_chunks mon;          /* a coordinator on it, for the summary */
    int tty;
    uint64_t total, batches;
    char *params;           /* the migration's canonical parameters (from the first report) */
    size_t params_len;
    ks_chunk_summary sum;   /* the chunks' summary at the last refresh */
    tally added_then;       /* what this process's workers had added at that refresh */
    uint64_t chunks_done_then;
    uint64_t start_looked;  /* rows looked at before this run (at the first refresh) */
    int refreshed;
    double last_refresh, last_draw, last_health;
    tally now;              /* the migration's counts at the last report */
    tally here;             /* what this process's workers added (the summary's) */
    uint32_t pass;
    uint64_t rows;          /* rows this process's workers committed */
    double elapsed;
    int drawn;
    int64_t last_progress_time; /* Unix time of the last committed batch */
} wrun;

/* The time throttled so far (the open pause's included). */
static double throttled_s(wrun *r)
{
    pthread_mutex_lock(&r->mu);
    double t = ks_cli_throttle_spent(r->env->throttle);
    pthread_mutex_unlock(&r->mu);
    return t;
}

/* The driver's gate: one check of the throttle (see the file comment). */
static int gate(void *arg, unsigned worker)
{
    (void)worker;
    wrun *r = arg;
    pthread_mutex_lock(&r->mu);
    int hold = ks_cli_throttle_poll(r->env->throttle, r->env->json);
    pthread_mutex_unlock(&r->mu);
    return hold;
}

/* Open worker i's store and coordinator (ks_worker_open_fn): the run's
 * target on a connection of its own, gated on the rollout as the run's
 * own store is.  A failure is said here (r->open_rc its exit code). */
static ks_err open_worker(void *arg, unsigned i, ks_rowstore *store, ks_chunks *chunks)
{
    (void)i;
    wrun *r = arg;
    const ks_cli_workers_env *e = r->env;
    int rc = ks_cli_store_open(e->db, e->target, 0, e->busy_ms, KS_SQLITE_SYNC_FULL, store);
    if (rc == EX_OK) {
        rc = ks_cli_backfill_gate(store, e->rollout_id, 1);
    }
    if (rc == EX_OK) {
        char msg[256] = "";
        ks_err err = ks_chunks_pg_open(store, chunks, msg, sizeof msg);
        if (err != KS_OK) {
            ks_cli_error("PostgreSQL database %s: %s", e->db, msg[0] ? msg : ks_err_name(err));
            rc = ks_cli_exit_code(err);
        }
    }
    if (rc != EX_OK) {
        ks_rowstore_close(store);
        r->open_rc = rc;
        return KS_ERR_STORE;
    }
    return KS_OK;
}

/* Read the chunks' summary on the run's own connection (at most every
 * REFRESH_S seconds, or now when force): the other processes' work
 * counts too.  Best effort: a failure keeps the last summary. */
static void refresh(wrun *r, const ks_workers_progress *p, int force)
{
    if (r->mon.ops == NULL || (!force && p->elapsed_s - r->last_refresh < REFRESH_S)) {
        return;
    }
    if (r->params == NULL) {
        r->params = malloc(p->params.len ? p->params.len : 1);
        if (r->params == NULL) {
            return;
        }
        memcpy(r->params, p->params.ptr, p->params.len);
        r->params_len = p->params.len;
    }
    ks_chunk_summary s;
    ks_bytes params = {(const uint8_t *)r->params, r->params_len};
    if (r->mon.ops->summary(r->mon.self, params, &s) != KS_OK) {
        return;
    }
    r->sum = s;
    r->added_then = (tally){p->done, p->skipped, p->raced, p->quarantined, p->wrong_state};
    r->chunks_done_then = p->chunks_done;
    r->last_refresh = p->elapsed_s;
    if (!r->refreshed) {
        tally before = {s.done, s.skipped, s.raced, s.quarantined, s.wrong_state};
        uint64_t mine = looked_at(&r->added_then), all = looked_at(&before);
        r->start_looked = all > mine ? all - mine : 0;
        r->refreshed = 1;
    }
}

/* The migration's counts now: the last summary plus what this
 * process's workers added since. */
static tally counts_now(const wrun *r, const ks_workers_progress *p)
{
    const tally *a = &r->added_then;
    return (tally){r->sum.done + (p->done - a->done), r->sum.skipped + (p->skipped - a->skipped),
                   r->sum.raced + (p->raced - a->raced),
                   r->sum.quarantined + (p->quarantined - a->quarantined),
                   r->sum.wrong_state + (p->wrong_state - a->wrong_state)};
}

/* This process's rate (rows/s of working time) and the migration's ETA
 * (-1: none) at elapsed, leaving the throttled time out. */
static void rates(wrun *r, double elapsed, double *rate, double *eta)
{
    double work = elapsed - throttled_s(r);
    work = work > 0 ? work : 0;
    *rate = work > 0 ? (double)r->rows / work : 0.0;
    uint64_t n = looked_at(&r->now);
    uint64_t since = n > r->start_looked ? n - r->start_looked : 0;
    double all = work > 0 ? (double)since / work : 0.0; /* every process's workers */
    *eta = all > 0 && n < r->total ? (double)(r->total - n) / all : -1;
}

/* Write the migration's counts c to --textfile (env->textfile; running
 * or not, complete or not), with this run's throttled time; nothing
 * without --textfile. */
static void write_textfile(wrun *r, const tally *c, int running, int complete)
{
    ks_cli_mig_textfile *t = r->env->textfile;
    if (t == NULL || t->dir == NULL) {
        return;
    }
    ks_metrics_migrate m = {NULL,
                            {c->done, c->skipped, c->raced, c->quarantined, c->wrong_state},
                            r->total,
                            throttled_s(r),
                            r->last_progress_time,
                            running,
                            complete};
    ks_cli_mig_textfile_write(t, &m);
}

/* The driver's progress callback (under its lock): a JSON line, or a
 * redraw of the bar, a health sample every HEALTH_S seconds, and the
 * --textfile file at most every KS_CLI_TEXTFILE_EVERY_S seconds once the
 * migration's counts are known (the chunks' summary read). */
static void on_progress(void *arg, const ks_workers_progress *p)
{
    wrun *r = arg;
    const ks_cli_workers_env *e = r->env;
    refresh(r, p, !r->refreshed);
    r->batches++;
    r->rows = p->rows;
    r->elapsed = p->elapsed_s;
    r->now = counts_now(r, p);
    r->here = (tally){p->done, p->skipped, p->raced, p->quarantined, p->wrong_state};
    r->pass = p->chunk_cp->pass > r->sum.max_pass ? p->chunk_cp->pass : r->sum.max_pass;
    r->last_progress_time = (int64_t)time(NULL);
    if (r->refreshed && e->textfile != NULL && ks_cli_mig_textfile_due(e->textfile, p->elapsed_s)) {
        write_textfile(r, &r->now, 1, 0);
    }
    if (e->health != NULL && p->elapsed_s - r->last_health >= HEALTH_S) {
        r->last_health = p->elapsed_s;
        e->health(e->health_arg);
    }
    uint64_t complete = r->sum.complete + (p->chunks_done - r->chunks_done_then);
    double rate, eta;
    if (e->json) {
        rates(r, p->elapsed_s, &rate, &eta);
        printf("{\"batch\":%llu,\"worker\":%u,\"chunk\":%lld,\"pass\":%u,\"done\":%llu,"
               "\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,\"wrong_state\":%llu,"
               "\"total\":%llu,\"rows_per_s\":%.1f,\"throttled_s\":%.1f,\"chunks\":%llu,"
               "\"chunks_complete\":%llu}\n",
               (unsigned long long)r->batches, p->worker, (long long)p->chunk, r->pass,
               (unsigned long long)r->now.done, (unsigned long long)r->now.skipped,
               (unsigned long long)r->now.raced, (unsigned long long)r->now.quarantined,
               (unsigned long long)r->now.wrong_state, (unsigned long long)r->total, rate,
               throttled_s(r), (unsigned long long)r->sum.chunks, (unsigned long long)complete);
        fflush(stdout);
    } else if (r->tty && (p->elapsed_s - r->last_draw >= DRAW_S || r->batches == 1)) {
        r->last_draw = p->elapsed_s;
        rates(r, p->elapsed_s, &rate, &eta);
        char extra[64];
        snprintf(extra, sizeof extra, "  chunks %llu/%llu", (unsigned long long)complete,
                 (unsigned long long)r->sum.chunks);
        ks_cli_draw_bar(looked_at(&r->now), r->total, rate, eta, extra);
        r->drawn = 1;
    }
}

/* Print the summary of a run with workers that ended with e (exit rc):
 * what this process's workers did, the migration's counts (its
 * chunks', every process's), the time; a JSON object on stdout, or
 * lines on stderr. */
static void print_summary(wrun *r, const ks_workers_result *res, ks_err e, int rc, double elapsed)
{
    const ks_cli_workers_env *env = r->env;
    const tally *h = &r->here;
    tally c = r->now;
    uint32_t pass = r->pass;
    if (res->summary.chunks > 0) { /* the summary read at the end: every chunk's counts */
        const ks_chunk_summary *s = &res->summary;
        c = (tally){s->done, s->skipped, s->raced, s->quarantined, s->wrong_state};
        pass = s->max_pass;
    }
    double rate, eta;
    r->rows = res->rows;
    rates(r, elapsed, &rate, &eta);
    double thr = throttled_s(r);
    const char *result = e == KS_OK ? "complete" : rc == EX_TEMPFAIL ? "paused" : "failed";
    if (env->json) {
        printf("{\"result\":\"%s\",\"error\":\"%s\",\"exit\":%d,\"pass\":%u,\"done\":%llu,"
               "\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,\"wrong_state\":%llu,"
               "\"total\":%llu,\"elapsed_s\":%.3f,\"rows_per_s\":%.1f,\"throttled_s\":%.3f,"
               "\"migration\":{\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,"
               "\"quarantined\":%llu,\"wrong_state\":%llu},"
               "\"workers\":%u,\"rows_here\":%llu,\"chunks\":%llu,\"chunks_complete\":%llu,"
               "\"claims\":%llu,\"takeovers\":%llu,\"lost\":%llu}\n",
               result, ks_err_name(e), rc, pass, (unsigned long long)h->done,
               (unsigned long long)h->skipped, (unsigned long long)h->raced,
               (unsigned long long)h->quarantined, (unsigned long long)h->wrong_state,
               (unsigned long long)r->total, elapsed, rate, thr, (unsigned long long)c.done,
               (unsigned long long)c.skipped, (unsigned long long)c.raced,
               (unsigned long long)c.quarantined, (unsigned long long)c.wrong_state, r->workers,
               (unsigned long long)res->rows, (unsigned long long)res->summary.chunks,
               (unsigned long long)res->summary.complete, (unsigned long long)res->claims,
               (unsigned long long)res->takeovers, (unsigned long long)res->lost);
        return;
    }
    if (env->throttle->pauses > 0) {
        fprintf(stderr, KS_PROG " migrate: throttled %.1f s in %u pauses (left out of the rate)\n",
                thr, env->throttle->pauses);
    }
    fprintf(stderr,
            KS_PROG " migrate: workers: %llu rows in %llu chunks claimed here (%llu taken over, "
            "%llu lost to another worker); chunks %llu/%llu complete\n",
            (unsigned long long)res->rows, (unsigned long long)res->claims,
            (unsigned long long)res->takeovers, (unsigned long long)res->lost,
            (unsigned long long)res->summary.complete, (unsigned long long)res->summary.chunks);
    fprintf(stderr,
            KS_PROG " migrate: %s: %llu rewritten, %llu already at target, %llu raced, "
            "%llu quarantined, %llu in the wrong state; pass %u, %.1f s, %.0f rows/s\n",
            result, (unsigned long long)h->done, (unsigned long long)h->skipped,
            (unsigned long long)h->raced, (unsigned long long)h->quarantined,
            (unsigned long long)h->wrong_state, pass, elapsed, rate);
    if (h->done != c.done || h->skipped != c.skipped || h->raced != c.raced ||
        h->quarantined != c.quarantined || h->wrong_state != c.wrong_state) {
        fprintf(stderr,
                KS_PROG " migrate: the migration so far, every host and run: %llu rewritten, "
                "%llu already at target, %llu raced, %llu quarantined, %llu in the wrong "
                "state\n",
                (unsigned long long)c.done, (unsigned long long)c.skipped,
                (unsigned long long)c.raced, (unsigned long long)c.quarantined,
                (unsigned long long)c.wrong_state);
    }
}

/* See cmd_migrate_workers.h. */
int ks_cli_workers_run(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                       const ks_cli_workers *w, const ks_cli_workers_env *env)
{
    assert(w->workers >= 1 && w->workers <= KS_WORKERS_MAX && env->throttle != NULL);
    wrun *r = calloc(1, sizeof *r);
    if (r == NULL || pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    r->env = env;
    r->ctx = ctx;
    r->workers = w->workers;
    r->store = store;
    r->tty = isatty(STDERR_FILENO);
    r->last_progress_time = (int64_t)time(NULL);
    char msg[256] = "";
    ks_err e = store->ops->count(store->self, &r->total);
    if (e == KS_OK) {
        e = ks_chunks_pg_open(store, &r->mon, msg, sizeof msg);
    }
    ks_workers_result res;
    memset(&res, 0, sizeof res);
    double t0 = ks_cli_mono_s();
    if (e == KS_OK) {
        ks_workers_options o = {.workers = w->workers,
                                .chunk_ids = w->chunk_ids,
                                .lease_ms = w->lease_ms,
                                .gate = env->throttle->conn != NULL ? gate : NULL,
                                .gate_arg = r,
                                .gate_poll_ms = (uint32_t)(KS_CLI_THROTTLE_POLL_S * 1000)};
        e = ks_migrate_run_workers(ctx, p, &o, open_worker, r, env->stop, on_progress, r, &res);
    }
    double elapsed = ks_cli_mono_s() - t0;
    pthread_mutex_lock(&r->mu);
    ks_cli_throttle_stopped(env->throttle, env->json);
    pthread_mutex_unlock(&r->mu);
    if (env->health != NULL) {
        env->health(env->health_arg);
    }
    int rc;
    if (r->open_rc != EX_OK) {
        rc = r->open_rc; /* said by open_worker */
    } else if (e == KS_OK && res.already_complete) {
        rc = KS_CLI_WORKERS_CATCHUP;
    } else {
        rc = e == KS_ERR_STOPPED ? EX_TEMPFAIL : ks_cli_exit_code(e);
        if (r->tty && !env->json && r->drawn) {
            fputc('\n', stderr);
        }
        if (e != KS_OK) {
            const char *advice =
                ks_cli_migrate_advice(e, 1, env->rollout_id != 0 && !*env->stop);
            if (msg[0]) {
                ks_cli_error("PostgreSQL database %s: %s", env->db, msg);
            }
            ks_cli_error("migrate %s %s.%s with %u workers: %s (%s)",
                         ks_migrate_mode_name(p->mode), env->target->table,
                         env->target->column, w->workers, advice != NULL ? advice : "failed",
                         ks_err_name(e));
        }
        print_summary(r, &res, e, rc, elapsed);
        /* the last write: every chunk's counts when the end read them,
         * else the last report's (never zeros over a known migration) */
        const ks_chunk_summary *s = &res.summary;
        const tally end = {s->done, s->skipped, s->raced, s->quarantined, s->wrong_state};
        if (s->chunks > 0 || r->refreshed) {
            write_textfile(r, s->chunks > 0 ? &end : &r->now, 0,
                           e == KS_OK && s->chunks > 0 && s->complete == s->chunks);
        }
    }
    ks_chunks_close(&r->mon);
    pthread_mutex_destroy(&r->mu);
    free(r->params);
    free(r);
    return rc;
}

/* ---- migrate status: the chunks of a migration ------------------------------- */

/* What the status listing of one migration's chunks keeps. */
typedef struct chunk_list {
    int json, all;
    int pass;               /* 0: counting; 1: printing */
    uint64_t complete, running, pending, expired;
    int printed;
} chunk_list;

/* Nonzero when k is not complete and a worker holds its live lease. */
static int is_running(const ks_chunk *k)
{
    return k->lease_live && k->owner.len > 0;
}

/* Nonzero when k's state is "complete". */
static int is_complete(const ks_chunk *k)
{
    return k->cp.state.len == 8 && memcmp(k->cp.state.ptr, "complete", 8) == 0;
}

/* Print one chunk: a JSON object, or a line. */
static void print_chunk(const chunk_list *l, const ks_chunk *k)
{
    char until[32] = "";
    ks_cli_format_time(k->lease_until_ms / 1000, until, sizeof until);
    const ks_checkpoint *cp = &k->cp;
    if (l->json) {
        printf("%s{\"chunk\":%lld,\"lo\":%lld,\"hi\":%lld,", l->printed ? "," : "",
               (long long)k->id, (long long)k->lo, (long long)k->hi);
        ks_cli_put_progress_json(cp);
        fputs(",\"owner\":", stdout);
        if (k->owner.len > 0) {
            ks_cli_put_json_string(stdout, k->owner.ptr, k->owner.len);
        } else {
            fputs("null", stdout);
        }
        printf(k->lease_until_ms ? ",\"lease_until\":\"%s\"" : ",\"lease_until\":null%s", until);
        printf(",\"lease_live\":%s}", k->lease_live ? "true" : "false");
        return;
    }
    printf("  chunk %lld  ids %lld..%lld  ", (long long)k->id, (long long)k->lo, (long long)k->hi);
    ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, cp->state}, 0);
    printf("  pass %u  cursor ", cp->pass);
    ks_cli_put_value(stdout, &cp->cursor, 0);
    printf("  done %llu", (unsigned long long)cp->done);
    if (k->owner.len > 0) {
        fputs("  owner ", stdout);
        ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, k->owner}, 0);
        printf("  lease until %s%s", until, k->lease_live ? "" : " (expired)");
    }
    fputc('\n', stdout);
}

/* The list callback: count each chunk (first pass), print the running
 * ones, or all (second pass). */
static int on_chunk(void *arg, const ks_chunk *k)
{
    chunk_list *l = arg;
    if (l->pass == 0) {
        if (is_complete(k)) {
            l->complete++;
        } else if (is_running(k)) {
            l->running++;
        } else {
            l->pending++;
            l->expired += k->owner.len > 0; /* its worker died or hung: the next claim's */
        }
        return 0;
    }
    if (l->all || is_running(k)) {
        print_chunk(l, k);
        l->printed++;
    }
    return 0;
}

/* See cmd_migrate_workers.h. */
void ks_cli_chunks_print(const char *db, ks_bytes tbl, ks_bytes col, ks_bytes params,
                         const char *id_column, int json, int all)
{
    /* the store needs NUL-terminated names: the catalog's spellings, as listed */
    char *table = strndup((const char *)tbl.ptr, tbl.len);
    char *column = strndup((const char *)col.ptr, col.len);
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    ks_chunks chunks = {NULL, NULL, NULL};
    ks_chunk_summary s = {0};
    chunk_list l = {json, all, 0, 0, 0, 0, 0, 0};
    ks_pg_options o = {0, 0, 1};
    ks_rowstore_target t = {.table = table, .column = column, .id_column = id_column};
    /* best effort: a table gone, or one without chunks, shows the checkpoint alone */
    int ok = table != NULL && column != NULL &&
             ks_rowstore_pg_open(db, &t, &o, &store, NULL, 0) == KS_OK &&
             ks_chunks_pg_open(&store, &chunks, NULL, 0) == KS_OK &&
             chunks.ops->summary(chunks.self, params, &s) == KS_OK && s.chunks > 0 &&
             chunks.ops->list(chunks.self, params, on_chunk, &l) == KS_OK;
    if (ok && json) {
        printf(",\"chunks\":{\"chunks\":%llu,\"complete\":%llu,\"running\":%llu,"
               "\"pending\":%llu,\"expired\":%llu,\"list\":[",
               (unsigned long long)s.chunks, (unsigned long long)l.complete,
               (unsigned long long)l.running, (unsigned long long)l.pending,
               (unsigned long long)l.expired);
    } else if (ok) {
        printf("%-12s %llu: %llu complete, %llu running, %llu pending", "chunks",
               (unsigned long long)s.chunks, (unsigned long long)l.complete,
               (unsigned long long)l.running, (unsigned long long)l.pending);
        if (l.expired > 0) {
            printf(" (%llu with an expired lease: taken over by the next claim)",
                   (unsigned long long)l.expired);
        }
        printf(all ? "\n" : "%s\n", l.running > 0 ? "; running:" : "");
    }
    if (ok) {
        l.pass = 1;
        (void)chunks.ops->list(chunks.self, params, on_chunk, &l); /* as far as it got */
        if (json) {
            fputs("]}", stdout);
        }
    }
    ks_chunks_close(&chunks);
    ks_rowstore_close(&store);
    free(table);
    free(column);
}
