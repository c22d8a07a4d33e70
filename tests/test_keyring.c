/*
 * tests/test_keyring.c -- unit tests of the local keyring and the "local"
 * provider (include/keyshift/keyring.h, docs/keyring.md).
 *
 * Every test works in its own directory made with mkdtemp under /tmp and
 * removed afterwards.  Concurrency and crash tests fork real processes:
 * children only ever leave through _exit().  No test is timed.
 *
 * The vectors of docs/keyring.md Appendix A are checked by
 * test_spec_vectors (path: $KS_SPEC's directory, else docs/).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/aad.h>
#include <keyshift/keyring.h>
#include <keyshift/provider.h>

#include "keyring_test_util.h"
#include "test_files.h"

/* A ks_bytes over a string literal or a C string. */
#define B(s) ((ks_bytes){(const uint8_t *)(s), strlen(s)})
#define NO_PASS ((ks_bytes){NULL, 0})
#define PASS B("tr0ub4dor&3")

/* ---- per-test directory ---------------------------------------------------------- */

/* A directory /tmp/ks-keyring-test-XXXXXX; the fixture's path is dir/keyring. */
static int setup(void **state)
{
    return tf_setup(state, "keyring", "keyring");
}

/* Remove the directory and what the test left in it. */
static int teardown(void **state)
{
    return tf_teardown(state);
}

/* ---- helpers ----------------------------------------------------------------- */

/* Nonzero when needle[0, n) occurs in hay[0, len). */
static int contains(const uint8_t *hay, size_t len, const uint8_t *needle, size_t n)
{
    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(hay + i, needle, n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Open path, failing the test unless it opens. */
static ks_keyring *must_open(const char *path, ks_bytes pass)
{
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    assert_int_equal(ks_keyring_open(path, pass, &kr, &pe), KS_OK);
    assert_non_null(kr);
    return kr;
}

/* Init and open a plain keyring with the keys "app/main" (1 version) and
 * "db" (versions 1..3, primary 1). */
static ks_keyring *make_keyring(const char *path)
{
    uint32_t v;
    assert_int_equal(ks_keyring_init(path, NO_PASS), KS_OK);
    ks_keyring *kr = must_open(path, NO_PASS);
    assert_int_equal(ks_keyring_create(kr, B("app/main")), KS_OK);
    assert_int_equal(ks_keyring_create(kr, B("db")), KS_OK);
    assert_int_equal(ks_keyring_add_version(kr, B("db"), &v), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(ks_keyring_add_version(kr, B("db"), &v), KS_OK);
    assert_int_equal(v, 3);
    return kr;
}

/* The index of key_id in kr's listing; fails the test if absent. */
static size_t key_index(const ks_keyring *kr, const char *key_id)
{
    for (size_t i = 0; i < ks_keyring_count(kr); i++) {
        ks_keyring_key k;
        assert_int_equal(ks_keyring_key_at(kr, i, &k), KS_OK);
        if (k.key_id.len == strlen(key_id) && memcmp(k.key_id.ptr, key_id, k.key_id.len) == 0) {
            return i;
        }
    }
    fail_msg("key %s not found", key_id);
    return 0;
}

/* The state of version v of key_id. */
static ks_key_state state_of(const ks_keyring *kr, const char *key_id, uint32_t v)
{
    ks_keyring_version kv;
    assert_int_equal(ks_keyring_version_at(kr, key_index(kr, key_id), v, &kv), KS_OK);
    assert_int_equal(kv.version, v);
    return kv.state;
}

/* The primary version of key_id. */
static uint32_t primary_of(const ks_keyring *kr, const char *key_id)
{
    ks_keyring_key k;
    assert_int_equal(ks_keyring_key_at(kr, key_index(kr, key_id), &k), KS_OK);
    return k.primary;
}

/* ---- names --------------------------------------------------------------------- */

static void test_state_names(void **state)
{
    (void)state;
    static const char *const names[] = {NULL, "active", "decrypt-only", "disabled", "destroyed"};
    for (int s = KS_KEY_ACTIVE; s <= KS_KEY_DESTROYED; s++) {
        assert_string_equal(ks_key_state_name(s), names[s]);
        assert_int_equal(ks_key_state_from_name(names[s]), s);
    }
    assert_null(ks_key_state_name(0));
    assert_null(ks_key_state_name(5));
    assert_null(ks_key_state_name(-1));
    assert_int_equal(ks_key_state_from_name("Active"), 0);
    assert_int_equal(ks_key_state_from_name(""), 0);
    assert_int_equal(ks_key_state_from_name(NULL), 0);
    ks_provider p = {0};
    ks_provider_destroy(&p); /* no ops: a no-op */
    ks_provider_destroy(NULL);
}

/* ---- init, open, permissions ----------------------------------------------------- */

static void test_init_and_open_empty(void **state)
{
    fixture *f = *state;
    struct stat st;
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    assert_int_equal(stat(f->path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_ERR_EXISTS);
    assert_int_equal(ks_keyring_init(f->path, PASS), KS_ERR_EXISTS);
    ks_keyring *kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_count(kr), 0);
    ks_keyring_key k;
    assert_int_equal(ks_keyring_key_at(kr, 0, &k), KS_ERR_NOT_FOUND);
    ks_keyring_close(kr);
    ks_keyring_close(NULL);

    /* The file is exactly the empty plain keyring of Appendix A. */
    size_t n;
    uint8_t *buf = tf_slurp(f->path, &n);
    static const uint8_t empty[] = {0x4B, 0x53, 0x4B, 1, 0, 0, 0, 0, 0};
    assert_int_equal(n, sizeof empty);
    assert_memory_equal(buf, empty, n);
    free(buf);
}

static void test_open_errors(void **state)
{
    fixture *f = *state;
    ks_keyring *kr = (ks_keyring *)&kr; /* must be set to NULL */
    ks_parse_error pe;
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_IO); /* missing */
    assert_null(kr);
    assert_int_equal(ks_keyring_open(NULL, NO_PASS, &kr, &pe), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, NULL, &pe), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_open(f->path, (ks_bytes){NULL, 3}, &kr, &pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_init(NULL, NO_PASS), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_init("", NO_PASS), KS_ERR_INVALID_ARGUMENT);

    /* A directory where the file should be: not a regular file. */
    assert_int_equal(mkdir(f->path, 0700), 0);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_INSECURE);
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_ERR_EXISTS);
    assert_int_equal(rmdir(f->path), 0);

    /* A FIFO is refused, not waited on. */
    assert_int_equal(mkfifo(f->path, 0600), 0);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_INSECURE);
    assert_int_equal(unlink(f->path), 0);

    /* A keyring in a directory that does not exist cannot be created. */
    char deep[192];
    snprintf(deep, sizeof deep, "%s/no/such/dir", f->dir);
    assert_int_equal(ks_keyring_init(deep, NO_PASS), KS_ERR_IO);
}

static void test_permissions(void **state)
{
    fixture *f = *state;
    static const mode_t refused[] = {0644, 0640, 0604, 0660, 0606, 0620, 0602, 0610, 0601, 0700 | 0070};
    static const mode_t allowed[] = {0600, 0400};
    ks_keyring *kr;
    ks_parse_error pe;

    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(chmod(f->path, refused[i]), 0);
        kr = NULL;
        assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_INSECURE);
        assert_null(kr);
    }
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
        assert_int_equal(chmod(f->path, allowed[i]), 0);
        kr = must_open(f->path, NO_PASS);
        ks_keyring_close(kr);
    }
    /* A change to a group-readable keyring is refused too (the re-read). */
    assert_int_equal(chmod(f->path, 0600), 0);
    kr = must_open(f->path, NO_PASS);
    assert_int_equal(chmod(f->path, 0640), 0);
    assert_int_equal(ks_keyring_create(kr, B("k")), KS_ERR_INSECURE);
    assert_int_equal(chmod(f->path, 0600), 0);
    assert_int_equal(ks_keyring_create(kr, B("k")), KS_OK);
    struct stat st;
    assert_int_equal(stat(f->path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600); /* the rewrite is 0600 */
    ks_keyring_close(kr);

    /* A symlink to a good keyring is refused. */
    char link_path[192];
    snprintf(link_path, sizeof link_path, "%s/link", f->dir);
    assert_int_equal(symlink(f->path, link_path), 0);
    kr = NULL;
    assert_int_equal(ks_keyring_open(link_path, NO_PASS, &kr, &pe), KS_ERR_INSECURE);
    assert_null(kr);
    assert_int_equal(ks_keyring_init(link_path, NO_PASS), KS_ERR_EXISTS);
}

