/*
 * tests/test_files.h -- what the file-based unit tests share
 * (tests/test_keyring.c, tests/test_registry.c): a per-test directory
 * under /tmp, reading and writing whole files, the path of a document
 * beside $KS_SPEC, the documents' vector blocks (finding them, reading
 * their `key: value` lines, their hex values), and a growing text buffer
 * for their results.
 *
 * Include after <cmocka.h>.  Everything is static inline (no warning when
 * a test does not need a helper).
 */
#ifndef KS_TESTS_TEST_FILES_H
#define KS_TESTS_TEST_FILES_H

#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A test's directory and one file path in it. */
typedef struct fixture {
    char dir[64];
    char path[128]; /* dir/<file> */
} fixture;

/* Make a directory /tmp/ks-<tag>-test-XXXXXX and a fixture for it whose
 * path is dir/<file>; for a cmocka setup function. */
static inline int tf_setup(void **state, const char *tag, const char *file)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/ks-%s-test-XXXXXX", tag);
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, file);
    *state = f;
    return 0;
}

/* Remove the directory and what the test left in it (no subdirectories
 * except those a test made itself and removed), and free the fixture. */
static inline int tf_teardown(void **state)
{
    fixture *f = *state;
    DIR *d = opendir(f->dir);
    if (d != NULL) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
                if (unlinkat(dirfd(d), de->d_name, 0) != 0) {
                    (void)unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR);
                }
            }
        }
        closedir(d);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

/* Read a whole file into a malloc'd buffer, NUL-terminated after its
 * *len bytes. */
static inline uint8_t *tf_slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    assert_true(n >= 0);
    rewind(fp);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

/* Write buf[0, n) to path with the given mode (replacing the file). */
static inline void tf_spit(const char *path, const void *buf, size_t n, mode_t mode)
{
    (void)unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    close(fd);
}

/* The path of docs/<name> into out: beside $KS_SPEC (docs/format.md) if
 * it is set, else under docs/. */
static inline void tf_spec_path(const char *name, char *out, size_t cap)
{
    const char *spec = getenv("KS_SPEC");
    const char *slash = spec != NULL ? strrchr(spec, '/') : NULL;
    if (slash == NULL) {
        snprintf(out, cap, "docs/%s", name);
    } else {
        snprintf(out, cap, "%.*s/%s", (int)(slash - spec), spec, name);
    }
}

/* Append the hex digits of s[0, n) (spaces ignored, either case) to the
 * malloc'd *buf of *len bytes; -1 unless they are whole bytes of hex
 * digits. */
static inline int tf_append_hex(const char *s, size_t n, uint8_t **buf, size_t *len)
{
    int hi = -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            continue;
        }
        const char *digits = "0123456789abcdef0123456789ABCDEF";
        const char *d = s[i] != '\0' ? strchr(digits, s[i]) : NULL;
        if (d == NULL) {
            return -1;
        }
        const int v = (int)((d - digits) & 15);
        if (hi < 0) {
            hi = v;
            continue;
        }
        uint8_t *grown = realloc(*buf, *len + 1);
        assert_non_null(grown);
        *buf = grown;
        (*buf)[(*len)++] = (uint8_t)(hi << 4 | v);
        hi = -1;
    }
    return hi < 0 ? 0 : -1;
}

/* A growing text buffer (malloc'd). */
typedef struct tf_text {
    char *s;
    size_t len, cap;
} tf_text;

/* Append p[0, n) to t, keeping t NUL-terminated. */
static inline void add_bytes(tf_text *t, const void *p, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->s = realloc(t->s, t->cap);
        assert_non_null(t->s);
    }
    memcpy(t->s + t->len, p, n);
    t->len += n;
    t->s[t->len] = '\0';
}

/* Append printf-formatted text to t (at most 2047 bytes at once). */
static inline void addf(tf_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void addf(tf_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[2048];
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof tmp);
    add_bytes(t, tmp, (size_t)n);
}

/*
 * The strictness check of a vector loader: `accepts` (a loader run over a
 * whole document, nonzero when it loads every block) takes `good` alone,
 * and refuses good followed by each of bad[0, n).
 */
static inline void tf_loader_refuses(const char *good, const char *const *bad, size_t n,
                                     int (*accepts)(const char *doc))
{
    assert_true(accepts(good));
    for (size_t i = 0; i < n; i++) {
        char *doc = malloc(strlen(good) + strlen(bad[i]) + 1);
        assert_non_null(doc);
        strcpy(doc, good);
        strcat(doc, bad[i]);
        if (accepts(doc)) {
            fail_msg("malformed block %zu was accepted", i);
        }
        free(doc);
    }
}

