/*
 * tools/agent/request.c -- the strict reader of the agent's request bodies
 * (docs/agent.md section 4).
 *
 * A body comes from a local process the agent trusts only as far as its
 * policy says.  jansson builds the tree with JSON_REJECT_DUPLICATES (and
 * refuses invalid UTF-8 and NUL characters); this file then checks every
 * member against the request's table: exact JSON types, unknown members
 * refused, canonical base64 through the envelope text decoder
 * (parser/text.c, [F-TEXT-1]), names by [F-NAME-1], bounded lengths.  It
 * stops at the first fault, in document order of [AG-REQ-3], and names a
 * reason and a member, never a byte of the body.  Every string jansson
 * copied is wiped before the tree is freed, since a seal's body holds
 * plaintext.
 *
 * Long values.  jansson builds every string a byte at a time, which costs
 * a 2 KiB plaintext tens of microseconds in base64.  So a body with no
 * backslash has each member value of LIT_MIN or more base64-alphabet
 * bytes replaced, in the copy jansson reads, by a short placeholder
 * string "\u001fK" (K: the value's index); the reader takes such a value
 * from the body itself.  The copy is valid JSON exactly when the body is,
 * with the same members and structure: a base64-alphabet string needs no
 * escape, and without a backslash in the body no string of it can hold
 * U+001F (a raw control byte is not JSON), so no placeholder is mistaken
 * for a member's own value.  fuzz/fuzz_agent_request.c checks that both
 * ways read every body alike.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "request.h"

#include "../../format/rules.h"
#include "../../parser/cursor.h"

/* See request.h. */
const char *ks_agent_reason_name(int reason)
{
    static const char *const names[KS_AGENT_R_COUNT] = {
        [KS_AGENT_R_NONE] = "none",
        [KS_AGENT_R_TOO_LARGE] = "too-large",
        [KS_AGENT_R_BAD_JSON] = "bad-json",
        [KS_AGENT_R_DUPLICATE] = "duplicate-member",
        [KS_AGENT_R_NOT_OBJECT] = "not-object",
        [KS_AGENT_R_UNKNOWN] = "unknown-member",
        [KS_AGENT_R_MISSING] = "missing-member",
        [KS_AGENT_R_BAD_TYPE] = "bad-type",
        [KS_AGENT_R_BAD_BASE64] = "bad-base64",
        [KS_AGENT_R_BAD_VALUE] = "bad-value",
        [KS_AGENT_R_TOO_MANY] = "too-many-records",
        [KS_AGENT_R_BAD_FRAME] = "bad-frame",
    };
    return reason >= 0 && reason < KS_AGENT_R_COUNT ? names[reason] : NULL;
}

/* The members of a record [AG-REQ-4..8]. */
enum { M_SCOPE, M_TENANT, M_PURPOSE, M_CONTEXT, M_PLAINTEXT, M_VALUE, M_COUNT };
static const char *const member_names[M_COUNT] = {
    "scope", "tenant", "purpose", "context", "plaintext", "value",
};
#define BIT(m) (1u << (m))

/* The reader's state: the request being filled, its arena's use, and the
 * error report. */
typedef struct req_read {
    ks_agent_request *out;
    size_t used;
    ks_agent_req_error *err;
    long index;
    const uint8_t *body;     /* the body, for the long values */
    const size_t *lits;      /* offset and length of long value K at [2K], [2K+1] */
    size_t n_lits;
} req_read;

/* The shortest member value taken from the body rather than through
 * jansson, and the first byte of its placeholder (U+001F). */
#define LIT_MIN 16
#define LIT_MARK 0x1f

/* Record a refusal and return KS_ERR_BAD_VALUE. */
static ks_err refuse(req_read *st, ks_agent_reason reason, const char *member)
{
    st->err->reason = reason;
    st->err->member = member;
    st->err->index = st->index;
    st->err->offset = -1;
    return KS_ERR_BAD_VALUE;
}

/* n bytes of the arena, or NULL when it is full (which its sizing in
 * ks_agent_request_read rules out). */
