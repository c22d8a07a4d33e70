/*
 * tests/test_registry.c -- unit tests of the provider registry: the file
 * format (migrate/keys/registry_format.c), loading and the routing
 * provider (include/keyshift/registry.h, docs/providers.md "Registry").
 *
 * The vectors of docs/providers.md Appendix R are checked by
 * test_spec_vectors (path: $KS_SPEC's directory, else docs/), with a
 * loader as strict as the one tests/test_keyring.c has for keyring.md.
 * Every test that touches files works in its own directory made with
 * mkdtemp under /tmp and removed afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/keyring.h>
#include <keyshift/pkcs11.h>
#include <keyshift/provider.h>
#include <keyshift/registry.h>

#include "../migrate/keys/registry_format.h"
#include "test_files.h"

typedef tf_text text;

/* A ks_bytes over a C string. */
#define B(s) ((ks_bytes){(const uint8_t *)(s), strlen(s)})
#define NO_PASS ((ks_bytes){NULL, 0})

/* ---- per-test directory and files -------------------------------------------------- */

/* A directory /tmp/ks-registry-test-XXXXXX; the fixture's path is dir/providers. */
static int setup(void **state)
{
    return tf_setup(state, "registry", "providers");
}

/* Remove the directory and every file in it. */
static int teardown(void **state)
{
    return tf_teardown(state);
}

/* Write the text s to path, mode 0644. */
static void spit_text(const char *path, const char *s)
{
    tf_spit(path, s, strlen(s), 0644);
}

/* Parse the C string s; the parser's result. */
static ks_err parse_text(const char *s, ks_regf_file *f, ks_regf_error *e)
{
    return ks_regf_parse((const uint8_t *)s, strlen(s), f, e);
}

/* Render a parsed registry as Appendix R's result lines, each ended by LF. */
static void render(const ks_regf_file *f, text *t)
{
    for (size_t i = 0; i < f->nproviders; i++) {
        const ks_regf_provider *p = &f->providers[i];
        const int nl = (int)p->name.len;
        const char *nm = (const char *)p->name.ptr;
        addf(t, "provider: %.*s %s\n", nl, nm, ks_regf_type_name(p->type));
        for (int k = KS_REGF_TYPE + 1; k < KS_REGF_KEY_COUNT; k++) {
            if (p->value[k].len != 0) {
                addf(t, "setting: %.*s %s %.*s\n", nl, nm, ks_regf_key_name(k),
                     (int)p->value[k].len, (const char *)p->value[k].ptr);
            }
        }
        for (size_t j = 0; j < f->nargs; j++) {
            if (f->args[j].provider == i) {
                addf(t, "setting: %.*s arg %.*s\n", nl, nm, (int)f->args[j].value.len,
                     (const char *)f->args[j].value.ptr);
            }
        }
        for (size_t j = 0; j < f->nenvs; j++) {
            if (f->envs[j].provider == i) {
                addf(t, "setting: %.*s %s %.*s\n", nl, nm, f->envs[j].prefix ? "env-prefix" : "env",
                     (int)f->envs[j].name.len, (const char *)f->envs[j].name.ptr);
            }
        }
        for (size_t j = 0; j < f->nserves; j++) {
            const ks_regf_serve *s = &f->serves[j];
            if (s->provider == i) {
                addf(t, "serve: %.*s %s %.*s\n", nl, nm, s->prefix ? "prefix" : "exact",
                     (int)s->pattern.len, (const char *)s->pattern.ptr);
            }
        }
    }
}

/* [P-CANON-1] for an accepted buf: its canonical form parses to the same
 * rendering, and is its own canonical form. */
static void check_canonical(const uint8_t *buf, size_t len, const ks_regf_file *f)
{
    static ks_regf_file g;
    text a = {0}, b = {0};
    size_t n = 0, m = 0;
    (void)buf;
    (void)len;
    assert_int_equal(ks_regf_encode(f, NULL, 0, &n), KS_ERR_BUFFER_TOO_SMALL);
    uint8_t *out = malloc(n), *again = malloc(n);
    assert_true(out != NULL && again != NULL);
    assert_int_equal(ks_regf_encode(f, out, n, &m), KS_OK);
    assert_int_equal(m, n);
    assert_int_equal(ks_regf_parse(out, n, &g, NULL), KS_OK);
    render(f, &a);
    render(&g, &b);
    assert_string_equal(a.s, b.s);
    assert_int_equal(ks_regf_encode(&g, again, n, &m), KS_OK);
    assert_int_equal(m, n);
    assert_memory_equal(out, again, n);
    free(out);
    free(again);
    free(a.s);
    free(b.s);
}

/* ---- the format: errors and limits not in the appendix -------------------------- */

/* The limit cases the appendix leaves to this test: 64 providers and 256
 * serve lines pass, one more of either is too-large; a file of 65536
 * bytes passes, one byte more is too-large at 65536. */
static void test_limits(void **state)
{
    static ks_regf_file f;
    ks_regf_error e;
    (void)state;

    for (int extra = 0; extra <= 1; extra++) {
        text t = {0};
        addf(&t, "keyshift-providers 1\n");
        for (int i = 0; i < 64 + extra; i++) {
            addf(&t, "provider p%d\n  type local\n  keyring /k\n  serve k%d\n", i, i);
        }
        const char *last = strstr(t.s, "provider p64\n");
        assert_int_equal(parse_text(t.s, &f, &e), extra ? KS_ERR_TOO_LARGE : KS_OK);
        if (extra) {
            assert_int_equal(e.offset, (size_t)(last - t.s));
            assert_int_equal(e.provider, 65);
            assert_int_equal(e.line, 1 + 4 * 64 + 1);
            assert_int_equal(e.column, 1);
        } else {
            assert_int_equal(f.nproviders, 64);
            check_canonical((const uint8_t *)t.s, t.len, &f);
        }
        free(t.s);
    }
    for (int extra = 0; extra <= 1; extra++) {
        text t = {0};
        addf(&t, "keyshift-providers 1\nprovider a\n  type local\n  keyring /k\n");
        for (int i = 0; i < 128; i++) {
            addf(&t, "  serve k%d\n", i);
        }
        addf(&t, "provider b\n  type local\n  keyring /k\n");
        for (int i = 0; i < 128 + extra; i++) {
            addf(&t, "  serve-prefix k%d/\n", i);
        }
        assert_int_equal(parse_text(t.s, &f, &e), extra ? KS_ERR_TOO_LARGE : KS_OK);
        if (extra) {
            assert_int_equal(e.offset, (size_t)(strstr(t.s, "  serve-prefix k128/") - t.s) + 2);
            assert_int_equal(e.provider, 2);
        } else {
            assert_int_equal(f.nserves, 256);
            check_canonical((const uint8_t *)t.s, t.len, &f);
        }
        free(t.s);
    }
    /* A file of exactly 65536 bytes, then 65537. */
    const char *head = "keyshift-providers 1\nprovider a\n  type local\n  keyring /k\n  serve k\n";
    uint8_t *big = malloc(KS_REGF_FILE_MAX + 1);
    assert_non_null(big);
    memset(big, '#', KS_REGF_FILE_MAX + 1);
    memcpy(big, head, strlen(head));
    for (size_t i = strlen(head) + 1000; i < KS_REGF_FILE_MAX; i += 1001) {
        big[i] = '\n';
    }
    big[KS_REGF_FILE_MAX - 1] = '\n';
    assert_int_equal(ks_regf_parse(big, KS_REGF_FILE_MAX, &f, &e), KS_OK);
    big[KS_REGF_FILE_MAX] = '\n';
    assert_int_equal(ks_regf_parse(big, KS_REGF_FILE_MAX + 1, &f, &e), KS_ERR_TOO_LARGE);
    assert_int_equal(e.offset, KS_REGF_FILE_MAX);
    assert_int_equal(f.nproviders, 0);
    free(big);
}

/* The limits of a repeated plugin line (arg [P-PLUGIN-3], env
 * [P-PLUGIN-9]): 32 in a provider and 256 in the file pass; a 33rd in a
 * provider, or a 257th in the file, is too-large at its KEY.  The lines
 * are stem and a number; key is another line's "  KEY " text; count
 * gives how many a parse holds. */
