/*
 * tests/test_sigv4.c -- AWS Signature Version 4 (tools/kms-aws/sigv4.c)
 * against AWS's published worked examples, exactly.
 *
 * Sources (every expected value below is copied from them, none computed
 * here):
 *   [IAM]   AWS General Reference, "Create a canonical request for Signature
 *           Version 4", "Create a string to sign for Signature Version 4",
 *           "Calculate the signature for AWS Signature Version 4" and "Add
 *           the signature to the HTTP request": the IAM ListUsers GET example
 *           (20150830T123600Z, us-east-1, iam, AKIDEXAMPLE), with its
 *           canonical request, its hash, the string to sign, the signing key
 *           and the signature.
 *   [SUITE] AWS General Reference, "Signature Version 4 Test Suite"
 *           (aws-sig-v4-test-suite; the copy AWS's SDKs keep, e.g.
 *           awslabs/aws-c-auth tests/aws-signing-test-suite/v4/<name>/):
 *           each case's request.txt, header-canonical-request.txt,
 *           header-string-to-sign.txt, header-signature.txt and, where
 *           quoted, header-signed-request.txt.  All cases use AKIDEXAMPLE,
 *           wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY, us-east-1, service
 *           "service", 20150830T123600Z.
 * Authorization headers marked "assembled" are not quoted from a source:
 * they are the published signed-headers line and signature put into the
 * published header layout by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "../tools/kms-aws/sigv4.h"

#define SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define DATE "20150830T123600Z"
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define STS_HEAD "AWS4-HMAC-SHA256\n" DATE "\n20150830/us-east-1/service/aws4_request\n"
#define TOKEN                                                                                                         \
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuw" \
    "thAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcH" \
    "NVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="

/* One published case: the request as given, what each step must produce. */
typedef struct {
    const char *name;
    const char *method;
    const char *path;
    sigv4_pair query[4];
    size_t nquery;
    sigv4_pair headers[6];
    size_t nheaders;
    const char *payload;
    const char *service;
    const char *creq;
    const char *sts;
    const char *signature;
    const char *authorization; /* NULL: not checked */
} vector;

