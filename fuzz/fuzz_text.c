/*
 * fuzz/fuzz_text.c -- the text form of an envelope (docs/format.md
 * section 10): the strict base64 decoder of parser/text.c and the
 * canonical encoder of format/text.c, on arbitrary bytes.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. Decode under the defaults into an exactly sized, zeroed buffer.  A
 *      rejection is truncated at len (len not a multiple of 4), or
 *      bad-value at an offset below len, field 0, *out_len 0 and the
 *      buffer zero again [F-TEXT-2].  An acceptance has len a multiple of
 *      4 and out_len = len / 4 * 3 minus the padding.
 *   2. Round trip: re-encoding an accepted text gives the identical bytes
 *      (one text per envelope, [F-TEXT-1]); a buffer one byte short gives
 *      buffer-too-small and writes nothing.
 *   3. Differential: libsodium's sodium_base642bin, variant ORIGINAL (with
 *      padding), no ignored characters and the whole input consumed,
 *      accepts exactly the same inputs and gives the same bytes.  libsodium
 *      is used here only, as the independent decoder.  One divergence is
 *      allowed: libsodium 1.0.18 takes every byte from 0x80 up for '/',
 *      so an input holding one is only required to be rejected here.
 *   4. Lowered limits (max_ciphertext 16): an input above the lowered
 *      bound is too-large at 0 without being read; any other input gets
 *      the defaults' result [F-TEXT-3].
 *   5. Classification [F-TEXT-4]: an accepted text begins with "S1NF" if
 *      and only if its bytes begin with "KSE"; the decoded bytes are parsed
 *      as an envelope, and one that parses came from an "S1NF" text.
 *   6. The input as envelope bytes: encoding it gives
 *      ks_envelope_text_len(size) characters that decode back to it.
 *   7. The migration engine's reading and writing of a base64 column
 *      (migrate/engine/engine.h): ks_engine_value_env takes the input for
 *      an envelope exactly when it begins "S1NF", with the decoder's
 *      result and bytes, or "KSE", as bad-magic; ks_engine_encode_value
 *      writes, after the bytes already in its buffer (kept), the public
 *      encoder's text.
 *   8. Once per process: caller errors (NULL pointers, bad limits, a
 *      short buffer, a length too large to encode) are caller errors.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../migrate/engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

/* Nonzero when every byte of b[0, n) is zero. */
static int all_zero(const uint8_t *b, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc |= b[i];
    }
    return acc == 0;
}

/* Nonzero when some byte of b[0, n) is 0x80 or above. */
static int memchr_high(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (b[i] >= 0x80) {
            return 1;
        }
    }
    return 0;
}

/* Oracle 7: the engine's view of data[0, size) as a value of a base64
 * column, against the decoder's result e and bytes out[0, n). */
static void check_engine(const uint8_t *data, size_t size, ks_err e, const uint8_t *out,
                         size_t n)
{
    ks_value v = {KS_VALUE_TEXT, 0, {data, size}};
    uint8_t *buf = NULL;
    size_t cap = 0;
    ks_bytes env;
    ks_err perr = KS_ERR_STORE;
    int is = ks_engine_value_env(KS_ENCODING_BASE64, &v, &buf, &cap, &env, &perr);
    int kse = size >= 3 && data[0] == KS_MAGIC_0 && data[1] == KS_MAGIC_1 && data[2] == KS_MAGIC_2;
    CHECK(is == (kse || ks_envelope_text_is_candidate(data, size)));
    if (kse) {
        CHECK(perr == KS_ERR_BAD_MAGIC); /* a binary envelope: malformed here */
    } else if (is) {
        CHECK(perr == e);
        CHECK(e != KS_OK || (env.len == n && (n == 0 || memcmp(env.ptr, out, n) == 0)));
    }
    free(buf);
    /* writing: the input's bytes after a one-byte prefix */
    size_t len = size, bcap = size + 1;
    uint8_t *w = malloc(bcap);
    CHECK(w != NULL);
    w[0] = 'P';
    memcpy(w + 1, data, size);
    CHECK(ks_engine_encode_value(KS_ENCODING_BINARY, &w, &bcap, 1, &len) == KS_OK && len == size);
    ks_err we = ks_engine_encode_value(KS_ENCODING_BASE64, &w, &bcap, 1, &len);
    CHECK(size == 0 ? we == KS_ERR_TOO_LARGE : we == KS_OK);
    if (we == KS_OK) {
        size_t tn = ks_envelope_text_len(size), got = 0;
        uint8_t *ref = malloc(tn);
        CHECK(ref != NULL && len == tn && w[0] == 'P');
        CHECK(ks_envelope_text_encode(data, size, ref, tn, &got) == KS_OK && got == tn);
        CHECK(memcmp(w + 1, ref, tn) == 0);
        free(ref);
    }
    free(w);
}

