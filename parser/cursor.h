/*
 * parser/cursor.h -- the one cursor type for reading untrusted bytes.
 *
 * Modelled on s2n_stuffer and aws_byte_cursor:
 *   - every read checks `n > remaining`, never `pos + n`, so no addition can
 *     overflow;
 *   - a read that fails leaves the cursor exactly as it was, so the caller
 *     can report the offset of the element that failed;
 *   - a length-prefixed region is read through a sub-cursor, which the caller
 *     must consume exactly (ks_cursor_is_empty).
 *
 * Offsets reported by a cursor are absolute: relative to the start of the
 * outermost input, including for sub-cursors.  Internal header: all static
 * inline; no allocation, no libc beyond the types.
 *
 * The comments that open with an at sign are ACSL contracts, for Frama-C
 * (`make prove`, docs/fuzzing.md "Proof"): WP proves each function
 * against its contract, and Eva checks every call's precondition in the
 * parser.  A compiler sees comments only.
 */
#ifndef KS_PARSER_CURSOR_H
#define KS_PARSER_CURSOR_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include <keyshift/common.h>
#include <keyshift/error.h>

typedef struct ks_cursor {
    const uint8_t *buf; /* first byte of this cursor's region */
    size_t len;         /* bytes in the region */
    size_t pos;         /* bytes consumed, 0 <= pos <= len */
    size_t base;        /* absolute offset of buf[0] in the outermost input */
} ks_cursor;

/*@ // The cursor's invariant: pos <= len, every byte of the region
    // readable, and every absolute offset representable in a size_t.
    predicate ks_cursor_inv{L}(ks_cursor *c) =
      \valid_read(c) && c->pos <= c->len && c->base + c->len <= SIZE_MAX &&
      \valid_read(c->buf + (0 .. c->len - 1));
*/

/* A cursor over buf[0, len) at absolute offset 0. */
/*@ requires len == 0 || \valid_read(buf + (0 .. len - 1));
    assigns \nothing;
    ensures \result.buf == buf && \result.len == len;
    ensures \result.pos == 0 && \result.base == 0;
*/
static inline ks_cursor ks_cursor_init(const uint8_t *buf, size_t len)
{
    ks_cursor c = {buf, len, 0, 0};
    assert(buf != NULL || len == 0);
    return c;
}

/* Bytes not yet consumed. */
/*@ requires \valid_read(c) && c->pos <= c->len;
    assigns \nothing;
    ensures \result == c->len - c->pos;
*/
static inline size_t ks_cursor_remaining(const ks_cursor *c)
{
    assert(c->pos <= c->len);
    return c->len - c->pos;
}

/* Nonzero when every byte has been consumed. */
/*@ requires \valid_read(c) && c->pos <= c->len;
    assigns \nothing;
    ensures \result != 0 <==> c->pos == c->len;
*/
static inline int ks_cursor_is_empty(const ks_cursor *c)
{
    return ks_cursor_remaining(c) == 0;
}

/* Absolute offset of the next byte to be read. */
/*@ requires \valid_read(c) && c->base + c->pos <= SIZE_MAX;
    assigns \nothing;
    ensures \result == c->base + c->pos;
*/
static inline size_t ks_cursor_offset(const ks_cursor *c)
{
    return c->base + c->pos;
}

/* Read one byte.  KS_ERR_TRUNCATED, cursor unchanged, when none is left. */
/*@ requires \valid(c) && ks_cursor_inv(c) && \valid(out) && \separated(c, out);
    assigns c->pos, *out;
    ensures ks_cursor_inv(c);
    behavior empty:
      assumes c->pos == c->len;
      assigns \nothing;
      ensures \result == KS_ERR_TRUNCATED;
    behavior byte:
      assumes c->pos < c->len;
      ensures \result == KS_OK && c->pos == \old(c->pos) + 1;
      ensures *out == \old(c->buf[c->pos]);
    complete behaviors;
    disjoint behaviors;
*/
static inline ks_err ks_cursor_read_u8(ks_cursor *c, uint8_t *out)
{
    if (1 > ks_cursor_remaining(c)) {
        return KS_ERR_TRUNCATED;
    }
    *out = c->buf[c->pos];
    c->pos++;
    return KS_OK;
}

/* Read a view of the next n bytes, without copying.  KS_ERR_TRUNCATED,
 * cursor unchanged, when fewer than n remain. */
/*@ requires \valid(c) && ks_cursor_inv(c) && \valid(out) && \separated(c, out);
    assigns c->pos, *out;
    ensures ks_cursor_inv(c);
    behavior short:
      assumes n > c->len - c->pos;
      assigns \nothing;
      ensures \result == KS_ERR_TRUNCATED;
    behavior view:
      assumes n <= c->len - c->pos;
      ensures \result == KS_OK && c->pos == \old(c->pos) + n && out->len == n;
      ensures n == 0 ==> out->ptr == \null;
      ensures n != 0 ==> out->ptr == c->buf + \old(c->pos);
      ensures \valid_read(out->ptr + (0 .. n - 1));
    complete behaviors;
    disjoint behaviors;
*/
static inline ks_err ks_cursor_read_view(ks_cursor *c, size_t n, ks_bytes *out)
{
    if (n > ks_cursor_remaining(c)) {
        return KS_ERR_TRUNCATED;
    }
    out->ptr = n == 0 ? NULL : c->buf + c->pos;
    out->len = n;
    c->pos += n;
    return KS_OK;
}

