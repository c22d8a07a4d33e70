/*
 * migrate/store/sqlite/sqlite_store_open.c -- opening the SQLite row store
 * (ks_rowstore_sqlite_open, keyshift/rowstore.h): the target table and
 * columns looked up in the schema, keyshift's own tables created or
 * upgraded, the statements built from the schema's spellings and kept for
 * the store's life; and ks_rowstore_sqlite_checkpoints, which opens the
 * database only to list them.  The tables and the rules for names, ids
 * and transactions are documented at the top of sqlite_store.c, whose
 * operations the opened store runs (sqlite_store_internal.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include <keyshift/rowstore.h>

#include "sqlite_store.h"
#include "sqlite_store_internal.h"
#include "sqlite_util.h"
#include "../../alloc_hook.h"

/* The longest identifier accepted. */
#define IDENT_MAX 1024u

/* A growing string for building SQL. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;               /* an allocation failed: p is unusable */
} sbuf;

/* What the schema says about one column. */
typedef struct colinfo {
    int found;
    int cid;
    char *name;               /* schema spelling (malloc'd) */
    char *type;               /* declared type (malloc'd) */
    int notnull, pk, hidden;
} colinfo;

/* ---- SQL text ----------------------------------------------------------------- */

/* Append n bytes to b (keeping a NUL after them). */
static void sb_putn(sbuf *b, const char *p, size_t n)
{
    if (b->failed)
        return;
    if (n > SIZE_MAX / 2 - b->len - 1) {
        b->failed = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Append a C string to b. */
static void sb_put(sbuf *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

/* Append name as a quoted SQL identifier: "..." with every '"' doubled.
 * Only names taken from the schema are ever given here. */
static void sb_ident(sbuf *b, const char *name)
{
    sb_putn(b, "\"", 1);
    for (const char *p = name; *p != '\0'; p++) {
        sb_putn(b, p, 1);
        if (*p == '"')
            sb_putn(b, "\"", 1);
    }
    sb_putn(b, "\"", 1);
}

/* ---- opening: the schema ------------------------------------------------------------ */

/* The context of an open: the store being built and where messages go. */
typedef struct opener {
    sqlite_store *s;
    char *errbuf;
    size_t errbuf_len;
    char tname[96];           /* the table name, printable, for messages */
} opener;

/* Report an SQLite failure during open (sqlite_util.h). */
static ks_err open_fail_rc(opener *o, int rc, const char *what)
{
    return ks_sqlite_fail_rc(o->errbuf, o->errbuf_len, rc, what);
}

/* strdup that reports allocation failure as NULL for a NULL input too. */
static char *dup_str(const char *p)
{
    if (p == NULL)
        p = "";
    size_t n = strlen(p) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, p, n);
    return d;
}

/* Free the strings of c and clear it. */
static void colinfo_free(colinfo *c)
{
    free(c->name);
    free(c->type);
    memset(c, 0, sizeof *c);
}

/* Look up table in sqlite_master (name bound, compared as SQLite compares
 * identifiers); on success *schema_name is its spelling (malloc'd) and
 * *is_view tells a view. */
static ks_err find_table(opener *o, const char *table, char **schema_name, int *is_view)
{
    static const char sql[] = "SELECT name, type FROM main.sqlite_master "
                              "WHERE type IN ('table', 'view') AND name = ?1 COLLATE NOCASE";
    sqlite3_stmt *st;
    int rc = ks_sqls_prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    *schema_name = NULL;
    if (rc == SQLITE_ROW) {
        *schema_name = dup_str((const char *)sqlite3_column_text(st, 0));
        const char *type = (const char *)sqlite3_column_text(st, 1);
        *is_view = type != NULL && strcmp(type, "view") == 0;
        if (*schema_name == NULL)
            err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    } else if (rc == SQLITE_DONE) {
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET, "no table \"%s\" in the database",
                   o->tname);
    } else {
        err = open_fail_rc(o, rc, "reading the schema");
    }
    sqlite3_finalize(st);
    return err;
}

/* Look up column name of the target table (pragma_table_xinfo, both names
 * bound) into *c; c->found is 0 when there is none. */
static ks_err find_column(opener *o, const char *name, colinfo *c)
{
    static const char sql[] = "SELECT cid, name, type, \"notnull\", pk, hidden "
                              "FROM pragma_table_xinfo(?1, 'main') WHERE name = ?2 COLLATE NOCASE";
    memset(c, 0, sizeof *c);
    sqlite3_stmt *st;
    int rc = ks_sqls_prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 1, o->s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_ROW) {
        c->found = 1;
        c->cid = sqlite3_column_int(st, 0);
        c->name = dup_str((const char *)sqlite3_column_text(st, 1));
        c->type = dup_str((const char *)sqlite3_column_text(st, 2));
        c->notnull = sqlite3_column_int(st, 3);
        c->pk = sqlite3_column_int(st, 4);
        c->hidden = sqlite3_column_int(st, 5);
        if (c->name == NULL || c->type == NULL)
            err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    } else if (rc != SQLITE_DONE) {
        err = open_fail_rc(o, rc, "reading the table's columns");
    }
    sqlite3_finalize(st);
    return err;
}

