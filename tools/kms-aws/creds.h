/*
 * tools/kms-aws/creds.h -- the AWS credential chain of keyshift-kms-aws
 * (docs/kms-plugin.md [KP-AWS-10..14]): where the plugin finds the
 * credentials it signs with, in the order of the AWS SDKs' default chain:
 *
 *   1. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 *      AWS_SESSION_TOKEN;
 *   2. web identity: AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN (and
 *      AWS_ROLE_SESSION_NAME), traded at STS AssumeRoleWithWebIdentity;
 *   3. the profile of the shared config and credentials files: static
 *      keys, role_arn with source_profile, credential_source or
 *      web_identity_token_file (STS AssumeRole[WithWebIdentity]), or
 *      credential_process;
 *   4. the container endpoint: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or
 *      _FULL_URI, with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE);
 *   5. EC2 instance metadata, IMDSv2 only.
 *
 * The first source that is configured is the one used: when it fails,
 * the chain fails with its error and never falls through to a later
 * source (a broken role must not quietly become the instance's role).
 * A source that is not configured is skipped, with the reason kept for
 * the message of a chain that found nothing.
 *
 * Every byte a source gives (files, a process's output, HTTP bodies) is
 * untrusted: bounded, parsed strictly, and copied only into the
 * fixed-size fields of kms_creds.  Secrets are wiped from every buffer
 * this module owns.
 */
#ifndef KS_KMS_AWS_CREDS_H
#define KS_KMS_AWS_CREDS_H

#include <stddef.h>
#include <time.h>

#include "kms.h"

#define CREDS_MAX_DOC 65536       /* an HTTP body or a process's output */
#define CREDS_MAX_WEB_TOKEN 16384 /* a web identity token file */
#define CREDS_MAX_DEPTH 4         /* source_profile hops */
#define CREDS_REFRESH_WINDOW 300  /* s before Expiration [KP-AWS-13] */
#define CREDS_IMDS_STEP_MS 1000   /* one IMDS request, as the SDKs */
#define CREDS_CONTAINER_STEP_MS 2000

/* Credentials and whence they came.  expires is 0 for credentials that
 * do not expire (static keys). */
typedef struct {
    char access_key_id[129];
    char secret_access_key[KMS_MAX_SECRET + 1];
    char session_token[KMS_MAX_TOKEN + 1];
    time_t expires;
    char source[96];
} kms_creds;

/* What reads a credentials JSON document. */
typedef enum {
    CREDS_JSON_PROCESS = 0, /* credential_process: Version 1, SessionToken */
    CREDS_JSON_HTTP         /* container and IMDS: Token, optional Code */
} creds_json_kind;

/* The region of the EC2 instance from IMDSv2 [KP-AWS-16]: a token, then
 * /latest/meta-data/placement/region, each within CREDS_IMDS_STEP_MS,
 * into region[0, cap).  0 with a region name; 1 when IMDS is disabled or
 * gives none (why in why); -1 when a variable or the answer is malformed
 * (why in why). */
int kms_imds_region(char *region, size_t cap, char *why, size_t whylen);

/* Walk the chain for cfg (its region, timeout_ms, profile, now): KMS_OK
 * with the credentials in out; KMS_INVALID when nothing is configured or
 * a configuration is wrong (a configuration error); KMS_UNAVAILABLE,
 * KMS_TIMEOUT or KMS_DENIED when the configured source failed so.  On
 * failure err gets the full reason (every source tried and why it was
 * skipped, naming the variables and files) and brief a short form of at
 * most 240 bytes without runs of 16 or more [A-Za-z0-9+/=_-] characters,
 * which keyshift shows unredacted [KP-BRIDGE-9].  The whole walk ends by
 * cfg->timeout_ms. */
kms_status kms_creds_resolve(const kms_config *cfg, kms_creds *out, char *err, size_t errlen, char *brief,
                             size_t brieflen);

/* Parse a credentials JSON document doc[0..n) of kind into out (strict:
 * one object, no duplicate member, exact types, bounded fields, an
 * Expiration in the form kms_creds_parse_time() reads).  KMS_OK, or
 * KMS_INVALID with why in err; KMS_UNAVAILABLE for an HTTP document
 * whose Code is not "Success". */
kms_status kms_creds_parse_json(const char *doc, size_t n, creds_json_kind kind, kms_creds *out, char *err,
                                size_t errlen);

/* Parse an STS query-protocol answer doc[0..n) to action
 * ("AssumeRole", "AssumeRoleWithWebIdentity") with HTTP status http:
 * on 200 the Credentials into out; otherwise the ErrorResponse's Code
 * and Message into err and the status they mean (KMS_DENIED,
 * KMS_THROTTLED, KMS_UNAVAILABLE, KMS_INVALID).  Strict and bounded: one
 * root element of the action, each field once, no entity or markup in a
 * value, printable ASCII. */
kms_status kms_creds_parse_sts(const char *doc, size_t n, long http, const char *action, kms_creds *out,
                               char *err, size_t errlen);

/* An ISO 8601 UTC time "YYYY-MM-DDTHH:MM:SS[.fraction]Z" (fraction 1..9
 * digits) of s[0..n) into *out.  0 or -1. */
int kms_creds_parse_time(const char *s, size_t n, time_t *out);

/* When credentials fetched at fetched should be fetched again: 0 for
 * none (no expiry), else CREDS_REFRESH_WINDOW seconds before expires,
 * or half way through a shorter life [KP-AWS-13]. */
time_t kms_creds_refresh_at(const kms_creds *c, time_t fetched);

/* Copy s[0..n) into dst (cap bytes) if it is 1..cap-1 bytes of printable
 * ASCII without spaces.  0 or -1 (dst unchanged). */
int kms_creds_field(char *dst, size_t cap, const char *s, size_t n);

/* Copy s[0..n) into dst (cap bytes) if it is a region name [KP-AWS-16]:
 * a field as kms_creds_field takes it that is also a SigV4 scope part
 * (1 to 64 lowercase letters, digits and '-').  0, or -1 with dst empty. */
int kms_creds_region(char *dst, size_t cap, const char *s, size_t n);

/* How messages name an STS action: "AssumeRole", or "web identity" for
 * AssumeRoleWithWebIdentity (a name of 16 or more such characters would
 * be redacted where keyshift shows it, [KP-BRIDGE-9]). */
const char *kms_sts_label(const char *action);

/* Zero c. */
void kms_creds_wipe(kms_creds *c);

#endif