/* Oracles 1 to 5 on data[0, size) as a text. */
static void check_decode(const uint8_t *data, size_t size)
{
    size_t cap = ks_envelope_text_decoded_max(size);
    uint8_t *out = calloc(1, cap + 1);
    CHECK(out != NULL);
    size_t n = 12345;
    ks_parse_error pe = {KS_OK, 0, 99};
    ks_err e = ks_envelope_text_decode(data, size, NULL, out, cap, &n, &pe);

    /* 3: libsodium, the independent decoder. */
    uint8_t *ref = malloc(cap + 1);
    CHECK(ref != NULL);
    size_t ref_len = 0;
    int ref_rc = sodium_base642bin(ref, cap + 1, (const char *)data, size, NULL, &ref_len, NULL,
                                   sodium_base64_VARIANT_ORIGINAL);
    /* libsodium 1.0.18 decodes every byte from 0x80 up as '/' (its
     * character test sees a negative char): such inputs are the one
     * allowed divergence, and keyshift must reject them. */
    if (memchr_high(data, size)) {
        CHECK(e != KS_OK);
    } else {
        CHECK((e == KS_OK) == (ref_rc == 0));
    }

    if (e != KS_OK) {
        /* 1: the rejection's shape. */
        CHECK(pe.code == e && pe.field == 0 && n == 0);
        CHECK((e == KS_ERR_TRUNCATED && size % 4 != 0 && pe.offset == size) ||
              (e == KS_ERR_BAD_VALUE && size % 4 == 0 && pe.offset < size));
        CHECK(all_zero(out, cap + 1));
    } else {
        size_t pads = size == 0 ? 0 : (data[size - 1] == '=') + (data[size - 2] == '=');
        CHECK(size % 4 == 0 && n == size / 4 * 3 - pads && out[cap] == 0);
        CHECK(ref_len == n && memcmp(ref, out, n) == 0);
        /* 2: the round trip. */
        uint8_t *back = malloc(size + 1);
        CHECK(back != NULL);
        size_t bn = 0;
        CHECK(ks_envelope_text_encode(out, n, back, size, &bn) == KS_OK);
        CHECK(bn == size && ks_envelope_text_len(n) == size && memcmp(back, data, size) == 0);
        if (size > 0) {
            memset(back, 0, size + 1);
            CHECK(ks_envelope_text_encode(out, n, back, size - 1, &bn) ==
                  KS_ERR_BUFFER_TOO_SMALL);
            CHECK(bn == 0 && all_zero(back, size + 1));
        }
        free(back);
        /* 5: classification. */
        int kse = n >= 3 && out[0] == KS_MAGIC_0 && out[1] == KS_MAGIC_1 && out[2] == KS_MAGIC_2;
        CHECK(ks_envelope_text_is_candidate(data, size) == kse);
        ks_envelope env;
        if (ks_envelope_parse(out, n, NULL, &env, NULL) == KS_OK) {
            CHECK(kse && env.total_len == n);
        }
    }

    check_engine(data, size, e, out, n);

    /* 4: lowered limits. */
    ks_limits lim;
    ks_limits_default(&lim);
    lim.max_ciphertext = KS_TAG_LEN;
    size_t bound = ks_envelope_text_len(ks_envelope_max_len(&lim));
    memset(out, 0, cap + 1);
    size_t n2 = 0;
    ks_parse_error pe2 = {KS_OK, 0, 0};
    ks_err e2 = ks_envelope_text_decode(data, size, &lim, out, cap, &n2, &pe2);
    if (size > bound) {
        CHECK(e2 == KS_ERR_TOO_LARGE && pe2.offset == 0 && n2 == 0 && all_zero(out, cap + 1));
    } else {
        CHECK(e2 == e && n2 == n && (e != KS_OK ? pe2.offset == pe.offset : 1));
    }
    free(ref);
    free(out);
}

/* Oracle 8, once per process: caller errors are caller errors, whatever
 * the input: NULL pointers and bad limits are invalid-argument, a short
 * buffer is buffer-too-small, a length whose text would not fit in a
 * size_t has no text. */
static void check_caller_errors(void)
{
    uint8_t b[8] = "S1NFAA==";
    size_t n = 0;
    ks_limits bad;
    ks_limits_default(&bad);
    bad.max_tenant = 0;
    CHECK(ks_envelope_text_decode(NULL, 4, NULL, b, 3, &n, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_decode(b, 8, NULL, b, 6, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_decode(b, 8, NULL, NULL, 6, &n, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_decode(b, 8, &bad, b, 6, &n, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_decode(b, 8, NULL, b, 5, &n, NULL) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_envelope_text_encode(NULL, 1, b, 8, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_encode(b, 1, NULL, 8, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_encode(b, 1, b, 8, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_encode(b, SIZE_MAX, b, 8, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_text_len(SIZE_MAX) == 0 && ks_envelope_text_len(0) == 0);
    CHECK(!ks_envelope_text_is_candidate(NULL, 4));
}

/* Oracle 6 on data[0, size) as envelope bytes. */
static void check_encode(const uint8_t *data, size_t size)
{
    size_t tn = ks_envelope_text_len(size);
    uint8_t *text = malloc(tn + 1);
    uint8_t *back = malloc(size + 3); /* ks_envelope_text_decoded_max(tn) <= size + 2 */
    CHECK(text != NULL && back != NULL);
    size_t got = 0, bn = 0;
    CHECK(ks_envelope_text_encode(data, size, text, tn, &got) == KS_OK && got == tn);
    CHECK(ks_envelope_text_decode(text, tn, NULL, back, size + 3, &bn, NULL) == KS_OK);
    CHECK(bn == size && memcmp(back, data, size) == 0);
    free(text);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        CHECK(sodium_init() >= 0);
        check_caller_errors();
        ready = 1;
    }
    check_decode(data, size);
    check_encode(data, size);
    return 0;
}