/* Look up a column that must exist: KS_ERR_NO_TARGET naming it (and its
 * role) otherwise. */
static ks_err need_column(opener *o, const char *name, const char *role, colinfo *c)
{
    ks_err err = find_column(o, name, c);
    if (err == KS_OK && !c->found) {
        char pname[96];
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET, "no %s column \"%s\" in table \"%s\"",
                   role, ks_sqlite_printable(name, pname, sizeof pname), o->tname);
    }
    return err;
}

/* Run a query on the target table (bound as ?1, the integer arg as ?2)
 * that returns one integer into *out. */
static ks_err query_int(opener *o, const char *sql, int64_t arg, int64_t *out)
{
    sqlite3_stmt *st;
    int rc = ks_sqls_prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) >= 1)
        rc = sqlite3_bind_text(st, 1, o->s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) >= 2)
        rc = sqlite3_bind_int64(st, 2, arg);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else
        err = open_fail_rc(o, rc == SQLITE_DONE ? SQLITE_ERROR : rc, "reading the schema");
    sqlite3_finalize(st);
    return err;
}

/* The column id (cid) of the target's INTEGER PRIMARY KEY, the alias of
 * its rowid, into *cid; -1 when it has none.  The alias is the table's
 * only primary-key column, declared INTEGER, with no separate
 * primary-key index (which "INTEGER PRIMARY KEY DESC" and WITHOUT ROWID
 * tables have).  Unlike the bare rowid, VACUUM and a dump/restore keep
 * its values. */
static ks_err rowid_alias_cid(opener *o, int64_t *cid)
{
    static const char q[] =
        "SELECT coalesce((SELECT cid FROM pragma_table_xinfo(?1, 'main') "
        "WHERE pk > 0 AND upper(type) = 'INTEGER' "
        "AND (SELECT count(*) FROM pragma_table_xinfo(?1, 'main') WHERE pk > 0) = 1 "
        "AND NOT EXISTS (SELECT 1 FROM pragma_index_list(?1, 'main') WHERE origin = 'pk')), -1)";
    return query_int(o, q, 0, cid);
}

/* Set *ok when id (a column of the target) is a valid id: the rowid
 * alias (rowid_alias_cid), or NOT NULL with a full unique index on
 * exactly that column (a WITHOUT ROWID table's one-column primary key
 * is one: SQLite makes it NOT NULL). */
static ks_err check_id_column(opener *o, const colinfo *id, int *ok)
{
    static const char unique_index[] =
        "SELECT count(*) FROM pragma_index_list(?1, 'main') AS il "
        "WHERE il.\"unique\" = 1 AND il.partial = 0 "
        "AND (SELECT count(*) FROM pragma_index_info(il.name, 'main')) = 1 "
        "AND (SELECT cid FROM pragma_index_info(il.name, 'main')) = ?2";
    int64_t alias = -1, n_unique = 0;
    *ok = 0;
    ks_err err = rowid_alias_cid(o, &alias);
    if (err == KS_OK)
        err = query_int(o, unique_index, id->cid, &n_unique);
    if (err != KS_OK)
        return err;
    *ok = id->cid == alias || (id->notnull && n_unique > 0);
    return KS_OK;
}

/* Without an id column: pick a rowid alias no column shadows (rowid,
 * _rowid_, oid) and check the table has a rowid (not WITHOUT ROWID). */
static ks_err pick_rowid(opener *o, const char **alias)
{
    static const char *const names[] = {"rowid", "_rowid_", "oid"};
    *alias = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && *alias == NULL; i++) {
        colinfo c;
        ks_err err = find_column(o, names[i], &c);
        int found = c.found;
        colinfo_free(&c);
        if (err != KS_OK)
            return err;
        if (!found)
            *alias = names[i];
    }
    if (*alias == NULL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "columns of table \"%s\" hide its rowid: give an id column", o->tname);
    sbuf b = {0};
    sb_put(&b, "SELECT ");
    sb_put(&b, *alias);
    sb_put(&b, " FROM main.");
    sb_ident(&b, o->s->table);
    if (b.failed) {
        free(b.p);
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    sqlite3_stmt *st;
    int rc = ks_sqls_prepare(o->s->db, b.p, 0, &st);
    sqlite3_finalize(st);
    free(b.p);
    if (rc != SQLITE_OK && (rc & 0xff) == SQLITE_ERROR)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" has no rowid (WITHOUT ROWID): name its primary key as the "
                    "id column", o->tname);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "reading the schema");
}

