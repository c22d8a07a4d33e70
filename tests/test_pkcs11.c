/*
 * tests/test_pkcs11.c -- the "pkcs11" key provider (keyshift/pkcs11.h,
 * docs/providers.md "PKCS#11 provider") against a real SoftHSM2 token.
 *
 * The group setup makes a token of its own in a fresh temporary
 * directory (a softhsm2.conf pointing SOFTHSM2_CONF at <dir>/tokens, then
 * `softhsm2-util --init-token`), never the system's token store, and
 * removes it at the end.  Without SoftHSM2 the test fails: `make test`
 * installs it (tools/deps.sh).
 *
 * The module's function list is passed through a filter (the test hook
 * ks_p11_test_filter) that counts C_Login calls, can fail C_EncryptInit
 * with a chosen result, delay C_GenerateRandom and report a token at its
 * final PIN try: so the test proves that a wrong PIN is tried exactly
 * once, that a lost session is reconnected once and only once, and that
 * deadlines hold.  Raw sessions for looking at the token's objects are
 * opened on the provider's own module and slot (p11_internal.h).
 */
#define _GNU_SOURCE /* nftw's FTW_DEPTH|FTW_PHYS */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>

#include <keyshift/crypto.h>
#include <keyshift/envelope.h>
#include <keyshift/pkcs11.h>

#include "../migrate/keys/p11_meta.h"
/* The library under test is built with the test hooks (SAN_HOOKS); this
 * declares ks_p11_test_filter. */
#ifndef KS_TEST_HOOKS
#define KS_TEST_HOOKS
#endif
#include "../migrate/keys/p11_internal.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define PIN "5678"
#define AAD "wrap-aad:test"

extern char **environ;

static char g_dir[256];
static void *g_module;

/* ---- the function-list filter ------------------------------------------ */

static CK_FUNCTION_LIST g_list;
static CK_FUNCTION_LIST_PTR g_real;
static atomic_int g_logins;        /* C_Login calls */
static atomic_int g_fail_left;     /* C_EncryptInit calls still to fail */
static atomic_int g_fail_seen;     /* C_EncryptInit calls failed */
static CK_RV g_fail_rv;
static atomic_int g_delay_ms;      /* C_GenerateRandom sleeps this long */
static atomic_int g_final_try;     /* C_GetTokenInfo reports CKF_USER_PIN_FINAL_TRY */
static _Atomic CK_RV g_init_rv;    /* the module's last C_EncryptInit result */

/* Counting C_Login. */
static CK_RV f_login(CK_SESSION_HANDLE s, CK_USER_TYPE u, CK_UTF8CHAR_PTR pin, CK_ULONG len)
{
    atomic_fetch_add(&g_logins, 1);
    return g_real->C_Login(s, u, pin, len);
}

