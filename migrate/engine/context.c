/*
 * migrate/engine/context.c -- the context-template expander and the
 * small helpers the census, the migration and verify share.
 *
 * Context templates (docs/migration.md).  A template is at most
 * KS_CONTEXT_TEMPLATE_MAX bytes of literal text with placeholders:
 *   {id}     the row id;
 *   {name}   the value of context column `name` (any name but "id",
 *            which always means the row id, even if the table has a
 *            column so called);
 *   {{ }}    a literal "{" and "}".
 * A lone "{" or "}", an empty or unterminated name, a "{" inside a
 * name, or more than KS_ROWSTORE_MAX_CONTEXT_COLUMNS distinct names is
 * KS_ERR_INVALID_ARGUMENT, with the byte offset of the fault (the "{"
 * that opens the bad placeholder, or the lone "}") and what it is kept
 * in the compiled template for a message (ks_context_template_check).  The distinct column names, in order of first
 * appearance, are the store target's context columns
 * (ks_context_template_columns): row.context[k] is the k-th of them.
 * A template is compiled once per run; rendering is per row, into a stack
 * buffer of KS_CONTEXT_MAX bytes, with no allocation:
 *   INTEGER -> decimal ("-42"), TEXT -> its bytes, BLOB -> lowercase hex,
 *   NULL -> nothing.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "../alloc_hook.h"

/* Find name[0, len) among t's columns; its index or -1. */
static int find_column(const ks_context_tmpl *t, const uint8_t *name, size_t len)
{
    for (size_t i = 0; i < t->n_columns; i++) {
        if (strlen(t->columns[i]) == len && memcmp(t->columns[i], name, len) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Append literal byte c to t, extending the last literal part or opening
 * a new one. */
static void add_literal(ks_context_tmpl *t, size_t *lit_len, uint8_t c)
{
    assert(*lit_len < KS_CONTEXT_TEMPLATE_MAX);
    ks_tmpl_part *last = t->n_parts > 0 ? &t->parts[t->n_parts - 1] : NULL;
    if (last == NULL || last->kind != KS_TMPL_LITERAL) {
        assert(t->n_parts < KS_CONTEXT_TEMPLATE_MAX);
        last = &t->parts[t->n_parts++];
        *last = (ks_tmpl_part){KS_TMPL_LITERAL, 0, (uint16_t)*lit_len, 0};
    }
    t->literal[(*lit_len)++] = c;
    last->len++;
}

/* Record in t a fault at byte offset off of the template, described by
 * why (a static phrase); KS_ERR_INVALID_ARGUMENT. */
static ks_err fault(ks_context_tmpl *t, size_t off, const char *why)
{
    t->fault_off = off;
    t->fault = why;
    return KS_ERR_INVALID_ARGUMENT;
}

/* Add placeholder name[0, len) to t, registering a new column name in
 * names storage at *names_len; off is the offset of its "{". */
static ks_err add_placeholder(ks_context_tmpl *t, size_t *names_len, const uint8_t *name, size_t len,
                              size_t off)
{
    if (len == 0) {
        return fault(t, off, "an empty name \"{}\"");
    }
    assert(t->n_parts < KS_CONTEXT_TEMPLATE_MAX);
    if (len == 2 && memcmp(name, "id", 2) == 0) {
        t->parts[t->n_parts++] = (ks_tmpl_part){KS_TMPL_ID, 0, 0, 0};
        return KS_OK;
    }
    int col = find_column(t, name, len);
    if (col < 0) {
        if (t->n_columns == KS_ROWSTORE_MAX_CONTEXT_COLUMNS) {
            return fault(t, off, "one distinct column name too many");
        }
        if (memchr(name, 0, len) != NULL) {
            return fault(t, off, "a NUL byte in a name");
        }
        /* "{name}" takes len + 2 template bytes, the copy len + 1: it fits. */
        assert(*names_len + len + 1 <= sizeof t->names);
        memcpy(t->names + *names_len, name, len);
        t->names[*names_len + len] = '\0';
        t->columns[t->n_columns] = t->names + *names_len;
        *names_len += len + 1;
        col = (int)t->n_columns++;
    }
    t->parts[t->n_parts++] = (ks_tmpl_part){KS_TMPL_COLUMN, (uint8_t)col, 0, 0};
    return KS_OK;
}

/* See engine.h. */
ks_err ks_context_tmpl_compile(ks_bytes tmpl, ks_context_tmpl *out)
{
    if (out == NULL || (tmpl.ptr == NULL && tmpl.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    if (tmpl.len > KS_CONTEXT_TEMPLATE_MAX) {
        return fault(out, KS_CONTEXT_TEMPLATE_MAX, "a template longer than the most bytes");
    }
    size_t lit_len = 0, names_len = 0, i = 0;
    const uint8_t *s = tmpl.ptr;
    while (i < tmpl.len) {
        uint8_t c = s[i];
        if ((c == '{' || c == '}') && i + 1 < tmpl.len && s[i + 1] == c) {
            add_literal(out, &lit_len, c); /* "{{" or "}}" */
            i += 2;
        } else if (c == '}') {
            return fault(out, i, "a lone \"}\" (write \"}}\" for a literal brace)");
        } else if (c == '{') {
            size_t j = i + 1;
            while (j < tmpl.len && s[j] != '}' && s[j] != '{') {
                j++;
            }
            if (j == tmpl.len || s[j] != '}') { /* unterminated, or "{" in a name */
                return fault(out, i, "an unclosed \"{\" (write \"{{\" for a literal brace)");
            }
            ks_err err = add_placeholder(out, &names_len, s + i + 1, j - i - 1, i);
            if (err != KS_OK) {
                return err;
            }
            i = j + 1;
        } else {
            add_literal(out, &lit_len, c);
            i++;
        }
    }
    return KS_OK;
}

/* Append src[0, len) to buf[*pos, cap); KS_ERR_TOO_LARGE when it does not fit. */
static ks_err put(uint8_t *buf, size_t cap, size_t *pos, const void *src, size_t len)
{
    if (len > cap - *pos) {
        return KS_ERR_TOO_LARGE;
    }
    if (len != 0) {
        memcpy(buf + *pos, src, len);
    }
    *pos += len;
    return KS_OK;
}

/* Write i in decimal (a '-' first when negative) at the end of num[0, 24)
 * and return where it starts: what snprintf("%" PRId64) writes, without
 * its format parsing, once per row of a migration. */
static const char *decimal(int64_t i, char num[24])
{
    uint64_t u = i < 0 ? 0u - (uint64_t)i : (uint64_t)i; /* INT64_MIN too */
    char *p = num + 24;
    do {
        *--p = (char)('0' + u % 10u);
        u /= 10u;
    } while (u != 0);
    if (i < 0) {
        *--p = '-';
    }
    assert(p >= num);
    return p;
}

/* Append the rendering of value v (see the file comment). */
static ks_err put_value(uint8_t *buf, size_t cap, size_t *pos, const ks_value *v)
{
    static const char hex[] = "0123456789abcdef";
    char num[24];
    switch (v->type) {
    case KS_VALUE_NULL:
        return KS_OK;
    case KS_VALUE_INTEGER: {
        const char *d = decimal(v->integer, num);
        return put(buf, cap, pos, d, (size_t)(num + sizeof num - d));
    }
    case KS_VALUE_TEXT:
        return put(buf, cap, pos, v->bytes.ptr, v->bytes.len);
    case KS_VALUE_BLOB:
        if (v->bytes.len > (cap - *pos) / 2) {
            return KS_ERR_TOO_LARGE;
        }
        for (size_t i = 0; i < v->bytes.len; i++) {
            buf[(*pos)++] = (uint8_t)hex[v->bytes.ptr[i] >> 4];
            buf[(*pos)++] = (uint8_t)hex[v->bytes.ptr[i] & 15];
        }
        return KS_OK;
    }
    return KS_ERR_INVALID_ARGUMENT; /* not a ks_value_type */
}

/* See engine.h. */
ks_err ks_context_tmpl_render(const ks_context_tmpl *t, const ks_row *row, uint8_t *buf, size_t cap,
                              size_t *out_len)
{
    assert(t != NULL && row != NULL && buf != NULL && out_len != NULL);
    size_t pos = 0;
    ks_err err = KS_OK;
    for (size_t i = 0; i < t->n_parts && err == KS_OK; i++) {
        const ks_tmpl_part *p = &t->parts[i];
        if (p->kind == KS_TMPL_LITERAL) {
            err = put(buf, cap, &pos, t->literal + p->off, p->len);
        } else if (p->kind == KS_TMPL_ID) {
            err = put_value(buf, cap, &pos, &row->id);
        } else {
            assert(p->column < t->n_columns);
            err = put_value(buf, cap, &pos, &row->context[p->column]);
        }
    }
    *out_len = pos;
    return err;
}

/* Compile tmpl into a malloc'd template (large: not for the stack),
 * *err the outcome; NULL only when the allocation failed
 * (KS_ERR_NO_MEMORY).  For the public functions, which compile once per
 * call. */
static ks_context_tmpl *compile_new(ks_bytes tmpl, ks_err *err)
{
    ks_context_tmpl *t = malloc(sizeof *t);
    *err = t != NULL ? ks_context_tmpl_compile(tmpl, t) : KS_ERR_NO_MEMORY;
    return t;
}

/* Public: list the context columns a template references (migrate.h). */
ks_err ks_context_template_columns(ks_bytes tmpl,
                                   const char *names[KS_ROWSTORE_MAX_CONTEXT_COLUMNS],
                                   char storage[KS_CONTEXT_TEMPLATE_MAX], size_t *n)
{
    if (names == NULL || storage == NULL || n == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *n = 0;
    ks_err err;
    ks_context_tmpl *t = compile_new(tmpl, &err);
    if (err == KS_OK) {
        memcpy(storage, t->names, KS_CONTEXT_TEMPLATE_MAX);
        for (size_t i = 0; i < t->n_columns; i++) {
            names[i] = storage + (t->columns[i] - t->names);
        }
        *n = t->n_columns;
    }
    free(t);
    return err;
}

/* Public: where a template is malformed (migrate.h). */
ks_err ks_context_template_check(ks_bytes tmpl, size_t *offset, const char **why)
{
    if (offset == NULL || why == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *offset = 0;
    *why = NULL;
    ks_err err;
    ks_context_tmpl *t = compile_new(tmpl, &err);
    if (err != KS_OK && t != NULL) {
        *offset = t->fault_off;
        *why = t->fault != NULL ? t->fault : "a NULL template with a length";
    }
    free(t);
    return err;
}

/* See engine.h.  The rule of docs/migration.md, "Ids": an envelope's
 * context is authenticated, so the id it binds must be the one the row
 * keeps; SQLite's bare rowid is renumbered by VACUUM and by a
 * dump/restore once rows were deleted, and every envelope sealed under
 * the old number would then fail to open. */
ks_err ks_context_tmpl_check_store(const ks_context_tmpl *t, const ks_rowstore *store)
{
    if (store->id_stable) {
        return KS_OK;
    }
    for (size_t i = 0; i < t->n_parts; i++) {
        if (t->parts[i].kind == KS_TMPL_ID) {
            return KS_ERR_UNSTABLE_ID;
        }
    }
    return KS_OK;
}

/* Public: may a template's contexts be bound to a store's rows (migrate.h). */
ks_err ks_migrate_check_context(const ks_rowstore *store, ks_bytes tmpl)
{
    if (store == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err err;
    ks_context_tmpl *t = compile_new(tmpl, &err);
    if (err == KS_OK) {
        err = ks_context_tmpl_check_store(t, store);
    }
    free(t);
    return err;
}

/* See engine.h. */
int ks_engine_is_envelope(const ks_value *v)
{
    return (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB) && v->bytes.len >= 3 &&
           v->bytes.ptr[0] == KS_MAGIC_0 && v->bytes.ptr[1] == KS_MAGIC_1 &&
           v->bytes.ptr[2] == KS_MAGIC_2;
}

/* See keyshift/rowstore.h. */
const char *ks_value_encoding_name(int encoding)
{
    switch (encoding) {
    case KS_ENCODING_BINARY: return "binary";
    case KS_ENCODING_BASE64: return "base64";
    }
    return NULL;
}

/* See engine.h.  The text is bounded before any buffer is sized
 * [F-TEXT-3]: a text longer than the largest envelope's is too-large
 * without a byte of it decoded. */
int ks_engine_value_env(ks_value_encoding enc, const ks_value *v, uint8_t **buf, size_t *cap,
                        ks_bytes *env, ks_err *perr)
{
    *env = (ks_bytes){NULL, 0};
    *perr = KS_OK;
    if (enc == KS_ENCODING_BINARY) {
        if (!ks_engine_is_envelope(v)) {
            return 0;
        }
        *env = v->bytes;
        return 1;
    }
    assert(enc == KS_ENCODING_BASE64);
    if (ks_engine_is_envelope(v)) {
        *perr = KS_ERR_BAD_MAGIC; /* [F-TEXT-4] a binary envelope: never sealed again */
        return 1;
    }
    if ((v->type != KS_VALUE_TEXT && v->type != KS_VALUE_BLOB) ||
        !ks_envelope_text_is_candidate(v->bytes.ptr, v->bytes.len)) {
        return 0;
    }
    size_t len = v->bytes.len;
    size_t need = len > ks_envelope_text_len(ks_envelope_max_len(NULL))
                      ? 0
                      : ks_envelope_text_decoded_max(len);
    if (need > *cap) {
        uint8_t *p = realloc(*buf, need);
        if (p == NULL) {
            *perr = KS_ERR_NO_MEMORY;
            return 1;
        }
        *buf = p;
        *cap = need;
    }
    size_t n = 0;
    *perr = ks_envelope_text_decode(v->bytes.ptr, len, NULL, *buf, need, &n, NULL);
    assert(*perr == KS_OK || ks_err_is_rejection(*perr));
    if (*perr == KS_OK) {
        *env = (ks_bytes){*buf, n};
    }
    return 1;
}

/* See engine.h.  The text is written after the envelope, then moved
 * over it (the two may overlap: memmove). */
ks_err ks_engine_encode_value(ks_value_encoding enc, uint8_t **buf, size_t *cap, size_t off,
                              size_t *len)
{
    if (enc == KS_ENCODING_BINARY) {
        return KS_OK;
    }
    size_t tl = ks_envelope_text_len(*len);
    size_t need = off + *len + tl;
    if (tl == 0 || need < off) {
        return KS_ERR_TOO_LARGE;
    }
    if (need > *cap) {
        uint8_t *p = realloc(*buf, need);
        if (p == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        *buf = p;
        *cap = need;
    }
    size_t got = 0;
    ks_err err = ks_envelope_text_encode(*buf + off, *len, *buf + off + *len, tl, &got);
    if (err != KS_OK) {
        return err;
    }
    assert(got == tl);
    memmove(*buf + off, *buf + off + *len, tl);
    *len = tl;
    return KS_OK;
}

/* See engine.h.  Only the header is parsed: the key_id precedes the
 * ciphertext [F-ORDER-1]. */
int ks_engine_outside_key(const ks_migrate_params *params, int is_env, ks_err perr, ks_bytes env)
{
    if (params->from_key_id.len == 0) {
        return 0;
    }
    if (!is_env) {
        return 1;
    }
    ks_envelope e;
    if (perr != KS_OK || ks_envelope_parse_header(env.ptr, env.len, NULL, &e, NULL) != KS_OK) {
        return 0;
    }
    return e.key_id.len != params->from_key_id.len ||
           memcmp(e.key_id.ptr, params->from_key_id.ptr, e.key_id.len) != 0;
}

/* See engine.h.  The version byte follows the three magic bytes
 * [F-PREFIX-1]; anything but 2 gets no purpose, and ks_open parses the
 * whole envelope strictly anyway. */
ks_open_params ks_engine_open_params(const ks_migrate_params *p, ks_bytes env, ks_bytes context,
                                     ks_bytes tenant)
{
    int v2 = env.len > 3 && env.ptr[3] == KS_FORMAT_V2;
    return (ks_open_params){context, tenant, v2 ? p->purpose : (ks_bytes){NULL, 0}};
}

/* See engine.h. */
int ks_engine_name_ok(ks_bytes b)
{
    if (b.len == 0 || b.len > KS_TENANT_MAX || b.ptr == NULL) {
        return 0;
    }
    for (size_t i = 0; i < b.len; i++) {
        uint8_t c = b.ptr[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok) {
            return 0;
        }
    }
    return 1;
}

/* See engine.h. */
ks_err ks_engine_row_tenant(const ks_migrate_params *params, const ks_row *row, ks_bytes *out)
{
    if (params->tenant.len != 0) {
        if (row->tenant.type != KS_VALUE_NULL) {
            return KS_ERR_INVALID_ARGUMENT;
        }
        *out = params->tenant;
        return KS_OK;
    }
    if (row->tenant.type != KS_VALUE_TEXT && row->tenant.type != KS_VALUE_BLOB) {
        return KS_ERR_BAD_VALUE;
    }
    if (!ks_engine_name_ok(row->tenant.bytes)) {
        return KS_ERR_BAD_VALUE;
    }
    *out = row->tenant.bytes;
    return KS_OK;
}

/* See engine.h. */
ks_err ks_engine_value_copy(const ks_value *v, uint8_t **buf, size_t *cap, ks_value *out)
{
    *out = *v;
    if (v->type != KS_VALUE_TEXT && v->type != KS_VALUE_BLOB) {
        out->bytes = (ks_bytes){NULL, 0};
        return KS_OK;
    }
    if (v->bytes.len > *cap || *buf == NULL) {
        size_t want = v->bytes.len > 64 ? v->bytes.len : 64;
        uint8_t *p = realloc(*buf, want);
        if (p == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        *buf = p;
        *cap = want;
    }
    if (v->bytes.len != 0) {
        memcpy(*buf, v->bytes.ptr, v->bytes.len);
    }
    out->bytes = (ks_bytes){v->bytes.len ? *buf : NULL, v->bytes.len};
    return KS_OK;
}

/* Append key=value; to buf, percent-escaping every value byte outside
 * [A-Za-z0-9._:/@+={}-] (so ';' and '%' never appear unescaped). */
static ks_err put_field(char *buf, size_t cap, size_t *pos, const char *key, ks_bytes v)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t klen = strlen(key);
    if (klen + 2 > cap - *pos) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    memcpy(buf + *pos, key, klen);
    *pos += klen;
    buf[(*pos)++] = '=';
    for (size_t i = 0; i < v.len; i++) {
        uint8_t c = v.ptr[i];
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    strchr("._:/@+={}-", c) != NULL;
        if (cap - *pos < 4) {
            return KS_ERR_BUFFER_TOO_SMALL;
        }
        if (plain && c != 0) {
            buf[(*pos)++] = (char)c;
        } else {
            buf[(*pos)++] = '%';
            buf[(*pos)++] = hex[c >> 4];
            buf[(*pos)++] = hex[c & 15];
        }
    }
    if (cap - *pos < 2) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    buf[(*pos)++] = ';';
    buf[*pos] = '\0';
    return KS_OK;
}

/*
 * See engine.h.  The string is, e.g.
 *   mode=reencrypt;to=payments/kek;version=3;format=2;alg=xchacha20-poly1305;
 *   tenant=acme;purpose=cards;context=card:{id};
 * (with encoding=base64; last for a base64 column, docs/format.md section
 * 10) with the defaults applied (format 2, xchacha20-poly1305) and the target
 * version resolved, so two spellings of one migration give one string.
 * format and alg are omitted for rewrap (it keeps each envelope's own).
 * batch size, rate limits, failure rate and no_verify are not part of it:
 * changing them resumes the same migration.
 */
ks_err ks_migrate_canonical_params(const ks_migrate_params *p, uint32_t to_version, char *buf,
                                   size_t cap, size_t *out_len)
{
    const char *mode = ks_migrate_mode_name((int)p->mode);
    if (mode == NULL || cap == 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    char num[16];
    size_t pos = 0;
    buf[0] = '\0';
    ks_err err = put_field(buf, cap, &pos, "mode", (ks_bytes){(const uint8_t *)mode, strlen(mode)});
    if (err == KS_OK) {
        err = put_field(buf, cap, &pos, "to", p->to_key_id);
    }
    if (err == KS_OK && p->from_key_id.len != 0) { /* absent otherwise: older checkpoints match */
        err = put_field(buf, cap, &pos, "from", p->from_key_id);
    }
    if (err == KS_OK) {
        int n = snprintf(num, sizeof num, "%" PRIu32, to_version);
        err = put_field(buf, cap, &pos, "version", (ks_bytes){(const uint8_t *)num, (size_t)n});
    }
    if (err == KS_OK && p->mode != KS_MIGRATE_REWRAP) {
        int n = snprintf(num, sizeof num, "%u", p->to_format ? (unsigned)p->to_format : 2u);
        err = put_field(buf, cap, &pos, "format", (ks_bytes){(const uint8_t *)num, (size_t)n});
        const char *alg = ks_alg_name(p->algorithm ? p->algorithm : KS_ALG_XCHACHA20POLY1305);
        if (err == KS_OK) {
            err = alg == NULL ? KS_ERR_INVALID_ARGUMENT
                              : put_field(buf, cap, &pos, "alg",
                                          (ks_bytes){(const uint8_t *)alg, strlen(alg)});
        }
    }
    if (err == KS_OK) {
        err = put_field(buf, cap, &pos, "tenant", p->tenant);
    }
    if (err == KS_OK) {
        err = put_field(buf, cap, &pos, "purpose", p->purpose);
    }
    if (err == KS_OK) {
        err = put_field(buf, cap, &pos, "context", p->context_template);
    }
    if (err == KS_OK && p->encoding != KS_ENCODING_BINARY) { /* absent for binary: older
                                                                 checkpoints match */
        const char *enc = ks_value_encoding_name((int)p->encoding);
        err = enc == NULL ? KS_ERR_INVALID_ARGUMENT
                          : put_field(buf, cap, &pos, "encoding",
                                      (ks_bytes){(const uint8_t *)enc, strlen(enc)});
    }
    *out_len = pos;
    return err;
}
