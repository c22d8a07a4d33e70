/*
 * tests/test_health.c -- rollout health (keyshift/health.h): histogram
 * buckets and quantiles, summing samples, judging a window against its
 * thresholds, and the Prometheus text exposition.
 *
 * Everything here is pure: no database, no clock, no provider.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include <keyshift/health.h>

/* A histogram's count in bucket i after recording one latency of ns. */
static unsigned bucket_of(uint64_t ns)
{
    ks_histogram h = {{0}};
    ks_histogram_record(&h, ns);
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        if (h.bucket[i] == 1) {
            return i;
        }
    }
    fail_msg("latency %llu recorded nowhere", (unsigned long long)ns);
    return KS_HIST_BUCKETS;
}

/* A window that passes the default thresholds: 1000 seals and opens, no
 * failures, every latency 1 µs. */
static ks_health_sample healthy(void)
{
    ks_health_sample s;
    memset(&s, 0, sizeof s);
    s.time = 1700000000;
    s.seals = 1000;
    s.opens = 1000;
    s.provider_calls = 100;
    s.seal_ns.bucket[2] = 1000;
    s.open_ns.bucket[2] = 1000;
    s.seal_ns_sum = 1000 * 600; /* bucket 2: [512, 1024) ns */
    s.open_ns_sum = 1000 * 700;
    return s;
}

/* Evaluate w against t and return the verdict. */
static ks_health_verdict judge(const ks_health_sample *w, const ks_thresholds *t)
{
    ks_health_verdict v;
    memset(&v, 0xA5, sizeof v);
    ks_health_evaluate(w, t, &v);
    return v;
}

/* Assert v's status and tripped checks. */
static void expect(const ks_health_verdict *v, ks_health_status status, unsigned tripped)
{
    assert_int_equal(v->status, status);
    assert_int_equal(v->tripped, tripped);
}

/* The defaults are the documented ones, and pass ks_thresholds_check;
 * NaN rates and an empty window are refused. */
static void test_defaults_and_check(void **state)
{
    (void)state;
    ks_thresholds t;
    memset(&t, 0xFF, sizeof t);
    ks_thresholds_default(&t);
    assert_true(t.max_auth_failure_rate == 0.001);
    assert_true(t.max_parse_error_rate == 0.001);
    assert_true(t.max_provider_error_rate == 0.01);
    assert_int_equal(t.max_seal_p99_us, 10000);
    assert_int_equal(t.max_open_p99_us, 10000);
    assert_int_equal(t.min_samples, 1000);
    assert_int_equal(t.window_s, 300);
    assert_int_equal(ks_thresholds_check(&t), KS_OK);
    ks_thresholds_default(NULL);

    ks_thresholds u = t;
    u.max_auth_failure_rate = -1.0; /* disabled is valid */
    u.max_seal_p99_us = 0;
    u.max_parse_error_rate = INFINITY;
    assert_int_equal(ks_thresholds_check(&u), KS_OK);
    u = t;
    u.max_parse_error_rate = NAN;
    assert_int_equal(ks_thresholds_check(&u), KS_ERR_INVALID_ARGUMENT);
    u = t;
    u.max_provider_error_rate = NAN;
    assert_int_equal(ks_thresholds_check(&u), KS_ERR_INVALID_ARGUMENT);
    u = t;
    u.max_auth_failure_rate = NAN;
    assert_int_equal(ks_thresholds_check(&u), KS_ERR_INVALID_ARGUMENT);
    u = t;
    u.window_s = 0;
    assert_int_equal(ks_thresholds_check(&u), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_thresholds_check(NULL), KS_ERR_INVALID_ARGUMENT);
}

/* Bucket 0 is below 256 ns; bucket i holds [2^(7+i), 2^(8+i)); the last
 * holds everything from 2^30 ns, up to UINT64_MAX. */
static void test_bucket_boundaries(void **state)
{
    (void)state;
    assert_int_equal(bucket_of(0), 0);
    assert_int_equal(bucket_of(1), 0);
    assert_int_equal(bucket_of(255), 0);
    assert_int_equal(bucket_of(256), 1);
    assert_int_equal(bucket_of(511), 1);
    assert_int_equal(bucket_of(512), 2);
    assert_int_equal(bucket_of(1023), 2);
    assert_int_equal(bucket_of(1024), 3);
    assert_int_equal(bucket_of((UINT64_C(1) << 30) - 1), KS_HIST_BUCKETS - 2);
    assert_int_equal(bucket_of(UINT64_C(1) << 30), KS_HIST_BUCKETS - 1);
    assert_int_equal(bucket_of(UINT64_C(1) << 40), KS_HIST_BUCKETS - 1);
    assert_int_equal(bucket_of(UINT64_MAX), KS_HIST_BUCKETS - 1);

    assert_int_equal(ks_histogram_bucket_bound(0), 256);
    assert_int_equal(ks_histogram_bucket_bound(1), 512);
    assert_int_equal(ks_histogram_bucket_bound(KS_HIST_BUCKETS - 2), UINT64_C(1) << 30);
    assert_true(ks_histogram_bucket_bound(KS_HIST_BUCKETS - 1) == KS_HIST_UNBOUNDED);
    assert_true(ks_histogram_bucket_bound(1000) == KS_HIST_UNBOUNDED);
    /* Every bound is where the next bucket starts. */
    for (unsigned i = 0; i + 1 < KS_HIST_BUCKETS; i++) {
        uint64_t b = ks_histogram_bucket_bound(i);
        assert_int_equal(bucket_of(b - 1), i);
        assert_int_equal(bucket_of(b), i + 1);
    }
    ks_histogram_record(NULL, 5);
}

/* A bucket at UINT64_MAX stays there. */
static void test_record_saturates(void **state)
{
    (void)state;
    ks_histogram h = {{0}};
    h.bucket[1] = UINT64_MAX - 1;
    ks_histogram_record(&h, 300);
    assert_true(h.bucket[1] == UINT64_MAX);
    ks_histogram_record(&h, 300);
    assert_true(h.bucket[1] == UINT64_MAX);
    assert_int_equal(h.bucket[0], 0);
    assert_int_equal(h.bucket[2], 0);
}

/* Empty: 0.  One bucket: its upper bound for every q.  The last bucket:
 * KS_HIST_UNBOUNDED. */
