/*
 * migrate/crypto/dek_cache.c -- the bounded, expiring LRU map of dek_cache.h.
 *
 * Layout: a fixed array of entries (allocated once), a power-of-two bucket
 * array of chain heads, a doubly linked LRU list and a free list, all by
 * 32-bit index.  Each entry's key (and a public value) lives in one heap
 * blob allocated on insert, outside the lock; secret values live in a
 * sodium_malloc'd slab, value_max bytes per entry.
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "dek_cache.h"
#include "mono_clock.h"

#define NIL UINT32_MAX

typedef struct entry {
    uint64_t hash;
    uint64_t expires;  /* ks_mono_seconds() at which it is dropped */
    uint8_t *blob;     /* key || public value; NULL when the entry is free */
    size_t key_len;
    size_t val_len;
    uint32_t chain;    /* next entry in the bucket */
    uint32_t prev;     /* LRU list: towards the most recent */
    uint32_t next;     /* LRU list: towards the least recent; free list link */
} entry;

struct ks_dek_cache {
    pthread_mutex_t mu;
    uint32_t entries, ttl, bucket_mask;
    size_t value_max;
    size_t hash_tail;  /* 0: hash whole keys; else see hash_key() */
    int secret;
    uint8_t hkey[crypto_shorthash_KEYBYTES];
    uint8_t *slab;     /* secret values, or NULL */
    entry *e;
    uint32_t *bucket;
    uint32_t mru, lru, free_head;
};

/*
 * The keyed hash of a key: SipHash-2-4 under the map's random key, over
 * the whole key, or, when c->hash_tail is set, over u64(key length) ||
 * the key's last hash_tail bytes only.
 *
 * The short form stays safe against crafted lookups because the hash only
 * picks a bucket: a hit still needs the full key comparison in find(), and
 * entries are inserted only by a caller that has authenticated the key
 * (the read cache puts a wrap identity only after its provider unwrapped
 * it).  A forged key therefore only walks a chain of genuine entries, and
 * chain lengths are set by genuine keys alone.  For the read cache the tail
 * is the end of the wrapped DEK: the wrapping AEAD's tag (local keyring)
 * or the end of a KMS ciphertext, pseudorandom and not chosen by whoever
 * asks for the wrap; hashed under a per-map key, genuine entries still
 * spread evenly over the buckets.
 */
static uint64_t hash_key(const ks_dek_cache *c, const uint8_t *key, size_t len)
{
    uint8_t h[crypto_shorthash_BYTES];
    uint64_t v = 0;
    if (c->hash_tail != 0) {
        uint8_t in[8 + KS_CACHE_HASH_TAIL_MAX];
        size_t n = len < c->hash_tail ? len : c->hash_tail;
        uint64_t len64 = len;
        memcpy(in, &len64, 8); /* host order: the hash is never stored */
        memcpy(in + 8, key + (len - n), n);
        (void)crypto_shorthash(h, in, 8 + n, c->hkey); /* cannot fail */
    } else {
        (void)crypto_shorthash(h, key, len, c->hkey);
    }
    memcpy(&v, h, sizeof v);
    return v;
}

/* Where entry i's value is. */
static uint8_t *value_of(const ks_dek_cache *c, uint32_t i)
{
    const entry *x = &c->e[i];
    return c->secret ? c->slab + (size_t)i * c->value_max : x->blob + x->key_len;
}

/* Unlink i from the LRU list. */
static void lru_unlink(ks_dek_cache *c, uint32_t i)
{
    entry *x = &c->e[i];
    if (x->prev != NIL) {
        c->e[x->prev].next = x->next;
    } else {
        c->mru = x->next;
    }
    if (x->next != NIL) {
        c->e[x->next].prev = x->prev;
    } else {
        c->lru = x->prev;
    }
}

/* Make i the most recently used entry. */
static void lru_push_front(ks_dek_cache *c, uint32_t i)
{
    entry *x = &c->e[i];
    x->prev = NIL;
    x->next = c->mru;
    if (c->mru != NIL) {
        c->e[c->mru].prev = i;
    } else {
        c->lru = i;
    }
    c->mru = i;
}

/* Remove i from its bucket chain. */
static void chain_unlink(ks_dek_cache *c, uint32_t i)
{
    uint32_t *p = &c->bucket[c->e[i].hash & c->bucket_mask];
    while (*p != i) {
        assert(*p != NIL);
        p = &c->e[*p].chain;
    }
    *p = c->e[i].chain;
}

/* Drop entry i: wipe its value, free it, and return its blob for the
 * caller to free once the lock is released. */
static uint8_t *drop(ks_dek_cache *c, uint32_t i)
{
    entry *x = &c->e[i];
    uint8_t *blob = x->blob;
    chain_unlink(c, i);
    lru_unlink(c, i);
    sodium_memzero(value_of(c, i), c->secret ? c->value_max : x->val_len);
    x->blob = NULL;
    x->next = c->free_head;
    c->free_head = i;
    return blob;
}

