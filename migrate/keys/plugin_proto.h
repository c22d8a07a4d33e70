/*
 * migrate/keys/plugin_proto.h -- the KMS plugin protocol, version 1
 * (docs/kms-plugin.md): the encoder of keyshift's request lines and the
 * strict reader of a plugin's response lines.
 *
 * Internal header.  Its functions have hidden visibility (none carries
 * KS_API): they are shared by the plugin provider (a later step), the unit
 * tests and fuzz/fuzz_plugin_resp.c without being part of the ABI.
 *
 * No process, pipe or deadline is handled here: this part knows lines
 * and rules only.  A response line is untrusted input; a request line may
 * hold a DEK, and the caller wipes it once written.
 */
#ifndef KS_MIGRATE_PLUGIN_PROTO_H
#define KS_MIGRATE_PLUGIN_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>

/* The limits of [KP-MSG-2], [KP-MSG-4], [KP-WRAP-2], [KP-ERR-4], [KP-HELLO-3]. */
#define KS_KP_LINE_MAX 65536u           /* bytes in a line, its LF included */
#define KS_KP_ID_MAX 9007199254740991ull /* 2^53 - 1 */
#define KS_KP_WRAPPED_MAX 1024u         /* bytes of a wrapped DEK */
#define KS_KP_AAD_MAX 4096u             /* bytes of a wrap AAD */
#define KS_KP_MESSAGE_MAX 1024u         /* bytes of an error message */
#define KS_KP_MESSAGE_KEPT 256u         /* of which keyshift keeps at most this many */
#define KS_KP_PLUGIN_MAX 128u           /* bytes of the hello "plugin" string */
#define KS_KP_RETRY_MAX 3600000u        /* retry_after_ms */
#define KS_KP_CAPS_MAX 16u              /* entries of "capabilities" */
#define KS_KP_VERSION 1u                /* the protocol version this code speaks */

/* The operations [KP-OP-1]. */
typedef enum ks_kp_op {
    KS_KP_HELLO = 1,
    KS_KP_WRAP = 2,
    KS_KP_UNWRAP = 3,
    KS_KP_KEY_INFO = 4
} ks_kp_op;

/* Capability bits of a hello response [KP-HELLO-4]. */
#define KS_KP_CAP_WRAP 1u
#define KS_KP_CAP_UNWRAP 2u
#define KS_KP_CAP_KEY_INFO 4u
#define KS_KP_CAP_REWRAP 8u

/* The error classes of [KP-ERR-2], in the order of that table. */
typedef enum ks_kp_class {
    KS_KP_CLASS_NONE = 0,
    KS_KP_UNAVAILABLE,
    KS_KP_TIMEOUT,
    KS_KP_THROTTLED,
    KS_KP_DENIED,
    KS_KP_REVOKED,
    KS_KP_NOT_FOUND,
    KS_KP_INTEGRITY,
    KS_KP_INVALID,
    KS_KP_AUTH_FAILED,
    KS_KP_CLASS_COUNT
} ks_kp_class;

/* Why a response line was refused [KP-RESP]: one reason per check, in
 * the order of [KP-RESP-1]. */
typedef enum ks_kp_reason {
    KS_KP_R_NONE = 0,
    KS_KP_R_TOO_LONG,       /* "line-too-long": over KS_KP_LINE_MAX bytes */
    KS_KP_R_UNTERMINATED,   /* "unterminated": does not end with LF */
    KS_KP_R_EMBEDDED_LF,    /* "embedded-lf": an LF before the last byte */
    KS_KP_R_BAD_TEXT,       /* "bad-text": not UTF-8, or a NUL */
    KS_KP_R_DUPLICATE_KEY,  /* "duplicate-key": a member name twice */
    KS_KP_R_BAD_JSON,       /* "bad-json": not one JSON text (or a number jansson cannot hold) */
    KS_KP_R_NOT_OBJECT,     /* "not-object": the text is not an object */
    KS_KP_R_UNKNOWN_FIELD,  /* "unknown-field": a member the op does not define */
    KS_KP_R_MISSING_FIELD,  /* "missing-field": a required member is absent */
    KS_KP_R_BAD_TYPE,       /* "bad-type": a member of the wrong JSON type */
    KS_KP_R_BAD_VERSION,    /* "bad-version": v is not 1 */
    KS_KP_R_ID_MISMATCH,    /* "id-mismatch": id is not the request's */
    KS_KP_R_BAD_CLASS,      /* "bad-class": an error class unknown or not allowed for the op */
    KS_KP_R_BAD_VALUE,      /* "bad-value": a value outside its rule */
    KS_KP_R_BAD_BASE64,     /* "bad-base64": not canonical standard base64 */
    KS_KP_R_BAD_LENGTH,     /* "bad-length": decoded bytes outside the op's bounds */
    KS_KP_R_INCONSISTENT,   /* "inconsistent": members that contradict each other or the request */
    KS_KP_R_COUNT
} ks_kp_reason;

