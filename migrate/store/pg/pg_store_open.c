/*
 * migrate/store/pg/pg_store_open.c -- opening the PostgreSQL row store
 * (ks_rowstore_pg_open, keyshift/rowstore_pg.h): the connection and its
 * session settings, the target table and columns looked up in the
 * catalog and checked, keyshift's own tables created or upgraded, the
 * statements built from the catalog's spellings and prepared for the
 * store's life; and ks_rowstore_pg_checkpoints and
 * ks_rowstore_pg_migrated_columns, which connect only to list what the
 * keyshift_migration tables hold.  The tables and the rules for
 * statements, views and failures are documented at the top of
 * pg_store.c, whose operations the opened store runs
 * (pg_store_internal.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>

#include "../../errbuf.h"
#include "pg_decode.h"
#include "pg_store_internal.h"
#include "pg_util.h"
#include "../../alloc_hook.h"

/* The longest identifier accepted. */
#define IDENT_MAX 1024u

/* What the catalog says about one column. */
typedef struct colinfo {
    int attnum;
    char *name;               /* catalog spelling (malloc'd) */
    unsigned type;            /* type oid */
    int notnull, generated;
    char *quoted;             /* PQescapeIdentifier of name (malloc'd copy) */
} colinfo;

/* ---- errors ------------------------------------------------------------------ */

/* The SQLSTATE of res for a message ("-----" when there is none). */
static const char *sqlstate_of(const PGresult *res)
{
    const char *st = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    return st != NULL ? st : "-----";
}

/* ---- opening ------------------------------------------------------------------------ */

/* The context of an open: the store being built, the target's catalog
 * facts, and where messages go. */
typedef struct opener {
    pg_store *s;
    char *errbuf;
    size_t errbuf_len;
    char tname[96];           /* the table name, printable, for messages */
    char *table_oid;          /* pg_class.oid as text */
    char *ns_oid;             /* its schema's oid as text */
    char *qtable;             /* "schema"."table", quoted */
    char *qschema;            /* "schema", quoted */
    colinfo column, id, tenant, context[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
} opener;

/* strdup that reports failure as NULL. */
static char *dup_str(const char *p)
{
    size_t n = strlen(p) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, p, n);
    return d;
}

/* name quoted as an identifier by libpq, in memory of our own (NULL
 * when out of memory or libpq refuses it). */
static char *quote_ident(PGconn *conn, const char *name)
{
    char *q = PQescapeIdentifier(conn, name, strlen(name));
    if (q == NULL)
        return NULL;
    char *d = dup_str(q);
    PQfreemem(q);
    return d;
}

/* Run a catalog query sql with text parameters vals[0, n) and text
 * results; KS_OK with *out (the caller's to clear) on success. */
static ks_err catalog_query(opener *o, const char *sql, const char *const *vals, int n,
                            PGresult **out, const char *what)
{
    PGresult *res = PQexecParams(o->s->conn, sql, n, NULL, vals, NULL, NULL, 0);
    *out = NULL;
    if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
        *out = res;
        return KS_OK;
    }
    ks_err err = ks_errbuf_fail(o->errbuf, o->errbuf_len, ks_pgs_result_err(o->s, res),
                      "%s failed (SQLSTATE %s)", what, sqlstate_of(res));
    PQclear(res);
    return err;
}

/* Check the caller's arguments before connecting. */
static ks_err check_args(const char *conninfo, const ks_rowstore_target *t, ks_rowstore *out,
                         char *errbuf, size_t errbuf_len)
{
    if (conninfo == NULL || t == NULL || out == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "missing connection string, target or store");
    if (t->n_context_columns > KS_ROWSTORE_MAX_CONTEXT_COLUMNS)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "at most %d context columns",
                    KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    const char *names[4 + KS_ROWSTORE_MAX_CONTEXT_COLUMNS] = {t->table, t->column};
    size_t n = 2;
    if (t->id_column != NULL)
        names[n++] = t->id_column;
    if (t->tenant_column != NULL)
        names[n++] = t->tenant_column;
    for (size_t i = 0; i < t->n_context_columns; i++)
        names[n++] = t->context_columns[i];
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || names[i][0] == '\0' || strlen(names[i]) > IDENT_MAX)
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                        "a table or column name is missing, empty or too long");
    if (strncmp(t->table, "keyshift_", 9) == 0 || strncmp(t->table, "pg_", 3) == 0)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" is reserved (pg_*, keyshift_*)", t->table);
    return KS_OK;
}

/* Connect and set the session's timeouts and read-only mode (bound
 * through set_config, never pasted). */
static ks_err connect_db(opener *o, const char *conninfo)
{
    pg_store *s = o->s;
    ks_err err = ks_pg_connect(conninfo, &s->conn, o->errbuf, o->errbuf_len);
    if (err != KS_OK)
        return err;
    const char *cfg[] = {s->lock_ms, s->stmt_ms, s->read_only ? "on" : "off"};
    PGresult *res;
    err = catalog_query(o,
                        "SELECT pg_catalog.set_config('lock_timeout', $1, false), "
                        "pg_catalog.set_config('statement_timeout', $2, false), "
                        "pg_catalog.set_config('default_transaction_read_only', $3, false)",
                        cfg, 3, &res, "setting the session's timeouts");
    PQclear(res);
    return err;
}

