/*
 * tools/cli/cmd_migrate_check.c -- `keyshift migrate verify` (open every
 * envelope of a column, or a sample, and record a clean pass with the
 * rollouts that need one) and `keyshift migrate quarantine list|release`
 * (docs/migration.md).  Nothing they print carries a value: row ids,
 * error names and counts only.
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

/* What verify keeps while reporting failures. */
typedef struct verify_state {
    int json;
    uint64_t reported;
} verify_state;

/* Report one row that did not open: its id and error, never its value. */
static void on_failure(void *arg, const ks_verify_failure *f)
{
    verify_state *s = arg;
    s->reported++;
    if (s->json) {
        printf("{\"id\":");
        ks_cli_put_value(stdout, &f->id, 1);
        printf(",\"error\":\"%s\"}\n", f->name);
    } else {
        printf("FAILED id ");
        ks_cli_put_value(stdout, &f->id, 0);
        printf(": %s\n", f->name);
    }
}

/* Record the pass of a complete verify of o's column in rollout r of
 * db: the column of a key scope, or the whole column scope. */
static int record_one(ks_rollout_db *db, const ks_cli_mig_opts *o, const ks_rollout *r,
                      const char *actor)
{
    int64_t now = (int64_t)time(NULL);
    ks_err e = r->scope == KS_SCOPE_KEY
                   ? ks_rollout_db_record_verify_column(db, r->id, o->table, o->column, actor, now)
                   : ks_rollout_db_record_verify(db, r->id, actor, now);
    if (e != KS_OK) {
        ks_cli_error("verify passed but was not recorded for rollout %lld (%s.%s): %s",
                     (long long)r->id, o->table, o->column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (r->scope == KS_SCOPE_KEY) {
        fprintf(stderr, KS_PROG ": verify pass recorded for rollout %lld (backfill, key %s) "
                "for %s.%s: it may be finalized once every column it lists is verified\n",
                (long long)r->id, r->source.key_id, o->table, o->column);
    } else {
        fprintf(stderr, KS_PROG ": verify pass recorded for rollout %lld (backfill): it may now "
                "be finalized with 'keyshift rollout advance'\n", (long long)r->id);
    }
    return EX_OK;
}

/* After a complete verify that found no failure: record the pass in each
 * rollout in backfill that governs the column (its own, or a key-scoped
 * one for its key_id), so that it may be finalized.  A verify confined to
 * one key (--from-key) opened only that key's envelopes, so it counts
 * only for a key-scoped rollout of that key.  Looked up read-only first,
 * so a database without rollouts is not changed. */
static int record_verify(const ks_cli_mig_opts *o)
{
    ks_rollout_db *db = NULL;
    ks_rollout *rs = NULL;
    size_t n = 0;
    char actor[KS_ROLLOUT_ACTOR_MAX + 1];
    int rc = ks_cli_mig_covering_rollouts(o, &rs, &n);
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *r = &rs[i];
        const char *key = r->scope == KS_SCOPE_KEY ? r->source.key_id : NULL;
        if (r->phase != KS_PHASE_BACKFILL ||
            ks_rollout_scope_find(rs, n, o->table, o->column, key) != r ||
            (o->from_key != NULL && (key == NULL || strcmp(key, o->from_key) != 0))) {
            continue;
        }
        if (db == NULL && ((rc = ks_cli_actor("migrate verify", NULL, actor, sizeof actor)) !=
                               EX_OK ||
                           (rc = ks_cli_rollout_open(o->db, 0, &db)) != EX_OK)) {
            break;
        }
        rc = record_one(db, o, r, actor);
    }
    ks_rollout_db_close(db);
    free(rs);
    return rc;
}

/* See cmd_migrate.h. */
int ks_cli_migrate_verify(int argc, char **argv)
{
    static const char cmd[] = "migrate verify";
    ks_cli_mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (ks_cli_mig_parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = ks_cli_mig_only_options(cmd, &o, " --tenant-column --tenant --context --purpose --sample "
                                    "--keyring --passphrase-file --providers --id-column "
                                    "--from-key --encoding ")) != EX_OK) {
        return rc;
    }
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    ks_rowstore_target t;
    char names[KS_CONTEXT_TEMPLATE_MAX];
    if ((rc = ks_cli_mig_common_params(cmd, &o, &p, &t, names)) != EX_OK) {
        return rc;
    }
    size_t sample = 0;
    if (o.sample != NULL && ks_cli_parse_size(o.sample, 1, SIZE_MAX, &sample) != 0) {
        return ks_cli_usage_error(cmd, "--sample must be a number from 1");
    }
    if ((rc = ks_cli_mig_check_encoding(cmd, &o, p.encoding)) != EX_OK) {
        return rc;
    }
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    verify_state s = {o.json, 0};
    ks_verify_result r = {0, 0, 0};
    if ((rc = ks_cli_store_open(o.db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store)) == EX_OK &&
        (rc = ks_cli_check_context(cmd, &store, o.table, o.context)) == EX_OK &&
        (rc = ks_cli_ctx_open(cmd, o.keyring, o.passfile, o.providers, &keys, &ctx)) == EX_OK) {
        ks_err e = ks_migrate_verify(ctx, &store, &p, sample, on_failure, &s, &r);
        if (e != KS_OK) {
            ks_cli_error("verify of %s.%s stopped: %s", o.table, o.column, ks_err_name(e));
            rc = ks_cli_exit_code(e);
        } else {
            rc = r.failed ? EX_DATAERR : EX_OK;
        }
        if (rc == EX_OK && sample == 0) {
            rc = record_verify(&o);
        }
        if (o.json) {
            printf("{\"checked\":%llu,\"failed\":%llu,\"skipped\":%llu,\"result\":\"%s\"}\n",
                   (unsigned long long)r.checked, (unsigned long long)r.failed,
                   (unsigned long long)r.skipped, e != KS_OK ? ks_err_name(e) : r.failed ? "failed" : "ok");
        } else {
            printf("%llu envelopes checked, %llu failed, %llu rows skipped (%s)\n",
                   (unsigned long long)r.checked, (unsigned long long)r.failed,
                   (unsigned long long)r.skipped,
                   o.from_key != NULL ? "NULL, plaintext or another key" : "NULL or plaintext");
        }
    }
    ks_rowstore_close(&store);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}


