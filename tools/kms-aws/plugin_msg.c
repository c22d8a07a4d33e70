/*
 * tools/kms-aws/plugin_msg.c -- the lines keyshift-kms-aws reads and
 * writes (docs/kms-plugin.md sections 3 to 6): request lines read with a
 * bound of PL_LINE_MAX bytes and decoded strictly with jansson, response
 * lines encoded with jansson, and the readable parts of a wrap AAD for
 * the encryption context.
 */
#define _POSIX_C_SOURCE 200809L
#include "plugin.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <string.h>
#include <unistd.h>

#define B64_LEN(n) sodium_base64_ENCODED_LEN((n), sodium_base64_VARIANT_ORIGINAL)

/* ---- reading lines --------------------------------------------------- */

/* Drop the first n bytes of r's buffer, wiping the room they leave. */
static void drop(pl_reader *r, size_t n)
{
    memmove(r->buf, r->buf + n, r->have - n);
    sodium_memzero(r->buf + r->have - n, n);
    r->have -= n;
}

/* read() into r's free room, retrying on EINTR: the bytes read (0 at the
 * end of input), or -1. */
static ssize_t fill(pl_reader *r)
{
    for (;;) {
        ssize_t n = read(r->fd, r->buf + r->have, sizeof r->buf - r->have);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n > 0) {
            r->have += (size_t)n;
        } else if (n == 0) {
            r->eof = 1;
        }
        return n;
    }
}

/* The buffer is full and holds no LF: skip the rest of that line, up to
 * and including its LF (or the end of input) [KP-MSG-2]. */
static pl_line skip_long(pl_reader *r)
{
    for (;;) {
        char *nl = memchr(r->buf, '\n', r->have);
        if (nl != NULL) {
            drop(r, (size_t)(nl - r->buf) + 1);
            return PL_LINE_TOO_LONG;
        }
        drop(r, r->have);
        if (r->eof) {
            return PL_LINE_TOO_LONG;
        }
        if (fill(r) < 0) {
            return PL_LINE_ERROR;
        }
    }
}

/* The next line (plugin.h). */
pl_line pl_read_line(pl_reader *r, const char **line, size_t *len)
{
    size_t scan = 0;
    drop(r, r->used);
    r->used = 0;
    *line = r->buf;
    *len = 0;
    for (;;) {
        char *nl = memchr(r->buf + scan, '\n', r->have - scan);
        if (nl != NULL) {
            *len = r->used = (size_t)(nl - r->buf) + 1;
            return PL_LINE;
        }
        scan = r->have;
        if (r->have == sizeof r->buf) {
            return skip_long(r);
        }
        if (r->eof) {
            *len = r->used = r->have;
            return r->have == 0 ? PL_LINE_EOF : PL_LINE_NO_LF;
        }
        if (fill(r) < 0) {
            return PL_LINE_ERROR;
        }
    }
}

/* Wipe r (plugin.h). */
void pl_reader_wipe(pl_reader *r)
{
    sodium_memzero(r->buf, sizeof r->buf);
    r->have = r->used = 0;
}

/* ---- decoding a request ---------------------------------------------- */

static const char *const OP_NAMES[] = {NULL, "hello", "wrap", "unwrap", "key-info"};

/* The members each op's request may hold beyond v, id and op [KP-REQ-1],
 * [KP-HELLO-1], [KP-WRAP-1], [KP-UNWRAP-1], [KP-INFO-1]. */
static const char *const OP_MEMBERS[][4] = {
    {NULL},
    {"versions", "client", NULL},
    {"key_id", "key_version", "dek", "aad"},
    {"key_id", "key_version", "wrapped", "aad"},
    {"key_id", "key_version", NULL},
};

/* Whether name is a member a request of op may hold: v, id, op, the
 * op's own, or a vendor extension beginning with "x-" ([KP-AWS-3]). */
