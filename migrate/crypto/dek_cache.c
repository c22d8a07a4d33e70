/*
 * migrate/crypto/dek_cache.c -- the bounded, expiring LRU map of dek_cache.h.
 *
 * Layout: a fixed array of entries (allocated once), a power-of-two bucket
 * array of chain heads, a doubly linked LRU list and a free list, all by
 * 32-bit index.  Each entry's key (and a public value) lives in one heap
 * blob allocated on insert, outside the lock; secret values live in a
 * sodium_malloc'd slab, value_max bytes per entry.
 *
 * Derived states (optional) live in a second sodium_malloc'd slab of
 * state slots, with their own LRU list.  A slot's pin word counts the
 * readers using it outside the lock, plus ORPHAN once its entry is gone.
 * Pins are only taken under the lock and only on an owned slot; a slot is
 * only (re)claimed under the lock when its pin word reads 0 (acquire,
 * pairing with the release of the last unpin), so no reader ever sees a
 * state change under it.  An orphan is wiped by whoever sees its last
 * pin go: the dropper (under the lock) when there was none, else the
 * last unpinner, which then clears the word (release).
 */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "dek_cache.h"
#include "mono_clock.h"
#include "../alloc_hook.h"

#define NIL UINT32_MAX
/* NH's input in 32-bit words: the longest tail, then u64(key length). */
#define KS_NH_WORDS ((KS_CACHE_HASH_TAIL_MAX + 8) / 4)
_Static_assert(KS_NH_WORDS % 2 == 0, "NH takes its words in pairs");
/* In a state slot's pin word: its entry is gone (see the top). */
#define ORPHAN 0x80000000u

/* An LRU list link, by index: the first member of an entry and of a
 * state slot, so that one set of list functions serves both. */
typedef struct links {
    uint32_t prev; /* towards the most recent */
    uint32_t next; /* towards the least recent; an entry's free list link */
} links;

typedef struct entry {
    links lk;          /* the entries' LRU list */
    uint32_t chain;    /* next entry in the bucket */
    uint32_t state;    /* its derived state slot, or NIL */
    uint64_t hash;
    uint64_t expires;  /* ks_mono_seconds() at which it is dropped */
    uint8_t *blob;     /* key || public value; NULL when the entry is free */
    size_t key_len;
    size_t val_len;
} entry;

/* A derived state slot. */
typedef struct state_slot {
    links lk;              /* the slots' LRU list */
    uint32_t owner;        /* the entry it belongs to, or NIL */
    _Atomic uint32_t pins; /* readers outside the lock, | ORPHAN */
} state_slot;

struct ks_dek_cache {
    pthread_mutex_t mu;
    /* Lookups that hit and missed: written only under mu (so a plain
     * load and store count them, without a locked read-modify-write),
     * read at any time. */
    _Atomic uint64_t hits, misses;
    uint32_t entries, ttl, bucket_mask;
    size_t value_max;
    size_t hash_tail;  /* 0: hash whole keys; else see hash_key() */
    int secret;
    uint8_t hkey[crypto_shorthash_KEYBYTES]; /* whole keys: SipHash-2-4 */
    uint32_t nh[KS_NH_WORDS];                 /* key tails: NH */
    uint8_t *slab;     /* secret values, or NULL */
    entry *e;
    uint32_t *bucket;
    uint32_t mru, lru, free_head;
    /* derived states: none when states == 0 */
    uint32_t states, st_mru, st_lru;
    size_t state_size;
    ks_dek_cache_derive_fn derive;
    uint8_t *st_slab;  /* states * state_size bytes */
    state_slot *st;
};

/*
 * The keyed hash of a key's tail (c->hash_tail set): NH, the universal
 * hash of UMAC (Black et al., 1999), over the key's last hash_tail bytes
 * (a key shorter than that zero-padded in front) and u64(key length), as
 * 32-bit words m[i], under the map's random words k[i] (the tail's taking
 * the key words just before the length's, as if the tail were zero-padded
 * in front to KS_CACHE_HASH_TAIL_MAX):
 *     sum over pairs of (m[2j] + k[2j] mod 2^32) * (m[2j+1] + k[2j+1] mod 2^32)
 * mod 2^64, rotated by 32 so that the bucket bits come from the products'
 * high halves (a product's low bits depend only on its factors' low bits).
 *
 * A short, non-cryptographic hash stays safe against crafted lookups
 * because the hash only picks a bucket: a hit still needs the full key
 * comparison in find(), and entries are inserted only by a caller that has
 * authenticated the key (the read cache puts a wrap identity only after
 * its provider unwrapped it).  A forged key therefore only walks a chain
 * of genuine entries, and chain lengths are set by genuine keys alone.
 * For the read cache the tail is the end of the wrapped DEK: the wrapping
 * AEAD's tag (local keyring) or the end of a KMS ciphertext, pseudorandom
 * and not chosen by whoever asks for the wrap, so genuine entries spread
 * evenly; the per-map random key keeps even a holder of many genuine
 * envelopes from working out offline which of them share a bucket.  NH
 * costs a few multiplications where SipHash-2-4 over the same 24 bytes
 * took about 35 ns, a sixth of a 128-byte AES-GCM open.
 */