static uint8_t *arena_take(req_read *st, size_t n)
{
    if (n > st->out->arena_cap - st->used) {
        return NULL;
    }
    uint8_t *p = st->out->arena + st->used;
    st->used += n;
    return p;
}

/* Copy s[0, n) into the arena with a NUL. */
static char *arena_str(req_read *st, const char *s, size_t n)
{
    uint8_t *p = arena_take(st, n + 1);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, s, n);
    p[n] = '\0';
    return (char *)p;
}

/* [AG-REQ-5] Nonzero when s[0, n) is 1..max bytes of [F-NAME-1]. */
static int name_ok(const char *s, size_t n, size_t max)
{
    if (n == 0 || n > max) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!(ks_charclass[(unsigned char)s[i]] & KS_CC_NAME)) {
            return 0;
        }
    }
    return 1;
}

/* [AG-REQ-4] A scope: TABLE.COLUMN, each part 1..KS_ROLLOUT_IDENT_MAX
 * bytes of printable ASCII other than '.', exactly one '.'.  Returns the
 * length of TABLE, or 0 when s[0, n) is not a scope. */
static size_t scope_split(const char *s, size_t n)
{
    const char *dot = n > 0 ? memchr(s, '.', n) : NULL;
    if (dot == NULL || dot == s || dot == s + n - 1 || memchr(dot + 1, '.', n - (size_t)(dot - s) - 1)) {
        return 0;
    }
    const size_t tl = (size_t)(dot - s), cl = n - tl - 1;
    if (tl > KS_ROLLOUT_IDENT_MAX || cl > KS_ROLLOUT_IDENT_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7E) {
            return 0;
        }
    }
    return tl;
}

/* Copy the scope s[0, n), whose TABLE is tl bytes, into the arena as
 * r's scope, table and column. */
static ks_err put_scope(req_read *st, const char *s, size_t n, size_t tl, ks_agent_record *r)
{
    const size_t cl = n - tl - 1;
    r->scope = arena_str(st, s, n);
    r->table = arena_str(st, s, tl);
    r->column = arena_str(st, s + tl + 1, cl);
    return r->scope && r->table && r->column ? KS_OK : KS_ERR_NO_MEMORY;
}

/* Read a scope s[0, n) into r [AG-REQ-4]. */
static ks_err read_scope(req_read *st, const char *s, size_t n, ks_agent_record *r)
{
    const size_t tl = scope_split(s, n);
    if (tl == 0) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "scope");
    }
    return put_scope(st, s, n, tl, r);
}

/* [AG-REQ-6] Decode the canonical base64 s[0, n) into the arena as *out,
 * at most max bytes. */
static ks_err read_b64(req_read *st, int m, const char *s, size_t n, size_t max, ks_bytes *out)
{
    const size_t cap = ks_envelope_text_decoded_max(n);
    uint8_t *p = arena_take(st, cap);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    size_t got = 0;
    ks_err e = ks_envelope_text_decode((const uint8_t *)s, n, NULL, p, cap, &got, NULL);
    if (e == KS_ERR_TOO_LARGE) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, member_names[m]);
    }
    if (e != KS_OK) {
        return refuse(st, KS_AGENT_R_BAD_BASE64, member_names[m]);
    }
    if (got > max) {
        sodium_memzero(p, got);
        return refuse(st, KS_AGENT_R_BAD_VALUE, member_names[m]);
    }
    *out = (ks_bytes){p, got};
    return KS_OK;
}

/* The members allowed in a record of verb, and those required [AG-REQ-7]. */
static void record_members(ks_agent_verb verb, unsigned *allowed, unsigned *required)
{
    switch (verb) {
    case KS_AGENT_SEAL:
    case KS_AGENT_SEAL_BATCH:
        *allowed = BIT(M_SCOPE) | BIT(M_TENANT) | BIT(M_PURPOSE) | BIT(M_CONTEXT) | BIT(M_PLAINTEXT);
        *required = BIT(M_SCOPE) | BIT(M_TENANT) | BIT(M_PLAINTEXT);
        return;
    case KS_AGENT_OPEN:
    case KS_AGENT_OPEN_BATCH:
        *allowed = BIT(M_SCOPE) | BIT(M_TENANT) | BIT(M_PURPOSE) | BIT(M_CONTEXT) | BIT(M_VALUE);
        *required = BIT(M_SCOPE) | BIT(M_VALUE);
        return;
    case KS_AGENT_PARSE:
        *allowed = BIT(M_SCOPE) | BIT(M_VALUE);
        *required = BIT(M_SCOPE) | BIT(M_VALUE);
        return;
    }
    *allowed = *required = 0;
}

