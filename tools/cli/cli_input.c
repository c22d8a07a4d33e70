/*
 * tools/cli/cli_input.c -- bounded input for the keyshift subcommands: a
 * file or standard input read into memory that is wiped whenever it is
 * given up, and the keyring's passphrase [K-SEAL-7].
 */
#define _POSIX_C_SOURCE 200809L /* open(O_CLOEXEC), read, fstat */

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cli.h"

/* Wipe buf[0, cap) and free it (NULL: nothing). */
static void free_wiped(uint8_t *buf, size_t cap)
{
    if (buf != NULL) {
        sodium_memzero(buf, cap);
        free(buf);
    }
}

/* Move buf (cap bytes, its first len in use) to a new block of ncap
 * bytes, wiping and freeing the old one (realloc would free it unwiped,
 * and it may hold a plaintext or a passphrase: the engine's grow_keep
 * does the same).  NULL, buf left as it was, when out of memory. */
static uint8_t *grow_wiped(uint8_t *buf, size_t len, size_t cap, size_t ncap)
{
    assert(len <= cap && cap <= ncap);
    uint8_t *nb = malloc(ncap);
    if (nb == NULL) {
        return NULL;
    }
    memcpy(nb, buf, len);
    free_wiped(buf, cap);
    return nb;
}

/* Read from fd until EOF or until max + 1 bytes have arrived, growing the
 * buffer geometrically but never beyond max + 1 bytes.  What it read may
 * be a plaintext or a passphrase: every block given up is wiped first. */
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
            uint8_t *nb = grow_wiped(buf, len, cap, ncap);
            if (nb == NULL) {
                free_wiped(buf, cap);
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
            free_wiped(buf, cap);
            return EX_IOERR;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
    }
    if (len > max) {
        *too_long = 1;
        free_wiped(buf, cap);
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
int ks_cli_passphrase_load(const char *passphrase_file, ks_bytes *out)
{
    *out = (ks_bytes){NULL, 0};
    const char *env = getenv("KEYSHIFT_PASSPHRASE");
    if (passphrase_file == NULL && env == NULL) {
        return EX_OK;
    }
    uint8_t *raw = NULL;
    size_t len = 0, raw_len = 0;
    if (passphrase_file != NULL) {
        int too_long;
        int rc = ks_cli_read_input(passphrase_file, 4096, &raw, &len, &too_long);
        if (too_long) {
            ks_cli_error("passphrase file %s is longer than 4096 bytes", passphrase_file);
            return EX_CONFIG;
        }
        if (rc != EX_OK) {
            return rc == EX_NOINPUT ? EX_CONFIG : rc;
        }
        raw_len = len;
    } else {
        len = strlen(env);
    }
    const uint8_t *src = raw != NULL ? raw : (const uint8_t *)env;
    if (len > 0 && src[len - 1] == '\n') {
        len--;
    }
    uint8_t *pass = len > 0 ? sodium_malloc(len) : NULL;
    if (len > 0 && pass == NULL) {
        free_wiped(raw, raw_len);
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    if (len > 0) {
        memcpy(pass, src, len);
    }
    free_wiped(raw, raw_len); /* its final LF too */
    if (len == 0) {
        ks_cli_error("the passphrase is empty");
        return EX_CONFIG;
    }
    *out = (ks_bytes){pass, len};
    return EX_OK;
}

/* See cli.h. */
void ks_cli_passphrase_free(ks_bytes *pass)
{
    if (pass->ptr != NULL) {
        sodium_free((void *)(uintptr_t)pass->ptr);
    }
    *pass = (ks_bytes){NULL, 0};
}
