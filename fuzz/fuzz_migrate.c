/*
 * fuzz/fuzz_migrate.c -- the migration engine (ks_migrate_run) over a small
 * SQLite database whose column values and migration parameters come from
 * the input.
 *
 * Input (docs/fuzzing.md, "fuzz_migrate"; short inputs read as zeros):
 *   byte 0  bits 0-1 mode (0: encrypt; 1: rewrap; 2: reencrypt; 3: rewrap
 *           confined to one key by from_key_id, other-key when bit 2 is
 *           set, else fuzz-key), bit 2 format 1 (else 2; for 3, the key),
 *           bit 3 AES-256-GCM (else XChaCha20),
 *           bits 4-6 batch size - 1, bit 7 no_verify (the run is
 *           always serial: the pipeline is fuzzed by fuzz_rollout)
 *   byte 1  bits 0-1 context template (TEMPLATES), bit 2 tenant column (else
 *           the constant tenant "acme"), bit 3 purpose "db.orders" (else
 *           "db.users"; format 1 has none), bits 4-5 target (TARGETS),
 *           bit 6 both a tenant column and a constant tenant, bit 7 run
 *           ks_migrate_verify afterwards
 *   byte 2  max_failure_rate: 255 the default (negative), else byte / 254
 *   byte 3  bits 0-2 after which committed batch to act (0: before the
 *           run), bits 3-5 the action (ACTIONS: stop, or make provider
 *           calls fail; 6 and 7 slice mode, below), bits 6-7 how many
 *           calls fail - 1
 *   slice mode only (byte 3's action 6 or 7; no seed before it had one):
 *   byte 4  lo, byte 5 hi: the chunk's ids, each byte % 20 - 2 (-2..17),
 *           255 the int64 extreme (lo INT64_MIN, hi INT64_MAX); lo > hi
 *           is a refused slice
 *   byte 6  the chunk's start: bits 0-1 its cursor (none, lo, 1 + bits
 *           4-7 kept within [lo, hi], hi), bits 2-3 its pass (0-3); with a
 *           cursor or a pass > 1 it has counts of its own (300 rows done
 *           in pass 3) and, past pass 1, one raced row.  For a refused
 *           slice the byte names the parameter also broken (bad_params)
 *   and byte 3 means: action 6 sets the slice's halt flag (bit 6: the
 *   stop flag instead) after batch bits 0-2 (0: never); action 7 fails
 *   save number bits 0-2 + 1 with KS_ERR_STALE; bit 7 gives the slice no
 *   halt flag (NULL)
 *   then up to MAX_ROWS rows, each a header byte: bits 0-2 the value kind
 *   (NULL, INTEGER, TEXT, BLOB, genuine envelope as BLOB / TEXT, REAL,
 *   "KSE"-prefixed BLOB), bit 3 pre-quarantined, bits 4-5 the tenant
 *   column (acme, Globex-2.x_y:z, NULL, "bad tenant"), bits 6-7 the org column
 *   (NULL, -7, "sales", x'dead'); followed by the kind's bytes (see
 *   read_row).  Row i has id i + 1.
 *
 * World (built once): libsodium's random source replaced by a fixed-seed
 * generator (as in fuzz_open.c), the in-memory provider of
 * tests/mem_provider.h (fuzz-key versions 1 and 2, 2 primary; other-key
 * version 1), and GENUINE envelopes sealed at init (with a context of
 * their own), so an input can place genuine envelopes (possibly with one
 * byte changed) in rows.
 * The database lives in SQLite's in-memory "memdb" VFS, made the default
 * (fuzz/fuzz_sqlite.h: the store opens plain paths only, no URI, no
 * SQLITE_OPEN_CREATE), under SQLite's fuzzing limits; its schema (table t
 * and keyshift's tables) is a template image built once.
 *
 * The connections and the four stores an input can ask for (with or
 * without the tenant column, with or without org as a context column)
 * are opened once and kept (fuzz/fuzz_sqlite.h), with secrets on the
 * heap (migrate/alloc_hook.h, fuzz builds): opening a store parsed the
 * schema and was half of every input.
 *
 * Per input (each independent of the ones before: the random stream is
 * rewound, the context and its caches are new, the database is the
 * template the last input's reset left): insert the rows, run the
 * migration (in slice mode one chunk of a chunked run: settled by
 * ks_engine_settle, then ks_engine_run_slice over the SQLite store's
 * visit_rows_range, saving the chunk's state through an in-memory save
 * callback, and resumed from the last saved state after a halt, a stop,
 * a failed save or the threshold, as the chunk's next owner would: the
 * path of migrate/engine/workers.c, whose coordinator is PostgreSQL's)
 * through the store of the input's target (with a cas_batch
 * made of the store's cas per row when bit 1 of the row count is set: the
 * engine's path for stores that swap a batch in one statement, as
 * PostgreSQL's does), on the calling thread (the pipeline is
 * fuzz_rollout's MIGRATE), and, after a stop, an injected
 * failure or the threshold, run it once more without either; run a census and a verify, read the rows back, then reset the database
 * to the template and check SQLite's memory (fuzz/fuzz_sqlite.h).
 *
 * Oracles (abort() on failure):
 *   1. Every ks_migrate_run result is allowed: OK, THRESHOLD, STOPPED
 *      (a stop was requested), the injected provider error, NOT_FOUND (an
 *      envelope names a key the provider lacks), INVALID_ARGUMENT (only
 *      with both a tenant column and a constant tenant).
 *   2. sqlite3_memory_used(), once the database is reset and the page
 *      caches released, equals its value before the input (unless a
 *      kept connection now holds more statements, schema or pages:
 *      fuzz/fuzz_sqlite.h), and is 0 at exit once everything is closed.
 *   3. A pre-quarantined row, and every row the run quarantined, is
 *      byte-identical to its original value.
 *   4. Every row whose value changed is a BLOB envelope at the target key
 *      and version (and, for encrypt/reencrypt, format and algorithm),
 *      opens with the row's context, tenant and purpose, and yields the
 *      original plaintext: the value itself for encrypt (an INTEGER as its
 *      decimal text, a REAL as SQLite's text), the original envelope's
 *      plaintext for rewrap and reencrypt.  The original was not one the
 *      mode must leave alone (an envelope for encrypt, plaintext for the
 *      others).
 *   5. When the last run returned OK, nothing is left to do: every
 *      non-NULL row that is not quarantined is either in the wrong state
 *      for the mode or at the target.
 *   6. The census counts every row, and the NULL ones exactly (through
 *      the store's batched scan when the input has an odd number of
 *      rows, else through visit_values); a verify (byte 1 bit 7)
 *      reports each failure through its callback once (and samples about
 *      half the rows when their number is odd).
 *   7. A TEXT row's bytes, read as a context template, give the column
 *      list ks_context_template_columns documents (check_template);
 *      ks_context_template_check agrees and points at the fault's brace,
 *      and ks_migrate_check_context refuses exactly an unstable id bound
 *      as {id} (check_template_faults); the canonical parameter string
 *      holds the template escaped as its context field
 *      (check_params_string).
 *   8. Slice mode: the settled target version is the input's; every save
 *      is of the settled migration, in a chunk's state, its cursor NULL
 *      or an id of [lo, hi], not behind the last save's in a pass, pass
 *      and counts never lower; a halt or stop ends with a batch saved
 *      "paused", a failed save with KS_ERR_STALE (its batch rolled back);
 *      progress reports the chunk's checkpoint and no row total.  After
 *      the runs, a row outside [lo, hi], or at or below the start's
 *      cursor while no later pass ran, is exactly as it was, quarantine
 *      included; the chunk's saved done and quarantined counts grew by
 *      exactly the rows changed and newly quarantined, raced not at all,
 *      and a first pass run to "complete" counted every row it decided;
 *      the migration's own checkpoint is still ks_engine_settle's.  A
 *      refused slice (lo > hi, no start, no save, no slice, a store
 *      without visit_rows_range) and invalid parameters are refused with
 *      KS_ERR_INVALID_ARGUMENT before anything is saved.
 *
 * FUZZ_MIGRATE_VERBOSE=1 (environment) prints each run's result and counts.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/crypto.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

#include "../tests/mem_provider.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "../migrate/engine/engine.h"
#include "../migrate/store/sqlite/sqlite_store.h"
#include "fuzz_check.h"
#include "fuzz_drbg.h"
#include "fuzz_input.h"
#include "fuzz_sqlite.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define MAX_ROWS 16
#define MAX_RAW 255
#define PT_CAP 4096
#define ENV_CAP 1024

/* ---- a fixed-seed random source (as in fuzz_open.c) -------------------------- */