static void repeat_limits(const char *stem, const char *key, size_t (*count)(const ks_regf_file *f))
{
    static ks_regf_file f;
    ks_regf_error e;
    char want[32];
    for (int extra = 0; extra <= 1; extra++) {
        text t = {0};
        addf(&t, "keyshift-providers 1\n");
        for (int i = 0; i < 8; i++) {
            addf(&t, "provider p%d\n  type plugin\n  command aws\n", i);
            for (int j = 0; j < 32 + (i == 7 ? extra : 0); j++) {
                addf(&t, "%s%d\n", stem, j);
            }
            addf(&t, "  serve k%d\n", i);
        }
        assert_int_equal(parse_text(t.s, &f, &e), extra ? KS_ERR_TOO_LARGE : KS_OK);
        if (extra) {
            snprintf(want, sizeof want, "%s32\n", stem);
            assert_int_equal(e.offset, (size_t)(strstr(strstr(t.s, "provider p7"), want) - t.s) + 2);
            assert_int_equal(e.provider, 8);
        } else {
            assert_int_equal(count(&f), 256);
            check_canonical((const uint8_t *)t.s, t.len, &f);
            /* A 257th in the file, in a provider of one. */
            addf(&t, "provider q\n  type plugin\n  command aws\n%sX\n  serve q\n", key);
            assert_int_equal(parse_text(t.s, &f, &e), KS_ERR_TOO_LARGE);
            snprintf(want, sizeof want, "%sX\n", key);
            assert_int_equal(e.offset, (size_t)(strstr(t.s, want) - t.s) + 2);
            assert_int_equal(e.provider, 9);
        }
        free(t.s);
    }
}

/* The arg lines of a parse. */
static size_t count_args(const ks_regf_file *f)
{
    return f->nargs;
}

/* The env and env-prefix lines of a parse. */
static size_t count_envs(const ks_regf_file *f)
{
    return f->nenvs;
}

/* The arg limits [P-PLUGIN-3] (see repeat_limits). */
static void test_arg_limits(void **state)
{
    (void)state;
    repeat_limits("  arg ", "  arg ", count_args);
}

/* The env limits [P-PLUGIN-9], env and env-prefix lines counted
 * together (see repeat_limits). */
static void test_env_limits(void **state)
{
    (void)state;
    repeat_limits("  env V", "  env-prefix ", count_envs);
}

/* [P-CANON-1] with arg lines: after the other settings (timeout-ms,
 * command, then the plugin numbers, in the table's order), in file
 * order, before the serve lines; spaces inside an arg kept. */
static void test_plugin_canonical(void **state)
{
    static ks_regf_file f;
    ks_regf_error e;
    uint8_t out[1024];
    size_t n = 0;
    (void)state;
    assert_int_equal(parse_text("# a plugin\nkeyshift-providers 1\nprovider kms\n  type plugin\n"
                                "  arg --b x\n  serve k/1\n  rate-limit 0\n  arg a\n"
                                "  command aws\n  serve-prefix k/\n  retries 2\n"
                                "  timeout-ms 40\n  arg --b x\n"
                                "provider dev\n  type local\n  keyring /k\n  serve d\n",
                                &f, &e),
                     KS_OK);
    assert_int_equal(f.nargs, 3);
    assert_int_equal(f.providers[0].args, 3);
    assert_int_equal(f.providers[1].args, 0);
    assert_int_equal(f.providers[0].number[KS_REGF_RETRIES], 2);
    assert_int_equal(f.providers[0].number[KS_REGF_TIMEOUT_MS], 40);
    assert_int_equal(f.providers[0].number[KS_REGF_RATE_LIMIT], 0);
    assert_non_null(f.providers[0].value[KS_REGF_RATE_LIMIT].ptr);
    assert_int_equal(ks_regf_encode(&f, out, sizeof out, &n), KS_OK);
    static const char want[] = "keyshift-providers 1\nprovider kms\n  type plugin\n"
                               "  timeout-ms 40\n  command aws\n  retries 2\n  rate-limit 0\n"
                               "  arg --b x\n  arg a\n  arg --b x\n  serve k/1\n"
                               "  serve-prefix k/\nprovider dev\n  type local\n  keyring /k\n"
                               "  serve d\n";
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(out, want, n);
    check_canonical(out, n, &f);
    assert_string_equal(ks_regf_type_name(KS_REGF_PLUGIN), "plugin");
    assert_string_equal(ks_regf_key_name(KS_REGF_ARG), "arg");
    assert_string_equal(ks_regf_key_name(KS_REGF_ENV), "env");
    assert_string_equal(ks_regf_key_name(KS_REGF_ENV_PREFIX), "env-prefix");
    assert_null(ks_regf_type_name(KS_REGF_PLUGIN + 1));
}

