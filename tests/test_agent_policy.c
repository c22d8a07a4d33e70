/*
 * tests/test_agent_policy.c -- unit tests of the agent policy file
 * (tools/agent/policy.c, docs/agent-policy.md): every vector of the
 * document's Appendix A (path: $KS_SPEC's directory, else docs/), read by
 * a loader as strict as the registry's, the limit cases too long to
 * print there, the loader's file checks [AP-LOAD-1] and the API's
 * argument rules.  The tests that touch files work in their own
 * directory made with mkdtemp under /tmp and removed afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keyshift/error.h>

#include "../tools/agent/policy.h"
#include "test_files.h"

/* Last: with the test hooks (SAN_HOOKS) it routes this file's
 * allocations through the counting wrappers too. */
#include "../migrate/alloc_hook.h"

typedef tf_text text;

#define MAX_VECTORS 128

/* The keys of a vector block, in Appendix A's table. */
enum { VK_NAME, VK_EXPECT, VK_POSITION, VK_LINE, VK_HEX, VK_RULE, VK_CHECK, VK_COUNT };
static const char *const vector_keys[VK_COUNT] = {
    [VK_NAME] = "name", [VK_EXPECT] = "expect", [VK_POSITION] = "position", [VK_LINE] = "line",
    [VK_HEX] = "hex",   [VK_RULE] = "rule",     [VK_CHECK] = "check",
};

#define HAS(v, k) ((int)(((v)->seen >> (k)) & 1u))

typedef struct vector {
    unsigned seen;     /* bit VK_x: key x was given */
    char name[64];
    ks_err code;       /* KS_OK for an ok vector */
    size_t offset;
    unsigned line, column;
    text file;         /* the file's bytes */
    text rules;        /* the rule lines, each ended by LF */
    text checks;       /* the check lines, each ended by LF */
} vector;

/* The rejection code named name[0, n) (one of a policy's, [AP-ERR-1]), or KS_OK. */
static ks_err code_named(const char *name, size_t n)
{
    static const ks_err codes[] = {
        KS_ERR_TRUNCATED,     KS_ERR_BAD_MAGIC,     KS_ERR_UNSUPPORTED_VERSION,
        KS_ERR_FIELD_ORDER,   KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
        KS_ERR_TOO_LARGE,     KS_ERR_BAD_VALUE,     KS_ERR_CONFLICT,
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *c = ks_err_name(codes[i]);
        if (strlen(c) == n && memcmp(c, name, n) == 0) {
            return codes[i];
        }
    }
    return KS_OK;
}

/* A decimal number in s[0, n) without a leading zero (0 itself
 * allowed), at most 9 digits; -1 for anything else. */
static long number(const char *s, size_t n)
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

/* Store the value s[0, n) of key k in the vector vp; -1 if it is malformed. */
static int store_key(void *vp, int k, const char *s, size_t n)
{
    vector *v = vp;
    const char *sep;
    long a, b;
    uint8_t *hex = NULL;
    size_t hex_len = 0;
    int rc;

    switch (k) {
    case VK_NAME:
        if (n >= sizeof v->name) {
            return -1;
        }
        memcpy(v->name, s, n);
        v->name[n] = '\0';
        return 0;
    case VK_EXPECT:
        if (n == 2 && memcmp(s, "ok", 2) == 0) {
            v->code = KS_OK;
            return 0;
        }
        sep = NULL;
        for (size_t i = 0; i + 4 <= n && sep == NULL; i++) {
            sep = memcmp(s + i, " at ", 4) == 0 ? s + i : NULL;
        }
        if (sep == NULL || (v->code = code_named(s, (size_t)(sep - s))) == KS_OK ||
            (a = number(sep + 4, (size_t)(s + n - sep - 4))) < 0) {
            return -1;
        }
        v->offset = (size_t)a;
        return 0;
    case VK_POSITION:
        sep = memchr(s, ':', n);
        if (sep == NULL || (a = number(s, (size_t)(sep - s))) < 1 ||
            (b = number(sep + 1, (size_t)(s + n - sep - 1))) < 1) {
            return -1;
        }
        v->line = (unsigned)a;
        v->column = (unsigned)b;
        return 0;
    case VK_LINE: addf(&v->file, "%.*s\n", (int)n, s); return 0;
    case VK_HEX:
        rc = tf_append_hex(s, n, &hex, &hex_len);
        add_bytes(&v->file, hex != NULL ? hex : (const uint8_t *)"", hex_len);
        free(hex);
        return rc;
    case VK_RULE: addf(&v->rules, "%.*s\n", (int)n, s); return 0;
    default: addf(&v->checks, "%.*s\n", (int)n, s); return 0;
    }
}

