/*
 * fuzz/fuzz_pg_rows.c -- the decoders of the rows the PostgreSQL stores
 * read back (migrate/store/pg/: rollout_pg.h, pg_decode.h) on results
 * built from arbitrary bytes.  A database's cells are untrusted, and no
 * server is needed: the results are made with libpq's own API for it
 * (PQmakeEmptyPGresult, PQsetResultAttrs, PQsetvalue, PQclear), with the
 * columns, type oids and formats of the query each decoder reads.
 *
 * Input: a decoder byte (mod the decoders below), a row count (1..8),
 * an attribute byte (>= 0x80: column (byte & 0x7f) % ncols gets the oid and
 * format of the next byte; else every column is the query's), for the
 * scan a context count and a type byte per value column, then the cells
 * row by row: a tag (0xff NULL, 0xfe a 16-bit big-endian length, else
 * the length) and that many bytes.  Past the end every byte reads 0.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. A strict decoder returns KS_OK or KS_ERR_STORE, nothing else.
 *   2. A row it accepts obeys what its header promises: ids and times
 *      within their columns' ranges, names within their lengths, known
 *      phases and canary kinds, a scope its cells agree on, rates not
 *      NaN, histograms and counters non-negative; a scan row's id an
 *      integer and its quarantine flag a boolean of exactly 0 or 1, a
 *      checkpoint's cursor NULL or an integer and its text without a
 *      NUL; every cell it read of the binary format.
 *   3. Round trip: an accepted row, written back into a result the way
 *      the store writes it (bound parameters: bigint big-endian, text
 *      and bytea bytes, the canary and phases by their codec names, the
 *      histograms by ks_rcodec_hist_encode), decodes to the same value;
 *      a histogram re-encodes to the cell's own bytes.
 *   4. The chunk coordinator's decoders (binary results, strict:
 *      pg_decode.h) return KS_OK or KS_ERR_STORE with a message naming
 *      one of the result's columns; a chunk or summary they accept obeys
 *      the header (a known state, lo <= cursor <= hi, pass >= 1, counts
 *      >= 0, owner and lease together, summed counts that add up) and
 *      is canonical: written back as the server sends it (bigints
 *      8 bytes, a boolean 1 byte 0/1, NULL owner and lease when none)
 *      it gives back the very cells it was read from, and reads back the
 *      same.  So a non-canonical form (a NULL in a NOT NULL column, an
 *      unknown state, a boolean 2, a text column, ...) is refused.
 *   5. No crash, leak or undefined behaviour (ASan+UBSan); the work is
 *      linear in the input (each cell is read a bounded number of times).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include <keyshift/error.h>
#include <keyshift/health.h>
#include <keyshift/rollout.h>

#include "../migrate/store/pg/pg_decode.h"
#include "../migrate/store/pg/rollout_pg.h"
#include "../migrate/store/rollout_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"
#include "fuzz_input.h"

/* Type oids (fixed in every PostgreSQL release). */
#define OID_BOOL 16u
#define OID_BYTEA 17u
#define OID_INT8 20u
#define OID_INT4 23u
#define OID_TEXT 25u
#define OID_FLOAT8 701u

/* The most rows and columns of one built result. */
#define MAX_ROWS 8
#define MAX_COLS 32

/* One result's shape: a type letter per column ('i' bigint, 't' text,
 * 'd' double precision, 'b' bytea, 'o' boolean) and its names; every
 * column binary (a perturbed one may be text: make_result). */
typedef struct shape {
    const char *types;
    const char *const *names;
} shape;

/* The decoders, chosen by the input's first byte. */
enum {
    D_ROLLOUT, D_COLUMN, D_LOG, D_READER, D_SAMPLE, D_SCAN, D_CHECKPOINT, D_LISTED, D_CELL,
    D_CHUNK, D_SUMMARY, D_N
};

/* The column names of each select list, split once from the store's own
 * lists (rollout_pg.h, pg_decode.h), and the coordinator's. */
