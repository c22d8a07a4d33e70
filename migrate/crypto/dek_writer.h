/*
 * migrate/crypto/dek_writer.h -- the write side of a ks_ctx: one active DEK per
 * (format, algorithm, tenant, purpose, key_id, requested key_version), and
 * nonce reservation on it (docs/format.md [F-CRYPTO-NONCE-1..3]).
 *
 * A DEK record (ks_wdek) is created by crypto.c (which talks to the
 * provider), then installed here.  Sealing reserves one nonce with
 * ks_dek_writer_reserve(): one short critical section finds the record,
 * takes a counter value and byte budget of it, and takes a reference.  A
 * record is retired (removed from the table) when it reaches
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

#include <keyshift/aad.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>

/* The longest nonce of the format, and the counter's share of it. */
#define KS_NONCE_MAX KS_XCHACHA20POLY1305_NONCE_LEN
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

/* One write-side DEK.  Immutable after ks_wdek_new() except counter and
 * bytes (changed only by the creator before ks_dek_writer_install(), then
 * only under the writer's lock) and refs. */
typedef struct ks_wdek {
    uint64_t counter;          /* next nonce counter [F-CRYPTO-NONCE-1] */
    uint64_t bytes;            /* plaintext bytes reserved so far */
    _Atomic uint32_t refs;     /* the table's reference + one per seal in flight */
    uint64_t max_messages;     /* already capped at 2^32 for aes-256-gcm */
    uint64_t max_bytes;
    uint64_t expires;          /* ks_mono_seconds() at which it retires */
    uint64_t generation;       /* ks_fork_generation() at creation */
    uint32_t req_version;
    uint8_t *key;              /* KS_DEK_LEN bytes, sodium_malloc'd */
    /* v1 aes-256-gcm only (else NULL): the AEAD key is the DEK itself
     * [F-CRYPTO-KEY-1], so libsodium's expanded key state
     * (crypto_aead_aes256gcm_state, 16-byte aligned) is computed once, in
     * sodium_malloc'd memory, and wiped and freed with the key. */
    void *aes;
    uint8_t prefix[KS_NONCE_MAX - KS_NONCE_COUNTER_LEN]; /* random, per DEK */
    /* v1 only (else aad_head_len 0): the data AAD [F-CRYPTO-AAD-1] is
     * aad_head || lp(context), aad_head depending on the DEK's header
     * alone (v2 puts the per-message commitment before lp(context)); it
     * is the library's ks_aad_data() of the template with an empty
     * context, less that context's 4-byte length. */
    size_t aad_head_len;
    uint8_t aad_head[KS_DATA_AAD_HEAD_MAX];
    /* The envelope header with a zero nonce and commitment: bytes
     * [0, tmpl.header_len) of every envelope sealed with this DEK, up to
     * the ciphertext tag.  tmpl's views point into hdr. */
    ks_envelope tmpl;
    size_t nonce_off;          /* offset of the nonce bytes in hdr */
    size_t commit_off;         /* v2: offset of the commitment bytes; else 0 */
    uint8_t hdr[];
} ks_wdek;

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

/* Reserve one nonce of d, not yet installed, for a message of pt_len
 * bytes into nonce[0, nonce length): KS_OK, or KS_ERR_NOT_FOUND when d
 * must retire (counter, bytes or age at its limit, or another process
 * generation). */
KS_WUR ks_err ks_wdek_reserve(ks_wdek *d, size_t pt_len, uint8_t nonce[KS_NONCE_MAX]);

typedef struct ks_dek_writer ks_dek_writer;

/* A writer with no DEK.  KS_ERR_NO_MEMORY. */
KS_WUR ks_err ks_dek_writer_new(ks_dek_writer **out);

/* Release every record (in-flight seals keep theirs alive) and free. */
void ks_dek_writer_free(ks_dek_writer *w);

/*
 * Find the tuple's active DEK and reserve one nonce of it for a message of
 * pt_len bytes: on KS_OK, *out holds a reference (ks_wdek_release() it)
 * and nonce[0, nonce length) the unique nonce.  KS_ERR_NOT_FOUND when the
 * tuple has no usable DEK (none yet, or the one there was just retired):
 * the caller creates one and installs it.
 */
KS_WUR ks_err ks_dek_writer_reserve(ks_dek_writer *w, const ks_wdek_tuple *t, size_t pt_len,
                                    ks_wdek **out, uint8_t nonce[KS_NONCE_MAX]);

/* Make d the tuple's active DEK (the table takes over the caller's
 * reference), retiring any record it replaces, and the oldest record when
 * the table is full. */
void ks_dek_writer_install(ks_dek_writer *w, ks_wdek *d);

/* Serialise DEK creation (provider calls) without blocking seals. */
void ks_dek_writer_create_lock(ks_dek_writer *w);
void ks_dek_writer_create_unlock(ks_dek_writer *w);

/*
 * The process generation [F-CRYPTO-NONCE-2]: changes in a child after
 * fork() (pthread_atfork) and, where MADV_WIPEONFORK exists, after any
 * clone that copies the address space (a marker page reads zero there).
 * A record made under another generation is never used.
 */
uint64_t ks_fork_generation(void);

#endif /* KS_MIGRATE_DEK_WRITER_H */
