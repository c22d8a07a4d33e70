/*
 * tools/cli/cmd_crypt.c -- `keyshift encrypt` and `keyshift decrypt`: seal
 * standard input into one envelope, or open one envelope, with the local
 * keyring.
 *
 * Plaintext is handled in sodium_malloc'd memory, wiped before exit, and
 * written only by decrypt, only to standard output, only after the
 * envelope authenticated.  Every failure message is the same whatever
 * secret was involved; none carries plaintext, keys or AAD.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "cli.h"

/* The largest plaintext one envelope can carry under the default limits. */
#define MAX_PLAINTEXT (KS_CIPHERTEXT_DEFAULT_MAX - KS_TAG_LEN)

/* Manual of `keyshift encrypt`. */
static void usage_encrypt(FILE *f)
{
    fprintf(f,
            "NAME\n"
            "    keyshift encrypt - seal standard input into one envelope\n"
            "\n"
            "SYNOPSIS\n"
            "    keyshift encrypt --tenant T --key-id K [--key-version N] [--context C]\n"
            "                     [--purpose P] [--format 1|2] [--algorithm NAME]\n"
            "                     [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
            "                     < plaintext > envelope\n"
            "\n"
            "DESCRIPTION\n"
            "    Reads at most %zu bytes of plaintext from standard input, seals them\n"
            "    under a fresh data key wrapped by key K (in the keyring, or with\n"
            "    --providers in the provider serving K), and writes the\n"
            "    envelope (docs/format.md) to standard output. Of a providers file,\n"
            "    only the provider serving K is opened (decrypt: the one serving\n"
            "    the envelope's key): no other is logged in to or started.\n"
            "\n"
            "OPTIONS\n"
            "    --tenant T        tenant the record belongs to ([A-Za-z0-9._:-], 1..64)\n"
            "    --key-id K        key-encryption key\n"
            "    --key-version N   that key's version (default: its primary)\n"
            "    --context C       bytes the reader rebuilds from trusted data, e.g.\n"
            "                      'payments:42:card', taken as its exact bytes; bound into\n"
            "                      the ciphertext (default: empty; at most 4096 bytes)\n"
            "    --purpose P       format 2: what the value is, e.g. 'card' (default: 'default')\n"
            "    --format 1|2      envelope format (default 2, key-committing)\n"
            "    --algorithm NAME  xchacha20-poly1305 (default) or aes-256-gcm (needs AES-NI\n"
            "                      on every reader; refused where unavailable)\n"
            "    --keyring FILE    default: $KEYSHIFT_KEYRING\n"
            "    --passphrase-file FILE  keyring passphrase (default: $KEYSHIFT_PASSPHRASE);\n"
            "                      " KS_CLI_PASSPHRASE_RULE "\n"
            "    --providers FILE  " KS_CLI_KEYS_RULE
            "    -h, --help        print this manual\n"
            "\n"
            "EXIT STATUS\n"
            "    0 sealed; 64 usage, or a KMS plugin answering `invalid'; 65 input too\n"
            "    large; 69 algorithm or provider unavailable; 75 provider timeout; 77 key\n"
            "    disabled, destroyed, denied or missing (or served by no provider);\n"
            "    78 insecure, unreadable or corrupt keyring or providers file, wrong\n"
            "    passphrase, wrong or locked PIN, or a KMS plugin that names no program,\n"
            "    refuses the hello, answers `integrity' or writes a line the protocol\n"
            "    refuses (docs/kms-plugin.md [KP-BRIDGE-13]).\n"
            "\n"
            "EXAMPLE\n"
            "    printf 4111111111111111 | keyshift encrypt --tenant acme --key-id payments/kek \\\n"
            "        --purpose card --context payments:42:card > card.kse\n",
            (size_t)MAX_PLAINTEXT);
}