static uint64_t nh_tail(const ks_dek_cache *c, const uint8_t *key, size_t len)
{
    const size_t n = c->hash_tail; /* a multiple of 8 */
    uint8_t pad[KS_CACHE_HASH_TAIL_MAX] = {0};
    const uint8_t *tail = key + len - n;
    uint32_t m[2], k0 = 0, k1 = 0;
    uint64_t h = 0;
    if (len < n) { /* a short key: zero-padded in front */
        memcpy(pad + (n - len), key, len);
        tail = pad;
    }
    /* The tail's words pair with the last key words before the length's. */
    const uint32_t *k = c->nh + (KS_CACHE_HASH_TAIL_MAX - n) / 4;
    for (size_t j = 0; j < n / 4; j += 2) {
        memcpy(m, tail + 4 * j, sizeof m);
        k0 = k[j];
        k1 = k[j + 1];
        h += (uint64_t)(uint32_t)(m[0] + k0) * (uint32_t)(m[1] + k1);
    }
    const uint64_t len64 = len;
    memcpy(m, &len64, sizeof m); /* host order: the hash is never stored */
    k0 = c->nh[KS_NH_WORDS - 2];
    k1 = c->nh[KS_NH_WORDS - 1];
    h += (uint64_t)(uint32_t)(m[0] + k0) * (uint32_t)(m[1] + k1);
    return h >> 32 | h << 32;
}

/* The keyed hash of a key: SipHash-2-4 under the map's random key over
 * the whole key, or, when c->hash_tail is set, nh_tail(). */
static uint64_t hash_key(const ks_dek_cache *c, const uint8_t *key, size_t len)
{
    uint8_t h[crypto_shorthash_BYTES];
    uint64_t v = 0;
    if (c->hash_tail != 0) {
        return nh_tail(c, key, len);
    }
    (void)crypto_shorthash(h, key, len, c->hkey); /* cannot fail */
    memcpy(&v, h, sizeof v);
    return v;
}

/* Where entry i's value is. */
static uint8_t *value_of(const ks_dek_cache *c, uint32_t i)
{
    const entry *x = &c->e[i];
    return c->secret ? c->slab + (size_t)i * c->value_max : x->blob + x->key_len;
}

/* An LRU list over an array of records (entries or state slots) that
 * start with their links. */
typedef struct lru_list {
    uint32_t *mru, *lru;
    void *base;
    size_t stride;
} lru_list;

/* Record i's links. */
static links *link_of(const lru_list *l, uint32_t i)
{
    return (links *)(void *)((uint8_t *)l->base + (size_t)i * l->stride);
}

/* The entries' LRU list, and the state slots'. */
static lru_list entries_lru(ks_dek_cache *c)
{
    return (lru_list){&c->mru, &c->lru, c->e, sizeof *c->e};
}

static lru_list slots_lru(ks_dek_cache *c)
{
    return (lru_list){&c->st_mru, &c->st_lru, c->st, sizeof *c->st};
}

/* Unlink i from list l. */
static void list_unlink(const lru_list *l, uint32_t i)
{
    const links *x = link_of(l, i);
    *(x->prev != NIL ? &link_of(l, x->prev)->next : l->mru) = x->next;
    *(x->next != NIL ? &link_of(l, x->next)->prev : l->lru) = x->prev;
}

/* Link i into list l at its most recent end (front) or least recent end. */
static void list_push(const lru_list *l, uint32_t i, int front)
{
    links *x = link_of(l, i);
    if (front) {
        x->prev = NIL;
        x->next = *l->mru;
        *(*l->mru != NIL ? &link_of(l, *l->mru)->prev : l->lru) = i;
        *l->mru = i;
    } else {
        x->next = NIL;
        x->prev = *l->lru;
        *(*l->lru != NIL ? &link_of(l, *l->lru)->next : l->mru) = i;
        *l->lru = i;
    }
}

/* Unlink i from the LRU list. */
static void lru_unlink(ks_dek_cache *c, uint32_t i)
{
    lru_list l = entries_lru(c);
    list_unlink(&l, i);
}

/* Make i the most recently used entry. */
static void lru_push_front(ks_dek_cache *c, uint32_t i)
{
    lru_list l = entries_lru(c);
    list_push(&l, i, 1);
}

