/*
 * tools/cli/cli.c -- helpers shared by the keyshift subcommands: messages,
 * bounded input, number parsing, output encodings, and opening a --db
 * (a SQLite file or a PostgreSQL connection string, in one place).
 */
#define _POSIX_C_SOURCE 200809L /* open(O_CLOEXEC), read, fstat */

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sodium.h>

#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "cli.h"

/* The program named in messages (ks_cli_set_prog). */
static const char *prog_name = KS_PROG;

/* See cli.h. */
void ks_cli_set_prog(const char *name)
{
    prog_name = name != NULL ? name : KS_PROG;
}

/* See cli.h. */
void ks_cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* See cli.h. */
int ks_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    const char *sep = cmd != NULL ? " " : "";
    cmd = cmd != NULL ? cmd : "";
    va_start(ap, fmt);
    fprintf(stderr, "%s%s%s: ", prog_name, sep, cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s%s%s --help' for more information.\n", prog_name, sep, cmd);
    va_end(ap);
    return EX_USAGE;
}

/* See cli.h. */
int ks_cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* See cli.h. */
int ks_cli_parse_encoding(const char *cmd, const char *s, ks_value_encoding *out)
{
    *out = KS_ENCODING_BINARY;
    if (s == NULL || strcmp(s, "binary") == 0) {
        return EX_OK;
    }
    if (strcmp(s, "base64") == 0) {
        *out = KS_ENCODING_BASE64;
        return EX_OK;
    }
    return ks_cli_usage_error(cmd, "--encoding must be binary or base64");
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

/* Find the option named by arg (with "=VALUE" allowed after a valued one);
 * *inline_value points past '=' when present. */
static const ks_cli_opt *find_opt(const ks_cli_opt *opts, const char *arg, const char **inline_value)
{
    *inline_value = NULL;
    for (const ks_cli_opt *o = opts; o->name != NULL; o++) {
        size_t n = strlen(o->name);
        if (strncmp(arg, o->name, n) != 0) {
            continue;
        }
        if (arg[n] == '\0') {
            return o;
        }
        if (arg[n] == '=' && o->value != NULL) {
            *inline_value = arg + n + 1;
            return o;
        }
    }
    return NULL;
}

/* Parse the arguments (see ks_cli_parse_opts); EX_OK, EX_USAGE, or -1
 * for -h/--help. */
static int parse_args(const char *cmd, int argc, char **argv, const ks_cli_opt *opts,
                      const char **pos, int max_pos, int *npos)
{
    int only_pos = 0;
    *npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && ks_cli_is_help(a)) {
            return -1;
        }
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        if (!only_pos && a[0] == '-' && a[1] != '\0') {
            const char *v;
            const ks_cli_opt *o = find_opt(opts, a, &v);
            if (o == NULL) {
                return ks_cli_usage_error(cmd, "unknown option '%s'", a);
            }
            if (o->flag != NULL) {
                *o->flag = 1;
                continue;
            }
            if (v == NULL) {
                if (i + 1 >= argc) {
                    return ks_cli_usage_error(cmd, "%s needs a value", o->name);
                }
                v = argv[++i];
            }
            *o->value = v;
            continue;
        }
        if (*npos >= max_pos) {
            return ks_cli_usage_error(cmd, "unexpected argument '%s'", a);
        }
        pos[(*npos)++] = a;
    }
    return EX_OK;
}

/* Where `make install' puts docs/ (the Makefile's DOCDIR). */
#ifndef KS_DOCDIR
#define KS_DOCDIR "/usr/local/share/doc/keyshift"
#endif

/* See cli.h.  encrypt and decrypt share keyshift-encrypt(1). */
void ks_cli_help_footer(FILE *f, const char *cmd)
{
    fputs("\nSEE ALSO\n    ", f);
    if (cmd == NULL) {
        fputs("keyshift(1), keyshift-COMMAND(1) for each command, libkeyshift(3),\n"
              "    keyshift-keyring(5), keyshift-providers(5)", f);
    } else {
        size_t n = strcspn(cmd, " ");
        if (strncmp(cmd, "decrypt", n) == 0 && n == strlen("decrypt")) {
            cmd = "encrypt";
            n = strlen(cmd);
        }
        fprintf(f, "keyshift-%.*s(1)", (int)n, cmd);
    }
    fputs("\n    The documents cited as docs/NAME.md are installed as\n    " KS_DOCDIR "/NAME.md.\n",
          f);
}

/* See cli.h. */
int ks_cli_parse_opts(const char *cmd, void (*usage)(FILE *), int argc, char **argv,
                      const ks_cli_opt *opts, const char **pos, int max_pos, int *npos, int *rc)
{
    int r = parse_args(cmd, argc, argv, opts, pos, max_pos, npos);
    if (r == -1) {
        usage(stdout);
        if (cmd != NULL) {
            ks_cli_help_footer(stdout, cmd);
        }
        *rc = EX_OK;
        return 1;
    }
    *rc = r;
    return r != EX_OK;
}