/* Nonzero when name is a table keyshift or SQLite reserves (the target
 * must be an application table). */
static int reserved_table(const char *name)
{
    return sqlite3_strnicmp(name, "sqlite_", 7) == 0 || sqlite3_strnicmp(name, "keyshift_", 9) == 0;
}

/* ---- opening: keyshift's own tables ------------------------------------------------- */

const char ks_sqlite_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS main.keyshift_meta(key TEXT PRIMARY KEY, value);"
    "INSERT OR IGNORE INTO main.keyshift_meta(key, value) VALUES('schema_version', 1);"
    "CREATE TABLE IF NOT EXISTS main.keyshift_migration("
    " tbl TEXT NOT NULL, col TEXT NOT NULL,"
    " params TEXT NOT NULL, state TEXT NOT NULL, cursor, pass INTEGER NOT NULL,"
    " done INTEGER NOT NULL, skipped INTEGER NOT NULL, raced INTEGER NOT NULL,"
    " quarantined INTEGER NOT NULL, wrong_state INTEGER NOT NULL,"
    " started INTEGER NOT NULL, updated INTEGER NOT NULL, finished INTEGER NOT NULL,"
    " PRIMARY KEY (tbl, col, params));"
    "CREATE TABLE IF NOT EXISTS main.keyshift_quarantine("
    " tbl TEXT NOT NULL, col TEXT NOT NULL, id NOT NULL, error TEXT NOT NULL,"
    " time INTEGER NOT NULL, params TEXT, PRIMARY KEY (tbl, col, id));";

/* The index through which a run finds whether its migration has any
 * quarantined row (ST_QCHECK_MIG), created by every writable open. */
static const char quarantine_index_sql[] =
    "CREATE INDEX IF NOT EXISTS main.keyshift_quarantine_params "
    "ON keyshift_quarantine(tbl, col, params)";

/* How many of keyshift's three tables exist. */
static ks_err count_own_tables(opener *o, int64_t *n)
{
    return query_int(o,
                     "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN "
                     "('keyshift_meta', 'keyshift_migration', 'keyshift_quarantine')",
                     0, n);
}

/* Refuse a database whose keyshift tables are of a newer schema version
 * (when keyshift_meta exists). */
static ks_err check_schema_version(opener *o)
{
    int64_t has_meta = 0, version = 0;
    ks_err err = query_int(o,
                           "SELECT count(*) FROM main.sqlite_master "
                           "WHERE type = 'table' AND name = 'keyshift_meta'",
                           0, &has_meta);
    if (err != KS_OK || has_meta == 0)
        return err;
    err = query_int(o,
                    "SELECT coalesce(max(value), 0) FROM main.keyshift_meta "
                    "WHERE key = 'schema_version'",
                    0, &version);
    if (err == KS_OK && version > KS_SQLITE_SCHEMA_LATEST)
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_STORE,
                   "keyshift tables are of schema version %lld, newer than this keyshift (%d)",
                   (long long)version, KS_SQLITE_SCHEMA_LATEST);
    return err;
}

/* Create the keyshift tables in one BEGIN IMMEDIATE transaction (the busy
 * handler applies), rolling back on any failure. */
static ks_err create_own_tables(opener *o)
{
    sqlite3 *db = o->s->db;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, ks_sqlite_schema_sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        if (!sqlite3_get_autocommit(db))
            (void)sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return open_fail_rc(o, rc, "creating the keyshift tables");
    }
    return KS_OK;
}

/* Whether keyshift_quarantine has its params column (*has). */
static ks_err quarantine_has_params(opener *o, int64_t *has)
{
    return query_int(o,
                     "SELECT count(*) FROM pragma_table_info('keyshift_quarantine', 'main') "
                     "WHERE name = 'params'",
                     0, has);
}

/*
 * Bring keyshift_quarantine up to date: a table created before quarantine
 * kept its migration's parameters gets the params column (its entries
 * NULL: they keep holding their rows back from every migration, until
 * released), and every table its index.  Unless read-only, in one BEGIN
 * IMMEDIATE transaction, the column checked again inside it (another
 * process may have added it meanwhile).  Read-only: only whether the
 * column is there (s->q_params).
 */