static int member_known(pl_op op, const char *name)
{
    if (strcmp(name, "v") == 0 || strcmp(name, "id") == 0 || strcmp(name, "op") == 0 ||
        strncmp(name, "x-", 2) == 0) {
        return 1;
    }
    for (size_t i = 0; i < 4 && OP_MEMBERS[op][i] != NULL; i++) {
        if (strcmp(name, OP_MEMBERS[op][i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* o[name] as an integer in [lo, hi] into *out.  0 or -1. */
static int get_int(const json_t *o, const char *name, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const json_t *v = json_object_get(o, name);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return -1;
    }
    uint64_t x = (uint64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        return -1;
    }
    *out = x;
    return 0;
}

/* Decode o[name], canonical base64 [KP-B64-1] of lo..hi bytes, into out
 * (hi bytes).  0, or -1 with out wiped. */
static int get_b64(const json_t *o, const char *name, size_t lo, size_t hi, uint8_t *out, size_t *out_len)
{
    const json_t *v = json_object_get(o, name);
    *out_len = 0;
    if (!json_is_string(v) ||
        kms_base64_decode(json_string_value(v), json_string_length(v), out, hi, out_len) != 0) {
        return -1;
    }
    if (*out_len < lo) {
        sodium_memzero(out, hi);
        *out_len = 0;
        return -1;
    }
    return 0;
}

/* Whether c is in the key_id class [F-KEYID-1]. */
static int key_id_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("._:-/@+=", c) != NULL;
}

/* Whether c is in the tenant and purpose class [F-NAME-1]. */
static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._:-", c) != NULL;
}

/* Whether s[0..n) is 1..max bytes of class ok. */
static int in_class(const char *s, size_t n, size_t max, int (*ok)(unsigned char))
{
    if (n == 0 || n > max) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\0' || !ok((unsigned char)s[i])) {
            return 0;
        }
    }
    return 1;
}

/* Whether s[0..n) is a key_id (plugin.h). */
int pl_key_id_ok(const char *s, size_t n)
{
    return in_class(s, n, PL_KEY_ID_MAX, key_id_char);
}

/* key_id and key_version (from lo) of a wrap, unwrap or key-info request
 * [KP-REQ-2].  0, or -1 with why. */
static int get_key(const json_t *o, pl_request *rq, uint64_t lo, const char **why)
{
    const json_t *k = json_object_get(o, "key_id");
    uint64_t ver;
    if (!json_is_string(k) || !pl_key_id_ok(json_string_value(k), json_string_length(k))) {
        *why = "key_id is not 1 to 256 bytes of [A-Za-z0-9._:/@+=-] [KP-REQ-2]";
        return -1;
    }
    memcpy(rq->key_id, json_string_value(k), json_string_length(k) + 1);
    if (get_int(o, "key_version", lo, UINT32_MAX, &ver) != 0) {
        *why = lo == 0 ? "key_version is not an integer from 0 to 2^32-1 [KP-REQ-2]"
                       : "key_version is not an integer from 1 to 2^32-1 [KP-WRAP-1]";
        return -1;
    }
    rq->key_version = (uint32_t)ver;
    return 0;
}

/* The members of a hello request [KP-HELLO-1]: versions must list 1
 * (integers only), client must be a string.  0, or -1 with why. */
static int get_hello(const json_t *o, const char **why)
{
    const json_t *vs = json_object_get(o, "versions"), *e;
    size_t i;
    int has1 = 0;
    if (!json_is_array(vs) || json_array_size(vs) == 0 || json_array_size(vs) > 16) {
        *why = "versions is not an array of 1 to 16 integers [KP-HELLO-1]";
        return -1;
    }
    json_array_foreach(vs, i, e)
    {
        if (!json_is_integer(e)) {
            *why = "versions is not an array of 1 to 16 integers [KP-HELLO-1]";
            return -1;
        }
        has1 |= json_integer_value(e) == 1;
    }
    if (!json_is_string(json_object_get(o, "client"))) {
        *why = "client is not a string [KP-HELLO-1]";
        return -1;
    }
    if (!has1) {
        *why = "no common protocol version: this plugin speaks version 1 [KP-HELLO-2]";
        return -1;
    }
    return 0;
}

/* The op's own members into rq [KP-REQ-2..3].  0, or -1 with why. */
static int get_op_members(const json_t *o, pl_request *rq, const char **why)
{
    size_t n;
    switch (rq->op) {
    case PL_OP_HELLO:
        return get_hello(o, why);
    case PL_OP_KEY_INFO:
        return get_key(o, rq, 0, why);
    case PL_OP_WRAP:
        if (get_key(o, rq, 1, why) != 0) {
            return -1;
        }
        if (get_b64(o, "dek", PL_DEK_LEN, PL_DEK_LEN, rq->dek, &n) != 0) {
            *why = "dek is not the canonical base64 of 32 bytes [KP-WRAP-1]";
            return -1;
        }
        break;
    case PL_OP_UNWRAP:
        if (get_key(o, rq, 1, why) != 0) {
            return -1;
        }
        if (get_b64(o, "wrapped", 1, PL_WRAPPED_MAX, rq->wrapped, &rq->wrapped_len) != 0) {
            *why = "wrapped is not the canonical base64 of 1 to 1024 bytes [KP-UNWRAP-1]";
            return -1;
        }
        break;
    }
    if (get_b64(o, "aad", 1, PL_AAD_MAX, rq->aad, &rq->aad_len) != 0) {
        *why = "aad is not the canonical base64 of 1 to 4096 bytes [KP-REQ-3]";
        return -1;
    }
    return 0;
}