static void test_quantile_empty_and_single(void **state)
{
    (void)state;
    ks_histogram h = {{0}};
    assert_int_equal(ks_histogram_quantile(&h, 0.99), 0);
    assert_int_equal(ks_histogram_quantile(&h, 0.5), 0);
    assert_int_equal(ks_histogram_quantile(NULL, 0.99), 0);

    ks_histogram_record(&h, 300);
    assert_int_equal(ks_histogram_quantile(&h, 0.5), 512);
    assert_int_equal(ks_histogram_quantile(&h, 0.99), 512);
    assert_int_equal(ks_histogram_quantile(&h, 1.0), 512);

    ks_histogram z = {{0}};
    ks_histogram_record(&z, 0);
    assert_int_equal(ks_histogram_quantile(&z, 0.99), 256);

    ks_histogram top = {{0}};
    top.bucket[KS_HIST_BUCKETS - 1] = 7;
    assert_true(ks_histogram_quantile(&top, 0.99) == KS_HIST_UNBOUNDED);
    assert_true(ks_histogram_quantile(&top, 0.01) == KS_HIST_UNBOUNDED);
}

/* p99 over a spread: the ceil(0.99 * n)-th latency's bucket; q outside
 * (0, 1] is clamped. */
static void test_quantile_spread(void **state)
{
    (void)state;
    ks_histogram h = {{0}};
    h.bucket[0] = 99;
    h.bucket[3] = 1;
    assert_int_equal(ks_histogram_quantile(&h, 0.99), 256);  /* rank 99 */
    assert_int_equal(ks_histogram_quantile(&h, 0.991), 2048); /* rank 100 */
    assert_int_equal(ks_histogram_quantile(&h, 1.0), 2048);
    assert_int_equal(ks_histogram_quantile(&h, 5.0), 2048);
    assert_int_equal(ks_histogram_quantile(&h, 0.0), 256);
    assert_int_equal(ks_histogram_quantile(&h, -1.0), 256);
    assert_int_equal(ks_histogram_quantile(&h, NAN), 256);

    ks_histogram s = {{0}};
    s.bucket[1] = 500;
    s.bucket[4] = 489;
    s.bucket[9] = 11; /* 1000 in all; the 990th is in bucket 9 */
    assert_int_equal(ks_histogram_quantile(&s, 0.99), UINT64_C(1) << 17);
    assert_int_equal(ks_histogram_quantile(&s, 0.5), 512); /* rank 500 */
    assert_int_equal(ks_histogram_quantile(&s, 0.501), 4096);
    s.bucket[4] = 490; /* 1001: rank 991, bucket 9 */
    s.bucket[9] = 11;
    assert_int_equal(ks_histogram_quantile(&s, 0.99), UINT64_C(1) << 17);
    s.bucket[9] = 10; /* 1000: rank 990, bucket 4 */
    assert_int_equal(ks_histogram_quantile(&s, 0.99), 4096);

    /* Saturated counts do not overflow the walk. */
    ks_histogram big = {{0}};
    big.bucket[0] = UINT64_MAX;
    big.bucket[KS_HIST_BUCKETS - 1] = UINT64_MAX;
    assert_int_equal(ks_histogram_quantile(&big, 0.99), 256);
    assert_true(ks_histogram_quantile(&big, 1.0) == 256); /* the total saturates at bucket 0 */
}

/* Counters and buckets add and saturate; time is the later one. */
static void test_add(void **state)
{
    (void)state;
    ks_health_sample acc = healthy(), s = healthy();
    s.time = acc.time + 10;
    s.auth_failures = 3;
    ks_health_add(&acc, &s);
    assert_int_equal(acc.time, s.time);
    assert_int_equal(acc.seals, 2000);
    assert_int_equal(acc.opens, 2000);
    assert_int_equal(acc.auth_failures, 3);
    assert_int_equal(acc.provider_calls, 200);
    assert_int_equal(acc.seal_ns.bucket[2], 2000);
    assert_int_equal(acc.open_ns.bucket[2], 2000);
    assert_int_equal(acc.seal_ns_sum, 2 * 1000 * 600);
    assert_int_equal(acc.open_ns_sum, 2 * 1000 * 700);

    s.time = 5; /* earlier: time stays */
    ks_health_add(&acc, &s);
    assert_int_equal(acc.time, 1700000010);

    ks_health_sample a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.seals = a.opens = a.auth_failures = a.parse_errors = UINT64_MAX - 1;
    a.provider_calls = a.provider_errors = UINT64_MAX;
    a.seal_ns.bucket[0] = a.open_ns.bucket[KS_HIST_BUCKETS - 1] = UINT64_MAX - 2;
    a.seal_ns_sum = a.open_ns_sum = UINT64_MAX - 1000;
    b.seals = b.opens = b.auth_failures = b.parse_errors = 2;
    b.provider_calls = b.provider_errors = UINT64_MAX;
    b.seal_ns.bucket[0] = b.open_ns.bucket[KS_HIST_BUCKETS - 1] = 5;
    b.seal_ns_sum = 999;
    b.open_ns_sum = 1001;
    b.time = -3;
    ks_health_add(&a, &b);
    assert_true(a.seals == UINT64_MAX && a.opens == UINT64_MAX);
    assert_true(a.auth_failures == UINT64_MAX && a.parse_errors == UINT64_MAX);
    assert_true(a.provider_calls == UINT64_MAX && a.provider_errors == UINT64_MAX);
    assert_true(a.seal_ns.bucket[0] == UINT64_MAX);
    assert_true(a.open_ns.bucket[KS_HIST_BUCKETS - 1] == UINT64_MAX);
    assert_true(a.seal_ns_sum == UINT64_MAX - 1 && a.open_ns_sum == UINT64_MAX);
    assert_int_equal(a.time, 0);

    ks_health_add(NULL, &b);
    ks_health_add(&a, NULL);
}

/* A healthy window passes, with its observed values filled in. */
static void test_evaluate_ok(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    ks_health_sample w = healthy();
    w.auth_failures = 1; /* exactly the limit: within */
    w.parse_errors = 1;
    w.provider_errors = 1; /* 1 % of 100: within */
    ks_health_verdict v = judge(&w, &t);
    expect(&v, KS_HEALTH_OK, 0);
    assert_int_equal(v.samples, 2000);
    assert_true(v.auth_failure_rate == 0.001);
    assert_true(v.parse_error_rate == 0.001);
    assert_true(v.provider_error_rate == 0.01);
    assert_int_equal(v.seal_p99_us, 2); /* 1024 ns, rounded up */
    assert_int_equal(v.open_p99_us, 2);
}

