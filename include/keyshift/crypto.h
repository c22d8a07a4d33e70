/*
 * keyshift/crypto.h -- sealing, opening and rewrapping envelopes
 * (docs/format.md section 7), with a key provider, a write-side DEK
 * manager, a read-side DEK cache and metrics.
 *
 * Algorithms: KS_ALG_XCHACHA20POLY1305 (the default for new writes) and
 * KS_ALG_AES256GCM (opt-in; KS_ERR_ALGORITHM_UNAVAILABLE where the CPU
 * lacks AES-NI: never a silent switch).  libsodium does the cryptography.
 *
 * Write side.  A context keeps one active DEK per (format, algorithm,
 * tenant, purpose, key_id, requested key_version).  It is generated in
 * process, wrapped once by the provider, never written anywhere in
 * plaintext, and replaced when it reaches max_messages, max_bytes or
 * max_age.  Nonces are unique per DEK across threads and fork(): each is a
 * random per-DEK prefix and a 64-bit counter, and a child process never
 * seals with a DEK its parent created (docs/format.md [F-CRYPTO-NONCE]).
 * Format 2's message key and commitment are derived once per DEK
 * ([F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]) and kept with it.
 *
 * Read side.  Unwrapped DEKs (with, for format 2, their derived key and
 * commitment) are cached (bounded entries and TTL) under the whole wrap
 * identity (every wrap AAD field and the wrapped bytes), so one tenant's
 * entry can never serve another's envelope.
 *
 * Memory.  DEKs and derived keys live in sodium_malloc'd (guarded,
 * mlocked) memory and are wiped on eviction, when the thread that held a
 * copy exits, and by ks_ctx_free().  Plaintext, DEKs and AADs are never
 * logged.
 *
 * Threads.  A ks_ctx may be used from several threads at once, and scales
 * with them: each of the first 63 threads alive at once that uses a
 * context gets a per-thread share of it on its first call (a few KiB),
 * so that a seal on an active DEK and an open of a cached DEK take no
 * lock and write no memory another thread writes.  Such a thread reserves
 * nonces and plaintext bytes of a DEK in blocks (at most 256 nonces and
 * 1/64 of the DEK's budgets at a time; a block left unspent is never
 * reissued, so a DEK may retire a little before its limits) and keeps up
 * to min(4, cache_entries) of the DEKs it opened last, each for no longer
 * than its read-cache entry's TTL.  The read cache therefore holds at
 * most cache_entries DEKs, and each such thread at most 4 more.  Further
 * threads take the locked paths.  A thread's share is wiped when it
 * exits.  The limits above still hold over all threads: a DEK seals at
 * most max_messages messages and at most max_bytes bytes plus the message
 * that crosses the limit.
 *
 * fork().  A child may go on using a context its parent created, from the
 * thread that forked: atfork handlers take every context lock before
 * fork() (so fork() waits for a DEK being created, a provider call bounded
 * by its timeout) and release them in both processes; the child seals only
 * with DEKs of its own.  A provider's own locks are the provider's
 * concern (the local keyring's read lock never blocks another reader).
 * ks_ctx_free() must not run while another thread uses the context.
 */
#ifndef KEYSHIFT_CRYPTO_H
#define KEYSHIFT_CRYPTO_H

#include <keyshift/aad.h>
#include <keyshift/common.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/health.h>
#include <keyshift/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Limits and defaults of a context. */
#define KS_DEK_MAX_MESSAGES_DEFAULT ((uint64_t)1 << 24)
#define KS_DEK_MAX_MESSAGES_AESGCM ((uint64_t)1 << 32) /* never more for aes-256-gcm */
#define KS_DEK_MAX_BYTES_DEFAULT ((uint64_t)1 << 36)    /* 64 GiB */
#define KS_DEK_MAX_AGE_DEFAULT 3600u                    /* seconds */
#define KS_CACHE_ENTRIES_DEFAULT 4096u
#define KS_CACHE_TTL_DEFAULT 300u                       /* seconds */

typedef struct ks_ctx_config {
    uint64_t dek_max_messages;   /* seals per write-side DEK; 1 .. 2^32 (aes-256-gcm is
                                    capped at 2^32 whatever is set) */
    uint64_t dek_max_bytes;      /* plaintext bytes per write-side DEK; >= 1 */
    uint32_t dek_max_age;        /* seconds a write-side DEK is used; >= 1 */
    uint32_t cache_entries;      /* read-side cache entries; 0 disables the cache (and the
                                    per-thread copies: every open then unwraps) */
    uint32_t cache_ttl;          /* seconds an unwrapped DEK stays cached */
    uint32_t provider_timeout_ms; /* deadline per provider call; 0: the provider's default */
    int latency_histograms;      /* nonzero: time every ks_seal and ks_open (two clock reads,
                                    a few tens of ns each) into the histograms and latency
                                    sums of ks_ctx_health_sample, kept per thread as the
                                    counts are (threads share no histogram line); default 0 */
} ks_ctx_config;

