/*
 * ksgo.c -- the C side of the Go package: each call builds the library's
 * structures from a Go caller's buffers for the duration of one call, so
 * that no Go pointer is ever stored in C memory (the cgo pointer rules).
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "ksgo.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <keyshift/app.h>

/* The negative result for e (ksgo.h), with the parser's offset when pe
 * holds one for e. */
static int64_t ksgo_fail(ks_err e, const ks_parse_error *pe)
{
	int64_t off = 0;
	if (pe != NULL && pe->code == e && e >= 1 && e <= 31) {
		off = (int64_t)pe->offset + 1;
	}
	return -(int64_t)((uint64_t)e | ((uint64_t)off << 16));
}

/* Copy name[0, n) into buf with its NUL; 0 when it does not fit. */
static int ksgo_name(char buf[KS_ROLLOUT_IDENT_MAX + 1], const char *name, size_t n)
{
	if (n > KS_ROLLOUT_IDENT_MAX || (n > 0 && memchr(name, 0, n) != NULL)) {
		return 0;
	}
	if (n > 0) {
		memcpy(buf, name, n);
	}
	buf[n] = 0;
	return 1;
}

/* ks_app_seal (seal != 0; the class written to *written when not NULL)
 * or ks_app_open_value with the record built here from its parts: every
 * pointer is the caller's for this call only. */
int64_t ksgo_call(uintptr_t app_handle, int seal, const char *table, size_t table_len,
                  const char *column, size_t column_len, const uint8_t *tenant, size_t tenant_len,
                  const uint8_t *context, size_t context_len, const uint8_t *purpose,
                  size_t purpose_len, const uint8_t *in, size_t in_len, uint8_t *out, size_t cap,
                  ks_rollout_class *written)
{
	char t[KS_ROLLOUT_IDENT_MAX + 1], c[KS_ROLLOUT_IDENT_MAX + 1];
	if (!ksgo_name(t, table, table_len) || !ksgo_name(c, column, column_len)) {
		return ksgo_fail(KS_ERR_INVALID_ARGUMENT, NULL);
	}
	ks_app *app = (ks_app *)app_handle;
	ks_app_record r = {t, c, {tenant, tenant_len}, {context, context_len},
			   {purpose, purpose_len}};
	size_t n = 0;
	ks_parse_error pe = {0};
	ks_err e = seal ? ks_app_seal(app, &r, in, in_len, out, cap, &n, written)
			: ks_app_open_value(app, &r, in, in_len, out, cap, &n, NULL, &pe);
	return e == KS_OK ? (int64_t)n : ksgo_fail(e, &pe);
}

/* ks_app_seal_batch (seal != 0) or ks_app_open_batch over items[0, n),
 * whose fields lie in in[] and whose outputs go to out[].  The ks_app_item
 * array is C memory, freed before return; it points into in and out only
 * during this call. */
ks_err ksgo_batch(uintptr_t app_handle, int seal, const char *table, size_t table_len,
			 const char *column, size_t column_len, const uint8_t *in, uint8_t *out,
			 ksgo_item *items, size_t n)
{
	char t[KS_ROLLOUT_IDENT_MAX + 1], c[KS_ROLLOUT_IDENT_MAX + 1];
	if (!ksgo_name(t, table, table_len) || !ksgo_name(c, column, column_len)) {
		return KS_ERR_INVALID_ARGUMENT;
	}
	ks_app_item *a = calloc(n ? n : 1, sizeof *a);
	if (a == NULL) {
		return KS_ERR_NO_MEMORY;
	}
	for (size_t i = 0; i < n; i++) {
		a[i].tenant = (ks_bytes){in + items[i].tenant_off, items[i].tenant_len};
		a[i].context = (ks_bytes){in + items[i].context_off, items[i].context_len};
		a[i].purpose = (ks_bytes){in + items[i].purpose_off, items[i].purpose_len};
		a[i].in = (ks_bytes){in + items[i].in_off, items[i].in_len};
		a[i].out = out + items[i].out_off;
		a[i].cap = items[i].out_cap;
	}
	ks_app *app = (ks_app *)app_handle;
	ks_err e = seal ? ks_app_seal_batch(app, t, c, a, n) : ks_app_open_batch(app, t, c, a, n);
	for (size_t i = 0; i < n; i++) {
		items[i].result = a[i].err == KS_OK ? (int64_t)a[i].out_len : ksgo_fail(a[i].err, NULL);
	}
	free(a);
	return e;
}

/* Lay out the outputs of items[0, n) (their in_len set) one after the
 * other: each item's out_cap (ks_app_seal_max_len when sealing, else its
 * input's length) and out_off; returns the total, or UINT64_MAX when an
 * input is past the format's limits. */
uint64_t ksgo_layout(int seal, ksgo_item *items, size_t n)
{
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t cap = items[i].in_len;
		if (seal) {
			cap = ks_app_seal_max_len((size_t)items[i].in_len);
			if (cap == 0) {
				return UINT64_MAX;
			}
		}
		items[i].out_off = off;
		items[i].out_cap = cap;
		off += cap;
	}
	return off;
}

/* ks_app_parse; the result as ksgo_call's. */
int64_t ksgo_parse(const uint8_t *v, size_t v_len, ks_app_header *h)
{
	ks_parse_error pe = {0};
	ks_err e = ks_app_parse(v, v_len, h, &pe);
	return e == KS_OK ? 0 : ksgo_fail(e, &pe);
}

/* Copy n bytes of a Go slice into fresh C memory (NULL on failure); the
 * caller wipes and frees it with ksgo_free_wiped. */
uint8_t *ksgo_dup(const uint8_t *p, size_t n)
{
	uint8_t *c = malloc(n ? n : 1);
	if (c != NULL && n > 0) {
		memcpy(c, p, n);
	}
	return c;
}

/* Wipe p[0, n) and free it. */
void ksgo_free_wiped(void *p, size_t n)
{
	if (p != NULL) {
		explicit_bzero(p, n); /* not optimised away */
		free(p);
	}
}

/* Seal (seal != 0) or open in[0, in_len) iters times into out from C,
 * for the benchmarks: the library's own cost, without a cgo crossing per
 * call.  Returns the first error, or KS_OK. */
ks_err ksgo_bench_loop(uintptr_t app_handle, int seal, const uint8_t *in, size_t in_len,
                       uint8_t *out, size_t cap, uint64_t iters)
{
	ks_app_record r = {"payments", "card", {(const uint8_t *)"acme", 4},
			   {(const uint8_t *)"payments:42:card", 16}, {(const uint8_t *)"card", 4}};
	size_t n = 0;
	for (uint64_t i = 0; i < iters; i++) {
		ks_err e = seal ? ks_app_seal((ks_app *)app_handle, &r, in, in_len, out, cap, &n, NULL)
				: ks_app_open_value((ks_app *)app_handle, &r, in, in_len, out, cap, &n,
						    NULL, NULL);
		if (e != KS_OK) {
			return e;
		}
	}
	return KS_OK;
}