/* The label of this harness's fixed seed (fuzz/fuzz_drbg.h). */
#define DRBG_LABEL "keyshift fuzz_migrate fixed"

/* ---- the world ----------------------------------------------------------------- */

/* What a genuine envelope is sealed with. */
typedef struct genuine_spec {
    uint8_t format;
    uint32_t alg;
    uint32_t version; /* of key */
    const char *tenant;
    const char *context;
    const char *key;
} genuine_spec;

#define X KS_ALG_XCHACHA20POLY1305
#define A KS_ALG_AES256GCM
#define FK "fuzz-key"
#define OK "other-key"
/* Indexed by the input; fuzz/migrate_seeds.py mirrors this table.  The
 * contexts are what TEMPLATES render for ids 1..4 (org "sales" for
 * "{org}/{id}"); the purpose of format 2 is "db.users". */
static const genuine_spec GENUINE[] = {
    {2, X, 1, "acme", "", FK},      {2, X, 1, "acme", "t:1", FK},   {2, X, 1, "acme", "t:2", FK},
    {2, X, 1, "acme", "t:3", FK},   {1, X, 1, "acme", "", FK},      {1, X, 1, "acme", "t:1", FK},
    {1, X, 1, "acme", "t:2", FK},   {2, X, 2, "acme", "t:1", FK},   {2, X, 1, "Globex-2.x_y:z", "t:2", FK},
    {2, X, 1, "acme", "sales/3", FK}, {2, A, 1, "acme", "t:1", FK}, {1, A, 1, "acme", "t:2", FK},
    {2, X, 1, "acme", "fixed", FK}, {2, X, 2, "acme", "", FK},      {1, X, 2, "acme", "t:4", FK},
    {2, A, 2, "acme", "t:3", FK},   {2, X, 1, "acme", "t:1", OK},
    {1, X, 1, "acme", "t:2", OK},
};
#undef X
#undef A
#undef FK
#undef OK
#define N_GENUINE (sizeof GENUINE / sizeof GENUINE[0])

/* Context templates and the context columns they use. */
static const char *const TEMPLATES[4] = {"", "t:{id}", "{org}/{id}", "fixed"};

/* Migration targets: key id and requested version (0: the primary). */
static const struct {
    const char *key;
    uint32_t version;
} TARGETS[4] = {{"fuzz-key", 0}, {"fuzz-key", 1}, {"fuzz-key", 2}, {"other-key", 0}};

/* What byte 3 asks for after a batch; the last two run the input in
 * slice mode (one chunk through ks_engine_run_slice): set the halt flag
 * (or the stop flag), or fail the chunk's save (KS_ERR_STALE, a chunk
 * another worker took over). */
enum { ACT_NONE, ACT_STOP, ACT_FAIL_UNWRAP, ACT_FAIL_WRAP, ACT_FAIL_KEY_INFO, ACT_FAIL_DENIED,
       ACT_SLICE_HALT, ACT_SLICE_STALE };

typedef struct sealed {
    uint8_t env[ENV_CAP];
    size_t env_len;
} sealed;

static ks_mem_provider mem;
static ks_ctx *ctx;          /* the input's context (the init's while sealing GENUINE) */
static sealed gen[N_GENUINE];
static uint64_t drbg_start;  /* the random stream's position at each input's start */
static int initialised;
static sqlite3 *raw;         /* the harness's connection (fuzz/fuzz_sqlite.h's keeper) */
static ks_rowstore stores[2][2]; /* by tenant column, then the org context column */

/* The database's name in the in-memory VFS (shared by every connection of
 * the process while one is open, the leading '/'). */
static const char db_path[] = "/fuzz_migrate.db";

/* Read-cache entries of a context: more than one input can use (MAX_ROWS
 * rows, each opened as found and as written), far below the default 4096,
 * whose slabs would cost more to allocate than the input to run. */
#define CACHE_ENTRIES 64

/* The context of one input (and of the init): the default configuration
 * but for CACHE_ENTRIES, fresh so that no cached DEK or memoised rewrap
 * of an earlier input changes how many provider calls this one makes. */
static void new_ctx(void)
{
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = CACHE_ENTRIES;
    ks_provider prov = ks_mem_provider_of(&mem);
    CHECK(ks_ctx_new(&prov, &cfg, &ctx) == KS_OK);
}

/* The SQLite store's operations while a batched input runs (see
 * with_cas_batch). */
static const ks_rowstore_ops *sqlite_ops;

/* A cas_batch over the SQLite store: its cas per row, in order, stopping
 * at the first error (the store has rolled back by then). */
static ks_err loop_cas_batch(void *self, size_t n, const ks_value *const *ids,
                             const ks_value *const *olds, const ks_bytes *new_values, int *swapped)
{
    for (size_t i = 0; i < n; i++) {
        ks_err err = sqlite_ops->cas(self, ids[i], olds[i], new_values[i], &swapped[i]);
        if (err != KS_OK) {
            return err;
        }
    }
    return KS_OK;
}

/* st with a cas_batch added (ops are kept in *ops): the engine then takes
 * the path of the stores that swap a whole batch in one statement
 * (PostgreSQL's), over the same SQLite database and oracles. */
static ks_rowstore with_cas_batch(ks_rowstore st, ks_rowstore_ops *ops)
{
    sqlite_ops = st.ops;
    *ops = *st.ops;
    ops->cas_batch = loop_cas_batch;
    st.ops = ops;
    return st;
}

/* Open, once, the store of t.v with (tenant_column) or without the tenant
 * column and with (context_org) or without org as a context column: every
 * target an input can ask for, kept for the whole run like the
 * connections (fuzz/fuzz_sqlite.h). */
static void open_store(int tenant_column, int context_org)
{
    static const char *const org[1] = {"org"};
    ks_rowstore_target tg = {"t",    "v", NULL, tenant_column ? "tenant" : NULL,
                             {NULL}, 0,   KS_ENCODING_BINARY};
    if (context_org) {
        tg.context_columns[0] = org[0];
        tg.n_context_columns = 1;
    }
    char eb[256];
    CHECK(ks_rowstore_sqlite_open(db_path, &tg, NULL, &stores[tenant_column][context_org], eb,
                                  sizeof eb) == KS_OK);
}

/* At exit: close the stores, then SQLite's world (fuzz/fuzz_sqlite.h
 * checks that nothing of SQLite's is left). */
static void close_stores(void)
{
    ks_fuzz_sqlite_stmts_finalize();
    for (int tc = 0; tc < 2; tc++) {
        for (int org = 0; org < 2; org++) {
            ks_rowstore_close(&stores[tc][org]);
        }
    }
    ks_fuzz_sqlite_world_end();
}

