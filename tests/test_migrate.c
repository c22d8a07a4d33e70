/*
 * tests/test_migrate.c -- the census and the re-encryption engine
 * (keyshift/migrate.h), over the in-memory row store of
 * tests/mem_rowstore.h (fault injection) and, once it is built, the
 * SQLite store on a temporary file.  No test depends on timing.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/migrate.h>

#include "../migrate/engine/engine.h"
#include "mem_provider.h"
#include "mem_rowstore.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define N_ROWS 60

/* One test's world: keys "k" v1 (primary) and "other" v1, a context and
 * an in-memory store. */
typedef struct world {
    ks_mem_provider mem;
    ks_provider prov;
    ks_ctx *ctx;
    ks_rowstore st;
    mem_rowstore *m;
    char orig[N_ROWS + 1][32]; /* the original plaintext by id */
} world;

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, "k", 1, 1, NULL), 0);
    assert_int_equal(ks_mem_add(&w->mem, "other", 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    w->m = mrs_new(&w->st);
    assert_non_null(w->m);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    w->st.ops->close(w->st.self);
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&w->mem);
    free(w);
    return 0;
}

/* Migration parameters: tenant "acme", purpose "pp", context "t:{id}". */
static ks_migrate_params mparams(ks_migrate_mode mode, const char *key, uint32_t version)
{
    ks_migrate_params p = {0};
    p.mode = mode;
    p.to_key_id = (ks_bytes){(const uint8_t *)key, strlen(key)};
    p.to_key_version = version;
    p.tenant = BV("acme");
    p.purpose = BV("pp");
    p.context_template = BV("t:{id}");
    p.batch_size = 7;
    p.max_failure_rate = -1;
    return p;
}

/* Rows 1..N_ROWS: NULL when id % 10 == 0, INTEGER id*3 when id % 7 == 0,
 * else TEXT "secret-<id>". */
static void fill_plain(world *w)
{
    for (int64_t id = 1; id <= N_ROWS; id++) {
        if (id % 10 == 0) {
            mrs_add(w->m, id, KS_VALUE_NULL, 0, NULL, 0);
            w->orig[id][0] = '\0';
        } else if (id % 7 == 0) {
            mrs_add(w->m, id, KS_VALUE_INTEGER, id * 3, NULL, 0);
            snprintf(w->orig[id], sizeof w->orig[id], "%lld", (long long)(id * 3));
        } else {
            snprintf(w->orig[id], sizeof w->orig[id], "secret-%lld", (long long)id);
            mrs_add(w->m, id, KS_VALUE_TEXT, 0, w->orig[id], strlen(w->orig[id]));
        }
    }
}

/* The key version seal_for asks for (0: the primary). */
static uint32_t g_seal_version;

/* Seal pt for row id as the engine would (context "t:<id>"), into out. */
static size_t seal_for(world *w, int64_t id, const char *key, uint8_t fmt, const char *ctxs,
                       const char *pt, uint8_t *out, size_t cap)
{
    char c[32];
    snprintf(c, sizeof c, "t:%lld", (long long)id);
    ks_seal_params sp = {fmt, 0, BV("acme"), {(const uint8_t *)key, strlen(key)}, g_seal_version,
                         fmt == 1 ? (ks_bytes){NULL, 0} : BV("pp"),
                         {(const uint8_t *)(ctxs ? ctxs : c), strlen(ctxs ? ctxs : c)}};
    size_t n = 0;
    assert_int_equal(ks_seal(w->ctx, &sp, (const uint8_t *)pt, strlen(pt), out, cap, &n), KS_OK);
    return n;
}

/* Every row: NULL stays NULL; every other value is an envelope under
 * (key, version) opening to the original plaintext. */
static void check_all(world *w, const char *key, uint32_t version)
{
    for (size_t i = 0; i < w->m->n; i++) {
        mrs_row *r = &w->m->rows[i];
        if (r->id > N_ROWS) {
            continue; /* extra rows of a test: checked there */
        }
        if (w->orig[r->id][0] == '\0') {
            assert_int_equal(r->value.type, KS_VALUE_NULL);
            continue;
        }
        ks_value v = mrs_view(&r->value);
        assert_true(ks_engine_is_envelope(&v));
        ks_envelope e;
        assert_int_equal(ks_envelope_parse(v.bytes.ptr, v.bytes.len, NULL, &e, NULL), KS_OK);
        assert_int_equal(e.key_id.len, strlen(key));
        assert_memory_equal(e.key_id.ptr, key, strlen(key));
        assert_int_equal(e.key_version, version);
        char c[32];
        snprintf(c, sizeof c, "t:%lld", (long long)r->id);
        ks_open_params op = {{(const uint8_t *)c, strlen(c)}, BV("acme"), BV("pp")};
        uint8_t pt[64];
        size_t n = 0;
        assert_int_equal(ks_open(w->ctx, v.bytes.ptr, v.bytes.len, &op, pt, sizeof pt, &n, NULL), KS_OK);
        assert_int_equal(n, strlen(w->orig[r->id]));
        assert_memory_equal(pt, w->orig[r->id], n);
    }
}

/* Run a migration and return the checkpoint (copied counts). */
static ks_err run(world *w, const ks_migrate_params *p, ks_checkpoint *cp)
{
    return ks_migrate_run(w->ctx, &w->st, p, NULL, NULL, NULL, cp);
}

/* ---- context templates ---------------------------------------------------- */

