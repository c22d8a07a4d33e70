/*
 * tools/cli/cmd_rollout_phase.c -- the subcommands that move a rollout: advance,
 * rollback, canary, abort and set, and the transition they make through
 * the library's guard (docs/rollout.md, "Commands").
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "cmd_rollout.h"

/* ---- canaries and transitions ------------------------------------------------------ */

/* Parse the canary options (at most one of --tenants, --percent, --all)
 * into c; *given says whether any was. */
static int parse_canary(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_canary *c, int *given)
{
    memset(c, 0, sizeof *c);
    int n = (o->tenants != NULL) + (o->percent != NULL) + (o->all != 0);
    *given = n > 0;
    if (n > 1) {
        return ks_cli_usage_error(cmd, "give one of --tenants, --percent and --all");
    }
    c->kind = KS_CANARY_ALL;
    if (o->percent != NULL) {
        size_t p;
        if (ks_cli_parse_size(o->percent, 0, 100, &p) != 0) {
            return ks_cli_usage_error(cmd, "--percent must be a whole number from 0 to 100");
        }
        c->kind = KS_CANARY_PERCENT;
        c->percent = (uint32_t)p;
    }
    if (o->tenants != NULL) {
        c->kind = KS_CANARY_TENANTS;
        const char *p = o->tenants;
        for (;;) {
            size_t len = strcspn(p, ",");
            if (len == 0 || len > KS_TENANT_MAX || c->n_tenants == KS_ROLLOUT_TENANTS_MAX) {
                return ks_cli_usage_error(cmd, "--tenants takes 1..%d comma-separated tenants of "
                                               "1..%d bytes each", KS_ROLLOUT_TENANTS_MAX,
                                          KS_TENANT_MAX);
            }
            memcpy(c->tenants[c->n_tenants], p, len);
            c->tenants[c->n_tenants++][len] = '\0';
            if (p[len] == '\0') {
                break;
            }
            p += len + 1;
        }
    }
    return EX_OK;
}

/* Nonzero when canaries a and b say the same. */
static int canary_equal(const ks_rollout_canary *a, const ks_rollout_canary *b)
{
    if (a->kind != b->kind) {
        return 0;
    }
    if (a->kind == KS_CANARY_PERCENT) {
        return a->percent == b->percent;
    }
    if (a->kind == KS_CANARY_TENANTS) {
        if (a->n_tenants != b->n_tenants) {
            return 0;
        }
        for (size_t i = 0; i < a->n_tenants; i++) {
            if (strcmp(a->tenants[i], b->tenants[i]) != 0) {
                return 0;
            }
        }
    }
    return 1;
}

/* Report the outcome of a transition attempt; returns the exit code. */
static int report_transition(const char *cmd, const ks_rollout *r, ks_rollout_phase to, ks_err e,
                             const char *why, int json)
{
    const char *from = ks_rollout_phase_name((int)r->phase), *tn = ks_rollout_phase_name((int)to);
    int rc = e == KS_ERR_STATE ? EX_DATAERR : ks_cli_exit_code(e);
    if (json) {
        printf("{\"rollout\":%" PRId64 ",\"from\":\"%s\",\"to\":\"%s\",\"result\":\"%s\","
               "\"reason\":", r->id, from, tn, e == KS_OK ? "ok" : ks_err_name(e));
        ks_cli_ro_put_str(e == KS_OK ? "" : why[0] ? why : ks_err_name(e));
        printf(",\"exit\":%d}\n", rc);
    }
    if (e == KS_OK) {
        if (!json) {
            printf("rollout %" PRId64 ": %s -> %s\n", r->id, from, tn);
        }
        return EX_OK;
    }
    if (e == KS_ERR_GUARD) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot go from %s to %s yet: %s\n",
                cmd, r->id, from, tn, why);
    } else if (e == KS_ERR_STALE) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " was moved by someone else meanwhile; "
                "look at 'keyshift rollout status' and retry\n", cmd, r->id);
    } else {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot go from %s to %s: %s\n", cmd,
                r->id, from, tn, why[0] ? why : ks_err_name(e));
    }
    return rc;
}

