/*
 * tests/kms_aws_driver.c -- drives tools/kms-aws/kms.c for
 * tests/kms_aws_test.sh (built by the Makefile, never installed).
 *
 *   kms_aws_driver encrypt  KEY DEKFILE AAD OUTFILE [TENANT]
 *   kms_aws_driver decrypt  KEY CTFILE  AAD OUTFILE [TENANT]
 *   kms_aws_driver describe KEY
 *
 * Configuration comes from the environment (kms_config_load).  Each
 * prints the call's status name on stdout (describe adds the key state
 * and enabled flag) and the error details on stderr; it exits 0 when the
 * call returned KMS_OK, 1 otherwise, 2 on usage or I/O errors.  The DEK is
 * only ever read from and written to files (mode 0600), never printed.
 * The encryption context is AAD (as bytes), tenant TENANT (default
 * "acme"), key id "orders/card", version "3", purpose "dek".
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tools/kms-aws/kms.h"

/* Read at most cap bytes of path into buf; the length, or -1. */
static long read_file(const char *path, uint8_t *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r <= 0) {
            close(fd);
            return r < 0 ? -1 : (long)n;
        }
        n += (size_t)r;
        if (n == cap) {
            uint8_t extra;
            r = read(fd, &extra, 1);
            close(fd);
            return r == 0 ? (long)n : -1;
        }
    }
}

/* Write buf to path (created 0600, truncated).  0 or -1. */
static int write_file(const char *path, const uint8_t *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    return close(fd);
}

/* Print st on stdout and err's details on stderr; the exit status. */
static int report(kms_status st, const kms_error *err)
{
    printf("%s\n", kms_status_name(st));
    if (st != KMS_OK) {
        fprintf(stderr, "kms_aws_driver: %s (http %ld, type '%s'): %s\n", kms_status_name(st), err->http_status,
                err->type, err->message);
    }
    return st == KMS_OK ? 0 : 1;
}

/* Run one subcommand. */
int main(int argc, char **argv)
{
    char why[512];
    kms_config cfg;
    kms_error err;
    int rc = 2;

    if (kms_global_init() != 0 || argc < 3) {
        fprintf(stderr, "usage: kms_aws_driver encrypt|decrypt|describe KEY ...\n");
        return 2;
    }
    if (kms_config_load(&cfg, why, sizeof why) != KMS_OK) {
        fprintf(stderr, "kms_aws_driver: %s\n", why);
        printf("invalid\n");
        return 2;
    }
    kms_client *c = kms_client_open(&cfg);
    kms_config_wipe(&cfg);
    if (c == NULL) {
        fprintf(stderr, "kms_aws_driver: cannot open a client\n");
        return 2;
    }
    const char *cmd = argv[1], *key = argv[2];
    if (strcmp(cmd, "describe") == 0 && argc == 3) {
        kms_key_info info;
        kms_status st = kms_describe_key(c, key, &info, &err);
        rc = report(st, &err);
        if (st == KMS_OK) {
            printf("state %s\nenabled %d\nusage %s\n", info.key_state, info.enabled, info.key_usage);
        }
    } else if ((strcmp(cmd, "encrypt") == 0 || strcmp(cmd, "decrypt") == 0) && (argc == 6 || argc == 7)) {
        static uint8_t in[KMS_MAX_CIPHERTEXT], out[KMS_MAX_CIPHERTEXT];
        int enc = cmd[0] == 'e';
        long n = read_file(argv[3], in, enc ? KMS_MAX_PLAINTEXT : KMS_MAX_CIPHERTEXT);
        kms_context ctx = {(const uint8_t *)argv[4], strlen(argv[4]), argc == 7 ? argv[6] : "acme", "orders/card",
                           "3", "dek"};
        size_t out_len = 0;
        if (n <= 0) {
            fprintf(stderr, "kms_aws_driver: cannot read %s\n", argv[3]);
        } else {
            kms_status st = enc ? kms_encrypt(c, key, in, (size_t)n, &ctx, out, sizeof out, &out_len, &err)
                                : kms_decrypt(c, key, in, (size_t)n, &ctx, out, sizeof out, &out_len, &err);
            rc = report(st, &err);
            if (st == KMS_OK && write_file(argv[5], out, out_len) != 0) {
                fprintf(stderr, "kms_aws_driver: cannot write %s\n", argv[5]);
                rc = 2;
            }
        }
        sodium_memzero(in, sizeof in);
        sodium_memzero(out, sizeof out);
    } else {
        fprintf(stderr, "usage: kms_aws_driver encrypt|decrypt KEY IN AAD OUT [TENANT] | describe KEY\n");
    }
    kms_client_close(c);
    return rc;
}
