/*
 * migrate/crypto/thread_index.h -- a small index per thread, for per-thread
 * state in a ks_ctx (its counters and its shards: shard.h).
 *
 * The first KS_THREAD_SLOTS threads alive at once each own an index in
 * [0, KS_THREAD_SLOTS) that no other live thread has; every further
 * thread gets KS_THREAD_SHARED, which they share.  An index is given back
 * when its thread exits (a TLS destructor) and handed to the next thread
 * that asks: the hand-over orders everything the old owner wrote before
 * it exited before everything the new owner reads.  In a child of fork()
 * only the forking thread keeps its index (ks_thread_index_fork_child()).
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_THREAD_INDEX_H
#define KS_MIGRATE_THREAD_INDEX_H

#include <stdint.h>

/* Indices owned by one thread each; KS_THREAD_SHARED is everyone else's. */
#define KS_THREAD_SLOTS 63u
#define KS_THREAD_SHARED KS_THREAD_SLOTS

/* This thread's index plus one; 0: none owned.  Written by its thread
 * alone (thread_index.c). */
extern __attribute__((visibility("hidden"))) _Thread_local uint32_t ks_thread_index_1;

/* ks_thread_index() for a thread that owns no index yet: take one. */
uint32_t ks_thread_index_take(void);

/* This thread's index: its own (< KS_THREAD_SLOTS), or KS_THREAD_SHARED
 * while every index is taken (asked again on later calls).  Every seal
 * and open asks, so the steady state (one TLS load) is inline. */
static inline uint32_t ks_thread_index(void)
{
    const uint32_t m = ks_thread_index_1;
    return m != 0 ? m - 1 : ks_thread_index_take();
}

/* This thread's own index, or KS_THREAD_SHARED when it owns none; never
 * takes one. */
uint32_t ks_thread_index_owned(void);

/* In a child of fork(), from an atfork child handler: every index but the
 * calling thread's is free again (the other threads do not exist here). */
void ks_thread_index_fork_child(void);

/* Call fn(index) in each exiting thread that owns an index, just before
 * the index is given back (ctx.c empties that index's shards, so that no
 * key material outlives the thread that used it).  Set once, before any
 * thread exits with an index; later calls replace it. */
void ks_thread_index_on_exit(void (*fn)(uint32_t index));

#endif /* KS_MIGRATE_THREAD_INDEX_H */