static ks_err upgrade_quarantine(opener *o)
{
    sqlite_store *s = o->s;
    int64_t has = 0, indexed = 0;
    ks_err err = quarantine_has_params(o, &has);
    if (err == KS_OK)
        err = query_int(o,
                        "SELECT count(*) FROM main.sqlite_master WHERE type = 'index' "
                        "AND name = 'keyshift_quarantine_params'",
                        0, &indexed);
    if (err != KS_OK || s->read_only || (has != 0 && indexed != 0)) {
        s->q_params = has != 0;
        return err;
    }
    int rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "upgrading keyshift_quarantine");
    err = quarantine_has_params(o, &has);
    if (err == KS_OK && has == 0)
        rc = sqlite3_exec(s->db, "ALTER TABLE main.keyshift_quarantine ADD COLUMN params TEXT",
                          NULL, NULL, NULL);
    if (err == KS_OK && rc == SQLITE_OK)
        rc = sqlite3_exec(s->db, quarantine_index_sql, NULL, NULL, NULL);
    if (err == KS_OK && rc == SQLITE_OK)
        rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    if (err == KS_OK && rc != SQLITE_OK)
        err = open_fail_rc(o, rc, "upgrading keyshift_quarantine");
    if (err != KS_OK && !sqlite3_get_autocommit(s->db))
        (void)sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    s->q_params = err == KS_OK;
    return err;
}

/* Check the schema version and, unless read-only, create missing tables;
 * *have is nonzero when all three tables exist afterwards. */
static ks_err ensure_own_tables(opener *o, int *have)
{
    int64_t n = 0;
    ks_err err = check_schema_version(o);
    if (err == KS_OK)
        err = count_own_tables(o, &n);
    if (err == KS_OK && n < 3 && !o->s->read_only) {
        err = create_own_tables(o);
        if (err == KS_OK)
            err = check_schema_version(o); /* another process may have won */
        n = 3;
    }
    *have = n == 3;
    if (err == KS_OK && *have)
        err = upgrade_quarantine(o);
    return err;
}

/* ---- opening: statements ------------------------------------------------------------- */

/* The resolved target: schema spellings of every column used. */
typedef struct resolved {
    const char *id;           /* a column name or a rowid alias */
    int id_stable;            /* see ks_rowstore.id_stable */
    colinfo column, id_col, tenant;
    colinfo context[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
    size_t n_context;
} resolved;

/* Append " FROM main.<table> AS t" (the schema's spelling). */
static void sb_from(sbuf *b, const sqlite_store *s)
{
    sb_put(b, " FROM main.");
    sb_ident(b, s->table);
    sb_put(b, " AS t");
}

/* Append " ORDER BY t.<id>" (a schema spelling or a rowid alias). */
static void sb_order(sbuf *b, const resolved *r)
{
    sb_put(b, " ORDER BY t.");
    sb_ident(b, r->id);
}

/* The scans build_scan writes: from the start, after ?2, or the range
 * [?2, ?6] of integer ids. */
enum { SCAN_FIRST, SCAN_AFTER, SCAN_RANGE };

/* Append the scan statement: id, value, tenant (or NULL), context columns,
 * quarantine flag; after ?2 (SCAN_AFTER) or within [?2, ?6] (SCAN_RANGE),
 * limit ?1. */
static void build_scan(sbuf *b, const sqlite_store *s, const resolved *r, int have_tables,
                       int kind)
{
    sb_put(b, "SELECT t.");
    sb_ident(b, r->id);
    sb_put(b, ", t.");
    sb_ident(b, r->column.name);
    sb_put(b, ", ");
    if (r->tenant.found) {
        sb_put(b, "t.");
        sb_ident(b, r->tenant.name);
    } else {
        sb_put(b, "NULL");
    }
    for (size_t i = 0; i < r->n_context; i++) {
        sb_put(b, ", t.");
        sb_ident(b, r->context[i].name);
    }
    if (have_tables) {
        /* +t.id: no affinity, so q.id (stored with the id's own type) is
         * compared as is and the (tbl, col, id) index is used in full */
        /* ?5 says whether the target has any quarantined row at all (one
         * lookup per scan, scan_has_quarantine): when it has none, the
         * CASE skips the per-row probe, which is most of a census. */
        sb_put(b, ", CASE WHEN ?5 THEN EXISTS (SELECT 1 FROM main.keyshift_quarantine AS q "
                  "WHERE q.tbl = ?3 AND q.col = ?4 AND q.id = +t.");
        sb_ident(b, r->id);
        /* ?7: the bound migration (NULL: unbound, every entry counts); an
         * entry without params (an older table's) holds back every one */
        sb_put(b, s->q_params ? " AND (?7 IS NULL OR q.params IS NULL OR q.params = ?7)"
                                ") ELSE 0 END"
                              : ") ELSE 0 END");
    } else {
        sb_put(b, ", 0");
    }
    sb_from(b, s);
    if (kind != SCAN_FIRST) {
        sb_put(b, " WHERE t.");
        sb_ident(b, r->id);
        sb_put(b, kind == SCAN_AFTER ? " > ?2" : " >= ?2 AND t.");
    }
    if (kind == SCAN_RANGE) {
        /* typeof: in a TEXT-affinity id column the bounds compare as text,
         * and every id there is TEXT: no row of such a column is in a range */
        sb_ident(b, r->id);
        sb_put(b, " <= ?6 AND typeof(t.");
        sb_ident(b, r->id);
        sb_put(b, ") IN ('integer', 'real')");
    }
    sb_order(b, r);
    sb_put(b, " LIMIT ?1");
}

/* Append the values statement of visit_values: the target column alone,
 * every row in id order, in one statement. */
static void build_values(sbuf *b, const sqlite_store *s, const resolved *r)
{
    sb_put(b, "SELECT t.");
    sb_ident(b, r->column.name);
    sb_from(b, s);
    sb_order(b, r);
}

/* Prepare (persistently) the statement built in b into s->st[which]. */
static ks_err prepare_kept(opener *o, sbuf *b, int which)
{
    if (b->failed)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    int rc = ks_sqls_prepare(o->s->db, b->p, 1, &o->s->st[which]);
    b->len = 0;
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "preparing the store's statements");
    return KS_OK;
}

