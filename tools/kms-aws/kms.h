/*
 * tools/kms-aws/kms.h -- the AWS KMS calls the keyshift-kms-aws plugin
 * makes: Encrypt, Decrypt and DescribeKey over the JSON 1.1 protocol
 * (POST /, X-Amz-Target: TrentService.<Op>, Content-Type:
 * application/x-amz-json-1.1), signed with SigV4 (sigv4.h), sent with
 * libcurl, parsed with jansson.
 *
 * Everything the endpoint sends is untrusted: a response is at most
 * KMS_MAX_RESPONSE bytes, must be one JSON object without duplicate
 * members, every member this module reads must have the exact JSON type
 * and a bounded length, and base64 must be strict (standard alphabet,
 * padded, no whitespace).  Members it does not read are ignored, so that
 * AWS adding one does not break the plugin; an optional member that is
 * null counts as absent.
 *
 * Secrets: the secret access key and session token live in kms_config
 * (wipe it with kms_config_wipe()); plaintext DEKs are wiped from every
 * buffer this module owns, and from jansson's and libcurl's, whose
 * allocators are replaced process-wide by kms_global_init() with one that
 * wipes on free.  The TLS library's own buffers are outside
 * its reach.
 *
 * Encryption context (what KMS binds the ciphertext to, and logs in
 * CloudTrail).  Every call with a kms_context sends this JSON object:
 *
 *   "keyshift-aad":         base64 (standard, padded) of keyshift's wrap
 *                           AAD, the binary bytes the envelope binds its
 *                           wrapped DEK to
 *   "keyshift-tenant":      the tenant                     (if not NULL)
 *   "keyshift-key-id":      keyshift's key id              (if not NULL)
 *   "keyshift-key-version": the key version, in decimal    (if not NULL)
 *   "keyshift-purpose":     the purpose (v2 envelopes)     (if not NULL)
 *
 * The readable members only repeat what the AAD already binds, so that a
 * CloudTrail reader can tell which key and tenant a call was for; the AAD
 * is what makes a wrapped DEK useless under any other context.  Decrypt
 * must send exactly the context Encrypt did, or KMS refuses it
 * (InvalidCiphertextException).  Values are caller-provided UTF-8 strings
 * of at most KMS_MAX_CONTEXT_VALUE bytes.  The plugin's use of it is
 * docs/kms-plugin.md [KP-AWS-6].
 *
 * Errors, from the response's __type (the part after any '#') or, without
 * a body, the HTTP status:
 *   ThrottlingException, LimitExceededException             KMS_THROTTLED
 *   HTTP 5xx, KMSInternalException, DependencyTimeoutException,
 *   KeyUnavailableException, connection failures            KMS_UNAVAILABLE
 *   no answer within timeout_ms (CURLE_OPERATION_TIMEDOUT)   KMS_TIMEOUT
 *   AccessDeniedException, DisabledException,
 *   InvalidKeyUsageException, UnrecognizedClientException,
 *   InvalidSignatureException, ExpiredTokenException         KMS_DENIED
 *   KMSInvalidStateException                                 see below
 *   NotFoundException                                        KMS_NOT_FOUND
 *   InvalidCiphertextException, IncorrectKeyException        KMS_AUTH_FAILED
 *   anything else, or a malformed response                   KMS_INVALID
 * KMSInvalidStateException covers several key states (pending deletion,
 * pending import, unavailable custom key store, ...) and its message text
 * is not a contract, so the rule is: ask DescribeKey for the KeyState;
 * PendingDeletion or PendingReplicaDeletion is KMS_REVOKED (the key is
 * going away: nothing wrapped under it will decrypt again unless an
 * operator cancels the deletion), anything else -- or DescribeKey failing
 * -- is KMS_DENIED.
 */
#ifndef KS_KMS_AWS_KMS_H
#define KS_KMS_AWS_KMS_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define KMS_MAX_RESPONSE 65536
#define KMS_MAX_PLAINTEXT 4096     /* KMS's own limit for Encrypt */
#define KMS_MAX_CIPHERTEXT 6144    /* KMS's CiphertextBlob limit */
#define KMS_MAX_AAD 4096
#define KMS_MAX_CONTEXT_VALUE 1024
#define KMS_MAX_KEY_ID 2048
#define KMS_MAX_SECRET 256
#define KMS_MAX_TOKEN 4096
#define KMS_MAX_URL 1024