/* See cli.h.  Exit codes are documented in `keyshift --help`. */
int ks_cli_exit_code(ks_err err)
{
    if (ks_err_is_rejection(err)) {
        return EX_DATAERR;
    }
    switch (err) {
    case KS_OK: return EX_OK;
    case KS_ERR_AUTH_FAILED:
    case KS_ERR_STATE:
    case KS_ERR_EXISTS:
        return EX_DATAERR;
    case KS_ERR_DENIED:
    case KS_ERR_REVOKED:
    case KS_ERR_NOT_FOUND:
        return EX_NOPERM;
    case KS_ERR_INSECURE:
    case KS_ERR_IO:
    case KS_ERR_BAD_PASSPHRASE:
    case KS_ERR_INTEGRITY:
        return EX_CONFIG;
    case KS_ERR_UNAVAILABLE:
    case KS_ERR_ALGORITHM_UNAVAILABLE:
        return EX_UNAVAILABLE;
    case KS_ERR_TIMEOUT: return EX_TEMPFAIL;
    case KS_ERR_INVALID_ARGUMENT: return EX_USAGE;
    case KS_ERR_UNSTABLE_ID:   /* give --id-column, or a context without {id} */
        return EX_USAGE;
    /* Row stores and migrations (docs/migration.md, "Exit codes"). */
    case KS_ERR_NO_TARGET: return EX_NOINPUT;
    case KS_ERR_BUSY:          /* the database stayed locked: resumable */
    case KS_ERR_STOPPED:       /* paused on a signal: resumable */
        return EX_TEMPFAIL;
    case KS_ERR_THRESHOLD:     /* too many rows quarantined */
    case KS_ERR_MISMATCH:      /* another unfinished migration's checkpoint */
        return EX_DATAERR;
    case KS_ERR_VERIFY_FAILED: /* a new value did not open: a bug, never the data */
        return EX_SOFTWARE;
    case KS_ERR_FULL:          /* rolled back; resumable once space is freed */
    case KS_ERR_STORE:         /* rolled back; resumable */
        return EX_IOERR;
    case KS_ERR_NO_MEMORY:
    case KS_ERR_CRYPTO_INIT:
        return EX_OSERR;
    /* Rollouts (docs/rollout.md, "Commands"). */
    case KS_ERR_GUARD:         /* not safe yet: the message says what is missing */
    case KS_ERR_STALE:         /* another operator moved it first: look and retry */
        return EX_TEMPFAIL;
    case KS_ERR_NO_ROLLOUT: return EX_NOINPUT;
    case KS_ERR_ROLLOUT_EXISTS: return EX_DATAERR;
    case KS_ERR_PHASE:         /* the phase does not read that class (app.h) */
        return EX_DATAERR;
    default: return EX_SOFTWARE;
    }
}

/* See cli.h. */
int ks_cli_keyring_args(const char **path, const char *passphrase_file, ks_bytes *pass)
{
    *pass = (ks_bytes){NULL, 0};
    if (*path == NULL) {
        *path = getenv("KEYSHIFT_KEYRING");
    }
    if (*path == NULL || **path == '\0') {
        ks_cli_error("no keyring: give --keyring FILE or set KEYSHIFT_KEYRING");
        return EX_USAGE;
    }
    return ks_cli_passphrase_load(passphrase_file, pass);
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

/* The name of a file type that is not a regular file, for messages. */
static const char *file_type_name(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a regular file";
}

/* Nonzero when the file at path starts with the three bytes magic (a
 * keyring's "KSK", docs/keyring.md section 2).  Only those bytes are
 * read, never the keys, and no link is followed. */
static int starts_with_magic(const char *path, const char *magic)
{
    uint8_t m[3];
    ssize_t n = -1;
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, m, sizeof m);
        close(fd);
    }
    return n == (ssize_t)sizeof m && memcmp(m, magic, sizeof m) == 0;
}

/*
 * Say what is wrong with a file the library refused as insecure: a
 * keyring ([K-FILE-1]) or a providers file ([P-LOAD-1]), checked in the
 * library's order: a symbolic link, not a regular file, another user's,
 * then the permission bits in bad_mode, which `fix` (a chmod mode) clears.
 * what names the file ("keyring"); harm says what those bits would let
 * group or others do; a file with such bits that does not start with
 * magic (when not NULL) is said to be the wrong file rather than told to
 * chmod.  lstat, not stat: the library does not follow a link either.
 */