static void test_template(void **state)
{
    (void)state;
    ks_context_tmpl *t = malloc(sizeof *t);
    assert_non_null(t);
    assert_int_equal(ks_context_tmpl_compile(BV("a{{{id}}}-{c}-{d}{c}"), t), KS_OK);
    assert_int_equal(t->n_columns, 2);
    assert_string_equal(t->columns[0], "c");
    assert_string_equal(t->columns[1], "d");
    ks_row row;
    memset(&row, 0, sizeof row);
    static const uint8_t blob[] = {0xab, 0x01};
    row.id = (ks_value){KS_VALUE_INTEGER, -5, {NULL, 0}};
    row.context[0] = (ks_value){KS_VALUE_TEXT, 0, BV("x")};
    row.context[1] = (ks_value){KS_VALUE_BLOB, 0, {blob, 2}};
    uint8_t out[KS_CONTEXT_MAX];
    size_t n = 0;
    assert_int_equal(ks_context_tmpl_render(t, &row, out, sizeof out, &n), KS_OK);
    assert_int_equal(n, strlen("a{-5}-x-ab01x"));
    assert_memory_equal(out, "a{-5}-x-ab01x", n);
    row.context[0] = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
    row.id = (ks_value){KS_VALUE_TEXT, 0, BV("r7")};
    assert_int_equal(ks_context_tmpl_render(t, &row, out, sizeof out, &n), KS_OK);
    assert_memory_equal(out, "a{r7}--ab01", n);
    assert_int_equal(n, 11);
    assert_int_equal(ks_context_tmpl_render(t, &row, out, 4, &n), KS_ERR_TOO_LARGE);
    /* integers render as snprintf's %lld would, at both ends of the range */
    static const int64_t ints[] = {0, 7, -1, 10, 1234567890123, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        char want[96];
        row.id = (ks_value){KS_VALUE_INTEGER, ints[i], {NULL, 0}};
        row.context[0] = (ks_value){KS_VALUE_INTEGER, ints[i], {NULL, 0}};
        row.context[1] = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
        assert_int_equal(ks_context_tmpl_render(t, &row, out, sizeof out, &n), KS_OK);
        /* template "a{{{id}}}-{c}-{d}{c}" with d NULL */
        int wl = snprintf(want, sizeof want, "a{%lld}-%lld-%lld", (long long)ints[i], (long long)ints[i],
                      (long long)ints[i]);
        assert_int_equal(n, (size_t)wl);
        assert_memory_equal(out, want, n);
    }
    row.id = (ks_value){KS_VALUE_TEXT, 0, BV("r7")};
    row.context[0] = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
    row.context[1] = (ks_value){KS_VALUE_BLOB, 0, {blob, 2}};
    /* errors */
    const char *bad[] = {"{", "}", "a}b", "{}", "{a{b}", "{id", "{a}{b}{c}{d}{e}{f}{g}{h}{i}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(ks_context_tmpl_compile((ks_bytes){(const uint8_t *)bad[i], strlen(bad[i])}, t),
                         KS_ERR_INVALID_ARGUMENT);
    }
    assert_int_equal(ks_context_tmpl_compile(BV("{{}}"), t), KS_OK);
    assert_int_equal(ks_context_tmpl_render(t, &row, out, sizeof out, &n), KS_OK);
    assert_memory_equal(out, "{}", 2);
    assert_int_equal(ks_context_tmpl_compile((ks_bytes){NULL, 0}, t), KS_OK);
    assert_int_equal(ks_context_tmpl_render(t, &row, out, sizeof out, &n), KS_OK);
    assert_int_equal(n, 0);
    free(t);
    /* the public column list */
    const char *names[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
    char storage[KS_CONTEXT_TEMPLATE_MAX];
    size_t nc = 99;
    assert_int_equal(ks_context_template_columns(BV("{id}:{org}:{kind}:{org}"), names, storage, &nc), KS_OK);
    assert_int_equal(nc, 2);
    assert_string_equal(names[0], "org");
    assert_string_equal(names[1], "kind");
    assert_int_equal(ks_context_template_columns(BV("{x"), names, storage, &nc), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(nc, 0);
}

/* A malformed template's fault is named with its byte offset: the "{"
 * left unclosed (also when another "{" comes first), a lone "}", the
 * "{" of an empty name or of one distinct name too many, the limit for
 * a template too long. */
static void test_template_fault_offset(void **state)
{
    (void)state;
    static const struct {
        const char *tmpl;
        size_t off;
        const char *why;
    } cases[] = {
        {"orders:{id:card", 7, "an unclosed \"{\""},
        {"{", 0, "an unclosed \"{\""},
        {"a:{b{c}", 2, "an unclosed \"{\""},
        {"{{x}}{id", 5, "an unclosed \"{\""},
        {"a}b", 1, "a lone \"}\""},
        {"ab{}", 2, "an empty name"},
        {"{a}{b}{c}{d}{e}{f}{g}{h}:{i}", 25, "one distinct column name too many"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t off = 99;
        const char *why = NULL;
        ks_bytes b = {(const uint8_t *)cases[i].tmpl, strlen(cases[i].tmpl)};
        assert_int_equal(ks_context_template_check(b, &off, &why), KS_ERR_INVALID_ARGUMENT);
        assert_int_equal(off, cases[i].off);
        assert_non_null(why);
        assert_non_null(strstr(why, cases[i].why));
    }
    static char big[KS_CONTEXT_TEMPLATE_MAX + 2];
    memset(big, 'a', sizeof big - 1);
    size_t off = 0;
    const char *why = NULL;
    assert_int_equal(ks_context_template_check(BV(big), &off, &why), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(off, KS_CONTEXT_TEMPLATE_MAX);
    assert_int_equal(ks_context_template_check(BV("o:{id}:{{x}}"), &off, &why), KS_OK);
    assert_null(why);
    assert_int_equal(ks_context_template_check(BV("o"), NULL, &why), KS_ERR_INVALID_ARGUMENT);
}

/* A store whose id is not stable (SQLite's bare rowid) refuses every
 * run, worker settle and verify whose context binds {id}, before a row
 * is read or written: no value, no checkpoint.  A context that does not
 * bind {id} ("{{id}}" is literal text) runs on it. */
static void test_unstable_id(void **state)
{
    world *w = *state;
    fill_plain(w);
    w->st.id_stable = 0;
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    assert_int_equal(ks_migrate_check_context(&w->st, p.context_template), KS_ERR_UNSTABLE_ID);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_ERR_UNSTABLE_ID);
    ks_engine_settled settled;
    assert_int_equal(ks_engine_settle(w->ctx, &w->st, &p, &settled), KS_ERR_UNSTABLE_ID);
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 0, NULL, NULL, &vr), KS_ERR_UNSTABLE_ID);
    assert_int_equal(vr.checked + vr.skipped, 0);
    assert_int_equal(w->m->writes, 0);
    assert_int_equal(w->m->commits, 0);
    ks_checkpoint none;
    assert_int_equal(w->st.ops->checkpoint_load(w->st.self, (ks_bytes){NULL, 0}, &none),
                     KS_ERR_NOT_FOUND);
    assert_memory_equal(w->m->rows[0].value.bytes, "secret-1", 8); /* still plaintext */
    p.context_template = BV("t:{{id}}");
    assert_int_equal(ks_migrate_check_context(&w->st, p.context_template), KS_OK);
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.failed, 0);
    w->st.id_stable = 1; /* a stable id may be bound */
    assert_int_equal(ks_migrate_check_context(&w->st, BV("t:{id}")), KS_OK);
    assert_int_equal(ks_migrate_check_context(&w->st, BV("t:{id")), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_migrate_check_context(NULL, BV("t")), KS_ERR_INVALID_ARGUMENT);
}

/* ---- census --------------------------------------------------------------- */

/* Rows 1..15 of every census class: NULLs, plaintext (TEXT, INTEGER,
 * BLOB, a TEXT too short for the magic), envelopes of format 1 and 2
 * under three key versions (one as TEXT), and malformed ones. */