/* What a call came to. */
typedef enum {
    KMS_OK = 0,
    KMS_UNAVAILABLE, /* retryable: no connection, timeout, 5xx */
    KMS_THROTTLED,   /* retryable: later, slower */
    KMS_DENIED,      /* credentials or policy refuse, or the key is disabled */
    KMS_REVOKED,     /* the key is pending deletion */
    KMS_NOT_FOUND,   /* no such key */
    KMS_AUTH_FAILED, /* the ciphertext does not open under this key and context */
    KMS_INVALID,     /* a malformed request, response or configuration */
    KMS_TIMEOUT,     /* retryable: no answer within timeout_ms */
} kms_status;

/* Where and as whom to call.  Fill it with kms_config_load(). */
typedef struct {
    char access_key_id[129];
    char secret_access_key[KMS_MAX_SECRET + 1];
    char session_token[KMS_MAX_TOKEN + 1]; /* "" when none */
    char region[65];
    char endpoint[KMS_MAX_URL + 1]; /* scheme://authority/ */
    char host[256];                 /* the authority, as signed in Host */
    long timeout_ms;                /* whole call; default 10000 */
    time_t now;                     /* 0: the clock (tests may fix it) */
    char profile[65];               /* the shared files' profile */
    int profile_given;              /* --profile: the environment's keys
                                       and web identity are not used */
    int profile_named;              /* --profile or AWS_PROFILE: a profile
                                       in neither file is an error */
} kms_config;

/* A refusal's details, safe to print: type and message are the
 * endpoint's, reduced to printable ASCII and bounded. */
typedef struct {
    long http_status; /* 0: no response */
    char type[64];
    char message[256];
} kms_error;

/* The encryption context (see above).  aad is required. */
typedef struct {
    const uint8_t *aad;
    size_t aad_len;
    const char *tenant;
    const char *key_id;
    const char *key_version;
    const char *purpose;
} kms_context;

/* What DescribeKey says of a key. */
typedef struct {
    char arn[KMS_MAX_KEY_ID + 1];
    char key_state[32];
    char key_usage[32];
    int enabled;
} kms_key_info;

/* A connection to one endpoint as one identity.  Not thread-safe: one
 * call at a time per client (it reuses one libcurl handle, so that calls
 * after the first reuse the TLS connection).  Calls do not retry: a
 * retryable status goes back to the caller, which owns the backoff. */
typedef struct kms_client kms_client;

/* The configuration from the environment and the shared files:
 *   credentials  the chain of creds.h [KP-AWS-10]: the environment, web
 *                identity, the profile AWS_PROFILE (default "default")
 *                of the shared files, the container endpoint, IMDSv2;
 *   region       AWS_REGION, AWS_DEFAULT_REGION, else the profile's region
 *                in AWS_CONFIG_FILE or $HOME/.aws/config;
 *   endpoint     AWS_ENDPOINT_URL_KMS, AWS_ENDPOINT_URL, else
 *                https://kms.REGION.amazonaws.com/.
 * The files are parsed strictly (kms_ini_parse).  KMS_OK; KMS_INVALID
 * (a configuration error) with why in err; or the status of a
 * credential source that failed (creds.h). */
kms_status kms_config_load(kms_config *cfg, char *err, size_t errlen);

/* What a caller (the plugin's command line) sets instead of what
 * kms_config_load() would read; NULL members change nothing. */
typedef struct {
    const char *profile;  /* instead of AWS_PROFILE; credentials then come
                             from this profile only, never from
                             AWS_ACCESS_KEY_ID (as the AWS SDKs do) */
    const char *region;   /* instead of AWS_REGION and the config file */
    const char *endpoint; /* instead of AWS_ENDPOINT_URL(_KMS) and the
                             regional default */
} kms_overrides;

/* kms_config_load() with ov (which may be NULL) applied. */
kms_status kms_config_load_with(kms_config *cfg, const kms_overrides *ov, char *err, size_t errlen);

/* kms_config_load_with() without the credentials (cfg's stay empty):
 * the profile, region and endpoint only.  KMS_OK or KMS_INVALID. */
kms_status kms_config_load_base(kms_config *cfg, const kms_overrides *ov, char *err, size_t errlen);

/* One key = value a section may hold: where its value goes (cap bytes,
 * printable ASCII, spaces only when allow_space), and whether it was
 * seen. */
