/*
 * migrate/crypto/shard.c -- see shard.h.
 *
 * Layout of a shard's secret slab (sodium_malloc'd, so flush with its
 * guard page: every size below is a multiple of 16, which keeps each AES
 * state 16-byte aligned): KS_SHARD_OPENS expanded AES-GCM keys, then
 * KS_SHARD_OPENS read keys of KS_RKEYS_MAX bytes.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "shard.h"
#include "../alloc_hook.h"

#define AES_STATE sizeof(crypto_aead_aes256gcm_state)
#define SECRET_LEN (KS_SHARD_OPENS * (AES_STATE + KS_RKEYS_MAX))
_Static_assert(AES_STATE % 16 == 0 && KS_RKEYS_MAX % 16 == 0, "16-byte aligned states");

/* See shard.h. */
ks_shard *ks_shard_new(size_t id_max, uint32_t opens)
{
    /* On lines of its own: its owner writes it on every call, and another
     * thread's shard may otherwise come out of malloc right beside it. */
    const size_t size = (sizeof(ks_shard) + KS_LINE_PAIR - 1) / KS_LINE_PAIR * KS_LINE_PAIR;
    ks_shard *sh = aligned_alloc(KS_LINE_PAIR, size);
    if (sh == NULL) {
        return NULL;
    }
    memset(sh, 0, size);
    sh->opens = opens < KS_SHARD_OPENS ? opens : KS_SHARD_OPENS;
    sh->id_max = id_max;
    sh->ids = malloc(KS_SHARD_OPENS * (id_max + KS_ENVELOPE_TAIL_MAX));
    sh->secret = sodium_malloc(SECRET_LEN);
    if (sh->ids == NULL || sh->secret == NULL) {
        free(sh->ids);
        sodium_free(sh->secret);
        free(sh);
        return NULL;
    }
    sodium_memzero(sh->secret, SECRET_LEN);
    for (size_t i = 0; i < KS_SHARD_OPENS; i++) {
        sh->open[i].id = sh->ids + i * (id_max + KS_ENVELOPE_TAIL_MAX);
        sh->open[i].keys = sh->secret + KS_SHARD_OPENS * AES_STATE + i * KS_RKEYS_MAX;
    }
    return sh;
}

/* Empty every slot without reading it (the slab and the id buffers, set
 * at creation, stay), and overwrite the OpenSSL key schedules (the
 * contexts stay: each is whole, see aead.c's ctx_make()). */
static void reset(ks_shard *sh)
{
    sodium_memzero(sh->secret, SECRET_LEN);
    for (size_t i = 0; i < KS_SHARD_SEALS; i++) {
        ks_aead_evp_wipe(&sh->seal_evp[i]);
    }
    for (size_t i = 0; i < KS_SHARD_OPENS; i++) {
        ks_aead_evp_wipe(&sh->open[i].evp);
        sh->open[i].serial = 0;
    }
    memset(sh->seal, 0, sizeof sh->seal);
    for (size_t i = 0; i < KS_SHARD_OPENS; i++) {
        sh->open[i].expires = 0;
        sh->open[i].id_len = 0;
        sh->open[i].keys_len = 0;
        sh->open[i].aes = NULL;
        sh->open[i].head = (ks_envelope_head){0};
        sh->open[i].head_at = 0;
        sh->open[i].aad_len = 0;
    }
    sh->seal_next = sh->seal_last = sh->open_next = sh->open_last = 0;
}

/* See shard.h. */
void ks_shard_free(ks_shard *sh)
{
    if (sh == NULL) {
        return;
    }
    for (size_t i = 0; i < KS_SHARD_SEALS; i++) {
        ks_wdek_release(sh->seal[i].d);
    }
    reset(sh);
    for (size_t i = 0; i < KS_SHARD_SEALS; i++) {
        ks_aead_evp_free(&sh->seal_evp[i]);
    }
    for (size_t i = 0; i < KS_SHARD_OPENS; i++) {
        ks_aead_evp_free(&sh->open[i].evp);
    }
    sodium_free(sh->secret);
    free(sh->ids);
    free(sh);
}

