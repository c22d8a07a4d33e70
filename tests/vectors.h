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

#endif /* KS_TESTS_VECTORS_H */