/* Fill cfg with the defaults above. */
KS_API void ks_ctx_config_default(ks_ctx_config *cfg);

typedef struct ks_ctx ks_ctx;

/*
 * Create a context over provider (copied; the provider's own state must
 * outlive the context).  cfg NULL means the defaults.  Initialises
 * libsodium.  KS_ERR_INVALID_ARGUMENT for a bad cfg, KS_ERR_NO_MEMORY,
 * KS_ERR_CRYPTO_INIT.
 */
KS_API KS_WUR ks_err ks_ctx_new(const ks_provider *provider, const ks_ctx_config *cfg,
                                ks_ctx **out);

/* Wipe every DEK and free the context; NULL is a no-op.  Does not destroy
 * the provider. */
KS_API void ks_ctx_free(ks_ctx *ctx);

/* What to seal under. */
typedef struct ks_seal_params {
    uint8_t format;        /* KS_FORMAT_V1 or KS_FORMAT_V2; 0 means KS_FORMAT_V2 */
    uint32_t algorithm;    /* KS_ALG_*; 0 means KS_ALG_XCHACHA20POLY1305 */
    ks_bytes tenant;       /* [F-NAME-1] */
    ks_bytes key_id;       /* [F-KEYID-1] */
    uint32_t key_version;  /* 0 means the key's primary version */
    ks_bytes purpose;      /* v2: required [F-NAME-1]; v1: must be empty */
    ks_bytes context;      /* 0 .. KS_CONTEXT_MAX bytes the reader rebuilds from trusted data */
} ks_seal_params;

/* An upper bound on the envelope that sealing pt_len bytes with p gives,
 * for any provider; 0 if p is unusable or the size exceeds the format. */
KS_API size_t ks_seal_max_len(const ks_seal_params *p, size_t pt_len);

/*
 * Seal pt[0, pt_len) into one envelope in out[0, cap); its length goes to
 * *out_len.  Errors: KS_ERR_INVALID_ARGUMENT (bad params), KS_ERR_TOO_LARGE
 * (plaintext beyond the default ciphertext limit), KS_ERR_BUFFER_TOO_SMALL
 * (cap below this envelope's exact length, known once the tuple's DEK is
 * there: a first seal may call the provider before refusing; a cap of
 * ks_seal_max_len() always suffices; nothing is written),
 * KS_ERR_ALGORITHM_UNAVAILABLE, provider errors.  Invalid tenant, key_id
 * or purpose give KS_ERR_INVALID_ARGUMENT.  pt and out must not overlap.
 * On failure out holds no plaintext.
 */
KS_API KS_WUR ks_err ks_seal(ks_ctx *ctx, const ks_seal_params *p, const uint8_t *pt, size_t pt_len,
                             uint8_t *out, size_t cap, size_t *out_len);

/* What the reader expects of an envelope. */
typedef struct ks_open_params {
    ks_bytes context;      /* the context the writer bound */
    ks_bytes tenant;       /* if not empty, the envelope's tenant must equal it */
    ks_bytes purpose;      /* if not empty, the envelope's purpose must equal it (a v1
                              envelope has none, so then it fails) */
} ks_open_params;

/*
 * Open the envelope env[0, env_len) into pt[0, cap); the plaintext length
 * (ciphertext length - 16) goes to *pt_len.
 *
 * Errors: a parse rejection (codes 1..31, *perr filled when not NULL);
 * KS_ERR_AUTH_FAILED whatever the cryptographic cause (wrong context,
 * tenant or purpose; tampering anywhere; a wrapped DEK that does not
 * unwrap; a commitment that does not match, checked in constant time
 * before the AEAD runs); KS_ERR_BUFFER_TOO_SMALL (nothing written);
 * KS_ERR_ALGORITHM_UNAVAILABLE; provider errors (KS_ERR_NOT_FOUND for an
 * unknown key, KS_ERR_DENIED for a disabled version, KS_ERR_REVOKED for a
 * destroyed one, ...).  No unauthenticated plaintext is ever released:
 * a failure once decryption ran leaves pt[0, cap) zero; earlier failures
 * do not touch pt.  A DEK found in the read cache is used without asking
 * the provider, so disabling or destroying a key version takes effect for
 * this context within cache_ttl seconds.
 */
KS_API KS_WUR ks_err ks_open(ks_ctx *ctx, const uint8_t *env, size_t env_len,
                             const ks_open_params *p, uint8_t *pt, size_t cap, size_t *pt_len,
                             ks_parse_error *perr);

