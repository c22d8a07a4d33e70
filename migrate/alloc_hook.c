/*
 * migrate/alloc_hook.c -- the counting allocation wrappers of
 * alloc_hook.h, compiled into test builds only (-DKS_TEST_HOOKS), and the
 * heap-backed secret memory of fuzz builds
 * (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION).  A release build compiles
 * this file to nothing but a typedef.
 *
 * One process-wide counter (atomic: the migration pipeline allocates on
 * a helper thread too).  A fault fails one call, the Nth since
 * ks_test_alloc_fail_at(N); the calls after it succeed again, as SQLite's
 * own fault simulator does in its transient mode.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#if !defined(KS_TEST_HOOKS) && defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
#include <malloc.h> /* malloc_usable_size: glibc's, and ASan's */

#include "alloc_hook.h" /* its fuzz-build macros touch nothing this file calls */
#endif

/* Unused in a release build: keeps the translation unit non-empty. */
typedef int ks_alloc_hook_unused;

#ifdef KS_TEST_HOOKS
#include "alloc_hook.h"

/* This file calls the real functions. */
#undef malloc
#undef calloc
#undef realloc
#undef aligned_alloc
#undef strdup
#undef strndup
#undef sodium_malloc
#undef sodium_allocarray

static atomic_ulong fail_at; /* 0: off */
static atomic_ulong calls;
static atomic_ulong fired;

/* See alloc_hook.h. */
void ks_test_alloc_fail_at(unsigned long n)
{
    atomic_store(&calls, 0);
    atomic_store(&fired, 0);
    atomic_store(&fail_at, n);
}

/* See alloc_hook.h. */
unsigned long ks_test_alloc_fired(void)
{
    return atomic_load(&fired);
}

/* See alloc_hook.h. */
unsigned long ks_test_alloc_calls(void)
{
    return atomic_load(&calls);
}

/* Count one allocation; nonzero when it is the one to fail. */
static int should_fail(void)
{
    unsigned long n = atomic_fetch_add(&calls, 1) + 1;
    unsigned long at = atomic_load(&fail_at);
    if (at != 0 && n == at) {
        atomic_fetch_add(&fired, 1);
        return 1;
    }
    return 0;
}

/* See alloc_hook.h. */
void *ks_test_malloc(size_t n)
{
    return should_fail() ? NULL : malloc(n);
}

/* See alloc_hook.h. */
void *ks_test_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count, size);
}

/* See alloc_hook.h: a failed realloc leaves p allocated, as realloc does. */
void *ks_test_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : realloc(p, n);
}

/* See alloc_hook.h. */
void *ks_test_aligned_alloc(size_t align, size_t n)
{
    return should_fail() ? NULL : aligned_alloc(align, n);
}

/* See alloc_hook.h. */
char *ks_test_strdup(const char *s)
{
    return should_fail() ? NULL : strdup(s);
}

/* See alloc_hook.h. */
char *ks_test_strndup(const char *s, size_t n)
{
    return should_fail() ? NULL : strndup(s, n);
}

/* See alloc_hook.h. */
void *ks_test_sodium_malloc(size_t n)
{
    return should_fail() ? NULL : sodium_malloc(n);
}

/* See alloc_hook.h. */
void *ks_test_sodium_allocarray(size_t count, size_t size)
{
    return should_fail() ? NULL : sodium_allocarray(count, size);
}
#endif /* KS_TEST_HOOKS */

#if !defined(KS_TEST_HOOKS) && defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
/* Alignment of fuzz builds' secret memory: a cache line, at least what
 * libsodium's AES-GCM state (16) and every C type need. */
#define SECRET_ALIGN 64u

/* See alloc_hook.h: n bytes (n rounded up to SECRET_ALIGN, as aligned_alloc
 * wants), or NULL, like sodium_malloc. */
void *ks_fuzz_secret_malloc(size_t n)
{
    if (n > SIZE_MAX - SECRET_ALIGN)
        return NULL;
    size_t m = (n + SECRET_ALIGN - 1) / SECRET_ALIGN * SECRET_ALIGN;
    return aligned_alloc(SECRET_ALIGN, m == 0 ? SECRET_ALIGN : m);
}

/* See alloc_hook.h: count * size bytes, NULL when that overflows. */
void *ks_fuzz_secret_allocarray(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    return ks_fuzz_secret_malloc(count * size);
}

/* See alloc_hook.h: wipe the whole block, then free it; NULL is a no-op. */
void ks_fuzz_secret_free(void *p)
{
    if (p == NULL)
        return;
    sodium_memzero(p, malloc_usable_size(p));
    free(p);
}

/* See alloc_hook.h: no page protection on the heap; succeeds. */
int ks_fuzz_secret_mprotect(void *p)
{
    (void)p;
    return 0;
}
#endif /* fuzz builds */