static char *names_of[D_N][MAX_COLS];
static const char *const chunk_names[KS_PG_CHUNK_NCOLS] = {KS_PG_CHUNK_NAMES};
static const char *const summary_names[KS_PG_SUMMARY_NCOLS] = {KS_PG_SUMMARY_NAMES};
static const char *const scan_names[MAX_COLS] = {
    "id", "value", "tenant", "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "quarantined"};

/* The type letters of each decoder's columns (the scan's and the cell's
 * are chosen per input). */
static const char rollout_types[] = "ittiiitiiititititdddiiiiiiiiit";
static const char column_types[] = "tti";
static const char log_types[] = "iiitttti";
static const char reader_types[] = "ttiitii";
static const char sample_types[] = "iiiiiiibbii";
static const char checkpoint_types[] = "ttiiiiiiiiii";
static const char listed_types[] = "ttiiiiiiiiiitt";
static const char chunk_types[] = "iiitiiiiiiitio";
static const char summary_types[] = "iiiiiiiii";

/* Split a ", "-separated select list into out (each malloc'd, kept for
 * the process's life); the number of names. */
static int split_names(const char *list, char **out)
{
    int n = 0;
    for (const char *p = list; *p != '\0' && n < MAX_COLS;) {
        const char *e = strchr(p, ',');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        out[n] = malloc(len + 1);
        CHECK(out[n] != NULL);
        memcpy(out[n], p, len);
        out[n][len] = '\0';
        n++;
        p += len;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return n;
}

/* Split the store's select lists once and check that each has as many
 * columns as this harness gives it types (a query that gained a column
 * fails here before any input runs). */
static void init_names(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    CHECK(split_names(KS_RPG_ROLLOUT_COLS, names_of[D_ROLLOUT]) == (int)strlen(rollout_types));
    CHECK(split_names(KS_RPG_COLUMN_COLS, names_of[D_COLUMN]) == (int)strlen(column_types));
    CHECK(split_names(KS_RPG_LOG_COLS, names_of[D_LOG]) == (int)strlen(log_types));
    CHECK(split_names(KS_RPG_READER_COLS, names_of[D_READER]) == (int)strlen(reader_types));
    CHECK(split_names(KS_RPG_METRICS_COLS, names_of[D_SAMPLE]) == (int)strlen(sample_types));
    CHECK(split_names(KS_PG_CHECKPOINT_COLS, names_of[D_CHECKPOINT]) ==
          (int)strlen(checkpoint_types));
    CHECK(split_names(KS_PG_CHECKPOINT_COLS ", tbl, col", names_of[D_LISTED]) ==
          (int)strlen(listed_types));
    CHECK(strlen(chunk_types) == KS_PG_CHUNK_NCOLS && strlen(summary_types) == KS_PG_SUMMARY_NCOLS);
}

/* The oid of a type letter. */
static Oid oid_of(char t)
{
    switch (t) {
    case 'i':
        return OID_INT8;
    case 'd':
        return OID_FLOAT8;
    case 'b':
        return OID_BYTEA;
    case 'o':
        return OID_BOOL;
    default:
        return OID_TEXT;
    }
}

/* An empty result of shape sh (oids from its letters), one column's oid
 * and format replaced when bad_col >= 0 (bad_format: the other format). */
static PGresult *make_result(const shape *sh, int bad_col, Oid bad_oid, int bad_format)
{
    PGresAttDesc att[MAX_COLS];
    int n = (int)strlen(sh->types);
    CHECK(n <= MAX_COLS);
    memset(att, 0, sizeof att);
    for (int i = 0; i < n; i++) {
        att[i].name = (char *)(uintptr_t)sh->names[i];
        att[i].format = 1;
        att[i].typid = oid_of(sh->types[i]);
        att[i].typlen = -1;
        att[i].atttypmod = -1;
        if (i == bad_col) {
            att[i].typid = bad_oid;
            att[i].format = bad_format ? !att[i].format : att[i].format;
        }
    }
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    CHECK(res != NULL);
    CHECK(PQsetResultAttrs(res, n, att));
    return res;
}

/* ---- writing a result back, as the store writes its rows -------------------- */

/* A one-row result being written, column by column. */
typedef struct writer {
    PGresult *res;
    int col;
} writer;

/* Start a one-row result of shape sh. */
static writer w_begin(const shape *sh)
{
    return (writer){make_result(sh, -1, 0, 0), 0};
}

/* The next cell: len bytes at p (NULL: a NULL cell). */
static void w_bytes(writer *w, const void *p, size_t len)
{
    CHECK(PQsetvalue(w->res, 0, w->col++, (char *)(uintptr_t)p, p != NULL ? (int)len : -1));
}

/* The next cell: a NUL-terminated text. */
static void w_text(writer *w, const char *s)
{
    w_bytes(w, s, strlen(s));
}

/* The next cell: a bigint, 8 bytes big-endian (as ks_rpg_exec binds 'i'). */
static void w_int(writer *w, int64_t v)
{
    uint8_t b[8];
    for (int i = 7; i >= 0; i--) {
        b[i] = (uint8_t)v;
        v = (int64_t)((uint64_t)v >> 8);
    }
    w_bytes(w, b, 8);
}

/* The next cell: a double precision, its bits big-endian. */
static void w_double(writer *w, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    w_int(w, (int64_t)bits);
}

/* The next cell: a boolean, one byte 0 or 1. */
static void w_bool(writer *w, int b)
{
    uint8_t v = b != 0;
    w_bytes(w, &v, 1);
}

/* Nonzero when cell (row, col) of a and cell (0, col) of b are the same
 * cell: both NULL, or the same bytes. */
static int cell_eq(const PGresult *a, int row, const PGresult *b, int col)
{
    if (PQgetisnull(a, row, col) || PQgetisnull(b, 0, col))
        return PQgetisnull(a, row, col) && PQgetisnull(b, 0, col);
    int n = PQgetlength(a, row, col);
    return n == PQgetlength(b, 0, col) &&
           memcmp(PQgetvalue(a, row, col), PQgetvalue(b, 0, col), (size_t)n) == 0;
}

/* Oracle 4's canonical form: every cell of row `row` of res is the
 * same as the written-back one's. */
static void check_same_cells(const PGresult *res, int row, const PGresult *back)
{
    CHECK(PQnfields(res) == PQnfields(back));
    for (int c = 0; c < PQnfields(res); c++) {
        CHECK(PQfformat(res, c) == 1 && PQftype(res, c) == PQftype(back, c));
        CHECK(cell_eq(res, row, back, c));
    }
}

/* Oracle 4 for a refusal: a message naming a column of res. */
static void check_refusal(const PGresult *res, const char *msg)
{
    CHECK(msg[0] != '\0');
    int named = 0;
    for (int c = 0; c < PQnfields(res) && !named; c++)
        named = strstr(msg, PQfname(res, c)) != NULL;
    CHECK(named || strstr(msg, "shape") != NULL);
}

/* ---- the input --------------------------------------------------------------- */

/* Fill rows [0, rows) of res (ncols columns) with cells from in. */
static void fill(PGresult *res, int rows, int ncols, ks_fuzz_input *in)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ncols; c++) {
            size_t len = ks_fuzz_next(in);
            if (len == 0xff) {
                CHECK(PQsetvalue(res, r, c, NULL, -1));
                continue;
            }
            if (len == 0xfe) {
                len = (size_t)ks_fuzz_next(in) << 8;
                len |= ks_fuzz_next(in);
            }
            if (len > in->n - in->off)
                len = in->n - in->off;
            /* PQsetvalue copies; an empty cell still needs a pointer */
            const char *p = len > 0 ? (const char *)in->p + in->off : "";
            in->off += len;
            CHECK(PQsetvalue(res, r, c, (char *)(uintptr_t)p, (int)len));
        }
}

