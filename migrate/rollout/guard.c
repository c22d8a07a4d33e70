/*
 * migrate/rollout/guard.c -- the pure part of rollouts (keyshift/rollout.h):
 * phase names, class checks, canonical key-version lists, what a reader
 * supports, and the guards of every transition.
 *
 * Nothing here does I/O or reads a clock: a guard decides on the facts the
 * caller gathered (ks_rollout_facts), so that every rule is unit-testable
 * and the same code judges the CLI, the store's transactions and the
 * fuzzer's state machine.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <keyshift/rollout.h>

#include "../../format/rules.h"
#include "rollout_internal.h"

/* The phase names, indexed by phase. */
static const char *const phase_names[] = {
    NULL, "planned", "read-compat", "write-upgrade", "backfill", "finalized",
};

/* See rollout.h. */
const char *ks_rollout_phase_name(int phase)
{
    if (phase < KS_PHASE_PLANNED || phase > KS_PHASE_FINALIZED)
        return NULL;
    return phase_names[phase];
}

/* See rollout.h. */
int ks_rollout_phase_from_name(const char *name)
{
    if (name == NULL)
        return 0;
    for (int p = KS_PHASE_PLANNED; p <= KS_PHASE_FINALIZED; p++)
        if (strcmp(name, phase_names[p]) == 0)
            return p;
    return 0;
}

/* Nonzero when s (NUL-terminated, at most max bytes before the NUL
 * within a buffer of max + 1) is 1..max bytes of the character class
 * kind (KS_RULE_NAME, KS_RULE_KEY_ID). */
int ks_rollout_charset_ok(const char *s, size_t max, uint8_t kind)
{
    if (s == NULL)
        return 0;
    size_t n = strnlen(s, max + 1);
    return n >= 1 && n <= max && ks_rules_charset_scan(kind, (const uint8_t *)s, n) == n;
}