/* The umask does not loosen (or tighten) a new keyring's mode. */
static void test_umask_ignored(void **state)
{
    fixture *f = *state;
    struct stat st;
    const mode_t old = umask(0);
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    umask(0277);
    ks_keyring *kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_create(kr, B("k")), KS_OK);
    umask(old);
    assert_int_equal(stat(f->path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    ks_keyring_close(kr);
}

/* ---- keys and versions -------------------------------------------------------------- */

static void test_create_and_list(void **state)
{
    fixture *f = *state;
    uint32_t v = 0;
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    ks_keyring *kr = must_open(f->path, NO_PASS);

    static const char *const ids[] = {"zeta", "alpha", "kms:eu/acct@1+r=2_x.y-z", "alph"};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(ks_keyring_create(kr, B(ids[i])), KS_OK);
    }
    assert_int_equal(ks_keyring_create(kr, B("alpha")), KS_ERR_EXISTS);
    assert_int_equal(ks_keyring_create(kr, B("has space")), KS_ERR_BAD_VALUE);
    assert_int_equal(ks_keyring_create(kr, NO_PASS), KS_ERR_BAD_VALUE);
    char long_id[KS_KEY_ID_MAX + 2];
    memset(long_id, 'k', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_int_equal(ks_keyring_create(kr, B(long_id)), KS_ERR_BAD_VALUE);
    long_id[KS_KEY_ID_MAX] = '\0';
    assert_int_equal(ks_keyring_create(kr, B(long_id)), KS_OK);
    assert_int_equal(ks_keyring_create(NULL, B("x")), KS_ERR_INVALID_ARGUMENT);

    /* Listed in key_id order, each with version 1, active and primary. */
    static const char *const sorted[] = {"alph", "alpha", NULL, "kms:eu/acct@1+r=2_x.y-z", "zeta"};
    assert_int_equal(ks_keyring_count(kr), 5);
    for (size_t i = 0; i < 5; i++) {
        ks_keyring_key k;
        ks_keyring_version kv;
        assert_int_equal(ks_keyring_key_at(kr, i, &k), KS_OK);
        const char *want = sorted[i] != NULL ? sorted[i] : long_id;
        assert_int_equal(k.key_id.len, strlen(want));
        assert_memory_equal(k.key_id.ptr, want, k.key_id.len);
        assert_int_equal(k.primary, 1);
        assert_int_equal(k.versions, 1);
        assert_int_equal(ks_keyring_version_at(kr, i, 1, &kv), KS_OK);
        assert_int_equal(kv.state, KS_KEY_ACTIVE);
        assert_true(kv.created > 1600000000u);
        assert_int_equal(ks_keyring_version_at(kr, i, 2, &kv), KS_ERR_NOT_FOUND);
        assert_int_equal(ks_keyring_version_at(kr, i, 0, &kv), KS_ERR_NOT_FOUND);
    }
    assert_int_equal(ks_keyring_key_at(kr, 5, &(ks_keyring_key){0}), KS_ERR_NOT_FOUND);

    /* Versions are numbered on; a new one is not primary. */
    assert_int_equal(ks_keyring_add_version(kr, B("zeta"), &v), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(primary_of(kr, "zeta"), 1);
    assert_int_equal(ks_keyring_add_version(kr, B("nope"), &v), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_keyring_add_version(kr, B("zeta"), NULL), KS_ERR_INVALID_ARGUMENT);
    ks_keyring_close(kr);

    /* All of it is in the file. */
    kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_count(kr), 5);
    assert_int_equal(state_of(kr, "zeta", 2), KS_KEY_ACTIVE);
    ks_keyring_close(kr);
}

/* Every (from, to) state change of a non-primary version, against
 * [K-STATE-2]: free among the first three, anything to destroyed, nothing
 * out of destroyed; the same state is a no-op. */
static void test_state_transitions(void **state)
{
    fixture *f = *state;
    uint32_t v;
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    ks_keyring *kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_create(kr, B("k")), KS_OK);

    for (int from = KS_KEY_ACTIVE; from <= KS_KEY_DESTROYED; from++) {
        for (int to = KS_KEY_ACTIVE; to <= KS_KEY_DESTROYED; to++) {
            assert_int_equal(ks_keyring_add_version(kr, B("k"), &v), KS_OK);
            if (from != KS_KEY_ACTIVE) {
                assert_int_equal(ks_keyring_set_state(kr, B("k"), v, (ks_key_state)from), KS_OK);
            }
            assert_int_equal(state_of(kr, "k", v), from);
            const ks_err want = from == KS_KEY_DESTROYED && to != from ? KS_ERR_STATE : KS_OK;
            assert_int_equal(ks_keyring_set_state(kr, B("k"), v, (ks_key_state)to), want);
            assert_int_equal(state_of(kr, "k", v), want == KS_OK ? to : from);
        }
    }
    assert_int_equal(ks_keyring_set_state(kr, B("k"), v, 0), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_set_state(kr, B("k"), v, 5), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_set_state(kr, B("k"), 0, KS_KEY_DISABLED), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_set_state(kr, B("k"), v + 1, KS_KEY_DISABLED), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_keyring_set_state(kr, B("x"), 1, KS_KEY_DISABLED), KS_ERR_NOT_FOUND);
    ks_keyring_close(kr);

    /* What the handle showed is what the file holds. */
    kr = must_open(f->path, NO_PASS);
    assert_int_equal(state_of(kr, "k", 2), KS_KEY_ACTIVE);       /* active -> active */
    assert_int_equal(state_of(kr, "k", 3), KS_KEY_DECRYPT_ONLY); /* active -> decrypt-only */
    assert_int_equal(state_of(kr, "k", 17), KS_KEY_DESTROYED);   /* destroyed -> destroyed */
    ks_keyring_close(kr);
}

/* The primary must stay active [K-STATE-3]; promote needs active. */
static void test_primary_rules(void **state)
{
    fixture *f = *state;
    ks_keyring *kr = make_keyring(f->path);

    for (int s = KS_KEY_DECRYPT_ONLY; s <= KS_KEY_DESTROYED; s++) {
        assert_int_equal(ks_keyring_set_state(kr, B("db"), 1, (ks_key_state)s), KS_ERR_STATE);
    }
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 1, KS_KEY_ACTIVE), KS_OK);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 1), KS_OK); /* already: no-op */

    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DECRYPT_ONLY), KS_OK);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 2), KS_ERR_STATE);
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DISABLED), KS_OK);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 2), KS_ERR_STATE);
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DESTROYED), KS_OK);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 2), KS_ERR_STATE);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 4), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 0), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_keyring_promote(kr, B("nope"), 1), KS_ERR_NOT_FOUND);

    assert_int_equal(ks_keyring_promote(kr, B("db"), 3), KS_OK);
    assert_int_equal(primary_of(kr, "db"), 3);
    /* The old primary may now be retired, the new one not. */
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 1, KS_KEY_DECRYPT_ONLY), KS_OK);
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 3, KS_KEY_DISABLED), KS_ERR_STATE);
    ks_keyring_close(kr);

    kr = must_open(f->path, NO_PASS);
    assert_int_equal(primary_of(kr, "db"), 3);
    assert_int_equal(state_of(kr, "db", 1), KS_KEY_DECRYPT_ONLY);
    assert_int_equal(state_of(kr, "db", 2), KS_KEY_DESTROYED);
    assert_int_equal(primary_of(kr, "app/main"), 1);
    ks_keyring_close(kr);
}

