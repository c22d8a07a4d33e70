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
 * The last bucket has no upper bound: a quantile in it is reported as
 * KS_HIST_UNBOUNDED, which exceeds every latency threshold.
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

/* The "upper bound" of the last histogram bucket, which has none: what
 * ks_histogram_quantile and ks_histogram_bucket_bound return for it, and
 * what ks_health_verdict's p99 fields hold (in µs) when the p99 lies in
 * it.  Being the largest uint64_t, it trips any enabled latency check. */
#define KS_HIST_UNBOUNDED UINT64_MAX

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
    uint64_t seal_ns_sum;     /* the sum of the latencies counted in seal_ns, in ns */
    uint64_t open_ns_sum;     /* the sum of the latencies counted in open_ns, in ns */
} ks_health_sample;

/* The health thresholds of a rollout.  A rate is a fraction (0.001 is
 * 0.1 %); a negative rate or a 0 latency disables that check.  A rate of
 * 0 is enabled and tolerates no failure; +infinity is enabled and never
 * trips.  A NaN rate is a misconfiguration: ks_thresholds_check rejects
 * it, and ks_health_evaluate treats its check as tripped (fail safe). */
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

/* KS_OK when t can be stored as a rollout's thresholds;
 * KS_ERR_INVALID_ARGUMENT for NULL, a NaN rate or a window_s of 0.  For
 * the rollout store and the CLI to refuse a bad configuration up front
 * rather than have every evaluation trip. */
KS_API KS_WUR ks_err ks_thresholds_check(const ks_thresholds *t);

/* The checks of a verdict, as bits of ks_health_verdict.tripped. */
typedef enum ks_health_check {
    KS_HEALTH_AUTH_FAILURES = 1u << 0,
    KS_HEALTH_PARSE_ERRORS = 1u << 1,
    KS_HEALTH_PROVIDER_ERRORS = 1u << 2,
    KS_HEALTH_SEAL_P99 = 1u << 3,
    KS_HEALTH_OPEN_P99 = 1u << 4
} ks_health_check;

/* Every check bit, and the number of checks. */
#define KS_HEALTH_ALL_CHECKS 0x1Fu
#define KS_HEALTH_N_CHECKS 5

/* The outcome of an evaluation. */
typedef enum ks_health_status {
    KS_HEALTH_OK = 0,           /* every enabled check within its threshold */
    KS_HEALTH_TRIPPED = 1,      /* at least one check over its threshold */
    KS_HEALTH_INSUFFICIENT = 2  /* fewer than min_samples seals + opens, or an enabled
                                   check has no data in the window (and none tripped) */
} ks_health_status;

/* What an evaluation found: each observed value next to its limit.  A
 * rate whose denominator is 0 is 0.  The p99 fields are the quantile of
 * ks_histogram_quantile converted to µs rounding up (so 1 ns over a
 * limit is over it), 0 for an empty histogram and KS_HIST_UNBOUNDED when
 * the p99 lies in the last bucket.  The observed values are filled in
 * whatever the status; tripped is 0 unless status is KS_HEALTH_TRIPPED. */
typedef struct ks_health_verdict {
    ks_health_status status;
    unsigned tripped;               /* ks_health_check bits over their threshold */
    unsigned no_data;               /* ks_health_check bits of enabled checks with nothing
                                       to judge in the window (see ks_health_evaluate) */
    uint64_t samples;               /* seals + opens in the window */
    double auth_failure_rate, parse_error_rate, provider_error_rate;
    uint64_t seal_p99_us, open_p99_us;
} ks_health_verdict;

/* The bucket (0 .. KS_HIST_BUCKETS - 1) that a latency of ns nanoseconds
 * falls in (see the file comment): for callers that keep their own
 * counters, e.g. atomic ones shared between threads (ks_ctx does). */
KS_API unsigned ks_histogram_bucket_of(uint64_t ns);

/* Count one latency of ns nanoseconds in h.  Not atomic: callers that
 * share a histogram between threads serialise (ks_ctx does).  h keeps
 * buckets only: a caller that wants the mean adds ns to its own sum
 * (ks_health_sample.seal_ns_sum and open_ns_sum). */