/* Make the transition of r to `to` with facts f. */
static int transition(const char *cmd, ks_rollout_db *db, const ks_rollout *r, ks_rollout_phase to,
                      ks_rollout_facts *f, const ks_cli_ro_opts *o, int automatic,
                      const char *reason)
{
    char why[1024] = "";
    ks_rollout_change c = {r->id, r->phase, to, o->actor_buf, reason, automatic};
    ks_err e = ks_rollout_db_transition(db, &c, f, why, sizeof why);
    return report_transition(cmd, r, to, e, why, o->json);
}

/* ---- advance ----------------------------------------------------------------------- */

/* The phase after p, or 0 after finalized. */
static ks_rollout_phase next_phase(ks_rollout_phase p)
{
    return p < KS_PHASE_FINALIZED ? (ks_rollout_phase)(p + 1) : (ks_rollout_phase)0;
}

/* Nonzero when finalizing r retires a key version: the source is an
 * envelope class whose key version is not also the target's (a format or
 * algorithm upgrade keeps using the same key version). */
static int source_retires(const ks_rollout *r)
{
    const ks_rollout_class *s = &r->source, *t = &r->target;
    return !s->is_plaintext &&
           !(strcmp(s->key_id, t->key_id) == 0 && s->key_version == t->key_version);
}

/* Before finalizing with a keyring: the source key version will become
 * decrypt-only, which the keyring refuses for a primary.  Returns EX_OK
 * (with *retire set when the source is active) or EX_TEMPFAIL saying
 * what to promote first. */
static int finalize_precheck(const char *cmd, ks_ctx *ctx, const ks_rollout *r, int *retire)
{
    int state, primary;
    int rc = ks_cli_ro_key_fact(ctx, &r->source, &state, &primary);
    *retire = 0;
    if (rc != EX_OK || state == KS_ROLLOUT_KEY_MISSING) {
        return rc;
    }
    if (primary) {
        const ks_rollout_class *s = &r->source, *t = &r->target;
        int same = strcmp(s->key_id, t->key_id) == 0;
        fprintf(stderr, KS_PROG " %s: source key %s:%" PRIu32 " is still the primary of %s, so "
                "it cannot become decrypt-only; first run 'keyshift keys promote %s %" PRIu32
                "'%s, then advance again\n", cmd, s->key_id, s->key_version, s->key_id,
                s->key_id, same ? t->key_version : s->key_version + 1,
                same ? " (the target)" : " (or another active version of that key)");
        return EX_TEMPFAIL;
    }
    *retire = state == KS_KEY_ACTIVE;
    return EX_OK;
}

/* After finalizing: move the source key version to decrypt-only. */
static int retire_source(const ks_cli_keys *keys, const ks_rollout *r)
{
    const ks_rollout_class *s = &r->source;
    ks_bytes id = {(const uint8_t *)s->key_id, strlen(s->key_id)};
    const ks_provider_admin_ops *a = keys->prov.ops->admin;
    ks_err e = a == NULL ? KS_ERR_DENIED
                         : a->set_state(keys->prov.self, id, s->key_version, KS_KEY_DECRYPT_ONLY, 0);
    if (e != KS_OK) {
        ks_cli_error("rollout %" PRId64 " is finalized, but source key %s:%" PRIu32 " did not "
                     "become decrypt-only: %s; run 'keyshift keys set-state %s %" PRIu32
                     " decrypt-only'", r->id, s->key_id, s->key_version, ks_err_name(e),
                     s->key_id, s->key_version);
        return ks_cli_exit_code(e);
    }
    fprintf(stderr, KS_PROG ": source key %s:%" PRIu32 " is now decrypt-only\n", s->key_id,
            s->key_version);
    return EX_OK;
}

