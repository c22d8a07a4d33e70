/*
 * tests/test_plugin_proto.c -- unit tests of the KMS plugin protocol
 * (migrate/keys/plugin_proto.c, docs/kms-plugin.md): the request encoder,
 * the strict response reader, the vectors of Appendix A (path: $KS_SPEC's
 * directory, else docs/) with a loader as strict as tests/test_registry.c's,
 * and a conversation with tools/kms-example/keyshift-kms-example run by python3.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/error.h>
#include <keyshift/provider.h>

#include "../migrate/keys/plugin_proto.h"
#include "plugin_test_util.h"
#include "test_files.h"

extern char **environ;

/* A ks_bytes over a C string. */
#define B(s) ((ks_bytes){(const uint8_t *)(s), strlen(s)})

/* Read line[0, len) as the response to (op, id, key_version) into *rp. */
static ks_err parse(kp_reply *rp, const void *line, size_t len, ks_kp_op op, uint64_t id,
                    uint32_t key_version)
{
    const ks_kp_request_ctx ctx = {op, id, key_version};
    return kp_read(rp, line, len, &ctx, 1);
}

/* Read the C string s (its LF included) as the response to a wrap with id 7. */
static ks_err parse_wrap(kp_reply *rp, const char *s)
{
    return parse(rp, s, strlen(s), KS_KP_WRAP, 7, 0);
}

/* Nonzero when every byte of p[0, n) is zero. */
static int all_zero(const void *p, size_t n)
{
    return sodium_is_zero(p, n);
}

/* Append the hex of p[0, n) to t. */
static void add_hex(tf_text *t, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        addf(t, "%02x", p[i]);
    }
}

/* Render a response to op as Appendix A's result lines, each ended by LF. */
static void render(const ks_kp_response *r, ks_kp_op op, tf_text *t)
{
    static const char *const caps[] = {"wrap", "unwrap", "key-info", "rewrap"};
    add_bytes(t, "", 0);
    if (!r->ok) {
        addf(t, "result: status %s\n", ks_err_name(r->status));
        if (r->has_retry_after) {
            addf(t, "result: retry-after %u\n", r->retry_after_ms);
        }
        if (r->message[0] != '\0') {
            addf(t, "result: message %s\n", r->message);
        }
        return;
    }
    switch (op) {
    case KS_KP_HELLO:
        addf(t, "result: version %u\nresult: plugin %s\nresult: capabilities", r->version, r->plugin);
        for (unsigned i = 0; i < 4; i++) {
            if (r->capabilities & (1u << i)) {
                addf(t, " %s", caps[i]);
            }
        }
        addf(t, "\n");
        return;
    case KS_KP_WRAP:
        addf(t, "result: wrapped ");
        add_hex(t, r->wrapped, r->wrapped_len);
        addf(t, "\n");
        return;
    case KS_KP_UNWRAP:
        addf(t, "result: dek ");
        add_hex(t, r->dek, KS_DEK_LEN);
        addf(t, "\n");
        return;
    default:
        addf(t, "result: key %u %s %s\n", r->info.version, ks_key_state_name(r->info.state),
             r->info.is_primary ? "primary" : "not-primary");
    }
}

/* ---- the vectors of docs/kms-plugin.md ------------------------------------------------- */

#define MAX_VECTORS 128

enum { VK_NAME, VK_REQUEST, VK_RESPONSE, VK_HEX, VK_EXPECT, VK_RESULT, VK_COUNT };

static const char *const vector_keys[VK_COUNT] = {
    [VK_NAME] = "name",   [VK_REQUEST] = "request", [VK_RESPONSE] = "response",
    [VK_HEX] = "hex",     [VK_EXPECT] = "expect",   [VK_RESULT] = "result",
};

/* Nonzero for the keys that may repeat. */
#define REPEATS(k) ((k) == VK_HEX || (k) == VK_RESULT)
#define HAS(v, k) ((int)(((v)->seen >> (k)) & 1u))

typedef struct vector {
    unsigned seen;
    char name[64];
    ks_kp_op op;
    uint64_t id;
    uint32_t key_version;
    int kind;                /* 0 ok, 1 error, 2 refused */
    ks_kp_class cls;         /* error vectors */
    ks_kp_reason reason;     /* refused vectors */
    char field[32];          /* refused vectors: the member, or "" */
    tf_text line;
    tf_text result;
} vector;

/* A decimal number of 1 to 10 digits without a leading 0 (0 itself
 * allowed) in s[0, n); -1 otherwise. */