/* Look up the target table among the visible ones: its oid, schema and
 * quoted names.  A view or another kind of relation is refused. */
static ks_err find_table(opener *o, const char *table)
{
    PGresult *res;
    ks_err err = catalog_query(o,
                               "SELECT c.oid, n.oid, n.nspname, c.relkind "
                               "FROM pg_catalog.pg_class c "
                               "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                               "WHERE c.relname = $1 AND pg_catalog.pg_table_is_visible(c.oid) "
                               "AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                               &table, 1, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET, "no table \"%s\" in the database",
                    o->tname);
    }
    const char *kind = PQgetvalue(res, 0, 3);
    if (strcmp(kind, "r") != 0 && strcmp(kind, "p") != 0) {
        PQclear(res);
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "\"%s\" is not a table (a view, materialized view or foreign table)",
                    o->tname);
    }
    o->table_oid = dup_str(PQgetvalue(res, 0, 0));
    o->ns_oid = dup_str(PQgetvalue(res, 0, 1));
    o->qschema = quote_ident(o->s->conn, PQgetvalue(res, 0, 2));
    char *qname = quote_ident(o->s->conn, table);
    PQclear(res);
    o->s->table = dup_str(table);
    if (qname != NULL && o->qschema != NULL) {
        const char *parts[] = {o->qschema, ".", qname};
        o->qtable = ks_pgs_concat(parts, 3);
    }
    free(qname);
    if (o->table_oid == NULL || o->ns_oid == NULL || o->qtable == NULL || o->s->table == NULL)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    return KS_OK;
}

/* Look up column name of the target table into *c (role names it in
 * messages); KS_ERR_NO_TARGET when there is none. */
static ks_err find_column(opener *o, const char *name, const char *role, colinfo *c)
{
    const char *vals[] = {o->table_oid, name};
    PGresult *res;
    ks_err err = catalog_query(o,
                               "SELECT a.attnum, a.atttypid, a.attnotnull, a.attgenerated <> '' "
                               "FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1::oid "
                               "AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                               vals, 2, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    if (PQntuples(res) != 1) {
        PQclear(res);
        char pcol[96];
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "no %s column \"%s\" in table \"%s\"", role,
                    ks_pg_printable(name, pcol, sizeof pcol), o->tname);
    }
    c->attnum = atoi(PQgetvalue(res, 0, 0));
    c->type = (unsigned)strtoul(PQgetvalue(res, 0, 1), NULL, 10);
    c->notnull = strcmp(PQgetvalue(res, 0, 2), "t") == 0;
    c->generated = strcmp(PQgetvalue(res, 0, 3), "t") == 0;
    PQclear(res);
    c->name = dup_str(name);
    c->quoted = quote_ident(o->s->conn, name);
    if (c->name == NULL || c->quoted == NULL)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    return KS_OK;
}

/* Without an id_column: the name of the table's one-column primary key
 * (malloc'd) into *name. */
static ks_err primary_key(opener *o, char **name)
{
    PGresult *res;
    const char *oid = o->table_oid;
    ks_err err = catalog_query(o,
                               "SELECT a.attname FROM pg_catalog.pg_index i "
                               "JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
                               "AND a.attnum = i.indkey[0] WHERE i.indrelid = $1::oid "
                               "AND i.indisprimary AND i.indnkeyatts = 1",
                               &oid, 1, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    *name = PQntuples(res) == 1 ? dup_str(PQgetvalue(res, 0, 0)) : NULL;
    int found = PQntuples(res) == 1;
    PQclear(res);
    if (!found)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "table \"%s\" has no one-column primary key: name an id column", o->tname);
    return *name != NULL ? KS_OK : ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
}

/* Nonzero for the integer types an id may have. */
static int integer_type(unsigned t)
{
    return t == KS_PG_OID_INT2 || t == KS_PG_OID_INT4 || t == KS_PG_OID_INT8;
}

/* Check that the id column is an integer and the primary key, or NOT
 * NULL with a unique index of its own (full, immediate, valid). */
static ks_err check_id(opener *o)
{
    char pid[96];
    ks_pg_printable(o->id.name, pid, sizeof pid);
    if (!integer_type(o->id.type))
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "id column \"%s\" of table \"%s\" is not a smallint, integer or bigint", pid,
                    o->tname);
    char attnum[16];
    snprintf(attnum, sizeof attnum, "%d", o->id.attnum);
    const char *vals[] = {o->table_oid, attnum, o->id.notnull ? "t" : "f"};
    PGresult *res;
    ks_err err = catalog_query(o,
                               "SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = $1::oid "
                               "AND i.indisunique AND i.indnkeyatts = 1 AND i.indkey[0] = $2::int2 "
                               "AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indisvalid "
                               "AND i.indimmediate AND (i.indisprimary OR $3::bool)",
                               vals, 3, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    int ok = PQntuples(res) > 0;
    PQclear(res);
    if (!ok)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "id column \"%s\" of table \"%s\" is neither the primary key nor NOT NULL "
                    "with a unique index of its own",
                    pid, o->tname);
    return KS_OK;
}