/* Gather what the guard of r -> to needs into f: key states (ctx), the
 * census, the health.  Facts not needed stay unknown. */
static int gather_facts(const ks_cli_ro_opts *o, ks_rollout_db *db, ks_ctx *ctx,
                        const ks_rollout *r, ks_rollout_phase to, ks_rollout_facts *f)
{
    int rc = EX_OK, primary;
    memset(f, 0, sizeof *f);
    f->now = (int64_t)time(NULL);
    if (r->phase == KS_PHASE_PLANNED && to == KS_PHASE_READ_COMPAT) {
        rc = ks_cli_ro_key_fact(ctx, &r->target, &f->target_key_state, &primary);
    } else if (r->phase == KS_PHASE_FINALIZED && to == KS_PHASE_BACKFILL && ctx != NULL &&
               !r->source.is_plaintext) {
        rc = ks_cli_ro_key_fact(ctx, &r->source, &f->source_key_state, &primary);
    } else if (r->phase == KS_PHASE_WRITE_UPGRADE && to == KS_PHASE_BACKFILL) {
        ks_health_sample sum;
        ks_health_verdict v;
        rc = ks_cli_ro_health_of(db, r, f->now, &sum, &v);
        f->health_known = rc == EX_OK;
        f->health = v.status;
        char t[512];
        if (rc == EX_OK && v.status == KS_HEALTH_TRIPPED) {
            ks_cli_ro_tripped_str(&v, &r->thresholds, t, sizeof t);
            fprintf(stderr, KS_PROG ": tripped: %s\n", t);
        } else if (rc == EX_OK && v.status == KS_HEALTH_INSUFFICIENT && v.no_data != 0) {
            ks_cli_ro_no_data_str(&v, t, sizeof t);
            fprintf(stderr, KS_PROG ": no data in the window for: %s (disable a check the "
                    "application cannot feed with 'keyshift rollout set')\n", t);
        }
    } else if ((r->phase == KS_PHASE_BACKFILL && to == KS_PHASE_FINALIZED) ||
               (r->phase == KS_PHASE_READ_COMPAT && to == KS_PHASE_PLANNED)) {
        ks_cli_ro_scope_census c;
        rc = ks_cli_ro_census_of(o->db, r, &c);
        f->census_known = c.known;
        f->rows_at_source = c.at_source;
        f->rows_at_target = c.at_target;
    }
    return rc;
}

