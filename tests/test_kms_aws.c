/*
 * tests/test_kms_aws.c -- the AWS KMS client's offline parts
 * (tools/kms-aws/kms.c, kms_config.c): error classification, the
 * endpoint URL check, and the strict reading of the environment and the
 * shared credentials and config files.  The calls themselves are tested
 * against moto_server and a fake endpoint by tests/kms_aws_test.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../tools/kms-aws/creds.h"
#include "../tools/kms-aws/kms.h"

static char dir[64];
static char creds_path[128], config_path[128];

/* Every variable kms_config_load reads, cleared; HOME the test's. */
static void clear_env(void)
{
    static const char *const VARS[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                       "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                                       "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_ENDPOINT_URL_KMS",
                                       "AWS_ENDPOINT_URL", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                                       "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                       "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_EC2_METADATA_SERVICE_ENDPOINT"};
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) {
        unsetenv(VARS[i]);
    }
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    setenv("HOME", dir, 1);
    unlink(creds_path);
    unlink(config_path);
}

/* Write text to path. */
static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A temporary HOME with .aws/ for the group. */
static int setup(void **state)
{
    (void)state;
    char aws[96];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ks-kms-aws-XXXXXX", tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 40 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        return -1;
    }
    snprintf(aws, sizeof aws, "%s/.aws", dir);
    snprintf(creds_path, sizeof creds_path, "%s/credentials", aws);
    snprintf(config_path, sizeof config_path, "%s/config", aws);
    return mkdir(aws, 0700);
}

/* Remove the temporary HOME. */
static int teardown(void **state)
{
    (void)state;
    char aws[96];
    unlink(creds_path);
    unlink(config_path);
    snprintf(aws, sizeof aws, "%s/.aws", dir);
    rmdir(aws);
    rmdir(dir);
    return 0;
}

/* Load the configuration, expecting want; err for the caller to look at. */
static kms_config load(kms_status want, char *err, size_t errlen)
{
    kms_config c;
    kms_status got = kms_config_load(&c, err, errlen);
    if (got != want) {
        fail_msg("kms_config_load: %s (%s), want %s", kms_status_name(got), err, kms_status_name(want));
    }
    return c;
}

/* Every documented __type, with and without a prefix, and the statuses. */
static void test_classify(void **state)
{
    (void)state;
    static const struct {
        const char *type;
        long http;
        kms_status want;
        int inv;
    } CASES[] = {
        {"ThrottlingException", 400, KMS_THROTTLED, 0},
        {"LimitExceededException", 400, KMS_THROTTLED, 0},
        {"KMSInternalException", 500, KMS_UNAVAILABLE, 0},
        {"DependencyTimeoutException", 503, KMS_UNAVAILABLE, 0},
        {"KeyUnavailableException", 500, KMS_UNAVAILABLE, 0},
        {"AccessDeniedException", 400, KMS_DENIED, 0},
        {"DisabledException", 400, KMS_DENIED, 0},
        {"KMSInvalidStateException", 400, KMS_DENIED, 1},
        {"com.amazonaws.kms#KMSInvalidStateException", 400, KMS_DENIED, 1},
        {"NotFoundException", 400, KMS_NOT_FOUND, 0},
        {"com.amazonaws.kms#NotFoundException", 400, KMS_NOT_FOUND, 0},
        {"InvalidCiphertextException", 400, KMS_AUTH_FAILED, 0},
        {"IncorrectKeyException", 400, KMS_AUTH_FAILED, 0},
        {"AccessDeniedException:http://internal.amazon.com/coral/com.amazon.coral.service/", 400, KMS_DENIED, 0},
        {"ExpiredTokenException", 400, KMS_DENIED, 0},
        {"NotFoundExceptionX", 400, KMS_INVALID, 0},
        {"ValidationException", 400, KMS_INVALID, 0},
        {NULL, 503, KMS_UNAVAILABLE, 0},
        {"", 500, KMS_UNAVAILABLE, 0},
        {NULL, 429, KMS_THROTTLED, 0},
        {NULL, 400, KMS_INVALID, 0},
        {NULL, 302, KMS_INVALID, 0},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        int inv = -1;
        kms_status got = kms_classify(CASES[i].type, CASES[i].http, &inv);
        if (got != CASES[i].want || inv != CASES[i].inv) {
            fail_msg("%s/%ld: %s inv %d", CASES[i].type ? CASES[i].type : "(null)", CASES[i].http,
                     kms_status_name(got), inv);
        }
    }
    assert_string_equal(kms_status_name(KMS_NOT_FOUND), "not-found");
    assert_string_equal(kms_status_name(KMS_AUTH_FAILED), "auth-failed");
    assert_string_equal(kms_status_name(KMS_REVOKED), "revoked");
    assert_string_equal(kms_status_name(KMS_TIMEOUT), "timeout");
    assert_string_equal(kms_status_name((kms_status)99), "invalid");
}

