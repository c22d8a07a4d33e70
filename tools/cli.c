/*
 * tools/cli.c -- helpers shared by the keyshift subcommands: messages,
 * bounded input, number parsing and output encodings.
 */
#define _POSIX_C_SOURCE 200809L /* open(O_CLOEXEC), read, fstat */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* See cli.h. */
void ks_cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(KS_PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* See cli.h. */
int ks_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, KS_PROG " %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '" KS_PROG " %s --help' for more information.\n", cmd);
    va_end(ap);
    return EX_USAGE;
}

/* See cli.h. */
int ks_cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* See cli.h. */
int ks_cli_parse_size(const char *s, size_t lo, size_t hi, size_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9') {
        return -1;
    }
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/* Read from fd until EOF or until max + 1 bytes have arrived, growing the
 * buffer geometrically but never beyond max + 1 bytes. */
static int read_bounded(int fd, const char *name, size_t max, uint8_t **out, size_t *out_len,
                        int *too_long)
{
    const size_t limit = max + 1;
    size_t cap = limit < 4096 ? limit : 4096, len = 0;
    uint8_t *buf = malloc(cap);
    if (buf == NULL) {
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    while (len < limit) {
        if (len == cap) {
            size_t ncap = cap < limit / 2 ? cap * 2 : limit;
            uint8_t *nb = realloc(buf, ncap);
            if (nb == NULL) {
                free(buf);
                ks_cli_error("out of memory");
                return EX_OSERR;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            ks_cli_error("cannot read %s: %s", name, strerror(errno));
            free(buf);
            return EX_IOERR;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
    }
    if (len > max) {
        *too_long = 1;
        free(buf);
        return EX_DATAERR;
    }
    *out = buf;
    *out_len = len;
    return EX_OK;
}

/* See cli.h. */
int ks_cli_read_input(const char *path, size_t max, uint8_t **out, size_t *out_len, int *too_long)
{
    int fd = STDIN_FILENO;
    const char *name = "standard input";
    *too_long = 0;
    *out = NULL;
    *out_len = 0;
    if (path != NULL && strcmp(path, "-") != 0) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            ks_cli_error("cannot open %s: %s", path, strerror(errno));
            return EX_NOINPUT;
        }
        name = path;
        struct stat st;
        if (fstat(fd, &st) != 0) {
            ks_cli_error("cannot read %s: %s", path, strerror(errno));
            close(fd);
            return EX_IOERR;
        }
        if (S_ISDIR(st.st_mode)) {
            ks_cli_error("cannot read %s: Is a directory", path);
            close(fd);
            return EX_NOINPUT;
        }
        if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) {
            *too_long = 1; /* refused before reading anything */
            close(fd);
            return EX_DATAERR;
        }
    }
    int rc = read_bounded(fd, name, max, out, out_len, too_long);
    if (fd != STDIN_FILENO) {
        close(fd);
    }
    return rc;
}

/* See cli.h. */
void ks_cli_put_hex(FILE *f, const uint8_t *p, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        fputc(digits[p[i] >> 4], f);
        fputc(digits[p[i] & 15], f);
    }
}

/* See cli.h. */
void ks_cli_put_json_string(FILE *f, const uint8_t *p, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20 || c >= 0x7f) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}
