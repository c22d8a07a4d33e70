/*
 * migrate/crypto/dek_writer.h -- the write side of a ks_ctx: one active DEK per
 * (format, algorithm, tenant, purpose, key_id, requested key_version), and
 * nonce reservation on it (docs/format.md [F-CRYPTO-NONCE-1..3]).
 *
 * A DEK record (ks_wdek) is created by crypto.c (which talks to the
 * provider), then installed here.  Sealing takes nonces from a seal slot
 * (ks_seal_slot): a reference on a record and a block of its counter
 * values and byte budget, reserved in one short critical section by
 * ks_dek_writer_refill() and then spent by one thread alone with
 * ks_seal_slot_take(), which touches no shared memory.  A thread that
 * owns a shard (shard.h) keeps its slots between seals and so reserves
 * blocks of up to KS_SEAL_BLOCK_MAX nonces; others reserve one nonce at a
 * time.  A record is retired (removed from the table) when it reaches
 * max_messages, max_bytes or max_age, or when it was created by another
 * process (fork: see ks_fork_generation()); it is wiped and freed when
 * its last reference goes.
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_DEK_WRITER_H
#define KS_MIGRATE_DEK_WRITER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <keyshift/aad.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../../format/rules.h"

/* The counter's share of a nonce (its last bytes) [F-CRYPTO-NONCE-1]. */
#define KS_NONCE_COUNTER_LEN 8
/* The longest data AAD without its final lp(context) [F-CRYPTO-AAD-1]. */
#define KS_DATA_AAD_HEAD_MAX (KS_DATA_AAD_MAX - 4 - KS_CONTEXT_MAX)

/* What identifies the active DEK a seal uses.  Views are the caller's. */
typedef struct ks_wdek_tuple {
    uint8_t format;
    uint32_t algorithm;
    ks_bytes tenant;
    ks_bytes purpose;
    ks_bytes key_id;
    uint32_t req_version; /* as requested: 0 means the primary */
} ks_wdek_tuple;

/* When a DEK is retired [F-CRYPTO-NONCE-3]. */
typedef struct ks_wdek_limits {
    uint64_t max_messages;
    uint64_t max_bytes;
    uint32_t max_age;
} ks_wdek_limits;

/* The most nonces one seal slot reserves at a time, and the most
 * plaintext bytes (beyond the message at hand): a slot reserves
 * min(KS_SEAL_BLOCK_MAX, max_messages / 64) nonces (at least 1) and
 * min(KS_SEAL_BYTES_MAX, max_bytes / 64) bytes, so that an idle thread's
 * slot never holds more than 1/64 of a DEK's budget. */
#define KS_SEAL_BLOCK_MAX 256u
#define KS_SEAL_BYTES_MAX ((uint64_t)1 << 30)

/* One write-side DEK.  Immutable after ks_wdek_new() except counter and
 * bytes (changed only under the writer's lock) and refs.  The first
 * members are the ones every seal reads. */
typedef struct ks_wdek {
    uint64_t expires;          /* ks_mono_seconds() at which it retires */
    uint64_t generation;       /* ks_fork_generation() at creation */
    /* The AEAD key: the DEK itself in v1 [F-CRYPTO-KEY-1], the derived K
     * in v2 [F-CRYPTO-KEY-4] (mkey). */
    const uint8_t *aead_key;
    /* aes-256-gcm only (else NULL): libsodium's expanded key state of
     * aead_key (crypto_aead_aes256gcm_state, 16-byte aligned), computed
     * once, in sodium_malloc'd memory, and wiped and freed with the key. */
    void *aes;
    /* Names aead_key for the shards' OpenSSL states (aead.h): a seal
     * slot's state is keyed again whenever its DEK's serial differs. */
    uint64_t serial;
    /* The data AAD [F-CRYPTO-AAD-1] is aad_head || lp(context), aad_head
     * depending on the DEK's header alone (the v2 commitment is per DEK):
     * the library's ks_aad_data() of the template with an empty context,
     * less that context's 4-byte length. */
    size_t aad_head_len;
    uint8_t aad_head[KS_DATA_AAD_HEAD_MAX];
    /* Written under the writer's lock, by refills only. */
    _Alignas(64) uint64_t counter; /* next nonce counter [F-CRYPTO-NONCE-1] */
    uint64_t bytes;            /* plaintext bytes reserved so far (given back unused) */
    _Atomic uint32_t refs;     /* the table's reference + one per seal slot */
    uint64_t max_messages;     /* already capped at 2^32 for aes-256-gcm */
    uint64_t max_bytes;
    uint64_t block;            /* nonces a shard's slot reserves at a time */
    uint64_t chunk;            /* bytes it reserves beyond the message at hand */
    uint32_t req_version;
    uint8_t *key;              /* the DEK, KS_DEK_LEN bytes, sodium_malloc'd */
    uint8_t *mkey;             /* v2: K, 32 bytes, sodium_malloc'd; else NULL */
    /* The envelope header with the DEK's nonce prefix (random, drawn
     * once) and a zero counter as its nonce [F-CRYPTO-NONCE-1], and (v2)
     * the DEK's commitment [F-CRYPTO-COMMIT-2]: bytes [0,
     * tmpl.header_len) of every envelope sealed with this DEK, up to the
     * ciphertext tag, but for the counter.  tmpl's views point into
     * hdr. */
    ks_envelope tmpl;
    size_t nonce_off;          /* offset of the nonce bytes in hdr */
    size_t counter_off;        /* offset of the nonce's last 8 bytes, its counter */
    uint8_t hdr[];
} ks_wdek;

