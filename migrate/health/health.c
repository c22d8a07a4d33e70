/*
 * migrate/health/health.c -- rollout health (include/keyshift/health.h,
 * docs/rollout.md "Health and thresholds"): log2 latency histograms,
 * summing interval samples, judging a window against thresholds, and the
 * Prometheus text exposition of all three.
 *
 * Pure functions over plain data: no I/O, no clock, no allocation, no
 * libsodium or SQLite.  Counters saturate at UINT64_MAX rather than wrap,
 * so a sum over a long window can only overstate, never reset to small.
 *
 * A module of its own, below the other folders of migrate/: the crypto
 * core (migrate/crypto/) counts its latencies in these histograms and the
 * rollout code (migrate/rollout/) judges them, and the crypto core must
 * not reach up into the rollout code for them (`make check-layout`).
 */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/health.h>

/* The default thresholds (keyshift/health.h, ks_thresholds_default). */
#define DEFAULT_MAX_AUTH_FAILURE_RATE 0.001
#define DEFAULT_MAX_PARSE_ERROR_RATE 0.001
#define DEFAULT_MAX_PROVIDER_ERROR_RATE 0.01
#define DEFAULT_MAX_P99_US 10000u
#define DEFAULT_MIN_SAMPLES 1000u
#define DEFAULT_WINDOW_S 300u

/* The quantile the latency checks look at. */
#define P99 0.99

/* a + b, or UINT64_MAX when the sum does not fit: a window's counters
 * must never wrap to a small (healthy-looking) value. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* See keyshift/health.h.  The defaults are strict on
 * failures that mean data cannot be read, looser on the provider, whose
 * errors are often transient and retried. */
void ks_thresholds_default(ks_thresholds *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    out->max_auth_failure_rate = DEFAULT_MAX_AUTH_FAILURE_RATE;
    out->max_parse_error_rate = DEFAULT_MAX_PARSE_ERROR_RATE;
    out->max_provider_error_rate = DEFAULT_MAX_PROVIDER_ERROR_RATE;
    out->max_seal_p99_us = DEFAULT_MAX_P99_US;
    out->max_open_p99_us = DEFAULT_MAX_P99_US;
    out->min_samples = DEFAULT_MIN_SAMPLES;
    out->window_s = DEFAULT_WINDOW_S;
}

/* See keyshift/health.h.  A NaN rate is refused here so that a stored
 * configuration never holds one; evaluation still copes (it trips). */
ks_err ks_thresholds_check(const ks_thresholds *t)
{
    if (t == NULL || isnan(t->max_auth_failure_rate) || isnan(t->max_parse_error_rate) ||
        isnan(t->max_provider_error_rate) || t->window_s == 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return KS_OK;
}

/* The bucket of a latency of ns nanoseconds: 0 below 2^KS_HIST_SHIFT,
 * else floor(log2(ns)) - KS_HIST_SHIFT + 1, capped at the last bucket.
 * floor(log2) is one count-leading-zeros instruction where the compiler
 * has one (every seal and open of a context with latency histograms
 * takes this path), else a binary search in portable C11. */
static unsigned bucket_of(uint64_t ns)
{
    if (ns < (UINT64_C(1) << KS_HIST_SHIFT)) {
        return 0;
    }
#if defined(__GNUC__) || defined(__clang__)
    const unsigned lg = 63u - (unsigned)__builtin_clzll(ns); /* ns != 0 here */
#else
    unsigned lg = 0;
    for (unsigned step = 32; step > 0; step >>= 1) {
        if (ns >> step) {
            ns >>= step;
            lg += step;
        }
    }
#endif
    unsigned i = lg - KS_HIST_SHIFT + 1;
    return i < KS_HIST_BUCKETS - 1 ? i : KS_HIST_BUCKETS - 1;
}

/* See keyshift/health.h.  Saturates the bucket rather than wrap. */
unsigned ks_histogram_bucket_of(uint64_t ns)
{
    return bucket_of(ns);
}

/* See keyshift/health.h. */
void ks_histogram_record(ks_histogram *h, uint64_t ns)
{
    if (h == NULL) {
        return;
    }
    unsigned i = bucket_of(ns);
    assert(i < KS_HIST_BUCKETS);
    h->bucket[i] = sat_add(h->bucket[i], 1);
}

/* See keyshift/health.h.  The shift stays below 64 as long as the
 * bucket count and shift keep the second-to-last bound in a uint64_t. */
uint64_t ks_histogram_bucket_bound(unsigned i)
{
    _Static_assert(KS_HIST_SHIFT + KS_HIST_BUCKETS - 2 < 64, "bucket bounds fit in 64 bits");
    if (i >= KS_HIST_BUCKETS - 1) {
        return KS_HIST_UNBOUNDED;
    }
    return UINT64_C(1) << (KS_HIST_SHIFT + i);
}

/* The rank (1-based) of the q-quantile among total latencies:
 * ceil(q * total), within [1, total].  Computed without ceil() so the
 * library needs no libm; the float product may round up by one rank,
 * which only moves the answer up (fail safe). */
static uint64_t quantile_rank(double q, uint64_t total)
{
    assert(total > 0);
    if (!(q > 0.0)) { /* also NaN */
        return 1;
    }
    if (q >= 1.0) {
        return total;
    }
    double r = q * (double)total;
    if (r >= (double)total) {
        return total;
    }
    uint64_t rank = (uint64_t)r;
    if ((double)rank < r) {
        rank++;
    }
    if (rank == 0) {
        rank = 1;
    }
    return rank < total ? rank : total;
}

/* See keyshift/health.h.  Walks the buckets until the cumulative count
 * reaches the rank; sums saturate, which can only make the total
 * smaller than the truth and the walk stop no earlier than it would. */
uint64_t ks_histogram_quantile(const ks_histogram *h, double q)
{
    if (h == NULL) {
        return 0;
    }
    uint64_t total = 0;
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        total = sat_add(total, h->bucket[i]);
    }
    if (total == 0) {
        return 0;
    }
    uint64_t rank = quantile_rank(q, total);
    uint64_t seen = 0;
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        seen = sat_add(seen, h->bucket[i]);
        if (seen >= rank) {
            return ks_histogram_bucket_bound(i);
        }
    }
    assert(0 && "the cumulative count reaches the total");
    return KS_HIST_UNBOUNDED;
}

