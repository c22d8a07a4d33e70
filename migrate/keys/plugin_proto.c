/*
 * migrate/keys/plugin_proto.c -- the KMS plugin protocol, version 1
 * (docs/kms-plugin.md): request lines out, response lines in.
 *
 * A response line comes from a helper process keyshift does not trust
 * beyond the key operations it asks of it.  The reader checks the framing
 * itself, lets jansson (JSON_REJECT_DUPLICATES) build the object, then
 * checks every member against the op's table: exact JSON types, unknown
 * members refused except "x-" vendor members, canonical standard base64,
 * bounded lengths, the request's id.  It stops at the first fault, in the
 * order of [KP-RESP-1], and names a reason and a member of the protocol,
 * never a byte of the line (a line may hold a DEK).  The decoded DEK goes
 * only to the caller's buffer; on a refusal it is wiped, and so is the
 * copy of its base64 text inside jansson's object.
 *
 * The encoder writes a request line straight into the caller's buffer,
 * with no allocation, so the DEK's base64 exists only there.
 */
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include <keyshift/envelope.h>

#include "plugin_proto.h"

#include "../../format/rules.h"

/* ---- names ------------------------------------------------------------------------------ */

static const char *const reason_names[KS_KP_R_COUNT] = {
    [KS_KP_R_NONE] = "none",
    [KS_KP_R_TOO_LONG] = "line-too-long",
    [KS_KP_R_UNTERMINATED] = "unterminated",
    [KS_KP_R_EMBEDDED_LF] = "embedded-lf",
    [KS_KP_R_BAD_TEXT] = "bad-text",
    [KS_KP_R_DUPLICATE_KEY] = "duplicate-key",
    [KS_KP_R_BAD_JSON] = "bad-json",
    [KS_KP_R_NOT_OBJECT] = "not-object",
    [KS_KP_R_UNKNOWN_FIELD] = "unknown-field",
    [KS_KP_R_MISSING_FIELD] = "missing-field",
    [KS_KP_R_BAD_TYPE] = "bad-type",
    [KS_KP_R_BAD_VERSION] = "bad-version",
    [KS_KP_R_ID_MISMATCH] = "id-mismatch",
    [KS_KP_R_BAD_CLASS] = "bad-class",
    [KS_KP_R_BAD_VALUE] = "bad-value",
    [KS_KP_R_BAD_BASE64] = "bad-base64",
    [KS_KP_R_BAD_LENGTH] = "bad-length",
    [KS_KP_R_INCONSISTENT] = "inconsistent",
};

/* The classes of [KP-ERR-2] and the ks_err of each [KP-ERR-3]. */
static const struct {
    const char *name;
    ks_err code;
} classes[KS_KP_CLASS_COUNT] = {
    [KS_KP_CLASS_NONE] = {NULL, KS_OK},
    [KS_KP_UNAVAILABLE] = {"unavailable", KS_ERR_UNAVAILABLE},
    [KS_KP_TIMEOUT] = {"timeout", KS_ERR_TIMEOUT},
    [KS_KP_THROTTLED] = {"throttled", KS_ERR_UNAVAILABLE},
    [KS_KP_DENIED] = {"denied", KS_ERR_DENIED},
    [KS_KP_REVOKED] = {"revoked", KS_ERR_REVOKED},
    [KS_KP_NOT_FOUND] = {"not-found", KS_ERR_NOT_FOUND},
    [KS_KP_INTEGRITY] = {"integrity", KS_ERR_INTEGRITY},
    [KS_KP_INVALID] = {"invalid", KS_ERR_INVALID_ARGUMENT},
    [KS_KP_AUTH_FAILED] = {"auth-failed", KS_ERR_AUTH_FAILED},
};

static const char *const op_names[] = {
    [KS_KP_HELLO] = "hello",
    [KS_KP_WRAP] = "wrap",
    [KS_KP_UNWRAP] = "unwrap",
    [KS_KP_KEY_INFO] = "key-info",
};

