/*
 * tests/vectors.c -- the strict ks-vector block loader (see vectors.h),
 * and the pieces it is built from, which tests/crypto_vectors.h reuses for
 * the ks-crypto-vector blocks (the fence scanner, hex, names, messages,
 * reading a file).
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

/* A vector being assembled from the lines of its block. */
typedef struct draft {
    size_t line;
    int have_name, have_expect, have_hex;
    const char *name;
    size_t name_len;
    ks_err code;
    size_t offset;
    ks_test_hex hex; /* the bytes; a byte may span two hex: lines */
} draft;

/* See vectors.h. */
int ks_test_fail(const ks_test_loader *ld, const char *msg, const char *detail, size_t detail_len)
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

/* See vectors.h. */
int ks_test_key_value(const ks_test_loader *ld, const char *block, const char *line, size_t n,
                      const char **key, size_t *key_len, const char **val, size_t *val_len)
{
    char msg[96];
    ks_test_trim(&line, &n);
    if (n == 0) {
        snprintf(msg, sizeof msg, "blank line in %s block", block);
        return ks_test_fail(ld, msg, NULL, 0);
    }
    const char *colon = memchr(line, ':', n);
    if (colon == NULL) {
        snprintf(msg, sizeof msg, "%s line is not 'key: value'", block);
        return ks_test_fail(ld, msg, line, n);
    }
    *key = line;
    *key_len = (size_t)(colon - line);
    *val = colon + 1;
    *val_len = n - *key_len - 1;
    ks_test_trim(key, key_len);
    ks_test_trim(val, val_len);
    return 0;
}

/* See vectors.h. */
int ks_test_is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* See vectors.h. */
void ks_test_trim(const char **p, size_t *n)
{
    while (*n > 0 && ks_test_is_blank(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n > 0 && ks_test_is_blank((*p)[*n - 1])) {
        (*n)--;
    }
}

/* See vectors.h. */
int ks_test_equals(const char *p, size_t n, const char *s)
{
    return strlen(s) == n && memcmp(p, s, n) == 0;
}

/* See vectors.h. */
ks_err ks_test_err_from_name(const char *name, size_t len)
{
    for (int code = 1; code < 32; code++) {
        if (ks_err_is_rejection((ks_err)code) &&
            ks_test_equals(name, len, ks_err_name((ks_err)code))) {
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
    ks_test_trim(info, info_len);
    return run;
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

/* See vectors.h. */
int ks_test_hex_add(const ks_test_loader *ld, ks_test_hex *h, const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ks_test_is_blank(v[i])) {
            continue;
        }
        int x = hex_digit(v[i]);
        if (x < 0) {
            return ks_test_fail(ld, "bad hex digit", v + i, 1);
        }
        if (!h->half) {
            h->nibble = (uint8_t)x;
            h->half = 1;
            continue;
        }
        if (h->len == h->cap) {
            size_t cap = h->cap == 0 ? 64 : h->cap * 2;
            uint8_t *q = realloc(h->bytes, cap);
            if (q == NULL) {
                return ks_test_fail(ld, "out of memory", NULL, 0);
            }
            h->bytes = q;
            h->cap = cap;
        }
        h->bytes[h->len++] = (uint8_t)(h->nibble << 4 | x);
        h->half = 0;
    }
    return 0;
}

/* See vectors.h. */
int ks_test_name_ok(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '-')) {
            return 0;
        }
    }
    return n > 0;
}

/* The line scanner: outside any fence, inside a wanted fence, or inside
 * some other fence. */
enum { OUTSIDE, IN_WANTED, IN_OTHER };