/* C_EncryptInit that fails g_fail_left times with g_fail_rv. */
static CK_RV f_encrypt_init(CK_SESSION_HANDLE s, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
{
    if (atomic_load(&g_fail_left) > 0) {
        atomic_fetch_sub(&g_fail_left, 1);
        atomic_fetch_add(&g_fail_seen, 1);
        return g_fail_rv;
    }
    const CK_RV rv = g_real->C_EncryptInit(s, m, k);
    atomic_store(&g_init_rv, rv);
    return rv;
}

/* C_GenerateRandom that sleeps g_delay_ms first. */
static CK_RV f_random(CK_SESSION_HANDLE s, CK_BYTE_PTR p, CK_ULONG n)
{
    const int ms = atomic_load(&g_delay_ms);
    if (ms > 0) {
        struct timespec ts = {0, (long)ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    return g_real->C_GenerateRandom(s, p, n);
}

/* C_GetTokenInfo that can claim the final PIN try. */
static CK_RV f_token_info(CK_SLOT_ID slot, CK_TOKEN_INFO_PTR ti)
{
    const CK_RV rv = g_real->C_GetTokenInfo(slot, ti);
    if (rv == CKR_OK && atomic_load(&g_final_try)) {
        ti->flags |= CKF_USER_PIN_FINAL_TRY;
    }
    return rv;
}

/* The ks_p11_test_filter: the module's list with the wrappers above. */
static CK_FUNCTION_LIST_PTR filter(CK_FUNCTION_LIST_PTR f)
{
    g_real = f;
    g_list = *f;
    g_list.C_Login = f_login;
    g_list.C_EncryptInit = f_encrypt_init;
    g_list.C_GenerateRandom = f_random;
    g_list.C_GetTokenInfo = f_token_info;
    return &g_list;
}

/* ---- the token ----------------------------------------------------------- */

/* Remove one file or directory (nftw callback). */
static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Run argv (PATH lookup) with stdout and stderr to /dev/null; its status. */
static int run_quiet(char *const argv[])
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        return -1;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Group setup: a SoftHSM2 token "ks-test" (SO PIN 1234, PIN 5678) in a
 * fresh directory, SOFTHSM2_CONF set before the module is ever loaded. */
static int group_setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/ks-p11-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "test_pkcs11: mkdtemp failed\n");
        return -1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tokens", g_dir);
    if (mkdir(path, 0700) != 0) {
        return -1;
    }
    snprintf(path, sizeof path, "%s/softhsm2.conf", g_dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "directories.tokendir = %s/tokens\nobjectstore.backend = file\nlog.level = ERROR\n",
            g_dir);
    fclose(f);
    setenv("SOFTHSM2_CONF", path, 1);
    if (access(KS_PKCS11_DEFAULT_MODULE, R_OK) != 0) {
        fprintf(stderr, "test_pkcs11: FAIL: no SoftHSM2 module at %s (tools/deps.sh installs "
                        "softhsm2)\n", KS_PKCS11_DEFAULT_MODULE);
        return -1;
    }
    char *const argv[] = {"softhsm2-util", "--init-token", "--free", "--label", "ks-test",
                          "--so-pin", "1234", "--pin", PIN, NULL};
    if (run_quiet(argv) != 0) {
        fprintf(stderr, "test_pkcs11: FAIL: softhsm2-util --init-token failed (is softhsm2 "
                        "installed?)\n");
        return -1;
    }
    /* Keep the module loaded for the whole run, so that g_real (the
     * function list the filter saw) stays valid between providers. */
    g_module = dlopen(KS_PKCS11_DEFAULT_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (g_module == NULL) {
        return -1;
    }
    ks_p11_test_filter = filter;
    return 0;
}

/* Group teardown: remove the token directory. */
static int group_teardown(void **state)
{
    (void)state;
    if (g_module != NULL) {
        dlclose(g_module);
    }
    if (g_dir[0] != '\0') {
        nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    return 0;
}

/* A config for the test token by label. */
static ks_pkcs11_config config(const char *pin)
{
    ks_pkcs11_config c;
    memset(&c, 0, sizeof c);
    c.token_label = "ks-test";
    c.pin = (ks_bytes){(const uint8_t *)pin, strlen(pin)};
    return c;
}

/* Open the test token with the right PIN. */
static ks_provider open_ok(void)
{
    ks_pkcs11_config c = config(PIN);
    ks_provider p;
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_OK);
    assert_string_equal(p.name, "pkcs11");
    return p;
}

/* A raw session on the provider's module and slot (shares its login). */
static CK_SESSION_HANDLE raw_session(const ks_provider *prov)
{
    const ks_p11 *p = prov->self;
    CK_SESSION_HANDLE s = CK_INVALID_HANDLE;
    assert_int_equal(g_real->C_OpenSession(p->slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL,
                                           NULL, &s),
                     CKR_OK);
    return s;
}

/* The number of objects of class cls labelled label; the first in *first. */
static CK_ULONG count_objects(CK_SESSION_HANDLE s, CK_OBJECT_CLASS cls, const char *label,
                              CK_OBJECT_HANDLE *first)
{
    CK_ATTRIBUTE t[] = {{CKA_CLASS, &cls, sizeof cls},
                        {CKA_LABEL, (void *)(uintptr_t)label, strlen(label)}};
    CK_OBJECT_HANDLE h[8];
    CK_ULONG n = 0;
    assert_int_equal(g_real->C_FindObjectsInit(s, t, 2), CKR_OK);
    assert_int_equal(g_real->C_FindObjects(s, h, 8, &n), CKR_OK);
    assert_int_equal(g_real->C_FindObjectsFinal(s), CKR_OK);
    if (first != NULL && n > 0) {
        *first = h[0];
    }
    return n;
}

/* The number of secret key objects labelled "keyshift:" key_id ":" v. */
static CK_ULONG count_key_objects(CK_SESSION_HANDLE s, const char *key_id, uint32_t v,
                                  CK_OBJECT_HANDLE *first)
{
    char label[400];
    snprintf(label, sizeof label, "keyshift:%s:%u", key_id, (unsigned)v);
    return count_objects(s, CKO_SECRET_KEY, label, first);
}

/* Wrap a fixed DEK under (key_id, v); the result code. */
static ks_err wrap(const ks_provider *p, const char *key_id, uint32_t v, uint8_t out[64],
                   size_t *len)
{
    uint8_t dek[KS_DEK_LEN];
    memset(dek, 0x42, sizeof dek);
    return p->ops->wrap(p->self, (ks_bytes){(const uint8_t *)key_id, strlen(key_id)}, v, dek,
                        sizeof dek, BV(AAD), out, 64, len, 0);
}

/* Unwrap into dek (prefilled with 0xAA); the result code. */
static ks_err unwrap(const ks_provider *p, const char *key_id, uint32_t v, const uint8_t *w,
                     size_t wlen, ks_bytes aad, uint8_t dek[KS_DEK_LEN])
{
    memset(dek, 0xAA, KS_DEK_LEN);
    return p->ops->unwrap(p->self, (ks_bytes){(const uint8_t *)key_id, strlen(key_id)}, v,
                          (ks_bytes){w, wlen}, aad, dek, KS_DEK_LEN, 0);
}

/* Nonzero when all n bytes are zero. */
static int all_zero(const uint8_t *b, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc |= b[i];
    }
    return acc == 0;
}

/* The ks_bytes of a C string. */
static ks_bytes S(const char *s)
{
    return (ks_bytes){(const uint8_t *)s, strlen(s)};
}

/* ---- the metadata record parser -------------------------------------------- */

/* A valid record: key "k/1", three versions, primary 2. */
static size_t valid_record(uint8_t *buf, size_t cap)
{
    ks_p11meta m;
    memset(&m, 0, sizeof m);
    m.seq = 7;
    memcpy(m.key_id, "k/1", 3);
    m.key_id_len = 3;
    m.nversions = 3;
    m.primary = 2;
    m.states[0] = KS_KEY_DECRYPT_ONLY;
    m.states[1] = KS_KEY_ACTIVE;
    m.states[2] = KS_KEY_DESTROYED;
    size_t len = 0;
    assert_int_equal(ks_p11meta_encode(&m, buf, cap, &len), KS_OK);
    return len;
}

/* The parser accepts exactly the canonical records: every truncation,
 * extension and out-of-range field is refused with its code. */
static void test_meta_parser(void **state)
{
    (void)state;
    static uint8_t buf[KS_P11META_MAX_LEN + 8], re[KS_P11META_MAX_LEN];
    static ks_p11meta m, m2;
    const size_t len = valid_record(buf, sizeof buf);
    assert_int_equal(len, 23 + 3 + 3);
    assert_memory_equal(buf, "KSPM\x01", 5);
    assert_int_equal(ks_p11meta_parse(buf, len, &m), KS_OK);
    assert_int_equal(m.seq, 7);
    assert_int_equal(m.nversions, 3);
    assert_int_equal(m.primary, 2);
    assert_int_equal(m.states[2], KS_KEY_DESTROYED);
    size_t rl = 0;
    assert_int_equal(ks_p11meta_encode(&m, re, sizeof re, &rl), KS_OK);
    assert_int_equal(rl, len);
    assert_memory_equal(re, buf, len);
    assert_int_equal(ks_p11meta_encode(&m, re, len - 1, &rl), KS_ERR_BUFFER_TOO_SMALL);

    /* Every proper prefix is truncated; one byte more is refused. */
    for (size_t n = 0; n < len; n++) {
        assert_int_equal(ks_p11meta_parse(buf, n, &m2), KS_ERR_TRUNCATED);
    }
    buf[len] = 0;
    assert_int_equal(ks_p11meta_parse(buf, len + 1, &m2), KS_ERR_BAD_VALUE);
    assert_int_equal(ks_p11meta_parse(buf, KS_P11META_MAX_LEN + 1, &m2), KS_ERR_TOO_LARGE);
    assert_int_equal(ks_p11meta_parse(NULL, 0, &m2), KS_ERR_TRUNCATED);
    assert_int_equal(ks_p11meta_parse(buf, len, NULL), KS_ERR_INVALID_ARGUMENT);

    /* One-byte changes: offsets 0..3 magic, 4 version, 5..12 seq, 13..14
     * key_id length, 15..17 key_id, 18..21 count, 22..25 primary, 26..28
     * states. */
    struct {
        size_t off;
        uint8_t v;
        ks_err want;
    } bad[] = {
        {0, 'X', KS_ERR_BAD_MAGIC},
        {3, 'K', KS_ERR_BAD_MAGIC},
        {4, 0, KS_ERR_UNSUPPORTED_VERSION},
        {4, 2, KS_ERR_UNSUPPORTED_VERSION},
        {13, 0x01, KS_ERR_TOO_LARGE},        /* key_id length 259 */
        {14, 0, KS_ERR_BAD_VALUE},           /* key_id length 0 */
        {14, 4, KS_ERR_BAD_VALUE},           /* key_id takes a 0x00 of the count */
        {14, 0xFF, KS_ERR_TRUNCATED},        /* longer than the record */
        {15, ' ', KS_ERR_BAD_VALUE},         /* outside [F-KEYID-1] */
        {17, 0, KS_ERR_BAD_VALUE},
        {18, 0x01, KS_ERR_TOO_LARGE},        /* 2^24 + 3 versions */
        {21, 0, KS_ERR_BAD_VALUE},           /* no versions */
        {21, 2, KS_ERR_BAD_VALUE},           /* primary 2 of 2 is fine, but bytes remain */
        {21, 4, KS_ERR_TRUNCATED},           /* four states, three bytes */
        {25, 0, KS_ERR_BAD_VALUE},           /* primary 0 */
        {25, 4, KS_ERR_BAD_VALUE},           /* primary past the last */
        {25, 1, KS_ERR_BAD_VALUE},           /* primary not active */
        {22, 0x80, KS_ERR_BAD_VALUE},        /* primary huge */
        {26, 0, KS_ERR_BAD_VALUE},           /* state 0 */
        {28, 5, KS_ERR_BAD_VALUE},           /* state 5 */
        {27, 2, KS_ERR_BAD_VALUE},           /* primary decrypt-only */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t b[64];
        memcpy(b, buf, len);
        b[bad[i].off] = bad[i].v;
        if (ks_p11meta_parse(b, len, &m2) != bad[i].want) {
            fail_msg("change %zu (offset %zu to %u): got %d, want %d", i, bad[i].off,
                     (unsigned)bad[i].v, ks_p11meta_parse(b, len, &m2), bad[i].want);
        }
    }
    /* seq 0. */
    uint8_t b[64];
    memcpy(b, buf, len);
    b[12] = 0;
    assert_int_equal(ks_p11meta_parse(b, len, &m2), KS_ERR_BAD_VALUE);

    /* The encoder refuses what the parser refuses. */
    m2 = m;
    m2.seq = 0;
    assert_int_equal(ks_p11meta_encode(&m2, re, sizeof re, &rl), KS_ERR_BAD_VALUE);
    m2 = m;
    m2.primary = 1;
    assert_int_equal(ks_p11meta_encode(&m2, re, sizeof re, &rl), KS_ERR_BAD_VALUE);
    m2 = m;
    m2.key_id_len = KS_KEY_ID_MAX + 1;
    assert_int_equal(ks_p11meta_encode(&m2, re, sizeof re, &rl), KS_ERR_TOO_LARGE);
    m2 = m;
    m2.nversions = KS_P11META_MAX_VERSIONS + 1;
    assert_int_equal(ks_p11meta_encode(&m2, re, sizeof re, &rl), KS_ERR_TOO_LARGE);

    /* The largest record parses. */
    memset(&m2, 0, sizeof m2);
    m2.seq = UINT64_MAX;
    memset(m2.key_id, 'z', KS_KEY_ID_MAX);
    m2.key_id_len = KS_KEY_ID_MAX;
    m2.nversions = KS_P11META_MAX_VERSIONS;
    m2.primary = KS_P11META_MAX_VERSIONS;
    memset(m2.states, KS_KEY_ACTIVE, KS_P11META_MAX_VERSIONS);
    assert_int_equal(ks_p11meta_encode(&m2, re, sizeof re, &rl), KS_OK);
    assert_int_equal(rl, KS_P11META_MAX_LEN);
    assert_int_equal(ks_p11meta_parse(re, rl, &m), KS_OK);
    assert_int_equal(m.seq, UINT64_MAX);
}

/* ---- opening --------------------------------------------------------------- */

/* By label and by RFC 7512 URI; unknown tokens, bad selectors. */
static void test_open(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    ks_provider_destroy(&p);

    ks_pkcs11_config c = config(PIN);
    c.token_label = NULL;
    c.token_uri = "pkcs11:token=ks-test";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_OK);
    ks_provider_destroy(&p);
    c.token_uri = "pkcs11:token=ks-test;manufacturer=SoftHSM%20project";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_OK);
    ks_provider_destroy(&p);

    c.token_uri = "pkcs11:token=no-such-token";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_UNAVAILABLE);
    c.token_uri = "not a uri";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_INVALID_ARGUMENT);
    c.token_label = "ks-test"; /* both */
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_INVALID_ARGUMENT);
    c.token_uri = NULL;
    c.token_label = "no-such-token";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_UNAVAILABLE);
    c.token_label = "a label longer than thirty-two bytes";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_INVALID_ARGUMENT);
    c = config(PIN);
    c.module = "/nonexistent/libnothing.so";
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_UNAVAILABLE);
    c = config("");
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_pkcs11_open(NULL, &p), KS_ERR_INVALID_ARGUMENT);
}