/* Build the world once. */
static void init(void)
{
    static const uint8_t kek1[32] = "fuzz_migrate kek version 1 .....";
    static const uint8_t kek2[32] = "fuzz_migrate kek version 2 .....";
    static const uint8_t kek3[32] = "fuzz_migrate other-key v1 ......";
    CHECK(ks_fuzz_drbg_install(DRBG_LABEL) == 0);
    CHECK(sodium_init() >= 0);
    ks_mem_init(&mem);
    CHECK(ks_mem_add(&mem, "fuzz-key", 1, 0, kek1) == 0);
    CHECK(ks_mem_add(&mem, "fuzz-key", 2, 1, kek2) == 0);
    CHECK(ks_mem_add(&mem, "other-key", 1, 1, kek3) == 0);
    new_ctx();
    int aes = crypto_aead_aes256gcm_is_available();
    for (size_t i = 0; i < N_GENUINE; i++) {
        const genuine_spec *g = &GENUINE[i];
        uint8_t pt[64];
        size_t pt_len = (i * 5) % 40; /* genuine 0 has an empty plaintext */
        for (size_t k = 0; k < pt_len; k++) {
            pt[k] = (uint8_t)('a' + (i + k) % 26);
        }
        ks_seal_params p = {g->format, aes ? g->alg : KS_ALG_XCHACHA20POLY1305,
                            {(const uint8_t *)g->tenant, strlen(g->tenant)},
                            {(const uint8_t *)g->key, strlen(g->key)},
                            g->version, g->format == 2 ? BV("db.users") : (ks_bytes){NULL, 0},
                            {(const uint8_t *)g->context, strlen(g->context)}};
        CHECK(ks_seal(ctx, &p, pt, pt_len, gen[i].env, sizeof gen[i].env, &gen[i].env_len) == KS_OK);
    }
    ks_ctx_free(ctx);
    ctx = NULL;
    ks_fuzz_sqlite_init();
    raw = ks_fuzz_sqlite_world_begin(db_path);
    CHECK(sqlite3_exec(raw, "CREATE TABLE t(id INTEGER PRIMARY KEY, v, tenant, org);", NULL, NULL,
                       NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(raw, ks_sqlite_schema_sql, NULL, NULL, NULL) == SQLITE_OK);
    for (int tc = 0; tc < 2; tc++) {
        for (int org = 0; org < 2; org++) {
            open_store(tc, org);
        }
    }
    ks_fuzz_sqlite_world_seal("/fuzz_migrate.tmpl");
    CHECK(atexit(close_stores) == 0);
    drbg_start = ks_fuzz_drbg_tell();
    initialised = 1;
}

/* ---- decoding ------------------------------------------------------------------ */

/* One row of the database, as inserted. */
typedef struct row {
    int64_t id;
    int type; /* SQLITE_NULL, SQLITE_INTEGER, SQLITE_TEXT, SQLITE_BLOB, SQLITE_FLOAT */
    int64_t integer;
    double real;
    uint8_t bytes[ENV_CAP];
    size_t len;
    char real_text[64]; /* SQLite's rendering of a REAL */
    int quarantined;    /* pre-quarantined by the harness */
    int tenant_kind, org_kind;
} row;

/* The decoded input. */
typedef struct world_in {
    ks_migrate_params p;
    int tenant_column, context_org;
    unsigned tmpl;
    uint32_t to_version; /* the target version, resolved */
    unsigned act_after, action, fail_count;
    row rows[MAX_ROWS];
    size_t n_rows;
    int any_quarantined;
    int verify;   /* run ks_migrate_verify after the migration */
    /* slice mode (byte 3's action ACT_SLICE_HALT or ACT_SLICE_STALE) */
    int slice;
    int64_t lo, hi;          /* the chunk's ids */
    int has_cursor;          /* the chunk's start has a cursor, start_at */
    int64_t start_at;
    uint32_t start_pass;     /* 0 (the engine makes it 1) to 3 */
    int stop_flag;           /* byte 3 bit 6: ACT_SLICE_HALT sets the stop flag, not halt */
    int no_halt;             /* byte 3 bit 7: the slice has no halt flag (NULL) */
    unsigned bad_param;      /* lo > hi: the parameter the refusals also break (the start byte) */
} world_in;

static const char *const TENANTS[4] = {"acme", "Globex-2.x_y:z", NULL, "bad tenant"};

/* Decode one row (header already read) from in. */
static void read_row(ks_fuzz_input *in, uint8_t h, row *r)
{
    r->quarantined = (h >> 3) & 1;
    r->tenant_kind = (h >> 4) & 3;
    r->org_kind = (h >> 6) & 3;
    r->len = 0;
    switch (h & 7) {
    case 0:
        r->type = SQLITE_NULL;
        break;
    case 1:
    case 6: {
        uint64_t v = 0;
        for (int k = 0; k < 8; k++) {
            v = (v << 8) | ks_fuzz_next(in);
        }
        if ((h & 7) == 1) {
            r->type = SQLITE_INTEGER;
            r->integer = (int64_t)v;
        } else {
            r->type = SQLITE_FLOAT;
            /* a finite, small-ish value: its text rendering round-trips in type */
            r->real = (double)(int32_t)(uint32_t)v / 64.0;
        }
        break;
    }
    case 2:
    case 3:
    case 7: {
        size_t len = ks_fuzz_next(in), pre = 0;
        if ((h & 7) == 7) {
            memcpy(r->bytes, "KSE", 3);
            pre = 3;
        }
        for (size_t k = 0; k < len && in->off < in->n; k++) {
            r->bytes[pre + r->len++] = ks_fuzz_next(in);
        }
        r->len += pre;
        r->type = (h & 7) == 2 ? SQLITE_TEXT : SQLITE_BLOB;
        break;
    }
    default: { /* 4, 5: a genuine envelope, maybe with one byte changed */
        const sealed *g = &gen[ks_fuzz_next(in) % N_GENUINE];
        memcpy(r->bytes, g->env, g->env_len);
        r->len = g->env_len;
        uint8_t mut = ks_fuzz_next(in);
        if (mut != 0) {
            r->bytes[(mut * 7u) % r->len] ^= ks_fuzz_next(in);
        }
        r->type = (h & 7) == 4 ? SQLITE_BLOB : SQLITE_TEXT;
        break;
    }
    }
}

/* The id of the slice bytes: 255 the extreme ext, else byte % 20 - 2
 * (-2..17: around the rows' ids 1..16). */
static int64_t slice_id(uint8_t b, int64_t ext)
{
    return b == 255 ? ext : (int64_t)(b % 20) - 2;
}

/* Decode slice mode's three bytes after byte 3 (docs/fuzzing.md): lo, hi,
 * and the chunk's start (bits 0-1 its cursor: none, lo, 1 + bits 4-7
 * within [lo, hi], hi; bits 2-3 its pass). */
static void decode_slice(ks_fuzz_input *in, uint8_t b3, world_in *w)
{
    uint8_t b4 = ks_fuzz_next(in), b5 = ks_fuzz_next(in), b6 = ks_fuzz_next(in);
    w->lo = slice_id(b4, INT64_MIN);
    w->hi = slice_id(b5, INT64_MAX);
    w->stop_flag = (b3 >> 6) & 1;
    w->no_halt = (b3 >> 7) & 1;
    w->start_pass = (b6 >> 2) & 3;
    w->has_cursor = (b6 & 3) != 0;
    int64_t mid = 1 + (b6 >> 4);
    mid = mid < w->lo ? w->lo : mid > w->hi ? w->hi : mid;
    w->start_at = (b6 & 3) == 1 ? w->lo : (b6 & 3) == 2 ? mid : w->hi;
    w->bad_param = b6;
}

/* Decode the whole input into w. */
static void decode(const uint8_t *data, size_t size, world_in *w)
{
    ks_fuzz_input in = {data, size, 0};
    uint8_t b0 = ks_fuzz_next(&in), b1 = ks_fuzz_next(&in), b2 = ks_fuzz_next(&in), b3 = ks_fuzz_next(&in);
    memset(&w->p, 0, sizeof w->p);
    static const ks_migrate_mode modes[4] = {KS_MIGRATE_ENCRYPT, KS_MIGRATE_REWRAP,
                                             KS_MIGRATE_REENCRYPT, KS_MIGRATE_REWRAP};
    w->p.mode = modes[b0 & 3];
    if ((b0 & 3) == 3) {
        w->p.from_key_id = (b0 & 4) ? BV("other-key") : BV("fuzz-key");
    }
    w->p.to_format = (b0 & 4) ? KS_FORMAT_V1 : KS_FORMAT_V2;
    w->p.algorithm = (b0 & 8) && crypto_aead_aes256gcm_is_available() ? KS_ALG_AES256GCM
                                                                       : KS_ALG_XCHACHA20POLY1305;
    w->p.batch_size = 1 + ((b0 >> 4) & 7);
    w->p.no_verify = (b0 >> 7) & 1;
    w->tmpl = b1 & 3;
    w->p.context_template = (ks_bytes){(const uint8_t *)TEMPLATES[w->tmpl], strlen(TEMPLATES[w->tmpl])};
    w->context_org = w->tmpl == 2;
    w->tenant_column = (b1 >> 2) & 1;
    if (!w->tenant_column || ((b1 >> 6) & 1)) {
        w->p.tenant = BV("acme");
    }
    w->tenant_column |= (b1 >> 6) & 1;
    w->verify = (b1 >> 7) & 1;
    if (w->p.to_format == KS_FORMAT_V2) {
        w->p.purpose = (b1 & 8) ? BV("db.orders") : BV("db.users");
    }
    unsigned t = (b1 >> 4) & 3;
    w->p.to_key_id = (ks_bytes){(const uint8_t *)TARGETS[t].key, strlen(TARGETS[t].key)};
    w->p.to_key_version = TARGETS[t].version;
    w->to_version = TARGETS[t].version != 0 ? TARGETS[t].version : t == 0 ? 2 : 1; /* the primaries */
    w->p.max_failure_rate = b2 == 255 ? -1.0 : (double)b2 / 254.0;
    w->act_after = b3 & 7;
    w->action = (b3 >> 3) & 7;
    w->fail_count = 1 + (b3 >> 6);
    w->slice = w->action == ACT_SLICE_HALT || w->action == ACT_SLICE_STALE;
    if (w->slice) {
        decode_slice(&in, b3, w);
    }
    w->n_rows = 0;
    w->any_quarantined = 0;
    while (in.off < in.n && w->n_rows < MAX_ROWS) {
        row *r = &w->rows[w->n_rows];
        r->id = (int64_t)w->n_rows + 1;
        read_row(&in, ks_fuzz_next(&in), r);
        w->any_quarantined |= r->quarantined;
        w->n_rows++;
    }
    /* serially on the calling thread: the pipeline (a helper thread
     * computing batch k + 1 while batch k commits) is fuzzed by
     * fuzz_rollout's MIGRATE, and starting and waking
     * its thread under ASan doubled the time of an input of several
     * batches here (docs/fuzzing.md, "Speed of the stateful targets") */
    w->p.serial = 1;
}

/* ---- the database -------------------------------------------------------------- */

/* keyshift's tables are created with the store's own SQL (ks_sqlite_schema_sql,
 * migrate/store/sqlite/sqlite_store.h) when the harness pre-quarantines rows. */

/* Bind the tenant (kind 0-3) or org (kind 0-3) column value. */
static void bind_extra(sqlite3_stmt *st, int col, int is_org, int kind)
{
    if (is_org) {
        switch (kind) {
        case 0: CHECK(sqlite3_bind_null(st, col) == SQLITE_OK); break;
        case 1: CHECK(sqlite3_bind_int64(st, col, -7) == SQLITE_OK); break;
        case 2: CHECK(sqlite3_bind_text(st, col, "sales", 5, SQLITE_STATIC) == SQLITE_OK); break;
        default: CHECK(sqlite3_bind_blob(st, col, "\xde\xad", 2, SQLITE_STATIC) == SQLITE_OK); break;
        }
    } else if (TENANTS[kind] == NULL) {
        CHECK(sqlite3_bind_null(st, col) == SQLITE_OK);
    } else {
        CHECK(sqlite3_bind_text(st, col, TENANTS[kind], -1, SQLITE_STATIC) == SQLITE_OK);
    }
}

/* Fill the database, as the last input's reset left it (the template:
 * table t and keyshift's tables, empty), with w's rows and the quarantine
 * entries, through the harness's connection. */
static void build_db(world_in *w)
{
    sqlite3 *db = raw;
    ks_fuzz_sqlite_run(ks_fuzz_sqlite_stmt(db, "BEGIN"));
    sqlite3_stmt *ins = ks_fuzz_sqlite_stmt(db, "INSERT INTO t(id, v, tenant, org) VALUES(?1, ?2, ?3, ?4)");
    sqlite3_stmt *q =
        ks_fuzz_sqlite_stmt(db, "INSERT INTO keyshift_quarantine(tbl, col, id, error, time) VALUES('t', 'v', ?1, 'auth-failed', 0)");
    sqlite3_stmt *rt = ks_fuzz_sqlite_stmt(db, "SELECT CAST(?1 AS TEXT)");
    for (size_t i = 0; i < w->n_rows; i++) {
        row *r = &w->rows[i];
        CHECK(sqlite3_bind_int64(ins, 1, r->id) == SQLITE_OK);
        int rc = SQLITE_OK;
        switch (r->type) {
        case SQLITE_NULL: rc = sqlite3_bind_null(ins, 2); break;
        case SQLITE_INTEGER: rc = sqlite3_bind_int64(ins, 2, r->integer); break;
        case SQLITE_FLOAT:
            rc = sqlite3_bind_double(ins, 2, r->real);
            CHECK(sqlite3_bind_double(rt, 1, r->real) == SQLITE_OK);
            CHECK(sqlite3_step(rt) == SQLITE_ROW);
            snprintf(r->real_text, sizeof r->real_text, "%s", (const char *)sqlite3_column_text(rt, 0));
            CHECK(sqlite3_reset(rt) == SQLITE_OK);
            break;
        case SQLITE_TEXT: rc = sqlite3_bind_text(ins, 2, (const char *)r->bytes, (int)r->len, SQLITE_STATIC); break;
        default: rc = sqlite3_bind_blob(ins, 2, r->bytes, (int)r->len, SQLITE_STATIC); break;
        }
        CHECK(rc == SQLITE_OK);
        bind_extra(ins, 3, 0, r->tenant_kind);
        bind_extra(ins, 4, 1, r->org_kind);
        CHECK(sqlite3_step(ins) == SQLITE_DONE);
        CHECK(sqlite3_reset(ins) == SQLITE_OK);
        if (r->quarantined) {
            CHECK(sqlite3_bind_int64(q, 1, r->id) == SQLITE_OK);
            CHECK(sqlite3_step(q) == SQLITE_DONE);
            CHECK(sqlite3_reset(q) == SQLITE_OK);
        }
    }
    ks_fuzz_sqlite_done(ins);
    ks_fuzz_sqlite_done(q);
    ks_fuzz_sqlite_done(rt);
    ks_fuzz_sqlite_run(ks_fuzz_sqlite_stmt(db, "COMMIT"));
}

/* A row's value after the run, read back by the harness. */
typedef struct final {
    int type;
    int64_t integer;
    double real;
    uint8_t *bytes; /* malloc'd copy */
    size_t len;
    int in_quarantine;
} final;

/* Read every row's value and quarantine flag into f (by id - 1), through
 * the harness's connection. */
static void read_back(const world_in *w, final *f)
{
    sqlite3 *db = raw;
    sqlite3_stmt *st = ks_fuzz_sqlite_stmt(db, "SELECT id, v, EXISTS(SELECT 1 FROM keyshift_quarantine AS q WHERE "
                                              "q.tbl = 't' AND q.col = 'v' AND q.id = t.id) FROM t ORDER BY id");
    size_t n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        CHECK(n < w->n_rows && sqlite3_column_int64(st, 0) == w->rows[n].id);
        final *x = &f[n++];
        x->type = sqlite3_column_type(st, 1);
        x->integer = sqlite3_column_int64(st, 1);
        x->real = sqlite3_column_double(st, 1);
        x->bytes = NULL;
        x->len = 0;
        if (x->type == SQLITE_TEXT || x->type == SQLITE_BLOB) {
            const void *b = x->type == SQLITE_TEXT ? (const void *)sqlite3_column_text(st, 1)
                                                   : sqlite3_column_blob(st, 1);
            x->len = (size_t)sqlite3_column_bytes(st, 1);
            x->bytes = malloc(x->len + 1);
            CHECK(x->bytes != NULL);
            if (x->len != 0) {
                memcpy(x->bytes, b, x->len);
            }
        }
        x->in_quarantine = sqlite3_column_int(st, 2);
    }
    CHECK(n == w->n_rows);
    ks_fuzz_sqlite_done(st);
}