/* The section a fault is in, and the error struct for an accepted file. */
static void test_error_details(void **state)
{
    static ks_regf_file f;
    ks_regf_error e;
    (void)state;
    assert_int_equal(parse_text("keyshift-providers 1\nprovider a\n  type local\n  keyring /k\n"
                                "  serve x\nprovider b\n  type local\n  colour red\n", &f, &e),
                     KS_ERR_UNKNOWN_FIELD);
    assert_int_equal(e.provider, 2);
    assert_int_equal(e.line, 8);
    assert_int_equal(e.column, 3);
    /* A section's end is reported in that section. */
    assert_int_equal(parse_text("keyshift-providers 1\nprovider a\n  type local\nprovider b\n", &f,
                                &e), KS_ERR_MISSING_FIELD);
    assert_int_equal(e.provider, 1);
    assert_int_equal(e.line, 4);
    /* Before the first section; at the end of a file. */
    assert_int_equal(parse_text("keyshift-providers 1\n", &f, &e), KS_ERR_MISSING_FIELD);
    assert_int_equal(e.provider, 0);
    assert_int_equal(e.line, 2);
    assert_int_equal(e.column, 1);
    /* No err: the same code. */
    assert_int_equal(parse_text("keyshift-providers 2\n", &f, NULL), KS_ERR_UNSUPPORTED_VERSION);
    /* The encoder's argument checks. */
    size_t n;
    uint8_t b[4];
    assert_int_equal(ks_regf_encode(NULL, b, sizeof b, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_regf_encode(&f, NULL, 4, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_regf_encode(&f, b, sizeof b, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_null(ks_regf_key_name(-1));
    assert_null(ks_regf_key_name(99));
    assert_string_equal(ks_regf_key_name(KS_REGF_SERVE_PREFIX), "serve-prefix");
    assert_null(ks_regf_type_name(0));
    assert_string_equal(ks_err_name(KS_ERR_CONFLICT), "conflict");
}

/* ---- routing [P-ROUTE-1..3] --------------------------------------------------------- */

/* The provider index route() gives for key_id, or -1 for not-found. */
static int route_of(const ks_regf_file *f, const char *key_id)
{
    size_t i = 99;
    const ks_err e = ks_regf_route(f, B(key_id), &i);
    if (e == KS_ERR_NOT_FOUND) {
        return -1;
    }
    assert_int_equal(e, KS_OK);
    return (int)i;
}

/* Exact beats prefix wherever the lines are; the longest prefix wins;
 * a prefix matches the key_id equal to it; nothing else has a default. */
static void test_routing(void **state)
{
    static ks_regf_file f;
    ks_regf_error e;
    (void)state;
    assert_int_equal(parse_text("keyshift-providers 1\n"
                                "provider a\n  type local\n  keyring /a\n"
                                "  serve-prefix app/\n  serve-prefix app/eu/x\n"
                                "provider b\n  type local\n  keyring /b\n"
                                "  serve-prefix app/eu/\n  serve app/main\n"
                                "provider c\n  type local\n  keyring /c\n"
                                "  serve app/eu/x1\n  serve-prefix app/main\n  serve-prefix z\n",
                                &f, &e),
                     KS_OK);
    assert_int_equal(route_of(&f, "app/other"), 0);     /* the only prefix */
    assert_int_equal(route_of(&f, "app/"), 0);          /* a prefix equal to the key_id */
    assert_int_equal(route_of(&f, "app/eu/1"), 1);      /* the longer prefix */
    assert_int_equal(route_of(&f, "app/eu/x"), 0);      /* longer still */
    assert_int_equal(route_of(&f, "app/eu/x1"), 2);     /* exact beats every prefix */
    assert_int_equal(route_of(&f, "app/main"), 1);      /* exact beats an equal prefix */
    assert_int_equal(route_of(&f, "app/main2"), 2);     /* prefix app/main beats app/ */
    assert_int_equal(route_of(&f, "zebra"), 2);
    assert_int_equal(route_of(&f, "app"), -1);          /* shorter than every prefix */
    assert_int_equal(route_of(&f, "App/main"), -1);     /* bytewise */
    assert_int_equal(route_of(&f, "db"), -1);           /* no default */
    assert_int_equal(route_of(&f, ""), -1);
    size_t i;
    assert_int_equal(ks_regf_route(NULL, B("x"), &i), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_regf_route(&f, B("x"), NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_regf_route(&f, (ks_bytes){NULL, 3}, &i), KS_ERR_INVALID_ARGUMENT);
}

/* ---- loading ------------------------------------------------------------------------ */

/* Load path, expecting `want`; the error struct goes to *err. */
static ks_registry *load_expect(const char *path, ks_err want, ks_registry_error *err)
{
    ks_registry *r = (ks_registry *)(uintptr_t)1;
    assert_int_equal(ks_registry_load(path, &r, err), want);
    if (want != KS_OK) {
        assert_null(r);
    } else {
        assert_non_null(r);
        assert_int_equal(err->stage, KS_REGISTRY_STAGE_NONE);
    }
    return r;
}

/* Make a plain keyring at dir/name holding the given keys (each with one
 * version), closed again. */
static void make_keyring(const fixture *f, const char *name, const char *const *keys, size_t n,
                         ks_bytes pass, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", f->dir, name);
    assert_int_equal(ks_keyring_init(path, pass), KS_OK);
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    assert_int_equal(ks_keyring_open(path, pass, &kr, &pe), KS_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ks_keyring_create(kr, B(keys[i])), KS_OK);
    }
    ks_keyring_close(kr);
}

/* Make a keyring at dir/name holding the one key "k", as make_keyring. */
static void make_keyring_k(const fixture *f, const char *name, ks_bytes pass, char *path,
                           size_t cap)
{
    static const char *const keys[] = {"k"};
    make_keyring(f, name, keys, 1, pass, path, cap);
}

/* [P-LOAD-1]: the file checks, and [P-LOAD-2]'s stages. */
static void test_load_refusals(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    char kpath[192], link[192], text_buf[512];
    static const char *const none[] = {NULL};

    make_keyring(f, "k", none, 0, NO_PASS, kpath, sizeof kpath);
    snprintf(text_buf, sizeof text_buf,
             "keyshift-providers 1\nprovider a\n  type local\n  keyring %s\n  serve x\n", kpath);
    /* Arguments. */
    ks_registry *r = NULL;
    assert_int_equal(ks_registry_load(f->path, NULL, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_load(NULL, &r, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_load("", &r, NULL), KS_ERR_INVALID_ARGUMENT);
    /* Missing. */
    (void)load_expect(f->path, KS_ERR_IO, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_FILE);
    assert_int_equal(err.code, KS_ERR_IO);
    /* Readable by all is fine; writable by group or others is not. */
    tf_spit(f->path, text_buf, strlen(text_buf), 0644);
    r = load_expect(f->path, KS_OK, &err);
    ks_registry_close(r);
    tf_spit(f->path, text_buf, strlen(text_buf), 0664);
    (void)load_expect(f->path, KS_ERR_INSECURE, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_FILE);
    tf_spit(f->path, text_buf, strlen(text_buf), 0646);
    (void)load_expect(f->path, KS_ERR_INSECURE, &err);
    /* A symbolic link, even to a good file. */
    tf_spit(f->path, text_buf, strlen(text_buf), 0600);
    snprintf(link, sizeof link, "%s/link", f->dir);
    assert_int_equal(symlink(f->path, link), 0);
    (void)load_expect(link, KS_ERR_INSECURE, &err);
    /* A directory, a FIFO: not regular files (the FIFO is not waited on). */
    (void)load_expect(f->dir, KS_ERR_INSECURE, &err);
    snprintf(link, sizeof link, "%s/fifo", f->dir);
    assert_int_equal(mkfifo(link, 0600), 0);
    (void)load_expect(link, KS_ERR_INSECURE, &err);
    /* Too large: a rejection at 65536, whatever the bytes. */
    uint8_t *big = calloc(1, KS_REGF_FILE_MAX + 100);
    assert_non_null(big);
    tf_spit(f->path, big, KS_REGF_FILE_MAX + 100, 0600);
    free(big);
    (void)load_expect(f->path, KS_ERR_INTEGRITY, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PARSE);
    assert_int_equal(err.code, KS_ERR_TOO_LARGE);
    assert_int_equal(err.offset, KS_REGF_FILE_MAX);
    /* A rejection: code, offset, line and column. */
    spit_text(f->path, "keyshift-providers 1\nprovider a\n  type local\n  keyring k\n");
    (void)load_expect(f->path, KS_ERR_INTEGRITY, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PARSE);
    assert_int_equal(err.code, KS_ERR_BAD_VALUE);
    assert_int_equal(err.offset, 55);
    assert_int_equal(err.line, 4);
    assert_int_equal(err.column, 11);
    assert_int_equal(err.provider, 1);
    /* read: the same checks, no provider opened. */
    assert_int_equal(ks_registry_read(f->path, &r, &err), KS_ERR_INTEGRITY);
    assert_null(r);
}

/* Write a registry with two local keyrings: "one" serves app/ and the
 * exact key "shared"; "two" serves app/eu/ and db/.  Returns nothing;
 * the keyrings hold app/a, app/eu/x, shared (one) and app/eu/y, db/k,
 * app/b, shared (two: app/b and shared are routed to one, so its copies
 * are never used or listed). */
static void make_two(const fixture *f)
{
    static const char *const one[] = {"app/a", "app/eu/x", "shared"};
    static const char *const two[] = {"app/eu/y", "db/k", "app/b", "shared"};
    char p1[192], p2[192], pass_path[192];
    char buf[1024];
    make_keyring(f, "one.keyring", one, 3, NO_PASS, p1, sizeof p1);
    make_keyring(f, "two.keyring", two, 4, B("s3cret"), p2, sizeof p2);
    snprintf(pass_path, sizeof pass_path, "%s/two.pass", f->dir);
    tf_spit(pass_path, "s3cret\n", 7, 0600);
    snprintf(buf, sizeof buf,
             "keyshift-providers 1\n"
             "provider one\n  type local\n  keyring %s\n  serve-prefix app/\n  serve shared\n"
             "provider two\n  type local\n  keyring %s\n  passphrase-file %s\n"
             "  serve-prefix app/eu/\n  serve-prefix db/\n",
             p1, p2, pass_path);
    spit_text(f->path, buf);
}

/* What a listing collected (admin list callback). */
typedef struct listing {
    char ids[16][32];
    uint32_t version[16];
    int primary[16];
    size_t n, stop_after;
} listing;

/* Collect one entry; stop after stop_after entries when it is set. */
static int collect(void *arg, const ks_key_entry *e)
{
    listing *l = arg;
    assert_true(l->n < 16 && e->key_id.len < 32);
    memcpy(l->ids[l->n], e->key_id.ptr, e->key_id.len);
    l->ids[l->n][e->key_id.len] = '\0';
    l->version[l->n] = e->version;
    l->primary[l->n] = e->is_primary;
    l->n++;
    return l->stop_after != 0 && l->n == l->stop_after;
}

/* The keyring at dir/name holds key_id (reopened from disk). */
static int holds(const fixture *f, const char *name, ks_bytes pass, const char *key_id)
{
    char path[192];
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    ks_key_info info;
    ks_provider p;
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    assert_int_equal(ks_keyring_open(path, pass, &kr, &pe), KS_OK);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    const ks_err e = p.ops->key_info(p.self, B(key_id), 0, &info, 0);
    ks_keyring_close(kr);
    return e == KS_OK;
}

/* A registry of two local keyrings: each call reaches the provider that
 * serves its key_id, and only that one ([P-ROUTE-1..5]). */
static void test_two_keyrings(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    ks_provider p;
    ks_key_info info;
    uint8_t dek[KS_DEK_LEN], back[KS_DEK_LEN], wrapped[128];
    size_t wlen = 0;
    const ks_bytes aad = B("wrap-aad");

    make_two(f);
    ks_registry *r = load_expect(f->path, KS_OK, &err);
    assert_int_equal(ks_registry_provider(r, &p), KS_OK);
    assert_string_equal(p.name, "registry");
    assert_int_equal(ks_registry_count(r), 2);

    /* Routing queries. */
    size_t i = 9;
    assert_int_equal(ks_registry_route(r, B("app/eu/x"), &i), KS_OK);
    assert_int_equal(i, 1);
    assert_int_equal(ks_registry_route(r, B("shared"), &i), KS_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ks_registry_route(r, B("other"), &i), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_route(NULL, B("other"), &i), KS_ERR_INVALID_ARGUMENT);

    /* wrap/unwrap round trip through the registry, and straight through
     * the serving keyring: app/a is one's. */
    randombytes_buf(dek, sizeof dek);
    assert_int_equal(p.ops->wrap(p.self, B("app/a"), 1, dek, sizeof dek, aad, wrapped,
                                 sizeof wrapped, &wlen, 0), KS_OK);
    assert_int_equal(wlen, KS_LOCAL_WRAPPED_LEN);
    assert_int_equal(p.ops->unwrap(p.self, B("app/a"), 1, (ks_bytes){wrapped, wlen}, aad, back,
                                   sizeof back, 0), KS_OK);
    assert_memory_equal(dek, back, sizeof dek);
    /* app/eu/x exists in one but the registry routes it to two, which
     * does not have it: not-found, never a fallback to one. */
    assert_int_equal(p.ops->key_info(p.self, B("app/eu/x"), 0, &info, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->wrap(p.self, B("app/eu/x"), 1, dek, sizeof dek, aad, wrapped,
                                 sizeof wrapped, &wlen, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->key_info(p.self, B("app/eu/y"), 0, &info, 0), KS_OK);
    assert_int_equal(info.version, 1);
    assert_true(info.is_primary);
    assert_int_equal(p.ops->key_info(p.self, B("db/k"), 1, &info, 0), KS_OK);
    /* Unserved: not-found, and unwrap leaves the DEK zeroed. */
    memset(back, 0xA5, sizeof back);
    assert_int_equal(p.ops->unwrap(p.self, B("nothing"), 1, (ks_bytes){wrapped, wlen}, aad, back,
                                   sizeof back, 0), KS_ERR_NOT_FOUND);
    static const uint8_t zero[KS_DEK_LEN];
    assert_memory_equal(back, zero, sizeof back);
    assert_int_equal(p.ops->key_info(p.self, B("nothing"), 0, &info, 0), KS_ERR_NOT_FOUND);
    /* A blob wrapped by one does not unwrap as a key of two. */
    assert_int_equal(p.ops->unwrap(p.self, B("app/eu/y"), 1, (ks_bytes){wrapped, wlen}, aad,
                                   back, sizeof back, 0), KS_ERR_AUTH_FAILED);

    /* Key management goes to the serving keyring. */
    const ks_provider_admin_ops *a = p.ops->admin;
    assert_non_null(a);
    assert_int_equal(a->create(p.self, B("db/new"), 0), KS_OK);
    assert_int_equal(a->create(p.self, B("app/new"), 0), KS_OK);
    assert_int_equal(a->create(p.self, B("unserved"), 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->create(p.self, B("db/new"), 0), KS_ERR_EXISTS);
    uint32_t v = 0;
    assert_int_equal(a->add_version(p.self, B("db/new"), &v, 0), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(a->add_version(p.self, B("unserved"), &v, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->promote(p.self, B("db/new"), 2, 0), KS_OK);
    assert_int_equal(a->promote(p.self, B("unserved"), 1, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->set_state(p.self, B("db/new"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, B("unserved"), 1, KS_KEY_DISABLED, 0), KS_ERR_NOT_FOUND);
    assert_true(holds(f, "two.keyring", B("s3cret"), "db/new"));
    assert_false(holds(f, "one.keyring", NO_PASS, "db/new"));
    assert_true(holds(f, "one.keyring", NO_PASS, "app/new"));
    assert_false(holds(f, "two.keyring", B("s3cret"), "app/new"));

    /* The merged listing: routed keys only, in key_id order. */
    listing l = {0};
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    static const char *const want[] = {"app/a", "app/eu/y", "app/new", "db/k", "db/new",
                                       "db/new", "shared"};
    assert_int_equal(l.n, sizeof want / sizeof want[0]);
    for (size_t j = 0; j < l.n; j++) {
        assert_string_equal(l.ids[j], want[j]);
    }
    assert_true(l.version[4] == 1 && !l.primary[4] && l.version[5] == 2 && l.primary[5]);
    /* One key; a callback that stops; unserved. */
    l = (listing){0};
    assert_int_equal(a->list(p.self, B("db/new"), collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 2);
    l = (listing){.stop_after = 2};
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 2);
    assert_int_equal(a->list(p.self, B("unserved"), collect, &l, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->list(p.self, B("app/zzz"), collect, &l, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, NULL, &l, 0), KS_ERR_INVALID_ARGUMENT);

    /* The listing API: names, types, settings (no secret), serve lines. */
    ks_registry_info ri;
    ks_registry_setting rs;
    ks_registry_serve sv;
    assert_int_equal(ks_registry_info_at(r, 1, &ri), KS_OK);
    assert_string_equal(ri.name, "two");
    assert_string_equal(ri.type, "local");
    assert_int_equal(ri.settings, 2);
    assert_int_equal(ri.serves, 2);
    assert_int_equal(ks_registry_setting_at(r, 1, 0, &rs), KS_OK);
    assert_string_equal(rs.key, "keyring");
    assert_int_equal(ks_registry_setting_at(r, 1, 1, &rs), KS_OK);
    assert_string_equal(rs.key, "passphrase-file");
    assert_null(strstr(rs.value, "s3cret"));
    assert_int_equal(ks_registry_setting_at(r, 1, 2, &rs), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_serve_at(r, 1, 1, &sv), KS_OK);
    assert_string_equal(sv.pattern, "db/");
    assert_int_equal(sv.prefix, 1);
    assert_int_equal(ks_registry_serve_at(r, 0, 1, &sv), KS_OK);
    assert_string_equal(sv.pattern, "shared");
    assert_int_equal(sv.prefix, 0);
    assert_int_equal(ks_registry_serve_at(r, 0, 2, &sv), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_info_at(r, 2, &ri), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_info_at(NULL, 0, &ri), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_setting_at(r, 5, 0, &rs), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_serve_at(r, 0, 0, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_count(NULL), 0);
    ks_provider_destroy(&p); /* borrowed: the registry stays usable */
    assert_int_equal(ks_registry_provider(r, &p), KS_OK);
    assert_int_equal(ks_registry_provider(NULL, &p), KS_ERR_INVALID_ARGUMENT);
    ks_registry_close(r);
    ks_registry_close(NULL);
}

/* One thread of test_lazy_open: wrap and unwrap under "k" through the
 * shared routing provider, counting the failures. */
typedef struct lazy_thread {
    const ks_provider *p;
    int failures;
} lazy_thread;

static void *lazy_worker(void *arg)
{
    lazy_thread *t = arg;
    const ks_bytes aad = B("lazy");
    uint8_t dek[32], back[32], wrapped[128];
    size_t wlen = 0;
    for (int i = 0; i < 20; i++) {
        randombytes_buf(dek, sizeof dek);
        if (t->p->ops->wrap(t->p->self, B("k"), 1, dek, sizeof dek, aad, wrapped, sizeof wrapped,
                            &wlen, 0) != KS_OK ||
            t->p->ops->unwrap(t->p->self, B("k"), 1, (ks_bytes){wrapped, wlen}, aad, back,
                              sizeof back, 0) != KS_OK ||
            memcmp(dek, back, sizeof dek) != 0) {
            t->failures++;
        }
    }
    return NULL;
}

/*
 * [P-LOAD-5] ks_registry_load_lazy opens a provider when a call first
 * needs it: beside a keyring, an HSM whose PIN variable is unset and a
 * plugin that does not exist make ks_registry_load fail, but a lazy
 * registry serves the keyring's key (from several threads at once, the
 * keyring opened once) without touching them.  A call that needs one
 * fails with the error the eager load gave, ks_registry_open_error
 * gives its details, the failure is not retried, and a key nothing
 * serves is still not-found.
 */
static void test_lazy_open(void **state)
{
    fixture *f = *state;
    ks_registry_error err, eager;
    ks_provider p;
    char kpath[192], text_buf[1024];
    uint8_t dek[32], wrapped[128];
    size_t wlen = 0;

    make_keyring_k(f, "k", NO_PASS, kpath, sizeof kpath);
    snprintf(text_buf, sizeof text_buf,
             "keyshift-providers 1\nprovider loc\n  type local\n  keyring %s\n  serve k\n\n"
             "provider hsm\n  type pkcs11\n  module %s/no-such-module.so\n"
             "  token-label nowhere\n  pin-env KS_TEST_LAZY_PIN\n  serve h\n\n"
             "provider kms\n  type plugin\n  command %s/no-such-plugin\n  serve p\n",
             kpath, f->dir, f->dir);
    tf_spit(f->path, text_buf, strlen(text_buf), 0600);
    unsetenv("KS_TEST_LAZY_PIN");

    ks_registry *r = (ks_registry *)(uintptr_t)1;
    assert_int_equal(ks_registry_load(f->path, &r, &eager), KS_ERR_NOT_FOUND);
    assert_null(r);
    assert_int_equal(eager.stage, KS_REGISTRY_STAGE_PROVIDER);
    assert_string_equal(eager.name, "hsm");

    assert_int_equal(ks_registry_load_lazy(NULL, &r, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_load_lazy(f->path, &r, &err), KS_OK);
    assert_int_equal(ks_registry_provider(r, &p), KS_OK);
    assert_int_equal(ks_registry_open_error(r, &err), KS_OK);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_NONE);
    assert_int_equal(ks_registry_open_error(NULL, &err), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_open_error(r, NULL), KS_ERR_INVALID_ARGUMENT);

    pthread_t th[8];
    lazy_thread t[8];
    for (int i = 0; i < 8; i++) {
        t[i] = (lazy_thread){&p, 0};
        assert_int_equal(pthread_create(&th[i], NULL, lazy_worker, &t[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(t[i].failures, 0);
    }
    assert_int_equal(ks_registry_open_error(r, &err), KS_OK);

    /* Routing decides first: a key nothing serves opens nothing. */
    randombytes_buf(dek, sizeof dek);
    assert_int_equal(p.ops->wrap(p.self, B("zz"), 1, dek, sizeof dek, B("a"), wrapped,
                                 sizeof wrapped, &wlen, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_open_error(r, &err), KS_OK);

    /* The HSM, once needed: the eager load's error and details. */
    assert_int_equal(p.ops->wrap(p.self, B("h"), 1, dek, sizeof dek, B("a"), wrapped,
                                 sizeof wrapped, &wlen, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_open_error(r, &err), KS_ERR_NOT_FOUND);
    assert_int_equal(err.stage, eager.stage);
    assert_int_equal(err.code, eager.code);
    assert_int_equal(err.provider, 2);
    assert_string_equal(err.name, "hsm");
    assert_string_equal(err.setting, "pin-env");
    /* Not tried again, even once the PIN could be read. */
    assert_int_equal(setenv("KS_TEST_LAZY_PIN", "1234", 1), 0);
    assert_int_equal(p.ops->key_info(p.self, B("h"), 0, &(ks_key_info){0}, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(unsetenv("KS_TEST_LAZY_PIN"), 0);

    /* The plugin fails with its own error; the first failure stays the
     * one reported; the keyring still serves. */
    assert_int_equal(p.ops->wrap(p.self, B("p"), 1, dek, sizeof dek, B("a"), wrapped,
                                 sizeof wrapped, &wlen, 0), KS_ERR_NOT_FOUND);
    ks_plugin_stats stats;
    assert_int_equal(ks_registry_plugin_stats(r, 2, &stats), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_open_error(r, &err), KS_ERR_NOT_FOUND);
    assert_string_equal(err.name, "hsm");
    assert_int_equal(p.ops->wrap(p.self, B("k"), 1, dek, sizeof dek, B("a"), wrapped,
                                 sizeof wrapped, &wlen, 0), KS_OK);
    /* A listing of every key needs every provider. */
    listing l = {0};
    assert_int_equal(p.ops->admin->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(l.n, 0); /* nothing listed unless every provider listed */
    ks_registry_close(r);
}

/* A provider without admin ops: its keys route, management is denied,
 * and the merged listing skips it ([P-ROUTE-4..5]).  Built by loading a
 * registry and swapping in a provider with other ops over the same
 * keyring, as a token without key management would look. */
static const ks_provider_ops *real_ops;

/* key_info of the real local provider. */
static ks_err plain_key_info(void *self, ks_bytes key_id, uint32_t v, ks_key_info *out,
                             uint32_t timeout_ms)
{
    return real_ops->key_info(self, key_id, v, out, timeout_ms);
}

static const ks_provider_ops no_admin_ops = {NULL, NULL, plain_key_info, NULL, NULL};

/* A provider's list that fails, to check that nothing is listed then. */
static ks_err failing_list(void *self, ks_bytes key_id, ks_key_list_fn fn, void *arg,
                           uint32_t timeout_ms)
{
    (void)self;
    (void)key_id;
    (void)fn;
    (void)arg;
    (void)timeout_ms;
    return KS_ERR_UNAVAILABLE;
}

static const ks_provider_admin_ops failing_admin = {NULL, NULL, NULL, NULL, failing_list};

static const ks_provider_ops failing_ops = {NULL, NULL, plain_key_info, NULL, &failing_admin};

/* See above: a provider without admin ops, then one whose list fails. */
static void test_provider_without_admin(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    ks_provider p;
    ks_key_info info;
    make_two(f);
    ks_registry *r = load_expect(f->path, KS_OK, &err);
    assert_int_equal(ks_registry_provider(r, &p), KS_OK);
    listing l = {0};
    const ks_provider_admin_ops *a = p.ops->admin;
    ks_provider two;
    assert_int_equal(ks_registry_swap_provider(r, 2, &two), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_swap_provider(r, 1, NULL), KS_ERR_INVALID_ARGUMENT);
    /* Take provider two out (it is handed back below), and put in its
     * place a provider with the same state and other ops. */
    memset(&two, 0, sizeof two);
    assert_int_equal(ks_registry_swap_provider(r, 1, &two), KS_OK);
    assert_string_equal(two.name, "local");
    real_ops = two.ops;
    ks_provider stub = {&no_admin_ops, two.self, "stub"};
    assert_int_equal(ks_registry_swap_provider(r, 1, &stub), KS_OK);
    assert_int_equal(p.ops->key_info(p.self, B("db/k"), 0, &info, 0), KS_OK);
    assert_int_equal(a->create(p.self, B("db/x"), 0), KS_ERR_DENIED);
    uint32_t v;
    assert_int_equal(a->add_version(p.self, B("db/k"), &v, 0), KS_ERR_DENIED);
    assert_int_equal(a->promote(p.self, B("db/k"), 1, 0), KS_ERR_DENIED);
    assert_int_equal(a->set_state(p.self, B("db/k"), 1, KS_KEY_DISABLED, 0), KS_ERR_DENIED);
    assert_int_equal(a->list(p.self, B("db/k"), collect, &l, 0), KS_ERR_DENIED);
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 2); /* one's app/a and shared */
    assert_string_equal(l.ids[0], "app/a");
    assert_string_equal(l.ids[1], "shared");
    /* admin ops without the operation asked for: denied too. */
    stub = (ks_provider){&failing_ops, two.self, "stub"};
    assert_int_equal(ks_registry_swap_provider(r, 1, &stub), KS_OK);
    assert_int_equal(a->create(p.self, B("db/x"), 0), KS_ERR_DENIED);
    assert_int_equal(a->add_version(p.self, B("db/k"), &v, 0), KS_ERR_DENIED);
    assert_int_equal(a->promote(p.self, B("db/k"), 1, 0), KS_ERR_DENIED);
    assert_int_equal(a->set_state(p.self, B("db/k"), 1, KS_KEY_DISABLED, 0), KS_ERR_DENIED);
    /* A listing that fails lists nothing. */
    l = (listing){0};
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_ERR_UNAVAILABLE);
    assert_int_equal(l.n, 0);
    assert_int_equal(a->list(p.self, B("db/k"), collect, &l, 0), KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_registry_swap_provider(r, 1, &two), KS_OK);
    ks_registry_close(r);
}

/* [P-LOAD-3], [P-SECRET-1..2]: secrets from files and variables, and a
 * provider that does not open fails the load with its name. */
static void test_secrets_and_failures(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    char kpath[192], ppath[192], buf[1024];
    make_keyring_k(f, "sealed.keyring", B("pw"), kpath, sizeof kpath);
    snprintf(ppath, sizeof ppath, "%s/pass", f->dir);

    /* From a variable, one LF removed. */
    snprintf(buf, sizeof buf, "keyshift-providers 1\nprovider s\n  type local\n  keyring %s\n"
             "  passphrase-env KS_TEST_REGISTRY_PASS\n  serve k\n", kpath);
    spit_text(f->path, buf);
    setenv("KS_TEST_REGISTRY_PASS", "pw\n", 1);
    ks_registry_close(load_expect(f->path, KS_OK, &err));
    /* Two LFs: the second is part of the passphrase. */
    setenv("KS_TEST_REGISTRY_PASS", "pw\n\n", 1);
    (void)load_expect(f->path, KS_ERR_BAD_PASSPHRASE, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PROVIDER);
    assert_string_equal(err.name, "s");
    assert_int_equal(err.provider, 1);
    assert_string_equal(err.setting, "keyring");
    setenv("KS_TEST_REGISTRY_PASS", "\n", 1);
    (void)load_expect(f->path, KS_ERR_BAD_VALUE, &err);
    assert_string_equal(err.setting, "passphrase-env");
    unsetenv("KS_TEST_REGISTRY_PASS");
    (void)load_expect(f->path, KS_ERR_NOT_FOUND, &err);
    assert_string_equal(err.setting, "passphrase-env");
    assert_string_equal(err.name, "s");
    char *huge = malloc(5000);
    assert_non_null(huge);
    memset(huge, 'p', 4999);
    huge[4999] = '\0';
    setenv("KS_TEST_REGISTRY_PASS", huge, 1);
    (void)load_expect(f->path, KS_ERR_TOO_LARGE, &err);
    unsetenv("KS_TEST_REGISTRY_PASS");

    /* From a file: exactly one LF removed; bad permissions; too long; missing. */
    snprintf(buf, sizeof buf, "keyshift-providers 1\nprovider s\n  type local\n  keyring %s\n"
             "  passphrase-file %s\n  serve k\n", kpath, ppath);
    spit_text(f->path, buf);
    tf_spit(ppath, "pw\n", 3, 0600);
    ks_registry_close(load_expect(f->path, KS_OK, &err));
    tf_spit(ppath, "pw", 2, 0400);
    ks_registry_close(load_expect(f->path, KS_OK, &err));
    tf_spit(ppath, "pw\r\n", 4, 0600);
    (void)load_expect(f->path, KS_ERR_BAD_PASSPHRASE, &err);
    tf_spit(ppath, "pw\n", 3, 0640);
    (void)load_expect(f->path, KS_ERR_INSECURE, &err);
    assert_string_equal(err.setting, "passphrase-file");
    tf_spit(ppath, huge, 4097, 0600);
    (void)load_expect(f->path, KS_ERR_TOO_LARGE, &err);
    tf_spit(ppath, huge, 4096, 0600);
    (void)load_expect(f->path, KS_ERR_BAD_PASSPHRASE, &err);
    free(huge);
    tf_spit(ppath, "", 0, 0600);
    (void)load_expect(f->path, KS_ERR_BAD_VALUE, &err);
    unlink(ppath);
    (void)load_expect(f->path, KS_ERR_IO, &err);
    assert_string_equal(err.setting, "passphrase-file");
    assert_int_equal(mkdir(ppath, 0700), 0);
    (void)load_expect(f->path, KS_ERR_INSECURE, &err);
    rmdir(ppath);

    /* A keyring that does not parse: its rejection comes along. */
    char bad[192];
    snprintf(bad, sizeof bad, "%s/bad.keyring", f->dir);
    tf_spit(bad, "KSE\x01\x00", 5, 0600);
    snprintf(buf, sizeof buf, "keyshift-providers 1\nprovider good\n  type local\n  keyring %s\n"
             "  passphrase-env KS_TEST_REGISTRY_PASS\n  serve k\n"
             "provider broken\n  type local\n  keyring %s\n  serve j\n", kpath, bad);
    spit_text(f->path, buf);
    setenv("KS_TEST_REGISTRY_PASS", "pw", 1);
    (void)load_expect(f->path, KS_ERR_INTEGRITY, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PROVIDER);
    assert_string_equal(err.name, "broken");
    assert_int_equal(err.provider, 2);
    assert_int_equal(err.keyring.code, KS_ERR_BAD_MAGIC);
    assert_int_equal(err.keyring.offset, 2);
    /* A keyring that is not there. */
    unlink(bad);
    (void)load_expect(f->path, KS_ERR_IO, &err);
    assert_string_equal(err.name, "broken");
    unsetenv("KS_TEST_REGISTRY_PASS");
}

/* A pkcs11 provider: the stub (or a token that is not there) fails the
 * load closed, with the provider's name; the local provider before it
 * is closed again (ASan's leak check). */
static void test_pkcs11_fails_closed(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    char kpath[192], pin[192], buf[1024];
    make_keyring_k(f, "local.keyring", NO_PASS, kpath, sizeof kpath);
    snprintf(pin, sizeof pin, "%s/pin", f->dir);
    tf_spit(pin, "1234\n", 5, 0600);
    snprintf(buf, sizeof buf,
             "keyshift-providers 1\nprovider dev\n  type local\n  keyring %s\n  serve-prefix dev/\n"
             "provider prod-hsm\n  type pkcs11\n  module %s/no-such-module.so\n"
             "  token-label prod\n  pin-file %s\n  gcm-params no-ivbits\n  timeout-ms 500\n"
             "  serve-prefix prod/\n",
             kpath, f->dir, pin);
    spit_text(f->path, buf);
    (void)load_expect(f->path, KS_ERR_UNAVAILABLE, &err);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PROVIDER);
    assert_int_equal(err.code, KS_ERR_UNAVAILABLE);
    assert_string_equal(err.name, "prod-hsm");
    assert_int_equal(err.provider, 2);
    assert_null(err.setting);
    /* The PIN is read before the token is tried: an unset variable. */
    snprintf(buf, sizeof buf,
             "keyshift-providers 1\nprovider hsm\n  type pkcs11\n  token-uri pkcs11:token=prod\n"
             "  pin-env KS_TEST_REGISTRY_PIN\n  serve k\n");
    spit_text(f->path, buf);
    unsetenv("KS_TEST_REGISTRY_PIN");
    (void)load_expect(f->path, KS_ERR_NOT_FOUND, &err);
    assert_string_equal(err.setting, "pin-env");
    assert_string_equal(err.name, "hsm");
    setenv("KS_TEST_REGISTRY_PIN", "1234", 1);
    (void)load_expect(f->path, KS_ERR_UNAVAILABLE, &err);
    assert_string_equal(err.name, "hsm");
    unsetenv("KS_TEST_REGISTRY_PIN");
    /* read opens nothing: it lists the pkcs11 settings, and has no
     * routing provider. */
    ks_registry *r = NULL;
    ks_provider p;
    ks_registry_info ri;
    ks_registry_setting rs;
    assert_int_equal(ks_registry_read(f->path, &r, &err), KS_OK);
    assert_int_equal(ks_registry_info_at(r, 0, &ri), KS_OK);
    assert_string_equal(ri.type, "pkcs11");
    assert_int_equal(ri.settings, 2);
    assert_int_equal(ks_registry_setting_at(r, 0, 0, &rs), KS_OK);
    assert_string_equal(rs.key, "token-uri");
    assert_string_equal(rs.value, "pkcs11:token=prod");
    assert_int_equal(ks_registry_setting_at(r, 0, 1, &rs), KS_OK);
    assert_string_equal(rs.key, "pin-env");
    assert_int_equal(ks_registry_provider(r, &p), KS_ERR_INVALID_ARGUMENT);
    size_t i;
    assert_int_equal(ks_registry_route(r, B("k"), &i), KS_OK);
    ks_registry_close(r);
}

/* A plugin provider's settings, listed by a read registry (arg lines,
 * then env and env-prefix lines, last, in file order; no plugin started); ks_registry_plugin_stats
 * refuses a read registry, a provider past the end and a provider of
 * another type. */
static void test_plugin_read(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    ks_registry *r = NULL;
    ks_registry_info ri;
    ks_registry_setting rs;
    ks_plugin_stats stats;
    spit_text(f->path, "keyshift-providers 1\nprovider dev\n  type local\n  keyring /k\n"
                       "  serve d\nprovider kms\n  type plugin\n  env-prefix AWS_\n  arg --key=app/main,1,arn:x\n"
                       "  concurrency 2\n  command aws\n  env HTTPS_PROXY\n  arg two words\n"
                       "  serve-prefix app/\n");
    assert_int_equal(ks_registry_read(f->path, &r, &err), KS_OK);
    assert_int_equal(ks_registry_info_at(r, 1, &ri), KS_OK);
    assert_string_equal(ri.type, "plugin");
    assert_int_equal(ri.settings, 6);
    assert_int_equal(ri.serves, 1);
    static const char *const want[][2] = {
        {"command", "aws"}, {"concurrency", "2"}, {"arg", "--key=app/main,1,arn:x"},
        {"arg", "two words"}, {"env-prefix", "AWS_"}, {"env", "HTTPS_PROXY"}};
    for (size_t j = 0; j < 6; j++) {
        assert_int_equal(ks_registry_setting_at(r, 1, j, &rs), KS_OK);
        assert_string_equal(rs.key, want[j][0]);
        assert_string_equal(rs.value, want[j][1]);
    }
    assert_int_equal(ks_registry_setting_at(r, 1, 6, &rs), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_setting_at(r, 0, 1, &rs), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_registry_plugin_stats(r, 1, &stats), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_plugin_stats(NULL, 1, &stats), KS_ERR_INVALID_ARGUMENT);
    ks_registry_close(r);
}

/* A plugin that cannot be started fails the whole load at stage
 * PROVIDER, with the plugin's own report in err.plugin ([P-LOAD-3]);
 * the local provider opened before it is closed again. */
static void test_plugin_fails_closed(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    char kpath[192], buf[1024];
    make_keyring_k(f, "local.keyring", NO_PASS, kpath, sizeof kpath);
    snprintf(buf, sizeof buf,
             "keyshift-providers 1\nprovider dev\n  type local\n  keyring %s\n  serve-prefix dev/\n"
             "provider kms\n  type plugin\n  command %s/no-such-plugin\n  timeout-ms 2000\n"
             "  retries 0\n  serve-prefix app/\n",
             kpath, f->dir);
    spit_text(f->path, buf);
    ks_registry *r = (ks_registry *)(uintptr_t)1;
    const ks_err e = ks_registry_load(f->path, &r, &err);
    assert_int_not_equal(e, KS_OK);
    assert_null(r);
    assert_int_equal(err.stage, KS_REGISTRY_STAGE_PROVIDER);
    assert_int_equal(err.code, e);
    assert_string_equal(err.name, "kms");
    assert_int_equal(err.provider, 2);
    assert_null(err.setting);
    assert_int_equal(e, KS_ERR_NOT_FOUND);
    assert_string_equal(err.plugin.stage, "start");
    assert_int_equal(err.plugin.code, e);
}

/* The example plugin's key file: app/main, version 1 active. */
static const char example_keys[] =
    "{\"app/main\": {\"primary\": 1, \"versions\": {"
    "\"1\": {\"state\": \"active\", \"kek\": \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"}}}}\n";

/* A plugin provider opened from the registry ([P-LOAD-3]): the example
 * plugin (tools/kms-example/keyshift-kms-example) is started and greeted at load,
 * wraps and unwraps through the routing provider, is denied key
 * management (it has no admin ops, [P-ROUTE-5]) and is skipped by the
 * merged listing; ks_registry_plugin_stats gives its hello's name. */
static void test_plugin_opens(void **state)
{
    fixture *f = *state;
    ks_registry_error err;
    ks_provider p;
    ks_plugin_stats stats;
    char kpath[192], keys[192], spec[256], buf[1536];
    make_keyring_k(f, "local.keyring", NO_PASS, kpath, sizeof kpath);
    snprintf(keys, sizeof keys, "%s/keys.json", f->dir);
    tf_spit(keys, example_keys, sizeof example_keys - 1, 0600);
    assert_int_equal(setenv("KEYSHIFT_KMS_EXAMPLE_KEYS", keys, 1), 0);
    tf_spec_path("providers.md", spec, sizeof spec);
    char *abs = realpath(spec, NULL);
    assert_non_null(abs);
    snprintf(buf, sizeof buf,
             "keyshift-providers 1\nprovider dev\n  type local\n  keyring %s\n  serve-prefix dev/\n"
             "provider kms\n  type plugin\n  command %.*s/../tools/kms-example/keyshift-kms-example\n"
             "  arg --unused two words\n  timeout-ms 20000\n  retries 0\n  rate-limit 0\n"
             "  concurrency 1\n  env KEYSHIFT_KMS_EXAMPLE_KEYS\n  serve-prefix app/\n",
             kpath, (int)(strrchr(abs, '/') - abs), abs);
    free(abs);
    spit_text(f->path, buf);
    ks_registry *r = load_expect(f->path, KS_OK, &err);
    assert_null(err.plugin.stage);
    assert_int_equal(ks_registry_plugin_stats(r, 1, &stats), KS_OK);
    assert_string_equal(stats.plugin, "keyshift-kms-example 1");
    assert_int_equal(stats.starts, 1);
    assert_int_equal(ks_registry_plugin_stats(r, 0, &stats), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_plugin_stats(r, 2, &stats), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_registry_plugin_stats(r, 1, NULL), KS_ERR_INVALID_ARGUMENT);

    uint8_t dek[KS_DEK_LEN], back[KS_DEK_LEN], wrapped[256];
    size_t wlen = 0;
    const ks_bytes aad = B("wrap-aad");
    ks_key_info info;
    randombytes_buf(dek, sizeof dek);
    assert_int_equal(ks_registry_provider(r, &p), KS_OK);
    assert_int_equal(p.ops->key_info(p.self, B("app/main"), 0, &info, 0), KS_OK);
    assert_int_equal(info.version, 1);
    assert_int_equal(p.ops->wrap(p.self, B("app/main"), 1, dek, sizeof dek, aad, wrapped,
                                 sizeof wrapped, &wlen, 0), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("app/main"), 1, (ks_bytes){wrapped, wlen}, aad, back,
                                   sizeof back, 0), KS_OK);
    assert_memory_equal(dek, back, sizeof dek);
    assert_int_equal(p.ops->key_info(p.self, B("app/none"), 0, &info, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->admin->create(p.self, B("app/new"), 0), KS_ERR_DENIED);
    listing l = {0};
    assert_int_equal(p.ops->admin->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 0); /* dev's k is not routed to dev; kms cannot list */
    assert_int_equal(ks_registry_plugin_stats(r, 1, &stats), KS_OK);
    assert_int_equal(stats.calls, 4);
    ks_registry_close(r);
    unsetenv("KEYSHIFT_KMS_EXAMPLE_KEYS");
}

/* ---- the vectors of docs/providers.md ------------------------------------------------ */

#define MAX_VECTORS 160

/* The keys of a vector block (docs/providers.md Appendix R). */
enum { VK_NAME, VK_EXPECT, VK_POSITION, VK_LINE, VK_HEX, VK_PROVIDER, VK_SETTING, VK_SERVE, VK_COUNT };

static const char *const vector_keys[VK_COUNT] = {
    [VK_NAME] = "name",         [VK_EXPECT] = "expect",   [VK_POSITION] = "position",
    [VK_LINE] = "line",         [VK_HEX] = "hex",         [VK_PROVIDER] = "provider",
    [VK_SETTING] = "setting",   [VK_SERVE] = "serve",
};


typedef struct vector {
    unsigned seen;           /* bit VK_x: key x was given */
    char name[64];
    ks_err code;             /* KS_OK for an ok vector */
    size_t offset;
    uint32_t line, column;
    text file;               /* the file's bytes (from line or hex) */
    text result;             /* the result lines, each ended by LF */
} vector;

#define HAS(v, k) ((int)(((v)->seen >> (k)) & 1u))

/* Append the hex value s[0, n) to *t; -1 unless it is whole bytes of
 * hex digits. */
static int append_hex(const char *s, size_t n, text *t)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    const int rc = tf_append_hex(s, n, &buf, &len);
    add_bytes(t, buf != NULL ? buf : (const uint8_t *)"", len);
    free(buf);
    return rc;
}

/* The rejection code named `name` (1..11 or conflict), or KS_OK. */
static ks_err code_named(const char *name, size_t n)
{
    static const ks_err codes[] = {
        KS_ERR_TRUNCATED,     KS_ERR_BAD_MAGIC, KS_ERR_UNSUPPORTED_VERSION,
        KS_ERR_WIRE_TYPE,     KS_ERR_NONCANONICAL_VARINT, KS_ERR_VARINT_OVERFLOW,
        KS_ERR_FIELD_ORDER,   KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
        KS_ERR_TOO_LARGE,     KS_ERR_BAD_VALUE, KS_ERR_CONFLICT,
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *c = ks_err_name(codes[i]);
        if (strlen(c) == n && memcmp(c, name, n) == 0) {
            return codes[i];
        }
    }
    return KS_OK;
}

/* A decimal number of at most 9 digits in s[0, n), without a leading 0
 * (0 itself allowed); -1 for anything else. */
static long decimal(const char *s, size_t n)
{
    long v = 0;
    if (n == 0 || n > 9 || (s[0] == '0' && n > 1)) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* Parse an `expect` value into v; -1 if malformed. */
static int expect_field(vector *v, const char *s, size_t n)
{
    if (n == 2 && memcmp(s, "ok", 2) == 0) {
        v->code = KS_OK;
        return 0;
    }
    const char *sep = NULL;
    for (size_t i = 0; i + 4 <= n; i++) {
        if (memcmp(s + i, " at ", 4) == 0) {
            sep = s + i;
            break;
        }
    }
    if (sep == NULL || (v->code = code_named(s, (size_t)(sep - s))) == KS_OK) {
        return -1;
    }
    const long off = decimal(sep + 4, (size_t)(s + n - sep - 4));
    if (off < 0) {
        return -1;
    }
    v->offset = (size_t)off;
    return 0;
}

/* Parse a `position` value "L:C" into v; -1 if malformed. */
static int position_field(vector *v, const char *s, size_t n)
{
    const char *colon = memchr(s, ':', n);
    if (colon == NULL) {
        return -1;
    }
    const long l = decimal(s, (size_t)(colon - s));
    const long c = decimal(colon + 1, (size_t)(s + n - colon - 1));
    if (l < 1 || c < 1) {
        return -1;
    }
    v->line = (uint32_t)l;
    v->column = (uint32_t)c;
    return 0;
}

/* Store value s[0, n) of key k in the vector vp; -1 if the value is
 * malformed. */
static int store_key(void *vp, int k, const char *s, size_t n)
{
    vector *v = vp;
    switch (k) {
    case VK_NAME:
        if (n == 0 || n >= sizeof v->name) {
            return -1;
        }
        memcpy(v->name, s, n);
        v->name[n] = '\0';
        return 0;
    case VK_EXPECT: return expect_field(v, s, n);
    case VK_POSITION: return position_field(v, s, n);
    case VK_LINE: addf(&v->file, "%.*s\n", (int)n, s); return 0;
    case VK_HEX: return append_hex(s, n, &v->file);
    default: addf(&v->result, "%s: %.*s\n", vector_keys[k], (int)n, s); return 0;
    }
}

/* Check that v holds exactly the keys Appendix R requires; NULL when it
 * does, else what is wrong. */
static const char *check_presence(const vector *v)
{
    const int ok = v->code == KS_OK;
    if (!HAS(v, VK_NAME) || !HAS(v, VK_EXPECT)) {
        return "no name or no expect";
    }
    if (HAS(v, VK_LINE) == HAS(v, VK_HEX)) {
        return "exactly one of line and hex";
    }
    if (HAS(v, VK_POSITION) == ok) {
        return "position: required exactly in error vectors";
    }
    if (ok != HAS(v, VK_PROVIDER) || (!ok && (HAS(v, VK_SETTING) || HAS(v, VK_SERVE)))) {
        return "provider, setting, serve: exactly in ok vectors";
    }
    return NULL;
}

/* Read block i of the document, its lines s[0, end), into vs[i]; NULL
 * when the block is well formed, else what is wrong. */
static const char *parse_block(void *vs, size_t i, const char *s, const char *end)
{
    vector *v = &((vector *)vs)[i];
    memset(v, 0, sizeof *v);
    if (end <= s) {
        return "empty block";
    }
    const unsigned repeats = ((1u << VK_COUNT) - 1) & ~((1u << VK_LINE) - 1);
    const char *why = tf_block_fields(s, end, vector_keys, VK_COUNT, sizeof vector_keys[0], repeats,
                                      1u << VK_LINE | 1u << VK_HEX, &v->seen, store_key, v);
    return why != NULL ? why : check_presence(v);
}

/* Release the vectors vs[0, n). */
static void free_vectors(vector *vs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(vs[i].file.s);
        free(vs[i].result.s);
    }
}

/* Parse every vector block of the document text into vs (at most
 * MAX_VECTORS); the count, or -1 with *why (and the block's name, if it
 * got one, in *where) for a malformed block, every vector then freed. */
static long parse_vectors(const char *doc, vector *vs, const char **why, const char **where)
{
    size_t begun = 0;
    const long n = tf_vector_blocks(doc, "ks-providers-vector", MAX_VECTORS, parse_block, vs, why,
                                    &begun);
    if (n < 0) {
        *where = begun > 0 ? vs[begun - 1].name : "";
        free_vectors(vs, begun);
    }
    return n;
}

/* Check one vector against the parser. */
static void check_vector(const vector *v, unsigned *seen)
{
    static ks_regf_file f;
    ks_regf_error e;
    const uint8_t *buf = (const uint8_t *)(v->file.s != NULL ? v->file.s : "");
    const ks_err got = ks_regf_parse(buf, v->file.len, &f, &e);
    if (got != v->code) {
        fail_msg("vector %s: want %s, got %s at %zu", v->name, ks_err_name(v->code),
                 ks_err_name(got), got == KS_OK ? (size_t)0 : e.offset);
    }
    seen[got == KS_ERR_CONFLICT ? 12 : got]++;
    if (got != KS_OK) {
        if (e.offset != v->offset || e.line != v->line || e.column != v->column) {
            fail_msg("vector %s: want %s at %zu (%u:%u), got it at %zu (%u:%u)", v->name,
                     ks_err_name(got), v->offset, v->line, v->column, e.offset, e.line, e.column);
        }
        return;
    }
    text t = {0};
    render(&f, &t);
    if (strcmp(t.s, v->result.s) != 0) {
        fail_msg("vector %s: result\n%s\ndiffers from the expected\n%s", v->name, t.s, v->result.s);
    }
    free(t.s);
    check_canonical(buf, v->file.len, &f);
}

/* Nonzero when parse_vectors() loads every block of doc. */
static int loads(const char *doc)
{
    vector *vs = calloc(MAX_VECTORS, sizeof *vs);
    const char *why = NULL, *where = NULL;
    assert_non_null(vs);
    const long n = parse_vectors(doc, vs, &why, &where);
    if (n >= 0) {
        free_vectors(vs, (size_t)n);
    } else {
        assert_non_null(why);
    }
    free(vs);
    return n >= 0;
}

/* The vector loader is strict: each malformed block below is refused. */
static void test_vector_loader_strict(void **state)
{
    (void)state;
    static const char *const good = "```ks-providers-vector\nname: e\nexpect: truncated at 0\n"
                                    "position: 1:1\nhex:\n```\n";
    static const char *const bad[] = {
        /* unknown key; no key; repeated name; repeated expect */
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\ncomment: x\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\n0a\n```\n",
        "```ks-providers-vector\nname: e\nname: f\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: ok\nexpect: ok\nline: x\nprovider: a local\n```\n",
        /* no position in an error vector; a position in an ok vector */
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: ok\nposition: 1:1\nline: x\nprovider: a local\n```\n",
        /* results in an error vector; none in an ok vector */
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex:\nserve: a exact k\n```\n",
        "```ks-providers-vector\nname: e\nexpect: ok\nline: x\n```\n",
        /* line and hex together; neither */
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nline: x\nhex: 0a\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\n```\n",
        /* a trailing space; a bad error name; a bad offset; a bad position; odd hex */
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nline: x \n```\n",
        "```ks-providers-vector\nname: e\nexpect: broken at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 01\nposition: 1:1\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 0:1\nhex:\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex: 0\n```\n",
        /* no space after the colon; an empty name; an empty or unterminated block */
        "```ks-providers-vector\nname:e\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-providers-vector\nname:\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-providers-vector\n```\n",
        "```ks-providers-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex:\n",
    };
    tf_loader_refuses(good, bad, sizeof bad / sizeof bad[0], loads);
}

/* Every vector of docs/providers.md Appendix R, and at least one of each
 * rejection class. */
static void test_spec_vectors(void **state)
{
    char path[256];
    size_t n, nok = 0;
    unsigned seen[16] = {0};
    const char *why = "", *where = "";
    (void)state;

    tf_spec_path("providers.md", path, sizeof path);
    uint8_t *doc = tf_slurp(path, &n);
    vector *vs = calloc(MAX_VECTORS, sizeof *vs);
    assert_non_null(vs);
    const long got = parse_vectors((const char *)doc, vs, &why, &where);
    if (got < 0) {
        fail_msg("%s: vector '%s': %s", path, where, why);
    }
    for (long i = 0; i < got; i++) {
        for (long j = 0; j < i; j++) {
            if (strcmp(vs[i].name, vs[j].name) == 0) {
                fail_msg("%s: vector name '%s' twice", path, vs[i].name);
            }
        }
        check_vector(&vs[i], seen);
        nok += vs[i].code == KS_OK;
    }
    /* Every rejection class the registry format uses has a vector. */
    static const int classes[] = {KS_ERR_TRUNCATED, KS_ERR_BAD_MAGIC, KS_ERR_UNSUPPORTED_VERSION,
                                  KS_ERR_FIELD_ORDER, KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
                                  KS_ERR_TOO_LARGE, KS_ERR_BAD_VALUE, 12 /* conflict */};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        if (seen[classes[i]] == 0) {
            fail_msg("no vector for rejection class %d", classes[i]);
        }
    }
    assert_true(got >= 60);
    assert_true(nok >= 5);
    print_message("registry vectors: %ld (%zu ok)\n", got, nok);
    free_vectors(vs, (size_t)got);
    free(vs);
    free(doc);
}

/* Run the tests. */
int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_arg_limits),
        cmocka_unit_test(test_env_limits),
        cmocka_unit_test(test_plugin_canonical),
        cmocka_unit_test(test_error_details),
        cmocka_unit_test(test_routing),
        cmocka_unit_test_setup_teardown(test_load_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_keyrings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lazy_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_without_admin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secrets_and_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pkcs11_fails_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_fails_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_opens, setup, teardown),
        cmocka_unit_test(test_vector_loader_strict),
        cmocka_unit_test(test_spec_vectors),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}
