/*
 * migrate/crypto/dek_writer.c -- write-side DEKs and nonces (dek_writer.h,
 * docs/format.md [F-CRYPTO-NONCE-1..3]).
 *
 * Nonce = prefix || u64be(counter): the prefix (nonce length - 8 bytes) is
 * drawn once per DEK, the counter comes from an atomic fetch-add on the
 * record, so two seals in one process never share a (DEK, nonce), and no
 * per-message random call is needed.  Across processes, a DEK is only
 * ever used by the process generation that created it.
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
#include "dek_writer.h"
#include "mono_clock.h"

/* Active DEKs per context.  Past this many tuples the oldest is retired
 * (it is re-created on its next seal): a bound on memory and on the
 * linear lookup. */
#define KS_WRITER_SLOTS 1024

struct ks_dek_writer {
    pthread_mutex_t mu;        /* guards slot[] and used; held only to look up and swap */
    pthread_mutex_t create_mu; /* serialises DEK creation */
    size_t used;
    ks_wdek *slot[KS_WRITER_SLOTS];
};

/* ---- process generation [F-CRYPTO-NONCE-2] ------------------------------ */

static _Atomic uint64_t generation = 1;
static _Atomic uint64_t *wipe_marker; /* a MADV_WIPEONFORK page, or NULL */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* pthread_atfork child handler: the child is a new generation, and its
 * marker page (wiped by the kernel) is armed again. */
static void fork_child(void)
{
    atomic_fetch_add(&generation, 1);
    if (wipe_marker != NULL) {
        atomic_store(wipe_marker, 1);
    }
}

/* Once per process: register the fork handler and map the marker page.
 * Without MADV_WIPEONFORK (old kernels) the atfork handler alone guards
 * fork(); a raw clone() is then not detected. */
static void fork_init(void)
{
    (void)pthread_atfork(NULL, NULL, fork_child);
#ifdef MADV_WIPEONFORK
    long page = sysconf(_SC_PAGESIZE);
    size_t len = page > 0 ? (size_t)page : 4096;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return;
    }
    if (madvise(p, len, MADV_WIPEONFORK) != 0) {
        munmap(p, len);
        return;
    }
    wipe_marker = p;
    atomic_store(wipe_marker, 1);
#endif
}

/* See dek_writer.h.  A zero marker means this address space was copied
 * without our atfork handler running: start a new generation. */
