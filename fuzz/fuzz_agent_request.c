/*
 * fuzz/fuzz_agent_request.c -- the agent's request reader
 * (tools/agent/request.c, docs/agent.md section 4) on arbitrary bytes: a
 * request body as a local client could send it, with no server.
 *
 * The first byte picks the endpoint (its value mod 5) and, with its top
 * bit set on a batch endpoint, the batch frame reader
 * (ks_agent_request_read_frame, docs/agent.md section 4a) rather than
 * JSON; the rest is the body.  Oracles (each failure calls abort(), so
 * every engine reports it):
 *   1. A refusal is KS_ERR_BAD_VALUE with a named reason [AG-REQ-3], a
 *      member that is NULL or one of the protocol's names, an index that
 *      is -1 or inside the batch bound, and keeps nothing (the request is
 *      empty).  A body over max_body is too-large without being read
 *      [AG-REQ-2].
 *   2. An acceptance has 1 record (single forms) or 1..max_batch (batches),
 *      each with a scope that is its table, '.', its column [AG-REQ-4], a
 *      tenant and purpose of [F-NAME-1] or empty (a seal's tenant never
 *      empty) [AG-REQ-5], a context of at most KS_CONTEXT_MAX bytes
 *      [AG-REQ-6]; a parse record has no tenant, purpose or context
 *      [AG-REQ-7].
 *   3. Determinism, and the long values: reading the same body again with
 *      every string through jansson (request_read without literals, see
 *      the top of request.c) gives the same records, byte for byte, or the
 *      same refusal.
 *   4. Every accepted input re-encodes to canonical base64 that the
 *      envelope text decoder takes back ([F-TEXT-1]).
 *   5. A frame: a bad-frame refusal has an offset inside the body (or at
 *      its end), every other refusal none [AG-BIN-3]; an accepted frame
 *      is the one encoding of its records: written again from them, it
 *      is the body byte for byte [AG-BIN-2].
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

/* The reader is a file of the agent, not of the library: compiled here. */
#include "../tools/agent/request.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

/* A body bound below max_len, so that too-large is reached. */
static const ks_agent_limits LIM = {2048, 8};

/* Nonzero when b is empty or [F-NAME-1] of at most max bytes. */
static int name_or_empty(ks_bytes b, size_t max)
{
    return b.len == 0 || name_ok((const char *)b.ptr, b.len, max);
}

