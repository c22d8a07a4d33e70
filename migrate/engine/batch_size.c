/*
 * migrate/engine/batch_size.c -- the batch size that adapts to a target
 * batch duration (keyshift/migrate.h batch_target_ms; docs/migration.md,
 * "Batch size").
 *
 * The rule, after each committed batch of n rows that took t seconds:
 *   - the time per row t/n is smoothed into row_s: row_s' = a * t/n +
 *     (1 - a) * row_s (a = SMOOTHING), so that one slow or quick batch
 *     (a checkpoint of the server, another client's burst) moves the size
 *     only part of the way;
 *   - except that a batch over the target (t > target) sets row_s to at
 *     least t/n at once: the next batch is then sized on that batch's own
 *     speed, so a slowdown shortens the very next batch instead of three
 *     or four later (a long batch holds its row locks that long);
 *   - the next size is target / row_s, at most GROWTH times the last size
 *     (a batch quick by chance does not jump to a huge one), and within
 *     [min, max].
 * The per-row model ignores what a batch costs whatever its size (a
 * COMMIT's flush, a round trip): small batches then look slow per row,
 * and the size still converges where overhead + size * cost = target,
 * since the measured t/n includes the overhead.
 *
 * No clock here: the caller measures, so the rule is a pure function of
 * its inputs and unit-tested without timing (tests/test_batch_size.c).
 */
#include <assert.h>
#include <math.h>

#include "engine.h"

/* The weight of the last batch in the smoothed time per row. */
#define SMOOTHING 0.3
/* The most a batch may grow from one to the next. */
#define GROWTH 2.0

/* The bound b, or its default d when 0. */
static size_t bound_or(size_t b, size_t d)
{
    return b != 0 ? b : d;
}

/* See engine.h. */
int ks_engine_batch_params_ok(const ks_migrate_params *p)
{
    size_t lo = bound_or(p->batch_min, KS_MIGRATE_BATCH_MIN_DEFAULT);
    size_t hi = bound_or(p->batch_max, KS_MIGRATE_BATCH_MAX_DEFAULT);
    return p->batch_size <= KS_MIGRATE_BATCH_MAX && p->batch_min <= KS_MIGRATE_BATCH_MAX &&
           p->batch_max <= KS_MIGRATE_BATCH_MAX && lo <= hi &&
           p->batch_target_ms <= KS_MIGRATE_BATCH_TARGET_MAX_MS;
}

/* See engine.h. */
void ks_engine_batch_init(ks_engine_batch_sizer *s, const ks_migrate_params *p)
{
    assert(ks_engine_batch_params_ok(p));
    s->target_s = (double)p->batch_target_ms / 1000.0;
    s->min = bound_or(p->batch_min, KS_MIGRATE_BATCH_MIN_DEFAULT);
    s->max = bound_or(p->batch_max, KS_MIGRATE_BATCH_MAX_DEFAULT);
    s->size = bound_or(p->batch_size, KS_MIGRATE_BATCH_DEFAULT);
    s->row_s = 0.0;
    if (s->target_s > 0) {
        s->size = s->size < s->min ? s->min : s->size > s->max ? s->max : s->size;
    }
    assert(s->size >= 1);
}

/* See engine.h. */
size_t ks_engine_batch_capacity(const ks_engine_batch_sizer *s)
{
    return s->target_s > 0 && s->max > s->size ? s->max : s->size;
}

/* See engine.h and the file comment. */
size_t ks_engine_batch_next(ks_engine_batch_sizer *s, size_t rows, double elapsed_s)
{
    assert(s->size >= 1);
    if (s->target_s <= 0 || rows == 0 || !(elapsed_s >= 0)) {
        return s->size; /* fixed, or nothing learnt (NaN fails the comparison) */
    }
    if (!isfinite(elapsed_s)) {
        /* no usable speed, only "slow": the smallest batch, and the next
         * measure taken as the first (an infinite row_s would stick) */
        s->row_s = 0.0;
        s->size = s->min;
        return s->size;
    }
    double per = elapsed_s / (double)rows;
    if (s->row_s <= 0 || (elapsed_s > s->target_s && per > s->row_s)) {
        s->row_s = per; /* the first measure, or an overshoot: believe it at once */
    } else {
        s->row_s = SMOOTHING * per + (1.0 - SMOOTHING) * s->row_s;
    }
    double cap = GROWTH * (double)s->size;
    /* row_s is 0 only when every batch so far took no measurable time */
    double want = s->row_s > 0 ? s->target_s / s->row_s : cap;
    want = want > cap ? cap : want;
    want = want < (double)s->min ? (double)s->min : want > (double)s->max ? (double)s->max : want;
    s->size = (size_t)want; /* in [min, max] <= KS_MIGRATE_BATCH_MAX: the cast is exact */
    assert(s->size >= s->min && s->size <= s->max);
    return s->size;
}
