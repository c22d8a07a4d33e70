/*
 * tools/kms-aws/plugin_main.c -- keyshift-kms-aws, the AWS KMS plugin of
 * keyshift (docs/kms-plugin.md, section "The AWS KMS plugin"): it reads
 * requests from standard input, one line each, and answers each with
 * exactly one line on standard output [KP-PROC-2], calling AWS KMS
 * Encrypt, Decrypt and DescribeKey (kms.h) once per request, without
 * retrying: keyshift owns deadlines, retries and rate limits [KP-AWS-3].
 */
#define _POSIX_C_SOURCE 200809L
#include "plugin.h"
#include "creds.h"

#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keyshift/common.h>

#define PLUGIN_NAME "keyshift-kms-aws " KS_VERSION_STRING

/* What one request needs: the KMS client and the key table, the
 * configuration (or why it could not be loaded), and the credentials the
 * client signs with, until refresh_at [KP-AWS-13]. */
typedef struct {
    kms_client *kms;
    const pl_args *args;
    kms_config cfg;
    const char *config_error; /* NULL: cfg loaded */
    kms_creds creds;
    int have_creds;
    time_t refresh_at; /* 0: never */
} server;

/* The protocol class of a failed KMS call of op [KP-AWS-7]: auth-failed
 * is for unwrap only [KP-ERR-2], so elsewhere it is invalid. */
static pl_class class_of(kms_status s, pl_op op)
{
    switch (s) {
    case KMS_UNAVAILABLE:
        return PL_E_UNAVAILABLE;
    case KMS_TIMEOUT:
        return PL_E_TIMEOUT;
    case KMS_THROTTLED:
        return PL_E_THROTTLED;
    case KMS_DENIED:
        return PL_E_DENIED;
    case KMS_REVOKED:
        return PL_E_REVOKED;
    case KMS_NOT_FOUND:
        return PL_E_NOT_FOUND;
    case KMS_AUTH_FAILED:
        return op == PL_OP_UNWRAP ? PL_E_AUTH_FAILED : PL_E_INVALID;
    case KMS_OK:
    case KMS_INVALID:
        break;
    }
    return PL_E_INVALID;
}

/* Make sure s->kms has credentials that are not due for a refresh: the
 * ones it has, else a walk of the chain (creds.h).  A walk that fails
 * while the current credentials have not expired keeps them.  0, or 1
 * after answering rq with the chain's error (-1 when that write
 * failed). */
static int ensure_creds(server *s, const pl_request *rq)
{
    char full[2048], brief[256];
    kms_creds fresh;
    time_t now = time(NULL);
    if (s->config_error != NULL) {
        return pl_write_error(STDOUT_FILENO, rq->id, PL_E_INVALID, s->config_error) != 0 ? -1 : 1;
    }
    if (s->have_creds && (s->refresh_at == 0 || now < s->refresh_at)) {
        return 0;
    }
    kms_status st = kms_creds_resolve(&s->cfg, &fresh, full, sizeof full, brief, sizeof brief);
    if (st == KMS_OK) {
        kms_creds_wipe(&s->creds);
        s->creds = fresh;
        s->have_creds = 1;
        s->refresh_at = kms_creds_refresh_at(&fresh, now);
        kms_client_set_credentials(s->kms, fresh.access_key_id, fresh.secret_access_key, fresh.session_token);
        kms_creds_wipe(&fresh);
        if (s->creds.expires != 0) {
            fprintf(stderr, "keyshift-kms-aws: credentials from %s, valid for %lld s\n", s->creds.source,
                    (long long)(s->creds.expires - now));
        } else {
            fprintf(stderr, "keyshift-kms-aws: credentials from %s\n", s->creds.source);
        }
        return 0;
    }
    fprintf(stderr, "keyshift-kms-aws: %s\n", full);
    if (s->have_creds && s->creds.expires > now) {
        /* a refresh that failed early: the current ones still serve */
        return 0;
    }
    return pl_write_error(STDOUT_FILENO, rq->id, class_of(st, PL_OP_HELLO) /* [KP-AWS-12] */, brief) != 0 ? -1 : 1;
}

