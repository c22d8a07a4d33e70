/*
 * fuzz/envelope_mutator.h -- a structure-aware libFuzzer mutator for the
 * envelope targets (LLVMFuzzerCustomMutator).
 *
 * Included, once, by a variant target (fuzz/struct/<target>_struct.c) after
 * the target's own source and after it defines
 *     static size_t ks_mut_envelope_offset(const uint8_t *data, size_t size);
 * which says where the envelope starts in an input (0 for fuzz_parse; after
 * the flags byte and the context for fuzz_open).  Bytes before that offset
 * are kept as they are.
 *
 * On each call: parse the envelope part with ks_envelope_parse() under the
 * defaults.  If it parses, change one field's value -- the bytes of a byte
 * field or of key_version through LLVMFuzzerMutate(), the algorithm or the
 * version toggled (with the nonce resized, or purpose and commitment added
 * or dropped, so the result can still be valid) -- and write the envelope
 * back with the canonical encoder, ks_envelope_encode().  If it does not
 * parse, or the changed value is one the encoder refuses (a bad tenant
 * character, say), fall back to LLVMFuzzerMutate() on the raw bytes, as
 * libFuzzer would without this mutator.  So a parsed input's mutants are
 * canonical envelopes with one new field value: the fuzzer explores values
 * deep in the header without spending its executions on re-discovering
 * tags, lengths and order, while raw mutation still explores the rejects.
 *
 * docs/fuzzing.md ("Structure-aware mutation") has what it adds in
 * features against the plain mutator.
 */
#ifndef KS_FUZZ_ENVELOPE_MUTATOR_H
#define KS_FUZZ_ENVELOPE_MUTATOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <keyshift/envelope.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

/* The largest input the mutator rewrites structurally; libFuzzer's max_len
 * of the envelope targets is 4096. */
#define KS_MUT_CAP 8192

/* A field-value scratch buffer and the output of the encoder: separate from
 * the input, which the parsed views point into. */
static uint8_t ks_mut_value[KS_MUT_CAP];
static uint8_t ks_mut_out[KS_MUT_CAP];
static uint8_t ks_mut_extra[KS_COMMITMENT_LEN + KS_PURPOSE_MAX];

/* Replace *v by LLVMFuzzerMutate()'s change of a copy of it, at most cap bytes. */
static void ks_mut_bytes(ks_bytes *v, size_t cap)
{
    size_t n = v->len < cap ? v->len : cap;
    if (n != 0) {
        memcpy(ks_mut_value, v->ptr, n);
    }
    n = LLVMFuzzerMutate(ks_mut_value, n, cap);
    v->ptr = ks_mut_value;
    v->len = n;
}

/* Change one field of *e, chosen by seed; returns 0 when nothing changed. */
static int ks_mut_field(ks_envelope *e, unsigned int seed, size_t ct_cap)
{
    static const uint8_t zero_commitment[KS_COMMITMENT_LEN];
    switch (seed % 10) {
    case 0: /* the version: purpose and commitment follow it */
        if (e->version == KS_FORMAT_V1) {
            e->version = KS_FORMAT_V2;
            memcpy(ks_mut_extra, zero_commitment, KS_COMMITMENT_LEN);
            memcpy(ks_mut_extra + KS_COMMITMENT_LEN, "db.users", 8);
            e->commitment = (ks_bytes){ks_mut_extra, KS_COMMITMENT_LEN};
            e->purpose = (ks_bytes){ks_mut_extra + KS_COMMITMENT_LEN, 8};
        } else {
            e->version = KS_FORMAT_V1;
            e->purpose = (ks_bytes){NULL, 0};
            e->commitment = (ks_bytes){NULL, 0};
        }
        return 1;
    case 1: { /* the algorithm, with the nonce resized to the other's length */
        size_t want;
        if (e->algorithm == KS_ALG_AES256GCM) {
            e->algorithm = KS_ALG_XCHACHA20POLY1305;
            want = KS_XCHACHA20POLY1305_NONCE_LEN;
        } else {
            e->algorithm = KS_ALG_AES256GCM;
            want = KS_AES256GCM_NONCE_LEN;
        }
        memset(ks_mut_value, 0, want);
        memcpy(ks_mut_value, e->nonce.ptr, e->nonce.len < want ? e->nonce.len : want);
        e->nonce = (ks_bytes){ks_mut_value, want};
        return 1;
    }
    case 2:
        ks_mut_bytes(&e->tenant, KS_TENANT_MAX);
        return 1;
    case 3:
        ks_mut_bytes(&e->key_id, KS_KEY_ID_MAX);
        return 1;
    case 4: { /* key_version: its four bytes, little-endian */
        uint8_t b[4] = {(uint8_t)e->key_version, (uint8_t)(e->key_version >> 8),
                        (uint8_t)(e->key_version >> 16), (uint8_t)(e->key_version >> 24)};
        size_t n = LLVMFuzzerMutate(b, sizeof b, sizeof b);
        uint32_t kv = 0;
        for (size_t i = n; i-- > 0;) {
            kv = kv << 8 | b[i];
        }
        e->key_version = kv != 0 ? kv : 1;
        return 1;
    }
    case 5:
        ks_mut_bytes(&e->wrapped_dek, KS_WRAPPED_DEK_MAX);
        return 1;
    case 6:
        ks_mut_bytes(&e->nonce, KS_XCHACHA20POLY1305_NONCE_LEN);
        return 1;
    case 7:
        if (e->version != KS_FORMAT_V2) {
            return 0;
        }
        ks_mut_bytes(&e->purpose, KS_PURPOSE_MAX);
        return 1;
    case 8:
        if (e->version != KS_FORMAT_V2) {
            return 0;
        }
        ks_mut_bytes(&e->commitment, KS_COMMITMENT_LEN);
        return 1;
    default:
        if (ct_cap < KS_TAG_LEN) {
            return 0;
        }
        ks_mut_bytes(&e->ciphertext, ct_cap);
        return 1;
    }
}

/* libFuzzer's hook: one structured mutation of data[0, size), at most
 * max_size bytes long, or a raw one when the envelope does not parse. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    size_t off = ks_mut_envelope_offset(data, size);
    ks_envelope e;
    if (off <= size && max_size <= KS_MUT_CAP &&
        ks_envelope_parse(data + off, size - off, NULL, &e, NULL) == KS_OK) {
        /* The ciphertext may grow into what the header leaves of max_size. */
        size_t room = max_size - off;
        size_t ct_cap = room > e.header_len + 8 ? room - e.header_len - 8 : 0;
        size_t n = 0;
        if (ks_mut_field(&e, seed, ct_cap) &&
            ks_envelope_encode(&e, NULL, ks_mut_out, room, &n) == KS_OK) {
            memcpy(data + off, ks_mut_out, n);
            return off + n;
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}

#endif /* KS_FUZZ_ENVELOPE_MUTATOR_H */