/* A wrong PIN is denied after exactly one C_Login, and the token records
 * the failed attempt (CKF_USER_PIN_COUNT_LOW); a token at its final try is
 * refused without any attempt. */
static void test_wrong_pin(void **state)
{
    (void)state;
    ks_pkcs11_config c = config("0000");
    ks_provider p;
    atomic_store(&g_logins, 0);
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_DENIED);
    assert_int_equal(atomic_load(&g_logins), 1);

    /* The token's own record of it (no provider is open: initialise the
     * module ourselves). */
    assert_int_equal(g_real->C_Initialize(NULL), CKR_OK);
    CK_SLOT_ID slots[8];
    CK_ULONG n = 8;
    assert_int_equal(g_real->C_GetSlotList(CK_TRUE, slots, &n), CKR_OK);
    int seen = 0;
    for (CK_ULONG i = 0; i < n; i++) {
        CK_TOKEN_INFO ti;
        assert_int_equal(g_real->C_GetTokenInfo(slots[i], &ti), CKR_OK);
        if (memcmp(ti.label, "ks-test ", 8) == 0) {
            seen = 1;
            assert_true((ti.flags & CKF_USER_PIN_COUNT_LOW) != 0);
        }
    }
    assert_true(seen);
    assert_int_equal(g_real->C_Finalize(NULL), CKR_OK);

    atomic_store(&g_logins, 0);
    atomic_store(&g_final_try, 1);
    c = config(PIN);
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_DENIED);
    atomic_store(&g_final_try, 0);
    assert_int_equal(atomic_load(&g_logins), 0);

    p = open_ok(); /* the right PIN still works (and clears the count) */
    ks_provider_destroy(&p);
}

