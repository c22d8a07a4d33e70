/*
 * migrate/crypto/dek_cache.h -- a bounded, expiring LRU map from byte strings to
 * small values, thread-safe.  Two uses in a ks_ctx:
 *
 *   the read-side DEK cache: key = the whole wrap identity (every wrap AAD
 *   field and the wrapped_dek, in the envelope's canonical encoding:
 *   crypto.c, wrap_key()), compared in full, so an entry never serves
 *   another tenant, key or version; value = the DEK's read keys (the
 *   unwrapped DEK, and for format 2 its derived key and commitment:
 *   shard.h), kept in one sodium_malloc'd slab and wiped on eviction,
 *   expiry and free ("secret" values);
 *
 *   the rewrap memo: key = old wrap identity || target, value = the target
 *   version and wrapped bytes (public: kept with the key on the heap).
 *
 * Lookups hash the key under a random per-map key (so crafted envelopes
 * cannot flood one bucket) -- the whole key with SipHash-2-4, or, for a
 * map whose keys end in pseudorandom bytes, only its length and last bytes
 * with the universal hash NH (see nh_tail() in dek_cache.c) -- then
 * compare in full.  The
 * lock is held only to walk one chain and copy at most value_max bytes; a
 * hit allocates nothing.  Expiry uses ks_mono_seconds().
 *
 * A secret map may also keep, for some entries, a state derived from the
 * value (the read cache: a v1 aes-256-gcm DEK's expanded AES-GCM key, for
 * opens on threads without a shard, crypto.c), in
 * a bounded pool of guarded memory shared by the entries in LRU order.  A
 * lookup pins an entry's state instead of copying its value, so the
 * caller uses it outside the lock; a state is wiped when its entry goes
 * (eviction, expiry, replacement, free) or, if pinned then, when its last
 * pin is dropped, and is reused only once no pin is left.
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_DEK_CACHE_H
#define KS_MIGRATE_DEK_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/error.h>

/* The most entries a map may be given. */
#define KS_CACHE_ENTRIES_MAX (1u << 20)
/* The longest key tail a map may hash instead of the whole key. */
#define KS_CACHE_HASH_TAIL_MAX 32u

typedef struct ks_dek_cache ks_dek_cache;

/* A map of `entries` (1 .. KS_CACHE_ENTRIES_MAX) entries living `ttl`
 * seconds (>= 1), values of at most value_max bytes; secret values go in
 * guarded memory.  hash_tail 0 hashes whole keys; a multiple of 8 up to
 * KS_CACHE_HASH_TAIL_MAX hashes only the key length and the key's last
 * hash_tail bytes, for a map whose callers put only authenticated keys
 * ending in pseudorandom bytes.
 * KS_ERR_INVALID_ARGUMENT, KS_ERR_NO_MEMORY. */
KS_WUR ks_err ks_dek_cache_new(uint32_t entries, uint32_t ttl, size_t value_max, int secret,
                               size_t hash_tail, ks_dek_cache **out);

/* Wipe every value and free the map; NULL is a no-op. */
void ks_dek_cache_free(ks_dek_cache *c);

/* Copy the value stored under key[0, key_len) into val[0, value_max) and
 * its length to *val_len: 1 on a hit (the entry becomes most recent), 0 on
 * a miss (an expired entry is wiped and dropped).  c NULL: always a miss. */
int ks_dek_cache_get(ks_dek_cache *c, const uint8_t *key, size_t key_len, uint8_t *val,
                     size_t *val_len);

/* The lookups (ks_dek_cache_get(), ks_dek_cache_get_pinned()) that hit
 * and that missed so far, into *hits and *misses; c NULL: 0 and 0. */
void ks_dek_cache_counts(ks_dek_cache *c, uint64_t *hits, uint64_t *misses);

/* Derive a state of the map's state size from val[0, val_len). */
typedef void (*ks_dek_cache_derive_fn)(void *state, const uint8_t *val, size_t val_len);

/* Give a secret map a pool of min(entries, states_max) (>= 1) derived
 * states of state_size bytes (a multiple of 16; states are 16-byte
 * aligned), made by derive for the entries put with derive=1.  Call once,
 * before the map is shared.  KS_ERR_INVALID_ARGUMENT, KS_ERR_NO_MEMORY. */
KS_WUR ks_err ks_dek_cache_enable_states(ks_dek_cache *c, size_t state_size, uint32_t states_max,
                                         ks_dek_cache_derive_fn derive);

/* A pinned derived state (ks_dek_cache_get_pinned()). */
typedef struct ks_dek_cache_pin {
    const void *state; /* NULL: nothing pinned */
    uint32_t slot;
} ks_dek_cache_pin;

/* ks_dek_cache_get(), except that when pin is not NULL and the entry has
 * a derived state, the state is pinned into *pin (val and *val_len are
 * then not written) and stays valid and unchanged until
 * ks_dek_cache_unpin(); otherwise pin->state is NULL and the value is
 * copied out.  On a hit, *expires (when not NULL) receives the entry's
 * expiry, for a copy that must not outlive it. */
int ks_dek_cache_get_pinned(ks_dek_cache *c, const uint8_t *key, size_t key_len, uint8_t *val,
                            size_t *val_len, ks_dek_cache_pin *pin, uint64_t *expires);

/* fork() safety: take c's lock before fork() and release it after, in the
 * parent and in the child (no lookup is then half done in the child).
 * NULL is a no-op. */
void ks_dek_cache_fork_prepare(ks_dek_cache *c);
void ks_dek_cache_fork_release(ks_dek_cache *c);

/* Drop the pin taken by ks_dek_cache_get_pinned() (no-op when pin->state
 * is NULL); the last pin of a state whose entry is gone wipes it. */
void ks_dek_cache_unpin(ks_dek_cache *c, ks_dek_cache_pin *pin);

/* Store val[0, val_len) (<= value_max) under key, replacing an entry with
 * the same key and evicting the least recently used entry when full; with
 * derive nonzero on a map with states, also derive its state, taking the
 * pool's least recently used unpinned state when none is free (none
 * unpinned: the entry just has no state).  A failed allocation just leaves
 * the value uncached.  c NULL: no-op. */
void ks_dek_cache_put(ks_dek_cache *c, const uint8_t *key, size_t key_len, const uint8_t *val,
                      size_t val_len, int derive);

#endif /* KS_MIGRATE_DEK_CACHE_H */