/* Prepare a constant statement into s->st[which]. */
static ks_err prepare_const(opener *o, const char *sql, int which)
{
    sbuf b = {0};
    sb_put(&b, sql);
    ks_err err = prepare_kept(o, &b, which);
    free(b.p);
    return err;
}

/* Prepare every statement kept for the store's life: scans, values, count, and
 * (unless read-only) cas, quarantine, checkpoint save, transactions;
 * checkpoint loads when keyshift's tables exist. */
static ks_err prepare_statements(opener *o, const resolved *r, int have_tables)
{
    sqlite_store *s = o->s;
    sbuf b = {0};
    ks_err err;
    build_scan(&b, s, r, have_tables, SCAN_FIRST);
    err = prepare_kept(o, &b, ST_SCAN_FIRST);
    if (err == KS_OK) {
        build_scan(&b, s, r, have_tables, SCAN_AFTER);
        err = prepare_kept(o, &b, ST_SCAN_AFTER);
    }
    if (err == KS_OK) {
        build_scan(&b, s, r, have_tables, SCAN_RANGE);
        err = prepare_kept(o, &b, ST_SCAN_RANGE);
    }
    if (err == KS_OK) {
        build_values(&b, s, r);
        err = prepare_kept(o, &b, ST_VALUES);
    }
    if (err == KS_OK && have_tables)
        err = prepare_const(o,
                            "SELECT EXISTS (SELECT 1 FROM main.keyshift_quarantine WHERE tbl = ?1 "
                            "AND col = ?2)",
                            ST_QCHECK);
    if (err == KS_OK && have_tables && s->q_params)
        err = prepare_const(o,
                            "SELECT EXISTS (SELECT 1 FROM main.keyshift_quarantine WHERE tbl = ?1 "
                            "AND col = ?2 AND params = ?3) OR EXISTS (SELECT 1 FROM "
                            "main.keyshift_quarantine WHERE tbl = ?1 AND col = ?2 AND params IS "
                            "NULL)",
                            ST_QCHECK_MIG);
    if (err == KS_OK) {
        sb_put(&b, "SELECT count(*) FROM main.");
        sb_ident(&b, s->table);
        err = prepare_kept(o, &b, ST_COUNT);
    }
    if (err == KS_OK && !s->read_only) {
        sb_put(&b, "UPDATE main.");
        sb_ident(&b, s->table);
        sb_put(&b, " SET ");
        sb_ident(&b, r->column.name);
        sb_put(&b, " = ?1 WHERE ");
        sb_ident(&b, r->id);
        sb_put(&b, " = ?2 AND (");
        sb_ident(&b, r->column.name);
        /* A REAL was read as its text rendering (no REAL ks_value): it is
         * unchanged when its CAST to TEXT, the same rendering, still equals
         * the text the engine saw. */
        sb_put(&b, " IS ?3 OR (typeof(");
        sb_ident(&b, r->column.name);
        sb_put(&b, ") = 'real' AND typeof(?3) = 'text' AND CAST(");
        sb_ident(&b, r->column.name);
        sb_put(&b, " AS TEXT) = ?3))");
        err = prepare_kept(o, &b, ST_CAS);
    }
    free(b.p);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o,
                            "INSERT INTO main.keyshift_quarantine(tbl, col, id, error, time, "
                            "params) VALUES(?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(tbl, col, id) "
                            "DO UPDATE SET error = excluded.error, time = excluded.time, "
                            "params = excluded.params WHERE params IS NOT excluded.params",
                            ST_QUARANTINE);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o,
                            "INSERT OR REPLACE INTO main.keyshift_migration(params, state, cursor, "
                            "pass, done, skipped, raced, quarantined, wrong_state, started, "
                            "updated, finished, tbl, col) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                            "?9, ?10, ?11, ?12, ?13, ?14)",
                            ST_CP_SAVE);