/* ---- key management ---------------------------------------------------------- */

typedef struct listing {
    char ids[16][32];
    uint32_t versions[16];
    ks_key_state states[16];
    int primary[16];
    size_t n;
    size_t stop_after;
} listing;

/* ks_key_list_fn collecting entries. */
static int collect(void *arg, const ks_key_entry *e)
{
    listing *l = arg;
    if (l->n < 16) {
        snprintf(l->ids[l->n], sizeof l->ids[0], "%.*s", (int)e->key_id.len,
                 (const char *)e->key_id.ptr);
        l->versions[l->n] = e->version;
        l->states[l->n] = e->state;
        l->primary[l->n] = e->is_primary;
    }
    l->n++;
    return l->stop_after != 0 && l->n >= l->stop_after;
}

/* create, add_version, promote, set_state and list, with the state rules
 * of [K-STATE-2..4]. */
static void test_admin(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    const ks_provider_admin_ops *a = p.ops->admin;
    assert_non_null(a);
    assert_int_equal(a->create(p.self, S("adm/b"), 0), KS_OK);
    assert_int_equal(a->create(p.self, S("adm/a"), 0), KS_OK);
    assert_int_equal(a->create(p.self, S("adm/a"), 0), KS_ERR_EXISTS);
    assert_int_equal(a->create(p.self, S("bad id"), 0), KS_ERR_BAD_VALUE);
    assert_int_equal(a->create(p.self, S(""), 0), KS_ERR_BAD_VALUE);

    uint32_t v = 0;
    assert_int_equal(a->add_version(p.self, S("adm/a"), &v, 0), KS_OK);
    assert_int_equal(v, 2);
    assert_int_equal(a->add_version(p.self, S("adm/a"), &v, 0), KS_OK);
    assert_int_equal(v, 3);
    assert_int_equal(a->add_version(p.self, S("adm/none"), &v, 0), KS_ERR_NOT_FOUND);

    ks_key_info ki;
    assert_int_equal(p.ops->key_info(p.self, S("adm/a"), 0, &ki, 0), KS_OK);
    assert_int_equal(ki.version, 1);
    assert_true(ki.is_primary);
    assert_int_equal(p.ops->key_info(p.self, S("adm/a"), 4, &ki, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(p.ops->key_info(p.self, S("adm/none"), 0, &ki, 0), KS_ERR_NOT_FOUND);

    /* [K-STATE-3]: the primary stays active; promote an active one only. */
    assert_int_equal(a->set_state(p.self, S("adm/a"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_ERR_STATE);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 3, KS_KEY_DISABLED, 0), KS_OK);
    assert_int_equal(a->promote(p.self, S("adm/a"), 3, 0), KS_ERR_STATE);
    assert_int_equal(a->promote(p.self, S("adm/a"), 2, 0), KS_OK);
    assert_int_equal(a->promote(p.self, S("adm/a"), 2, 0), KS_OK); /* in effect */
    assert_int_equal(a->promote(p.self, S("adm/a"), 9, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->promote(p.self, S("adm/a"), 0, 0), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 1, KS_KEY_DECRYPT_ONLY, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 3, KS_KEY_ACTIVE, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 3, KS_KEY_DESTROYED, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 3, KS_KEY_DESTROYED, 0), KS_OK);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 3, KS_KEY_ACTIVE, 0), KS_ERR_STATE);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 9, KS_KEY_ACTIVE, 0), KS_ERR_NOT_FOUND);
    assert_int_equal(a->set_state(p.self, S("adm/a"), 1, (ks_key_state)5, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->key_info(p.self, S("adm/a"), 0, &ki, 0), KS_OK);
    assert_int_equal(ki.version, 2);
    assert_int_equal(p.ops->key_info(p.self, S("adm/a"), 3, &ki, 0), KS_OK);
    assert_int_equal(ki.state, KS_KEY_DESTROYED);
    assert_false(ki.is_primary);

    /* One key, then every key: key_id order, versions ascending. */
    listing l;
    memset(&l, 0, sizeof l);
    assert_int_equal(a->list(p.self, S("adm/a"), collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.states[0], KS_KEY_DECRYPT_ONLY);
    assert_int_equal(l.states[1], KS_KEY_ACTIVE);
    assert_true(l.primary[1]);
    assert_int_equal(l.states[2], KS_KEY_DESTROYED);
    assert_int_equal(a->list(p.self, S("adm/none"), collect, &l, 0), KS_ERR_NOT_FOUND);

    memset(&l, 0, sizeof l);
    assert_int_equal(a->list(p.self, S(""), collect, &l, 0), KS_OK);
    size_t ia = 16, ib = 16;
    for (size_t i = 0; i < l.n && i < 16; i++) {
        if (strcmp(l.ids[i], "adm/a") == 0 && ia == 16) {
            ia = i;
        }
        if (strcmp(l.ids[i], "adm/b") == 0 && ib == 16) {
            ib = i;
        }
        if (i > 0) {
            assert_true(strcmp(l.ids[i - 1], l.ids[i]) < 0 ||
                        (strcmp(l.ids[i - 1], l.ids[i]) == 0 && l.versions[i - 1] < l.versions[i]));
        }
    }
    assert_true(ia < 16 && ib < 16 && ia < ib);
    assert_int_equal(l.versions[ia], 1);
    assert_int_equal(l.versions[ia + 2], 3);

    memset(&l, 0, sizeof l);
    l.stop_after = 2;
    assert_int_equal(a->list(p.self, S(""), collect, &l, 0), KS_OK);
    assert_int_equal(l.n, 2);

    /* The token holds one metadata object per key after all those changes. */
    CK_SESSION_HANDLE s = raw_session(&p);
    assert_int_equal(count_objects(s, CKO_DATA, "keyshift-meta:adm/a", NULL), 1);
    assert_int_equal(count_key_objects(s, "adm/a", 3, NULL), 0);
    assert_int_equal(count_key_objects(s, "adm/a", 2, NULL), 1);
    g_real->C_CloseSession(s);
    ks_provider_destroy(&p);
}

/* ---- wrap and unwrap ------------------------------------------------------------ */

/* Round trip; 60 bytes; another AAD, any flipped byte or another length
 * is auth-failed with the DEK zeroed; an empty AAD is refused. */
static void test_wrap_unwrap(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("wrap/k"), 0), KS_OK);
    uint8_t w[64], w2[64], dek[KS_DEK_LEN], want[KS_DEK_LEN];
    size_t len = 0, len2 = 0;
    memset(want, 0x42, sizeof want);
    assert_int_equal(wrap(&p, "wrap/k", 1, w, &len), KS_OK);
    assert_int_equal(len, KS_PKCS11_WRAPPED_LEN);
    assert_int_equal(len, 60);
    assert_int_equal(wrap(&p, "wrap/k", 1, w2, &len2), KS_OK);
    assert_memory_not_equal(w, w2, 12); /* a fresh IV each time */
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, BV(AAD), dek), KS_OK);
    assert_memory_equal(dek, want, KS_DEK_LEN);

    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, BV("wrap-aad:other"), dek),
                     KS_ERR_AUTH_FAILED);
    assert_true(all_zero(dek, KS_DEK_LEN));
    for (size_t i = 0; i < len; i += 7) {
        w[i] ^= 0x01;
        assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, BV(AAD), dek), KS_ERR_AUTH_FAILED);
        assert_true(all_zero(dek, KS_DEK_LEN));
        w[i] ^= 0x01;
    }
    w[len - 1] ^= 0x80; /* the tag's last byte */
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, BV(AAD), dek), KS_ERR_AUTH_FAILED);
    w[len - 1] ^= 0x80;
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len - 1, BV(AAD), dek), KS_ERR_AUTH_FAILED);
    assert_true(all_zero(dek, KS_DEK_LEN));
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len + 1, BV(AAD), dek), KS_ERR_AUTH_FAILED);
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, (ks_bytes){NULL, 0}, dek),
                     KS_ERR_INVALID_ARGUMENT);
    assert_true(all_zero(dek, KS_DEK_LEN));
    assert_int_equal(unwrap(&p, "wrap/k", 1, w, len, BV(AAD), dek), KS_OK);

    /* Another version's KEK does not unwrap it. */
    uint32_t v = 0;
    assert_int_equal(p.ops->admin->add_version(p.self, S("wrap/k"), &v, 0), KS_OK);
    assert_int_equal(unwrap(&p, "wrap/k", 2, w, len, BV(AAD), dek), KS_ERR_AUTH_FAILED);
    assert_true(all_zero(dek, KS_DEK_LEN));

    uint8_t d[KS_DEK_LEN] = {0};
    assert_int_equal(p.ops->wrap(p.self, S("wrap/k"), 1, d, sizeof d, (ks_bytes){NULL, 0}, w, 64,
                                 &len, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(p.ops->wrap(p.self, S("wrap/k"), 1, d, sizeof d, BV(AAD), w, 59, &len, 0),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(p.ops->wrap(p.self, S("wrap/k"), 0, d, sizeof d, BV(AAD), w, 64, &len, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(wrap(&p, "wrap/none", 1, w, &len), KS_ERR_NOT_FOUND);
    assert_int_equal(wrap(&p, "wrap/k", 3, w, &len), KS_ERR_NOT_FOUND);
    ks_provider_destroy(&p);
}

/* decrypt-only refuses wrap, disabled both, destroyed is revoked and its
 * object is gone; the token itself enforces the usage flags. */
static void test_states(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    const ks_provider_admin_ops *a = p.ops->admin;
    assert_int_equal(a->create(p.self, S("st/k"), 0), KS_OK);
    uint32_t v = 0;
    assert_int_equal(a->add_version(p.self, S("st/k"), &v, 0), KS_OK);
    assert_int_equal(v, 2);
    uint8_t w[64], dek[KS_DEK_LEN];
    size_t len = 0;
    assert_int_equal(wrap(&p, "st/k", 2, w, &len), KS_OK);

    CK_SESSION_HANDLE s = raw_session(&p);
    CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
    assert_int_equal(count_key_objects(s, "st/k", 2, &h), 1);

    assert_int_equal(a->set_state(p.self, S("st/k"), 2, KS_KEY_DECRYPT_ONLY, 0), KS_OK);
    uint8_t scratch[64];
    assert_int_equal(wrap(&p, "st/k", 2, scratch, &len), KS_ERR_DENIED);
    assert_int_equal(unwrap(&p, "st/k", 2, w, 60, BV(AAD), dek), KS_OK);
    CK_BBOOL enc = CK_TRUE, dec = CK_FALSE;
    CK_ATTRIBUTE at[] = {{CKA_ENCRYPT, &enc, sizeof enc}, {CKA_DECRYPT, &dec, sizeof dec}};
    assert_int_equal(g_real->C_GetAttributeValue(s, h, at, 2), CKR_OK);
    const ks_p11 *pp = p.self;
    if (!pp->usage_attrs_refused) {
        assert_int_equal(enc, CK_FALSE);
        assert_int_equal(dec, CK_TRUE);
    }

    assert_int_equal(a->set_state(p.self, S("st/k"), 2, KS_KEY_DISABLED, 0), KS_OK);
    assert_int_equal(wrap(&p, "st/k", 2, scratch, &len), KS_ERR_DENIED);
    uint8_t w0[64];
    size_t l0 = 0;
    assert_int_equal(wrap(&p, "st/k", 1, w0, &l0), KS_OK);
    assert_int_equal(unwrap(&p, "st/k", 2, w0, l0, BV(AAD), dek), KS_ERR_DENIED);
    assert_true(all_zero(dek, KS_DEK_LEN));
    assert_int_equal(g_real->C_GetAttributeValue(s, h, at, 2), CKR_OK);
    if (!pp->usage_attrs_refused) {
        assert_int_equal(enc, CK_FALSE);
        assert_int_equal(dec, CK_FALSE);
    }

    /* Disabled is reversible. */
    assert_int_equal(a->set_state(p.self, S("st/k"), 2, KS_KEY_ACTIVE, 0), KS_OK);
    assert_int_equal(unwrap(&p, "st/k", 2, w, 60, BV(AAD), dek), KS_OK);
    assert_int_equal(g_real->C_GetAttributeValue(s, h, at, 2), CKR_OK);
    if (!pp->usage_attrs_refused) {
        assert_int_equal(enc, CK_TRUE);
        assert_int_equal(dec, CK_TRUE);
    }

    assert_int_equal(a->set_state(p.self, S("st/k"), 2, KS_KEY_DESTROYED, 0), KS_OK);
    assert_int_equal(wrap(&p, "st/k", 2, w0, &l0), KS_ERR_REVOKED);
    assert_int_equal(unwrap(&p, "st/k", 2, w, 60, BV(AAD), dek), KS_ERR_REVOKED);
    assert_true(all_zero(dek, KS_DEK_LEN));
    ks_key_info ki;
    assert_int_equal(p.ops->key_info(p.self, S("st/k"), 2, &ki, 0), KS_OK);
    assert_int_equal(ki.state, KS_KEY_DESTROYED);
    assert_int_equal(count_key_objects(s, "st/k", 2, NULL), 0);
    assert_int_equal(count_key_objects(s, "st/k", 1, NULL), 1);
    g_real->C_CloseSession(s);
    ks_provider_destroy(&p);
}

/* A KEK's bytes cannot be read out of the token. */
static void test_not_extractable(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("ext/k"), 0), KS_OK);
    CK_SESSION_HANDLE s = raw_session(&p);
    CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
    assert_int_equal(count_key_objects(s, "ext/k", 1, &h), 1);
    uint8_t kek[64];
    CK_ATTRIBUTE a = {CKA_VALUE, kek, sizeof kek};
    const CK_RV rv = g_real->C_GetAttributeValue(s, h, &a, 1);
    assert_int_equal(rv, CKR_ATTRIBUTE_SENSITIVE);
    assert_int_equal(a.ulValueLen, CK_UNAVAILABLE_INFORMATION);

    CK_BBOOL sens = CK_FALSE, extr = CK_TRUE, tok = CK_FALSE, priv = CK_FALSE;
    CK_ULONG vlen = 0;
    uint8_t id[64];
    CK_ATTRIBUTE at[] = {{CKA_SENSITIVE, &sens, sizeof sens}, {CKA_EXTRACTABLE, &extr, sizeof extr},
                         {CKA_TOKEN, &tok, sizeof tok},         {CKA_PRIVATE, &priv, sizeof priv},
                         {CKA_VALUE_LEN, &vlen, sizeof vlen},   {CKA_ID, id, sizeof id}};
    assert_int_equal(g_real->C_GetAttributeValue(s, h, at, 6), CKR_OK);
    assert_int_equal(sens, CK_TRUE);
    assert_int_equal(extr, CK_FALSE);
    assert_int_equal(tok, CK_TRUE);
    assert_int_equal(priv, CK_TRUE);
    assert_int_equal(vlen, 32);
    assert_int_equal(at[5].ulValueLen, 4 + 5);
    assert_memory_equal(id, "\0\0\0\1ext/k", 9);

    /* Making it extractable is refused too. */
    CK_BBOOL yes = CK_TRUE;
    CK_ATTRIBUTE mk = {CKA_EXTRACTABLE, &yes, sizeof yes};
    assert_int_not_equal(g_real->C_SetAttributeValue(s, h, &mk, 1), CKR_OK);
    g_real->C_CloseSession(s);
    ks_provider_destroy(&p);
}

/* ---- what the token holds ----------------------------------------------------------- */

/* Create a metadata data object for key_id holding value[0, len). */
static CK_OBJECT_HANDLE put_meta(CK_SESSION_HANDLE s, const char *key_id, const uint8_t *value,
                                 size_t len)
{
    char label[300];
    snprintf(label, sizeof label, "keyshift-meta:%s", key_id);
    CK_OBJECT_CLASS cls = CKO_DATA;
    CK_BBOOL yes = CK_TRUE;
    CK_ATTRIBUTE t[] = {{CKA_CLASS, &cls, sizeof cls},
                        {CKA_TOKEN, &yes, sizeof yes},
                        {CKA_PRIVATE, &yes, sizeof yes},
                        {CKA_APPLICATION, (void *)(uintptr_t) "keyshift", 8},
                        {CKA_LABEL, label, strlen(label)},
                        {CKA_VALUE, (void *)(uintptr_t)value, len}};
    CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
    assert_int_equal(g_real->C_CreateObject(s, t, 6, &h), CKR_OK);
    return h;
}

/* Encode a record of key_id: n versions, all active, primary p, seq. */
static size_t make_record(const char *key_id, uint64_t seq, uint32_t n, uint32_t p, uint8_t *out)
{
    ks_p11meta m;
    memset(&m, 0, sizeof m);
    m.seq = seq;
    m.key_id_len = strlen(key_id);
    memcpy(m.key_id, key_id, m.key_id_len);
    m.nversions = n;
    m.primary = p;
    memset(m.states, KS_KEY_ACTIVE, n);
    size_t len = 0;
    assert_int_equal(ks_p11meta_encode(&m, out, KS_P11META_MAX_LEN, &len), KS_OK);
    return len;
}

/* Malformed or misplaced records and duplicate key objects are integrity
 * failures; of several records the highest seq wins (equal: the greater
 * bytes), and the next change leaves one. */
static void test_token_records(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    const ks_provider_admin_ops *a = p.ops->admin;
    CK_SESSION_HANDLE s = raw_session(&p);
    ks_key_info ki;
    static uint8_t rec[KS_P11META_MAX_LEN];

    /* Garbage, and a good record under another key's label. */
    CK_OBJECT_HANDLE bad = put_meta(s, "tok/garbage", (const uint8_t *)"KSPM\x01junk", 9);
    assert_int_equal(p.ops->key_info(p.self, S("tok/garbage"), 0, &ki, 0), KS_ERR_INTEGRITY);
    listing l;
    memset(&l, 0, sizeof l);
    assert_int_equal(a->list(p.self, S(""), collect, &l, 0), KS_ERR_INTEGRITY);
    assert_int_equal(g_real->C_DestroyObject(s, bad), CKR_OK);
    size_t len = make_record("tok/other", 1, 1, 1, rec);
    bad = put_meta(s, "tok/moved", rec, len);
    assert_int_equal(p.ops->key_info(p.self, S("tok/moved"), 0, &ki, 0), KS_ERR_INTEGRITY);
    memset(&l, 0, sizeof l);
    assert_int_equal(a->list(p.self, S(""), collect, &l, 0), KS_ERR_INTEGRITY);
    assert_int_equal(g_real->C_DestroyObject(s, bad), CKR_OK);
    memset(&l, 0, sizeof l);
    assert_int_equal(a->list(p.self, S(""), collect, &l, 0), KS_OK);

    /* The highest seq wins; a change then leaves a single record. */
    assert_int_equal(a->create(p.self, S("tok/k"), 0), KS_OK);
    len = make_record("tok/k", 9, 2, 2, rec); /* says version 2 is primary */
    put_meta(s, "tok/k", rec, len);
    assert_int_equal(p.ops->key_info(p.self, S("tok/k"), 0, &ki, 0), KS_OK);
    assert_int_equal(ki.version, 2);
    /* Equal seq (two writers at once): the greater bytes win. */
    len = make_record("tok/k", 9, 3, 3, rec);
    put_meta(s, "tok/k", rec, len);
    assert_int_equal(p.ops->key_info(p.self, S("tok/k"), 0, &ki, 0), KS_OK);
    assert_int_equal(ki.version, 3);
    assert_int_equal(a->promote(p.self, S("tok/k"), 1, 0), KS_OK);
    assert_int_equal(count_objects(s, CKO_DATA, "keyshift-meta:tok/k", NULL), 1);
    assert_int_equal(p.ops->key_info(p.self, S("tok/k"), 0, &ki, 0), KS_OK);
    assert_int_equal(ki.version, 1);

    /* A second key object with version 1's CKA_ID: never used. */
    uint8_t id[16] = {0, 0, 0, 1, 't', 'o', 'k', '/', 'k'};
    CK_OBJECT_CLASS kc = CKO_SECRET_KEY;
    CK_KEY_TYPE kt = CKK_AES;
    CK_ULONG vlen = 32;
    CK_BBOOL yes = CK_TRUE;
    CK_ATTRIBUTE kt_tmpl[] = {{CKA_CLASS, &kc, sizeof kc},   {CKA_KEY_TYPE, &kt, sizeof kt},
                              {CKA_VALUE_LEN, &vlen, sizeof vlen}, {CKA_TOKEN, &yes, sizeof yes},
                              {CKA_ENCRYPT, &yes, sizeof yes}, {CKA_ID, id, 9}};
    CK_MECHANISM gen = {CKM_AES_KEY_GEN, NULL, 0};
    CK_OBJECT_HANDLE dup = CK_INVALID_HANDLE;
    assert_int_equal(g_real->C_GenerateKey(s, &gen, kt_tmpl, 6, &dup), CKR_OK);
    uint8_t w[64];
    assert_int_equal(wrap(&p, "tok/k", 1, w, &len), KS_ERR_INTEGRITY);
    assert_int_equal(g_real->C_DestroyObject(s, dup), CKR_OK);
    assert_int_equal(wrap(&p, "tok/k", 1, w, &len), KS_OK);
    g_real->C_CloseSession(s);
    ks_provider_destroy(&p);
}

/* ---- through a ks_ctx --------------------------------------------------------------- */

/* Seal and open one envelope of each format and algorithm. */
static void seal_open(ks_ctx *ctx, uint8_t format, uint32_t alg, const char *key_id)
{
    ks_seal_params sp = {.format = format, .algorithm = alg, .tenant = BV("acme"),
                         .key_id = S(key_id), .context = BV("row:1")};
    if (format == KS_FORMAT_V2) {
        sp.purpose = BV("card");
    }
    const uint8_t pt[] = "4111111111111111";
    uint8_t env[1024], out[64];
    size_t len = 0, olen = 0;
    assert_int_equal(ks_seal(ctx, &sp, pt, sizeof pt, env, sizeof env, &len), KS_OK);
    ks_open_params op = {.context = BV("row:1")};
    assert_int_equal(ks_open(ctx, env, len, &op, out, sizeof out, &olen, NULL), KS_OK);
    assert_int_equal(olen, sizeof pt);
    assert_memory_equal(out, pt, sizeof pt);
    op.context = BV("row:2");
    assert_int_equal(ks_open(ctx, env, len, &op, out, sizeof out, &olen, NULL), KS_ERR_AUTH_FAILED);
}

/* A context config that asks the provider on every seal and open. */
static ks_ctx_config uncached(void)
{
    ks_ctx_config c;
    ks_ctx_config_default(&c);
    c.cache_entries = 0;
    c.dek_max_messages = 1;
    return c;
}

/* ks_seal / ks_open through the provider: formats 1 and 2, both AEADs. */
static void test_ctx(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("ctx/k"), 0), KS_OK);
    ks_ctx_config c = uncached();
    ks_ctx *ctx = NULL;
    assert_int_equal(ks_ctx_new(&p, &c, &ctx), KS_OK);
    const uint8_t formats[] = {KS_FORMAT_V1, KS_FORMAT_V2};
    const uint32_t algs[] = {KS_ALG_AES256GCM, KS_ALG_XCHACHA20POLY1305};
    for (size_t i = 0; i < 2; i++) {
        for (size_t j = 0; j < 2; j++) {
            seal_open(ctx, formats[i], algs[j], "ctx/k");
        }
    }
    ks_ctx_free(ctx);
    ks_provider_destroy(&p);
}