/* ---- oracles ----------------------------------------------------------------- */

/* Nonzero when final value f is exactly original value r. */
static int unchanged(const row *r, const final *f)
{
    if (r->type != f->type) {
        return 0;
    }
    switch (r->type) {
    case SQLITE_NULL: return 1;
    case SQLITE_INTEGER: return r->integer == f->integer;
    case SQLITE_FLOAT: return memcmp(&r->real, &f->real, sizeof r->real) == 0;
    default: return r->len == f->len && (r->len == 0 || memcmp(r->bytes, f->bytes, r->len) == 0);
    }
}

/* Nonzero when original value r starts with the envelope magic. */
static int starts_kse(const row *r)
{
    return (r->type == SQLITE_TEXT || r->type == SQLITE_BLOB) && r->len >= 3 &&
           memcmp(r->bytes, "KSE", 3) == 0;
}

/* The context the engine renders for r under template tmpl. */
static size_t render(unsigned tmpl, const row *r, char *buf, size_t cap)
{
    static const char *const orgs[4] = {"", "-7", "sales", "dead"};
    switch (tmpl) {
    case 0: buf[0] = '\0'; break;
    case 1: snprintf(buf, cap, "t:%lld", (long long)r->id); break;
    case 2: snprintf(buf, cap, "%s/%lld", orgs[r->org_kind], (long long)r->id); break;
    default: snprintf(buf, cap, "fixed"); break;
    }
    return strlen(buf);
}