/* See plugin_proto.h. */
const char *ks_kp_reason_name(int reason)
{
    return reason >= 0 && reason < KS_KP_R_COUNT ? reason_names[reason] : NULL;
}

/* See plugin_proto.h. */
const char *ks_kp_class_name(int cls)
{
    return cls > KS_KP_CLASS_NONE && cls < KS_KP_CLASS_COUNT ? classes[cls].name : NULL;
}

/* See plugin_proto.h. */
const char *ks_kp_op_name(int op)
{
    return op >= KS_KP_HELLO && op <= KS_KP_KEY_INFO ? op_names[op] : NULL;
}

/* ---- the request encoder [KP-REQ] ---------------------------------------------------- */

/* A bounded writer into the caller's buffer. */
typedef struct writer {
    uint8_t *p;
    size_t cap;
    size_t len;
    int over;   /* nonzero once something did not fit */
} writer;

/* Append the text s. */
static void put_str(writer *w, const char *s)
{
    const size_t n = strlen(s);
    if (w->over || n > w->cap - w->len) {
        w->over = 1;
        return;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
}

/* Append the bytes b (already known to need no JSON escape). */
static void put_bytes(writer *w, ks_bytes b)
{
    if (w->over || b.len > w->cap - w->len) {
        w->over = 1;
        return;
    }
    if (b.len > 0) {
        memcpy(w->p + w->len, b.ptr, b.len);
    }
    w->len += b.len;
}

/* Append v in decimal. */
static void put_u64(writer *w, uint64_t v)
{
    char digits[21];
    size_t i = sizeof digits - 1;
    digits[i] = '\0';
    do {
        digits[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    put_str(w, digits + i);
}

/* Append the standard base64 (with padding) of b[0, n), written in place. */
static void put_b64(writer *w, const uint8_t *b, size_t n)
{
    const size_t need = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL); /* with NUL */
    if (w->over || need > w->cap - w->len) {
        w->over = 1;
        return;
    }
    sodium_bin2base64((char *)(w->p + w->len), need, b, n, sodium_base64_VARIANT_ORIGINAL);
    w->len += need - 1;
}

/* Nonzero when key_id is 1..KS_KEY_ID_MAX bytes of [F-KEYID-1]: bytes
 * that need no JSON escape. */
static int key_id_ok(ks_bytes key_id)
{
    return key_id.ptr != NULL && key_id.len >= 1 && key_id.len <= KS_KEY_ID_MAX &&
           ks_rules_charset_scan(KS_RULE_KEY_ID, key_id.ptr, key_id.len) == key_id.len;
}

/* Nonzero when b is 1..max bytes. */
static int blob_ok(ks_bytes b, size_t max)
{
    return b.ptr != NULL && b.len >= 1 && b.len <= max;
}

/* Nonzero when req is a request [KP-REQ-1..6] allows. */
static int request_ok(const ks_kp_request *req)
{
    if (req->id < 1 || req->id > KS_KP_ID_MAX) {
        return 0;
    }
    switch (req->op) {
    case KS_KP_HELLO: return req->id == 1;
    case KS_KP_WRAP:
        return key_id_ok(req->key_id) && req->key_version >= 1 && req->dek != NULL &&
               req->dek_len == KS_DEK_LEN && blob_ok(req->aad, KS_KP_AAD_MAX);
    case KS_KP_UNWRAP:
        return key_id_ok(req->key_id) && req->key_version >= 1 &&
               blob_ok(req->wrapped, KS_KP_WRAPPED_MAX) && blob_ok(req->aad, KS_KP_AAD_MAX);
    case KS_KP_KEY_INFO: return key_id_ok(req->key_id);
    default: return 0;
    }
}

/* See plugin_proto.h. */
ks_err ks_kp_encode_request(const ks_kp_request *req, uint8_t *out, size_t cap, size_t *out_len)
{
    if (out_len != NULL) {
        *out_len = 0;
    }
    if (out == NULL || out_len == NULL || cap == 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (req == NULL || !request_ok(req)) {
        sodium_memzero(out, cap);
        return KS_ERR_INVALID_ARGUMENT;
    }
    writer w = {out, cap < KS_KP_LINE_MAX ? cap : KS_KP_LINE_MAX, 0, 0};
    put_str(&w, "{\"v\":1,\"id\":");
    put_u64(&w, req->id);
    put_str(&w, ",\"op\":\"");
    put_str(&w, op_names[req->op]);
    put_str(&w, "\"");
    if (req->op == KS_KP_HELLO) {
        put_str(&w, ",\"versions\":[1],\"client\":\"keyshift " KS_VERSION_STRING "\"");
    } else {
        put_str(&w, ",\"key_id\":\"");
        put_bytes(&w, req->key_id);
        put_str(&w, "\",\"key_version\":");
        put_u64(&w, req->key_version);
        if (req->op == KS_KP_WRAP) {
            put_str(&w, ",\"dek\":\"");
            put_b64(&w, req->dek, req->dek_len);
            put_str(&w, "\"");
        } else if (req->op == KS_KP_UNWRAP) {
            put_str(&w, ",\"wrapped\":\"");
            put_b64(&w, req->wrapped.ptr, req->wrapped.len);
            put_str(&w, "\"");
        }
        if (req->op != KS_KP_KEY_INFO) {
            put_str(&w, ",\"aad\":\"");
            put_b64(&w, req->aad.ptr, req->aad.len);
            put_str(&w, "\"");
        }
    }
    put_str(&w, "}\n");
    if (w.over) {
        sodium_memzero(out, cap);
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    *out_len = w.len;
    return KS_OK;
}

/* ---- the response reader [KP-RESP] --------------------------------------------------- */

/* The members a response may have [KP-RESP-4], as bits. */
enum {
    M_V, M_ID, M_OK, M_ERROR, M_MESSAGE, M_RETRY, M_VERSION, M_PLUGIN, M_CAPS, M_WRAPPED, M_DEK,
    M_STATE, M_PRIMARY, M_COUNT
};

static const char *const member_names[M_COUNT] = {
    [M_V] = "v",           [M_ID] = "id",
    [M_OK] = "ok",         [M_ERROR] = "error",
    [M_MESSAGE] = "message", [M_RETRY] = "retry_after_ms",
    [M_VERSION] = "version", [M_PLUGIN] = "plugin",
    [M_CAPS] = "capabilities", [M_WRAPPED] = "wrapped",
    [M_DEK] = "dek",       [M_STATE] = "state",
    [M_PRIMARY] = "primary",
};

#define BIT(m) (1u << (m))
#define COMMON (BIT(M_V) | BIT(M_ID) | BIT(M_OK))
#define ERROR_MEMBERS (COMMON | BIT(M_ERROR) | BIT(M_MESSAGE) | BIT(M_RETRY))

/* The members of an ok response to op. */
static unsigned ok_members(ks_kp_op op)
{
    switch (op) {
    case KS_KP_HELLO: return COMMON | BIT(M_VERSION) | BIT(M_PLUGIN) | BIT(M_CAPS);
    case KS_KP_WRAP: return COMMON | BIT(M_WRAPPED);
    case KS_KP_UNWRAP: return COMMON | BIT(M_DEK);
    default: return COMMON | BIT(M_VERSION) | BIT(M_STATE) | BIT(M_PRIMARY);
    }
}

/* The state of one read. */
typedef struct kp_read {
    json_t *root;
    const ks_kp_request_ctx *expect;
    ks_kp_response *out;
    ks_kp_error *err;
} kp_read;

/* Fail with reason about member m (or -1 for none): note them, return
 * KS_ERR_INTEGRITY. */
static ks_err refuse(kp_read *st, ks_kp_reason reason, int m)
{
    st->err->reason = reason;
    st->err->field = m >= 0 ? member_names[m] : NULL;
    return KS_ERR_INTEGRITY;
}

/* Member m of the root, checked for presence and JSON type (a jansson
 * json_type, JSON_TRUE standing for either boolean); *v gets it.  An
 * absent optional member gives KS_OK and *v NULL. */
static ks_err member(kp_read *st, int m, int type, int required, json_t **v)
{
    *v = json_object_get(st->root, member_names[m]);
    if (*v == NULL) {
        return required ? refuse(st, KS_KP_R_MISSING_FIELD, m) : KS_OK;
    }
    const int t = json_typeof(*v);
    const int same = type == JSON_TRUE ? (t == JSON_TRUE || t == JSON_FALSE) : t == type;
    return same ? KS_OK : refuse(st, KS_KP_R_BAD_TYPE, m);
}

/* An integer member m within [lo, hi] into *out; reason `range` when
 * outside. */
static ks_err int_member(kp_read *st, int m, int required, json_int_t lo, json_int_t hi,
                         ks_kp_reason range, json_int_t *out, int *present)
{
    json_t *v;
    ks_err e = member(st, m, JSON_INTEGER, required, &v);
    *present = v != NULL;
    if (e != KS_OK || v == NULL) {
        return e;
    }
    *out = json_integer_value(v);
    return *out >= lo && *out <= hi ? KS_OK : refuse(st, range, m);
}

/* Nonzero when the NUL-terminated s begins with the vendor prefix "x-". */
static int vendor_name(const char *s)
{
    return s[0] == 'x' && s[1] == '-';
}

/* Refuse any member outside `allowed` that is not an "x-" member [KP-RESP-5]. */
static ks_err only_members(kp_read *st, unsigned allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach(st->root, key, v) {
        int m = 0;
        while (m < M_COUNT && strcmp(member_names[m], key) != 0) {
            m++;
        }
        if (m == M_COUNT ? !vendor_name(key) : !(allowed & BIT(m))) {
            return refuse(st, KS_KP_R_UNKNOWN_FIELD, -1);
        }
    }
    return KS_OK;
}

/* Decode the base64 string member m [KP-B64-1] into buf[0, cap), min..max
 * bytes (max <= KS_KP_WRAPPED_MAX); the length goes to *n.  The text is
 * decoded into a scratch buffer first, wiped afterwards, so that a text
 * a few bytes too long is bad-length rather than a short buffer. */
static ks_err b64_member(kp_read *st, int m, uint8_t *buf, size_t cap, size_t min, size_t max,
                         size_t *n)
{
    uint8_t scratch[(KS_KP_WRAPPED_MAX + 2) / 3 * 3];
    json_t *v;
    ks_err e = member(st, m, JSON_STRING, 1, &v);
    if (e != KS_OK) {
        return e;
    }
    const char *s = json_string_value(v);
    const size_t len = json_string_length(v);
    if (len > (max + 2) / 3 * 4) {
        return refuse(st, KS_KP_R_BAD_LENGTH, m);
    }
    if (len % 4 != 0 || sodium_base642bin(scratch, sizeof scratch, s, len, NULL, n, NULL,
                                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        e = refuse(st, KS_KP_R_BAD_BASE64, m);
    } else if (*n < min || *n > max || *n > cap) {
        e = refuse(st, KS_KP_R_BAD_LENGTH, m);
    } else {
        memcpy(buf, scratch, *n);
    }
    sodium_memzero(scratch, sizeof scratch);
    return e;
}

/* Copy the printable-ASCII view of s[0, n) into out (KS_KP_MESSAGE_KEPT + 1
 * bytes, NUL-terminated): at most KS_KP_MESSAGE_KEPT bytes, each byte
 * outside 0x20..0x7E as '?'. */
static void keep_text(char *out, const char *s, size_t n)
{
    size_t i = 0;
    for (; i < n && i < KS_KP_MESSAGE_KEPT; i++) {
        const unsigned char c = (unsigned char)s[i];
        out[i] = c >= 0x20 && c <= 0x7E ? (char)c : '?';
    }
    out[i] = '\0';
}

/* Read an error response [KP-ERR]. */
static ks_err read_error(kp_read *st)
{
    ks_kp_response *out = st->out;
    json_t *v;
    ks_err e = only_members(st, ERROR_MEMBERS);
    if (e == KS_OK) {
        e = member(st, M_ERROR, JSON_STRING, 1, &v);
    }
    if (e != KS_OK) {
        return e;
    }
    int c = KS_KP_UNAVAILABLE;
    while (c < KS_KP_CLASS_COUNT && strcmp(classes[c].name, json_string_value(v)) != 0) {
        c++;
    }
    if (c == KS_KP_CLASS_COUNT || (c == KS_KP_AUTH_FAILED && st->expect->op != KS_KP_UNWRAP)) {
        return refuse(st, KS_KP_R_BAD_CLASS, M_ERROR); /* [KP-ERR-2] */
    }
    if ((e = member(st, M_MESSAGE, JSON_STRING, 0, &v)) != KS_OK) {
        return e;
    }
    if (v != NULL) {
        if (json_string_length(v) > KS_KP_MESSAGE_MAX) {
            return refuse(st, KS_KP_R_BAD_VALUE, M_MESSAGE); /* [KP-ERR-4] */
        }
        keep_text(out->message, json_string_value(v), json_string_length(v));
    }
    json_int_t retry = 0;
    int present = 0;
    if ((e = int_member(st, M_RETRY, 0, 0, KS_KP_RETRY_MAX, KS_KP_R_BAD_VALUE, &retry,
                        &present)) != KS_OK) {
        return e;
    }
    if (present && c != KS_KP_THROTTLED) {
        return refuse(st, KS_KP_R_INCONSISTENT, M_RETRY); /* [KP-ERR-5] */
    }
    out->ok = 0;
    out->error_class = (ks_kp_class)c;
    out->status = classes[c].code;
    out->has_retry_after = present;
    out->retry_after_ms = (uint32_t)retry;
    return KS_OK;
}

/* The capability bit of a name, 0 for an "x-" name, or -1 when unknown. */
static long capability(const char *s)
{
    static const char *const names[] = {"wrap", "unwrap", "key-info", "rewrap"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(names[i], s) == 0) {
            return 1L << i;
        }
    }
    return vendor_name(s) ? 0 : -1;
}

/* Read an ok response to hello [KP-HELLO-2..4]. */
static ks_err read_hello(kp_read *st)
{
    ks_kp_response *out = st->out;
    json_int_t version = 0;
    int present;
    json_t *v;
    ks_err e = int_member(st, M_VERSION, 1, KS_KP_VERSION, KS_KP_VERSION, KS_KP_R_BAD_VALUE,
                          &version, &present);
    if (e == KS_OK) {
        e = member(st, M_PLUGIN, JSON_STRING, 1, &v);
    }
    if (e != KS_OK) {
        return e;
    }
    const char *name = json_string_value(v);
    const size_t n = json_string_length(v);
    if (n < 1 || n > KS_KP_PLUGIN_MAX) {
        return refuse(st, KS_KP_R_BAD_VALUE, M_PLUGIN);
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7E) {
            return refuse(st, KS_KP_R_BAD_VALUE, M_PLUGIN);
        }
    }
    if ((e = member(st, M_CAPS, JSON_ARRAY, 1, &v)) != KS_OK) {
        return e;
    }
    const size_t count = json_array_size(v);
    unsigned caps = 0;
    if (count > KS_KP_CAPS_MAX) {
        return refuse(st, KS_KP_R_BAD_VALUE, M_CAPS);
    }
    for (size_t i = 0; i < count; i++) {
        const json_t *c = json_array_get(v, i);
        if (!json_is_string(c)) {
            return refuse(st, KS_KP_R_BAD_TYPE, M_CAPS);
        }
        const long bit = capability(json_string_value(c));
        for (size_t j = 0; j < i && bit >= 0; j++) {
            if (json_equal(c, json_array_get(v, j))) {
                return refuse(st, KS_KP_R_BAD_VALUE, M_CAPS); /* a repeated entry */
            }
        }
        if (bit < 0) {
            return refuse(st, KS_KP_R_BAD_VALUE, M_CAPS);
        }
        caps |= (unsigned)bit;
    }
    const unsigned need = KS_KP_CAP_WRAP | KS_KP_CAP_UNWRAP | KS_KP_CAP_KEY_INFO;
    if ((caps & need) != need) {
        return refuse(st, KS_KP_R_INCONSISTENT, M_CAPS);
    }
    out->version = (uint32_t)version;
    memcpy(out->plugin, name, n);
    out->plugin[n] = '\0';
    out->capabilities = caps;
    return KS_OK;
}

/* Read an ok response to key-info [KP-INFO-2..3]. */
static ks_err read_key_info(kp_read *st)
{
    json_int_t version = 0;
    int present;
    json_t *state, *primary;
    ks_err e = int_member(st, M_VERSION, 1, 1, UINT32_MAX, KS_KP_R_BAD_VALUE, &version, &present);
    if (e == KS_OK) {
        e = member(st, M_STATE, JSON_STRING, 1, &state);
    }
    if (e != KS_OK) {
        return e;
    }
    const int s = ks_key_state_from_name(json_string_value(state));
    if (s == 0) {
        return refuse(st, KS_KP_R_BAD_VALUE, M_STATE);
    }
    if ((e = member(st, M_PRIMARY, JSON_TRUE, 1, &primary)) != KS_OK) {
        return e;
    }
    const int is_primary = json_is_true(primary);
    const uint32_t asked = st->expect->key_version;
    if ((asked != 0 && (uint32_t)version != asked) || (asked == 0 && !is_primary)) {
        return refuse(st, KS_KP_R_INCONSISTENT, M_VERSION); /* [KP-INFO-3] */
    }
    if (is_primary && s != KS_KEY_ACTIVE) {
        return refuse(st, KS_KP_R_INCONSISTENT, M_PRIMARY); /* [K-STATE-3] */
    }
    st->out->info.version = (uint32_t)version;
    st->out->info.state = (ks_key_state)s;
    st->out->info.is_primary = is_primary;
    return KS_OK;
}

/* Read an ok response to the expected op. */
static ks_err read_ok(kp_read *st)
{
    ks_kp_response *out = st->out;
    ks_err e = only_members(st, ok_members(st->expect->op));
    if (e != KS_OK) {
        return e;
    }
    out->ok = 1;
    out->status = KS_OK;
    size_t n = 0;
    switch (st->expect->op) {
    case KS_KP_HELLO: return read_hello(st);
    case KS_KP_WRAP:
        e = b64_member(st, M_WRAPPED, out->wrapped, out->wrapped_cap, 1, KS_KP_WRAPPED_MAX, &n);
        out->wrapped_len = n;
        return e;
    case KS_KP_UNWRAP: return b64_member(st, M_DEK, out->dek, KS_DEK_LEN, KS_DEK_LEN, KS_DEK_LEN, &n);
    default: return read_key_info(st);
    }
}

/* Check the members every response has, v, id and ok [KP-RESP-3], then
 * the rest of the response. */
static ks_err read_response(kp_read *st)
{
    json_int_t v = 0, id = 0;
    int present;
    json_t *ok;
    ks_err e = int_member(st, M_V, 1, KS_KP_VERSION, KS_KP_VERSION, KS_KP_R_BAD_VERSION, &v,
                          &present);
    if (e == KS_OK) {
        e = int_member(st, M_ID, 1, (json_int_t)st->expect->id, (json_int_t)st->expect->id,
                       KS_KP_R_ID_MISMATCH, &id, &present);
    }
    if (e == KS_OK) {
        e = member(st, M_OK, JSON_TRUE, 1, &ok);
    }
    if (e != KS_OK) {
        return e;
    }
    return json_is_true(ok) ? read_ok(st) : read_error(st);
}

/* The reason for a jansson decoding error [KP-RESP-2]. */
static ks_kp_reason json_reason(const json_error_t *je)
{
    switch (json_error_code(je)) {
    case json_error_invalid_utf8:
    case json_error_null_character:
    case json_error_null_byte_in_key: return KS_KP_R_BAD_TEXT;
    case json_error_duplicate_key: return KS_KP_R_DUPLICATE_KEY;
    default: return KS_KP_R_BAD_JSON;
    }
}

/* Wipe the text of the root's "dek" member, if it is a string: jansson's
 * copy of the DEK's base64 [KP-SEC-3]. */
static void wipe_dek_text(json_t *root)
{
    json_t *v = json_object_get(root, member_names[M_DEK]);
    if (json_is_string(v)) {
        sodium_memzero((void *)(uintptr_t)json_string_value(v), json_string_length(v));
    }
}

/* Check the framing of a line [KP-MSG-1..2]: a reason, or KS_KP_R_NONE. */
static ks_kp_reason framing(const uint8_t *line, size_t len)
{
    if (len > KS_KP_LINE_MAX) {
        return KS_KP_R_TOO_LONG;
    }
    if (len == 0 || line[len - 1] != '\n') {
        return KS_KP_R_UNTERMINATED;
    }
    if (memchr(line, '\n', len - 1) != NULL) {
        return KS_KP_R_EMBEDDED_LF;
    }
    if (memchr(line, '\0', len - 1) != NULL) {
        return KS_KP_R_BAD_TEXT;
    }
    return KS_KP_R_NONE;
}

/* Zero every filled member of *out and wipe the caller's buffers, keeping
 * the buffer pointers. */
static void reset(ks_kp_response *out)
{
    uint8_t *const dek = out->dek, *const wrapped = out->wrapped;
    const size_t wrapped_cap = out->wrapped_cap;
    sodium_memzero(out, sizeof *out);
    out->dek = dek;
    out->wrapped = wrapped;
    out->wrapped_cap = wrapped_cap;
    if (dek != NULL) {
        sodium_memzero(dek, KS_DEK_LEN);
    }
    if (wrapped != NULL) {
        sodium_memzero(wrapped, wrapped_cap);
    }
}

/* See plugin_proto.h. */
ks_err ks_kp_parse_response(const uint8_t *line, size_t len, const ks_kp_request_ctx *expect,
                            ks_kp_response *out, ks_kp_error *err)
{
    ks_kp_error scratch;
    ks_kp_error *e = err != NULL ? err : &scratch;
    e->reason = KS_KP_R_NONE;
    e->field = NULL;
    if (out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    reset(out);
    if ((line == NULL && len != 0) || expect == NULL || ks_kp_op_name(expect->op) == NULL ||
        expect->id < 1 || expect->id > KS_KP_ID_MAX ||
        (expect->op == KS_KP_UNWRAP && out->dek == NULL) ||
        (expect->op == KS_KP_WRAP && (out->wrapped == NULL || out->wrapped_cap < KS_KP_WRAPPED_MAX))) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    kp_read st = {NULL, expect, out, e};
    ks_err rc = KS_ERR_INTEGRITY;
    const ks_kp_reason framed = framing(line, len);
    if (framed != KS_KP_R_NONE) {
        e->reason = framed;
    } else {
        json_error_t je;
        st.root = json_loadb((const char *)line, len - 1, JSON_REJECT_DUPLICATES, &je);
        if (st.root == NULL) {
            e->reason = json_reason(&je);
        } else if (!json_is_object(st.root)) {
            e->reason = KS_KP_R_NOT_OBJECT;
        } else {
            rc = read_response(&st);
            wipe_dek_text(st.root);
        }
        json_decref(st.root);
    }
    if (rc != KS_OK) {
        reset(out);
    }
    return rc;
}