/* ---- comparisons --------------------------------------------------------------- */

/* Nonzero when two values are the same (bytes by content). */
static int value_eq(const ks_value *a, const ks_value *b)
{
    if (a->type != b->type)
        return 0;
    if (a->type == KS_VALUE_INTEGER)
        return a->integer == b->integer;
    if (a->type == KS_VALUE_NULL)
        return 1;
    return a->bytes.len == b->bytes.len && a->bytes.ptr != NULL && b->bytes.ptr != NULL &&
           memcmp(a->bytes.ptr, b->bytes.ptr, a->bytes.len) == 0;
}

/* Nonzero when two byte views hold the same bytes. */
static int bytes_eq(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Nonzero when two checkpoints are the same (views by content). */
static int checkpoint_eq(const ks_checkpoint *a, const ks_checkpoint *b)
{
    return bytes_eq(a->params, b->params) && bytes_eq(a->state, b->state) &&
           value_eq(&a->cursor, &b->cursor) && a->pass == b->pass && a->done == b->done &&
           a->skipped == b->skipped && a->raced == b->raced && a->quarantined == b->quarantined &&
           a->wrong_state == b->wrong_state && a->started == b->started &&
           a->updated == b->updated && a->finished == b->finished;
}

/* Nonzero when s is a NUL-terminated string of at most max bytes. */
static int fits(const char *s, size_t max)
{
    return strnlen(s, max + 1) <= max;
}

/* ---- the rollout store's decoders --------------------------------------------- */

static ks_rollout ro, ro2;
static ks_rollout_log_entry le, le2;
static ks_rollout_reader rd, rd2;

/* Oracle 2 for an accepted rollout row. */
static void check_rollout(const ks_rollout *r)
{
    CHECK(r->id >= 1 && fits(r->table, KS_ROLLOUT_IDENT_MAX) &&
          fits(r->column, KS_ROLLOUT_IDENT_MAX));
    CHECK(r->source.is_plaintext == 0 || r->source.is_plaintext == 1);
    CHECK(r->target.is_plaintext == 0);
    CHECK(fits(r->source.key_id, KS_KEY_ID_MAX) && fits(r->target.key_id, KS_KEY_ID_MAX));
    CHECK(ks_rollout_phase_name((int)r->phase) != NULL);
    CHECK(r->canary.percent <= 100);
    if (r->canary.kind == KS_CANARY_TENANTS) {
        CHECK(r->canary.n_tenants >= 1 && r->canary.n_tenants <= KS_ROLLOUT_TENANTS_MAX);
        for (size_t i = 0; i < r->canary.n_tenants; i++) {
            const char *t = r->canary.tenants[i];
            CHECK(t[0] != '\0' && fits(t, KS_TENANT_MAX) && strchr(t, ',') == NULL);
        }
    } else {
        CHECK((r->canary.kind == KS_CANARY_ALL || r->canary.kind == KS_CANARY_PERCENT) &&
              r->canary.n_tenants == 0);
    }
    if (r->scope == KS_SCOPE_KEY) {
        CHECK(r->table[0] == '\0' && r->column[0] == '\0' && !r->source.is_plaintext);
        CHECK(r->source.key_id[0] != '\0' && strcmp(r->source.key_id, r->target.key_id) == 0);
    } else {
        CHECK(r->scope == KS_SCOPE_COLUMN && r->table[0] != '\0' && r->column[0] != '\0');
    }
    CHECK(!isnan(r->thresholds.max_auth_failure_rate) &&
          !isnan(r->thresholds.max_parse_error_rate) &&
          !isnan(r->thresholds.max_provider_error_rate));
    CHECK(r->thresholds.max_seal_p99_us <= INT64_MAX &&
          r->thresholds.max_open_p99_us <= INT64_MAX && r->thresholds.min_samples <= INT64_MAX);
    CHECK(r->thresholds.window_s >= 1 && r->reader_ttl_s >= 1 && r->verified_at >= 0);
    CHECK(r->n_columns == 0);
}

/* Write a class's cells (plaintext flag first when with_flag). */
static void w_class(writer *w, const ks_rollout_class *c, int with_flag)
{
    if (with_flag)
        w_int(w, c->is_plaintext != 0);
    w_int(w, c->version);
    w_int(w, c->algorithm);
    w_text(w, c->key_id);
    w_int(w, c->key_version);
}

/* Oracle 3 for a rollout: its row as ks_rpg_insert (and set_verified)
 * write it decodes to the same rollout. */
static void round_trip_rollout(const shape *sh, const ks_rollout *r)
{
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    const ks_thresholds *t = &r->thresholds;
    writer w = w_begin(sh);
    w_int(&w, r->id);
    w_text(&w, r->table);
    w_text(&w, r->column);
    w_class(&w, &r->source, 1);
    w_class(&w, &r->target, 0);
    w_text(&w, ks_rollout_phase_name((int)r->phase));
    w_int(&w, r->phase_since);
    ks_rcodec_canary_join(&r->canary, tenants);
    w_text(&w, ks_rcodec_canary_name(r->canary.kind));
    w_int(&w, r->canary.percent);
    w_text(&w, tenants);
    w_double(&w, t->max_auth_failure_rate);
    w_double(&w, t->max_parse_error_rate);
    w_double(&w, t->max_provider_error_rate);
    w_int(&w, (int64_t)t->max_seal_p99_us);
    w_int(&w, (int64_t)t->max_open_p99_us);
    w_int(&w, (int64_t)t->min_samples);
    w_int(&w, t->window_s);
    w_int(&w, r->min_soak_s);
    w_int(&w, r->reader_ttl_s);
    w_int(&w, r->created);
    w_int(&w, r->updated);
    w_int(&w, r->verified_at);
    w_text(&w, r->scope == KS_SCOPE_KEY ? r->source.key_id : "");
    CHECK(ks_rpg_read_rollout(w.res, 0, &ro2) == KS_OK);
    CHECK(memcmp(r, &ro2, sizeof *r) == 0);
    PQclear(w.res);
}

/* Decode every row of a rollout result: oracles 1-3. */
static void run_rollout(const shape *sh, const PGresult *res, int rows)
{
    for (int i = 0; i < rows; i++) {
        ks_err e = ks_rpg_read_rollout(res, i, &ro);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        check_rollout(&ro);
        round_trip_rollout(sh, &ro);
    }
}

/* Decode every row of a listed-column result: oracles 1-3. */
static void run_column(const shape *sh, const PGresult *res, int rows)
{
    for (int i = 0; i < rows; i++) {
        ks_rollout_column c, c2;
        memset(&c, 0, sizeof c);
        memset(&c2, 0, sizeof c2);
        ks_err e = ks_rpg_read_column(res, i, &c);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        CHECK(fits(c.table, KS_ROLLOUT_IDENT_MAX) && fits(c.column, KS_ROLLOUT_IDENT_MAX));
        CHECK(c.verified_at >= 0);
        writer w = w_begin(sh);
        w_text(&w, c.table);
        w_text(&w, c.column);
        w_int(&w, c.verified_at);
        CHECK(ks_rpg_read_column(w.res, 0, &c2) == KS_OK && memcmp(&c, &c2, sizeof c) == 0);
        PQclear(w.res);
    }
}

/* Decode every row of a log result: oracles 1-3 (the row as
 * ks_rpg_log_append writes it, from 0 as NULL). */
static void run_log(const shape *sh, const PGresult *res, int rows)
{
    for (int i = 0; i < rows; i++) {
        ks_err e = ks_rpg_read_log(res, i, &le);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        CHECK(le.id >= 1 && le.rollout_id >= 1 && fits(le.actor, KS_ROLLOUT_ACTOR_MAX) &&
              fits(le.reason, KS_ROLLOUT_REASON_MAX));
        CHECK(ks_rollout_phase_name(le.to) != NULL &&
              (le.from == 0 || ks_rollout_phase_name(le.from) != NULL));
        CHECK(le.automatic == 0 || le.automatic == 1);
        writer w = w_begin(sh);
        w_int(&w, le.id);
        w_int(&w, le.rollout_id);
        w_int(&w, le.time);
        w_text(&w, le.actor);
        const char *from = le.from == 0 ? NULL : ks_rollout_phase_name(le.from);
        w_bytes(&w, from, from != NULL ? strlen(from) : 0);
        w_text(&w, ks_rollout_phase_name(le.to));
        w_text(&w, le.reason);
        w_int(&w, le.automatic);
        CHECK(ks_rpg_read_log(w.res, 0, &le2) == KS_OK && memcmp(&le, &le2, sizeof le) == 0);
        PQclear(w.res);
    }
}

/* Decode every row of a reader result: oracles 1-3 (the row as
 * ks_rpg_reader_put writes it). */
static void run_reader(const shape *sh, const PGresult *res, int rows)
{
    for (int i = 0; i < rows; i++) {
        ks_err e = ks_rpg_read_reader(res, i, &rd);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        CHECK(fits(rd.instance_id, KS_INSTANCE_ID_MAX) &&
              fits(rd.library_version, KS_LIBRARY_VERSION_MAX) &&
              fits(rd.keys, KS_READER_KEYS_MAX));
        CHECK(rd.max_format >= 1);
        writer w = w_begin(sh);
        w_text(&w, rd.instance_id);
        w_text(&w, rd.library_version);
        w_int(&w, rd.max_format);
        w_int(&w, rd.algorithms);
        w_text(&w, rd.keys);
        w_int(&w, rd.started);
        w_int(&w, rd.heartbeat);
        CHECK(ks_rpg_read_reader(w.res, 0, &rd2) == KS_OK && memcmp(&rd, &rd2, sizeof rd) == 0);
        PQclear(w.res);
    }
}

/* Decode every row of a metrics result and sum them as metrics_sum
 * does: oracles 1-3 (the row as ks_rpg_metrics_insert writes it; each
 * histogram re-encodes to its cell's bytes). */
static void run_sample(const shape *sh, const PGresult *res, int rows)
{
    ks_health_sample acc, one, two;
    memset(&acc, 0, sizeof acc);
    acc.time = INT64_MIN;
    for (int i = 0; i < rows; i++) {
        ks_err e = ks_rpg_read_sample(res, i, &one);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        CHECK(one.seals <= INT64_MAX && one.opens <= INT64_MAX && one.auth_failures <= INT64_MAX &&
              one.parse_errors <= INT64_MAX && one.provider_calls <= INT64_MAX &&
              one.provider_errors <= INT64_MAX && one.seal_ns_sum <= INT64_MAX &&
              one.open_ns_sum <= INT64_MAX);
        uint8_t seal[KS_RCODEC_HIST_LEN], open[KS_RCODEC_HIST_LEN];
        ks_rcodec_hist_encode(&one.seal_ns, seal);
        ks_rcodec_hist_encode(&one.open_ns, open);
        CHECK(memcmp(seal, PQgetvalue(res, i, 7), sizeof seal) == 0);
        CHECK(memcmp(open, PQgetvalue(res, i, 8), sizeof open) == 0);
        writer w = w_begin(sh);
        w_int(&w, one.time);
        w_int(&w, (int64_t)one.seals);
        w_int(&w, (int64_t)one.opens);
        w_int(&w, (int64_t)one.auth_failures);
        w_int(&w, (int64_t)one.parse_errors);
        w_int(&w, (int64_t)one.provider_calls);
        w_int(&w, (int64_t)one.provider_errors);
        w_bytes(&w, seal, sizeof seal);
        w_bytes(&w, open, sizeof open);
        w_int(&w, (int64_t)one.seal_ns_sum);
        w_int(&w, (int64_t)one.open_ns_sum);
        CHECK(ks_rpg_read_sample(w.res, 0, &two) == KS_OK && memcmp(&one, &two, sizeof one) == 0);
        PQclear(w.res);
        ks_health_add(&acc, &one);
        CHECK(acc.time >= one.time && acc.seals >= one.seals && acc.opens >= one.opens);
    }
}

/* ---- the row store's decoders --------------------------------------------------- */

/* The oid a value of v's type is written with (a NULL: bytea's). */
static Oid oid_of_value(const ks_value *v)
{
    return v->type == KS_VALUE_INTEGER ? OID_INT8
           : v->type == KS_VALUE_TEXT  ? OID_TEXT
                                       : OID_BYTEA;
}

/* The letter of the type a value of v's type is written with. */
static char letter_of_value(const ks_value *v)
{
    Oid o = oid_of_value(v);
    return o == OID_INT8 ? 'i' : o == OID_TEXT ? 't' : 'b';
}

/* Write value v as its cell. */
static void w_value(writer *w, const ks_value *v)
{
    if (v->type == KS_VALUE_INTEGER)
        w_int(w, v->integer);
    else if (v->type == KS_VALUE_NULL)
        w_bytes(w, NULL, 0);
    else
        w_bytes(w, v->bytes.len > 0 ? v->bytes.ptr : (const uint8_t *)"", v->bytes.len);
}

/* Oracle 2 for a value ks_pg_cell accepted from a column of oid `oid`. */
static void check_value(const ks_value *v, Oid oid, int len)
{
    switch (v->type) {
    case KS_VALUE_NULL:
        break;
    case KS_VALUE_INTEGER:
        CHECK(oid == OID_INT8 && len == 8);
        break;
    case KS_VALUE_TEXT:
    case KS_VALUE_BLOB:
        CHECK(oid == (v->type == KS_VALUE_TEXT ? OID_TEXT : OID_BYTEA));
        CHECK(v->bytes.ptr != NULL && v->bytes.len == (size_t)len);
        break;
    default:
        CHECK(!"a value of no known type");
    }
}

static ks_row row_a, row_b;

/* Decode every row of a scan result: oracles 1-3 (the row written back
 * with each value under its own type's oid). */
static void run_scan(const PGresult *res, int rows, size_t n_context)
{
    for (int i = 0; i < rows; i++) {
        ks_err e = ks_pg_scan_row(res, i, n_context, &row_a);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        CHECK(row_a.id.type == KS_VALUE_INTEGER);
        CHECK(row_a.quarantined == 0 || row_a.quarantined == 1);
        int qcol = 3 + (int)n_context;
        CHECK(PQgetlength(res, i, qcol) == 1 &&
              (uint8_t)PQgetvalue(res, i, qcol)[0] == (uint8_t)row_a.quarantined);
        for (int c = 0; c <= qcol; c++)
            CHECK(PQfformat(res, c) == 1);
        check_value(&row_a.value, PQftype(res, 1), PQgetlength(res, i, 1));
        check_value(&row_a.tenant, PQftype(res, 2), PQgetlength(res, i, 2));
        char types[MAX_COLS + 1];
        size_t n = 0;
        types[n++] = 'i';
        types[n++] = letter_of_value(&row_a.value);
        types[n++] = letter_of_value(&row_a.tenant);
        for (size_t j = 0; j < n_context; j++) {
            check_value(&row_a.context[j], PQftype(res, 3 + (int)j),
                        PQgetlength(res, i, 3 + (int)j));
            types[n++] = letter_of_value(&row_a.context[j]);
        }
        types[n++] = 'o';
        types[n] = '\0';
        shape back = {types, scan_names};
        writer w = w_begin(&back);
        w_value(&w, &row_a.id);
        w_value(&w, &row_a.value);
        w_value(&w, &row_a.tenant);
        for (size_t j = 0; j < n_context; j++)
            w_value(&w, &row_a.context[j]);
        uint8_t q = (uint8_t)row_a.quarantined;
        w_bytes(&w, &q, 1);
        CHECK(ks_pg_scan_row(w.res, 0, n_context, &row_b) == KS_OK);
        CHECK(value_eq(&row_a.id, &row_b.id) && value_eq(&row_a.value, &row_b.value) &&
              value_eq(&row_a.tenant, &row_b.tenant) && row_a.quarantined == row_b.quarantined);
        for (size_t j = 0; j < n_context; j++)
            CHECK(value_eq(&row_a.context[j], &row_b.context[j]));
        PQclear(w.res);
    }
}

/* Oracle 2 for an accepted checkpoint. */
static void check_checkpoint(const ks_checkpoint *cp)
{
    CHECK(cp->params.ptr != NULL && cp->state.ptr != NULL);
    CHECK(memchr(cp->params.ptr, 0, cp->params.len) == NULL &&
          memchr(cp->state.ptr, 0, cp->state.len) == NULL);
    CHECK(cp->cursor.type == KS_VALUE_NULL || cp->cursor.type == KS_VALUE_INTEGER);
    CHECK(cp->done <= INT64_MAX && cp->skipped <= INT64_MAX && cp->raced <= INT64_MAX &&
          cp->quarantined <= INT64_MAX && cp->wrong_state <= INT64_MAX);
}

/* Write a checkpoint's cells as op_checkpoint_save binds them. */
static void w_checkpoint(writer *w, const ks_checkpoint *cp)
{
    w_bytes(w, cp->params.len > 0 ? cp->params.ptr : (const uint8_t *)"", cp->params.len);
    w_bytes(w, cp->state.len > 0 ? cp->state.ptr : (const uint8_t *)"", cp->state.len);
    w_value(w, &cp->cursor);
    int64_t counts[KS_PG_CHECKPOINT_NINTS];
    ks_pg_checkpoint_ints(cp, counts);
    for (size_t i = 0; i < KS_PG_CHECKPOINT_NINTS; i++)
        w_int(w, counts[i]);
}

/* Decode every row of a checkpoint result (listed: the listing's, with
 * tbl and col): oracles 1-3. */
static void run_checkpoint(const shape *sh, const PGresult *res, int rows, int listed)
{
    for (int i = 0; i < rows; i++) {
        ks_checkpoint cp, cp2;
        ks_bytes tbl = {NULL, 0}, col = {NULL, 0}, tbl2, col2;
        ks_err e = listed ? ks_pg_read_listed(res, i, &cp, &tbl, &col)
                          : ks_pg_read_checkpoint(res, i, &cp);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        check_checkpoint(&cp);
        writer w = w_begin(sh);
        w_checkpoint(&w, &cp);
        if (listed) {
            CHECK(tbl.len >= 1 && tbl.len <= 1024 && memchr(tbl.ptr, 0, tbl.len) == NULL);
            CHECK(col.len >= 1 && col.len <= 1024 && memchr(col.ptr, 0, col.len) == NULL);
            w_bytes(&w, tbl.ptr, tbl.len);
            w_bytes(&w, col.ptr, col.len);
            CHECK(ks_pg_read_listed(w.res, 0, &cp2, &tbl2, &col2) == KS_OK);
            CHECK(bytes_eq(tbl, tbl2) && bytes_eq(col, col2));
        } else {
            CHECK(ks_pg_read_checkpoint(w.res, 0, &cp2) == KS_OK);
        }
        CHECK(checkpoint_eq(&cp, &cp2));
        PQclear(w.res);
    }
}

/* Decode the one column of a count or a swapped-ids result by
 * ks_pg_cell: oracles 1-3. */
static void run_cell(const PGresult *res, int rows)
{
    for (int i = 0; i < rows; i++) {
        ks_value v, v2;
        ks_err e = ks_pg_cell(res, i, 0, &v);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK)
            continue;
        check_value(&v, PQftype(res, 0), PQgetlength(res, i, 0));
        CHECK(PQfformat(res, 0) == 1);
        char t[2] = {letter_of_value(&v), '\0'};
        shape back = {t, scan_names};
        writer w = w_begin(&back);
        w_value(&w, &v);
        CHECK(ks_pg_cell(w.res, 0, 0, &v2) == KS_OK && value_eq(&v, &v2));
        PQclear(w.res);
    }
}