typedef struct worker {
    ks_ctx *ctx;
    int id;
    int failures;
} worker;

/* A thread sealing and opening envelopes through the shared context. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < 12; i++) {
        ks_seal_params sp = {.format = KS_FORMAT_V2, .algorithm = KS_ALG_XCHACHA20POLY1305,
                             .tenant = BV("acme"), .key_id = BV("thr/k"), .purpose = BV("card"),
                             .context = BV("row:t")};
        uint8_t pt[8], env[512], out[16];
        memset(pt, (uint8_t)(w->id * 16 + i), sizeof pt);
        size_t len = 0, olen = 0;
        ks_open_params op = {.context = BV("row:t")};
        if (ks_seal(w->ctx, &sp, pt, sizeof pt, env, sizeof env, &len) != KS_OK ||
            ks_open(w->ctx, env, len, &op, out, sizeof out, &olen, NULL) != KS_OK ||
            olen != sizeof pt || memcmp(out, pt, sizeof pt) != 0) {
            w->failures++;
        }
    }
    return NULL;
}

/* Four threads seal and open through one context (one session each). */
static void test_threads(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("thr/k"), 0), KS_OK);
    ks_ctx_config c = uncached();
    ks_ctx *ctx = NULL;
    assert_int_equal(ks_ctx_new(&p, &c, &ctx), KS_OK);
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){ctx, i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    const ks_p11 *pp = p.self;
    assert_true(pp->npool >= 1 && pp->npool <= 4);
    ks_ctx_free(ctx);
    ks_provider_destroy(&p);
}

