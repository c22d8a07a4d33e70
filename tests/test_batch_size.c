/*
 * tests/test_batch_size.c -- the adaptive batch size
 * (migrate/engine/batch_size.c; keyshift/migrate.h batch_target_ms):
 * the rule fed with made-up batch times, so nothing depends on a clock.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <keyshift/migrate.h>

#include "../migrate/engine/engine.h"

/* Params with a target of target_ms and the given start and bounds. */
static ks_migrate_params params_of(uint32_t target_ms, size_t start, size_t lo, size_t hi)
{
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    p.batch_target_ms = target_ms;
    p.batch_size = start;
    p.batch_min = lo;
    p.batch_max = hi;
    return p;
}

/* A sizer of params_of(...), checked valid. */
static ks_engine_batch_sizer sizer_of(uint32_t target_ms, size_t start, size_t lo, size_t hi)
{
    ks_migrate_params p = params_of(target_ms, start, lo, hi);
    assert_true(ks_engine_batch_params_ok(&p));
    ks_engine_batch_sizer s;
    ks_engine_batch_init(&s, &p);
    return s;
}

/* Feed s batches whose time is overhead_s + rows * row_s, n times; the
 * last size. */
static size_t feed(ks_engine_batch_sizer *s, double overhead_s, double row_s, int n)
{
    for (int i = 0; i < n; i++) {
        size_t rows = s->size;
        (void)ks_engine_batch_next(s, rows, overhead_s + (double)rows * row_s);
    }
    return s->size;
}

/* No target: the size never moves, whatever the batches take. */
static void test_fixed(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(0, 0, 0, 0);
    assert_int_equal(s.size, 500);
    assert_int_equal(ks_engine_batch_capacity(&s), 500);
    assert_int_equal(ks_engine_batch_next(&s, 500, 10.0), 500);
    assert_int_equal(ks_engine_batch_next(&s, 500, 0.0), 500);
    s = sizer_of(0, 20000, 0, 0); /* the bounds apply only with a target */
    assert_int_equal(s.size, 20000);
    assert_int_equal(ks_engine_batch_capacity(&s), 20000);
}

/* The defaults, the start clamped into the bounds, the capacity. */
static void test_init(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 0, 0, 0);
    assert_int_equal(s.size, 500);
    assert_int_equal(s.min, KS_MIGRATE_BATCH_MIN_DEFAULT);
    assert_int_equal(s.max, KS_MIGRATE_BATCH_MAX_DEFAULT);
    assert_int_equal(ks_engine_batch_capacity(&s), KS_MIGRATE_BATCH_MAX_DEFAULT);
    s = sizer_of(500, 5, 50, 100);
    assert_int_equal(s.size, 50);
    s = sizer_of(500, 5000, 50, 100);
    assert_int_equal(s.size, 100);
    assert_int_equal(ks_engine_batch_capacity(&s), 100);
}

/* Out-of-range bounds and targets are refused. */
static void test_params(void **state)
{
    (void)state;
    ks_migrate_params p = params_of(500, 0, 0, 0);
    assert_true(ks_engine_batch_params_ok(&p));
    p = params_of(500, 0, 200, 100);
    assert_false(ks_engine_batch_params_ok(&p));
    p = params_of(500, 0, 20000, 0); /* over the default max */
    assert_false(ks_engine_batch_params_ok(&p));
    p = params_of(500, 0, 20000, 30000);
    assert_true(ks_engine_batch_params_ok(&p));
    p = params_of(500, 0, 0, KS_MIGRATE_BATCH_MAX + 1);
    assert_false(ks_engine_batch_params_ok(&p));
    p = params_of(500, KS_MIGRATE_BATCH_MAX + 1, 0, 0);
    assert_false(ks_engine_batch_params_ok(&p));
    p = params_of(KS_MIGRATE_BATCH_TARGET_MAX_MS + 1, 0, 0, 0);
    assert_false(ks_engine_batch_params_ok(&p));
    p = params_of(0, 0, 200, 100); /* checked without a target too */
    assert_false(ks_engine_batch_params_ok(&p));
}

/* Quick batches grow at most twice per step, up to where the target
 * is met, and stay there. */
static void test_converges_up(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 100, 0, 0);
    /* 100 rows in 10 ms: 0.1 ms per row, 5000 rows meet 0.5 s */
    assert_int_equal(ks_engine_batch_next(&s, 100, 0.010), 200);
    assert_int_equal(ks_engine_batch_next(&s, 200, 0.020), 400);
    assert_int_equal(ks_engine_batch_next(&s, 400, 0.040), 800);
    size_t n = feed(&s, 0.0, 1e-4, 20);
    assert_in_range(n, 4990, 5000);
}