/* A placeholder's value: the body's bytes it stands for (see the top of
 * this file).  Only lit_prescan writes placeholders, and only the body's
 * long values can be them. */
static void lit_resolve(const req_read *st, const char **s, size_t *n)
{
    size_t k = 0;
    for (size_t i = 1; i < *n; i++) {
        assert((*s)[i] >= '0' && (*s)[i] <= '9');
        k = k * 10 + (size_t)((*s)[i] - '0');
    }
    assert(k < st->n_lits);
    *s = (const char *)st->body + st->lits[2 * k];
    *n = st->lits[2 * k + 1];
}

/* Read one record object o of verb into *r [AG-REQ-3..8]. */
static ks_err read_record(req_read *st, ks_agent_verb verb, json_t *o, ks_agent_record *r)
{
    if (!json_is_object(o)) {
        return refuse(st, KS_AGENT_R_NOT_OBJECT, NULL);
    }
    unsigned allowed, required;
    record_members(verb, &allowed, &required);
    json_t *v[M_COUNT] = {NULL};
    /* Unknown members first, in the object's order. */
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        int m = 0;
        while (m < M_COUNT && strcmp(member_names[m], key) != 0) {
            m++;
        }
        if (m == M_COUNT || !(allowed & BIT(m))) {
            return refuse(st, KS_AGENT_R_UNKNOWN, NULL);
        }
        v[m] = val;
    }
    /* Then each member in table order: presence, type, value. */
    for (int m = 0; m < M_COUNT; m++) {
        if (!(allowed & BIT(m))) {
            continue;
        }
        if (v[m] == NULL) {
            if (required & BIT(m)) {
                return refuse(st, KS_AGENT_R_MISSING, member_names[m]);
            }
            continue;
        }
        if (!json_is_string(v[m])) {
            return refuse(st, KS_AGENT_R_BAD_TYPE, member_names[m]);
        }
        const char *s = json_string_value(v[m]);
        size_t n = json_string_length(v[m]);
        if (st->lits != NULL && n > 1 && s[0] == LIT_MARK) {
            lit_resolve(st, &s, &n);
        }
        ks_err e = KS_OK;
        switch (m) {
        case M_SCOPE:
            e = read_scope(st, s, n, r);
            break;
        case M_TENANT:
        case M_PURPOSE: {
            const size_t max = m == M_TENANT ? KS_TENANT_MAX : KS_PURPOSE_MAX;
            if (!name_ok(s, n, max)) {
                return refuse(st, KS_AGENT_R_BAD_VALUE, member_names[m]);
            }
            char *c = arena_str(st, s, n);
            if (c == NULL) {
                return KS_ERR_NO_MEMORY;
            }
            *(m == M_TENANT ? &r->tenant : &r->purpose) = (ks_bytes){(const uint8_t *)c, n};
            break;
        }
        case M_CONTEXT:
            e = read_b64(st, m, s, n, KS_CONTEXT_MAX, &r->context);
            break;
        default: /* M_PLAINTEXT, M_VALUE */
            e = read_b64(st, m, s, n, SIZE_MAX, &r->data);
            break;
        }
        if (e != KS_OK) {
            return e;
        }
    }
    return KS_OK;
}

/* Wipe the text of every string in the tree under j: jansson's copies of
 * plaintexts, contexts and values. */
static void wipe_strings(json_t *j, int depth)
{
    if (j == NULL || depth > 2) { /* [AG-REQ-2]: a body is at most two levels deep */
        return;
    }
    if (json_is_string(j)) {
        sodium_memzero((void *)(uintptr_t)json_string_value(j), json_string_length(j));
    } else if (json_is_object(j)) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            wipe_strings(v, depth + 1);
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            wipe_strings(v, depth + 1);
        }
    }
}

