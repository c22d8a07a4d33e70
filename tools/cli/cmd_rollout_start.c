/*
 * tools/cli/cmd_rollout_start.c -- `keyshift rollout start`: parse a rollout's scope,
 * source, target and thresholds, check the target key and record the
 * rollout in planned (docs/rollout.md, "Commands").
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_rollout.h"

/* A default documented in the manual and docs/rollout.md. */
#define DEFAULT_MIN_SOAK_S 300u

/* ---- start --------------------------------------------------------------------------- */

/* Parse a finite rate (a negative one disables its check). */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(d)) {
        return -1;
    }
    *out = d;
    return 0;
}

/*
 * Parse a class: "plaintext" (when may_be_plaintext) or
 * vF:ALG:KEY_ID:VERSION, the version after the last ':' since a key id
 * may contain ':'.  Checked with ks_rollout_class_check.
 */
static int parse_class(const char *s, int may_be_plaintext, ks_rollout_class *c)
{
    memset(c, 0, sizeof *c);
    if (strcmp(s, "plaintext") == 0) {
        c->is_plaintext = 1;
        return may_be_plaintext ? 0 : -1;
    }
    if (s[0] != 'v' || (s[1] != '1' && s[1] != '2') || s[2] != ':') {
        return -1;
    }
    c->version = (uint8_t)(s[1] - '0');
    const char *alg = s + 3, *colon = strchr(alg, ':');
    char name[32];
    if (colon == NULL || colon == alg || (size_t)(colon - alg) >= sizeof name) {
        return -1;
    }
    memcpy(name, alg, (size_t)(colon - alg));
    name[colon - alg] = '\0';
    c->algorithm = ks_alg_from_name(name);
    const char *key = colon + 1, *last = strrchr(key, ':');
    size_t v;
    if (c->algorithm == 0 || last == NULL || last == key || (size_t)(last - key) > KS_KEY_ID_MAX ||
        ks_cli_parse_size(last + 1, 1, UINT32_MAX, &v) != 0) {
        return -1;
    }
    memcpy(c->key_id, key, (size_t)(last - key));
    c->key_id[last - key] = '\0';
    c->key_version = (uint32_t)v;
    return ks_rollout_class_check(c, may_be_plaintext) == KS_OK ? 0 : -1;
}

/* Override the thresholds in *t with those the options give. */
int ks_cli_ro_parse_thresholds(const char *cmd, const ks_cli_ro_opts *o, ks_thresholds *t)
{
    const struct {
        const char *name, *value;
        double *out;
    } rates[] = {
        {"--max-auth-failure-rate", o->max_auth, &t->max_auth_failure_rate},
        {"--max-parse-error-rate", o->max_parse, &t->max_parse_error_rate},
        {"--max-provider-error-rate", o->max_provider, &t->max_provider_error_rate},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        if (rates[i].value != NULL && parse_rate(rates[i].value, rates[i].out) != 0) {
            return ks_cli_usage_error(cmd, "%s must be a number (a fraction: 0.001 is 0.1 %%; "
                                           "negative disables the check)", rates[i].name);
        }
    }
    const struct {
        const char *name, *value;
        uint64_t *out;
    } counts[] = {
        {"--max-seal-p99-us", o->max_seal, &t->max_seal_p99_us},
        {"--max-open-p99-us", o->max_open, &t->max_open_p99_us},
        {"--min-samples", o->min_samples, &t->min_samples},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        size_t v;
        if (counts[i].value == NULL) {
            continue;
        }
        if (ks_cli_parse_size(counts[i].value, 0, SIZE_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "%s must be a whole number (0 disables a latency "
                                           "check)", counts[i].name);
        }
        *counts[i].out = v;
    }
    if (o->window != NULL && (ks_cli_parse_duration(o->window, &t->window_s) != 0 || t->window_s == 0)) {
        return ks_cli_usage_error(cmd, "--window must be a duration of at least 1 s "
                                       "(300, 300s, 5m, 1h)");
    }
    return EX_OK;
}

/* Parse --columns T.C,T2.C2 into s's list (each split at its first '.';
 * names are checked against the schema by the store). */
static int parse_columns(const char *cmd, const char *list, ks_rollout *s)
{
    const char *p = list;
    s->n_columns = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        const char *dot = memchr(p, '.', n);
        if (s->n_columns == KS_ROLLOUT_COLUMNS_MAX || dot == NULL || dot == p ||
            dot + 1 == p + n || (size_t)(dot - p) > KS_ROLLOUT_IDENT_MAX ||
            (size_t)(p + n - dot - 1) > KS_ROLLOUT_IDENT_MAX) {
            return ks_cli_usage_error(cmd, "--columns must be 1 to %d TABLE.COLUMN names joined "
                                           "by ',' (names of at most %d bytes)",
                                      KS_ROLLOUT_COLUMNS_MAX, KS_ROLLOUT_IDENT_MAX);
        }
        ks_rollout_column *c = &s->columns[s->n_columns++];
        memcpy(c->table, p, (size_t)(dot - p));
        c->table[dot - p] = '\0';
        memcpy(c->column, dot + 1, (size_t)(p + n - dot - 1));
        c->column[p + n - dot - 1] = '\0';
        if (comma == NULL) {
            return EX_OK;
        }
        p = comma + 1;
    }
}