/* Each rate check trips just over its limit, alone. */
static void test_rate_checks_trip(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    /* One failure over each limit (1 per 1000 opens, 1 per 100 calls). */
    const struct {
        size_t field;
        unsigned check;
    } cases[] = {
        {offsetof(ks_health_sample, auth_failures), KS_HEALTH_AUTH_FAILURES},
        {offsetof(ks_health_sample, parse_errors), KS_HEALTH_PARSE_ERRORS},
        {offsetof(ks_health_sample, provider_errors), KS_HEALTH_PROVIDER_ERRORS},
    };
    ks_health_sample w;
    ks_health_verdict v;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        w = healthy();
        uint64_t two = 2;
        memcpy((char *)&w + cases[i].field, &two, sizeof two);
        v = judge(&w, &t);
        expect(&v, KS_HEALTH_TRIPPED, cases[i].check);
    }
    assert_true(v.provider_error_rate == 0.02);
    w = healthy();
    w.auth_failures = 2;
    assert_true(judge(&w, &t).auth_failure_rate == 0.002);

    w = healthy();
    w.auth_failures = 500;
    w.parse_errors = 500;
    w.provider_errors = 100;
    v = judge(&w, &t);
    assert_int_equal(v.tripped,
                     KS_HEALTH_AUTH_FAILURES | KS_HEALTH_PARSE_ERRORS | KS_HEALTH_PROVIDER_ERRORS);

    /* A limit of 0 tolerates none. */
    t.max_auth_failure_rate = 0.0;
    w = healthy();
    v = judge(&w, &t);
    assert_int_equal(v.status, KS_HEALTH_OK);
    w.auth_failures = 1;
    v = judge(&w, &t);
    assert_int_equal(v.tripped, KS_HEALTH_AUTH_FAILURES);
}

/* The latency checks compare p99 in µs rounded up: 8388608 ns is 8389
 * µs, over 8388 and within 8389. */
static void test_latency_checks_trip(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    ks_health_sample w = healthy();
    w.seal_ns.bucket[2] = 0;
    w.seal_ns.bucket[15] = 1000; /* bound 2^23 ns = 8388.608 µs */
    ks_health_verdict v = judge(&w, &t);
    assert_int_equal(v.status, KS_HEALTH_OK);
    assert_int_equal(v.seal_p99_us, 8389);

    t.max_seal_p99_us = 8389;
    v = judge(&w, &t);
    assert_int_equal(v.status, KS_HEALTH_OK);
    t.max_seal_p99_us = 8388;
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_TRIPPED, KS_HEALTH_SEAL_P99);

    ks_thresholds_default(&t);
    w = healthy();
    w.open_ns.bucket[2] = 980;
    w.open_ns.bucket[16] = 20; /* 2 % at 16.78 ms: p99 over 10 ms */
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_TRIPPED, KS_HEALTH_OPEN_P99);
    assert_int_equal(v.open_p99_us, 16778);
    w.open_ns.bucket[2] = 990;
    w.open_ns.bucket[16] = 10; /* 1 %: p99 still fast */
    v = judge(&w, &t);
    assert_int_equal(v.status, KS_HEALTH_OK);
    assert_int_equal(v.open_p99_us, 2);

    /* Past the last bound: unbounded, over any finite limit. */
    w = healthy();
    w.seal_ns.bucket[KS_HIST_BUCKETS - 1] = 1000;
    t.max_seal_p99_us = UINT64_MAX - 1;
    v = judge(&w, &t);
    assert_true(v.seal_p99_us == KS_HIST_UNBOUNDED);
    assert_int_equal(v.tripped, KS_HEALTH_SEAL_P99);

    /* Empty histograms: p99 0, and no data: 2970 opens that nobody
     * timed are not a p99 within its limit. */
    ks_thresholds_default(&t);
    w = healthy();
    w.opens = 2970;
    memset(&w.seal_ns, 0, sizeof w.seal_ns);
    memset(&w.open_ns, 0, sizeof w.open_ns);
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0);
    assert_int_equal(v.no_data, KS_HEALTH_SEAL_P99 | KS_HEALTH_OPEN_P99);
    assert_int_equal(v.seal_p99_us, 0);
    assert_int_equal(v.open_p99_us, 0);
    /* A trip elsewhere still trips. */
    w.auth_failures = 100;
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_TRIPPED, KS_HEALTH_AUTH_FAILURES);
    /* Disabled, the checks need no data. */
    w.auth_failures = 0;
    t.max_seal_p99_us = 0;
    t.max_open_p99_us = 0;
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_OK, 0);
    assert_int_equal(v.no_data, 0);
}

/* Negative rates and 0 latencies disable their checks; +Inf is enabled
 * but never trips. */
static void test_disabled_checks(void **state)
{
    (void)state;
    ks_health_sample w = healthy();
    w.auth_failures = w.parse_errors = 1000;
    w.provider_errors = 100;
    w.seal_ns.bucket[KS_HIST_BUCKETS - 1] = 1000;
    w.open_ns.bucket[KS_HIST_BUCKETS - 1] = 1000;
    ks_thresholds t;
    ks_thresholds_default(&t);
    assert_int_equal(judge(&w, &t).tripped, KS_HEALTH_ALL_CHECKS);

    t.max_auth_failure_rate = -1.0;
    t.max_parse_error_rate = -INFINITY;
    t.max_provider_error_rate = -0.5;
    t.max_seal_p99_us = 0;
    t.max_open_p99_us = 0;
    ks_health_verdict v = judge(&w, &t);
    expect(&v, KS_HEALTH_OK, 0);
    assert_true(v.auth_failure_rate == 1.0); /* still reported */

    t.max_auth_failure_rate = INFINITY;
    t.max_parse_error_rate = INFINITY;
    t.max_provider_error_rate = INFINITY;
    t.max_seal_p99_us = UINT64_MAX;
    t.max_open_p99_us = UINT64_MAX;
    assert_int_equal(judge(&w, &t).status, KS_HEALTH_OK);
}

/* Fewer than min_samples seals + opens: insufficient, nothing tripped,
 * the observed values still reported. */
