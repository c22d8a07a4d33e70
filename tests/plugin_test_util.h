/*
 * tests/plugin_test_util.h -- what tests/test_plugin_proto.c and
 * fuzz/fuzz_plugin_resp.c share: the buffers a plugin response is read
 * into, and one read with those buffers first filled with a pattern (so
 * that a wipe on refusal is seen).
 *
 * Everything is static inline (no warning when a helper is not used).
 */
#ifndef KS_TESTS_PLUGIN_TEST_UTIL_H
#define KS_TESTS_PLUGIN_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../migrate/keys/plugin_proto.h"

/* The buffers of one read, the response and the refusal. */
typedef struct kp_reply {
    uint8_t dek[KS_DEK_LEN];
    uint8_t wrapped[KS_KP_WRAPPED_MAX];
    ks_kp_response r;
    ks_kp_error e;
} kp_reply;

/* Read buf[0, n) as the response to ctx into *rp, its buffers first
 * filled with a pattern and its response with garbage; err is passed as
 * NULL unless with_err. */
static inline ks_err kp_read(kp_reply *rp, const void *buf, size_t n, const ks_kp_request_ctx *ctx,
                             int with_err)
{
    memset(rp->dek, 0xA5, sizeof rp->dek);
    memset(rp->wrapped, 0x5A, sizeof rp->wrapped);
    memset(&rp->r, 0x77, sizeof rp->r);
    rp->r.dek = rp->dek;
    rp->r.wrapped = rp->wrapped;
    rp->r.wrapped_cap = sizeof rp->wrapped;
    return ks_kp_parse_response(buf, n, ctx, &rp->r, with_err ? &rp->e : NULL);
}

#endif /* KS_TESTS_PLUGIN_TEST_UTIL_H */