/* See rollout.h. */
ks_err ks_rollout_class_check(const ks_rollout_class *c, int may_be_plaintext)
{
    if (c == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    if (c->is_plaintext) {
        int empty = c->version == 0 && c->algorithm == 0 && c->key_id[0] == '\0' &&
                    c->key_version == 0;
        return may_be_plaintext && empty ? KS_OK : KS_ERR_INVALID_ARGUMENT;
    }
    if ((c->version != KS_FORMAT_V1 && c->version != KS_FORMAT_V2) ||
        ks_alg_name(c->algorithm) == NULL || c->key_version == 0 ||
        !ks_rollout_charset_ok(c->key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    return KS_OK;
}

/* See rollout.h. */
int ks_rollout_class_equal(const ks_rollout_class *a, const ks_rollout_class *b)
{
    assert(a != NULL && b != NULL);
    if (a->is_plaintext || b->is_plaintext)
        return (a->is_plaintext != 0) == (b->is_plaintext != 0);
    return a->version == b->version && a->algorithm == b->algorithm &&
           a->key_version == b->key_version && strcmp(a->key_id, b->key_id) == 0;
}

/* Write class c as "plaintext" or "key_id:version (v2, xchacha20-poly1305)"
 * into out; returns out. */
const char *ks_rollout_class_text(const ks_rollout_class *c, char *out, size_t out_len)
{
    if (c->is_plaintext)
        snprintf(out, out_len, "plaintext");
    else
        snprintf(out, out_len, "%s:%" PRIu32 " (v%u, %s)", c->key_id, c->key_version,
                 (unsigned)c->version,
                 ks_alg_name(c->algorithm) ? ks_alg_name(c->algorithm) : "?");
    return out;
}

/* ---- scopes ------------------------------------------------------------------ */

/* c with an ASCII capital letter made small, and every other byte as it
 * is (no locale: sqlite3_stricmp folds ASCII only), without a branch. */
static unsigned fold_ascii(unsigned char c)
{
    return c + 32u * ((unsigned)(c - 'A') < 26u);
}

/* See rollout_internal.h: SQLite's rule for identifiers, here without
 * SQLite, so that the rollout layer matches names the same whichever
 * store holds them. */
int ks_rollout_name_cmp(const char *a, const char *b)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    while (*x != '\0' && fold_ascii(*x) == fold_ascii(*y)) {
        x++;
        y++;
    }
    return (int)fold_ascii(*x) - (int)fold_ascii(*y);
}

/* See rollout.h: compared with ks_rollout_name_cmp (ASCII letters in
 * either case, as SQLite compares identifiers), so that a scope matches
 * whatever spelling a caller uses. */
int ks_rollout_scope_covers(const ks_rollout *r, const char *table, const char *column)
{
    assert(r != NULL);
    if (table == NULL || column == NULL)
        return 0;
    if (r->scope == KS_SCOPE_COLUMN)
        return ks_rollout_name_cmp(r->table, table) == 0 &&
               ks_rollout_name_cmp(r->column, column) == 0;
    for (size_t i = 0; i < r->n_columns && i < KS_ROLLOUT_COLUMNS_MAX; i++)
        if (ks_rollout_name_cmp(r->columns[i].table, table) == 0 &&
            ks_rollout_name_cmp(r->columns[i].column, column) == 0)
            return 1;
    return 0;
}

/* See rollout.h: the latest applicable rollout wins, as the latest
 * rollout of a column always has; a key-scoped one applies only to the
 * envelopes of its key_id in its listed columns. */
const ks_rollout *ks_rollout_scope_find(const ks_rollout *rs, size_t n, const char *table,
                                        const char *column, const char *key_id)
{
    const ks_rollout *best = NULL;
    int with_key = key_id != NULL && key_id[0] != '\0';
    for (size_t i = 0; rs != NULL && i < n; i++) {
        const ks_rollout *r = &rs[i];
        if (r->scope == KS_SCOPE_KEY && (!with_key || strcmp(r->source.key_id, key_id) != 0))
            continue;
        if (!ks_rollout_scope_covers(r, table, column))
            continue;
        if (best == NULL || r->id > best->id)
            best = r;
    }
    return best;
}

/* See rollout.h. */
const char *ks_rollout_scope_text(const ks_rollout *r, char *out, size_t out_len)
{
    assert(r != NULL && out != NULL && out_len > 0);
    if (r->scope == KS_SCOPE_COLUMN) {
        snprintf(out, out_len, "%s.%s", r->table, r->column);
        return out;
    }
    int w = snprintf(out, out_len, "key %s (", r->source.key_id);
    size_t used = w > 0 ? (size_t)w : 0;
    for (size_t i = 0; i < r->n_columns && i < KS_ROLLOUT_COLUMNS_MAX && used < out_len; i++) {
        w = snprintf(out + used, out_len - used, "%s%s.%s", i > 0 ? ", " : "",
                     r->columns[i].table, r->columns[i].column);
        used += w > 0 ? (size_t)w : 0;
    }
    if (used < out_len)
        snprintf(out + used, out_len - used, ")");
    return out;
}

/* ---- key-version lists ---------------------------------------------------- */

/* One entry of a key list: key_id = p[0, id_len), its version. */
typedef struct key_entry {
    const char *id;
    size_t id_len;
    uint32_t version;
} key_entry;

/* Parse the entry p[0, n) ("key_id:version") strictly into *e. */
static int parse_entry(const char *p, size_t n, key_entry *e)
{
    size_t colon = n;
    while (colon > 0 && p[colon - 1] != ':')
        colon--;
    if (colon == 0)
        return 0; /* no ':' */
    size_t id_len = colon - 1, digits = n - colon;
    if (id_len == 0 || id_len > KS_KEY_ID_MAX ||
        ks_rules_charset_scan(KS_RULE_KEY_ID, (const uint8_t *)p, id_len) != id_len)
        return 0;
    if (digits == 0 || digits > 10 || p[colon] == '0')
        return 0;
    uint64_t v = 0;
    for (size_t i = colon; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10u + (uint64_t)(p[i] - '0');
    }
    if (v > UINT32_MAX)
        return 0;
    e->id = p;
    e->id_len = id_len;
    e->version = (uint32_t)v;
    return 1;
}

/* Order of entries: key_id bytewise (a prefix first), then version. */
static int entry_cmp(const key_entry *a, const key_entry *b)
{
    size_t m = a->id_len < b->id_len ? a->id_len : b->id_len;
    int c = memcmp(a->id, b->id, m);
    if (c != 0)
        return c;
    if (a->id_len != b->id_len)
        return a->id_len < b->id_len ? -1 : 1;
    return a->version < b->version ? -1 : a->version > b->version;
}

/* Walk the canonical list text, checking it; when want is not NULL, set
 * *found when an entry equals it.  Returns 1 when the list is canonical. */
static int walk_keys(const char *text, const key_entry *want, int *found)
{
    size_t len = strnlen(text, KS_READER_KEYS_MAX + 1);
    if (len > KS_READER_KEYS_MAX)
        return 0;
    key_entry prev = {NULL, 0, 0};
    size_t start = 0;
    while (start < len) {
        const char *comma = memchr(text + start, ',', len - start);
        size_t end = comma != NULL ? (size_t)(comma - text) : len;
        key_entry e;
        if (!parse_entry(text + start, end - start, &e))
            return 0;
        if (prev.id != NULL && entry_cmp(&prev, &e) >= 0)
            return 0; /* unsorted or duplicate */
        if (want != NULL && entry_cmp(&e, want) == 0)
            *found = 1;
        prev = e;
        if (comma == NULL)
            return 1;
        start = end + 1;
        if (start == len)
            return 0; /* trailing ',' */
    }
    return 1; /* "" */
}

/* See rollout.h. */
ks_err ks_rollout_keys_check(const char *text)
{
    if (text == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    return walk_keys(text, NULL, NULL) ? KS_OK : KS_ERR_BAD_VALUE;
}

/* See rollout.h. */
int ks_rollout_keys_holds(const char *text, const char *key_id, uint32_t version)
{
    if (text == NULL || key_id == NULL)
        return 0;
    key_entry want = {key_id, strlen(key_id), version};
    int found = 0;
    return walk_keys(text, &want, &found) && found;
}

/* See rollout.h: find where (key_id, version) sorts, then shift the
 * tail and write the entry in place. */
ks_err ks_rollout_keys_add(char *list, size_t cap, const char *key_id, uint32_t version)
{
    if (list == NULL || cap == 0 || strnlen(list, cap) == cap || version == 0 ||
        !ks_rollout_charset_ok(key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    if (!walk_keys(list, NULL, NULL))
        return KS_ERR_BAD_VALUE;
    key_entry want = {key_id, strlen(key_id), version};
    size_t len = strlen(list), at = len, start = 0;
    while (start < len) {
        const char *comma = memchr(list + start, ',', len - start);
        size_t end = comma != NULL ? (size_t)(comma - list) : len;
        key_entry e;
        int parsed = parse_entry(list + start, end - start, &e);
        assert(parsed); /* the list is canonical */
        (void)parsed;
        int c = entry_cmp(&e, &want);
        if (c == 0)
            return KS_OK; /* already held */
        if (c > 0) {
            at = start;
            break;
        }
        start = end + 1;
    }
    char entry[KS_KEY_ID_MAX + 16];
    int n = snprintf(entry, sizeof entry, "%s:%" PRIu32, key_id, version);
    assert(n > 0 && (size_t)n < sizeof entry);
    size_t add = (size_t)n + (len > 0 ? 1 : 0);
    if (len + add > KS_READER_KEYS_MAX)
        return KS_ERR_TOO_LARGE;
    if (len + add + 1 > cap)
        return KS_ERR_BUFFER_TOO_SMALL;
    memmove(list + at + add, list + at, len - at + 1);
    if (at < len) { /* before an entry: "entry," */
        memcpy(list + at, entry, (size_t)n);
        list[at + (size_t)n] = ',';
    } else if (len > 0) { /* at the end: ",entry" */
        list[at] = ',';
        memcpy(list + at + 1, entry, (size_t)n);
    } else {
        memcpy(list, entry, (size_t)n);
    }
    return KS_OK;
}

/* See rollout.h. */
int ks_rollout_reader_supports(const ks_rollout_reader *r, const ks_rollout_class *c)
{
    assert(r != NULL && c != NULL);
    if (c->is_plaintext)
        return 1;
    if (r->max_format < c->version || c->algorithm >= 32 ||
        (r->algorithms & (1u << c->algorithm)) == 0)
        return 0;
    return ks_rollout_keys_holds(r->keys, c->key_id, c->key_version);
}

/* ---- guards ----------------------------------------------------------------- */

/* Format n with thousands separators ("1,204") into out. */
static const char *grouped(uint64_t n, char out[32])
{
    char digits[24];
    int len = snprintf(digits, sizeof digits, "%" PRIu64, n);
    assert(len > 0 && len < 24);
    size_t o = 0;
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
    return out;
}

/* The rows of a count ("1 row is", "35 rows are"). */
static const char *rows_are(uint64_t n, char out[48])
{
    char g[32];
    snprintf(out, 48, "%s %s", grouped(n, g), n == 1 ? "row is" : "rows are");
    return out;
}

/* The name of a key state fact for messages. */
static const char *key_fact_name(int state)
{
    if (state == KS_ROLLOUT_KEY_UNKNOWN)
        return "unknown";
    if (state == KS_ROLLOUT_KEY_MISSING)
        return "missing";
    const char *n = ks_key_state_name(state);
    return n != NULL ? n : "invalid";
}

/* planned -> read-compat: the target key version exists and may be used
 * for reading and writing later (not disabled, not destroyed). */
static ks_err guard_read_compat(const ks_rollout_facts *f, char *why, size_t why_len)
{
    const ks_rollout_class *t = &f->rollout.target;
    int s = f->target_key_state;
    if (s == KS_KEY_ACTIVE || s == KS_KEY_DECRYPT_ONLY)
        return KS_OK;
    if (s == KS_ROLLOUT_KEY_UNKNOWN)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "the state of target key %s:%" PRIu32 " was not checked with the provider",
                      t->key_id, t->key_version);
    if (s == KS_ROLLOUT_KEY_MISSING)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "target key %s:%" PRIu32 " does not exist in the key provider", t->key_id,
                      t->key_version);
    return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "target key %s:%" PRIu32 " is %s", t->key_id,
                  t->key_version, key_fact_name(s));
}

/* KS_OK when every live reader of f supports class c, else KS_ERR_GUARD
 * naming those that do not (up to 8) in why. */
static ks_err readers_support(const ks_rollout_facts *f, const ks_rollout_class *c, char *why,
                              size_t why_len)
{
    size_t missing = 0;
    char names[512];
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < f->n_readers; i++) {
        if (ks_rollout_reader_supports(&f->readers[i], c))
            continue;
        if (missing < 8) {
            int n = snprintf(names + used, sizeof names - used, "%s%s", missing ? ", " : "",
                             f->readers[i].instance_id);
            used = n > 0 && (size_t)n < sizeof names - used ? used + (size_t)n : used;
        }
        missing++;
    }
    if (missing == 0)
        return KS_OK;
    char tc[KS_KEY_ID_MAX + 48];
    ks_rollout_class_text(c, tc, sizeof tc);
    return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "%zu live %s cannot read %s: %s%s", missing,
                           missing == 1 ? "reader" : "readers", tc, names,
                           missing > 8 ? ", ..." : "");
}