/* a - b for a counter that only grows; a smaller a means its source was
 * reset (a new context), and then all of a is new. */
static uint64_t grown(uint64_t a, uint64_t b)
{
    return a >= b ? a - b : a;
}

/* out = op(a, b) counter by counter, bucket by bucket and sum by sum
 * (out may be a); the time is left to the caller. */
static void combine(ks_health_sample *out, const ks_health_sample *a, const ks_health_sample *b,
                    uint64_t (*op)(uint64_t, uint64_t))
{
    out->seals = op(a->seals, b->seals);
    out->opens = op(a->opens, b->opens);
    out->auth_failures = op(a->auth_failures, b->auth_failures);
    out->parse_errors = op(a->parse_errors, b->parse_errors);
    out->provider_calls = op(a->provider_calls, b->provider_calls);
    out->provider_errors = op(a->provider_errors, b->provider_errors);
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        out->seal_ns.bucket[i] = op(a->seal_ns.bucket[i], b->seal_ns.bucket[i]);
        out->open_ns.bucket[i] = op(a->open_ns.bucket[i], b->open_ns.bucket[i]);
    }
    out->seal_ns_sum = op(a->seal_ns_sum, b->seal_ns_sum);
    out->open_ns_sum = op(a->open_ns_sum, b->open_ns_sum);
}

/* See keyshift/health.h. */
void ks_health_add(ks_health_sample *acc, const ks_health_sample *s)
{
    if (acc == NULL || s == NULL) {
        return;
    }
    if (s->time > acc->time) {
        acc->time = s->time;
    }
    combine(acc, acc, s, sat_add);
}

/* See keyshift/health.h. */
void ks_health_growth(ks_health_sample *out, const ks_health_sample *now,
                      const ks_health_sample *before)
{
    if (out == NULL || now == NULL || before == NULL) {
        return;
    }
    int64_t t = now->time;
    combine(out, now, before, grown);
    out->time = t;
}

/* num / den as a rate; 0 when nothing was attempted. */
static double rate_of(uint64_t num, uint64_t den)
{
    return den == 0 ? 0.0 : (double)num / (double)den;
}

/* Whether a rate check trips: a NaN limit always does (a broken
 * configuration must not pass silently), a negative one never does
 * (disabled), nor does a rate with nothing attempted; otherwise when the
 * rate is above the limit. */
static int rate_trips(double rate, uint64_t den, double limit)
{
    if (isnan(limit)) {
        return 1;
    }
    if (limit < 0.0 || den == 0) {
        return 0;
    }
    return rate > limit;
}

