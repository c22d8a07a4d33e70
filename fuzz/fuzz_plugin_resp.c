/*
 * fuzz/fuzz_plugin_resp.c -- the KMS plugin response reader
 * (migrate/keys/plugin_proto.c, docs/kms-plugin.md) on arbitrary bytes.
 *
 * The input is one response line.  It is read as the response to five
 * requests: hello (id 1), wrap, unwrap, key-info for the primary and
 * key-info for version 3 (id 7 each; the vectors of Appendix A use these
 * requests).  Oracles (each failure calls abort(), so every engine reports
 * it):
 *   1. Refusal.  KS_ERR_INTEGRITY with a named reason and, when a member
 *      is given, a member of the protocol; every filled member of the
 *      response is zero and the DEK and wrapped buffers are all zero,
 *      though they held a pattern before the call; a NULL err gives the
 *      same result.
 *   2. Acceptance.  The values are within [KP-...]'s bounds (status and
 *      class agree with [KP-ERR-3], retry-after only with throttled,
 *      kept text printable ASCII, lengths in range, the capabilities
 *      required, key-info consistent with the request), and a second read
 *      gives the identical response.
 *   3. Re-encoding.  The response written again by the canonical writer
 *      below reads back to the identical response; the input without its
 *      LF is unterminated.
 *   4. A caller error (NULL expect or response, a short wrapped buffer)
 *      is invalid-argument.
 *   5. The encoder.  A request built from the input's bytes (op, id,
 *      key_version, key_id, DEK, AAD, wrapped) is refused, with the buffer
 *      wiped, exactly when [KP-REQ] forbids it; else its line is one LF-ended
 *      JSON object (read back with jansson) holding exactly the request's
 *      members and values, and one byte less of buffer is too small.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../migrate/keys/plugin_proto.h"
#include "../tests/plugin_test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

static kp_reply first, second;
static char line[2 * KS_KP_LINE_MAX];
static uint8_t req_line[8192]; /* above the longest request: a 4096-byte AAD, a 1024-byte blob */

/* Nonzero when every byte of p[0, n) is zero. */
static int all_zero(const void *p, size_t n)
{
    return sodium_is_zero(p, n);
}

/* Nonzero when two reads gave the same response, buffers included (the
 * buffer pointers, which differ, aside). */
static int same_reply(const kp_reply *a, const kp_reply *b)
{
    ks_kp_response x = a->r, y = b->r;
    x.dek = y.dek = NULL;
    x.wrapped = y.wrapped = NULL;
    return memcmp(a->dek, b->dek, sizeof a->dek) == 0 &&
           memcmp(a->wrapped, b->wrapped, sizeof a->wrapped) == 0 && memcmp(&x, &y, sizeof x) == 0;
}

/* Nonzero when s is at most max bytes of printable ASCII, NUL-terminated. */
static int printable(const char *s, size_t max)
{
    size_t i = 0;
    for (; i <= max && s[i] != '\0'; i++) {
        if (s[i] < 0x20 || s[i] > 0x7E) {
            return 0;
        }
    }
    return i <= max;
}

/* Oracle 1: a refusal is well formed. */
static void check_refusal(const kp_reply *rp)
{
    static const char *const members[] = {"v", "id", "ok", "error", "message", "retry_after_ms",
                                          "version", "plugin", "capabilities", "wrapped", "dek",
                                          "state", "primary"};
    CHECK(rp->e.reason > KS_KP_R_NONE && rp->e.reason < KS_KP_R_COUNT);
    CHECK(ks_kp_reason_name(rp->e.reason) != NULL);
    if (rp->e.field != NULL) {
        int known = 0;
        for (size_t i = 0; i < sizeof members / sizeof members[0]; i++) {
            known |= strcmp(members[i], rp->e.field) == 0;
        }
        CHECK(known);
    }
    ks_kp_response zero;
    memset(&zero, 0, sizeof zero);
    zero.dek = rp->r.dek;
    zero.wrapped = rp->r.wrapped;
    zero.wrapped_cap = rp->r.wrapped_cap;
    CHECK(memcmp(&zero, &rp->r, sizeof zero) == 0);
    CHECK(all_zero(rp->dek, sizeof rp->dek) && all_zero(rp->wrapped, sizeof rp->wrapped));
}