/* Endpoint URLs: http(s), host[:port], nothing after "/". */
static void test_endpoint(void **state)
{
    (void)state;
    kms_config c;
    memset(&c, 0, sizeof c);
    assert_int_equal(kms_config_set_endpoint(&c, "https://KMS.us-east-1.amazonaws.com"), 0);
    assert_string_equal(c.endpoint, "https://kms.us-east-1.amazonaws.com/");
    assert_string_equal(c.host, "kms.us-east-1.amazonaws.com");
    assert_int_equal(kms_config_set_endpoint(&c, "http://127.0.0.1:5000/"), 0);
    assert_string_equal(c.endpoint, "http://127.0.0.1:5000/");
    assert_string_equal(c.host, "127.0.0.1:5000");
    assert_int_equal(kms_config_set_endpoint(&c, "http://[::1]:4566"), 0);
    assert_string_equal(c.host, "[::1]:4566");
    static const char *const BAD[] = {"ftp://x/", "https://", "https:///", "https://a/b", "https://a?x=1",
                                      "https://user@host/", "https://host:0/", "https://host:65536/",
                                      "https://host:/", "https://host:12x/", "https://[]/", "https://[::1/",
                                      "https://ho st/", "kms.us-east-1.amazonaws.com", "https://a//"};
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        if (kms_config_set_endpoint(&c, BAD[i]) == 0) {
            fail_msg("accepted %s", BAD[i]);
        }
    }
}

/* The environment: credentials, token, region, endpoint precedence. */
static void test_env(void **state)
{
    (void)state;
    char err[512];
    clear_env();
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secret/env+", 1);
    setenv("AWS_SESSION_TOKEN", "tok", 1);
    setenv("AWS_DEFAULT_REGION", "eu-west-1", 1);
    kms_config c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.access_key_id, "AKIDENV");
    assert_string_equal(c.secret_access_key, "secret/env+");
    assert_string_equal(c.session_token, "tok");
    assert_string_equal(c.region, "eu-west-1");
    assert_string_equal(c.endpoint, "https://kms.eu-west-1.amazonaws.com/");
    setenv("AWS_REGION", "us-west-2", 1);
    setenv("AWS_ENDPOINT_URL", "http://localhost:1", 1);
    c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.region, "us-west-2");
    assert_string_equal(c.endpoint, "http://localhost:1/");
    setenv("AWS_ENDPOINT_URL_KMS", "http://localhost:2", 1);
    c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.endpoint, "http://localhost:2/");
    kms_config_wipe(&c);
    assert_string_equal(c.secret_access_key, "");

    setenv("AWS_ENDPOINT_URL_KMS", "localhost:2", 1);
    load(KMS_INVALID, err, sizeof err);
    unsetenv("AWS_ENDPOINT_URL_KMS");
    setenv("AWS_REGION", "US_EAST", 1);
    load(KMS_INVALID, err, sizeof err);
    setenv("AWS_REGION", "us-east-1", 1);
    unsetenv("AWS_SECRET_ACCESS_KEY");
    load(KMS_INVALID, err, sizeof err);
    assert_non_null(strstr(err, "AWS_SECRET_ACCESS_KEY"));
    setenv("AWS_SECRET_ACCESS_KEY", "has space", 1);
    load(KMS_INVALID, err, sizeof err);
    setenv("AWS_SECRET_ACCESS_KEY", "ok", 1);
    setenv("AWS_PROFILE", "../etc", 1);
    load(KMS_INVALID, err, sizeof err);
}

/* The shared files: profiles, comments, CRLF, nested values elsewhere,
 * region from [profile NAME] or [default]. */