/* Split off the next n bytes as a sub-cursor and advance past them.
 * KS_ERR_TRUNCATED, cursor unchanged, when fewer than n remain. */
/*@ requires \valid(c) && ks_cursor_inv(c) && \valid(sub) && \separated(c, sub);
    assigns c->pos, *sub;
    ensures ks_cursor_inv(c);
    behavior short:
      assumes n > c->len - c->pos;
      assigns \nothing;
      ensures \result == KS_ERR_TRUNCATED;
    behavior sub:
      assumes n <= c->len - c->pos;
      ensures \result == KS_OK && c->pos == \old(c->pos) + n;
      ensures sub->buf == c->buf + \old(c->pos) && sub->len == n && sub->pos == 0;
      ensures sub->base == \old(c->base + c->pos);
      ensures ks_cursor_inv(sub);
    complete behaviors;
    disjoint behaviors;
*/
static inline ks_err ks_cursor_read_sub(ks_cursor *c, size_t n, ks_cursor *sub)
{
    if (n > ks_cursor_remaining(c)) {
        return KS_ERR_TRUNCATED;
    }
    sub->buf = c->buf + c->pos;
    sub->len = n;
    sub->pos = 0;
    sub->base = ks_cursor_offset(c);
    c->pos += n;
    return KS_OK;
}

/*
 * Read a canonical protobuf varint whose value fits in 32 bits
 * [F-VARINT-1..4]:
 *   - KS_ERR_TRUNCATED when the input ends before a byte without the
 *     continuation bit;
 *   - KS_ERR_VARINT_OVERFLOW when the fifth byte has the continuation bit or
 *     carries bits above 2^32-1 (any varint longer than five bytes is
 *     reported here, at its fifth byte's verdict);
 *   - KS_ERR_NONCANONICAL_VARINT when a byte after the first is a final 0x00,
 *     i.e. the value has a shorter encoding.
 * On any failure the cursor is unchanged, so ks_cursor_offset() is the
 * varint's first byte.  Reads at most five bytes.
 */
/*@ requires \valid(c) && ks_cursor_inv(c) && \valid(out) && \separated(c, out);
    assigns c->pos, *out;
    ensures ks_cursor_inv(c);
    ensures \result == KS_OK || \result == KS_ERR_TRUNCATED ||
            \result == KS_ERR_VARINT_OVERFLOW || \result == KS_ERR_NONCANONICAL_VARINT;
    ensures \result != KS_OK ==> c->pos == \old(c->pos);
    ensures \result == KS_OK ==> \old(c->pos) < c->pos <= \old(c->pos) + 5;
*/
static inline ks_err ks_cursor_read_varint32(ks_cursor *c, uint32_t *out)
{
    const size_t avail = ks_cursor_remaining(c);
    const uint8_t *p = c->buf + c->pos;
    uint32_t v = 0;

    /* Fast path: a one-byte varint (tags, and most values and lengths). */
    if (avail > 0 && p[0] < 0x80) {
        *out = p[0];
        c->pos++;
        return KS_OK;
    }
    /* And a canonical two-byte one (128 to 16,383: the ciphertext length
     * of a small record): a final second byte that is not 0x00. */
    if (avail > 1 && p[1] != 0 && p[1] < 0x80) {
        *out = (uint32_t)(p[0] & 0x7F) | (uint32_t)p[1] << 7;
        c->pos += 2;
        return KS_OK;
    }
    /*@ loop invariant 0 <= i <= 5 && i <= avail && c->pos == \at(c->pos, Pre);
        loop assigns i, v;
        loop variant 5 - i;
    */
    for (size_t i = 0; i < 5; i++) {
        if (i + 1 > avail) {
            return KS_ERR_TRUNCATED;
        }
        const uint8_t b = p[i];
        if (i == 4 && b > 0x0F) {
            /* 4 * 7 = 28 bits so far; only 4 more fit, and no continuation. */
            return KS_ERR_VARINT_OVERFLOW;
        }
        v |= (uint32_t)(b & 0x7F) << (7 * i);
        if ((b & 0x80) == 0) {
            if (i > 0 && b == 0) {
                return KS_ERR_NONCANONICAL_VARINT;
            }
            *out = v;
            c->pos += i + 1;
            return KS_OK;
        }
    }
    /* Unreachable: the fifth byte either ends the varint or overflows. */
    assert(0);
    return KS_ERR_VARINT_OVERFLOW;
}

#endif /* KS_PARSER_CURSOR_H */