/* Answer a failed KMS call: its class and a message naming the call and
 * what AWS said, "KMS Decrypt: denied, AccessDeniedException: ... (HTTP
 * 400)" (printable ASCII from kms.c, never key material). */
static int answer_kms_error(const pl_request *rq, const char *call, kms_status st, const kms_error *e)
{
    char msg[512];
    char http[24] = "";
    if (e->http_status != 0) {
        snprintf(http, sizeof http, " (HTTP %ld)", e->http_status);
    }
    snprintf(msg, sizeof msg, "KMS %s: %s%s%s%s%s%s", call, kms_status_name(st), e->type[0] != '\0' ? ", " : "",
             e->type, e->message[0] != '\0' ? ": " : "", e->message, http);
    return pl_write_error(STDOUT_FILENO, rq->id, class_of(st, rq->op), msg);
}

/* Resolve the request's version, answering not-found or denied when it
 * does not resolve [KP-AWS-4].  0 resolved, 1 answered, -1 write failed. */
static int resolve(const server *s, const pl_request *rq, pl_version *v)
{
    char msg[400];
    pl_lookup l = pl_args_lookup(s->args, rq->key_id, rq->key_version, v);
    if (l == PL_FOUND) {
        return 0;
    }
    if (l == PL_NO_PRIMARY) {
        snprintf(msg, sizeof msg, "%s has no primary version: every --key line of it is decrypt-only", rq->key_id);
        return pl_write_error(STDOUT_FILENO, rq->id, PL_E_DENIED, msg) != 0 ? -1 : 1;
    }
    if (l == PL_NO_KEY) {
        snprintf(msg, sizeof msg, "no --key line names %s, and it is not a KMS key ARN", rq->key_id);
    } else {
        snprintf(msg, sizeof msg, "%s has no version %u", rq->key_id, rq->key_version);
    }
    return pl_write_error(STDOUT_FILENO, rq->id, PL_E_NOT_FOUND, msg) != 0 ? -1 : 1;
}

/* Where the readable values of an encryption context live. */
typedef struct {
    char version[11];
    char tenant[PL_NAME_MAX + 1];
    char purpose[PL_NAME_MAX + 1];
} context_text;

/* The encryption context of a request (kms.h, [KP-AWS-6]), its values
 * in t. */
static kms_context context_of(const pl_request *rq, context_text *t)
{
    snprintf(t->version, sizeof t->version, "%u", rq->key_version);
    int named = pl_aad_names(rq->aad, rq->aad_len, rq->key_id, rq->key_version, t->tenant, t->purpose);
    kms_context ctx = {rq->aad, rq->aad_len, named ? t->tenant : NULL, rq->key_id, t->version,
                       named && t->purpose[0] != '\0' ? t->purpose : NULL};
    return ctx;
}

/* wrap [KP-WRAP-1..2]: Encrypt the DEK under the resolved version's KMS
 * key. */
static int op_wrap(const server *s, const pl_request *rq, const pl_version *v)
{
    context_text t;
    char msg[400];
    uint8_t ct[KMS_MAX_CIPHERTEXT];
    size_t ct_len = 0;
    kms_error e;
    if (v->decrypt_only) {
        snprintf(msg, sizeof msg, "%s version %u is decrypt-only", rq->key_id, v->version);
        return pl_write_error(STDOUT_FILENO, rq->id, PL_E_DENIED, msg);
    }
    kms_context ctx = context_of(rq, &t);
    kms_status st = kms_encrypt(s->kms, v->kms_key, rq->dek, PL_DEK_LEN, &ctx, ct, sizeof ct, &ct_len, &e);
    if (st != KMS_OK) {
        return answer_kms_error(rq, "Encrypt", st, &e);
    }
    if (ct_len > PL_WRAPPED_MAX) {
        return pl_write_error(STDOUT_FILENO, rq->id, PL_E_INVALID,
                              "KMS Encrypt: the ciphertext is longer than 1024 bytes [KP-WRAP-2]");
    }
    return pl_write_wrapped(STDOUT_FILENO, rq->id, ct, ct_len);
}