static void insecure_said(const char *what, const char *path, mode_t bad_mode, const char *fix,
                          const char *harm, const char *magic)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        ks_cli_error("%s %s was refused as insecure and cannot be examined now: %s", what, path,
                     strerror(errno));
    } else if (S_ISLNK(st.st_mode)) {
        ks_cli_error("%s %s is a symbolic link, and keyshift opens only a file itself (a link "
                     "can be repointed). Name the file it points to. A Kubernetes Secret volume "
                     "makes each entry a link to ..data/NAME: name DIR/..data/NAME instead, with "
                     "the volume's defaultMode 0400 (readable when running as root, its owner), "
                     "or copy the file to an emptyDir volume with mode 0600 in an init container",
                     what, path);
    } else if (!S_ISREG(st.st_mode)) {
        ks_cli_error("%s %s is %s; name a regular file", what, path, file_type_name(st.st_mode));
    } else if (st.st_uid != geteuid() && st.st_uid != 0) {
        ks_cli_error("%s %s belongs to uid %lu, not to you (uid %lu) or root, so another user "
                     "controls it; use a file of your own, or run keyshift as its owner",
                     what, path, (unsigned long)st.st_uid, (unsigned long)geteuid());
    } else if ((st.st_mode & bad_mode) != 0 && magic != NULL && !starts_with_magic(path, magic)) {
        ks_cli_error("%s %s is not a %s (it does not start with \"%s\") and has mode %04o; name "
                     "the right file", what, path, what, magic, (unsigned)(st.st_mode & 07777));
    } else if ((st.st_mode & bad_mode) != 0) {
        ks_cli_error("%s %s has mode %04o, which would let %s; run: chmod %s %s%s", what, path,
                     (unsigned)(st.st_mode & 07777), harm, fix, path,
                     st.st_uid != geteuid() ? " (as root, its owner)" : "");
    } else {
        ks_cli_error("%s %s was refused as insecure but passes the checks now (it changed "
                     "meanwhile); run the command again", what, path);
    }
}

/* See cli.h. */
int ks_cli_keyring_open(const char *path, const char *passphrase_file, ks_keyring **out)
{
    ks_bytes pass;
    *out = NULL;
    int rc = ks_cli_keyring_args(&path, passphrase_file, &pass);
    if (rc != EX_OK) {
        return rc;
    }
    ks_parse_error perr = {KS_OK, 0, 0};
    ks_err e = ks_keyring_open(path, pass, out, &perr);
    ks_cli_passphrase_free(&pass);
    if (e == KS_ERR_INTEGRITY) {
        ks_cli_error("keyring %s is corrupt: %s at byte %zu", path, ks_err_name(perr.code), perr.offset);
    } else if (e == KS_ERR_INSECURE) {
        insecure_said("keyring", path, S_IRWXG | S_IRWXO, "600",
                      "group or others read or change its keys", "KSK"); /* [K-FILE-1] */
    } else if (e == KS_ERR_BAD_PASSPHRASE) {
        ks_cli_error("keyring %s did not open: wrong or missing passphrase "
                     "(--passphrase-file or KEYSHIFT_PASSPHRASE)", path);
    } else if (e == KS_ERR_IO) {
        struct stat st;
        ks_cli_error("cannot read keyring %s: %s", path,
                     stat(path, &st) != 0 ? strerror(errno) : "not a readable regular file");
    } else if (e != KS_OK) {
        ks_cli_error("cannot open keyring %s: %s", path, ks_err_name(e));
    }
    return ks_cli_exit_code(e);
}

/* Say what is wrong with the keyring of provider number `provider`
 * (1-based) of the registry at path, refused as insecure: the registry
 * is read again (no provider opened) for the keyring's path. */
static void keyring_insecure_in(const char *path, uint32_t provider)
{
    ks_registry *r = NULL;
    ks_registry_setting st;
    if (provider == 0 || ks_registry_read(path, &r, NULL) != KS_OK) {
        return;
    }
    for (size_t j = 0; ks_registry_setting_at(r, provider - 1, j, &st) == KS_OK; j++) {
        if (strcmp(st.key, "keyring") == 0) {
            insecure_said("keyring", st.value, S_IRWXG | S_IRWXO, "600",
                          "group or others read or change its keys", "KSK"); /* [K-FILE-1] */
            break;
        }
    }
    ks_registry_close(r);
}

/* Report a plugin provider that did not open (err->plugin: its stage,
 * the refusal's reason and field, the plugin's message and its redacted
 * stderr, each when there is one) and return the exit code: a command
 * that names no program, a configuration out of limits and a refused
 * hello are configuration errors (78); the rest as ks_cli_exit_code (a
 * plugin that would not start or died: 69; one that did not answer: 75;
 * an error answer by its class). */