typedef struct {
    const char *key;
    char *dst;
    size_t cap;
    int allow_space;
    int seen;
} kms_ini_want;

/* Parse an AWS shared file text[0..len) (modified in place; path is for
 * messages) strictly: [section] lines, key = value lines, blank lines,
 * #/; comments, and indented lines only right after a key with an empty
 * value (a nested setting such as "s3 =", skipped: none of the keys read
 * is nested); anything else, a section or a wanted key given twice, a
 * NUL byte or a line over 4096 bytes is an error.  Fills the wanted keys
 * of the section named section; *found says whether it exists.  0, or
 * -1 with why (file and line) in err. */
int kms_ini_parse(const char *path, char *text, size_t len, const char *section, kms_ini_want *want, size_t nwant,
                  int *found, char *err, size_t errlen);

/* Read section of the shared file named by variable var (else
 * $HOME/.aws/leaf; its path into path, cap bytes) into want.  0 (the
 * file or section may be absent: *found says), or -1 with why in err. */
int kms_shared_load(const char *var, const char *leaf, const char *section, kms_ini_want *want, size_t nwant,
                    int *found, char *path, size_t cap, char *err, size_t errlen);

/* Read a regular file of at most max bytes into a NUL-terminated heap
 * buffer (*len its length; the caller wipes max + 1 bytes and frees it).
 * 0; 1 when it does not exist; -1 with why in err. */
int kms_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen);

/* Check and set cfg's endpoint from url (http or https, a host and
 * optional port, path empty or "/").  0 or -1. */
int kms_config_set_endpoint(kms_config *cfg, const char *url);

/* Whether s can name a profile: 1..64 of [A-Za-z0-9_.-]. */
int kms_config_profile_ok(const char *s);

/* printf into err (errlen bytes), when err is not NULL. */
void kms_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Zero cfg, secrets included. */
void kms_config_wipe(kms_config *cfg);

/* Once per process, before anything else uses libcurl or jansson (it
 * replaces their allocators): libsodium, libcurl, jansson.  0 or -1.
 * kms_client_open() calls it too. */
int kms_global_init(void);

/* A client for cfg (copied; its credentials may be empty until
 * kms_client_set_credentials(), and a call without them is
 * KMS_INVALID).  NULL on allocation or libcurl failure. */
kms_client *kms_client_open(const kms_config *cfg);

/* Replace the credentials c signs with (the session token may be "").
 * Between calls only. */
void kms_client_set_credentials(kms_client *c, const char *access_key_id, const char *secret_access_key,
                                const char *session_token);

/* Close c and wipe its copy of the configuration.  NULL is a no-op. */
void kms_client_close(kms_client *c);

/* Encrypt pt (at most KMS_MAX_PLAINTEXT bytes) under key_id with ctx; the
 * CiphertextBlob into ct (ct_cap bytes), its length into *ct_len. */
kms_status kms_encrypt(kms_client *c, const char *key_id, const uint8_t *pt, size_t pt_len, const kms_context *ctx,
                       uint8_t *ct, size_t ct_cap, size_t *ct_len, kms_error *err);

/* Decrypt ct under key_id (always named, so that KMS refuses a blob of
 * another key) with ctx; the plaintext into pt (pt_cap bytes), its length
 * into *pt_len.  pt is zeroed unless the call succeeds. */
kms_status kms_decrypt(kms_client *c, const char *key_id, const uint8_t *ct, size_t ct_len, const kms_context *ctx,
                       uint8_t *pt, size_t pt_cap, size_t *pt_len, kms_error *err);

/* DescribeKey for key_id. */
kms_status kms_describe_key(kms_client *c, const char *key_id, kms_key_info *info, kms_error *err);

/* Decode s[0..n) (NUL-terminated at n), which must be canonical base64
 * (standard alphabet, padded, no whitespace, unused bits zero), of at most
 * cap bytes, into out.  0, or -1 with out zeroed. */
int kms_base64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *out_len);

/* A status's name: "ok", "unavailable", "throttled", "denied", "revoked",
 * "not-found", "auth-failed", "invalid", "timeout". */
const char *kms_status_name(kms_status s);

/* The status an error __type (with or without a "prefix#") and HTTP
 * status map to, before the KMSInvalidStateException rule; *invalid_state
 * is set when that rule applies. */
kms_status kms_classify(const char *type, long http_status, int *invalid_state);

#endif