/* Destroying removes the material from the file for good. */
static void test_destroy_wipes_material(void **state)
{
    fixture *f = *state;
    uint8_t kek[KS_KEK_LEN];
    uint32_t v;
    size_t n;
    for (size_t i = 0; i < sizeof kek; i++) {
        kek[i] = (uint8_t)(0xC0 ^ (i * 7));
    }
    ks_keyring *kr = make_keyring(f->path);
    assert_int_equal(ks_keyring_import_version(kr, B("app/main"), kek, &v), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(ks_keyring_import_version(kr, B("app/main"), NULL, &v), KS_ERR_INVALID_ARGUMENT);
    uint8_t *buf = tf_slurp(f->path, &n);
    assert_true(contains(buf, n, kek, sizeof kek)); /* plain keyring: in clear */
    free(buf);

    assert_int_equal(ks_keyring_set_state(kr, B("app/main"), 2, KS_KEY_DESTROYED), KS_OK);
    buf = tf_slurp(f->path, &n);
    assert_false(contains(buf, n, kek, sizeof kek));
    free(buf);
    assert_int_equal(ks_keyring_set_state(kr, B("app/main"), 2, KS_KEY_ACTIVE), KS_ERR_STATE);
    ks_keyring_close(kr);
}

/* ---- the provider ----------------------------------------------------------------- */

/* A wrap AAD for key_id and version, built by the library (format/aad.c). */
static size_t wrap_aad(const char *key_id, uint32_t version, uint8_t *out, size_t cap)
{
    ks_envelope env = {0};
    size_t n = 0;
    env.version = KS_FORMAT_V2;
    env.algorithm = KS_ALG_XCHACHA20POLY1305;
    env.tenant = B("acme");
    env.key_id = B(key_id);
    env.key_version = version;
    env.purpose = B("db.users");
    assert_int_equal(ks_aad_wrap(&env, out, cap, &n), KS_OK);
    return n;
}

/* What a listing collected (admin list callback). */
typedef struct listing {
    char ids[8][32];
    uint32_t version[8];
    ks_key_state state[8];
    int primary[8];
    size_t n, stop_after;
} listing;

/* Collect one entry; stop after stop_after entries when it is set. */
static int collect(void *arg, const ks_key_entry *e)
{
    listing *l = arg;
    assert_true(l->n < 8 && e->key_id.len < 32);
    memcpy(l->ids[l->n], e->key_id.ptr, e->key_id.len);
    l->ids[l->n][e->key_id.len] = '\0';
    l->version[l->n] = e->version;
    l->state[l->n] = e->state;
    l->primary[l->n] = e->is_primary;
    l->n++;
    return l->stop_after != 0 && l->n == l->stop_after;
}

/* The local provider's key management (ks_provider_admin_ops) is the
 * keyring's changes and listing, with their rules and errors. */
static void test_provider_admin(void **state)
{
    fixture *f = *state;
    ks_provider p;
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    ks_keyring *kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    const ks_provider_admin_ops *a = p.ops->admin;
    assert_non_null(a);
    assert_int_equal(a->create(p.self, B("zeta"), 0), KS_OK);
    assert_int_equal(a->create(p.self, B("alpha"), 0), KS_OK);
    assert_int_equal(a->create(p.self, B("alpha"), 0), KS_ERR_EXISTS);
    assert_int_equal(a->create(p.self, B("no spaces"), 0), KS_ERR_BAD_VALUE);
    uint32_t v = 0;
    assert_int_equal(a->add_version(p.self, B("alpha"), &v, 0), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(a->set_state(p.self, B("alpha"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_ERR_STATE);
    assert_int_equal(a->promote(p.self, B("alpha"), 2, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, B("alpha"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_OK);
    assert_int_equal(a->promote(p.self, B("nope"), 1, 0), KS_ERR_NOT_FOUND);
    /* Every version, keys in key_id order. */
    listing l = {0};
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.ids[0], "alpha");
    assert_true(l.version[0] == 1 && l.state[0] == KS_KEY_DECRYPT_ONLY && !l.primary[0]);
    assert_true(l.version[1] == 2 && l.state[1] == KS_KEY_ACTIVE && l.primary[1]);
    assert_string_equal(l.ids[2], "zeta");
    assert_true(l.version[2] == 1 && l.primary[2]);
    /* One key; a callback that stops; an unknown key. */
    l = (listing){0};
    assert_int_equal(a->list(p.self, B("zeta"), collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 1);
    l = (listing){.stop_after = 1};
    assert_int_equal(a->list(p.self, (ks_bytes){NULL, 0}, collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 1);
    assert_int_equal(a->list(p.self, B("nope"), collect, &l, 0), KS_ERR_NOT_FOUND);
    ks_keyring_close(kr);
}

static void test_provider_round_trip(void **state)
{
    fixture *f = *state;
    uint8_t dek[KS_DEK_LEN], back[KS_DEK_LEN], wrapped[KS_LOCAL_WRAPPED_LEN + 8];
    uint8_t aad[KS_WRAP_AAD_MAX], aad2[KS_WRAP_AAD_MAX];
    size_t wl = 0;
    ks_provider p;

    ks_keyring *kr = make_keyring(f->path);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    assert_string_equal(p.name, "local");
    assert_int_equal(ks_keyring_provider(NULL, &p), KS_ERR_INVALID_ARGUMENT);
    randombytes_buf(dek, sizeof dek);
    const ks_bytes a = {aad, wrap_aad("db", 1, aad, sizeof aad)};

    assert_int_equal(p.ops->wrap(p.self, B("db"), 1, dek, sizeof dek, a, wrapped, sizeof wrapped,
                                 &wl, 0),
                     KS_OK);
    assert_int_equal(wl, KS_LOCAL_WRAPPED_LEN);
    assert_false(contains(wrapped, wl, dek, sizeof dek));
    const ks_bytes w = {wrapped, wl};
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, w, a, back, sizeof back, 0), KS_OK);
    assert_memory_equal(back, dek, sizeof dek);

    /* Two wraps of one DEK differ (fresh nonce). */
    uint8_t wrapped2[KS_LOCAL_WRAPPED_LEN];
    size_t wl2 = 0;
    assert_int_equal(p.ops->wrap(p.self, B("db"), 1, dek, sizeof dek, a, wrapped2, sizeof wrapped2,
                                 &wl2, 0),
                     KS_OK);
    assert_memory_not_equal(wrapped, wrapped2, KS_LOCAL_WRAPPED_LEN);

    /* AAD binding: another AAD (here another key_version in it) fails. */
    const ks_bytes a2 = {aad2, wrap_aad("db", 2, aad2, sizeof aad2)};
    memset(back, 0xAA, sizeof back);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, w, a2, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_true(sodium_is_zero(back, sizeof back));
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, w, NO_PASS, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);

    /* Every flipped bit anywhere in the blob fails, and leaves dek zero. */
    for (size_t bit = 0; bit < KS_LOCAL_WRAPPED_LEN * 8; bit++) {
        uint8_t bad[KS_LOCAL_WRAPPED_LEN];
        memcpy(bad, wrapped, sizeof bad);
        bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        memset(back, 0xAA, sizeof back);
        assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, (ks_bytes){bad, sizeof bad}, a, back,
                                       sizeof back, 0),
                         KS_ERR_AUTH_FAILED);
        assert_true(sodium_is_zero(back, sizeof back));
    }
    /* Wrong lengths are auth-failed too. */
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, (ks_bytes){wrapped, wl - 1}, a, back,
                                   sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, (ks_bytes){wrapped, wl + 1}, a, back,
                                   sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, NO_PASS, a, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    /* Another version of the same key, or another key, does not open it:
     * no fallback. */
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, w, a, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_int_equal(p.ops->unwrap(p.self, B("app/main"), 1, w, a, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_true(sodium_is_zero(back, sizeof back));

    /* Caller errors. */
    assert_int_equal(p.ops->wrap(p.self, B("db"), 0, dek, sizeof dek, a, wrapped, sizeof wrapped,
                                 &wl, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 1, dek, 16, a, wrapped, sizeof wrapped, &wl, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 1, dek, sizeof dek, a, wrapped,
                                 KS_LOCAL_WRAPPED_LEN - 1, &wl, 0),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 1, NULL, sizeof dek, a, wrapped, sizeof wrapped,
                                 &wl, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 0, w, a, back, sizeof back, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 1, w, a, back, 16, 0), KS_ERR_INVALID_ARGUMENT);
    /* Unknown key or version. */
    assert_int_equal(p.ops->wrap(p.self, B("nope"), 1, dek, sizeof dek, a, wrapped, sizeof wrapped,
                                 &wl, 0),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 4, dek, sizeof dek, a, wrapped, sizeof wrapped,
                                 &wl, 0),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 9, w, a, back, sizeof back, 0), KS_ERR_NOT_FOUND);

    ks_provider_destroy(&p); /* borrows kr: kr stays usable */
    assert_null(p.ops);
    assert_int_equal(ks_keyring_count(kr), 2);
    ks_keyring_close(kr);
    sodium_memzero(dek, sizeof dek);
}

/* wrap and unwrap by state [K-STATE-1]. */
static void test_provider_states(void **state)
{
    fixture *f = *state;
    uint8_t dek[KS_DEK_LEN] = {1, 2, 3}, back[KS_DEK_LEN];
    uint8_t w2[KS_LOCAL_WRAPPED_LEN], w3[KS_LOCAL_WRAPPED_LEN];
    size_t wl;
    ks_provider p;
    ks_key_info info;
    const ks_bytes a = B("aad");

    ks_keyring *kr = make_keyring(f->path);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 2, dek, sizeof dek, a, w2, sizeof w2, &wl, 0), KS_OK);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 3, dek, sizeof dek, a, w3, sizeof w3, &wl, 0), KS_OK);
    const ks_bytes b2 = {w2, sizeof w2}, b3 = {w3, sizeof w3};

    /* decrypt-only: unwrap yes, wrap denied. */
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DECRYPT_ONLY), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, b2, a, back, sizeof back, 0), KS_OK);
    assert_memory_equal(back, dek, sizeof dek);
    assert_int_equal(p.ops->wrap(p.self, B("db"), 2, dek, sizeof dek, a, w2, sizeof w2, &wl, 0),
                     KS_ERR_DENIED);

    /* disabled: both denied; and it comes back. */
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DISABLED), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, b2, a, back, sizeof back, 0), KS_ERR_DENIED);
    assert_true(sodium_is_zero(back, sizeof back));
    assert_int_equal(p.ops->wrap(p.self, B("db"), 2, dek, sizeof dek, a, w2, sizeof w2, &wl, 0),
                     KS_ERR_DENIED);
    /* the state comes before the bytes [K-WRAP-2]: a wrong length is still denied */
    const ks_bytes short2 = {w2, sizeof w2 - 1};
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, short2, a, back, sizeof back, 0), KS_ERR_DENIED);
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_ACTIVE), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, short2, a, back, sizeof back, 0),
                     KS_ERR_AUTH_FAILED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, b2, a, back, sizeof back, 0), KS_OK);

    /* destroyed: revoked, for good, while version 3 still works. */
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DESTROYED), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, b2, a, back, sizeof back, 0), KS_ERR_REVOKED);
    assert_true(sodium_is_zero(back, sizeof back));
    assert_int_equal(p.ops->wrap(p.self, B("db"), 2, dek, sizeof dek, a, w2, sizeof w2, &wl, 0),
                     KS_ERR_REVOKED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, short2, a, back, sizeof back, 0), KS_ERR_REVOKED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 3, b3, a, back, sizeof back, 0), KS_OK);

    /* key_info: version 0 is the primary. */
    assert_int_equal(p.ops->key_info(p.self, B("db"), 0, &info, 0), KS_OK);
    assert_int_equal(info.version, 1);
    assert_int_equal(info.state, KS_KEY_ACTIVE);
    assert_true(info.is_primary);
    assert_int_equal(p.ops->key_info(p.self, B("db"), 2, &info, 0), KS_OK);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.state, KS_KEY_DESTROYED);
    assert_false(info.is_primary);
    assert_int_equal(ks_keyring_promote(kr, B("db"), 3), KS_OK);
    assert_int_equal(p.ops->key_info(p.self, B("db"), 0, &info, 0), KS_OK);
    assert_int_equal(info.version, 3);
    assert_true(info.is_primary);
    assert_int_equal(p.ops->key_info(p.self, B("db"), 4, &info, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->key_info(p.self, B("zz"), 0, &info, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->key_info(p.self, B("db"), 0, NULL, 0), KS_ERR_INVALID_ARGUMENT);

    /* A reopened keyring agrees: the destroyed material is gone. */
    ks_keyring_close(kr);
    kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 2, b2, a, back, sizeof back, 0), KS_ERR_REVOKED);
    assert_int_equal(p.ops->unwrap(p.self, B("db"), 3, b3, a, back, sizeof back, 0), KS_OK);
    assert_memory_equal(back, dek, sizeof dek);
    ks_keyring_close(kr);
}