static void test_shared_files(void **state)
{
    (void)state;
    char err[512];
    clear_env();
    put(creds_path, "# comment\r\n; another\r\n[default]\r\naws_access_key_id=AKIDDEF\r\n"
                    "aws_secret_access_key = sdef\r\n\r\n[ks]\r\naws_access_key_id   =   AKIDKS  \r\n"
                    "aws_secret_access_key = s/ks+\r\naws_session_token = tks\r\nregion = ignored-here\r\n");
    put(config_path, "[default]\nregion = ap-south-1\ns3 =\n  max_concurrent_requests = 10\n"
                     "[profile ks]\nregion = eu-central-1\noutput = json\n");
    kms_config c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.access_key_id, "AKIDDEF");
    assert_string_equal(c.secret_access_key, "sdef");
    assert_string_equal(c.session_token, "");
    assert_string_equal(c.region, "ap-south-1");
    setenv("AWS_PROFILE", "ks", 1);
    c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.access_key_id, "AKIDKS");
    assert_string_equal(c.secret_access_key, "s/ks+");
    assert_string_equal(c.session_token, "tks");
    assert_string_equal(c.region, "eu-central-1");

    /* the files named by variables instead */
    char alt[160];
    snprintf(alt, sizeof alt, "%s/alt-credentials", dir);
    put(alt, "[ks]\naws_access_key_id = AKIDALT\naws_secret_access_key = salt\n");
    setenv("AWS_SHARED_CREDENTIALS_FILE", alt, 1);
    setenv("AWS_REGION", "us-east-2", 1);
    c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.access_key_id, "AKIDALT");
    assert_string_equal(c.region, "us-east-2");
    unlink(alt);
    kms_config_wipe(&c);
}