/* read-compat -> write-upgrade: every live reader supports the target,
 * and read-compat has lasted min_soak_s.  Readers are named (up to 8). */
static ks_err guard_write_upgrade(const ks_rollout_facts *f, char *why, size_t why_len)
{
    const ks_rollout *r = &f->rollout;
    ks_err err = readers_support(f, &r->target, why, why_len);
    if (err != KS_OK)
        return err;
    int64_t lasted = f->now - r->phase_since;
    if (lasted < (int64_t)r->min_soak_s)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "read-compat has lasted %" PRId64 " s of the %" PRIu32 " s minimum soak",
                      lasted < 0 ? 0 : lasted, r->min_soak_s);
    return KS_OK;
}

/* write-upgrade -> backfill: the health verdict of the window is OK. */
static ks_err guard_backfill(const ks_rollout_facts *f, char *why, size_t why_len)
{
    if (!f->health_known)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                               "the health of the window was not evaluated");
    if (f->health == KS_HEALTH_TRIPPED)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "the health check tripped a threshold in the last %" PRIu32 " s",
                      f->rollout.thresholds.window_s);
    if (f->health == KS_HEALTH_INSUFFICIENT)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "the health check has too few samples (fewer than %" PRIu64
                      ") in the last %" PRIu32 " s, or an enabled check has no data there",
                      f->rollout.thresholds.min_samples, f->rollout.thresholds.window_s);
    if (f->health != KS_HEALTH_OK)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "the health verdict is not valid");
    return KS_OK;
}

