/*
 * tools/agent/policy.c -- the agent policy file (docs/agent-policy.md):
 * its strict reader, the per-request decision and the canonical encoder.
 * Nothing here opens a file: tools/agent/policy_load.c does, then calls
 * the reader.
 *
 * Like the registry and keyring readers, the parser is a place at which
 * untrusted bytes enter: it reads only through ks_cursor, checks each
 * byte and each element as soon as it is read, stops at the first fault
 * and reports it with a code and an offset.  Each check names the clause
 * it enforces; the order of the checks is the order of [AP-ERR-2].
 *
 * A policy is one allocation: the header, the rules in file order, an
 * index of the rules sorted by principal (for the binary search of
 * allows() and for finding repeated rules in O(n log n)), and a copy of
 * the file that the rules' views point into.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>
#include <keyshift/rollout.h>

#include "policy.h"

#include "../../format/rules.h"
#include "../../migrate/alloc_hook.h"
#include "../../parser/cursor.h"

/* A table or column name is at most as long as the rollout layer's. */
#define IDENT_MAX KS_ROLLOUT_IDENT_MAX

_Static_assert(KS_AGENT_POLICY_LINE_MAX >= 27 + 2 * IDENT_MAX + 1 + 8 + KS_TENANT_MAX + 20,
               "the longest rule line fits in a line");

/* Principal kinds, in their sort order. */
enum { PRINCIPAL_UID = 0, PRINCIPAL_GID = 1 };

/* One rule; the views point into the policy's copy of the file. */
typedef struct rule {
    uint32_t id;
    uint8_t kind;       /* PRINCIPAL_x */
    uint8_t ops;        /* KS_AGENT_OP_x bits */
    uint8_t any_scope;  /* `scope *` */
    uint8_t any_tenant; /* `tenant *` */
    uint16_t table_len, column_len;
    uint8_t tenant_len;
    const uint8_t *table, *column, *tenant;
    size_t offset;      /* of the rule line */
    size_t index;       /* in file order */
} rule;

struct ks_agent_policy {
    size_t nrules;
    rule *rules;         /* file order */
    const rule **order;  /* by (principal, scope, tenant, index) */
};

/* The words of a rule line's keyword positions [AP-RULE-1]. */
static const char *const keywords[] = {"scope", "tenant", "ops"};

/* The state of one parse. */
typedef struct pol_parse {
    ks_agent_policy *out;
    size_t rules_cap;   /* rules that fit in out->rules */
    int have_header;
    size_t offset;      /* where the fault is, when a check fails */
    const char *why;    /* what is wrong, a sentence */
} pol_parse;

/* Fail with code at offset, saying why: note both, return the code. */
static ks_err fault(pol_parse *st, ks_err code, size_t offset, const char *why)
{
    st->offset = offset;
    st->why = why;
    return code;
}

/* Nonzero when v holds exactly the NUL-terminated text s. */
static int view_is(ks_bytes v, const char *s)
{
    const size_t n = strlen(s);
    return v.len == n && memcmp(v.ptr, s, n) == 0;
}

/* c with an ASCII capital made small, every other byte as it is: names
 * compare as SQLite compares identifiers, as the rollout layer does. */
static unsigned fold(uint8_t c)
{
    return c + 32u * ((unsigned)(c - 'A') < 26u);
}

/* Compare a[0, an) and b[0, bn), ASCII letters in either case alike:
 * 0 when equal, else the sign of the order (length first). */
static int fold_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    if (an != bn) {
        return an < bn ? -1 : 1;
    }
    for (size_t i = 0; i < an; i++) {
        if (fold(a[i]) != fold(b[i])) {
            return fold(a[i]) < fold(b[i]) ? -1 : 1;
        }
    }
    return 0;
}

/* ---- lines and tokens ---------------------------------------------------- */

/* Read the next line into *lc (its LF consumed, not part of it), checking
 * its bytes [AP-LINE-1..4]. */