static void fill_mixed(world *w)
{
    uint8_t env[512];
    int64_t id = 1;
    mrs_add(w->m, id++, KS_VALUE_NULL, 0, NULL, 0);
    mrs_add(w->m, id++, KS_VALUE_NULL, 0, NULL, 0);
    mrs_add(w->m, id++, KS_VALUE_TEXT, 0, "hello", 5);
    mrs_add(w->m, id++, KS_VALUE_INTEGER, 42, NULL, 0);
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, "\x00\x01", 2);
    mrs_add(w->m, id++, KS_VALUE_TEXT, 0, "KS", 2); /* too short for the magic: plaintext */
    size_t n = seal_for(w, id, "k", 1, NULL, "a", env, sizeof env);
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, env, n);
    for (int i = 0; i < 2; i++) {
        n = seal_for(w, id, "k", 2, NULL, "b", env, sizeof env);
        mrs_add(w->m, id++, KS_VALUE_BLOB, 0, env, n);
    }
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    g_seal_version = 2;
    n = seal_for(w, id, "k", 2, NULL, "c", env, sizeof env);
    g_seal_version = 0;
    mrs_add(w->m, id++, KS_VALUE_TEXT, 0, env, n); /* TEXT envelopes count too */
    n = seal_for(w, id, "other", 2, NULL, "c", env, sizeof env);
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, env, n);
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, env, n - 3);                 /* truncated */
    env[n] = 0;
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, env, n + 1);                 /* trailing byte */
    mrs_add(w->m, id++, KS_VALUE_BLOB, 0, "KSE\x09\x08\x02", 6);       /* unsupported version */
    mrs_add(w->m, id++, KS_VALUE_TEXT, 0, "KSE", 3);                   /* truncated */
}

/* Assert c is the census of fill_mixed's rows plus extra_plain more
 * plaintext rows. */
static void check_mixed(const ks_census *c, uint64_t extra_plain)
{
    assert_int_equal(c->rows, 15 + extra_plain);
    assert_int_equal(c->null_rows, 2);
    assert_int_equal(c->plaintext_rows, 4 + extra_plain);
    assert_int_equal(c->malformed_rows, 4);
    assert_int_equal(c->malformed[KS_ERR_TRUNCATED], 2); /* the cut envelope and a bare "KSE" */
    assert_int_equal(c->malformed[KS_ERR_UNSUPPORTED_VERSION], 1);
    assert_int_equal(c->n_classes, 4);
    /* sorted: k:1 v1, k:1 v2, k:2 v2, other:1 v2 */
    assert_string_equal(c->classes[0].key_id, "k");
    assert_int_equal(c->classes[0].key_version, 1);
    assert_int_equal(c->classes[0].version, 1);
    assert_int_equal(c->classes[0].rows, 1);
    assert_int_equal(c->classes[1].version, 2);
    assert_int_equal(c->classes[1].rows, 2);
    assert_int_equal(c->classes[2].key_version, 2);
    assert_int_equal(c->classes[2].rows, 1);
    assert_string_equal(c->classes[3].key_id, "other");
    assert_int_equal(c->classes[3].algorithm, KS_ALG_XCHACHA20POLY1305);
}

/* The census of st through both of ks_census_run's paths, the store's
 * visit_values and the batched scan (a copy of its ops without
 * visit_values): asserts they agree to the byte, returns the first in c. */
static void census_both(const ks_rowstore *st, ks_census *c)
{
    assert_non_null(st->ops->visit_values);
    assert_int_equal(ks_census_run(st, c), KS_OK);
    ks_rowstore_ops scan_ops = *st->ops;
    scan_ops.visit_values = NULL;
    ks_rowstore by_scan = {&scan_ops, st->self, st->name, st->id_stable, st->encoding};
    ks_census s;
    assert_int_equal(ks_census_run(&by_scan, &s), KS_OK);
    assert_int_equal(s.rows, c->rows);
    assert_int_equal(s.null_rows, c->null_rows);
    assert_int_equal(s.plaintext_rows, c->plaintext_rows);
    assert_int_equal(s.malformed_rows, c->malformed_rows);
    assert_memory_equal(s.malformed, c->malformed, sizeof s.malformed);
    assert_int_equal(s.n_classes, c->n_classes);
    assert_memory_equal(s.classes, c->classes, c->n_classes * sizeof *c->classes);
    ks_census_free(&s);
}

static void test_census(void **state)
{
    world *w = *state;
    fill_mixed(w);
    ks_census c;
    census_both(&w->st, &c);
    check_mixed(&c, 0);
    ks_census_free(&c);
    assert_null(c.classes);
    /* a store failing in the middle of the visit fails the census, which
     * keeps nothing */
    w->m->fail_visit_at = 8;
    assert_int_equal(ks_census_run(&w->st, &c), KS_ERR_STORE);
    assert_null(c.classes);
    assert_int_equal(c.rows, 0);
}

/* ---- round trips, idempotence, wraps -------------------------------------- */

static void test_round_trip(void **state)
{
    world *w = *state;
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_int_equal(cp.quarantined + cp.raced + cp.wrong_state + cp.skipped, 0);
    assert_memory_equal(cp.state.ptr, "complete", 8);
    check_all(w, "k", 1);
    /* idempotent: nothing written, counts unchanged */
    unsigned writes = w->m->writes;
    ks_checkpoint again;
    assert_int_equal(run(w, &p, &again), KS_OK);
    assert_int_equal(w->m->writes, writes);
    assert_int_equal(again.done, cp.done);
    assert_int_equal(again.updated, cp.updated);
    check_all(w, "k", 1);
    /* rewrap to a new primary: wraps grow with DEKs, not rows */
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    ks_metrics before, after;
    ks_ctx_metrics(w->ctx, &before);
    p = mparams(KS_MIGRATE_REWRAP, "k", 0);
    assert_int_equal(run(w, &p, &cp), KS_OK);
    ks_ctx_metrics(w->ctx, &after);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_true(after.wraps - before.wraps <= 2);
    assert_true(after.rewraps - before.rewraps >= cp.done);
    check_all(w, "k", 2);
    /* a second rewrap: every row already at the target */
    p.to_key_version = 2;
    writes = w->m->writes;
    /* the previous one is complete, a new identity (version pinned) may start */
    ks_checkpoint cp2;
    assert_int_equal(run(w, &p, &cp2), KS_OK);
    assert_int_equal(w->m->writes, writes);
    /* reencrypt to another key, format 1 */
    p = mparams(KS_MIGRATE_REENCRYPT, "other", 0);
    p.to_format = 2;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    check_all(w, "other", 1);
    /* an unknown mode is refused */
    p.mode = (ks_migrate_mode)9;
    assert_int_equal(run(w, &p, &cp), KS_ERR_INVALID_ARGUMENT);
    assert_string_equal(ks_migrate_mode_name(KS_MIGRATE_REWRAP), "rewrap");
    assert_null(ks_migrate_mode_name(0));
}

/* Format 1 has no purpose: a reencrypt to format 2 with a purpose opens
 * the format-1 rows without asking for one (and verifies the new values
 * with it), and a verify given the purpose passes on format-1 rows. */
static void test_upgrade_format_with_purpose(void **state)
{
    world *w = *state;
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    p.to_format = 1;
    p.purpose = (ks_bytes){NULL, 0};
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    ks_migrate_params vp = mparams(KS_MIGRATE_REENCRYPT, "k", 0); /* purpose "pp" */
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &vp, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.failed, 0);
    assert_int_equal(vr.checked, N_ROWS - N_ROWS / 10);
    p = mparams(KS_MIGRATE_REENCRYPT, "k", 0);
    p.to_format = 2;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_int_equal(cp.quarantined, 0);
    check_all(w, "k", 1); /* every row now format 2 with purpose "pp" */
}

