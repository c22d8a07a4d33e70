/*
 * tools/cli/cmd_migrate_run.c -- `keyshift migrate run` (docs/migration.md).
 *
 * The engine (ks_migrate_run, or ks_migrate_run_workers through
 * tools/cli/cmd_migrate_workers.c) does the work; this file opens the
 * store and the keys, refuses a run that the rollout governing the
 * column does not allow, reports progress (a bar on a terminal, JSON
 * lines with --json, health samples for a rollout in backfill, the
 * --textfile file), turns SIGINT/SIGTERM into a clean pause after the
 * current batch, and maps each outcome to a sysexits code with a message
 * saying what state the data is in and what to do.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_migrate.h"
#include "cmd_migrate_textfile.h"
#include "cmd_migrate_workers.h"
#include "throttle.h"

/* Set by SIGINT/SIGTERM; the engine polls it between batches. */
static volatile sig_atomic_t stop_requested;

/* Split KEY_ID[:VERSION]: a trailing ':<digits>' is the version. */
static int parse_to_key(const char *cmd, const char *s, ks_migrate_params *p)
{
    const char *colon = strrchr(s, ':');
    size_t v = 0;
    if (colon != NULL && colon[1] != '\0' && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
        if (ks_cli_parse_size(colon + 1, 1, UINT32_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "--to-key: the version must be a number from 1");
        }
        p->to_key_id = (ks_bytes){(const uint8_t *)s, (size_t)(colon - s)};
    } else {
        p->to_key_id = ks_cli_mig_str_view(s);
    }
    if (p->to_key_id.len == 0 || p->to_key_id.len > KS_KEY_ID_MAX) {
        return ks_cli_usage_error(cmd, "--to-key: a key id of 1..%d bytes is required", KS_KEY_ID_MAX);
    }
    p->to_key_version = (uint32_t)v;
    return EX_OK;
}

/* Parse a fraction in [0, 1]. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(d >= 0.0 && d <= 1.0)) {
        return -1;
    }
    *out = d;
    return 0;
}


/* Parse the mode and the target key and format of `migrate run`. */
static int run_target(const ks_cli_mig_opts *o, ks_migrate_params *p)
{
    static const char cmd[] = "migrate run";
    if (o->mode == NULL || o->to_key == NULL) {
        return ks_cli_usage_error(cmd, "--mode and --to-key are required");
    }
    if (strcmp(o->mode, "encrypt") == 0) {
        p->mode = KS_MIGRATE_ENCRYPT;
    } else if (strcmp(o->mode, "rewrap") == 0) {
        p->mode = KS_MIGRATE_REWRAP;
    } else if (strcmp(o->mode, "reencrypt") == 0) {
        p->mode = KS_MIGRATE_REENCRYPT;
    } else {
        return ks_cli_usage_error(cmd, "--mode must be encrypt, rewrap or reencrypt");
    }
    if (p->mode == KS_MIGRATE_REWRAP && (o->to_format != NULL || o->algorithm != NULL)) {
        return ks_cli_usage_error(cmd, "rewrap keeps the format and algorithm: "
                                       "use --mode reencrypt to change them");
    }
    if (o->to_format != NULL && strcmp(o->to_format, "1") != 0 && strcmp(o->to_format, "2") != 0) {
        return ks_cli_usage_error(cmd, "--to-format must be 1 or 2");
    }
    p->to_format = o->to_format != NULL && o->to_format[0] == '1' ? KS_FORMAT_V1 : KS_FORMAT_V2;
    p->algorithm = o->algorithm != NULL ? ks_alg_from_name(o->algorithm) : KS_ALG_XCHACHA20POLY1305;
    if (p->algorithm == 0) {
        return ks_cli_usage_error(cmd, "--algorithm must be xchacha20-poly1305 or aes-256-gcm");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && o->from_key != NULL) {
        return ks_cli_usage_error(cmd, "--from-key selects envelopes; encrypt reads plaintext");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && o->tenant == NULL && o->tenant_column == NULL) {
        return ks_cli_usage_error(cmd, "encrypt needs --tenant or --tenant-column");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && p->to_format == KS_FORMAT_V1 && o->purpose != NULL) {
        return ks_cli_usage_error(cmd, "--purpose needs --to-format 2");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && p->to_format == KS_FORMAT_V2 && o->purpose == NULL) {
        p->purpose = ks_cli_mig_str_view("default"); /* as `keyshift encrypt` */
    }
    return parse_to_key(cmd, o->to_key, p);
}