/* 1 for the bytes of the base64 alphabet and '=' ([F-TEXT-1]): those
 * that need no escape in a JSON string; 0 for every other byte. */
static const uint8_t lit_byte[256] = {
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
    ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
    ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1,
    ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1,
    ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['+'] = 1, ['/'] = 1,
    ['='] = 1
};

/* The length of the run of base64-alphabet bytes (lit_byte) that
 * begins p[0, n): eight bytes a step, one test each, since a seal's
 * plaintext is such a run of kilobytes. */
static size_t lit_span(const uint8_t *p, size_t n)
{
    size_t j = 0;
    while (n - j >= 8 && (lit_byte[p[j]] & lit_byte[p[j + 1]] & lit_byte[p[j + 2]] &
                          lit_byte[p[j + 3]] & lit_byte[p[j + 4]] & lit_byte[p[j + 5]] &
                          lit_byte[p[j + 6]] & lit_byte[p[j + 7]])) {
        j += 8;
    }
    while (j < n && lit_byte[p[j]]) {
        j++;
    }
    return j;
}

/* Write the placeholder of long value k, the JSON string "\u001fK" with
 * K in decimal (see the top of this file), to ph (32 bytes); returns its
 * length. */
static size_t lit_placeholder(uint8_t ph[32], size_t k)
{
    static const char head[] = "\"\\u001f";
    uint8_t digits[24];
    size_t nd = 0;
    do {
        digits[nd++] = (uint8_t)('0' + k % 10);
        k /= 10;
    } while (k > 0);
    size_t n = sizeof head - 1;
    memcpy(ph, head, n);
    while (nd > 0) {
        ph[n++] = digits[--nd];
    }
    ph[n++] = '"';
    assert(n <= 32);
    return n;
}

/* The copy of body[0, len) that jansson reads, with each member value of
 * LIT_MIN or more base64-alphabet bytes replaced by a placeholder (see the
 * top of this file), into *copy (malloc'd, *copy_len bytes) and the values'
 * offsets and lengths into *lits (malloc'd, *n_lits values).  *copy is
 * NULL when the body has a backslash or no such value: jansson then reads
 * the body.  Linear in len. */
static ks_err lit_prescan(const uint8_t *body, size_t len, uint8_t **copy, size_t *copy_len,
                          size_t **lits, size_t *n_lits)
{
    *copy = NULL;
    *lits = NULL;
    *copy_len = *n_lits = 0;
    if (len < LIT_MIN || memchr(body, '\\', len) != NULL) {
        return KS_OK;
    }
    const size_t max_lits = len / (LIT_MIN + 2) + 1, cap = len + 32;
    uint8_t *c = malloc(cap);
    size_t *l = malloc(2 * max_lits * sizeof *l);
    if (c == NULL || l == NULL) {
        free(c);
        free(l);
        return KS_ERR_NO_MEMORY;
    }
    size_t i = 0, o = 0, k = 0;
    uint8_t last = 0; /* the last byte outside strings that is not whitespace */
    while (i < len) {
        const uint8_t b = body[i];
        if (b != '"') {
            if (b != ' ' && b != '\t' && b != '\n' && b != '\r') {
                last = b;
            }
            c[o++] = b;
            i++;
            continue;
        }
        /* Without a backslash a string ends at the next quote. */
        const uint8_t *q = memchr(body + i + 1, '"', len - i - 1);
        const size_t end = q != NULL ? (size_t)(q - body) + 1 : len;
        const size_t s = i + 1, n = end - s - (q != NULL);
        size_t j = 0;
        if (q != NULL && last == ':' && n >= LIT_MIN && k < max_lits) {
            j = lit_span(body + s, n);
        }
        uint8_t ph[32];
        const size_t pl = j == n && n >= LIT_MIN ? lit_placeholder(ph, k) : 0;
        if (pl > 0 && pl <= end - i) {
            memcpy(c + o, ph, pl);
            o += pl;
            l[2 * k] = s;
            l[2 * k + 1] = n;
            k++;
        } else {
            memcpy(c + o, body + i, end - i);
            o += end - i;
        }
        last = '"';
        i = end;
    }
    assert(o <= len && o <= cap);
    if (k == 0) {
        sodium_memzero(c, o);
        free(c);
        free(l);
        return KS_OK;
    }
    *copy = c;
    *copy_len = o;
    *lits = l;
    *n_lits = k;
    return KS_OK;
}