/*
 * Verify: every check of ks_open(), in the same order and with the same
 * errors (but never KS_ERR_BUFFER_TOO_SMALL), without decrypting.  The
 * envelope is parsed, its tenant and purpose bound, its DEK unwrapped
 * (through the read cache), a v2 commitment compared and the AEAD tag
 * verified over the ciphertext and the data AAD; the plaintext is never
 * produced, so there is none to wipe and no size limit.  KS_OK exactly
 * when ks_open() would open it.  For a caller that must know an envelope
 * opens but has no use for its contents: `keyshift migrate verify`, and a
 * migration's check of each rewrapped value.  Counted as an open in the
 * metrics and the open latency histogram.
 */
KS_API KS_WUR ks_err ks_verify(ks_ctx *ctx, const uint8_t *env, size_t env_len,
                               const ks_open_params *p, ks_parse_error *perr);

/* Where to rewrap to. */
typedef struct ks_rewrap_params {
    ks_bytes key_id;       /* target key; empty means the envelope's own key_id */
    uint32_t key_version;  /* 0 means the target key's primary version */
} ks_rewrap_params;

/*
 * Rewrap: unwrap the envelope's DEK under its own key version and wrap it
 * under the target, writing the new envelope to out[0, cap).  Only key_id,
 * key_version and wrapped_dek change; nonce and ciphertext are
 * byte-identical.  A v2 envelope's commitment is checked against the
 * unwrapped DEK first (KS_ERR_AUTH_FAILED on mismatch); a v1 envelope has
 * nothing to check without its context.  Errors as ks_open(); out must
 * not overlap env.  Rewraps are memoised (cache_entries entries, cache_ttl
 * seconds; off when the cache is): the same wrapped DEK rewrapped to the
 * same target reuses one provider wrap, so wrap calls grow with distinct
 * DEKs, not envelopes; a target's change of primary is seen within
 * cache_ttl.
 */
KS_API KS_WUR ks_err ks_rewrap(ks_ctx *ctx, const uint8_t *env, size_t env_len,
                               const ks_rewrap_params *p, uint8_t *out, size_t cap,
                               size_t *out_len, ks_parse_error *perr);

/*
 * Ask ctx's provider about (key_id, key_version) with the context's
 * provider timeout; key_version 0 means the key's primary (out->version
 * is then the primary's number).  Provider errors are counted in the
 * metrics as for sealing.  Used to resolve a migration's target version
 * once.
 */
KS_API KS_WUR ks_err ks_ctx_key_info(ks_ctx *ctx, ks_bytes key_id, uint32_t key_version,
                                     ks_key_info *out);

/* Counters, with no secret in them.  A snapshot; every counter only grows. */
typedef struct ks_metrics {
    uint64_t seals;                /* envelopes sealed */
    uint64_t opens;                /* envelopes opened */
    uint64_t rewraps;              /* envelopes rewrapped */
    uint64_t auth_failures;        /* KS_ERR_AUTH_FAILED returned */
    uint64_t auth_fail_unwrap;     /*   of which: the wrapped DEK did not unwrap */
    uint64_t auth_fail_commitment; /*   of which: the v2 commitment did not match */
    uint64_t auth_fail_aead;       /*   of which: the AEAD tag did not verify */
    uint64_t auth_fail_binding;    /*   of which: tenant or purpose not as expected */
    uint64_t parse_errors[32];     /* by rejection code 1..31 (index = code) */
    uint64_t unknown_key;          /* provider said not-found */
    uint64_t provider_errors[6];   /* by code - KS_ERR_UNAVAILABLE: unavailable, timeout,
                                      denied, revoked, not-found, integrity */
    uint64_t cache_hits;           /* read-side DEK cache */
    uint64_t cache_misses;
    uint64_t wraps;                /* provider wrap calls */
    uint64_t unwraps;              /* provider unwrap calls */
    uint64_t deks_created;         /* write-side DEKs generated */
} ks_metrics;

/* Copy the context's counters into *out. */
KS_API void ks_ctx_metrics(ks_ctx *ctx, ks_metrics *out);

/*
 * The context's health counters since it was created (keyshift/health.h),
 * for a rollout's health window: out->seals (successful), out->opens
 * (every open that reached a verdict: opened, auth-failed or refused by
 * the parser), out->auth_failures, out->parse_errors (all classes),
 * out->provider_calls (wraps + unwraps), out->provider_errors (all
 * classes), and with cfg.latency_histograms the latency histograms of
 * ks_seal and ks_open (every call that got past its argument checks) and
 * the sums of those latencies (out->seal_ns_sum, out->open_ns_sum: ns,
 * modulo 2^64); out->time is 0.  Totals, not deltas: a reporter
 * subtracts its previous snapshot (ks_policy_report does).  No
 * secrets.
 */
KS_API void ks_ctx_health_sample(ks_ctx *ctx, ks_health_sample *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_CRYPTO_H */