/* The open parameters the engine uses for row r (NULL tenant: none valid). */
static int open_params(const world_in *w, const row *r, char *cbuf, size_t cap, ks_open_params *op)
{
    ks_bytes tenant = w->p.tenant;
    if (tenant.len == 0) {
        const char *t = TENANTS[r->tenant_kind];
        if (t == NULL || strchr(t, ' ') != NULL) {
            return 0;
        }
        tenant = (ks_bytes){(const uint8_t *)t, strlen(t)};
    }
    size_t clen = render(w->tmpl, r, cbuf, cap);
    *op = (ks_open_params){{(const uint8_t *)cbuf, clen}, tenant, w->p.purpose};
    return 1;
}

/* op for opening the envelope b[0, n): the purpose only for format 2, as
 * the engine expects it (format 1 has none; docs/migration.md). */
static ks_open_params for_env(ks_open_params op, const uint8_t *b, size_t n)
{
    if (!(n > 3 && b[3] == KS_FORMAT_V2)) {
        op.purpose = (ks_bytes){NULL, 0};
    }
    return op;
}

/* Nonzero when the original value r is outside the run's key filter
 * (from_key_id): not an envelope, or one whose header names another
 * key.  Restated here rather than shared with the engine, so that the
 * oracle stays independent of the code it checks. */
static int outside_filter(const world_in *w, const row *r)
{
    if (w->p.from_key_id.len == 0) {
        return 0;
    }
    ks_envelope h;
    if (!starts_kse(r)) {
        return 1;
    }
    if (ks_envelope_parse_header(r->bytes, r->len, NULL, &h, NULL) != KS_OK) {
        return 0; /* no key to judge by: treated as any malformed value */
    }
    return h.key_id.len != w->p.from_key_id.len ||
           memcmp(h.key_id.ptr, w->p.from_key_id.ptr, h.key_id.len) != 0;
}

/* Oracle 4 for one changed row. */
static void check_changed(const world_in *w, const row *r, const final *f, uint32_t to_version)
{
    static uint8_t pt[PT_CAP], pt0[PT_CAP];
    CHECK(f->type == SQLITE_BLOB);
    CHECK(!f->in_quarantine);
    CHECK(!outside_filter(w, r)); /* another key's value is never changed */
    ks_envelope e;
    CHECK(ks_envelope_parse(f->bytes, f->len, NULL, &e, NULL) == KS_OK);
    CHECK(e.key_id.len == w->p.to_key_id.len && memcmp(e.key_id.ptr, w->p.to_key_id.ptr, e.key_id.len) == 0);
    CHECK(e.key_version == to_version);
    if (w->p.mode != KS_MIGRATE_REWRAP) {
        CHECK(e.version == w->p.to_format && e.algorithm == w->p.algorithm);
    }
    char cbuf[128];
    ks_open_params op;
    CHECK(open_params(w, r, cbuf, sizeof cbuf, &op));
    size_t pt_len = 0, pt0_len = 0;
    ks_open_params opf = for_env(op, f->bytes, f->len), op0 = for_env(op, r->bytes, r->len);
    ks_err err = ks_open(ctx, f->bytes, f->len, &opf, pt, sizeof pt, &pt_len, NULL);
    if (w->p.mode == KS_MIGRATE_REWRAP && w->p.no_verify) {
        /* rewrap without verification: opens exactly when the original did */
        CHECK(starts_kse(r));
        ks_err err0 = ks_open(ctx, r->bytes, r->len, &op0, pt0, sizeof pt0, &pt0_len, NULL);
        CHECK((err == KS_OK) == (err0 == KS_OK));
        CHECK(err != KS_OK || (pt_len == pt0_len && (pt_len == 0 || memcmp(pt, pt0, pt_len) == 0)));
        return;
    }
    CHECK(err == KS_OK);
    const uint8_t *want;
    size_t want_len;
    char num[32];
    if (w->p.mode == KS_MIGRATE_ENCRYPT) {
        CHECK(!starts_kse(r) && r->type != SQLITE_NULL);
        if (r->type == SQLITE_INTEGER) {
            snprintf(num, sizeof num, "%lld", (long long)r->integer);
            want = (const uint8_t *)num;
            want_len = strlen(num);
        } else if (r->type == SQLITE_FLOAT) {
            want = (const uint8_t *)r->real_text;
            want_len = strlen(r->real_text);
        } else {
            want = r->bytes;
            want_len = r->len;
        }
    } else {
        CHECK(starts_kse(r));
        CHECK(ks_open(ctx, r->bytes, r->len, &op0, pt0, sizeof pt0, &pt0_len, NULL) == KS_OK);
        want = pt0;
        want_len = pt0_len;
    }
    CHECK(pt_len == want_len && (want_len == 0 || memcmp(pt, want, want_len) == 0));
}

/* Oracle 5 for one unchanged, non-quarantined, non-NULL row after OK. */
static void check_left(const world_in *w, const row *r, uint32_t to_version)
{
    ks_envelope e;
    int env = starts_kse(r);
    if (w->p.mode == KS_MIGRATE_ENCRYPT) {
        /* plaintext must have been sealed (or quarantined); envelopes stay */
        CHECK(env);
        CHECK(ks_envelope_parse(r->bytes, r->len, NULL, &e, NULL) == KS_OK);
        return;
    }
    if (!env || outside_filter(w, r)) {
        return; /* wrong state (plaintext) or another key's: untouched */
    }
    CHECK(ks_envelope_parse(r->bytes, r->len, NULL, &e, NULL) == KS_OK);
    CHECK(e.key_id.len == w->p.to_key_id.len && memcmp(e.key_id.ptr, w->p.to_key_id.ptr, e.key_id.len) == 0);
    CHECK(e.key_version == to_version);
    if (w->p.mode == KS_MIGRATE_REENCRYPT) {
        CHECK(e.version == w->p.to_format && e.algorithm == w->p.algorithm);
    }
}

/* ---- the run ------------------------------------------------------------------- */

/* What the save callback of a slice-mode input saw (slice_save): the
 * chunk's start, and the last checkpoint it took (its transaction then
 * committed: nothing fails after a save but a COMMIT, which the memory
 * database never fails, and the run would return that failure). */
typedef struct slice_run {
    const world_in *w;
    ks_engine_settled settled; /* the migration's, from ks_engine_settle */
    ks_checkpoint start;       /* the chunk's state before the first run */
    ks_checkpoint last;        /* the last save taken (valid when saved) */
    char last_state[16];       /* its state's bytes */
    int saved;
    unsigned calls;            /* save calls in this run */
    unsigned fail_at;          /* the call that fails with KS_ERR_STALE (0: none) */
    uint32_t max_pass;         /* the highest pass saved */
} slice_run;

/* Progress state: which batch we are at and what to do. */
typedef struct prog {
    const world_in *w;
    unsigned batches;
    volatile sig_atomic_t stop;
    ks_err injected; /* the error made to happen, or KS_OK */
    const slice_run *sr; /* slice mode: the chunk's record; else NULL */
    atomic_int *halt;    /* slice mode: the slice's halt flag, or NULL */
    int halted;          /* the halt flag was set */
} prog;

/* Arm byte 3's action (stop or a provider failure). */
static void act(prog *pr)
{
    const world_in *w = pr->w;
    switch (w->action) {
    case ACT_STOP: pr->stop = 1; break;
    case ACT_FAIL_UNWRAP:
        ks_mem_fail(&mem, KS_MEM_UNWRAP, KS_ERR_UNAVAILABLE, w->fail_count);
        pr->injected = KS_ERR_UNAVAILABLE;
        break;
    case ACT_FAIL_WRAP:
        ks_mem_fail(&mem, KS_MEM_WRAP, KS_ERR_TIMEOUT, w->fail_count);
        pr->injected = KS_ERR_TIMEOUT;
        break;
    case ACT_FAIL_KEY_INFO:
        ks_mem_fail(&mem, KS_MEM_KEY_INFO, KS_ERR_UNAVAILABLE, w->fail_count);
        pr->injected = KS_ERR_UNAVAILABLE;
        break;
    case ACT_FAIL_DENIED:
        ks_mem_fail(&mem, KS_MEM_UNWRAP, KS_ERR_DENIED, w->fail_count);
        pr->injected = KS_ERR_DENIED;
        break;
    case ACT_SLICE_HALT: /* another worker's failure, or the caller's stop */
        if (w->stop_flag) {
            pr->stop = 1;
        } else if (pr->halt != NULL) {
            atomic_store(pr->halt, 1);
            pr->halted = 1;
        }
        break;
    default: break;
    }
}

