/*
 * tools/kms-aws/creds_parse.c -- the readers of what a credential source
 * answers (creds.h): credential_process's and the metadata endpoints'
 * JSON (jansson, strict), STS's XML (a small strict extractor: bounded,
 * one root, each field once, no markup or entity in a value), ISO 8601
 * times.  No I/O: fuzz/fuzz_aws_creds.c runs these on arbitrary bytes.
 */
#define _GNU_SOURCE /* memmem */
#include "creds.h"
#include "sigv4.h"

#include <assert.h>
#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define seterr kms_seterr

/* creds.h */
int kms_creds_field(char *dst, size_t cap, const char *s, size_t n)
{
    if (n == 0 || n >= cap) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 32 || c >= 127) {
            return -1;
        }
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

/* creds.h */
int kms_creds_region(char *dst, size_t cap, const char *s, size_t n)
{
    if (kms_creds_field(dst, cap, s, n) != 0 || !sigv4_scope_part_ok(dst)) {
        if (cap > 0) {
            dst[0] = '\0';
        }
        return -1;
    }
    return 0;
}

/* ---- time --------------------------------------------------------------- */

/* creds.h */
int kms_creds_parse_time(const char *s, size_t n, time_t *out)
{
    /* YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z */
    static const char SHAPE[] = "dddd-dd-ddTdd:dd:dd";
    if (n < 20 || n > 30 || s[n - 1] != 'Z') {
        return -1;
    }
    for (size_t i = 0; i < 19; i++) {
        if (SHAPE[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != SHAPE[i]) {
            return -1;
        }
    }
    if (n > 20) {
        if (s[19] != '.' || n < 22) {
            return -1;
        }
        for (size_t i = 20; i < n - 1; i++) {
            if (s[i] < '0' || s[i] > '9') {
                return -1;
            }
        }
    }
#define D2(p) ((s[p] - '0') * 10 + (s[(p) + 1] - '0'))
    int year = D2(0) * 100 + D2(2), mon = D2(5), day = D2(8), h = D2(11), mi = D2(14), sec = D2(17);
#undef D2
    static const int MDAYS[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (year < 1970 || mon < 1 || mon > 12 || day < 1 || day > MDAYS[mon - 1] || (mon == 2 && day == 29 && !leap) ||
        h > 23 || mi > 59 || sec > 59) {
        return -1;
    }
    /* days from the civil date (proleptic Gregorian), no timegm needed */
    int y = year - (mon <= 2);
    int era = y / 400;
    int yoe = y - era * 400;
    int doy = (153 * (mon + (mon > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    int64_t days = (int64_t)era * 146097 + doe - 719468;
    *out = (time_t)(days * 86400 + h * 3600 + mi * 60 + sec);
    return 0;
}

/* creds.h */
time_t kms_creds_refresh_at(const kms_creds *c, time_t fetched)
{
    if (c->expires == 0) {
        return 0;
    }
    time_t life = c->expires - fetched;
    time_t window = life / 2 < CREDS_REFRESH_WINDOW ? life / 2 : CREDS_REFRESH_WINDOW;
    return c->expires - (window > 0 ? window : 0);
}

/* creds.h */
void kms_creds_wipe(kms_creds *c)
{
    sodium_memzero(c, sizeof *c);
}

/* ---- the credentials JSON documents ----------------------------------- */

/* o[key] as a string (its length into *n), NULL when absent or null;
 * *bad is set when it is there with another type. */
static const char *json_str(const json_t *o, const char *key, size_t *n, int *bad)
{
    const json_t *v = json_object_get(o, key);
    *n = 0;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    if (!json_is_string(v)) {
        *bad = 1;
        return NULL;
    }
    *n = json_string_length(v);
    return json_string_value(v);
}

/* creds.h */
kms_status kms_creds_parse_json(const char *doc, size_t n, creds_json_kind kind, kms_creds *out, char *err,
                                size_t errlen)
{
    json_error_t je;
    kms_status st = KMS_INVALID;
    int bad = 0;
    size_t nid, nsec, ntok, nexp, ncode, nmsg;
    kms_creds_wipe(out);
    if (n > CREDS_MAX_DOC || memchr(doc, '\0', n) != NULL) {
        seterr(err, errlen, "the credentials document is over %d bytes or holds a NUL byte", CREDS_MAX_DOC);
        return KMS_INVALID;
    }
    json_t *o = json_loadb(doc, n, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        seterr(err, errlen, "the credentials document is not one JSON object (%s at byte %d)",
               o == NULL ? je.text : "not an object", o == NULL ? je.position : 0);
        goto out;
    }
    if (kind == CREDS_JSON_PROCESS) {
        const json_t *v = json_object_get(o, "Version");
        if (!json_is_integer(v) || json_integer_value(v) != 1) {
            seterr(err, errlen, "the credential_process output has no \"Version\": 1");
            goto out;
        }
    } else {
        const char *code = json_str(o, "Code", &ncode, &bad);
        if (code != NULL && !(ncode == 7 && memcmp(code, "Success", 7) == 0)) {
            const char *msg = json_str(o, "Message", &nmsg, &bad);
            char c[64] = "?", m[160] = "";
            kms_creds_field(c, sizeof c, code, ncode < sizeof c ? ncode : sizeof c - 1);
            if (msg != NULL) {
                for (size_t i = 0; i < nmsg && i + 1 < sizeof m; i++) {
                    m[i] = msg[i] >= 32 && msg[i] < 127 ? msg[i] : '?';
                    m[i + 1] = '\0';
                }
            }
            seterr(err, errlen, "the endpoint answered Code %s%s%s", c, m[0] != '\0' ? ": " : "", m);
            st = KMS_UNAVAILABLE;
            goto out;
        }
    }
    const char *id = json_str(o, "AccessKeyId", &nid, &bad);
    const char *sec = json_str(o, "SecretAccessKey", &nsec, &bad);
    const char *tok = json_str(o, kind == CREDS_JSON_PROCESS ? "SessionToken" : "Token", &ntok, &bad);
    const char *exp = json_str(o, "Expiration", &nexp, &bad);
    if (bad) {
        seterr(err, errlen, "a credentials member is not a string");
        goto out;
    }
    if (id == NULL || kms_creds_field(out->access_key_id, sizeof out->access_key_id, id, nid) != 0) {
        seterr(err, errlen, "AccessKeyId is missing, empty, too long or not printable");
        goto out;
    }
    if (sec == NULL || kms_creds_field(out->secret_access_key, sizeof out->secret_access_key, sec, nsec) != 0) {
        seterr(err, errlen, "SecretAccessKey is missing, empty, too long or not printable");
        goto out;
    }
    if (tok != NULL && kms_creds_field(out->session_token, sizeof out->session_token, tok, ntok) != 0) {
        seterr(err, errlen, "the session token is empty, too long or not printable");
        goto out;
    }
    if (exp != NULL && kms_creds_parse_time(exp, nexp, &out->expires) != 0) {
        seterr(err, errlen, "Expiration is not an ISO 8601 UTC time (YYYY-MM-DDTHH:MM:SSZ)");
        goto out;
    }
    st = KMS_OK;
out:
    json_decref(o);
    if (st != KMS_OK) {
        kms_creds_wipe(out);
    }
    return st;
}

/* ---- the STS answers (XML) ------------------------------------------- */

/* The one element <name>...</name> of doc[0..n): its content into *v,
 * *vn.  1 when found once; 0 absent; -1 when given twice, with
 * attributes, unclosed, or (leaf) holding markup or an entity. */
static int xml_elem(const char *doc, size_t n, const char *name, int leaf, const char **v, size_t *vn)
{
    char open[72], close[72];
    size_t nl = strlen(name);
    const char *end = doc + n, *tag = NULL;
    assert(nl + 3 < sizeof open);
    snprintf(open, sizeof open, "<%s", name);
    snprintf(close, sizeof close, "</%s>", name);
    /* every start tag of exactly this name (not a longer one) */
    for (const char *p = doc; p < end;) {
        const char *q = memmem(p, (size_t)(end - p), open, nl + 1);
        if (q == NULL) {
            break;
        }
        const char *after = q + nl + 1;
        p = after;
        if (after < end && (*after == '>' || *after == ' ' || *after == '/' || *after == '\t')) {
            if (tag != NULL || *after != '>') {
                return -1; /* twice, attributes or self-closed: not what STS sends */
            }
            tag = q;
        }
    }
    if (tag == NULL) {
        return 0;
    }
    const char *content = tag + nl + 2;
    const char *c = memmem(content, (size_t)(end - content), close, nl + 3);
    if (c == NULL) {
        return -1;
    }
    *v = content;
    *vn = (size_t)(c - content);
    if (leaf && (memchr(*v, '<', *vn) != NULL || memchr(*v, '&', *vn) != NULL)) {
        return -1;
    }
    return 1;
}

/* Whether doc[0..n) is, after an optional XML declaration and white
 * space, one element named root (nothing but white space after it). */
static int xml_root(const char *doc, size_t n, const char *root)
{
    size_t i = 0;
    while (i < n && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\r' || doc[i] == '\n')) {
        i++;
    }
    if (n - i >= 5 && memcmp(doc + i, "<?xml", 5) == 0) {
        const char *q = memmem(doc + i, n - i, "?>", 2);
        if (q == NULL) {
            return 0;
        }
        i = (size_t)(q - doc) + 2;
        while (i < n && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\r' || doc[i] == '\n')) {
            i++;
        }
    }
    size_t e = n;
    while (e > i && (doc[e - 1] == ' ' || doc[e - 1] == '\t' || doc[e - 1] == '\r' || doc[e - 1] == '\n')) {
        e--;
    }
    size_t rl = strlen(root);
    char close[80];
    snprintf(close, sizeof close, "</%s>", root);
    size_t cl = strlen(close);
    return e - i > rl + 1 + cl && doc[i] == '<' && memcmp(doc + i + 1, root, rl) == 0 &&
           (doc[i + 1 + rl] == '>' || doc[i + 1 + rl] == ' ') && memcmp(doc + e - cl, close, cl) == 0;
}

/* The status an STS error Code means. */
static kms_status sts_code_status(const char *code, long http)
{
    static const char *const DENIED[] = {"AccessDenied",          "InvalidIdentityToken", "ExpiredTokenException",
                                         "ExpiredToken",          "InvalidClientTokenId", "SignatureDoesNotMatch",
                                         "IDPRejectedClaim",      "RegionDisabledException",
                                         "InvalidAuthorizationMessageException"};
    static const char *const BUSY[] = {"IDPCommunicationError", "ServiceUnavailable", "InternalFailure",
                                       "InternalError"};
    for (size_t i = 0; i < sizeof DENIED / sizeof DENIED[0]; i++) {
        if (strcmp(code, DENIED[i]) == 0) {
            return KMS_DENIED;
        }
    }
    for (size_t i = 0; i < sizeof BUSY / sizeof BUSY[0]; i++) {
        if (strcmp(code, BUSY[i]) == 0) {
            return KMS_UNAVAILABLE;
        }
    }
    if (strcmp(code, "Throttling") == 0 || strcmp(code, "ThrottlingException") == 0 || http == 429) {
        return KMS_THROTTLED;
    }
    if (http >= 500 && http <= 599) {
        return KMS_UNAVAILABLE;
    }
    return KMS_INVALID;
}

/* creds.h */
const char *kms_sts_label(const char *action)
{
    return strcmp(action, "AssumeRole") == 0 ? "AssumeRole" : "web identity";
}

/* creds.h */
kms_status kms_creds_parse_sts(const char *doc, size_t n, long http, const char *action, kms_creds *out,
                               char *err, size_t errlen)
{
    char root[64], result[64];
    const char *blk, *v;
    size_t bn, vn;
    kms_creds_wipe(out);
    if (n > CREDS_MAX_DOC || memchr(doc, '\0', n) != NULL) {
        seterr(err, errlen, "STS %s: the answer is over %d bytes or holds a NUL byte", kms_sts_label(action),
               CREDS_MAX_DOC);
        return http == 200 ? KMS_INVALID : sts_code_status("", http);
    }
    if (http != 200) {
        char code[64] = "", msg[200] = "";
        if (xml_root(doc, n, "ErrorResponse") && xml_elem(doc, n, "Error", 0, &blk, &bn) == 1) {
            if (xml_elem(blk, bn, "Code", 1, &v, &vn) == 1) {
                kms_creds_field(code, sizeof code, v, vn < sizeof code ? vn : sizeof code - 1);
            }
            if (xml_elem(blk, bn, "Message", 0, &v, &vn) == 1) {
                size_t j = 0;
                for (size_t i = 0; i < vn && j + 1 < sizeof msg; i++) {
                    msg[j++] = v[i] >= 32 && v[i] < 127 ? v[i] : '?';
                }
                msg[j] = '\0';
            }
        }
        seterr(err, errlen, "STS %s: %s%s%s (HTTP %ld)", kms_sts_label(action),
               code[0] != '\0' ? code : "no error code", msg[0] != '\0' ? ": " : "", msg, http);
        return sts_code_status(code, http);
    }
    snprintf(root, sizeof root, "%sResponse", action);
    snprintf(result, sizeof result, "%sResult", action);
    if (!xml_root(doc, n, root) || xml_elem(doc, n, result, 0, &blk, &bn) != 1 ||
        xml_elem(blk, bn, "Credentials", 0, &blk, &bn) != 1) {
        seterr(err, errlen, "STS %s: the answer is not one %s with its Credentials", kms_sts_label(action), root);
        return KMS_INVALID;
    }
    static const char *const NAMES[] = {"AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"};
    for (size_t i = 0; i < 4; i++) {
        int r = xml_elem(blk, bn, NAMES[i], 1, &v, &vn);
        int bad = r != 1;
        if (!bad && i == 0) {
            bad = kms_creds_field(out->access_key_id, sizeof out->access_key_id, v, vn) != 0;
        } else if (!bad && i == 1) {
            bad = kms_creds_field(out->secret_access_key, sizeof out->secret_access_key, v, vn) != 0;
        } else if (!bad && i == 2) {
            bad = kms_creds_field(out->session_token, sizeof out->session_token, v, vn) != 0;
        } else if (!bad) {
            bad = kms_creds_parse_time(v, vn, &out->expires) != 0;
        }
        if (bad) {
            kms_creds_wipe(out);
            seterr(err, errlen, "STS %s: Credentials/%s is missing, repeated or malformed", kms_sts_label(action),
                   NAMES[i]);
            return KMS_INVALID;
        }
    }
    return KMS_OK;
}

