/*
 * migrate/store/rollout_codec.c -- the stored forms of rollout values that
 * the SQLite and PostgreSQL rollout stores share (rollout_codec.h): one
 * definition of what a canary, a phase, a scope and a histogram look like
 * in a row, so that the two stores cannot drift apart.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <string.h>

#include "rollout_codec.h"

/* The stored names of the canary kinds, indexed by kind. */
static const char *const canary_names[] = {"all", "tenants", "percent"};

/* See rollout_codec.h. */
const char *ks_rcodec_canary_name(ks_canary_kind k)
{
    assert((unsigned)k < 3);
    return canary_names[k];
}

/* See rollout_codec.h. */
void ks_rcodec_canary_join(const ks_rollout_canary *c, char out[KS_RCODEC_TENANTS_MAX + 1])
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; c->kind == KS_CANARY_TENANTS && i < c->n_tenants; i++) {
        size_t n = strlen(c->tenants[i]);
        assert(o + n + 1 <= KS_RCODEC_TENANTS_MAX + 1);
        if (i > 0)
            out[o++] = ',';
        memcpy(out + o, c->tenants[i], n);
        o += n;
        out[o] = '\0';
    }
}

/* See rollout_codec.h (whether the canary is valid is the rollout
 * layer's check). */
int ks_rcodec_canary_parse(const char *kind, int64_t percent, char *tenants,
                           ks_rollout_canary *c)
{
    memset(c, 0, sizeof *c);
    int k = -1;
    for (int j = 0; j < 3; j++)
        if (strcmp(kind, canary_names[j]) == 0)
            k = j;
    if (k < 0 || percent < 0 || percent > 100)
        return 0;
    c->kind = (ks_canary_kind)k;
    c->percent = (uint32_t)percent;
    if (k != KS_CANARY_TENANTS)
        return tenants[0] == '\0';
    for (char *p = tenants;;) {
        char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (c->n_tenants == KS_ROLLOUT_TENANTS_MAX || n == 0 || n > KS_TENANT_MAX)
            return 0;
        memcpy(c->tenants[c->n_tenants], p, n);
        c->tenants[c->n_tenants][n] = '\0';
        c->n_tenants++;
        if (comma == NULL)
            return 1;
        p = comma + 1;
    }
}

/* See rollout_codec.h. */
int ks_rcodec_scope_ok(ks_rollout *r, const char *key)
{
    if (key[0] == '\0')
        return r->table[0] != '\0' && r->column[0] != '\0';
    r->scope = KS_SCOPE_KEY;
    return r->table[0] == '\0' && r->column[0] == '\0' && !r->source.is_plaintext &&
           strcmp(r->source.key_id, key) == 0 && strcmp(r->target.key_id, key) == 0;
}

/* See rollout_codec.h. */
int ks_rcodec_rollout_finish(ks_rollout *r, const char *phase, const int64_t v[6])
{
    r->phase = (ks_rollout_phase)ks_rollout_phase_from_name(phase);
    r->thresholds.max_seal_p99_us = (uint64_t)v[0];
    r->thresholds.max_open_p99_us = (uint64_t)v[1];
    r->thresholds.min_samples = (uint64_t)v[2];
    r->thresholds.window_s = (uint32_t)v[3];
    r->min_soak_s = (uint32_t)v[4];
    r->reader_ttl_s = (uint32_t)v[5];
    return r->phase != 0;
}

/* See rollout_codec.h. */
int ks_rcodec_encoding_parse(const char *name, ks_rollout *r)
{
    static const ks_value_encoding all[] = {KS_ENCODING_BINARY, KS_ENCODING_BASE64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(name, ks_value_encoding_name((int)all[i])) == 0) {
            r->encoding = all[i];
            return 1;
        }
    }
    return 0;
}

/* See rollout_codec.h. */
int ks_rcodec_log_finish(ks_rollout_log_entry *e, const char *from, const char *to,
                         int64_t automatic)
{
    e->from = from[0] != '\0' ? ks_rollout_phase_from_name(from) : 0;
    e->to = ks_rollout_phase_from_name(to);
    e->automatic = (int)automatic;
    return !(from[0] != '\0' && e->from == 0) && e->to != 0;
}

/* See rollout_codec.h. */
void ks_rcodec_hist_encode(const ks_histogram *h, uint8_t out[KS_RCODEC_HIST_LEN])
{
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++)
        for (size_t j = 0; j < 8; j++)
            out[i * 8 + j] = (uint8_t)(h->bucket[i] >> (8 * j));
}

/* See rollout_codec.h. */
void ks_rcodec_hist_decode(const uint8_t *p, ks_histogram *h)
{
    for (size_t b = 0; b < KS_HIST_BUCKETS; b++) {
        uint64_t v = 0;
        for (size_t j = 0; j < 8; j++)
            v |= (uint64_t)p[b * 8 + j] << (8 * j);
        h->bucket[b] = v;
    }
}

/* See rollout_codec.h. */
void ks_rcodec_sample_counters(ks_health_sample *s, const int64_t v[6])
{
    s->seals = (uint64_t)v[0];
    s->opens = (uint64_t)v[1];
    s->auth_failures = (uint64_t)v[2];
    s->parse_errors = (uint64_t)v[3];
    s->provider_calls = (uint64_t)v[4];
    s->provider_errors = (uint64_t)v[5];
}