/* ---- wrong state, quarantine, threshold ----------------------------------- */

static void test_wrong_state_and_quarantine(void **state)
{
    world *w = *state;
    uint8_t env[512];
    fill_plain(w);
    /* rows 101.. : an envelope not at the target (format 1: wrong state
     * for encrypt), malformed ones, and one already at the target (v2,
     * the default algorithm: skipped, not wrong state) */
    uint8_t at[512];
    size_t n = seal_for(w, 101, "k", 1, NULL, "x", env, sizeof env);
    mrs_add(w->m, 101, KS_VALUE_BLOB, 0, env, n);
    mrs_add(w->m, 102, KS_VALUE_BLOB, 0, env, n - 1);
    mrs_add(w->m, 103, KS_VALUE_TEXT, 0, "KSE-not-an-envelope", 19);
    size_t n_at = seal_for(w, 106, "k", 2, NULL, "y", at, sizeof at);
    mrs_add(w->m, 106, KS_VALUE_BLOB, 0, at, n_at);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    p.max_failure_rate = 0.5;
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.wrong_state, 1);
    assert_int_equal(cp.skipped, 1);
    assert_memory_equal(mrs_find(w->m, 106)->value.bytes, at, n_at);
    assert_int_equal(cp.quarantined, 2);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_memory_equal(mrs_find(w->m, 101)->value.bytes, env, n);
    assert_memory_equal(mrs_find(w->m, 102)->value.bytes, env, n - 1);
    assert_memory_equal(mrs_find(w->m, 103)->value.bytes, "KSE-not-an-envelope", 19);
    assert_string_equal(mrs_find(w->m, 102)->qerr, "truncated");
    assert_true(mrs_find(w->m, 103)->quarantined);
    /* rewrap: plaintext is wrong state; an envelope bound to another
     * context fails authentication and is quarantined, untouched */
    n = seal_for(w, 104, "k", 2, "elsewhere", "y", env, sizeof env);
    mrs_add(w->m, 104, KS_VALUE_BLOB, 0, env, n);
    mrs_add(w->m, 105, KS_VALUE_TEXT, 0, "plain", 5);
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p = mparams(KS_MIGRATE_REWRAP, "k", 2);
    p.max_failure_rate = 0.5;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.wrong_state, 1);
    assert_int_equal(cp.quarantined, 1);
    assert_string_equal(mrs_find(w->m, 104)->qerr, "auth-failed");
    assert_memory_equal(mrs_find(w->m, 104)->value.bytes, env, n);
    assert_memory_equal(mrs_find(w->m, 105)->value.bytes, "plain", 5);
}

static void test_threshold(void **state)
{
    world *w = *state;
    fill_plain(w);
    mrs_add(w->m, 101, KS_VALUE_TEXT, 0, "KSE1", 4);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    p.max_failure_rate = 0; /* stop on any failure */
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_ERR_THRESHOLD);
    assert_memory_equal(cp.state.ptr, "stopped", 7);
    assert_int_equal(cp.quarantined, 1);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_true(cp.finished != 0);
    check_all(w, "k", 1); /* what was written is sound */
    assert_memory_equal(mrs_find(w->m, 101)->value.bytes, "KSE1", 4);
    /* a rerun with the same rate stops again, writing nothing */
    unsigned writes = w->m->writes;
    assert_int_equal(run(w, &p, &cp), KS_ERR_THRESHOLD);
    assert_int_equal(w->m->writes, writes);
}

/* ---- stop and resume, provider failure ------------------------------------ */

static volatile sig_atomic_t g_stop;

/* progress: ask to stop after the first committed batch. */
static void stop_after_first(void *arg, const ks_migrate_progress *pr)
{
    (void)arg;
    assert_non_null(pr->checkpoint);
    g_stop = 1;
}

/* Fill w and run an encrypt to "k" stopped after its first batch: the
 * checkpoint is paused after id 14 (two batches of 7: the stop is seen
 * after the first, the second was read ahead).  The params and the
 * checkpoint. */
static ks_migrate_params encrypt_stopped(world *w, ks_checkpoint *cp)
{
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    g_stop = 0;
    assert_int_equal(ks_migrate_run(w->ctx, &w->st, &p, &g_stop, stop_after_first, NULL, cp),
                     KS_ERR_STOPPED);
    assert_memory_equal(cp->state.ptr, "paused", 6);
    assert_int_equal(cp->cursor.type, KS_VALUE_INTEGER);
    assert_int_equal(cp->cursor.integer, 14);
    return p;
}

static void test_stop_resume(void **state)
{
    world *w = *state;
    ks_checkpoint cp;
    ks_migrate_params p = encrypt_stopped(w, &cp);
    uint64_t done1 = cp.done;
    assert_true(done1 > 0);
    assert_int_equal(mrs_find(w->m, 15)->value.type, KS_VALUE_TEXT); /* untouched */
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    check_all(w, "k", 1);
}

/* The batch sizes a run reported (batch_target_ms). */
typedef struct sizes_seen {
    uint64_t min, max, batches, rows;
} sizes_seen;

/* progress: record every committed batch's rows (not a pass's end). */
static void record_sizes(void *arg, const ks_migrate_progress *pr)
{
    sizes_seen *s = arg;
    if (pr->batch_rows == 0) {
        return;
    }
    s->min = s->batches == 0 || pr->batch_rows < s->min ? pr->batch_rows : s->min;
    s->max = pr->batch_rows > s->max ? pr->batch_rows : s->max;
    s->batches++;
    s->rows += pr->batch_rows;
}

/*
 * The adaptive batch size is not part of a migration's identity: a run
 * stopped with fixed batches resumes with a target (and bounds), from
 * the same checkpoint, to the same result; every batch of the resumed
 * run is within the bounds (but the pass's last), whatever the sizes
 * the timing picks, pipelined or serial.  Bad bounds are refused.
 */
static void test_batch_target(void **state)
{
    world *w = *state;
    ks_checkpoint cp;
    ks_migrate_params p = encrypt_stopped(w, &cp);
    ks_migrate_params q = p;
    q.batch_target_ms = 1;
    q.batch_min = 2;
    q.batch_max = 9;
    char a[KS_PARAMS_MAX], b[KS_PARAMS_MAX];
    size_t al = 0, bl = 0;
    assert_int_equal(ks_migrate_canonical_params(&p, 1, a, sizeof a, &al), KS_OK);
    assert_int_equal(ks_migrate_canonical_params(&q, 1, b, sizeof b, &bl), KS_OK);
    assert_int_equal(al, bl);
    assert_memory_equal(a, b, al);
    for (int serial = 0; serial <= 1; serial++) {
        q.serial = serial;
        sizes_seen seen = {0, 0, 0, 0};
        assert_int_equal(ks_migrate_run(w->ctx, &w->st, &q, NULL, record_sizes, &seen, &cp),
                         KS_OK);
        assert_true(seen.batches > 0);
        assert_true(seen.max <= 9);
        assert_true(seen.min >= 1); /* the pass's last batch may be smaller than 2 */
        assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
        check_all(w, "k", 1);
        if (serial == 0) {
            assert_int_equal(seen.rows, N_ROWS - 14); /* resumed after the first run's 14 */
        }
    }
    q.batch_min = 10;
    assert_int_equal(run(w, &q, &cp), KS_ERR_INVALID_ARGUMENT);
    q.batch_min = 0;
    q.batch_max = 100001;
    assert_int_equal(run(w, &q, &cp), KS_ERR_INVALID_ARGUMENT);
    q.batch_max = 0;
    q.batch_target_ms = KS_MIGRATE_BATCH_TARGET_MAX_MS + 1;
    assert_int_equal(run(w, &q, &cp), KS_ERR_INVALID_ARGUMENT);
}

