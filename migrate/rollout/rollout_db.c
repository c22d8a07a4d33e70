/*
 * migrate/rollout/rollout_db.c -- the rollout layer over a rollout store
 * (keyshift/rollout.h, ks_rollout_db_*): starting rollouts, moving them
 * through their phases under the guards, canaries, verify passes, the
 * log, the reader registry and health samples.
 *
 * The state lives behind keyshift/rollout_store.h; this file holds no SQL
 * and knows no database.  ks_rollout_db_open opens the SQLite store
 * (migrate/store/sqlite/) and wraps it; ks_rollout_db_wrap wraps any
 * other.  Every change of a rollout runs between the store's begin and
 * commit (rolled back on any failure): it re-reads the rollout, checks
 * it is still where the caller saw it, runs the guard (guard.c), writes
 * the change and its log row.  Arguments are checked here, and so is
 * every row a store returns (classes, canaries, listed columns, readers,
 * log text): a store's rows are untrusted, and a bad one is KS_ERR_STORE,
 * never used.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>

#include "../../format/rules.h"
#include "rollout_internal.h"
#include "../alloc_hook.h"

/* One open rollout store, as the rollout layer holds it. */
struct ks_rollout_db {
    ks_rollout_store *s;
};

/* The operations of db's store. */
#define OPS(db) ((db)->s->ops)

/* ---- transactions --------------------------------------------------------------- */

/* Start a write transaction on db's store. */
static ks_err txn_begin(ks_rollout_db *db)
{
    return OPS(db)->begin(db->s);
}

/* Commit when err is KS_OK, else (or when the commit fails) roll back;
 * returns the first error. */
static ks_err txn_end(ks_rollout_db *db, ks_err err)
{
    if (err == KS_OK)
        return OPS(db)->commit(db->s);
    OPS(db)->rollback(db->s);
    return err;
}

/* See rollout_internal.h. */
ks_err ks_rollout_db_snapshot(ks_rollout_db *db, int begin)
{
    assert(db != NULL);
    return OPS(db)->snapshot(db->s, begin);
}

/* See rollout_internal.h. */
ks_err ks_rollout_db_data_version(ks_rollout_db *db, int64_t *out)
{
    assert(db != NULL && out != NULL);
    return OPS(db)->data_version(db->s, out);
}

/* ---- checking arguments and untrusted rows ---------------------------------------- */

/* Nonzero when s is at most max bytes, each printable (>= 0x20, not
 * DEL), and at least min_len bytes. */
static int printable_ok(const char *s, size_t min_len, size_t max)
{
    if (s == NULL)
        return 0;
    size_t n = strnlen(s, max + 1);
    if (n < min_len || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* Nonzero when actor and reason may be logged. */
static int log_args_ok(const char *actor, const char *reason)
{
    return printable_ok(actor, 1, KS_ROLLOUT_ACTOR_MAX) &&
           (reason == NULL || printable_ok(reason, 0, KS_ROLLOUT_REASON_MAX));
}

/* KS_OK when c is a well-formed canary (see rollout.h). */
static ks_err canary_check(const ks_rollout_canary *c)
{
    if (c == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    switch (c->kind) {
    case KS_CANARY_ALL:
        return c->n_tenants == 0 && c->percent == 0 ? KS_OK : KS_ERR_INVALID_ARGUMENT;
    case KS_CANARY_PERCENT:
        return c->n_tenants == 0 && c->percent <= 100 ? KS_OK : KS_ERR_INVALID_ARGUMENT;
    case KS_CANARY_TENANTS:
        break;
    default:
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (c->n_tenants == 0 || c->n_tenants > KS_ROLLOUT_TENANTS_MAX || c->percent != 0)
        return KS_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < c->n_tenants; i++) {
        if (!ks_rollout_charset_ok(c->tenants[i], KS_TENANT_MAX, KS_RULE_NAME))
            return KS_ERR_INVALID_ARGUMENT;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->tenants[i], c->tenants[j]) == 0)
                return KS_ERR_INVALID_ARGUMENT;
    }
    return KS_OK;
}

/* Nonzero when a rollout read from a store makes sense: a valid source
 * and (envelope) target that differ, a valid canary, a known encoding,
 * and for a key scope
 * 1..KS_ROLLOUT_COLUMNS_MAX distinct, non-empty listed columns (a store
 * decodes columns by type; this judges what they say together). */
static int rollout_ok(const ks_rollout *r)
{
    if (ks_rollout_class_check(&r->source, 1) != KS_OK ||
        ks_rollout_class_check(&r->target, 0) != KS_OK ||
        ks_rollout_class_equal(&r->source, &r->target) || canary_check(&r->canary) != KS_OK ||
        ks_value_encoding_name((int)r->encoding) == NULL)
        return 0;
    if (r->scope != KS_SCOPE_KEY)
        return r->scope == KS_SCOPE_COLUMN && r->n_columns == 0;
    if (r->n_columns == 0 || r->n_columns > KS_ROLLOUT_COLUMNS_MAX)
        return 0;
    ks_rollout prefix = *r;
    for (size_t i = 0; i < r->n_columns; i++) {
        const ks_rollout_column *c = &r->columns[i];
        prefix.n_columns = i;
        if (c->table[0] == '\0' || c->column[0] == '\0' ||
            ks_rollout_scope_covers(&prefix, c->table, c->column))
            return 0;
    }
    return 1;
}

/* Check the n rollouts a store returned (KS_ERR_STORE for a bad one). */
static ks_err rollouts_ok(const ks_rollout *rs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!rollout_ok(&rs[i]))
            return KS_ERR_STORE;
    return KS_OK;
}

