/*
 * tests/vectors.c -- the strict ks-vector block loader (see vectors.h).
 *
 * The markdown is scanned line by line for CommonMark fenced code blocks
 * (``` or ~~~, at most three spaces of indentation).  Blocks whose info
 * string is exactly "ks-vector" are parsed as vectors; every other fenced
 * block is skipped whole, so that an example inside one is never taken for
 * a vector.  All text is handled as (pointer, length) pairs: the input need
 * not be NUL-terminated and may contain any byte.
 */
#include "vectors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the parser is, for error messages. */
typedef struct loader {
    const char *origin;
    size_t line;
    char *errbuf;
    size_t errlen;
} loader;

/* A vector being assembled from the lines of its block. */
typedef struct draft {
    size_t line;
    int have_name, have_expect, have_hex;
    const char *name;
    size_t name_len;
    ks_err code;
    size_t offset;
    uint8_t *bytes; /* growable */
    size_t len, cap;
    int half;       /* nonzero when a high nibble is pending */
    uint8_t nibble;
} draft;

/* Write "origin:line: msg" (and 'detail' when given) to the error buffer;
 * always returns -1 so callers can `return fail(...)`. */
static int fail(const loader *ld, const char *msg, const char *detail, size_t detail_len)
{
    if (ld->errbuf != NULL && ld->errlen > 0) {
        if (detail != NULL) {
            int n = detail_len > 80 ? 80 : (int)detail_len;
            snprintf(ld->errbuf, ld->errlen, "%s:%zu: %s: '%.*s'", ld->origin, ld->line, msg, n,
                     detail);
        } else {
            snprintf(ld->errbuf, ld->errlen, "%s:%zu: %s", ld->origin, ld->line, msg);
        }
    }
    return -1;
}

/* Nonzero for the blanks allowed around tokens: space, tab, CR. */
static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Strip blanks from both ends of p[0, *n): advance *p, shrink *n. */
static void trim(const char **p, size_t *n)
{
    while (*n > 0 && is_blank(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n > 0 && is_blank((*p)[*n - 1])) {
        (*n)--;
    }
}

/* Nonzero when p[0, n) equals the NUL-terminated string s. */
static int equals(const char *p, size_t n, const char *s)
{
    return strlen(s) == n && memcmp(p, s, n) == 0;
}

/* See vectors.h. */
ks_err ks_test_err_from_name(const char *name, size_t len)
{
    for (int code = 1; code < 32; code++) {
        if (ks_err_is_rejection((ks_err)code) && equals(name, len, ks_err_name((ks_err)code))) {
            return (ks_err)code;
        }
    }
    return KS_OK;
}

/*
 * If line[0, n) opens or closes a fence, return the fence length (>= 3) and
 * set *ch to '`' or '~' and *info to the trimmed rest of the line;
 * otherwise return 0.
 */
static size_t fence(const char *line, size_t n, char *ch, const char **info, size_t *info_len)
{
    size_t i = 0;
    while (i < n && i < 3 && line[i] == ' ') {
        i++;
    }
    if (i >= n || (line[i] != '`' && line[i] != '~')) {
        return 0;
    }
    const char c = line[i];
    size_t run = 0;
    while (i + run < n && line[i + run] == c) {
        run++;
    }
    if (run < 3) {
        return 0;
    }
    *ch = c;
    *info = line + i + run;
    *info_len = n - i - run;
    trim(info, info_len);
    return run;
}

/* Append one byte to the draft's value. */
static int draft_push(const loader *ld, draft *d, uint8_t b)
{
    if (d->len == d->cap) {
        size_t cap = d->cap == 0 ? 64 : d->cap * 2;
        uint8_t *p = realloc(d->bytes, cap);
        if (p == NULL) {
            return fail(ld, "out of memory", NULL, 0);
        }
        d->bytes = p;
        d->cap = cap;
    }
    d->bytes[d->len++] = b;
    return 0;
}

/* Value of a hex digit, or -1. */
static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* Add the digits of one hex: value to the draft; whitespace is ignored and
 * a byte may span two lines. */
static int parse_hex(const loader *ld, draft *d, const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (is_blank(v[i])) {
            continue;
        }
        int x = hex_digit(v[i]);
        if (x < 0) {
            return fail(ld, "bad hex digit", v + i, 1);
        }
        if (d->half) {
            if (draft_push(ld, d, (uint8_t)(d->nibble << 4 | x)) != 0) {
                return -1;
            }
            d->half = 0;
        } else {
            d->nibble = (uint8_t)x;
            d->half = 1;
        }
    }
    d->have_hex = 1;
    return 0;
}