/* Read the validated tree root of verb into st->out. */
static ks_err read_root(req_read *st, ks_agent_verb verb, json_t *root, const ks_agent_limits *lim)
{
    ks_agent_request *out = st->out;
    if (!json_is_object(root)) {
        return refuse(st, KS_AGENT_R_NOT_OBJECT, NULL);
    }
    if (verb != KS_AGENT_SEAL_BATCH && verb != KS_AGENT_OPEN_BATCH) {
        out->records = calloc(1, sizeof *out->records);
        if (out->records == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        out->n = 1;
        return read_record(st, verb, root, &out->records[0]);
    }
    /* [AG-REQ-8] A batch: {"records": [record, ...]} and nothing else. */
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "records") != 0) {
            return refuse(st, KS_AGENT_R_UNKNOWN, NULL);
        }
    }
    json_t *recs = json_object_get(root, "records");
    if (recs == NULL) {
        return refuse(st, KS_AGENT_R_MISSING, "records");
    }
    if (!json_is_array(recs)) {
        return refuse(st, KS_AGENT_R_BAD_TYPE, "records");
    }
    const size_t n = json_array_size(recs);
    if (n == 0 || n > lim->max_batch) {
        return refuse(st, KS_AGENT_R_TOO_MANY, "records");
    }
    out->records = calloc(n, sizeof *out->records);
    if (out->records == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    out->n = n;
    const ks_agent_verb one = verb == KS_AGENT_SEAL_BATCH ? KS_AGENT_SEAL : KS_AGENT_OPEN;
    for (size_t i = 0; i < n; i++) {
        st->index = (long)i;
        ks_err e = read_record(st, one, json_array_get(recs, i), &out->records[i]);
        if (e != KS_OK) {
            return e;
        }
    }
    st->index = -1;
    return KS_OK;
}

/* What both readers do first: check the call (verb_ok: the reader takes
 * verb), empty *out, set up *st (its error report in *err, or in
 * *scratch), and bound the body before a byte is read [AG-REQ-2]. */
static ks_err read_begin(req_read *st, ks_agent_req_error *scratch, ks_agent_verb verb,
                         const uint8_t *body, size_t len, const ks_agent_limits *lim,
                         ks_agent_request *out, ks_agent_req_error *err, int verb_ok)
{
    ks_agent_req_error *e = err != NULL ? err : scratch;
    *e = (ks_agent_req_error){KS_AGENT_R_NONE, NULL, -1, -1};
    if (out == NULL || lim == NULL || (body == NULL && len != 0) || lim->max_batch == 0 || !verb_ok) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    out->verb = verb;
    *st = (req_read){out, 0, e, -1, body, NULL, 0};
    if (len > lim->max_body) {
        return refuse(st, KS_AGENT_R_TOO_LARGE, NULL);
    }
    return KS_OK;
}

/* ks_agent_request_read, with the long values taken from the body when
 * literals is nonzero (see the top of this file), through jansson when 0. */