/* Manual of `keyshift migrate quarantine`. */
static void quarantine_usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift migrate quarantine - list and release a column's quarantined rows\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift migrate quarantine list --db DB --table T --column C\n"
          "        [--id-column I] [--encoding binary|base64] [--json]\n"
          "    keyshift migrate quarantine release --db DB --table T --column C\n"
          "        (--id ID | --error NAME | --id ID --error NAME | --all)\n"
          "        [--id-column I] [--busy-timeout MS] [--encoding binary|base64] [--json]\n"
          "\n"
          "DESCRIPTION\n"
          "    A run quarantines a row that does not parse or open (keyshift_quarantine)\n"
          "    and never modifies it. Quarantine belongs to the migration that put the\n"
          "    row there (its mode, keys, context template, purpose, tenant...): a\n"
          "    run with other parameters, such as the corrected command after a run\n"
          "    with a wrong --context, tries the row again and quarantines it again,\n"
          "    under its own parameters, only if it fails again. Rows quarantined\n"
          "    before quarantine kept its migration hold back every migration until\n"
          "    released.\n"
          "    list     prints each quarantined row of column C: its id, the error\n"
          "             name, when, and the parameters of the migration that\n"
          "             quarantined it; with --json one object per line,\n"
          "             {\"id\":...,\"error\":...,\"migration\":...|null,\"time\":...}.\n"
          "             Read-only.\n"
          "    release  deletes the selected rows' quarantine entries, in one\n"
          "             transaction, so that the next run of their migration tries\n"
          "             them again (rows that still fail are quarantined again). The\n"
          "             rows themselves are never touched. --id ID selects one row\n"
          "             (a decimal number is an integer id, anything else a text\n"
          "             id), --error NAME the rows quarantined under that error name\n"
          "             (auth-failed, bad-tenant, bad-context, a parse error...),\n"
          "             both the rows matching both, --all every row of the column;\n"
          "             without one of them it is refused (exit 64). Each release is\n"
          "             logged on standard error: who ($USER@host), the column, the\n"
          "             selector and how many rows; with --json {\"released\":N} on\n"
          "             standard output.\n"
          "\n"
          "EXIT STATUS\n"
          "    0   listed (also when nothing is in quarantine), or released\n"
          "    64  usage error (release without a selector, --all with another one)\n"
          "    66  no such database, table or column\n"
          "    69  the PostgreSQL database cannot be reached\n"
          "    74  database error (nothing released); list: a malformed entry\n"
          "    75  the database stayed locked past --busy-timeout (nothing released)\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift migrate quarantine list --db shop.db --table payments --column card\n"
          "    keyshift migrate quarantine release --db shop.db --table payments \\\n"
          "        --column card --error auth-failed\n",
          f);
}

