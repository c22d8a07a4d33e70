/*
 * migrate/crypto/dek_writer.c -- write-side DEKs and nonces (dek_writer.h,
 * docs/format.md [F-CRYPTO-NONCE-1..3]).
 *
 * Nonce = prefix || u64be(counter): the prefix (nonce length - 8 bytes) is
 * drawn once per DEK; counter values are handed out in blocks, each
 * under the writer's lock and never twice, to seal slots that one thread
 * spends alone, so two seals in one process never share a (DEK, nonce),
 * and no per-message random call or shared write is needed.  Across
 * processes, a DEK is only ever used by the process generation that
 * created it.
 */
#define _DEFAULT_SOURCE /* MADV_WIPEONFORK, MAP_ANONYMOUS */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/provider.h>

#include "../../format/rules.h"
#include "aead.h"
#include "dek_writer.h"
#include "mono_clock.h"
#include "v2_keys.h"
#include "../alloc_hook.h"

/* Active DEKs per context.  Past this many tuples the oldest is retired
 * (it is re-created on its next seal): a bound on memory and on the
 * linear lookup. */
#define KS_WRITER_SLOTS 1024

struct ks_dek_writer {
    pthread_mutex_t mu;        /* guards slot[], used and the records' budgets; held
                                  only to look up, reserve and swap */
    pthread_mutex_t create_mu; /* serialises DEK creation (held across provider calls) */
    /* The thread holding create_mu (its creating_token's address), or 0;
     * and whether ks_dek_writer_fork_prepare() took create_mu. */
    _Atomic uintptr_t create_owner;
    int fork_took_create;
    size_t used;
    ks_wdek *slot[KS_WRITER_SLOTS];
};

/* Its address identifies this thread as create_mu's holder. */
static _Thread_local char creating_token;

/* ---- process generation [F-CRYPTO-NONCE-2] ------------------------------ */

static _Atomic uint64_t generation = 1;
static _Atomic uint64_t *wipe_marker; /* a MADV_WIPEONFORK page, or NULL */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static _Atomic int fork_armed; /* fork_init() has run */

/* pthread_atfork child handler: the child is a new generation, and its
 * marker page (wiped by the kernel) is armed again. */
static void fork_child(void)
{
    atomic_fetch_add(&generation, 1);
    if (wipe_marker != NULL) {
        atomic_store(wipe_marker, 1);
    }
}

/* A page the kernel zeroes in a child (MADV_WIPEONFORK), or NULL when
 * the kernel cannot. */
static _Atomic uint64_t *wipe_page(void)
{
#ifdef MADV_WIPEONFORK
    long page = sysconf(_SC_PAGESIZE);
    size_t len = page > 0 ? (size_t)page : 4096;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    if (madvise(p, len, MADV_WIPEONFORK) != 0) {
        munmap(p, len);
        return NULL;
    }
    return p;
#else
    return NULL;
#endif
}

/* Once per process: register the fork handler and map the marker page,
 * then raise fork_armed (release: a thread that sees it sees
 * wipe_marker).  Without MADV_WIPEONFORK (old kernels) the atfork
 * handler alone guards fork(); a raw clone() is then not detected. */
static void fork_init(void)
{
    (void)pthread_atfork(NULL, NULL, fork_child);
    wipe_marker = wipe_page();
    if (wipe_marker != NULL) {
        atomic_store(wipe_marker, 1);
    }
    atomic_store_explicit(&fork_armed, 1, memory_order_release);
}

/* See dek_writer.h.  A zero marker means this address space was copied
 * without our atfork handler running: start a new generation.  Every
 * seal asks, so after the first call a load replaces pthread_once(). */
uint64_t ks_fork_generation(void)
{
    if (!atomic_load_explicit(&fork_armed, memory_order_acquire)) {
        (void)pthread_once(&fork_once, fork_init);
    }
    if (wipe_marker != NULL && atomic_load_explicit(wipe_marker, memory_order_acquire) == 0) {
        atomic_fetch_add(&generation, 1);
        atomic_store(wipe_marker, 1);
    }
    return atomic_load_explicit(&generation, memory_order_acquire);
}