static ks_err request_read(ks_agent_verb verb, const uint8_t *body, size_t len,
                           const ks_agent_limits *lim, ks_agent_request *out,
                           ks_agent_req_error *err, int literals)
{
    ks_agent_req_error scratch;
    req_read st;
    ks_err b = read_begin(&st, &scratch, verb, body, len, lim, out, err,
                          verb >= KS_AGENT_SEAL && verb <= KS_AGENT_PARSE);
    if (b != KS_OK) {
        return b;
    }
    /* Every string member is copied at most twice (a scope, split) plus
     * three NULs; decoded base64 is shorter than its text. */
    uint8_t *copy = NULL;
    size_t copy_len = 0;
    size_t *lits = NULL;
    if (literals && lit_prescan(body, len, &copy, &copy_len, &lits, &st.n_lits) != KS_OK) {
        return KS_ERR_NO_MEMORY;
    }
    st.lits = lits;
    json_error_t je;
    json_t *root = copy != NULL
                       ? json_loadb((const char *)copy, copy_len, JSON_REJECT_DUPLICATES, &je)
                       : json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je);
    if (copy != NULL) {
        sodium_memzero(copy, copy_len); /* its short members: a context, a tenant */
        free(copy);
    }
    if (root == NULL) {
        free(lits);
        return refuse(&st, json_error_code(&je) == json_error_duplicate_key ? KS_AGENT_R_DUPLICATE
                                                                             : KS_AGENT_R_BAD_JSON,
                      NULL);
    }
    out->arena_cap = 2 * len + 16;
    out->arena = malloc(out->arena_cap); /* wiped on free: plain malloc keeps a
                                             request's cost to one allocation */
    ks_err rc = out->arena == NULL ? KS_ERR_NO_MEMORY : read_root(&st, verb, root, lim);
    wipe_strings(root, 0);
    json_decref(root);
    free(lits);
    if (rc != KS_OK) {
        ks_agent_request_free(out);
        out->verb = verb;
    } else {
        out->arena_cap = st.used; /* all that was written, and so all the free wipes */
    }
    return rc;
}

/* See request.h. */
ks_err ks_agent_request_read(ks_agent_verb verb, const uint8_t *body, size_t len,
                             const ks_agent_limits *lim, ks_agent_request *out,
                             ks_agent_req_error *err)
{
    return request_read(verb, body, len, lim, out, err, 1);
}

/* ---- the batch frame [AG-BIN-1..3] ------------------------------------------------ */

/* [AG-BIN-3] A framing fault at body offset at: bad-frame. */
static ks_err refuse_frame(req_read *st, size_t at)
{
    ks_err e = refuse(st, KS_AGENT_R_BAD_FRAME, NULL);
    st->err->offset = (long)at;
    return e;
}

/* [AG-BIN-2] A u32, big-endian. */
static ks_err frame_u32(ks_cursor *c, uint32_t *v)
{
    ks_bytes b = {NULL, 0};
    if (ks_cursor_read_view(c, 4, &b) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    *v = (uint32_t)b.ptr[0] << 24 | (uint32_t)b.ptr[1] << 16 | (uint32_t)b.ptr[2] << 8 | b.ptr[3];
    return KS_OK;
}

/* [AG-BIN-2..3] A field: its u32 length, then that many bytes; a length
 * the body does not hold is bad-frame at the length's offset. */
static ks_err frame_field(req_read *st, ks_cursor *c, ks_bytes *out)
{
    const size_t at = ks_cursor_offset(c);
    uint32_t n = 0;
    if (frame_u32(c, &n) != KS_OK || ks_cursor_read_view(c, n, out) != KS_OK) {
        return refuse_frame(st, at);
    }
    return KS_OK;
}

/* The fields of a frame's record, in their order [AG-BIN-2]. */
enum { F_SCOPE, F_TENANT, F_PURPOSE, F_CONTEXT, F_DATA, F_COUNT };

/* [AG-BIN-3] Check one record's fields f of a seal (seal nonzero) or an
 * open against [AG-REQ-4..7], in the order scope, tenant, purpose,
 * context; *tl is the scope's TABLE length. */
static ks_err frame_record_check(req_read *st, int seal, const ks_bytes f[F_COUNT], size_t *tl)
{
    *tl = scope_split((const char *)f[F_SCOPE].ptr, f[F_SCOPE].len);
    if (*tl == 0) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "scope");
    }
    if (f[F_TENANT].len == 0 && seal) {
        return refuse(st, KS_AGENT_R_MISSING, "tenant");
    }
    if (f[F_TENANT].len > 0 && !name_ok((const char *)f[F_TENANT].ptr, f[F_TENANT].len, KS_TENANT_MAX)) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "tenant");
    }
    if (f[F_PURPOSE].len > 0 &&
        !name_ok((const char *)f[F_PURPOSE].ptr, f[F_PURPOSE].len, KS_PURPOSE_MAX)) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "purpose");
    }
    if (f[F_CONTEXT].len > KS_CONTEXT_MAX) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "context");
    }
    return KS_OK;
}