/* unwrap [KP-UNWRAP-1..3]: Decrypt naming the version's KMS key; a
 * plaintext that is not 32 bytes was not wrapped by keyshift, so it is
 * auth-failed [KP-AWS-7]. */
static int op_unwrap(const server *s, const pl_request *rq, const pl_version *v)
{
    context_text t;
    uint8_t pt[KMS_MAX_PLAINTEXT];
    size_t pt_len = 0;
    kms_error e;
    int r;
    kms_context ctx = context_of(rq, &t);
    kms_status st = kms_decrypt(s->kms, v->kms_key, rq->wrapped, rq->wrapped_len, &ctx, pt, sizeof pt, &pt_len, &e);
    if (st != KMS_OK) {
        r = answer_kms_error(rq, "Decrypt", st, &e);
    } else if (pt_len != PL_DEK_LEN) {
        r = pl_write_error(STDOUT_FILENO, rq->id, PL_E_AUTH_FAILED,
                           "KMS Decrypt: the plaintext is not a 32-byte DEK [KP-AWS-7]");
    } else {
        r = pl_write_dek(STDOUT_FILENO, rq->id, pt);
    }
    sodium_memzero(pt, sizeof pt);
    return r;
}

/* The protocol state of a KMS KeyState [KP-AWS-5]. */
static const char *state_of(const kms_key_info *info, int decrypt_only)
{
    if (strcmp(info->key_state, "Enabled") == 0 &&
        (info->key_usage[0] == '\0' || strcmp(info->key_usage, "ENCRYPT_DECRYPT") == 0)) {
        return decrypt_only ? "decrypt-only" : "active";
    }
    if (strcmp(info->key_state, "PendingDeletion") == 0 || strcmp(info->key_state, "PendingReplicaDeletion") == 0) {
        return "destroyed";
    }
    return "disabled";
}

/* key-info [KP-INFO-1..3]: DescribeKey of the version's KMS key.  A
 * primary that is not active cannot be answered as primary [KP-INFO-3],
 * so a question for the primary (version 0) then gets denied, or revoked
 * when its KMS key is going away [KP-AWS-5]. */
static int op_key_info(const server *s, const pl_request *rq, const pl_version *v)
{
    kms_key_info info;
    kms_error e;
    char msg[400];
    kms_status st = kms_describe_key(s->kms, v->kms_key, &info, &e);
    if (st != KMS_OK) {
        return answer_kms_error(rq, "DescribeKey", st, &e);
    }
    const char *state = state_of(&info, v->decrypt_only);
    int active = strcmp(state, "active") == 0;
    if (rq->key_version == 0 && !active) {
        snprintf(msg, sizeof msg, "the primary version %u of %s is %s (KMS KeyState %s)", v->version, rq->key_id,
                 state, info.key_state);
        return pl_write_error(STDOUT_FILENO, rq->id, strcmp(state, "destroyed") == 0 ? PL_E_REVOKED : PL_E_DENIED,
                              msg);
    }
    return pl_write_key_info(STDOUT_FILENO, rq->id, v->version, state, v->primary && active);
}

/* Answer one request line; *last_id is the id of the one before, and
 * becomes this one's (when the line has no readable id, the next in
 * sequence [KP-PROC-3], [KP-AWS-3]).  0, or -1 when the write failed. */
static int handle(server *s, const char *line, size_t len, uint64_t *last_id)
{
    static pl_request rq;
    const char *why = NULL;
    int r;
    if (pl_request_parse(line, len, &rq, &why) != 0) {
        rq.id = rq.id != 0 ? rq.id : *last_id + 1;
        r = pl_write_error(STDOUT_FILENO, rq.id, PL_E_INVALID, why);
    } else if ((r = ensure_creds(s, &rq)) != 0) {
        r = r < 0 ? -1 : 0;
    } else if (rq.op == PL_OP_HELLO) {
        r = pl_write_hello(STDOUT_FILENO, rq.id, PLUGIN_NAME);
    } else {
        pl_version v;
        r = resolve(s, &rq, &v);
        if (r == 0) {
            r = rq.op == PL_OP_WRAP     ? op_wrap(s, &rq, &v)
                : rq.op == PL_OP_UNWRAP ? op_unwrap(s, &rq, &v)
                                        : op_key_info(s, &rq, &v);
        } else {
            r = r < 0 ? -1 : 0;
        }
    }
    *last_id = rq.id;
    pl_request_wipe(&rq);
    return r;
}