#define CP_COLS                                                                                    \
    "SELECT params, state, cursor, pass, done, skipped, raced, quarantined, wrong_state, "        \
    "started, updated, finished FROM main.keyshift_migration "
    if (err == KS_OK && have_tables)
        err = prepare_const(o, CP_COLS "WHERE params = ?1 AND tbl = ?2 AND col = ?3", ST_CP_LOAD);
    if (err == KS_OK && have_tables)
        err = prepare_const(o, CP_COLS "WHERE tbl = ?2 AND col = ?3 ORDER BY updated DESC, rowid DESC LIMIT 1",
                            ST_CP_LATEST);
#undef CP_COLS
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o, "BEGIN IMMEDIATE", ST_BEGIN);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o, "COMMIT", ST_COMMIT);
    if (err == KS_OK)
        err = prepare_const(o, "ROLLBACK", ST_ROLLBACK);
    return err;
}

/* ---- opening ---------------------------------------------------------------------------- */

/* Check the caller's arguments before touching any file. */
static ks_err check_args(const char *path, const ks_rowstore_target *t, ks_rowstore *out,
                         char *errbuf, size_t errbuf_len)
{
    if (path == NULL || t == NULL || out == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "missing path, target or store");
    if (t->n_context_columns > KS_ROWSTORE_MAX_CONTEXT_COLUMNS)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "at most %d context columns", KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    const char *names[3 + KS_ROWSTORE_MAX_CONTEXT_COLUMNS] = {t->table, t->column};
    size_t n = 2;
    if (t->id_column != NULL)
        names[n++] = t->id_column;
    if (t->tenant_column != NULL)
        names[n++] = t->tenant_column;
    for (size_t i = 0; i < t->n_context_columns; i++)
        names[n++] = t->context_columns[i];
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || names[i][0] == '\0' || strlen(names[i]) > IDENT_MAX)
            return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                        "a table or column name is missing, empty or too long");
    return KS_OK;
}

/* Read the main database's journal mode ("wal", "delete", ...) into
 * mode: what decides whether synchronous NORMAL is safe (set_synchronous). */
static ks_err journal_mode(opener *o, char *mode, size_t mode_len)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(o->s->db, "PRAGMA main.journal_mode", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        ks_sqlite_printable(t != NULL ? (const char *)t : "?", mode, mode_len);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_ERROR; /* a pragma that always answers answered nothing */
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "reading the journal mode");
}

/* Set the connection's PRAGMA synchronous to sync (rowstore.h,
 * ks_sqlite_sync): FULL always, NORMAL only on a WAL database, refused
 * otherwise rather than quietly kept at FULL (the caller asked for a
 * trade-off the database cannot make safely). */
static ks_err set_synchronous(opener *o, ks_sqlite_sync sync)
{
    if (sync != KS_SQLITE_SYNC_FULL && sync != KS_SQLITE_SYNC_NORMAL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "synchronous must be FULL or NORMAL");
    if (sync == KS_SQLITE_SYNC_NORMAL) {
        char mode[16];
        ks_err err = journal_mode(o, mode, sizeof mode);
        if (err != KS_OK)
            return err;
        if (strcmp(mode, "wal") != 0)
            return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "synchronous NORMAL is safe only in WAL mode, and the "
                                  "database's journal mode is %s: use FULL (the default) or "
                                  "switch the database to WAL", mode);
    }
    int rc = sqlite3_exec(o->s->db,
                          sync == KS_SQLITE_SYNC_NORMAL ? "PRAGMA synchronous = NORMAL"
                                                        : "PRAGMA synchronous = FULL",
                          NULL, NULL, NULL);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "setting synchronous");
}

/* Open the connection (never creating the file) and configure it
 * (sqlite_util.h): extended result codes, defensive mode, untrusted
 * schema, busy handler; then the page cache and synchronous of opts
 * (NULL: the defaults). */