/* A latency quantile in ns as whole µs, rounded up so that a latency a
 * nanosecond over a limit is over it; unbounded stays unbounded. */
static uint64_t ns_to_us_up(uint64_t ns)
{
    if (ns == KS_HIST_UNBOUNDED) {
        return KS_HIST_UNBOUNDED;
    }
    return ns / 1000 + (ns % 1000 != 0);
}

/* Whether a latency check trips: a limit of 0 is disabled. */
static int latency_trips(uint64_t p99_us, uint64_t limit_us)
{
    return limit_us != 0 && p99_us > limit_us;
}

/* Nonzero when h counts no latency at all. */
static int hist_empty(const ks_histogram *h)
{
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        if (h->bucket[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* The enabled checks of t that have nothing to judge in window: a rate
 * whose denominator is 0, a p99 of an empty histogram.  A NaN rate is
 * not among them: it trips whatever the data. */
static unsigned no_data_checks(const ks_health_sample *window, const ks_thresholds *t)
{
    unsigned bits = 0;
    if (t->max_auth_failure_rate >= 0.0 && window->opens == 0) {
        bits |= KS_HEALTH_AUTH_FAILURES;
    }
    if (t->max_parse_error_rate >= 0.0 && window->opens == 0) {
        bits |= KS_HEALTH_PARSE_ERRORS;
    }
    if (t->max_provider_error_rate >= 0.0 && window->provider_calls == 0) {
        bits |= KS_HEALTH_PROVIDER_ERRORS;
    }
    if (t->max_seal_p99_us != 0 && hist_empty(&window->seal_ns)) {
        bits |= KS_HEALTH_SEAL_P99;
    }
    if (t->max_open_p99_us != 0 && hist_empty(&window->open_ns)) {
        bits |= KS_HEALTH_OPEN_P99;
    }
    return bits;
}

/* See keyshift/health.h. */
void ks_health_evaluate(const ks_health_sample *window, const ks_thresholds *t,
                        ks_health_verdict *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    out->status = KS_HEALTH_INSUFFICIENT;
    if (window == NULL || t == NULL) {
        return;
    }
    out->samples = sat_add(window->seals, window->opens);
    out->auth_failure_rate = rate_of(window->auth_failures, window->opens);
    out->parse_error_rate = rate_of(window->parse_errors, window->opens);
    out->provider_error_rate = rate_of(window->provider_errors, window->provider_calls);
    out->seal_p99_us = ns_to_us_up(ks_histogram_quantile(&window->seal_ns, P99));
    out->open_p99_us = ns_to_us_up(ks_histogram_quantile(&window->open_ns, P99));
    out->no_data = no_data_checks(window, t);
    if (out->samples < t->min_samples) {
        return;
    }
    unsigned tripped = 0;
    if (rate_trips(out->auth_failure_rate, window->opens, t->max_auth_failure_rate)) {
        tripped |= KS_HEALTH_AUTH_FAILURES;
    }
    if (rate_trips(out->parse_error_rate, window->opens, t->max_parse_error_rate)) {
        tripped |= KS_HEALTH_PARSE_ERRORS;
    }
    if (rate_trips(out->provider_error_rate, window->provider_calls, t->max_provider_error_rate)) {
        tripped |= KS_HEALTH_PROVIDER_ERRORS;
    }
    if (latency_trips(out->seal_p99_us, t->max_seal_p99_us)) {
        tripped |= KS_HEALTH_SEAL_P99;
    }
    if (latency_trips(out->open_p99_us, t->max_open_p99_us)) {
        tripped |= KS_HEALTH_OPEN_P99;
    }
    assert((tripped & ~KS_HEALTH_ALL_CHECKS) == 0);
    out->tripped = tripped;
    out->status = tripped ? KS_HEALTH_TRIPPED
                  : out->no_data ? KS_HEALTH_INSUFFICIENT
                                 : KS_HEALTH_OK;
}

/* The names of the checks, indexed by bit position; stable: the CLI
 * prints them, and they are the Prometheus `check` label. */
static const char *const check_names[KS_HEALTH_N_CHECKS] = {
    "auth-failure-rate", "parse-error-rate", "provider-error-rate", "seal-p99-us", "open-p99-us",
};

/* See keyshift/health.h.  Exactly one known bit, or NULL. */
const char *ks_health_check_name(unsigned check)
{
    for (unsigned i = 0; i < KS_HEALTH_N_CHECKS; i++) {
        if (check == 1u << i) {
            return check_names[i];
        }
    }
    return NULL;
}

/* See keyshift/health.h. */
const char *ks_health_status_name(ks_health_status status)
{
    switch (status) {
    case KS_HEALTH_OK:
        return "ok";
    case KS_HEALTH_TRIPPED:
        return "tripped";
    case KS_HEALTH_INSUFFICIENT:
        return "insufficient";
    }
    return NULL;
}

/* ---- Prometheus text exposition ---------------------------------------- */

/* An output buffer that keeps counting past its capacity, so that one
 * pass both writes the text and measures it when it does not fit: the
 * public ks_metrics_buf (keyshift/health.h). */
typedef ks_metrics_buf sink;

/* Append n bytes of s to out (only while they fit; the length counts on). */
static void put_n(sink *out, const char *s, size_t n)
{
    if (n > 0 && out->len <= out->cap && n <= out->cap - out->len) {
        memcpy(out->buf + out->len, s, n);
    }
    out->len = out->len > SIZE_MAX - n ? SIZE_MAX : out->len + n;
}

/* Append the NUL-terminated s to out. */
static void put(sink *out, const char *s)
{
    put_n(out, s, strlen(s));
}

/* The decimal digits of v into num (at least 21 bytes). */
static void fmt_u64(char num[static 21], uint64_t v)
{
    char tmp[21];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++) {
        num[i] = tmp[n - 1 - i];
    }
    num[n] = '\0';
}

/* v / 10^digits as an exact decimal into num (at least 32 bytes), e.g.
 * (255, 9) -> "0.000000255", (10000, 6) -> "0.01", (3000000, 6) -> "3":
 * the latency units (ns, µs) in seconds without any float rounding. */
static void fmt_scaled(char num[static 32], uint64_t v, unsigned digits)
{
    assert(digits > 0 && digits < 10);
    uint64_t scale = 1;
    for (unsigned i = 0; i < digits; i++) {
        scale *= 10;
    }
    fmt_u64(num, v / scale);
    uint64_t frac = v % scale;
    if (frac == 0) {
        return;
    }
    size_t n = strlen(num);
    num[n++] = '.';
    for (unsigned i = digits; i-- > 0;) {
        num[n + i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    n += digits;
    while (num[n - 1] == '0') {
        n--;
    }
    num[n] = '\0';
}

/* d as a Prometheus float into num (at least 40 bytes): "NaN", "+Inf",
 * "-Inf", or the shortest of %.15g..%.17g that reads back as d, with the
 * locale's decimal point (whatever it is) replaced by '.'. */
static void fmt_double(char num[static 40], double d)
{
    if (isnan(d)) {
        strcpy(num, "NaN");
        return;
    }
    if (isinf(d)) {
        strcpy(num, d > 0 ? "+Inf" : "-Inf");
        return;
    }
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) {
        int n = snprintf(tmp, sizeof tmp, "%.*g", prec, d);
        assert(n > 0 && (size_t)n < sizeof tmp);
        (void)n;
        if (strtod(tmp, NULL) == d) {
            break;
        }
    }
    /* Copy digits, signs and exponent markers; any other run of bytes is
     * the locale's decimal point and becomes one '.'. */
    size_t o = 0;
    for (size_t i = 0; tmp[i] != '\0';) {
        char c = tmp[i];
        if ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == 'e' || c == 'E') {
            num[o++] = c;
            i++;
            continue;
        }
        num[o++] = '.';
        while (tmp[i] != '\0' && !(tmp[i] >= '0' && tmp[i] <= '9')) {
            i++;
        }
    }
    num[o] = '\0';
}

/* Write the # HELP and # TYPE lines of a metric family.  help is a
 * constant of this file, with no backslash or line feed to escape. */
static void family(sink *out, const char *name, const char *type, const char *help)
{
    assert(strchr(help, '\\') == NULL && strchr(help, '\n') == NULL);
    put(out, "# HELP ");
    put(out, name);
    put(out, " ");
    put(out, help);
    put(out, "\n# TYPE ");
    put(out, name);
    put(out, " ");
    put(out, type);
    put(out, "\n");
}

/* Write one sample line: name+suffix, the caller's labels and one more
 * label (extra_name="extra_value", when extra_name is not NULL; the
 * value is one of this file's, needing no escape), then the value. */
static void sample(sink *out, const char *name, const char *suffix, const char *labels,
                   const char *extra_name, const char *extra_value, const char *value)
{
    put(out, name);
    put(out, suffix);
    int have_labels = labels != NULL && labels[0] != '\0';
    if (have_labels || extra_name != NULL) {
        put(out, "{");
        if (have_labels) {
            put(out, labels);
        }
        if (extra_name != NULL) {
            put(out, have_labels ? "," : "");
            put(out, extra_name);
            put(out, "=\"");
            put(out, extra_value);
            put(out, "\"");
        }
        put(out, "}");
    }
    put(out, " ");
    put(out, value);
    put(out, "\n");
}

/* A gauge family with one unlabelled (but for the caller's labels)
 * sample of an integer value. */
static void gauge_u64(sink *out, const char *labels, const char *name, const char *help,
                      uint64_t v)
{
    char num[21];
    fmt_u64(num, v);
    family(out, name, "gauge", help);
    sample(out, name, "", labels, NULL, NULL, num);
}

/* The same for a float value. */
static void gauge_double(sink *out, const char *labels, const char *name, const char *help,
                         double v)
{
    char num[40];
    fmt_double(num, v);
    family(out, name, "gauge", help);
    sample(out, name, "", labels, NULL, NULL, num);
}

/* The same for a latency in whole µs, written in seconds; unbounded (the
 * verdict's p99 past the last bucket) or disabled_at_zero with v == 0
 * (a disabled limit) is +Inf. */
static void gauge_us(sink *out, const char *labels, const char *name, const char *help,
                     uint64_t us, int disabled_at_zero)
{
    char num[32];
    if (us == KS_HIST_UNBOUNDED || (disabled_at_zero && us == 0)) {
        strcpy(num, "+Inf");
    } else {
        fmt_scaled(num, us, 6);
    }
    family(out, name, "gauge", help);
    sample(out, name, "", labels, NULL, NULL, num);
}

/* A rate limit as a gauge: +Inf when disabled (negative), so that an
 * alert `observed > limit` never fires for it; NaN stays NaN. */
static void gauge_rate_limit(sink *out, const char *labels, const char *name, const char *help,
                             double limit)
{
    gauge_double(out, labels, name, help, limit < 0.0 ? INFINITY : limit);
}

/* Whether c may start (first) or continue a label name. */
static int label_name_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && c >= '0' && c <= '9');
}