/*
 * The provider fails from its 4th wrap on (every 3 seals need a wrap: the
 * 4th comes in the second batch of 7).  Pipelined or serial, the first
 * batch commits, the second writes nothing, and the checkpoint stays at
 * the first batch's last id; the run resumes once the provider is back.
 * The failure is injected by call count, not from a callback, so it
 * lands in the same batch whichever thread makes the call.
 */
static void provider_unavailable(world *w, int serial)
{
    ks_ctx_free(w->ctx);
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = 3; /* a wrap every few rows */
    assert_int_equal(ks_ctx_new(&w->prov, &cfg, &w->ctx), KS_OK);
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    p.serial = serial;
    ks_mem_fail_after(&w->mem, KS_MEM_WRAP, 3, KS_ERR_UNAVAILABLE, 1000);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_ERR_UNAVAILABLE);
    assert_memory_equal(cp.state.ptr, "running", 7);
    assert_int_equal(cp.cursor.integer, 7);
    assert_int_equal(cp.done, 7);
    for (int64_t id = 8; id <= N_ROWS; id++) { /* the failed batch wrote nothing */
        assert_int_not_equal(mrs_find(w->m, id)->value.type, KS_VALUE_BLOB);
    }
    assert_false(w->m->in_txn);
    ks_mem_fail(&w->mem, KS_MEM_WRAP, KS_OK, 0);
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    check_all(w, "k", 1);
}

static void test_provider_unavailable(void **state)
{
    provider_unavailable(*state, 0);
}

static void test_provider_unavailable_serial(void **state)
{
    provider_unavailable(*state, 1);
}

/* The serial engine (no helper thread) makes exactly the pipelined
 * engine's writes and counts: encrypt, then rewrap. */
static void test_serial(void **state)
{
    world *w = *state;
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    p.serial = 1;
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_int_equal(w->m->commits, (N_ROWS + 6) / 7 + 1); /* every batch, then "complete" */
    check_all(w, "k", 1);
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p = mparams(KS_MIGRATE_REWRAP, "k", 2);
    p.serial = 1;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    check_all(w, "k", 2);
}

static void test_commit_failure(void **state)
{
    world *w = *state;
    fill_plain(w);
    w->m->fail_commit_at = 2;
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_ERR_BUSY);
    assert_int_equal(cp.cursor.integer, 7);
    assert_int_equal(mrs_find(w->m, 8)->value.type, KS_VALUE_TEXT);
    assert_int_equal(run(w, &p, &cp), KS_OK);
    check_all(w, "k", 1);
}

/* ---- races ----------------------------------------------------------------- */

/* begin hook: the application rewrites row 9's plaintext once, between
 * the scan of its batch (the second) and the batch's writes. */
static void app_writes(mem_rowstore *m, void *arg)
{
    world *w = arg;
    if (m->commits == 1 && w->orig[9][0] != 'n') {
        strcpy(w->orig[9], "new-9");
        mrs_set(m, 9, KS_VALUE_TEXT, "new-9", 5);
    }
}

static void test_races(void **state)
{
    world *w = *state;
    fill_plain(w);
    mrs_find(w->m, 3)->race_once = 1;
    mrs_find(w->m, 33)->race_once = 1;
    w->m->begin_hook = app_writes;
    w->m->hook_arg = w;
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.raced, 3);
    assert_int_equal(cp.pass, 2);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    check_all(w, "k", 1); /* row 9 holds the application's new value */
}

/* test_races through the engine's batched path (a store with
 * cas_batch): the same raced, done and pass counts, the same values. */
static void test_races_batched(void **state)
{
    world *w = *state;
    static ks_rowstore_ops ops; /* outlives a failed assertion: teardown closes through it */
    ops = *w->st.ops;
    ops.cas_batch = mrs_cas_batch;
    ks_rowstore plain = w->st;
    w->st.ops = &ops;
    test_races(state);
    w->st = plain;
}

/* ---- the SQLite store ------------------------------------------------------ */

/* Create an empty temporary file (under TMPDIR, else /tmp) for a
 * database; its name in path[0, 128). */