/* What the strict parser refuses, each with a message naming it. */
static void test_shared_files_refused(void **state)
{
    (void)state;
    static const struct {
        const char *creds;
        const char *why;
    } CASES[] = {
        {"aws_access_key_id = A\n", "expected [section]"},
        {"[ks]\naws_access_key_id = A\naws_secret_access_key = s\naws_access_key_id = B\n", "given twice"},
        {"[ks]\naws_access_key_id = A\n[ks]\naws_secret_access_key = s\n", "given twice"},
        {"[ks]\naws_access_key_id = A\naws_secret_access_key = s\nsso_session = x\n", "IAM Identity Center"},
        {"[ks]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n", "has no credentials"},
        {"[ks]\nrole_arn = arn:aws:iam::1:role/x\n", "exactly one of"},
        {"[ks]\nrole_arn = arn:aws:iam::1:role/x\ncredential_source = Laptop\n", "credential_source"},
        {"[ks]\nrole_arn = nope\nsource_profile = ks\n", "role_arn"},
        {"[ks]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = ks\n", "is itself"},
        {"[ks]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = a\n[a]\nrole_arn = arn:aws:iam::1:role/x\n"
         "source_profile = b\n[b]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = c\n[c]\n"
         "role_arn = arn:aws:iam::1:role/x\nsource_profile = ks\n", "longer than"},
        {"[ks]\ncredential_process = printf '{\"Version\": 2}'\n", "Version"},
        {"[ks]\naws_access_key_id = A\njunk\n", "expected [section]"},
        {"[ks\naws_access_key_id = A\n", "malformed section"},
        {"[]\n", "empty section"},
        {"[ks]\n= x\n", "empty key"},
        {"[ks]\naws_access_key_id = A\n  nested = 1\n", "indented"},
        {"[ks]\n  aws_access_key_id = A\n", "indented"},
        {"[ks]\naws_access_key_id = A B\naws_secret_access_key = s\n", "not printable"},
        {"[ks]\naws_access_key_id = A\n", "only one of"},
        {"[other]\naws_access_key_id = A\naws_secret_access_key = s\n", "in neither"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        clear_env();
        setenv("AWS_PROFILE", "ks", 1);
        setenv("AWS_REGION", "us-east-1", 1);
        put(creds_path, CASES[i].creds);
        load(KMS_INVALID, err, sizeof err);
        if (strstr(err, CASES[i].why) == NULL) {
            fail_msg("case %zu: '%s' does not say '%s'", i, err, CASES[i].why);
        }
    }
    /* a credential_process that fails, or that gives credentials */
    clear_env();
    setenv("AWS_PROFILE", "ks", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    put(creds_path, "[ks]\ncredential_process = exit 3\n");
    load(KMS_UNAVAILABLE, err, sizeof err);
    assert_non_null(strstr(err, "exited 3"));
    put(creds_path, "[ks]\ncredential_process = printf '{\"Version\": 1, \"AccessKeyId\": \"AKIDP\", "
                    "\"SecretAccessKey\": \"sp\", \"SessionToken\": \"tp\"}'\n");
    kms_config c = load(KMS_OK, err, sizeof err);
    assert_string_equal(c.access_key_id, "AKIDP");
    assert_string_equal(c.session_token, "tp");
    kms_config_wipe(&c);
    /* an over-long line */
    clear_env();
    setenv("AWS_REGION", "us-east-1", 1);
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, 'a', 4999);
    memcpy(big, "[default]\n# ", 12);
    big[4999] = '\0';
    put(creds_path, big);
    free(big);
    load(KMS_INVALID, err, sizeof err);
    assert_non_null(strstr(err, "longer than"));
    /* no region anywhere: not in the environment, not in the config file,
     * and IMDS disabled (clear_env), which the message says */
    clear_env();
    put(creds_path, "[default]\naws_access_key_id = A\naws_secret_access_key = s\n");
    load(KMS_INVALID, err, sizeof err);
    assert_non_null(strstr(err, "no region"));
    assert_non_null(strstr(err, "AWS_EC2_METADATA_DISABLED"));
    /* a config file's region that is not a region name is refused, not
     * replaced by IMDS's */
    put(config_path, "[default]\nregion = US_EAST\n");
    load(KMS_INVALID, err, sizeof err);
    assert_non_null(strstr(err, "region: not a region name"));
    /* a directory where the file should be */
    clear_env();
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", dir, 1);
    load(KMS_INVALID, err, sizeof err);
    assert_non_null(strstr(err, "regular file"));
}

/* Overrides (the plugin's command line): an explicit profile takes the
 * credentials from the shared file even when the environment has some;
 * region and endpoint replace the environment's. */
static void test_overrides(void **state)
{
    (void)state;
    char err[512];
    kms_config c;
    clear_env();
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "senv", 1);
    setenv("AWS_REGION", "eu-west-1", 1);
    setenv("AWS_ENDPOINT_URL_KMS", "http://localhost:2", 1);
    put(creds_path, "[ks]\naws_access_key_id = AKIDKS\naws_secret_access_key = sks\n");
    put(config_path, "[profile ks]\nregion = eu-central-1\n");
    kms_overrides ov = {"ks", NULL, NULL};
    assert_int_equal(kms_config_load_with(&c, &ov, err, sizeof err), KMS_OK);
    assert_string_equal(c.access_key_id, "AKIDKS");
    assert_string_equal(c.secret_access_key, "sks");
    assert_string_equal(c.region, "eu-west-1");
    assert_string_equal(c.endpoint, "http://localhost:2/");
    kms_overrides ov2 = {NULL, "ap-south-1", "https://kms.example.test"};
    assert_int_equal(kms_config_load_with(&c, &ov2, err, sizeof err), KMS_OK);
    assert_string_equal(c.access_key_id, "AKIDENV");
    assert_string_equal(c.region, "ap-south-1");
    assert_string_equal(c.endpoint, "https://kms.example.test/");
    unsetenv("AWS_ENDPOINT_URL_KMS");
    kms_overrides ov3 = {NULL, "ap-south-1", NULL};
    assert_int_equal(kms_config_load_with(&c, &ov3, err, sizeof err), KMS_OK);
    assert_string_equal(c.endpoint, "https://kms.ap-south-1.amazonaws.com/");
    kms_overrides bad[] = {{"no/such", NULL, NULL}, {"absent", NULL, NULL}, {NULL, "US_EAST", NULL},
                           {NULL, NULL, "ftp://x"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kms_config_load_with(&c, &bad[i], err, sizeof err), KMS_INVALID);
        assert_string_equal(c.secret_access_key, "");
    }
    assert_non_null(strstr(err, "--endpoint-url"));
    assert_true(kms_config_profile_ok("a.b_c-1"));
    assert_false(kms_config_profile_ok(""));
    kms_config_wipe(&c);
}