/* A forked child seals and opens (re-initialising the module and logging
 * in again first), and opens what the parent sealed; the parent goes on
 * afterwards. */
static void test_fork(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("fork/k"), 0), KS_OK);
    ks_ctx_config c = uncached();
    ks_ctx *ctx = NULL;
    assert_int_equal(ks_ctx_new(&p, &c, &ctx), KS_OK);
    ks_seal_params sp = {.format = KS_FORMAT_V2, .algorithm = KS_ALG_AES256GCM,
                         .tenant = BV("acme"), .key_id = BV("fork/k"), .purpose = BV("card"),
                         .context = BV("row:f")};
    ks_open_params op = {.context = BV("row:f")};
    const uint8_t pt[] = "parent";
    uint8_t env[512], out[32];
    size_t len = 0, olen = 0;
    assert_int_equal(ks_seal(ctx, &sp, pt, sizeof pt, env, sizeof env, &len), KS_OK);
    const int logins = atomic_load(&g_logins);

    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20);
        uint8_t cenv[512], cout[32];
        size_t clen = 0, colen = 0;
        const uint8_t cpt[] = "child";
        int rc = 0;
        if (ks_seal(ctx, &sp, cpt, sizeof cpt, cenv, sizeof cenv, &clen) != KS_OK) {
            rc = 10;
        } else if (ks_open(ctx, cenv, clen, &op, cout, sizeof cout, &colen, NULL) != KS_OK ||
                   colen != sizeof cpt || memcmp(cout, cpt, sizeof cpt) != 0) {
            rc = 11;
        } else if (ks_open(ctx, env, len, &op, cout, sizeof cout, &colen, NULL) != KS_OK ||
                   colen != sizeof pt) {
            rc = 12;
        } else if (atomic_load(&g_logins) != logins + 1) {
            rc = 13; /* the child logged in again, once */
        }
        _exit(rc);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's provider is untouched by the child. */
    assert_int_equal(ks_open(ctx, env, len, &op, out, sizeof out, &olen, NULL), KS_OK);
    assert_int_equal(ks_seal(ctx, &sp, pt, sizeof pt, env, sizeof env, &len), KS_OK);
    ks_ctx_free(ctx);
    ks_provider_destroy(&p);
}