/* A key scope's verify condition: every listed column has a verify pass
 * recorded since entering backfill; the refusal names each column that
 * has none, so the operator knows which `migrate verify` to run. */
static ks_err columns_verified(const ks_rollout *r, char *why, size_t why_len)
{
    char missing[SCOPE_TEXT_MAX];
    size_t used = 0, n = 0;
    missing[0] = '\0';
    if (r->n_columns == 0 || r->n_columns > KS_ROLLOUT_COLUMNS_MAX)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "the key scope lists no column");
    for (size_t i = 0; i < r->n_columns; i++) {
        const ks_rollout_column *c = &r->columns[i];
        if (c->verified_at != 0 && c->verified_at >= r->phase_since)
            continue;
        int w = snprintf(missing + used, sizeof missing - used, "%s%s.%s", n > 0 ? ", " : "",
                         c->table, c->column);
        used += w > 0 && (size_t)w < sizeof missing - used ? (size_t)w : 0;
        n++;
    }
    if (n == 0)
        return KS_OK;
    return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                           "no `migrate verify` pass was recorded since backfill began for "
                           "%zu of %zu columns: %s", n, r->n_columns, missing);
}

/* backfill -> finalized: no row left at the source, and a verify pass
 * recorded since entering backfill (of every column of a key scope). */
