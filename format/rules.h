/*
 * format/rules.h -- the field table and value rules of docs/format.md,
 * shared by the strict parser (parser/) and the canonical encoder
 * (format/encode.c) so that both enforce one definition.
 *
 * Internal header: everything here is static inline.  It includes nothing
 * beyond the public envelope header and the C library.
 */
#ifndef KS_FORMAT_RULES_H
#define KS_FORMAT_RULES_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <keyshift/envelope.h>

/* Protocol-buffers wire types [F-WIRE-1]. */
enum {
    KS_WIRE_VARINT = 0,
    KS_WIRE_I64 = 1,
    KS_WIRE_LEN = 2,
    KS_WIRE_SGROUP = 3,
    KS_WIRE_EGROUP = 4,
    KS_WIRE_I32 = 5
};

/* How a field's value is checked [F-FIELDS]. */
typedef enum ks_rule_kind {
    KS_RULE_ALGORITHM,   /* varint, 1 or 2                          [F-ALG-1]  */
    KS_RULE_KEY_VERSION, /* varint, 1 .. 2^32-1                     [F-KVER-1] */
    KS_RULE_NAME,        /* bytes, charset [A-Za-z0-9._:-]          [F-NAME-1] */
    KS_RULE_KEY_ID,      /* bytes, charset [A-Za-z0-9._:/@+=-]      [F-KEYID-1] */
    KS_RULE_OPAQUE,      /* bytes, any content                                  */
    KS_RULE_NONCE,       /* bytes, exactly the algorithm's nonce length [F-NONCE-1] */
    KS_RULE_FIXED        /* bytes, exactly min_len (= max) bytes               */
} ks_rule_kind;

/* One row of the field table. */
typedef struct ks_field_rule {
    uint8_t number;     /* field number */
    uint8_t wire;       /* the one wire type allowed [F-WIRE-2] */
    uint8_t kind;       /* ks_rule_kind */
    uint32_t min_len;   /* bytes fields: smallest length allowed */
    uint16_t member;    /* offsetof the ks_envelope member holding the value */
    uint16_t limit;     /* variable bytes fields: offsetof the ks_limits member
                           bounding the length; else KS_NO_LIMIT */
} ks_field_rule;

#define KS_M(name) ((uint16_t)offsetof(ks_envelope, name))
#define KS_L(name) ((uint16_t)offsetof(ks_limits, name))
#define KS_NO_LIMIT UINT16_MAX

/* The fields of each version, in the only order allowed [F-ORDER-1]. All
 * are required [F-REQ-1].  Fields 1 to 6 are common to both versions. */
#define KS_RULES_COMMON                                                                       \
    {KS_FIELD_ALGORITHM, KS_WIRE_VARINT, KS_RULE_ALGORITHM, 0, KS_M(algorithm), KS_NO_LIMIT}, \
    {KS_FIELD_TENANT, KS_WIRE_LEN, KS_RULE_NAME, 1, KS_M(tenant), KS_L(max_tenant)},          \
    {KS_FIELD_KEY_ID, KS_WIRE_LEN, KS_RULE_KEY_ID, 1, KS_M(key_id), KS_L(max_key_id)},        \
    {KS_FIELD_KEY_VERSION, KS_WIRE_VARINT, KS_RULE_KEY_VERSION, 0, KS_M(key_version),         \
     KS_NO_LIMIT},                                                                            \
    {KS_FIELD_WRAPPED_DEK, KS_WIRE_LEN, KS_RULE_OPAQUE, 1, KS_M(wrapped_dek),                 \
     KS_L(max_wrapped_dek)},                                                                  \
    {KS_FIELD_NONCE, KS_WIRE_LEN, KS_RULE_NONCE, 0, KS_M(nonce), KS_NO_LIMIT}
#define KS_RULE_CIPHERTEXT                                                                    \
    {KS_FIELD_CIPHERTEXT, KS_WIRE_LEN, KS_RULE_OPAQUE, KS_TAG_LEN, KS_M(ciphertext),          \
     KS_L(max_ciphertext)}

static const ks_field_rule ks_rules_v1[] = {KS_RULES_COMMON, KS_RULE_CIPHERTEXT};
static const ks_field_rule ks_rules_v2[] = {
    KS_RULES_COMMON,
    {KS_FIELD_PURPOSE, KS_WIRE_LEN, KS_RULE_NAME, 1, KS_M(purpose), KS_L(max_purpose)},
    {KS_FIELD_COMMITMENT, KS_WIRE_LEN, KS_RULE_FIXED, KS_COMMITMENT_LEN, KS_M(commitment),
     KS_NO_LIMIT},
    KS_RULE_CIPHERTEXT,
};

