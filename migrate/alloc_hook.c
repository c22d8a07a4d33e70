/*
 * migrate/alloc_hook.c -- the counting allocation wrappers of
 * alloc_hook.h, compiled into test builds only (-DKS_TEST_HOOKS).  A
 * release build compiles this file to nothing but a typedef.
 *
 * One process-wide counter (atomic: the migration pipeline allocates on
 * a helper thread too).  A fault fails one call, the Nth since
 * ks_test_alloc_fail_at(N); the calls after it succeed again, as SQLite's
 * own fault simulator does in its transient mode.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

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