/* ---- records ------------------------------------------------------------ */

/* See dek_writer.h. */
uint8_t *ks_wdek_key_new(void)
{
    uint8_t *key = sodium_malloc(KS_DEK_LEN);
    if (key != NULL) {
        randombytes_buf(key, KS_DEK_LEN);
    }
    return key;
}

/* See dek_writer.h.  sodium_free wipes as well; the explicit wipe keeps
 * the guarantee independent of that. */
void ks_wdek_key_free(uint8_t *key)
{
    if (key != NULL) {
        sodium_memzero(key, KS_DEK_LEN);
        sodium_free(key);
    }
}

/* Encode the header template of d from shape, with the commitment
 * (v2: the DEK's [F-CRYPTO-COMMIT-2]): the whole envelope with a 16-byte
 * dummy ciphertext, parsed back for the field offsets.  Using the
 * canonical encoder and the parser keeps one definition of the layout. */
static ks_err build_template(ks_wdek *d, const ks_envelope *shape, const uint8_t *commitment,
                             size_t cap)
{
    static const uint8_t zeros[KS_COMMITMENT_LEN];
    ks_envelope env = *shape;
    env.nonce.ptr = zeros;
    if (env.version == KS_FORMAT_V2) {
        env.commitment = (ks_bytes){commitment, KS_COMMITMENT_LEN};
    }
    env.ciphertext = (ks_bytes){zeros, KS_TAG_LEN};
    size_t len;
    ks_err err = ks_envelope_encode(&env, NULL, d->hdr, cap, &len);
    if (err != KS_OK) {
        return err;
    }
    err = ks_envelope_parse(d->hdr, len, NULL, &d->tmpl, NULL);
    assert(err == KS_OK); /* the encoder only writes what the parser accepts */
    if (err != KS_OK) {
        return err;
    }
    d->nonce_off = (size_t)(d->tmpl.nonce.ptr - d->hdr);
    d->counter_off = d->nonce_off + d->tmpl.nonce.len - KS_NONCE_COUNTER_LEN;
    d->tmpl.ciphertext = (ks_bytes){NULL, 0};
    return KS_OK;
}

/* d's data AAD head (see dek_writer.h), from the template. */
static ks_err data_aad_head(ks_wdek *d)
{
    uint8_t aad[KS_DATA_AAD_HEAD_MAX + 4];
    size_t len = 0;
    ks_err err = ks_aad_data(&d->tmpl, (ks_bytes){NULL, 0}, aad, sizeof aad, &len);
    if (err != KS_OK) {
        return err;
    }
    assert(len >= 4 && aad[len - 4] == 0 && aad[len - 1] == 0); /* ends with lp(empty) */
    d->aad_head_len = len - 4;
    memcpy(d->aad_head, aad, d->aad_head_len);
    return KS_OK;
}

/* aes-256-gcm: expand d's AEAD key once into d->aes (see dek_writer.h).
 * sodium_malloc returns the region flush with its guard page, so a size
 * that is a multiple of 16 keeps the state's 16-byte alignment. */