/* Parse the pacing, locking and durability options of `migrate run`. */
static int run_limits(const ks_cli_mig_opts *o, ks_migrate_params *p, uint32_t *busy_ms,
                      ks_sqlite_sync *sync)
{
    static const char cmd[] = "migrate run";
    size_t v;
    p->batch_size = 500;
    p->max_failure_rate = 0.001;
    if (o->batch_size != NULL) {
        if (ks_cli_parse_size(o->batch_size, 1, 100000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--batch-size must be a number from 1 to 100000");
        }
        p->batch_size = v;
    }
    if (o->batch_target != NULL &&
        (ks_cli_parse_duration_ms(o->batch_target, &p->batch_target_ms) != 0 ||
         p->batch_target_ms > KS_MIGRATE_BATCH_TARGET_MAX_MS)) {
        return ks_cli_usage_error(cmd, "--batch-target must be a duration up to 1h (e.g. 500ms)");
    }
    if (o->batch_max != NULL) {
        if (o->batch_target == NULL || ks_cli_parse_size(o->batch_max, 10, 100000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--batch-max must be a number from 10 to 100000, "
                                           "with --batch-target");
        }
        p->batch_max = v;
    }
    if (o->max_failure_rate != NULL && parse_rate(o->max_failure_rate, &p->max_failure_rate) != 0) {
        return ks_cli_usage_error(cmd, "--max-failure-rate must be a number from 0 to 1");
    }
    if (o->max_rps != NULL) {
        if (ks_cli_parse_size(o->max_rps, 1, UINT32_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "--max-rows-per-second must be a number from 1");
        }
        p->max_rows_per_second = (uint32_t)v;
    }
    *busy_ms = 30000;
    if (o->busy_timeout != NULL) {
        if (ks_cli_parse_size(o->busy_timeout, 0, 86400000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--busy-timeout must be milliseconds (0..86400000)");
        }
        *busy_ms = (uint32_t)v;
    }
    *sync = KS_SQLITE_SYNC_FULL;
    if (o->synchronous != NULL && ks_cli_parse_synchronous(cmd, o->synchronous, sync) != EX_OK) {
        return EX_USAGE;
    }
    p->no_verify = o->no_verify;
    p->serial = o->serial;
    return EX_OK;
}

/* Set stop_requested; async-signal-safe. */
static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* Install the SIGINT/SIGTERM handlers that pause a run after its batch. */
static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* The counts of a checkpoint, copied out of the store's views. */
typedef struct counts {
    uint64_t done, skipped, raced, quarantined, wrong_state;
    uint32_t pass;
} counts;

/* What the progress callback keeps between batches. */
typedef struct progress_state {
    int json, tty;
    uint64_t batches, total;
    uint64_t run_rows; /* rows of the batches committed by this invocation */
    double elapsed, last_draw;
    int have;
    counts c;              /* the migration's counts (the checkpoint's, every run's) */
    ks_migrate_counts run; /* this run's own (the summary's) */
    /* health samples for the rollout in backfill (0: none) */
    int64_t rollout_id;
    const char *db;
    ks_ctx *ctx;
    ks_health_sample reported;
    double last_report;
    ks_cli_throttle *throttle; /* PostgreSQL's pauses between batches (tools/cli/throttle.h) */
    ks_cli_mig_textfile textfile; /* --textfile */
    int64_t last_progress_time;
} progress_state;

/* Seconds of the run spent working: elapsed less the time throttled,
 * which the rate and the ETA leave out. */
static double working_s(const progress_state *s, double elapsed)
{
    double w = elapsed - (s->throttle != NULL ? s->throttle->throttled_s : 0);
    return w > 0 ? w : 0;
}

/* Copy the counts of cp. */
static counts counts_of(const ks_checkpoint *cp)
{
    return (counts){cp->done, cp->skipped, cp->raced, cp->quarantined, cp->wrong_state, cp->pass};
}

/* Rows looked at so far, whatever became of them. */
static uint64_t processed(const counts *c)
{
    return c->done + c->skipped + c->quarantined + c->wrong_state;
}

/* Draw the progress bar on standard error (a terminal). */
static void draw_bar(const progress_state *s)
{
    uint64_t n = processed(&s->c);
    double work = working_s(s, s->elapsed);
    double rate = work > 0 ? (double)s->run_rows / work : 0.0;
    double eta = rate > 0 && n < s->total ? (double)(s->total - n) / rate : -1;
    ks_cli_draw_bar(n, s->total, rate, eta, "");
}

/* See cmd_migrate_workers.h. */
void ks_cli_draw_bar(uint64_t n, uint64_t total, double rate, double eta_s, const char *extra)
{
    double frac = total ? (double)n / (double)total : 1.0;
    frac = frac > 1.0 ? 1.0 : frac;
    char bar[31];
    int fill = (int)(frac * 30.0);
    for (int i = 0; i < 30; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3d%% %llu/%llu rows  %.0f rows/s", bar, (int)(frac * 100.0),
            (unsigned long long)n, (unsigned long long)total, rate);
    if (eta_s >= 0) {
        fprintf(stderr, "  ETA %.0fs%s   ", eta_s, extra);
    } else {
        fprintf(stderr, "%s            ", extra);
    }
    fflush(stderr);
}

/* The seconds between two health samples of a run (and one at its end). */
#define REPORT_EVERY_S 5.0

/*
 * Write this run's health sample (source "migrate", docs/rollout.md) for
 * the rollout in backfill: the growth of the context's totals since the
 * previous sample.  They are the migration's own figures: `rollout
 * status` and `metrics` show them apart, and the guards and `rollout
 * check` never judge them (an operator's wrong --context is not the
 * applications' health).  Best effort: a failure is said once on
 * standard error and the run goes on (the sample is carried into the
 * next one).
 */
static void report_health(progress_state *s)
{
    if (s->rollout_id == 0) {
        return;
    }
    ks_health_sample totals, d;
    ks_ctx_health_sample(s->ctx, &totals);
    ks_health_growth(&d, &totals, &s->reported);
    d.time = (int64_t)time(NULL);
    char instance[KS_INSTANCE_ID_MAX + 1], host[64];
    ks_cli_hostname(host, sizeof host);
    for (char *c = host; *c != '\0'; c++) { /* an instance id is [F-NAME-1] */
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_') {
            *c = '-';
        }
    }
    snprintf(instance, sizeof instance, "migrate.%s.%ld", host, (long)getpid());
    ks_rollout_db *db = NULL;
    ks_err e = KS_ERR_STORE;
    if (ks_cli_rollout_open(s->db, 0, &db) == EX_OK) {
        e = ks_rollout_db_metrics_insert(db, s->rollout_id, instance, "migrate", &d);
        ks_rollout_db_close(db);
    }
    if (e == KS_OK) {
        s->reported = totals;
    } else if (s->rollout_id > 0) {
        ks_cli_error("warning: cannot write this run's health sample to rollout %lld: %s",
                     (long long)s->rollout_id, ks_err_name(e));
        s->rollout_id = -s->rollout_id; /* said once; stop trying */
    }
}

/* Write the run's progress to --textfile (running or not, complete or
 * not): the migration's counts, every run's. */
static void write_textfile(progress_state *s, int running, int complete)
{
    ks_metrics_migrate m = {NULL,
                            {s->c.done, s->c.skipped, s->c.raced, s->c.quarantined,
                             s->c.wrong_state},
                            s->total,
                            s->throttle != NULL ? s->throttle->throttled_s : 0.0,
                            s->last_progress_time,
                            running,
                            complete};
    ks_cli_mig_textfile_write(&s->textfile, &m);
}

/* The engine's per-batch report: a JSON line or a bar redraw, and a
 * health sample every REPORT_EVERY_S seconds. */
static void on_progress(void *arg, const ks_migrate_progress *p)
{
    progress_state *s = arg;
    if (s->rollout_id > 0 && p->elapsed_s - s->last_report >= REPORT_EVERY_S) {
        s->last_report = p->elapsed_s;
        report_health(s);
    }
    s->batches++;
    s->run_rows += p->batch_rows;
    s->total = p->total_rows;
    s->elapsed = p->elapsed_s;
    s->c = counts_of(p->checkpoint);
    s->run = p->run;
    s->have = 1;
    s->last_progress_time = (int64_t)time(NULL);
    if (ks_cli_mig_textfile_due(&s->textfile, p->elapsed_s)) {
        write_textfile(s, 1, 0);
    }
    if (s->json) {
        double work = working_s(s, p->elapsed_s);
        double rate = work > 0 ? (double)s->run_rows / work : 0.0;
        printf("{\"batch\":%llu,\"batch_rows\":%llu,\"pass\":%u,\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,"
               "\"quarantined\":%llu,\"wrong_state\":%llu,\"total\":%llu,\"rows_per_s\":%.1f,"
               "\"throttled_s\":%.1f}\n",
               (unsigned long long)s->batches, (unsigned long long)p->batch_rows, s->c.pass, (unsigned long long)s->c.done,
               (unsigned long long)s->c.skipped, (unsigned long long)s->c.raced,
               (unsigned long long)s->c.quarantined, (unsigned long long)s->c.wrong_state,
               (unsigned long long)s->total, rate, p->elapsed_s - work);
        fflush(stdout);
    } else if (s->tty && (p->elapsed_s - s->last_draw >= 0.1 || s->batches == 1)) {
        s->last_draw = p->elapsed_s;
        draw_bar(s);
    }
    /* between batches: the batch is committed, no row lock is held */
    if (s->throttle != NULL) {
        ks_cli_throttle_wait(s->throttle, &stop_requested, s->json);
    }
}

/* See cmd_migrate_workers.h. */
const char *ks_cli_migrate_advice(ks_err e, int pg, int rollout_left)
{
    if (e == KS_ERR_STOPPED && rollout_left) {
        return "the rollout left backfill (rolled back?); the batch was not written and the "
               "checkpoint kept: run the same command again once it is back in backfill";
    }
    if (e == KS_ERR_UNAVAILABLE && pg) {
        return "the database went away (server stopped or connection lost) or the key "
               "provider is unavailable; the batch was rolled back and the checkpoint "
               "kept: run the same command again once both are back";
    }
    switch (e) {
    case KS_OK: return "complete";
    case KS_ERR_STOPPED:
        return "paused after the last committed batch; run the same command again to resume";
    case KS_ERR_BUSY:
        return "the database stayed locked past --busy-timeout (PostgreSQL: or a statement ran "
               "past statement_timeout, or a deadlock); the batch was rolled back and "
               "the checkpoint kept: run the same command again to resume";
    case KS_ERR_TIMEOUT:
        return "the key provider timed out; the batch was rolled back and the checkpoint kept: "
               "run the same command again to resume";
    case KS_ERR_UNAVAILABLE:
        return "the key provider is unavailable; the batch was rolled back and the checkpoint "
               "kept: run the same command again once it is back";
    case KS_ERR_THRESHOLD:
        return "stopped: too many rows failed and were quarantined (see the keyshift_quarantine "
               "table); committed batches stand. Investigate, then rerun (raise "
               "--max-failure-rate only if the failures are understood)";
    case KS_ERR_MISMATCH:
        return "an unfinished migration of this column with other parameters exists (see "
               "'keyshift migrate status'); nothing was written. Finish it by running it again "
               "with its own parameters, or, if it was the mistake (a wrong --context, "
               "--purpose or tenant), give --supersede to run this one instead: the rows it "
               "quarantined are tried again under the new parameters";
    case KS_ERR_VERIFY_FAILED:
        return "verify-before-commit found a new value that does not open to the old "
               "plaintext: a bug or faulty hardware, not bad data. Nothing of that batch was "
               "written and earlier batches stand (each was verified); do not rerun: report "
               "it as a bug, with the command and 'keyshift version'";
    case KS_ERR_FULL:
        return "the database or its disk is full; the batch was rolled back and the checkpoint "
               "kept: free space, then run the same command again to resume";
    case KS_ERR_STORE:
        return "database error; the batch was rolled back and the checkpoint kept: fix the "
               "cause, then run the same command again to resume";
    case KS_ERR_NOT_FOUND: return "the target key or version does not exist (in the keyring, or in the provider "
                                   "serving it)";
    case KS_ERR_DENIED:
        return "the target key version may not wrap (disabled or decrypt-only); promote an "
               "active version or pick another";
    case KS_ERR_REVOKED: return "the target key version was destroyed";
    default: return NULL;
    }
}

/* The advice when a run stopped on its failure threshold and most rows
 * of its first batch failed "auth-failed": the run's parameters, not the
 * data, are the likely cause. */
static const char *auth_failed_advice(const ks_migrate_counts *run)
{
    if (run->first_batch_rows == 0 || run->first_batch_auth_failed * 2 <= run->first_batch_rows) {
        return NULL;
    }
    return "stopped: most rows of the first batch failed with auth-failed. The likely cause is "
           "a --context, --purpose or tenant (--tenant, --tenant-column) that differs from the "
           "one the values were encrypted with; compare with the application's. Committed "
           "batches stand and nothing was modified. Run the corrected command with "
           "--supersede: the rows this run quarantined are tried again under the new "
           "parameters ('keyshift migrate quarantine list' shows them)";
}

/* Print the final summary of what this run did (s->run): a JSON object
 * on stdout, or a line on stderr; the migration's totals too when other
 * runs added to them. */
static void print_summary(const progress_state *s, ks_err e, int rc, double elapsed)
{
    const counts *m = &s->c;
    counts mine = {s->run.done, s->run.skipped, s->run.raced, s->run.quarantined,
                   s->run.wrong_state, m->pass};
    const counts *c = &mine;
    int others = m->done != c->done || m->skipped != c->skipped || m->raced != c->raced ||
                 m->quarantined != c->quarantined || m->wrong_state != c->wrong_state;
    double work = working_s(s, elapsed);
    double rate = work > 0 ? (double)s->run_rows / work : 0.0;
    double throttled = elapsed - work;
    int idle = c->done + c->skipped + c->raced + c->quarantined + c->wrong_state == 0;
    const char *result = e == KS_OK ? (idle ? "already complete, nothing to do" : "complete")
                         : rc == EX_TEMPFAIL ? "paused" : "failed";
    if (s->tty && !s->json && s->have) {
        fputc('\n', stderr);
    }
    if (s->json) {
        result = e == KS_OK ? "complete" : rc == EX_TEMPFAIL ? "paused" : "failed";
        printf("{\"result\":\"%s\",\"error\":\"%s\",\"exit\":%d,\"pass\":%u,\"done\":%llu,"
               "\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,\"wrong_state\":%llu,"
               "\"total\":%llu,\"elapsed_s\":%.3f,\"rows_per_s\":%.1f,\"throttled_s\":%.3f,"
               "\"migration\":{\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,"
               "\"quarantined\":%llu,\"wrong_state\":%llu}}\n",
               result, ks_err_name(e), rc, c->pass, (unsigned long long)c->done,
               (unsigned long long)c->skipped, (unsigned long long)c->raced,
               (unsigned long long)c->quarantined, (unsigned long long)c->wrong_state,
               (unsigned long long)s->total, elapsed, rate, throttled,
               (unsigned long long)m->done, (unsigned long long)m->skipped,
               (unsigned long long)m->raced, (unsigned long long)m->quarantined,
               (unsigned long long)m->wrong_state);
        return;
    }
    if (s->throttle != NULL && s->throttle->pauses > 0) {
        fprintf(stderr, KS_PROG " migrate: throttled %.1f s in %u pauses (left out of the rate)\n",
                throttled, s->throttle->pauses);
    }
    fprintf(stderr,
            KS_PROG " migrate: %s: %llu rewritten, %llu already at target, %llu raced, "
            "%llu quarantined, %llu in the wrong state; pass %u, %.1f s, %.0f rows/s\n",
            result, (unsigned long long)c->done, (unsigned long long)c->skipped,
            (unsigned long long)c->raced, (unsigned long long)c->quarantined,
            (unsigned long long)c->wrong_state, c->pass, elapsed, rate);
    if (others) {
        fprintf(stderr,
                KS_PROG " migrate: the migration so far, every run: %llu rewritten, %llu already "
                "at target, %llu raced, %llu quarantined, %llu in the wrong state\n",
                (unsigned long long)m->done, (unsigned long long)m->skipped,
                (unsigned long long)m->raced, (unsigned long long)m->quarantined,
                (unsigned long long)m->wrong_state);
    }
}

/* Run the engine with progress and signals, then report its outcome
 * (pg: the store is PostgreSQL, whose lost connection is
 * KS_ERR_UNAVAILABLE too). */
static int run_engine(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                      const ks_cli_mig_opts *o, int64_t rollout_id, int pg, ks_cli_throttle *throttle)
{
    progress_state s;
    memset(&s, 0, sizeof s);
    s.throttle = throttle;
    s.rollout_id = rollout_id;
    s.db = o->db;
    s.ctx = ctx;
    s.json = o->json;
    s.tty = isatty(STDERR_FILENO);
    s.textfile = (ks_cli_mig_textfile){o->textfile, o->table, o->column, rollout_id, 0, 0};
    s.last_progress_time = (int64_t)time(NULL);
    ks_checkpoint cp;
    memset(&cp, 0, sizeof cp);
    install_signals();
    double t0 = ks_cli_mono_s();
    ks_err e = ks_migrate_run(ctx, store, p, &stop_requested, on_progress, &s, &cp);
    double elapsed = ks_cli_mono_s() - t0;
    if (s.rollout_id > 0) {
        report_health(&s);
    }
    if (cp.state.ptr != NULL || cp.pass != 0) {
        s.c = counts_of(&cp);
        s.have = 1;
    }
    if (s.have) { /* the counts are known: never write zeros over a resumed migration's */
        write_textfile(&s, 0, e == KS_OK);
    }
    int rc = e == KS_ERR_STOPPED ? EX_TEMPFAIL : ks_cli_exit_code(e);
    if (e != KS_OK) {
        const char *advice = e == KS_ERR_THRESHOLD ? auth_failed_advice(&s.run) : NULL;
        advice = advice != NULL ? advice
                                : ks_cli_migrate_advice(e, pg, rollout_id != 0 && !stop_requested);
        if (s.tty && !s.json && s.have) {
            fputc('\n', stderr);
            s.have = 0;
        }
        ks_cli_error("migrate %s %s.%s: %s (%s)", ks_migrate_mode_name(p->mode), o->table,
                     o->column, advice != NULL ? advice : "failed", ks_err_name(e));
    }
    print_summary(&s, e, rc, elapsed);
    return rc;
}

/* See cmd_migrate.h. */
int ks_cli_mig_covering_rollouts(const ks_cli_mig_opts *o, ks_rollout **rs, size_t *n)
{
    ks_rollout_db *db;
    int rc = ks_cli_rollout_open(o->db, 1, &db);
    if (rc != EX_OK) {
        return rc;
    }
    rc = ks_cli_rollouts_all(db, o->db, rs, n);
    ks_rollout_db_close(db);
    size_t kept = 0;
    for (size_t i = 0; rc == EX_OK && i < *n; i++) {
        if (ks_rollout_scope_covers(&(*rs)[i], o->table, o->column)) {
            (*rs)[kept++] = (*rs)[i];
        }
    }
    *n = kept;
    return rc;
}

/* See cmd_migrate.h. */
int ks_cli_mig_check_encoding(const char *cmd, const ks_cli_mig_opts *o, ks_value_encoding enc)
{
    ks_rollout *rs = NULL;
    size_t n = 0;
    int rc = ks_cli_mig_covering_rollouts(o, &rs, &n);
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *r = &rs[i];
        if (r->phase != KS_PHASE_FINALIZED && r->encoding != enc) {
            const char *want = ks_value_encoding_name((int)r->encoding);
            rc = ks_cli_usage_error(cmd, "rollout %lld records %s.%s as of %s encoding; this "
                                    "run's is %s: give --encoding %s",
                                    (long long)r->id, o->table, o->column, want,
                                    ks_value_encoding_name((int)enc), want);
        }
    }
    free(rs);
    return rc;
}

