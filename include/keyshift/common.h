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
 * the major number; minor grows with additions that keep the ABI.  The
 * three numbers are the only source of the version: KS_VERSION_STRING is
 * made from them here, and the Makefile reads them (soname, keyshift.pc). */
#define KS_VERSION_MAJOR 0
#define KS_VERSION_MINOR 2
#define KS_VERSION_PATCH 0
#define KS_VERSION_STR_(x) #x
#define KS_VERSION_XSTR_(x) KS_VERSION_STR_(x)
#define KS_VERSION_STRING                                                                          \
    KS_VERSION_XSTR_(KS_VERSION_MAJOR)                                                             \
    "." KS_VERSION_XSTR_(KS_VERSION_MINOR) "." KS_VERSION_XSTR_(KS_VERSION_PATCH)

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