/* See vectors.h. */
int ks_test_scan_blocks(const char *text, size_t len, ks_test_loader *ld,
                        const ks_test_block_ops *ops, void *arg)
{
    int state = OUTSIDE;
    char open_ch = 0;
    size_t open_run = 0, open_line = 0;
    int rc = 0;
    size_t pos = 0;
    while (rc == 0 && pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        const char *line = text + pos;
        size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;
        pos += n + (nl != NULL);
        ld->line++;

        char ch = 0;
        const char *info = NULL;
        size_t info_len = 0;
        size_t run = fence(line, n, &ch, &info, &info_len);
        if (state == OUTSIDE) {
            if (run > 0) {
                state = ks_test_equals(info, info_len, ops->info) ? IN_WANTED : IN_OTHER;
                open_ch = ch;
                open_run = run;
                open_line = ld->line;
                if (state == IN_WANTED) {
                    rc = ops->open(arg, ld);
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
        /* IN_WANTED */
        if (closes) {
            state = OUTSIDE;
            rc = ops->close(arg, ld);
        } else {
            rc = ops->line(arg, ld, line, n);
        }
    }
    if (rc == 0 && state != OUTSIDE) {
        char msg[96];
        snprintf(msg, sizeof msg, "unterminated %s block", ops->info);
        ld->line = open_line;
        rc = ks_test_fail(ld,
                          state == IN_WANTED ? msg
                                             : "unterminated fenced block (could hide vectors)",
                          NULL, 0);
    }
    return rc;
}

/* See vectors.h. */
const char *ks_test_read_file(const char *path, char **text_out, size_t *len_out)
{
    *text_out = NULL;
    *len_out = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return "cannot open file";
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    const char *why = NULL;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap == 0 ? 65536 : cap * 2;
            char *p = realloc(text, ncap);
            if (p == NULL) {
                why = "out of memory";
                break;
            }
            text = p;
            cap = ncap;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                why = "read error";
            }
            break;
        }
    }
    fclose(f);
    if (why != NULL) {
        free(text);
        return why;
    }
    *text_out = text;
    *len_out = len;
    return NULL;
}

/* Parse an expect: value, "ok" or "<error-name> at <decimal offset>". */
static int parse_expect(const ks_test_loader *ld, draft *d, const char *v, size_t n)
{
    if (ks_test_equals(v, n, "ok")) {
        d->code = KS_OK;
        d->offset = 0;
        return 0;
    }
    /* Split into exactly three blank-separated tokens. */
    const char *tok[3];
    size_t tlen[3];
    size_t ntok = 0, i = 0;
    while (i < n) {
        while (i < n && ks_test_is_blank(v[i])) {
            i++;
        }
        if (i == n) {
            break;
        }
        size_t start = i;
        while (i < n && !ks_test_is_blank(v[i])) {
            i++;
        }
        if (ntok == 3) {
            return ks_test_fail(ld, "expect: want 'ok' or '<error-name> at <offset>'", v, n);
        }
        tok[ntok] = v + start;
        tlen[ntok] = i - start;
        ntok++;
    }
    if (ntok != 3 || !ks_test_equals(tok[1], tlen[1], "at")) {
        return ks_test_fail(ld, "expect: want 'ok' or '<error-name> at <offset>'", v, n);
    }
    d->code = ks_test_err_from_name(tok[0], tlen[0]);
    if (d->code == KS_OK) {
        return ks_test_fail(ld, "expect: unknown error name", tok[0], tlen[0]);
    }
    size_t off = 0;
    for (size_t k = 0; k < tlen[2]; k++) {
        char c = tok[2][k];
        if (c < '0' || c > '9') {
            return ks_test_fail(ld, "expect: offset is not a decimal number", tok[2], tlen[2]);
        }
        if (off > (SIZE_MAX - (size_t)(c - '0')) / 10) {
            return ks_test_fail(ld, "expect: offset overflows", tok[2], tlen[2]);
        }
        off = off * 10 + (size_t)(c - '0');
    }
    d->offset = off;
    return 0;
}

/* Handle one line inside a ks-vector block: name:, expect: or hex:, and
 * nothing else, not even a blank line (docs/format.md A.1). */
static int vector_line(const ks_test_loader *ld, draft *d, const char *line, size_t n)
{
    const char *key, *val;
    size_t key_len, val_len;
    if (ks_test_key_value(ld, "ks-vector", line, n, &key, &key_len, &val, &val_len) != 0) {
        return -1;
    }

    if (ks_test_equals(key, key_len, "name")) {
        if (d->have_name) {
            return ks_test_fail(ld, "repeated name:", NULL, 0);
        }
        if (!ks_test_name_ok(val, val_len)) { /* docs/format.md A.1 */
            return ks_test_fail(ld, "name: want a non-empty [a-z0-9-] name", val, val_len);
        }
        d->name = val;
        d->name_len = val_len;
        d->have_name = 1;
        return 0;
    }
    if (ks_test_equals(key, key_len, "expect")) {
        if (d->have_expect) {
            return ks_test_fail(ld, "repeated expect:", NULL, 0);
        }
        d->have_expect = 1;
        return parse_expect(ld, d, val, val_len);
    }
    if (ks_test_equals(key, key_len, "hex")) {
        d->have_hex = 1;
        return ks_test_hex_add(ld, &d->hex, val, val_len);
    }
    return ks_test_fail(ld, "unknown key in ks-vector block", key, key_len);
}