/* One pass over the frame body[0, len): without out->records, check it
 * all and add the arena bytes the scopes need to *arena; with them, fill
 * them (the frame is known valid then). */
static ks_err frame_pass(req_read *st, int seal, const uint8_t *body, size_t len,
                         const ks_agent_limits *lim, size_t *arena)
{
    ks_agent_request *out = st->out;
    ks_cursor c = ks_cursor_init(body, len);
    ks_bytes magic = {NULL, 0};
    if (ks_cursor_read_view(&c, 4, &magic) != KS_OK ||
        memcmp(magic.ptr, KS_AGENT_FRAME_REQ_MAGIC, 4) != 0) {
        return refuse_frame(st, 0);
    }
    uint32_t n = 0;
    if (frame_u32(&c, &n) != KS_OK) {
        return refuse_frame(st, 4);
    }
    if (n == 0 || n > lim->max_batch) {
        return refuse(st, KS_AGENT_R_TOO_MANY, "records");
    }
    for (uint32_t i = 0; i < n; i++) {
        st->index = (long)i;
        ks_bytes f[F_COUNT];
        for (int k = 0; k < F_COUNT; k++) {
            ks_err e = frame_field(st, &c, &f[k]);
            if (e != KS_OK) {
                return e;
            }
        }
        size_t tl = 0;
        ks_err e = frame_record_check(st, seal, f, &tl);
        if (e != KS_OK) {
            return e;
        }
        if (out->records == NULL) {
            *arena += 2 * f[F_SCOPE].len + 3;
            continue;
        }
        ks_agent_record *r = &out->records[i];
        e = put_scope(st, (const char *)f[F_SCOPE].ptr, f[F_SCOPE].len, tl, r);
        if (e != KS_OK) {
            return e;
        }
        r->tenant = f[F_TENANT];
        r->purpose = f[F_PURPOSE];
        r->context = f[F_CONTEXT];
        r->data = f[F_DATA];
    }
    st->index = -1;
    /* [AG-BIN-3] Canonical: nothing after the last record. */
    if (!ks_cursor_is_empty(&c)) {
        return refuse_frame(st, ks_cursor_offset(&c));
    }
    out->n = n;
    return KS_OK;
}

/* See request.h. */
ks_err ks_agent_request_read_frame(ks_agent_verb verb, const uint8_t *body, size_t len,
                                   const ks_agent_limits *lim, ks_agent_request *out,
                                   ks_agent_req_error *err)
{
    ks_agent_req_error scratch;
    req_read st;
    ks_err b = read_begin(&st, &scratch, verb, body, len, lim, out, err,
                          verb == KS_AGENT_SEAL_BATCH || verb == KS_AGENT_OPEN_BATCH);
    if (b != KS_OK) {
        return b;
    }
    const int seal = verb == KS_AGENT_SEAL_BATCH;
    size_t arena = 0;
    ks_err rc = frame_pass(&st, seal, body, len, lim, &arena);
    if (rc != KS_OK) {
        out->n = 0;
        return rc;
    }
    /* Valid: now the records and the scopes' arena, then the same pass
     * fills them. */
    out->records = calloc(out->n, sizeof *out->records);
    out->arena_cap = arena;
    out->arena = malloc(arena);
    rc = out->records == NULL || out->arena == NULL ? KS_ERR_NO_MEMORY
                                                    : frame_pass(&st, seal, body, len, lim, &arena);
    if (rc != KS_OK) {
        ks_agent_request_free(out);
        out->verb = verb;
    }
    return rc;
}

/* See request.h. */
void ks_agent_request_free(ks_agent_request *r)
{
    if (r == NULL) {
        return;
    }
    if (r->arena != NULL) {
        sodium_memzero(r->arena, r->arena_cap);
        free(r->arena);
    }
    free(r->records);
    memset(r, 0, sizeof *r);
}