/* ---- failures of the token ------------------------------------------------------------ */

/* A lost session is reconnected once: one failure is absorbed, a lasting
 * one is unavailable after exactly two attempts; a passed deadline is a
 * timeout; a key function the token refuses is denied. */
static void test_reconnect_timeout(void **state)
{
    (void)state;
    ks_provider p = open_ok();
    assert_int_equal(p.ops->admin->create(p.self, S("rc/k"), 0), KS_OK);
    uint8_t w[64], dek[KS_DEK_LEN];
    size_t len = 0;

    g_fail_rv = CKR_SESSION_HANDLE_INVALID;
    atomic_store(&g_fail_seen, 0);
    atomic_store(&g_fail_left, 1);
    int logins = atomic_load(&g_logins);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_OK);
    assert_int_equal(atomic_load(&g_fail_seen), 1);
    assert_int_equal(atomic_load(&g_logins), logins + 1); /* re-login on the new login session */
    assert_int_equal(unwrap(&p, "rc/k", 1, w, len, BV(AAD), dek), KS_OK);

    g_fail_rv = CKR_DEVICE_REMOVED;
    atomic_store(&g_fail_seen, 0);
    atomic_store(&g_fail_left, 100);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_ERR_UNAVAILABLE);
    assert_int_equal(atomic_load(&g_fail_seen), 2);

    g_fail_rv = CKR_USER_NOT_LOGGED_IN;
    atomic_store(&g_fail_seen, 0);
    atomic_store(&g_fail_left, 100);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_ERR_DENIED);
    assert_int_equal(atomic_load(&g_fail_seen), 2);

    g_fail_rv = CKR_KEY_FUNCTION_NOT_PERMITTED;
    atomic_store(&g_fail_seen, 0);
    atomic_store(&g_fail_left, 100);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_ERR_DENIED);
    assert_int_equal(atomic_load(&g_fail_seen), 1);
    atomic_store(&g_fail_left, 0);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_OK);

    atomic_store(&g_delay_ms, 30);
    uint8_t d[KS_DEK_LEN] = {0};
    assert_int_equal(p.ops->wrap(p.self, S("rc/k"), 1, d, sizeof d, BV(AAD), w, 64, &len, 10),
                     KS_ERR_TIMEOUT);
    atomic_store(&g_delay_ms, 0);
    assert_int_equal(wrap(&p, "rc/k", 1, w, &len), KS_OK);
    ks_provider_destroy(&p);
}

