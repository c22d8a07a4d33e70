/*
 * tools/cli/cli.c -- helpers shared by the keyshift subcommands: messages,
 * options, number and duration parsing, output encodings, the manual's
 * footer and the rollout log's actor.  The keys a command uses are opened
 * in cli_keys.c, its databases in cli_db.c, its input read in
 * cli_input.c.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
int ks_cli_write_stdout(const uint8_t *p, size_t n)
{
    if (n != 0 && fwrite(p, 1, n, stdout) != n) {
        ks_cli_error("cannot write standard output");
        return EX_IOERR;
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