/* NULL when v holds exactly the keys Appendix A requires, else what is wrong. */
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
    if (!ok && (HAS(v, VK_RULE) || HAS(v, VK_CHECK))) {
        return "rule, check: only in ok vectors";
    }
    return NULL;
}

/* Read block i of the document, its lines s[0, end), into vs[i]; NULL
 * when it is well formed, else what is wrong. */
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
        free(vs[i].rules.s);
        free(vs[i].checks.s);
    }
}

/* Parse every vector block of doc into vs; the count, or -1 with *why
 * (and the block's name in *where) for a malformed block, every vector
 * then freed. */
static long parse_vectors(const char *doc, vector *vs, const char **why, const char **where)
{
    size_t begun = 0;
    const long n = tf_vector_blocks(doc, "ks-agent-policy-vector", MAX_VECTORS, parse_block, vs, why,
                                    &begun);
    if (n < 0) {
        *where = begun > 0 ? vs[begun - 1].name : "";
        free_vectors(vs, begun);
    }
    return n;
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
    }
    free(vs);
    return n >= 0;
}

/* The canonical rule lines of p (its encoding without the header). */
static char *render_rules(const ks_agent_policy *p, uint8_t **canon, size_t *canon_len)
{
    size_t n = 0;
    assert_int_equal(ks_agent_policy_encode(p, NULL, 0, &n), KS_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = malloc(n + 1);
    assert_non_null(buf);
    size_t m = 0;
    assert_int_equal(ks_agent_policy_encode(p, buf, n, &m), KS_OK);
    assert_int_equal(m, n);
    buf[n] = '\0';
    const size_t head = strlen(KS_AGENT_POLICY_HEADER "\n");
    assert_true(n >= head && memcmp(buf, KS_AGENT_POLICY_HEADER "\n", head) == 0);
    *canon = buf;
    *canon_len = n;
    return (char *)buf + head;
}

/* Run one `check` line against p: "allow|deny UID GID OP SCOPE TENANT". */
static void run_check(const char *vname, const ks_agent_policy *p, const char *line, size_t n)
{
    char buf[1024], verdict[8], op[8], scope[600], tenant[100];
    unsigned long uid, gid;
    assert_true(n < sizeof buf);
    memcpy(buf, line, n);
    buf[n] = '\0';
    if (sscanf(buf, "%7s %lu %lu %7s %599s %99s", verdict, &uid, &gid, op, scope, tenant) != 6) {
        fail_msg("vector %s: malformed check '%s'", vname, buf);
    }
    const ks_agent_op o = strcmp(op, "seal") == 0   ? KS_AGENT_OP_SEAL
                          : strcmp(op, "open") == 0 ? KS_AGENT_OP_OPEN
                                                    : KS_AGENT_OP_PARSE;
    assert_true(strcmp(op, "seal") == 0 || strcmp(op, "open") == 0 || strcmp(op, "parse") == 0);
    const int none_t = strcmp(tenant, "-") == 0;
    const int got = ks_agent_policy_allows(p, (uid_t)uid, (gid_t)gid,
                                           strcmp(scope, "-") == 0 ? NULL : scope,
                                           none_t ? NULL : (const uint8_t *)tenant,
                                           none_t ? 0 : strlen(tenant), o);
    const int want = strcmp(verdict, "allow") == 0;
    assert_true(want || strcmp(verdict, "deny") == 0);
    if (got != want) {
        fail_msg("vector %s: check '%s' got %s", vname, buf, got ? "allow" : "deny");
    }
    if (strcmp(scope, "-") == 0) {
        /* An empty scope names none, as NULL does [AP-MATCH-2]. */
        assert_int_equal(ks_agent_policy_allows(p, (uid_t)uid, (gid_t)gid, "",
                                                none_t ? NULL : (const uint8_t *)tenant,
                                                none_t ? 0 : strlen(tenant), o),
                         want);
    }
}

/* Check one vector against the parser. */
static void check_vector(const vector *v, unsigned *seen)
{
    ks_agent_policy *p = NULL;
    size_t off = SIZE_MAX;
    char msg[512];
    const uint8_t *buf = (const uint8_t *)(v->file.s != NULL ? v->file.s : "");
    const ks_err got = ks_agent_policy_parse(buf, v->file.len, &p, &off, msg, sizeof msg);
    if (got != v->code) {
        fail_msg("vector %s: want %s, got %s (%s)", v->name, ks_err_name(v->code), ks_err_name(got),
                 got == KS_OK ? "" : msg);
    }
    seen[got == KS_ERR_CONFLICT ? 12 : got]++;
    if (got != KS_OK) {
        char pos[64];
        snprintf(pos, sizeof pos, "%u:%u: %s: ", v->line, v->column, ks_err_name(got));
        assert_null(p);
        if (off != v->offset || strncmp(msg, pos, strlen(pos)) != 0) {
            fail_msg("vector %s: want %s at %zu (%s), got %zu: %s", v->name, ks_err_name(got),
                     v->offset, pos, off, msg);
        }
        return;
    }
    uint8_t *canon;
    size_t canon_len;
    const char *rules = render_rules(p, &canon, &canon_len);
    if (strcmp(rules, v->rules.s != NULL ? v->rules.s : "") != 0) {
        fail_msg("vector %s: rules\n%s\ndiffer from the expected\n%s", v->name, rules, v->rules.s);
    }
    /* [AP-CANON-1]: the canonical form parses to itself. */
    ks_agent_policy *q = NULL;
    assert_int_equal(ks_agent_policy_parse(canon, canon_len, &q, NULL, NULL, 0), KS_OK);
    uint8_t *canon2;
    size_t canon2_len;
    (void)render_rules(q, &canon2, &canon2_len);
    assert_int_equal(canon2_len, canon_len);
    assert_memory_equal(canon, canon2, canon_len);
    assert_int_equal(ks_agent_policy_count(p), ks_agent_policy_count(q));
    for (const char *c = v->checks.s; c != NULL && *c != '\0';) {
        const char *eol = strchr(c, '\n');
        run_check(v->name, p, c, (size_t)(eol - c));
        run_check(v->name, q, c, (size_t)(eol - c));
        c = eol + 1;
    }
    free(canon);
    free(canon2);
    ks_agent_policy_free(q);
    ks_agent_policy_free(p);
}

/* The vector loader is strict: each malformed block below is refused. */
static void test_vector_loader_strict(void **state)
{
    (void)state;
    static const char *const good = "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\n"
                                    "position: 1:1\nhex:\n```\n";
    static const char *const bad[] = {
        /* unknown key; repeated name; no position; a position in an ok vector */
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nnote: x\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nname: f\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: ok\nposition: 1:1\nline: x\n```\n",
        /* a rule or check in an error vector */
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex:\nrule: x\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex:\ncheck: x\n```\n",
        /* line and hex; neither; a trailing space; a bad name, offset, position, hex */
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nline: x\nhex: 0a\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nline: x \n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: broken at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 01\nposition: 1:1\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 0:1\nhex:\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex: 0\n```\n",
        /* no space after the colon; an empty name; empty and unterminated blocks */
        "```ks-agent-policy-vector\nname:e\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-agent-policy-vector\nname:\nexpect: truncated at 0\nposition: 1:1\nhex:\n```\n",
        "```ks-agent-policy-vector\n```\n",
        "```ks-agent-policy-vector\nname: e\nexpect: truncated at 0\nposition: 1:1\nhex:\n",
    };
    tf_loader_refuses(good, bad, sizeof bad / sizeof bad[0], loads);
}

/* Every vector of docs/agent-policy.md Appendix A, and at least one of
 * each rejection class of [AP-ERR-1]. */
static void test_spec_vectors(void **state)
{
    char path[256];
    size_t n, nok = 0;
    unsigned seen[16] = {0};
    const char *why = "", *where = "";
    (void)state;

    tf_spec_path("agent-policy.md", path, sizeof path);
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
    static const int classes[] = {KS_ERR_TRUNCATED, KS_ERR_BAD_MAGIC, KS_ERR_UNSUPPORTED_VERSION,
                                  KS_ERR_FIELD_ORDER, KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
                                  KS_ERR_TOO_LARGE, KS_ERR_BAD_VALUE, 12 /* conflict */};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        if (seen[classes[i]] == 0) {
            fail_msg("no vector for rejection class %d", classes[i]);
        }
    }
    assert_true(got >= 40);
    assert_true(nok >= 5);
    print_message("agent policy vectors: %ld (%zu ok)\n", got, nok);
    free_vectors(vs, (size_t)got);
    free(vs);
    free(doc);
}