/* ---- corrupt files -------------------------------------------------------------------- */

/* Open a file holding buf[0, n) (mode 0600); return the result. */
static ks_err open_bytes(const char *path, const uint8_t *buf, size_t n, ks_bytes pass,
                         ks_parse_error *pe)
{
    ks_keyring *kr = (ks_keyring *)pe; /* must be reset to NULL on error */
    tf_spit(path, buf, n, 0600);
    ks_err e = ks_keyring_open(path, pass, &kr, pe);
    if (e == KS_OK) {
        assert_non_null(kr);
        ks_keyring_close(kr);
    } else {
        assert_null(kr);
    }
    return e;
}

static void test_truncated_and_corrupt(void **state)
{
    fixture *f = *state;
    ks_parse_error pe;
    size_t n;
    ks_keyring *kr = make_keyring(f->path);
    assert_int_equal(ks_keyring_set_state(kr, B("db"), 2, KS_KEY_DESTROYED), KS_OK);
    ks_keyring_close(kr);
    uint8_t *good = tf_slurp(f->path, &n);

    /* Every proper prefix is corrupt, with the error inside the file. */
    for (size_t len = 0; len < n; len++) {
        memset(&pe, 0, sizeof pe);
        assert_int_equal(open_bytes(f->path, good, len, NO_PASS, &pe), KS_ERR_INTEGRITY);
        assert_true(ks_err_is_rejection(pe.code));
        assert_true(pe.offset <= len);
    }
    /* Every byte changed in turn: corrupt, or (a byte of `created` or of
     * material) still a valid keyring. */
    uint8_t *bad = malloc(n);
    assert_non_null(bad);
    for (size_t i = 0; i < n; i++) {
        for (unsigned x = 1; x < 256; x <<= 1) {
            memcpy(bad, good, n);
            bad[i] ^= (uint8_t)x;
            const ks_err e = open_bytes(f->path, bad, n, NO_PASS, &pe);
            assert_true(e == KS_OK || e == KS_ERR_INTEGRITY);
            if (e == KS_ERR_INTEGRITY) {
                assert_true(ks_err_is_rejection(pe.code));
                assert_true(pe.offset <= n);
            }
        }
    }
    free(bad);
    /* Trailing garbage. */
    uint8_t *longer = malloc(n + 1);
    assert_non_null(longer);
    memcpy(longer, good, n);
    longer[n] = 0;
    assert_int_equal(open_bytes(f->path, longer, n + 1, NO_PASS, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_UNKNOWN_FIELD);
    assert_int_equal(pe.offset, n);
    assert_int_equal(pe.field, 0);
    free(longer);
    /* A change on top of a corrupt file is refused, the file left alone. */
    assert_int_equal(open_bytes(f->path, good, n, NO_PASS, &pe), KS_OK);
    kr = must_open(f->path, NO_PASS);
    tf_spit(f->path, good, n - 1, 0600);
    assert_int_equal(ks_keyring_create(kr, B("new")), KS_ERR_INTEGRITY);
    size_t m;
    uint8_t *now = tf_slurp(f->path, &m);
    assert_int_equal(m, n - 1);
    free(now);
    ks_keyring_close(kr);
    free(good);
}

/* ---- sealed keyrings -------------------------------------------------------------------- */

static void test_sealed(void **state)
{
    fixture *f = *state;
    uint8_t kek[KS_KEK_LEN];
    uint32_t v;
    ks_keyring *kr = NULL;
    ks_parse_error pe;
    size_t n;

    memset(kek, 0x5A, sizeof kek);
    assert_int_equal(ks_keyring_init(f->path, PASS), KS_OK);
    kr = must_open(f->path, PASS);
    assert_int_equal(ks_keyring_create(kr, B("app")), KS_OK);
    assert_int_equal(ks_keyring_import_version(kr, B("app"), kek, &v), KS_OK);
    assert_int_equal(ks_keyring_promote(kr, B("app"), 2), KS_OK);
    ks_keyring_close(kr);

    /* No key material, and the header of [K-SEAL-1], in the file. */
    uint8_t *file = tf_slurp(f->path, &n);
    assert_false(contains(file, n, kek, sizeof kek));
    assert_int_equal(file[4], KS_KRF_MODE_SEALED);
    ks_krf_header h;
    assert_int_equal(ks_krf_parse_header(file, n, &h, &pe), KS_OK);
    assert_int_equal(h.opslimit, crypto_pwhash_OPSLIMIT_INTERACTIVE);
    assert_int_equal(h.memlimit, crypto_pwhash_MEMLIMIT_INTERACTIVE);

    /* Round trip. */
    kr = must_open(f->path, PASS);
    assert_int_equal(ks_keyring_count(kr), 1);
    assert_int_equal(primary_of(kr, "app"), 2);
    ks_keyring_close(kr);

    /* Wrong, missing, and superfluous passphrases. */
    kr = NULL;
    assert_int_equal(ks_keyring_open(f->path, B("tr0ub4dor&4"), &kr, &pe), KS_ERR_BAD_PASSPHRASE);
    assert_null(kr);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_BAD_PASSPHRASE);
    assert_int_equal(ks_keyring_open(f->path, (ks_bytes){(const uint8_t *)"x", 0}, &kr, &pe),
                     KS_ERR_BAD_PASSPHRASE);
    char plain_path[192];
    snprintf(plain_path, sizeof plain_path, "%s/plain", f->dir);
    assert_int_equal(ks_keyring_init(plain_path, NO_PASS), KS_OK);
    assert_int_equal(ks_keyring_open(plain_path, PASS, &kr, &pe), KS_ERR_BAD_PASSPHRASE);

    /* Truncations in the header are corrupt without deriving anything; a
     * short box too; a few cuts in the box and a flipped tag byte cannot
     * be told from a wrong passphrase. */
    for (size_t len = 0; len < KS_KRF_SEALED_HDR_LEN + KS_KRF_MAC_LEN + KS_KRF_COUNT_LEN; len++) {
        assert_int_equal(open_bytes(f->path, file, len, PASS, &pe), KS_ERR_INTEGRITY);
        assert_int_equal(pe.code, KS_ERR_TRUNCATED);
    }
    static const size_t cuts[] = {KS_KRF_SEALED_HDR_LEN + KS_KRF_MAC_LEN + KS_KRF_COUNT_LEN, 100};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(open_bytes(f->path, file, cuts[i], PASS, &pe), KS_ERR_BAD_PASSPHRASE);
    }
    file[KS_KRF_SEALED_HDR_LEN] ^= 1;
    assert_int_equal(open_bytes(f->path, file, n, PASS, &pe), KS_ERR_BAD_PASSPHRASE);
    file[KS_KRF_SEALED_HDR_LEN] ^= 1;
    /* An absurd memlimit is refused before Argon2id runs [K-SEAL-2]. */
    file[29] = 0xFF;
    assert_int_equal(open_bytes(f->path, file, n, PASS, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_BAD_VALUE);
    assert_int_equal(pe.offset, 29);
    file[29] = 0;
    assert_int_equal(open_bytes(f->path, file, n, PASS, &pe), KS_OK);
    free(file);

    /* A handle whose file was resealed (another salt) cannot write it. */
    kr = must_open(f->path, PASS);
    uint8_t *other = tf_slurp(f->path, &n);
    (void)unlink(f->path);
    assert_int_equal(ks_keyring_init(f->path, PASS), KS_OK);
    assert_int_equal(ks_keyring_create(kr, B("x")), KS_ERR_BAD_PASSPHRASE);
    tf_spit(f->path, other, n, 0600);
    assert_int_equal(ks_keyring_create(kr, B("x")), KS_OK);
    free(other);
    ks_keyring_close(kr);
    kr = must_open(f->path, PASS);
    assert_int_equal(ks_keyring_count(kr), 2);
    ks_keyring_close(kr);
}

