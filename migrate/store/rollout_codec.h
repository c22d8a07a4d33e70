/*
 * migrate/store/rollout_codec.h -- the stored forms of rollout values that
 * every rollout store (SQLite: migrate/store/sqlite/rollout_sqlite_rows.c,
 * PostgreSQL: migrate/store/pg/rollout_pg_rows.c) shares, whatever its
 * column types: the canary as a kind name, a percent and a "t1,t2" text,
 * phases by name, histograms as KS_HIST_BUCKETS little-endian uint64, and
 * the checks that tie a row's cells together (scope, phase, ranges).
 * Each store reads its cells strictly by its own types and hands the
 * values here; so a row means the same in every database.
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_ROLLOUT_CODEC_H
#define KS_MIGRATE_ROLLOUT_CODEC_H

#include <stdint.h>

#include <keyshift/health.h>
#include <keyshift/rollout.h>

/* The canary's tenants joined by ',' fit in this many bytes. */
#define KS_RCODEC_TENANTS_MAX (KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1))
/* Bytes of a stored histogram. */
#define KS_RCODEC_HIST_LEN (KS_HIST_BUCKETS * 8)

/* The stored name of canary kind k ("all", "tenants", "percent"). */
const char *ks_rcodec_canary_name(ks_canary_kind k);
/* The canary's tenants joined by ',' into out. */
void ks_rcodec_canary_join(const ks_rollout_canary *c, char out[KS_RCODEC_TENANTS_MAX + 1]);
/* Parse a stored canary (kind name, percent already within [0, 100],
 * tenants text, split in place) into *c: 0 for an unknown kind, an empty
 * or over-long tenant, too many, or tenants on another kind. */
int ks_rcodec_canary_parse(const char *kind, int64_t percent, char *tenants,
                           ks_rollout_canary *c);
/* Set r's scope from the stored scope key (empty: a column scope, which
 * names its table and column; else a key scope, which names neither and
 * whose source and target are of that key): 0 when they disagree. */
int ks_rcodec_scope_ok(ks_rollout *r, const char *key);
/* Finish a rollout read from its phase name and, in v, max_seal_p99_us,
 * max_open_p99_us, min_samples, window_s, min_soak_s, reader_ttl_s
 * (each already within its column's range): 0 for an unknown phase. */
int ks_rcodec_rollout_finish(ks_rollout *r, const char *phase, const int64_t v[6]);
/* Set r's encoding from its stored name ("binary" or "base64"): 0 for
 * any other. */
int ks_rcodec_encoding_parse(const char *name, ks_rollout *r);
/* Set a log row's phases from their names (from "" for none) and its
 * automatic flag: 0 for an unknown name. */
int ks_rcodec_log_finish(ks_rollout_log_entry *e, const char *from, const char *to,
                         int64_t automatic);
/* Encode h as KS_HIST_BUCKETS little-endian uint64 into out. */
void ks_rcodec_hist_encode(const ks_histogram *h, uint8_t out[KS_RCODEC_HIST_LEN]);
/* Decode KS_RCODEC_HIST_LEN bytes at p into h. */
void ks_rcodec_hist_decode(const uint8_t *p, ks_histogram *h);
/* Set a sample's counters from v: seals, opens, auth_failures,
 * parse_errors, provider_calls, provider_errors (each >= 0). */
void ks_rcodec_sample_counters(ks_health_sample *s, const int64_t v[6]);

#endif /* KS_MIGRATE_ROLLOUT_CODEC_H */