static void temp_db(char path[128])
{
    const char *tmp = getenv("TMPDIR");
    snprintf(path, 128, "%s/ksmigrateXXXXXX", tmp != NULL && strlen(tmp) < 80 ? tmp : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

/* The census of a SQLite table holding fill_mixed's values (with their
 * types) and a REAL, one row quarantined: the same counts through the
 * store's visit_values and through its scan. */
static void test_census_sqlite(void **state)
{
    world *w = *state;
    fill_mixed(w);
    char path[128];
    temp_db(path);
    sqlite3 *db = NULL;
    sqlite3_stmt *ins = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                                      "INSERT INTO t VALUES(100, 2.5)",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO t VALUES(?1, ?2)", -1, &ins, NULL),
                     SQLITE_OK);
    for (size_t i = 0; i < w->m->n; i++) {
        const mrs_row *r = &w->m->rows[i];
        const mrs_val *v = &r->value;
        int rc = SQLITE_OK;
        if (v->type == KS_VALUE_INTEGER) {
            rc = sqlite3_bind_int64(ins, 2, v->integer);
        } else if (v->type == KS_VALUE_TEXT) {
            rc = sqlite3_bind_text(ins, 2, (const char *)v->bytes, (int)v->len, SQLITE_STATIC);
        } else if (v->type == KS_VALUE_BLOB) {
            rc = sqlite3_bind_blob(ins, 2, v->bytes, (int)v->len, SQLITE_STATIC);
        }
        assert_int_equal(rc, SQLITE_OK);
        assert_int_equal(sqlite3_bind_int64(ins, 1, r->id), SQLITE_OK);
        assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
        assert_int_equal(sqlite3_reset(ins), SQLITE_OK);
        assert_int_equal(sqlite3_clear_bindings(ins), SQLITE_OK);
    }
    assert_int_equal(sqlite3_finalize(ins), SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    ks_rowstore_target tg = {"t", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
    ks_rowstore st;
    char eb[128];
    assert_int_equal(ks_rowstore_sqlite_open(path, &tg, NULL, &st, eb, sizeof eb), KS_OK);
    ks_value id = {KS_VALUE_INTEGER, 12, {NULL, 0}};
    assert_int_equal(st.ops->begin(st.self), KS_OK);
    assert_int_equal(st.ops->quarantine(st.self, &id, "truncated"), KS_OK);
    assert_int_equal(st.ops->commit(st.self), KS_OK);
    ks_census c;
    census_both(&st, &c);
    check_mixed(&c, 1); /* the REAL is plaintext */
    ks_census_free(&c);
    ks_rowstore_close(&st);
    unlink(path);
}

/* A census of a table larger than the scan's batches: the scan path
 * starts small and grows its batch (64, 256, then 1,000 rows), and still
 * counts what visit_values counts, every row once. */
static void test_census_batches(void **state)
{
    (void)state;
    char path[128];
    temp_db(path);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                                      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
                                      "FROM n WHERE i < 2345) INSERT INTO t SELECT i, "
                                      "CASE WHEN i % 7 = 0 THEN NULL ELSE 'p' || i END FROM n",
                                  NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    ks_rowstore_target tg = {"t", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
    ks_rowstore st;
    char eb[128];
    assert_int_equal(ks_rowstore_sqlite_open(path, &tg, NULL, &st, eb, sizeof eb), KS_OK);
    ks_census c;
    census_both(&st, &c);
    assert_int_equal(c.rows, 2345);
    assert_int_equal(c.null_rows, 2345 / 7);
    assert_int_equal(c.plaintext_rows, 2345 - 2345 / 7);
    ks_census_free(&c);
    ks_rowstore_close(&st);
    unlink(path);
}

/* progress: the total is the target's row count (arg: the expected one). */
static void check_total(void *arg, const ks_migrate_progress *pr)
{
    assert_int_equal(pr->total_rows, *(const uint64_t *)arg);
}

/* Encrypt, rewrap and reencrypt through the SQLite store: the engine
 * reads its batches through the store's visit_rows, and (reencrypt)
 * through its scan, with the same results; progress reports count the
 * table's rows. */
static void test_sqlite(void **state)
{
    world *w = *state;
    char path[128];
    temp_db(path);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)", NULL, NULL, NULL), SQLITE_OK);
    for (int id = 1; id <= N_ROWS; id++) {
        char sql[96];
        if (id % 10 == 0) {
            snprintf(sql, sizeof sql, "INSERT INTO t VALUES(%d, NULL)", id);
        } else {
            snprintf(w->orig[id], sizeof w->orig[id], "secret-%d", id);
            snprintf(sql, sizeof sql, "INSERT INTO t VALUES(%d, 'secret-%d')", id, id);
        }
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    ks_rowstore_target tg = {"t", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
    ks_rowstore st;
    char eb[128];
    assert_int_equal(ks_rowstore_sqlite_open(path, &tg, NULL, &st, eb, sizeof eb), KS_OK);
    assert_non_null(st.ops->visit_rows);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    uint64_t rows = N_ROWS;
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, check_total, &rows, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    ks_census c;
    census_both(&st, &c);
    assert_int_equal(c.plaintext_rows, 0);
    assert_int_equal(c.null_rows, N_ROWS / 10);
    ks_census_free(&c);
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p = mparams(KS_MIGRATE_REWRAP, "k", 0);
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &st, &p, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.checked, N_ROWS - N_ROWS / 10);
    assert_int_equal(vr.failed, 0);
    /* the engine's other read path: the store's scan (no visit_rows) */
    ks_rowstore_ops scan_ops = *st.ops;
    scan_ops.visit_rows = NULL;
    ks_rowstore by_scan = {&scan_ops, st.self, st.name, st.id_stable, st.encoding};
    p = mparams(KS_MIGRATE_REENCRYPT, "k", 0);
    p.algorithm = KS_ALG_AES256GCM;
    assert_int_equal(ks_migrate_run(w->ctx, &by_scan, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10);
    assert_int_equal(ks_migrate_verify(w->ctx, &st, &p, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.checked, N_ROWS - N_ROWS / 10);
    assert_int_equal(vr.failed, 0);
    ks_rowstore_close(&st);
    sqlite3_close(db);
    unlink(path);
}

/* verify's failure callback: count the failures named bad-value. */
static void count_bad_value(void *arg, const ks_verify_failure *f)
{
    if (f->error == KS_ERR_BAD_VALUE && strcmp(f->name, "bad-value") == 0) {
        (*(int *)arg)++;
    }
}

/*
 * A TEXT column of base64 envelopes (docs/format.md section 10): encrypt
 * writes each envelope's canonical text, as TEXT, beginning "S1NF";
 * rewrap, reencrypt and verify read them back; the census counts them.
 * A value beginning "S1NF" that is not canonical base64 (non-zero pad
 * bits) is malformed: counted so, quarantined "bad-value" and left byte
 * for byte as it was, never re-encoded; a value beginning "KSE" is
 * plaintext in such a column.  Parameters that do not name the store's
 * encoding are refused, and base64 is part of the migration's identity.
 */
static void test_sqlite_base64(void **state)
{
    world *w = *state;
    char path[128];
    temp_db(path);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);"
                                      "INSERT INTO t VALUES(1, 'secret-1'), (2, 'secret-2'),"
                                      " (3, NULL), (4, 'KSE plain'), (5, 'secret-5'),"
                                      " (6, 'S1NFAQgBEgF0GgFrIAEqAaAyDAABAgMEBQYHCAkKC3oQwMHCw8T"
                                      "FxsfIycrLzM3Ozx==')",
                                  NULL, NULL, NULL), SQLITE_OK);
    ks_rowstore_target tg = {"t", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BASE64};
    ks_rowstore st;
    char eb[128];
    assert_int_equal(ks_rowstore_sqlite_open(path, &tg, NULL, &st, eb, sizeof eb), KS_OK);
    assert_int_equal(st.encoding, KS_ENCODING_BASE64);
    ks_census c;
    census_both(&st, &c);
    assert_int_equal(c.plaintext_rows, 3);
    assert_int_equal(c.malformed_rows, 2);
    assert_int_equal(c.malformed[KS_ERR_BAD_VALUE], 1);
    assert_int_equal(c.malformed[KS_ERR_BAD_MAGIC], 1); /* "KSE plain": binary magic */
    ks_census_free(&c);

    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    /* binary parameters on a base64 store: refused before a row is read */
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp),
                     KS_ERR_INVALID_ARGUMENT);
    p.encoding = KS_ENCODING_BASE64;
    p.max_failure_rate = 0.5; /* the one malformed row of six */
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, 3);
    assert_int_equal(cp.quarantined, 2);
    assert_true(cp.params.len > 16 &&
                memcmp(cp.params.ptr + cp.params.len - 16, "encoding=base64;", 16) == 0);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT id, typeof(v), v FROM t ORDER BY id", -1, &q,
                                        NULL), SQLITE_OK);
    while (sqlite3_step(q) == SQLITE_ROW) {
        int id = sqlite3_column_int(q, 0);
        const char *type = (const char *)sqlite3_column_text(q, 1);
        const char *v = (const char *)sqlite3_column_text(q, 2);
        if (id == 3) {
            assert_string_equal(type, "null");
        } else if (id == 4) {
            assert_string_equal(v, "KSE plain"); /* never sealed again */
        } else if (id == 6) {
            assert_string_equal(v, "S1NFAQgBEgF0GgFrIAEqAaAyDAABAgMEBQYHCAkKC3oQwMHCw8TFxsfIycrLz"
                                   "M3Ozx=="); /* untouched */
        } else {
            assert_string_equal(type, "text");
            assert_memory_equal(v, "S1NF", 4);
            size_t n = strlen(v), got = 0;
            uint8_t env[512];
            assert_int_equal(ks_envelope_text_decode((const uint8_t *)v, n, NULL, env, sizeof env,
                                                     &got, NULL), KS_OK);
            ks_envelope e;
            assert_int_equal(ks_envelope_parse(env, got, NULL, &e, NULL), KS_OK);
        }
    }
    assert_int_equal(sqlite3_finalize(q), SQLITE_OK);
    census_both(&st, &c);
    assert_int_equal(c.plaintext_rows, 0);
    assert_int_equal(c.n_classes, 1);
    assert_int_equal(c.classes[0].rows, 3);
    assert_int_equal(c.malformed[KS_ERR_BAD_VALUE], 1);
    ks_census_free(&c);

    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p = mparams(KS_MIGRATE_REWRAP, "k", 0);
    p.encoding = KS_ENCODING_BASE64;
    p.max_failure_rate = 0.5;
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, 3);
    assert_int_equal(cp.quarantined, 2);
    ks_verify_result vr;
    int bad = 0;
    assert_int_equal(ks_migrate_verify(w->ctx, &st, &p, 0, count_bad_value, &bad, &vr), KS_OK);
    assert_int_equal(vr.checked, 5);
    assert_int_equal(vr.failed, 2);
    assert_int_equal(bad, 1);
    p.encoding = KS_ENCODING_BINARY;
    assert_int_equal(ks_migrate_verify(w->ctx, &st, &p, 0, NULL, NULL, &vr),
                     KS_ERR_INVALID_ARGUMENT);
    p = mparams(KS_MIGRATE_REENCRYPT, "k", 0);
    p.encoding = KS_ENCODING_BASE64;
    p.max_failure_rate = 0.5;
    p.algorithm = KS_ALG_AES256GCM;
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, 3);
    census_both(&st, &c);
    assert_int_equal(c.n_classes, 1);
    assert_int_equal(c.classes[0].algorithm, KS_ALG_AES256GCM);
    assert_int_equal(c.classes[0].rows, 3);
    ks_census_free(&c);
    ks_rowstore_close(&st);
    sqlite3_close(db);
    unlink(path);
}

