/*
 * tests/free_scan.c -- an LD_PRELOAD shim for tests/cli_crypto_test.sh:
 * it reports every heap block given back to the C library while it still
 * holds the bytes of $FREE_SCAN_MARKER, whether by free() or by a
 * realloc().  Its realloc() always moves the block, as the C library's
 * may whenever the block cannot grow where it is: so a realloc of a
 * block holding the marker is reported every time, not only when the
 * heap's layout happens to make it move.  A program that wipes what it
 * frees, and grows secret buffers by copy-and-wipe, never trips it.
 *
 * Built by the test script (cc -shared -fPIC) and preloaded into the
 * release build of keyshift (a sanitizer build intercepts malloc itself).
 * It calls glibc's __libc_* entry points, so it needs no dlsym and never
 * allocates; a report is one write(2) to standard error.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *__libc_malloc(size_t n);
void __libc_free(void *p);

void free(void *p);
void *realloc(void *p, size_t n);

/* Whether the live block p holds the marker. */
static int holds_marker(void *p)
{
    const char *m = getenv("FREE_SCAN_MARKER");
    if (p == NULL || m == NULL || *m == '\0') {
        return 0;
    }
    return memmem(p, malloc_usable_size(p), m, strlen(m)) != NULL;
}

/* Say that a block holding the marker was given back unwiped. */
static void report(const char *how)
{
    static const char head[] = "free-scan: a block holding the marker was freed unwiped by ";
    ssize_t r = write(2, head, sizeof head - 1);
    r = write(2, how, strlen(how));
    r = write(2, "\n", 1);
    (void)r;
}

/* free(), checked first. */
void free(void *p)
{
    if (holds_marker(p)) {
        report("free");
    }
    __libc_free(p);
}

/* realloc(), always moving the block: a new one, the old one's bytes
 * copied, the old one checked and freed. */
void *realloc(void *p, size_t n)
{
    if (p == NULL) {
        return __libc_malloc(n);
    }
    void *q = __libc_malloc(n != 0 ? n : 1);
    if (q == NULL) {
        return NULL;
    }
    const size_t old = malloc_usable_size(p);
    memcpy(q, p, old < n ? old : n);
    if (holds_marker(p)) {
        report("realloc");
    }
    __libc_free(p);
    return q;
}
