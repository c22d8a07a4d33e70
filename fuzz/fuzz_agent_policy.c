/*
 * fuzz/fuzz_agent_policy.c -- the agent policy parser, its decision and
 * its canonical encoder (tools/agent/policy.c, docs/agent-policy.md) on
 * arbitrary bytes.  The loader is not fuzzed: it opens a file; the
 * parser is what reads the untrusted bytes.
 *
 * The input is a policy file, optionally followed by a NUL and a query
 * section: queries of 8 bytes each (at most 32), which pick a request's
 * uid, gid, scope, tenant and operation from the parsed rules or from
 * the bytes themselves (see query()).  A policy file never holds a NUL
 * ([AP-LINE-3]), so the split loses nothing the parser could accept.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. Rejection.  The code is one of [AP-ERR-1]'s, the offset within
 *      [0, len], the message begins with the line and column of that
 *      offset ([AP-ERR-3], recomputed here) and the code's name, *out is
 *      NULL, and a second parse without err_off, with an errbuf of length
 *      0, gives the same code and leaves errbuf alone.
 *   2. Acceptance.  A second parse (as in 1) accepts it with as many
 *      rules.  At most KS_AGENT_POLICY_RULES_MAX rules; each rule's
 *      offset is a line of the input that begins with `allow `; its
 *      values keep their limits and classes ([AP-ID-1], [AP-SCOPE-1],
 *      [AP-TENANT-1], [AP-OPS-1]); no two rules share a key ([AP-DUP-1],
 *      checked pairwise here).
 *   3. Canonical form [AP-CANON-1].  The encoding is no longer than the
 *      input, parses to the same rules (by bytes), and re-encodes to
 *      itself; the input without its final LF is truncated at len - 1
 *      [AP-LINE-1] (or, when that LF ended an empty line, the same
 *      policy).
 *   4. Decisions [AP-MATCH-1..4].  ks_agent_policy_allows agrees with a
 *      reference written here from the clauses (a linear scan of every
 *      rule), on the policy and on its canonical form, for requests made
 *      from the first rules (their own principal, scope and tenant, and
 *      neighbours: the other case, a byte more, none) and for the
 *      queries of the input.
 *   5. Caller errors.  NULL arguments of parse, rule and encode are
 *      invalid-argument; allows() denies a NULL policy, a NULL tenant
 *      with a length, every op that is not exactly one operation, and
 *      (uid_t)-1; a scope too long for any rule matches `scope *` only.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../tools/agent/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

#define QUERY_LEN 8
#define QUERIES_MAX 32
#define OWN_RULES_MAX 8
#define IDENT_MAX 255

static uint8_t enc[KS_AGENT_POLICY_FILE_MAX], enc2[KS_AGENT_POLICY_FILE_MAX];

/* c with an ASCII capital made small. */
static unsigned fold(uint8_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32u : c;
}

/* Nonzero when a[0, an) and b[0, bn) are equal but for ASCII case. */
static int same_folded(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    if (an != bn) {
        return 0;
    }
    for (size_t i = 0; i < an; i++) {
        if (fold(a[i]) != fold(b[i])) {
            return 0;
        }
    }
    return 1;
}

/* Nonzero when a and b hold the same bytes. */
static int same_bytes(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Rule i of p (which must exist). */
static ks_agent_rule rule_at(const ks_agent_policy *p, size_t i)
{
    ks_agent_rule r;
    CHECK(ks_agent_policy_rule(p, i, &r) == KS_OK);
    return r;
}

/* ---- oracle 1 ---------------------------------------------------------------- */

/* A rejection is well formed. */
static void check_rejection(const uint8_t *data, size_t size, ks_err code, size_t off,
                            const char *msg, const ks_agent_policy *p)
{
    static const ks_err codes[] = {
        KS_ERR_TRUNCATED,     KS_ERR_BAD_MAGIC,     KS_ERR_UNSUPPORTED_VERSION,
        KS_ERR_FIELD_ORDER,   KS_ERR_UNKNOWN_FIELD, KS_ERR_MISSING_FIELD,
        KS_ERR_TOO_LARGE,     KS_ERR_BAD_VALUE,     KS_ERR_CONFLICT,
    };
    int known = 0;
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        known |= code == codes[i];
    }
    CHECK(known);
    CHECK(p == NULL);
    CHECK(off <= size);
    size_t line = 1, start = 0;
    for (size_t i = 0; i < off && i < size; i++) {
        if (data[i] == '\n') {
            line++;
            start = i + 1;
        }
    }
    char want[96];
    snprintf(want, sizeof want, "%zu:%zu: %s: ", line, off - start + 1, ks_err_name(code));
    CHECK(strncmp(msg, want, strlen(want)) == 0);
    ks_agent_policy *q = NULL;
    char none[1] = {'x'};
    CHECK(ks_agent_policy_parse(data, size, &q, NULL, none, 0) == code && q == NULL);
    CHECK(none[0] == 'x');
}

