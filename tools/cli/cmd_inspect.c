/*
 * tools/cli/cmd_inspect.c -- `keyshift inspect`: parse one envelope with the
 * strict parser and print its fields, as text or as one JSON object.
 *
 * The input is untrusted: it is read under a size bound (the largest
 * envelope the limits allow) and handed to ks_envelope_parse() only.
 * Nothing here decrypts, and nothing printed is secret: the wrapped DEK is
 * ciphertext under a KEK.
 */
#define _POSIX_C_SOURCE 200809L /* open(O_CLOEXEC), read, fstat */

#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Print the subcommand's manual to f. */
static void usage(FILE *f)
{
    fprintf(f,
            "NAME\n"
            "    keyshift inspect - parse one envelope strictly and print its fields\n"
            "\n"
            "SYNOPSIS\n"
            "    keyshift inspect [--json] [--max-ciphertext BYTES] [FILE|-]\n"
            "\n"
            "DESCRIPTION\n"
            "    Reads exactly one envelope from FILE, or from standard input when FILE\n"
            "    is '-' or absent, and checks it against the canonical form of\n"
            "    docs/format.md. Nothing is decrypted and no key is needed.\n"
            "\n"
            "    Input longer than the largest envelope the limits allow is refused\n"
            "    before it is read in full (a regular file: before any byte is read).\n"
            "\n"
            "OPTIONS\n"
            "    --json\n"
            "        Print one JSON object: version, algorithm, tenant, key_id,\n"
            "        key_version, wrapped_dek (hex), nonce (hex), ciphertext_len,\n"
            "        header_len, total_len, and for version 2 purpose and commitment\n"
            "        (hex). On invalid input, also print {\"error\":NAME,\"offset\":N}.\n"
            "    --max-ciphertext BYTES\n"
            "        Lower the ciphertext limit (default %zu, the most %zu).\n"
            "    -h, --help\n"
            "        Print this manual.\n"
            "\n"
            "OUTPUT\n"
            "    On invalid input, one line on standard error:\n"
            "        keyshift: invalid envelope: ERROR at byte OFFSET\n"
            "    where ERROR is one of truncated, bad-magic, unsupported-version,\n"
            "    wire-type, noncanonical-varint, varint-overflow, field-order,\n"
            "    unknown-field, missing-field, too-large, bad-value, and OFFSET is the\n"
            "    byte at which the problem was found.\n"
            "\n"
            "EXIT STATUS\n"
            "    0   the envelope is valid\n"
            "    64  usage error\n"
            "    65  the envelope is invalid (including too large)\n"
            "    66  FILE does not exist or cannot be opened\n"
            "    74  read or write error\n"
            "\n"
            "EXAMPLES\n"
            "    keyshift inspect record.kse\n"
            "    sqlite3 app.db \"SELECT writefile('/dev/stdout', card) FROM t WHERE id=42\" \\\n"
            "        | keyshift inspect --json -\n",
            (size_t)KS_CIPHERTEXT_DEFAULT_MAX, (size_t)KS_CIPHERTEXT_HARD_MAX);
}

/* Print a bytes field as "name: value" where value is text (charset-
 * restricted fields) or hex. */
static void put_text_field(const char *name, const ks_bytes *v, int hex)
{
    printf("%-13s", name);
    if (hex) {
        ks_cli_put_hex(stdout, v->ptr, v->len);
    } else {
        fwrite(v->ptr, 1, v->len, stdout);
    }
    putchar('\n');
}

/* The human-readable listing. */
static void print_text(const ks_envelope *e)
{
    printf("%-13s%u\n", "version:", e->version);
    printf("%-13s%s (%u)\n", "algorithm:", ks_alg_name(e->algorithm), e->algorithm);
    put_text_field("tenant:", &e->tenant, 0);
    put_text_field("key_id:", &e->key_id, 0);
    printf("%-13s%u\n", "key_version:", e->key_version);
    printf("%-13s%zu bytes  ", "wrapped_dek:", e->wrapped_dek.len);
    ks_cli_put_hex(stdout, e->wrapped_dek.ptr, e->wrapped_dek.len);
    putchar('\n');
    put_text_field("nonce:", &e->nonce, 1);
    if (e->version >= KS_FORMAT_V2) {
        put_text_field("purpose:", &e->purpose, 0);
        put_text_field("commitment:", &e->commitment, 1);
    }
    printf("%-13s%zu bytes (%zu of data, %d of tag)\n", "ciphertext:", e->ciphertext.len,
           e->ciphertext.len - KS_TAG_LEN, KS_TAG_LEN);
    printf("%-13s%zu bytes of header, %zu in all\n", "size:", e->header_len, e->total_len);
}

