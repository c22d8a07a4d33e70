/*
 * migrate/app/app_values.c -- the application API's seal and open calls
 * (keyshift/app.h): each asks the rollout policy what to write or whether
 * it may read, in the column's encoding (binary or base64 text), then
 * seals or opens through the app's current context (ks_seal, ks_open),
 * so the context's health counting sees every call.  The app itself
 * (its keys, policy and thread) is app.c's (app_internal.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/app.h>

#include "../alloc_hook.h"
#include "../crypto/open_parsed.h"
#include "app_internal.h"

/* ---- sealing and opening ------------------------------------------------------- */

/* The class of the envelope whose parsed header is env. */
static void class_of(const ks_envelope *env, ks_rollout_class *c)
{
    memset(c, 0, sizeof *c);
    c->version = env->version;
    c->algorithm = env->algorithm;
    size_t n = env->key_id.len <= KS_KEY_ID_MAX ? env->key_id.len : KS_KEY_ID_MAX;
    if (n > 0) {
        memcpy(c->key_id, env->key_id.ptr, n);
    }
    c->key_version = env->key_version;
}

/* The purpose of r's format-2 envelopes: its own, else the app's, else
 * its column's name (ks_app_record). */
static ks_bytes purpose_of(const ks_app *a, const ks_app_record *r)
{
    if (r->purpose.len > 0) {
        return r->purpose;
    }
    const char *p = a->has_purpose ? a->purpose : r->column;
    return (ks_bytes){(const uint8_t *)p, strlen(p)};
}

/* The largest binary envelope sealing pt_len bytes can give, whatever
 * the class, tenant and context; 0 past the format's limits. */
static size_t binary_max_len(size_t pt_len)
{
    uint8_t id[KS_KEY_ID_MAX], name[KS_TENANT_MAX > KS_PURPOSE_MAX ? KS_TENANT_MAX : KS_PURPOSE_MAX];
    memset(id, 'k', sizeof id);
    memset(name, 'n', sizeof name);
    ks_seal_params p = {KS_FORMAT_V2,      KS_ALG_XCHACHA20POLY1305,
                        {name, KS_TENANT_MAX}, {id, sizeof id},
                        UINT32_MAX,        {name, KS_PURPOSE_MAX},
                        {NULL, 0}};
    return ks_seal_max_len(&p, pt_len);
}

/* v with a NULL ptr when it is empty, as ks_bytes requires: bindings
 * often pass an empty string's pointer. */
static ks_bytes view(ks_bytes v)
{
    return v.len > 0 ? v : (ks_bytes){NULL, 0};
}

/* e, a rollout's answer for c, or when none governs (KS_ERR_NOT_FOUND)
 * the default key's class. */
static ks_err class_or_default(ks_app *a, ks_err e, ks_rollout_class *c)
{
    if (e != KS_ERR_NOT_FOUND) {
        return e;
    }
    if (!a->has_default) {
        return KS_ERR_NO_ROLLOUT;
    }
    memset(c, 0, sizeof *c);
    c->version = a->default_format;
    c->algorithm = a->default_algorithm;
    strcpy(c->key_id, a->default_key_id);
    c->key_version = a->default_key_version; /* 0: the primary, resolved by ks_seal */
    return KS_OK;
}

/* Copy out a plaintext value v[0, v_len) as it is (one the phase reads,
 * or one written before write-upgrade), with the plaintext class. */
static ks_err copy_plaintext(const uint8_t *v, size_t v_len, uint8_t *pt, size_t cap,
                             size_t *pt_len, ks_rollout_class *read)
{
    if (cap < v_len) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    if (v_len > 0) {
        memcpy(pt, v, v_len);
    }
    *pt_len = v_len;
    if (read != NULL) {
        memset(read, 0, sizeof *read);
        read->is_plaintext = 1;
    }
    return KS_OK;
}

/* Seal pt for r in exactly class c (plaintext: pt itself), as
 * ks_app_seal says; the caller checked the arguments. */