KS_API void ks_histogram_record(ks_histogram *h, uint64_t ns);

/* The q-quantile (0 < q <= 1) of h in nanoseconds: the upper bound of the
 * bucket holding it (see the file comment); 0 for an empty histogram.
 * The quantile is the ceil(q * total)-th smallest latency; q above 1 is
 * taken as 1, and q at or below 0 (or NaN) as the smallest latency. */
KS_API uint64_t ks_histogram_quantile(const ks_histogram *h, double q);

/* The exclusive upper bound in ns of bucket i: 2^(KS_HIST_SHIFT+i) for
 * i < KS_HIST_BUCKETS - 1, KS_HIST_UNBOUNDED for the last bucket (and for
 * any i past it).  Bucket i holds the whole nanoseconds below this bound
 * and at or above the bound of bucket i - 1. */
KS_API uint64_t ks_histogram_bucket_bound(unsigned i);

/* Add sample s into acc (counters, buckets and latency sums; saturating;
 * acc->time becomes the later of the two). */
KS_API void ks_health_add(ks_health_sample *acc, const ks_health_sample *s);

/* *out = what the totals `now` add to the earlier totals `before`, counter
 * by counter, bucket by bucket and sum by sum (one that went down means
 * its source was reset: all of it counts); out->time = now->time.  out may be now.  For reporters that
 * keep totals (ks_ctx_health_sample) and write intervals. */
KS_API void ks_health_growth(ks_health_sample *out, const ks_health_sample *now,
                             const ks_health_sample *before);

/* Judge window (the sum of the samples of a window) against t.  A check
 * trips when its observed value is above its limit (equal is within);
 * a disabled check never trips, nor does a rate with a 0 denominator
 * (unless its limit is NaN).  An enabled check has no data (its bit in
 * no_data) when the window holds nothing it measures: no opens for the
 * auth-failure and parse-error rates, no provider calls for the provider
 * error rate, an empty histogram for a p99 (e.g. opens counted by a
 * reporter that does not time them).  A check with no data is never
 * healthy: when none tripped, the status is KS_HEALTH_INSUFFICIENT
 * (disable the check, e.g. with `keyshift rollout set`, for an
 * application that never does what it measures).  Status is also
 * KS_HEALTH_INSUFFICIENT, with tripped 0, when seals + opens
 * (saturating) is below t->min_samples.
 * NULL window or t: *out is zeroed with status KS_HEALTH_INSUFFICIENT;
 * NULL out: nothing happens. */
KS_API void ks_health_evaluate(const ks_health_sample *window, const ks_thresholds *t,
                               ks_health_verdict *out);

/* The name of a check bit ("auth-failure-rate", "parse-error-rate",
 * "provider-error-rate", "seal-p99-us", "open-p99-us") or NULL. */
KS_API const char *ks_health_check_name(unsigned check);

/* The stable name of a status ("ok", "tripped", "insufficient") or NULL. */
KS_API const char *ks_health_status_name(ks_health_status status);

/*
 * Prometheus text exposition (format version 0.0.4) of a rollout's
 * thresholds and the guard's verdict on its window, for `keyshift rollout
 * metrics --prometheus`.  Every metric carries `# HELP` and `# TYPE`; the
 * window's own sums (the guard's input) are not exposed: the cumulative
 * counters of ks_metrics_write_totals give them with rate() or
 * increase() (docs/prometheus.md's recording rules):
 *
 *   keyshift_threshold_auth_failure_rate, _parse_error_rate,
 *   _provider_error_rate, _seal_p99_seconds, _open_p99_seconds
 *                                          gauge, the limits; +Inf when
 *                                          the check is disabled, NaN for
 *                                          a NaN rate
 *   keyshift_threshold_min_samples, keyshift_threshold_window_seconds
 *                                          gauge
 *   keyshift_health_status                 gauge, the ks_health_status
 *                                          value (0 ok, 1 tripped,
 *                                          2 insufficient)
 *   keyshift_health_tripped{check="..."}   gauge, 1 when that check
 *                                          (ks_health_check_name) tripped
 *
 * labels is NULL, "" or a pre-rendered label set put on every sample,
 * such as `rollout="3",table="payments"`, its values escaped with
 * ks_health_prometheus_label_escape; it must be well formed (names
 * [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", not "le", "check",
 * "phase" or "outcome", quoted values with only the escapes \\ \" \n)
 * or KS_ERR_INVALID_ARGUMENT.
 * v is the verdict to print, or NULL to evaluate window against t here.
 * Numbers are written the same in every locale.
 *
 * The text and a NUL go to buf[0, cap); *out_len receives the length of
 * the text (without the NUL).  KS_ERR_BUFFER_TOO_SMALL when cap is below
 * that length + 1: then *out_len receives the length needed (without the
 * NUL) and buf holds no usable text.  KS_ERR_INVALID_ARGUMENT for NULL
 * window, t, buf (with cap > 0) or out_len.
 */