/*
 * Split the next line of a doc vector block, line[0, end) (every loader's
 * blocks are lines of `key: value`): its end (the LF, or end) into *eol,
 * its colon into *colon, and the index of its key among the n names at
 * names, stride bytes apart (an array of names, or the name member of an
 * array of structs).  Returns that index, or -1 when the line has no
 * colon or its key is none of the names.  The value rules after the colon
 * are each loader's own.
 */
static inline int tf_block_line(const char *line, const char *end, const char *const *names,
                                size_t n, size_t stride, const char **eol, const char **colon)
{
    const char *e = memchr(line, '\n', (size_t)(end - line));
    *eol = e != NULL ? e : end;
    *colon = memchr(line, ':', (size_t)(*eol - line));
    if (*colon == NULL) {
        return -1;
    }
    const size_t len = (size_t)(*colon - line);
    for (size_t k = 0; k < n; k++) {
        const char *name = *(const char *const *)(const void *)((const char *)names + k * stride);
        if (strlen(name) == len && memcmp(name, line, len) == 0) {
            return (int)k;
        }
    }
    return -1;
}

/*
 * Read the lines of one vector block, s[0, end), each `key: value` with
 * a key among the n names at names, stride bytes apart (as tf_block_line
 * takes them): a key that is none of them, a key given twice unless bit k
 * of repeats is set, a line that ends with a space, a colon not followed
 * by a space, an empty value unless bit k of may_be_empty is set (the
 * key and its colon alone are then an empty value), or a value that
 * store(v, k, value, length) refuses (nonzero) makes the block malformed.
 * Bit k of *seen is set for each key k read.  NULL when every line is
 * well formed (which keys a block must hold is the caller's to check),
 * else what is wrong.
 */
static inline const char *tf_block_fields(const char *s, const char *end, const char *const *names,
                                          size_t n, size_t stride, unsigned repeats,
                                          unsigned may_be_empty, unsigned *seen,
                                          int (*store)(void *v, int k, const char *val, size_t len),
                                          void *v)
{
    for (const char *line = s; line < end;) {
        const char *eol, *colon;
        const int k = tf_block_line(line, end, names, n, stride, &eol, &colon);
        if (k < 0) {
            return "unknown key";
        }
        if ((*seen >> k & 1u) != 0 && (repeats >> k & 1u) == 0) {
            return "repeated key";
        }
        if (eol > line && eol[-1] == ' ') {
            return "a line ends with a space";
        }
        const char *val = colon + 1;
        if (val < eol && *val != ' ') {
            return "no space after the colon";
        }
        if (val == eol && (may_be_empty >> k & 1u) == 0) {
            return "an empty value";
        }
        val += val < eol;
        if (store(v, k, val, (size_t)(eol - val)) != 0) {
            return "malformed value";
        }
        *seen |= 1u << k;
        line = eol + 1;
    }
    return NULL;
}

/*
 * Call block(vs, i, s, end) for each fenced block of doc tagged tag (a
 * line "```TAG", up to the next line that begins with "```"), with i
 * from 0 and the block's lines s[0, end) (end < s for a block without
 * lines), for at most max blocks.  The count, or -1 with *why (block()'s
 * answer, "unterminated block" or "too many"); *begun is how many blocks
 * block() was called for.
 */
static inline long tf_vector_blocks(const char *doc, const char *tag, size_t max,
                                    const char *(*block)(void *vs, size_t i, const char *s,
                                                         const char *end),
                                    void *vs, const char **why, size_t *begun)
{
    const size_t tl = strlen(tag);
    size_t count = 0;
    const char *p = doc;
    *why = NULL;
    while ((p = strstr(p, "```")) != NULL) {
        if (strncmp(p + 3, tag, tl) != 0 || p[3 + tl] != '\n') {
            p += 3;
            continue;
        }
        const char *start = p + 3 + tl + 1;
        const char *end = strstr(start - 1, "\n```");
        *why = count < max ? (end != NULL ? NULL : "unterminated block") : "too many";
        if (*why == NULL) {
            *why = block(vs, count++, start, end);
        }
        if (*why != NULL) {
            break;
        }
        p = end + 4;
    }
    *begun = count;
    return *why != NULL ? -1 : (long)count;
}

#endif /* KS_TESTS_TEST_FILES_H */