/* A file of `rules` rules, uid 0.. (each line of fixed shape). */
static void many_rules(text *t, size_t rules)
{
    addf(t, "%s\n", KS_AGENT_POLICY_HEADER);
    for (size_t i = 0; i < rules; i++) {
        addf(t, "allow uid %zu scope * tenant * ops open\n", i);
    }
}

/* The shipped example, tools/agent/agent-policy.example (beside docs/),
 * is a valid policy that means what its comments say. */
static void test_example(void **state)
{
    char path[256];
    size_t n;
    ks_agent_policy *p = NULL;
    char msg[256];
    (void)state;

    tf_spec_path("../tools/agent/agent-policy.example", path, sizeof path);
    uint8_t *buf = tf_slurp(path, &n);
    if (ks_agent_policy_parse(buf, n, &p, NULL, msg, sizeof msg) != KS_OK) {
        fail_msg("%s: %s", path, msg);
    }
    const uint8_t *acme = (const uint8_t *)"acme";
    assert_int_equal(ks_agent_policy_count(p), 3);
    assert_true(ks_agent_policy_allows(p, 1001, 1001, "payments.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1002, 1002, "payments.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_true(ks_agent_policy_allows(p, 1002, 1002, "payments.card", NULL, 0, KS_AGENT_OP_OPEN));
    assert_true(ks_agent_policy_allows(p, 4242, 1500, NULL, NULL, 0, KS_AGENT_OP_PARSE));
    assert_false(ks_agent_policy_allows(p, 4242, 1500, NULL, NULL, 0, KS_AGENT_OP_OPEN));
    ks_agent_policy_free(p);
    free(buf);
}

/* The limit cases too long for the appendix [AP-RULE-3], [AP-FILE-1]
 * (fuzz/agent_policy_seeds.py builds the same files). */
static void test_limits(void **state)
{
    ks_agent_policy *p = NULL;
    size_t off = 0;
    (void)state;

    text t = {0};
    many_rules(&t, KS_AGENT_POLICY_RULES_MAX);
    assert_int_equal(ks_agent_policy_parse((uint8_t *)t.s, t.len, &p, &off, NULL, 0), KS_OK);
    assert_int_equal(ks_agent_policy_count(p), KS_AGENT_POLICY_RULES_MAX);
    assert_true(ks_agent_policy_allows(p, 1023, 99999, "a.b", NULL, 0, KS_AGENT_OP_OPEN));
    assert_true(ks_agent_policy_allows(p, 0, 99999, "a.b", NULL, 0, KS_AGENT_OP_OPEN));
    assert_false(ks_agent_policy_allows(p, 1024, 99999, "a.b", NULL, 0, KS_AGENT_OP_OPEN));
    assert_false(ks_agent_policy_allows(p, 512, 99999, "a.b", NULL, 0, KS_AGENT_OP_SEAL));
    ks_agent_policy_free(p);
    const size_t last = t.len;
    addf(&t, "allow uid 1024 scope * tenant * ops open\n");
    assert_int_equal(ks_agent_policy_parse((uint8_t *)t.s, t.len, &p, &off, NULL, 0),
                     KS_ERR_TOO_LARGE);
    assert_null(p);
    assert_int_equal(off, last);
    free(t.s);

    /* A file of exactly 65536 bytes is read; one more byte is too-large at 65536. */
    text f = {0};
    addf(&f, "%s\n", KS_AGENT_POLICY_HEADER);
    while (f.len + 1001 <= KS_AGENT_POLICY_FILE_MAX) {
        addf(&f, "#%0999d\n", 0);
    }
    while (f.len < KS_AGENT_POLICY_FILE_MAX) {
        add_bytes(&f, "\n", 1);
    }
    assert_int_equal(ks_agent_policy_parse((uint8_t *)f.s, f.len, &p, &off, NULL, 0), KS_OK);
    assert_int_equal(ks_agent_policy_count(p), 0);
    ks_agent_policy_free(p);
    add_bytes(&f, "\n", 1);
    char msg[256];
    assert_int_equal(ks_agent_policy_parse((uint8_t *)f.s, f.len, &p, &off, msg, sizeof msg),
                     KS_ERR_TOO_LARGE);
    assert_int_equal(off, KS_AGENT_POLICY_FILE_MAX);
    assert_non_null(strstr(msg, "too-large"));
    free(f.s);
}

/* The API's argument rules, the rule accessor and the encoder's sizes. */
static void test_api(void **state)
{
    static const char file[] = KS_AGENT_POLICY_HEADER "\n"
                               "allow gid 7 scope Pay.Card tenant acme ops seal,parse\n";
    const uint8_t *b = (const uint8_t *)file;
    ks_agent_policy *p = NULL;
    ks_agent_rule r;
    uint8_t out[256];
    size_t n = 0;
    (void)state;

    assert_int_equal(ks_agent_policy_parse(b, sizeof file - 1, NULL, NULL, NULL, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_parse(NULL, 1, &p, NULL, NULL, 0), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_parse(b, sizeof file - 1, &p, NULL, NULL, 0), KS_OK);

    assert_int_equal(ks_agent_policy_rule(p, 0, &r), KS_OK);
    assert_int_equal(r.is_gid, 1);
    assert_int_equal(r.id, 7);
    assert_false(r.any_scope || r.any_tenant);
    assert_int_equal(r.table.len, 3);
    assert_memory_equal(r.column.ptr, "Card", 4);
    assert_memory_equal(r.tenant.ptr, "acme", 4);
    assert_int_equal(r.ops, KS_AGENT_OP_SEAL | KS_AGENT_OP_PARSE);
    assert_int_equal(r.offset, strlen(KS_AGENT_POLICY_HEADER) + 1);
    assert_int_equal(ks_agent_policy_rule(p, 1, &r), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_agent_policy_rule(NULL, 0, &r), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_rule(p, 0, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_count(NULL), 0);

    assert_int_equal(ks_agent_policy_encode(p, out, sizeof out, &n), KS_OK);
    assert_int_equal(n, sizeof file - 1);
    assert_memory_equal(out, file, n);
    assert_int_equal(ks_agent_policy_encode(p, out, n - 1, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, sizeof file - 1);
    assert_int_equal(ks_agent_policy_encode(NULL, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_encode(p, NULL, 1, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_encode(p, out, sizeof out, NULL), KS_ERR_INVALID_ARGUMENT);

    /* [AP-MATCH-1]: deny on anything doubtful. */
    const uint8_t *acme = (const uint8_t *)"acme";
    assert_true(ks_agent_policy_allows(p, 1, 7, "pay.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(NULL, 1, 7, "pay.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1, 7, "pay.card", acme, 4, (ks_agent_op)0));
    assert_false(ks_agent_policy_allows(p, 1, 7, "pay.card", acme, 4,
                                        (ks_agent_op)(KS_AGENT_OP_SEAL | KS_AGENT_OP_PARSE)));
    assert_false(ks_agent_policy_allows(p, 1, 7, "pay.card", NULL, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1, 7, "pay.card", acme, 3, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1, (gid_t)-1, "pay.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 7, 1, "pay.card", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1, 7, "paycard", acme, 4, KS_AGENT_OP_SEAL));
    assert_false(ks_agent_policy_allows(p, 1, 7, "pay.cards", acme, 4, KS_AGENT_OP_SEAL));
    ks_agent_policy_free(p);
    ks_agent_policy_free(NULL);

    /* A scope longer than any rule's names matches only `scope *`. */
    static const char star[] = KS_AGENT_POLICY_HEADER "\nallow uid 5 scope * tenant * ops open\n";
    assert_int_equal(ks_agent_policy_parse((const uint8_t *)star, sizeof star - 1, &p, NULL, NULL, 0),
                     KS_OK);
    char longscope[600];
    memset(longscope, 'a', sizeof longscope - 1);
    longscope[sizeof longscope - 1] = '\0';
    longscope[300] = '.';
    assert_true(ks_agent_policy_allows(p, 5, 5, longscope, NULL, 0, KS_AGENT_OP_OPEN));
    assert_true(ks_agent_policy_allows(p, 5, 5, NULL, NULL, 0, KS_AGENT_OP_OPEN));
    assert_false(ks_agent_policy_allows(p, (uid_t)-1, 5, NULL, NULL, 0, KS_AGENT_OP_OPEN));
    ks_agent_policy_free(p);
}

/* A failed allocation fails closed: no policy, no-memory, and the next
 * parse works (migrate/alloc_hook.h's fault hook). */
static void test_no_memory(void **state)
{
    static const char file[] = KS_AGENT_POLICY_HEADER "\nallow uid 1 scope * tenant * ops open\n";
    ks_agent_policy *p = (ks_agent_policy *)(uintptr_t)1;
    char msg[128];
    (void)state;

    ks_test_alloc_fail_at(1);
    assert_int_equal(ks_agent_policy_parse((const uint8_t *)file, sizeof file - 1, &p, NULL, msg,
                                           sizeof msg),
                     KS_ERR_NO_MEMORY);
    assert_int_equal(ks_test_alloc_fired(), 1);
    ks_test_alloc_fail_at(0);
    assert_null(p);
    assert_non_null(strstr(msg, "no memory"));
    assert_int_equal(ks_agent_policy_parse((const uint8_t *)file, sizeof file - 1, &p, NULL, NULL, 0),
                     KS_OK);
    assert_true(ks_agent_policy_allows(p, 1, 1, NULL, NULL, 0, KS_AGENT_OP_OPEN));
    ks_agent_policy_free(p);
}

/* ---- loading [AP-LOAD-1..2] ---------------------------------------------- */

static const char good_file[] = KS_AGENT_POLICY_HEADER "\n"
                                "allow uid 1000 scope payments.card tenant acme ops seal,open\n";

static int setup(void **state)
{
    return tf_setup(state, "agent-policy", "agent-policy");
}

static int teardown(void **state)
{
    return tf_teardown(state);
}

/* Load f->path; the code, with the message in msg. */
static ks_err load(const fixture *f, char *msg, size_t cap)
{
    ks_agent_policy *p = (ks_agent_policy *)(uintptr_t)1;
    const ks_err e = ks_agent_policy_load(f->path, &p, msg, cap);
    if (e == KS_OK) {
        assert_non_null(p);
        ks_agent_policy_free(p);
    } else {
        assert_null(p);
    }
    return e;
}

/* A 0644 file is read; 0664 and 0646 files, a symbolic link, a directory,
 * a FIFO and a missing file are refused, each with its reason. */
static void test_load_permissions(void **state)
{
    fixture *f = *state;
    char msg[512], target[160];

    tf_spit(f->path, good_file, sizeof good_file - 1, 0644);
    assert_int_equal(load(f, msg, sizeof msg), KS_OK);
    tf_spit(f->path, good_file, sizeof good_file - 1, 0600);
    assert_int_equal(load(f, msg, sizeof msg), KS_OK);

    tf_spit(f->path, good_file, sizeof good_file - 1, 0664);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_INSECURE);
    assert_non_null(strstr(msg, "writable by its group or by others"));
    tf_spit(f->path, good_file, sizeof good_file - 1, 0646);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_INSECURE);

    /* A symbolic link to a good file. */
    snprintf(target, sizeof target, "%s/real", f->dir);
    tf_spit(target, good_file, sizeof good_file - 1, 0644);
    assert_int_equal(unlink(f->path), 0);
    assert_int_equal(symlink(target, f->path), 0);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_INSECURE);
    assert_non_null(strstr(msg, "symbolic link"));
    assert_int_equal(unlink(f->path), 0);

    assert_int_equal(mkdir(f->path, 0755), 0);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_INSECURE);
    assert_non_null(strstr(msg, "not a regular file"));
    assert_int_equal(rmdir(f->path), 0);

    assert_int_equal(mkfifo(f->path, 0600), 0);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_INSECURE);
    assert_int_equal(unlink(f->path), 0);

    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_IO);
    assert_non_null(strstr(msg, f->path));
    assert_int_equal(load(f, NULL, 0), KS_ERR_IO);

    ks_agent_policy *p = NULL;
    assert_int_equal(ks_agent_policy_load(NULL, &p, msg, sizeof msg), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_agent_policy_load(f->path, NULL, msg, sizeof msg), KS_ERR_INVALID_ARGUMENT);

    /* No memory for the read buffer, then for the policy: no-memory, no policy. */
    tf_spit(f->path, good_file, sizeof good_file - 1, 0644);
    for (unsigned long n = 1; n <= 2; n++) {
        ks_test_alloc_fail_at(n);
        assert_int_equal(load(f, msg, sizeof msg), KS_ERR_NO_MEMORY);
        assert_int_equal(ks_test_alloc_fired(), 1);
    }
    ks_test_alloc_fail_at(0);
    assert_int_equal(load(f, msg, sizeof msg), KS_OK);
}

/* A rejected file is reported with its path, line, column and code
 * [AP-LOAD-2], [AP-ERR-3]; a file above the limit is read only that far. */
static void test_load_rejections(void **state)
{
    fixture *f = *state;
    char msg[512], want[256];
    static const char bad[] = KS_AGENT_POLICY_HEADER "\n"
                              "# comment\n"
                              "allow uid 1000 scope payments tenant acme ops open\n";

    tf_spit(f->path, bad, sizeof bad - 1, 0644);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_BAD_VALUE);
    snprintf(want, sizeof want, "%s:3:22: bad-value: ", f->path);
    if (strncmp(msg, want, strlen(want)) != 0) {
        fail_msg("message '%s' does not begin with '%s'", msg, want);
    }
    char *big = malloc(2 * KS_AGENT_POLICY_FILE_MAX);
    assert_non_null(big);
    memset(big, '\n', 2 * KS_AGENT_POLICY_FILE_MAX);
    tf_spit(f->path, big, 2 * KS_AGENT_POLICY_FILE_MAX, 0644);
    assert_int_equal(load(f, msg, sizeof msg), KS_ERR_TOO_LARGE);
    assert_non_null(strstr(msg, "(byte 65536)"));
    free(big);
}

/* Run the tests. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_loader_strict),
        cmocka_unit_test(test_spec_vectors),
        cmocka_unit_test(test_example),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_no_memory),
        cmocka_unit_test_setup_teardown(test_load_permissions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_rejections, setup, teardown),
    };
    return cmocka_run_group_tests_name("agent_policy", tests, NULL, NULL);
}