/* Set the canary of r for write-upgrade when it differs (logged). */
static int apply_canary(ks_rollout_db *db, const ks_rollout *r, const ks_rollout_canary *c,
                        const ks_cli_ro_opts *o)
{
    if (canary_equal(&r->canary, c)) {
        return EX_OK;
    }
    ks_err e = ks_rollout_db_set_canary(db, r->id, c, o->actor_buf, (int64_t)time(NULL));
    if (e != KS_OK) {
        ks_cli_error("cannot set the canary of rollout %" PRId64 ": %s", r->id,
                     e == KS_ERR_INVALID_ARGUMENT ? "invalid tenants (distinct, 1..64 bytes of "
                                                    "[A-Za-z0-9._:/@+=-])" : ks_err_name(e));
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* The advance itself, with the database and keyring open. */
static int advance(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                   const ks_cli_keys *keys, ks_ctx *ctx, const ks_rollout_canary *canary)
{
    ks_rollout_phase to = next_phase(r->phase);
    ks_rollout_facts f;
    int rc = gather_facts(o, db, ctx, r, to, &f), retire = 0;
    if (rc != EX_OK) {
        return rc;
    }
    if (to == KS_PHASE_FINALIZED && ctx != NULL && source_retires(r)) {
        /* the guard first (pure), so its refusal wins over key advice */
        char why[1024] = "";
        f.rollout = *r;
        f.is_latest = 1;
        ks_err e = ks_rollout_guard(&f, to, why, sizeof why);
        if (e != KS_OK) {
            return report_transition(cmd, r, to, e, why, o->json);
        }
        if ((rc = finalize_precheck(cmd, ctx, r, &retire)) != EX_OK) {
            return rc;
        }
    }
    if (to == KS_PHASE_WRITE_UPGRADE && (rc = apply_canary(db, r, canary, o)) != EX_OK) {
        return rc;
    }
    rc = transition(cmd, db, r, to, &f, o, 0, o->reason);
    if (rc == EX_OK && retire) {
        rc = retire_source(keys, r);
    } else if (rc == EX_OK && to == KS_PHASE_FINALIZED && source_retires(r) && ctx == NULL) {
        fprintf(stderr, KS_PROG ": source key %s:%" PRIu32 " was left as it is (no keyring); "
                "retire it with 'keyshift keys set-state %s %" PRIu32 " decrypt-only'\n",
                r->source.key_id, r->source.key_version, r->source.key_id, r->source.key_version);
    }
    return rc;
}

/* What a step (advance or rollback) does once the keyring is open. */
typedef int (*step_fn)(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
             const ks_rollout *r, const ks_cli_keys *keys, ks_ctx *ctx,
             const ks_rollout_canary *canary);

/* Run step with the keyring open when the transition uses it (wanted:
 * only then, so a keyring that is not needed is never opened) and one is
 * named; a required one that is not named is a usage error saying why. */
static int with_keyring(const char *cmd, const ks_cli_ro_opts *o, int wanted, int required,
                        const char *why, ks_rollout_db *db, const ks_rollout *r,
                        const ks_rollout_canary *canary, step_fn step)
{
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    int opened = 0;
    int rc = wanted ? ks_cli_ro_keyring_for(cmd, o, required, why, &keys, &opened, &ctx) : EX_OK;
    if (rc == EX_OK) {
        rc = step(cmd, o, db, r, opened ? &keys : NULL, ctx, canary);
    }
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* `rollout advance`. */
int ks_cli_ro_on_advance(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                         const ks_rollout *r)
{
    ks_rollout_canary canary;
    int given, rc = parse_canary(cmd, o, &canary, &given);
    ks_rollout_phase to = next_phase(r->phase);
    if (rc != EX_OK) {
        return rc;
    }
    if (to == 0) {
        ks_cli_error("rollout %" PRId64 " is finalized: there is no next phase", r->id);
        return EX_DATAERR;
    }
    if (given && to != KS_PHASE_WRITE_UPGRADE) {
        return ks_cli_usage_error(cmd, "--tenants, --percent and --all apply when entering "
                                       "write-upgrade; use 'keyshift rollout canary' to change it");
    }
    char why[KS_KEY_ID_MAX + 128];
    snprintf(why, sizeof why, "entering read-compat checks target key %s:%" PRIu32
             " with the keyring", r->target.key_id, r->target.key_version);
    int source_key = to == KS_PHASE_FINALIZED && source_retires(r);
    return with_keyring(cmd, o, to == KS_PHASE_READ_COMPAT || source_key,
                        to == KS_PHASE_READ_COMPAT, why, db, r, &canary, advance);
}

/* ---- rollback ---------------------------------------------------------------------- */

/* The one safe step back from p, or 0 from planned. */
static ks_rollout_phase back_phase(ks_rollout_phase p)
{
    switch (p) {
    case KS_PHASE_READ_COMPAT: return KS_PHASE_PLANNED;
    case KS_PHASE_WRITE_UPGRADE:
    case KS_PHASE_BACKFILL: return KS_PHASE_READ_COMPAT;
    case KS_PHASE_FINALIZED: return KS_PHASE_BACKFILL;
    default: return (ks_rollout_phase)0;
    }
}

/* The rollback step, with the keyring open when needed. */
static int rollback(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                    const ks_rollout *r, const ks_cli_keys *keys, ks_ctx *ctx,
                    const ks_rollout_canary *canary)
{
    (void)keys;
    (void)canary;
    ks_rollout_phase to = back_phase(r->phase);
    ks_rollout_facts f;
    int rc = gather_facts(o, db, ctx, r, to, &f);
    return rc == EX_OK ? transition(cmd, db, r, to, &f, o, 0, o->reason) : rc;
}

/* `rollout rollback`. */
int ks_cli_ro_on_rollback(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                          const ks_rollout *r)
{
    if (o->reason == NULL || o->reason[0] == '\0') {
        return ks_cli_usage_error(cmd, "--reason TEXT is required: say why, for the log");
    }
    ks_rollout_phase to = back_phase(r->phase);
    if (to == 0) {
        ks_cli_error("rollout %" PRId64 " is planned: there is nothing to roll back (start "
                     "another rollout instead)", r->id);
        return EX_DATAERR;
    }
    char why[KS_KEY_ID_MAX + 128];
    snprintf(why, sizeof why, "leaving finalized checks that source key %s:%" PRIu32
             " was not destroyed, with the keyring", r->source.key_id, r->source.key_version);
    int source_key = to == KS_PHASE_BACKFILL && !r->source.is_plaintext;
    return with_keyring(cmd, o, source_key, source_key, why, db, r, NULL, rollback);
}

/* ---- canary ------------------------------------------------------------------------- */

/* `rollout canary`. */
int ks_cli_ro_on_canary(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                        const ks_rollout *r)
{
    ks_rollout_canary c;
    int given, rc = parse_canary(cmd, o, &c, &given);
    if (rc != EX_OK) {
        return rc;
    }
    if (!given) {
        return ks_cli_usage_error(cmd, "give --tenants a,b, --percent N or --all");
    }
    int64_t now = (int64_t)time(NULL);
    ks_err e = ks_rollout_db_set_canary(db, r->id, &c, o->actor_buf, now);
    if (e == KS_OK && o->reason != NULL && o->reason[0] != '\0') {
        e = ks_rollout_db_note(db, r->id, o->actor_buf, o->reason, now);
    }
    char text[KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1) + 16];
    ks_cli_ro_canary_str(&c, text, sizeof text);
    if (e == KS_ERR_STATE) {
        ks_cli_error("rollout %" PRId64 " is finalized: its canary no longer applies", r->id);
        return EX_DATAERR;
    }
    if (e == KS_ERR_INVALID_ARGUMENT) {
        return ks_cli_usage_error(cmd, "invalid canary: tenants are distinct, 1..%d bytes of "
                                       "[A-Za-z0-9._:/@+=-]", KS_TENANT_MAX);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot set the canary of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"canary\":", r->id,
               ks_rollout_phase_name((int)r->phase));
        ks_cli_ro_put_str(text);
        printf("}\n");
    } else {
        printf("rollout %" PRId64 " (%s): canary %s\n", r->id, ks_rollout_phase_name((int)r->phase),
               text);
    }
    return EX_OK;
}

/* ---- abort -------------------------------------------------------------------------- */

/* `rollout abort`: end a rollout that has written its target nowhere
 * (planned; read-compat while the census shows no row at the target),
 * removing it so that its scope is free for a new start.  --reason is
 * required; the log keeps the actor, the reason and what the rollout
 * was. */
int ks_cli_ro_on_abort(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                       const ks_rollout *r)
{
    if (o->reason == NULL || o->reason[0] == '\0') {
        return ks_cli_usage_error(cmd, "--reason TEXT is required: say why, for the log");
    }
    if (strlen(o->reason) > KS_ROLLOUT_REASON_MAX - 16) {
        return ks_cli_usage_error(cmd, "--reason must be at most %d characters for an abort",
                                  KS_ROLLOUT_REASON_MAX - 16);
    }
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.now = (int64_t)time(NULL);
    if (r->phase == KS_PHASE_READ_COMPAT) {
        ks_cli_ro_scope_census c;
        int rc = ks_cli_ro_census_of(o->db, r, &c);
        if (rc != EX_OK) {
            return rc;
        }
        f.census_known = c.known;
        f.rows_at_source = c.at_source;
        f.rows_at_target = c.at_target;
    }
    char why[1024] = "", scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
    const char *phase = ks_rollout_phase_name((int)r->phase);
    ks_rollout_scope_text(r, scope, sizeof scope);
    ks_err e = ks_rollout_db_abort(db, r->id, r->phase, &f, o->actor_buf, o->reason, why,
                                   sizeof why);
    int rc = e == KS_ERR_STATE ? EX_DATAERR : ks_cli_exit_code(e);
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"result\":\"%s\",\"reason\":",
               r->id, phase, e == KS_OK ? "aborted" : ks_err_name(e));
        ks_cli_ro_put_str(e == KS_OK ? "" : why[0] ? why : ks_err_name(e));
        printf(",\"exit\":%d}\n", rc);
    }
    if (e == KS_OK) {
        if (!o->json) {
            printf("rollout %" PRId64 " (%s) aborted in %s\n", r->id, scope, phase);
        }
        fprintf(stderr, KS_PROG ": %s is free for a new 'keyshift rollout start'; the log of "
                "rollout %" PRId64 " stays ('keyshift rollout log --db %s' shows it)\n", scope,
                r->id, o->db);
    } else if (e == KS_ERR_STALE) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " was moved by someone else meanwhile; "
                "look at 'keyshift rollout status' and retry\n", cmd, r->id);
    } else {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot be aborted: %s\n", cmd, r->id,
                why[0] ? why : ks_err_name(e));
    }
    return rc;
}