/* Whether labels is a well-formed label set for sample(): NULL or "", or
 * name="value" pairs separated by commas, names valid and not reserved
 * ("__" prefix) nor ours ("le", "check", "phase", "outcome"), values with only the escapes
 * \\ \" \n and no raw line feed.  A malformed set would corrupt every
 * line of the exposition, so it is refused rather than copied. */
static int labels_ok(const char *labels)
{
    if (labels == NULL || labels[0] == '\0') {
        return 1;
    }
    const char *p = labels;
    for (;;) {
        const char *name = p;
        if (!label_name_char(*p, 1)) {
            return 0;
        }
        while (label_name_char(*p, 0)) {
            p++;
        }
        size_t n = (size_t)(p - name);
        if ((n >= 2 && name[0] == '_' && name[1] == '_') || (n == 2 && memcmp(name, "le", 2) == 0) ||
            (n == 5 && memcmp(name, "check", 5) == 0) || (n == 5 && memcmp(name, "phase", 5) == 0) ||
            (n == 7 && memcmp(name, "outcome", 7) == 0)) {
            return 0;
        }
        if (p[0] != '=' || p[1] != '"') {
            return 0;
        }
        p += 2;
        while (*p != '"') {
            if (*p == '\0' || *p == '\n') {
                return 0;
            }
            if (*p == '\\') {
                p++;
                if (*p != '\\' && *p != '"' && *p != 'n') {
                    return 0;
                }
            }
            p++;
        }
        p++;
        if (*p == '\0') {
            return 1;
        }
        if (*p != ',') {
            return 0;
        }
        p++;
    }
}