KS_API KS_WUR ks_err ks_health_prometheus(const ks_health_sample *window, const ks_thresholds *t,
                                          const ks_health_verdict *v, const char *labels,
                                          char *buf, size_t cap, size_t *out_len);

/* Escape the label value value (a NUL-terminated UTF-8 string) for the
 * Prometheus text format: backslash to \, double quote to ", line feed
 * to 
; every other byte is copied.  The result and a NUL go to
 * buf[0, cap), its length (without the NUL) to *out_len.
 * KS_ERR_BUFFER_TOO_SMALL when cap is below that length + 1 (then
 * *out_len receives the length needed); KS_ERR_INVALID_ARGUMENT for NULL
 * value, buf (with cap > 0) or out_len. */
KS_API KS_WUR ks_err ks_health_prometheus_label_escape(const char *value, char *buf, size_t cap,
                                                       size_t *out_len);

/*
 * Cumulative exposition: counters and histograms that only grow over the
 * lifetime of what they count, written into a caller's buffer.  One
 * writer for every exporter: `keyshift rollout metrics`, `keyshift
 * migrate run --textfile` and a process serving /metrics (docs/prometheus.md).
 *
 * Use: ks_metrics_begin(&b, buf, cap), any ks_metrics_write_* calls
 * (each writes whole families, HELP and TYPE once per family; a family
 * name must come from one call only), then ks_metrics_end(&b, &len).
 * The writers never fail on their own: a text that does not fit, or a
 * malformed argument, is reported by ks_metrics_end, so that a caller
 * can call ks_metrics_begin(&b, NULL, 0) first to measure, then allocate
 * len + 1 bytes and write again.  Label sets follow the rules of
 * ks_health_prometheus.  No allocation, no I/O, no locale.
 */
typedef struct ks_metrics_buf {
    char *buf;
    size_t cap;
    size_t len; /* bytes the text needs so far (may exceed cap) */
    int bad;    /* a malformed argument was given: ks_metrics_end refuses */
} ks_metrics_buf;

/* Start a text in buf[0, cap) (buf NULL and cap 0 to measure only). */
KS_API void ks_metrics_begin(ks_metrics_buf *b, char *buf, size_t cap);

/* Finish the text: NUL-terminate it and put its length (without the
 * NUL) in *out_len.  KS_ERR_BUFFER_TOO_SMALL when it needs more than
 * cap - 1 bytes (*out_len is then the length needed); KS_ERR_INVALID_ARGUMENT
 * when a writer was given a malformed argument (or b or out_len is NULL). */
KS_API KS_WUR ks_err ks_metrics_end(ks_metrics_buf *b, size_t *out_len);

/* One series of health totals: a label set and counters since the start
 * of what it counts (a ks_ctx's life from ks_ctx_health_sample, or the
 * sum of a rollout's stored samples). */
typedef struct ks_metrics_series {
    const char *labels;              /* as ks_health_prometheus's labels */
    const ks_health_sample *totals;  /* totals, not deltas; time is ignored */
} ks_metrics_series;