/* The scope of `start`: --table and --column, or --key-id and --columns
 * (the key_id must then be the source's and the target's). */
static int start_scope(const char *cmd, const ks_cli_ro_opts *o, ks_rollout *s)
{
    if (o->key_id != NULL || o->columns != NULL) {
        if (o->key_id == NULL || o->columns == NULL || o->table != NULL || o->column != NULL) {
            return ks_cli_usage_error(cmd, "a key scope is --key-id K --columns T.C[,T2.C2...], "
                                           "without --table and --column");
        }
        s->scope = KS_SCOPE_KEY;
        return parse_columns(cmd, o->columns, s);
    }
    if (o->table == NULL || o->column == NULL) {
        return ks_cli_usage_error(cmd, "--table and --column (or --key-id and --columns) are "
                                       "required");
    }
    if (strlen(o->table) > KS_ROLLOUT_IDENT_MAX || strlen(o->column) > KS_ROLLOUT_IDENT_MAX) {
        return ks_cli_usage_error(cmd, "table and column names are at most %d bytes",
                                  KS_ROLLOUT_IDENT_MAX);
    }
    memcpy(s->table, o->table, strlen(o->table) + 1);
    memcpy(s->column, o->column, strlen(o->column) + 1);
    return EX_OK;
}

/* Build the spec of `start` from the options. */
static int start_spec(const char *cmd, const ks_cli_ro_opts *o, ks_rollout *s)
{
    memset(s, 0, sizeof *s);
    int rc = start_scope(cmd, o, s);
    if (rc != EX_OK) {
        return rc;
    }
    if (o->source == NULL || o->target == NULL) {
        return ks_cli_usage_error(cmd, "--source and --target are required");
    }
    if (parse_class(o->source, 1, &s->source) != 0) {
        return ks_cli_usage_error(cmd, "--source must be plaintext or vF:ALG:KEY_ID:VERSION, "
                                       "e.g. v2:xchacha20-poly1305:payments/kek:1");
    }
    if (parse_class(o->target, 0, &s->target) != 0) {
        return ks_cli_usage_error(cmd, "--target must be vF:ALG:KEY_ID:VERSION, e.g. "
                                       "v2:xchacha20-poly1305:payments/kek:2");
    }
    if (ks_rollout_class_equal(&s->source, &s->target)) {
        return ks_cli_usage_error(cmd, "--source and --target are the same class");
    }
    if (s->scope == KS_SCOPE_KEY && s->source.is_plaintext) {
        return ks_cli_usage_error(cmd, "a key scope needs an envelope --source: plaintext has "
                                       "no key_id");
    }
    if (s->scope == KS_SCOPE_KEY && (strcmp(s->source.key_id, o->key_id) != 0 ||
                                     strcmp(s->target.key_id, o->key_id) != 0)) {
        return ks_cli_usage_error(cmd, "--key-id %s must be the key id of --source and --target "
                                       "(a key-scoped rollout keeps its key_id)", o->key_id);
    }
    s->min_soak_s = DEFAULT_MIN_SOAK_S;
    s->reader_ttl_s = KS_CLI_RO_DEFAULT_READER_TTL_S;
    if (o->min_soak != NULL && ks_cli_parse_duration(o->min_soak, &s->min_soak_s) != 0) {
        return ks_cli_usage_error(cmd, "--min-soak must be a duration (300, 300s, 5m, 1h)");
    }
    if (o->reader_ttl != NULL &&
        (ks_cli_parse_duration(o->reader_ttl, &s->reader_ttl_s) != 0 || s->reader_ttl_s == 0)) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration of at least 1 s");
    }
    if ((rc = ks_cli_parse_encoding(cmd, o->encoding, &s->encoding)) != EX_OK) {
        return rc;
    }
    s->canary.kind = KS_CANARY_ALL;
    ks_thresholds_default(&s->thresholds);
    return ks_cli_ro_parse_thresholds(cmd, o, &s->thresholds);
}

/* Before start: ask the key provider about the target key version, which
 * must exist and be active (only an active version seals).  Returns
 * EX_OK, EX_DATAERR saying what is wrong, or the provider's error. */
