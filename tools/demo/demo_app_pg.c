/*
 * tools/demo/demo_app_pg.c -- keyshift-demo-app's data access on PostgreSQL
 * (tools/demo/demo_app.h), over libpq.
 *
 * The row key is the id column (--id-column, else the table's one-column
 * primary key: a smallint, integer or bigint, as `keyshift migrate`
 * requires), and {id} renders it in decimal.  Two statements are
 * prepared at connect: the pick (WHERE id >= $1 ORDER BY id LIMIT 1) and
 * the UPDATE by id, each run with PQexecPrepared in autocommit, every
 * value a binary parameter, results in binary (integers big-endian,
 * bytea and text as their bytes; the column is bytea, or text or varchar
 * for base64 envelopes).  Identifiers enter SQL only quoted by
 * PQescapeIdentifier.  The session's lock_timeout is the SQLite busy
 * timeout's 10 s.  Messages never quote the connection string or the
 * server's text (it may quote rows): a failure is named by its SQLSTATE.
 * A lost connection fails the call that meets it; the next pick
 * reconnects with the same parameters.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "../cli/cli.h"
#include "demo_app.h"

/* The type oids the backend reads (pg_type.dat). */
#define OID_BYTEA 17
#define OID_TEXT 25
#define OID_VARCHAR 1043
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23

/* The PostgreSQL backend. */
typedef struct pg_db {
    demo_db base;
    PGconn *conn;
    PGresult *res;          /* the last pick's result, until release */
    char *qtable, *qcol, *qid, *qtenant; /* quoted identifiers */
    unsigned id_type;       /* OID_INT2, OID_INT4 or OID_INT8 */
    int text;               /* the column holds base64 text: text or varchar */
    char state[6];          /* the last failure's SQLSTATE ("" for none) */
    char msg[160];
} pg_db;

/* Drop the server's notices (libpq's default prints them): they are its
 * own text, which may quote rows. */
static void drop_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Name the failure of result res (NULL: a client-side failure) in p->msg
 * by its SQLSTATE, kept in p->state; a lost connection says it will be
 * retried. */
static void pg_fail(pg_db *p, const PGresult *res)
{
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    snprintf(p->state, sizeof p->state, "%s", state != NULL ? state : "");
    if (PQstatus(p->conn) != CONNECTION_OK) {
        snprintf(p->msg, sizeof p->msg, "the connection to the PostgreSQL server was lost "
                                        "(reconnecting at the next operation)");
    } else {
        snprintf(p->msg, sizeof p->msg, "PostgreSQL error (SQLSTATE %s)",
                 state != NULL ? state : "none");
    }
}

/* A big-endian integer of n (2, 4 or 8) bytes at b. */
static int64_t get_be(const char *b, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = v << 8 | (uint8_t)b[i];
    }
    int shift = 64 - 8 * n;
    return shift > 0 ? (int64_t)(v << shift) >> shift : (int64_t)v; /* sign-extend */
}

/* v as 8 bytes big-endian at be (a binary int8 parameter). */
static void put_be64(uint8_t be[8], int64_t v)
{
    for (int i = 0; i < 8; i++) {
        be[i] = (uint8_t)((uint64_t)v >> (56 - 8 * i));
    }
}

/* Run constant statement sql (no parameters, no value); 0 or -1 (p->msg). */
static int pg_exec(pg_db *p, const char *sql)
{
    PGresult *res = PQexec(p->conn, sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok) {
        pg_fail(p, res);
    }
    PQclear(res);
    return ok ? 0 : -1;
}

/* Prepare statement name from the NULL-terminated parts (literal text
 * and quoted identifiers), with nparams parameters; 0 or -1 (p->msg). */
static int pg_prepare(pg_db *p, const char *name, const char *const *parts, int nparams)
{
    char sql[1024] = "";
    for (size_t i = 0; parts[i] != NULL; i++) {
        strncat(sql, parts[i], sizeof sql - strlen(sql) - 1);
    }
    PGresult *res = PQprepare(p->conn, name, sql, nparams, NULL);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok) {
        pg_fail(p, res);
    }
    PQclear(res);
    return ok ? 0 : -1;
}

