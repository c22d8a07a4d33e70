/*
 * tools/demo/demo_app.h -- the data access of keyshift-demo-app
 * (tools/demo/demo_app.c): one small interface over the application's own
 * table, with a SQLite implementation (tools/demo/demo_app_sqlite.c) and a
 * PostgreSQL one (tools/demo/demo_app_pg.c), so that the application logic
 * (policy, keyring, open and seal) is the same on both databases.
 * Internal to the program.
 *
 * A backend picks one row by its key (the SQLite rowid, or PostgreSQL's
 * integer id column), lends views of its id, tenant and value until
 * release, and UPDATEs a row's value by key in autocommit.  Values and
 * keys are always bound parameters; identifiers are quoted.
 */
#ifndef KS_TOOLS_DEMO_APP_H
#define KS_TOOLS_DEMO_APP_H

#include <stddef.h>
#include <stdint.h>

/* Milliseconds a statement waits for a lock (SQLite's busy timeout,
 * PostgreSQL's lock_timeout) before it fails. */
#define DEMO_BUSY_TIMEOUT_MS 10000

/* What the caller names: the database (a SQLite file or a PostgreSQL
 * connection string, already checked by ks_cli_db_check), the table, its
 * encrypted column, the column {id} renders (NULL: the row key), the
 * tenant column, and whether the column holds base64 text (PostgreSQL:
 * text or varchar rather than bytea). */
typedef struct demo_target {
    const char *db, *table, *column, *id_column, *tenant_column;
    int text;
} demo_target;

/* The kinds of id a row's {id} renders from. */
enum { DEMO_ID_NULL, DEMO_ID_INT, DEMO_ID_TEXT, DEMO_ID_BLOB };

/* One picked row: views into the backend's result, valid until release. */
typedef struct demo_row {
    int64_t key;             /* what update names the row by */
    int id_kind;             /* DEMO_ID_*: INT in id_int, TEXT and BLOB in id */
    long long id_int;
    const uint8_t *id;
    size_t id_len;
    const uint8_t *tenant;   /* NULL for a NULL tenant */
    size_t tenant_len;
    int value_null;          /* the value is SQL NULL */
    const uint8_t *value;    /* never NULL when !value_null */
    size_t value_len;
} demo_row;

typedef struct demo_db demo_db;

/* A backend's operations. */
typedef struct demo_db_ops {
    /* The first row whose key is >= start into *row: 1 when there is
     * one, 0 when none is, -1 on a database error (see errmsg). */
    int (*pick)(demo_db *db, int64_t start, demo_row *row);
    /* End the pick: its views go, and its read snapshot with them. */
    void (*release)(demo_db *db);
    /* UPDATE the value of row key to value[0, len), as a BLOB or as
     * TEXT (SQLite; on PostgreSQL as the column's type, bytea, or text
     * for a demo_target.text column), in autocommit: 0 or -1. */
    int (*update)(demo_db *db, int64_t key, const uint8_t *value, size_t len, int blob);
    /* The last failure, for a message: never a value of the table. */
    const char *(*errmsg)(demo_db *db);
    /* Release everything. */
    void (*close)(demo_db *db);
} demo_db_ops;

/* The part every backend shares: its operations and the key range seen
 * at open (picks are drawn from it). */
struct demo_db {
    const demo_db_ops *ops;
    int64_t min_key, max_key;
};

/* Open the SQLite file t->db (which must exist) and prepare the
 * statements.  EX_OK, or an exit code after a message: EX_NOINPUT for no
 * such database, table or column, or an empty table. */
int demo_db_sqlite_open(const demo_target *t, demo_db **out);

/* Connect to the PostgreSQL database t->db and prepare the statements.
 * The row key is t->id_column, else the table's one-column primary key;
 * it must be a smallint, integer or bigint and the column bytea, or text
 * or varchar with t->text (as `keyshift migrate` requires).  EX_OK, or an exit code after a message
 * that never quotes the connection string: EX_NOINPUT for no such table
 * or column, or an empty table; EX_USAGE for a column of another type;
 * EX_UNAVAILABLE for a server that cannot be reached. */
int demo_db_pg_open(const demo_target *t, demo_db **out);

#endif /* KS_TOOLS_DEMO_APP_H */