uint64_t ks_fork_generation(void)
{
    (void)pthread_once(&fork_once, fork_init);
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

/* Encode the header template of d from shape: the whole envelope with a
 * 16-byte dummy ciphertext, parsed back for the field offsets.  Using the
 * canonical encoder and the parser keeps one definition of the layout. */
static ks_err build_template(ks_wdek *d, const ks_envelope *shape, size_t cap)
{
    static const uint8_t zeros[KS_COMMITMENT_LEN];
    ks_envelope env = *shape;
    env.nonce.ptr = zeros;
    if (env.version == KS_FORMAT_V2) {
        env.commitment = (ks_bytes){zeros, KS_COMMITMENT_LEN};
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
    d->commit_off = d->tmpl.commitment.len ? (size_t)(d->tmpl.commitment.ptr - d->hdr) : 0;
    d->tmpl.ciphertext = (ks_bytes){NULL, 0};
    return KS_OK;
}

/* v1: d's data AAD head (see dek_writer.h), from the template. */
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

/* v1 aes-256-gcm: expand d's key once into d->aes (see dek_writer.h).
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
    (void)crypto_aead_aes256gcm_beforenm(st, d->key); /* always 0 */
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

/* See dek_writer.h. */
ks_err ks_wdek_new(const ks_envelope *shape, uint32_t req_version, const ks_wdek_limits *lim,
                   uint8_t *key, ks_wdek **out)
{
    size_t need;
    ks_envelope probe = *shape;
    probe.ciphertext = (ks_bytes){shape->nonce.ptr, KS_TAG_LEN}; /* length only */
    ks_err err = ks_envelope_encoded_len(&probe, NULL, &need);
    ks_wdek *d = err == KS_OK ? calloc(1, sizeof *d + need) : NULL;
    if (d == NULL) {
        ks_wdek_key_free(key);
        return err != KS_OK ? err : KS_ERR_NO_MEMORY;
    }
    d->key = key;
    err = build_template(d, shape, need);
    if (err == KS_OK && shape->version == KS_FORMAT_V1) {
        err = data_aad_head(d);
    }
    if (err == KS_OK && shape->version == KS_FORMAT_V1 && shape->algorithm == KS_ALG_AES256GCM &&
        crypto_aead_aes256gcm_is_available()) {
        err = aes_state_new(d);
    }
    if (err != KS_OK) {
        ks_wdek_key_free(key);
        free(d);
        return err;
    }
    size_t nonce_len = ks_alg_nonce_len(shape->algorithm);
    randombytes_buf(d->prefix, nonce_len - KS_NONCE_COUNTER_LEN); /* [F-CRYPTO-NONCE-1] */
    d->max_messages = lim->max_messages;
    if (shape->algorithm == KS_ALG_AES256GCM && d->max_messages > ((uint64_t)1 << 32)) {
        d->max_messages = (uint64_t)1 << 32; /* [F-CRYPTO-NONCE-3] */
    }
    d->max_bytes = lim->max_bytes;
    d->expires = ks_mono_seconds() + lim->max_age;
    d->generation = ks_fork_generation();
    d->req_version = req_version;
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
        aes_state_free(d);
        ks_wdek_key_free(d->key);
        free(d);
    }
}

/* Nonzero when d is the active DEK of t. */
static int tuple_match(const ks_wdek *d, const ks_wdek_tuple *t)
{
    const ks_envelope *e = &d->tmpl;
    return e->version == t->format && e->algorithm == t->algorithm &&
           d->req_version == t->req_version && e->tenant.len == t->tenant.len &&
           e->purpose.len == t->purpose.len && e->key_id.len == t->key_id.len &&
           memcmp(e->tenant.ptr, t->tenant.ptr, t->tenant.len) == 0 &&
           (t->purpose.len == 0 || memcmp(e->purpose.ptr, t->purpose.ptr, t->purpose.len) == 0) &&
           memcmp(e->key_id.ptr, t->key_id.ptr, t->key_id.len) == 0;
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

/* Reserve one message of pt_len bytes on d, given the process generation
 * and the clock read by the caller: nonzero when d may seal it
 * [F-CRYPTO-NONCE-2], [F-CRYPTO-NONCE-3], its counter value in *counter.
 * The caller owns d's budget: d is not installed yet, or w->mu is held.
 * A refused reservation may burn a counter value; counters are never
 * handed out twice. */
static int reserve(ks_wdek *d, size_t pt_len, uint64_t gen, uint64_t now, uint64_t *counter)
{
    if (d->generation != gen || now >= d->expires) {
        return 0;
    }
    const uint64_t c = d->counter++;
    if (c >= d->max_messages) {
        return 0;
    }
    const uint64_t b = d->bytes;
    d->bytes += (uint64_t)pt_len;
    if (b >= d->max_bytes) {
        return 0;
    }
    *counter = c;
    return 1;
}

/* Write d's nonce of counter value c [F-CRYPTO-NONCE-1]: prefix ||
 * u64be(c). */
static void nonce_of(const ks_wdek *d, uint64_t c, uint8_t nonce[KS_NONCE_MAX])
{
    const size_t plen = d->tmpl.nonce.len - KS_NONCE_COUNTER_LEN;
    memcpy(nonce, d->prefix, plen);
    ks_be_put(nonce + plen, c, KS_NONCE_COUNTER_LEN);
}

/* See dek_writer.h: d is not installed yet, so its budget is the
 * caller's alone. */
ks_err ks_wdek_reserve(ks_wdek *d, size_t pt_len, uint8_t nonce[KS_NONCE_MAX])
{
    uint64_t c;
    if (!reserve(d, pt_len, ks_fork_generation(), ks_mono_seconds(), &c)) {
        return KS_ERR_NOT_FOUND;
    }
    nonce_of(d, c, nonce);
    return KS_OK;
}

/* See dek_writer.h. */
void ks_wdek_retain(ks_wdek *d)
{
    atomic_fetch_add_explicit(&d->refs, 1, memory_order_relaxed);
}

/* See dek_writer.h.  One critical section finds t's record, reserves on
 * it (a plain update of its budget: every reservation on an installed
 * record holds w->mu, so none needs an atomic read-modify-write) and
 * takes a reference, or retires it when it is spent.  The generation and
 * the clock are read before the lock. */
ks_err ks_dek_writer_reserve(ks_dek_writer *w, const ks_wdek_tuple *t, size_t pt_len,
                             ks_wdek **out, uint8_t nonce[KS_NONCE_MAX])
{
    const uint64_t gen = ks_fork_generation(), now = ks_mono_seconds();
    ks_wdek *d = NULL, *gone = NULL;
    uint64_t c = 0;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->used; i++) {
        if (tuple_match(w->slot[i], t)) {
            if (reserve(w->slot[i], pt_len, gen, now, &c)) {
                d = w->slot[i];
                ks_wdek_retain(d);
            } else {
                gone = take_slot(w, i); /* spent: retired */
            }
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    ks_wdek_release(gone);
    if (d == NULL) {
        return KS_ERR_NOT_FOUND;
    }
    nonce_of(d, c, nonce);
    *out = d;
    return KS_OK;
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
void ks_dek_writer_install(ks_dek_writer *w, ks_wdek *d)
{
    ks_wdek *gone = NULL;
    ks_wdek_tuple t = {d->tmpl.version, d->tmpl.algorithm, d->tmpl.tenant,
                       d->tmpl.purpose,  d->tmpl.key_id,    d->req_version};
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->used; i++) {
        if (tuple_match(w->slot[i], &t)) {
            gone = take_slot(w, i);
            break;
        }
    }
    if (gone == NULL && w->used == KS_WRITER_SLOTS) {
        gone = take_slot(w, oldest_slot(w));
    }
    w->slot[w->used++] = d;
    pthread_mutex_unlock(&w->mu);
    ks_wdek_release(gone);
}

/* See dek_writer.h. */
void ks_dek_writer_create_lock(ks_dek_writer *w)
{
    pthread_mutex_lock(&w->create_mu);
}

/* See dek_writer.h. */
void ks_dek_writer_create_unlock(ks_dek_writer *w)
{
    pthread_mutex_unlock(&w->create_mu);
}