/* Set up a (new) session: its lock_timeout, then the pick and the
 * UPDATE; 0 or -1 (p->msg, p->state). */
static int pg_session(pg_db *p)
{
    char set[64];
    snprintf(set, sizeof set, "SET lock_timeout = %d", DEMO_BUSY_TIMEOUT_MS);
    const char *const pick[] = {"SELECT ", p->qid, ", ", p->qtenant, "::text, ", p->qcol,
                                " FROM ", p->qtable, " WHERE ", p->qid,
                                " >= $1::int8 ORDER BY ", p->qid, " LIMIT 1", NULL};
    const char *const update[] = {"UPDATE ", p->qtable, " SET ", p->qcol,
                                  p->text ? " = $1::text WHERE " : " = $1::bytea WHERE ",
                                  p->qid, " = $2::int8", NULL};
    if (pg_exec(p, set) != 0 || pg_prepare(p, "demo_pick", pick, 1) != 0 ||
        pg_prepare(p, "demo_update", update, 2) != 0) {
        return -1;
    }
    return 0;
}

/* Reconnect after a lost connection; 0 when the session is usable. */
static int pg_ready(pg_db *p)
{
    if (PQstatus(p->conn) == CONNECTION_OK) {
        return 0;
    }
    PQreset(p->conn);
    if (PQstatus(p->conn) != CONNECTION_OK || pg_session(p) != 0) {
        snprintf(p->msg, sizeof p->msg, "cannot reconnect to the PostgreSQL server");
        return -1;
    }
    return 0;
}

/* See demo_db_ops.pick: the result's columns are id, tenant and value. */
static int pg_pick(demo_db *d, int64_t start, demo_row *row)
{
    pg_db *p = (pg_db *)d;
    PQclear(p->res);
    p->res = NULL;
    if (pg_ready(p) != 0) {
        return -1;
    }
    uint8_t be[8];
    put_be64(be, start);
    const char *vals[] = {(const char *)be};
    const int lens[] = {8}, fmts[] = {1};
    p->res = PQexecPrepared(p->conn, "demo_pick", 1, vals, lens, fmts, 1);
    if (PQresultStatus(p->res) != PGRES_TUPLES_OK) {
        pg_fail(p, p->res);
        return -1;
    }
    if (PQntuples(p->res) == 0) {
        return 0;
    }
    int idn = p->id_type == OID_INT8 ? 8 : p->id_type == OID_INT4 ? 4 : 2;
    if (PQgetisnull(p->res, 0, 0) || PQgetlength(p->res, 0, 0) != idn) {
        snprintf(p->msg, sizeof p->msg, "the id column returned no integer");
        return -1;
    }
    memset(row, 0, sizeof *row);
    row->key = get_be(PQgetvalue(p->res, 0, 0), idn);
    row->id_kind = DEMO_ID_INT;
    row->id_int = (long long)row->key;
    if (!PQgetisnull(p->res, 0, 1)) {
        row->tenant = (const uint8_t *)PQgetvalue(p->res, 0, 1);
        row->tenant_len = (size_t)PQgetlength(p->res, 0, 1);
    }
    row->value_null = PQgetisnull(p->res, 0, 2);
    row->value = (const uint8_t *)PQgetvalue(p->res, 0, 2); /* "" when NULL */
    row->value_len = row->value_null ? 0 : (size_t)PQgetlength(p->res, 0, 2);
    return 1;
}

/* See demo_db_ops.release. */
static void pg_release(demo_db *d)
{
    pg_db *p = (pg_db *)d;
    PQclear(p->res);
    p->res = NULL;
}

/* See demo_db_ops.update: the value goes as the column's type either
 * way (a binary text parameter is its bytes; the server checks that they
 * are valid in its encoding). */