static void test_insufficient(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    ks_health_sample w;
    memset(&w, 0, sizeof w);
    w.seals = 600;
    w.opens = 399;
    w.auth_failures = 399;
    ks_health_verdict v = judge(&w, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0);
    assert_int_equal(v.samples, 999);
    assert_true(v.auth_failure_rate == 1.0);

    w.opens = 400; /* 1000: enough */
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_TRIPPED, KS_HEALTH_AUTH_FAILURES);

    /* No minimum: an empty window still has no data to judge. */
    memset(&w, 0, sizeof w);
    t.min_samples = 0;
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0);
    assert_int_equal(v.no_data, KS_HEALTH_ALL_CHECKS);
    assert_int_equal(v.samples, 0);

    /* seals + opens saturates rather than wrapping below the minimum. */
    t.min_samples = UINT64_MAX;
    w = healthy();
    w.seals = UINT64_MAX;
    w.opens = 5;
    v = judge(&w, &t);
    assert_true(v.samples == UINT64_MAX);
    assert_int_equal(v.status, KS_HEALTH_OK);
}

/* A rate with nothing attempted is 0 and never trips, even with
 * (inconsistent) failures counted and a zero-tolerance limit; its check
 * has no data, so the window is not healthy either. */
static void test_zero_denominators(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    t.max_auth_failure_rate = 0.0;
    t.max_parse_error_rate = 0.0;
    t.max_provider_error_rate = 0.0;
    ks_health_sample w;
    memset(&w, 0, sizeof w);
    w.seals = 5000;
    w.auth_failures = 7;
    w.parse_errors = 7;
    w.provider_errors = 7;
    ks_health_verdict v = judge(&w, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0); /* nothing to judge is not healthy */
    assert_int_equal(v.no_data, KS_HEALTH_ALL_CHECKS);
    assert_true(v.auth_failure_rate == 0.0);
    assert_true(v.parse_error_rate == 0.0);
    assert_true(v.provider_error_rate == 0.0);
}

/* A NaN limit trips its check (fail safe), with or without data, but
 * never makes an insufficient window trip. */
static void test_nan_thresholds(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    t.max_parse_error_rate = NAN;
    ks_health_sample w = healthy();
    ks_health_verdict v = judge(&w, &t);
    expect(&v, KS_HEALTH_TRIPPED, KS_HEALTH_PARSE_ERRORS);

    t.max_provider_error_rate = NAN;
    w.provider_calls = 0;
    v = judge(&w, &t);
    assert_int_equal(v.tripped, KS_HEALTH_PARSE_ERRORS | KS_HEALTH_PROVIDER_ERRORS);

    t.min_samples = 1u << 20;
    v = judge(&w, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0);
}

/* NULL arguments: no crash; a missing window is insufficient. */
static void test_evaluate_null(void **state)
{
    (void)state;
    ks_thresholds t;
    ks_thresholds_default(&t);
    ks_health_sample w = healthy();
    ks_health_evaluate(&w, &t, NULL);
    ks_health_verdict v = judge(NULL, &t);
    expect(&v, KS_HEALTH_INSUFFICIENT, 0);
    assert_int_equal(v.samples, 0);
    v = judge(&w, NULL);
    assert_int_equal(v.status, KS_HEALTH_INSUFFICIENT);
    assert_int_equal(v.samples, 0);
}

/* Check and status names: one per known bit, NULL otherwise. */
static void test_names(void **state)
{
    (void)state;
    assert_string_equal(ks_health_check_name(KS_HEALTH_AUTH_FAILURES), "auth-failure-rate");
    assert_string_equal(ks_health_check_name(KS_HEALTH_PARSE_ERRORS), "parse-error-rate");
    assert_string_equal(ks_health_check_name(KS_HEALTH_PROVIDER_ERRORS), "provider-error-rate");
    assert_string_equal(ks_health_check_name(KS_HEALTH_SEAL_P99), "seal-p99-us");
    assert_string_equal(ks_health_check_name(KS_HEALTH_OPEN_P99), "open-p99-us");
    assert_null(ks_health_check_name(0));
    assert_null(ks_health_check_name(KS_HEALTH_AUTH_FAILURES | KS_HEALTH_OPEN_P99));
    assert_null(ks_health_check_name(1u << KS_HEALTH_N_CHECKS));
    assert_null(ks_health_check_name(~0u));
    assert_string_equal(ks_health_status_name(KS_HEALTH_OK), "ok");
    assert_string_equal(ks_health_status_name(KS_HEALTH_TRIPPED), "tripped");
    assert_string_equal(ks_health_status_name(KS_HEALTH_INSUFFICIENT), "insufficient");
    assert_null(ks_health_status_name((ks_health_status)7));
}

/* The small case of test_prometheus_exact: 3 seals (100, 300, 300 ns),
 * 4 opens at 1000 ns with one auth failure, 2 provider calls; the parse
 * and open-latency checks disabled, 5 samples needed. */
static void small_case(ks_health_sample *w, ks_thresholds *t)
{
    memset(w, 0, sizeof *w);
    w->seals = 3;
    w->opens = 4;
    w->auth_failures = 1;
    w->provider_calls = 2;
    ks_histogram_record(&w->seal_ns, 100);
    ks_histogram_record(&w->seal_ns, 300);
    ks_histogram_record(&w->seal_ns, 300);
    w->seal_ns_sum = 700;
    for (int i = 0; i < 4; i++) {
        ks_histogram_record(&w->open_ns, 1000);
    }
    w->open_ns_sum = 4000;
    ks_thresholds_default(t);
    t->max_parse_error_rate = -1.0;
    t->max_open_p99_us = 0;
    t->min_samples = 5;
}

#define SMALL_LABELS "rollout=\"3\",table=\"pay\\\"ments\""