/* Check a decoded request object and fill rq.  0, or -1 with why. */
static int check_request(json_t *o, pl_request *rq, const char **why)
{
    uint64_t v;
    const char *name;
    json_t *val;
    if (!json_is_object(o)) {
        *why = "the request is not one JSON object [KP-MSG-1]";
        return -1;
    }
    if (get_int(o, "id", 1, PL_ID_MAX, &rq->id) != 0) {
        rq->id = 0;
        *why = "id is not an integer from 1 to 2^53-1 [KP-MSG-4]";
        return -1;
    }
    if (get_int(o, "v", 1, 1, &v) != 0) {
        *why = "v is not the integer 1 [KP-MSG-5]";
        return -1;
    }
    const json_t *op = json_object_get(o, "op");
    for (int i = PL_OP_HELLO; i <= PL_OP_KEY_INFO && json_is_string(op); i++) {
        if (strcmp(json_string_value(op), OP_NAMES[i]) == 0) {
            rq->op = (pl_op)i;
        }
    }
    if (rq->op == 0) {
        *why = "op is not hello, wrap, unwrap or key-info [KP-REQ-1]";
        return -1;
    }
    json_object_foreach(o, name, val)
    {
        if (!member_known(rq->op, name)) {
            *why = "the request has a member its op does not define [KP-AWS-3]";
            return -1;
        }
    }
    return get_op_members(o, rq, why);
}

/* Decode a request line (plugin.h). */
int pl_request_parse(const char *line, size_t len, pl_request *rq, const char **why)
{
    json_error_t je;
    sodium_memzero(rq, sizeof *rq);
    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\0', len) != NULL) {
        *why = "the request is not a line of text [KP-MSG-1]";
        return -1;
    }
    /* JSON_REJECT_DUPLICATES: [KP-MSG-3]; jansson refuses invalid UTF-8,
     * \u0000 and trailing text. */
    json_t *o = json_loadb(line, len - 1, JSON_REJECT_DUPLICATES, &je);
    if (o == NULL) {
        *why = "the request is not one JSON text without duplicate members [KP-MSG-1], [KP-MSG-3]";
        return -1;
    }
    int r = check_request(o, rq, why);
    json_decref(o); /* the allocator wipes the dek's text */
    if (r != 0) {
        uint64_t id = rq->id;
        pl_request_wipe(rq);
        rq->id = id;
    }
    return r;
}

/* Wipe rq (plugin.h). */
void pl_request_wipe(pl_request *rq)
{
    sodium_memzero(rq, sizeof *rq);
}

/* ---- the wrap AAD's readable parts ------------------------------------ */

/* Read a u32be at aad[*off] into *v.  0, or -1 past the end. */
static int take_u32(const uint8_t *aad, size_t n, size_t *off, uint32_t *v)
{
    if (n - *off < 4) {
        return -1;
    }
    const uint8_t *p = aad + *off;
    *v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    *off += 4;
    return 0;
}

/* Read lp(x) at aad[*off], x 1..max bytes of class ok, into dst (max + 1
 * bytes, NUL-terminated).  0 or -1. */
static int take_lp(const uint8_t *aad, size_t n, size_t *off, size_t max, int (*ok)(unsigned char), char *dst)
{
    uint32_t len;
    if (take_u32(aad, n, off, &len) != 0 || len > n - *off || !in_class((const char *)aad + *off, len, max, ok)) {
        return -1;
    }
    memcpy(dst, aad + *off, len);
    dst[len] = '\0';
    *off += len;
    return 0;
}