/*
 * The totals of n series as counters and histograms:
 *
 *   keyshift_seals_total, keyshift_opens_total,
 *   keyshift_auth_failures_total, keyshift_parse_errors_total,
 *   keyshift_provider_calls_total, keyshift_provider_errors_total
 *                                          counter
 *   keyshift_seal_duration_seconds, keyshift_open_duration_seconds
 *                                          histogram: _bucket{le}
 *                                          cumulative, le the largest
 *                                          whole ns the bucket holds
 *                                          ("0.000000255" ... "1.073741823",
 *                                          exact as latencies are whole
 *                                          ns), "+Inf" = _count; _sum the
 *                                          seal_ns_sum / open_ns_sum in
 *                                          seconds, written exactly (at
 *                                          most 9 decimals)
 *
 * Nothing is written for n == 0.
 */
KS_API void ks_metrics_write_totals(ks_metrics_buf *b, const ks_metrics_series *s, size_t n);

/* One series of ks_metrics_write_histogram. */
typedef struct ks_metrics_hist_series {
    const char *labels;       /* as ks_health_prometheus's labels */
    const uint64_t *counts;   /* n_bounds + 1 per-bucket counts (not cumulative):
                                 counts[i] the observations in (bounds[i - 1], bounds[i]],
                                 counts[n_bounds] those above the last bound */
    double sum;               /* the sum of the observations, in the family's unit
                                 (>= 0, finite) */
} ks_metrics_hist_series;

/*
 * A histogram family name (a metric name, [a-zA-Z_:][a-zA-Z0-9_:]*, not
 * starting with "__") of n series over the caller's own bucket bounds
 * (n_bounds finite, strictly increasing), written as every keyshift
 * histogram is (ks_metrics_write_totals' too): # HELP help (no backslash
 * or line feed) and # TYPE, then per series name_bucket{le} cumulative
 * (le each bound, the shortest decimal that reads back as it), le="+Inf",
 * name_sum and name_count (= the +Inf bucket).  For a process's own
 * histograms, such as an agent's request durations.  A malformed argument
 * writes nothing and makes ks_metrics_end refuse the text.  Nothing is
 * written for n == 0.
 */
KS_API void ks_metrics_write_histogram(ks_metrics_buf *b, const char *name, const char *help,
                                       const double *bounds, size_t n_bounds,
                                       const ks_metrics_hist_series *s, size_t n);

/* The info-style gauge keyshift_rollout_phase{phase=...}: one sample per
 * name of phases[0, n), 1 for phases[current] and 0 for the others (all
 * 0 when current >= n), so that a change of phase moves a 1 between
 * series instead of starting new ones.  Names need no escaping (no
 * backslash, double quote or line feed). */
KS_API void ks_metrics_write_phase(ks_metrics_buf *b, const char *labels,
                                   const char *const *phases, size_t n, size_t current);

/* The number of outcomes of ks_metrics_migrate.rows. */
#define KS_METRICS_OUTCOMES 5

/* A migration run's progress, for ks_metrics_write_migrate. */
typedef struct ks_metrics_migrate {
    const char *labels;               /* as ks_health_prometheus's labels */
    uint64_t rows[KS_METRICS_OUTCOMES]; /* by outcome: done, skipped, raced, quarantined,
                                           wrong_state (the checkpoint's, every run's) */
    uint64_t target_rows;             /* rows in the table at the run's start */
    double throttled_s;               /* seconds this run was paused (>= 0) */
    int64_t last_progress_time;       /* Unix time of the last committed batch */
    int running;                      /* nonzero while the run is under way */
    int complete;                     /* nonzero once the migration is complete */
} ks_metrics_migrate;

/*
 * The progress of a migration run:
 *
 *   keyshift_migrate_rows_total{outcome="done|skipped|raced|quarantined|wrong_state"}
 *                                          counter (resets when a run
 *                                          supersedes the checkpoint)
 *   keyshift_migrate_target_rows           gauge
 *   keyshift_migrate_throttled_seconds_total
 *                                          counter, this run's (resets at
 *                                          each run)
 *   keyshift_migrate_last_progress_timestamp_seconds
 *                                          gauge
 *   keyshift_migrate_running, keyshift_migrate_complete
 *                                          gauge, 0 or 1
 */
KS_API void ks_metrics_write_migrate(ks_metrics_buf *b, const ks_metrics_migrate *m);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_HEALTH_H */