static int plugin_failed(const char *path, ks_err e, const ks_registry_error *err)
{
    const ks_plugin_error *pe = &err->plugin;
    char detail[600] = "";
    size_t n = 0;
    if (pe->reason != NULL) {
        n += (size_t)snprintf(detail + n, sizeof detail - n, ", reason %s", pe->reason);
    }
    if (pe->field != NULL && n < sizeof detail) {
        n += (size_t)snprintf(detail + n, sizeof detail - n, ", field %s", pe->field);
    }
    if (pe->message[0] != '\0' && n < sizeof detail) {
        (void)snprintf(detail + n, sizeof detail - n, "; the plugin says: %s", pe->message);
    }
    ks_cli_error("providers file %s: provider %s (plugin %s) did not open: %s at %s%s%s", path,
                 err->name, pe->program[0] != '\0' ? pe->program : "?", ks_err_name(e), pe->stage, detail,
                 e == KS_ERR_NOT_FOUND ? " (no such program: `command` is an absolute path, or NAME for "
                                         "keyshift-kms-NAME on PATH)" : "");
    if (pe->stderr_tail[0] != '\0') {
        ks_cli_error("provider %s: its stderr (redacted): %s", err->name, pe->stderr_tail);
    }
    switch (e) {
    case KS_ERR_NOT_FOUND:
    case KS_ERR_INVALID_ARGUMENT:
    case KS_ERR_INTEGRITY:
        return EX_CONFIG;
    default:
        return ks_cli_exit_code(e);
    }
}

/* See cli.h.  The file's own problems and every credential of a provider
 * (a passphrase or PIN that cannot be read, a wrong or locked PIN) are
 * configuration errors (78); a provider that cannot be reached is
 * unavailable (69); a plugin's failures as plugin_failed() says. */
int ks_cli_registry_failed(const char *path, ks_err e, const ks_registry_error *err)
{
    switch (err->stage) {
    case KS_REGISTRY_STAGE_PARSE:
        ks_cli_error("providers file %s is invalid: %s at line %" PRIu32 ", column %" PRIu32
                     " (byte %zu)", path, ks_err_name(err->code), err->line, err->column,
                     err->offset);
        return EX_CONFIG;
    case KS_REGISTRY_STAGE_PROVIDER:
        if (err->plugin.stage != NULL) {
            return plugin_failed(path, e, err);
        }
        if (err->setting != NULL) {
            ks_cli_error("providers file %s: provider %s: cannot use its %s: %s", path, err->name,
                         err->setting, ks_err_name(e));
            if (e == KS_ERR_INSECURE && strcmp(err->setting, "keyring") == 0) {
                keyring_insecure_in(path, err->provider);
            }
            return e == KS_ERR_UNAVAILABLE ? EX_UNAVAILABLE : EX_CONFIG;
        }
        ks_cli_error("providers file %s: provider %s did not open: %s%s", path, err->name,
                     ks_err_name(e),
                     e == KS_ERR_DENIED ? " (wrong or locked PIN, or the token's final try: "
                                          "not retried)" : "");
        return e == KS_ERR_DENIED ? EX_CONFIG : ks_cli_exit_code(e);
    default:
        if (e == KS_ERR_INSECURE) {
            insecure_said("providers file", path, S_IWGRP | S_IWOTH, "go-w",
                          "group or others choose which provider serves a key",
                          NULL); /* [P-LOAD-1] */
        } else if (e == KS_ERR_IO) {
            struct stat st;
            ks_cli_error("cannot read providers file %s: %s", path,
                         stat(path, &st) != 0 ? strerror(errno) : "not a readable regular file");
        } else {
            ks_cli_error("cannot load providers file %s: %s", path, ks_err_name(e));
        }
        return e == KS_ERR_NO_MEMORY ? EX_OSERR : EX_CONFIG;
    }
}

/* ks_cli_keys_open() and ks_cli_keys_open_lazy(): a registry's providers
 * are opened at once, or each when first needed (lazy). */
static int keys_open(const char *cmd, const char *keyring, const char *passfile,
                     const char *providers, int lazy, ks_cli_keys *out)
{
    memset(out, 0, sizeof *out);
    if (providers != NULL && keyring != NULL) {
        return ks_cli_usage_error(cmd, "give --keyring or --providers, not both");
    }
    if (providers == NULL && keyring == NULL) {
        const char *env = getenv("KEYSHIFT_PROVIDERS");
        providers = env != NULL && *env != '\0' ? env : NULL;
    }
    if (providers != NULL) {
        if (passfile != NULL) {
            return ks_cli_usage_error(cmd, "--passphrase-file goes with --keyring; a providers "
                                           "file names each keyring's passphrase itself");
        }
        ks_registry_error err;
        ks_err e = lazy ? ks_registry_load_lazy(providers, &out->reg, &err)
                        : ks_registry_load(providers, &out->reg, &err);
        if (e == KS_OK) {
            e = ks_registry_provider(out->reg, &out->prov);
        }
        if (e != KS_OK) {
            int rc = out->reg == NULL ? ks_cli_registry_failed(providers, e, &err) : EX_SOFTWARE;
            ks_cli_keys_close(out);
            return rc;
        }
        snprintf(out->source, sizeof out->source, "providers %s", providers);
        out->providers = providers;
        return EX_OK;
    }
    int rc = ks_cli_keyring_open(keyring, passfile, &out->kr);
    if (rc != EX_OK) {
        return rc;
    }
    if (ks_keyring_provider(out->kr, &out->prov) != KS_OK) {
        ks_cli_keys_close(out);
        return EX_SOFTWARE;
    }
    snprintf(out->source, sizeof out->source, "keyring %s",
             keyring != NULL ? keyring : getenv("KEYSHIFT_KEYRING"));
    return EX_OK;
}