/* The orders of checks that the spec makes normative: the file checks
 * before the contents [K-ERR-3], the header before the passphrase and the
 * passphrase before the body [K-SEAL-6], the charset before the key order
 * [K-KEY-3]. */
static void test_check_order(void **state)
{
    fixture *f = *state;
    ks_parse_error pe;
    ks_keyring *kr = NULL;
    size_t n;

    /* [K-ERR-3] An oversized file is too-large at the largest keyring's
     * length, unread: not bad-magic.  Permissions come first. */
    tf_spit(f->path, (const uint8_t *)"XYZ", 3, 0600);
    assert_int_equal(truncate(f->path, (off_t)KS_KRF_FILE_MAX + 1), 0);
    memset(&pe, 0xFF, sizeof pe);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_INTEGRITY);
    assert_null(kr);
    assert_int_equal(pe.code, KS_ERR_TOO_LARGE);
    assert_int_equal(pe.offset, KS_KRF_FILE_MAX);
    assert_int_equal(pe.offset, 61 + 16 + 193214468);
    assert_int_equal(pe.field, 0);
    assert_int_equal(ks_keyring_open(f->path, PASS, &kr, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_TOO_LARGE);
    assert_int_equal(chmod(f->path, 0640), 0);
    memset(&pe, 0xFF, sizeof pe);
    assert_int_equal(ks_keyring_open(f->path, NO_PASS, &kr, &pe), KS_ERR_INSECURE);
    assert_int_equal(pe.code, KS_OK); /* only integrity fills *err */
    assert_int_equal(unlink(f->path), 0);

    /* [K-SEAL-6] A plain file with a corrupt body: with a passphrase the
     * mode mismatch wins, without one the body's rejection is reported. */
    ks_keyring_close(make_keyring(f->path));
    uint8_t *plain = tf_slurp(f->path, &n);
    plain[KS_KRF_PREFIX_LEN] = 0xFF; /* key count far above 1024 */
    assert_int_equal(open_bytes(f->path, plain, n, PASS, &pe), KS_ERR_BAD_PASSPHRASE);
    assert_int_equal(open_bytes(f->path, plain, n, NO_PASS, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_TOO_LARGE);
    assert_int_equal(pe.offset, KS_KRF_PREFIX_LEN);
    /* A plain file with a header fault is integrity with or without one. */
    plain[3] = 2;
    assert_int_equal(open_bytes(f->path, plain, n, PASS, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_UNSUPPORTED_VERSION);
    free(plain);

    /* A sealed file with a header fault: integrity even without a
     * passphrase; with a sound header and none, bad-passphrase. */
    assert_int_equal(unlink(f->path), 0);
    assert_int_equal(ks_keyring_init(f->path, PASS), KS_OK);
    uint8_t *sealed = tf_slurp(f->path, &n);
    assert_int_equal(open_bytes(f->path, sealed, n, NO_PASS, &pe), KS_ERR_BAD_PASSPHRASE);
    assert_int_equal(open_bytes(f->path, sealed, KS_KRF_SEALED_HDR_LEN + 19, NO_PASS, &pe),
                     KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_TRUNCATED);
    assert_int_equal(pe.offset, KS_KRF_SEALED_HDR_LEN);
    sealed[29] = 0xFF; /* memlimit above 1 GiB */
    assert_int_equal(open_bytes(f->path, sealed, n, NO_PASS, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, KS_ERR_BAD_VALUE);
    assert_int_equal(pe.offset, 29);
    free(sealed);

    /* [K-KEY-3] The encoder, like the parser (vector keys-order-and-charset),
     * reports the charset before the order. */
    uint8_t mat[KS_KEK_LEN] = {0};
    ks_krf_version vs[1] = {{KS_KEY_ACTIVE, 1, mat}};
    ks_krf_key keys[2] = {{B("b"), 1, 1, vs}, {B("a a"), 1, 1, vs}};
    assert_int_equal(ks_krf_body_len(keys, 2, &n), KS_ERR_BAD_VALUE);
    keys[1].key_id = B("a");
    assert_int_equal(ks_krf_body_len(keys, 2, &n), KS_ERR_FIELD_ORDER);
}

/* ---- processes: concurrency and crashes ----------------------------------------------- */

#define CHILDREN 4
#define ADDS_PER_CHILD 6

/* In a child: open the keyring itself and add versions. */
static void child_add_versions(const char *path)
{
    ks_keyring *kr = NULL;
    if (ks_keyring_open(path, NO_PASS, &kr, NULL) != KS_OK) {
        _exit(10);
    }
    for (int i = 0; i < ADDS_PER_CHILD; i++) {
        uint32_t v;
        if (ks_keyring_add_version(kr, B("shared"), &v) != KS_OK || v < 2) {
            _exit(11);
        }
    }
    ks_keyring_close(kr);
    _exit(0);
}

static void test_concurrent_processes(void **state)
{
    fixture *f = *state;
    pid_t pids[CHILDREN];
    assert_int_equal(ks_keyring_init(f->path, NO_PASS), KS_OK);
    ks_keyring *kr = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_create(kr, B("shared")), KS_OK);
    ks_keyring_close(kr);

    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            child_add_versions(f->path);
        }
    }
    for (int i = 0; i < CHILDREN; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    /* Every version is there, numbered 1..N without a gap or a repeat
     * (the parser checks the numbering [K-VER-1]). */
    kr = must_open(f->path, NO_PASS);
    ks_keyring_key k;
    assert_int_equal(ks_keyring_key_at(kr, 0, &k), KS_OK);
    assert_int_equal(k.versions, 1 + CHILDREN * ADDS_PER_CHILD);
    for (uint32_t v = 1; v <= k.versions; v++) {
        ks_keyring_version kv;
        assert_int_equal(ks_keyring_version_at(kr, 0, v, &kv), KS_OK);
        assert_int_equal(kv.version, v);
        assert_int_equal(kv.state, KS_KEY_ACTIVE);
    }
    ks_keyring_close(kr);
}

/* Count "<keyring>.tmp-*" files in the fixture's directory. */
static int count_temps(const fixture *f)
{
    DIR *d = opendir(f->dir);
    struct dirent *de;
    int n = 0;
    assert_non_null(d);
    while ((de = readdir(d)) != NULL) {
        n += strncmp(de->d_name, "keyring.tmp-", 12) == 0;
    }
    closedir(d);
    return n;
}

static void test_crash_before_rename(void **state)
{
    fixture *f = *state;
    size_t n0, n1;
    ks_keyring *kr = make_keyring(f->path);
    ks_keyring_close(kr);
    uint8_t *before = tf_slurp(f->path, &n0);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("KEYSHIFT_TEST_CRASH_BEFORE_RENAME", "1", 1);
        ks_keyring *ckr = NULL;
        uint32_t v;
        if (ks_keyring_open(f->path, NO_PASS, &ckr, NULL) != KS_OK) {
            _exit(10);
        }
        const ks_err e = ks_keyring_add_version(ckr, B("db"), &v); /* exits with 99 inside */
        _exit(e == KS_OK ? 11 : 12);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 99);

    /* The old keyring, byte for byte, and a stale temporary beside it. */
    uint8_t *after = tf_slurp(f->path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    assert_int_equal(count_temps(f), 1);

    /* It opens, and the next change succeeds and clears the temporary. */
    kr = must_open(f->path, NO_PASS);
    ks_keyring_key k;
    assert_int_equal(ks_keyring_key_at(kr, key_index(kr, "db"), &k), KS_OK);
    assert_int_equal(k.versions, 3);
    uint32_t v;
    assert_int_equal(ks_keyring_add_version(kr, B("db"), &v), KS_OK);
    assert_int_equal(v, 4);
    assert_int_equal(count_temps(f), 0);
    ks_keyring_close(kr);
}

/* Two handles in one process on one file: the second sees the first's
 * change when it makes its own (it re-reads under the lock). */
static void test_two_handles(void **state)
{
    fixture *f = *state;
    ks_keyring *a = make_keyring(f->path);
    ks_keyring *b = must_open(f->path, NO_PASS);
    assert_int_equal(ks_keyring_create(a, B("from-a")), KS_OK);
    assert_int_equal(ks_keyring_count(b), 2); /* b's snapshot */
    assert_int_equal(ks_keyring_create(b, B("from-b")), KS_OK);
    assert_int_equal(ks_keyring_count(b), 4);
    assert_int_equal(ks_keyring_create(b, B("from-a")), KS_ERR_EXISTS);
    ks_keyring_close(a);
    ks_keyring_close(b);
}

/* ---- the format functions directly -------------------------------------------------- */

static void test_format_encoder_refuses(void **state)
{
    (void)state;
    uint8_t mat[KS_KEK_LEN] = {0};
    ks_krf_version vs[2] = {{KS_KEY_ACTIVE, 1, mat}, {KS_KEY_DESTROYED, 2, NULL}};
    ks_krf_key keys[2] = {{B("b"), 1, 2, vs}, {B("a"), 1, 1, vs}};
    size_t n;
    uint8_t buf[256];

    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_OK);
    assert_int_equal(n, 4 + 4 + 2 + 1 + 4 + 4 + 46 + 14);
    assert_int_equal(ks_krf_body_len(keys, 2, &n), KS_ERR_FIELD_ORDER);
    assert_int_equal(ks_krf_body_len(NULL, 1, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_krf_body_len(keys, KS_KEYRING_MAX_KEYS + 1, &n), KS_ERR_TOO_LARGE);
    keys[0].primary = 2; /* destroyed primary */
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    keys[0].primary = 3;
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    keys[0].primary = 1;
    vs[1].material = mat; /* destroyed with material */
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_INVALID_ARGUMENT);
    vs[1].material = NULL;
    vs[1].state = 9;
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    vs[1].state = KS_KEY_DESTROYED;
    keys[0].count = 0;
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    keys[0].count = KS_KEYRING_MAX_VERSIONS + 1;
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_TOO_LARGE);
    keys[0].count = 2;
    keys[0].key_id = B("b c");
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    keys[0].key_id = (ks_bytes){NULL, 0};
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_BAD_VALUE);
    keys[0].key_id = B("b");
    keys[0].versions = NULL;
    assert_int_equal(ks_krf_body_len(keys, 1, &n), KS_ERR_INVALID_ARGUMENT);
    keys[0].versions = vs;
    assert_int_equal(ks_krf_encode_body(keys, 1, buf, 10, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_krf_encode_body(keys, 1, NULL, 10, &n), KS_ERR_INVALID_ARGUMENT);

    /* The header encoder. */
    uint8_t salt[KS_KRF_SALT_LEN] = {0}, nonce[KS_KRF_NONCE_LEN] = {0};
    ks_krf_header h = {.mode = 2};
    assert_int_equal(ks_krf_encode_header(&h, buf, sizeof buf, &n), KS_ERR_BAD_VALUE);
    h.mode = KS_KRF_MODE_SEALED;
    assert_int_equal(ks_krf_encode_header(&h, buf, sizeof buf, &n), KS_ERR_INVALID_ARGUMENT);
    h.salt = (ks_bytes){salt, sizeof salt};
    h.nonce = (ks_bytes){nonce, sizeof nonce};
    h.opslimit = 17;
    h.memlimit = 8192;
    assert_int_equal(ks_krf_encode_header(&h, buf, sizeof buf, &n), KS_ERR_BAD_VALUE);
    h.opslimit = 1;
    assert_int_equal(ks_krf_encode_header(&h, buf, 60, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_krf_encode_header(&h, buf, sizeof buf, &n), KS_OK);
    assert_int_equal(n, KS_KRF_SEALED_HDR_LEN);

    /* key_id order: a proper prefix first. */
    assert_true(ks_krf_key_id_cmp(B("a"), B("ab")) < 0);
    assert_true(ks_krf_key_id_cmp(B("ab"), B("a")) > 0);
    assert_true(ks_krf_key_id_cmp(B("ab"), B("ab")) == 0);
    assert_true(ks_krf_key_id_cmp(B("b"), B("ab")) > 0);
}

/* A visitor that fails ends the parse with its own code. */
static ks_err failing_key(void *ctx, const ks_krf_key *key)
{
    (void)ctx;
    (void)key;
    return KS_ERR_NO_MEMORY;
}

static void test_format_visitor_failure(void **state)
{
    fixture *f = *state;
    size_t n;
    ks_parse_error pe = {KS_OK, 0, 0};
    ks_keyring *kr = make_keyring(f->path);
    ks_keyring_close(kr);
    uint8_t *file = tf_slurp(f->path, &n);
    const ks_krf_visitor vis = {failing_key, kt_on_version, NULL};
    assert_int_equal(ks_krf_parse_body(file + 5, n - 5, 5, &vis, NULL, &pe), KS_ERR_NO_MEMORY);
    assert_int_equal(pe.code, KS_OK); /* not a rejection: err untouched */
    free(file);
}

/* ---- the vectors of docs/keyring.md -------------------------------------------------- */

#define MAX_VECTORS 128

/* The keys of a vector block (docs/keyring.md Appendix A). */
enum {
    VK_NAME, VK_EXPECT, VK_PASSPHRASE, VK_DERIVED_KEY, VK_BODY, VK_HEX,
    VK_KEYRING, VK_KEY_ID, VK_VERSION, VK_KEK, VK_AAD, VK_DEK, VK_WRAPPED, VK_COUNT
};

/* Each key's name and the block kinds ('k' keyring, 'w' wrap) it belongs to;
 * only hex may repeat. */
static const struct {
    const char *name;
    const char *kinds;
} vector_keys[VK_COUNT] = {
    [VK_NAME] = {"name", "kw"},       [VK_EXPECT] = {"expect", "kw"},
    [VK_PASSPHRASE] = {"passphrase", "k"}, [VK_DERIVED_KEY] = {"derived_key", "k"},
    [VK_BODY] = {"body", "k"},        [VK_HEX] = {"hex", "k"},
    [VK_KEYRING] = {"keyring", "w"},  [VK_KEY_ID] = {"key_id", "w"},
    [VK_VERSION] = {"version", "w"},  [VK_KEK] = {"kek", "w"},
    [VK_AAD] = {"aad", "w"},          [VK_DEK] = {"dek", "w"},
    [VK_WRAPPED] = {"wrapped", "w"},
};

typedef struct vector {
    char kind;               /* 'k': keyring, 'w': wrap */
    unsigned seen;           /* bit VK_x: key x was given */
    char name[64];
    char expect[64];         /* "ok", "bad-passphrase", "auth-failed", "<name> at <offset>" */
    char passphrase[64];
    char keyring[64];        /* wrap: the keyring vector's name */
    char key_id[64];
    uint32_t version;
    uint8_t *bytes;          /* keyring: the file */
    size_t len;
    uint8_t *body;           /* sealed keyring: the plaintext body */
    size_t body_len;
    uint8_t derived_key[crypto_secretbox_KEYBYTES], kek[KS_KEK_LEN];
    uint8_t aad[256], dek[64], wrapped[128];
    size_t derived_key_len, kek_len, aad_len, dek_len, wrapped_len;
} vector;

/* Decode the hex value s[0, n) into out[0, cap); -1 if it is not hex or
 * does not fit. */
static int hex_field(const char *s, size_t n, uint8_t *out, size_t cap, size_t *out_len)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    const int ok = tf_append_hex(s, n, &buf, &len) == 0 && len <= cap;
    if (ok && len != 0) {
        memcpy(out, buf, len);
    }
    free(buf);
    *out_len = len;
    return ok ? 0 : -1;
}