/* The last progress report's own counts (ks_migrate_counts). */
static void keep_counts(void *arg, const ks_migrate_progress *pr)
{
    *(ks_migrate_counts *)arg = pr->run;
}

/* quarantine_list's callback: count the entries. */
static int count_entry(void *arg, const ks_quarantine_entry *e)
{
    assert_true(e->params.len > 0);
    (*(int *)arg)++;
    return 0;
}

/*
 * A rewrap run without the context the column was encrypted with
 * quarantines every row "auth-failed" and stops (its first batch all
 * auth-failed); the corrected run (the context given) is refused while
 * the mistaken one is unfinished, and with supersede tries every row the
 * mistaken one quarantined again and rewraps them all, since quarantine
 * belongs to the migration.  Each run's own counts are what it did: a
 * catch-up rerun that finds nothing to do reports zeros whatever the
 * checkpoint's totals.
 */
static void test_sqlite_corrected_run(void **state)
{
    world *w = *state;
    char path[128];
    temp_db(path);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)", NULL, NULL, NULL), SQLITE_OK);
    for (int id = 1; id <= 20; id++) {
        char sql[96];
        snprintf(sql, sizeof sql, "INSERT INTO t VALUES(%d, 'secret-%d')", id, id);
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    ks_rowstore_target tg = {"t", "v", NULL, NULL, {NULL}, 0, KS_ENCODING_BINARY};
    ks_rowstore st;
    char eb[128];
    assert_int_equal(ks_rowstore_sqlite_open(path, &tg, NULL, &st, eb, sizeof eb), KS_OK);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(ks_migrate_run(w->ctx, &st, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, 20);
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    /* the mistaken rewrap: no context */
    ks_migrate_params bad = mparams(KS_MIGRATE_REWRAP, "k", 0);
    bad.context_template = (ks_bytes){NULL, 0};
    ks_migrate_counts c;
    memset(&c, 0, sizeof c);
    assert_int_equal(ks_migrate_run(w->ctx, &st, &bad, NULL, keep_counts, &c, &cp), KS_ERR_THRESHOLD);
    assert_int_equal(cp.quarantined, 20);
    assert_int_equal(c.quarantined, 20);
    assert_int_equal(c.auth_failed, 20);
    assert_int_equal(c.first_batch_rows, 7);
    assert_int_equal(c.first_batch_auth_failed, 7);
    /* the corrected one: refused while the mistaken one is unfinished ... */
    ks_migrate_params good = mparams(KS_MIGRATE_REWRAP, "k", 0);
    assert_int_equal(ks_migrate_run(w->ctx, &st, &good, NULL, NULL, NULL, &cp), KS_ERR_MISMATCH);
    /* ... and with supersede, it retries the quarantined rows */
    good.supersede = 1;
    memset(&c, 0, sizeof c);
    assert_int_equal(ks_migrate_run(w->ctx, &st, &good, NULL, keep_counts, &c, &cp), KS_OK);
    assert_int_equal(cp.done, 20);
    assert_int_equal(cp.quarantined, 0);
    assert_int_equal(c.done, 20);
    assert_int_equal(c.first_batch_auth_failed, 0);
    ks_census census;
    census_both(&st, &census);
    assert_int_equal(census.n_classes, 1);
    assert_int_equal(census.classes[0].key_version, 2);
    assert_int_equal(census.classes[0].rows, 20);
    ks_census_free(&census);
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &st, &good, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.failed, 0);
    /* a rerun: this run did nothing, whatever the migration's totals */
    memset(&c, 0xff, sizeof c);
    assert_int_equal(ks_migrate_run(w->ctx, &st, &good, NULL, keep_counts, &c, &cp), KS_OK);
    assert_int_equal(cp.done, 20);
    assert_int_equal(c.done + c.skipped + c.quarantined + c.raced + c.wrong_state, 0);
    /* the mistaken migration's entries stay listed until released */
    int entries = 0;
    assert_int_equal(st.ops->quarantine_list(st.self, count_entry, &entries), KS_OK);
    assert_int_equal(entries, 20);
    ks_rowstore_close(&st);
    sqlite3_close(db);
    unlink(path);
}

/* ---- verify ---------------------------------------------------------------- */

static void count_failure(void *arg, const ks_verify_failure *f)
{
    int *n = arg;
    assert_int_equal(f->id.type, KS_VALUE_INTEGER);
    assert_int_equal(f->id.integer, 104);
    assert_int_equal(f->error, KS_ERR_AUTH_FAILED);
    (*n)++;
}