static ks_err open_db(opener *o, const char *path, const ks_sqlite_options *opts)
{
    sqlite_store *s = o->s;
    ks_err err = ks_sqlite_connect(path, s->read_only, 0, &s->busy, &s->db, o->errbuf,
                                   o->errbuf_len);
    if (err != KS_OK)
        return err;
    uint32_t cache_kib = opts != NULL ? opts->cache_kib : 0;
    char sql[48];
    snprintf(sql, sizeof sql, "PRAGMA cache_size = -%u",
             (unsigned)(cache_kib != 0 ? cache_kib : KS_SQLITE_CACHE_KIB_DEFAULT));
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "setting the page cache");
    return set_synchronous(o, opts != NULL ? opts->synchronous : KS_SQLITE_SYNC_FULL);
}

/* Nonzero when colinfo a and b are the same column. */
static int same_column(const colinfo *a, const colinfo *b)
{
    return a->found && b->found && a->cid == b->cid;
}

/* Resolve every name of target t against the schema into r (s->table
 * and s->column set), with the checks of the file comment. */
static ks_err resolve_target(opener *o, const ks_rowstore_target *t, resolved *r)
{
    sqlite_store *s = o->s;
    int is_view = 0;
    ks_sqlite_printable(t->table, o->tname, sizeof o->tname);
    if (reserved_table(t->table))
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" is reserved (sqlite_*, keyshift_*)", o->tname);
    ks_err err = find_table(o, t->table, &s->table, &is_view);
    if (err != KS_OK)
        return err;
    if (is_view)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "\"%s\" is a view, not a table", o->tname);
    err = need_column(o, t->column, "target", &r->column);
    if (err == KS_OK && t->id_column != NULL)
        err = need_column(o, t->id_column, "id", &r->id_col);
    if (err == KS_OK && t->tenant_column != NULL)
        err = need_column(o, t->tenant_column, "tenant", &r->tenant);
    for (size_t i = 0; err == KS_OK && i < t->n_context_columns; i++)
        err = need_column(o, t->context_columns[i], "context", &r->context[i]);
    if (err != KS_OK)
        return err;
    r->n_context = t->n_context_columns;
    char pcol[96];
    ks_sqlite_printable(r->column.name, pcol, sizeof pcol);
    if (r->column.hidden != 0 || r->column.pk != 0)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "column \"%s\" is generated, hidden or part of the primary key", pcol);
    int clash = same_column(&r->column, &r->id_col) || same_column(&r->column, &r->tenant);
    for (size_t i = 0; i < r->n_context; i++)
        clash |= same_column(&r->column, &r->context[i]);
    if (clash)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "column \"%s\" cannot also be the id, tenant or a context column", pcol);
    s->column = dup_str(r->column.name);
    if (s->column == NULL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    if (t->id_column == NULL) {
        /* the bare rowid: stable only as the alias of an INTEGER PRIMARY KEY */
        int64_t alias = -1;
        err = pick_rowid(o, &r->id);
        if (err == KS_OK)
            err = rowid_alias_cid(o, &alias);
        r->id_stable = alias >= 0;
        return err;
    }
    r->id_stable = 1; /* a unique NOT NULL column or the rowid alias, once checked */
    int ok = 0;
    err = check_id_column(o, &r->id_col, &ok);
    if (err == KS_OK && !ok) {
        char pid[96];
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                   "id column \"%s\" of table \"%s\" is neither the INTEGER PRIMARY KEY nor "
                   "NOT NULL with a UNIQUE or PRIMARY KEY index of its own",
                   ks_sqlite_printable(r->id_col.name, pid, sizeof pid), o->tname);
    }
    r->id = r->id_col.name;
    return err;
}

/* Free the strings of r. */
static void resolved_free(resolved *r)
{
    colinfo_free(&r->column);
    colinfo_free(&r->id_col);
    colinfo_free(&r->tenant);
    for (size_t i = 0; i < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; i++)
        colinfo_free(&r->context[i]);
}

/*
 * Test builds only (-DKS_TEST_HOOKS): when KEYSHIFT_TEST_MAX_PAGES is set,
 * cap a writable store's database at that many pages (PRAGMA
 * max_page_count), so that CLI tests provoke SQLITE_FULL in a real
 * `keyshift migrate run` process.  Release builds never read the
 * variable.
 */