static ks_err seal_as(ks_app *app, const ks_app_record *r, ks_rollout_class c, const uint8_t *pt,
                      size_t pt_len, uint8_t *out, size_t cap, size_t *out_len,
                      ks_rollout_class *written)
{
    if (c.is_plaintext) { /* before write-upgrade, or a plaintext kept as it is */
        return copy_plaintext(pt, pt_len, out, cap, out_len, written);
    }
    ks_seal_params p = {c.version, c.algorithm, view(r->tenant),
                        {(const uint8_t *)c.key_id, strlen(c.key_id)}, c.key_version,
                        {NULL, 0}, view(r->context)};
    if (c.version == KS_FORMAT_V2) {
        p.purpose = purpose_of(app, r);
    }
    ks_err e = ks_seal(atomic_load_explicit(&app->cur, memory_order_acquire)->ctx, &p, pt, pt_len,
                       out, cap, out_len);
    if (e == KS_OK && written != NULL) {
        ks_envelope env;
        e = ks_envelope_parse_header(out, *out_len, NULL, &env, NULL);
        assert(e == KS_OK); /* ks_seal writes canonical envelopes */
        class_of(&env, written);
    }
    return e;
}

/* Decode the text envelope v[0, v_len) strictly (ks_envelope_text_decode,
 * the length bounded before anything is decoded [F-TEXT-3]) into a
 * malloc'd *env of *n bytes, which the caller frees (NULL on failure). */
