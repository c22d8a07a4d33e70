/*
 * tests/vectors.h -- loader for the test vectors of docs/format.md.
 *
 * The spec carries its vectors in fenced code blocks whose info string is
 * exactly `ks-vector`:
 *
 *     ```ks-vector
 *     name: v1-typical
 *     expect: ok                      (or: <error-name> at <offset>)
 *     hex: 4b534501 0801 120c ...
 *     hex: ...                        (all hex: lines concatenated)
 *     ```
 *
 * The loader is strict: a block that does not follow this shape (unknown
 * or repeated key, missing key, blank line, name outside [a-z0-9-], bad
 * hex, unknown error name, bad offset, duplicate vector name, unterminated
 * fence) makes the whole load fail, so
 * that a typo in the spec fails the tests instead of silently dropping a
 * vector.  Test support code, not part of the library.
 */
#ifndef KS_TESTS_VECTORS_H
#define KS_TESTS_VECTORS_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/error.h>

/* One vector.  Owned by the ks_test_vectors it belongs to. */
typedef struct ks_test_vector {
    char *name;           /* NUL-terminated */
    ks_err expect_code;   /* KS_OK or an envelope rejection code */
    size_t expect_offset; /* 0 when expect_code is KS_OK */
    uint8_t *bytes;       /* exactly len bytes; NULL when len is 0 */
    size_t len;
    size_t line;          /* 1-based line of the opening fence */
} ks_test_vector;

/* Every vector of one document, in document order. */
typedef struct ks_test_vectors {
    ks_test_vector *v;
    size_t count;
} ks_test_vectors;

/*
 * Parse the vectors out of markdown text[0, len).  origin names the text in
 * error messages (e.g. its path).  Returns 0 and fills *out (count may be
 * 0), or returns -1, leaves *out empty and writes a message
 * "origin:line: reason" to errbuf[0, errlen).
 */
int ks_test_vectors_parse(const char *text, size_t len, const char *origin, ks_test_vectors *out,
                          char *errbuf, size_t errlen);

/* Read the markdown file at path and parse it as ks_test_vectors_parse()
 * does.  An unreadable file is an error. */
int ks_test_vectors_load(const char *path, ks_test_vectors *out, char *errbuf, size_t errlen);

/* Free every vector of *vs and leave it empty.  NULL and empty are fine. */
void ks_test_vectors_free(ks_test_vectors *vs);

/* The rejection code whose ks_err_name() is name[0, len), or KS_OK when
 * there is none. */
ks_err ks_test_err_from_name(const char *name, size_t len);

/* ---- the pieces of a strict block loader ---------------------------------
 * Shared with tests/crypto_vectors.h (the ks-crypto-vector blocks of
 * Appendix C), which builds its own stricter loader from them.  Text is
 * handled as (pointer, length) pairs throughout. */

/* Where a loader is, for error messages. */
typedef struct ks_test_loader {
    const char *origin; /* names the text, e.g. its path */
    size_t line;        /* 1-based line being read; 0 before the first */
    char *errbuf;       /* may be NULL */
    size_t errlen;
} ks_test_loader;

/* Write "origin:line: msg" (with ": 'detail'", at most 80 bytes of it,
 * when detail is not NULL) to ld->errbuf; returns -1, so that a caller can
 * `return ks_test_fail(...)`. */
int ks_test_fail(const ks_test_loader *ld, const char *msg, const char *detail, size_t detail_len);

/* Nonzero for the blanks allowed around tokens: space, tab, CR. */
int ks_test_is_blank(char c);

/* Strip blanks from both ends of p[0, *n): advance *p, shrink *n. */
void ks_test_trim(const char **p, size_t *n);

/*
 * Split one line of a vector block (block names the block type in
 * messages) into a trimmed key and value around its first ':'.  A blank
 * line or one without ':' fails (ks_test_fail, -1); 0 otherwise.
 */
int ks_test_key_value(const ks_test_loader *ld, const char *block, const char *line, size_t n,
                      const char **key, size_t *key_len, const char **val, size_t *val_len);

/* Nonzero when p[0, n) equals the NUL-terminated string s. */
int ks_test_equals(const char *p, size_t n, const char *s);

/* Nonzero when p[0, n) is a non-empty [a-z0-9-] vector name. */
int ks_test_name_ok(const char *p, size_t n);

/* A growing byte string filled from hex digits.  half/nibble carry a high
 * nibble from one call to the next, so a byte may span two calls; a caller
 * that wants whole bytes per line checks half after each call. */
typedef struct ks_test_hex {
    uint8_t *bytes; /* realloc'd; the caller frees it */
    size_t len, cap;
    int half;       /* nonzero when a high nibble is pending */
    uint8_t nibble;
} ks_test_hex;

/* Append the hex digits of v[0, n) to *h; blanks are skipped, any other
 * non-hex byte fails ("bad hex digit").  0 or -1 (message in ld). */
int ks_test_hex_add(const ks_test_loader *ld, ks_test_hex *h, const char *v, size_t n);

/* What ks_test_scan_blocks() does with the blocks it looks for. */
typedef struct ks_test_block_ops {
    const char *info; /* the exact info string of those blocks, e.g. "ks-vector" */
    int (*open)(void *arg, const ks_test_loader *ld); /* at the opening fence */
    int (*line)(void *arg, const ks_test_loader *ld, const char *line, size_t n);
    int (*close)(void *arg, const ks_test_loader *ld); /* at the closing fence */
} ks_test_block_ops;

/*
 * Scan markdown text[0, len) line by line for CommonMark fenced code blocks
 * (``` or ~~~, at most three spaces of indentation; closed by a fence of
 * the same character, at least as long, with no info string).  For each
 * block whose info string is exactly ops->info, call ops->open at its
 * opening fence, ops->line for every line inside it (without the newline),
 * and ops->close at its closing fence; ld->line is the line at hand.
 * Every other fenced block is skipped whole, so that an example inside
 * one is never taken for a block.  Stops at the first nonzero return and
 * returns it; an unterminated fence of either kind fails at its opening
 * line (it could hide blocks).  0 when the whole text was read.
 */
int ks_test_scan_blocks(const char *text, size_t len, ks_test_loader *ld,
                        const ks_test_block_ops *ops, void *arg);

/* Read the whole file at path into a malloc'd *text (free it), *len bytes,
 * not NUL-terminated.  NULL, or why not: "cannot open file", "out of
 * memory" or "read error" (and *text is NULL). */
const char *ks_test_read_file(const char *path, char **text, size_t *len);

#endif /* KS_TESTS_VECTORS_H */