/* What `migrate quarantine list` keeps while printing. */
typedef struct qlist_state {
    int json;
    uint64_t n;
} qlist_state;

/* Print one quarantine entry (ks_rowstore_quarantine_fn): a line, or a
 * JSON object per line; text read back from the database is printed
 * with non-printable bytes as '?' (JSON: escaped). */
static int print_entry(void *arg, const ks_quarantine_entry *e)
{
    qlist_state *l = arg;
    char when[32];
    ks_cli_format_time(e->time, when, sizeof when);
    ks_value error = {KS_VALUE_TEXT, 0, e->error}, params = {KS_VALUE_TEXT, 0, e->params};
    if (l->json) {
        printf("{\"id\":");
        ks_cli_put_value(stdout, &e->id, 1);
        printf(",\"error\":");
        ks_cli_put_json_string(stdout, e->error.ptr, e->error.len);
        printf(",\"migration\":");
        if (e->params.len > 0) {
            ks_cli_put_json_string(stdout, e->params.ptr, e->params.len);
        } else {
            printf("null");
        }
        printf(",\"time\":\"%s\"}\n", when);
    } else {
        printf("id ");
        ks_cli_put_value(stdout, &e->id, 0);
        printf("  ");
        ks_cli_put_value(stdout, &error, 0);
        printf("  %s  migration ", when);
        if (e->params.len > 0) {
            ks_cli_put_value(stdout, &params, 0);
        } else {
            printf("(any: recorded before quarantine kept its migration)");
        }
        fputc('\n', stdout);
    }
    l->n++;
    return 0;
}

/* The id of --id: an INTEGER when it is canonical decimal (the rowid, an
 * INTEGER or PostgreSQL key), else TEXT (a TEXT key). */
static ks_value id_of(const char *text)
{
    ks_value v = {KS_VALUE_TEXT, 0, ks_cli_mig_str_view(text)};
    char *end = NULL, canon[24];
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (errno == 0 && end != text && *end == '\0' &&
        snprintf(canon, sizeof canon, "%lld", n) > 0 && strcmp(canon, text) == 0) {
        v = (ks_value){KS_VALUE_INTEGER, (int64_t)n, {NULL, 0}};
    }
    return v;
}

/* Delete the quarantine entries o selects from store, in one
 * transaction, and log it on stderr (who, what, how many). */