/* Parse an expect: value, "ok" or "<error-name> at <decimal offset>". */
static int parse_expect(const loader *ld, draft *d, const char *v, size_t n)
{
    if (equals(v, n, "ok")) {
        d->code = KS_OK;
        d->offset = 0;
        return 0;
    }
    /* Split into exactly three blank-separated tokens. */
    const char *tok[3];
    size_t tlen[3];
    size_t ntok = 0, i = 0;
    while (i < n) {
        while (i < n && is_blank(v[i])) {
            i++;
        }
        if (i == n) {
            break;
        }
        size_t start = i;
        while (i < n && !is_blank(v[i])) {
            i++;
        }
        if (ntok == 3) {
            return fail(ld, "expect: want 'ok' or '<error-name> at <offset>'", v, n);
        }
        tok[ntok] = v + start;
        tlen[ntok] = i - start;
        ntok++;
    }
    if (ntok != 3 || !equals(tok[1], tlen[1], "at")) {
        return fail(ld, "expect: want 'ok' or '<error-name> at <offset>'", v, n);
    }
    d->code = ks_test_err_from_name(tok[0], tlen[0]);
    if (d->code == KS_OK) {
        return fail(ld, "expect: unknown error name", tok[0], tlen[0]);
    }
    size_t off = 0;
    for (size_t k = 0; k < tlen[2]; k++) {
        char c = tok[2][k];
        if (c < '0' || c > '9') {
            return fail(ld, "expect: offset is not a decimal number", tok[2], tlen[2]);
        }
        if (off > (SIZE_MAX - (size_t)(c - '0')) / 10) {
            return fail(ld, "expect: offset overflows", tok[2], tlen[2]);
        }
        off = off * 10 + (size_t)(c - '0');
    }
    d->offset = off;
    return 0;
}

/* Nonzero when a vector name is acceptable: non-empty [a-z0-9-]
 * (docs/format.md A.1). */
static int name_ok(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '-')) {
            return 0;
        }
    }
    return n > 0;
}

/* Handle one line inside a ks-vector block: name:, expect: or hex:, and
 * nothing else, not even a blank line (docs/format.md A.1). */
static int vector_line(const loader *ld, draft *d, const char *line, size_t n)
{
    trim(&line, &n);
    if (n == 0) {
        return fail(ld, "blank line in ks-vector block", NULL, 0);
    }
    const char *colon = memchr(line, ':', n);
    if (colon == NULL) {
        return fail(ld, "ks-vector line is not 'key: value'", line, n);
    }
    const char *key = line;
    size_t key_len = (size_t)(colon - line);
    const char *val = colon + 1;
    size_t val_len = n - key_len - 1;
    trim(&key, &key_len);
    trim(&val, &val_len);

    if (equals(key, key_len, "name")) {
        if (d->have_name) {
            return fail(ld, "repeated name:", NULL, 0);
        }
        if (!name_ok(val, val_len)) {
            return fail(ld, "name: want a non-empty [a-z0-9-] name", val, val_len);
        }
        d->name = val;
        d->name_len = val_len;
        d->have_name = 1;
        return 0;
    }
    if (equals(key, key_len, "expect")) {
        if (d->have_expect) {
            return fail(ld, "repeated expect:", NULL, 0);
        }
        d->have_expect = 1;
        return parse_expect(ld, d, val, val_len);
    }
    if (equals(key, key_len, "hex")) {
        return parse_hex(ld, d, val, val_len);
    }
    return fail(ld, "unknown key in ks-vector block", key, key_len);
}

/* Check a finished draft and append it to *out. */
static int vector_finish(const loader *ld, draft *d, ks_test_vectors *out)
{
    if (!d->have_name) {
        return fail(ld, "ks-vector block without name:", NULL, 0);
    }
    if (!d->have_expect) {
        return fail(ld, "ks-vector block without expect:", d->name, d->name_len);
    }
    if (!d->have_hex) {
        return fail(ld, "ks-vector block without hex:", d->name, d->name_len);
    }
    if (d->half) {
        return fail(ld, "odd number of hex digits", d->name, d->name_len);
    }
    for (size_t i = 0; i < out->count; i++) {
        if (equals(d->name, d->name_len, out->v[i].name)) {
            return fail(ld, "duplicate vector name", d->name, d->name_len);
        }
    }
    ks_test_vector *grown = realloc(out->v, (out->count + 1) * sizeof *grown);
    if (grown == NULL) {
        return fail(ld, "out of memory", NULL, 0);
    }
    out->v = grown;
    ks_test_vector *v = &out->v[out->count];
    memset(v, 0, sizeof *v);
    v->name = malloc(d->name_len + 1);
    if (d->len > 0) {
        v->bytes = malloc(d->len);
    }
    if (v->name == NULL || (d->len > 0 && v->bytes == NULL)) {
        free(v->name);
        free(v->bytes);
        return fail(ld, "out of memory", NULL, 0);
    }
    memcpy(v->name, d->name, d->name_len);
    v->name[d->name_len] = '\0';
    if (d->len > 0) {
        memcpy(v->bytes, d->bytes, d->len);
    }
    v->len = d->len;
    v->expect_code = d->code;
    v->expect_offset = d->offset;
    v->line = d->line;
    out->count++;
    return 0;
}