static ks_err next_line(pol_parse *st, ks_cursor *c, ks_cursor *lc)
{
    const size_t base = ks_cursor_offset(c), avail = ks_cursor_remaining(c);
    const uint8_t *p = c->buf + c->pos;
    size_t n = 0;
    uint8_t lf;

    while (n < avail && p[n] != '\n') {
        if (n == KS_AGENT_POLICY_LINE_MAX) {
            return fault(st, KS_ERR_TOO_LARGE, base + n, "a line is longer than 1024 bytes");
        }
        if (p[n] < 0x20 || p[n] > 0x7E) {
            return fault(st, KS_ERR_BAD_VALUE, base + n,
                         "a byte is not printable ASCII or a space (a tab, a CR, a control "
                         "byte or a byte above 7E)");
        }
        n++;
    }
    if (n == avail) {
        return fault(st, KS_ERR_TRUNCATED, base + n, "the last line does not end with a line feed");
    }
    if (n > 0 && p[n - 1] == ' ') {
        size_t j = n - 1;
        while (j > 0 && p[j - 1] == ' ') {
            j--;
        }
        return fault(st, KS_ERR_BAD_VALUE, base + j, "a line ends with a space");
    }
    ks_err e = ks_cursor_read_sub(c, n, lc);
    assert(e == KS_OK);
    e = ks_cursor_read_u8(c, &lf);
    assert(e == KS_OK && lf == '\n');
    (void)e;
    return KS_OK;
}

/* Read the next token of a rule line into *tok [AP-RULE-2]: after the
 * first, one space; then the bytes up to the next space or the line's
 * end.  *off is the token's offset. */
static ks_err next_token(pol_parse *st, ks_cursor *lc, int first, ks_bytes *tok, size_t *off)
{
    uint8_t sp;
    size_t n = 0;

    if (!first && ks_cursor_read_u8(lc, &sp) != KS_OK) {
        return fault(st, KS_ERR_MISSING_FIELD, ks_cursor_offset(lc),
                     "the rule line ends early: a rule is `allow uid|gid ID scope SCOPE tenant "
                     "TENANT ops OPS`");
    }
    assert(first || sp == ' '); /* a token ends at a space or the line's end */
    *off = ks_cursor_offset(lc);
    const uint8_t *p = lc->buf + lc->pos;
    const size_t avail = ks_cursor_remaining(lc);
    assert(avail > 0); /* [AP-LINE-4]: no line ends with a space, and none is empty here */
    if (p[0] == ' ') {
        return fault(st, KS_ERR_BAD_VALUE, *off,
                     "two spaces, or a space at the start of a line: the words of a rule are "
                     "separated by one space");
    }
    while (n < avail && p[n] != ' ') {
        n++;
    }
    ks_err e = ks_cursor_read_view(lc, n, tok);
    assert(e == KS_OK);
    return e;
}

/* ---- the values ----------------------------------------------------------- */

/* ID [AP-ID-1]: decimal digits (bad-value at the first other byte), no
 * leading zero but "0" itself, at most KS_AGENT_POLICY_ID_MAX (bad-value
 * at its first byte). */
static ks_err check_id(pol_parse *st, ks_bytes v, size_t off, uint32_t *out)
{
    uint64_t x = 0;
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9') {
            return fault(st, KS_ERR_BAD_VALUE, off + i, "a uid or gid is a decimal number");
        }
        if (x <= KS_AGENT_POLICY_ID_MAX) {
            x = x * 10 + (uint64_t)(v.ptr[i] - '0');
        }
    }
    if ((v.len > 1 && v.ptr[0] == '0') || x > KS_AGENT_POLICY_ID_MAX) {
        return fault(st, KS_ERR_BAD_VALUE, off,
                     "a uid or gid is a number from 0 to 4294967294 without a leading zero "
                     "(names are not looked up: use `id -u NAME` or `getent group NAME`)");
    }
    *out = (uint32_t)x;
    return KS_OK;
}

/* Nonzero for a byte of a table or column name [AP-SCOPE-1]. */
static int ident_byte(uint8_t b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' ||
           b == '$';
}

