/*
 * fuzz/fuzz_providers.c -- the provider registry parser, its route query
 * and its canonical encoder (migrate/keys/registry_format.c,
 * docs/providers.md "Registry") on arbitrary bytes.  The loader is not
 * fuzzed: it opens files and providers; the parser is what reads the
 * untrusted bytes.
 *
 * The input is a registry file.  Oracles (each failure calls abort(), so
 * every engine reports it):
 *   1. Rejection.  The code is a rejection code (1..11) or conflict, the
 *      offset within [0, len], line and column agree with the offset
 *      ([P-ERR-3], recomputed here), the section number is at most 65,
 *      the result is all zero, and a NULL err changes nothing but the
 *      report.
 *   2. Acceptance.  A second parse gives the identical result (same
 *      views: the parse is deterministic); every view lies inside the
 *      input and is non-empty where present; the counts are within the
 *      limits, every provider serves something and every serve line's
 *      provider exists; a numeric setting's number agrees with its
 *      presence and limits; arg lines belong to plugin providers, in
 *      contiguous runs of at most KS_PLUGIN_ARGS_MAX; so do env and
 *      env-prefix lines (KS_PLUGIN_ENV_MAX), each a variable name of
 *      [P-VAL-3], none given twice in one provider [P-PLUGIN-9].
 *   3. Canonical form [P-CANON-1].  The encoder's output is no longer than
 *      the input, parses to the same registry (values compared by bytes),
 *      and re-encodes to itself; the input without its final LF is
 *      truncated at len - 1 [P-LINE-1].
 *   4. Routing [P-ROUTE-1..3].  ks_regf_route agrees with a reference
 *      written here from the clauses, for every serve pattern, for each
 *      pattern with a byte appended or removed, and for the input's first
 *      bytes.
 *   5. The names of the keys and types each appear in the input's
 *      canonical form where the registry uses them, and the caller errors
 *      of route and encode are invalid-argument.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/error.h>
#include <keyshift/plugin.h>

#include "../migrate/keys/registry_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

static ks_regf_file first, second, canon;
static uint8_t enc[KS_REGF_FILE_MAX], enc2[KS_REGF_FILE_MAX];

/* Nonzero when every byte of p[0, n) is zero. */
static int all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* Nonzero when v is absent, or a non-empty view inside data[0, size). */
static int view_inside(ks_bytes v, const uint8_t *data, size_t size)
{
    if (v.ptr == NULL) {
        return v.len == 0;
    }
    return v.len > 0 && v.ptr >= data && v.len <= size && (size_t)(v.ptr - data) <= size - v.len;
}