/* The line scanner: outside any fence, inside a ks-vector fence, or inside
 * some other fence. */
enum { OUTSIDE, IN_VECTOR, IN_OTHER };

/* See vectors.h. */
int ks_test_vectors_parse(const char *text, size_t len, const char *origin, ks_test_vectors *out,
                          char *errbuf, size_t errlen)
{
    loader ld = {origin != NULL ? origin : "<text>", 0, errbuf, errlen};
    draft d;
    int state = OUTSIDE;
    char open_ch = 0;
    size_t open_run = 0, open_line = 0;
    int rc = 0;

    memset(&d, 0, sizeof d);
    out->v = NULL;
    out->count = 0;
    if (errbuf != NULL && errlen > 0) {
        errbuf[0] = '\0';
    }
    if (text == NULL && len != 0) {
        return fail(&ld, "no text", NULL, 0);
    }

    size_t pos = 0;
    while (rc == 0 && pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        const char *line = text + pos;
        size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;
        pos += n + (nl != NULL);
        ld.line++;

        char ch = 0;
        const char *info = NULL;
        size_t info_len = 0;
        size_t run = fence(line, n, &ch, &info, &info_len);
        if (state == OUTSIDE) {
            if (run > 0) {
                state = equals(info, info_len, "ks-vector") ? IN_VECTOR : IN_OTHER;
                open_ch = ch;
                open_run = run;
                open_line = ld.line;
                if (state == IN_VECTOR) {
                    memset(&d, 0, sizeof d);
                    d.line = ld.line;
                }
            }
            continue;
        }
        const int closes = run >= open_run && ch == open_ch && info_len == 0;
        if (state == IN_OTHER) {
            if (closes) {
                state = OUTSIDE;
            }
            continue;
        }
        /* IN_VECTOR */
        if (closes) {
            rc = vector_finish(&ld, &d, out);
            free(d.bytes);
            memset(&d, 0, sizeof d);
            state = OUTSIDE;
        } else {
            rc = vector_line(&ld, &d, line, n);
        }
    }
    if (rc == 0 && state != OUTSIDE) {
        ld.line = open_line;
        rc = fail(&ld, state == IN_VECTOR ? "unterminated ks-vector block"
                                          : "unterminated fenced block (could hide vectors)",
                  NULL, 0);
    }
    free(d.bytes);
    if (rc != 0) {
        ks_test_vectors_free(out);
    }
    return rc;
}

/* See vectors.h. */
int ks_test_vectors_load(const char *path, ks_test_vectors *out, char *errbuf, size_t errlen)
{
    loader ld = {path != NULL ? path : "(null)", 0, errbuf, errlen};
    out->v = NULL;
    out->count = 0;
    if (path == NULL) {
        return fail(&ld, "no path given", NULL, 0);
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return fail(&ld, "cannot open file", NULL, 0);
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap == 0 ? 65536 : cap * 2;
            char *p = realloc(text, ncap);
            if (p == NULL) {
                rc = fail(&ld, "out of memory", NULL, 0);
                break;
            }
            text = p;
            cap = ncap;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                rc = fail(&ld, "read error", NULL, 0);
            }
            break;
        }
    }
    fclose(f);
    if (rc == 0) {
        rc = ks_test_vectors_parse(text, len, path, out, errbuf, errlen);
    }
    free(text);
    return rc;
}

/* See vectors.h. */
void ks_test_vectors_free(ks_test_vectors *vs)
{
    if (vs == NULL) {
        return;
    }
    for (size_t i = 0; i < vs->count; i++) {
        free(vs->v[i].name);
        free(vs->v[i].bytes);
    }
    free(vs->v);
    vs->v = NULL;
    vs->count = 0;
}