/* The field table of a version, or NULL for an unsupported version. */
static inline const ks_field_rule *ks_rules_for(uint8_t version, size_t *count)
{
    switch (version) {
    case KS_FORMAT_V1:
        *count = sizeof ks_rules_v1 / sizeof ks_rules_v1[0];
        return ks_rules_v1;
    case KS_FORMAT_V2:
        *count = sizeof ks_rules_v2 / sizeof ks_rules_v2[0];
        return ks_rules_v2;
    default:
        *count = 0;
        return NULL;
    }
}

/* Index of field `number` in a version's table, or -1 if the version does
 * not define it [F-UNKNOWN-1]. Field number 0 is never defined. */
static inline int ks_rules_index(const ks_field_rule *rules, size_t count, uint32_t number)
{
    for (size_t i = 0; i < count; i++) {
        if (rules[i].number == number) {
            return (int)i;
        }
    }
    return -1;
}

/* Character classes [F-NAME-1], [F-KEYID-1]: bit 1 set when the byte is
 * allowed in tenant and purpose, bit 2 when allowed in key_id. */
#define KS_CC_NAME 1u
#define KS_CC_KEY_ID 2u
static const uint8_t ks_charclass[256] = {
    ['-'] = 3, ['.'] = 3, [':'] = 3, ['_'] = 3,
    ['/'] = 2, ['@'] = 2, ['+'] = 2, ['='] = 2,
    ['0'] = 3, ['1'] = 3, ['2'] = 3, ['3'] = 3, ['4'] = 3,
    ['5'] = 3, ['6'] = 3, ['7'] = 3, ['8'] = 3, ['9'] = 3,
    ['A'] = 3, ['B'] = 3, ['C'] = 3, ['D'] = 3, ['E'] = 3, ['F'] = 3, ['G'] = 3,
    ['H'] = 3, ['I'] = 3, ['J'] = 3, ['K'] = 3, ['L'] = 3, ['M'] = 3, ['N'] = 3,
    ['O'] = 3, ['P'] = 3, ['Q'] = 3, ['R'] = 3, ['S'] = 3, ['T'] = 3, ['U'] = 3,
    ['V'] = 3, ['W'] = 3, ['X'] = 3, ['Y'] = 3, ['Z'] = 3,
    ['a'] = 3, ['b'] = 3, ['c'] = 3, ['d'] = 3, ['e'] = 3, ['f'] = 3, ['g'] = 3,
    ['h'] = 3, ['i'] = 3, ['j'] = 3, ['k'] = 3, ['l'] = 3, ['m'] = 3, ['n'] = 3,
    ['o'] = 3, ['p'] = 3, ['q'] = 3, ['r'] = 3, ['s'] = 3, ['t'] = 3, ['u'] = 3,
    ['v'] = 3, ['w'] = 3, ['x'] = 3, ['y'] = 3, ['z'] = 3,
};

/* Return the index of the first byte of p[0, n) outside the character
 * class of `kind` (KS_RULE_NAME or KS_RULE_KEY_ID), or n if all are in.
 * The common case, every byte allowed, runs without a branch per byte;
 * only a failure rescans to find the offending byte. */
static inline size_t ks_rules_charset_scan(uint8_t kind, const uint8_t *p, size_t n)
{
    const uint8_t mask = kind == KS_RULE_KEY_ID ? KS_CC_KEY_ID : KS_CC_NAME;
    uint8_t all = mask;
    size_t i = 0;
    assert(kind == KS_RULE_NAME || kind == KS_RULE_KEY_ID);
    /* Four independent lookups per step keep the loads in flight. */
    for (; n - i >= 4; i += 4) {
        all &= (uint8_t)(ks_charclass[p[i]] & ks_charclass[p[i + 1]] & ks_charclass[p[i + 2]] &
                         ks_charclass[p[i + 3]]);
    }
    for (; i < n; i++) {
        all &= ks_charclass[p[i]];
    }
    if (all != 0) {
        return n;
    }
    i = 0;
    while ((ks_charclass[p[i]] & mask) != 0) {
        i++;
    }
    assert(i < n);
    return i;
}

/* The largest length `lim` allows for a variable-length bytes field r;
 * the caller has checked lim with ks_limits_check(). */