/* ---- the chunk coordinator's decoders ------------------------------------------- */

/* Nonzero when a chunk's state is one chunks.h names. */
static int chunk_state_known(ks_bytes st)
{
    static const char *const states[] = {KS_PG_CHUNK_STATES};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        if (bytes_eq(st, (ks_bytes){(const uint8_t *)states[i], strlen(states[i])}))
            return 1;
    return 0;
}

/* Decode every row of a chunk result: oracle 4 (the chunk written back
 * as the server sends CHUNK_COLS). */
static void run_chunk(const shape *sh, const PGresult *res, int rows)
{
    static const uint8_t pbytes[] = "p=1";
    const ks_bytes params = {pbytes, sizeof pbytes - 1};
    for (int i = 0; i < rows; i++) {
        ks_chunk k, k2;
        char msg[128] = "";
        ks_err e = ks_pg_read_chunk(res, i, params, &k, msg, sizeof msg);
        CHECK(e == KS_OK || e == KS_ERR_STORE);
        if (e != KS_OK) {
            check_refusal(res, msg);
            continue;
        }
        CHECK(k.cp.params.ptr == params.ptr && k.cp.params.len == params.len);
        CHECK(k.id >= 0 && k.id < (int64_t)KS_CHUNKS_MAX && k.lo <= k.hi);
        CHECK(k.cp.pass >= 1);
        CHECK(k.cp.state.ptr != NULL && chunk_state_known(k.cp.state));
        CHECK(k.owner.ptr != NULL && k.owner.len <= KS_PG_CHUNK_OWNER_MAX &&
              memchr(k.owner.ptr, 0, k.owner.len) == NULL);
        CHECK(k.cp.cursor.type == KS_VALUE_NULL ||
              (k.cp.cursor.type == KS_VALUE_INTEGER && k.cp.cursor.integer >= k.lo &&
               k.cp.cursor.integer <= k.hi));
        CHECK(k.cp.done <= INT64_MAX && k.cp.skipped <= INT64_MAX && k.cp.raced <= INT64_MAX &&
              k.cp.quarantined <= INT64_MAX && k.cp.wrong_state <= INT64_MAX);
        CHECK(k.cp.started == 0 && k.cp.updated == 0 && k.cp.finished == 0);
        CHECK(k.lease_live == 0 || k.lease_live == 1);
        int leased = k.owner.len > 0;
        CHECK(leased ? k.lease_until_ms >= 1 && bytes_eq(k.cp.state, (ks_bytes){(const uint8_t *)
                                                                               "running", 7})
                     : k.lease_until_ms == 0 && !k.lease_live);
        writer w = w_begin(sh);
        w_int(&w, k.id);
        w_int(&w, k.lo);
        w_int(&w, k.hi);
        w_bytes(&w, k.cp.state.ptr, k.cp.state.len);
        w_value(&w, &k.cp.cursor);
        const uint64_t counts[] = {k.cp.pass, k.cp.done, k.cp.skipped, k.cp.raced,
                                   k.cp.quarantined, k.cp.wrong_state};
        for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
            w_int(&w, (int64_t)counts[j]);
        w_bytes(&w, leased ? k.owner.ptr : NULL, k.owner.len);
        if (leased)
            w_int(&w, k.lease_until_ms);
        else
            w_bytes(&w, NULL, 0);
        w_bool(&w, k.lease_live);
        check_same_cells(res, i, w.res);
        CHECK(ks_pg_read_chunk(w.res, 0, params, &k2, NULL, 0) == KS_OK);
        CHECK(k.id == k2.id && k.lo == k2.lo && k.hi == k2.hi && checkpoint_eq(&k.cp, &k2.cp));
        CHECK(bytes_eq(k.owner, k2.owner) && k.lease_until_ms == k2.lease_until_ms &&
              k.lease_live == k2.lease_live);
        PQclear(w.res);
    }
}