/* The exposition of small_case, byte for byte. */
static const char small_expected[] =
    "# HELP keyshift_threshold_auth_failure_rate Highest auth failure rate allowed (+Inf: check disabled).\n"
    "# TYPE keyshift_threshold_auth_failure_rate gauge\n"
    "keyshift_threshold_auth_failure_rate{rollout=\"3\",table=\"pay\\\"ments\"} 0.001\n"
    "# HELP keyshift_threshold_parse_error_rate Highest parse error rate allowed (+Inf: check disabled).\n"
    "# TYPE keyshift_threshold_parse_error_rate gauge\n"
    "keyshift_threshold_parse_error_rate{rollout=\"3\",table=\"pay\\\"ments\"} +Inf\n"
    "# HELP keyshift_threshold_provider_error_rate Highest key provider error rate allowed (+Inf: check disabled).\n"
    "# TYPE keyshift_threshold_provider_error_rate gauge\n"
    "keyshift_threshold_provider_error_rate{rollout=\"3\",table=\"pay\\\"ments\"} 0.01\n"
    "# HELP keyshift_threshold_seal_p99_seconds Highest p99 seal latency allowed (+Inf: check disabled).\n"
    "# TYPE keyshift_threshold_seal_p99_seconds gauge\n"
    "keyshift_threshold_seal_p99_seconds{rollout=\"3\",table=\"pay\\\"ments\"} 0.01\n"
    "# HELP keyshift_threshold_open_p99_seconds Highest p99 open latency allowed (+Inf: check disabled).\n"
    "# TYPE keyshift_threshold_open_p99_seconds gauge\n"
    "keyshift_threshold_open_p99_seconds{rollout=\"3\",table=\"pay\\\"ments\"} +Inf\n"
    "# HELP keyshift_threshold_min_samples Seals plus opens needed in the window for a verdict.\n"
    "# TYPE keyshift_threshold_min_samples gauge\n"
    "keyshift_threshold_min_samples{rollout=\"3\",table=\"pay\\\"ments\"} 5\n"
    "# HELP keyshift_threshold_window_seconds Length of the health window in seconds.\n"
    "# TYPE keyshift_threshold_window_seconds gauge\n"
    "keyshift_threshold_window_seconds{rollout=\"3\",table=\"pay\\\"ments\"} 300\n"
    "# HELP keyshift_health_status Health verdict: 0 ok, 1 tripped, 2 insufficient data.\n"
    "# TYPE keyshift_health_status gauge\n"
    "keyshift_health_status{rollout=\"3\",table=\"pay\\\"ments\"} 1\n"
    "# HELP keyshift_health_tripped 1 when the check is over its threshold.\n"
    "# TYPE keyshift_health_tripped gauge\n"
    "keyshift_health_tripped{rollout=\"3\",table=\"pay\\\"ments\",check=\"auth-failure-rate\"} 1\n"
    "keyshift_health_tripped{rollout=\"3\",table=\"pay\\\"ments\",check=\"parse-error-rate\"} 0\n"
    "keyshift_health_tripped{rollout=\"3\",table=\"pay\\\"ments\",check=\"provider-error-rate\"} 0\n"
    "keyshift_health_tripped{rollout=\"3\",table=\"pay\\\"ments\",check=\"seal-p99-us\"} 0\n"
    "keyshift_health_tripped{rollout=\"3\",table=\"pay\\\"ments\",check=\"open-p99-us\"} 0\n";

/* The exposition of the small case with labels and verdict v (NULL:
 * evaluated) into buf[0, cap). */
static ks_err render_small(const char *labels, const ks_health_verdict *v, char *buf, size_t cap,
                           size_t *len)
{
    ks_health_sample w;
    ks_thresholds t;
    small_case(&w, &t);
    return ks_health_prometheus(&w, &t, v, labels, buf, cap, len);
}

/* Output buffer of the exposition tests. */
static char out_buf[16384];

/* The exact text for the small case; the same with the verdict passed
 * in; and a verdict given is printed as given. */
static void test_prometheus_exact(void **state)
{
    (void)state;
    char *buf = out_buf;
    size_t len = 0;
    assert_int_equal(render_small(SMALL_LABELS, NULL, buf, sizeof out_buf, &len), KS_OK);
    assert_int_equal(len, strlen(small_expected));
    assert_string_equal(buf, small_expected);

    ks_health_sample w;
    ks_thresholds t;
    small_case(&w, &t);
    ks_health_verdict v;
    ks_health_evaluate(&w, &t, &v);
    assert_int_equal(v.status, KS_HEALTH_TRIPPED);
    assert_int_equal(render_small(SMALL_LABELS, &v, buf, sizeof out_buf, &len), KS_OK);
    assert_string_equal(buf, small_expected);

    v.status = KS_HEALTH_OK;
    v.tripped = 0;
    assert_int_equal(render_small(SMALL_LABELS, &v, buf, sizeof out_buf, &len), KS_OK);
    assert_non_null(strstr(buf, "\nkeyshift_health_status{" SMALL_LABELS "} 0\n"));
    assert_non_null(
        strstr(buf, "\nkeyshift_health_tripped{" SMALL_LABELS ",check=\"auth-failure-rate\"} 0\n"));
}

/* Every capacity below the length + 1 is refused with the length
 * needed, and nothing is written past the capacity. */
static void test_prometheus_buffer_too_small(void **state)
{
    (void)state;
    size_t need = 0;
    assert_int_equal(render_small(SMALL_LABELS, NULL, NULL, 0, &need), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(need, strlen(small_expected));

    char *buf = out_buf;
    for (size_t cap = 1; cap <= need; cap += (cap < 64 || need - cap < 64) ? 1 : 97) {
        memset(buf, 'Z', sizeof out_buf);
        size_t len = 0;
        assert_int_equal(render_small(SMALL_LABELS, NULL, buf, cap, &len), KS_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(len, need);
        for (size_t i = cap; i < sizeof out_buf; i++) {
            assert_int_equal(buf[i], 'Z');
        }
    }
    size_t len = 0;
    assert_int_equal(render_small(SMALL_LABELS, NULL, buf, need + 1, &len), KS_OK);
    assert_int_equal(len, need);
    assert_string_equal(buf, small_expected);
}

/* Without labels, plain samples have no braces and the others only
 * their own label; malformed label sets are refused. */
static void test_prometheus_labels(void **state)
{
    (void)state;
    char *buf = out_buf;
    size_t len = 0;
    const char *none[] = {NULL, ""};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(render_small(none[i], NULL, buf, sizeof out_buf, &len), KS_OK);
        assert_non_null(strstr(buf, "\nkeyshift_health_status 1\n"));
        assert_non_null(strstr(buf, "\nkeyshift_health_tripped{check=\"seal-p99-us\"} 0\n"));
        assert_null(strstr(buf, "{,"));
        assert_null(strstr(buf, ",}"));
        assert_null(strstr(buf, "{}"));
    }

    const char *good[] = {"a=\"\"", "a_1=\"x\",B=\"y\\\\\\\"\\n\"", "_x=\"é\""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(render_small(good[i], NULL, buf, sizeof out_buf, &len), KS_OK);
    }
    const char *bad[] = {
        "le=\"1\"",     "check=\"x\"", "__name__=\"x\"", "a=1",         "a=\"x",
        "a=\"x\ny\"",   "a=\"\\q\"",   "a=\"x\",",       "9a=\"x\"",    "a =\"x\"",
        "a=\"x\" ",     ",a=\"x\"",    "a=\"x\"b=\"y\"", "a=\"x\\\"",   "{a=\"x\"}",
        "a=\"x\",le=\"\"", "phase=\"backfill\"", "b=\"1\",outcome=\"done\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(render_small(bad[i], NULL, buf, sizeof out_buf, &len),
                         KS_ERR_INVALID_ARGUMENT);
    }
}