static void env_max_pages(const ks_rowstore *store)
{
#ifdef KS_TEST_HOOKS
    const char *v = getenv("KEYSHIFT_TEST_MAX_PAGES");
    const sqlite_store *s = store->self;
    if (v != NULL && !s->read_only && atol(v) > 0) {
        ks_err err = ks_rowstore_sqlite_test_max_pages(store, (uint32_t)atol(v));
        (void)err; /* a test that sets it checks the outcome it provokes */
    }
#else
    (void)store;
#endif
}

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_open(const char *path, const ks_rowstore_target *target,
                               const ks_sqlite_options *opts, ks_rowstore *out, char *errbuf,
                               size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    ks_err err = check_args(path, target, out, errbuf, errbuf_len);
    if (err != KS_OK)
        return err;
    if (ks_value_encoding_name((int)target->encoding) == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "the column's encoding is neither binary nor base64");
    memset(out, 0, sizeof *out);
    sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = opts != NULL && opts->read_only;
    ks_sqlite_busy_init(&s->busy, opts != NULL ? opts->busy_timeout_ms : 0);
    s->n_context = target->n_context_columns;
    s->as_text = target->encoding == KS_ENCODING_BASE64;
    opener o = {.s = s, .errbuf = errbuf, .errbuf_len = errbuf_len};
    resolved r;
    memset(&r, 0, sizeof r);
    int have_tables = 0;
    err = open_db(&o, path, opts);
    if (err == KS_OK)
        err = resolve_target(&o, target, &r);
    if (err == KS_OK)
        err = ensure_own_tables(&o, &have_tables);
    if (err == KS_OK)
        err = prepare_statements(&o, &r, have_tables);
    int id_stable = r.id_stable;
    resolved_free(&r);
    if (err != KS_OK) {
        ks_sqls_store_free(s);
        return err;
    }
    out->ops = &ks_sqls_ops;
    out->self = s;
    out->name = "sqlite";
    out->id_stable = id_stable;
    out->encoding = target->encoding;
    env_max_pages(out);
    return KS_OK;
}

/* A name read back from keyshift_migration: TEXT with no NUL inside and
 * at most IDENT_MAX bytes, as check_args admits; else KS_ERR_STORE. */
static ks_err read_name(sqlite3_stmt *st, int col, ks_bytes *out)
{
    if (sqlite3_column_type(st, col) != SQLITE_TEXT)
        return KS_ERR_STORE;
    const unsigned char *p = sqlite3_column_text(st, col);
    int n = sqlite3_column_bytes(st, col);
    if (p == NULL || n <= 0 || (size_t)n > IDENT_MAX || memchr(p, 0, (size_t)n) != NULL)
        return KS_ERR_STORE;
    *out = (ks_bytes){p, (size_t)n};
    return KS_OK;
}

/* Step the checkpoint listing st, handing each row to fn (see
 * ks_rowstore_sqlite_checkpoints); every row is checked as
 * checkpoint_load checks it. */
static ks_err list_rows(sqlite_store *s, sqlite3_stmt *st, ks_checkpoint_list_fn fn, void *arg)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        ks_checkpoint cp;
        ks_bytes tbl, col;
        s->arena_len = 0;
        ks_err err = ks_sqls_read_checkpoint(s, st, &cp);
        if (err == KS_OK)
            err = read_name(st, 12, &tbl);
        if (err == KS_OK)
            err = read_name(st, 13, &col);
        if (err != KS_OK)
            return err;
        if (fn(arg, tbl, col, &cp) != 0)
            return KS_OK;
    }
    return rc == SQLITE_DONE ? KS_OK : ks_sqlite_map_rc(rc);
}

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_checkpoints(const char *path, const char *table, const char *column,
                                      ks_checkpoint_list_fn fn, void *arg, char *errbuf,
                                      size_t errbuf_len)
{
    static const char q[] =
        "SELECT params, state, cursor, pass, done, skipped, raced, quarantined, wrong_state, "
        "started, updated, finished, tbl, col FROM main.keyshift_migration "
        "WHERE ?1 IS NULL OR (tbl = ?1 AND col = ?2) ORDER BY updated DESC, rowid DESC";
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (path == NULL || fn == NULL || (table == NULL) != (column == NULL))
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "missing path or callback, or a table without a column");
    sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = 1;
    ks_sqlite_busy_init(&s->busy, 0);
    opener o = {.s = s, .errbuf = errbuf, .errbuf_len = errbuf_len};
    int have = 0;
    sqlite3_stmt *st = NULL;
    ks_err err = open_db(&o, path, 0);
    if (err == KS_OK)
        err = ensure_own_tables(&o, &have); /* read-only: creates nothing */
    if (err == KS_OK && have) {
        int rc = sqlite3_prepare_v2(s->db, q, -1, &st, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        if (rc == SQLITE_OK)
            rc = sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
        err = rc == SQLITE_OK ? list_rows(s, st, fn, arg) : open_fail_rc(&o, rc, "listing the checkpoints");
        if (err == KS_ERR_STORE && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
            (void)ks_sqlite_fail(errbuf, errbuf_len, err, "a malformed row in keyshift_migration");
    }
    sqlite3_finalize(st);
    ks_sqls_store_free(s);
    return err;
}