/* Nonzero when v may be a chunk's cursor: NULL (a pass not begun) or an
 * INTEGER id of the slice. */
static int cursor_in_slice(const world_in *w, const ks_value *v)
{
    return v->type == KS_VALUE_NULL ||
           (v->type == KS_VALUE_INTEGER && v->integer >= w->lo && v->integer <= w->hi);
}

/* Progress callback: act after the chosen committed batch.  In slice
 * mode (oracle 8) the checkpoint is the chunk's and the table is never
 * counted. */
static void on_progress(void *arg, const ks_migrate_progress *p)
{
    prog *pr = arg;
    if (pr->sr != NULL) {
        CHECK(p->total_rows == 0 && cursor_in_slice(pr->w, &p->checkpoint->cursor));
    }
    if (p->batch_rows != 0 && ++pr->batches == pr->w->act_after) {
        act(pr);
    }
}

/* Oracle 1: err is an allowed result of a run. */
static void check_result(const world_in *w, const prog *pr, ks_err err)
{
    if (getenv("FUZZ_MIGRATE_VERBOSE") != NULL) {
        fprintf(stderr, "fuzz_migrate: ks_migrate_run: %s\n", ks_err_name(err));
    }
    CHECK(err == KS_OK || err == KS_ERR_THRESHOLD || err == KS_ERR_NOT_FOUND ||
          (err == KS_ERR_STOPPED && (pr->stop || pr->halted)) ||
          (pr->injected != KS_OK && err == pr->injected) ||
          (err == KS_ERR_INVALID_ARGUMENT && w->tenant_column && w->p.tenant.len != 0));
}

/* Clear every injected provider failure. */
static void clear_faults(void)
{
    ks_mem_fail(&mem, KS_MEM_WRAP, KS_OK, 0);
    ks_mem_fail(&mem, KS_MEM_UNWRAP, KS_OK, 0);
    ks_mem_fail(&mem, KS_MEM_KEY_INFO, KS_OK, 0);
}

/* ks_migrate_verify's failure callback: count the failures in *arg. */
static void on_verify_failure(void *arg, const ks_verify_failure *f)
{
    CHECK(f->id.type == KS_VALUE_INTEGER && f->id.integer >= 1);
    (*(uint64_t *)arg)++;
}

/* Print a run's counts (FUZZ_MIGRATE_VERBOSE). */
static void print_counts(const ks_checkpoint *cp)
{
    if (getenv("FUZZ_MIGRATE_VERBOSE") != NULL) {
        fprintf(stderr, "fuzz_migrate: done %llu skipped %llu quarantined %llu wrong_state %llu\n",
                (unsigned long long)cp->done, (unsigned long long)cp->skipped,
                (unsigned long long)cp->quarantined, (unsigned long long)cp->wrong_state);
    }
}

/* Migrate the whole table with ks_migrate_run (twice when the first run
 * was interrupted); returns the last run's result. */
static ks_err run_whole(const world_in *w, const ks_rowstore *st)
{
    prog pr = {w, 0, 0, KS_OK, NULL, NULL, 0};
    if (w->act_after == 0) {
        act(&pr);
    }
    ks_checkpoint cp;
    ks_err err = ks_migrate_run(ctx, st, &w->p, &pr.stop, on_progress, &pr, &cp);
    check_result(w, &pr, err);
    clear_faults();
    if (err == KS_ERR_STOPPED || err == KS_ERR_THRESHOLD || (pr.injected != KS_OK && err == pr.injected)) {
        prog pr2 = {w, 0, 0, KS_OK, NULL, NULL, 0};
        err = ks_migrate_run(ctx, st, &w->p, &pr2.stop, NULL, NULL, &cp);
        check_result(w, &pr2, err);
    }
    print_counts(&cp);
    return err;
}

/* Nonzero when count a is at least count b in every field (a chunk's
 * counts never go down). */
static int counts_ge(const ks_checkpoint *a, const ks_checkpoint *b)
{
    return a->done >= b->done && a->skipped >= b->skipped && a->raced >= b->raced &&
           a->quarantined >= b->quarantined && a->wrong_state >= b->wrong_state;
}

/* Nonzero when state is s. */
static int state_is(ks_bytes state, const char *s)
{
    return state.len == strlen(s) && memcmp(state.ptr, s, state.len) == 0;
}

/* The pass a chunk's start runs in (the engine makes pass 0 the first). */
static uint32_t start_pass(const slice_run *sr)
{
    return sr->start.pass == 0 ? 1 : sr->start.pass;
}

/* The slice's save callback (oracle 8): the checkpoint is the settled
 * migration's, its state one a chunk may have, its cursor in the slice
 * and not behind the last save's in the same pass, its pass and counts
 * not below the last save's (or the start's), its start the chunk's.
 * The call numbered fail_at fails with KS_ERR_STALE (the engine must roll
 * its batch back); any other is kept as the chunk's state. */
static ks_err slice_save(void *arg, const ks_checkpoint *cp)
{
    slice_run *sr = arg;
    const world_in *w = sr->w;
    CHECK(cp->params.len == sr->settled.params_len &&
          memcmp(cp->params.ptr, sr->settled.params, cp->params.len) == 0);
    CHECK(state_is(cp->state, "running") || state_is(cp->state, "paused") ||
          state_is(cp->state, "stopped") || state_is(cp->state, "complete"));
    CHECK(cursor_in_slice(w, &cp->cursor));
    const ks_checkpoint *prev = sr->saved ? &sr->last : &sr->start;
    uint32_t prev_pass = prev->pass == 0 ? 1 : prev->pass;
    CHECK(cp->pass >= prev_pass && counts_ge(cp, prev) && cp->started == sr->start.started);
    if (cp->pass == prev_pass && cp->cursor.type == KS_VALUE_INTEGER &&
        prev->cursor.type == KS_VALUE_INTEGER) {
        CHECK(cp->cursor.integer >= prev->cursor.integer);
    }
    if (++sr->calls == sr->fail_at) {
        return KS_ERR_STALE;
    }
    CHECK(cp->state.len < sizeof sr->last_state);
    sr->last = *cp;
    memcpy(sr->last_state, cp->state.ptr, cp->state.len);
    sr->last.state = (ks_bytes){(const uint8_t *)sr->last_state, cp->state.len};
    sr->last.params = (ks_bytes){NULL, 0}; /* the engine's view: checked above */
    sr->saved = 1;
    sr->max_pass = cp->pass > sr->max_pass ? cp->pass : sr->max_pass;
    return KS_OK;
}

/* The chunk's state before the first run, from the input: its cursor (or
 * none), its pass and, when it is a resumed chunk, counts of its own. */
static void slice_start(const world_in *w, slice_run *sr)
{
    ks_checkpoint *c = &sr->start;
    memset(c, 0, sizeof *c);
    c->state = BV("running");
    c->cursor = (ks_value){w->has_cursor ? KS_VALUE_INTEGER : KS_VALUE_NULL,
                           w->has_cursor ? w->start_at : 0, {NULL, 0}};
    c->pass = w->start_pass;
    if (w->has_cursor || w->start_pass > 1) {
        /* raced in a later pass resumed mid-way: the engine then runs one
         * more; pass 3 starts with enough rows done for the threshold to
         * be checked after every batch, not only at the end of the pass */
        *c = (ks_checkpoint){c->params, c->state, c->cursor, c->pass,
                             w->start_pass == 3 ? 300 : 3, 2, w->start_pass > 1, 0, 4, 1000,
                             1000, 0};
    }
    c->started = 1000;
    sr->max_pass = start_pass(sr);
}

/* w's parameters with the one the input names (kind % 16) made invalid,
 * each a different rule of the engine's check (15: none broken, the
 * context missing instead; *no_ctx set). */
