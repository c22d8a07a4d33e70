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
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "request.h"

#include "../../format/rules.h"

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
} req_read;

/* Record a refusal and return KS_ERR_BAD_VALUE. */
static ks_err refuse(req_read *st, ks_agent_reason reason, const char *member)
{
    st->err->reason = reason;
    st->err->member = member;
    st->err->index = st->index;
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
 * bytes of printable ASCII other than '.', exactly one '.'. */
static ks_err read_scope(req_read *st, const char *s, size_t n, ks_agent_record *r)
{
    const char *dot = memchr(s, '.', n);
    if (dot == NULL || dot == s || dot == s + n - 1 || memchr(dot + 1, '.', n - (size_t)(dot - s) - 1)) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "scope");
    }
    const size_t tl = (size_t)(dot - s), cl = n - tl - 1;
    if (tl > KS_ROLLOUT_IDENT_MAX || cl > KS_ROLLOUT_IDENT_MAX) {
        return refuse(st, KS_AGENT_R_BAD_VALUE, "scope");
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7E) {
            return refuse(st, KS_AGENT_R_BAD_VALUE, "scope");
        }
    }
    r->scope = arena_str(st, s, n);
    r->table = arena_str(st, s, tl);
    r->column = arena_str(st, dot + 1, cl);
    return r->scope && r->table && r->column ? KS_OK : KS_ERR_NO_MEMORY;
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
        const size_t n = json_string_length(v[m]);
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

/* See request.h. */
ks_err ks_agent_request_read(ks_agent_verb verb, const uint8_t *body, size_t len,
                             const ks_agent_limits *lim, ks_agent_request *out,
                             ks_agent_req_error *err)
{
    ks_agent_req_error scratch;
    ks_agent_req_error *e = err != NULL ? err : &scratch;
    *e = (ks_agent_req_error){KS_AGENT_R_NONE, NULL, -1};
    if (out == NULL || lim == NULL || (body == NULL && len != 0) || lim->max_batch == 0 ||
        verb < KS_AGENT_SEAL || verb > KS_AGENT_PARSE) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    out->verb = verb;
    req_read st = {out, 0, e, -1};
    /* [AG-REQ-2] Bounded before a byte is parsed. */
    if (len > lim->max_body) {
        return refuse(&st, KS_AGENT_R_TOO_LARGE, NULL);
    }
    /* Every string member is copied at most twice (a scope, split) plus
     * three NULs; decoded base64 is shorter than its text. */
    json_error_t je;
    json_t *root = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
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