/* Calls refuse bad arguments before any network use. */
static void test_call_arguments(void **state)
{
    (void)state;
    kms_config cfg;
    memset(&cfg, 0, sizeof cfg);
    strcpy(cfg.access_key_id, "AKID");
    strcpy(cfg.secret_access_key, "s");
    strcpy(cfg.region, "us-east-1");
    assert_int_equal(kms_config_set_endpoint(&cfg, "http://127.0.0.1:9"), 0);
    kms_client *c = kms_client_open(&cfg);
    assert_non_null(c);
    uint8_t pt[KMS_MAX_PLAINTEXT + 1] = {0}, ct[64];
    size_t n = 99;
    kms_error e;
    kms_context ctx = {(const uint8_t *)"aad", 3, NULL, NULL, NULL, NULL};
    assert_int_equal(kms_encrypt(c, "k", pt, KMS_MAX_PLAINTEXT + 1, &ctx, ct, sizeof ct, &n, &e), KMS_INVALID);
    assert_int_equal(n, 0);
    assert_int_equal(kms_encrypt(c, "", pt, 1, &ctx, ct, sizeof ct, &n, &e), KMS_INVALID);
    assert_int_equal(kms_encrypt(c, "a key", pt, 1, &ctx, ct, sizeof ct, &n, &e), KMS_INVALID);
    kms_context noaad = {NULL, 0, NULL, NULL, NULL, NULL};
    assert_int_equal(kms_encrypt(c, "k", pt, 1, &noaad, ct, sizeof ct, &n, &e), KMS_INVALID);
    kms_context badutf8 = {(const uint8_t *)"aad", 3, "\xff\xfe", NULL, NULL, NULL};
    assert_int_equal(kms_encrypt(c, "k", pt, 1, &badutf8, ct, sizeof ct, &n, &e), KMS_INVALID);
    memset(ct, 0x55, sizeof ct);
    assert_int_equal(kms_decrypt(c, "k", pt, 0, &ctx, ct, sizeof ct, &n, &e), KMS_INVALID);
    for (size_t i = 0; i < sizeof ct; i++) {
        assert_int_equal(ct[i], 0);
    }
    kms_client_close(c);
    kms_client_close(NULL);
}

/* The credentials documents: credential_process's Version 1 JSON, the
 * container and IMDS JSON, and STS's XML, each strict. */
