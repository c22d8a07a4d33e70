/*
 * keyshift/error.h -- stable error codes.
 *
 * Every function that can fail returns a ks_err.  KS_OK is 0; every failure
 * is a positive value.  The numeric values and the names returned by
 * ks_err_name() are stable across releases: scripts and logs may rely on
 * them.  New codes are only ever appended.
 *
 * Codes 1..31 are envelope rejections (docs/format.md, section 5); each comes
 * with the byte offset at which the problem was found.
 */
#ifndef KEYSHIFT_ERROR_H
#define KEYSHIFT_ERROR_H

#include <keyshift/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ks_err {
    KS_OK = 0,

    /* Envelope rejections (docs/format.md section 5). */
    KS_ERR_TRUNCATED = 1,           /* "truncated": input ended inside an element or before a required field */
    KS_ERR_BAD_MAGIC = 2,           /* "bad-magic": the first three bytes are not "KSE" */
    KS_ERR_UNSUPPORTED_VERSION = 3, /* "unsupported-version": version byte is not 1 or 2 */
    KS_ERR_WIRE_TYPE = 4,           /* "wire-type": wire type differs from the field table */
    KS_ERR_NONCANONICAL_VARINT = 5, /* "noncanonical-varint": a varint is not minimal */
    KS_ERR_VARINT_OVERFLOW = 6,     /* "varint-overflow": a varint does not fit in 32 bits */
    KS_ERR_FIELD_ORDER = 7,         /* "field-order": a duplicate or decreasing field number */
    KS_ERR_UNKNOWN_FIELD = 8,       /* "unknown-field": a field this version does not define */
    KS_ERR_MISSING_FIELD = 9,       /* "missing-field": a required field was skipped */
    KS_ERR_TOO_LARGE = 10,          /* "too-large": a length above the field's limit */
    KS_ERR_BAD_VALUE = 11,          /* "bad-value": a value outside the field's rule */

    /* Caller errors: the input was never looked at. */
    KS_ERR_INVALID_ARGUMENT = 32,   /* "invalid-argument": NULL pointer, bad limits, inconsistent struct */
    KS_ERR_BUFFER_TOO_SMALL = 33    /* "buffer-too-small": output capacity below the encoded size */
} ks_err;

/* The stable name of an error code, e.g. "noncanonical-varint"; "ok" for
 * KS_OK and "unknown-error" for a value this library does not define.
 * Static storage; never NULL. */
KS_API const char *ks_err_name(ks_err err);

/* Nonzero when err is an envelope rejection (codes 1..31): the input bytes
 * were at fault, not the caller. */
KS_API int ks_err_is_rejection(ks_err err);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ERROR_H */