/* ---- oracle 2 ---------------------------------------------------------------- */

/* Nonzero when v is 1..max bytes of the class `ok`. */
static int in_class(ks_bytes v, size_t max, int (*ok)(uint8_t b))
{
    if (v.len == 0 || v.len > max || v.ptr == NULL) {
        return 0;
    }
    for (size_t i = 0; i < v.len; i++) {
        if (!ok(v.ptr[i])) {
            return 0;
        }
    }
    return 1;
}

/* [AP-SCOPE-1]'s class. */
static int ident_byte(uint8_t b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' ||
           b == '$';
}

/* [F-NAME-1]'s class. */
static int name_byte(uint8_t b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '.' ||
           b == '_' || b == ':' || b == '-';
}

/* Nonzero when two rules have the same key [AP-DUP-1]. */
static int same_key(const ks_agent_rule *a, const ks_agent_rule *b)
{
    if (a->is_gid != b->is_gid || a->id != b->id || a->any_scope != b->any_scope ||
        a->any_tenant != b->any_tenant) {
        return 0;
    }
    if (!a->any_scope &&
        (!same_folded(a->table.ptr, a->table.len, b->table.ptr, b->table.len) ||
         !same_folded(a->column.ptr, a->column.len, b->column.ptr, b->column.len))) {
        return 0;
    }
    return a->any_tenant || same_bytes(a->tenant, b->tenant);
}

/* The shape of an accepted policy. */
static void check_accepted(const uint8_t *data, size_t size, const ks_agent_policy *p)
{
    const size_t n = ks_agent_policy_count(p);
    ks_agent_rule r;
    CHECK(n <= KS_AGENT_POLICY_RULES_MAX);
    CHECK(ks_agent_policy_rule(p, n, &r) == KS_ERR_NOT_FOUND);
    for (size_t i = 0; i < n; i++) {
        r = rule_at(p, i);
        CHECK(r.offset < size && size - r.offset >= 6 && memcmp(data + r.offset, "allow ", 6) == 0);
        CHECK(r.offset == 0 || data[r.offset - 1] == '\n');
        CHECK(i == 0 || r.offset > rule_at(p, i - 1).offset);
        CHECK(r.is_gid == 0 || r.is_gid == 1);
        CHECK(r.id <= KS_AGENT_POLICY_ID_MAX);
        CHECK(r.ops >= 1 && r.ops <= 7);
        if (r.any_scope) {
            CHECK(r.table.len == 0 && r.column.len == 0);
        } else {
            CHECK(in_class(r.table, IDENT_MAX, ident_byte));
            CHECK(in_class(r.column, IDENT_MAX, ident_byte));
            CHECK(r.column.ptr == r.table.ptr + r.table.len + 1 && r.table.ptr[r.table.len] == '.');
        }
        if (r.any_tenant) {
            CHECK(r.tenant.len == 0);
        } else {
            CHECK(in_class(r.tenant, KS_TENANT_MAX, name_byte));
        }
        for (size_t j = 0; j < i; j++) {
            const ks_agent_rule o = rule_at(p, j);
            CHECK(!same_key(&o, &r));
        }
    }
    ks_agent_policy *q = NULL;
    char none[1] = {'x'};
    CHECK(ks_agent_policy_parse(data, size, &q, NULL, none, 0) == KS_OK && none[0] == 'x');
    CHECK(ks_agent_policy_count(q) == n);
    ks_agent_policy_free(q);
}