static int check_target_key(const char *cmd, const ks_cli_ro_opts *o, const ks_rollout_class *t)
{
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    int opened = 0, state = 0, primary = 0;
    char why[KS_KEY_ID_MAX + 64];
    snprintf(why, sizeof why, "start checks target key %s:%" PRIu32 " with the key provider",
             t->key_id, t->key_version);
    int rc = ks_cli_ro_keyring_for(cmd, o, 1, why, &keys, &opened, &ctx);
    if (rc == EX_OK) {
        rc = ks_cli_ro_key_fact(ctx, t, &state, &primary);
    }
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    if (rc != EX_OK) {
        return rc;
    }
    if (state == KS_ROLLOUT_KEY_MISSING) {
        ks_cli_error("target key %s:%" PRIu32 " does not exist in the key provider: check "
                     "--target ('keyshift keys list'), or create the version first with "
                     "'keyshift keys add-version %s'", t->key_id, t->key_version, t->key_id);
        return EX_DATAERR;
    }
    if (state != KS_KEY_ACTIVE) {
        ks_cli_error("target key %s:%" PRIu32 " is %s, so nothing can be sealed under it: "
                     "choose an active version for --target", t->key_id, t->key_version,
                     ks_key_state_name(state));
        return EX_DATAERR;
    }
    return EX_OK;
}

/* Before a start with --encoding base64: open each column of s's scope
 * as its census will (read-only, in that encoding), so that a column
 * that cannot hold base64 text (a PostgreSQL column that is not text or
 * varchar) is refused now rather than found by a census in a later
 * phase, where the rollout could neither finalize nor go back.  EX_OK,
 * or the store's exit code after its message. */
static int check_text_columns(const ks_cli_ro_opts *o, const ks_rollout *s)
{
    size_t n = s->scope == KS_SCOPE_KEY ? s->n_columns : 1;
    int rc = EX_OK;
    for (size_t i = 0; rc == EX_OK && s->encoding == KS_ENCODING_BASE64 && i < n; i++) {
        ks_rowstore_target t = {.encoding = s->encoding};
        t.table = s->scope == KS_SCOPE_KEY ? s->columns[i].table : s->table;
        t.column = s->scope == KS_SCOPE_KEY ? s->columns[i].column : s->column;
        ks_rowstore store;
        rc = ks_cli_store_open(o->db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store);
        if (rc == EX_OK) {
            ks_rowstore_close(&store);
        }
    }
    return rc;
}

/* `rollout start`. */
int ks_cli_ro_cmd_start(int argc, char **argv)
{
    static const char cmd[] = "rollout start";
    ks_cli_ro_opts o;
    int rc;
    if (ks_cli_ro_parse(cmd, argc, argv,
                        "--table --column --key-id --columns --source --target --min-soak "
                        "--reader-ttl --max-auth-failure-rate --max-parse-error-rate "
                        "--max-provider-error-rate --max-seal-p99-us --max-open-p99-us "
                        "--min-samples --window --actor --reason --keyring --passphrase-file "
                        "--providers --encoding",
                        &o, &rc)) {
        return rc;
    }
    ks_rollout s;
    if ((rc = start_spec(cmd, &o, &s)) != EX_OK || (rc = check_text_columns(&o, &s)) != EX_OK) {
        return rc;
    }
    ks_rollout_db *db;
    if ((rc = ks_cli_rollout_open(o.db, 0, &db)) != EX_OK) {
        return rc;
    }
    if ((rc = check_target_key(cmd, &o, &s.target)) != EX_OK) {
        ks_rollout_db_close(db);
        return rc;
    }
    int64_t id = 0, now = (int64_t)time(NULL);
    char msg[512] = "";
    ks_err e = ks_rollout_db_start(db, &s, o.actor_buf, now, &id, msg, sizeof msg);
    char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
    ks_rollout_scope_text(&s, scope, sizeof scope);
    if (e != KS_OK) {
        ks_rollout_db_close(db);
        ks_cli_error("cannot start a rollout of %s: %s", scope, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (o.reason != NULL && o.reason[0] != '\0' &&
        (e = ks_rollout_db_note(db, id, o.actor_buf, o.reason, now)) != KS_OK) {
        ks_cli_error("warning: rollout %" PRId64 " started, but its reason was not logged: %s",
                     id, ks_err_name(e));
    }
    ks_rollout_db_close(db);
    if (o.json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"planned\"}\n", id);
    } else {
        printf("%" PRId64 "\n", id);
        char src[KS_CLI_RO_CLASS_TEXT_MAX], dst[KS_CLI_RO_CLASS_TEXT_MAX];
        fprintf(stderr, KS_PROG ": rollout %" PRId64 " of %s is planned: %s -> %s (%s); next: "
                "'keyshift rollout advance --db %s --rollout %" PRId64 "'\n", id, scope,
                ks_cli_ro_class_str(&s.source, src, sizeof src),
                ks_cli_ro_class_str(&s.target, dst, sizeof dst),
                ks_value_encoding_name((int)s.encoding), o.db, id);
    }
    return EX_OK;
}