/* Finish a sink: NUL-terminate and report, or report the size needed. */
static ks_err finish(sink *out, size_t *out_len)
{
    *out_len = out->len;
    if (out->len >= out->cap) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    out->buf[out->len] = '\0';
    return KS_OK;
}

/* See keyshift/health.h.  One pass writes and measures; the families
 * come in a fixed order so that the output is stable for tests and diffs. */
ks_err ks_health_prometheus(const ks_health_sample *window, const ks_thresholds *t,
                            const ks_health_verdict *v, const char *labels, char *buf, size_t cap,
                            size_t *out_len)
{
    if (window == NULL || t == NULL || (buf == NULL && cap > 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!labels_ok(labels)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_health_verdict own;
    if (v == NULL) {
        ks_health_evaluate(window, t, &own);
        v = &own;
    }
    sink out = {buf, cap, 0, 0};
    const char *L = labels;

    gauge_rate_limit(&out, L, "keyshift_threshold_auth_failure_rate",
                     "Highest auth failure rate allowed (+Inf: check disabled).",
                     t->max_auth_failure_rate);
    gauge_rate_limit(&out, L, "keyshift_threshold_parse_error_rate",
                     "Highest parse error rate allowed (+Inf: check disabled).",
                     t->max_parse_error_rate);
    gauge_rate_limit(&out, L, "keyshift_threshold_provider_error_rate",
                     "Highest key provider error rate allowed (+Inf: check disabled).",
                     t->max_provider_error_rate);
    gauge_us(&out, L, "keyshift_threshold_seal_p99_seconds",
             "Highest p99 seal latency allowed (+Inf: check disabled).", t->max_seal_p99_us, 1);
    gauge_us(&out, L, "keyshift_threshold_open_p99_seconds",
             "Highest p99 open latency allowed (+Inf: check disabled).", t->max_open_p99_us, 1);
    gauge_u64(&out, L, "keyshift_threshold_min_samples",
              "Seals plus opens needed in the window for a verdict.", t->min_samples);
    gauge_u64(&out, L, "keyshift_threshold_window_seconds",
              "Length of the health window in seconds.", t->window_s);

    gauge_u64(&out, L, "keyshift_health_status",
              "Health verdict: 0 ok, 1 tripped, 2 insufficient data.", (uint64_t)v->status);

    family(&out, "keyshift_health_tripped", "gauge", "1 when the check is over its threshold.");
    for (unsigned i = 0; i < KS_HEALTH_N_CHECKS; i++) {
        sample(&out, "keyshift_health_tripped", "", L, "check", check_names[i],
               (v->tripped & (1u << i)) ? "1" : "0");
    }
    return finish(&out, out_len);
}

/* See keyshift/health.h.  Measures and writes in one pass, like the
 * exposition itself. */
ks_err ks_health_prometheus_label_escape(const char *value, char *buf, size_t cap, size_t *out_len)
{
    if (value == NULL || (buf == NULL && cap > 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    sink out = {buf, cap, 0, 0};
    for (const char *p = value; *p != '\0'; p++) {
        switch (*p) {
        case '\\':
            put_n(&out, "\\\\", 2);
            break;
        case '"':
            put_n(&out, "\\\"", 2);
            break;
        case '\n':
            put_n(&out, "\\n", 2);
            break;
        default:
            put_n(&out, p, 1);
            break;
        }
    }
    return finish(&out, out_len);
}

/* ---- cumulative exposition (ks_metrics_*) ------------------------------ */

/* The sink of b: the same type, named for the family writers above. */
static sink *sink_of(ks_metrics_buf *b)
{
    return b;
}

/* See keyshift/health.h. */
void ks_metrics_begin(ks_metrics_buf *b, char *buf, size_t cap)
{
    assert(b != NULL);
    b->buf = buf;
    b->cap = buf != NULL ? cap : 0;
    b->len = 0;
    b->bad = 0;
}

/* See keyshift/health.h. */
ks_err ks_metrics_end(ks_metrics_buf *b, size_t *out_len)
{
    if (b == NULL || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (b->bad) {
        *out_len = 0;
        return KS_ERR_INVALID_ARGUMENT;
    }
    return finish(sink_of(b), out_len);
}

/* Whether every label set of the n series is well formed; marks b bad
 * when one is not, so that ks_metrics_end refuses the whole text. */
static int series_ok(ks_metrics_buf *b, const ks_metrics_series *s, size_t n)
{
    if (s == NULL && n > 0) {
        b->bad = 1;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i].totals == NULL || !labels_ok(s[i].labels)) {
            b->bad = 1;
            return 0;
        }
    }
    return 1;
}

/* The counters of a ks_health_sample, by offset, with their family. */
static const struct {
    const char *name, *help;
    size_t offset;
} total_families[] = {
    {"keyshift_seals_total", "Envelopes sealed.", offsetof(ks_health_sample, seals)},
    {"keyshift_opens_total", "Envelope opens that reached a verdict (opened, auth failed or refused).",
     offsetof(ks_health_sample, opens)},
    {"keyshift_auth_failures_total", "Opens that failed authentication.",
     offsetof(ks_health_sample, auth_failures)},
    {"keyshift_parse_errors_total", "Opens refused by the strict envelope parser.",
     offsetof(ks_health_sample, parse_errors)},
    {"keyshift_provider_calls_total", "Key provider wrap and unwrap calls.",
     offsetof(ks_health_sample, provider_calls)},
    {"keyshift_provider_errors_total", "Key provider calls that failed, whatever the error class.",
     offsetof(ks_health_sample, provider_errors)},
};

/* The le text of finite bucket i of a histogram (at least 40 bytes). */
typedef void le_fn(const void *ctx, size_t i, char le[static 40]);

/* One histogram series, the rule of every keyshift histogram: its
 * n_finite finite buckets cumulative (counts[i] is bucket i's own count,
 * le its text from le_of), the +Inf bucket (counts[n_finite] added), then
 * _sum (the text sum) and _count (the +Inf bucket's), in the order
 * Prometheus' own clients write them.  Counts saturate. */
static void histogram_lines(sink *out, const char *name, const char *labels,
                            const uint64_t *counts, size_t n_finite, le_fn *le_of,
                            const void *ctx, const char *sum)
{
    uint64_t cum = 0;
    char num[21], le[40];
    for (size_t i = 0; i < n_finite; i++) {
        cum = sat_add(cum, counts[i]);
        le_of(ctx, i, le);
        fmt_u64(num, cum);
        sample(out, name, "_bucket", labels, "le", le, num);
    }
    cum = sat_add(cum, counts[n_finite]);
    fmt_u64(num, cum);
    sample(out, name, "_bucket", labels, "le", "+Inf", num);
    sample(out, name, "_sum", labels, NULL, NULL, sum);
    sample(out, name, "_count", labels, NULL, NULL, num);
}

/* le of a log2 latency bucket: the largest whole ns it holds, in seconds
 * (so `<= le` is exact). */
static void le_ns(const void *ctx, size_t i, char le[static 40])
{
    (void)ctx;
    assert(i < KS_HIST_BUCKETS - 1);
    fmt_scaled(le, ks_histogram_bucket_bound((unsigned)i) - 1, 9);
}

/* le of a bucket of ks_metrics_write_histogram: the caller's bound. */
static void le_bound(const void *ctx, size_t i, char le[static 40])
{
    fmt_double(le, ((const double *)ctx)[i]);
}

/* One cumulative latency histogram series of a ks_histogram: _sum is
 * sum_ns in seconds, exact (a whole number of ns has at most 9
 * decimals). */
static void histogram_series(sink *out, const char *labels, const char *name,
                             const ks_histogram *h, uint64_t sum_ns)
{
    char sum[32];
    fmt_scaled(sum, sum_ns, 9);
    histogram_lines(out, name, labels, h->bucket, KS_HIST_BUCKETS - 1, le_ns, NULL, sum);
}

/* See keyshift/health.h.  Families in a fixed order, each with all its
 * series, so that HELP and TYPE come once per family. */
void ks_metrics_write_totals(ks_metrics_buf *b, const ks_metrics_series *s, size_t n)
{
    assert(b != NULL);
    if (!series_ok(b, s, n) || n == 0) {
        return;
    }
    sink *out = sink_of(b);
    char num[21];
    for (size_t f = 0; f < sizeof total_families / sizeof total_families[0]; f++) {
        family(out, total_families[f].name, "counter", total_families[f].help);
        for (size_t i = 0; i < n; i++) {
            uint64_t v;
            memcpy(&v, (const char *)s[i].totals + total_families[f].offset, sizeof v);
            fmt_u64(num, v);
            sample(out, total_families[f].name, "", s[i].labels, NULL, NULL, num);
        }
    }
    family(out, "keyshift_seal_duration_seconds", "histogram",
           "Seal latency in seconds (log2 buckets of nanoseconds).");
    for (size_t i = 0; i < n; i++) {
        histogram_series(out, s[i].labels, "keyshift_seal_duration_seconds", &s[i].totals->seal_ns,
                         s[i].totals->seal_ns_sum);
    }
    family(out, "keyshift_open_duration_seconds", "histogram",
           "Open latency in seconds (log2 buckets of nanoseconds).");
    for (size_t i = 0; i < n; i++) {
        histogram_series(out, s[i].labels, "keyshift_open_duration_seconds", &s[i].totals->open_ns,
                         s[i].totals->open_ns_sum);
    }
}

/* Whether name is a metric name: [a-zA-Z_:][a-zA-Z0-9_:]*, not
 * reserved ("__" prefix). */
static int metric_name_ok(const char *name)
{
    if (name == NULL || name[0] == '\0' || strncmp(name, "__", 2) == 0) {
        return 0;
    }
    for (size_t i = 0; name[i] != '\0'; i++) {
        if (!label_name_char(name[i], i == 0) && name[i] != ':') {
            return 0;
        }
    }
    return 1;
}

/* See keyshift/health.h.  Every argument is checked before a byte is
 * written, so a refused call leaves no half family behind. */
void ks_metrics_write_histogram(ks_metrics_buf *b, const char *name, const char *help,
                                const double *bounds, size_t n_bounds,
                                const ks_metrics_hist_series *s, size_t n)
{
    assert(b != NULL);
    int ok = metric_name_ok(name) && help != NULL && strpbrk(help, "\\\n") == NULL &&
             (bounds != NULL || n_bounds == 0) && (s != NULL || n == 0);
    for (size_t i = 0; ok && i < n_bounds; i++) {
        ok = isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]);
    }
    for (size_t i = 0; ok && i < n; i++) {
        ok = labels_ok(s[i].labels) && s[i].counts != NULL && s[i].sum >= 0.0 &&
             !isinf(s[i].sum);
    }
    if (!ok) {
        b->bad = 1;
        return;
    }
    if (n == 0) {
        return;
    }
    sink *out = sink_of(b);
    family(out, name, "histogram", help);
    for (size_t i = 0; i < n; i++) {
        char sum[40];
        fmt_double(sum, s[i].sum);
        histogram_lines(out, name, s[i].labels, s[i].counts, n_bounds, le_bound, bounds, sum);
    }
}

/* See keyshift/health.h. */
void ks_metrics_write_phase(ks_metrics_buf *b, const char *labels, const char *const *phases,
                            size_t n, size_t current)
{
    assert(b != NULL);
    if (!labels_ok(labels) || (phases == NULL && n > 0)) {
        b->bad = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (phases[i] == NULL || strpbrk(phases[i], "\\\"\n") != NULL) {
            b->bad = 1;
            return;
        }
    }
    sink *out = sink_of(b);
    family(out, "keyshift_rollout_phase", "gauge",
           "1 for the phase the rollout is in, 0 for every other phase.");
    for (size_t i = 0; i < n; i++) {
        sample(out, "keyshift_rollout_phase", "", labels, "phase", phases[i], i == current ? "1" : "0");
    }
}

/* The outcome label values of ks_metrics_migrate.rows, in index order. */
static const char *const outcome_names[KS_METRICS_OUTCOMES] = {"done", "skipped", "raced",
                                                               "quarantined", "wrong_state"};

/* See keyshift/health.h. */
void ks_metrics_write_migrate(ks_metrics_buf *b, const ks_metrics_migrate *m)
{
    assert(b != NULL);
    if (m == NULL || !labels_ok(m->labels) || !(m->throttled_s >= 0.0)) {
        b->bad = 1;
        return;
    }
    sink *out = sink_of(b);
    const char *L = m->labels;
    char num[40];
    family(out, "keyshift_migrate_rows_total", "counter",
           "Rows the migration has dealt with, by outcome, over every run of its checkpoint.");
    for (unsigned i = 0; i < KS_METRICS_OUTCOMES; i++) {
        fmt_u64(num, m->rows[i]);
        sample(out, "keyshift_migrate_rows_total", "", L, "outcome", outcome_names[i], num);
    }
    gauge_u64(out, L, "keyshift_migrate_target_rows",
              "Rows in the migrated column's table when the run started.", m->target_rows);
    family(out, "keyshift_migrate_throttled_seconds_total", "counter",
           "Seconds this run spent paused by its throttle.");
    fmt_double(num, m->throttled_s);
    sample(out, "keyshift_migrate_throttled_seconds_total", "", L, NULL, NULL, num);
    gauge_u64(out, L, "keyshift_migrate_last_progress_timestamp_seconds",
              "Unix time of the run's last committed batch.",
              m->last_progress_time < 0 ? 0 : (uint64_t)m->last_progress_time);
    gauge_u64(out, L, "keyshift_migrate_running", "1 while the run is under way, 0 once it ended.",
              m->running ? 1 : 0);
    gauge_u64(out, L, "keyshift_migrate_complete",
              "1 once the migration is complete, 0 before (stopped, failed or running).",
              m->complete ? 1 : 0);
}