static void test_verify(void **state)
{
    world *w = *state;
    uint8_t env[512];
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    size_t n = seal_for(w, 104, "k", 2, "elsewhere", "y", env, sizeof env);
    mrs_add(w->m, 104, KS_VALUE_BLOB, 0, env, n);
    int fails = 0;
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 0, count_failure, &fails, &vr), KS_OK);
    assert_int_equal(vr.checked, N_ROWS - N_ROWS / 10 + 1);
    assert_int_equal(vr.failed, 1);
    assert_int_equal(fails, 1);
    assert_int_equal(vr.skipped, N_ROWS / 10);
    /* a sample never checks more rows than exist */
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 5, NULL, NULL, &vr), KS_OK);
    assert_true(vr.checked + vr.skipped <= N_ROWS + 1);
    /* an unreachable provider stops verify instead of failing rows */
    ks_ctx_free(w->ctx);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    ks_mem_fail(&w->mem, KS_MEM_UNWRAP, KS_ERR_UNAVAILABLE, 1);
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 0, NULL, NULL, &vr), KS_ERR_UNAVAILABLE);
}

/* from_key_id confines rewrap, reencrypt and verify to one key: another
 * key's envelope, plaintext, NULL are skipped and never touched, even an
 * "other" envelope that would not open under this run's tenant; a
 * malformed value is still quarantined; encrypt refuses the filter; the
 * filter is part of the checkpoint's parameters. */
static void test_from_key(void **state)
{
    world *w = *state;
    uint8_t env[512], oth[512];
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    ks_checkpoint cp;
    assert_int_equal(run(w, &p, &cp), KS_OK);
    size_t on = seal_for(w, 101, "other", 2, "elsewhere", "theirs", oth, sizeof oth);
    mrs_add(w->m, 101, KS_VALUE_BLOB, 0, oth, on);
    mrs_add(w->m, 102, KS_VALUE_TEXT, 0, "plain", 5);
    size_t n = seal_for(w, 103, "k", 2, NULL, "z", env, sizeof env);
    mrs_add(w->m, 103, KS_VALUE_BLOB, 0, env, n - 1); /* truncated: its key cannot be known */
    p.from_key_id = BV("k");
    assert_int_equal(run(w, &p, &cp), KS_ERR_INVALID_ARGUMENT); /* encrypt has no source key */
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    for (int mode = 0; mode < 2; mode++) {
        p = mparams(mode ? KS_MIGRATE_REENCRYPT : KS_MIGRATE_REWRAP, "k", 2);
        p.from_key_id = BV("k");
        p.max_failure_rate = 0.5;
        assert_int_equal(run(w, &p, &cp), KS_OK);
        assert_int_equal(cp.done, mode ? 0 : N_ROWS - N_ROWS / 10); /* reencrypt: all at target */
        assert_int_equal(cp.wrong_state, 0);
        assert_int_equal(cp.quarantined, mode ? 0 : 1); /* already in quarantine the 2nd time */
        assert_memory_equal(mrs_find(w->m, 101)->value.bytes, oth, on);
        assert_false(mrs_find(w->m, 101)->quarantined);
        assert_memory_equal(mrs_find(w->m, 102)->value.bytes, "plain", 5);
        assert_true(mrs_find(w->m, 103)->quarantined);
    }
    check_all(w, "k", 2);
    /* another filter is another migration: its checkpoint is its own */
    uint8_t a[512], b[512];
    size_t al = 0, bl = 0;
    p.from_key_id = (ks_bytes){NULL, 0};
    assert_int_equal(ks_migrate_canonical_params(&p, 2, (char *)a, sizeof a, &al), KS_OK);
    p.from_key_id = BV("k");
    assert_int_equal(ks_migrate_canonical_params(&p, 2, (char *)b, sizeof b, &bl), KS_OK);
    assert_true(al != bl || memcmp(a, b, al) != 0);
    /* verify with the filter skips the other key's row, which would fail */
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &w->st, &p, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.failed, 1); /* the truncated row: a verify failure, whatever its key */
    assert_int_equal(vr.checked, N_ROWS - N_ROWS / 10 + 1);
    assert_int_equal(vr.skipped, N_ROWS / 10 + 2);
}

/* A different migration may not start over an unfinished one. */
static void test_mismatch(void **state)
{
    world *w = *state;
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    g_stop = 0;
    assert_int_equal(ks_migrate_run(w->ctx, &w->st, &p, &g_stop, stop_after_first, NULL, NULL),
                     KS_ERR_STOPPED);
    ks_migrate_params q = mparams(KS_MIGRATE_ENCRYPT, "other", 0);
    assert_int_equal(run(w, &q, NULL), KS_ERR_MISMATCH);
    p.batch_size = 100; /* batch size is not part of the identity */
    assert_int_equal(run(w, &p, NULL), KS_OK);
}

/* supersede: a paused migration with other parameters is marked
 * "superseded" (cursor and counts kept) instead of refusing the run; a
 * superseded one refuses nobody afterwards, and can still be resumed. */
static void test_supersede(void **state)
{
    world *w = *state;
    fill_plain(w);
    ks_migrate_params p = mparams(KS_MIGRATE_ENCRYPT, "k", 0);
    g_stop = 0;
    ks_checkpoint cp;
    assert_int_equal(ks_migrate_run(w->ctx, &w->st, &p, &g_stop, stop_after_first, NULL, &cp),
                     KS_ERR_STOPPED);
    uint64_t done = cp.done;
    assert_true(done > 0);
    ks_migrate_params q = mparams(KS_MIGRATE_ENCRYPT, "other", 0);
    q.supersede = 1;
    assert_int_equal(run(w, &q, &cp), KS_OK);
    assert_int_equal(cp.done, N_ROWS - N_ROWS / 10 - done); /* the rest of the plaintext */
    size_t found = 0;
    for (size_t i = 0; i < MRS_MAX_CP; i++) {
        const mrs_cp *c = &w->m->cps[i];
        if (c->used && c->cp.state.len == 10 && memcmp(c->cp.state.ptr, "superseded", 10) == 0) {
            assert_int_equal(c->cp.done, done);
            found++;
        }
    }
    assert_int_equal(found, 1);
    /* the superseded one no longer refuses a third migration ... */
    ks_migrate_params t = mparams(KS_MIGRATE_ENCRYPT, "k", 1);
    assert_int_equal(run(w, &t, NULL), KS_OK); /* nothing left to encrypt */
    /* ... and resuming it picks up its own checkpoint */
    assert_int_equal(run(w, &p, &cp), KS_OK);
    assert_int_equal(cp.done, done); /* every row is an envelope now: wrong state */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_template_fault_offset),
        cmocka_unit_test_setup_teardown(test_unstable_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_census, setup, teardown),
        cmocka_unit_test(test_census_batches),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_format_with_purpose, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_state_and_quarantine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_unavailable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_unavailable_serial, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serial, setup, teardown),
        cmocka_unit_test_setup_teardown(test_races_batched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_races, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_from_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_supersede, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_census_sqlite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sqlite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sqlite_base64, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sqlite_corrected_run, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