/* Copy the text value s[0, n) into out[0, cap) as a C string; -1 if it
 * does not fit. */
static int text_field(const char *s, size_t n, char *out, size_t cap)
{
    if (n >= cap) {
        return -1;
    }
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

/* A decimal key version 1..2^32-1 in s[0, n); -1 for anything else. */
static int version_field(const char *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 10 || s[0] == '0') {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* Store value s[0, n) of key k in v; -1 if the value is malformed. */
static int store_key(vector *v, int k, const char *s, size_t n)
{
    switch (k) {
    case VK_NAME: return text_field(s, n, v->name, sizeof v->name);
    case VK_EXPECT: return text_field(s, n, v->expect, sizeof v->expect);
    case VK_PASSPHRASE: return text_field(s, n, v->passphrase, sizeof v->passphrase);
    case VK_KEYRING: return text_field(s, n, v->keyring, sizeof v->keyring);
    case VK_KEY_ID: return text_field(s, n, v->key_id, sizeof v->key_id);
    case VK_VERSION: return version_field(s, n, &v->version);
    case VK_HEX: return tf_append_hex(s, n, &v->bytes, &v->len);
    case VK_BODY: return tf_append_hex(s, n, &v->body, &v->body_len);
    case VK_DERIVED_KEY:
        return hex_field(s, n, v->derived_key, sizeof v->derived_key, &v->derived_key_len);
    case VK_KEK: return hex_field(s, n, v->kek, sizeof v->kek, &v->kek_len);
    case VK_AAD: return hex_field(s, n, v->aad, sizeof v->aad, &v->aad_len);
    case VK_DEK: return hex_field(s, n, v->dek, sizeof v->dek, &v->dek_len);
    case VK_WRAPPED: return hex_field(s, n, v->wrapped, sizeof v->wrapped, &v->wrapped_len);
    }
    return -1;
}

#define HAS(v, k) ((int)(((v)->seen >> (k)) & 1u))

/* Check that v holds exactly the keys Appendix A's tables require for its
 * kind and expectation; NULL when it does, else what is wrong. */
static const char *check_presence(const vector *v)
{
    if (!HAS(v, VK_NAME) || !HAS(v, VK_EXPECT)) {
        return "no name or no expect";
    }
    if (v->kind == 'k') {
        const int sealed = v->len > 4 && v->bytes[4] == KS_KRF_MODE_SEALED;
        const int ok = strcmp(v->expect, "ok") == 0;
        const int opens = ok || strcmp(v->expect, "bad-passphrase") == 0;
        if (!HAS(v, VK_HEX)) {
            return "no hex";
        }
        if (HAS(v, VK_PASSPHRASE) != (sealed && opens)) {
            return "passphrase: required exactly in sealed ok and bad-passphrase vectors";
        }
        if (HAS(v, VK_DERIVED_KEY) != HAS(v, VK_PASSPHRASE) ||
            (HAS(v, VK_DERIVED_KEY) && v->derived_key_len != sizeof v->derived_key)) {
            return "derived_key: 32 bytes, exactly where passphrase is";
        }
        if (HAS(v, VK_BODY) != (sealed && ok)) {
            return "body: required exactly in sealed ok vectors";
        }
        return NULL;
    }
    const int ok = strcmp(v->expect, "ok") == 0;
    if (!ok && strcmp(v->expect, "auth-failed") != 0) {
        return "expect: ok or auth-failed";
    }
    static const int required[] = {VK_KEYRING, VK_KEY_ID, VK_VERSION, VK_KEK, VK_AAD, VK_WRAPPED};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (!HAS(v, required[i])) {
            return "a required key is missing";
        }
    }
    if (v->kek_len != KS_KEK_LEN || v->wrapped_len != KS_LOCAL_WRAPPED_LEN) {
        return "kek: 32 bytes, wrapped: 72 bytes";
    }
    if (HAS(v, VK_DEK) != ok || (ok && v->dek_len != KS_DEK_LEN)) {
        return "dek: 32 bytes, exactly in ok vectors";
    }
    return NULL;
}

/* Read one block's lines, text[0, end), into v (kind already set); NULL
 * when the block is well formed, else what is wrong. */
static const char *parse_block(const char *text, const char *end, vector *v)
{
    for (const char *line = text; line < end;) {
        const char *eol, *colon;
        const int k = tf_block_line(line, end, &vector_keys[0].name, VK_COUNT, sizeof vector_keys[0],
                                    &eol, &colon);
        if (k < 0 || strchr(vector_keys[k].kinds, v->kind) == NULL) {
            return "unknown key"; /* names are unique: a key of another kind is unknown here */
        }
        if (HAS(v, k) && k != VK_HEX) {
            return "repeated key";
        }
        const char *val = colon + 1;
        if (val < eol && *val == ' ') {
            val++;
        }
        if (store_key(v, k, val, (size_t)(eol - val)) != 0) {
            return "malformed value";
        }
        v->seen |= 1u << k;
        line = eol + 1;
    }
    return check_presence(v);
}

/* Release the vectors vs[0, n). */
static void free_vectors(vector *vs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(vs[i].bytes);
        free(vs[i].body);
    }
}

