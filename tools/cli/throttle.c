/*
 * tools/cli/throttle.c -- the pauses of `keyshift migrate run` on PostgreSQL
 * (tools/cli/throttle.h): the pause flag, --throttle-query and
 * --max-replica-lag, checked after every batch on a session of their own.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "cli.h"
#include "throttle.h"

/* The flag's table: one row per paused column. */
static const char pause_schema[] =
    "CREATE TABLE IF NOT EXISTS keyshift_migrate_pause ("
    " tbl text NOT NULL, col text NOT NULL, paused_at bigint NOT NULL, reason text NOT NULL,"
    " PRIMARY KEY (tbl, col))";

/* Sleep for s seconds (an interrupting signal ends it early). */
static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A notice processor that drops the server's notices: its own text. */
static void drop_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Connect to conninfo and create the flag's table; NULL after a message. */
static PGconn *connect_checks(const char *conninfo)
{
    PGconn *c = PQconnectdb(conninfo);
    if (c == NULL || PQstatus(c) != CONNECTION_OK) {
        ks_cli_error("cannot connect to the PostgreSQL database for the run's throttle checks");
        PQfinish(c);
        return NULL;
    }
    PQsetNoticeProcessor(c, drop_notice, NULL); /* never print the server's text */
    PGresult *res = PQexec(c, pause_schema);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!ok) {
        ks_cli_error("cannot create keyshift_migrate_pause (CREATE privilege on the schema?)");
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* See throttle.h. */
int ks_cli_throttle_open(ks_cli_throttle *t, const char *conninfo, const char *table,
                         const char *column, const char *query, const char *max_lag)
{
    memset(t, 0, sizeof *t);
    t->max_lag_s = -1;
    uint32_t lag = 0;
    if (max_lag != NULL && ks_cli_parse_duration(max_lag, &lag) != 0) {
        return ks_cli_usage_error("migrate run", "--max-replica-lag must be a duration (5s, 1m)");
    }
    if (strlen(table) >= sizeof t->table || strlen(column) >= sizeof t->column) {
        return ks_cli_usage_error("migrate run", "table or column name too long");
    }
    t->conn = connect_checks(conninfo);
    if (t->conn == NULL) {
        return EX_UNAVAILABLE;
    }
    strcpy(t->table, table);
    strcpy(t->column, column);
    t->max_lag_s = max_lag != NULL ? (double)lag : -1;
    PGresult *res = PQexec(t->conn, "SET default_transaction_read_only = on");
    PQclear(res);
    /* asked after every batch: parsed once */
    res = PQprepare(t->conn, "ks_pause",
                    "SELECT reason FROM keyshift_migrate_pause WHERE tbl = $1 AND col = $2", 2, NULL);
    int prepared = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!prepared) {
        ks_cli_throttle_close(t);
        ks_cli_error("cannot read keyshift_migrate_pause");
        return EX_SOFTWARE;
    }
    if (query != NULL) {
        res = PQprepare(t->conn, "ks_throttle", query, 0, NULL);
        int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!ok) {
            ks_cli_throttle_close(t);
            return ks_cli_usage_error("migrate run", "--throttle-query does not prepare");
        }
        t->has_query = 1;
    }
    return EX_OK;
}

/* One text value of a one-row result, or NULL. */
static const char *one_value(PGresult *res)
{
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) < 1 || PQnfields(res) < 1 ||
        PQgetisnull(res, 0, 0)) {
        return NULL;
    }
    return PQgetvalue(res, 0, 0);
}

/* Whether a condition holds now, its description into why; 0 when none
 * does (or a check failed: see throttle.h). */
