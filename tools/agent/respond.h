/*
 * tools/agent/respond.h -- the writers of the agent's answers
 * (docs/agent.md sections 5 and 4a): JSON text and the batch frame, into
 * a buffer sized beforehand, for the server (server_serve.c and
 * server_metrics.c).
 *
 * Every answer's buffer comes from resp_alloc, whose free callback
 * (resp_free) wipes it whole before libmicrohttpd frees it: an open's
 * answer holds plaintext [AG-SEC-2].  Internal header: all static, no
 * state.
 */
#ifndef KS_TOOLS_AGENT_RESPOND_H
#define KS_TOOLS_AGENT_RESPOND_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/keyshift.h>
#include <sodium.h>

/* A response buffer of n bytes whose length sits before it, so that the
 * free callback can wipe it whole [AG-SEC-2]. */
static inline uint8_t *resp_alloc(size_t n)
{
    uint8_t *p = malloc(n + 16);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    return p + 16;
}

/* Say that only buf[0, n) of resp_alloc's buffer was ever written, so
 * that resp_free wipes those bytes rather than the whole capacity. */
static inline void resp_written(uint8_t *buf, size_t n)
{
    memcpy(buf - 16, &n, sizeof n);
}

/* libmicrohttpd's free callback for resp_alloc's buffers: wipe, free. */
static inline void resp_free(void *buf)
{
    if (buf == NULL) {
        return;
    }
    uint8_t *p = (uint8_t *)buf - 16;
    size_t n;
    memcpy(&n, p, sizeof n);
    sodium_memzero(buf, n);
    free(p);
}

/* A JSON writer into a buffer sized beforehand; overflow latches. */
typedef struct jw {
    uint8_t *p;
    size_t n, cap;
    int overflow;
} jw;

/* Append s[0, n). */
static inline void jw_put(jw *w, const void *s, size_t n)
{
    if (w->overflow || n > w->cap - w->n) {
        w->overflow = 1;
        return;
    }
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

/* Append a C string. */
static inline void jw_str(jw *w, const char *s)
{
    jw_put(w, s, strlen(s));
}

/* Append formatted text (numbers and names only). */
static inline void jw_fmt(jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void jw_fmt(jw *w, const char *fmt, ...)
{
    if (w->overflow) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf((char *)w->p + w->n, w->cap - w->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= w->cap - w->n) {
        w->overflow = 1;
        return;
    }
    w->n += (size_t)k;
}

/* Append v in decimal: what jw_fmt's "%" PRIu64 writes, without a
 * format string to interpret on every answer. */
static inline void jw_uint(jw *w, uint64_t v)
{
    uint8_t d[20];
    size_t n = 0;
    do {
        d[sizeof d - 1 - n++] = (uint8_t)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    jw_put(w, d + sizeof d - n, n);
}

/* Append a JSON string of bytes known to need no escape ([F-NAME-1],
 * [F-KEYID-1], the names of this file). */
static inline void jw_name(jw *w, const uint8_t *s, size_t n)
{
    jw_put(w, "\"", 1);
    jw_put(w, s, n);
    jw_put(w, "\"", 1);
}

/* Append the canonical base64 of b[0, n) as a JSON string [AG-RESP-2]. */
static inline void jw_b64(jw *w, const uint8_t *b, size_t n)
{
    jw_put(w, "\"", 1);
    size_t need = ks_envelope_text_len(n), got = 0;
    if (w->overflow || need > w->cap - w->n ||
        ks_envelope_text_encode(b, n, w->p + w->n, w->cap - w->n, &got) != KS_OK) {
        w->overflow = 1;
        return;
    }
    w->n += got;
    jw_put(w, "\"", 1);
}

/* Write the class fields of a seal's or open's result. */
static inline void put_class(jw *w, const ks_rollout_class *c)
{
    if (c->is_plaintext) {
        jw_str(w, ",\"sealed\":false");
        return;
    }
    jw_str(w, ",\"sealed\":true,\"format\":");
    jw_uint(w, c->version);
    jw_str(w, ",\"algorithm\":");
    const char *alg = ks_alg_name(c->algorithm); /* defined: the library sealed or read it */
    alg = alg != NULL ? alg : "";
    jw_name(w, (const uint8_t *)alg, strlen(alg));
    jw_str(w, ",\"key_id\":");
    jw_name(w, (const uint8_t *)c->key_id, strlen(c->key_id));
    jw_str(w, ",\"key_version\":");
    jw_uint(w, c->key_version);
}

/* Write a record's error object [AG-ERR-1]. */
static inline void put_record_error(jw *w, ks_err e, const ks_parse_error *pe)
{
    jw_fmt(w, "{\"error\":\"%s\",\"class\":\"%s\"", ks_err_name(e),
           ks_error_class_name(ks_err_class(e)));
    if (pe != NULL && ks_err_is_rejection(e)) {
        jw_fmt(w, ",\"offset\":%zu", pe->offset);
    }
    jw_str(w, "}");
}

/* ---- the batch frame [AG-BIN-4] ---------------------------------------------------- */

/* Append a byte. */
static inline void fw_u8(jw *w, uint8_t v)
{
    jw_put(w, &v, 1);
}

/* Append a u32, big-endian. */
static inline void fw_u32(jw *w, uint32_t v)
{
    const uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    jw_put(w, b, 4);
}

/* Append a str16: a u16 length, big-endian, then the bytes (at most 65535). */
static inline void fw_str16(jw *w, const char *s, size_t n)
{
    if (n > 0xFFFF) {
        w->overflow = 1;
        return;
    }
    const uint8_t b[2] = {(uint8_t)(n >> 8), (uint8_t)n};
    jw_put(w, b, 2);
    jw_put(w, s, n);
}

/* The most bytes of a result in the frame besides its output: the kind,
 * the output's length, sealed, format, key_version, and the algorithm
 * and key id as str16 (or an error's name, class and offset). */
#define FW_RESULT_MAX (1 + 4 + 1 + 1 + 4 + 2 + 64 + 2 + 256)

/* Append the class fields of an ok result [AG-BIN-4]. */
static inline void fw_class(jw *w, const ks_rollout_class *c)
{
    if (c->is_plaintext) {
        fw_u8(w, 0);
        fw_u8(w, 0);
        fw_u32(w, 0);
        fw_str16(w, "", 0);
        fw_str16(w, "", 0);
        return;
    }
    fw_u8(w, 1);
    fw_u8(w, (uint8_t)c->version);
    fw_u32(w, c->key_version);
    const char *alg = ks_alg_name(c->algorithm);
    fw_str16(w, alg, strlen(alg));
    fw_str16(w, c->key_id, strlen(c->key_id));
}

/* Append an error result [AG-BIN-4]: kind 1, the name and class as str16,
 * has-offset and the offset. */
static inline void fw_record_error(jw *w, ks_err e, const ks_parse_error *pe)
{
    const char *name = ks_err_name(e), *cls = ks_error_class_name(ks_err_class(e));
    const int has = pe != NULL && ks_err_is_rejection(e);
    fw_u8(w, 1);
    fw_str16(w, name, strlen(name));
    fw_str16(w, cls, strlen(cls));
    fw_u8(w, (uint8_t)has);
    fw_u32(w, has ? (uint32_t)pe->offset : 0);
}

#endif /* KS_TOOLS_AGENT_RESPOND_H */