/* Parse every vector block of the document text into vs (at most
 * MAX_VECTORS); the count, or -1 with *why (and the block's name, if it
 * got one, in *where) for a malformed block, every vector then freed. */
static long parse_vectors(const char *text, vector *vs, const char **why, const char **where)
{
    size_t count = 0;
    const char *p = text;
    while ((p = strstr(p, "```ks-")) != NULL) {
        const int is_keyring = strncmp(p, "```ks-keyring-vector\n", 21) == 0;
        const int is_wrap = strncmp(p, "```ks-wrap-vector\n", 18) == 0;
        p += 3;
        if (!is_keyring && !is_wrap) {
            continue;
        }
        const char *start = strchr(p, '\n') + 1;
        const char *end = strstr(start - 1, "\n```");
        *why = count < MAX_VECTORS ? (end != NULL ? NULL : "unterminated block") : "too many";
        vector *v = &vs[count];
        if (*why == NULL) {
            memset(v, 0, sizeof *v);
            v->kind = is_keyring ? 'k' : 'w';
            count++;
            *why = end > start ? parse_block(start, end, v) : "empty block";
        }
        if (*why != NULL) {
            *where = count > 0 ? vs[count - 1].name : "";
            free_vectors(vs, count);
            return -1;
        }
        p = end + 4;
    }
    return (long)count;
}

/* The rejection code whose name is `name`, or 0. */
static ks_err code_named(const char *name)
{
    for (int c = 1; c < 32; c++) {
        if (strcmp(ks_err_name((ks_err)c), name) == 0) {
            return (ks_err)c;
        }
    }
    return KS_OK;
}

/* The plaintext body of keyring vector k: its file after the prefix, or
 * (sealed) its `body`. */
static ks_bytes vector_body(const vector *k)
{
    if (k->len > 4 && k->bytes[4] == KS_KRF_MODE_SEALED) {
        return (ks_bytes){k->body, k->body_len};
    }
    assert_true(k->len >= KS_KRF_PREFIX_LEN);
    return (ks_bytes){k->bytes + KS_KRF_PREFIX_LEN, k->len - KS_KRF_PREFIX_LEN};
}

/* [K-SEAL-3], [K-SEAL-4] for a sealed vector with a passphrase: Argon2id
 * of the passphrase and the file's salt and costs is derived_key, and the
 * box opens under it to body (ok) or does not open (bad-passphrase). */
static void check_sealed_vector(const vector *v, const ks_krf_header *h, int ok)
{
    uint8_t key[crypto_secretbox_KEYBYTES];
    assert_int_equal(crypto_pwhash(key, sizeof key, v->passphrase, strlen(v->passphrase), h->salt.ptr,
                                   h->opslimit, (size_t)h->memlimit, crypto_pwhash_ALG_ARGON2ID13),
                     0);
    if (memcmp(key, v->derived_key, sizeof key) != 0) {
        fail_msg("vector %s: derived_key is not Argon2id of the passphrase", v->name);
    }
    const size_t blen = h->payload.len - crypto_secretbox_MACBYTES;
    uint8_t *body = malloc(blen + 1);
    assert_non_null(body);
    const int opened =
        crypto_secretbox_open_easy(body, h->payload.ptr, h->payload.len, h->nonce.ptr, key) == 0;
    assert_int_equal(opened, ok);
    if (ok) {
        assert_int_equal(blen, v->body_len);
        assert_memory_equal(body, v->body, blen);
        assert_int_equal(ks_krf_parse_body(body, blen, h->payload_offset + crypto_secretbox_MACBYTES,
                                           NULL, NULL, NULL),
                         KS_OK);
    }
    free(body);
}

/* Check one keyring vector: the parser functions, libsodium, then the
 * library. */
static void check_keyring_vector(const fixture *f, const vector *v, unsigned *seen)
{
    ks_parse_error pe = {KS_OK, 0, 0};
    ks_krf_header h;
    const ks_bytes pass = B(v->passphrase);
    ks_err he = ks_krf_parse_header(v->bytes, v->len, &h, &pe);
    if (strcmp(v->expect, "ok") == 0 || strcmp(v->expect, "bad-passphrase") == 0) {
        const int ok = v->expect[0] == 'o';
        assert_int_equal(he, KS_OK);
        if (h.mode == KS_KRF_MODE_PLAIN) {
            kt_model m;
            assert_int_equal(kt_model_parse(h.payload.ptr, h.payload.len, h.payload_offset, &m, &pe),
                             KS_OK);
            assert_true(kt_model_reencodes(&m, h.payload.ptr, h.payload.len));
            kt_model_free(&m);
        } else {
            check_sealed_vector(v, &h, ok);
        }
        assert_int_equal(open_bytes(f->path, v->bytes, v->len, pass, &pe),
                         ok ? KS_OK : KS_ERR_BAD_PASSPHRASE);
        return;
    }
    char name[48];
    size_t offset;
    assert_int_equal(sscanf(v->expect, "%47s at %zu", name, &offset), 2);
    const ks_err code = code_named(name);
    assert_true(ks_err_is_rejection(code));
    seen[code]++;
    if (he == KS_OK) {
        assert_int_equal(h.mode, KS_KRF_MODE_PLAIN);
        he = ks_krf_parse_body(h.payload.ptr, h.payload.len, h.payload_offset, NULL, NULL, &pe);
    }
    if (he != code || pe.offset != offset) {
        fail_msg("vector %s: got %s at %zu, want %s", v->name, ks_err_name(he), pe.offset, v->expect);
    }
    memset(&pe, 0, sizeof pe);
    assert_int_equal(open_bytes(f->path, v->bytes, v->len, pass, &pe), KS_ERR_INTEGRITY);
    assert_int_equal(pe.code, code);
    assert_int_equal(pe.offset, offset);
}

