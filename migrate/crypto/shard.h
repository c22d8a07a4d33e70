/*
 * migrate/crypto/shard.h -- one thread's share of a ks_ctx: its seal slots
 * (dek_writer.h) and a few read keys, so that a seal on an active DEK and
 * an open whose DEK is cached write no memory that another thread writes.
 *
 * A context has one shard per thread index (thread_index.h), made by its
 * owner on first use and used by that owner alone, with no lock; threads
 * on the shared index have none and take the locked paths (the writer's
 * table, the read cache).  Sharing a context between threads therefore
 * costs no cache-line traffic on the hot paths.
 *
 * Read keys ("rkeys"): what an open needs of a DEK, the read cache's value
 * (crypto.c): v1, the DEK (the AEAD key, [F-CRYPTO-KEY-1]); v2, K || C ||
 * DEK ([F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]).  The AEAD key is always the
 * first 32 bytes.  A shard keeps a few of them (ks_shard_new()), each with
 * the wrap identity it belongs to (compared in full), its expiry (that of
 * the read cache's entry it was copied from, so the cache TTL bounds it
 * too) and, for aes-256-gcm, its expanded key.  Secrets live in one
 * sodium_malloc'd slab per shard and are wiped on replacement and free.
 *
 * Each seal slot and each read key also has the owner's OpenSSL state
 * for its key (aead.h: a cipher context per algorithm, made once, keyed
 * once per key), so the OpenSSL engine allocates nothing per call and
 * never shares a context between threads.  A seal slot's state is keyed
 * again whenever its DEK's serial differs (a refill onto another DEK); a
 * read key's is overwritten when the slot is replaced.  Emptying a shard
 * (clear, abandon) overwrites every key schedule; freeing it frees the
 * contexts.
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_SHARD_H
#define KS_MIGRATE_SHARD_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include <keyshift/provider.h>

#include "../../parser/envelope_head.h"
#include "aead.h"
#include "dek_writer.h"

/* Seal slots and read keys per shard: tuples and DEKs one thread uses in
 * turn (a service alternating between a few tenants). */
#define KS_SHARD_SEALS 4u
#define KS_SHARD_OPENS 4u
/* The longest read keys: K || C || DEK. */
#define KS_RKEYS_MAX (32 + KS_COMMITMENT_LEN + KS_DEK_LEN)

/* The longest context whose data AAD [F-CRYPTO-AAD-1] a seal slot or a
 * read key builds in place: the head kept in the slot, lp(context)
 * written after it per call.  A longer context's AAD is built on the
 * caller's frame. */
#define KS_AAD_CONTEXT_SMALL 256u
#define KS_AAD_SMALL (KS_DATA_AAD_HEAD_MAX + 4 + KS_AAD_CONTEXT_SMALL)

/* A seal slot's data AAD: its DEK's AAD head (dek_writer.h), copied when
 * the slot's DEK changes, then lp(context) per seal.  Public bytes. */
typedef struct ks_seal_aad {
    uint64_t serial;    /* the DEK (ks_wdek.serial) whose head buf holds; 0: none */
    uint8_t buf[KS_AAD_SMALL];
} ks_seal_aad;

/* One cached read key of a shard.  expires 0: empty. */
typedef struct ks_open_slot {
    uint64_t expires;   /* ks_mono_seconds() from which it is not used */
    size_t id_len;
    size_t keys_len;
    uint8_t *id;        /* the wrap identity, then the header's tail (public) */
    uint8_t *keys;      /* KS_RKEYS_MAX bytes of guarded memory */
    void *aes;          /* the expanded AES-GCM key of keys[0, 32), or NULL */
    uint64_t serial;    /* names keys[0, 32) for evp (ks_aead_serial()) */
    ks_aead_evp evp;    /* the owner's OpenSSL state for keys[0, 32) (aead.h) */
    /* The shape of the envelopes it opens (parser/envelope_head.h): their
     * header is id[head_at, head_at + head.header_len), the wrap
     * identity's head and then the rest of the header; head.len 0: none. */
    ks_envelope_head head;
    size_t head_at;
    /* The data AAD of those envelopes less its lp(context) (as a seal
     * slot's DEK keeps it, dek_writer.h), written by the owner after a
     * put, with room for a small context's lp(context) after it;
     * aad_len 0: none. */
    size_t aad_len;
    uint8_t aad[KS_AAD_SMALL];
} ks_open_slot;