/* NaN limits print as NaN, disabled ones as +Inf, an unbounded p99 as
 * +Inf; bad arguments are refused. */
static void test_prometheus_special_values(void **state)
{
    (void)state;
    ks_health_sample w = healthy();
    w.seal_ns.bucket[KS_HIST_BUCKETS - 1] = 5000;
    w.auth_failures = 1;
    w.opens = 3;
    ks_thresholds t;
    ks_thresholds_default(&t);
    t.max_auth_failure_rate = NAN;
    t.max_provider_error_rate = -2;
    t.max_seal_p99_us = 0;
    t.max_open_p99_us = 1500000;
    char *buf = out_buf;
    size_t len = 0;
    assert_int_equal(ks_health_prometheus(&w, &t, NULL, NULL, buf, sizeof out_buf, &len), KS_OK);
    assert_non_null(strstr(buf, "\nkeyshift_threshold_auth_failure_rate NaN\n"));
    assert_non_null(strstr(buf, "\nkeyshift_threshold_parse_error_rate 0.001\n"));
    assert_non_null(strstr(buf, "\nkeyshift_threshold_provider_error_rate +Inf\n"));
    assert_non_null(strstr(buf, "\nkeyshift_threshold_seal_p99_seconds +Inf\n"));
    assert_non_null(strstr(buf, "\nkeyshift_threshold_open_p99_seconds 1.5\n"));
    assert_non_null(strstr(buf, "\nkeyshift_health_tripped{check=\"seal-p99-us\"} 0\n"));
    assert_non_null(strstr(buf, "\nkeyshift_health_tripped{check=\"auth-failure-rate\"} 1\n"));
    assert_true(len > 0 && buf[len - 1] == '\n' && buf[len] == '\0');

    /* Every family has one HELP and one TYPE line, HELP first. */
    size_t helps = 0, types = 0;
    for (const char *p = buf; (p = strstr(p, "# HELP ")) != NULL; p++) {
        helps++;
        const char *name = p + 7;
        size_t n = strcspn(name, " ");
        const char *type = strchr(p, '\n') + 1;
        assert_memory_equal(type, "# TYPE ", 7);
        assert_memory_equal(type + 7, name, n);
    }
    for (const char *p = buf; (p = strstr(p, "# TYPE ")) != NULL; p++) {
        types++;
    }
    assert_int_equal(helps, 9);
    assert_int_equal(types, 9);

    assert_int_equal(ks_health_prometheus(NULL, &t, NULL, NULL, buf, sizeof out_buf, &len),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_health_prometheus(&w, NULL, NULL, NULL, buf, sizeof out_buf, &len),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_health_prometheus(&w, &t, NULL, NULL, NULL, 10, &len),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_health_prometheus(&w, &t, NULL, NULL, buf, sizeof out_buf, NULL),
                     KS_ERR_INVALID_ARGUMENT);
}

/* Backslash, double quote and line feed are escaped; nothing else. */
static void test_label_escape(void **state)
{
    (void)state;
    char buf[64];
    size_t len = 0;
    assert_int_equal(ks_health_prometheus_label_escape("pay\\ments \"x\"\nÿ,{}=", buf, sizeof buf,
                                                       &len),
                     KS_OK);
    assert_string_equal(buf, "pay\\\\ments \\\"x\\\"\\nÿ,{}=");
    assert_int_equal(len, strlen(buf));

    assert_int_equal(ks_health_prometheus_label_escape("", buf, 1, &len), KS_OK);
    assert_string_equal(buf, "");
    assert_int_equal(len, 0);

    memset(buf, 'Z', sizeof buf);
    assert_int_equal(ks_health_prometheus_label_escape("a\"b", buf, 4, &len),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, 4);
    assert_int_equal(buf[4], 'Z');
    assert_int_equal(ks_health_prometheus_label_escape("a\"b", buf, 5, &len), KS_OK);
    assert_string_equal(buf, "a\\\"b");
    assert_int_equal(ks_health_prometheus_label_escape("a", NULL, 0, &len),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, 1);

    assert_int_equal(ks_health_prometheus_label_escape(NULL, buf, sizeof out_buf, &len),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_health_prometheus_label_escape("a", NULL, 3, &len),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_health_prometheus_label_escape("a", buf, sizeof buf, NULL),
                     KS_ERR_INVALID_ARGUMENT);

    /* An escaped value makes a label set ks_health_prometheus accepts. */
    char labels[96];
    strcpy(labels, "table=\"");
    assert_int_equal(ks_health_prometheus_label_escape("a\\\"\nb", labels + 7,
                                                       sizeof labels - 8, &len),
                     KS_OK);
    strcat(labels, "\"");
    ks_health_sample w = healthy();
    ks_thresholds t;
    ks_thresholds_default(&t);
    assert_int_equal(ks_health_prometheus(&w, &t, NULL, labels, out_buf, sizeof out_buf, &len),
                     KS_OK);
    assert_non_null(strstr(out_buf, "\nkeyshift_health_status{table=\"a\\\\\\\"\\nb\"} 0\n"));
}