/* ---- set ---------------------------------------------------------------------------- */

/* `rollout set`: change the thresholds and soak times of a rollout that
 * is not finalized; the options not given keep their values.  Logged
 * with the old and new value of each change. */
int ks_cli_ro_on_set(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                     const ks_rollout *r)
{
    if (o->max_auth == NULL && o->max_parse == NULL && o->max_provider == NULL &&
        o->max_seal == NULL && o->max_open == NULL && o->min_samples == NULL &&
        o->window == NULL && o->min_soak == NULL && o->reader_ttl == NULL) {
        return ks_cli_usage_error(cmd, "give at least one threshold, --window, --min-soak or "
                                       "--reader-ttl to change");
    }
    ks_thresholds t = r->thresholds;
    uint32_t soak = r->min_soak_s, ttl = r->reader_ttl_s;
    int rc = ks_cli_ro_parse_thresholds(cmd, o, &t);
    if (rc != EX_OK) {
        return rc;
    }
    if (o->min_soak != NULL && ks_cli_parse_duration(o->min_soak, &soak) != 0) {
        return ks_cli_usage_error(cmd, "--min-soak must be a duration (300, 300s, 5m, 1h)");
    }
    if (o->reader_ttl != NULL && (ks_cli_parse_duration(o->reader_ttl, &ttl) != 0 || ttl == 0)) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration of at least 1 s");
    }
    char changes[KS_ROLLOUT_REASON_MAX + 1] = "";
    ks_err e = ks_rollout_db_set_settings(db, r->id, &t, soak, ttl, o->actor_buf, o->reason,
                                          (int64_t)time(NULL), changes, sizeof changes);
    if (e == KS_ERR_STATE) {
        ks_cli_error("rollout %" PRId64 " is finalized: its thresholds no longer apply", r->id);
        return EX_DATAERR;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot change the settings of rollout %" PRId64 ": %s", r->id,
                     ks_err_name(e));
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"changes\":", r->id,
               ks_rollout_phase_name((int)r->phase));
        ks_cli_ro_put_str(changes);
        printf("}\n");
    } else {
        printf("rollout %" PRId64 " (%s): %s\n", r->id, ks_rollout_phase_name((int)r->phase),
               changes[0] ? changes : "nothing changed");
    }
    return EX_OK;
}