/* ---- oracle 3 ---------------------------------------------------------------- */

/* Nonzero when a and b hold the same rules, by bytes. */
static int same_rules(const ks_agent_policy *a, const ks_agent_policy *b)
{
    if (ks_agent_policy_count(a) != ks_agent_policy_count(b)) {
        return 0;
    }
    for (size_t i = 0; i < ks_agent_policy_count(a); i++) {
        const ks_agent_rule x = rule_at(a, i), y = rule_at(b, i);
        if (x.is_gid != y.is_gid || x.id != y.id || x.any_scope != y.any_scope ||
            x.any_tenant != y.any_tenant || x.ops != y.ops || !same_bytes(x.table, y.table) ||
            !same_bytes(x.column, y.column) || !same_bytes(x.tenant, y.tenant)) {
            return 0;
        }
    }
    return 1;
}

/* The canonical form; the parse of it to *canon. */
static void check_canonical(const uint8_t *data, size_t size, const ks_agent_policy *p,
                            ks_agent_policy **canon)
{
    size_t n = 0, m = 0;
    CHECK(ks_agent_policy_encode(p, enc, sizeof enc, &n) == KS_OK);
    CHECK(n <= size);
    CHECK(ks_agent_policy_encode(p, NULL, 0, &m) == KS_ERR_BUFFER_TOO_SMALL && m == n);
    CHECK(ks_agent_policy_parse(enc, n, canon, NULL, NULL, 0) == KS_OK);
    CHECK(same_rules(p, *canon));
    CHECK(ks_agent_policy_encode(*canon, enc2, sizeof enc2, &m) == KS_OK);
    CHECK(m == n && memcmp(enc, enc2, n) == 0);
    /* Without its final LF: truncated, unless that LF ended an empty line. */
    ks_agent_policy *q = NULL;
    size_t off = 0;
    if (size >= 2 && data[size - 2] == '\n') {
        CHECK(ks_agent_policy_parse(data, size - 1, &q, &off, NULL, 0) == KS_OK);
        CHECK(same_rules(p, q));
        ks_agent_policy_free(q);
    } else {
        CHECK(ks_agent_policy_parse(data, size - 1, &q, &off, NULL, 0) == KS_ERR_TRUNCATED);
        CHECK(off == size - 1 && q == NULL);
    }
}

/* ---- oracle 4 ---------------------------------------------------------------- */

/* A request. */
typedef struct request {
    uint32_t uid, gid;
    const char *scope;  /* NULL: none */
    const uint8_t *tenant;
    size_t tenant_len;
    unsigned op;
} request;

/* The reference decision of [AP-MATCH-1..4]: a scan of every rule. */
static int reference(const ks_agent_policy *p, const request *q)
{
    if (q->op != KS_AGENT_OP_SEAL && q->op != KS_AGENT_OP_OPEN && q->op != KS_AGENT_OP_PARSE) {
        return 0;
    }
    const char *dot = q->scope != NULL ? strchr(q->scope, '.') : NULL;
    for (size_t i = 0; i < ks_agent_policy_count(p); i++) {
        const ks_agent_rule r = rule_at(p, i);
        const uint32_t who = r.is_gid ? q->gid : q->uid;
        if (who != r.id || who > KS_AGENT_POLICY_ID_MAX || (r.ops & q->op) == 0) {
            continue;
        }
        if (!r.any_scope &&
            (dot == NULL ||
             !same_folded(r.table.ptr, r.table.len, (const uint8_t *)q->scope,
                          (size_t)(dot - q->scope)) ||
             !same_folded(r.column.ptr, r.column.len, (const uint8_t *)dot + 1, strlen(dot + 1)))) {
            continue;
        }
        const ks_bytes t = {q->tenant, q->tenant_len};
        if (!r.any_tenant && (q->tenant_len == 0 || !same_bytes(r.tenant, t))) {
            continue;
        }
        return 1;
    }
    return 0;
}

