/*
 * keyshift/common.h -- shared definitions for the keyshift public API.
 *
 * Everything exported by libkeyshift carries the `ks_` prefix.  Types here
 * are plain C11 and carry no ownership: a ks_bytes is a borrowed view.
 */
#ifndef KEYSHIFT_COMMON_H
#define KEYSHIFT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Mark a symbol as part of the shared library's ABI. */
#if defined(__GNUC__) || defined(__clang__)
#define KS_API __attribute__((visibility("default")))
#define KS_WUR __attribute__((warn_unused_result))
#else
#define KS_API
#define KS_WUR
#endif

/* Library version: major.minor.patch.  The shared library's soname carries
 * the major number; minor grows with additions that keep the ABI. */
#define KS_VERSION_MAJOR 0
#define KS_VERSION_MINOR 1
#define KS_VERSION_PATCH 0
#define KS_VERSION_STRING "0.2.0"

/* Return KS_VERSION_STRING as compiled into the library (which may differ
 * from the header the caller was compiled against). Static storage. */
KS_API const char *ks_version(void);

/*
 * A read-only view of bytes owned by someone else.
 *
 * ptr is NULL exactly when len is 0 and the view is "absent".  A view that
 * points into a caller's buffer is valid only while that buffer is.
 */
typedef struct ks_bytes {
    const uint8_t *ptr;
    size_t len;
} ks_bytes;

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_COMMON_H */