/* Oracle 2: an accepted response is within the protocol's bounds. */
static void check_accepted(const kp_reply *rp, const ks_kp_request_ctx *ctx)
{
    const ks_kp_response *r = &rp->r;
    static const ks_err codes[KS_KP_CLASS_COUNT] = {
        KS_OK, KS_ERR_UNAVAILABLE, KS_ERR_TIMEOUT, KS_ERR_UNAVAILABLE, KS_ERR_DENIED, KS_ERR_REVOKED,
        KS_ERR_NOT_FOUND, KS_ERR_INTEGRITY, KS_ERR_INVALID_ARGUMENT, KS_ERR_AUTH_FAILED};
    CHECK(r->ok == 0 || r->ok == 1);
    CHECK(printable(r->message, KS_KP_MESSAGE_KEPT) && printable(r->plugin, KS_KP_PLUGIN_MAX));
    if (!r->ok) {
        CHECK(r->error_class > KS_KP_CLASS_NONE && r->error_class < KS_KP_CLASS_COUNT);
        CHECK(r->status == codes[r->error_class]);
        CHECK(r->error_class != KS_KP_AUTH_FAILED || ctx->op == KS_KP_UNWRAP);
        CHECK(!r->has_retry_after || r->error_class == KS_KP_THROTTLED);
        CHECK(r->retry_after_ms <= KS_KP_RETRY_MAX && (r->has_retry_after || r->retry_after_ms == 0));
        CHECK(all_zero(rp->dek, sizeof rp->dek) && all_zero(rp->wrapped, sizeof rp->wrapped));
        return;
    }
    CHECK(r->status == KS_OK && r->error_class == KS_KP_CLASS_NONE && r->message[0] == '\0');
    switch (ctx->op) {
    case KS_KP_HELLO:
        CHECK(r->version == KS_KP_VERSION && r->plugin[0] != '\0');
        CHECK((r->capabilities & 7u) == 7u && r->capabilities <= 15u);
        break;
    case KS_KP_WRAP:
        CHECK(r->wrapped_len >= 1 && r->wrapped_len <= KS_KP_WRAPPED_MAX);
        CHECK(all_zero(rp->wrapped + r->wrapped_len, sizeof rp->wrapped - r->wrapped_len));
        break;
    case KS_KP_UNWRAP: break;
    default:
        CHECK(r->info.version >= 1 && r->info.state >= KS_KEY_ACTIVE && r->info.state <= KS_KEY_DESTROYED);
        CHECK(ctx->key_version == 0 ? r->info.is_primary : r->info.version == ctx->key_version);
        CHECK(!r->info.is_primary || r->info.state == KS_KEY_ACTIVE);
    }
}

/* Append the text s, escaping '"' and '\\', as a JSON string. */
static size_t put_string(char *out, size_t n, const char *s)
{
    out[n++] = '"';
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            out[n++] = '\\';
        }
        out[n++] = *s;
    }
    out[n++] = '"';
    return n;
}

/* Append the base64 of p[0, len) as a JSON string. */
static size_t put_b64(char *out, size_t n, const uint8_t *p, size_t len)
{
    out[n++] = '"';
    sodium_bin2base64(out + n, sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_ORIGINAL), p, len,
                      sodium_base64_VARIANT_ORIGINAL);
    n += strlen(out + n);
    out[n++] = '"';
    return n;
}

/* Write r, the response to ctx, in canonical form into line; its length. */
static size_t canonical(const kp_reply *rp, const ks_kp_request_ctx *ctx)
{
    static const char *const caps[] = {"wrap", "unwrap", "key-info", "rewrap"};
    const ks_kp_response *r = &rp->r;
    size_t n = (size_t)sprintf(line, "{\"v\":1,\"id\":%llu,\"ok\":%s", (unsigned long long)ctx->id,
                               r->ok ? "true" : "false");
    if (!r->ok) {
        n += (size_t)sprintf(line + n, ",\"error\":\"%s\"", ks_kp_class_name(r->error_class));
        if (r->message[0] != '\0') {
            n = put_string(line, n + (size_t)sprintf(line + n, ",\"message\":"), r->message);
        }
        if (r->has_retry_after) {
            n += (size_t)sprintf(line + n, ",\"retry_after_ms\":%u", r->retry_after_ms);
        }
    } else if (ctx->op == KS_KP_HELLO) {
        n = put_string(line, n + (size_t)sprintf(line + n, ",\"version\":%u,\"plugin\":", r->version), r->plugin);
        n += (size_t)sprintf(line + n, ",\"capabilities\":[");
        for (unsigned i = 0, k = 0; i < 4; i++) {
            if (r->capabilities & (1u << i)) {
                n += (size_t)sprintf(line + n, "%s\"%s\"", k++ ? "," : "", caps[i]);
            }
        }
        line[n++] = ']';
    } else if (ctx->op == KS_KP_WRAP) {
        n = put_b64(line, n + (size_t)sprintf(line + n, ",\"wrapped\":"), rp->wrapped, r->wrapped_len);
    } else if (ctx->op == KS_KP_UNWRAP) {
        n = put_b64(line, n + (size_t)sprintf(line + n, ",\"dek\":"), rp->dek, KS_DEK_LEN);
    } else {
        n += (size_t)sprintf(line + n, ",\"version\":%u,\"state\":\"%s\",\"primary\":%s", r->info.version,
                             ks_key_state_name(r->info.state), r->info.is_primary ? "true" : "false");
    }
    n += (size_t)sprintf(line + n, "}\n");
    return n;
}