static int pg_update(demo_db *d, int64_t key, const uint8_t *value, size_t len, int blob)
{
    (void)blob;
    pg_db *p = (pg_db *)d;
    if (pg_ready(p) != 0) {
        return -1;
    }
    uint8_t be[8];
    put_be64(be, key);
    const char *vals[] = {len > 0 ? (const char *)value : "", (const char *)be};
    const int lens[] = {(int)len, 8}, fmts[] = {1, 1};
    PGresult *res = PQexecPrepared(p->conn, "demo_update", 2, vals, lens, fmts, 1);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok) {
        pg_fail(p, res);
    }
    PQclear(res);
    return ok ? 0 : -1;
}

/* See demo_db_ops.errmsg. */
static const char *pg_errmsg(demo_db *d)
{
    return ((pg_db *)d)->msg;
}

/* See demo_db_ops.close. */
static void pg_close(demo_db *d)
{
    pg_db *p = (pg_db *)d;
    PQclear(p->res);
    PQfinish(p->conn);
    PQfreemem(p->qtable);
    PQfreemem(p->qcol);
    PQfreemem(p->qid);
    PQfreemem(p->qtenant);
    free(p);
}

static const demo_db_ops pg_ops = {pg_pick, pg_release, pg_update, pg_errmsg, pg_close};

/* Run catalog or range query sql with text parameters vals[0, n), text
 * results, into *res; 0, or -1 (p->msg) with *res cleared. */
static int pg_query(pg_db *p, const char *sql, const char *const *vals, int n, PGresult **res)
{
    *res = PQexecParams(p->conn, sql, n, NULL, vals, NULL, NULL, 0);
    if (PQresultStatus(*res) == PGRES_TUPLES_OK) {
        return 0;
    }
    pg_fail(p, *res);
    PQclear(*res);
    *res = NULL;
    return -1;
}

/* The id column: t->id_column, else the table's one-column primary key
 * (PQescapeIdentifier'd into p->qid).  EX_OK or an exit code after a
 * message. */
static int pg_find_id(pg_db *p, const demo_target *t)
{
    const char *name = t->id_column;
    PGresult *res = NULL;
    if (name == NULL) {
        const char *vals[] = {p->qtable};
        if (pg_query(p,
                     "SELECT a.attname FROM pg_catalog.pg_index i "
                     "JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
                     "AND a.attnum = i.indkey[0] WHERE i.indrelid = $1::text::regclass "
                     "AND i.indisprimary AND i.indnkeyatts = 1",
                     vals, 1, &res) != 0) {
            if (strcmp(p->state, "42P01") == 0) { /* undefined_table */
                ks_cli_error("no table %s in the PostgreSQL database", t->table);
                return EX_NOINPUT;
            }
            ks_cli_error("PostgreSQL database: reading the catalog: %s", p->msg);
            return EX_IOERR;
        }
        if (PQntuples(res) != 1) {
            PQclear(res);
            ks_cli_error("table %s has no one-column primary key: name an id column "
                         "(--id-column)",
                         t->table);
            return EX_USAGE;
        }
        name = PQgetvalue(res, 0, 0);
    }
    p->qid = PQescapeIdentifier(p->conn, name, strlen(name));
    PQclear(res);
    if (p->qid == NULL) {
        ks_cli_error("--id-column: not a valid name");
        return EX_USAGE;
    }
    return EX_OK;
}

/* Check the types of the pick's results (an integer id, a bytea value)
 * and find the id range.  EX_OK or an exit code after a message. */