/* The readable parts of a wrap AAD (plugin.h). */
int pl_aad_names(const uint8_t *aad, size_t n, const char *key_id, uint32_t version,
                 char tenant[PL_NAME_MAX + 1], char purpose[PL_NAME_MAX + 1])
{
    char kid[PL_KEY_ID_MAX + 1];
    uint32_t alg, ver;
    size_t off = 4;
    tenant[0] = purpose[0] = '\0';
    if (n < 4 || memcmp(aad, "KSW", 3) != 0 || (aad[3] != 1 && aad[3] != 2) ||
        take_u32(aad, n, &off, &alg) != 0 || (alg != 1 && alg != 2) ||
        take_lp(aad, n, &off, PL_NAME_MAX, name_char, tenant) != 0 ||
        take_lp(aad, n, &off, PL_KEY_ID_MAX, key_id_char, kid) != 0 || take_u32(aad, n, &off, &ver) != 0 ||
        ver == 0 || (aad[3] == 2 && take_lp(aad, n, &off, PL_NAME_MAX, name_char, purpose) != 0) || off != n ||
        strcmp(kid, key_id) != 0 || ver != version) {
        tenant[0] = purpose[0] = '\0';
        return 0;
    }
    return 1;
}

/* ---- writing responses ------------------------------------------------ */

static const char *const CLASS_NAMES[] = {"unavailable", "timeout",  "throttled", "denied",     "revoked",
                                          "not-found",   "integrity", "invalid",  "auth-failed"};

/* Write all of buf to fd.  0 or -1. */
static int write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Encode o (stolen) as one line through a buffer wiped after the write:
 * o may hold a DEK's base64.  0 or -1. */
static int emit(int fd, json_t *o)
{
    static char line[PL_LINE_MAX];
    int r = -1;
    size_t n = o != NULL ? json_dumpb(o, line, sizeof line - 1, JSON_COMPACT) : 0;
    if (n > 0 && n < sizeof line - 1) {
        line[n++] = '\n';
        r = write_all(fd, line, n);
    }
    sodium_memzero(line, sizeof line);
    json_decref(o);
    return r;
}

/* {"v":1,"id":id,"ok":ok}, or NULL. */
static json_t *head(uint64_t id, int ok)
{
    return json_pack("{s:i,s:I,s:b}", "v", 1, "id", (json_int_t)id, "ok", ok);
}

/* head(id, 1) with member name set to the base64 of in[0..n), or NULL;
 * the text goes through a wiped buffer. */
static json_t *with_b64(uint64_t id, const char *name, const uint8_t *in, size_t n)
{
    char b64[B64_LEN(PL_WRAPPED_MAX)];
    json_t *o = head(id, 1);
    if (n > PL_WRAPPED_MAX) {
        json_decref(o);
        return NULL;
    }
    sodium_bin2base64(b64, sizeof b64, in, n, sodium_base64_VARIANT_ORIGINAL);
    if (o != NULL && json_object_set_new(o, name, json_string(b64)) != 0) {
        json_decref(o);
        o = NULL;
    }
    sodium_memzero(b64, sizeof b64);
    return o;
}

/* [KP-HELLO-2] */
int pl_write_hello(int fd, uint64_t id, const char *plugin)
{
    return emit(fd, json_pack("{s:i,s:I,s:b,s:i,s:s,s:[sss]}", "v", 1, "id", (json_int_t)id, "ok", 1, "version", 1,
                              "plugin", plugin, "capabilities", "wrap", "unwrap", "key-info"));
}

/* [KP-WRAP-2] */
int pl_write_wrapped(int fd, uint64_t id, const uint8_t *wrapped, size_t n)
{
    return emit(fd, with_b64(id, "wrapped", wrapped, n));
}

/* [KP-UNWRAP-2] */
int pl_write_dek(int fd, uint64_t id, const uint8_t dek[PL_DEK_LEN])
{
    return emit(fd, with_b64(id, "dek", dek, PL_DEK_LEN));
}

/* [KP-INFO-2] */
int pl_write_key_info(int fd, uint64_t id, uint32_t version, const char *state, int primary)
{
    return emit(fd, json_pack("{s:i,s:I,s:b,s:I,s:s,s:b}", "v", 1, "id", (json_int_t)id, "ok", 1, "version",
                              (json_int_t)version, "state", state, "primary", primary));
}

/* [KP-ERR-1..4]: the message cut to 1024 bytes (it is printable ASCII
 * from this program, never key material). */
int pl_write_error(int fd, uint64_t id, pl_class cls, const char *message)
{
    json_t *o = head(id, 0);
    if (o == NULL || json_object_set_new(o, "error", json_string(CLASS_NAMES[cls])) != 0 ||
        (message != NULL && message[0] != '\0' &&
         json_object_set_new(o, "message", json_stringn(message, strnlen(message, 1024))) != 0)) {
        json_decref(o);
        return -1;
    }
    return emit(fd, o);
}