/* Nonzero when r may be registered: a [F-NAME-1] instance id, a printable
 * version string, a format 1..255 and a canonical key list. */
static int reader_ok(const ks_rollout_reader *r)
{
    return ks_rollout_charset_ok(r->instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME) &&
           printable_ok(r->library_version, 0, KS_LIBRARY_VERSION_MAX) &&
           r->max_format >= 1 && ks_rollout_keys_check(r->keys) == KS_OK;
}

/* The rollout with this id into *out, checked (KS_ERR_NO_ROLLOUT if none). */
static ks_err load_rollout(ks_rollout_db *db, int64_t id, ks_rollout *out)
{
    ks_err err = OPS(db)->get(db->s, id, out);
    return err == KS_OK ? rollouts_ok(out, 1) : err;
}

/* Append a log row (inside the caller's transaction).  from 0: none. */
static ks_err log_append(ks_rollout_db *db, int64_t rollout_id, int64_t now, const char *actor,
                         int from, int to, const char *reason, int automatic)
{
    return OPS(db)->log_append(db->s, rollout_id, now, actor, from, to, reason, automatic);
}

/* ---- opening ------------------------------------------------------------------ */

/* See rollout_store.h. */
ks_err ks_rollout_db_wrap(ks_rollout_store *store, ks_rollout_db **out)
{
    if (out != NULL)
        *out = NULL;
    if (store == NULL || store->ops == NULL || out == NULL) {
        if (store != NULL && store->ops != NULL)
            store->ops->close(store);
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_rollout_db *db = calloc(1, sizeof *db);
    if (db == NULL) {
        store->ops->close(store);
        return KS_ERR_NO_MEMORY;
    }
    db->s = store;
    *out = db;
    return KS_OK;
}

/* See rollout.h: the SQLite rollout store, wrapped. */
ks_err ks_rollout_db_open(const char *path, unsigned flags, ks_rollout_db **out, char *errbuf,
                          size_t errbuf_len)
{
    if (out == NULL) {
        if (errbuf != NULL && errbuf_len > 0)
            errbuf[0] = '\0';
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    ks_rollout_store *s = NULL;
    ks_err err = ks_rollout_store_sqlite_open(path, flags, &s, errbuf, errbuf_len);
    return err == KS_OK ? ks_rollout_db_wrap(s, out) : err;
}

/* See rollout.h. */
void ks_rollout_db_close(ks_rollout_db *db)
{
    if (db == NULL)
        return;
    OPS(db)->close(db->s);
    free(db);
}

/* ---- start ------------------------------------------------------------------- */

/* What is wrong with key-scoped spec s (NULL when nothing): a source
 * with a key_id, a target keeping it, no table or column of its own, and
 * 1..KS_ROLLOUT_COLUMNS_MAX well-formed column names (checked against the
 * schema later). */
static const char *key_spec_problem(const ks_rollout *s)
{
    if (s->table[0] != '\0' || s->column[0] != '\0')
        return "a key-scoped rollout names its columns in its list, not as its table and column";
    if (s->source.is_plaintext)
        return "a key-scoped rollout needs an envelope source: plaintext has no key_id";
    if (strncmp(s->source.key_id, s->target.key_id, sizeof s->source.key_id) != 0)
        return "a key-scoped rollout keeps its key_id: the target must be under the source's "
               "key_id (a move to another key_id is a rollout per column)";
    if (s->n_columns == 0 || s->n_columns > KS_ROLLOUT_COLUMNS_MAX)
        return "a key-scoped rollout lists 1 to 16 columns";
    for (size_t i = 0; i < s->n_columns; i++)
        if (strnlen(s->columns[i].table, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
            strnlen(s->columns[i].column, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX)
            return "a listed table or column name is empty or too long";
    return NULL;
}

/* Nonzero when thresholds t can be stored: no NaN rate, counters that
 * fit an INTEGER column, a window of at least 1 s. */
static int thresholds_ok(const ks_thresholds *t)
{
    return !isnan(t->max_auth_failure_rate) && !isnan(t->max_parse_error_rate) &&
           !isnan(t->max_provider_error_rate) && t->max_seal_p99_us <= INT64_MAX &&
           t->max_open_p99_us <= INT64_MAX && t->min_samples <= INT64_MAX && t->window_s != 0;
}

/* Check a rollout spec (see ks_rollout_db_start). */
static ks_err spec_check(const ks_rollout *s, char *errbuf, size_t errbuf_len)
{
    const ks_thresholds *t = &s->thresholds;
    const char *what = NULL;
    if (s->scope != KS_SCOPE_COLUMN && s->scope != KS_SCOPE_KEY)
        what = "the scope is neither a column nor a key";
    else if (s->scope == KS_SCOPE_COLUMN &&
             (strnlen(s->table, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
              strnlen(s->column, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
              s->n_columns != 0))
        what = "the table or column name is empty or too long";
    else if (ks_rollout_class_check(&s->source, 1) != KS_OK)
        what = "the source class is not valid";
    else if (ks_rollout_class_check(&s->target, 0) != KS_OK)
        what = "the target must be a valid envelope class";
    else if (ks_rollout_class_equal(&s->source, &s->target))
        what = "the source and the target are the same class";
    else if (canary_check(&s->canary) != KS_OK)
        what = "the canary is not valid";
    else if (!thresholds_ok(t))
        what = "the thresholds are not valid";
    else if (s->reader_ttl_s == 0)
        what = "the reader TTL must be at least 1 s";
    else if (ks_value_encoding_name((int)s->encoding) == NULL)
        what = "the encoding is neither binary nor base64";
    else if (s->scope == KS_SCOPE_KEY)
        what = key_spec_problem(s);
    if (what != NULL)
        return ks_rollout_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "%s", what);
    return KS_OK;
}

/* The open (not finalized) rollout that overlaps a new rollout on
 * tbl.col, or of key_id when key_id is not NULL (the store's find_open):
 * its id (0 when none), phase and scope text go to *id, phase and what. */
static ks_err find_open(ks_rollout_db *db, const char *tbl, const char *col, const char *key_id,
                        int key_scopes, int64_t *id, char phase[32], char what[SCOPE_TEXT_MAX])
{
    ks_err err = OPS(db)->find_open(db->s, tbl, col, key_id, key_scopes, id);
    if (err != KS_OK || *id == 0)
        return err;
    ks_rollout other;
    err = load_rollout(db, *id, &other);
    if (err == KS_OK) {
        snprintf(phase, 32, "%s", ks_rollout_phase_name((int)other.phase));
        ks_rollout_scope_text(&other, what, SCOPE_TEXT_MAX);
    }
    return err;
}

/* Refuse (KS_ERR_ROLLOUT_EXISTS, naming it) a new rollout of scope s that
 * overlaps an open one: for a column scope, one of its column or a key
 * scope covering it; for a key scope, one of the same key_id or a column
 * scope of one of its columns.  A key scope overlaps a column scope on a
 * shared column whatever their classes, because a column-scoped rollout
 * judges every value of its column, which would leave the key-scoped
 * one's envelopes under two rules.  Key scopes of different key_ids
 * judge disjoint envelopes and may share columns. */
static ks_err refuse_overlap(ks_rollout_db *db, const ks_rollout *s, char *errbuf,
                             size_t errbuf_len)
{
    char phase[32], what[SCOPE_TEXT_MAX], mine[SCOPE_TEXT_MAX];
    int64_t open_id = 0;
    ks_err err = KS_OK;
    if (s->scope == KS_SCOPE_KEY)
        err = find_open(db, NULL, NULL, s->source.key_id, 0, &open_id, phase, what);
    else
        err = find_open(db, s->table, s->column, NULL, 1, &open_id, phase, what);
    for (size_t i = 0; err == KS_OK && open_id == 0 && i < s->n_columns; i++)
        err = find_open(db, s->columns[i].table, s->columns[i].column, NULL, 0, &open_id, phase,
                        what);
    if (err == KS_OK && open_id != 0)
        err = ks_rollout_fail(errbuf, errbuf_len, KS_ERR_ROLLOUT_EXISTS,
                              "rollout %lld of %s is in %s and overlaps %s: finalize it first",
                              (long long)open_id, what, phase,
                              ks_rollout_scope_text(s, mine, sizeof mine));
    return err;
}

/* Inside start's transaction: *r = spec with its scope in the schema's
 * spellings (the store's find_column), in planned at now. */
static ks_err start_record(ks_rollout_db *db, const ks_rollout *spec, int64_t now, ks_rollout *r,
                           char *errbuf, size_t errbuf_len)
{
    ks_err err = KS_OK;
    *r = *spec;
    r->id = 0;
    r->phase = KS_PHASE_PLANNED;
    r->phase_since = r->created = r->updated = now;
    r->verified_at = 0;
    if (spec->scope == KS_SCOPE_COLUMN)
        err = OPS(db)->find_column(db->s, spec->table, spec->column, r->table, r->column, errbuf,
                                   errbuf_len);
    for (size_t i = 0; err == KS_OK && i < spec->n_columns; i++) {
        ks_rollout_column *c = &r->columns[i];
        c->verified_at = 0;
        err = OPS(db)->find_column(db->s, spec->columns[i].table, spec->columns[i].column,
                                   c->table, c->column, errbuf, errbuf_len);
        r->n_columns = i;
        if (err == KS_OK && ks_rollout_scope_covers(r, c->table, c->column))
            err = ks_rollout_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "column %s.%s is listed twice", c->table, c->column);
        r->n_columns = spec->n_columns;
    }
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_start(ks_rollout_db *db, const ks_rollout *spec, const char *actor,
                           int64_t now, int64_t *id, char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (db == NULL || spec == NULL || id == NULL || !log_args_ok(actor, NULL))
        return ks_rollout_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                               "missing store, spec or actor");
    *id = 0;
    ks_err err = spec_check(spec, errbuf, errbuf_len);
    if (err == KS_OK)
        err = txn_begin(db);
    if (err != KS_OK)
        return err;
    ks_rollout r; /* the record to insert: the scope in the schema's spellings */
    err = start_record(db, spec, now, &r, errbuf, errbuf_len);
    if (err == KS_OK)
        err = refuse_overlap(db, &r, errbuf, errbuf_len);
    if (err == KS_OK)
        err = OPS(db)->insert(db->s, &r, id);
    if (err == KS_OK) {
        char reason[3 * (KS_KEY_ID_MAX + 48) + 48], sc[KS_KEY_ID_MAX + 48], tc[KS_KEY_ID_MAX + 48];
        if (spec->scope == KS_SCOPE_KEY)
            snprintf(reason, sizeof reason, "start: key %s, %zu columns: %s -> %s",
                     spec->source.key_id, spec->n_columns,
                     ks_rollout_class_text(&spec->source, sc, sizeof sc),
                     ks_rollout_class_text(&spec->target, tc, sizeof tc));
        else
            snprintf(reason, sizeof reason, "start: %s -> %s",
                     ks_rollout_class_text(&spec->source, sc, sizeof sc),
                     ks_rollout_class_text(&spec->target, tc, sizeof tc));
        err = log_append(db, *id, now, actor, 0, KS_PHASE_PLANNED, reason, 0);
    }
    err = txn_end(db, err);
    if (err != KS_OK)
        *id = 0;
    return err;
}

/* ---- reading rollouts ----------------------------------------------------------- */

/* See rollout.h. */
ks_err ks_rollout_db_get(ks_rollout_db *db, int64_t id, ks_rollout *out)
{
    if (db == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    return load_rollout(db, id, out);
}

/* See rollout.h. */
ks_err ks_rollout_db_latest(ks_rollout_db *db, const char *table, const char *column,
                            ks_rollout *out)
{
    if (db == NULL || table == NULL || column == NULL || out == NULL || table[0] == '\0' ||
        column[0] == '\0')
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = OPS(db)->latest(db->s, table, column, out);
    return err == KS_OK ? rollouts_ok(out, 1) : err;
}

/* See rollout.h. */
ks_err ks_rollout_db_latest_key(ks_rollout_db *db, const char *key_id, ks_rollout *out)
{
    if (db == NULL || out == NULL || !ks_rollout_charset_ok(key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = OPS(db)->latest_key(db->s, key_id, out);
    return err == KS_OK ? rollouts_ok(out, 1) : err;
}

/* See rollout.h. */
ks_err ks_rollout_db_list(ks_rollout_db *db, int64_t after_id, ks_rollout *out, size_t max,
                          size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (max == 0)
        return KS_OK;
    ks_err err = OPS(db)->list(db->s, after_id, out, max, n);
    if (err == KS_OK)
        err = rollouts_ok(out, *n);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* ---- readers ------------------------------------------------------------------- */

/* now - ttl_s without overflow. */
static int64_t live_since(int64_t now, uint32_t ttl_s)
{
    return now < INT64_MIN + (int64_t)ttl_s ? INT64_MIN : now - (int64_t)ttl_s;
}

/* The live readers into out[0, *n) (max of them), *total their number,
 * each checked (KS_ERR_STORE for a malformed one). */
static ks_err load_readers(ks_rollout_db *db, uint32_t ttl_s, int64_t now, ks_rollout_reader *out,
                           size_t max, size_t *n, size_t *total)
{
    ks_err err = OPS(db)->readers_live(db->s, live_since(now, ttl_s), out, max, n, total);
    for (size_t i = 0; err == KS_OK && i < *n; i++)
        if (!reader_ok(&out[i]))
            err = KS_ERR_STORE;
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_readers_live(ks_rollout_db *db, uint32_t ttl_s, int64_t now,
                                  ks_rollout_reader *out, size_t max, size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    size_t total = 0;
    ks_err err = load_readers(db, ttl_s, now, out, max, n, &total);
    if (err == KS_OK && total > max) {
        *n = total;
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_register(ks_rollout_db *db, const ks_rollout_reader *r, int64_t now)
{
    if (db == NULL || r == NULL || !reader_ok(r))
        return KS_ERR_INVALID_ARGUMENT;
    return OPS(db)->reader_put(db->s, r, now);
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_heartbeat(ks_rollout_db *db, const char *instance_id, int64_t now)
{
    if (db == NULL || !ks_rollout_charset_ok(instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME))
        return KS_ERR_INVALID_ARGUMENT;
    return OPS(db)->reader_heartbeat(db->s, instance_id, now);
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_deregister(ks_rollout_db *db, const char *instance_id)
{
    if (db == NULL || !ks_rollout_charset_ok(instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME))
        return KS_ERR_INVALID_ARGUMENT;
    return OPS(db)->reader_delete(db->s, instance_id);
}

/* ---- transitions ---------------------------------------------------------------- */

/* KS_OK when r is still in phase `from`, which the caller saw; else
 * KS_ERR_STALE: someone moved it first. */
static ks_err still_in(const ks_rollout *r, ks_rollout_phase from, char *why, size_t why_len)
{
    if (r->phase == from)
        return KS_OK;
    return ks_rollout_fail(why, why_len, KS_ERR_STALE,
                           "rollout %lld is in %s, not %s: it was moved by someone else",
                           (long long)r->id, ks_rollout_phase_name((int)r->phase),
                           ks_rollout_phase_name((int)from));
}

/* Inside the transaction: fill f's rollout-side facts (rollout, live
 * readers in *readers, which the caller frees, is_latest), after
 * checking the rollout is still in `from` (KS_ERR_STALE, why). */
static ks_err gather(ks_rollout_db *db, int64_t id, ks_rollout_phase from, ks_rollout_facts *f,
                     ks_rollout_reader **readers, char *why, size_t why_len)
{
    size_t n = 0, total = 0;
    int64_t later = 0;
    *readers = NULL;
    ks_err err = load_rollout(db, id, &f->rollout);
    if (err == KS_OK)
        err = still_in(&f->rollout, from, why, why_len);
    if (err == KS_OK)
        err = OPS(db)->later_count(db->s, &f->rollout, &later);
    f->is_latest = err == KS_OK && later == 0;
    if (err == KS_OK)
        err = load_readers(db, f->rollout.reader_ttl_s, f->now, NULL, 0, &n, &total);
    if (err == KS_OK && total > 0) {
        *readers = calloc(total, sizeof **readers);
        if (*readers == NULL)
            return KS_ERR_NO_MEMORY;
        err = load_readers(db, f->rollout.reader_ttl_s, f->now, *readers, total, &n, &total);
    }
    f->readers = *readers;
    f->n_readers = n;
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_transition(ks_rollout_db *db, const ks_rollout_change *c,
                                const ks_rollout_facts *facts, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (db == NULL || c == NULL || facts == NULL || !log_args_ok(c->actor, c->reason) ||
        ks_rollout_phase_name((int)c->from) == NULL || ks_rollout_phase_name((int)c->to) == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_facts f = *facts;
    ks_rollout_reader *readers = NULL;
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = gather(db, c->id, c->from, &f, &readers, why, why_len);
    if (err == KS_OK)
        err = ks_rollout_guard(&f, c->to, why, why_len);
    if (err == KS_OK)
        err = OPS(db)->set_phase(db->s, c->id, c->from, c->to, f.now);
    if (err == KS_OK)
        err = log_append(db, c->id, f.now, c->actor, (int)c->from, (int)c->to, c->reason,
                         c->automatic);
    err = txn_end(db, err);
    free(readers);
    return err;
}

/* Inside a transaction: load rollout id and check its phase is allowed
 * (bit (1 << phase) of allowed), else KS_ERR_STATE. */
static ks_err load_in_phase(ks_rollout_db *db, int64_t id, unsigned allowed, ks_rollout *r)
{
    ks_err err = load_rollout(db, id, r);
    if (err == KS_OK && (allowed & (1u << r->phase)) == 0)
        err = KS_ERR_STATE;
    return err;
}

/* See rollout.h.  The log rows are written before the rollout is
 * removed, inside the same transaction: the first says what the rollout
 * was (its classes), the second who aborted it and why. */
ks_err ks_rollout_db_abort(ks_rollout_db *db, int64_t id, ks_rollout_phase from,
                           const ks_rollout_facts *facts, const char *actor, const char *reason,
                           char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (db == NULL || facts == NULL || reason == NULL ||
        !printable_ok(reason, 1, KS_ROLLOUT_REASON_MAX - 16) || !log_args_ok(actor, reason) ||
        ks_rollout_phase_name((int)from) == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_facts f = *facts;
    ks_rollout_reader *readers = NULL;
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = gather(db, id, from, &f, &readers, why, why_len);
    if (err == KS_OK)
        err = ks_rollout_abort_guard(&f, why, why_len);
    if (err == KS_OK) {
        char src[KS_KEY_ID_MAX + 48], dst[KS_KEY_ID_MAX + 48], what[KS_ROLLOUT_REASON_MAX + 1];
        snprintf(what, sizeof what, "abort: the rollout of %s to %s is removed",
                 ks_rollout_class_text(&f.rollout.source, src, sizeof src),
                 ks_rollout_class_text(&f.rollout.target, dst, sizeof dst));
        err = log_append(db, id, f.now, actor, (int)from, (int)from, what, 0);
        snprintf(what, sizeof what, "aborted: %s", reason);
        if (err == KS_OK)
            err = log_append(db, id, f.now, actor, (int)from, (int)from, what, 0);
    }
    if (err == KS_OK)
        err = OPS(db)->remove(db->s, id);
    err = txn_end(db, err);
    free(readers);
    return err;
}

/* Append "name old -> new" to the change list out[0, cap) at *used when
 * the two texts differ. */
static void change_add(char *out, size_t cap, size_t *used, const char *name, const char *was,
                       const char *now)
{
    if (strcmp(was, now) == 0 || *used >= cap)
        return;
    int w = snprintf(out + *used, cap - *used, "%s%s %s -> %s", *used > 5 ? ", " : "", name, was,
                     now);
    *used += w > 0 ? (size_t)w : 0;
}

/* The log reason of a settings change into out: "set: min_samples 1000
 * -> 10, window_s 300 -> 60", naming only the values that change (empty
 * when none does).  Rates print with %.17g, so the text is exact. */
static void settings_reason(const ks_rollout *r, const ks_thresholds *t, uint32_t min_soak_s,
                            uint32_t reader_ttl_s, char *out, size_t cap)
{
    const ks_thresholds *o = &r->thresholds;
    const struct {
        const char *name;
        int is_rate;
        double rate_was, rate_now;
        uint64_t was, now;
    } v[] = {
        {"max_auth_failure_rate", 1, o->max_auth_failure_rate, t->max_auth_failure_rate, 0, 0},
        {"max_parse_error_rate", 1, o->max_parse_error_rate, t->max_parse_error_rate, 0, 0},
        {"max_provider_error_rate", 1, o->max_provider_error_rate, t->max_provider_error_rate, 0,
         0},
        {"max_seal_p99_us", 0, 0, 0, o->max_seal_p99_us, t->max_seal_p99_us},
        {"max_open_p99_us", 0, 0, 0, o->max_open_p99_us, t->max_open_p99_us},
        {"min_samples", 0, 0, 0, o->min_samples, t->min_samples},
        {"window_s", 0, 0, 0, o->window_s, t->window_s},
        {"min_soak_s", 0, 0, 0, r->min_soak_s, min_soak_s},
        {"reader_ttl_s", 0, 0, 0, r->reader_ttl_s, reader_ttl_s},
    };
    size_t used = (size_t)snprintf(out, cap, "set: ");
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char was[40], now[40];
        if (v[i].is_rate) {
            snprintf(was, sizeof was, "%.17g", v[i].rate_was);
            snprintf(now, sizeof now, "%.17g", v[i].rate_now);
        } else {
            snprintf(was, sizeof was, "%" PRIu64, v[i].was);
            snprintf(now, sizeof now, "%" PRIu64, v[i].now);
        }
        change_add(out, cap, &used, v[i].name, was, now);
    }
    if (used <= 5)
        out[0] = '\0';
}

/* See rollout.h. */
ks_err ks_rollout_db_set_settings(ks_rollout_db *db, int64_t id, const ks_thresholds *t,
                                  uint32_t min_soak_s, uint32_t reader_ttl_s, const char *actor,
                                  const char *reason, int64_t now, char *changes,
                                  size_t changes_len)
{
    if (changes != NULL && changes_len > 0)
        changes[0] = '\0';
    if (db == NULL || t == NULL || !thresholds_ok(t) || reader_ttl_s == 0 ||
        !log_args_ok(actor, reason))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    char what[KS_ROLLOUT_REASON_MAX + 1];
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_in_phase(db, id, ~(1u << KS_PHASE_FINALIZED), &r);
    if (err == KS_OK)
        settings_reason(&r, t, min_soak_s, reader_ttl_s, what, sizeof what);
    if (err == KS_OK && what[0] != '\0') {
        err = OPS(db)->set_settings(db->s, id, t, min_soak_s, reader_ttl_s, now);
        if (err == KS_OK)
            err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, what, 0);
        if (err == KS_OK && reason != NULL && reason[0] != '\0')
            err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, reason, 0);
        if (err == KS_OK && changes != NULL && changes_len > 0)
            snprintf(changes, changes_len, "%s", what + 5);
    }
    return txn_end(db, err);
}

/* The log reason of a canary change: "canary: 25%", "canary: all" or
 * "canary: t1,t2" (the tenants in the order given). */
static void canary_reason(const ks_rollout_canary *c, char *out, size_t cap)
{
    if (c->kind == KS_CANARY_PERCENT) {
        snprintf(out, cap, "canary: %u%%", (unsigned)c->percent);
        return;
    }
    size_t used = (size_t)snprintf(out, cap, "canary: %s", c->kind == KS_CANARY_ALL ? "all" : "");
    for (size_t i = 0; c->kind == KS_CANARY_TENANTS && i < c->n_tenants && used < cap; i++) {
        int w = snprintf(out + used, cap - used, "%s%s", i > 0 ? "," : "", c->tenants[i]);
        used += w > 0 ? (size_t)w : 0;
    }
}

/* See rollout.h. */
ks_err ks_rollout_db_set_canary(ks_rollout_db *db, int64_t id, const ks_rollout_canary *canary,
                                const char *actor, int64_t now)
{
    if (db == NULL || canary_check(canary) != KS_OK || !log_args_ok(actor, NULL))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    char reason[KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1) + 32];
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_in_phase(db, id, ~(1u << KS_PHASE_FINALIZED), &r);
    if (err == KS_OK)
        err = OPS(db)->set_canary(db->s, id, canary, now);
    if (err == KS_OK) {
        canary_reason(canary, reason, sizeof reason);
        err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, reason, 0);
    }
    return txn_end(db, err);
}

/* Record a verify pass of rollout id in one transaction: of its whole
 * scope (table NULL; a column scope only), or of table.column, which its
 * scope must cover.  Only in backfill; logged. */
static ks_err record_verify(ks_rollout_db *db, int64_t id, const char *table, const char *column,
                            const char *actor, int64_t now)
{
    if (db == NULL || !log_args_ok(actor, NULL) || (table != NULL && column == NULL))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    char reason[2 * KS_ROLLOUT_IDENT_MAX + 64];
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_in_phase(db, id, 1u << KS_PHASE_BACKFILL, &r);
    if (err == KS_OK && table == NULL && r.scope == KS_SCOPE_KEY)
        err = KS_ERR_INVALID_ARGUMENT; /* a key scope is verified column by column */
    if (err == KS_OK && table != NULL && !ks_rollout_scope_covers(&r, table, column))
        err = KS_ERR_NOT_FOUND;
    if (err == KS_OK)
        err = OPS(db)->set_verified(db->s, id, r.scope == KS_SCOPE_KEY ? table : NULL,
                                    r.scope == KS_SCOPE_KEY ? column : NULL, now);
    for (size_t i = 0; err == KS_OK && i < r.n_columns; i++) /* the schema's spelling */
        if (ks_rollout_name_cmp(r.columns[i].table, table) == 0 &&
            ks_rollout_name_cmp(r.columns[i].column, column) == 0)
            snprintf(reason, sizeof reason, "migrate verify passed for %s.%s",
                     r.columns[i].table, r.columns[i].column);
    if (err == KS_OK && r.scope == KS_SCOPE_COLUMN)
        snprintf(reason, sizeof reason, "migrate verify passed");
    if (err == KS_OK)
        err = log_append(db, id, now, actor, KS_PHASE_BACKFILL, KS_PHASE_BACKFILL, reason, 0);
    return txn_end(db, err);
}

/* See rollout.h. */
ks_err ks_rollout_db_record_verify(ks_rollout_db *db, int64_t id, const char *actor, int64_t now)
{
    return record_verify(db, id, NULL, NULL, actor, now);
}

/* See rollout.h. */
ks_err ks_rollout_db_record_verify_column(ks_rollout_db *db, int64_t id, const char *table,
                                          const char *column, const char *actor, int64_t now)
{
    if (table == NULL || column == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    return record_verify(db, id, table, column, actor, now);
}

/* ---- the log ------------------------------------------------------------------ */

/* See rollout.h. */
ks_err ks_rollout_db_note(ks_rollout_db *db, int64_t id, const char *actor, const char *reason,
                          int64_t now)
{
    if (db == NULL || reason == NULL || !printable_ok(reason, 1, KS_ROLLOUT_REASON_MAX) ||
        !log_args_ok(actor, reason))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_rollout(db, id, &r);
    if (err == KS_OK)
        err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, reason, 0);
    return txn_end(db, err);
}

/* See rollout.h: every row read back must be one the log accepts. */
ks_err ks_rollout_db_log(ks_rollout_db *db, int64_t rollout_id, int64_t after_id,
                         ks_rollout_log_entry *out, size_t max, size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (max == 0)
        return KS_OK;
    ks_err err = OPS(db)->log_list(db->s, rollout_id, after_id, out, max, n);
    for (size_t i = 0; err == KS_OK && i < *n; i++)
        if (!log_args_ok(out[i].actor, out[i].reason))
            err = KS_ERR_STORE;
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* ---- metrics --------------------------------------------------------------------- */

/* See rollout.h. */
ks_err ks_rollout_db_metrics_insert(ks_rollout_db *db, int64_t rollout_id,
                                    const char *instance_id, const char *source,
                                    const ks_health_sample *s)
{
    if (db == NULL || s == NULL || rollout_id <= 0 ||
        !ks_rollout_charset_ok(instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME) || source == NULL ||
        (strcmp(source, "app") != 0 && strcmp(source, "migrate") != 0))
        return KS_ERR_INVALID_ARGUMENT;
    const uint64_t counts[] = {s->seals,          s->opens,           s->auth_failures,
                               s->parse_errors,   s->provider_calls,  s->provider_errors,
                               s->seal_ns_sum,    s->open_ns_sum};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i] > INT64_MAX)
            return KS_ERR_INVALID_ARGUMENT;
    return OPS(db)->metrics_insert(db->s, rollout_id, instance_id, source, s);
}

/* See rollout.h. */
ks_err ks_rollout_db_metrics_sum(ks_rollout_db *db, int64_t rollout_id, int64_t since,
                                 ks_health_sample *out)
{
    return ks_rollout_db_metrics_sum_source(db, rollout_id, since, NULL, out);
}

/* See rollout.h. */
ks_err ks_rollout_db_metrics_sum_source(ks_rollout_db *db, int64_t rollout_id, int64_t since,
                                        const char *source, ks_health_sample *out)
{
    if (db == NULL || out == NULL ||
        (source != NULL && strcmp(source, "app") != 0 && strcmp(source, "migrate") != 0))
        return KS_ERR_INVALID_ARGUMENT;
    return OPS(db)->metrics_sum(db->s, rollout_id, since, source, out);
}