/* Nonzero when a and b hold the same bytes. */
static int same_bytes(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Nonzero when two parses describe the same registry, by bytes. */
static int same_registry(const ks_regf_file *a, const ks_regf_file *b)
{
    if (a->nproviders != b->nproviders || a->nserves != b->nserves || a->nargs != b->nargs ||
        a->nenvs != b->nenvs) {
        return 0;
    }
    for (size_t i = 0; i < a->nproviders; i++) {
        const ks_regf_provider *x = &a->providers[i], *y = &b->providers[i];
        if (!same_bytes(x->name, y->name) || x->type != y->type ||
            memcmp(x->number, y->number, sizeof x->number) != 0 || x->serves != y->serves ||
            x->args != y->args || x->envs != y->envs) {
            return 0;
        }
        for (int k = 0; k < KS_REGF_KEY_COUNT; k++) {
            if (!same_bytes(x->value[k], y->value[k])) {
                return 0;
            }
        }
    }
    for (size_t j = 0; j < a->nserves; j++) {
        const ks_regf_serve *x = &a->serves[j], *y = &b->serves[j];
        if (!same_bytes(x->pattern, y->pattern) || x->prefix != y->prefix ||
            x->provider != y->provider) {
            return 0;
        }
    }
    for (size_t j = 0; j < a->nargs; j++) {
        if (!same_bytes(a->args[j].value, b->args[j].value) ||
            a->args[j].provider != b->args[j].provider) {
            return 0;
        }
    }
    for (size_t j = 0; j < a->nenvs; j++) {
        if (!same_bytes(a->envs[j].name, b->envs[j].name) || a->envs[j].prefix != b->envs[j].prefix ||
            a->envs[j].provider != b->envs[j].provider) {
            return 0;
        }
    }
    return 1;
}

/* The largest value of each numeric setting, by key (0: not a number). */
static const uint32_t number_max[KS_REGF_KEY_COUNT] = {
    [KS_REGF_TIMEOUT_MS] = KS_REGF_TIMEOUT_MAX,
    [KS_REGF_RETRIES] = KS_PLUGIN_RETRIES_MAX,
    [KS_REGF_RETRY_BUDGET_MS] = KS_PLUGIN_BUDGET_MAX,
    [KS_REGF_RATE_LIMIT] = KS_PLUGIN_RATE_MAX,
    [KS_REGF_CONCURRENCY] = KS_PLUGIN_CONCURRENCY_MAX,
};

/* The arg lines of an accepted registry: each of a plugin provider,
 * contiguous, at most KS_PLUGIN_ARGS_MAX of one, counted right. */
static void check_args(const uint8_t *data, size_t size)
{
    uint32_t per[KS_REGF_PROVIDERS_MAX] = {0};
    CHECK(first.nargs <= KS_REGF_ARGS_MAX);
    for (size_t j = 0; j < first.nargs; j++) {
        const ks_regf_arg *a = &first.args[j];
        CHECK(view_inside(a->value, data, size) && a->value.ptr != NULL);
        CHECK(a->provider < first.nproviders);
        CHECK(first.providers[a->provider].type == KS_REGF_PLUGIN);
        CHECK(j == 0 || a->provider >= first.args[j - 1].provider);
        per[a->provider]++;
    }
    for (size_t i = 0; i < first.nproviders; i++) {
        CHECK(per[i] == first.providers[i].args && per[i] <= KS_PLUGIN_ARGS_MAX);
    }
}

/* Nonzero when v is a variable name of [P-VAL-3]. */
static int env_name_ok(ks_bytes v)
{
    if (v.len == 0 || v.len > KS_REGF_ENV_MAX || (v.ptr[0] >= '0' && v.ptr[0] <= '9')) {
        return 0;
    }
    for (size_t i = 0; i < v.len; i++) {
        const uint8_t b = v.ptr[i];
        if (!((b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '_')) {
            return 0;
        }
    }
    return 1;
}

/* The env and env-prefix lines of an accepted registry [P-PLUGIN-9]:
 * each of a plugin provider, contiguous, at most KS_PLUGIN_ENV_MAX of
 * one, counted right, a variable name, and no name (or prefix) twice in
 * one provider. */
static void check_envs(const uint8_t *data, size_t size)
{
    uint32_t per[KS_REGF_PROVIDERS_MAX] = {0};
    CHECK(first.nenvs <= KS_REGF_ENVS_MAX);
    for (size_t j = 0; j < first.nenvs; j++) {
        const ks_regf_env *x = &first.envs[j];
        CHECK(view_inside(x->name, data, size) && env_name_ok(x->name) && x->prefix <= 1);
        CHECK(x->provider < first.nproviders);
        CHECK(first.providers[x->provider].type == KS_REGF_PLUGIN);
        CHECK(j == 0 || x->provider >= first.envs[j - 1].provider);
        for (size_t k = j; k-- > 0 && first.envs[k].provider == x->provider;) {
            CHECK(first.envs[k].prefix != x->prefix || !same_bytes(first.envs[k].name, x->name));
        }
        per[x->provider]++;
    }
    for (size_t i = 0; i < first.nproviders; i++) {
        CHECK(per[i] == first.providers[i].envs && per[i] <= KS_PLUGIN_ENV_MAX);
    }
}

/* Oracle 1: a rejection is well formed. */
static void check_rejection(const uint8_t *data, size_t size, ks_err code, const ks_regf_error *e)
{
    CHECK(ks_err_is_rejection(code) || code == KS_ERR_CONFLICT);
    CHECK(e->code == code);
    CHECK(e->offset <= size);
    CHECK(e->provider <= KS_REGF_PROVIDERS_MAX + 1);
    CHECK(all_zero(&first, sizeof first));
    size_t line = 1, start = 0;
    for (size_t i = 0; i < e->offset; i++) {
        if (data[i] == '\n') {
            line++;
            start = i + 1;
        }
    }
    CHECK(e->line == line && e->column == e->offset - start + 1);
    CHECK(ks_regf_parse(data, size, &second, NULL) == code);
}

/* Oracle 2: the shape of an accepted registry. */
static void check_accepted(const uint8_t *data, size_t size)
{
    CHECK(ks_regf_parse(data, size, &second, NULL) == KS_OK);
    CHECK(memcmp(&first, &second, sizeof first) == 0);
    CHECK(first.nproviders >= 1 && first.nproviders <= KS_REGF_PROVIDERS_MAX);
    CHECK(first.nserves >= first.nproviders && first.nserves <= KS_REGF_SERVES_MAX);
    for (size_t i = 0; i < first.nproviders; i++) {
        const ks_regf_provider *p = &first.providers[i];
        CHECK(view_inside(p->name, data, size) && p->name.len <= KS_REGF_NAME_MAX);
        CHECK(p->type == KS_REGF_LOCAL || p->type == KS_REGF_PKCS11 || p->type == KS_REGF_PLUGIN);
        CHECK(p->serves >= 1);
        CHECK(p->offset < size);
        CHECK(p->value[KS_REGF_TYPE].ptr != NULL);
        for (int k = 0; k < KS_REGF_KEY_COUNT; k++) {
            CHECK(view_inside(p->value[k], data, size));
        }
        for (int k = 0; k < KS_REGF_KEY_COUNT; k++) {
            CHECK(p->number[k] <= number_max[k]);
            CHECK(p->value[k].ptr != NULL || p->number[k] == 0);
        }
        CHECK(p->value[KS_REGF_TIMEOUT_MS].ptr == NULL || p->number[KS_REGF_TIMEOUT_MS] != 0);
        CHECK((p->value[KS_REGF_COMMAND].ptr != NULL) == (p->type == KS_REGF_PLUGIN));
        if (p->type == KS_REGF_LOCAL) {
            CHECK(p->value[KS_REGF_KEYRING].ptr != NULL);
            CHECK(p->value[KS_REGF_PIN_FILE].ptr == NULL && p->value[KS_REGF_MODULE].ptr == NULL);
        } else if (p->type == KS_REGF_PLUGIN) {
            CHECK(p->value[KS_REGF_KEYRING].ptr == NULL && p->value[KS_REGF_PIN_ENV].ptr == NULL);
            CHECK(p->value[KS_REGF_GCM_PARAMS].ptr == NULL);
        } else {
            CHECK((p->value[KS_REGF_TOKEN_LABEL].ptr == NULL) != (p->value[KS_REGF_TOKEN_URI].ptr == NULL));
            CHECK((p->value[KS_REGF_PIN_FILE].ptr == NULL) != (p->value[KS_REGF_PIN_ENV].ptr == NULL));
            CHECK(p->value[KS_REGF_KEYRING].ptr == NULL);
        }
    }
    size_t counted = 0;
    for (size_t j = 0; j < first.nserves; j++) {
        const ks_regf_serve *s = &first.serves[j];
        CHECK(view_inside(s->pattern, data, size) && s->pattern.ptr != NULL);
        CHECK(s->pattern.len <= KS_REGF_PATTERN_MAX && s->prefix <= 1);
        CHECK(s->provider < first.nproviders);
        CHECK(j == 0 || s->provider >= first.serves[j - 1].provider); /* sections are contiguous */
        counted++;
    }
    CHECK(counted == first.nserves);
    check_args(data, size);
    check_envs(data, size);
}

/* Oracle 3: the canonical form. */
static void check_canonical(const uint8_t *data, size_t size)
{
    size_t n = 0, m = 0;
    CHECK(ks_regf_encode(&first, enc, sizeof enc, &n) == KS_OK);
    CHECK(n <= size);
    CHECK(ks_regf_parse(enc, n, &canon, NULL) == KS_OK);
    CHECK(same_registry(&first, &canon));
    CHECK(ks_regf_encode(&canon, enc2, sizeof enc2, &m) == KS_OK);
    CHECK(m == n && memcmp(enc, enc2, n) == 0);
    CHECK(ks_regf_encode(&first, enc2, n - 1, &m) == KS_ERR_BUFFER_TOO_SMALL && m == n);
    CHECK(ks_regf_encode(&first, NULL, 0, &m) == KS_ERR_BUFFER_TOO_SMALL && m == n);
    /* Without its final LF: truncated, unless that LF ended an empty
     * last line, which is then simply gone. */
    ks_regf_error e;
    if (data[size - 2] == '\n') {
        CHECK(ks_regf_parse(data, size - 1, &second, &e) == KS_OK);
        CHECK(same_registry(&first, &second));
    } else {
        CHECK(ks_regf_parse(data, size - 1, &second, &e) == KS_ERR_TRUNCATED);
        CHECK(e.offset == size - 1);
    }
}

/* The reference route of [P-ROUTE-1..3]: an exact serve line, else the
 * longest serve-prefix that key begins with; -1 for none. */
static long reference_route(const ks_regf_file *f, const uint8_t *key, size_t len)
{
    long best = -1;
    size_t best_len = 0;
    for (size_t j = 0; j < f->nserves; j++) {
        const ks_regf_serve *s = &f->serves[j];
        if (!s->prefix && s->pattern.len == len && memcmp(s->pattern.ptr, key, len) == 0) {
            return s->provider;
        }
    }
    for (size_t j = 0; j < f->nserves; j++) {
        const ks_regf_serve *s = &f->serves[j];
        if (s->prefix && s->pattern.len <= len && memcmp(s->pattern.ptr, key, s->pattern.len) == 0) {
            CHECK(s->pattern.len != best_len || best < 0); /* [P-SERVE-3]: unique */
            if (s->pattern.len > best_len) {
                best = s->provider;
                best_len = s->pattern.len;
            }
        }
    }
    return best;
}

/* Check ks_regf_route against the reference for key[0, len). */
static void check_route(const uint8_t *key, size_t len)
{
    size_t got = SIZE_MAX;
    const ks_err e = ks_regf_route(&first, (ks_bytes){len ? key : NULL, len}, &got);
    const long want = reference_route(&first, key, len);
    if (want < 0) {
        CHECK(e == KS_ERR_NOT_FOUND);
    } else {
        CHECK(e == KS_OK && got == (size_t)want);
    }
}

/* Oracle 4: routing for the patterns and their neighbours. */
static void check_routing(const uint8_t *data, size_t size)
{
    uint8_t key[KS_REGF_PATTERN_MAX + 1];
    for (size_t j = 0; j < first.nserves; j++) {
        const ks_bytes p = first.serves[j].pattern;
        memcpy(key, p.ptr, p.len);
        check_route(key, p.len);
        check_route(key, p.len - 1);
        key[p.len] = data[j % size];
        check_route(key, p.len + 1);
    }
    check_route(data, size < KS_REGF_PATTERN_MAX ? size : KS_REGF_PATTERN_MAX);
}

/* Nonzero when the text s occurs in p[0, n). */
static int has_text(const uint8_t *p, size_t n, const char *s)
{
    const size_t m = strlen(s);
    for (size_t i = 0; i + m <= n; i++) {
        if (memcmp(p + i, s, m) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Oracle 5: names and caller errors (enc holds the canonical form). */
static void check_names(void)
{
    size_t n = 0, i;
    CHECK(ks_regf_encode(&first, enc, sizeof enc, &n) == KS_OK);
    for (int k = -1; k <= KS_REGF_ENV_PREFIX + 1; k++) {
        const char *name = ks_regf_key_name(k);
        CHECK((name != NULL) == (k >= 0 && k <= KS_REGF_ENV_PREFIX));
        if (k > KS_REGF_TYPE && k < KS_REGF_KEY_COUNT && first.providers[0].value[k].len != 0) {
            CHECK(has_text(enc, n, name));
        }
    }
    CHECK(ks_regf_type_name(0) == NULL && ks_regf_type_name(KS_REGF_PLUGIN + 1) == NULL);
    CHECK(first.providers[0].args == 0 || has_text(enc, n, "\n  arg "));
    CHECK(first.providers[0].envs == 0 || has_text(enc, n, "\n  env"));
    CHECK(has_text(enc, n, ks_regf_type_name(first.providers[0].type)));
    CHECK(ks_regf_route(NULL, (ks_bytes){NULL, 0}, &i) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_regf_route(&first, (ks_bytes){NULL, 0}, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_regf_route(&first, (ks_bytes){NULL, 1}, &i) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_regf_encode(NULL, enc, sizeof enc, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_regf_encode(&first, NULL, 1, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_regf_encode(&first, enc, sizeof enc, NULL) == KS_ERR_INVALID_ARGUMENT);
}

/* One input: oracles 1 to 5 (see the header comment). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_regf_error e;
    const ks_err code = ks_regf_parse(data, size, &first, &e);
    if (code != KS_OK) {
        check_rejection(data, size, code, &e);
        return 0;
    }
    check_accepted(data, size);
    check_canonical(data, size);
    check_routing(data, size);
    check_names();
    return 0;
}
