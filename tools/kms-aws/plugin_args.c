/*
 * tools/kms-aws/plugin_args.c -- the command line of keyshift-kms-aws:
 * the --key lines that map each keyshift key version to one KMS key, the
 * overrides of the AWS configuration, and the rules that resolve a
 * (key_id, key_version) to a KMS key (docs/kms-plugin.md [KP-AWS-4]).
 */
#define _POSIX_C_SOURCE 200809L
#include "plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* printf into err (errlen bytes). */
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Where `make install' puts docs/ (the Makefile's DOCDIR), which the
 * manual names so that its docs/NAME.md citations can be found. */
#ifndef KS_DOCDIR
#define KS_DOCDIR "/usr/local/share/doc/keyshift"
#endif

/* The manual (plugin.h). */
const char *pl_help_text(void)
{
    return "NAME\n"
           "    keyshift-kms-aws - keyshift KMS plugin for AWS KMS\n"
           "\n"
           "SYNOPSIS\n"
           "    keyshift-kms-aws [--key=KEYID,VERSION,KMSKEY[,decrypt-only]]...\n"
           "                     [--region=REGION] [--endpoint-url=URL]\n"
           "                     [--profile=PROFILE] [--timeout-ms=N]\n"
           "    keyshift-kms-aws --help | --version\n"
           "\n"
           "DESCRIPTION\n"
           "    A KMS plugin (docs/kms-plugin.md, protocol version 1): keyshift starts it,\n"
           "    writes one JSON request per line to its standard input and reads one\n"
           "    response per line from its standard output. It wraps a DEK with AWS KMS\n"
           "    Encrypt, unwraps it with Decrypt (always naming the KMS key, so that a\n"
           "    ciphertext of another key is refused) and describes a key version with\n"
           "    DescribeKey. The wrap AAD is bound as the encryption context. It never\n"
           "    retries: keyshift owns deadlines, retries and rate limits. It exits 0\n"
           "    when its standard input ends. Run by hand, it serves the same protocol.\n"
           "\n"
           "KEYS AND VERSIONS\n"
           "    A KMS key has no versions keyshift can choose, so each keyshift key\n"
           "    version is one KMS key, named by a --key line:\n"
           "\n"
           "    --key=KEYID,VERSION,KMSKEY[,decrypt-only]\n"
           "        KEYID    the keyshift key_id, 1-256 bytes of [A-Za-z0-9._:/@+=-]\n"
           "        VERSION  its key version, 1 to 4294967295, in decimal\n"
           "        KMSKEY   the KMS key: a key ARN, an alias ARN, a key id, or\n"
           "                 alias/NAME\n"
           "        decrypt-only  this version unwraps but never wraps\n"
           "    A KEYID given in --key lines has exactly those versions; its primary\n"
           "    (the version keyshift wraps new DEKs under) is the highest version not\n"
           "    marked decrypt-only. A KEYID given in no --key line that is itself a\n"
           "    KMS key ARN or alias ARN (arn:PARTITION:kms:...) has exactly version 1,\n"
           "    that key, primary. Any other KEYID or version is not-found.\n"
           "\n"
           "    To rotate, in two steps: (1) create a KMS key and add its line with\n"
           "    the next VERSION marked decrypt-only to the provider registry's\n"
           "    arguments, then restart every process that uses the registry, so that\n"
           "    each can unwrap under it; (2) then drop decrypt-only from the new line\n"
           "    and add it to the old one, restart again, and rewrap. Keep the old KMS\n"
           "    key enabled and its line listed until nothing is wrapped under it.\n"
           "\n"
           "    A version's state comes from DescribeKey: Enabled is active (decrypt-only\n"
           "    when so marked), Disabled is disabled, PendingDeletion and\n"
           "    PendingReplicaDeletion are destroyed, any other KeyState is disabled.\n"
           "\n"
           "OPTIONS\n"
           "    --region=REGION      the AWS region, instead of AWS_REGION,\n"
           "                         AWS_DEFAULT_REGION, the profile's region or\n"
           "                         the EC2 instance's (IMDSv2)\n"
           "    --endpoint-url=URL   http(s)://HOST[:PORT][/], instead of\n"
           "                         AWS_ENDPOINT_URL_KMS, AWS_ENDPOINT_URL or\n"
           "                         https://kms.REGION.amazonaws.com/\n"
           "    --profile=PROFILE    the shared-file profile, instead of AWS_PROFILE;\n"
           "                         the environment's keys and web identity are\n"
           "                         then not used\n"
           "    --timeout-ms=N       the deadline of one KMS request, and of one walk\n"
           "                         of the credential chain, 1-600000 (default\n"
           "                         4000); a call makes at most a walk and two\n"
           "                         requests, so keep 3N below keyshift's timeout\n"
           "    -h, --help           print this manual and exit 0\n"
           "    --version            print \"keyshift-kms-aws VERSION\" and exit 0\n"
           "    Options take their value after '='; each may be given once, --key as\n"
           "    often as needed.\n"
           "\n"
           "ENVIRONMENT\n"
           "    keyshift passes a plugin only the variables its registry section\n"
           "    names: give this plugin `env-prefix AWS_` (docs/kms-plugin.md\n"
           "    [KP-SEC-1]). HOME is always passed, so ~/.aws is found.\n"
           "    AWS_REGION, AWS_DEFAULT_REGION\n"
           "        the region, unless --region is given; else the profile's region,\n"
           "        else the EC2 instance's from IMDSv2 (1 s per request; not with\n"
           "        AWS_EC2_METADATA_DISABLED=true)\n"
           "    AWS_ENDPOINT_URL_KMS, AWS_ENDPOINT_URL\n"
           "        the KMS endpoint, unless --endpoint-url is given\n"
           "    AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE\n"
           "        the profile (default \"default\") and the shared files (default\n"
           "        ~/.aws/credentials, ~/.aws/config)\n"
           "    The region and endpoint are read once, at start.\n"
           "\n"
           "CREDENTIALS\n"
           "    Found as the AWS SDKs find them, from the first source configured:\n"
           "    1. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;\n"
           "    2. AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN (and\n"
           "       AWS_ROLE_SESSION_NAME): STS AssumeRoleWithWebIdentity (EKS);\n"
           "    3. the profile: role_arn with source_profile, web_identity_token_file\n"
           "       or credential_source (STS AssumeRole); else aws_access_key_id and\n"
           "       aws_secret_access_key; else credential_process (JSON Version 1);\n"
           "       sso_* is refused;\n"
           "    4. AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (169.254.170.2) or\n"
           "       AWS_CONTAINER_CREDENTIALS_FULL_URI (https, or http to a loopback,\n"
           "       ECS or EKS Pod Identity address), with\n"
           "       AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or _TOKEN (ECS, EKS);\n"
           "    5. EC2 instance metadata, IMDSv2 only (AWS_EC2_METADATA_DISABLED=true\n"
           "       turns it off; AWS_EC2_METADATA_SERVICE_ENDPOINT moves it).\n"
           "    With --profile, 1 and 2 are not used. STS is AWS_ENDPOINT_URL_STS,\n"
           "    AWS_ENDPOINT_URL, else https://sts.REGION.amazonaws.com/\n"
           "    (AWS_STS_REGIONAL_ENDPOINTS=legacy: the global one). A source that is\n"
           "    configured and fails is the answer; no later source is tried. The\n"
           "    credentials are fetched at hello and again 5 minutes before they\n"
           "    expire. With none, every request, hello first, is answered invalid,\n"
           "    naming each source and why it was skipped: keyshift providers check\n"
           "    then exits 78. A source that cannot be reached is unavailable (69).\n"
           "    Standard error names where each set came from, never a secret.\n"
           "\n"
           "IAM PERMISSIONS\n"
           "    kms:Encrypt, kms:Decrypt and kms:DescribeKey on every KMS key named.\n"
           "\n"
           "ERRORS\n"
           "    ThrottlingException: throttled. 5xx, KMSInternalException,\n"
           "    DependencyTimeoutException, no connection: unavailable. No answer\n"
           "    within --timeout-ms: timeout. AccessDeniedException, DisabledException,\n"
           "    InvalidKeyUsageException, bad credentials: denied.\n"
           "    KMSInvalidStateException: revoked when the key is pending deletion,\n"
           "    else denied. NotFoundException: not-found. InvalidCiphertextException,\n"
           "    IncorrectKeyException: auth-failed (unwrap). docs/kms-plugin.md has the\n"
           "    whole table.\n"
           "\n"
           "EXIT STATUS\n"
           "    0   standard input ended\n"
           "    64  usage error: a malformed or repeated option, a (KEYID, VERSION)\n"
           "        given twice (EX_USAGE)\n"
           "    70  libcurl, jansson or libsodium would not start (EX_SOFTWARE)\n"
           "    74  standard input or output failed (EX_IOERR)\n"
           "    No credentials or region, or a malformed AWS file, is not an exit\n"
           "    status: every request is answered invalid with the reason.\n"
           "\n"
           "SECURITY\n"
           "    A DEK is never written to standard error or to an error message; every\n"
           "    buffer that held one is wiped.\n"
           "\n"
           "SEE ALSO\n"
           "    keyshift-kms-aws(1), keyshift-providers(5)\n"
           "    docs/kms-plugin.md: the protocol, and in section 11 this plugin's\n"
           "    setup, key policy, encryption context, error table and credential\n"
           "    chain ([KP-AWS-1..15]).\n"
           "    The documents cited as docs/NAME.md are installed as\n"
           "    " KS_DOCDIR "/NAME.md.\n";
}

/* Whether s is a KMS key or alias ARN: arn:PARTITION:kms:... with a
 * key/ or alias/ resource. */
static int kms_arn(const char *s)
{
    if (strncmp(s, "arn:", 4) != 0) {
        return 0;
    }
    const char *p = s + 4;
    size_t part = strspn(p, "abcdefghijklmnopqrstuvwxyz-");
    return part > 0 && strncmp(p + part, ":kms:", 5) == 0 &&
           (strstr(p, ":key/") != NULL || strstr(p, ":alias/") != NULL);
}

/* Whether s[0..n) names a KMS key: a key or alias ARN, alias/NAME, or a
 * key id ([A-Za-z0-9-]), printable ASCII without spaces or commas. */
static int kms_key_ok(const char *s, size_t n)
{
    if (n == 0 || n > KMS_MAX_KEY_ID) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] <= ' ' || s[i] >= 127 || s[i] == ',') {
            return 0;
        }
    }
    if (kms_arn(s)) {
        return 1;
    }
    if (strncmp(s, "alias/", 6) == 0) {
        return n > 6;
    }
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") == n;
}

/* A decimal key version 1..2^32-1 without sign or leading zero. */
static int parse_version(const char *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 10 || s[0] == '0') {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* Parse the value of one --key into k.  0, or -1 with why in err. */
static int parse_key(const char *val, pl_key *k, char *err, size_t errlen)
{
    const char *c1 = strchr(val, ','), *c2 = c1 != NULL ? strchr(c1 + 1, ',') : NULL;
    const char *c3 = c2 != NULL ? strchr(c2 + 1, ',') : NULL;
    if (c1 == NULL || c2 == NULL) {
        seterr(err, errlen, "--key=%.64s: want KEYID,VERSION,KMSKEY[,decrypt-only]", val);
        return -1;
    }
    size_t nid = (size_t)(c1 - val), nver = (size_t)(c2 - c1 - 1);
    size_t nkms = c3 != NULL ? (size_t)(c3 - c2 - 1) : strlen(c2 + 1);
    memset(k, 0, sizeof *k);
    if (!pl_key_id_ok(val, nid)) {
        seterr(err, errlen, "--key: KEYID '%.*s' is not 1-256 bytes of [A-Za-z0-9._:/@+=-]", (int)(nid > 64 ? 64 : nid),
               val);
        return -1;
    }
    if (parse_version(c1 + 1, nver, &k->version) != 0) {
        seterr(err, errlen, "--key: VERSION '%.*s' is not a number from 1 to 4294967295", (int)(nver > 16 ? 16 : nver),
               c1 + 1);
        return -1;
    }
    memcpy(k->key_id, val, nid);
    memcpy(k->kms_key, c2 + 1, nkms < KMS_MAX_KEY_ID ? nkms : KMS_MAX_KEY_ID);
    if (!kms_key_ok(k->kms_key, nkms)) {
        seterr(err, errlen, "--key: KMSKEY '%.64s' is not a key ARN, alias ARN, key id or alias/NAME", k->kms_key);
        return -1;
    }
    if (c3 != NULL && strcmp(c3 + 1, "decrypt-only") != 0) {
        seterr(err, errlen, "--key: the fourth part may only be 'decrypt-only', not '%.32s'", c3 + 1);
        return -1;
    }
    k->decrypt_only = c3 != NULL;
    return 0;
}

/* Refuse a (KEYID, VERSION) given twice, and one KMS key named twice for
 * one KEYID (a rotation to the same key rotates nothing).  0 or -1. */
static int check_unique(const pl_args *a, char *err, size_t errlen)
{
    for (size_t i = 0; i < a->nkeys; i++) {
        for (size_t j = 0; j < i; j++) {
            const pl_key *x = &a->keys[i], *y = &a->keys[j];
            if (strcmp(x->key_id, y->key_id) != 0) {
                continue;
            }
            if (x->version == y->version) {
                seterr(err, errlen, "--key: %s version %u given twice", x->key_id, x->version);
                return -1;
            }
            if (strcmp(x->kms_key, y->kms_key) == 0) {
                seterr(err, errlen, "--key: %s versions %u and %u name the same KMS key", x->key_id, y->version,
                       x->version);
                return -1;
            }
        }
    }
    return 0;
}

/* If arg is --NAME=VALUE, set *dst to VALUE (once only).  1 matched, 0
 * not this option, -1 given twice or empty (why in err). */
static int take_option(const char *arg, const char *name, const char **dst, char *err, size_t errlen)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || arg[n] != '=') {
        return 0;
    }
    if (*dst != NULL || arg[n + 1] == '\0') {
        seterr(err, errlen, "%s: %s", name, *dst != NULL ? "given twice" : "empty");
        return -1;
    }
    *dst = arg + n + 1;
    return 1;
}

/* Check the values of the single options.  0, or -1 with why in err. */
static int check_options(pl_args *a, const char *timeout, char *err, size_t errlen)
{
    kms_config scratch;
    if (a->region != NULL && !sigv4_scope_part_ok(a->region)) {
        seterr(err, errlen, "--region: '%.64s' is not a region name", a->region);
        return -1;
    }
    if (a->profile != NULL && !kms_config_profile_ok(a->profile)) {
        seterr(err, errlen, "--profile: '%.64s' is not 1-64 bytes of [A-Za-z0-9_.-]", a->profile);
        return -1;
    }
    memset(&scratch, 0, sizeof scratch);
    if (a->endpoint != NULL && kms_config_set_endpoint(&scratch, a->endpoint) != 0) {
        seterr(err, errlen, "--endpoint-url: '%.64s' is not http(s)://HOST[:PORT][/]", a->endpoint);
        return -1;
    }
    a->timeout_ms = PL_TIMEOUT_DEFAULT;
    if (timeout != NULL) {
        uint32_t t;
        if (parse_version(timeout, strlen(timeout), &t) != 0 || t > PL_TIMEOUT_MAX) {
            seterr(err, errlen, "--timeout-ms: '%.16s' is not a number from 1 to %d", timeout, PL_TIMEOUT_MAX);
            return -1;
        }
        a->timeout_ms = (long)t;
    }
    return 0;
}

/* Parse the command line (plugin.h). */
pl_mode pl_args_parse(int argc, char **argv, pl_args *a, char *err, size_t errlen)
{
    const char *timeout = NULL;
    memset(a, 0, sizeof *a);
    err[0] = '\0';
    a->keys = calloc(argc > 0 ? (size_t)argc : 1, sizeof *a->keys);
    if (a->keys == NULL) {
        seterr(err, errlen, "out of memory");
        return PL_USAGE;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int r = 0;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            return PL_HELP;
        }
        if (strcmp(arg, "--version") == 0) {
            return PL_VERSION;
        }
        if (strncmp(arg, "--key=", 6) == 0) {
            if (parse_key(arg + 6, &a->keys[a->nkeys], err, errlen) != 0) {
                return PL_USAGE;
            }
            a->nkeys++;
            continue;
        }
        if ((r = take_option(arg, "--region", &a->region, err, errlen)) == 0 &&
            (r = take_option(arg, "--endpoint-url", &a->endpoint, err, errlen)) == 0 &&
            (r = take_option(arg, "--profile", &a->profile, err, errlen)) == 0 &&
            (r = take_option(arg, "--timeout-ms", &timeout, err, errlen)) == 0) {
            seterr(err, errlen, "unknown argument '%.64s'", arg);
            return PL_USAGE;
        }
        if (r < 0) {
            return PL_USAGE;
        }
    }
    if (check_unique(a, err, errlen) != 0 || check_options(a, timeout, err, errlen) != 0) {
        return PL_USAGE;
    }
    return PL_RUN;
}

/* Free the key table (plugin.h). */
void pl_args_free(pl_args *a)
{
    free(a->keys);
    a->keys = NULL;
    a->nkeys = 0;
}

/* Look a version up (plugin.h): the --key lines of key_id when there are
 * any, else a key_id that is a KMS ARN as its own version 1. */
pl_lookup pl_args_lookup(const pl_args *a, const char *key_id, uint32_t version, pl_version *out)
{
    const pl_key *hit = NULL, *primary = NULL;
    int listed = 0;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < a->nkeys; i++) {
        const pl_key *k = &a->keys[i];
        if (strcmp(k->key_id, key_id) != 0) {
            continue;
        }
        listed = 1;
        if (k->version == version) {
            hit = k;
        }
        if (!k->decrypt_only && (primary == NULL || k->version > primary->version)) {
            primary = k;
        }
    }
    if (listed) {
        if (version == 0) {
            hit = primary;
        }
        if (hit == NULL) {
            return version == 0 ? PL_NO_PRIMARY : PL_NO_VERSION;
        }
        *out = (pl_version){hit->kms_key, hit->version, hit->decrypt_only, hit == primary};
        return PL_FOUND;
    }
    if (!kms_arn(key_id)) {
        return PL_NO_KEY;
    }
    if (version > 1) {
        return PL_NO_VERSION;
    }
    *out = (pl_version){key_id, 1, 0, 1};
    return PL_FOUND;
}