/* Where state slot s's bytes are. */
static uint8_t *state_of(const ks_dek_cache *c, uint32_t s)
{
    return c->st_slab + (size_t)s * c->state_size;
}

/* Make slot s the most (front) or least recently used one. */
static void slot_move(ks_dek_cache *c, uint32_t s, int front)
{
    lru_list l = slots_lru(c);
    list_unlink(&l, s);
    list_push(&l, s, front);
}

/* Entry i gives up its state, if any (lock held): wiped now when no
 * reader has it pinned, else by the last unpin; then first to reuse. */
static void state_release(ks_dek_cache *c, uint32_t i)
{
    uint32_t s = c->e[i].state;
    if (s == NIL) {
        return;
    }
    c->e[i].state = NIL;
    c->st[s].owner = NIL;
    if (atomic_fetch_or_explicit(&c->st[s].pins, ORPHAN, memory_order_acq_rel) == 0) {
        sodium_memzero(state_of(c, s), c->state_size);
        atomic_store_explicit(&c->st[s].pins, 0, memory_order_relaxed); /* nobody can pin it */
    }
    slot_move(c, s, 0);
}

/* Give entry i a state derived from val (lock held): the least recently
 * used slot with no pin, taken from its owner if it has one. */
static void state_attach(ks_dek_cache *c, uint32_t i, const uint8_t *val, size_t val_len)
{
    uint32_t s = c->st_lru;
    while (s != NIL && atomic_load_explicit(&c->st[s].pins, memory_order_acquire) != 0) {
        s = c->st[s].lk.prev; /* pinned now: at most one per reader in flight */
    }
    if (s == NIL) {
        return;
    }
    if (c->st[s].owner != NIL) {
        c->e[c->st[s].owner].state = NIL; /* overwritten just below */
    }
    c->derive(state_of(c, s), val, val_len);
    c->st[s].owner = i;
    c->e[i].state = s;
    slot_move(c, s, 1);
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
    state_release(c, i);
    sodium_memzero(value_of(c, i), c->secret ? c->value_max : x->val_len);
    x->blob = NULL;
    x->lk.next = c->free_head;
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

/* Add one to a counter of c (c->mu held, so no other writer). */
static void count(_Atomic uint64_t *n)
{
    atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Expand c->hkey into NH's key words: SipHash-2-4 under hkey of the word
 * pair's index.  Drawing no second random key keeps a map's random draws
 * what they were (deterministic test runs replay the same sequence). */
static void nh_key(ks_dek_cache *c)
{
    for (uint64_t j = 0; j < KS_NH_WORDS / 2; j++) {
        uint8_t in[8], h[crypto_shorthash_BYTES];
        memcpy(in, &j, sizeof in);
        (void)crypto_shorthash(h, in, sizeof in, c->hkey); /* cannot fail */
        memcpy(&c->nh[2 * j], h, 2 * sizeof c->nh[0]);
    }
}

/* See dek_cache.h. */
ks_err ks_dek_cache_new(uint32_t entries, uint32_t ttl, size_t value_max, int secret,
                        size_t hash_tail, ks_dek_cache **out)
{
    if (entries == 0 || entries > KS_CACHE_ENTRIES_MAX || ttl == 0 || value_max == 0 ||
        hash_tail > KS_CACHE_HASH_TAIL_MAX || hash_tail % 8 != 0 || out == NULL) {
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
        c->e[i].lk.next = i + 1 < entries ? i + 1 : NIL;
        c->e[i].state = NIL;
    }
    c->entries = entries;
    c->ttl = ttl;
    c->bucket_mask = nb - 1;
    c->value_max = value_max;
    c->hash_tail = hash_tail;
    c->secret = secret != 0;
    c->mru = c->lru = NIL;
    c->free_head = 0;
    atomic_init(&c->hits, 0);
    atomic_init(&c->misses, 0);
    crypto_shorthash_keygen(c->hkey);
    nh_key(c);
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
    if (c->st_slab != NULL) { /* no pin is left when the map is freed */
        sodium_memzero(c->st_slab, (size_t)c->states * c->state_size);
        sodium_free(c->st_slab);
    }
    free(c->st);
    pthread_mutex_destroy(&c->mu);
    free(c->bucket);
    free(c->e);
    free(c);
}

/* See dek_cache.h. */
int ks_dek_cache_get(ks_dek_cache *c, const uint8_t *key, size_t key_len, uint8_t *val,
                     size_t *val_len)
{
    return ks_dek_cache_get_pinned(c, key, key_len, val, val_len, NULL, NULL);
}

/* See dek_cache.h. */
void ks_dek_cache_fork_prepare(ks_dek_cache *c)
{
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
    }
}

/* See dek_cache.h. */
void ks_dek_cache_fork_release(ks_dek_cache *c)
{
    if (c != NULL) {
        pthread_mutex_unlock(&c->mu);
    }
}

/* See dek_cache.h; pin NULL: always copy the value. */
int ks_dek_cache_get_pinned(ks_dek_cache *c, const uint8_t *key, size_t key_len, uint8_t *val,
                            size_t *val_len, ks_dek_cache_pin *pin, uint64_t *expires)
{
    if (pin != NULL) {
        pin->state = NULL;
    }
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
        if (i != c->mru) {
            lru_unlink(c, i);
            lru_push_front(c, i);
        }
        uint32_t s = c->e[i].state;
        if (pin != NULL && s != NIL) {
            atomic_fetch_add_explicit(&c->st[s].pins, 1, memory_order_relaxed); /* under the lock */
            if (s != c->st_mru) {
                slot_move(c, s, 1);
            }
            *pin = (ks_dek_cache_pin){state_of(c, s), s};
        } else {
            memcpy(val, value_of(c, i), c->e[i].val_len);
            *val_len = c->e[i].val_len;
        }
        if (expires != NULL) {
            *expires = c->e[i].expires;
        }
        hit = 1;
    }
    count(hit ? &c->hits : &c->misses);
    pthread_mutex_unlock(&c->mu);
    free(expired);
    return hit;
}