static ks_err aes_state_new(ks_wdek *d)
{
    _Static_assert(sizeof(crypto_aead_aes256gcm_state) % 16 == 0, "alignment");
    crypto_aead_aes256gcm_state *st = sodium_malloc(sizeof *st);
    if (st == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    assert(((uintptr_t)st & 15) == 0);
    (void)crypto_aead_aes256gcm_beforenm(st, d->aead_key); /* always 0 */
    d->aes = st;
    return KS_OK;
}

/* Wipe and free d->aes, if any. */
static void aes_state_free(ks_wdek *d)
{
    if (d->aes != NULL) {
        sodium_memzero(d->aes, sizeof(crypto_aead_aes256gcm_state));
        sodium_free(d->aes);
        d->aes = NULL;
    }
}

/* Free d's derived keys and its record (not its DEK). */
static void record_free(ks_wdek *d)
{
    aes_state_free(d);
    if (d->mkey != NULL) {
        sodium_memzero(d->mkey, 32);
        sodium_free(d->mkey);
    }
    free(d);
}

/* v2: derive d's K into guarded memory and its commitment into c
 * [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]; v1: the AEAD key is the DEK. */
static ks_err derive_keys(ks_wdek *d, const ks_envelope *shape, uint8_t c[KS_COMMITMENT_LEN])
{
    if (shape->version != KS_FORMAT_V2) {
        d->aead_key = d->key;
        return KS_OK;
    }
    d->mkey = sodium_malloc(32);
    if (d->mkey == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    ks_v2_keys(shape->algorithm, d->key, d->mkey, c);
    d->aead_key = d->mkey;
    return KS_OK;
}

/* The share of a budget one shard's slot reserves at a time:
 * min(cap, budget / 64), at least `floor`. */
static uint64_t share_of(uint64_t budget, uint64_t cap, uint64_t floor)
{
    uint64_t n = budget / 64;
    n = n < cap ? n : cap;
    return n < floor ? floor : n;
}

/* See dek_writer.h. */
ks_err ks_wdek_new(const ks_envelope *shape, uint32_t req_version, const ks_wdek_limits *lim,
                   uint8_t *key, ks_wdek **out)
{
    size_t need;
    uint8_t c[KS_COMMITMENT_LEN] = {0};
    ks_envelope probe = *shape;
    probe.ciphertext = (ks_bytes){shape->nonce.ptr, KS_TAG_LEN}; /* length only */
    ks_err err = ks_envelope_encoded_len(&probe, NULL, &need);
    ks_wdek *d = err == KS_OK ? aligned_alloc(_Alignof(ks_wdek), (sizeof *d + need + 63) / 64 * 64)
                              : NULL;
    if (d == NULL) {
        ks_wdek_key_free(key);
        return err != KS_OK ? err : KS_ERR_NO_MEMORY;
    }
    memset(d, 0, sizeof *d);
    d->key = key;
    err = derive_keys(d, shape, c);
    if (err == KS_OK) {
        err = build_template(d, shape, c, need);
    }
    if (err == KS_OK) {
        err = data_aad_head(d);
    }
    if (err == KS_OK && shape->algorithm == KS_ALG_AES256GCM && crypto_aead_aes256gcm_is_available()) {
        err = aes_state_new(d);
    }
    if (err != KS_OK) {
        ks_wdek_key_free(key);
        record_free(d);
        return err;
    }
    /* [F-CRYPTO-NONCE-1]: the prefix, in the template's nonce */
    randombytes_buf(d->hdr + d->nonce_off, d->tmpl.nonce.len - KS_NONCE_COUNTER_LEN);
    d->max_messages = lim->max_messages;
    if (shape->algorithm == KS_ALG_AES256GCM && d->max_messages > ((uint64_t)1 << 32)) {
        d->max_messages = (uint64_t)1 << 32; /* [F-CRYPTO-NONCE-3] */
    }
    d->max_bytes = lim->max_bytes;
    d->block = share_of(d->max_messages, KS_SEAL_BLOCK_MAX, 1);
    d->chunk = share_of(d->max_bytes, KS_SEAL_BYTES_MAX, 0);
    d->expires = ks_mono_seconds() + lim->max_age;
    d->generation = ks_fork_generation();
    d->req_version = req_version;
    d->serial = ks_aead_serial();
    d->counter = 0;
    d->bytes = 0;
    atomic_init(&d->refs, 1);
    *out = d;
    return KS_OK;
}

/* See dek_writer.h. */
void ks_wdek_release(ks_wdek *d)
{
    if (d != NULL && atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) == 1) {
        ks_wdek_key_free(d->key);
        record_free(d);
    }
}

/* ---- the table ------------------------------------------------------------ */

/* See dek_writer.h. */
ks_err ks_dek_writer_new(ks_dek_writer **out)
{
    ks_dek_writer *w = calloc(1, sizeof *w);
    if (w == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&w->create_mu, NULL) != 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return KS_ERR_NO_MEMORY;
    }
    (void)ks_fork_generation(); /* arm the fork guards before any DEK exists */
    *out = w;
    return KS_OK;
}