/* The rollout governing what a run toward key_id writes into o's column
 * (ks_rollout_scope_find: the column's own latest rollout, or a later
 * key-scoped one of key_id covering it) into *r, *found 1.  EX_CONFIG
 * after a message when another key-scoped rollout that is not finalized
 * covers the column: the run would convert that rollout's envelopes out
 * of its scope under its feet.  EX_OK with *found 0 when none governs. */
static int governing_rollout(const ks_cli_mig_opts *o, const char *key_id, ks_rollout *r, int *found)
{
    ks_rollout *rs = NULL;
    size_t n = 0;
    *found = 0;
    int rc = ks_cli_mig_covering_rollouts(o, &rs, &n);
    const ks_rollout *g = rc == EX_OK ? ks_rollout_scope_find(rs, n, o->table, o->column, key_id)
                                      : NULL;
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *k = &rs[i];
        if (k != g && k->scope == KS_SCOPE_KEY && k->phase != KS_PHASE_FINALIZED) {
            ks_cli_error("rollout %lld (key %s, %s) covers %s.%s: migrate runs on it only toward "
                         "that rollout's target, in backfill (--to-key %s:%u)",
                         (long long)k->id, k->source.key_id,
                         ks_rollout_phase_name((int)k->phase), o->table, o->column,
                         k->target.key_id, (unsigned)k->target.key_version);
            rc = EX_CONFIG;
        }
    }
    if (rc == EX_OK && g != NULL) {
        *r = *g;
        *found = 1;
    }
    free(rs);
    return rc;
}