/* See dek_cache.h. */
void ks_dek_cache_counts(ks_dek_cache *c, uint64_t *hits, uint64_t *misses)
{
    *hits = c == NULL ? 0 : atomic_load_explicit(&c->hits, memory_order_relaxed);
    *misses = c == NULL ? 0 : atomic_load_explicit(&c->misses, memory_order_relaxed);
}

/* See dek_cache.h.  The release orders this reader's use of the state
 * before its wipe or reuse (which see the word drop to 0 with acquire). */
void ks_dek_cache_unpin(ks_dek_cache *c, ks_dek_cache_pin *pin)
{
    if (pin->state == NULL) {
        return;
    }
    uint32_t s = pin->slot;
    pin->state = NULL;
    if (atomic_fetch_sub_explicit(&c->st[s].pins, 1, memory_order_acq_rel) == (ORPHAN | 1)) {
        sodium_memzero(state_of(c, s), c->state_size); /* orphaned: nobody else can reach it */
        atomic_store_explicit(&c->st[s].pins, 0, memory_order_release);
    }
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
    c->free_head = c->e[i].lk.next;
    return i;
}

/* See dek_cache.h. */
void ks_dek_cache_put(ks_dek_cache *c, const uint8_t *key, size_t key_len, const uint8_t *val,
                      size_t val_len, int derive)
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
    *x = (entry){{NIL, NIL}, c->bucket[h & c->bucket_mask], NIL, h, expires, blob, key_len, val_len};
    c->bucket[h & c->bucket_mask] = i;
    lru_push_front(c, i);
    memcpy(value_of(c, i), val, val_len);
    if (derive && c->states != 0) {
        state_attach(c, i, val, val_len);
    }
    pthread_mutex_unlock(&c->mu);
    free(old);
}

/* See dek_cache.h.  Every slot starts unowned in the slots' LRU list. */
ks_err ks_dek_cache_enable_states(ks_dek_cache *c, size_t state_size, uint32_t states_max,
                                  ks_dek_cache_derive_fn derive)
{
    if (c == NULL || !c->secret || c->states != 0 || state_size == 0 || state_size % 16 != 0 ||
        states_max == 0 || derive == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    uint32_t n = states_max < c->entries ? states_max : c->entries;
    /* sodium_malloc puts the region flush with its guard page: a size that
     * is a multiple of 16 keeps every state 16-byte aligned. */
    c->st_slab = sodium_malloc((size_t)n * state_size);
    c->st = calloc(n, sizeof *c->st);
    if (c->st_slab == NULL || c->st == NULL) {
        sodium_free(c->st_slab);
        free(c->st);
        c->st_slab = NULL;
        c->st = NULL;
        return KS_ERR_NO_MEMORY;
    }
    assert(((uintptr_t)c->st_slab & 15) == 0);
    sodium_memzero(c->st_slab, (size_t)n * state_size);
    c->state_size = state_size;
    c->derive = derive;
    c->st_mru = c->st_lru = NIL;
    lru_list l = slots_lru(c);
    for (uint32_t s = 0; s < n; s++) {
        atomic_init(&c->st[s].pins, 0);
        c->st[s].owner = NIL;
        list_push(&l, s, 0);
    }
    c->states = n;
    return KS_OK;
}