static int throttled(ks_cli_throttle *t, char *why, size_t cap)
{
    const char *vals[2] = {t->table, t->column};
    PGresult *res = PQexecPrepared(t->conn, "ks_pause", 2, vals, NULL, NULL, 0);
    const char *v = one_value(res);
    if (v != NULL) {
        snprintf(why, cap, "paused by keyshift migrate pause (%.80s)", v);
        for (char *p = why; *p != '\0'; p++) {
            if (*p < 0x20 || *p > 0x7e || *p == '"' || *p == '\\') {
                *p = '?'; /* the operator's reason: printable, and safe in a JSON string */
            }
        }
        PQclear(res);
        return 1;
    }
    PQclear(res);
    if (t->has_query) {
        res = PQexecPrepared(t->conn, "ks_throttle", 0, NULL, NULL, NULL, 0);
        v = one_value(res);
        int on = v != NULL && (strcmp(v, "t") == 0 || strcmp(v, "1") == 0);
        PQclear(res);
        if (on) {
            snprintf(why, cap, "the throttle query returned true");
            return 1;
        }
    }
    if (t->max_lag_s >= 0) {
        res = PQexec(t->conn, "SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::float8 "
                              "FROM pg_stat_replication");
        v = one_value(res);
        double lag = v != NULL ? atof(v) : 0;
        PQclear(res);
        if (lag > t->max_lag_s) {
            snprintf(why, cap, "replica replay lag %.1f s above %.0f s", lag, t->max_lag_s);
            return 1;
        }
    }
    return 0;
}

/* Close the pause in progress: count its time and say so (stderr only
 * when the run goes on: a stopped run says why it ended instead). */
static void pause_end(ks_cli_throttle *t, int json, int stopped)
{
    assert(t->active);
    double spent = ks_cli_mono_s() - t->since;
    t->throttled_s += spent;
    t->active = 0;
    if (json) {
        printf("{\"throttled\":false,\"paused_s\":%.1f}\n", spent);
        fflush(stdout);
    } else if (!stopped) {
        ks_cli_error("resumed after %.1f s", spent);
    }
}

/* See throttle.h. */
int ks_cli_throttle_poll(ks_cli_throttle *t, int json)
{
    if (t->conn == NULL) {
        return 0;
    }
    char why[160];
    if (!throttled(t, why, sizeof why)) {
        if (t->active) {
            pause_end(t, json, 0);
        }
        return 0;
    }
    if (!t->active) {
        t->active = 1;
        t->since = ks_cli_mono_s();
        t->pauses++;
        if (json) {
            printf("{\"throttled\":true,\"reason\":\"%s\"}\n", why);
            fflush(stdout);
        } else {
            ks_cli_error("throttled: %s; waiting (the time is left out of the ETA)", why);
        }
    }
    return 1;
}

/* See throttle.h. */
void ks_cli_throttle_stopped(ks_cli_throttle *t, int json)
{
    if (t->active) {
        pause_end(t, json, 1);
    }
}

/* See throttle.h. */
double ks_cli_throttle_spent(const ks_cli_throttle *t)
{
    return t->throttled_s + (t->active ? ks_cli_mono_s() - t->since : 0);
}

/* See throttle.h. */
void ks_cli_throttle_wait(ks_cli_throttle *t, volatile sig_atomic_t *stop, int json)
{
    if (!ks_cli_throttle_poll(t, json)) {
        return;
    }
    while (!*stop) {
        sleep_s(KS_CLI_THROTTLE_POLL_S);
        if (!ks_cli_throttle_poll(t, json)) {
            return;
        }
    }
    ks_cli_throttle_stopped(t, json);
}

/* See throttle.h. */
void ks_cli_throttle_close(ks_cli_throttle *t)
{
    PQfinish(t->conn);
    t->conn = NULL;
}

/* See throttle.h. */
int ks_cli_pause_set(const char *conninfo, const char *table, const char *column, int paused,
                     const char *reason)
{
    PGconn *c = connect_checks(conninfo);
    if (c == NULL) {
        return EX_UNAVAILABLE;
    }
    char now[24];
    snprintf(now, sizeof now, "%lld", (long long)time(NULL));
    const char *vals[4] = {table, column, now, reason != NULL ? reason : ""};
    PGresult *res =
        paused ? PQexecParams(c,
                              "INSERT INTO keyshift_migrate_pause (tbl, col, paused_at, reason) "
                              "VALUES ($1, $2, $3::bigint, $4) ON CONFLICT (tbl, col) DO UPDATE "
                              "SET paused_at = EXCLUDED.paused_at, reason = EXCLUDED.reason",
                              4, NULL, vals, NULL, NULL, 0)
               : PQexecParams(c, "DELETE FROM keyshift_migrate_pause WHERE tbl = $1 AND col = $2", 2,
                              NULL, vals, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    PQfinish(c);
    if (!ok) {
        ks_cli_error("cannot %s %s.%s", paused ? "pause" : "resume", table, column);
        return EX_SOFTWARE;
    }
    return EX_OK;
}