/* Under a key-scoped rollout r: confine the run to r's key_id
 * (p->from_key_id, a view of key, which the caller keeps), so that
 * plaintext and other keys' envelopes in the column (another tenant's
 * key, say) are never moved under r's key.  A --from-key naming another
 * key is refused. */
static int key_scope_filter(const ks_rollout *r, ks_migrate_params *p, char key[KS_KEY_ID_MAX + 1])
{
    if (r->scope != KS_SCOPE_KEY) {
        return EX_OK;
    }
    size_t n = strlen(r->source.key_id);
    if (p->from_key_id.len != 0 &&
        (p->from_key_id.len != n || memcmp(p->from_key_id.ptr, r->source.key_id, n) != 0)) {
        ks_cli_error("rollout %lld moves the envelopes of key %s; this run's --from-key is "
                     "%.*s: give --from-key %s, or leave it out", (long long)r->id,
                     r->source.key_id, (int)p->from_key_id.len,
                     (const char *)p->from_key_id.ptr, r->source.key_id);
        return EX_CONFIG;
    }
    assert(n <= KS_KEY_ID_MAX);
    memcpy(key, r->source.key_id, n + 1);
    p->from_key_id = (ks_bytes){(const uint8_t *)key, n};
    return EX_OK;
}

/* Refuse a run that the rollout governing the column does not allow:
 * outside backfill, or toward another target than the rollout's.  No
 * rollout (or no rollout tables): the run goes ahead as before.  A
 * key-scoped rollout confines the run to its key (key_scope_filter;
 * from_key holds the key).  The store is opened read-only, so a database
 * without rollouts is not changed. */