/* See shard.h. */
void ks_shard_clear(ks_shard *sh, ks_dek_writer *w)
{
    for (size_t i = 0; i < KS_SHARD_SEALS; i++) {
        ks_dek_writer_drop(w, &sh->seal[i]);
    }
    reset(sh);
}

/* See shard.h. */
void ks_shard_abandon(ks_shard *sh)
{
    reset(sh);
}

/* See shard.h. */
ks_seal_slot *ks_shard_seal_find(ks_shard *sh, const ks_wdek_tuple *t, int *on_t)
{
    for (uint32_t i = 0; i < KS_SHARD_SEALS; i++) {
        if (sh->seal[i].d != NULL && ks_wdek_match(sh->seal[i].d, t)) {
            *on_t = 1;
            sh->seal_last = i;
            return &sh->seal[i];
        }
    }
    *on_t = 0;
    sh->seal_last = sh->seal_next;
    ks_seal_slot *s = &sh->seal[sh->seal_next];
    sh->seal_next = (sh->seal_next + 1) % KS_SHARD_SEALS;
    return s;
}

/* See shard.h.  At most KS_SHARD_OPENS comparisons, each cut short by the
 * length. */
ks_open_slot *ks_shard_open_find(ks_shard *sh, const uint8_t *id, size_t id_len, uint64_t now)
{
    for (size_t i = 0; i < sh->opens; i++) {
        ks_open_slot *o = &sh->open[i];
        if (o->id_len == id_len && now < o->expires && memcmp(o->id, id, id_len) == 0) {
            sh->open_last = (uint32_t)i;
            return o;
        }
    }
    return NULL;
}

/* See shard.h. */
ks_open_slot *ks_shard_open_last(ks_shard *sh)
{
    assert(sh->open_last < KS_SHARD_OPENS);
    ks_open_slot *o = &sh->open[sh->open_last];
    return o->head.len != 0 ? o : NULL;
}

/* See shard.h. */
ks_open_slot *ks_shard_open_put(ks_shard *sh, const uint8_t *id, size_t id_len,
                                const ks_envelope_head *head, size_t head_at, const uint8_t *hdr,
                                const uint8_t *keys, size_t keys_len, uint64_t expires, int aes)
{
    if (sh->opens == 0 || id_len > sh->id_max || keys_len < 32 || keys_len > KS_RKEYS_MAX ||
        head->header_len <= head->len || head->header_len - head->len > KS_ENVELOPE_TAIL_MAX) {
        return NULL;
    }
    assert(head->len != 0 && head_at + head->len == id_len);
    const size_t i = sh->open_next;
    sh->open_next = (uint32_t)((i + 1) % sh->opens);
    ks_open_slot *o = &sh->open[i];
    uint8_t *state = sh->secret + i * AES_STATE;
    sodium_memzero(o->keys, KS_RKEYS_MAX);
    sodium_memzero(state, AES_STATE);
    ks_aead_evp_wipe(&o->evp);
    o->serial = ks_aead_serial();
    memcpy(o->id, id, id_len);
    memcpy(o->id + id_len, hdr + head->len, head->header_len - head->len); /* the header's tail */
    memcpy(o->keys, keys, keys_len);
    o->id_len = id_len;
    o->head = *head;
    o->head_at = head_at;
    o->aad_len = 0;
    sh->open_last = (uint32_t)i;
    o->keys_len = keys_len;
    o->expires = expires;
    o->aes = NULL;
    if (aes) {
        assert(((uintptr_t)state & 15) == 0);
        (void)crypto_aead_aes256gcm_beforenm((crypto_aead_aes256gcm_state *)(void *)state, keys);
        o->aes = state;
    }
    return o;
}