/* SCOPE [AP-SCOPE-1..2]: `*`, or TABLE `.` COLUMN, checked left to right. */
static ks_err check_scope(pol_parse *st, ks_bytes v, size_t off, rule *r)
{
    static const char bad[] = "a scope is `*` or TABLE.COLUMN, each name 1 to 255 bytes of "
                              "[A-Za-z0-9_$]";
    size_t dot = SIZE_MAX, start = 0;

    if (view_is(v, "*")) {
        r->any_scope = 1;
        return KS_OK;
    }
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] == '.' && dot == SIZE_MAX && i > 0) {
            dot = i;
            start = i + 1;
            continue;
        }
        if (i - start == IDENT_MAX) {
            return fault(st, KS_ERR_TOO_LARGE, off + i,
                         "a table or column name is longer than 255 bytes");
        }
        if (!ident_byte(v.ptr[i])) {
            return fault(st, KS_ERR_BAD_VALUE, off + i, bad);
        }
    }
    if (dot == SIZE_MAX) {
        return fault(st, KS_ERR_BAD_VALUE, off, bad);
    }
    if (dot + 1 == v.len) {
        return fault(st, KS_ERR_BAD_VALUE, off + dot, bad);
    }
    r->table = v.ptr;
    r->table_len = (uint16_t)dot;
    r->column = v.ptr + dot + 1;
    r->column_len = (uint16_t)(v.len - dot - 1);
    return KS_OK;
}

/* TENANT [AP-TENANT-1]: `*`, or 1..KS_TENANT_MAX bytes of [F-NAME-1],
 * checked left to right. */
static ks_err check_tenant(pol_parse *st, ks_bytes v, size_t off, rule *r)
{
    if (view_is(v, "*")) {
        r->any_tenant = 1;
        return KS_OK;
    }
    for (size_t i = 0; i < v.len; i++) {
        if (i == KS_TENANT_MAX) {
            return fault(st, KS_ERR_TOO_LARGE, off + i, "a tenant is longer than 64 bytes");
        }
        if (ks_rules_charset_scan(KS_RULE_NAME, v.ptr + i, 1) != 1) {
            return fault(st, KS_ERR_BAD_VALUE, off + i,
                         "a tenant is `*` or 1 to 64 bytes of [A-Za-z0-9._:-]");
        }
    }
    r->tenant = v.ptr;
    r->tenant_len = (uint8_t)v.len;
    return KS_OK;
}

/* OPS [AP-OPS-1]: op names joined by commas, in the order seal, open,
 * parse, each at most once. */
static ks_err check_ops(pol_parse *st, ks_bytes v, size_t off, rule *r)
{
    static const char *const names[] = {"seal", "open", "parse"};
    size_t i = 0;
    int last = -1;

    for (;;) {
        size_t n = 0;
        while (i + n < v.len && v.ptr[i + n] != ',') {
            n++;
        }
        const ks_bytes name = {v.ptr + i, n};
        int k = -1;
        for (int j = 0; j < 3; j++) {
            if (view_is(name, names[j])) {
                k = j;
            }
        }
        if (k < 0) {
            return fault(st, KS_ERR_BAD_VALUE, off + i,
                         "the operations are seal, open and parse, joined by commas");
        }
        if (k <= last) {
            return fault(st, KS_ERR_FIELD_ORDER, off + i,
                         "the operations are listed in the order seal,open,parse, each once");
        }
        last = k;
        r->ops |= (uint8_t)(1u << k);
        i += n;
        if (i == v.len) {
            return KS_OK;
        }
        i++; /* the comma */
    }
}

/* The keyword `want` at a keyword position [AP-RULE-1]: another keyword
 * of the line is field-order, anything else unknown-field. */
static ks_err check_keyword(pol_parse *st, ks_bytes v, size_t off, const char *want)
{
    if (view_is(v, want)) {
        return KS_OK;
    }
    for (size_t j = 0; j < sizeof keywords / sizeof keywords[0]; j++) {
        if (view_is(v, keywords[j])) {
            return fault(st, KS_ERR_FIELD_ORDER, off,
                         "the words of a rule come in the order allow, uid|gid, scope, "
                         "tenant, ops");
        }
    }
    return fault(st, KS_ERR_UNKNOWN_FIELD, off,
                 "a rule is `allow uid|gid ID scope SCOPE tenant TENANT ops OPS`");
}

/* ---- lines ------------------------------------------------------------------- */