/* Nonzero when two views hold the same bytes. */
static int same(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Oracle 4: data re-encodes and decodes back. */
static void round_trip(ks_bytes d)
{
    size_t tl = ks_envelope_text_len(d.len), got = 0, back = 0;
    size_t bc = ks_envelope_text_decoded_max(tl);
    uint8_t *t = malloc(tl + 1), *b = malloc(bc + 1);
    CHECK(t != NULL && b != NULL);
    CHECK(ks_envelope_text_encode(d.ptr, d.len, t, tl, &got) == KS_OK && got == tl);
    CHECK(ks_envelope_text_decode(t, tl, NULL, b, bc, &back, NULL) == KS_OK);
    CHECK(back == d.len && (d.len == 0 || memcmp(b, d.ptr, d.len) == 0));
    free(t);
    free(b);
}

/* Append a frame field (u32 length, big-endian, then the bytes) of b to
 * out at *n. */
static void put_field(uint8_t *out, size_t *n, const void *b, size_t len)
{
    const uint8_t be[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                           (uint8_t)len};
    memcpy(out + *n, be, 4);
    if (len > 0) {
        memcpy(out + *n + 4, b, len);
    }
    *n += 4 + len;
}

/* Oracle 5: the records of q, written as a frame, are body[0, len). */
static void frame_round_trip(const ks_agent_request *q, const uint8_t *body, size_t len)
{
    uint8_t *out = malloc(len + 1);
    CHECK(out != NULL);
    size_t n = 0;
    memcpy(out, KS_AGENT_FRAME_REQ_MAGIC, 4);
    n = 4;
    const uint8_t cnt[4] = {(uint8_t)(q->n >> 24), (uint8_t)(q->n >> 16), (uint8_t)(q->n >> 8),
                            (uint8_t)q->n};
    memcpy(out + n, cnt, 4);
    n += 4;
    for (size_t i = 0; i < q->n; i++) {
        const ks_agent_record *r = &q->records[i];
        CHECK(n + 20 + strlen(r->scope) + r->tenant.len + r->purpose.len + r->context.len +
                  r->data.len <= len);
        put_field(out, &n, r->scope, strlen(r->scope));
        put_field(out, &n, r->tenant.ptr, r->tenant.len);
        put_field(out, &n, r->purpose.ptr, r->purpose.len);
        put_field(out, &n, r->context.ptr, r->context.len);
        put_field(out, &n, r->data.ptr, r->data.len);
    }
    CHECK(n == len && memcmp(out, body, len) == 0);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    const ks_agent_verb verb = (ks_agent_verb)(data[0] % 5 + 1);
    const int frame = (data[0] & 0x80) && (verb == KS_AGENT_SEAL_BATCH || verb == KS_AGENT_OPEN_BATCH);
    const uint8_t *body = data + 1;
    const size_t len = size - 1;
    ks_agent_request q, q2;
    ks_agent_req_error e, e2;
    ks_err rc = frame ? ks_agent_request_read_frame(verb, body, len, &LIM, &q, &e)
                      : ks_agent_request_read(verb, body, len, &LIM, &q, &e);
    ks_err rc2 = frame ? ks_agent_request_read_frame(verb, body, len, &LIM, &q2, &e2)
                       : request_read(verb, body, len, &LIM, &q2, &e2, 0);
    CHECK(rc == rc2); /* oracle 3 */
    if (rc != KS_OK) {
        /* Oracle 1. */
        CHECK(rc == KS_ERR_BAD_VALUE || rc == KS_ERR_NO_MEMORY);
        if (rc == KS_ERR_BAD_VALUE) {
            CHECK(ks_agent_reason_name(e.reason) != NULL && e.reason != KS_AGENT_R_NONE);
            CHECK(e.reason == e2.reason && e.member == e2.member && e.index == e2.index &&
                  e.offset == e2.offset);
            /* Oracle 5. */
            CHECK(e.reason == KS_AGENT_R_BAD_FRAME ? frame && e.offset >= 0 && (size_t)e.offset <= len
                                                   : e.offset == -1);
            CHECK(e.index >= -1 && e.index < (long)LIM.max_batch);
            if (e.member != NULL) {
                int known = strcmp(e.member, "records") == 0;
                for (int m = 0; m < M_COUNT; m++) {
                    known |= strcmp(e.member, member_names[m]) == 0;
                }
                CHECK(known);
            }
            CHECK((len > LIM.max_body) == (e.reason == KS_AGENT_R_TOO_LARGE));
        }
        CHECK(q.records == NULL && q.arena == NULL && q.n == 0);
        return 0;
    }
    /* Oracle 2. */
    const int batch = verb == KS_AGENT_SEAL_BATCH || verb == KS_AGENT_OPEN_BATCH;
    CHECK(q.verb == verb && q.n >= 1 && (batch ? q.n <= LIM.max_batch : q.n == 1));
    CHECK(q2.n == q.n);
    for (size_t i = 0; i < q.n; i++) {
        const ks_agent_record *r = &q.records[i], *r2 = &q2.records[i];
        size_t tl = strlen(r->table), cl = strlen(r->column);
        CHECK(tl >= 1 && cl >= 1 && strlen(r->scope) == tl + 1 + cl);
        CHECK(memcmp(r->scope, r->table, tl) == 0 && r->scope[tl] == '.' &&
              strcmp(r->scope + tl + 1, r->column) == 0);
        CHECK(name_or_empty(r->tenant, KS_TENANT_MAX) && name_or_empty(r->purpose, KS_PURPOSE_MAX));
        CHECK(r->context.len <= KS_CONTEXT_MAX);
        if (verb == KS_AGENT_SEAL || verb == KS_AGENT_SEAL_BATCH) {
            CHECK(r->tenant.len > 0);
        }
        if (verb == KS_AGENT_PARSE) {
            CHECK(r->tenant.len == 0 && r->purpose.len == 0 && r->context.len == 0);
        }
        /* Oracle 3. */
        CHECK(strcmp(r->scope, r2->scope) == 0 && same(r->tenant, r2->tenant) &&
              same(r->purpose, r2->purpose) && same(r->context, r2->context) &&
              same(r->data, r2->data));
        round_trip(r->data); /* oracle 4 */
        round_trip(r->context);
    }
    if (frame) {
        frame_round_trip(&q, body, len);
    }
    ks_agent_request_free(&q);
    ks_agent_request_free(&q2);
    return 0;
}
