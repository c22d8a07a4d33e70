/*
 * tools/agent/request.h -- the strict reader of the agent's request bodies
 * (docs/agent.md section 4): a JSON body in, a validated request out.
 *
 * No server, no keys: the reader is a pure function of the body's bytes,
 * so that fuzz/fuzz_agent_request.c drives it alone.  Decoded bytes
 * (plaintexts, stored values, contexts) live in one malloc'd arena that
 * ks_agent_request_free wipes; a batch frame's records point into the
 * body itself (docs/agent.md section 4a), which the caller wipes.
 */
#ifndef KS_TOOLS_AGENT_REQUEST_H
#define KS_TOOLS_AGENT_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/keyshift.h>

/* The request kinds, one per endpoint [AG-REQ-1]. */
typedef enum ks_agent_verb {
    KS_AGENT_SEAL = 1,       /* POST /v1/seal */
    KS_AGENT_OPEN = 2,       /* POST /v1/open */
    KS_AGENT_SEAL_BATCH = 3, /* POST /v1/seal-batch */
    KS_AGENT_OPEN_BATCH = 4, /* POST /v1/open-batch */
    KS_AGENT_PARSE = 5       /* POST /v1/parse */
} ks_agent_verb;

/* Why a body was refused [AG-REQ-3]; names by ks_agent_reason_name. */
typedef enum ks_agent_reason {
    KS_AGENT_R_NONE = 0,
    KS_AGENT_R_TOO_LARGE,       /* "too-large": the body exceeds max_body */
    KS_AGENT_R_BAD_JSON,        /* "bad-json": not one JSON text (or invalid UTF-8, a NUL) */
    KS_AGENT_R_DUPLICATE,       /* "duplicate-member": an object names a member twice */
    KS_AGENT_R_NOT_OBJECT,      /* "not-object": the body or a record is not an object */
    KS_AGENT_R_UNKNOWN,         /* "unknown-member": a member the request does not define */
    KS_AGENT_R_MISSING,         /* "missing-member": a required member is absent */
    KS_AGENT_R_BAD_TYPE,        /* "bad-type": a member of another JSON type */
    KS_AGENT_R_BAD_BASE64,      /* "bad-base64": not canonical base64 */
    KS_AGENT_R_BAD_VALUE,       /* "bad-value": outside the member's rule */
    KS_AGENT_R_TOO_MANY,        /* "too-many-records": a batch above max_batch, or empty */
    KS_AGENT_R_BAD_FRAME,       /* "bad-frame": a batch frame's framing is broken [AG-BIN-3] */
    KS_AGENT_R_COUNT
} ks_agent_reason;

/* The name of a reason ("bad-json", ...), or NULL for another value. */
const char *ks_agent_reason_name(int reason);

/* The reader's bounds. */
typedef struct ks_agent_limits {
    size_t max_body;   /* bytes of a body */
    size_t max_batch;  /* records of a batch, >= 1 */
} ks_agent_limits;

/* One record of a request: its scope (split into table and column), tenant,
 * purpose and context, and its input (a plaintext to seal, a stored value to
 * open or parse).  Every view points into the request's arena. */
typedef struct ks_agent_record {
    const char *scope;   /* "TABLE.COLUMN", NUL-terminated */
    const char *table;   /* NUL-terminated */
    const char *column;  /* NUL-terminated */
    ks_bytes tenant;     /* [F-NAME-1]; empty only where [AG-REQ-7] allows */
    ks_bytes purpose;    /* [F-NAME-1] or empty */
    ks_bytes context;    /* decoded, 0..KS_CONTEXT_MAX bytes */
    ks_bytes data;       /* decoded input */
} ks_agent_record;

/* A validated request. */
typedef struct ks_agent_request {
    ks_agent_verb verb;
    size_t n;                 /* records, 1 for the single forms */
    ks_agent_record *records; /* malloc'd */
    uint8_t *arena;           /* malloc'd; wiped on free */
    size_t arena_cap;
} ks_agent_request;

/* Where a refusal was found: its reason, the member (a static name, or
 * NULL), the record's index in a batch (-1 for none) and, for bad-frame,
 * the byte of the body where the framing broke (-1 for none). */
typedef struct ks_agent_req_error {
    ks_agent_reason reason;
    const char *member;
    long index;
    long offset;
} ks_agent_req_error;

/*
 * Read body[0, len) as a request of kind verb under lim into *out.
 * Returns KS_OK; KS_ERR_BAD_VALUE with *err filled for a refused body
 * (nothing is kept: *out is empty); KS_ERR_NO_MEMORY; KS_ERR_INVALID_ARGUMENT
 * for a bad call.  Linear in len.  The body may hold plaintext: jansson's
 * copies of every string are wiped before they are freed.
 */
KS_WUR ks_err ks_agent_request_read(ks_agent_verb verb, const uint8_t *body, size_t len,
                                    const ks_agent_limits *lim, ks_agent_request *out,
                                    ks_agent_req_error *err);

/* The media type of the batch frame [AG-BIN-1], and its magics. */
#define KS_AGENT_FRAME_TYPE "application/vnd.keyshift.batch"
#define KS_AGENT_FRAME_REQ_MAGIC "KSB1"
#define KS_AGENT_FRAME_RESP_MAGIC "KSR1"

/*
 * Read body[0, len) in the batch frame [AG-BIN-2..3] as a request of kind
 * verb (KS_AGENT_SEAL_BATCH or KS_AGENT_OPEN_BATCH) under lim into *out,
 * as ks_agent_request_read does; the records' tenant, purpose, context
 * and data point into body, which must outlive *out (only the scopes are
 * copied, into the arena).  Nothing is allocated until the whole frame
 * has been read and found valid.  Linear in len.
 */
KS_WUR ks_err ks_agent_request_read_frame(ks_agent_verb verb, const uint8_t *body, size_t len,
                                          const ks_agent_limits *lim, ks_agent_request *out,
                                          ks_agent_req_error *err);

/* Wipe and free what ks_agent_request_read kept; an empty *r is a no-op. */
void ks_agent_request_free(ks_agent_request *r);

#endif /* KS_TOOLS_AGENT_REQUEST_H */