/* A block of nonces and bytes reserved on one record, spent by one
 * thread alone.  All zero is an empty slot. */
typedef struct ks_seal_slot {
    ks_wdek *d;                /* a reference on the record, or NULL */
    uint64_t next, end;        /* counter values reserved: [next, end) */
    uint64_t bytes;            /* plaintext bytes reserved and not yet sealed */
} ks_seal_slot;

/* A fresh DEK: KS_DEK_LEN random bytes in sodium_malloc'd memory, or NULL
 * when memory is short.  Free with ks_wdek_key_free(). */
uint8_t *ks_wdek_key_new(void);

/* Wipe and free a key made by ks_wdek_key_new(); NULL is a no-op. */
void ks_wdek_key_free(uint8_t *key);

/*
 * Build the record for `key` (taken over: freed with the record, and on
 * failure) sealing envelopes shaped like `shape` (every header field set,
 * nonce and commitment of the right length, any content; ciphertext
 * ignored).  req_version is the tuple's requested version.
 * KS_ERR_NO_MEMORY, or the encoder's error for a bad shape.
 */
KS_WUR ks_err ks_wdek_new(const ks_envelope *shape, uint32_t req_version, const ks_wdek_limits *lim,
                          uint8_t *key, ks_wdek **out);

/* Take one more reference on d. */
void ks_wdek_retain(ks_wdek *d);

/* Drop one reference; the last one wipes and frees the record.  NULL is a
 * no-op. */
void ks_wdek_release(ks_wdek *d);