static ks_err guard_finalize(const ks_rollout_facts *f, char *why, size_t why_len)
{
    const ks_rollout *r = &f->rollout;
    char rows[48], scope[SCOPE_TEXT_MAX];
    if (!f->census_known)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "the census of %s was not computed",
                      ks_rollout_scope_text(r, scope, sizeof scope));
    if (f->rows_at_source > 0)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "%s still at the source",
                      rows_are(f->rows_at_source, rows));
    if (r->scope == KS_SCOPE_KEY)
        return columns_verified(r, why, why_len);
    if (r->verified_at == 0 || r->verified_at < r->phase_since)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "no `migrate verify` pass was recorded since backfill began");
    return KS_OK;
}

/* KS_OK when the census of f is known and shows no row at the target;
 * else KS_ERR_GUARD saying that `doing` (e.g. "rolling back to planned")
 * would make those rows unreadable. */
static ks_err target_unwritten(const ks_rollout_facts *f, const char *doing, char *why,
                               size_t why_len)
{
    const ks_rollout *r = &f->rollout;
    char scope[SCOPE_TEXT_MAX];
    if (!f->census_known)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "the census of %s was not computed",
                      ks_rollout_scope_text(r, scope, sizeof scope));
    if (f->rows_at_target > 0) {
        char g[32];
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "%s would make %s %s unreadable", doing,
                      grouped(f->rows_at_target, g), f->rows_at_target == 1 ? "row" : "rows");
    }
    return KS_OK;
}

/* read-compat -> planned: no row written at the target yet. */
static ks_err guard_to_planned(const ks_rollout_facts *f, char *why, size_t why_len)
{
    return target_unwritten(f, "rolling back to planned", why, why_len);
}

/* finalized -> backfill: only the governing rollout, only while the
 * source can still be written and read again (its key not destroyed),
 * and only when every live reader can read the source: backfill reads it
 * again, and its step back to read-compat (always allowed, so that an
 * automatic rollback never stalls) writes it.  An instance started after
 * finalize may hold the target alone; it must be upgraded or stopped
 * first. */