static long long decimal(const char *s, size_t n)
{
    long long v = 0;
    if (n == 0 || n > 10 || (s[0] == '0' && n > 1)) {
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

/* The index of the name s[0, n) in names[0, count) (NULL entries
 * skipped), or -1. */
static int lookup(const char *s, size_t n, const char *(*name)(int), int count)
{
    for (int i = 0; i < count; i++) {
        const char *x = name(i);
        if (x != NULL && strlen(x) == n && memcmp(x, s, n) == 0) {
            return i;
        }
    }
    return -1;
}

/* Parse `request: OP ID [KEY_VERSION]`; -1 if malformed. */
static int request_field(vector *v, const char *s, size_t n)
{
    const char *sp = memchr(s, ' ', n);
    if (sp == NULL) {
        return -1;
    }
    const int op = lookup(s, (size_t)(sp - s), ks_kp_op_name, 5);
    const char *rest = sp + 1, *end = s + n;
    const char *sp2 = memchr(rest, ' ', (size_t)(end - rest));
    const long long id = decimal(rest, (size_t)((sp2 != NULL ? sp2 : end) - rest));
    if (op < 0 || id < 1 || (sp2 != NULL) != (op == KS_KP_KEY_INFO)) {
        return -1;
    }
    long long kv = 0;
    if (sp2 != NULL && (kv = decimal(sp2 + 1, (size_t)(end - sp2 - 1))) < 0) {
        return -1;
    }
    v->op = (ks_kp_op)op;
    v->id = (uint64_t)id;
    v->key_version = (uint32_t)kv;
    return 0;
}

/* Parse `expect: ok | error CLASS | refused REASON [MEMBER]`; -1 if malformed. */
static int expect_field(vector *v, const char *s, size_t n)
{
    if (n == 2 && memcmp(s, "ok", 2) == 0) {
        v->kind = 0;
        return 0;
    }
    if (n > 6 && memcmp(s, "error ", 6) == 0) {
        const int c = lookup(s + 6, n - 6, ks_kp_class_name, KS_KP_CLASS_COUNT);
        v->kind = 1;
        v->cls = (ks_kp_class)c;
        return c > 0 ? 0 : -1;
    }
    if (n > 8 && memcmp(s, "refused ", 8) == 0) {
        const char *r = s + 8, *end = s + n;
        const char *sp = memchr(r, ' ', (size_t)(end - r));
        const int reason = lookup(r, (size_t)((sp != NULL ? sp : end) - r), ks_kp_reason_name, KS_KP_R_COUNT);
        if (reason <= 0 || (sp != NULL && (size_t)(end - sp - 1) >= sizeof v->field) ||
            (sp != NULL && end - sp - 1 == 0)) {
            return -1;
        }
        v->kind = 2;
        v->reason = (ks_kp_reason)reason;
        if (sp != NULL) {
            memcpy(v->field, sp + 1, (size_t)(end - sp - 1));
        }
        return 0;
    }
    return -1;
}

/* Store value s[0, n) of key k in v; -1 if the value is malformed. */
static int store_key(vector *v, int k, const char *s, size_t n)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = 0;
    switch (k) {
    case VK_NAME:
        if (n >= sizeof v->name) {
            return -1;
        }
        memcpy(v->name, s, n);
        return 0;
    case VK_REQUEST: return request_field(v, s, n);
    case VK_RESPONSE: addf(&v->line, "%.*s\n", (int)n, s); return 0;
    case VK_HEX:
        rc = tf_append_hex(s, n, &buf, &len);
        add_bytes(&v->line, buf != NULL ? (const char *)buf : "", len);
        free(buf);
        return rc;
    case VK_EXPECT: return expect_field(v, s, n);
    default: addf(&v->result, "result: %.*s\n", (int)n, s); return 0;
    }
}

/* Check that v holds exactly the keys Appendix A requires; NULL when it
 * does, else what is wrong. */
static const char *check_presence(const vector *v)
{
    if (!HAS(v, VK_NAME) || !HAS(v, VK_REQUEST) || !HAS(v, VK_EXPECT)) {
        return "no name, request or expect";
    }
    if (HAS(v, VK_RESPONSE) == HAS(v, VK_HEX)) {
        return "exactly one of response and hex";
    }
    if (HAS(v, VK_RESULT) != (v->kind != 2)) {
        return "result: exactly in ok and error vectors";
    }
    return NULL;
}

/* Read one block's lines, s[0, end), into v; NULL when the block is well
 * formed, else what is wrong. */
static const char *parse_block(const char *s, const char *end, vector *v)
{
    for (const char *line = s; line < end;) {
        const char *eol, *colon;
        const int k = tf_block_line(line, end, vector_keys, VK_COUNT, sizeof vector_keys[0], &eol,
                                    &colon);
        if (k < 0) {
            return "unknown key";
        }
        if (HAS(v, k) && !REPEATS(k)) {
            return "repeated key";
        }
        if (eol[-1] == ' ') {
            return "a line ends with a space";
        }
        if (colon + 1 >= eol || colon[1] != ' ' || colon + 2 >= eol) {
            return "not `key: value`";
        }
        if (store_key(v, k, colon + 2, (size_t)(eol - colon - 2)) != 0) {
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
        free(vs[i].line.s);
        free(vs[i].result.s);
    }
}

/* Parse every vector block of doc into vs (at most MAX_VECTORS); the
 * count, or -1 with *why for a malformed block, every vector then freed. */
static long parse_vectors(const char *doc, vector *vs, const char **why)
{
    static const char tag[] = "```ks-plugin-vector\n";
    size_t count = 0;
    const char *p = doc;
    while ((p = strstr(p, "```ks-")) != NULL) {
        if (strncmp(p, tag, sizeof tag - 1) != 0) {
            p += 3;
            continue;
        }
        const char *start = p + sizeof tag - 1;
        const char *end = strstr(start - 1, "\n```");
        *why = count < MAX_VECTORS ? (end != NULL ? NULL : "unterminated block") : "too many";
        if (*why == NULL) {
            memset(&vs[count], 0, sizeof vs[count]);
            count++;
            *why = end > start ? parse_block(start, end, &vs[count - 1]) : "empty block";
        }
        if (*why != NULL) {
            free_vectors(vs, count);
            return -1;
        }
        p = end + 4;
    }
    return (long)count;
}

/* Nonzero when parse_vectors() loads every block of doc. */
static int loads(const char *doc)
{
    vector *vs = calloc(MAX_VECTORS, sizeof *vs);
    const char *why = NULL;
    assert_non_null(vs);
    const long n = parse_vectors(doc, vs, &why);
    if (n >= 0) {
        free_vectors(vs, (size_t)n);
    }
    free(vs);
    return n >= 0;
}

/* The vector loader is strict: each malformed block below is refused. */
static void test_vector_loader_strict(void **state)
{
    (void)state;
    static const char *const good = "```ks-plugin-vector\nname: e\nrequest: wrap 7\nhex: 7b7d\n"
                                    "expect: refused unterminated\n```\n";
#define VB "```ks-plugin-vector\nname: e\n"
    static const char *const bad[] = {
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused unterminated\ncomment: x\n```\n",
        VB "name: f\nrequest: wrap 7\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nrequest: wrap 8\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused unterminated\nexpect: ok\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nresponse: {}\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused unterminated\nresult: dek 00\n```\n",
        VB "request: wrap 7\nresponse: {}\nexpect: ok\n```\n",
        VB "request: wrap 7\nresponse: {}\nexpect: error busy\nresult: status denied\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused broken\n```\n",
        VB "request: wrap 7\nhex: 7b7\nexpect: refused unterminated\n```\n",
        VB "request: wrap 07\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 0\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: rewrap 7\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7 1\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: key-info 7\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nhex: 7b7d \nexpect: refused unterminated\n```\n",
        VB "request:wrap 7\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused unterminated \n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: ok\n```\n",
        "```ks-plugin-vector\nrequest: wrap 7\nhex: 7b7d\nexpect: refused unterminated\n```\n",
        "```ks-plugin-vector\n```\n",
        VB "request: wrap 7\nhex: 7b7d\nexpect: refused unterminated\n",
    };
#undef VB
    tf_loader_refuses(good, bad, sizeof bad / sizeof bad[0], loads);
}

/* Check one vector against the reader. */
static void check_vector(const vector *v, unsigned *kinds)
{
    kp_reply rp;
    const ks_err got = parse(&rp, v->line.s, v->line.len, v->op, v->id, v->key_version);
    const int kind = got != KS_OK ? 2 : rp.r.ok ? 0 : 1;
    kinds[kind]++;
    if (kind != v->kind) {
        fail_msg("vector %s: want kind %d, got %d (%s)", v->name, v->kind, kind,
                 ks_kp_reason_name(rp.e.reason));
    }
    if (kind == 2) {
        const char *field = rp.e.field != NULL ? rp.e.field : "";
        if (rp.e.reason != v->reason || strcmp(field, v->field) != 0) {
            fail_msg("vector %s: want %s %s, got %s %s", v->name, ks_kp_reason_name(v->reason),
                     v->field, ks_kp_reason_name(rp.e.reason), field);
        }
        assert_true(all_zero(rp.dek, sizeof rp.dek) && all_zero(rp.wrapped, sizeof rp.wrapped));
        assert_int_equal(got, KS_ERR_INTEGRITY);
        return;
    }
    if (kind == 1 && rp.r.error_class != v->cls) {
        fail_msg("vector %s: want class %s, got %s", v->name, ks_kp_class_name(v->cls),
                 ks_kp_class_name(rp.r.error_class));
    }
    tf_text t = {0};
    render(&rp.r, v->op, &t);
    if (strcmp(t.s, v->result.s) != 0) {
        fail_msg("vector %s: result\n%s\ndiffers from the expected\n%s", v->name, t.s, v->result.s);
    }
    free(t.s);
}

/* Every vector of docs/kms-plugin.md Appendix A, each kind present. */
static void test_spec_vectors(void **state)
{
    (void)state;
    char path[256];
    size_t n;
    unsigned kinds[3] = {0};
    tf_spec_path("kms-plugin.md", path, sizeof path);
    char *doc = (char *)tf_slurp(path, &n);
    vector *vs = calloc(MAX_VECTORS, sizeof *vs);
    const char *why = NULL;
    assert_non_null(vs);
    const long count = parse_vectors(doc, vs, &why);
    if (count < 0) {
        fail_msg("%s: malformed vector block: %s", path, why);
    }
    for (long i = 0; i < count; i++) {
        for (long j = 0; j < i; j++) {
            if (strcmp(vs[i].name, vs[j].name) == 0) {
                fail_msg("vector name %s twice", vs[i].name);
            }
        }
        check_vector(&vs[i], kinds);
    }
    assert_true(count >= 40 && kinds[0] >= 5 && kinds[1] >= 4 && kinds[2] >= 30);
    free_vectors(vs, (size_t)count);
    free(vs);
    free(doc);
}

/* ---- the encoder --------------------------------------------------------------------- */

/* Encode req into a fresh buffer; the line (NUL-terminated) in out. */
static ks_err encode(const ks_kp_request *req, char *out, size_t cap, size_t *n)
{
    return ks_kp_encode_request(req, (uint8_t *)out, cap, n);
}

/* Each op's line, byte for byte as [KP-HELLO-1], [KP-WRAP-1], [KP-UNWRAP-1],
 * [KP-INFO-1] show it; a short buffer and a bad request wipe the output. */
static void test_encoder(void **state)
{
    (void)state;
    uint8_t dek[KS_DEK_LEN];
    char out[512];
    size_t n = 1;
    for (size_t i = 0; i < sizeof dek; i++) {
        dek[i] = (uint8_t)i;
    }
    static const uint8_t wrapped[] = {0xde, 0xad, 0xbe, 0xef};
    const ks_kp_request hello = {KS_KP_HELLO, 1, {NULL, 0}, 0, NULL, 0, {NULL, 0}, {NULL, 0}};
    const ks_kp_request wrap = {KS_KP_WRAP, 7, B("app/main"), 2, dek, sizeof dek, {NULL, 0}, B("aad")};
    const ks_kp_request unwrap = {KS_KP_UNWRAP, 8, B("app/main"), 2, NULL, 0,
                                  {wrapped, sizeof wrapped}, B("aad")};
    const ks_kp_request info = {KS_KP_KEY_INFO, 9, B("app/main"), 0, NULL, 0, {NULL, 0}, {NULL, 0}};
    static const char *const want[] = {
        "{\"v\":1,\"id\":1,\"op\":\"hello\",\"versions\":[1],\"client\":\"keyshift " KS_VERSION_STRING "\"}\n",
        "{\"v\":1,\"id\":7,\"op\":\"wrap\",\"key_id\":\"app/main\",\"key_version\":2,"
        "\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\",\"aad\":\"YWFk\"}\n",
        "{\"v\":1,\"id\":8,\"op\":\"unwrap\",\"key_id\":\"app/main\",\"key_version\":2,"
        "\"wrapped\":\"3q2+7w==\",\"aad\":\"YWFk\"}\n",
        "{\"v\":1,\"id\":9,\"op\":\"key-info\",\"key_id\":\"app/main\",\"key_version\":0}\n",
    };
    const ks_kp_request *reqs[] = {&hello, &wrap, &unwrap, &info};
    for (size_t i = 0; i < 4; i++) {
        memset(out, 'x', sizeof out);
        assert_int_equal(encode(reqs[i], out, sizeof out, &n), KS_OK);
        assert_int_equal(n, strlen(want[i]));
        assert_memory_equal(out, want[i], n);
        /* exactly the size fits; one byte less is too small, and wiped */
        assert_int_equal(encode(reqs[i], out, n, &n), KS_OK);
        memset(out, 'x', sizeof out);
        assert_int_equal(encode(reqs[i], out, n - 1, &n), KS_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(n, 0);
        assert_true(all_zero(out, strlen(want[i]) - 1));
    }
    /* requests [KP-REQ] does not allow */
    ks_kp_request bad[12];
    for (size_t i = 0; i < 12; i++) {
        bad[i] = wrap;
    }
    bad[0].id = 0;
    bad[1].id = KS_KP_ID_MAX + 1;
    bad[2].key_version = 0;
    bad[3].dek_len = 31;
    bad[4].aad = (ks_bytes){NULL, 0};
    bad[5].key_id = B("app main");
    bad[6].key_id = B("");
    bad[7].aad = (ks_bytes){dek, KS_KP_AAD_MAX + 1};
    bad[8] = hello;
    bad[8].id = 2;
    bad[9] = unwrap;
    bad[9].wrapped = (ks_bytes){NULL, 0};
    bad[10] = info;
    bad[10].key_id = B("k\"");
    bad[11].op = (ks_kp_op)5;
    for (size_t i = 0; i < 12; i++) {
        memset(out, 'x', sizeof out);
        assert_int_equal(encode(&bad[i], out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
        assert_true(all_zero(out, sizeof out));
    }
    assert_int_equal(encode(NULL, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(encode(&wrap, NULL, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(encode(&wrap, out, sizeof out, NULL), KS_ERR_INVALID_ARGUMENT);
    /* the encoder's lines are what a plugin is sent: each is one line of JSON */
    assert_int_equal(encode(&wrap, out, sizeof out, &n), KS_OK);
    assert_null(memchr(out, '\n', n - 1));
}

/* ---- the reader ---------------------------------------------------------------------- */

/* libsodium's ORIGINAL variant is canonical [KP-B64-1]: non-zero padding
 * bits, missing padding and whitespace are all refused. */
static void test_base64_strict(void **state)
{
    (void)state;
    uint8_t buf[8];
    size_t n;
    static const char *const bad[] = {"AB==", "AAB=", "AA", "AA=", "A===", "AA== ", " AA==",
                                      "AA==AA==", "-_8=", "AA\n=="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(sodium_base642bin(buf, sizeof buf, bad[i], strlen(bad[i]), NULL, &n, NULL,
                                               sodium_base64_VARIANT_ORIGINAL), 0);
    }
    assert_int_equal(sodium_base642bin(buf, sizeof buf, "AA==", 4, NULL, &n, NULL,
                                       sodium_base64_VARIANT_ORIGINAL), 0);
    assert_int_equal(n, 1);
}

/* Lines at and over the bound [KP-MSG-2]. */
static void test_line_bound(void **state)
{
    (void)state;
    kp_reply rp;
    static const char head[] = "{\"v\":1,\"id\":7,\"ok\":true,\"wrapped\":\"AQ==\",\"x-pad\":\"";
    char *line = malloc(KS_KP_LINE_MAX + 2);
    assert_non_null(line);
    for (size_t len = KS_KP_LINE_MAX; len <= KS_KP_LINE_MAX + 1; len++) {
        memset(line, 'p', len);
        memcpy(line, head, sizeof head - 1);
        memcpy(line + len - 3, "\"}\n", 3);
        const ks_err e = parse(&rp, line, len, KS_KP_WRAP, 7, 0);
        if (len == KS_KP_LINE_MAX) {
            assert_int_equal(e, KS_OK);
            assert_int_equal(rp.r.wrapped_len, 1);
        } else {
            assert_int_equal(e, KS_ERR_INTEGRITY);
            assert_int_equal(rp.e.reason, KS_KP_R_TOO_LONG);
            assert_null(rp.e.field);
        }
    }
    free(line);
    assert_int_equal(parse(&rp, "", 0, KS_KP_WRAP, 7, 0), KS_ERR_INTEGRITY);
    assert_int_equal(rp.e.reason, KS_KP_R_UNTERMINATED);
}

/* A refused unwrap leaves the caller's DEK buffer zero, whatever was in
 * it, and so does every refusal after a DEK was decoded. */
static void test_dek_wiped(void **state)
{
    (void)state;
    kp_reply rp;
    static const char *const lines[] = {
        "{\"v\":1,\"id\":7,\"ok\":true,\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\",\"n\":1}\n",
        "{\"v\":1,\"id\":8,\"ok\":true,\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}\n",
        "{\"v\":1,\"id\":7,\"ok\":true,\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8\"}\n",
        "{\"v\":1,\"id\":7,\"ok\":true,\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}",
        "{\"v\":1,\"id\":7,\"ok\":false,\"error\":\"denied\",\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        memset(rp.dek, 0xAA, sizeof rp.dek);
        const ks_kp_request_ctx ctx = {KS_KP_UNWRAP, 7, 0};
        memset(&rp.r, 0x55, sizeof rp.r);
        rp.r.dek = rp.dek;
        rp.r.wrapped = NULL;
        rp.r.wrapped_cap = 0;
        assert_int_equal(ks_kp_parse_response((const uint8_t *)lines[i], strlen(lines[i]), &ctx, &rp.r,
                                              &rp.e), KS_ERR_INTEGRITY);
        assert_true(all_zero(rp.dek, sizeof rp.dek));
        assert_int_equal(rp.r.ok, 0);
        assert_int_equal(rp.r.status, KS_OK);
        assert_true(rp.r.dek == rp.dek);
    }
    /* and an accepted one decodes it */
    const char *ok = "{\"v\":1,\"id\":7,\"ok\":true,\"dek\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}\n";
    assert_int_equal(parse(&rp, ok, strlen(ok), KS_KP_UNWRAP, 7, 0), KS_OK);
    assert_int_equal(rp.dek[31], 31);
}

/* Every reason is reachable and named; the caller's errors are
 * invalid-argument; a NULL err changes nothing but the report. */
static void test_reasons_and_arguments(void **state)
{
    (void)state;
    kp_reply rp;
    for (int r = 0; r < KS_KP_R_COUNT; r++) {
        assert_non_null(ks_kp_reason_name(r));
    }
    assert_null(ks_kp_reason_name(-1));
    assert_null(ks_kp_reason_name(KS_KP_R_COUNT));
    assert_null(ks_kp_class_name(KS_KP_CLASS_NONE));
    assert_null(ks_kp_class_name(KS_KP_CLASS_COUNT));
    assert_null(ks_kp_op_name(0));
    assert_null(ks_kp_op_name(5));
    /* integers jansson cannot hold; a message too long; a NUL escape; a class not a string */
    assert_int_equal(parse_wrap(&rp, "{\"v\":1,\"id\":99999999999999999999,\"ok\":true}\n"), KS_ERR_INTEGRITY);
    assert_int_equal(rp.e.reason, KS_KP_R_BAD_JSON);
    char msg[1200];
    snprintf(msg, sizeof msg, "{\"v\":1,\"id\":7,\"ok\":false,\"error\":\"denied\",\"message\":\"%01025d\"}\n", 0);
    assert_int_equal(parse_wrap(&rp, msg), KS_ERR_INTEGRITY);
    assert_int_equal(rp.e.reason, KS_KP_R_BAD_VALUE);
    assert_string_equal(rp.e.field, "message");
    assert_int_equal(parse_wrap(&rp, "{\"v\":1,\"id\":7,\"ok\":false,\"error\":\"x\\u0000\"}\n"), KS_ERR_INTEGRITY);
    assert_int_equal(rp.e.reason, KS_KP_R_BAD_TEXT);
    assert_int_equal(parse_wrap(&rp, "{\"v\":1,\"id\":7,\"ok\":false,\"error\":7}\n"), KS_ERR_INTEGRITY);
    assert_int_equal(rp.e.reason, KS_KP_R_BAD_TYPE);
    /* a wrapped blob of 1024 bytes is the most [KP-WRAP-2]; 1025 is bad-length */
    char *big = malloc(1500);
    assert_non_null(big);
    for (size_t pad = 2; pad >= 1; pad--) {
        const size_t n = strlen(strcpy(big, "{\"v\":1,\"id\":7,\"ok\":true,\"wrapped\":\""));
        memset(big + n, 'A', 1368 - pad);
        memset(big + n + 1368 - pad, '=', pad);
        strcpy(big + n + 1368, "\"}\n");
        const ks_err e = parse_wrap(&rp, big);
        if (pad == 2) {
            assert_int_equal(e, KS_OK);
            assert_int_equal(rp.r.wrapped_len, KS_KP_WRAPPED_MAX);
        } else {
            assert_int_equal(e, KS_ERR_INTEGRITY);
            assert_int_equal(rp.e.reason, KS_KP_R_BAD_LENGTH);
        }
    }
    free(big);
    /* caller errors */
    const ks_kp_request_ctx ctx = {KS_KP_UNWRAP, 7, 0};
    ks_kp_response r = {0};
    const char *line = "{}\n";
    assert_int_equal(ks_kp_parse_response((const uint8_t *)line, 3, &ctx, &r, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_kp_parse_response((const uint8_t *)line, 3, NULL, &rp.r, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_kp_parse_response((const uint8_t *)line, 3, &ctx, NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    const ks_kp_request_ctx wrap_ctx = {KS_KP_WRAP, 7, 0};
    r.wrapped = rp.wrapped;
    r.wrapped_cap = KS_KP_WRAPPED_MAX - 1;
    assert_int_equal(ks_kp_parse_response((const uint8_t *)line, 3, &wrap_ctx, &r, NULL), KS_ERR_INVALID_ARGUMENT);
    const ks_kp_request_ctx zero_id = {KS_KP_WRAP, 0, 0};
    assert_int_equal(parse(&rp, line, 3, zero_id.op, zero_id.id, 0), KS_ERR_INVALID_ARGUMENT);
    r.dek = rp.dek;
    assert_int_equal(ks_kp_parse_response((const uint8_t *)"{}\n", 3, &ctx, &r, NULL), KS_ERR_INTEGRITY);
}

/* ---- a conversation with tools/kms-example/keyshift-kms-example ---------------------------------- */

/* A running plugin: its pid, the pipe to its stdin and from its stdout. */
typedef struct plugin {
    pid_t pid;
    int to;
    FILE *from;
    uint64_t next_id;
} plugin;

/* Start python3 tools/kms-example/keyshift-kms-example with its key file keys. */
static void plugin_start(plugin *p, const char *keys)
{
    char tool[256], spec[256];
    int in[2], out[2];
    tf_spec_path("kms-plugin.md", spec, sizeof spec);
    snprintf(tool, sizeof tool, "%.*s/../tools/kms-example/keyshift-kms-example", (int)(strrchr(spec, '/') - spec), spec);
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    posix_spawn_file_actions_t fa;
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, in[0], 0), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, out[1], 1), 0);
    assert_int_equal(posix_spawn_file_actions_addclose(&fa, in[1]), 0);
    assert_int_equal(posix_spawn_file_actions_addclose(&fa, out[0]), 0);
    assert_int_equal(setenv("KEYSHIFT_KMS_EXAMPLE_KEYS", keys, 1), 0);
    char *argv[] = {"python3", tool, NULL};
    const int rc = posix_spawnp(&p->pid, "python3", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fail_msg("cannot run python3 %s: %s", tool, strerror(rc));
    }
    close(in[0]);
    close(out[1]);
    p->to = in[1];
    p->from = fdopen(out[0], "r");
    assert_non_null(p->from);
    p->next_id = 1;
}

/* Send req (its id set here) and read the response into *rp; the
 * reader's result. */
static ks_err plugin_call(plugin *p, ks_kp_request req, kp_reply *rp)
{
    uint8_t line[KS_KP_LINE_MAX + 1];
    size_t n = 0;
    req.id = p->next_id++;
    assert_int_equal(ks_kp_encode_request(&req, line, sizeof line, &n), KS_OK);
    assert_int_equal(write(p->to, line, n), (ssize_t)n);
    sodium_memzero(line, n);
    int c;
    n = 0;
    while (n < sizeof line && (c = getc(p->from)) != EOF) {
        line[n++] = (uint8_t)c;
        if (c == '\n') {
            break;
        }
    }
    const ks_err e = parse(rp, line, n, req.op, req.id, req.key_version);
    sodium_memzero(line, n);
    return e;
}

/* Write the raw line text (not a request keyshift would send) and read the
 * answer as the response to an op request with the next id in sequence
 * [KP-PROC-4]; the reader's result. */
static ks_err plugin_raw(plugin *p, const char *text, ks_kp_op op, kp_reply *rp)
{
    uint8_t line[KS_KP_LINE_MAX + 1];
    size_t n = 0;
    const uint64_t id = p->next_id++;
    assert_int_equal(write(p->to, text, strlen(text)), (ssize_t)strlen(text));
    int c;
    while (n < sizeof line && (c = getc(p->from)) != EOF) {
        line[n++] = (uint8_t)c;
        if (c == '\n') {
            break;
        }
    }
    return parse(rp, line, n, op, id, 0);
}

/* Close the plugin's stdin and wait for it to exit 0. */
static void plugin_stop(plugin *p)
{
    int status = 0;
    close(p->to);
    fclose(p->from);
    assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* hello, key-info, a wrap/unwrap round trip, an unwrap with a changed AAD
 * (auth-failed), a wrap under a decrypt-only version (denied) and an
 * unknown key (not-found), every request built by the encoder and every
 * response read by the reader. */
static void test_example_plugin(void **state)
{
    fixture *f = *state;
    static const char keys[] =
        "{\"app/main\": {\"primary\": 2, \"versions\": {"
        "\"1\": {\"state\": \"decrypt-only\", \"kek\": \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"},"
        "\"2\": {\"state\": \"active\", \"kek\": \"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\"}}},"
        "\"app/off\": {\"primary\": 1, \"versions\": {"
        "\"1\": {\"state\": \"disabled\", \"kek\": \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"},"
        "\"2\": {\"state\": \"destroyed\", \"kek\": \"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\"}}}}\n";
    tf_spit(f->path, keys, sizeof keys - 1, 0600);
    signal(SIGPIPE, SIG_IGN);
    plugin p;
    kp_reply rp;
    uint8_t dek[KS_DEK_LEN], wrapped[KS_KP_WRAPPED_MAX];
    randombytes_buf(dek, sizeof dek);
    plugin_start(&p, f->path);

    const ks_kp_request hello = {KS_KP_HELLO, 0, {NULL, 0}, 0, NULL, 0, {NULL, 0}, {NULL, 0}};
    assert_int_equal(plugin_call(&p, hello, &rp), KS_OK);
    assert_true(rp.r.ok && rp.r.version == 1);
    assert_int_equal(rp.r.capabilities, KS_KP_CAP_WRAP | KS_KP_CAP_UNWRAP | KS_KP_CAP_KEY_INFO);
    assert_string_equal(rp.r.plugin, "keyshift-kms-example 1");

    const ks_kp_request info = {KS_KP_KEY_INFO, 0, B("app/main"), 0, NULL, 0, {NULL, 0}, {NULL, 0}};
    assert_int_equal(plugin_call(&p, info, &rp), KS_OK);
    assert_true(rp.r.ok && rp.r.info.version == 2 && rp.r.info.state == KS_KEY_ACTIVE && rp.r.info.is_primary);

    const ks_kp_request wrap = {KS_KP_WRAP, 0, B("app/main"), 2, dek, sizeof dek, {NULL, 0}, B("aad-1")};
    assert_int_equal(plugin_call(&p, wrap, &rp), KS_OK);
    assert_true(rp.r.ok);
    assert_int_equal(rp.r.wrapped_len, 80);
    memcpy(wrapped, rp.wrapped, rp.r.wrapped_len);

    ks_kp_request unwrap = {KS_KP_UNWRAP, 0, B("app/main"), 2, NULL, 0, {wrapped, 80}, B("aad-1")};
    assert_int_equal(plugin_call(&p, unwrap, &rp), KS_OK);
    assert_true(rp.r.ok);
    assert_memory_equal(rp.dek, dek, sizeof dek);

    unwrap.aad = B("aad-2");
    assert_int_equal(plugin_call(&p, unwrap, &rp), KS_OK);
    assert_false(rp.r.ok);
    assert_int_equal(rp.r.error_class, KS_KP_AUTH_FAILED);
    assert_int_equal(rp.r.status, KS_ERR_AUTH_FAILED);
    assert_true(all_zero(rp.dek, sizeof rp.dek));

    ks_kp_request old = wrap;
    old.key_version = 1;
    assert_int_equal(plugin_call(&p, old, &rp), KS_OK);
    assert_int_equal(rp.r.status, KS_ERR_DENIED);

    ks_kp_request missing = info;
    missing.key_id = B("app/none");
    assert_int_equal(plugin_call(&p, missing, &rp), KS_OK);
    assert_int_equal(rp.r.status, KS_ERR_NOT_FOUND);

    /* no active primary: denied, never a primary that is not active; a
     * destroyed version is described [KP-INFO-4]; unwrap under a disabled
     * version is denied [KP-UNWRAP-1] */
    ks_kp_request off = info;
    off.key_id = B("app/off");
    assert_int_equal(plugin_call(&p, off, &rp), KS_OK);
    assert_int_equal(rp.r.status, KS_ERR_DENIED);
    off.key_version = 2;
    assert_int_equal(plugin_call(&p, off, &rp), KS_OK);
    assert_true(rp.r.ok && rp.r.info.version == 2 && rp.r.info.state == KS_KEY_DESTROYED &&
                !rp.r.info.is_primary);
    unwrap.key_id = B("app/off");
    unwrap.key_version = 1;
    unwrap.aad = B("aad-1");
    assert_int_equal(plugin_call(&p, unwrap, &rp), KS_OK);
    assert_int_equal(rp.r.status, KS_ERR_DENIED);

    /* a line that is not a request gets one answer, invalid, with the id it
     * should have had, or its own when it has one [KP-PROC-4] */
    assert_int_equal(plugin_raw(&p, "not json\n", KS_KP_KEY_INFO, &rp), KS_OK);
    assert_int_equal(rp.r.error_class, KS_KP_INVALID);
    char no_op[64];
    snprintf(no_op, sizeof no_op, "{\"v\":1,\"id\":%llu}\n", (unsigned long long)p.next_id);
    assert_int_equal(plugin_raw(&p, no_op, KS_KP_KEY_INFO, &rp), KS_OK);
    assert_int_equal(rp.r.error_class, KS_KP_INVALID);
    assert_int_equal(plugin_call(&p, info, &rp), KS_OK); /* still in step */
    assert_true(rp.r.ok && rp.r.info.version == 2);
    plugin_stop(&p);
    sodium_memzero(dek, sizeof dek);
}

/* A directory /tmp/ks-plugin-test-XXXXXX; the key file is dir/keys.json. */
static int setup(void **state)
{
    return tf_setup(state, "plugin", "keys.json");
}

/* Remove the directory and every file in it. */
static int teardown(void **state)
{
    return tf_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_loader_strict),
        cmocka_unit_test(test_spec_vectors),
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_base64_strict),
        cmocka_unit_test(test_line_bound),
        cmocka_unit_test(test_dek_wiped),
        cmocka_unit_test(test_reasons_and_arguments),
        cmocka_unit_test_setup_teardown(test_example_plugin, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