/* Decode the summary result (one row): oracle 4. */
static void run_summary(const shape *sh, const PGresult *res)
{
    ks_chunk_summary s, s2;
    char msg[128] = "";
    ks_err e = ks_pg_read_summary(res, &s, msg, sizeof msg);
    CHECK(e == KS_OK || e == KS_ERR_STORE);
    if (e != KS_OK) {
        check_refusal(res, msg);
        return;
    }
    CHECK(s.chunks <= KS_CHUNKS_MAX && s.complete + s.leased <= s.chunks);
    CHECK(s.claimable == s.chunks - s.complete - s.leased);
    CHECK(s.done <= INT64_MAX && s.skipped <= INT64_MAX && s.raced <= INT64_MAX &&
          s.quarantined <= INT64_MAX && s.wrong_state <= INT64_MAX);
    CHECK(s.chunks > 0 ? s.max_pass >= 1
                       : s.max_pass == 0 && s.done == 0 && s.skipped == 0 && s.raced == 0 &&
                             s.quarantined == 0 && s.wrong_state == 0);
    writer w = w_begin(sh);
    const uint64_t v[] = {s.chunks, s.complete, s.leased, s.done, s.skipped,
                          s.raced, s.quarantined, s.wrong_state, s.max_pass};
    for (size_t j = 0; j < sizeof v / sizeof v[0]; j++)
        w_int(&w, (int64_t)v[j]);
    check_same_cells(res, 0, w.res);
    CHECK(ks_pg_read_summary(w.res, &s2, NULL, 0) == KS_OK);
    CHECK(memcmp(&s, &s2, sizeof s) == 0);
    PQclear(w.res);
}