static ks_migrate_params bad_params(const world_in *w, unsigned kind, int *no_ctx)
{
    static const char long_name[KS_CONTEXT_TEMPLATE_MAX + 1] = {0};
    ks_bytes too_long_id = {(const uint8_t *)long_name, KS_KEY_ID_MAX + 1};
    ks_migrate_params p = w->p;
    *no_ctx = 0;
    if (kind % 16 >= 11) { /* the rules of the modes that seal */
        p.mode = KS_MIGRATE_REENCRYPT;
        p.from_key_id = (ks_bytes){NULL, 0};
    }
    switch (kind % 16) {
    case 0: p.mode = (ks_migrate_mode)99; break;
    case 1: p.to_key_id = (ks_bytes){NULL, 0}; break;
    case 2: p.to_key_id = too_long_id; break;
    case 3: p.context_template = (ks_bytes){(const uint8_t *)long_name, sizeof long_name}; break;
    case 4: p.tenant = BV("bad tenant"); break;
    case 5: p.purpose = BV("bad purpose"); break;
    case 6: p.batch_size = 100001; break;
    case 7: p.max_failure_rate = 2.0; break;
    case 8: p.from_key_id = too_long_id; break;
    case 9: p.from_key_id = (ks_bytes){NULL, 3}; break;
    case 10: p.mode = KS_MIGRATE_ENCRYPT; p.from_key_id = BV("fuzz-key"); break;
    case 11: p.to_format = 7; break;
    case 12: p.algorithm = 99; break;
    case 13: p.to_format = KS_FORMAT_V2; p.purpose = (ks_bytes){NULL, 0}; break;
    case 14: p.to_format = KS_FORMAT_V1; p.purpose = BV("db.users"); break;
    default: *no_ctx = 1; break;
    }
    return p;
}

/* A slice with lo > hi and every other bad argument is refused before
 * anything is read or saved (oracle 8), and so are parameters the input
 * makes invalid, by ks_migrate_run, ks_engine_settle and the slice run. */