/* allows() on p and on its canonical form agrees with the reference. */
static void check_request(const ks_agent_policy *p, const ks_agent_policy *canon, const request *q)
{
    const int want = reference(p, q);
    CHECK(ks_agent_policy_allows(p, q->uid, q->gid, q->scope, q->tenant, q->tenant_len,
                                 (ks_agent_op)q->op) == want);
    CHECK(ks_agent_policy_allows(canon, q->uid, q->gid, q->scope, q->tenant, q->tenant_len,
                                 (ks_agent_op)q->op) == want);
}

/* Scope and tenant buffers of a request. */
static char scope_buf[2 * IDENT_MAX + 8];
static uint8_t tenant_buf[KS_TENANT_MAX + 2];

/* Write rule r's scope into scope_buf, with ASCII case flipped when flip;
 * NULL for `scope *`. */
static const char *scope_of(const ks_agent_rule *r, int flip)
{
    if (r->any_scope) {
        return NULL;
    }
    size_t n = 0;
    memcpy(scope_buf, r->table.ptr, r->table.len);
    n += r->table.len;
    scope_buf[n++] = '.';
    memcpy(scope_buf + n, r->column.ptr, r->column.len);
    n += r->column.len;
    scope_buf[n] = '\0';
    for (size_t i = 0; flip && i < n; i++) {
        const char c = scope_buf[i];
        scope_buf[i] = (char)(c >= 'a' && c <= 'z' ? c - 32 : c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    return scope_buf;
}

/* Requests made from rule r: its own, and neighbours (flipped case, a
 * tenant one byte longer, no scope or tenant, the id as the other kind). */
static void check_own(const ks_agent_policy *p, const ks_agent_policy *canon, const ks_agent_rule *r)
{
    for (unsigned op = 1; op <= 4; op <<= 1) {
        for (int variant = 0; variant < 4; variant++) {
            request q = {r->is_gid ? 4242u : r->id, r->is_gid ? r->id : 4242u, NULL, NULL, 0, op};
            q.scope = scope_of(r, variant == 1);
            memcpy(tenant_buf, r->tenant.ptr != NULL ? r->tenant.ptr : (const uint8_t *)"t",
                   r->tenant.len != 0 ? r->tenant.len : 1);
            q.tenant = tenant_buf;
            q.tenant_len = r->tenant.len != 0 ? r->tenant.len : 1;
            if (variant == 2) {
                tenant_buf[q.tenant_len++] = 'x';
            } else if (variant == 3) {
                q.scope = NULL;
                q.tenant = NULL;
                q.tenant_len = 0;
                const uint32_t t = q.uid;
                q.uid = q.gid;
                q.gid = t;
            }
            check_request(p, canon, &q);
        }
    }
}

/* A request from the 8 query bytes b: the ids from a rule's (b[1], b[3]
 * pick the rule; high bit: the byte itself, plus one when b[0] says so),
 * the scope and tenant from a rule (b[5], b[6]; some values mean none,
 * the empty string, or a bad op), op from b[0]. */
static void query(const ks_agent_policy *p, const ks_agent_policy *canon, const uint8_t *b)
{
    static const unsigned ops[] = {KS_AGENT_OP_SEAL, KS_AGENT_OP_OPEN, KS_AGENT_OP_PARSE, 0, 3, 8};
    const size_t n = ks_agent_policy_count(p);
    request q = {0, 0, NULL, NULL, 0, ops[b[0] % 6]};
    uint32_t *ids[2] = {&q.uid, &q.gid};
    for (int k = 0; k < 2; k++) {
        const uint8_t pick = b[1 + 2 * k], raw = b[2 + 2 * k];
        if ((pick & 0x80) != 0 || n == 0) {
            *ids[k] = raw == 0xFF ? UINT32_MAX : raw;
        } else {
            *ids[k] = rule_at(p, pick % n).id + (uint32_t)((b[0] >> (4 + k)) & 1u);
        }
    }
    if (n > 0 && b[5] < 0xF0) {
        const ks_agent_rule r = rule_at(p, b[5] % n);
        q.scope = scope_of(&r, (b[7] & 1) != 0);
    } else {
        q.scope = b[5] == 0xF0 ? "" : b[5] == 0xF1 ? "a.b" : NULL;
    }
    if (n > 0 && b[6] < 0xF0) {
        const ks_agent_rule r = rule_at(p, b[6] % n);
        q.tenant_len = r.tenant.len;
        memcpy(tenant_buf, r.tenant.ptr != NULL ? r.tenant.ptr : (const uint8_t *)"", r.tenant.len);
        q.tenant = q.tenant_len != 0 ? tenant_buf : NULL;
        if ((b[7] & 2) != 0 && q.tenant_len > 0) {
            q.tenant_len--; /* a prefix of the rule's tenant */
        }
    }
    check_request(p, canon, &q);
}

/* Oracle 5: caller errors and edge requests on an accepted policy. */
static void check_edges(const uint8_t *data, size_t len, const ks_agent_policy *p,
                        const ks_agent_policy *canon)
{
    ks_agent_policy *q = NULL;
    ks_agent_rule r;
    size_t n = 0;
    CHECK(ks_agent_policy_parse(data, len, NULL, NULL, NULL, 0) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_agent_policy_parse(NULL, 1, &q, NULL, NULL, 0) == KS_ERR_INVALID_ARGUMENT && q == NULL);
    CHECK(ks_agent_policy_parse(NULL, 0, &q, NULL, NULL, 0) == KS_ERR_TRUNCATED && q == NULL);
    CHECK(ks_agent_policy_rule(NULL, 0, &r) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_agent_policy_rule(p, 0, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_agent_policy_count(NULL) == 0);
    CHECK(ks_agent_policy_encode(NULL, enc, sizeof enc, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_agent_policy_encode(p, NULL, 1, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_agent_policy_encode(p, enc, sizeof enc, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(!ks_agent_policy_allows(NULL, 0, 0, NULL, NULL, 0, KS_AGENT_OP_OPEN));
    CHECK(!ks_agent_policy_allows(p, 0, 0, NULL, NULL, 1, KS_AGENT_OP_OPEN));
    /* A scope of 2 * 255 + 2 bytes, and one without a dot. */
    memset(scope_buf, 'a', sizeof scope_buf - 1);
    scope_buf[sizeof scope_buf - 1] = '\0';
    scope_buf[IDENT_MAX] = '.';
    for (size_t i = 0; i < ks_agent_policy_count(p) && i < OWN_RULES_MAX; i++) {
        const ks_agent_rule x = rule_at(p, i);
        const request a = {x.id, x.id, scope_buf, NULL, 0, KS_AGENT_OP_PARSE};
        const request b = {x.id, x.id, "nodot", NULL, 0, KS_AGENT_OP_OPEN};
        const request c = {UINT32_MAX, x.id, NULL, NULL, 0, KS_AGENT_OP_SEAL};
        check_request(p, canon, &a);
        check_request(p, canon, &b);
        check_request(p, canon, &c);
    }
}

/* One input: oracles 1 to 5 (see the header comment). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = size > 0 ? memchr(data, 0, size) : NULL;
    const size_t len = nul != NULL ? (size_t)(nul - data) : size;
    ks_agent_policy *p = NULL, *canon = NULL;
    size_t off = SIZE_MAX;
    char msg[512];

    const ks_err code = ks_agent_policy_parse(data, len, &p, &off, msg, sizeof msg);
    if (code != KS_OK) {
        check_rejection(data, len, code, off, msg, p);
        return 0;
    }
    CHECK(p != NULL && len > 0);
    check_accepted(data, len, p);
    check_canonical(data, len, p, &canon);
    const size_t n = ks_agent_policy_count(p);
    for (size_t i = 0; i < n && i < OWN_RULES_MAX; i++) {
        const ks_agent_rule r = rule_at(p, i);
        check_own(p, canon, &r);
    }
    if (nul != NULL) {
        const uint8_t *qs = nul + 1;
        const size_t qn = (size - len - 1) / QUERY_LEN;
        for (size_t i = 0; i < qn && i < QUERIES_MAX; i++) {
            query(p, canon, qs + i * QUERY_LEN);
        }
    }
    check_edges(data, len, p, canon);
    ks_agent_policy_free(canon);
    ks_agent_policy_free(p);
    return 0;
}