/* ---- the target ------------------------------------------------------------------ */

/* The oids a perturbed column may get. */
static const Oid alt_oids[] = {OID_INT8, OID_TEXT, OID_BYTEA, OID_FLOAT8, OID_BOOL, OID_INT4, 0};

/* The type letters a scan's value, tenant and context columns may have
 * (rowstore_pg.h: bigint, bytea or text; 'o' a type the store refuses). */
static const char scan_letters[] = "bti" "o";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init_names();
    ks_fuzz_input in = {data, size, 0};
    int d = ks_fuzz_next(&in) % D_N;
    int rows = 1 + ks_fuzz_next(&in) % MAX_ROWS;
    uint8_t attr = ks_fuzz_next(&in);
    int bad_col = -1, bad_format = 0;
    Oid bad_oid = 0;
    char scan_types[MAX_COLS + 1];
    size_t n_context = 0;
    shape sh = {NULL, NULL};
    switch (d) {
    case D_ROLLOUT: sh = (shape){rollout_types, (const char *const *)names_of[d]}; break;
    case D_COLUMN: sh = (shape){column_types, (const char *const *)names_of[d]}; break;
    case D_LOG: sh = (shape){log_types, (const char *const *)names_of[d]}; break;
    case D_READER: sh = (shape){reader_types, (const char *const *)names_of[d]}; break;
    case D_SAMPLE: sh = (shape){sample_types, (const char *const *)names_of[d]}; break;
    case D_CHECKPOINT: sh = (shape){checkpoint_types, (const char *const *)names_of[d]}; break;
    case D_LISTED: sh = (shape){listed_types, (const char *const *)names_of[d]}; break;
    case D_CHUNK: sh = (shape){chunk_types, chunk_names}; break;
    case D_SUMMARY: sh = (shape){summary_types, summary_names}; rows = 1; break;
    default: { /* D_SCAN, D_CELL: the value columns' types from the input */
        size_t n = 0;
        if (d == D_SCAN) {
            n_context = ks_fuzz_next(&in) % (KS_ROWSTORE_MAX_CONTEXT_COLUMNS + 1);
            scan_types[n++] = 'i';
            for (size_t j = 0; j < 2 + n_context; j++)
                scan_types[n++] = scan_letters[ks_fuzz_next(&in) % (sizeof scan_letters - 1)];
            scan_types[n++] = 'o';
        } else {
            scan_types[n++] = scan_letters[ks_fuzz_next(&in) % (sizeof scan_letters - 1)];
        }
        scan_types[n] = '\0';
        sh = (shape){scan_types, scan_names};
        break;
    }
    }
    int ncols = (int)strlen(sh.types);
    if (attr >= 0x80) {
        uint8_t b = ks_fuzz_next(&in);
        bad_col = (attr & 0x7f) % ncols;
        bad_oid = alt_oids[(b & 0x7f) % (sizeof alt_oids / sizeof alt_oids[0])];
        bad_format = b >> 7;
    }
    PGresult *res = make_result(&sh, bad_col, bad_oid, bad_format);
    fill(res, rows, ncols, &in);
    CHECK(PQntuples(res) == rows && PQnfields(res) == ncols);
    switch (d) {
    case D_ROLLOUT: run_rollout(&sh, res, rows); break;
    case D_COLUMN: run_column(&sh, res, rows); break;
    case D_LOG: run_log(&sh, res, rows); break;
    case D_READER: run_reader(&sh, res, rows); break;
    case D_SAMPLE: run_sample(&sh, res, rows); break;
    case D_SCAN: run_scan(res, rows, n_context); break;
    case D_CHECKPOINT: run_checkpoint(&sh, res, rows, 0); break;
    case D_LISTED: run_checkpoint(&sh, res, rows, 1); break;
    case D_CELL: run_cell(res, rows); break;
    case D_CHUNK: run_chunk(&sh, res, rows); break;
    default: run_summary(&sh, res); break;
    }
    PQclear(res);
    return 0;
}