/* One input as the response to ctx: oracles 1 to 3. */
static void check_one(const uint8_t *data, size_t size, const ks_kp_request_ctx *ctx)
{
    const ks_err rc = kp_read(&first, data, size, ctx, 1);
    CHECK(kp_read(&second, data, size, ctx, 0) == rc);
    CHECK(same_reply(&first, &second));
    if (rc != KS_OK) {
        CHECK(rc == KS_ERR_INTEGRITY);
        check_refusal(&first);
        return;
    }
    CHECK(first.e.reason == KS_KP_R_NONE && first.e.field == NULL);
    check_accepted(&first, ctx);
    const size_t n = canonical(&first, ctx);
    CHECK(n <= KS_KP_LINE_MAX);
    CHECK(kp_read(&second, line, n, ctx, 1) == KS_OK);
    CHECK(same_reply(&first, &second));
    CHECK(kp_read(&second, data, size - 1, ctx, 1) == KS_ERR_INTEGRITY);
    CHECK(second.e.reason == KS_KP_R_UNTERMINATED);
}

/* The bytes of a base64 JSON string member into out (cap bytes); the
 * length, or SIZE_MAX when absent or not base64. */
static size_t b64_of(const json_t *obj, const char *name, uint8_t *out, size_t cap)
{
    const json_t *v = json_object_get(obj, name);
    size_t n = 0;
    if (!json_is_string(v) || sodium_base642bin(out, cap, json_string_value(v), json_string_length(v), NULL,
                                                &n, NULL, sodium_base64_VARIANT_ORIGINAL) != 0) {
        return SIZE_MAX;
    }
    return n;
}

/* Nonzero when member name of obj is the integer want. */
static int int_is(const json_t *obj, const char *name, uint64_t want)
{
    const json_t *v = json_object_get(obj, name);
    return json_is_integer(v) && (uint64_t)json_integer_value(v) == want;
}

/* Nonzero when b is a slice [KP-REQ] allows: 1..max bytes. */
static int slice_ok(ks_bytes b, size_t max)
{
    return b.len >= 1 && b.len <= max;
}