/* Manual of `keyshift decrypt`. */
static void usage_decrypt(FILE *f)
{
    fputs("NAME\n"
          "    keyshift decrypt - open one envelope from standard input\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift decrypt [--context C] [--purpose P] [--tenant T]\n"
          "                     [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
          "                     < envelope > plaintext\n"
          "\n"
          "DESCRIPTION\n"
          "    Parses the envelope strictly, unwraps its data key with the keyring (or\n"
          "    the provider serving its key_id),\n"
          "    checks the key commitment (format 2) and the authentication tag, and\n"
          "    only then writes the plaintext to standard output. On any failure\n"
          "    nothing at all is written to standard output.\n"
          "\n"
          "OPTIONS\n"
          "    --context C   the context the writer bound, its exact bytes (default:\n"
          "                  empty, which opens only what was sealed without one)\n"
          "    --purpose P   require this purpose (format 2)\n"
          "    --tenant T    require this tenant\n"
          "    --keyring FILE, --passphrase-file FILE, --providers FILE   as for encrypt\n"
          "    -h, --help    print this manual\n"
          "\n"
          "EXIT STATUS\n"
          "    0 opened; 64 usage, or a KMS plugin answering `invalid'; 65 malformed\n"
          "    envelope, or authentication failed (wrong key, context, tenant or\n"
          "    purpose, or tampering: one message for all); 69 provider or algorithm\n"
          "    unavailable; 75 provider timeout; 77 key disabled, destroyed, denied or\n"
          "    missing; 78 insecure, unreadable or corrupt keyring or providers file,\n"
          "    wrong passphrase, wrong PIN, or a KMS plugin that names no program,\n"
          "    refuses the hello, answers `integrity' or writes a line the protocol\n"
          "    refuses (docs/kms-plugin.md [KP-BRIDGE-13]).\n",
          f);
}

/* A ks_bytes view of a C string (NULL gives the empty view). */
static ks_bytes str_view(const char *s)
{
    return s == NULL ? (ks_bytes){NULL, 0} : (ks_bytes){(const uint8_t *)s, strlen(s)};
}

/* Read standard input (at most max bytes) into sodium_malloc'd memory, so
 * that plaintext never sits in ordinary heap pages. */
