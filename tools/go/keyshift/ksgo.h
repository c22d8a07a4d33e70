/*
 * ksgo.h -- the C helpers of the Go package (ksgo.c).  Results of a seal,
 * an open or a parse come back as one int64_t, so that no pointer to a Go
 * result variable crosses into C (which would move it to the heap): >= 0
 * the output's length; < 0 -(err | (offset + 1) << 16), offset + 1 being
 * 0 when the error has no byte offset.  The ks_app comes as a uintptr_t:
 * a C pointer argument would make cgo check it, which costs a Go heap
 * allocation per call.
 */
#ifndef KSGO_H
#define KSGO_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <keyshift/app.h>

/* One batch item as Go lays it out: offsets into one input and one output
 * buffer, so that the item array holds no pointer at all. */
typedef struct ksgo_item {
	uint64_t tenant_off, tenant_len, context_off, context_len, purpose_off, purpose_len;
	uint64_t in_off, in_len, out_off, out_cap;
	int64_t result; /* set: as ksgo_call's result */
} ksgo_item;

int64_t ksgo_call(uintptr_t app_handle, int seal, const char *table, size_t table_len,
                  const char *column, size_t column_len, const uint8_t *tenant, size_t tenant_len,
                  const uint8_t *context, size_t context_len, const uint8_t *purpose,
                  size_t purpose_len, const uint8_t *in, size_t in_len, uint8_t *out, size_t cap,
                  ks_rollout_class *written);
ks_err ksgo_batch(uintptr_t app_handle, int seal, const char *table, size_t table_len, const char *column,
                  size_t column_len, const uint8_t *in, uint8_t *out, ksgo_item *items, size_t n);
uint64_t ksgo_layout(int seal, ksgo_item *items, size_t n);
ks_err ksgo_bench_loop(uintptr_t app_handle, int seal, const uint8_t *in, size_t in_len,
                       uint8_t *out, size_t cap, uint64_t iters);
int64_t ksgo_parse(const uint8_t *v, size_t v_len, ks_app_header *h);
uint8_t *ksgo_dup(const uint8_t *p, size_t n);
void ksgo_free_wiped(void *p, size_t n);
#endif
