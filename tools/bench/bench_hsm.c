/*
 * tools/bench/bench_hsm.c -- `build/bin/bench hsm` (part of `make bench`): the
 * pkcs11 provider on a real SoftHSM2 token against the local keyring, in
 * the same run, by the measurements of tools/bench/bench_remote.c:
 *
 * one wrap and one unwrap (C_Encrypt / C_Decrypt with CKM_AES_GCM on the
 * token) against the local keyring's, and a 20-DEK rewrap migration to a
 * key in the token against the same rewrap to the local key's version 2
 * (goal: at most 1.25 times the local time).
 *
 * The token is made for the run in a temporary directory (SOFTHSM2_CONF,
 * softhsm2-util --init-token), never the system's store, and removed.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#define _DEFAULT_SOURCE   /* setenv */

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "bench.h"

#define HSM_LABEL "ks-bench"
#define HSM_PIN "5678"
#define HSM_KEY "hsm/bench"

/* ---- the token -------------------------------------------------------------- */

/* A SoftHSM2 configuration and an initialised token under dir (which
 * exists), with SOFTHSM2_CONF pointing at it before the module loads. */
static int token_make(const char *dir)
{
    char conf[512], tokens[512];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    snprintf(conf, sizeof conf, "%s/softhsm2.conf", dir);
    if (mkdir(tokens, 0700) != 0) {
        return -1;
    }
    FILE *f = fopen(conf, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n", tokens);
    fclose(f);
    setenv("SOFTHSM2_CONF", conf, 1);
    char *const argv[] = {"softhsm2-util", "--init-token", "--free", "--label", HSM_LABEL,
                          "--so-pin", "1234", "--pin", HSM_PIN, NULL};
    return bench_spawn(argv, NULL, 0);
}

/* nftw callback: remove one entry (children before their directory). */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* See bench.h. */
void bench_tree_remove(const char *dir)
{
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "bench: could not remove %s\n", dir);
    }
}

/* See bench.h. */
int bench_hsm(void)
{
    char dir[256], tdir[300];
    ks_keyring *kr = NULL;
    ks_ctx *unused = NULL;
    ks_provider hsm = {NULL, NULL, NULL};
    int rc = -1;
    if (bench_keyring(dir, sizeof dir, &kr, &unused) != 0) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    snprintf(tdir, sizeof tdir, "%s/softhsm", dir);
    ks_pkcs11_config pc = {NULL, HSM_LABEL, NULL, {(const uint8_t *)HSM_PIN, sizeof HSM_PIN - 1},
                           KS_PKCS11_GCM_P11KIT, 0};
    if (mkdir(tdir, 0700) != 0 || token_make(tdir) != 0 || ks_pkcs11_open(&pc, &hsm) != KS_OK) {
        fprintf(stderr, "bench: cannot set up a SoftHSM2 token (is softhsm2 installed?)\n");
        goto done;
    }
    ks_bytes hk = {(const uint8_t *)HSM_KEY, sizeof HSM_KEY - 1};
    if (hsm.ops->admin->create(hsm.self, hk, 0) != KS_OK) {
        fprintf(stderr, "bench: cannot create the token's key\n");
        goto done;
    }
    const remote_case c = {"hsm", &hsm, "hsm/", HSM_KEY, 1};
    rc = bench_remote(&c, kr, dir);
done:
    ks_provider_destroy(&hsm);
    ks_ctx_free(unused);
    ks_keyring_close(kr);
    if (kr != NULL) {
        bench_tree_remove(dir);
    }
    return rc;
}