/* A per-batch overhead: the size settles where overhead + size * cost
 * is the target, not where size * cost alone would be. */
static void test_overhead(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 500, 0, 0);
    /* 100 ms a batch + 0.1 ms a row: 4000 rows take 0.5 s */
    size_t n = feed(&s, 0.100, 1e-4, 60);
    assert_in_range(n, 3900, 4000);
}

/* A batch over the target shrinks the next at once, all the way. */
static void test_shrinks_fast(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 1000, 0, 0);
    assert_int_equal(feed(&s, 0.0, 2.5e-4, 10), 2000); /* 0.5 s: on target */
    /* the server slows tenfold: 2000 rows take 5 s */
    assert_int_equal(ks_engine_batch_next(&s, 2000, 5.0), 200);
    /* and speeds up again: growth is smoothed and capped */
    size_t a = ks_engine_batch_next(&s, 200, 200 * 2.5e-4);
    assert_in_range(a, 201, 400);
    assert_in_range(feed(&s, 0.0, 2.5e-4, 40), 1990, 2000);
}

/* Noise under the target moves the size only part of the way. */
static void test_smoothed(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 1000, 0, 0);
    assert_int_equal(feed(&s, 0.0, 2.5e-4, 10), 2000);
    /* a batch of 1000 rows at 0.45 ms a row: slower, still under the target */
    size_t n = ks_engine_batch_next(&s, 1000, 0.45);
    /* per-row 4.5e-4 smoothed: 0.3 * 4.5e-4 + 0.7 * 2.5e-4 = 3.1e-4 */
    assert_in_range(n, 1610, 1615);
}

/* The bounds hold, whatever the times. */
static void test_bounds(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 100, 50, 300);
    assert_int_equal(feed(&s, 0.0, 1e-9, 10), 300);
    assert_int_equal(feed(&s, 0.0, 1.0, 1), 50);
    s = sizer_of(1, 1, 1, 1);
    assert_int_equal(feed(&s, 0.0, 1e-9, 5), 1);
    assert_int_equal(feed(&s, 0.0, 10.0, 5), 1);
}

/* Batches that tell nothing (no rows, a negative or NaN time) keep the
 * size; a zero time grows it twice; an infinite or huge one drops it to
 * the minimum, and a normal batch after an infinite one counts as the
 * first. */
static void test_edges(void **state)
{
    (void)state;
    ks_engine_batch_sizer s = sizer_of(500, 100, 0, 0);
    assert_int_equal(ks_engine_batch_next(&s, 0, 1.0), 100);
    assert_int_equal(ks_engine_batch_next(&s, 100, -1.0), 100);
    assert_int_equal(ks_engine_batch_next(&s, 100, NAN), 100);
    assert_true(s.row_s == 0.0);
    assert_int_equal(ks_engine_batch_next(&s, 100, 0.0), 200);
    assert_int_equal(ks_engine_batch_next(&s, 200, 0.0), 400);
    assert_int_equal(ks_engine_batch_next(&s, 400, 1e300), KS_MIGRATE_BATCH_MIN_DEFAULT);
    s = sizer_of(500, 100, 0, 0);
    assert_int_equal(ks_engine_batch_next(&s, 100, INFINITY), KS_MIGRATE_BATCH_MIN_DEFAULT);
    assert_true(s.row_s == 0.0);
    /* 10 rows in 1 ms: 0.1 ms a row; growth capped at 20 */
    assert_int_equal(ks_engine_batch_next(&s, 10, 0.001), 20);
    /* the last batch of a pass (few rows) still counts per row */
    s = sizer_of(500, 1000, 0, 0);
    assert_int_equal(ks_engine_batch_next(&s, 3, 3 * 2.5e-4), 2000);
    /* a huge row count: no overflow */
    s = sizer_of(500, 1000, 0, 0);
    assert_int_equal(ks_engine_batch_next(&s, SIZE_MAX, 1.0), 2000);
}

/* Every test above. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),        cmocka_unit_test(test_init),
        cmocka_unit_test(test_params),       cmocka_unit_test(test_converges_up),
        cmocka_unit_test(test_overhead),     cmocka_unit_test(test_shrinks_fast),
        cmocka_unit_test(test_smoothed),     cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
