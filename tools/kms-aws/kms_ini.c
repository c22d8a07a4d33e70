/*
 * tools/kms-aws/kms_ini.c -- the strict reader of the AWS shared config
 * and credentials files (kms.h, kms_ini_parse) and the bounded file
 * reader the plugin reads them and its token files with.  The parser
 * does no I/O: fuzz/fuzz_aws_creds.c runs it on arbitrary bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "kms.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INI_MAX_LINE 4096

/* printf into err (kms.h). */
void kms_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Copy s into dst (cap bytes) if it fits and every byte is printable
 * ASCII other than space (spaces allowed when allow_space).  0 or -1. */
static int copy_token(char *dst, size_t cap, const char *s, int allow_space)
{
    size_t n = strnlen(s, cap);
    if (n == 0 || n >= cap) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 32 || c >= 127 || (c == ' ' && !allow_space)) {
            return -1;
        }
    }
    memcpy(dst, s, n + 1);
    return 0;
}

#define seterr kms_seterr

/* Read a file (kms.h). */
int kms_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 1;
        }
        seterr(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uintmax_t)st.st_size > (uintmax_t)max) {
        seterr(err, errlen, "%s: not a regular file of at most %zu bytes", path, max);
        close(fd);
        return -1;
    }
    char *buf = malloc(max + 1);
    if (buf == NULL) {
        close(fd);
        seterr(err, errlen, "out of memory");
        return -1;
    }
    size_t n = 0;
    int bad = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            seterr(err, errlen, "%s: %s", path, strerror(errno));
            bad = 1;
            break;
        }
        if (r == 0) {
            break;
        }
        n += (size_t)r;
        if (n > max) {
            seterr(err, errlen, "%s: larger than %zu bytes", path, max);
            bad = 1;
            break;
        }
    }
    close(fd);
    if (bad) {
        sodium_memzero(buf, max + 1);
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* Trim spaces and tabs off both ends of s[0..*n); returns the start. */
static char *trim(char *s, size_t *n)
{
    while (*n > 0 && (s[0] == ' ' || s[0] == '\t')) {
        s++;
        (*n)--;
    }
    while (*n > 0 && (s[*n - 1] == ' ' || s[*n - 1] == '\t')) {
        (*n)--;
    }
    s[*n] = '\0';
    return s;
}

/* Parse an AWS shared file (kms.h). */
int kms_ini_parse(const char *path, char *text, size_t len, const char *section, kms_ini_want *want, size_t nwant,
                  int *found, char *err, size_t errlen)
{
    int in_section = 0, have_section = 0, may_continue = 0;
    size_t lineno = 0;
    *found = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
        char *next = nl != NULL ? nl + 1 : end;
        lineno++;
        if (n > INI_MAX_LINE) {
            seterr(err, errlen, "%s:%zu: line longer than %d bytes", path, lineno, INI_MAX_LINE);
            return -1;
        }
        if (n > 0 && p[n - 1] == '\r') {
            n--;
        }
        if (memchr(p, '\0', n) != NULL) {
            seterr(err, errlen, "%s:%zu: NUL byte", path, lineno);
            return -1;
        }
        int indented = n > 0 && (p[0] == ' ' || p[0] == '\t');
        char *s = trim(p, &n);
        p = next;
        if (n == 0 || s[0] == '#' || s[0] == ';') {
            continue;
        }
        if (indented) {
            /* a nested value ("s3 =" then indented lines): only after an
             * empty value; none of the keys read is nested */
            if (!may_continue) {
                seterr(err, errlen, "%s:%zu: unexpected indented line", path, lineno);
                return -1;
            }
            continue;
        }
        may_continue = 0;
        if (s[0] == '[') {
            if (s[n - 1] != ']') {
                seterr(err, errlen, "%s:%zu: malformed section header", path, lineno);
                return -1;
            }
            size_t m = n - 2;
            char *name = trim(s + 1, &m);
            if (m == 0) {
                seterr(err, errlen, "%s:%zu: empty section name", path, lineno);
                return -1;
            }
            have_section = 1;
            in_section = strcmp(name, section) == 0;
            if (in_section) {
                if (*found) {
                    seterr(err, errlen, "%s:%zu: section [%s] given twice", path, lineno, section);
                    return -1;
                }
                *found = 1;
            }
            continue;
        }
        char *eq = memchr(s, '=', n);
        if (eq == NULL || !have_section) {
            seterr(err, errlen, "%s:%zu: expected [section] or key = value", path, lineno);
            return -1;
        }
        size_t kn = (size_t)(eq - s), vn = n - kn - 1;
        char *val = trim(eq + 1, &vn);
        char *key = trim(s, &kn);
        if (kn == 0) {
            seterr(err, errlen, "%s:%zu: empty key", path, lineno);
            return -1;
        }
        may_continue = vn == 0;
        if (!in_section) {
            continue;
        }
        for (size_t i = 0; i < nwant; i++) {
            if (strcmp(key, want[i].key) != 0) {
                continue;
            }
            if (want[i].seen) {
                seterr(err, errlen, "%s:%zu: %s given twice in [%s]", path, lineno, key, section);
                return -1;
            }
            want[i].seen = 1;
            if (copy_token(want[i].dst, want[i].cap, val, want[i].allow_space) != 0) {
                seterr(err, errlen, "%s:%zu: %s: empty, too long or not printable", path, lineno, key);
                return -1;
            }
        }
    }
    return 0;
}