/* The cumulative exposition of the small case's counts as totals. */
static const char totals_expected[] =
    "# HELP keyshift_seals_total Envelopes sealed.\n"
    "# TYPE keyshift_seals_total counter\n"
    "keyshift_seals_total{rollout=\"3\",table=\"pay\\\"ments\"} 3\n"
    "# HELP keyshift_opens_total Envelope opens that reached a verdict (opened, auth failed or refused).\n"
    "# TYPE keyshift_opens_total counter\n"
    "keyshift_opens_total{rollout=\"3\",table=\"pay\\\"ments\"} 4\n"
    "# HELP keyshift_auth_failures_total Opens that failed authentication.\n"
    "# TYPE keyshift_auth_failures_total counter\n"
    "keyshift_auth_failures_total{rollout=\"3\",table=\"pay\\\"ments\"} 1\n"
    "# HELP keyshift_parse_errors_total Opens refused by the strict envelope parser.\n"
    "# TYPE keyshift_parse_errors_total counter\n"
    "keyshift_parse_errors_total{rollout=\"3\",table=\"pay\\\"ments\"} 0\n"
    "# HELP keyshift_provider_calls_total Key provider wrap and unwrap calls.\n"
    "# TYPE keyshift_provider_calls_total counter\n"
    "keyshift_provider_calls_total{rollout=\"3\",table=\"pay\\\"ments\"} 2\n"
    "# HELP keyshift_provider_errors_total Key provider calls that failed, whatever the error class.\n"
    "# TYPE keyshift_provider_errors_total counter\n"
    "keyshift_provider_errors_total{rollout=\"3\",table=\"pay\\\"ments\"} 0\n"
    "# HELP keyshift_seal_duration_seconds Seal latency in seconds (log2 buckets of nanoseconds).\n"
    "# TYPE keyshift_seal_duration_seconds histogram\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000000255\"} 1\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000000511\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000001023\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000002047\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000004095\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000008191\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000016383\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000032767\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000065535\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000131071\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000262143\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000524287\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.001048575\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.002097151\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.004194303\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.008388607\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.016777215\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.033554431\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.067108863\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.134217727\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.268435455\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.536870911\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"1.073741823\"} 3\n"
    "keyshift_seal_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"+Inf\"} 3\n"
    "keyshift_seal_duration_seconds_sum{rollout=\"3\",table=\"pay\\\"ments\"} 0.0000007\n"
    "keyshift_seal_duration_seconds_count{rollout=\"3\",table=\"pay\\\"ments\"} 3\n"
    "# HELP keyshift_open_duration_seconds Open latency in seconds (log2 buckets of nanoseconds).\n"
    "# TYPE keyshift_open_duration_seconds histogram\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000000255\"} 0\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000000511\"} 0\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000001023\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000002047\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000004095\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000008191\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000016383\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000032767\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000065535\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000131071\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000262143\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.000524287\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.001048575\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.002097151\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.004194303\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.008388607\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.016777215\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.033554431\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.067108863\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.134217727\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.268435455\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"0.536870911\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"1.073741823\"} 4\n"
    "keyshift_open_duration_seconds_bucket{rollout=\"3\",table=\"pay\\\"ments\",le=\"+Inf\"} 4\n"
    "keyshift_open_duration_seconds_sum{rollout=\"3\",table=\"pay\\\"ments\"} 0.000004\n"
    "keyshift_open_duration_seconds_count{rollout=\"3\",table=\"pay\\\"ments\"} 4\n";

/* ks_metrics_write_totals: the exact text, measured then written; two
 * series share each family's HELP and TYPE; bad labels are refused. */
static void test_metrics_totals(void **state)
{
    (void)state;
    ks_health_sample w;
    ks_thresholds t;
    small_case(&w, &t);
    ks_metrics_series s = {SMALL_LABELS, &w};
    ks_metrics_buf b;
    size_t len = 0;
    ks_metrics_begin(&b, NULL, 0);
    ks_metrics_write_totals(&b, &s, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, strlen(totals_expected));
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, &s, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_string_equal(out_buf, totals_expected);

    ks_metrics_series two[2] = {{"source=\"app\"", &w}, {"source=\"migrate\"", &w}};
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, two, 2);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_non_null(strstr(out_buf, "# TYPE keyshift_opens_total counter\n"
                                    "keyshift_opens_total{source=\"app\"} 4\n"
                                    "keyshift_opens_total{source=\"migrate\"} 4\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_open_duration_seconds_count{source=\"migrate\"} 4\n"));
    assert_null(strstr(strstr(out_buf, "# HELP keyshift_opens_total") + 1, "# HELP keyshift_opens_total"));

    /* _sum is exact seconds: whole ns, whole seconds, the largest sum. */
    w.seal_ns_sum = UINT64_C(1234567890123);
    w.open_ns_sum = UINT64_C(3000000000);
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, &s, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_non_null(strstr(out_buf, "\nkeyshift_seal_duration_seconds_sum{" SMALL_LABELS "} 1234.567890123\n"
                                    "keyshift_seal_duration_seconds_count{"));
    assert_non_null(strstr(out_buf, "\nkeyshift_open_duration_seconds_sum{" SMALL_LABELS "} 3\n"));
    w.seal_ns_sum = UINT64_MAX;
    w.open_ns_sum = 0;
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, &s, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_non_null(strstr(out_buf, "\nkeyshift_seal_duration_seconds_sum{" SMALL_LABELS "} 18446744073.709551615\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_open_duration_seconds_sum{" SMALL_LABELS "} 0\n"));

    ks_metrics_series bad = {"phase=\"x\"", &w};
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, &bad, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);
    ks_metrics_series none = {NULL, NULL};
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_totals(&b, &none, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_metrics_end(NULL, &len), KS_ERR_INVALID_ARGUMENT);
}

/* ks_metrics_write_histogram: the exact text of two series over the
 * caller's bounds (cumulative, +Inf, _sum, _count); every malformed
 * argument refused with nothing written. */
static void test_metrics_histogram(void **state)
{
    (void)state;
    static const double bounds[] = {0.00005, 0.00025, 1.0};
    const uint64_t a[] = {2, 0, 3, 1}, z[] = {0, 0, 0, 0};
    ks_metrics_hist_series s[2] = {{"endpoint=\"seal\"", a, 0.375}, {"endpoint=\"open\"", z, 0.0}};
    ks_metrics_buf b;
    size_t len = 0;
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_histogram(&b, "keyshift_agent_request_duration_seconds", "Request time.",
                               bounds, 3, s, 2);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_string_equal(out_buf,
                        "# HELP keyshift_agent_request_duration_seconds Request time.\n"
                        "# TYPE keyshift_agent_request_duration_seconds histogram\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"seal\",le=\"5e-05\"} 2\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"seal\",le=\"0.00025\"} 2\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"seal\",le=\"1\"} 5\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"seal\",le=\"+Inf\"} 6\n"
                        "keyshift_agent_request_duration_seconds_sum{endpoint=\"seal\"} 0.375\n"
                        "keyshift_agent_request_duration_seconds_count{endpoint=\"seal\"} 6\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"open\",le=\"5e-05\"} 0\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"open\",le=\"0.00025\"} 0\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"open\",le=\"1\"} 0\n"
                        "keyshift_agent_request_duration_seconds_bucket{endpoint=\"open\",le=\"+Inf\"} 0\n"
                        "keyshift_agent_request_duration_seconds_sum{endpoint=\"open\"} 0\n"
                        "keyshift_agent_request_duration_seconds_count{endpoint=\"open\"} 0\n");
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_histogram(&b, "x:y_seconds", "h", NULL, 0, NULL, 0);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_int_equal(len, 0);

    static const double unsorted[] = {1.0, 0.5}, inf[] = {1.0, INFINITY};
    ks_metrics_hist_series bad_sum = {NULL, a, -1.0}, nan_sum = {NULL, a, NAN},
                           no_counts = {NULL, NULL, 0.0}, bad_labels = {"le=\"1\"", a, 0.0};
    const struct {
        const char *name, *help;
        const double *bounds;
        size_t n_bounds;
        const ks_metrics_hist_series *s;
    } bad[] = {
        {"1x", "h", bounds, 3, s},        {"__x", "h", bounds, 3, s},
        {"a-b", "h", bounds, 3, s},       {NULL, "h", bounds, 3, s},
        {"x", "two\nlines", bounds, 3, s}, {"x", "a\\b", bounds, 3, s},
        {"x", NULL, bounds, 3, s},        {"x", "h", unsorted, 2, s},
        {"x", "h", inf, 2, s},            {"x", "h", NULL, 3, s},
        {"x", "h", bounds, 3, &bad_sum},  {"x", "h", bounds, 3, &nan_sum},
        {"x", "h", bounds, 3, &no_counts}, {"x", "h", bounds, 3, &bad_labels},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_metrics_begin(&b, out_buf, sizeof out_buf);
        ks_metrics_write_histogram(&b, bad[i].name, bad[i].help, bad[i].bounds, bad[i].n_bounds,
                                   bad[i].s, 1);
        assert_int_equal(b.len, 0);
        assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);
    }
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_histogram(&b, "x", "h", bounds, 3, NULL, 2);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);
}