/* See cli.h. */
int ks_cli_keys_open(const char *cmd, const char *keyring, const char *passfile,
                     const char *providers, ks_cli_keys *out)
{
    return keys_open(cmd, keyring, passfile, providers, 0, out);
}

/* See cli.h. */
int ks_cli_keys_open_lazy(const char *cmd, const char *keyring, const char *passfile,
                          const char *providers, ks_cli_keys *out)
{
    return keys_open(cmd, keyring, passfile, providers, 1, out);
}

/* See cli.h.  The message and exit code are those the registry's load
 * would have given, had it opened every provider at once. */
int ks_cli_keys_open_failed(const ks_cli_keys *k)
{
    ks_registry_error err;
    if (k->reg == NULL || k->providers == NULL) {
        return EX_OK;
    }
    const ks_err e = ks_registry_open_error(k->reg, &err);
    return e == KS_OK ? EX_OK : ks_cli_registry_failed(k->providers, e, &err);
}

/* See cli.h. */
void ks_cli_keys_close(ks_cli_keys *k)
{
    ks_registry_close(k->reg);
    ks_keyring_close(k->kr);
    memset(k, 0, sizeof *k);
}

/* ks_cli_ctx_open() and ks_cli_ctx_open_lazy(). */
static int ctx_open(const char *cmd, const char *keyring, const char *passfile,
                    const char *providers, int lazy, ks_cli_keys *keys, ks_ctx **ctx)
{
    *ctx = NULL;
    int rc = keys_open(cmd, keyring, passfile, providers, lazy, keys);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_ctx_new(&keys->prov, NULL, ctx);
    if (e != KS_OK) {
        ks_cli_keys_close(keys);
        ks_cli_error("cannot set up encryption: %s", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_ctx_open(const char *cmd, const char *keyring, const char *passfile,
                    const char *providers, ks_cli_keys *keys, ks_ctx **ctx)
{
    return ctx_open(cmd, keyring, passfile, providers, 0, keys, ctx);
}

/* See cli.h. */
int ks_cli_ctx_open_lazy(const char *cmd, const char *keyring, const char *passfile,
                         const char *providers, ks_cli_keys *keys, ks_ctx **ctx)
{
    return ctx_open(cmd, keyring, passfile, providers, 1, keys, ctx);
}

/* See cli.h. */
int ks_cli_write_stdout(const uint8_t *p, size_t n)
{
    if (n != 0 && fwrite(p, 1, n, stdout) != n) {
        ks_cli_error("cannot write standard output");
        return EX_IOERR;
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_template_columns(const char *cmd, const char *tmpl, ks_rowstore_target *t,
                            char storage[KS_CONTEXT_TEMPLATE_MAX])
{
    t->n_context_columns = 0;
    if (tmpl == NULL) {
        return EX_OK;
    }
    ks_bytes b = {(const uint8_t *)tmpl, strlen(tmpl)};
    size_t n = 0;
    ks_err e = ks_context_template_columns(b, t->context_columns, storage, &n);
    size_t off = 0;
    const char *why = NULL;
    if (e == KS_ERR_INVALID_ARGUMENT && ks_context_template_check(b, &off, &why) == e) {
        return ks_cli_usage_error(cmd, "invalid --context template: %s at byte %zu (at most %d "
                                       "bytes and %d distinct {column} names)", why, off,
                                  KS_CONTEXT_TEMPLATE_MAX, KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot read the --context template: %s", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    t->n_context_columns = n;
    return EX_OK;
}

/* EX_OK when path names a regular file, else EX_NOINPUT after saying
 * why: databases are never created by a command that reads them. */
static int db_exists(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        ks_cli_error("no such database %s: %s", path, strerror(errno));
        return EX_NOINPUT;
    }
    if (!S_ISREG(st.st_mode)) {
        ks_cli_error("no such database %s: not a regular file", path);
        return EX_NOINPUT;
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_db_is_pg(const char *db)
{
    return ks_rollout_store_pg_names(db);
}

/* See cli.h.  libpq's parse error is not printed: it may quote part of
 * the string, which may hold a password. */
int ks_cli_db_check(const char *db, int *is_pg)
{
    int pg = ks_cli_db_is_pg(db);
    if (is_pg != NULL) {
        *is_pg = pg;
    }
    if (!pg) {
        return EX_OK;
    }
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(db, &err);
    if (err != NULL) {
        PQfreemem(err);
    }
    if (opts == NULL) {
        ks_cli_error("--db: not a valid PostgreSQL connection URI or key=value string");
        return EX_USAGE;
    }
    int password = 0;
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        password |= strcmp(o->keyword, "password") == 0 && o->val != NULL;
    }
    PQconninfoFree(opts);
    if (password) {
        ks_cli_error("--db: the PostgreSQL connection string holds a password, which the "
                     "command line would show to other users: remove it and give it through "
                     "PGPASSFILE (a 0600 file) or PGPASSWORD");
        return EX_USAGE;
    }
    return EX_OK;
}

/* Open the PostgreSQL store of ks_cli_store_open (db checked already). */
static int pg_store_open(const char *db, const ks_rowstore_target *t, int read_only,
                         uint32_t busy_timeout_ms, ks_rowstore *out)
{
    ks_pg_options o = {busy_timeout_ms ? busy_timeout_ms : 30000, 0, read_only};
    char msg[256] = "";
    ks_err e = ks_rowstore_pg_open(db, t, &o, out, msg, sizeof msg);
    if (e != KS_OK) {
        const char *advice = e == KS_ERR_BUSY ? " (the table stayed locked past --busy-timeout: "
                                                "run the same command again later)"
                             : e == KS_ERR_UNAVAILABLE ? " (run the same command again once the "
                                                         "server is reachable)"
                                                       : "";
        /* never the connection string: it may carry more than a host */
        ks_cli_error("PostgreSQL database: %s%s", msg[0] ? msg : ks_err_name(e), advice);
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
ks_err ks_cli_checkpoints(const char *db, const char *table, const char *column,
                          ks_checkpoint_list_fn fn, void *arg, char *errbuf, size_t errbuf_len)
{
    return ks_cli_db_is_pg(db)
               ? ks_rowstore_pg_checkpoints(db, table, column, fn, arg, errbuf, errbuf_len)
               : ks_rowstore_sqlite_checkpoints(db, table, column, fn, arg, errbuf, errbuf_len);
}

/* See cli.h. */
int ks_cli_store_open(const char *db, const ks_rowstore_target *t, int read_only,
                      uint32_t busy_timeout_ms, ks_sqlite_sync sync, ks_rowstore *out)
{
    *out = (ks_rowstore){NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    int pg;
    int rc = ks_cli_db_check(db, &pg);
    if (rc != EX_OK || pg) {
        return rc != EX_OK ? rc : pg_store_open(db, t, read_only, busy_timeout_ms, out);
    }
    rc = db_exists(db);
    if (rc != EX_OK) {
        return rc;
    }
    ks_sqlite_options o = {busy_timeout_ms ? busy_timeout_ms : 30000, read_only, 0, sync};
    char msg[256] = "";
    ks_err e = ks_rowstore_sqlite_open(db, t, &o, out, msg, sizeof msg);
    if (e == KS_ERR_INVALID_ARGUMENT) {
        ks_cli_error("%s: %s", db, msg[0] ? msg : "invalid table or column name");
        return EX_USAGE;
    }
    if (e != KS_OK) {
        ks_cli_error("%s: %s", db, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_check_context(const char *cmd, const ks_rowstore *store, const char *table,
                         const char *tmpl)
{
    ks_bytes b = {(const uint8_t *)(tmpl != NULL ? tmpl : ""), tmpl != NULL ? strlen(tmpl) : 0};
    ks_err e = ks_migrate_check_context(store, b);
    if (e == KS_ERR_UNSTABLE_ID) {
        ks_cli_error("%s%stable %s has no INTEGER PRIMARY KEY, so its row id is the bare rowid, "
                     "which VACUUM and a dump/restore renumber; --context binds {id}, so every "
                     "envelope would stop opening once its row is renumbered. Nothing was "
                     "written. Give --id-column naming the INTEGER PRIMARY KEY or a UNIQUE NOT "
                     "NULL column (add one to the table first if it has none), or a --context "
                     "that does not bind {id} (unstable-id)",
                     cmd != NULL ? cmd : "", cmd != NULL ? ": " : "", table);
        return ks_cli_exit_code(e);
    }
    if (e != KS_OK) {
        ks_cli_error("%s%scannot check the --context template: %s", cmd != NULL ? cmd : "",
                     cmd != NULL ? ": " : "", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_parse_synchronous(const char *cmd, const char *s, ks_sqlite_sync *out)
{
    if (strcmp(s, "full") == 0) {
        *out = KS_SQLITE_SYNC_FULL;
    } else if (strcmp(s, "normal") == 0) {
        *out = KS_SQLITE_SYNC_NORMAL;
    } else {
        return ks_cli_usage_error(cmd, "--synchronous must be full or normal");
    }
    return EX_OK;
}

/* See cli.h. */
void ks_cli_put_value(FILE *f, const ks_value *v, int json)
{
    switch (v->type) {
    case KS_VALUE_INTEGER: fprintf(f, "%lld", (long long)v->integer); break;
    case KS_VALUE_TEXT:
        if (json) {
            ks_cli_put_json_string(f, v->bytes.ptr, v->bytes.len);
        } else {
            for (size_t i = 0; i < v->bytes.len; i++) {
                uint8_t c = v->bytes.ptr[i];
                fputc(c >= 0x20 && c < 0x7f ? c : '?', f);
            }
        }
        break;
    case KS_VALUE_BLOB:
        fputs(json ? "\"x'" : "x'", f);
        ks_cli_put_hex(f, v->bytes.ptr, v->bytes.len);
        fputs(json ? "'\"" : "'", f);
        break;
    default: fputs(json ? "null" : "NULL", f); break;
    }
}

/* See cli.h. */
int ks_cli_only_options(const char *cmd, const ks_cli_opt *opts, const char *allowed)
{
    for (const ks_cli_opt *o = opts; o->name != NULL; o++) {
        int given = o->value != NULL ? *o->value != NULL : *o->flag != 0;
        char word[64];
        snprintf(word, sizeof word, " %s ", o->name);
        if (given && strstr(allowed, word) == NULL) {
            return ks_cli_usage_error(cmd, "%s is not an option of '%s'", o->name, cmd);
        }
    }
    return EX_OK;
}

/* See cli.h. */
void ks_cli_format_time(int64_t t, char *out, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    out[0] = '\0';
    if (t != 0 && (gmtime_r(&tt, &tm) == NULL || strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)) {
        snprintf(out, cap, "%lld", (long long)t);
    }
}

/* See cli.h. */
int ks_cli_printable(const char *s, size_t min, size_t max)
{
    size_t n = strlen(s);
    if (n < min || n > max) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x20 || s[i] > 0x7e) {
            return 0;
        }
    }
    return 1;
}

/* See cli.h. */
void ks_cli_hostname(char *out, size_t cap)
{
    if (gethostname(out, cap) != 0 || out[0] == '\0') {
        snprintf(out, cap, "localhost");
    }
    out[cap - 1] = '\0'; /* gethostname need not terminate a cut name */
}

/* See cli.h. */
int ks_cli_actor(const char *cmd, const char *given, char *out, size_t cap)
{
    if (given != NULL) {
        if (!ks_cli_printable(given, 1, KS_ROLLOUT_ACTOR_MAX) || strlen(given) >= cap) {
            return ks_cli_usage_error(cmd, "--actor must be 1..%d printable ASCII characters",
                                      KS_ROLLOUT_ACTOR_MAX);
        }
        memcpy(out, given, strlen(given) + 1);
        return EX_OK;
    }
    char user[64] = "", host[256] = "";
    const char *env = getenv("USER");
    if (env != NULL && *env != '\0') {
        snprintf(user, sizeof user, "%s", env);
    } else if (getlogin_r(user, sizeof user) != 0 || user[0] == '\0') {
        snprintf(user, sizeof user, "unknown");
    }
    ks_cli_hostname(host, sizeof host);
    size_t limit = cap - 1 < KS_ROLLOUT_ACTOR_MAX ? cap - 1 : KS_ROLLOUT_ACTOR_MAX;
    if (snprintf(out, limit + 1, "%s@%s", user, host) < 0) { /* cut to the limit */
        snprintf(out, cap, "unknown");
    }
    for (char *p = out; *p != '\0'; p++) {
        if (*p < 0x20 || *p > 0x7e) {
            *p = '?';
        }
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_rollout_open(const char *path, int read_only, ks_rollout_db **out)
{
    *out = NULL;
    char msg[256] = "";
    if (ks_cli_db_is_pg(path)) { /* the rollouts live in the application's PostgreSQL database */
        int rc = ks_cli_db_check(path, NULL); /* no password in argv */
        if (rc != EX_OK) {
            return rc;
        }
        ks_rollout_store *store = NULL;
        ks_err e = ks_rollout_store_pg_open(path, read_only, &store, msg, sizeof msg);
        if (e == KS_OK) {
            e = ks_rollout_db_wrap(store, out); /* it owns the store, even on failure */
        }
        if (e != KS_OK) {
            /* never the connection string: it may carry more than a host */
            ks_cli_error("cannot open the rollouts of the PostgreSQL database: %s",
                         msg[0] ? msg : ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        return EX_OK;
    }
    int rc = db_exists(path);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_rollout_db_open(path, read_only ? KS_ROLLOUT_DB_READ_ONLY : 0, out, msg, sizeof msg);
    if (e != KS_OK) {
        ks_cli_error("cannot open the rollouts of %s: %s", path, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h.  Paged, so that any number of rollouts is read in one
 * array: the rules of ks_rollout_scope_find need all of them. */
int ks_cli_rollouts_all(ks_rollout_db *db, const char *path, ks_rollout **out, size_t *n)
{
    enum { PAGE = 8 };
    ks_rollout *rs = NULL;
    size_t got = PAGE, cap = 0;
    ks_err e = KS_OK;
    *out = NULL;
    *n = 0;
    while (e == KS_OK && got == PAGE) {
        if (*n + PAGE > cap) {
            size_t ncap = cap ? cap * 2 : PAGE;
            ks_rollout *np = realloc(rs, ncap * sizeof *np);
            if (np == NULL) {
                e = KS_ERR_NO_MEMORY;
                break;
            }
            rs = np;
            cap = ncap;
        }
        e = ks_rollout_db_list(db, *n > 0 ? rs[*n - 1].id : 0, rs + *n, PAGE, &got);
        *n += e == KS_OK ? got : 0;
    }
    if (e != KS_OK) {
        free(rs);
        *n = 0;
        ks_cli_error("cannot read the rollouts of %s: %s", path, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    *out = rs;
    return EX_OK;
}

/* See cli.h. */
int ks_cli_census(const char *path, const char *table, const char *column,
                  ks_value_encoding encoding, ks_census *out)
{
    ks_rowstore_target t = {.table = table, .column = column, .encoding = encoding};
    ks_rowstore store;
    memset(out, 0, sizeof *out);
    int rc = ks_cli_store_open(path, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_census_run(&store, out);
    ks_rowstore_close(&store);
    if (e != KS_OK) {
        ks_cli_error("census of %s.%s failed: %s", table, column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
uint64_t ks_cli_census_key_rows(const ks_census *c, const char *key_id, uint32_t key_version)
{
    uint64_t n = 0;
    for (size_t i = 0; i < c->n_classes; i++) {
        if (c->classes[i].key_version == key_version && strcmp(c->classes[i].key_id, key_id) == 0) {
            n += c->classes[i].rows;
        }
    }
    return n;
}

/* See cli.h. */
int ks_cli_subcommand_help(int argc, char **argv, void (*usage)(FILE *), int *rc)
{
    if (argc < 2) {
        usage(stderr);
        *rc = EX_USAGE;
        return 1;
    }
    if (ks_cli_is_help(argv[1])) {
        usage(stdout);
        ks_cli_help_footer(stdout, argv[0]);
        *rc = EX_OK;
        return 1;
    }
    return 0;
}

/* See cli.h. */
int ks_cli_parse_duration(const char *s, uint32_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9') {
        return -1;
    }
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    if (*end != '\0') {
        if (end[1] != '\0') {
            return -1;
        }
        switch (*end) {
        case 's': mul = 1; break;
        case 'm': mul = 60; break;
        case 'h': mul = 3600; break;
        case 'd': mul = 86400; break;
        default: return -1;
        }
    }
    if (errno != 0 || v > UINT32_MAX / mul) {
        return -1;
    }
    *out = (uint32_t)(v * mul);
    return 0;
}

/* See cli.h. */
int ks_cli_parse_duration_ms(const char *s, uint32_t *out_ms)
{
    if (s == NULL || *s < '0' || *s > '9') {
        return -1;
    }
    uint64_t whole = 0, frac = 0; /* frac: thousandths */
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++) {
        whole = whole * 10 + (uint64_t)(*c - '0');
        if (whole > UINT32_MAX) {
            return -1;
        }
    }
    if (*c == '.') {
        uint64_t scale = 100;
        c++;
        if (*c < '0' || *c > '9') {
            return -1;
        }
        for (; *c >= '0' && *c <= '9'; c++, scale /= 10) {
            if (scale == 0) {
                return -1; /* finer than a millisecond */
            }
            frac += scale * (uint64_t)(*c - '0');
        }
    }
    uint64_t mul = 1000;
    if (strcmp(c, "ms") == 0) {
        mul = 1;
    } else if (strcmp(c, "m") == 0) {
        mul = 60000;
    } else if (strcmp(c, "h") == 0) {
        mul = 3600000;
    } else if (*c != '\0' && strcmp(c, "s") != 0) {
        return -1;
    }
    /* thousandths of the unit: exact for s (ms), and for ms only whole */
    if (mul == 1 && frac != 0) {
        return -1;
    }
    uint64_t ms = whole * mul + frac * mul / 1000;
    if (ms > UINT32_MAX) {
        return -1;
    }
    *out_ms = (uint32_t)ms;
    return 0;
}

/* See cli.h. */
double ks_cli_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