static int pg_check(pg_db *p, const demo_target *t)
{
    PGresult *d = PQdescribePrepared(p->conn, "demo_pick");
    int ok = PQresultStatus(d) == PGRES_COMMAND_OK && PQnfields(d) == 3;
    unsigned id_type = ok ? (unsigned)PQftype(d, 0) : 0;
    unsigned col_type = ok ? (unsigned)PQftype(d, 2) : 0;
    if (!ok) {
        pg_fail(p, d);
    }
    PQclear(d);
    if (!ok) {
        ks_cli_error("PostgreSQL database: %s", p->msg);
        return EX_IOERR;
    }
    if (id_type != OID_INT2 && id_type != OID_INT4 && id_type != OID_INT8) {
        ks_cli_error("the id column of table %s is not a smallint, integer or bigint", t->table);
        return EX_USAGE;
    }
    if (!p->text && col_type != OID_BYTEA) {
        ks_cli_error("column %s of table %s is not bytea (a text or varchar column of base64 "
                     "envelopes needs --encoding base64)", t->column, t->table);
        return EX_USAGE;
    }
    if (p->text && col_type != OID_TEXT && col_type != OID_VARCHAR) {
        ks_cli_error("column %s of table %s is neither text nor varchar, which --encoding "
                     "base64 needs", t->column, t->table);
        return EX_USAGE;
    }
    p->id_type = id_type;
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT min(%s)::int8, max(%s)::int8 FROM %s", p->qid, p->qid,
             p->qtable);
    PGresult *res = NULL;
    if (pg_query(p, sql, NULL, 0, &res) != 0) {
        ks_cli_error("PostgreSQL database: %s", p->msg);
        return EX_IOERR;
    }
    int empty = PQgetisnull(res, 0, 0);
    if (!empty) {
        p->base.min_key = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        p->base.max_key = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    }
    PQclear(res);
    if (empty) {
        ks_cli_error("table %s has no rows", t->table);
        return EX_NOINPUT;
    }
    return EX_OK;
}

/* Connect and quote the table's and the columns' names; then the id
 * column, the session and the checks.  EX_OK or an exit code after a
 * message. */
static int pg_setup(pg_db *p, const demo_target *t)
{
    const char *keys[] = {"fallback_application_name", "dbname", NULL};
    const char *vals[] = {"keyshift-demo-app", t->db, NULL};
    p->conn = PQconnectdbParams(keys, vals, 1);
    if (p->conn == NULL) {
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    PQsetNoticeProcessor(p->conn, drop_notice, NULL);
    if (PQstatus(p->conn) != CONNECTION_OK) {
        char msg[160]; /* libpq's first line: the server's address, authentication */
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(p->conn));
        msg[strcspn(msg, "\n")] = '\0';
        ks_cli_error("cannot connect to the PostgreSQL database: %s", msg);
        return EX_UNAVAILABLE;
    }
    p->qtable = PQescapeIdentifier(p->conn, t->table, strlen(t->table));
    p->qcol = PQescapeIdentifier(p->conn, t->column, strlen(t->column));
    p->qtenant = PQescapeIdentifier(p->conn, t->tenant_column, strlen(t->tenant_column));
    if (p->qtable == NULL || p->qcol == NULL || p->qtenant == NULL) {
        ks_cli_error("--table, --column, --tenant-column: not valid names");
        return EX_USAGE;
    }
    int rc = pg_find_id(p, t);
    if (rc != EX_OK) {
        return rc;
    }
    if (pg_session(p) != 0) { /* undefined_table, undefined_column */
        int missing = strcmp(p->state, "42P01") == 0 || strcmp(p->state, "42703") == 0;
        if (missing) {
            ks_cli_error("no table %s with columns %s, %s and the id in the PostgreSQL database",
                         t->table, t->column, t->tenant_column);
        } else {
            ks_cli_error("PostgreSQL database: %s", p->msg);
        }
        return missing ? EX_NOINPUT : EX_IOERR;
    }
    return pg_check(p, t);
}

/* See demo_app.h. */
int demo_db_pg_open(const demo_target *t, demo_db **out)
{
    *out = NULL;
    pg_db *p = calloc(1, sizeof *p);
    if (p == NULL) {
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    p->base.ops = &pg_ops;
    p->text = t->text;
    int rc = pg_setup(p, t);
    if (rc != EX_OK) {
        pg_close(&p->base);
        return rc;
    }
    *out = &p->base;
    return EX_OK;
}