static inline size_t ks_rules_max_len(const ks_field_rule *r, const ks_limits *lim)
{
    assert(r->limit != KS_NO_LIMIT);
    return *(const size_t *)(const void *)((const char *)lim + r->limit);
}

/*
 * Check the length n of a bytes field against its rule [F-LEN-1..3].
 * nonce_len is the nonce length of the envelope's algorithm.
 * Fixed-length fields (nonce, commitment) reject any other length as
 * bad-value; variable fields reject n above the limit as too-large and n
 * below the minimum as bad-value.
 */
static inline ks_err ks_rules_check_len(const ks_field_rule *r, const ks_limits *lim, size_t nonce_len,
                                        uint64_t n)
{
    if (r->kind == KS_RULE_NONCE || r->kind == KS_RULE_FIXED) {
        size_t exact = r->kind == KS_RULE_NONCE ? nonce_len : r->min_len;
        return n == exact ? KS_OK : KS_ERR_BAD_VALUE;
    }
    if (n > ks_rules_max_len(r, lim)) {
        return KS_ERR_TOO_LARGE;
    }
    if (n < r->min_len) {
        return KS_ERR_BAD_VALUE;
    }
    return KS_OK;
}

/* The nonce length in bytes for alg, or 0 when alg is not defined
 * [F-ALG-1], [F-NONCE-1]: ks_alg_nonce_len(), inline for the parser. */
static inline size_t ks_rules_nonce_len(uint32_t alg)
{
    switch (alg) {
    case KS_ALG_AES256GCM: return KS_AES256GCM_NONCE_LEN;
    case KS_ALG_XCHACHA20POLY1305: return KS_XCHACHA20POLY1305_NONCE_LEN;
    default: return 0;
    }
}

/* Check a varint field's value against its rule [F-ALG-1], [F-KVER-1]. */
static inline ks_err ks_rules_check_varint(const ks_field_rule *r, uint32_t v)
{
    if (r->kind == KS_RULE_ALGORITHM) {
        return ks_rules_nonce_len(v) != 0 ? KS_OK : KS_ERR_BAD_VALUE;
    }
    assert(r->kind == KS_RULE_KEY_VERSION);
    return v != 0 ? KS_OK : KS_ERR_BAD_VALUE;
}

/* The ks_bytes member of env that a bytes field r is stored in. */
static inline ks_bytes *ks_rules_bytes(ks_envelope *env, const ks_field_rule *r)
{
    assert(r->wire == KS_WIRE_LEN);
    return (ks_bytes *)(void *)((char *)env + r->member);
}

/* The uint32_t member of env that a varint field r is stored in. */
static inline uint32_t *ks_rules_u32(ks_envelope *env, const ks_field_rule *r)
{
    assert(r->wire == KS_WIRE_VARINT);
    return (uint32_t *)(void *)((char *)env + r->member);
}

/* Number of bytes of the minimal varint encoding of v [F-VARINT-2]. */
static inline size_t ks_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Write v as n big-endian bytes at p (1 <= n <= 8): the fixed-width
 * integers of the AADs, the keyring file and the nonce counter. */
static inline void ks_be_put(uint8_t *p, uint64_t v, size_t n)
{
    /* All eight bytes, then the last n: with a constant n (every caller)
     * the compiler makes this one byte swap and one store, where a loop
     * over the bytes stays a loop. */
    const uint8_t b[8] = {(uint8_t)(v >> 56), (uint8_t)(v >> 48), (uint8_t)(v >> 40),
                          (uint8_t)(v >> 32), (uint8_t)(v >> 24), (uint8_t)(v >> 16),
                          (uint8_t)(v >> 8),  (uint8_t)v};
    assert(n >= 1 && n <= 8);
    memcpy(p, b + (8 - n), n);
}

/* Read n big-endian bytes at p (1 <= n <= 8). */
static inline uint64_t ks_be_get(const uint8_t *p, size_t n)
{
    uint64_t x = 0;
    assert(n >= 1 && n <= 8);
    for (size_t i = 0; i < n; i++) {
        x = x << 8 | p[i];
    }
    return x;
}

/* Write the minimal varint encoding of v at p [F-VARINT-2]; return the
 * number of bytes written (ks_varint_len(v)). */
static inline size_t ks_varint_put(uint8_t *p, uint64_t v)
{
    size_t i = 0;
    while (v >= 0x80) {
        p[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[i++] = (uint8_t)v;
    return i;
}

#endif /* KS_FORMAT_RULES_H */
