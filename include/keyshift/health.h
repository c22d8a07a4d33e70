/*
 * keyshift/health.h -- rollout health: interval samples of counters and
 * latency histograms, thresholds, their evaluation over a window, and the
 * Prometheus text exposition (docs/rollout.md).
 *
 * Everything here is plain data and pure functions: no I/O, no clock, no
 * allocation, no secrets.  Samples are produced by applications (from a
 * ks_ctx) and by `keyshift migrate`, stored by the rollout store in the
 * keyshift_metrics table, summed over a window, and judged against the
 * rollout's thresholds.
 *
 * Histograms.  Latencies are counted in log2 buckets of nanoseconds:
 * bucket 0 holds every sample below 2^KS_HIST_SHIFT ns (256 ns), bucket i
 * (1 <= i < KS_HIST_BUCKETS - 1) holds [2^(KS_HIST_SHIFT+i-1),
 * 2^(KS_HIST_SHIFT+i)) ns, and the last bucket holds everything from
 * 2^(KS_HIST_SHIFT+KS_HIST_BUCKETS-2) ns up.  A quantile is reported as
 * the upper bound of the bucket it falls in (an overestimate by at most a
 * factor of 2; never an underestimate, so a threshold on it fails safe).
 */
#ifndef KEYSHIFT_HEALTH_H
#define KEYSHIFT_HEALTH_H

#include <keyshift/common.h>
#include <keyshift/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The number of buckets of a latency histogram, and the log2 of the
 * upper bound of bucket 0 in nanoseconds. */
#define KS_HIST_BUCKETS 24
#define KS_HIST_SHIFT 8

/* A latency histogram (counts per bucket, see the file comment). */
typedef struct ks_histogram {
    uint64_t bucket[KS_HIST_BUCKETS];
} ks_histogram;

/* The counters of one interval (deltas, not totals since start) from one
 * source.  Rates are computed from the sum of samples over a window. */
typedef struct ks_health_sample {
    int64_t time;             /* Unix seconds at the end of the interval */
    uint64_t seals;           /* envelopes sealed */
    uint64_t opens;           /* envelope opens attempted */
    uint64_t auth_failures;   /* opens that returned auth-failed */
    uint64_t parse_errors;    /* opens refused by the strict parser */
    uint64_t provider_calls;  /* wrap and unwrap calls made to the key provider */
    uint64_t provider_errors; /* of which failed (any provider error class) */
    ks_histogram seal_ns;     /* latency of ks_seal */
    ks_histogram open_ns;     /* latency of ks_open */
} ks_health_sample;

/* The health thresholds of a rollout.  A rate is a fraction (0.001 is
 * 0.1 %); a negative rate or a 0 latency disables that check. */
typedef struct ks_thresholds {
    double max_auth_failure_rate;     /* auth_failures / opens */
    double max_parse_error_rate;      /* parse_errors / opens */
    double max_provider_error_rate;   /* provider_errors / provider_calls */
    uint64_t max_seal_p99_us;         /* p99 of seal latency */
    uint64_t max_open_p99_us;         /* p99 of open latency */
    uint64_t min_samples;             /* seals + opens needed for a verdict */
    uint32_t window_s;                /* the window the samples are summed over */
} ks_thresholds;

/* Default thresholds: 0.1 % auth failures, 0.1 % parse errors, 1 %
 * provider errors, p99 10 ms for both, 1000 samples, 300 s window. */
KS_API void ks_thresholds_default(ks_thresholds *out);

/* The checks of a verdict, as bits of ks_health_verdict.tripped. */
typedef enum ks_health_check {
    KS_HEALTH_AUTH_FAILURES = 1u << 0,
    KS_HEALTH_PARSE_ERRORS = 1u << 1,
    KS_HEALTH_PROVIDER_ERRORS = 1u << 2,
    KS_HEALTH_SEAL_P99 = 1u << 3,
    KS_HEALTH_OPEN_P99 = 1u << 4
} ks_health_check;

/* The outcome of an evaluation. */
typedef enum ks_health_status {
    KS_HEALTH_OK = 0,           /* every enabled check within its threshold */
    KS_HEALTH_TRIPPED = 1,      /* at least one check over its threshold */
    KS_HEALTH_INSUFFICIENT = 2  /* fewer than min_samples seals + opens */
} ks_health_status;

/* What an evaluation found: each observed value next to its limit. */
typedef struct ks_health_verdict {
    ks_health_status status;
    unsigned tripped;               /* ks_health_check bits over their threshold */
    uint64_t samples;               /* seals + opens in the window */
    double auth_failure_rate, parse_error_rate, provider_error_rate;
    uint64_t seal_p99_us, open_p99_us;
} ks_health_verdict;

/* Count one latency of ns nanoseconds in h.  Not atomic: callers that
 * share a histogram between threads serialise (ks_ctx does). */
KS_API void ks_histogram_record(ks_histogram *h, uint64_t ns);

/* The q-quantile (0 < q <= 1) of h in nanoseconds: the upper bound of the
 * bucket holding it (see the file comment); 0 for an empty histogram. */
KS_API uint64_t ks_histogram_quantile(const ks_histogram *h, double q);

/* Add sample s into acc (counters and buckets; saturating; acc->time
 * becomes the later of the two). */
KS_API void ks_health_add(ks_health_sample *acc, const ks_health_sample *s);

/* Judge window (the sum of the samples of a window) against t. */
KS_API void ks_health_evaluate(const ks_health_sample *window, const ks_thresholds *t,
                               ks_health_verdict *out);

/* The name of a check bit ("auth-failure-rate", "parse-error-rate",
 * "provider-error-rate", "seal-p99-us", "open-p99-us") or NULL. */
KS_API const char *ks_health_check_name(unsigned check);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_HEALTH_H */