/* The header line [AP-HEAD-1]. */
static ks_err parse_header(pol_parse *st, ks_bytes line, size_t off)
{
    static const char stem[] = "keyshift-agent-policy ";
    if (view_is(line, KS_AGENT_POLICY_HEADER)) {
        st->have_header = 1;
        return KS_OK;
    }
    if (line.len >= sizeof stem - 1 && memcmp(line.ptr, stem, sizeof stem - 1) == 0) {
        return fault(st, KS_ERR_UNSUPPORTED_VERSION, off + sizeof stem - 1,
                     "this keyshift reads version 1 of the agent policy file only");
    }
    return fault(st, KS_ERR_BAD_MAGIC, off,
                 "the first line that is not a comment must be `keyshift-agent-policy 1`");
}

/* A rule line [AP-RULE-1..3]: nine words, each checked as it is read. */
static ks_err parse_rule(pol_parse *st, ks_cursor *lc)
{
    const size_t line_off = ks_cursor_offset(lc);
    rule r;
    ks_bytes tok;
    size_t off;
    ks_err e;

    memset(&r, 0, sizeof r);
    r.offset = line_off;
    if ((e = next_token(st, lc, 1, &tok, &off)) != KS_OK) {
        return e;
    }
    if (!view_is(tok, "allow")) {
        return fault(st, KS_ERR_UNKNOWN_FIELD, off,
                     "a line after the header is a rule that begins with `allow`, a comment or "
                     "empty");
    }
    if (st->out->nrules == KS_AGENT_POLICY_RULES_MAX) {
        return fault(st, KS_ERR_TOO_LARGE, line_off, "a policy has at most 1024 rules");
    }
    for (int w = 1; w < 9; w++) {
        if ((e = next_token(st, lc, 0, &tok, &off)) != KS_OK) {
            return e;
        }
        switch (w) {
        case 1:
            if (!view_is(tok, "uid") && !view_is(tok, "gid")) {
                return fault(st, KS_ERR_UNKNOWN_FIELD, off, "a rule names `uid ID` or `gid ID`");
            }
            r.kind = tok.ptr[0] == 'g' ? PRINCIPAL_GID : PRINCIPAL_UID;
            break;
        case 2: e = check_id(st, tok, off, &r.id); break;
        case 3: e = check_keyword(st, tok, off, "scope"); break;
        case 4: e = check_scope(st, tok, off, &r); break;
        case 5: e = check_keyword(st, tok, off, "tenant"); break;
        case 6: e = check_tenant(st, tok, off, &r); break;
        case 7: e = check_keyword(st, tok, off, "ops"); break;
        default: e = check_ops(st, tok, off, &r); break;
        }
        if (e != KS_OK) {
            return e;
        }
    }
    if (!ks_cursor_is_empty(lc)) {
        return fault(st, KS_ERR_UNKNOWN_FIELD, ks_cursor_offset(lc) + 1,
                     "a rule line ends after its operations");
    }
    assert(st->out->nrules < st->rules_cap);
    r.index = st->out->nrules;
    st->out->rules[st->out->nrules++] = r;
    return KS_OK;
}

/* Dispatch one line [AP-LINE-5], [AP-HEAD-1]. */
static ks_err parse_line(pol_parse *st, ks_cursor *lc)
{
    const size_t n = ks_cursor_remaining(lc);
    if (n == 0 || lc->buf[lc->pos] == '#') {
        return KS_OK; /* [AP-LINE-5] */
    }
    if (!st->have_header) {
        return parse_header(st, (ks_bytes){lc->buf + lc->pos, n}, ks_cursor_offset(lc));
    }
    return parse_rule(st, lc);
}

/* ---- the index ------------------------------------------------------------------ */

/* The order of rules by principal, then scope (`*` first, then names
 * ASCII case-insensitively), then tenant (`*` first, then bytes): 0
 * when a and b have the same key [AP-DUP-1]. */
static int key_cmp(const rule *a, const rule *b)
{
    int c;
    if (a->kind != b->kind) {
        return a->kind < b->kind ? -1 : 1;
    }
    if (a->id != b->id) {
        return a->id < b->id ? -1 : 1;
    }
    if (a->any_scope != b->any_scope) {
        return a->any_scope ? -1 : 1;
    }
    if ((c = fold_cmp(a->table, a->table_len, b->table, b->table_len)) != 0 ||
        (c = fold_cmp(a->column, a->column_len, b->column, b->column_len)) != 0) {
        return c;
    }
    if (a->any_tenant != b->any_tenant) {
        return a->any_tenant ? -1 : 1;
    }
    if (a->tenant_len != b->tenant_len) {
        return a->tenant_len < b->tenant_len ? -1 : 1;
    }
    return a->tenant_len == 0 ? 0 : memcmp(a->tenant, b->tenant, a->tenant_len);
}

