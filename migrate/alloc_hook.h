/*
 * migrate/alloc_hook.h -- the allocation-fault hook of test builds
 * (-DKS_TEST_HOOKS; docs/fuzzing.md, "Fault injection").  Internal (no
 * KS_API): only code linked with the library's objects, i.e. the unit
 * tests, can reach it.
 *
 * Every library source that allocates includes this header after its
 * system headers.  In a test build it routes the file's calls to malloc,
 * calloc, realloc, aligned_alloc, strdup, strndup, sodium_malloc and
 * sodium_allocarray through counting wrappers that can fail the Nth
 * call, so that a sweep can fail every allocation of an operation in
 * turn.  In a release build it defines nothing: the calls are the C
 * library's and libsodium's own.  The controls are declared for every
 * includer (a unit test, compiled without KS_TEST_HOOKS, includes this
 * header for them alone); they exist in test builds of the library only.
 */
#ifndef KS_MIGRATE_ALLOC_HOOK_H
#define KS_MIGRATE_ALLOC_HOOK_H

#include <stddef.h>

/* Fail the nth allocation counted from now (1 is the next one), once; 0
 * turns the hook off.  Resets the count of calls and of faults fired. */
void ks_test_alloc_fail_at(unsigned long n);

/* How many faults fired since the last ks_test_alloc_fail_at. */
unsigned long ks_test_alloc_fired(void);

/* How many allocations were counted since the last ks_test_alloc_fail_at. */
unsigned long ks_test_alloc_calls(void);

#ifdef KS_TEST_HOOKS
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

/* The wrappers: the real function unless this call is the one to fail. */
void *ks_test_malloc(size_t n);
void *ks_test_calloc(size_t count, size_t size);
void *ks_test_realloc(void *p, size_t n);
void *ks_test_aligned_alloc(size_t align, size_t n);
char *ks_test_strdup(const char *s);
char *ks_test_strndup(const char *s, size_t n);
void *ks_test_sodium_malloc(size_t n);
void *ks_test_sodium_allocarray(size_t count, size_t size);

#define malloc(n) ks_test_malloc(n)
#define calloc(c, s) ks_test_calloc(c, s)
#define realloc(p, n) ks_test_realloc(p, n)
#define aligned_alloc(a, n) ks_test_aligned_alloc(a, n)
#define strdup(s) ks_test_strdup(s)
#define strndup(s, n) ks_test_strndup(s, n)
#define sodium_malloc(n) ks_test_sodium_malloc(n)
#define sodium_allocarray(c, s) ks_test_sodium_allocarray(c, s)
#elif defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
/*
 * Fuzz builds only (never a test or release build): secret memory from
 * the C heap instead of libsodium's guarded pages.  Every sodium_malloc
 * is an mmap, three mprotects and an mlock, and every sodium_free as
 * many again, with TLB shootdowns: in the stateful harnesses, a fresh
 * DEK per seal made the kernel a quarter of each input.  Under ASan the
 * heap is checked more tightly than guard pages check (any overrun, and
 * use after free); the memory is still wiped when freed, and the
 * mprotect calls (the PKCS#11 PIN) do nothing.  All of a library file's
 * secret allocations and frees go through this header, so a pointer
 * never crosses to the other allocator.
 */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

void *ks_fuzz_secret_malloc(size_t n);
void *ks_fuzz_secret_allocarray(size_t count, size_t size);
void ks_fuzz_secret_free(void *p);
int ks_fuzz_secret_mprotect(void *p);

#define sodium_malloc(n) ks_fuzz_secret_malloc(n)
#define sodium_allocarray(c, s) ks_fuzz_secret_allocarray(c, s)
#define sodium_free(p) ks_fuzz_secret_free(p)
#define sodium_mprotect_noaccess(p) ks_fuzz_secret_mprotect(p)
#define sodium_mprotect_readonly(p) ks_fuzz_secret_mprotect(p)
#endif /* KS_TEST_HOOKS, FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION */

#endif /* KS_MIGRATE_ALLOC_HOOK_H */