static void check_refusals(const world_in *w, const ks_rowstore *st, slice_run *sr)
{
    ks_engine_slice bad = {w->lo, w->hi, sr->settled.to_version, &sr->start, slice_save, sr, NULL, NULL};
    CHECK(ks_engine_run_slice(ctx, st, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    bad.lo = w->hi;
    bad.hi = w->lo;
    bad.start = NULL;
    CHECK(ks_engine_run_slice(ctx, st, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    bad.start = &sr->start;
    bad.save = NULL;
    CHECK(ks_engine_run_slice(ctx, st, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_engine_run_slice(ctx, st, &w->p, NULL, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    bad.save = slice_save;
    ks_rowstore_ops no_range = *st->ops;
    no_range.visit_rows_range = NULL;
    ks_rowstore nr = *st;
    nr.ops = &no_range;
    CHECK(ks_engine_run_slice(ctx, &nr, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    nr.ops = NULL;
    CHECK(ks_engine_run_slice(ctx, &nr, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_engine_run_slice(ctx, NULL, &w->p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    int no_ctx;
    ks_migrate_params p = bad_params(w, w->bad_param, &no_ctx);
    ks_ctx *c = no_ctx ? NULL : ctx;
    ks_engine_settled settled;
    CHECK(ks_migrate_run(c, st, &p, NULL, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_engine_settle(c, st, &p, &settled) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_engine_run_slice(c, st, &p, &bad, NULL, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(sr->calls == 0);
}

/* Slice mode: settle the migration as workers.c does, run the input's
 * chunk through ks_engine_run_slice with the input's halt or save
 * failure, and, when that run was interrupted, once more from the chunk's
 * last saved state (as the chunk's next owner would); returns the last
 * run's result. */
static ks_err run_slices(const world_in *w, const ks_rowstore *st, slice_run *sr)
{
    memset(sr, 0, sizeof *sr);
    sr->w = w;
    slice_start(w, sr);
    ks_err err = ks_engine_settle(ctx, st, &w->p, &sr->settled);
    prog pr = {w, 0, 0, KS_OK, sr, NULL, 0};
    if (err != KS_OK) {
        check_result(w, &pr, err);
        return err;
    }
    CHECK(!sr->settled.complete && sr->settled.to_version == w->to_version);
    if (w->lo > w->hi) {
        check_refusals(w, st, sr);
        return KS_ERR_INVALID_ARGUMENT;
    }
    atomic_int halt;
    atomic_init(&halt, 0);
    pr.halt = w->no_halt ? NULL : &halt;
    sr->fail_at = w->action == ACT_SLICE_STALE ? w->act_after + 1 : 0;
    pr.injected = sr->fail_at != 0 ? KS_ERR_STALE : KS_OK;
    /* ACT_SLICE_HALT after batch 0 never halts: on_progress counts from 1 */
    ks_engine_slice sl = {w->lo, w->hi, sr->settled.to_version, &sr->start, slice_save, sr, pr.halt, NULL};
    err = ks_engine_run_slice(ctx, st, &w->p, &sl, &pr.stop, on_progress, &pr);
    check_result(w, &pr, err);
    CHECK(err != KS_ERR_STALE || sr->calls == sr->fail_at);
    /* a halt or stop commits its batch "paused" */
    CHECK(err != KS_ERR_STOPPED || (sr->saved && state_is(sr->last.state, "paused")));
    if ((err == KS_ERR_STOPPED || err == KS_ERR_STALE || err == KS_ERR_THRESHOLD) &&
        !(sr->saved && state_is(sr->last.state, "complete"))) {
        ks_checkpoint from = sr->saved ? sr->last : sr->start;
        prog pr2 = {w, 0, 0, KS_OK, sr, NULL, 0};
        sr->calls = 0;
        sr->fail_at = 0;
        sl.start = &from;
        sl.halt = NULL;
        err = ks_engine_run_slice(ctx, st, &w->p, &sl, &pr2.stop, NULL, NULL);
        check_result(w, &pr2, err);
    }
    /* every save went to the chunk: the migration's own checkpoint is as
     * ks_engine_settle left it */
    ks_checkpoint cp;
    CHECK(st->ops->checkpoint_load(st->self, (ks_bytes){(const uint8_t *)sr->settled.params,
                                                        sr->settled.params_len},
                                   &cp) == KS_OK);
    CHECK(state_is(cp.state, "running") && cp.done == 0 && cp.cursor.type == KS_VALUE_NULL);
    print_counts(sr->saved ? &sr->last : &sr->start);
    return err;
}

/* Migrate (run_whole, or run_slices in slice mode: sr its record), run a
 * census (oracle 6) and a verify; returns the last run's result. */
static ks_err migrate(const world_in *w, slice_run *sr)
{
    ks_rowstore st = stores[w->tenant_column != 0][w->context_org != 0];
    ks_rowstore_ops batched_ops;
    if ((w->n_rows >> 1) & 1) {
        st = with_cas_batch(st, &batched_ops);
    }
    ks_err err = w->slice ? run_slices(w, &st, sr) : run_whole(w, &st);
    uint64_t nulls = 0;
    for (size_t i = 0; i < w->n_rows; i++) {
        nulls += w->rows[i].type == SQLITE_NULL; /* no mode ever writes NULL */
    }
    /* an odd row count takes the census through the batched scan (the
     * path of stores without visit_values), an even one through
     * visit_values: the counts are the same either way */
    ks_rowstore_ops scan_ops = *st.ops;
    scan_ops.visit_values = NULL;
    ks_rowstore scan_st = st;
    scan_st.ops = &scan_ops;
    ks_census census;
    CHECK(ks_census_run(w->n_rows % 2 ? &scan_st : &st, &census) == KS_OK);
    CHECK(census.rows == w->n_rows && census.null_rows == nulls);
    ks_census_free(&census);
    if (w->verify) {
        /* an odd row count samples about half the rows (the fixed-seed
         * random stream picks them); every failure is reported once */
        ks_verify_result vr;
        uint64_t failures = 0, sample = w->n_rows % 2 ? (w->n_rows + 1) / 2 : 0;
        ks_err verr = ks_migrate_verify(ctx, &st, &w->p, sample, on_verify_failure, &failures, &vr);
        CHECK(verr == KS_OK || verr == KS_ERR_INVALID_ARGUMENT);
        CHECK(verr != KS_OK || (failures == vr.failed && vr.checked + vr.skipped <= w->n_rows));
    }
    return err;
}

/* Nonzero when a slice run may touch row r: its id in [lo, hi] and not
 * at or below the start's cursor, unless a later pass rescanned them. */
static int slice_may_touch(const world_in *w, const slice_run *sr, const row *r)
{
    if (r->id < w->lo || r->id > w->hi) {
        return 0;
    }
    return !w->has_cursor || r->id > w->start_at || sr->max_pass > start_pass(sr);
}

/* Oracle 8 after a slice run: the chunk's last saved counts (or its
 * start's) grew by exactly the rows changed and newly quarantined, never
 * raced (nothing writes beside the run), and, for a first pass run to
 * completion, by every row of it the engine had to decide (not NULL, not
 * quarantined before). */
static void check_slice_counts(const slice_run *sr, uint64_t changed, uint64_t newly_q,
                               uint64_t decided)
{
    const ks_checkpoint *s = &sr->start, *f = sr->saved ? &sr->last : &sr->start;
    CHECK(f->done - s->done == changed && f->quarantined - s->quarantined == newly_q);
    CHECK(f->raced == s->raced);
    if (state_is(f->state, "complete") && start_pass(sr) == 1 && sr->max_pass == 1) {
        uint64_t d = (f->done - s->done) + (f->skipped - s->skipped) +
                     (f->quarantined - s->quarantined) + (f->wrong_state - s->wrong_state);
        CHECK(d == decided);
    }
}

/* Oracles 3-5 over the rows read back after the run, and in slice mode
 * (sr not NULL) oracle 8: a row the slice may not touch is exactly as it
 * was, quarantine included, and the chunk's counts add up. */
static void check_rows(const world_in *w, ks_err last, const slice_run *sr)
{
    static final f[MAX_ROWS];
    uint64_t changed = 0, newly_q = 0, decided = 0;
    read_back(w, f);
    for (size_t i = 0; i < w->n_rows; i++) {
        const row *r = &w->rows[i];
        const final *x = &f[i];
        if (r->quarantined) {
            CHECK(x->in_quarantine);
        }
        newly_q += x->in_quarantine && !r->quarantined;
        if (sr != NULL && !slice_may_touch(w, sr, r)) {
            CHECK(unchanged(r, x) && x->in_quarantine == r->quarantined);
            free(x->bytes);
            continue;
        }
        decided += !r->quarantined && r->type != SQLITE_NULL;
        if (unchanged(r, x)) {
            if (last == KS_OK && !x->in_quarantine && r->type != SQLITE_NULL) {
                check_left(w, r, w->to_version);
            }
        } else {
            CHECK(!r->quarantined);
            check_changed(w, r, x, w->to_version);
            changed++;
        }
        free(x->bytes);
    }
    if (sr != NULL) {
        check_slice_counts(sr, changed, newly_q, decided);
    }
}

/* Whether well-formed template t[0, len) binds {id}: a reference scan of
 * the grammar ("{{" and "}}" are literal braces, "{name}" a placeholder). */
static int binds_id(const uint8_t *t, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (i + 1 < len && (t[i] == '{' || t[i] == '}') && t[i + 1] == t[i]) {
            i += 2;
        } else if (t[i] == '{') {
            size_t j = i + 1;
            while (j < len && t[j] != '}') {
                j++;
            }
            if (j - i - 1 == 2 && t[i + 1] == 'i' && t[i + 2] == 'd') {
                return 1;
            }
            i = j + 1;
        } else {
            i++;
        }
    }
    return 0;
}

/* Oracle 7b: ks_context_template_check agrees with the compile and
 * points at the fault: the "{" or "}" it concerns, or the limit for a
 * template past it; ks_migrate_check_context refuses exactly the
 * well-formed templates that bind {id} to an unstable id. */
static void check_template_faults(const row *r, ks_err compiled)
{
    size_t off = 99;
    const char *why = "unset";
    ks_bytes t = {r->bytes, r->len};
    CHECK(ks_context_template_check(t, &off, &why) == compiled);
    if (compiled != KS_OK) {
        CHECK(why != NULL);
        if (r->len > KS_CONTEXT_TEMPLATE_MAX) {
            CHECK(off == KS_CONTEXT_TEMPLATE_MAX);
        } else {
            CHECK(off < r->len && (r->bytes[off] == '{' || r->bytes[off] == '}'));
        }
    } else {
        CHECK(off == 0 && why == NULL);
    }
    ks_rowstore st;
    memset(&st, 0, sizeof st);
    for (int stable = 0; stable <= 1; stable++) {
        st.id_stable = stable;
        ks_err want = compiled != KS_OK                      ? compiled
                      : !stable && binds_id(r->bytes, r->len) ? KS_ERR_UNSTABLE_ID
                                                               : KS_OK;
        CHECK(ks_migrate_check_context(&st, t) == want);
    }
}

/* The value of hex digit c (uppercase), or -1. */
static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Oracle 7c: with a TEXT row's bytes as its context template, the
 * migration's canonical parameter string escapes every ';' and '%' of a
 * value (so its fields are its ';'s), holds the template as its last
 * field but the encoding's, unescaped back to the same bytes, adds
 * exactly "encoding=base64;" for a base64 column, and never writes past a
 * short buffer. */
static void check_params_string(const world_in *w, const row *r)
{
    static char bin[8 * KS_CONTEXT_TEMPLATE_MAX], b64[8 * KS_CONTEXT_TEMPLATE_MAX];
    ks_migrate_params p = w->p;
    p.context_template = (ks_bytes){r->bytes, r->len};
    size_t n = 0, m = 0;
    p.encoding = KS_ENCODING_BINARY;
    if (ks_migrate_canonical_params(&p, 1, bin, sizeof bin, &n) != KS_OK) {
        return; /* parameters the engine refuses before any string */
    }
    p.encoding = KS_ENCODING_BASE64;
    CHECK(ks_migrate_canonical_params(&p, 1, b64, sizeof b64, &m) == KS_OK);
    CHECK(n == strlen(bin) && m == n + strlen("encoding=base64;") && memcmp(b64, bin, n) == 0 &&
          strcmp(b64 + n, "encoding=base64;") == 0);
    char short_buf[64];
    size_t cap = n < sizeof short_buf ? n : sizeof short_buf, k = 0;
    CHECK(ks_migrate_canonical_params(&p, 1, short_buf, cap, &k) == KS_ERR_BUFFER_TOO_SMALL &&
          k < cap);
    /* The context field: between the last two ';' of the binary string. */
    CHECK(n >= 2 && bin[n - 1] == ';');
    size_t start = n - 1;
    while (start > 0 && bin[start - 1] != ';') {
        start--;
    }
    CHECK(strncmp(bin + start, "context=", 8) == 0);
    size_t j = 0;
    for (size_t i = start + 8; i < n - 1; j++) {
        CHECK(bin[i] != '%' || (i + 2 < n && hex_value(bin[i + 1]) >= 0 && hex_value(bin[i + 2]) >= 0));
        int c = bin[i] == '%' ? hex_value(bin[i + 1]) * 16 + hex_value(bin[i + 2]) : (uint8_t)bin[i];
        i += bin[i] == '%' ? 3 : 1;
        CHECK(j < r->len && c == r->bytes[j]);
    }
    CHECK(j == r->len);
}

/* Oracle 7: a TEXT row's bytes, read as a context template, list their
 * columns as ks_context_template_columns documents: none on an error;
 * else distinct, non-empty names other than "id", each in the template
 * as "{name}". */
static void check_template(const row *r)
{
    const char *names[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
    static char storage[KS_CONTEXT_TEMPLATE_MAX];
    size_t n = 99;
    ks_err err = ks_context_template_columns((ks_bytes){r->bytes, r->len}, names, storage, &n);
    CHECK(err == KS_OK || err == KS_ERR_INVALID_ARGUMENT);
    check_template_faults(r, err);
    if (err != KS_OK) {
        CHECK(n == 0);
        return;
    }
    CHECK(n <= KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        CHECK(len != 0 && len + 2 <= r->len && strcmp(names[i], "id") != 0);
        int found = 0;
        for (size_t k = 0; !found && k + len + 2 <= r->len; k++) {
            found = r->bytes[k] == '{' && r->bytes[k + len + 1] == '}' &&
                    memcmp(r->bytes + k + 1, names[i], len) == 0;
        }
        CHECK(found);
        for (size_t j = 0; j < i; j++) {
            CHECK(strcmp(names[i], names[j]) != 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static world_in w;
    static slice_run sr;
    if (!initialised) {
        init();
    }
    ks_fuzz_drbg_seek(drbg_start);
    clear_faults();
    new_ctx();
    decode(data, size, &w);
    for (size_t i = 0; i < w.n_rows; i++) {
        if (w.rows[i].type == SQLITE_TEXT) {
            check_template(&w.rows[i]);
            check_params_string(&w, &w.rows[i]);
        }
    }
    build_db(&w);
    ks_err last = migrate(&w, &sr);
    check_rows(&w, last, w.slice ? &sr : NULL);
    ks_fuzz_sqlite_world_check(); /* oracle 2, and the reset for the next input */
    ks_ctx_free(ctx);
    ctx = NULL;
    return 0;
}
