/*
 * tools/kms-aws/plugin.h -- the parts of keyshift-kms-aws, the AWS KMS
 * plugin (docs/kms-plugin.md, protocol version 1 and section "The AWS KMS
 * plugin"), shared by its three files:
 *
 *   plugin_args.c  the command line: the key-version table [KP-AWS-4]
 *                  and the overrides of the AWS configuration;
 *   plugin_msg.c   request lines in (bounded, strict, with jansson) and
 *                  response lines out; the wrap AAD's readable parts;
 *   plugin_main.c  the serving loop and the four operations.
 *
 * A request line may hold a DEK (wrap) and a response line may hold one
 * (unwrap): every buffer that held one is wiped before it is reused or
 * freed, and jansson's own buffers are wiped by the allocator that
 * kms_global_init() installs.
 */
#ifndef KS_KMS_AWS_PLUGIN_H
#define KS_KMS_AWS_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "kms.h"

#define PL_LINE_MAX 65536       /* bytes in a line, its LF included [KP-MSG-2] */
#define PL_ID_MAX 9007199254740991ull /* 2^53 - 1 [KP-MSG-4] */
#define PL_KEY_ID_MAX 256       /* [KP-REQ-2], [F-KEYID-1] */
#define PL_DEK_LEN 32           /* [KP-WRAP-1], [KP-UNWRAP-2] */
#define PL_WRAPPED_MAX 1024     /* [KP-WRAP-2], [KP-UNWRAP-1] */
#define PL_AAD_MAX 4096         /* [KP-REQ-3] */
#define PL_NAME_MAX 64          /* a tenant or purpose [F-NAME-1] */
#define PL_TIMEOUT_DEFAULT 4000 /* ms, one KMS request [KP-AWS-2] */
#define PL_TIMEOUT_MAX 600000

/* Exit statuses (sysexits). */
#define PL_EX_OK 0
#define PL_EX_USAGE 64
#define PL_EX_SOFTWARE 70
#define PL_EX_IOERR 74

/* ---- the command line (plugin_args.c) ---------------------------------- */

/* One --key line: a keyshift key version and the KMS key that holds it. */
typedef struct {
    char key_id[PL_KEY_ID_MAX + 1];
    uint32_t version;
    char kms_key[KMS_MAX_KEY_ID + 1];
    int decrypt_only;
} pl_key;

/* The parsed command line.  The strings point into argv. */
typedef struct {
    pl_key *keys;
    size_t nkeys;
    const char *region;   /* NULL: the AWS configuration's */
    const char *endpoint; /* NULL: the AWS configuration's */
    const char *profile;  /* NULL: AWS_PROFILE */
    long timeout_ms;
} pl_args;

/* What pl_args_parse() found the command line to ask for. */
typedef enum { PL_RUN = 0, PL_HELP, PL_VERSION, PL_USAGE } pl_mode;

/* Parse argv into a (why into err on PL_USAGE).  pl_args_free() after. */
pl_mode pl_args_parse(int argc, char **argv, pl_args *a, char *err, size_t errlen);

/* Free what pl_args_parse() allocated. */
void pl_args_free(pl_args *a);

/* The manual, for --help. */
const char *pl_help_text(void);

/* A resolved keyshift key version. */
typedef struct {
    const char *kms_key;
    uint32_t version;
    int decrypt_only;
    int primary; /* the key's primary version [KP-AWS-4] */
} pl_version;

/* What looking a (key_id, version) up came to. */
typedef enum { PL_FOUND = 0, PL_NO_KEY, PL_NO_VERSION, PL_NO_PRIMARY } pl_lookup;

/* Look up key_id's version (0: its primary) by the rules of [KP-AWS-4]. */
pl_lookup pl_args_lookup(const pl_args *a, const char *key_id, uint32_t version, pl_version *out);

/* ---- messages (plugin_msg.c) ------------------------------------------- */

/* The operations [KP-REQ-1]. */
typedef enum { PL_OP_HELLO = 1, PL_OP_WRAP, PL_OP_UNWRAP, PL_OP_KEY_INFO } pl_op;

/* The error classes [KP-ERR-2]. */
typedef enum {
    PL_E_UNAVAILABLE,
    PL_E_TIMEOUT,
    PL_E_THROTTLED,
    PL_E_DENIED,
    PL_E_REVOKED,
    PL_E_NOT_FOUND,
    PL_E_INTEGRITY,
    PL_E_INVALID,
    PL_E_AUTH_FAILED
} pl_class;

/* A request, decoded.  id is 0 when the line had no readable id. */
typedef struct {
    uint64_t id;
    pl_op op;
    char key_id[PL_KEY_ID_MAX + 1];
    uint32_t key_version;
    uint8_t dek[PL_DEK_LEN];
    uint8_t wrapped[PL_WRAPPED_MAX];
    size_t wrapped_len;
    uint8_t aad[PL_AAD_MAX];
    size_t aad_len;
} pl_request;

/* A reader of request lines from one descriptor. */
typedef struct {
    int fd;
    int eof;
    size_t have; /* bytes in buf */
    size_t used; /* bytes of the line last returned, dropped by the next call */
    char buf[PL_LINE_MAX];
} pl_reader;

/* What pl_read_line() found. */
typedef enum {
    PL_LINE = 0,      /* a line, its LF included */
    PL_LINE_TOO_LONG, /* a line over PL_LINE_MAX bytes, skipped to its LF */
    PL_LINE_NO_LF,    /* bytes, then the end of input */
    PL_LINE_EOF,      /* the end of input */
    PL_LINE_ERROR     /* read() failed */
} pl_line;

/* The next line of r; *line and *len are valid until the next call. */
pl_line pl_read_line(pl_reader *r, const char **line, size_t *len);

/* Wipe r's buffer. */
void pl_reader_wipe(pl_reader *r);

/* Decode one request line (its LF included) into rq.  0, or -1 with a
 * static, secret-free reason in *why (rq->id still set when readable). */
int pl_request_parse(const char *line, size_t len, pl_request *rq, const char **why);

/* Wipe rq. */
void pl_request_wipe(pl_request *rq);

/* Whether s[0..n) is 1..256 bytes of the key_id class [F-KEYID-1]. */
int pl_key_id_ok(const char *s, size_t n);

/* The readable parts of a wrap AAD (docs/format.md [F-CRYPTO-AAD-2]):
 * when aad parses strictly as one and names key_id and version, its
 * tenant and its purpose ("" in a version 1 AAD) into tenant and purpose
 * and 1; else 0 and both "". */
int pl_aad_names(const uint8_t *aad, size_t n, const char *key_id, uint32_t version,
                 char tenant[PL_NAME_MAX + 1], char purpose[PL_NAME_MAX + 1]);

/* Write one response line to fd; 0, or -1 when the write failed. */
int pl_write_hello(int fd, uint64_t id, const char *plugin);
int pl_write_wrapped(int fd, uint64_t id, const uint8_t *wrapped, size_t n);
int pl_write_dek(int fd, uint64_t id, const uint8_t dek[PL_DEK_LEN]);
int pl_write_key_info(int fd, uint64_t id, uint32_t version, const char *state, int primary);
int pl_write_error(int fd, uint64_t id, pl_class cls, const char *message);

#endif