/* The entry holding key, or NIL. */
static uint32_t find(const ks_dek_cache *c, uint64_t h, const uint8_t *key, size_t len)
{
    for (uint32_t i = c->bucket[h & c->bucket_mask]; i != NIL; i = c->e[i].chain) {
        const entry *x = &c->e[i];
        if (x->hash == h && x->key_len == len && memcmp(x->blob, key, len) == 0) {
            return i;
        }
    }
    return NIL;
}

/* See dek_cache.h. */
ks_err ks_dek_cache_new(uint32_t entries, uint32_t ttl, size_t value_max, int secret,
                        size_t hash_tail, ks_dek_cache **out)
{
    if (entries == 0 || entries > KS_CACHE_ENTRIES_MAX || ttl == 0 || value_max == 0 ||
        hash_tail > KS_CACHE_HASH_TAIL_MAX || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    uint32_t nb = 1;
    while (nb < entries) {
        nb <<= 1;
    }
    ks_dek_cache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    c->e = calloc(entries, sizeof *c->e);
    c->bucket = malloc((size_t)nb * sizeof *c->bucket);
    c->slab = secret ? sodium_malloc((size_t)entries * value_max) : NULL;
    if (c->e == NULL || c->bucket == NULL || (secret && c->slab == NULL) ||
        pthread_mutex_init(&c->mu, NULL) != 0) {
        sodium_free(c->slab);
        free(c->bucket);
        free(c->e);
        free(c);
        return KS_ERR_NO_MEMORY;
    }
    if (secret) {
        sodium_memzero(c->slab, (size_t)entries * value_max);
    }
    memset(c->bucket, 0xFF, (size_t)nb * sizeof *c->bucket); /* every head NIL */
    for (uint32_t i = 0; i < entries; i++) {
        c->e[i].next = i + 1 < entries ? i + 1 : NIL;
    }
    c->entries = entries;
    c->ttl = ttl;
    c->bucket_mask = nb - 1;
    c->value_max = value_max;
    c->hash_tail = hash_tail;
    c->secret = secret != 0;
    c->mru = c->lru = NIL;
    c->free_head = 0;
    crypto_shorthash_keygen(c->hkey);
    *out = c;
    return KS_OK;
}

/* See dek_cache.h. */
void ks_dek_cache_free(ks_dek_cache *c)
{
    if (c == NULL) {
        return;
    }
    for (uint32_t i = 0; i < c->entries; i++) {
        if (c->e[i].blob != NULL) {
            sodium_memzero(value_of(c, i), c->secret ? c->value_max : c->e[i].val_len);
            free(c->e[i].blob);
        }
    }
    if (c->slab != NULL) {
        sodium_memzero(c->slab, (size_t)c->entries * c->value_max);
        sodium_free(c->slab);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->bucket);
    free(c->e);
    free(c);
}

/* See dek_cache.h. */
int ks_dek_cache_get(ks_dek_cache *c, const uint8_t *key, size_t key_len, uint8_t *val,
                     size_t *val_len)
{
    if (c == NULL) {
        return 0;
    }
    uint64_t h = hash_key(c, key, key_len);
    uint64_t now = ks_mono_seconds();
    uint8_t *expired = NULL;
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    uint32_t i = find(c, h, key, key_len);
    if (i != NIL && now >= c->e[i].expires) {
        expired = drop(c, i);
    } else if (i != NIL) {
        lru_unlink(c, i);
        lru_push_front(c, i);
        memcpy(val, value_of(c, i), c->e[i].val_len);
        *val_len = c->e[i].val_len;
        hit = 1;
    }
    pthread_mutex_unlock(&c->mu);
    free(expired);
    return hit;
}

/* Take a free entry, evicting the least recently used one if none is
 * free; its old blob (or NULL) goes to *old. */
static uint32_t claim(ks_dek_cache *c, uint8_t **old)
{
    if (c->free_head == NIL) {
        assert(*old == NULL);
        *old = drop(c, c->lru);
    }
    uint32_t i = c->free_head;
    c->free_head = c->e[i].next;
    return i;
}

/* See dek_cache.h. */
void ks_dek_cache_put(ks_dek_cache *c, const uint8_t *key, size_t key_len, const uint8_t *val,
                      size_t val_len)
{
    if (c == NULL || val_len > c->value_max) {
        return;
    }
    uint8_t *blob = malloc(key_len + (c->secret ? 0 : val_len) + 1);
    if (blob == NULL) {
        return;
    }
    memcpy(blob, key, key_len);
    uint64_t h = hash_key(c, key, key_len);
    uint64_t expires = ks_mono_seconds() + c->ttl;
    uint8_t *old = NULL;
    pthread_mutex_lock(&c->mu);
    uint32_t i = find(c, h, key, key_len);
    if (i != NIL) {
        old = drop(c, i); /* same key: replaced by the new value */
    }
    i = claim(c, &old); /* evicts only when nothing was dropped just above */
    entry *x = &c->e[i];
    *x = (entry){h, expires, blob, key_len, val_len, c->bucket[h & c->bucket_mask], NIL, NIL};
    c->bucket[h & c->bucket_mask] = i;
    lru_push_front(c, i);
    memcpy(value_of(c, i), val, val_len);
    pthread_mutex_unlock(&c->mu);
    free(old);
}