/* Check a finished draft and append it to *out. */
static int vector_finish(const ks_test_loader *ld, draft *d, ks_test_vectors *out)
{
    if (!d->have_name) {
        return ks_test_fail(ld, "ks-vector block without name:", NULL, 0);
    }
    if (!d->have_expect) {
        return ks_test_fail(ld, "ks-vector block without expect:", d->name, d->name_len);
    }
    if (!d->have_hex) {
        return ks_test_fail(ld, "ks-vector block without hex:", d->name, d->name_len);
    }
    if (d->hex.half) {
        return ks_test_fail(ld, "odd number of hex digits", d->name, d->name_len);
    }
    for (size_t i = 0; i < out->count; i++) {
        if (ks_test_equals(d->name, d->name_len, out->v[i].name)) {
            return ks_test_fail(ld, "duplicate vector name", d->name, d->name_len);
        }
    }
    ks_test_vector *grown = realloc(out->v, (out->count + 1) * sizeof *grown);
    if (grown == NULL) {
        return ks_test_fail(ld, "out of memory", NULL, 0);
    }
    out->v = grown;
    ks_test_vector *v = &out->v[out->count];
    memset(v, 0, sizeof *v);
    v->name = malloc(d->name_len + 1);
    if (d->hex.len > 0) {
        v->bytes = malloc(d->hex.len);
    }
    if (v->name == NULL || (d->hex.len > 0 && v->bytes == NULL)) {
        free(v->name);
        free(v->bytes);
        return ks_test_fail(ld, "out of memory", NULL, 0);
    }
    memcpy(v->name, d->name, d->name_len);
    v->name[d->name_len] = '\0';
    if (d->hex.len > 0) {
        memcpy(v->bytes, d->hex.bytes, d->hex.len);
    }
    v->len = d->hex.len;
    v->expect_code = d->code;
    v->expect_offset = d->offset;
    v->line = d->line;
    out->count++;
    return 0;
}

/* ks_test_scan_blocks() callbacks: the draft of the block at hand, and
 * where finished vectors go. */
typedef struct scan {
    draft d;
    ks_test_vectors *out;
} scan;

static int block_open(void *arg, const ks_test_loader *ld)
{
    scan *s = arg;
    free(s->d.hex.bytes);
    memset(&s->d, 0, sizeof s->d);
    s->d.line = ld->line;
    return 0;
}

static int block_line(void *arg, const ks_test_loader *ld, const char *line, size_t n)
{
    return vector_line(ld, &((scan *)arg)->d, line, n);
}

static int block_close(void *arg, const ks_test_loader *ld)
{
    scan *s = arg;
    int rc = vector_finish(ld, &s->d, s->out);
    free(s->d.hex.bytes);
    memset(&s->d, 0, sizeof s->d);
    return rc;
}

/* See vectors.h. */
int ks_test_vectors_parse(const char *text, size_t len, const char *origin, ks_test_vectors *out,
                          char *errbuf, size_t errlen)
{
    static const ks_test_block_ops ops = {"ks-vector", block_open, block_line, block_close};
    ks_test_loader ld = {origin != NULL ? origin : "<text>", 0, errbuf, errlen};
    scan s;
    memset(&s, 0, sizeof s);
    s.out = out;
    out->v = NULL;
    out->count = 0;
    if (errbuf != NULL && errlen > 0) {
        errbuf[0] = '\0';
    }
    if (text == NULL && len != 0) {
        return ks_test_fail(&ld, "no text", NULL, 0);
    }
    int rc = ks_test_scan_blocks(text, len, &ld, &ops, &s);
    free(s.d.hex.bytes);
    if (rc != 0) {
        ks_test_vectors_free(out);
    }
    return rc;
}

/* See vectors.h. */
int ks_test_vectors_load(const char *path, ks_test_vectors *out, char *errbuf, size_t errlen)
{
    ks_test_loader ld = {path != NULL ? path : "(null)", 0, errbuf, errlen};
    out->v = NULL;
    out->count = 0;
    if (path == NULL) {
        return ks_test_fail(&ld, "no path given", NULL, 0);
    }
    char *text = NULL;
    size_t len = 0;
    const char *why = ks_test_read_file(path, &text, &len);
    if (why != NULL) {
        return ks_test_fail(&ld, why, NULL, 0);
    }
    int rc = ks_test_vectors_parse(text, len, path, out, errbuf, errlen);
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