/* Serve requests until standard input ends [KP-PROC-3].  The exit
 * status. */
static int serve(server *s)
{
    static pl_reader rd;
    uint64_t last_id = 0;
    int rc = PL_EX_OK;
    rd.fd = STDIN_FILENO;
    for (;;) {
        const char *line;
        size_t len;
        int w = 0;
        pl_line l = pl_read_line(&rd, &line, &len);
        if (l == PL_LINE_EOF || l == PL_LINE_ERROR) {
            rc = l == PL_LINE_EOF ? PL_EX_OK : PL_EX_IOERR;
            break;
        }
        if (l == PL_LINE) {
            w = handle(s, line, len, &last_id);
        } else {
            /* no id can be read from a line that was skipped or cut off */
            last_id++;
            w = pl_write_error(STDOUT_FILENO, last_id, PL_E_INVALID,
                               l == PL_LINE_TOO_LONG ? "the request line is longer than 65536 bytes [KP-MSG-2]"
                                                     : "the request line does not end with LF [KP-MSG-1]");
        }
        if (w != 0) {
            fprintf(stderr, "keyshift-kms-aws: cannot write to standard output\n");
            rc = PL_EX_IOERR;
            break;
        }
    }
    pl_reader_wipe(&rd);
    return rc;
}

/* Load the AWS configuration (not yet the credentials: ensure_creds())
 * with the command line's overrides and open a client.  A configuration
 * that does not load is kept as s->config_error, answered to every
 * request as invalid [KP-AWS-12].  0, or -1 when no client can be
 * opened (why on stderr). */
static int open_kms(server *s, const pl_args *a)
{
    static char why[512];
    kms_overrides ov = {a->profile, a->region, a->endpoint};
    if (kms_config_load_base(&s->cfg, &ov, why, sizeof why) != KMS_OK) {
        fprintf(stderr, "keyshift-kms-aws: %s\n", why);
        s->config_error = why;
        return 0;
    }
    s->cfg.timeout_ms = a->timeout_ms;
    s->kms = kms_client_open(&s->cfg);
    if (s->kms == NULL) {
        fprintf(stderr, "keyshift-kms-aws: cannot open an AWS KMS client (out of memory or libcurl)\n");
        return -1;
    }
    return 0;
}

/* Parse the command line, then serve. */
int main(int argc, char **argv)
{
    char err[512];
    pl_args a;
    int rc;
    /* before anything allocates: jansson and libcurl wipe what they free */
    if (kms_global_init() != 0) {
        fprintf(stderr, "keyshift-kms-aws: libsodium, libcurl or jansson would not start\n");
        return PL_EX_SOFTWARE;
    }
    signal(SIGPIPE, SIG_IGN);
    pl_mode m = pl_args_parse(argc, argv, &a, err, sizeof err);
    if (m == PL_HELP || m == PL_VERSION) {
        fputs(m == PL_HELP ? pl_help_text() : PLUGIN_NAME "\n", stdout);
        rc = fflush(stdout) == 0 ? PL_EX_OK : PL_EX_IOERR;
    } else if (m == PL_USAGE) {
        fprintf(stderr, "keyshift-kms-aws: %s\nTry 'keyshift-kms-aws --help' for more information.\n", err);
        rc = PL_EX_USAGE;
    } else {
        static server s;
        s.args = &a;
        rc = open_kms(&s, &a) == 0 ? serve(&s) : PL_EX_SOFTWARE;
        kms_client_close(s.kms);
        kms_creds_wipe(&s.creds);
        kms_config_wipe(&s.cfg);
    }
    pl_args_free(&a);
    return rc;
}