/* qsort's comparison of two rule pointers: by key, then file order, so
 * the order is total and the same on every run. */
static int order_cmp(const void *x, const void *y)
{
    const rule *a = *(const rule *const *)x, *b = *(const rule *const *)y;
    const int c = key_cmp(a, b);
    if (c != 0) {
        return c;
    }
    return (a->index > b->index) - (a->index < b->index);
}

/* Sort the index and refuse a repeated rule [AP-DUP-1]: the conflict is
 * the earliest rule in file order that repeats an earlier one's key. */
static ks_err build_index(pol_parse *st)
{
    ks_agent_policy *p = st->out;
    size_t worst = SIZE_MAX;
    for (size_t i = 0; i < p->nrules; i++) {
        p->order[i] = &p->rules[i];
    }
    if (p->nrules > 1) {
        qsort(p->order, p->nrules, sizeof p->order[0], order_cmp);
    }
    for (size_t i = 1; i < p->nrules; i++) {
        if (key_cmp(p->order[i - 1], p->order[i]) == 0 && p->order[i]->index < worst) {
            worst = p->order[i]->index;
        }
    }
    if (worst != SIZE_MAX) {
        return fault(st, KS_ERR_CONFLICT, p->rules[worst].offset,
                     "this rule repeats an earlier rule's uid or gid, scope and tenant: give "
                     "all of their operations on one line");
    }
    return KS_OK;
}

/* ---- parse ------------------------------------------------------------------------ */

/* The 1-based line and column of offset in buf [AP-ERR-3]. */
static void position(const uint8_t *buf, size_t offset, size_t *line, size_t *col)
{
    size_t l = 1, start = 0;
    for (size_t i = 0; i < offset; i++) {
        if (buf[i] == '\n') {
            l++;
            start = i + 1;
        }
    }
    *line = l;
    *col = offset - start + 1;
}

/* The shortest rule line, its LF included: no file of len bytes holds
 * more than len / RULE_MIN rules. */
#define RULE_MIN (sizeof "allow uid 0 scope * tenant * ops open\n" - 1)

/* Allocate a policy with room for the rules that buf[0, len) can hold
 * (at most KS_AGENT_POLICY_RULES_MAX) and a copy of buf. */
static ks_agent_policy *alloc_policy(const uint8_t *buf, size_t len, size_t *cap)
{
    *cap = len / RULE_MIN < KS_AGENT_POLICY_RULES_MAX ? len / RULE_MIN : KS_AGENT_POLICY_RULES_MAX;
    _Static_assert(sizeof(ks_agent_policy) % _Alignof(rule) == 0, "rules follow the header");
    _Static_assert(sizeof(rule) % _Alignof(const rule *) == 0, "the index follows the rules");
    const size_t size = sizeof(ks_agent_policy) + *cap * (sizeof(rule) + sizeof(rule *)) + len;
    ks_agent_policy *p = malloc(size);
    if (p == NULL) {
        return NULL;
    }
    p->nrules = 0;
    p->rules = (rule *)(void *)(p + 1);
    p->order = (const rule **)(void *)(p->rules + *cap);
    if (len > 0) {
        memcpy(p->order + *cap, buf, len);
    }
    return p;
}

