/*
 * migrate/crypto/dek_cache.h -- a bounded, expiring LRU map from byte strings to
 * small values, thread-safe.  Two uses in a ks_ctx:
 *
 *   the read-side DEK cache: key = wrap AAD || wrapped_dek (the whole wrap
 *   identity, compared in full, so an entry never serves another tenant,
 *   key or version), value = the unwrapped DEK, kept in one sodium_malloc'd
 *   slab and wiped on eviction, expiry and free ("secret" values);
 *
 *   the rewrap memo: key = old wrap identity || target, value = the target
 *   version and wrapped bytes (public: kept with the key on the heap).
 *
 * Lookups hash the key with SipHash-2-4 under a random per-map key (so
 * crafted envelopes cannot flood one bucket) -- the whole key, or only its
 * length and last bytes for a map whose keys end in pseudorandom bytes
 * (see hash_key() in dek_cache.c) -- then compare in full.  The
 * lock is held only to walk one chain and copy at most value_max bytes; a
 * hit allocates nothing.  Expiry uses ks_mono_seconds().
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
 * guarded memory.  hash_tail 0 hashes whole keys; 1 .. KS_CACHE_HASH_TAIL_MAX
 * hashes only the key length and the key's last hash_tail bytes, for a map
 * whose callers put only authenticated keys ending in pseudorandom bytes.
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

/* Store val[0, val_len) (<= value_max) under key, replacing an entry with
 * the same key and evicting the least recently used entry when full.  A
 * failed allocation just leaves the value uncached.  c NULL: no-op. */
void ks_dek_cache_put(ks_dek_cache *c, const uint8_t *key, size_t key_len, const uint8_t *val,
                      size_t val_len);

#endif /* KS_MIGRATE_DEK_CACHE_H */
