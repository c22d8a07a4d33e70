/*
 * migrate/crypto/thread_index.c -- see thread_index.h.
 *
 * The taken indices are the bits of one word, changed with compare-and-swap
 * (acquire on taking, release on giving back).  A thread caches its index
 * in thread-local storage, so the steady state costs one TLS load; the
 * word is touched only when a thread first asks, when it exits, and, for a
 * thread on the shared index, once per call (a load, and a CAS only when a
 * bit is free).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "thread_index.h"

_Static_assert(KS_THREAD_SLOTS < 64, "the taken indices fit one 64-bit word");

/* Bit i: index i is owned by a live thread. */
static _Atomic uint64_t taken;
/* See thread_index.h. */
_Thread_local uint32_t ks_thread_index_1;
/* Its destructor gives the index back when the thread exits. */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;
/* What an exiting owner runs before giving its index back. */
static void (*_Atomic on_exit_fn)(uint32_t);

/* See thread_index.h. */
void ks_thread_index_on_exit(void (*fn)(uint32_t index))
{
    atomic_store_explicit(&on_exit_fn, fn, memory_order_release);
}

/* TLS destructor: run the exit hook, then give the exiting thread's index
 * back (release: what it wrote under the index happens before the next
 * owner's reads). */
static void give_back(void *v)
{
    uint32_t i = (uint32_t)(uintptr_t)v - 1;
    if (i < KS_THREAD_SLOTS) {
        void (*fn)(uint32_t) = atomic_load_explicit(&on_exit_fn, memory_order_acquire);
        if (fn != NULL) {
            fn(i);
        }
        atomic_fetch_and_explicit(&taken, ~((uint64_t)1 << i), memory_order_release);
    }
    ks_thread_index_1 = 0;
}

/* Once per process: the key whose destructor runs give_back. */
static void make_key(void)
{
    key_ok = pthread_key_create(&exit_key, give_back) == 0;
}

/* See thread_index.h: take the lowest free index, or return
 * KS_THREAD_SHARED. */
uint32_t ks_thread_index_take(void)
{
    (void)pthread_once(&key_once, make_key);
    if (!key_ok) {
        return KS_THREAD_SHARED; /* no way to give it back: own none */
    }
    uint64_t t = atomic_load_explicit(&taken, memory_order_relaxed);
    const uint64_t all = ((uint64_t)1 << KS_THREAD_SLOTS) - 1;
    while ((t & all) != all) {
        uint32_t i = (uint32_t)__builtin_ctzll(~t);
        if (atomic_compare_exchange_weak_explicit(&taken, &t, t | (uint64_t)1 << i,
                                                  memory_order_acquire, memory_order_relaxed)) {
            if (pthread_setspecific(exit_key, (void *)(uintptr_t)(i + 1)) != 0) {
                atomic_fetch_and_explicit(&taken, ~((uint64_t)1 << i), memory_order_release);
                return KS_THREAD_SHARED;
            }
            ks_thread_index_1 = i + 1;
            return i;
        }
    }
    return KS_THREAD_SHARED;
}

/* See thread_index.h. */
uint32_t ks_thread_index_owned(void)
{
    return ks_thread_index_1 != 0 ? ks_thread_index_1 - 1 : KS_THREAD_SHARED;
}

/* See thread_index.h. */
void ks_thread_index_fork_child(void)
{
    uint64_t keep = ks_thread_index_1 != 0 ? (uint64_t)1 << (ks_thread_index_1 - 1) : 0;
    atomic_store_explicit(&taken, keep, memory_order_relaxed);
}