static int read_secret_stdin(size_t max, uint8_t **out, size_t *len, const char *what)
{
    uint8_t *raw;
    int too_long;
    int rc = ks_cli_read_input(NULL, max, &raw, len, &too_long);
    if (too_long) {
        ks_cli_error("%s is larger than %zu bytes", what, max);
        return EX_DATAERR;
    }
    if (rc != EX_OK) {
        return rc;
    }
    *out = sodium_malloc(*len ? *len : 1);
    if (*out == NULL) {
        sodium_memzero(raw, *len);
        free(raw);
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    if (*len) {
        memcpy(*out, raw, *len);
    }
    sodium_memzero(raw, *len);
    free(raw);
    return EX_OK;
}

/* Report a seal or open failure by class, never by secret; a provider
 * that failed to open when first needed as its registry's load would. */
static int crypt_failed(const char *verb, ks_err e, const ks_parse_error *perr,
                        const ks_cli_keys *keys)
{
    const int rc = ks_cli_keys_open_failed(keys); /* [P-LOAD-5] a provider opened late */
    if (rc != EX_OK) {
        return rc;
    }
    if (ks_err_is_rejection(e) && perr != NULL) {
        ks_cli_error("invalid envelope: %s at byte %zu", ks_err_name(perr->code), perr->offset);
    } else if (e == KS_ERR_AUTH_FAILED) {
        ks_cli_error("cannot %s: authentication failed", verb);
    } else {
        ks_cli_error("cannot %s: %s", verb, ks_err_name(e));
    }
    return ks_cli_exit_code(e);
}

/* Parse --format and --algorithm into p. */
static int seal_choices(const char *format, const char *algorithm, ks_seal_params *p)
{
    if (format != NULL && strcmp(format, "1") != 0 && strcmp(format, "2") != 0) {
        return ks_cli_usage_error("encrypt", "--format must be 1 or 2");
    }
    p->format = format != NULL && format[0] == '1' ? KS_FORMAT_V1 : KS_FORMAT_V2;
    p->algorithm = algorithm != NULL ? ks_alg_from_name(algorithm) : KS_ALG_XCHACHA20POLY1305;
    if (p->algorithm == 0) {
        return ks_cli_usage_error("encrypt", "--algorithm must be xchacha20-poly1305 or aes-256-gcm");
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cmd_encrypt(int argc, char **argv)
{
    const char *keyring = NULL, *passfile = NULL, *tenant = NULL, *key_id = NULL, *version = NULL;
    const char *context = NULL, *purpose = NULL, *format = NULL, *algorithm = NULL;
    const char *providers = NULL;
    int npos = 0;
    const ks_cli_opt opts[] = {
        {"--keyring", &keyring, NULL}, {"--passphrase-file", &passfile, NULL},
        {"--providers", &providers, NULL},
        {"--tenant", &tenant, NULL},   {"--key-id", &key_id, NULL},
        {"--key-version", &version, NULL}, {"--context", &context, NULL},
        {"--purpose", &purpose, NULL}, {"--format", &format, NULL},
        {"--algorithm", &algorithm, NULL}, {NULL, NULL, NULL},
    };
    int rc;
    if (ks_cli_parse_opts("encrypt", usage_encrypt, argc, argv, opts, NULL, 0, &npos, &rc)) {
        return rc;
    }
    if (tenant == NULL || key_id == NULL) {
        return ks_cli_usage_error("encrypt", "--tenant and --key-id are required");
    }
    ks_seal_params p = {0};
    if ((rc = seal_choices(format, algorithm, &p)) != EX_OK) {
        return rc;
    }
    size_t v = 0;
    if (version != NULL && ks_cli_parse_size(version, 1, UINT32_MAX, &v) != 0) {
        return ks_cli_usage_error("encrypt", "--key-version must be a number from 1");
    }
    if (p.format == KS_FORMAT_V1 && purpose != NULL) {
        return ks_cli_usage_error("encrypt", "--purpose needs --format 2");
    }
    p.tenant = str_view(tenant);
    p.key_id = str_view(key_id);
    p.key_version = (uint32_t)v;
    p.purpose = p.format == KS_FORMAT_V2 ? str_view(purpose != NULL ? purpose : "default") : str_view(NULL);
    p.context = str_view(context);

    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    uint8_t *pt = NULL, *out = NULL;
    size_t pt_len = 0, out_len = 0;
    if ((rc = read_secret_stdin(MAX_PLAINTEXT, &pt, &pt_len, "the plaintext")) != EX_OK) {
        return rc;
    }
    size_t cap = ks_seal_max_len(&p, pt_len);
    if (cap == 0) {
        rc = ks_cli_usage_error("encrypt", "invalid --tenant, --key-id, --purpose or --context");
    } else if ((out = malloc(cap)) == NULL) {
        ks_cli_error("out of memory");
        rc = EX_OSERR;
    } else if ((rc = ks_cli_ctx_open_lazy("encrypt", keyring, passfile, providers, &keys,
                                          &ctx)) == EX_OK) {
        ks_err e = ks_seal(ctx, &p, pt, pt_len, out, cap, &out_len);
        rc = e == KS_OK ? ks_cli_write_stdout(out, out_len) : crypt_failed("encrypt", e, NULL, &keys);
    }
    sodium_free(pt);
    free(out);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* See cli.h. */
int ks_cmd_decrypt(int argc, char **argv)
{
    const char *keyring = NULL, *passfile = NULL, *tenant = NULL, *context = NULL, *purpose = NULL;
    const char *providers = NULL;
    int npos = 0;
    const ks_cli_opt opts[] = {
        {"--keyring", &keyring, NULL}, {"--passphrase-file", &passfile, NULL},
        {"--providers", &providers, NULL},
        {"--tenant", &tenant, NULL},   {"--context", &context, NULL},
        {"--purpose", &purpose, NULL}, {NULL, NULL, NULL},
    };
    int rc;
    if (ks_cli_parse_opts("decrypt", usage_decrypt, argc, argv, opts, NULL, 0, &npos, &rc)) {
        return rc;
    }
    ks_open_params p = {str_view(context), str_view(tenant), str_view(purpose)};
    if (p.context.len > KS_CONTEXT_MAX) {
        return ks_cli_usage_error("decrypt", "--context is longer than %d bytes", KS_CONTEXT_MAX);
    }
    uint8_t *env = NULL, *pt = NULL;
    size_t env_len = 0, pt_len = 0;
    int too_long;
    rc = ks_cli_read_input(NULL, ks_envelope_max_len(NULL), &env, &env_len, &too_long);
    if (too_long) {
        ks_cli_error("invalid envelope: too-large at byte %zu", ks_envelope_max_len(NULL));
        return EX_DATAERR;
    }
    if (rc != EX_OK) {
        return rc;
    }
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    if ((pt = sodium_malloc(env_len ? env_len : 1)) == NULL) {
        ks_cli_error("out of memory");
        rc = EX_OSERR;
    } else if ((rc = ks_cli_ctx_open_lazy("decrypt", keyring, passfile, providers, &keys,
                                          &ctx)) == EX_OK) {
        ks_parse_error perr;
        ks_err e = ks_open(ctx, env, env_len, &p, pt, env_len, &pt_len, &perr);
        rc = e == KS_OK ? ks_cli_write_stdout(pt, pt_len) : crypt_failed("decrypt", e, &perr, &keys);
    }
    if (pt != NULL) {
        sodium_free(pt); /* wipes */
    }
    free(env);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}