static int release_entries(const ks_rowstore *store, const ks_cli_mig_opts *o, const ks_value *id)
{
    static const char cmd[] = "migrate quarantine release";
    char actor[KS_ROLLOUT_ACTOR_MAX + 1];
    int rc = ks_cli_actor(cmd, NULL, actor, sizeof actor);
    if (rc != EX_OK) {
        return rc;
    }
    ks_quarantine_select sel = {id, o->error, o->all};
    uint64_t released = 0;
    ks_err e = store->ops->begin(store->self);
    if (e == KS_OK) {
        e = store->ops->quarantine_release(store->self, &sel, &released);
    }
    if (e == KS_OK) {
        e = store->ops->commit(store->self);
    }
    if (e != KS_OK) {
        store->ops->rollback(store->self);
        ks_cli_error("cannot release quarantined rows of %s.%s: %s (nothing was released)",
                     o->table, o->column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    char what[160];
    if (o->all) {
        snprintf(what, sizeof what, "all");
    } else {
        snprintf(what, sizeof what, "%s%.64s%s%s%s", o->id != NULL ? "id " : "",
                 o->id != NULL ? o->id : "", o->id != NULL && o->error != NULL ? " and " : "",
                 o->error != NULL ? "error " : "", o->error != NULL ? o->error : "");
    }
    for (char *c = what; *c != '\0'; c++) {
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c; /* --id is the operator's text */
    }
    fprintf(stderr,
            KS_PROG " %s: %s released %llu row(s) of %s.%s from quarantine (selected: %s); "
            "the next run of a migration tries them again\n",
            cmd, actor, (unsigned long long)released, o->table, o->column, what);
    if (o->json) {
        printf("{\"released\":%llu}\n", (unsigned long long)released);
    }
    return EX_OK;
}

/* Nonzero when s may be an error name: 1..128 of [a-z0-9-]. */
static int error_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 128 && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

/* See cmd_migrate.h. */
int ks_cli_migrate_quarantine(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        quarantine_usage(stdout);
        ks_cli_help_footer(stdout, "migrate quarantine");
        return EX_OK;
    }
    if (argc < 2 || (strcmp(argv[1], "list") != 0 && strcmp(argv[1], "release") != 0)) {
        return ks_cli_usage_error("migrate quarantine", "list or release is required");
    }
    int release = strcmp(argv[1], "release") == 0;
    const char *cmd = release ? "migrate quarantine release" : "migrate quarantine list";
    ks_cli_mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            quarantine_usage(stdout);
            ks_cli_help_footer(stdout, "migrate quarantine");
            return EX_OK;
        }
    }
    if (ks_cli_mig_parse(cmd, argc - 1, argv + 1, &o, &rc)) {
        return rc;
    }
    if ((rc = ks_cli_mig_only_options(cmd, &o, release ? " --id-column --id --error --all --busy-timeout "
                                              "--encoding "
                                            : " --id-column --encoding ")) != EX_OK) {
        return rc;
    }
    if (o.db == NULL || o.table == NULL || o.column == NULL) {
        return ks_cli_usage_error(cmd, "--db, --table and --column are required");
    }
    if (release && !o.all && o.id == NULL && o.error == NULL) {
        return ks_cli_usage_error(cmd, "say which rows: --id ID, --error NAME (both: rows "
                                       "matching both), or --all");
    }
    if (o.all && (o.id != NULL || o.error != NULL)) {
        return ks_cli_usage_error(cmd, "--all releases every row; give it alone");
    }
    if (o.error != NULL && !error_name_ok(o.error)) {
        return ks_cli_usage_error(cmd, "--error must be an error name such as auth-failed");
    }
    if (o.id != NULL && o.id[0] == '\0') {
        return ks_cli_usage_error(cmd, "--id must not be empty");
    }
    size_t busy = 30000;
    if (o.busy_timeout != NULL && ks_cli_parse_size(o.busy_timeout, 0, 86400000, &busy) != 0) {
        return ks_cli_usage_error(cmd, "--busy-timeout must be milliseconds (0..86400000)");
    }
    if ((rc = ks_cli_db_check(o.db, NULL)) != EX_OK) {
        return rc;
    }
    ks_rowstore_target t = {.table = o.table, .column = o.column, .id_column = o.id_column};
    if ((rc = ks_cli_parse_encoding(cmd, o.encoding, &t.encoding)) != EX_OK) {
        return rc;
    }
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    if ((rc = ks_cli_store_open(o.db, &t, !release, (uint32_t)busy, KS_SQLITE_SYNC_FULL,
                                &store)) != EX_OK) {
        return rc;
    }
    if (release) {
        ks_value id = o.id != NULL ? id_of(o.id) : (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
        rc = release_entries(&store, &o, o.id != NULL ? &id : NULL);
    } else {
        qlist_state l = {o.json, 0};
        ks_err e = store.ops->quarantine_list(store.self, print_entry, &l);
        if (e != KS_OK) {
            ks_cli_error("cannot read the quarantine of %s.%s: %s", o.table, o.column,
                         ks_err_name(e));
            rc = ks_cli_exit_code(e);
        } else if (l.n == 0 && !o.json) {
            fprintf(stderr, KS_PROG " %s: no row of %s.%s is in quarantine\n", cmd, o.table,
                    o.column);
        }
    }
    ks_rowstore_close(&store);
    return rc;
}