/* The material of version `version` of key_id in body (NULL if absent). */
static const uint8_t *material_in(ks_bytes body, const char *key_id, uint32_t version, kt_model *m)
{
    ks_parse_error pe;
    assert_int_equal(kt_model_parse(body.ptr, body.len, 0, m, &pe), KS_OK);
    for (size_t i = 0; i < m->nkeys; i++) {
        const ks_krf_key *k = &m->keys[i];
        if (k->key_id.len == strlen(key_id) && memcmp(k->key_id.ptr, key_id, k->key_id.len) == 0 &&
            version >= 1 && version <= k->count) {
            return k->versions[version - 1].material;
        }
    }
    return NULL;
}

/* Check one wrap vector against the keyring vector it names, with the
 * provider and with libsodium directly [K-WRAP-1], [K-WRAP-2]. */
static void check_wrap_vector(const fixture *f, const vector *v, const vector *vs, size_t n)
{
    const vector *k = NULL;
    for (size_t i = 0; i < n; i++) {
        if (vs[i].kind == 'k' && strcmp(vs[i].name, v->keyring) == 0) {
            k = &vs[i];
        }
    }
    assert_non_null(k);
    assert_string_equal(k->expect, "ok");
    const int ok = strcmp(v->expect, "ok") == 0;

    /* kek is the named version's material. */
    kt_model m;
    const uint8_t *mat = material_in(vector_body(k), v->key_id, v->version, &m);
    assert_non_null(mat);
    assert_memory_equal(mat, v->kek, KS_KEK_LEN);
    kt_model_free(&m);

    /* libsodium: XChaCha20-Poly1305 of wrapped[24..] under kek. */
    uint8_t dek[KS_DEK_LEN + 16];
    unsigned long long dlen = 0;
    const size_t wn = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
    const int opened = crypto_aead_xchacha20poly1305_ietf_decrypt(
                           dek, &dlen, NULL, v->wrapped + wn, v->wrapped_len - wn, v->aad,
                           v->aad_len, v->wrapped, v->kek) == 0;
    assert_int_equal(opened, ok);
    if (ok) {
        assert_int_equal(dlen, KS_DEK_LEN);
        assert_memory_equal(dek, v->dek, KS_DEK_LEN);
    }

    /* The provider over the keyring file. */
    tf_spit(f->path, k->bytes, k->len, 0600);
    ks_keyring *kr = must_open(f->path, B(k->passphrase));
    ks_provider p;
    memset(dek, 0xA5, sizeof dek);
    assert_int_equal(ks_keyring_provider(kr, &p), KS_OK);
    assert_int_equal(p.ops->unwrap(p.self, B(v->key_id), v->version,
                                   (ks_bytes){v->wrapped, v->wrapped_len},
                                   (ks_bytes){v->aad, v->aad_len}, dek, KS_DEK_LEN, 0),
                     ok ? KS_OK : KS_ERR_AUTH_FAILED);
    if (ok) {
        assert_memory_equal(dek, v->dek, KS_DEK_LEN);
    } else {
        static const uint8_t zero[KS_DEK_LEN];
        assert_memory_equal(dek, zero, KS_DEK_LEN);
    }
    ks_keyring_close(kr);
    /* The AAD is the library's wrap AAD for that envelope identity. */
    uint8_t aad[KS_WRAP_AAD_MAX];
    const size_t an = wrap_aad(v->key_id, v->version, aad, sizeof aad);
    assert_int_equal(an, v->aad_len);
    assert_memory_equal(aad, v->aad, an);
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
    static const char *const good_k = "```ks-keyring-vector\nname: e\nexpect: ok\nhex: 4b534b010000000000\n```\n";
    static const char *const bad[] = {
        /* unknown key */
        "```ks-keyring-vector\nname: e\nexpect: ok\ncomment: x\nhex: 4b534b010000000000\n```\n",
        /* a wrap key in a keyring block */
        "```ks-keyring-vector\nname: e\nexpect: ok\ndek: 00\nhex: 4b534b010000000000\n```\n",
        /* a line that is no key */
        "```ks-keyring-vector\nname: e\nexpect: ok\n4b534b010000000000\n```\n",
        /* missing expect, missing hex, missing name */
        "```ks-keyring-vector\nname: e\nhex: 4b534b010000000000\n```\n",
        "```ks-keyring-vector\nname: e\nexpect: ok\n```\n",
        "```ks-keyring-vector\nexpect: ok\nhex: 4b534b010000000000\n```\n",
        /* repeated name, repeated expect */
        "```ks-keyring-vector\nname: e\nname: f\nexpect: ok\nhex: 4b534b010000000000\n```\n",
        "```ks-keyring-vector\nname: e\nexpect: ok\nexpect: ok\nhex: 4b534b010000000000\n```\n",
        /* bad hex: odd, not hex */
        "```ks-keyring-vector\nname: e\nexpect: ok\nhex: 4b534b01000000000\n```\n",
        "```ks-keyring-vector\nname: e\nexpect: ok\nhex: 4b534b01000000000g\n```\n",
        /* a passphrase in a plain vector; a sealed ok vector without one */
        "```ks-keyring-vector\nname: e\nexpect: ok\npassphrase: p\nderived_key: "
        "0000000000000000000000000000000000000000000000000000000000000000\nhex: 4b534b010000000000\n```\n",
        "```ks-keyring-vector\nname: s\nexpect: ok\nhex: 4b534b0101\n```\n",
        /* an empty block, an unterminated one */
        "```ks-keyring-vector\n```\n",
        "```ks-keyring-vector\nname: e\nexpect: ok\nhex: 4b534b010000000000\n",
        /* wrap: missing expect; dek in an auth-failed vector; version 0 */
        "```ks-wrap-vector\nname: w\nkeyring: e\nkey_id: k\nversion: 1\nkek: "
        "0000000000000000000000000000000000000000000000000000000000000000\naad: 00\nwrapped: 00\n```\n",
        "```ks-wrap-vector\nname: w\nexpect: auth-failed\nkeyring: e\nkey_id: k\nversion: 0\nkek: 00\n"
        "aad: 00\nwrapped: 00\n```\n",
    };
    tf_loader_refuses(good_k, bad, sizeof bad / sizeof bad[0], loads);
}

static void test_spec_vectors(void **state)
{
    fixture *f = *state;
    char path[256];
    size_t n, nk = 0, nw = 0, nsealed = 0, nfail = 0;
    unsigned seen[32] = {0};
    const char *why = "", *where = "";

    tf_spec_path("keyring.md", path, sizeof path);
    uint8_t *text = tf_slurp(path, &n);
    text[n] = '\0';
    vector *vs = calloc(MAX_VECTORS, sizeof *vs);
    assert_non_null(vs);
    const long got = parse_vectors((const char *)text, vs, &why, &where);
    if (got < 0) {
        fail_msg("%s: vector '%s': %s", path, where, why);
    }
    const size_t count = (size_t)got;
    for (size_t i = 0; i < count; i++) {
        if (vs[i].kind == 'k') {
            check_keyring_vector(f, &vs[i], seen);
            nk++;
            nsealed += HAS(&vs[i], VK_DERIVED_KEY);
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (vs[i].kind == 'w') {
            check_wrap_vector(f, &vs[i], vs, count);
            nw++;
            nfail += !HAS(&vs[i], VK_DEK);
        }
    }
    /* Every rejection class the keyring format uses has a vector. */
    static const ks_err classes[] = {KS_ERR_TRUNCATED, KS_ERR_BAD_MAGIC, KS_ERR_UNSUPPORTED_VERSION,
                                     KS_ERR_FIELD_ORDER, KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
                                     KS_ERR_TOO_LARGE, KS_ERR_BAD_VALUE};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        assert_true(seen[classes[i]] > 0);
    }
    assert_true(nk >= 40);
    assert_true(nsealed >= 2);
    assert_true(nw >= 2 && nfail >= 1 && nfail < nw);
    print_message("keyring vectors: %zu keyring (%zu sealed with a derived key), %zu wrap\n", nk,
                  nsealed, nw);
    free_vectors(vs, count);
    free(vs);
    free(text);
}

int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_names),
        cmocka_unit_test_setup_teardown(test_init_and_open_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_permissions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_umask_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_and_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_transitions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_primary_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_wipes_material, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_admin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_provider_states, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_and_corrupt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sealed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_before_rename, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_handles, setup, teardown),
        cmocka_unit_test(test_format_encoder_refuses),
        cmocka_unit_test_setup_teardown(test_format_visitor_failure, setup, teardown),
        cmocka_unit_test(test_vector_loader_strict),
        cmocka_unit_test_setup_teardown(test_spec_vectors, setup, teardown),
    };
    return cmocka_run_group_tests_name("keyring", tests, NULL, NULL);
}