typedef struct ks_shard {
    ks_seal_slot seal[KS_SHARD_SEALS];
    ks_open_slot open[KS_SHARD_OPENS];
    ks_aead_evp seal_evp[KS_SHARD_SEALS]; /* the OpenSSL state of seal[i]'s DEK */
    ks_seal_aad seal_aad[KS_SHARD_SEALS]; /* the data AAD of seal[i]'s seals */
    uint32_t seal_next, open_next; /* the next slot to replace */
    uint32_t seal_last; /* the seal slot found or replaced last */
    uint32_t opens;     /* read keys kept: <= KS_SHARD_OPENS */
    uint32_t open_last; /* the read key found or put last */
    size_t id_max;
    uint8_t *secret;    /* the slab: AES states, then read keys */
    uint8_t *ids;
} ks_shard;

/* A shard with empty slots, keeping up to min(opens, KS_SHARD_OPENS) read
 * keys (the context's cache_entries: a shard never keeps more DEKs than
 * the read cache may) of wrap identities of up to id_max bytes, or NULL
 * when memory is short. */
ks_shard *ks_shard_new(size_t id_max, uint32_t opens);

/* Drop every seal slot's reference, wipe every secret and free; NULL is a
 * no-op.  Its records' unsealed bytes are not given back (the context
 * goes too). */
void ks_shard_free(ks_shard *sh);

/* Empty sh for its owner, which is exiting: give back each seal slot's
 * unsealed bytes and drop its reference (ks_dek_writer_drop, on w), and
 * wipe every read key.  The shard stays, empty, for the index's next
 * owner. */
void ks_shard_clear(ks_shard *sh, ks_dek_writer *w);

/* In a child of fork(), for a shard whose owner was another thread: its
 * slots may have been mid-update when the address space was copied, so
 * they are not interpreted: secrets wiped, slots emptied (their record
 * references are abandoned, never dropped). */
void ks_shard_abandon(ks_shard *sh);

/* The seal slot for t: the one on t's tuple (*on_t set to 1), else the
 * next to replace (*on_t 0; ks_dek_writer_refill() gives back and drops
 * what it held); either becomes the last one.  ks_shard_seal_slot() tries
 * the last one inline. */
ks_seal_slot *ks_shard_seal_find(ks_shard *sh, const ks_wdek_tuple *t, int *on_t);

static inline ks_seal_slot *ks_shard_seal_slot(ks_shard *sh, const ks_wdek_tuple *t, int *on_t)
{
    assert(sh->seal_last < KS_SHARD_SEALS);
    ks_seal_slot *s = &sh->seal[sh->seal_last];
    if (s->d != NULL && ks_wdek_match(s->d, t)) {
        *on_t = 1;
        return s;
    }
    return ks_shard_seal_find(sh, t, on_t);
}

/* The read keys cached under id[0, id_len) and valid at `now`, or NULL
 * (not const: the owner uses the slot's OpenSSL state); a slot found
 * becomes the last one. */
ks_open_slot *ks_shard_open_find(ks_shard *sh, const uint8_t *id, size_t id_len, uint64_t now);

/* The slot found or put last, when it holds read keys (valid or not at
 * this time: the caller checks its expiry), else NULL. */
ks_open_slot *ks_shard_open_last(ks_shard *sh);

/* Cache keys[0, keys_len) under id[0, id_len) until `expires`, replacing
 * the next slot (wiped first, its OpenSSL key schedules too) under a new
 * serial; with aes nonzero, also expand keys[0, 32) for aes-256-gcm.
 * head is the shape of an envelope the keys open, parsed from hdr (its
 * header: hdr[0, head->header_len)), whose head is id[head_at, id_len);
 * the slot keeps the rest of the header after the id.  Returns the slot,
 * now the last one, or NULL when id is too long. */
ks_open_slot *ks_shard_open_put(ks_shard *sh, const uint8_t *id, size_t id_len,
                                const ks_envelope_head *head, size_t head_at, const uint8_t *hdr,
                                const uint8_t *keys, size_t keys_len, uint64_t expires, int aes);

#endif /* KS_MIGRATE_SHARD_H */