/* Resolve every name of target t against the catalog, with the checks
 * of rowstore_pg.h. */
static ks_err resolve_target(opener *o, const ks_rowstore_target *t)
{
    ks_err err = find_table(o, t->table);
    if (err == KS_OK)
        err = find_column(o, t->column, "target", &o->column);
    if (err == KS_OK && t->id_column != NULL) {
        err = find_column(o, t->id_column, "id", &o->id);
    } else if (err == KS_OK) {
        char *pk = NULL;
        err = primary_key(o, &pk);
        if (err == KS_OK)
            err = find_column(o, pk, "id", &o->id);
        free(pk);
    }
    if (err == KS_OK && t->tenant_column != NULL)
        err = find_column(o, t->tenant_column, "tenant", &o->tenant);
    for (size_t i = 0; err == KS_OK && i < t->n_context_columns; i++)
        err = find_column(o, t->context_columns[i], "context", &o->context[i]);
    if (err == KS_OK)
        err = check_id(o);
    if (err != KS_OK)
        return err;
    char pcol[96];
    ks_pg_printable(o->column.name, pcol, sizeof pcol);
    if (!o->s->as_text && o->column.type != KS_PG_OID_BYTEA)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "column \"%s\" of table \"%s\" is not bytea (a text or varchar column "
                    "of base64 envelopes needs --encoding base64)", pcol, o->tname);
    if (o->s->as_text && o->column.type != KS_PG_OID_TEXT &&
        o->column.type != KS_PG_OID_VARCHAR)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                    "column \"%s\" of table \"%s\" is neither text nor varchar, which "
                    "--encoding base64 needs (a bytea column holds binary envelopes)",
                    pcol, o->tname);
    int clash = o->column.attnum == o->id.attnum || o->column.attnum == o->tenant.attnum;
    for (size_t i = 0; i < t->n_context_columns; i++)
        clash |= o->column.attnum == o->context[i].attnum;
    if (clash || o->column.generated)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "column \"%s\" is generated, or also the id, tenant or a context column",
                    pcol);
    o->s->column = dup_str(o->column.name);
    return o->s->column != NULL ? KS_OK : ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY,
                                              "out of memory");
}

/* The DDL of keyshift's tables in schema qs (quoted), %s standing for it. */
static const char own_tables_ddl[] =
    "CREATE TABLE IF NOT EXISTS %s.keyshift_migration("
    "tbl text NOT NULL, col text NOT NULL, params text NOT NULL, state text NOT NULL, "
    "cursor bigint, pass bigint NOT NULL, done bigint NOT NULL, skipped bigint NOT NULL, "
    "raced bigint NOT NULL, quarantined bigint NOT NULL, wrong_state bigint NOT NULL, "
    "started bigint NOT NULL, updated bigint NOT NULL, finished bigint NOT NULL, "
    "saved timestamptz NOT NULL, PRIMARY KEY (tbl, col, params)); "
    "CREATE TABLE IF NOT EXISTS %s.keyshift_quarantine("
    "tbl text NOT NULL, col text NOT NULL, id text NOT NULL, error text NOT NULL, "
    "time bigint NOT NULL, params text, PRIMARY KEY (tbl, col, id))";

/* Whether keyshift_quarantine of the target's schema has its params
 * column (s->q_params). */
static ks_err quarantine_has_params(opener *o)
{
    PGresult *res;
    const char *ns = o->ns_oid;
    ks_err err = catalog_query(o,
                               "SELECT count(*) FROM pg_catalog.pg_attribute a "
                               "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
                               "WHERE c.relnamespace = $1::oid AND c.relname = "
                               "'keyshift_quarantine' AND a.attname = 'params' "
                               "AND NOT a.attisdropped",
                               &ns, 1, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    o->s->q_params = strcmp(PQgetvalue(res, 0, 0), "1") == 0;
    PQclear(res);
    return KS_OK;
}

/* Run ddl (malloc'd; freed here, NULL: out of memory) in one
 * transaction that first takes keyshift's advisory lock, so that several
 * workers opening at once do not race on it (0x6b657973 is "keys"); a
 * failure is rolled back and reported as `what` in the schema of the
 * target. */
static ks_err run_locked_ddl(opener *o, char *ddl, const char *what)
{
    if (ddl == NULL)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    ks_err err = ks_pgs_run_simple(o->s, "BEGIN", NULL, 0);
    PGresult *lock = NULL;
    if (err == KS_OK) {
        lock = PQexec(o->s->conn, "SELECT pg_catalog.pg_advisory_xact_lock(1801812339)");
        if (lock == NULL || PQresultStatus(lock) != PGRES_TUPLES_OK)
            err = ks_pgs_result_err(o->s, lock);
    }
    PQclear(lock);
    if (err == KS_OK)
        err = ks_pgs_run_simple(o->s, ddl, NULL, 0);
    if (err == KS_OK)
        err = ks_pgs_run_simple(o->s, "COMMIT", NULL, 0);
    free(ddl);
    if (err != KS_OK) {
        ks_pgs_rollback_now(o->s);
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, err, "cannot %s in the schema of \"%s\"", what,
                    o->tname);
    }
    return KS_OK;
}