static int rollout_gate(const ks_cli_mig_opts *o, ks_migrate_params *p, ks_ctx *ctx,
                        int64_t *rollout_id, char from_key[KS_KEY_ID_MAX + 1])
{
    ks_rollout r;
    char key_id[KS_KEY_ID_MAX + 1];
    *rollout_id = 0;
    if (p->to_key_id.len == 0 || p->to_key_id.len > KS_KEY_ID_MAX) {
        return ks_cli_usage_error("migrate run", "the target key id is empty or too long");
    }
    memcpy(key_id, p->to_key_id.ptr, p->to_key_id.len);
    key_id[p->to_key_id.len] = '\0';
    int found, rc = governing_rollout(o, key_id, &r, &found);
    if (rc != EX_OK || !found) {
        return rc;
    }
    const char *phase = ks_rollout_phase_name((int)r.phase);
    if (r.phase != KS_PHASE_BACKFILL) {
        ks_cli_error("rollout %lld is in phase %s; migrate runs only in backfill: "
                     "keyshift rollout advance --db %s --rollout %lld", (long long)r.id, phase,
                     o->db, (long long)r.id);
        return EX_CONFIG;
    }
    uint32_t version = p->to_key_version;
    if (version == 0) { /* the primary, as the engine will resolve it */
        ks_key_info info;
        ks_err ke = ks_ctx_key_info(ctx, p->to_key_id, 0, &info);
        if (ke != KS_OK) {
            ks_cli_error("cannot resolve the primary of the target key: %s", ks_err_name(ke));
            return ks_cli_exit_code(ke);
        }
        version = info.version;
    }
    const ks_rollout_class *t = &r.target, *src = &r.source;
    int same_key = p->to_key_id.len == strlen(t->key_id) &&
                   memcmp(p->to_key_id.ptr, t->key_id, p->to_key_id.len) == 0 &&
                   version == t->key_version;
    int same_shape = p->mode == KS_MIGRATE_REWRAP ||
                     (p->to_format == t->version && p->algorithm == t->algorithm);
    if (!same_key || !same_shape) {
        char scope[256];
        ks_cli_error("rollout %lld moves %s to v%u:%s:%s:%u; this run targets %.*s:%u%s: give "
                     "the rollout's target (--to-key %s:%u --to-format %u --algorithm %s)",
                     (long long)r.id, ks_rollout_scope_text(&r, scope, sizeof scope),
                     (unsigned)t->version,
                     ks_alg_name(t->algorithm), t->key_id, (unsigned)t->key_version,
                     (int)p->to_key_id.len, (const char *)p->to_key_id.ptr, (unsigned)version,
                     same_shape ? "" : " in another format or algorithm", t->key_id,
                     (unsigned)t->key_version, (unsigned)t->version, ks_alg_name(t->algorithm));
        return EX_CONFIG;
    }
    if (p->mode == KS_MIGRATE_REWRAP &&
        (src->is_plaintext || src->version != t->version || src->algorithm != t->algorithm)) {
        ks_cli_error("rollout %lld changes %s; rewrap keeps each envelope's format and "
                     "algorithm: use --mode %s", (long long)r.id,
                     src->is_plaintext ? "plaintext into envelopes" : "the format or algorithm",
                     src->is_plaintext ? "encrypt" : "reencrypt");
        return EX_CONFIG;
    }
    int frc = key_scope_filter(&r, p, from_key);
    if (frc != EX_OK) {
        return frc;
    }
    p->supersede = 1; /* the rollout's target makes any other unfinished run obsolete */
    *rollout_id = r.id;
    return EX_OK;
}