/* ks_metrics_write_phase: one series per phase, 1 on the current one
 * only; ks_metrics_write_migrate: rows by outcome and the run's state. */
static void test_metrics_phase_migrate(void **state)
{
    (void)state;
    static const char *const phases[] = {"planned", "backfill", "finalized"};
    ks_metrics_buf b;
    size_t len = 0;
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_phase(&b, "rollout=\"3\"", phases, 3, 1);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_string_equal(out_buf,
                        "# HELP keyshift_rollout_phase 1 for the phase the rollout is in, 0 for "
                        "every other phase.\n"
                        "# TYPE keyshift_rollout_phase gauge\n"
                        "keyshift_rollout_phase{rollout=\"3\",phase=\"planned\"} 0\n"
                        "keyshift_rollout_phase{rollout=\"3\",phase=\"backfill\"} 1\n"
                        "keyshift_rollout_phase{rollout=\"3\",phase=\"finalized\"} 0\n");
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_phase(&b, NULL, phases, 3, 3);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_null(strstr(out_buf, "} 1\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_rollout_phase{phase=\"finalized\"} 0\n"));
    static const char *const bad_phase[] = {"a\"b"};
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_phase(&b, NULL, bad_phase, 1, 0);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);

    ks_metrics_migrate m;
    memset(&m, 0, sizeof m);
    m.labels = "table=\"pay\"";
    m.rows[0] = 90;
    m.rows[3] = 2;
    m.target_rows = 100;
    m.throttled_s = 1.5;
    m.last_progress_time = 1700000000;
    m.running = 1;
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_migrate(&b, &m);
    assert_int_equal(ks_metrics_end(&b, &len), KS_OK);
    assert_non_null(strstr(out_buf, "# TYPE keyshift_migrate_rows_total counter\n"
                                    "keyshift_migrate_rows_total{table=\"pay\",outcome=\"done\"} 90\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_rows_total{table=\"pay\",outcome=\"quarantined\"} 2\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_rows_total{table=\"pay\",outcome=\"wrong_state\"} 0\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_throttled_seconds_total{table=\"pay\"} 1.5\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_last_progress_timestamp_seconds{table=\"pay\"} 1700000000\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_running{table=\"pay\"} 1\n"));
    assert_non_null(strstr(out_buf, "\nkeyshift_migrate_complete{table=\"pay\"} 0\n"));
    m.throttled_s = NAN;
    ks_metrics_begin(&b, out_buf, sizeof out_buf);
    ks_metrics_write_migrate(&b, &m);
    assert_int_equal(ks_metrics_end(&b, &len), KS_ERR_INVALID_ARGUMENT);
}

/* ks_health_growth: the interval between two totals; a counter that went
 * down counts whole; out may alias now; NULLs are no-ops. */
static void test_growth(void **state)
{
    (void)state;
    ks_health_sample before, now, d;
    memset(&before, 0, sizeof before);
    memset(&now, 0, sizeof now);
    before.seals = 10;
    before.opens = 7;
    before.open_ns.bucket[2] = 5;
    before.seal_ns_sum = 8000;
    before.open_ns_sum = 3000;
    now.time = 99;
    now.seals = 25;
    now.opens = 3; /* reset */
    now.open_ns.bucket[2] = 9;
    now.seal_ns_sum = 9500;
    now.open_ns_sum = 2000; /* reset */
    ks_health_growth(&d, &now, &before);
    assert_int_equal(d.time, 99);
    assert_int_equal(d.seals, 15);
    assert_int_equal(d.opens, 3);
    assert_int_equal(d.open_ns.bucket[2], 4);
    assert_int_equal(d.seal_ns_sum, 1500);
    assert_int_equal(d.open_ns_sum, 2000);
    assert_int_equal(ks_histogram_bucket_of(255), 0);
    assert_int_equal(ks_histogram_bucket_of(256), 1);
    ks_health_growth(&now, &now, &before);
    assert_int_equal(now.seals, 15);
    ks_health_growth(NULL, &now, &before);
    ks_health_growth(&d, NULL, &before);
    ks_health_growth(&d, &now, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_check),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_bucket_boundaries),
        cmocka_unit_test(test_record_saturates),
        cmocka_unit_test(test_quantile_empty_and_single),
        cmocka_unit_test(test_quantile_spread),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_evaluate_ok),
        cmocka_unit_test(test_rate_checks_trip),
        cmocka_unit_test(test_latency_checks_trip),
        cmocka_unit_test(test_disabled_checks),
        cmocka_unit_test(test_insufficient),
        cmocka_unit_test(test_zero_denominators),
        cmocka_unit_test(test_nan_thresholds),
        cmocka_unit_test(test_evaluate_null),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_prometheus_exact),
        cmocka_unit_test(test_prometheus_buffer_too_small),
        cmocka_unit_test(test_prometheus_labels),
        cmocka_unit_test(test_prometheus_special_values),
        cmocka_unit_test(test_metrics_totals),
        cmocka_unit_test(test_metrics_phase_migrate),
        cmocka_unit_test(test_metrics_histogram),
        cmocka_unit_test(test_label_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