static ks_err text_decode(const uint8_t *v, size_t v_len, uint8_t **env, size_t *n,
                          ks_parse_error *perr)
{
    size_t bound = ks_envelope_text_len(ks_envelope_max_len(NULL));
    size_t need = v_len > bound ? 0 : ks_envelope_text_decoded_max(v_len);
    *n = 0;
    *env = need > 0 ? malloc(need) : NULL;
    if (need > 0 && *env == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_err e = ks_envelope_text_decode(v, v_len, NULL, *env, need, n, perr);
    if (e != KS_OK) {
        free(*env);
        *env = NULL;
        *n = 0;
    }
    return e;
}

/* Nonzero when v[0, v_len) begins with the binary envelope's magic "KSE". */
static int has_magic(const uint8_t *v, size_t v_len)
{
    return v_len >= 3 && v[0] == KS_MAGIC_0 && v[1] == KS_MAGIC_1 && v[2] == KS_MAGIC_2;
}

/* The policy's encoding answer got, with its error e, into *enc: where no
 * rollout covers the column (KS_ERR_NOT_FOUND) or on an error, the app's
 * default_encoding; KS_OK for a column none covers, else e. */
static ks_err encoding_or_default(ks_app *a, ks_err e, ks_value_encoding got, ks_value_encoding *enc)
{
    *enc = e == KS_OK ? got : a->default_encoding;
    return e == KS_ERR_NOT_FOUND ? KS_OK : e;
}

/* How table.column holds envelopes (ks_app_column_encoding): the latest
 * rollout covering it records it; where none does (or without a
 * database), the app's default_encoding.  The policy's errors otherwise
 * (fail closed: no form is guessed). */
static ks_err column_encoding(ks_app *a, const char *table, const char *column,
                              ks_value_encoding *enc)
{
    if (a->policy == NULL) {
        *enc = a->default_encoding;
        return KS_OK;
    }
    ks_value_encoding got;
    ks_err e = ks_policy_column_encoding(a->policy, table, column, &got);
    return encoding_or_default(a, e, got, enc);
}

/* column_encoding of r's column into *enc and what the rollout governing
 * it says to write for r's tenant into *c (under the default key_id when
 * the app has one), from one look at the policy's rules
 * (ks_policy_write_plan): the encoding's errors first, then the class's,
 * KS_ERR_NOT_FOUND among them when no rollout governs (also without a
 * database). */
static ks_err plan_write(ks_app *a, const ks_app_record *r, ks_value_encoding *enc,
                         ks_rollout_class *c)
{
    if (a->policy == NULL) {
        *enc = a->default_encoding;
        return KS_ERR_NOT_FOUND;
    }
    ks_value_encoding got;
    ks_err enc_err;
    ks_err e = ks_policy_write_plan(a->policy, r->table, r->column,
                                    a->has_default ? a->default_key_id : NULL, view(r->tenant), c,
                                    &got, &enc_err);
    enc_err = encoding_or_default(a, enc_err, got, enc);
    return enc_err != KS_OK ? enc_err : e;
}

/* See keyshift/app.h. */
ks_err ks_app_column_encoding(ks_app *app, const char *table, const char *column,
                              ks_value_encoding *out)
{
    if (out != NULL) {
        *out = KS_ENCODING_BINARY;
    }
    if (app == NULL || table == NULL || column == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return column_encoding(app, table, column, out);
}

/* Seal pt for r in exactly class c, in the form enc: binary as seal_as
 * writes it; base64 as the envelope's canonical text [F-TEXT-1], sealed
 * first into a buffer of its own that is wiped before it is freed.  A
 * plaintext class writes pt itself in either form. */
static ks_err seal_in(ks_app *app, const ks_app_record *r, ks_rollout_class c,
                      ks_value_encoding enc, const uint8_t *pt, size_t pt_len, uint8_t *out,
                      size_t cap, size_t *out_len, ks_rollout_class *written)
{
    if (enc == KS_ENCODING_BINARY || c.is_plaintext) {
        return seal_as(app, r, c, pt, pt_len, out, cap, out_len, written);
    }
    assert(enc == KS_ENCODING_BASE64);
    size_t bin_cap = binary_max_len(pt_len);
    if (bin_cap == 0) {
        return KS_ERR_TOO_LARGE;
    }
    uint8_t *bin = malloc(bin_cap);
    if (bin == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    size_t n = 0;
    ks_rollout_class w;
    ks_err e = seal_as(app, r, c, pt, pt_len, bin, bin_cap, &n, &w);
    if (e == KS_OK) {
        e = ks_envelope_text_encode(bin, n, out, cap, &n);
    }
    sodium_memzero(bin, bin_cap);
    free(bin);
    if (e == KS_OK) {
        *out_len = n;
        if (written != NULL) {
            *written = w;
        }
    }
    return e;
}

/* Nonzero when the arguments of a seal or an open are unusable: the app,
 * the record and its names, the input in[0, in_len) (a plaintext or a
 * stored value), the output out[0, cap) and its length. */
static int call_args_bad(const ks_app *app, const ks_app_record *r, const uint8_t *in,
                         size_t in_len, const uint8_t *out, size_t cap, const size_t *out_len)
{
    return app == NULL || r == NULL || r->table == NULL || r->column == NULL || out_len == NULL ||
           (in == NULL && in_len > 0) || (out == NULL && cap > 0);
}

/* See keyshift/app.h. */
ks_err ks_app_seal(ks_app *app, const ks_app_record *r, const uint8_t *pt, size_t pt_len,
                   uint8_t *out, size_t cap, size_t *out_len, ks_rollout_class *written)
{
    if (call_args_bad(app, r, pt, pt_len, out, cap, out_len)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out_len = 0;
    ks_value_encoding enc;
    ks_rollout_class c;
    ks_err e = class_or_default(app, plan_write(app, r, &enc, &c), &c);
    if (e != KS_OK) {
        return e;
    }
    return seal_in(app, r, c, enc, pt, pt_len, out, cap, out_len, written);
}

/* The class of stored value prev[0, prev_len) (NULL: SQL NULL) into *c:
 * plaintext when it does not start with "KSE", else its header's.
 * KS_ERR_NO_ROLLOUT when it has none (NULL, or a header that does not
 * parse): nothing says what to write. */
static ks_err stored_class(const uint8_t *prev, size_t prev_len, ks_rollout_class *c)
{
    memset(c, 0, sizeof *c);
    if (prev == NULL) {
        return KS_ERR_NO_ROLLOUT;
    }
    if (!has_magic(prev, prev_len)) {
        c->is_plaintext = 1;
        return KS_OK;
    }
    ks_envelope env;
    if (ks_envelope_parse_header(prev, prev_len, NULL, &env, NULL) != KS_OK ||
        env.key_id.len == 0 || env.key_id.len > KS_KEY_ID_MAX) {
        return KS_ERR_NO_ROLLOUT;
    }
    class_of(&env, c);
    return KS_OK;
}

/* stored_class of a value held in form enc: in a base64 column, a text
 * envelope [F-TEXT-4] is decoded first (a malformed one, or a binary
 * envelope there, has no class: KS_ERR_NO_ROLLOUT), and any other value
 * is plaintext. */
static ks_err stored_class_in(ks_value_encoding enc, const uint8_t *prev, size_t prev_len,
                              ks_rollout_class *c)
{
    if (enc == KS_ENCODING_BINARY || prev == NULL) {
        return stored_class(prev, prev_len, c);
    }
    memset(c, 0, sizeof *c);
    if (has_magic(prev, prev_len)) {
        return KS_ERR_NO_ROLLOUT;
    }
    if (!ks_envelope_text_is_candidate(prev, prev_len)) {
        c->is_plaintext = 1;
        return KS_OK;
    }
    uint8_t *env;
    size_t n;
    ks_err e = text_decode(prev, prev_len, &env, &n, NULL);
    if (e == KS_OK) {
        e = stored_class(env, n, c);
        free(env);
    }
    return e == KS_ERR_NO_MEMORY ? e : e != KS_OK ? KS_ERR_NO_ROLLOUT : KS_OK;
}

/* See keyshift/app.h. */
ks_err ks_app_seal_update(ks_app *app, const ks_app_record *r, const uint8_t *prev,
                          size_t prev_len, const uint8_t *pt, size_t pt_len, uint8_t *out,
                          size_t cap, size_t *out_len, ks_rollout_class *written)
{
    if (call_args_bad(app, r, pt, pt_len, out, cap, out_len) || (prev == NULL && prev_len > 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out_len = 0;
    ks_value_encoding enc;
    ks_rollout_class c;
    ks_err e = plan_write(app, r, &enc, &c);
    if (e == KS_ERR_NOT_FOUND) { /* no rollout governs: keep the stored form */
        e = stored_class_in(enc, prev, prev_len, &c);
    }
    if (e != KS_OK) {
        return e;
    }
    return seal_in(app, r, c, enc, pt, pt_len, out, cap, out_len, written);
}

/* See keyshift/app.h.  In a base64 column the policy judges the decoded
 * envelope; a text that does not decode, or a binary envelope there
 * [F-TEXT-4], is judged as a malformed value (never readable). */
ks_err ks_app_may_read(ks_app *app, const char *table, const char *column, const uint8_t *v,
                       size_t v_len, int *ok)
{
    static const uint8_t malformed[3] = {KS_MAGIC_0, KS_MAGIC_1, KS_MAGIC_2}; /* no header */
    if (ok != NULL) {
        *ok = 0;
    }
    if (app == NULL || table == NULL || column == NULL || ok == NULL || (v == NULL && v_len > 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (app->policy == NULL) {
        return KS_ERR_NOT_FOUND;
    }
    ks_value_encoding enc;
    ks_err e = column_encoding(app, table, column, &enc);
    if (e != KS_OK) {
        return e;
    }
    ks_bytes b = {v, v_len};
    uint8_t *env = NULL;
    if (enc == KS_ENCODING_BASE64 && v != NULL && has_magic(v, v_len)) {
        b = (ks_bytes){malformed, sizeof malformed};
    } else if (enc == KS_ENCODING_BASE64 && v != NULL && ks_envelope_text_is_candidate(v, v_len)) {
        size_t n = 0;
        e = text_decode(v, v_len, &env, &n, NULL);
        if (e == KS_ERR_NO_MEMORY) {
            return e;
        }
        b = e == KS_OK ? (ks_bytes){env, n} : (ks_bytes){malformed, sizeof malformed};
    }
    e = ks_policy_may_read(app->policy, table, column, v != NULL ? &b : NULL, ok);
    free(env);
    return e;
}

/* Open the binary value v[0, v_len) of r as ks_app_open_value says of a
 * binary column; the caller checked the arguments and zeroed *pt_len. */
static ks_err open_binary(ks_app *app, const ks_app_record *r, const uint8_t *v, size_t v_len,
                          uint8_t *pt, size_t cap, size_t *pt_len, ks_rollout_class *read,
                          ks_parse_error *perr)
{
    ks_open_params op = {view(r->context), view(r->tenant), {NULL, 0}};
    ks_ctx *ctx = atomic_load_explicit(&app->cur, memory_order_acquire)->ctx;
    int magic = has_magic(v, v_len);
    int is_env = 0, malformed = 0, parsed = 0;
    ks_envelope env;
    if (magic) {
        /* One strict parse serves the class check and the open; a value
         * it refuses is classed by its header alone, as the phase check
         * reads it, and ks_open below refuses it, counting the error. */
        parsed = ks_crypto_parse(ctx, v, v_len, &env, NULL) == KS_OK;
        malformed = !parsed && ks_envelope_parse_header(v, v_len, NULL, &env, NULL) != KS_OK;
        is_env = !malformed;
    }
    if (is_env && env.version > app->max_format) {
        if (perr != NULL) {
            *perr = (ks_parse_error){KS_ERR_UNSUPPORTED_VERSION, 3, 0};
        }
        return KS_ERR_UNSUPPORTED_VERSION; /* not what this instance registered to read */
    }
    int plaintext_ok = 0;
    if (app->policy != NULL && !malformed) {
        ks_bytes b = {v, v_len};
        ks_rollout_class c;
        int ok = 0;
        if (parsed) {
            class_of(&env, &c); /* its class without a second parse */
        }
        ks_err e = parsed ? ks_policy_may_read_class(app->policy, r->table, r->column, &c, &ok)
                          : ks_policy_may_read(app->policy, r->table, r->column, &b, &ok);
        if (e == KS_OK && !ok) {
            return KS_ERR_PHASE;
        }
        if (e != KS_OK && e != KS_ERR_NOT_FOUND) {
            return e;
        }
        plaintext_ok = e == KS_OK && !is_env;
    }
    if (plaintext_ok) { /* the phase still reads plaintext */
        return copy_plaintext(v, v_len, pt, cap, pt_len, read);
    }
    if (is_env && env.version == KS_FORMAT_V2) {
        op.purpose = purpose_of(app, r);
    }
    ks_err e = parsed ? ks_crypto_open_parsed(ctx, v, &env, &op, pt, cap, pt_len)
                      : ks_open(ctx, v, v_len, &op, pt, cap, pt_len, perr);
    if (e == KS_OK && read != NULL) {
        class_of(&env, read);
    }
    return e;
}

/* Open the stored text v[0, v_len) of r as ks_app_open_text says; the
 * caller checked the arguments and zeroed *pt_len.  The decoded
 * envelope goes through open_binary, so the phase, the counts and the
 * open are exactly a binary value's. */
static ks_err open_text(ks_app *app, const ks_app_record *r, const uint8_t *v, size_t v_len,
                        uint8_t *pt, size_t cap, size_t *pt_len, ks_rollout_class *read,
                        ks_parse_error *perr)
{
    if (has_magic(v, v_len)) {
        if (perr != NULL) { /* [F-TEXT-4] a binary envelope: malformed here */
            *perr = (ks_parse_error){KS_ERR_BAD_MAGIC, 0, 0};
        }
        return KS_ERR_BAD_MAGIC;
    }
    if (!ks_envelope_text_is_candidate(v, v_len)) {
        /* [F-TEXT-4] plaintext: read as the phase allows (the empty view
         * stands for the class) */
        int ok = 0;
        ks_bytes none = {NULL, 0};
        ks_err e = app->policy != NULL
                       ? ks_policy_may_read(app->policy, r->table, r->column, &none, &ok)
                       : KS_ERR_NOT_FOUND;
        if (e == KS_OK && !ok) {
            return KS_ERR_PHASE;
        }
        if (e == KS_ERR_NOT_FOUND) {
            static const uint8_t magic[KS_TEXT_MAGIC_LEN] = {'S', '1', 'N', 'F'};
            size_t i = 0;
            while (i < v_len && i < sizeof magic && v[i] == magic[i]) {
                i++;
            }
            e = i < v_len ? KS_ERR_BAD_MAGIC : KS_ERR_TRUNCATED;
            if (perr != NULL) {
                *perr = (ks_parse_error){e, i < v_len ? i : 0, 0};
            }
            return e;
        }
        return e != KS_OK ? e : copy_plaintext(v, v_len, pt, cap, pt_len, read);
    }
    uint8_t *env;
    size_t n = 0;
    ks_err e = text_decode(v, v_len, &env, &n, perr);
    if (e == KS_OK) {
        e = open_binary(app, r, env, n, pt, cap, pt_len, read, perr);
        free(env);
    }
    return e;
}

/* See keyshift/app.h. */
ks_err ks_app_open_value(ks_app *app, const ks_app_record *r, const uint8_t *v, size_t v_len,
                         uint8_t *pt, size_t cap, size_t *pt_len, ks_rollout_class *read,
                         ks_parse_error *perr)
{
    if (call_args_bad(app, r, v, v_len, pt, cap, pt_len)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *pt_len = 0;
    ks_value_encoding enc;
    ks_err e = column_encoding(app, r->table, r->column, &enc);
    if (e != KS_OK) {
        return e;
    }
    return enc == KS_ENCODING_BASE64 ? open_text(app, r, v, v_len, pt, cap, pt_len, read, perr)
                                     : open_binary(app, r, v, v_len, pt, cap, pt_len, read, perr);
}

/* Seal (seal != 0) or open items[0, n) of table.column, each item on its
 * own: the batch forms' one loop. */
static ks_err run_batch(ks_app *app, const char *table, const char *column, ks_app_item *items,
                        size_t n, int seal)
{
    if (app == NULL || table == NULL || column == NULL || (items == NULL && n > 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err first = KS_OK;
    for (size_t i = 0; i < n; i++) {
        ks_app_item *it = &items[i];
        ks_app_record r = {table, column, it->tenant, it->context, it->purpose};
        it->err = seal ? ks_app_seal(app, &r, it->in.ptr, it->in.len, it->out, it->cap,
                                     &it->out_len, &it->cls)
                       : ks_app_open_value(app, &r, it->in.ptr, it->in.len, it->out, it->cap,
                                           &it->out_len, &it->cls, NULL);
        if (first == KS_OK) {
            first = it->err;
        }
    }
    return first;
}

/* See keyshift/app.h. */
ks_err ks_app_seal_batch(ks_app *app, const char *table, const char *column, ks_app_item *items,
                         size_t n)
{
    return run_batch(app, table, column, items, n, 1);
}

/* See keyshift/app.h. */
ks_err ks_app_open_batch(ks_app *app, const char *table, const char *column, ks_app_item *items,
                         size_t n)
{
    return run_batch(app, table, column, items, n, 0);
}

/* See keyshift/app.h: the bound of the text form, which is above the
 * binary form's and the plaintext's. */
size_t ks_app_seal_max_len(size_t pt_len)
{
    size_t bin = binary_max_len(pt_len);
    size_t text = ks_envelope_text_len(bin);
    return bin == 0 || text == 0 ? 0 : (text > pt_len ? text : pt_len);
}

/* See keyshift/app.h. */
size_t ks_app_seal_text_max_len(size_t pt_len)
{
    return ks_app_seal_max_len(pt_len);
}

/* See keyshift/app.h. */
ks_err ks_app_seal_text(ks_app *app, const ks_app_record *r, const uint8_t *pt, size_t pt_len,
                        uint8_t *out, size_t cap, size_t *out_len, ks_rollout_class *written)
{
    if (call_args_bad(app, r, pt, pt_len, out, cap, out_len)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out_len = 0;
    ks_value_encoding recorded; /* a text seal is base64 whatever the column records */
    ks_rollout_class c;
    ks_err e = class_or_default(app, plan_write(app, r, &recorded, &c), &c);
    if (e != KS_OK) {
        return e;
    }
    return seal_in(app, r, c, KS_ENCODING_BASE64, pt, pt_len, out, cap, out_len, written);
}

/* See keyshift/app.h. */
ks_err ks_app_open_text(ks_app *app, const ks_app_record *r, const uint8_t *v, size_t v_len,
                        uint8_t *pt, size_t cap, size_t *pt_len, ks_rollout_class *read,
                        ks_parse_error *perr)
{
    if (call_args_bad(app, r, v, v_len, pt, cap, pt_len)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *pt_len = 0;
    return open_text(app, r, v, v_len, pt, cap, pt_len, read, perr);
}

