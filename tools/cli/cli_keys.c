/*
 * tools/cli/cli_keys.c -- open the keys a keyshift subcommand uses: a
 * keyring file or a provider registry, and a ks_ctx over their provider;
 * say why a keyring, a registry or one of its providers did not open.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

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