/* A refusal: the reason and the member it concerns (a static name of
 * the protocol such as "dek", or NULL).  Never any byte of the line. */
typedef struct ks_kp_error {
    ks_kp_reason reason;
    const char *field;
} ks_kp_error;

/* One request to encode.  Which members are used depends on op:
 *   hello:    id (must be 1)
 *   wrap:     key_id, key_version >= 1, dek (KS_DEK_LEN bytes), aad
 *   unwrap:   key_id, key_version >= 1, wrapped, aad
 *   key-info: key_id, key_version (0 = the primary) */
typedef struct ks_kp_request {
    ks_kp_op op;
    uint64_t id;
    ks_bytes key_id;
    uint32_t key_version;
    const uint8_t *dek;
    size_t dek_len;
    ks_bytes wrapped;
    ks_bytes aad;
} ks_kp_request;

/* What a response must answer: the request's op, id and (key-info) the
 * key_version asked for. */
typedef struct ks_kp_request_ctx {
    ks_kp_op op;
    uint64_t id;
    uint32_t key_version;
} ks_kp_request_ctx;

/*
 * A parsed response.  The caller sets the buffers before the call; the
 * reader fills the rest.  On any refusal every filled member is zero and
 * both buffers are wiped.
 */
typedef struct ks_kp_response {
    /* set by the caller */
    uint8_t *dek;            /* unwrap: KS_DEK_LEN bytes */
    uint8_t *wrapped;        /* wrap: wrapped_cap >= KS_KP_WRAPPED_MAX bytes */
    size_t wrapped_cap;
    /* filled by ks_kp_parse_response() */
    int ok;                  /* 1: "ok":true; 0: an error response */
    ks_err status;           /* KS_OK, or the ks_err of the class [KP-ERR-3] */
    ks_kp_class error_class; /* KS_KP_CLASS_NONE when ok */
    int has_retry_after;
    uint32_t retry_after_ms;
    char message[KS_KP_MESSAGE_KEPT + 1]; /* printable ASCII, others as '?' */
    size_t wrapped_len;      /* wrap */
    uint32_t version;        /* hello: the protocol version chosen */
    char plugin[KS_KP_PLUGIN_MAX + 1];    /* hello */
    uint32_t capabilities;   /* hello: KS_KP_CAP_* bits */
    ks_key_info info;        /* key-info */
} ks_kp_response;

/*
 * Encode req as one request line, its LF included, into out[0, cap); the
 * length goes to *out_len.  KS_ERR_INVALID_ARGUMENT for NULL pointers or a
 * request outside [KP-REQ] (bad id, key_id outside [F-KEYID-1], a DEK not
 * KS_DEK_LEN bytes, an empty or oversized AAD or wrapped blob);
 * KS_ERR_BUFFER_TOO_SMALL when cap is short.  On any failure out[0, cap)
 * is wiped.  Never allocates; the DEK is written only into out.
 */
ks_err ks_kp_encode_request(const ks_kp_request *req, uint8_t *out, size_t cap, size_t *out_len);

/*
 * Read the response line line[0, len) (its LF included) to the request
 * expect describes, strictly (docs/kms-plugin.md [KP-RESP]).  KS_OK when the
 * line is a well-formed response, whether "ok" is true (out->status
 * KS_OK) or false (out->status the class's ks_err).  KS_ERR_INTEGRITY when
 * the line is refused, with *err (when not NULL) saying why; every filled
 * member of *out is then zero and out->dek, out->wrapped are wiped.
 * KS_ERR_INVALID_ARGUMENT for NULL pointers or missing buffers.
 */
ks_err ks_kp_parse_response(const uint8_t *line, size_t len, const ks_kp_request_ctx *expect,
                            ks_kp_response *out, ks_kp_error *err);

/* The text of a reason ("bad-base64", ...), or NULL. */
const char *ks_kp_reason_name(int reason);

/* The text of an error class ("throttled", ...), or NULL. */
const char *ks_kp_class_name(int cls);

/* The text of an op ("key-info", ...), or NULL. */
const char *ks_kp_op_name(int op);

#endif /* KS_MIGRATE_PLUGIN_PROTO_H */