/* See policy.h. */
ks_err ks_agent_policy_parse(const uint8_t *buf, size_t len, ks_agent_policy **out,
                             size_t *err_off, char *errbuf, size_t errlen)
{
    pol_parse st;
    ks_err e = KS_OK;

    if (errbuf != NULL && errlen > 0) {
        errbuf[0] = '\0';
    }
    if (out == NULL || (buf == NULL && len > 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    memset(&st, 0, sizeof st);
    if (len > KS_AGENT_POLICY_FILE_MAX) {
        e = fault(&st, KS_ERR_TOO_LARGE, KS_AGENT_POLICY_FILE_MAX,
                  "the file is longer than 65536 bytes"); /* [AP-FILE-1] */
    } else if ((st.out = alloc_policy(buf, len, &st.rules_cap)) == NULL) {
        if (errbuf != NULL && errlen > 0) {
            snprintf(errbuf, errlen, "no memory for the agent policy.");
        }
        return KS_ERR_NO_MEMORY;
    }
    const uint8_t *text = st.out != NULL ? (const uint8_t *)(st.out->order + st.rules_cap) : NULL;
    ks_cursor c = ks_cursor_init(text, e == KS_OK ? len : 0);
    while (e == KS_OK && !ks_cursor_is_empty(&c)) {
        ks_cursor lc = {NULL, 0, 0, 0};
        if ((e = next_line(&st, &c, &lc)) == KS_OK) {
            e = parse_line(&st, &lc);
        }
    }
    if (e == KS_OK && !st.have_header) {
        e = fault(&st, KS_ERR_TRUNCATED, len,
                  "the file has no `keyshift-agent-policy 1` line"); /* [AP-HEAD-1] */
    }
    if (e == KS_OK) {
        e = build_index(&st);
    }
    if (e != KS_OK) {
        size_t line, col;
        position(buf, st.offset, &line, &col);
        if (err_off != NULL) {
            *err_off = st.offset;
        }
        if (errbuf != NULL && errlen > 0) {
            snprintf(errbuf, errlen, "%zu:%zu: %s: %s (byte %zu).", line, col, ks_err_name(e),
                     st.why, st.offset);
        }
        free(st.out);
        return e;
    }
    *out = st.out;
    return KS_OK;
}

/* ---- the decision ------------------------------------------------------------------ */

/* The first index entry of principal (kind, id), or nrules. */
static size_t lower_bound(const ks_agent_policy *p, uint8_t kind, uint32_t id)
{
    size_t lo = 0, hi = p->nrules;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const rule *r = p->order[mid];
        if (r->kind < kind || (r->kind == kind && r->id < id)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* A request's scope, split [AP-MATCH-2]: has is 0 when it names none or
 * is not TABLE.COLUMN of bounded names (then only `scope *` matches). */
typedef struct req_scope {
    int has;
    const uint8_t *table, *column;
    size_t table_len, column_len;
} req_scope;

/* Split scope at its first '.'. */
static req_scope split_scope(const char *scope)
{
    req_scope s = {0, NULL, NULL, 0, 0};
    if (scope == NULL) {
        return s;
    }
    const size_t n = strnlen(scope, 2 * IDENT_MAX + 2);
    const char *dot = memchr(scope, '.', n);
    if (n > 2 * IDENT_MAX + 1 || dot == NULL) {
        return s;
    }
    s.has = 1;
    s.table = (const uint8_t *)scope;
    s.table_len = (size_t)(dot - scope);
    s.column = (const uint8_t *)dot + 1;
    s.column_len = n - s.table_len - 1;
    return s;
}

/* Nonzero when rule r grants op on scope s for tenant[0, tn) [AP-MATCH-1..3]. */
static int rule_grants(const rule *r, const req_scope *s, const uint8_t *tenant, size_t tn,
                       unsigned op)
{
    if ((r->ops & op) == 0) {
        return 0;
    }
    if (!r->any_scope &&
        (!s->has || fold_cmp(r->table, r->table_len, s->table, s->table_len) != 0 ||
         fold_cmp(r->column, r->column_len, s->column, s->column_len) != 0)) {
        return 0;
    }
    /* A rule's tenant has 1..64 bytes: a request without one never equals it. */
    return r->any_tenant || (tn == r->tenant_len && memcmp(r->tenant, tenant, tn) == 0);
}

/* See policy.h. */
int ks_agent_policy_allows(const ks_agent_policy *p, uid_t uid, gid_t gid, const char *scope,
                           const uint8_t *tenant, size_t tenant_len, ks_agent_op op)
{
    const unsigned o = (unsigned)op;
    if (p == NULL || (o != KS_AGENT_OP_SEAL && o != KS_AGENT_OP_OPEN && o != KS_AGENT_OP_PARSE) ||
        (tenant == NULL && tenant_len > 0)) {
        return 0; /* [AP-MATCH-1]: deny */
    }
    const req_scope s = split_scope(scope);
    const uint8_t kinds[2] = {PRINCIPAL_UID, PRINCIPAL_GID};
    const uint64_t ids[2] = {(uint64_t)uid, (uint64_t)gid};
    for (int k = 0; k < 2; k++) {
        if (ids[k] > KS_AGENT_POLICY_ID_MAX) {
            continue; /* (uid_t)-1 is nobody's [AP-ID-1] */
        }
        for (size_t i = lower_bound(p, kinds[k], (uint32_t)ids[k]); i < p->nrules; i++) {
            const rule *r = p->order[i];
            if (r->kind != kinds[k] || r->id != ids[k]) {
                break;
            }
            if (rule_grants(r, &s, tenant, tenant_len, o)) {
                return 1;
            }
        }
    }
    return 0;
}

/* ---- rules and the canonical form ----------------------------------------------------- */

/* See policy.h. */
size_t ks_agent_policy_count(const ks_agent_policy *p)
{
    return p != NULL ? p->nrules : 0;
}

/* See policy.h. */
ks_err ks_agent_policy_rule(const ks_agent_policy *p, size_t i, ks_agent_rule *out)
{
    if (p == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (i >= p->nrules) {
        return KS_ERR_NOT_FOUND;
    }
    const rule *r = &p->rules[i];
    out->is_gid = r->kind == PRINCIPAL_GID;
    out->id = r->id;
    out->any_scope = r->any_scope;
    out->table = (ks_bytes){r->table, r->table_len};
    out->column = (ks_bytes){r->column, r->column_len};
    out->any_tenant = r->any_tenant;
    out->tenant = (ks_bytes){r->tenant, r->tenant_len};
    out->ops = r->ops;
    out->offset = r->offset;
    return KS_OK;
}

/* An output buffer that counts what does not fit. */
typedef struct sink {
    uint8_t *out;
    size_t cap, len;
} sink;

/* Append p[0, n) to s (as far as it fits; len counts it all). */
static void put(sink *s, const void *p, size_t n)
{
    if (n != 0 && s->len <= s->cap && n <= s->cap - s->len) {
        memcpy(s->out + s->len, p, n);
    }
    s->len += n;
}

/* Append the NUL-terminated text t to s. */
static void put_text(sink *s, const char *t)
{
    put(s, t, strlen(t));
}

/* See policy.h: the header, then each rule in file order, words
 * separated by one space [AP-CANON-1]. */
ks_err ks_agent_policy_encode(const ks_agent_policy *p, uint8_t *out, size_t cap, size_t *out_len)
{
    static const char *const names[] = {"seal", "open", "parse"};
    sink s = {out, cap, 0};
    char id[16];

    if (p == NULL || out_len == NULL || (out == NULL && cap != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    put_text(&s, KS_AGENT_POLICY_HEADER "\n");
    for (size_t i = 0; i < p->nrules; i++) {
        const rule *r = &p->rules[i];
        put_text(&s, r->kind == PRINCIPAL_GID ? "allow gid " : "allow uid ");
        snprintf(id, sizeof id, "%u", (unsigned)r->id);
        put_text(&s, id);
        put_text(&s, " scope ");
        if (r->any_scope) {
            put_text(&s, "*");
        } else {
            put(&s, r->table, r->table_len);
            put_text(&s, ".");
            put(&s, r->column, r->column_len);
        }
        put_text(&s, " tenant ");
        if (r->any_tenant) {
            put_text(&s, "*");
        } else {
            put(&s, r->tenant, r->tenant_len);
        }
        put_text(&s, " ops ");
        const char *sep = "";
        for (int k = 0; k < 3; k++) {
            if ((r->ops >> k & 1u) != 0) {
                put_text(&s, sep);
                put_text(&s, names[k]);
                sep = ",";
            }
        }
        put_text(&s, "\n");
    }
    *out_len = s.len;
    return s.len <= cap ? KS_OK : KS_ERR_BUFFER_TOO_SMALL;
}

/* See policy.h. */
void ks_agent_policy_free(ks_agent_policy *p)
{
    free(p);
}