/* Print `"key":"hex"` with a leading comma. */
static void json_hex(const char *key, const ks_bytes *v)
{
    printf(",\"%s\":\"", key);
    ks_cli_put_hex(stdout, v->ptr, v->len);
    putchar('"');
}

/* Print `"key":"string"` with a leading comma. */
static void json_str(const char *key, const ks_bytes *v)
{
    printf(",\"%s\":", key);
    ks_cli_put_json_string(stdout, v->ptr, v->len);
}

/* The --json object, on one line. */
static void print_json(const ks_envelope *e)
{
    printf("{\"version\":%u,\"algorithm\":\"%s\"", e->version, ks_alg_name(e->algorithm));
    json_str("tenant", &e->tenant);
    json_str("key_id", &e->key_id);
    printf(",\"key_version\":%u", e->key_version);
    json_hex("wrapped_dek", &e->wrapped_dek);
    json_hex("nonce", &e->nonce);
    if (e->version >= KS_FORMAT_V2) {
        json_str("purpose", &e->purpose);
        json_hex("commitment", &e->commitment);
    }
    printf(",\"ciphertext_len\":%zu,\"header_len\":%zu,\"total_len\":%zu}\n", e->ciphertext.len,
           e->header_len, e->total_len);
}

/* Report an invalid envelope: the stable stderr line, and with --json the
 * same facts on stdout.  Returns EX_DATAERR. */
static int invalid(ks_err code, size_t offset, int json)
{
    fprintf(stderr, KS_PROG ": invalid envelope: %s at byte %zu\n", ks_err_name(code), offset);
    if (json) {
        printf("{\"error\":\"%s\",\"offset\":%zu}\n", ks_err_name(code), offset);
    }
    return EX_DATAERR;
}

/* See cli.h. */
int ks_cmd_inspect(int argc, char **argv)
{
    int json = 0, npos = 0;
    const char *path = NULL, *max_ct = NULL;
    const ks_cli_opt opts[] = {
        {"--json", NULL, &json},
        {"--max-ciphertext", &max_ct, NULL},
        {NULL, NULL, NULL},
    };
    int rc;
    if (ks_cli_parse_opts("inspect", usage, argc, argv, opts, &path, 1, &npos, &rc)) {
        return rc;
    }
    ks_limits lim;
    ks_limits_default(&lim);
    if (max_ct != NULL &&
        ks_cli_parse_size(max_ct, KS_TAG_LEN, KS_CIPHERTEXT_HARD_MAX, &lim.max_ciphertext) != 0) {
        return ks_cli_usage_error("inspect", "--max-ciphertext needs a number of bytes from %d to %zu",
                                  KS_TAG_LEN, (size_t)KS_CIPHERTEXT_HARD_MAX);
    }

    const size_t max = ks_envelope_max_len(&lim);
    uint8_t *buf = NULL;
    size_t len = 0;
    int too_long = 0;
    rc = ks_cli_read_input(path, max, &buf, &len, &too_long);
    if (too_long) {
        /* [F-LIMITS-1] no valid envelope is longer than max: the first
         * byte past it is where the input went wrong. */
        return invalid(KS_ERR_TOO_LARGE, max, json);
    }
    if (rc != EX_OK) {
        return rc;
    }

    ks_envelope env;
    ks_parse_error perr;
    ks_err e = ks_envelope_parse(buf, len, &lim, &env, &perr);
    if (e != KS_OK) {
        rc = invalid(perr.code, perr.offset, json);
    } else if (json) {
        print_json(&env);
    } else {
        print_text(&env);
    }
    free(buf);
    return rc;
}