static void test_creds_documents(void **state)
{
    (void)state;
    char err[512];
    kms_creds c;
    static const char PROC[] = "{\"Version\":1,\"AccessKeyId\":\"AKID\",\"SecretAccessKey\":\"s/+\","
                               "\"SessionToken\":\"t\",\"Expiration\":\"2030-01-02T03:04:05Z\"}";
    assert_int_equal(kms_creds_parse_json(PROC, strlen(PROC), CREDS_JSON_PROCESS, &c, err, sizeof err), KMS_OK);
    assert_string_equal(c.access_key_id, "AKID");
    assert_string_equal(c.session_token, "t");
    assert_int_equal((long long)c.expires, 1893553445LL);
    static const char *const BAD_PROC[] = {
        "{\"Version\":2,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\"}",
        "{\"Version\":1.0,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\"}",
        "{\"Version\":1,\"AccessKeyId\":\"A\",\"AccessKeyId\":\"B\",\"SecretAccessKey\":\"s\"}",
        "{\"Version\":1,\"AccessKeyId\":\"A\"}",
        "{\"Version\":1,\"AccessKeyId\":\"A B\",\"SecretAccessKey\":\"s\"}",
        "{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\",\"Expiration\":\"tomorrow\"}",
        "{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":7}",
        "[1]", "{\"Version\":1} x",
    };
    for (size_t i = 0; i < sizeof BAD_PROC / sizeof BAD_PROC[0]; i++) {
        if (kms_creds_parse_json(BAD_PROC[i], strlen(BAD_PROC[i]), CREDS_JSON_PROCESS, &c, err, sizeof err) !=
            KMS_INVALID) {
            fail_msg("accepted %s", BAD_PROC[i]);
        }
        assert_string_equal(c.secret_access_key, "");
    }
    static const char IMDS[] = "{\"Code\":\"Success\",\"AccessKeyId\":\"ASIA\",\"SecretAccessKey\":\"s\","
                               "\"Token\":\"tok\",\"Expiration\":\"2030-01-02T03:04:05.123456Z\"}";
    assert_int_equal(kms_creds_parse_json(IMDS, strlen(IMDS), CREDS_JSON_HTTP, &c, err, sizeof err), KMS_OK);
    assert_string_equal(c.session_token, "tok");
    static const char FAILED[] = "{\"Code\":\"AssumeRoleUnauthorizedAccess\",\"Message\":\"no\"}";
    assert_int_equal(kms_creds_parse_json(FAILED, strlen(FAILED), CREDS_JSON_HTTP, &c, err, sizeof err),
                     KMS_UNAVAILABLE);
    assert_non_null(strstr(err, "AssumeRoleUnauthorizedAccess"));

    static const char STS[] =
        "<?xml version=\"1.0\"?>\n<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
        "<AssumeRoleResult><Credentials><AccessKeyId>ASIAX</AccessKeyId><SecretAccessKey>s/x+</SecretAccessKey>"
        "<SessionToken>tk</SessionToken><Expiration>2030-01-02T03:04:05Z</Expiration></Credentials>"
        "</AssumeRoleResult></AssumeRoleResponse>\n";
    assert_int_equal(kms_creds_parse_sts(STS, strlen(STS), 200, "AssumeRole", &c, err, sizeof err), KMS_OK);
    assert_string_equal(c.secret_access_key, "s/x+");
    assert_int_equal(kms_creds_parse_sts(STS, strlen(STS), 200, "AssumeRoleWithWebIdentity", &c, err, sizeof err),
                     KMS_INVALID);
    static const char TWICE[] = "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>A</AccessKeyId>"
                                "<AccessKeyId>B</AccessKeyId><SecretAccessKey>s</SecretAccessKey><SessionToken>t"
                                "</SessionToken><Expiration>2030-01-02T03:04:05Z</Expiration></Credentials>"
                                "</AssumeRoleResult></AssumeRoleResponse>";
    assert_int_equal(kms_creds_parse_sts(TWICE, strlen(TWICE), 200, "AssumeRole", &c, err, sizeof err), KMS_INVALID);
    static const char ENTITY[] = "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>A&amp;</AccessKeyId>"
                                 "<SecretAccessKey>s</SecretAccessKey><SessionToken>t</SessionToken><Expiration>"
                                 "2030-01-02T03:04:05Z</Expiration></Credentials></AssumeRoleResult>"
                                 "</AssumeRoleResponse>";
    assert_int_equal(kms_creds_parse_sts(ENTITY, strlen(ENTITY), 200, "AssumeRole", &c, err, sizeof err),
                     KMS_INVALID);
    static const char DENIED[] = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>not "
                                 "allowed</Message></Error></ErrorResponse>";
    assert_int_equal(kms_creds_parse_sts(DENIED, strlen(DENIED), 403, "AssumeRole", &c, err, sizeof err), KMS_DENIED);
    assert_non_null(strstr(err, "AccessDenied: not allowed"));
    assert_int_equal(kms_creds_parse_sts("", 0, 503, "AssumeRole", &c, err, sizeof err), KMS_UNAVAILABLE);

    time_t t;
    assert_int_equal(kms_creds_parse_time("1970-01-01T00:00:00Z", 20, &t), 0);
    assert_int_equal((long long)t, 0);
    assert_int_equal(kms_creds_parse_time("2024-02-29T23:59:59Z", 20, &t), 0);
    assert_int_equal(kms_creds_parse_time("2023-02-29T00:00:00Z", 20, &t), -1);
    assert_int_equal(kms_creds_parse_time("2024-01-01T00:00:00", 19, &t), -1);
    assert_int_equal(kms_creds_parse_time("2024-01-01T00:00:00.Z", 21, &t), -1);
    assert_int_equal(kms_creds_parse_time("2024-01-01 00:00:00Z", 20, &t), -1);
    /* a refresh 5 minutes before Expiration, or half way through a short life */
    memset(&c, 0, sizeof c);
    assert_int_equal((long long)kms_creds_refresh_at(&c, 1000), 0);
    c.expires = 1000 + 3600;
    assert_int_equal((long long)kms_creds_refresh_at(&c, 1000), 1000 + 3600 - 300);
    c.expires = 1000 + 120;
    assert_int_equal((long long)kms_creds_refresh_at(&c, 1000), 1060);
    kms_creds_wipe(&c);
}

/* Run the kms-aws tests. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),      cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_env),           cmocka_unit_test(test_shared_files),
        cmocka_unit_test(test_shared_files_refused), cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_call_arguments), cmocka_unit_test(test_creds_documents),
    };
    if (kms_global_init() != 0) {
        return 1;
    }
    return cmocka_run_group_tests(tests, setup, teardown);
}