static ks_err guard_unfinalize(const ks_rollout_facts *f, char *why, size_t why_len)
{
    const ks_rollout_class *s = &f->rollout.source;
    char scope[SCOPE_TEXT_MAX];
    if (!f->is_latest)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "a later rollout governs %s: only the latest may be rolled back",
                      ks_rollout_scope_text(&f->rollout, scope, sizeof scope));
    ks_err err = readers_support(f, s, why, why_len);
    if (err != KS_OK)
        return err;
    if (s->is_plaintext)
        return KS_OK;
    int st = f->source_key_state;
    if (st == KS_KEY_ACTIVE || st == KS_KEY_DECRYPT_ONLY || st == KS_KEY_DISABLED)
        return KS_OK;
    if (st == KS_KEY_DESTROYED)
        return ks_rollout_fail(why, why_len, KS_ERR_GUARD,
                      "source key %s:%" PRIu32 " was destroyed: its rows could never be read",
                      s->key_id, s->key_version);
    return ks_rollout_fail(why, why_len, KS_ERR_GUARD, "the state of source key %s:%" PRIu32 " is %s",
                  s->key_id, s->key_version, key_fact_name(st));
}

/* See rollout.h. */
ks_err ks_rollout_guard(const ks_rollout_facts *f, ks_rollout_phase to, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (f == NULL || (f->readers == NULL && f->n_readers > 0))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_phase from = f->rollout.phase;
    const char *fn = ks_rollout_phase_name((int)from), *tn = ks_rollout_phase_name((int)to);
    if (fn == NULL || tn == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    switch (from) {
    case KS_PHASE_PLANNED:
        if (to == KS_PHASE_READ_COMPAT)
            return guard_read_compat(f, why, why_len);
        break;
    case KS_PHASE_READ_COMPAT:
        if (to == KS_PHASE_WRITE_UPGRADE)
            return guard_write_upgrade(f, why, why_len);
        if (to == KS_PHASE_PLANNED)
            return guard_to_planned(f, why, why_len);
        break;
    case KS_PHASE_WRITE_UPGRADE:
        if (to == KS_PHASE_BACKFILL)
            return guard_backfill(f, why, why_len);
        if (to == KS_PHASE_READ_COMPAT)
            return KS_OK; /* readers still read the target */
        break;
    case KS_PHASE_BACKFILL:
        if (to == KS_PHASE_FINALIZED)
            return guard_finalize(f, why, why_len);
        if (to == KS_PHASE_READ_COMPAT)
            return KS_OK;
        break;
    case KS_PHASE_FINALIZED:
        if (to == KS_PHASE_BACKFILL)
            return guard_unfinalize(f, why, why_len);
        break;
    }
    return ks_rollout_fail(why, why_len, KS_ERR_STATE, "there is no transition from %s to %s", fn,
                           tn);
}

/* See rollout.h.  Planned never writes the target (it is entered at
 * start, or from read-compat only while the census shows no row at the
 * target); read-compat writes the source too, but a rollout that went
 * through write-upgrade may have left rows at the target, so read-compat
 * needs the census to show none.  Later phases write the target: they are
 * rolled back first. */
ks_err ks_rollout_abort_guard(const ks_rollout_facts *f, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (f == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    const ks_rollout *r = &f->rollout;
    const char *pn = ks_rollout_phase_name((int)r->phase);
    if (pn == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    switch (r->phase) {
    case KS_PHASE_PLANNED:
        return KS_OK;
    case KS_PHASE_READ_COMPAT:
        break;
    case KS_PHASE_WRITE_UPGRADE:
    case KS_PHASE_BACKFILL:
        return ks_rollout_fail(why, why_len, KS_ERR_STATE,
                               "rollout %" PRId64 " is in %s and may have written the target: "
                               "roll it back to read-compat first",
                               r->id, pn);
    case KS_PHASE_FINALIZED:
        return ks_rollout_fail(why, why_len, KS_ERR_STATE,
                               "rollout %" PRId64 " is finalized: its target is all there is",
                               r->id);
    }
    return target_unwritten(f, "aborting", why, why_len);
}