/* Give an older keyshift_quarantine its params column (see the file
 * comment), unless read-only or already there. */
static ks_err upgrade_quarantine(opener *o)
{
    ks_err err = quarantine_has_params(o);
    if (err != KS_OK || o->s->q_params || o->s->read_only)
        return err;
    const char *parts[] = {"ALTER TABLE ", o->qschema,
                           ".keyshift_quarantine ADD COLUMN IF NOT EXISTS params text"};
    err = run_locked_ddl(o, ks_pgs_concat(parts, 3),
                         "add the params column to keyshift_quarantine (owner of the table?)");
    o->s->q_params = err == KS_OK;
    return err;
}

/* Whether keyshift's two tables exist in the target's schema; unless
 * read-only, create them when they do not (rowstore_pg.h). */
static ks_err ensure_own_tables(opener *o)
{
    PGresult *res;
    const char *ns = o->ns_oid;
    ks_err err = catalog_query(o,
                               "SELECT count(*) FROM pg_catalog.pg_class c "
                               "WHERE c.relnamespace = $1::oid AND c.relkind IN ('r', 'p') "
                               "AND c.relname IN ('keyshift_migration', 'keyshift_quarantine')",
                               &ns, 1, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    o->s->have_tables = strcmp(PQgetvalue(res, 0, 0), "2") == 0;
    PQclear(res);
    if (o->s->have_tables)
        return upgrade_quarantine(o);
    if (o->s->read_only)
        return KS_OK;
    size_t len = sizeof own_tables_ddl + 2 * strlen(o->qschema);
    char *ddl = malloc(len);
    if (ddl != NULL)
        snprintf(ddl, len, own_tables_ddl, o->qschema, o->qschema);
    err = run_locked_ddl(o, ddl,
                         "create keyshift_migration and keyshift_quarantine (CREATE privilege?)");
    if (err != KS_OK)
        return err;
    o->s->have_tables = 1;
    o->s->q_params = 1;
    return KS_OK;
}

/* The select-list expression of column c of t: integers as bigint,
 * bytea as it is, anything else as text (rowstore_pg.h). */
static const char *cast_of(const colinfo *c)
{
    if (integer_type(c->type))
        return "::int8";
    return c->type == KS_PG_OID_BYTEA ? "" : "::text";
}

/* Prepare sql as statement name with n parameters (typed by the casts
 * in sql); frees sql. */
static ks_err prepare(opener *o, const char *name, char *sql, int n)
{
    if (sql == NULL)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    PGresult *res = PQprepare(o->s->conn, name, sql, n, NULL);
    free(sql);
    ks_err err = KS_OK;
    if (res == NULL || PQresultStatus(res) != PGRES_COMMAND_OK)
        err = ks_errbuf_fail(o->errbuf, o->errbuf_len, ks_pgs_result_err(o->s, res),
                   "preparing %s failed (SQLSTATE %s)", name, sqlstate_of(res));
    PQclear(res);
    return err;
}

/* Build and prepare one of the three scans: after (1: WHERE id > $1),
 * a range (2: WHERE id >= $1 AND id <= $2) or from the start (0), with
 * the quarantine flag from keyshift_quarantine when it exists (its tbl
 * and col as the last two parameters). */
static ks_err prepare_scan(opener *o, int after)
{
    const char *qid = o->id.quoted;
    const char *parts[64];
    size_t n = 0;
    parts[n++] = "SELECT t.";
    parts[n++] = qid;
    parts[n++] = "::int8, t.";
    parts[n++] = o->column.quoted;
    parts[n++] = cast_of(&o->column); /* a base64 varchar column reads as text */
    if (o->tenant.quoted != NULL) {
        parts[n++] = ", t.";
        parts[n++] = o->tenant.quoted;
        parts[n++] = cast_of(&o->tenant);
    } else {
        parts[n++] = ", NULL::int8";
    }
    for (size_t i = 0; i < o->s->n_context; i++) {
        parts[n++] = ", t.";
        parts[n++] = o->context[i].quoted;
        parts[n++] = cast_of(&o->context[i]);
    }
    int has_q = o->s->have_tables;
    parts[n++] = has_q ? ", q.id IS NOT NULL FROM " : ", false FROM ";
    parts[n++] = o->qtable;
    parts[n++] = " AS t";
    if (has_q) {
        parts[n++] = " LEFT JOIN ";
        parts[n++] = o->qschema;
        parts[n++] = after == 2 ? ".keyshift_quarantine AS q ON q.tbl = $4::text AND q.col = $5::text"
                     : after    ? ".keyshift_quarantine AS q ON q.tbl = $3::text AND q.col = $4::text"
                                : ".keyshift_quarantine AS q ON q.tbl = $2::text AND q.col = $3::text";
        parts[n++] = " AND q.id = t.";
        parts[n++] = qid;
        parts[n++] = "::text";
        /* the bound migration (NULL: unbound, every entry counts); an
         * entry without params (an older table's) holds back every one */
        if (o->s->q_params)
            parts[n++] = after == 2 ? " AND (q.params IS NULL OR $6::text IS NULL OR q.params = $6::text)"
                         : after    ? " AND (q.params IS NULL OR $5::text IS NULL OR q.params = $5::text)"
                                    : " AND (q.params IS NULL OR $4::text IS NULL OR q.params = $4::text)";
    }
    if (after) {
        parts[n++] = " WHERE t.";
        parts[n++] = qid;
        parts[n++] = after == 2 ? " >= $1::int8 AND t." : " > $1::int8";
    }
    if (after == 2) {
        parts[n++] = qid;
        parts[n++] = " <= $2::int8";
    }
    parts[n++] = " ORDER BY t.";
    parts[n++] = qid;
    parts[n++] = after == 2 ? " LIMIT $3::int8" : after ? " LIMIT $2::int8" : " LIMIT $1::int8";
    return prepare(o, after == 2 ? ST_SCAN_RANGE : after ? ST_SCAN_AFTER : ST_SCAN_FIRST,
                   ks_pgs_concat(parts, n), 1 + after + (has_q ? 2 + o->s->q_params : 0));
}

/* The select list of a checkpoint read (pg_decode.h). */
#define CP_COLS "SELECT " KS_PG_CHECKPOINT_COLS " FROM "

/* Prepare every statement of the store (the writes unless read-only;
 * the checkpoint reads when the tables exist). */
static ks_err prepare_statements(opener *o)
{
    pg_store *s = o->s;
    const char *qs = o->qschema, *qid = o->id.quoted, *qcol = o->column.quoted;
    ks_err err = prepare_scan(o, 0);
    if (err == KS_OK)
        err = prepare_scan(o, 1);
    if (err == KS_OK)
        err = prepare_scan(o, 2);
    if (err == KS_OK) {
        const char *parts[] = {"SELECT pg_catalog.count(*) FROM ", o->qtable};
        err = prepare(o, ST_COUNT, ks_pgs_concat(parts, 2), 0);
    }
    if (err == KS_OK && s->have_tables) {
        const char *parts[] = {CP_COLS, qs,
                               ".keyshift_migration WHERE tbl = $1::text AND col = $2::text "
                               "AND params = $3::text"};
        err = prepare(o, ST_CP_LOAD, ks_pgs_concat(parts, 3), 3);
    }
    if (err == KS_OK && s->have_tables) {
        const char *parts[] = {CP_COLS, qs,
                               ".keyshift_migration WHERE tbl = $1::text AND col = $2::text "
                               "ORDER BY updated DESC, saved DESC LIMIT 1"};
        err = prepare(o, ST_CP_LATEST, ks_pgs_concat(parts, 3), 2);
    }
    if (err != KS_OK || s->read_only)
        return err;
    err = prepare(o, ST_TXN_CFG,
                  dup_str("SELECT pg_catalog.set_config('lock_timeout', $1::text, true), "
                          "pg_catalog.set_config('statement_timeout', $2::text, true)"),
                  2);
    if (err == KS_OK) {
        /* unnest of several arrays is FROM-clause syntax (ROWS FROM), not
         * a function that could be schema-qualified or shadowed */
        const char *arrays =
            s->as_text ? "$2::text[], $3::text[]) " : "$2::bytea[], $3::bytea[]) ";
        const char *parts[] = {"UPDATE ", o->qtable, " AS t SET ", qcol,
                               " = u.new FROM unnest($1::int8[], ", arrays,
                               "AS u(id, old, new) WHERE t.", qid, " = u.id AND t.", qcol,
                               " IS NOT DISTINCT FROM u.old RETURNING t.", qid, "::int8"};
        err = prepare(o, ST_CAS, ks_pgs_concat(parts, sizeof parts / sizeof parts[0]), 3);
    }
    if (err == KS_OK) {
        const char *parts[] = {"INSERT INTO ", qs,
                               ".keyshift_quarantine AS q(tbl, col, id, error, time, params) "
                               "VALUES ($1::text, $2::text, $3::text, $4::text, $5::int8, "
                               "$6::text) ON CONFLICT (tbl, col, id) DO UPDATE SET "
                               "error = EXCLUDED.error, time = EXCLUDED.time, "
                               "params = EXCLUDED.params "
                               "WHERE q.params IS DISTINCT FROM EXCLUDED.params"};
        err = prepare(o, ST_QUARANTINE, ks_pgs_concat(parts, 3), 6);
    }
    if (err == KS_OK) {
        const char *parts[] = {
            "INSERT INTO ", qs,
            ".keyshift_migration AS m(tbl, col, params, state, cursor, pass, done, skipped, "
            "raced, quarantined, wrong_state, started, updated, finished, saved) VALUES "
            "($1::text, $2::text, $3::text, $4::text, $5::int8, $6::int8, $7::int8, $8::int8, "
            "$9::int8, $10::int8, $11::int8, $12::int8, $13::int8, $14::int8, "
            "pg_catalog.clock_timestamp()) ON CONFLICT (tbl, col, params) DO UPDATE SET "
            "state = EXCLUDED.state, cursor = EXCLUDED.cursor, pass = EXCLUDED.pass, "
            "done = EXCLUDED.done, skipped = EXCLUDED.skipped, raced = EXCLUDED.raced, "
            "quarantined = EXCLUDED.quarantined, wrong_state = EXCLUDED.wrong_state, "
            "started = EXCLUDED.started, updated = EXCLUDED.updated, "
            "finished = EXCLUDED.finished, saved = EXCLUDED.saved"};
        err = prepare(o, ST_CP_SAVE, ks_pgs_concat(parts, 3), 14);
    }
    return err;
}

/* Free the strings of c. */
static void colinfo_free(colinfo *c)
{
    free(c->name);
    free(c->quoted);
    memset(c, 0, sizeof *c);
}

/* Free what the opener holds (not the store). */
static void opener_free(opener *o)
{
    free(o->table_oid);
    free(o->ns_oid);
    free(o->qtable);
    free(o->qschema);
    colinfo_free(&o->column);
    colinfo_free(&o->id);
    colinfo_free(&o->tenant);
    for (size_t i = 0; i < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; i++)
        colinfo_free(&o->context[i]);
}

/* See rowstore_pg.h. */
ks_err ks_rowstore_pg_open(const char *conninfo, const ks_rowstore_target *target,
                           const ks_pg_options *opts, ks_rowstore *out, char *errbuf,
                           size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    ks_err err = check_args(conninfo, target, out, errbuf, errbuf_len);
    if (err != KS_OK)
        return err;
    if (ks_value_encoding_name((int)target->encoding) == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "the column's encoding is neither binary nor base64");
    memset(out, 0, sizeof *out);
    pg_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = opts != NULL && opts->read_only;
    s->n_context = target->n_context_columns;
    s->as_text = target->encoding == KS_ENCODING_BASE64;
    uint32_t lock = opts != NULL && opts->lock_timeout_ms ? opts->lock_timeout_ms
                                                          : KS_PG_LOCK_TIMEOUT_DEFAULT_MS;
    uint32_t stmt = opts != NULL && opts->statement_timeout_ms
                        ? opts->statement_timeout_ms
                        : KS_PG_STATEMENT_TIMEOUT_DEFAULT_MS;
    snprintf(s->lock_ms, sizeof s->lock_ms, "%lums", (unsigned long)lock);
    snprintf(s->stmt_ms, sizeof s->stmt_ms, "%lums", (unsigned long)stmt);
    opener o;
    memset(&o, 0, sizeof o);
    o.s = s;
    o.errbuf = errbuf;
    o.errbuf_len = errbuf_len;
    ks_pg_printable(target->table, o.tname, sizeof o.tname);
    err = connect_db(&o, conninfo);
    if (err == KS_OK)
        err = resolve_target(&o, target);
    if (err == KS_OK)
        err = ensure_own_tables(&o);
    if (err == KS_OK)
        err = prepare_statements(&o);
    if (err == KS_OK) {
        /* kept for pg_chunks.c (ks_pg_store_parts_of) */
        s->qschema = o.qschema;
        s->qtable = o.qtable;
        s->qid = o.id.quoted;
        o.qschema = o.qtable = o.id.quoted = NULL;
    }
    opener_free(&o);
    if (err != KS_OK) {
        ks_pgs_store_free(s);
        return err;
    }
    out->ops = &ks_pgs_ops;
    out->self = s;
    out->name = "pg";
    out->id_stable = 1; /* check_id: the primary key, or NOT NULL with a unique index */
    out->encoding = target->encoding;
    return KS_OK;
}

/* ---- listings ------------------------------------------------------------------------ */

/* The schema (quoted, malloc'd in *qschema; NULL when there is none) of
 * the keyshift_migration that ks_rowstore_pg_checkpoints lists: the one
 * next to the visible table `table`, or with table NULL the one the
 * search_path makes visible. */
static ks_err checkpoints_schema(opener *o, const char *table, char **qschema)
{
    PGresult *res;
    *qschema = NULL;
    ks_err err = catalog_query(
        o,
        "SELECT n.nspname FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'keyshift_migration' AND c.relkind IN ('r', 'p') AND "
        "CASE WHEN $1::text IS NULL THEN pg_catalog.pg_table_is_visible(c.oid) "
        "ELSE c.relnamespace = (SELECT t.relnamespace FROM pg_catalog.pg_class t "
        "WHERE t.relname = $1::text AND pg_catalog.pg_table_is_visible(t.oid) "
        "AND t.relkind IN ('r', 'p')) END",
        &table, 1, &res, "reading the catalog");
    if (err != KS_OK)
        return err;
    if (PQntuples(res) == 1) {
        *qschema = quote_ident(o->s->conn, PQgetvalue(res, 0, 0));
        if (*qschema == NULL)
            err = ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    PQclear(res);
    return err;
}

/* A name read back from keyshift_migration (cell col of row): text of
 * 1..IDENT_MAX bytes, as check_args admits; else KS_ERR_STORE. */
static ks_err read_name(const PGresult *res, int row, int col, ks_bytes *out)
{
    ks_value v;
    ks_err err = ks_pg_cell(res, row, col, &v);
    if (err != KS_OK || v.type != KS_VALUE_TEXT || v.bytes.len == 0 || v.bytes.len > IDENT_MAX ||
        memchr(v.bytes.ptr, 0, v.bytes.len) != NULL)
        return KS_ERR_STORE;
    *out = v.bytes;
    return KS_OK;
}

/* See pg_decode.h (ks_pg_read_listed). */
ks_err ks_pg_read_listed(const PGresult *res, int row, ks_checkpoint *cp, ks_bytes *tbl,
                         ks_bytes *col)
{
    ks_err err = ks_pg_read_checkpoint(res, row, cp);
    if (err == KS_OK)
        err = read_name(res, row, 12, tbl);
    if (err == KS_OK)
        err = read_name(res, row, 13, col);
    return err;
}

/* Hand each row of the checkpoint listing res to fn, checking every row
 * as checkpoint_load checks it (ks_rowstore_pg_checkpoints). */
static ks_err list_rows(const PGresult *res, ks_checkpoint_list_fn fn, void *arg)
{
    for (int i = 0; i < PQntuples(res); i++) {
        ks_checkpoint cp;
        ks_bytes tbl, col;
        ks_err err = ks_pg_read_listed(res, i, &cp, &tbl, &col);
        if (err != KS_OK)
            return err;
        if (fn(arg, tbl, col, &cp) != 0)
            break;
    }
    return KS_OK;
}

/* The session of a listing (ks_rowstore_pg_checkpoints,
 * ks_rowstore_pg_migrated_columns): a read-only store with the default
 * timeouts, connected, in o->s (NULL when out of memory), and the opener
 * o reporting into errbuf.  The caller frees o and o->s, even on failure. */
static ks_err listing_connect(opener *o, const char *conninfo, char *errbuf, size_t errbuf_len)
{
    memset(o, 0, sizeof *o);
    o->errbuf = errbuf;
    o->errbuf_len = errbuf_len;
    pg_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = 1;
    snprintf(s->lock_ms, sizeof s->lock_ms, "%lums", (unsigned long)KS_PG_LOCK_TIMEOUT_DEFAULT_MS);
    snprintf(s->stmt_ms, sizeof s->stmt_ms, "%lums",
             (unsigned long)KS_PG_STATEMENT_TIMEOUT_DEFAULT_MS);
    o->s = s;
    return connect_db(o, conninfo);
}

/* See rowstore_pg.h.  A read-only session, like a census's: the listing
 * is one statement, its values (table, column) bound. */
ks_err ks_rowstore_pg_checkpoints(const char *conninfo, const char *table, const char *column,
                                  ks_checkpoint_list_fn fn, void *arg, char *errbuf,
                                  size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (conninfo == NULL || fn == NULL || (table == NULL) != (column == NULL) ||
        (table != NULL && (table[0] == '\0' || column[0] == '\0' || strlen(table) > IDENT_MAX ||
                           strlen(column) > IDENT_MAX)))
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "missing connection string or callback, a table without a column, or an "
                    "empty or too long name");
    opener o;
    char *qs = NULL, *sql = NULL;
    ks_err err = listing_connect(&o, conninfo, errbuf, errbuf_len);
    pg_store *s = o.s;
    if (err == KS_OK)
        err = checkpoints_schema(&o, table, &qs);
    if (err == KS_OK && qs != NULL) {
        const char *parts[] = {"SELECT " KS_PG_CHECKPOINT_COLS ", tbl, col FROM ", qs,
                               ".keyshift_migration WHERE $1::text IS NULL OR "
                               "(tbl = $1::text AND col = $2::text) "
                               "ORDER BY updated DESC, saved DESC"};
        sql = ks_pgs_concat(parts, 3);
        const char *vals[] = {table, column};
        PGresult *res = sql != NULL ? PQexecParams(s->conn, sql, 2, NULL, vals, NULL, NULL, 1) : NULL;
        if (sql == NULL)
            err = ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
        else if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
            err = ks_errbuf_fail(errbuf, errbuf_len, ks_pgs_result_err(s, res),
                       "listing the checkpoints failed (SQLSTATE %s)", sqlstate_of(res));
        else if ((err = list_rows(res, fn, arg)) == KS_ERR_STORE)
            (void)ks_errbuf_fail(errbuf, errbuf_len, err, "a malformed row in keyshift_migration");
        PQclear(res);
    }
    free(sql);
    free(qs);
    opener_free(&o);
    ks_pgs_store_free(s);
    return err;
}

/* A name of a migrated-column listing (text cell col of row): 1..IDENT_MAX
 * bytes, as check_args admits; else KS_ERR_STORE. */
static ks_err listed_name(const PGresult *res, int row, int col, ks_bytes *out)
{
    if (PQgetisnull(res, row, col))
        return KS_ERR_STORE;
    size_t n = (size_t)PQgetlength(res, row, col);
    if (n == 0 || n > IDENT_MAX)
        return KS_ERR_STORE;
    *out = (ks_bytes){(const uint8_t *)PQgetvalue(res, row, col), n};
    return KS_OK;
}

/* Hand fn the distinct columns of the keyshift_migration of schema
 * nspname (oid ns_oid), each with whether the search_path shows that
 * schema's table under its name; *stop when fn asked to.  A table gone
 * since the catalog was read (42P01) holds no migration. */
static ks_err schema_columns(opener *o, const char *ns_oid, const char *nspname,
                             ks_migrated_column_fn fn, void *arg, int *stop)
{
    char *qs = quote_ident(o->s->conn, nspname);
    const char *parts[] = {"SELECT DISTINCT m.tbl, m.col, EXISTS (SELECT 1 FROM "
                           "pg_catalog.pg_class t WHERE t.relname = m.tbl "
                           "AND t.relnamespace = $1::oid AND t.relkind IN ('r', 'p') "
                           "AND pg_catalog.pg_table_is_visible(t.oid)) FROM ",
                           qs, ".keyshift_migration m ORDER BY 1, 2"};
    char *sql = qs != NULL ? ks_pgs_concat(parts, 3) : NULL;
    free(qs);
    if (sql == NULL)
        return ks_errbuf_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    PGresult *res = PQexecParams(o->s->conn, sql, 1, NULL, &ns_oid, NULL, NULL, 0);
    free(sql);
    ks_err err = KS_OK;
    char pschema[96];
    ks_pg_printable(nspname, pschema, sizeof pschema);
    if (res != NULL && PQresultStatus(res) != PGRES_TUPLES_OK &&
        strcmp(sqlstate_of(res), "42P01") == 0) {
        PQclear(res);
        return KS_OK;
    }
    if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
        err = ks_errbuf_fail(o->errbuf, o->errbuf_len, ks_pgs_result_err(o->s, res),
                   "reading keyshift_migration of schema \"%s\" failed (SQLSTATE %s)", pschema,
                   sqlstate_of(res));
        PQclear(res);
        return err;
    }
    ks_bytes schema = {(const uint8_t *)nspname, strlen(nspname)};
    for (int i = 0; err == KS_OK && !*stop && i < PQntuples(res); i++) {
        ks_bytes tbl, col;
        err = listed_name(res, i, 0, &tbl);
        if (err == KS_OK)
            err = listed_name(res, i, 1, &col);
        if (err != KS_OK)
            err = ks_errbuf_fail(o->errbuf, o->errbuf_len, err,
                       "a malformed row in keyshift_migration of schema \"%s\"", pschema);
        else
            *stop = fn(arg, schema, tbl, col, strcmp(PQgetvalue(res, i, 2), "t") == 0) != 0;
    }
    PQclear(res);
    return err;
}

/* See rowstore_pg.h.  The catalog names every keyshift_migration; each
 * is read with its schema quoted by PQescapeIdentifier, and the schema's
 * oid bound. */
ks_err ks_rowstore_pg_migrated_columns(const char *conninfo, ks_migrated_column_fn fn, void *arg,
                                       char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (conninfo == NULL || fn == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "missing connection string or callback");
    opener o;
    PGresult *res = NULL;
    ks_err err = listing_connect(&o, conninfo, errbuf, errbuf_len);
    if (err == KS_OK)
        err = catalog_query(&o,
                            "SELECT n.oid, n.nspname FROM pg_catalog.pg_class c "
                            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE c.relname = 'keyshift_migration' AND c.relkind IN ('r', 'p') "
                            "ORDER BY n.nspname",
                            NULL, 0, &res, "reading the catalog");
    int stop = 0;
    for (int i = 0; err == KS_OK && !stop && i < PQntuples(res); i++)
        err = schema_columns(&o, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), fn, arg, &stop);
    PQclear(res);
    opener_free(&o);
    ks_pgs_store_free(o.s);
    return err;
}