/*
 * With a rollout in backfill governing the column: make every batch's
 * write transaction check, under the write lock, that the rollout is
 * still in backfill (ks_rowstore_sqlite_set_write_gate, or the PostgreSQL
 * store's with the row locked FOR SHARE).  A rollback
 * committed meanwhile then stops the run before its next batch is
 * written (KS_ERR_STOPPED, exit 75, resumable once the rollout is back in
 * backfill), so that no target row is written after, say, a rollback to
 * read-compat and on to planned counted none.  The id is ours, not data.
 */
int ks_cli_backfill_gate(const ks_rowstore *store, int64_t rollout_id, int pg)
{
    if (rollout_id <= 0) {
        return EX_OK;
    }
    char sql[128];
    ks_err e;
    if (pg) {
        /* FOR SHARE: a transition of the rollout waits for the batch's
         * commit, and the next batch sees it (rowstore_pg.h) */
        snprintf(sql, sizeof sql,
                 "SELECT phase = 'backfill' FROM keyshift_rollout WHERE id = %lld FOR SHARE",
                 (long long)rollout_id);
        e = ks_rowstore_pg_set_write_gate(store, sql);
    } else {
        snprintf(sql, sizeof sql,
                 "SELECT phase = 'backfill' FROM main.keyshift_rollout WHERE id = %lld",
                 (long long)rollout_id);
        e = ks_rowstore_sqlite_set_write_gate(store, sql);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot watch rollout %lld during the run: %s", (long long)rollout_id,
                     ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* A health sample of a run with workers (ks_cli_workers_env.health). */
static void workers_health(void *arg)
{
    report_health(arg);
}

/* Run o's migration with workers (cmd_migrate_workers.c) on PostgreSQL,
 * with this file's signals, rollout gate and health samples; the exit
 * code, or KS_CLI_WORKERS_CATCHUP for the caller's single-connection
 * catch-up pass. */
static int run_workers(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                       const ks_cli_mig_opts *o, const ks_rowstore_target *t, uint32_t busy_ms,
                       int64_t rollout_id, const ks_cli_workers *wo, ks_cli_throttle *throttle)
{
    progress_state s; /* for the health samples only */
    memset(&s, 0, sizeof s);
    s.rollout_id = rollout_id;
    s.db = o->db;
    s.ctx = ctx;
    ks_cli_mig_textfile tf = {o->textfile, o->table, o->column, rollout_id, 0, 0};
    ks_cli_workers_env env = {o->db,    t,         busy_ms,        o->json,
                              rollout_id, throttle, &stop_requested,
                              rollout_id > 0 ? workers_health : NULL, &s, &tf};
    install_signals();
    return ks_cli_workers_run(ctx, store, p, wo, &env);
}

/* See cmd_migrate.h. */
int ks_cli_migrate_run(int argc, char **argv)
{
    static const char cmd[] = "migrate run";
    ks_cli_mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (ks_cli_mig_parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = ks_cli_mig_only_options(cmd, &o, " --mode --to-key --to-format --algorithm --tenant-column "
                                    "--tenant --context --purpose --batch-size --max-failure-rate "
                                    "--max-rows-per-second --busy-timeout --synchronous --keyring "
                                    "--passphrase-file --providers --no-verify --id-column --serial --encoding "
                                    "--from-key --supersede --throttle-query --max-replica-lag "
                                    "--workers --chunk-ids --lease --batch-target --batch-max --textfile ")) != EX_OK) {
        return rc;
    }
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    ks_rowstore_target t;
    char names[KS_CONTEXT_TEMPLATE_MAX];
    uint32_t busy_ms;
    ks_sqlite_sync sync = KS_SQLITE_SYNC_FULL;
    if ((rc = ks_cli_mig_common_params(cmd, &o, &p, &t, names)) != EX_OK || (rc = run_target(&o, &p)) != EX_OK ||
        (rc = run_limits(&o, &p, &busy_ms, &sync)) != EX_OK) {
        return rc;
    }
    p.supersede = o.supersede;
    int pg;
    if ((rc = ks_cli_db_check(o.db, &pg)) != EX_OK ||
        (rc = ks_cli_mig_check_encoding(cmd, &o, p.encoding)) != EX_OK) {
        return rc;
    }
    if (pg && o.synchronous != NULL) {
        return ks_cli_usage_error(cmd, "--synchronous is a SQLite option; a PostgreSQL commit "
                                       "is as durable as the server's synchronous_commit");
    }
    if (!pg && (o.throttle_query != NULL || o.max_replica_lag != NULL)) {
        return ks_cli_usage_error(cmd, "--throttle-query and --max-replica-lag need a PostgreSQL "
                                       "--db (a SQLite run pauses on SIGINT and resumes)");
    }
    ks_cli_workers wo;
    if ((rc = ks_cli_workers_parse(o.workers, o.chunk_ids, o.lease, pg, &wo)) != EX_OK) {
        return rc;
    }
    ks_cli_throttle throttle;
    memset(&throttle, 0, sizeof throttle);
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    int64_t rollout_id = 0;
    char from_key[KS_KEY_ID_MAX + 1];
    if ((rc = ks_cli_store_open(o.db, &t, 0, busy_ms, sync, &store)) == EX_OK &&
        (rc = ks_cli_check_context(cmd, &store, o.table, o.context)) == EX_OK &&
        (rc = ks_cli_ctx_open(cmd, o.keyring, o.passfile, o.providers, &keys, &ctx)) == EX_OK &&
        (rc = rollout_gate(&o, &p, ctx, &rollout_id, from_key)) == EX_OK &&
        (rc = ks_cli_backfill_gate(&store, rollout_id, pg)) == EX_OK &&
        (!pg || (rc = ks_cli_throttle_open(&throttle, o.db, o.table, o.column, o.throttle_query,
                                           o.max_replica_lag)) == EX_OK)) {
        rc = wo.workers ? run_workers(ctx, &store, &p, &o, &t, busy_ms, rollout_id, &wo, &throttle)
                        : KS_CLI_WORKERS_CATCHUP;
        if (rc == KS_CLI_WORKERS_CATCHUP) {
            rc = run_engine(ctx, &store, &p, &o, rollout_id, pg, pg ? &throttle : NULL);
        }
    }
    ks_cli_throttle_close(&throttle);
    ks_rowstore_close(&store);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* See cmd_migrate_workers.h. */
void ks_cli_put_progress_json(const ks_checkpoint *cp)
{
    printf("\"state\":");
    ks_cli_put_json_string(stdout, cp->state.ptr, cp->state.len);
    printf(",\"pass\":%u,\"cursor\":", cp->pass);
    ks_cli_put_value(stdout, &cp->cursor, 1);
    printf(",\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,"
           "\"wrong_state\":%llu",
           (unsigned long long)cp->done, (unsigned long long)cp->skipped,
           (unsigned long long)cp->raced, (unsigned long long)cp->quarantined,
           (unsigned long long)cp->wrong_state);
}