/* The 8 bytes at p (wide), or the 4. */
static inline uint64_t ks_wdek_load_word(const uint8_t *p, int wide)
{
    if (wide) {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Nonzero when a[0, n) equals b[0, n), as memcmp() == 0: inline, with two
 * overlapping loads, for the 4 to 16 bytes most names have (every seal
 * compares three, and the calls cost more than the compares).  The names
 * are public: not constant time. */
static inline __attribute__((always_inline)) int ks_wdek_same_bytes(const uint8_t *a, const uint8_t *b,
                                                                    size_t n)
{
    if (n >= 4 && n <= 16) {
        const int wide = n >= 8;
        const size_t last = n - (wide ? 8 : 4);
        const uint64_t first = ks_wdek_load_word(a, wide) ^ ks_wdek_load_word(b, wide);
        const uint64_t end = ks_wdek_load_word(a + last, wide) ^ ks_wdek_load_word(b + last, wide);
        return (first | end) == 0;
    }
    return n == 0 || memcmp(a, b, n) == 0;
}

/* Nonzero when d is the active DEK of t (d's header fields and requested
 * version are t's).  Inline: every seal compares. */
static inline __attribute__((always_inline)) int ks_wdek_match(const ks_wdek *d, const ks_wdek_tuple *t)
{
    const ks_envelope *e = &d->tmpl;
    return e->version == t->format && e->algorithm == t->algorithm &&
           d->req_version == t->req_version && e->tenant.len == t->tenant.len &&
           e->purpose.len == t->purpose.len && e->key_id.len == t->key_id.len &&
           ks_wdek_same_bytes(e->tenant.ptr, t->tenant.ptr, t->tenant.len) &&
           ks_wdek_same_bytes(e->purpose.ptr, t->purpose.ptr, t->purpose.len) &&
           ks_wdek_same_bytes(e->key_id.ptr, t->key_id.ptr, t->key_id.len);
}

/*
 * Nonzero when s, known to be on the tuple a seal asks for, can seal a
 * message of pt_len bytes, given the process generation and the clock; 0
 * when it cannot (empty, spent, or its record expired or of another
 * process generation): then ks_dek_writer_refill().  Reads s and its
 * immutable record only.
 */
static inline int ks_seal_slot_fresh(const ks_seal_slot *s, size_t pt_len, uint64_t gen, uint64_t now)
{
    const ks_wdek *d = s->d;
    return d != NULL && s->next < s->end && pt_len <= s->bytes && d->generation == gen && now < d->expires;
}

/* ks_seal_slot_fresh() for a slot that may be on another tuple than t
 * (then 0). */
static inline int ks_seal_slot_ready(const ks_seal_slot *s, const ks_wdek_tuple *t, size_t pt_len,
                                     uint64_t gen, uint64_t now)
{
    return ks_seal_slot_fresh(s, pt_len, gen, now) && ks_wdek_match(s->d, t);
}

/* Spend one nonce of a ready (or just refilled) slot s on a message of
 * pt_len bytes: returns its counter value c, the nonce being s->d's
 * prefix || u64be(c) [F-CRYPTO-NONCE-1] (ks_wdek_put_counter()).
 * Touches s alone. */
static inline uint64_t ks_seal_slot_take(ks_seal_slot *s, size_t pt_len)
{
    s->bytes -= pt_len;
    return s->next++;
}

/* Write counter value c into hdr, a copy of d->hdr (at the same offsets),
 * making its nonce d's prefix || u64be(c) [F-CRYPTO-NONCE-1]. */
static inline void ks_wdek_put_counter(const ks_wdek *d, uint8_t *hdr, uint64_t c)
{
    ks_be_put(hdr + d->counter_off, c, KS_NONCE_COUNTER_LEN);
}

typedef struct ks_dek_writer ks_dek_writer;

/* A writer with no DEK.  KS_ERR_NO_MEMORY. */
KS_WUR ks_err ks_dek_writer_new(ks_dek_writer **out);

/* Release every record (in-flight seals keep theirs alive) and free. */
void ks_dek_writer_free(ks_dek_writer *w);

/*
 * Refill s for a message of pt_len bytes under tuple t, in one critical
 * section: give back s's unsealed bytes, then reserve on t's active DEK
 * (keeping s's nonces when it is the same record and some are left) a
 * block of nonces and bytes: the record's block and chunk when `block` is
 * nonzero (a shard's slot, kept between seals), else one nonce and
 * exactly pt_len bytes.  A record at a limit is retired.  KS_OK: s serves
 * this message (ks_seal_slot_take() may follow).  KS_ERR_NOT_FOUND: t has
 * no usable DEK; s is then empty, and the caller creates a DEK and
 * installs it.
 */
KS_WUR ks_err ks_dek_writer_refill(ks_dek_writer *w, const ks_wdek_tuple *t, size_t pt_len,
                                   int block, ks_seal_slot *s);

/* Make d the tuple's active DEK (the table takes over the caller's
 * reference), retiring any record it replaces, and the oldest record when
 * the table is full; then, in the same critical section, refill s from
 * d as ks_dek_writer_refill() does.  KS_ERR_NOT_FOUND only when d is spent
 * at once (the clock jumped by max_age, or the process forked). */
KS_WUR ks_err ks_dek_writer_install(ks_dek_writer *w, ks_wdek *d, size_t pt_len, int block,
                                    ks_seal_slot *s);

/* Empty s: give back its unsealed bytes and drop its reference. */
void ks_dek_writer_drop(ks_dek_writer *w, ks_seal_slot *s);

/* Serialise DEK creation (provider calls) without blocking seals. */
void ks_dek_writer_create_lock(ks_dek_writer *w);
void ks_dek_writer_create_unlock(ks_dek_writer *w);

/* fork() safety (crypto.c's atfork handlers): take every lock of w, in
 * the order the writer takes them, except the creation lock when the
 * calling thread holds it; release them again, in the parent and in the
 * child alike. */
void ks_dek_writer_fork_prepare(ks_dek_writer *w);
void ks_dek_writer_fork_release(ks_dek_writer *w);

/*
 * The process generation [F-CRYPTO-NONCE-2]: changes in a child after
 * fork() (pthread_atfork) and, where MADV_WIPEONFORK exists, after any
 * clone that copies the address space (a marker page reads zero there).
 * A record made under another generation is never used.
 */
uint64_t ks_fork_generation(void);

#endif /* KS_MIGRATE_DEK_WRITER_H */