/* Oracle 5: the encoder on a request built from data[0, size). */
static void check_encoder(const uint8_t *data, size_t size)
{
    static const uint8_t zero[KS_DEK_LEN + 8];
    uint8_t head[16] = {0}, back[KS_KP_AAD_MAX];
    memcpy(head, data, size < sizeof head ? size : sizeof head);
    const uint8_t *rest = size > sizeof head ? data + sizeof head : zero;
    const size_t left = size > sizeof head ? size - sizeof head : 0;
    const size_t a = head[5] % (left + 1), b = head[6] % (left + 1 - a);
    ks_kp_request req = {(ks_kp_op)(head[0] % 6), (uint64_t)head[1] << 48 | (uint64_t)head[2], {rest, a},
                         (uint32_t)head[3] << 8 | head[4], head[7] & 1 ? NULL : rest,
                         KS_DEK_LEN - (head[7] & 2), {rest + a, b}, {rest + a + b, left - a - b}};
    if (head[7] & 4) {
        req.id = head[2] % 3;
    }
    if (left < KS_DEK_LEN) {
        req.dek = req.dek != NULL ? zero : NULL;
    }
    int valid = req.id >= 1 && req.id <= KS_KP_ID_MAX;
    const int id_ok = req.key_id.len >= 1 && req.key_id.len <= KS_KEY_ID_MAX;
    int key_ok = id_ok;
    for (size_t i = 0; i < req.key_id.len && key_ok; i++) {
        const uint8_t c = req.key_id.ptr[i];
        key_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 (c != 0 && strchr("._:-/@+=", c) != NULL);
    }
    switch (req.op) {
    case KS_KP_HELLO: valid = valid && req.id == 1; break;
    case KS_KP_WRAP:
        valid = valid && key_ok && req.key_version >= 1 && req.dek != NULL && req.dek_len == KS_DEK_LEN &&
                slice_ok(req.aad, KS_KP_AAD_MAX);
        break;
    case KS_KP_UNWRAP:
        valid = valid && key_ok && req.key_version >= 1 && slice_ok(req.wrapped, KS_KP_WRAPPED_MAX) &&
                slice_ok(req.aad, KS_KP_AAD_MAX);
        break;
    case KS_KP_KEY_INFO: valid = valid && key_ok; break;
    default: valid = 0;
    }
    size_t n = 1;
    memset(req_line, 0xEE, sizeof req_line);
    const ks_err rc = ks_kp_encode_request(&req, req_line, sizeof req_line, &n);
    if (!valid) {
        CHECK(rc == KS_ERR_INVALID_ARGUMENT && n == 0 && all_zero(req_line, sizeof req_line));
        return;
    }
    CHECK(rc == KS_OK && n >= 2 && n <= sizeof req_line && req_line[n - 1] == '\n');
    CHECK(memchr(req_line, '\n', n - 1) == NULL);
    json_error_t je;
    json_t *obj = json_loadb((const char *)req_line, n - 1, JSON_REJECT_DUPLICATES, &je);
    CHECK(json_is_object(obj));
    CHECK(int_is(obj, "v", 1) && int_is(obj, "id", req.id));
    CHECK(strcmp(json_string_value(json_object_get(obj, "op")), ks_kp_op_name(req.op)) == 0);
    size_t members = 3;
    if (req.op == KS_KP_HELLO) {
        CHECK(json_is_array(json_object_get(obj, "versions")) && json_is_string(json_object_get(obj, "client")));
        members += 2;
    } else {
        const json_t *k = json_object_get(obj, "key_id");
        CHECK(json_is_string(k) && json_string_length(k) == req.key_id.len &&
              memcmp(json_string_value(k), req.key_id.ptr, req.key_id.len) == 0);
        CHECK(int_is(obj, "key_version", req.key_version));
        members += 2;
    }
    if (req.op == KS_KP_WRAP) {
        CHECK(b64_of(obj, "dek", back, sizeof back) == KS_DEK_LEN && memcmp(back, req.dek, KS_DEK_LEN) == 0);
        members++;
    }
    if (req.op == KS_KP_UNWRAP) {
        CHECK(b64_of(obj, "wrapped", back, sizeof back) == req.wrapped.len &&
              memcmp(back, req.wrapped.ptr, req.wrapped.len) == 0);
        members++;
    }
    if (req.op == KS_KP_WRAP || req.op == KS_KP_UNWRAP) {
        CHECK(b64_of(obj, "aad", back, sizeof back) == req.aad.len && memcmp(back, req.aad.ptr, req.aad.len) == 0);
        members++;
    }
    CHECK(json_object_size(obj) == members);
    json_decref(obj);
    size_t m = 1;
    CHECK(ks_kp_encode_request(&req, req_line, n - 1, &m) == KS_ERR_BUFFER_TOO_SMALL && m == 0);
    CHECK(all_zero(req_line, n - 1));
    CHECK(ks_kp_encode_request(&req, req_line, n, &m) == KS_OK && m == n);
    CHECK(ks_kp_encode_request(&req, NULL, n, &m) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_kp_encode_request(&req, req_line, n, NULL) == KS_ERR_INVALID_ARGUMENT);
}

/* One input: the five requests (see the header comment), then oracles 4 and 5. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ks_kp_request_ctx ctxs[] = {
        {KS_KP_HELLO, 1, 0}, {KS_KP_WRAP, 7, 0}, {KS_KP_UNWRAP, 7, 0}, {KS_KP_KEY_INFO, 7, 0},
        {KS_KP_KEY_INFO, 7, 3},
    };
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
        check_one(data, size, &ctxs[i]);
    }
    CHECK(ks_kp_parse_response(data, size, NULL, &first.r, NULL) == KS_ERR_INVALID_ARGUMENT);
    first.r.wrapped_cap = KS_KP_WRAPPED_MAX - 1;
    CHECK(ks_kp_parse_response(data, size, &ctxs[1], &first.r, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_kp_parse_response(data, size, &ctxs[1], NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    check_encoder(data, size);
    return 0;
}