static const vector VECTORS[] = {
    /* [IAM] */
    {"iam-listusers", "GET", "/", {{"Version", "2010-05-08"}, {"Action", "ListUsers"}}, 2,
     {{"Host", "iam.amazonaws.com"},
      {"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"},
      {"X-Amz-Date", DATE}},
     3, "", "iam",
     "GET\n/\nAction=ListUsers&Version=2010-05-08\n"
     "content-type:application/x-www-form-urlencoded; charset=utf-8\nhost:iam.amazonaws.com\n"
     "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n" EMPTY_SHA256,
     "AWS4-HMAC-SHA256\n" DATE "\n20150830/us-east-1/iam/aws4_request\n"
     "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59",
     "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7",
     /* [IAM] "Add the signature to the HTTP request" */
     "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
     "SignedHeaders=content-type;host;x-amz-date, "
     "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"},
    /* [SUITE] post-vanilla */
    {"post-vanilla", "POST", "/", {{0}}, 0, {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "",
     "service", "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87",
     "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
     /* [SUITE] post-vanilla/header-signed-request.txt */
     "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
     "SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"},
    /* [SUITE] post-x-www-form-urlencoded: a signed body (the test suite's
     * x-amz-content-sha256 header is part of its published canonical
     * request, so it is given as a header here). */
    {"post-x-www-form-urlencoded", "POST", "/", {{0}}, 0,
     {{"Content-Type", "application/x-www-form-urlencoded"},
      {"Host", "example.amazonaws.com"},
      {"Content-Length", "13"},
      {"X-Amz-Date", DATE},
      {"X-Amz-Content-Sha256", "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"}},
     5, "Param1=value1", "service",
     "POST\n/\n\ncontent-length:13\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
     "x-amz-content-sha256:9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e\n"
     "x-amz-date:20150830T123600Z\n\n"
     "content-length;content-type;host;x-amz-content-sha256;x-amz-date\n"
     "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
     STS_HEAD "b1edd1d03544c25390e32085d55b57acc9a3961bb59415ff86c45c3d89d16cfb",
     "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b", NULL},
    /* [SUITE] post-sts-header-before: a session token, signed. */
    {"post-sts-header-before", "POST", "/", {{0}}, 0,
     {{"Host", "example.amazonaws.com"}, {"X-Amz-Security-Token", TOKEN}, {"X-Amz-Date", DATE}}, 3, "", "service",
     "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:" TOKEN
     "\n\nhost;x-amz-date;x-amz-security-token\n" EMPTY_SHA256,
     STS_HEAD "c237e1b440d4c63c32ca95b5b99481081cb7b13c7e40434868e71567c1a882f6",
     "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead",
     /* [SUITE] post-sts-header-before/header-signed-request.txt */
     "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
     "SignedHeaders=host;x-amz-date;x-amz-security-token, "
     "Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"},
    /* [SUITE] get-vanilla-query-order-key-case */
    {"get-vanilla-query-order-key-case", "GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}}, 2,
     {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "", "service",
     "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
     "host;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0",
     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500", NULL},
    /* [SUITE] get-vanilla-query-unreserved: nothing of the unreserved set
     * is encoded. */
    {"get-vanilla-query-unreserved", "GET", "/",
     {{"-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}},
     1, {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "", "service",
     "GET\n/\n-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
     "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"
     "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "c30d4703d9f799439be92736156d47ccfb2d879ddf56f5befa6d1d6aab979177",
     "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197", NULL},
    /* [SUITE] get-vanilla-query-order-encoded: sorted by the encoded
     * names ("%E1%88%B4" before "Param"). */
    {"get-vanilla-query-order-encoded", "GET", "/",
     {{"Param-3", "Value3"}, {"Param", "Value2"}, {"\xE1\x88\xB4", "Value1"}}, 3,
     {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "", "service",
     "GET\n/\n%E1%88%B4=Value1&Param=Value2&Param-3=Value3\nhost:example.amazonaws.com\n"
     "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "868294f5c38bd141c4972a373a76654f1418a8e4fc18b2e7903ae45e8ae0ec71",
     "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac", NULL},
    /* [SUITE] get-vanilla-utf8-query */
    {"get-vanilla-utf8-query", "GET", "/", {{"\xE1\x88\xB4", "bar"}}, 1,
     {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "", "service",
     "GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "eb30c5bed55734080471a834cc727ae56beb50e5f39d1bff6d0d38cb192a7073",
     "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04", NULL},
    /* [SUITE] get-utf8: the path encoded. */
    {"get-utf8", "GET", "/\xE1\x88\xB4", {{0}}, 0, {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", DATE}}, 2, "",
     "service",
     "GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256,
     STS_HEAD "2a0a97d02205e45ce2e994789806b19270cfbbb0921b278ccf58f5249ac42102",
     "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85", NULL},
};

/* The request of case v. */
static sigv4_request request_of(const vector *v)
{
    sigv4_request r = {v->method, v->path, v->query, v->nquery, v->headers, v->nheaders,
                       (const uint8_t *)v->payload, strlen(v->payload), NULL};
    return r;
}

/* The signer of case v. */
static sigv4_signer signer_of(const vector *v)
{
    sigv4_signer s = {"AKIDEXAMPLE", SECRET, "us-east-1", v->service, DATE};
    return s;
}

/* Every case: canonical request, string to sign, signature and (where
 * published) the Authorization header, byte for byte. */
static void test_published_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof VECTORS / sizeof VECTORS[0]; i++) {
        const vector *v = &VECTORS[i];
        sigv4_request r = request_of(v);
        sigv4_signer s = signer_of(v);
        char creq[4096], sh[256], sts[512], sig[SIGV4_HEX_LEN + 1], auth[512];
        size_t creq_len, sts_len;
        uint8_t key[SIGV4_KEY_LEN];

        print_message("  %s\n", v->name);
        assert_int_equal(sigv4_canonical_request(&r, creq, sizeof creq, &creq_len, sh, sizeof sh), 0);
        assert_string_equal(creq, v->creq);
        assert_int_equal(creq_len, strlen(v->creq));
        assert_int_equal(sigv4_string_to_sign(&s, creq, creq_len, sts, sizeof sts, &sts_len), 0);
        assert_string_equal(sts, v->sts);
        assert_int_equal(sigv4_signing_key(&s, key), 0);
        sigv4_signature(key, sts, sts_len, sig);
        assert_string_equal(sig, v->signature);
        assert_int_equal(sigv4_authorization(&s, &r, auth, sizeof auth), 0);
        assert_non_null(strstr(auth, v->signature));
        if (v->authorization != NULL) {
            assert_string_equal(auth, v->authorization);
        }
    }
}

/* [IAM] "Calculate the signature": the signing key for 20150830,
 * us-east-1, iam. */
static void test_iam_signing_key(void **state)
{
    (void)state;
    sigv4_signer s = {"AKIDEXAMPLE", SECRET, "us-east-1", "iam", DATE};
    uint8_t key[SIGV4_KEY_LEN];
    char hex[2 * SIGV4_KEY_LEN + 1];
    assert_int_equal(sigv4_signing_key(&s, key), 0);
    sigv4_hex(key, sizeof key, hex);
    assert_string_equal(hex, "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9");
}

/* [IAM] the canonical request's published hash, via the string to sign's
 * last line. */
static void test_iam_canonical_hash(void **state)
{
    (void)state;
    const vector *v = &VECTORS[0];
    uint8_t h[crypto_hash_sha256_BYTES];
    char hex[SIGV4_HEX_LEN + 1];
    crypto_hash_sha256(h, (const uint8_t *)v->creq, strlen(v->creq));
    sigv4_hex(h, sizeof h, hex);
    assert_string_equal(hex, "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59");
}

/* The encoding rules on their own: unreserved kept, '/' kept only in a
 * path, everything else %XX upper-case (values from the rules, by hand). */
static void test_uri_encode_rules(void **state)
{
    (void)state;
    char out[64];
    size_t n;
    assert_int_equal(sigv4_uri_encode((const uint8_t *)"a b/c~d*e+f=", 12, 1, out, sizeof out, &n), 0);
    assert_string_equal(out, "a%20b/c~d%2Ae%2Bf%3D");
    assert_int_equal(n, strlen(out));
    assert_int_equal(sigv4_uri_encode((const uint8_t *)"a/b", 3, 0, out, sizeof out, &n), 0);
    assert_string_equal(out, "a%2Fb");
    /* exactly fits (7 chars + NUL), then one short */
    assert_int_equal(sigv4_uri_encode((const uint8_t *)"\xff\x00x", 3, 0, out, 8, &n), 0);
    assert_string_equal(out, "%FF%00x");
    assert_int_equal(sigv4_uri_encode((const uint8_t *)"\xff\x00x", 3, 0, out, 7, &n), -1);
    assert_int_equal(n, 0);
}

/* Malformed input and short buffers are refused, never truncated. */
static void test_refusals(void **state)
{
    (void)state;
    const vector *v = &VECTORS[1];
    sigv4_request r = request_of(v);
    sigv4_signer s = signer_of(v);
    char creq[4096], sh[256], auth[512];
    size_t n;

    assert_int_equal(sigv4_canonical_request(&r, creq, strlen(v->creq), &n, sh, sizeof sh), -1);
    assert_int_equal(sigv4_canonical_request(&r, creq, strlen(v->creq) + 1, &n, sh, sizeof sh), 0);
    assert_int_equal(sigv4_authorization(&s, &r, auth, strlen(v->authorization)), -1);
    assert_string_equal(auth, "");
    assert_int_equal(sigv4_authorization(&s, &r, auth, strlen(v->authorization) + 1), 0);

    static const char *bad_paths[] = {"", "x", "//", "/a//b", "/./a", "/a/..", "/a/../b"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++) {
        sigv4_request b = r;
        b.path = bad_paths[i];
        assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    }
    sigv4_pair dup[] = {{"Host", "a"}, {"host", "b"}};
    sigv4_pair crlf[] = {{"Host", "a\r\nx-evil: 1"}};
    sigv4_pair colon[] = {{"Ho:st", "a"}};
    sigv4_request b = r;
    b.headers = dup;
    b.nheaders = 2;
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    b.headers = crlf;
    b.nheaders = 1;
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    b.headers = colon;
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    b = r;
    b.nheaders = SIGV4_MAX_HEADERS + 1;
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);

    b = r;
    b.payload_hash = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    b.payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85";
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), -1);
    b.payload_hash = EMPTY_SHA256;
    assert_int_equal(sigv4_canonical_request(&b, creq, sizeof creq, &n, sh, sizeof sh), 0);
    assert_string_equal(creq, v->creq);

    sigv4_signer t = s;
    t.amz_date = "20150830 123600Z";
    assert_int_equal(sigv4_authorization(&t, &r, auth, sizeof auth), -1);
    t = s;
    t.region = "us-east-1/x";
    assert_int_equal(sigv4_authorization(&t, &r, auth, sizeof auth), -1);
    t = s;
    t.access_key_id = "AKID/EXAMPLE";
    assert_int_equal(sigv4_authorization(&t, &r, auth, sizeof auth), -1);
    t = s;
    t.secret_access_key = "";
    uint8_t key[SIGV4_KEY_LEN];
    memset(key, 0xaa, sizeof key);
    assert_int_equal(sigv4_signing_key(&t, key), -1);
    for (size_t i = 0; i < sizeof key; i++) {
        assert_int_equal(key[i], 0);
    }
}

/* Header values are trimmed and inner spaces collapsed (the rule; the
 * expected text is by hand). */
static void test_header_trim(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"My-Header1", "  value1  "}, {"my-header2", "\"a   b   c\""}};
    sigv4_request r = {"GET", "/", NULL, 0, h, 2, NULL, 0, EMPTY_SHA256};
    char creq[512], sh[64];
    size_t n;
    assert_int_equal(sigv4_canonical_request(&r, creq, sizeof creq, &n, sh, sizeof sh), 0);
    assert_string_equal(creq, "GET\n/\n\nmy-header1:value1\nmy-header2:\"a b c\"\n\nmy-header1;my-header2\n" EMPTY_SHA256);
    assert_string_equal(sh, "my-header1;my-header2");
}

/* Run the SigV4 tests. */
int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_vectors), cmocka_unit_test(test_iam_signing_key),
        cmocka_unit_test(test_iam_canonical_hash), cmocka_unit_test(test_uri_encode_rules),
        cmocka_unit_test(test_refusals),          cmocka_unit_test(test_header_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