/* See dek_writer.h. */
void ks_dek_writer_free(ks_dek_writer *w)
{
    if (w == NULL) {
        return;
    }
    for (size_t i = 0; i < w->used; i++) {
        ks_wdek_release(w->slot[i]);
    }
    pthread_mutex_destroy(&w->create_mu);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Remove slot i (w->mu held); the caller releases the record it held. */
static ks_wdek *take_slot(ks_dek_writer *w, size_t i)
{
    ks_wdek *d = w->slot[i];
    w->slot[i] = w->slot[--w->used];
    w->slot[w->used] = NULL;
    return d;
}

/* See dek_writer.h. */
void ks_wdek_retain(ks_wdek *d)
{
    atomic_fetch_add_explicit(&d->refs, 1, memory_order_relaxed);
}

/* Give s's unsealed bytes back to its record (w->mu held): they were
 * reserved and never sealed, so the record may hand them out again. */
static void give_back(ks_seal_slot *s)
{
    if (s->d != NULL) {
        assert(s->bytes <= s->d->bytes);
        s->d->bytes -= s->bytes;
        s->bytes = 0;
    }
}

/*
 * Reserve on d (w->mu held) for s and a message of pt_len bytes, given
 * the process generation and the clock; nonzero on success
 * [F-CRYPTO-NONCE-2], [F-CRYPTO-NONCE-3].  s keeps its nonces when it is
 * on d and has some left; else it takes a block of fresh ones (moving its
 * reference to *old for the caller to release).  Bytes: a message is
 * sealed while d's reserved bytes are under max_bytes (the one that
 * crosses the limit included), so the bytes reserved are pt_len plus, for
 * a shard's slot, d's chunk capped at what is left under the limit.
 */
static int grant(ks_wdek *d, ks_seal_slot *s, size_t pt_len, int block, uint64_t gen,
                 uint64_t now, ks_wdek **old)
{
    const int keep = s->d == d && s->next < s->end;
    if (d->generation != gen || now >= d->expires || d->bytes >= d->max_bytes ||
        (!keep && d->counter >= d->max_messages)) {
        return 0;
    }
    if (!keep) {
        uint64_t n = block ? d->block : 1, left = d->max_messages - d->counter;
        n = n < left ? n : left;
        if (s->d != d) {
            *old = s->d;
            ks_wdek_retain(d);
            s->d = d;
        }
        s->next = d->counter;
        s->end = d->counter + n;
        d->counter += n;
    }
    uint64_t extra = block ? d->max_bytes - d->bytes : 0;
    extra = extra < d->chunk ? extra : d->chunk;
    s->bytes = (uint64_t)pt_len + extra;
    d->bytes += s->bytes;
    return 1;
}

/* The slot index of t's record (w->mu held), or w->used. */
static size_t find_slot(const ks_dek_writer *w, const ks_wdek_tuple *t)
{
    size_t i = 0;
    while (i < w->used && !ks_wdek_match(w->slot[i], t)) {
        i++;
    }
    return i;
}

/* Empty s (w->mu held), its reference moved to *old. */
static void empty_slot(ks_seal_slot *s, ks_wdek **old)
{
    *old = s->d;
    *s = (ks_seal_slot){NULL, 0, 0, 0};
}

/* See dek_writer.h.  The generation and the clock are read before the
 * lock; references are dropped after it. */
ks_err ks_dek_writer_refill(ks_dek_writer *w, const ks_wdek_tuple *t, size_t pt_len, int block,
                            ks_seal_slot *s)
{
    const uint64_t gen = ks_fork_generation(), now = ks_mono_seconds();
    ks_wdek *old = NULL, *gone = NULL;
    int ok = 0;
    pthread_mutex_lock(&w->mu);
    give_back(s);
    size_t i = find_slot(w, t);
    if (i < w->used) {
        ok = grant(w->slot[i], s, pt_len, block, gen, now, &old);
        if (!ok) {
            gone = take_slot(w, i); /* spent: retired */
        }
    }
    if (!ok) {
        assert(old == NULL);
        empty_slot(s, &old);
    }
    pthread_mutex_unlock(&w->mu);
    ks_wdek_release(old);
    ks_wdek_release(gone);
    return ok ? KS_OK : KS_ERR_NOT_FOUND;
}

/* See dek_writer.h. */
void ks_dek_writer_drop(ks_dek_writer *w, ks_seal_slot *s)
{
    ks_wdek *old = NULL;
    if (s->d == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    give_back(s);
    empty_slot(s, &old);
    pthread_mutex_unlock(&w->mu);
    ks_wdek_release(old);
}

/* Index of the oldest-created record (w->mu held, table not empty). */
static size_t oldest_slot(const ks_dek_writer *w)
{
    size_t best = 0;
    for (size_t i = 1; i < w->used; i++) {
        if (w->slot[i]->expires < w->slot[best]->expires) {
            best = i;
        }
    }
    return best;
}

/* See dek_writer.h. */
ks_err ks_dek_writer_install(ks_dek_writer *w, ks_wdek *d, size_t pt_len, int block, ks_seal_slot *s)
{
    const uint64_t gen = ks_fork_generation(), now = ks_mono_seconds();
    ks_wdek *gone = NULL, *old = NULL;
    ks_wdek_tuple t = {d->tmpl.version, d->tmpl.algorithm, d->tmpl.tenant,
                       d->tmpl.purpose,  d->tmpl.key_id,    d->req_version};
    pthread_mutex_lock(&w->mu);
    size_t i = find_slot(w, &t);
    if (i < w->used) {
        gone = take_slot(w, i);
    } else if (w->used == KS_WRITER_SLOTS) {
        gone = take_slot(w, oldest_slot(w));
    }
    w->slot[w->used++] = d;
    give_back(s);
    int ok = grant(d, s, pt_len, block, gen, now, &old);
    if (!ok) {
        assert(old == NULL);
        empty_slot(s, &old);
    }
    pthread_mutex_unlock(&w->mu);
    ks_wdek_release(old);
    ks_wdek_release(gone);
    return ok ? KS_OK : KS_ERR_NOT_FOUND;
}

/* See dek_writer.h.  The owner is recorded so that a provider that
 * forks while this thread creates a DEK does not wait for itself in
 * ks_dek_writer_fork_prepare(). */
void ks_dek_writer_create_lock(ks_dek_writer *w)
{
    pthread_mutex_lock(&w->create_mu);
    atomic_store_explicit(&w->create_owner, (uintptr_t)&creating_token, memory_order_relaxed);
}

/* See dek_writer.h. */
void ks_dek_writer_create_unlock(ks_dek_writer *w)
{
    atomic_store_explicit(&w->create_owner, 0, memory_order_relaxed);
    pthread_mutex_unlock(&w->create_mu);
}

/* See dek_writer.h.  create_mu before mu, as acquire_dek() nests them.
 * Waiting for create_mu waits for another thread's provider call (a
 * bounded one: the provider's deadline).  When this thread holds it (a
 * provider forking), the child's copy stays held by this same thread,
 * which goes on to release it there as in the parent. */
void ks_dek_writer_fork_prepare(ks_dek_writer *w)
{
    w->fork_took_create = atomic_load_explicit(&w->create_owner, memory_order_relaxed) !=
                          (uintptr_t)&creating_token;
    if (w->fork_took_create) {
        pthread_mutex_lock(&w->create_mu);
    }
    pthread_mutex_lock(&w->mu);
}

/* See dek_writer.h. */
void ks_dek_writer_fork_release(ks_dek_writer *w)
{
    pthread_mutex_unlock(&w->mu);
    if (w->fork_took_create) {
        pthread_mutex_unlock(&w->create_mu);
    }
}
