/*
 * fuzz/fuzz_aws_creds.c -- what keyshift-kms-aws reads from its
 * credential sources (docs/kms-plugin.md [KP-AWS-10..14]) on arbitrary
 * bytes: the AWS shared config and credentials files
 * (tools/kms-aws/kms_ini.c, kms_ini_parse), credential_process's and the
 * metadata endpoints' JSON, STS's XML answers and ISO 8601 times
 * (tools/kms-aws/creds_parse.c), and IMDS's region answer (its check
 * there, with tools/kms-aws/sigv4.c's scope rule).  The three files are
 * compiled in here: they do no I/O and need only libsodium and jansson,
 * which every target links.
 *
 * The first byte picks the reader, the rest is its input:
 *   0..2  a shared file, section "default", "profile ks" or "ks", read
 *         for the keys the plugin's profile reader wants;
 *   3, 4  credential_process JSON, metadata (container, IMDS) JSON;
 *   5..7  STS: AssumeRole and AssumeRoleWithWebIdentity answers (HTTP
 *         200), an error answer (HTTP 403);
 *   8     an ISO 8601 time;
 *   9     an IMDS region answer (kms_creds_region).
 * Oracles (each failure calls abort()):
 *   1. Shared files: a refusal names the file and a line ("fuzz:N:") or
 *      the file; an acceptance fills each seen key with 1..cap-1
 *      printable bytes (spaces only where allowed) and leaves the others
 *      empty; a second parse of the same bytes gives the same result.
 *   2. Credentials: an acceptance has an access key id and secret of
 *      printable ASCII without spaces, a token empty or likewise, and,
 *      for STS, an expiry; every refusal leaves the credentials zeroed
 *      and says why.
 *   3. Times: an accepted time formats back (gmtime, strftime) to the
 *      same first 19 characters.
 *   4. Regions: accepted exactly when the answer is 1 to 64 lowercase
 *      letters, digits and '-' (a reference scan here), then copied
 *      whole; refused, the region is left empty.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tools/kms-aws/creds_parse.c"
#include "../tools/kms-aws/kms_ini.c"
#include "../tools/kms-aws/sigv4.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether s is printable ASCII (spaces when allowed). */
static int printable(const char *s, int spaces)
{
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 32 || c >= 127 || (c == ' ' && !spaces)) {
            return 0;
        }
    }
    return 1;
}

/* The profile keys, into fields of 1025 bytes (the widest the plugin
 * uses for a free-form value; the ones it bounds tighter are checked
 * here at their own caps). */
#define NKEYS 8
static const char *const KEYS[NKEYS] = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                                        "role_arn",          "source_profile",        "credential_process",
                                        "region",            "duration_seconds"};
static const size_t CAPS[NKEYS] = {129, 257, 4097, 2049, 65, 1025, 65, 8};

/* Parse text[0..n) (copied) for section; results into vals/seen. */
static int parse_ini(const uint8_t *text, size_t n, const char *section, char vals[NKEYS][4097], int seen[NKEYS],
                     char *err, size_t errlen)
{
    kms_ini_want want[NKEYS];
    int found = 0;
    char *copy = malloc(n + 1);
    if (copy == NULL) {
        abort();
    }
    memcpy(copy, text, n);
    copy[n] = '\0';
    for (size_t i = 0; i < NKEYS; i++) {
        vals[i][0] = '\0';
        want[i] = (kms_ini_want){KEYS[i], vals[i], CAPS[i], i == 5, 0};
    }
    int r = kms_ini_parse("fuzz", copy, n, section, want, NKEYS, &found, err, errlen);
    for (size_t i = 0; i < NKEYS; i++) {
        seen[i] = want[i].seen;
    }
    free(copy);
    return r == 0 ? found : -1;
}

/* Oracle 1. */
static void fuzz_ini(const uint8_t *text, size_t n, const char *section)
{
    static char a[NKEYS][4097], b[NKEYS][4097];
    int sa[NKEYS], sb[NKEYS];
    char ea[512], eb[512];
    int ra = parse_ini(text, n, section, a, sa, ea, sizeof ea);
    int rb = parse_ini(text, n, section, b, sb, eb, sizeof eb);
    if (ra != rb || memcmp(sa, sb, sizeof sa) != 0) {
        abort();
    }
    if (ra < 0) {
        if (strncmp(ea, "fuzz:", 5) != 0 || strcmp(ea, eb) != 0) {
            abort();
        }
        return;
    }
    for (size_t i = 0; i < NKEYS; i++) {
        size_t len = strlen(a[i]);
        if (strcmp(a[i], b[i]) != 0 || (sa[i] && (len == 0 || len >= CAPS[i] || !printable(a[i], i == 5))) ||
            (!sa[i] && len != 0) || (sa[i] && ra == 0)) {
            abort();
        }
    }
}

/* Oracle 2 for one answer. */
static void check_creds(kms_status st, const kms_creds *c, const char *err, int sts)
{
    static const kms_creds ZERO;
    if (st != KMS_OK) {
        if (memcmp(c, &ZERO, sizeof *c) != 0 || err[0] == '\0') {
            abort();
        }
        return;
    }
    if (c->access_key_id[0] == '\0' || c->secret_access_key[0] == '\0' || !printable(c->access_key_id, 0) ||
        !printable(c->secret_access_key, 0) || !printable(c->session_token, 0) ||
        (sts && (c->expires == 0 || c->session_token[0] == '\0'))) {
        abort();
    }
}

/* Oracle 3. */
static void fuzz_time(const char *s, size_t n)
{
    time_t t;
    struct tm tm;
    char back[32];
    if (kms_creds_parse_time(s, n, &t) != 0) {
        return;
    }
    if (gmtime_r(&t, &tm) == NULL || strftime(back, sizeof back, "%Y-%m-%dT%H:%M:%S", &tm) != 19 ||
        memcmp(back, s, 19) != 0) {
        abort();
    }
}

/* Oracle 4. */
static void fuzz_region(const char *s, size_t n)
{
    char region[65];
    int want = n >= 1 && n <= 64;
    for (size_t i = 0; want && i < n; i++) {
        want = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-';
    }
    memset(region, 'x', sizeof region);
    int got = kms_creds_region(region, sizeof region, s, n) == 0;
    if (got != want || (got ? strlen(region) != n || memcmp(region, s, n) != 0 : region[0] != '\0')) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const SECTIONS[] = {"default", "profile ks", "ks"};
    static const char *const ACTIONS[] = {"AssumeRole", "AssumeRoleWithWebIdentity", "AssumeRole"};
    char err[512] = "";
    kms_creds c;
    if (size == 0 || size > 70000) {
        return 0;
    }
    unsigned mode = data[0] % 10;
    const char *doc = (const char *)data + 1;
    size_t n = size - 1;
    if (mode <= 2) {
        fuzz_ini(data + 1, n, SECTIONS[mode]);
    } else if (mode <= 4) {
        kms_status st = kms_creds_parse_json(doc, n, mode == 3 ? CREDS_JSON_PROCESS : CREDS_JSON_HTTP, &c, err,
                                             sizeof err);
        check_creds(st, &c, err, 0);
    } else if (mode <= 7) {
        kms_status st = kms_creds_parse_sts(doc, n, mode == 7 ? 403 : 200, ACTIONS[mode - 5], &c, err, sizeof err);
        if (mode == 7 && st == KMS_OK) {
            abort();
        }
        check_creds(st, &c, err, 1);
    } else if (mode == 8) {
        fuzz_time(doc, n);
    } else {
        fuzz_region(doc, n);
    }
    return 0;
}