/* The NO_IVBITS layout is a parameter SoftHSM2 does not take: it fails
 * cleanly (never a wrap under a misread IV). */
static void test_gcm_layout(void **state)
{
    (void)state;
    ks_pkcs11_config c = config(PIN);
    c.gcm_layout = KS_PKCS11_GCM_NO_IVBITS;
    ks_provider p;
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_OK);
    assert_int_equal(p.ops->admin->create(p.self, S("gcm/k"), 0), KS_OK);
    uint8_t w[64];
    size_t len = 0;
    assert_int_equal(wrap(&p, "gcm/k", 1, w, &len), KS_ERR_UNAVAILABLE);
    assert_int_equal(atomic_load(&g_init_rv), CKR_ARGUMENTS_BAD); /* SoftHSM 2.6.1 */
    ks_provider_destroy(&p);
    c.gcm_layout = (ks_pkcs11_gcm_layout)7;
    assert_int_equal(ks_pkcs11_open(&c, &p), KS_ERR_INVALID_ARGUMENT);
}

/* The CKR -> ks_err table of docs/providers.md ("Errors and deadlines"):
 * only a verdict on the PIN or the key is a denial (exit 78, not
 * retried); CKR_USER_PIN_NOT_INITIALIZED, which SoftHSM2 answers to a
 * correct PIN under concurrent processes, is unavailable (69, retryable). */
static void test_rv_map(void **state)
{
    (void)state;
    assert_int_equal(ks_p11_map(CKR_OK), KS_OK);
    assert_int_equal(ks_p11_map(KS_P11_RV_TIMEOUT), KS_ERR_TIMEOUT);
    const CK_RV denied[] = {CKR_PIN_INCORRECT, CKR_PIN_INVALID, CKR_PIN_LEN_RANGE,
                            CKR_PIN_EXPIRED, CKR_PIN_LOCKED, CKR_USER_NOT_LOGGED_IN,
                            CKR_KEY_FUNCTION_NOT_PERMITTED};
    for (size_t i = 0; i < sizeof denied / sizeof denied[0]; i++) {
        assert_int_equal(ks_p11_map(denied[i]), KS_ERR_DENIED);
    }
    assert_int_equal(ks_p11_map(CKR_USER_PIN_NOT_INITIALIZED), KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_p11_map(CKR_DEVICE_ERROR), KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_p11_map(CKR_GENERAL_ERROR), KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_p11_map(CKR_HOST_MEMORY), KS_ERR_NO_MEMORY);
    assert_int_equal(ks_p11_map(CKR_DEVICE_MEMORY), KS_ERR_NO_MEMORY);
    assert_int_equal(ks_p11_map(CKR_OBJECT_HANDLE_INVALID), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_p11_map(CKR_KEY_HANDLE_INVALID), KS_ERR_NOT_FOUND);
}

int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_parser),
        cmocka_unit_test(test_rv_map),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_wrong_pin),
        cmocka_unit_test(test_admin),
        cmocka_unit_test(test_wrap_unwrap),
        cmocka_unit_test(test_states),
        cmocka_unit_test(test_not_extractable),
        cmocka_unit_test(test_token_records),
        cmocka_unit_test(test_ctx),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_reconnect_timeout),
        cmocka_unit_test(test_gcm_layout),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
