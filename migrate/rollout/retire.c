/*
 * migrate/rollout/retire.c -- the reference check of key retirement
 * (ks_rollout_destroy_guard, keyshift/rollout.h): a key version is not
 * destroyed while a row, a live reader or an open rollout still names it.
 *
 * Pure, like guard.c: the caller (the CLI's `keys set-state ... destroyed`,
 * the fuzzer's state machine) counts the references; this decides and
 * says what is missing, so both judge with the same rule.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <keyshift/rollout.h>

#include "../../format/rules.h"
#include "rollout_internal.h"

/* Nonzero when s is 1..KS_ROLLOUT_REASON_MAX printable ASCII bytes: a
 * forced destroy must say why, in a form the log accepts. */
static int reason_ok(const char *s)
{
    if (s == NULL)
        return 0;
    size_t n = strnlen(s, KS_ROLLOUT_REASON_MAX + 1);
    if (n == 0 || n > KS_ROLLOUT_REASON_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return 0;
    return 1;
}

/* Append "N noun(s)" to the list in out (at *used), joined by ", " and a
 * final " and " (last nonzero when this is the last item), so the
 * sentence names every kind of reference that blocks the destroy. */
static void add_count(char *out, size_t cap, size_t *used, int *items, int last, uint64_t n,
                      const char *noun)
{
    if (n == 0)
        return;
    const char *sep = *items == 0 ? "" : last ? " and " : ", ";
    int w = snprintf(out + *used, cap - *used, "%s%" PRIu64 " %s%s", sep, n, noun,
                     n == 1 ? "" : "s");
    if (w > 0 && (size_t)w < cap - *used)
        *used += (size_t)w;
    (*items)++;
}

/* See rollout.h. */
ks_err ks_rollout_destroy_guard(const ks_rollout_destroy_facts *f, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (f == NULL || f->key_version == 0 ||
        !ks_rollout_charset_ok(f->key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    if (f->force && !reason_ok(f->reason))
        return ks_rollout_fail(why, why_len, KS_ERR_INVALID_ARGUMENT,
                               "a forced destroy of %s:%" PRIu32 " needs a written reason",
                               f->key_id, f->key_version);
    if (f->force && (!f->rows_known || !f->readers_known))
        return ks_rollout_fail(why, why_len, KS_OK,
                               "the %s referencing %s:%" PRIu32 " were not checked, and its "
                               "destroy was forced",
                               !f->rows_known && !f->readers_known ? "rows and live readers"
                               : !f->rows_known                    ? "rows"
                                                                   : "live readers",
                               f->key_id, f->key_version);
    if (!f->rows_known)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                               "the rows referencing %s:%" PRIu32 " were not counted", f->key_id,
                               f->key_version);
    if (!f->readers_known)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                               "the live readers holding %s:%" PRIu32 " were not checked",
                               f->key_id, f->key_version);
    if (f->rows == 0 && f->live_readers == 0 && f->open_rollouts == 0)
        return KS_OK;
    char refs[160];
    size_t used = 0;
    int items = 0;
    refs[0] = '\0';
    add_count(refs, sizeof refs, &used, &items, f->live_readers == 0 && f->open_rollouts == 0,
              f->rows, "row");
    add_count(refs, sizeof refs, &used, &items, f->open_rollouts == 0, f->live_readers,
              "live reader");
    add_count(refs, sizeof refs, &used, &items, 1, f->open_rollouts, "open rollout");
    if (f->force)
        return ks_rollout_fail(why, why_len, KS_OK,
                               "%s:%" PRIu32 " was still referenced by %s when its destroy was "
                               "forced", f->key_id, f->key_version, refs);
    return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "%s:%" PRIu32 " is still referenced by %s",
                           f->key_id, f->key_version, refs);
}
