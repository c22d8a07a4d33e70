/*
 * fuzz/fuzz_rollout.c -- property fuzzing of rollouts: the input is a
 * sequence of operations run against the REAL state machine (ks_rollout_db
 * transitions and guards, the application policy, the migration engine,
 * the destroy guard) over one SQLite database, with a simulated clock.
 *
 * Input (docs/fuzzing.md, "fuzz_rollout"; short inputs read as zeros):
 *   a start byte, mod 32: k + 1 start state k (RECIPES, below: a state
 *   reached once per run and saved), with no header; 0 and the values past
 *   the last state a new world from the four header bytes below; then the
 *   operations.  The header:
 *   byte 0  bit 0 source k:1 (v2, xchacha20-poly1305) (else plaintext),
 *           bit 1 target format 1 (plaintext source only; else 2); with
 *           bit 0, a KEY SCOPE: every envelope of key k in t.v and u.v
 *           (rows 1..8 in t, 9..16 in u),
 *           bits 2-3 canary (0, 3: all; 1: tenants acme,globex; 2: percent),
 *           bits 4-6 rows written at the source before the rollout (0..7),
 *           bit 7 key k:2 not in the provider at the start
 *   byte 1  canary percent (mod 101)
 *   byte 2  min_soak_s / 4
 *   byte 3  reader_ttl_s - 1
 *   then up to MAX_OPS (6) operations: a tag byte (mod N_OPS) and two
 *   argument bytes a, b (OP_RAW_READER: a length byte and that many bytes
 *   instead; OP_PURE: twelve bytes p[0..11], the first two being a and b).
 *
 * Operations (the tag's name, then what a and b choose):
 *   ADVANCE, ROLLBACK  gather facts as an operator tool does (census of the
 *       table through ks_census_run, live readers, key states from the
 *       provider, the health verdict over the window of inserted metrics,
 *       or OK without samples) and call ks_rollout_db_transition to the
 *       next phase / the rollback phase.  a bits 0-2 with bit 7: leave the
 *       census, key states or health out of the facts; bit 3: ask from the
 *       wrong phase (stale); bit 4: ask for a phase (b mod 5) + 1 instead;
 *       bit 5: ask it of the previous (finalized) rollout; bit 6: mark it
 *       automatic.  The result is compared with a reference model of the
 *       guards written from docs/rollout.md; refusals are expected results.
 *   WRITE    a live reader ((a & 3) mod 3) asks ks_policy_write_target (key
 *       scope: ks_policy_write_target_key for key k, and the keyless
 *       question must fail with KS_ERR_STATE), and ks_policy_write_plan
 *       must give the same class with the column's encoding, for a
 *       tenant (b >> 4) and seals (ks_seal) under that class into row
 *       (b mod 16) + 1, or stores plaintext.  A seal fails exactly when the
 *       key version is not active.
 *   READ     row (b mod 16) + 1 by live reader (a & 3) mod 3: ks_policy_may_read
 *       must allow it, and ks_open must return the stored plaintext.
 *   MIGRATE  in backfill only: ks_migrate_run over a ks_rowstore of the
 *       same database (encrypt or rewrap to the target), batch size
 *       (a mod 4) + 1, stopped after the first batch unless a bit 2; a
 *       key scope migrates u.v when a bit 3, else t.v.  The engine's
 *       pipeline (its helper thread) runs when a bits 4 and 5 are set,
 *       else the serial loop: starting and joining a thread costs more
 *       under ASan than the rest of an input, and this is the one target
 *       that fuzzes the pipeline (fuzz_migrate is serial).
 *   VERIFY   ks_migrate_verify; a full pass with no failure in backfill is
 *       recorded with ks_rollout_db_record_verify (refused elsewhere); a
 *       key scope verifies u.v when a bit 0, else t.v, and records it with
 *       ks_rollout_db_record_verify_column.
 *   JOIN     reader slot (a & 3) mod 3 starts: max format 1 + (a >> 2 & 1), the
 *       key versions k:1..k:4 of b's low bits that exist and are not
 *       destroyed; a ks_policy of its own, registered at the simulated now.
 *       An instance that cannot read what is stored, what is written now
 *       and what a permitted rollback would write does not start (the
 *       deployment rule the guards assume; docs/fuzzing.md).
 *   LEAVE    reader slot (a & 3) mod 3 deregisters and closes its policy.
 *   HEARTBEAT  reader slot (a & 3) mod 3 beats, if it is still live (an expired
 *       reader has stopped: it comes back only by JOIN).
 *   KEY      key version (a mod 4) + 1: b mod 5 = 0 add it, 1 active,
 *       2 decrypt-only, 3 disabled, 4 destroyed -- only when
 *       ks_rollout_destroy_guard allows it, with the references counted
 *       like `keys set-state destroyed` does; its verdict must match the
 *       model's references.  Destroyed is final.  a bits 2-6 (with b mod 5
 *       = 4) make it a dry run, never applied: bit 2 forced, bit 3 with a
 *       reason, bit 4 rows not counted, bit 5 readers not checked, bit 6
 *       also the calls no tool may make (version 0, bad key id, NULL or
 *       unprintable reason, NULL facts; bit 7 picks NULL).
 *   TIME     the clock moves a seconds (a < 64) or (a - 63) minutes.
 *   METRICS  an application health sample: 10 * (1 + a mod 16) opens,
 *       b mod 8 auth failures (b bit 3: parse errors instead).
 *   START    a & 3 = 0 or 3: after finalize, a new rollout from the old
 *       target to the next key version (up to k:4).  a & 3 = 1, ABORT:
 *       ks_rollout_db_abort of the governing rollout against a reference
 *       model of the abort guard (b bit 0 stale, bit 1 census left out,
 *       bit 2 no reason); once aborted, the same rollout is started again
 *       (a new id).  a & 3 = 2, SET: ks_rollout_db_set_settings of one
 *       setting chosen by b bits 0-1 (min_samples, window_s, the
 *       auth-failure rate limit, min_soak_s) to a value of b >> 2; logged
 *       with its old and new value when it changes anything, refused once
 *       finalized (and a window of 0 always).
 *   CANARY   ks_rollout_db_set_canary (all, tenants, percent a mod 101).
 *   RAW_READER  a key-version list from the input: registering it succeeds
 *       exactly when ks_rollout_keys_check accepts it (then removed again).
 *   PURE     the pure functions on facts from p: ks_rollout_guard (from
 *       p0 & 7, to p0 >> 3, each mod 7 so invalid phases occur; key facts
 *       from p1; census / health / latest / plaintext source / verified /
 *       reader count / NULL readers from p2; health value p3; census counts
 *       p4 << (p5 mod 40) and p5 << (p4 mod 40); lasted p6 * 10 - 100 s;
 *       soak 8 * p7; optionally the target replaced by the class of p8-p9)
 *       against the reference model; ks_rollout_class_check and _equal on
 *       that class; phase names (p10); ks_rollout_keys_add into a buffer
 *       of 1 + p11 mod 32 bytes (a list at the size limit is constant data:
 *       checked once per run, in init).
 *
 * Invariants, checked after every operation (abort() on violation):
 *   1. every stored record can be read by every live reader: the reader's
 *      policy allows it and the reader supports its class (and, in READ and
 *      at the end of the input, ks_open returns its plaintext unless its
 *      key version is disabled, when it fails with KS_ERR_DENIED);
 *   2. no key version is destroyed while a row or a live reader holds it;
 *   3. finalized implies no row remains at the source (in any column of a
 *      key scope);
 *   4. the log only grows: its row count never decreases, and exactly the
 *      entries of the step's successful start / transition / canary /
 *      verify / abort / set appear, in order, with their fields;
 * plus: the stored rollout and rows match the model, the census matches
 * the model, and sqlite3_memory_used() is back to its starting value after
 * each input (fuzz/fuzz_sqlite.h), and 0 at exit.
 *
 * World: libsodium's random source is fixed (fuzz/fuzz_drbg.h); the clock
 * is simulated (every ks_rollout_db_* call takes `now`; the policies never
 * register themselves and refresh explicitly).  The stores open plain
 * paths only (no URI, no SQLITE_OPEN_CREATE), so the harness makes
 * SQLite's in-memory "memdb" VFS the process's default: every connection
 * (the operator's ks_rollout_db, the policies, the row stores, the
 * application's own) opens the same in-memory database.  They are opened
 * once and kept for the whole run (fuzz/fuzz_sqlite.h; a policy per slot
 * and max format, which a JOIN gives its key list and reloads), and
 * before each input the database is brought to its start: the template
 * (tables t and u, keyshift's tables, all empty) or a saved start state,
 * so every input starts from the same state whatever ran before it.
 * Secrets live on the heap in fuzz builds (migrate/alloc_hook.h).
 * Keys come from tests/mem_provider.h (as in fuzz_migrate), rebuilt per
 * input.
 *
 * FUZZ_ROLLOUT_VERBOSE=1 (environment) prints every operation.
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/crypto.h>
#include <keyshift/health.h>
#include <keyshift/migrate.h>
#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>
#include <keyshift/rowstore.h>

#include "../migrate/rollout/rollout_internal.h"
#include "../tests/mem_provider.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"
#include "fuzz_drbg.h"
#include "fuzz_input.h"
#include "fuzz_sqlite.h"

#define DRBG_LABEL "keyshift fuzz_rollout fixed"
#define MAX_OPS 6
#define MAX_ROWS 16
#define N_SLOTS 3
#define MAX_KV 4 /* key versions k:1 .. k:4 */
#define N_TENANTS 4
#define T0 1700000000
#define ENV_CAP 512
#define ACTOR "fuzz-operator"

enum {
    OP_ADVANCE,
    OP_ROLLBACK,
    OP_WRITE,
    OP_READ,
    OP_MIGRATE,
    OP_VERIFY,
    OP_JOIN,
    OP_LEAVE,
    OP_HEARTBEAT,
    OP_KEY,
    OP_TIME,
    OP_METRICS,
    OP_START,
    OP_CANARY,
    OP_RAW_READER,
    OP_PURE,
    N_OPS
};

static const char *const OP_NAMES[N_OPS] = {"advance", "rollback", "write",  "read",   "migrate",
                                            "verify",  "join",     "leave",  "beat",   "key",
                                            "time",    "metrics",  "start",  "canary", "raw-reader",
                                            "pure"};
static const char *const TENANTS[N_TENANTS] = {"acme", "globex", "initech", "umbrella"};
static const char *const INSTANCES[N_SLOTS] = {"app-0", "app-1", "app-2"};

/* One row of table t as the model expects it. */
typedef struct mrow {
    int present;
    ks_rollout_class cls;
    unsigned tenant;
    uint8_t pt[32];
    size_t pt_len;
} mrow;

/* One simulated application instance. */
typedef struct slot {
    int registered;     /* in keyshift_readers */
    int64_t heartbeat;
    ks_rollout_reader r;
    unsigned held;      /* bit v: holds k:v */
    ks_policy *pol;
} slot;

/* The log rows a step must add. */
typedef struct want_log {
    int64_t rollout_id;
    int from, to;
    char reason[64];    /* prefix the stored reason starts with */
    int automatic;
} want_log;

/* The whole world of one input, and the model of what it must hold. */
typedef struct world {
    int64_t now;
    ks_rollout_db *db;      /* the operator's connection */
    sqlite3 *raw;           /* the application's: writes and reads rows of t */
    ks_rowstore st;         /* the migration engine's and the census's: t.v */
    ks_rowstore st_u;       /* key scope: the same for u.v */
    int key_mode;           /* the rollouts are key-scoped over t.v and u.v */
    ks_ctx *ctx;
    ks_rollout cur;         /* the governing rollout, as the model has it */
    int64_t prev_id;        /* the rollout before it (finalized), or 0 */
    mrow rows[MAX_ROWS];
    slot slots[N_SLOTS];
    int key_state[MAX_KV + 1]; /* 0: not in the provider, else ks_key_state */
    int64_t log_count, log_last_id;
    want_log want[4];
    size_t n_want;
    uint32_t writes;
    int rollout_changed;    /* the step changed keyshift_rollout: policies refresh */
    int touched;            /* the step asked the store to change the rollout */
    int verbose;
} world;

static ks_mem_provider mem;
static int initialised;
/* The rollout before the governing one (world.prev_id), as the model has
 * it: finalized, so it never changes (kept outside the world, which the
 * checks compare whole). */
static ks_rollout prev_rollout;

/* ---- the world -------------------------------------------------------------- */

/* The database's name in the in-memory VFS: shared by every connection of
 * the process while one is open (the leading '/'), gone when the last
 * one closes. */
static const char db_path[] = "/fuzz_rollout.db";

static uint64_t drbg_start; /* the random stream's position at each input's start */

/* What every input shares, opened once (fuzz/fuzz_sqlite.h): the
 * operator's store, the row stores of t.v and u.v, the application's
 * connection. */
static struct {
    ks_rollout_db *db;
    ks_rowstore st, st_u;
    sqlite3 *raw;
    ks_policy *pol[N_SLOTS][2]; /* by slot, then max format 2 (else 1) */
} kept;

/* Open the policy of o over two stores of db_path: its writes (key list,
 * heartbeat, reports) on a connection of their own, as an application's
 * registering policy has them. */
static ks_policy *open_with_writer(const ks_policy_options *o)
{
    ks_rollout_store *st = NULL, *wr = NULL;
    char eb[256];
    CHECK(ks_rollout_store_sqlite_open(db_path, 0, &st, eb, sizeof eb) == KS_OK);
    CHECK(ks_rollout_store_sqlite_open(db_path, 0, &wr, eb, sizeof eb) == KS_OK);
    ks_policy *p = NULL;
    CHECK(ks_policy_open_stores(st, wr, o, &p) == KS_OK);
    return p;
}

/* A store that only counts its closes: what ks_policy_open_stores must
 * close when it refuses (it uses no other operation then). */
typedef struct counted_store {
    ks_rollout_store base;
    int closes;
} counted_store;

/* The counting store's close op. */
static void counted_close(ks_rollout_store *s)
{
    ((counted_store *)(void *)s)->closes++;
}

/* Once per run: ks_policy_open_stores refuses a missing store or options,
 * one store given twice and options it cannot take, and closes every
 * store it was given exactly once. */
static void check_open_stores_refusals(void)
{
    static const ks_rollout_store_ops ops = {.close = counted_close};
    ks_policy_options o = {"refused", KS_FORMAT_V2, 1u << KS_ALG_XCHACHA20POLY1305, "", 0, 0};
    counted_store a = {{&ops}, 0}, b = {{&ops}, 0};
    ks_policy *p = NULL;
    CHECK(ks_policy_open_stores(NULL, NULL, &o, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(ks_policy_open_stores(NULL, &b.base, &o, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(b.closes == 1);
    CHECK(ks_policy_open_stores(&a.base, &a.base, &o, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(a.closes == 1);
    CHECK(ks_policy_open_stores(&a.base, &b.base, NULL, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(a.closes == 2 && b.closes == 2);
    o.instance_id = "not an instance id";
    CHECK(ks_policy_open_stores(&a.base, &b.base, &o, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(a.closes == 3 && b.closes == 3);
    CHECK(ks_policy_open_store(&a.base, &o, &p) == KS_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(a.closes == 4);
}

/* Once per run: the policy of every instance a JOIN can start, one per
 * slot and max format (opening one parses the schema and checks it: a
 * fifth of every input when each JOIN opened its own).  A JOIN sets its
 * key list and reloads its rules, which is all a new policy's state: its
 * refresh interval never elapses and it never registers itself.  The
 * format-2 ones write through a connection of their own, the format-1
 * ones through the one they read. */
static void init_policies(void)
{
    for (size_t i = 0; i < N_SLOTS; i++) {
        for (int f = 0; f < 2; f++) {
            ks_policy_options o = {INSTANCES[i], f ? KS_FORMAT_V2 : KS_FORMAT_V1,
                                   1u << KS_ALG_XCHACHA20POLY1305, "", 0xffffffffu, 0};
            if (f) {
                kept.pol[i][f] = open_with_writer(&o);
            } else {
                CHECK(ks_policy_open(db_path, &o, &kept.pol[i][f]) == KS_OK);
            }
        }
    }
}

/* At exit: close what init opened (every connection closes cleanly: no
 * statement left behind), then SQLite's world. */
static void close_kept(void)
{
    ks_fuzz_sqlite_stmts_finalize();
    for (size_t i = 0; i < N_SLOTS; i++) {
        for (int f = 0; f < 2; f++) {
            ks_policy_close(kept.pol[i][f]);
        }
    }
    ks_rowstore_close(&kept.st);
    ks_rowstore_close(&kept.st_u);
    ks_rollout_db_close(kept.db);
    CHECK(sqlite3_close(kept.raw) == SQLITE_OK);
    ks_fuzz_sqlite_world_end();
}

/* Once per run: a key list at the size limit is accepted, one more entry
 * is too large, and one more byte is not a list.  Constant data, so it is
 * checked once: walking the 4 KiB list under the fuzzer's comparison
 * tracing was an eighth of every input that asked for it per operation. */
static void check_keys_limit(void)
{
    static char big[KS_READER_KEYS_MAX + 2];
    size_t used = 0;
    for (uint32_t k = 1; used + 13 <= KS_READER_KEYS_MAX; k++)
        used += (size_t)snprintf(big + used, sizeof big - used, "%sk:%" PRIu32, used ? "," : "",
                                 1000000000u + k);
    CHECK(ks_rollout_keys_check(big) == KS_OK);
    CHECK(ks_rollout_keys_add(big, sizeof big, "k", 4000000000u) == KS_ERR_TOO_LARGE);
    memset(big + used, '1', sizeof big - 1 - used);
    big[sizeof big - 1] = '\0';
    CHECK(ks_rollout_keys_check(big) == KS_ERR_BAD_VALUE);
}

/* Once per process: the fixed random source; SQLite's "memdb" VFS as the
 * default, so that the library's plain-path opens (no URI, no
 * SQLITE_OPEN_CREATE) all reach one in-memory database, under the fuzzing
 * limits (fuzz/fuzz_sqlite.h); and the template every input starts from:
 * table t and keyshift's tables as ks_rollout_db_open and the row store
 * create them (u is added per input, in a key scope only). */
static void init(void)
{
    CHECK(ks_fuzz_drbg_install(DRBG_LABEL) == 0);
    CHECK(sodium_init() >= 0);
    ks_fuzz_sqlite_init();
    sqlite3 *keeper = ks_fuzz_sqlite_world_begin(db_path);
    CHECK(sqlite3_exec(keeper,
                       "CREATE TABLE t(id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, v);"
                       "CREATE TABLE u(id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, v);",
                       NULL, NULL, NULL) == SQLITE_OK);
    char eb[256];
    CHECK(ks_rollout_db_open(db_path, 0, &kept.db, eb, sizeof eb) == KS_OK);
    ks_rowstore_target tg = {"t", "v", NULL, "tenant", {NULL}, 0, KS_ENCODING_BINARY};
    CHECK(ks_rowstore_sqlite_open(db_path, &tg, NULL, &kept.st, eb, sizeof eb) == KS_OK);
    ks_rowstore_target tu = {"u", "v", NULL, "tenant", {NULL}, 0, KS_ENCODING_BINARY};
    CHECK(ks_rowstore_sqlite_open(db_path, &tu, NULL, &kept.st_u, eb, sizeof eb) == KS_OK);
    CHECK(sqlite3_open_v2(db_path, &kept.raw, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
    init_policies();
    check_keys_limit();
    ks_fuzz_sqlite_world_seal("/fuzz_rollout.tmpl");
    check_open_stores_refusals();
    CHECK(atexit(close_kept) == 0);
    drbg_start = ks_fuzz_drbg_tell();
    initialised = 1;
}

/* An envelope class of key k, version v, format fmt (xchacha20-poly1305). */
static ks_rollout_class cls_of(uint8_t fmt, uint32_t v)
{
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.version = fmt;
    c.algorithm = KS_ALG_XCHACHA20POLY1305;
    strcpy(c.key_id, "k");
    c.key_version = v;
    return c;
}

/* The plaintext class. */
static ks_rollout_class plain_cls(void)
{
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.is_plaintext = 1;
    return c;
}

/* The context a row is sealed under (the migration's template "t:{id}"). */
static ks_bytes row_context(unsigned id, char buf[16])
{
    int n = snprintf(buf, 16, "t:%u", id);
    return (ks_bytes){(const uint8_t *)buf, (size_t)n};
}

/* The purpose of a class (v2 only). */
static ks_bytes purpose_of(const ks_rollout_class *c)
{
    return !c->is_plaintext && c->version == KS_FORMAT_V2 ? (ks_bytes){(const uint8_t *)"db.users", 8}
                                                          : (ks_bytes){NULL, 0};
}

/* Bind s as text (NULL-terminated) to parameter i. */
static void bind_str(sqlite3_stmt *q, int i, const char *s)
{
    CHECK(sqlite3_bind_text(q, i, s, -1, SQLITE_STATIC) == SQLITE_OK);
}

/* The table of row id: t, or u for the upper half of a key scope's. */
static const char *tbl_of(const world *w, unsigned id)
{
    return w->key_mode && id > MAX_ROWS / 2 ? "u" : "t";
}

/* Write row id (1-based) of its table: plaintext as TEXT, an envelope as
 * a BLOB. */
static void put_row(const world *w, unsigned id, unsigned tenant, const uint8_t *v, size_t len,
                    int blob)
{
    sqlite3_stmt *q = ks_fuzz_sqlite_stmt(w->raw, strcmp(tbl_of(w, id), "u") == 0
                                      ? "INSERT OR REPLACE INTO u(id, tenant, v) VALUES(?1, ?2, ?3)"
                                      : "INSERT OR REPLACE INTO t(id, tenant, v) VALUES(?1, ?2, ?3)");
    CHECK(sqlite3_bind_int(q, 1, (int)id) == SQLITE_OK);
    bind_str(q, 2, TENANTS[tenant]);
    CHECK((blob ? sqlite3_bind_blob(q, 3, v, (int)len, SQLITE_STATIC)
                : sqlite3_bind_text(q, 3, (const char *)v, (int)len, SQLITE_STATIC)) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_DONE);
    ks_fuzz_sqlite_done(q);
}

/* Seal (or, for plaintext, store) a fresh plaintext into row id under class
 * c for tenant; returns the seal's result (the model changes on KS_OK). */
static ks_err write_row(world *w, unsigned id, unsigned tenant, const ks_rollout_class *c)
{
    mrow *m = &w->rows[id - 1];
    mrow nr;
    memset(&nr, 0, sizeof nr);
    nr.present = 1;
    nr.cls = *c;
    nr.tenant = tenant;
    nr.pt_len = (size_t)snprintf((char *)nr.pt, sizeof nr.pt, "row %u write %" PRIu32, id, w->writes++);
    if (c->is_plaintext) {
        put_row(w, id, tenant, nr.pt, nr.pt_len, 0);
        *m = nr;
        return KS_OK;
    }
    char cb[16];
    ks_seal_params p = {c->version, c->algorithm,
                        {(const uint8_t *)TENANTS[tenant], strlen(TENANTS[tenant])},
                        {(const uint8_t *)c->key_id, strlen(c->key_id)}, c->key_version,
                        purpose_of(c), row_context(id, cb)};
    uint8_t env[ENV_CAP];
    size_t env_len = 0;
    ks_err err = ks_seal(w->ctx, &p, nr.pt, nr.pt_len, env, sizeof env, &env_len);
    if (err == KS_OK) {
        put_row(w, id, tenant, env, env_len, 1);
        *m = nr;
    }
    return err;
}

/* A context over the provider, as every input has its own. */
static ks_ctx *new_ctx(void)
{
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = 0;   /* a key state change takes effect at once */
    cfg.dek_max_messages = 1; /* every seal asks the provider: no clock in the outcome */
    ks_provider prov = ks_mem_provider_of(&mem);
    ks_ctx *ctx = NULL;
    CHECK(ks_ctx_new(&prov, &cfg, &ctx) == KS_OK);
    return ctx;
}

/* Build the provider and the database (the template, table u in a key
 * scope, initial rows at the source) for one input, through the
 * application's connection, which stays open (it keeps the in-memory
 * database alive) until teardown. */
static void build(world *w, uint8_t h0)
{
    static const uint8_t kek[MAX_KV][32] = {"fuzz_rollout kek k:1 ...........",
                                            "fuzz_rollout kek k:2 ...........",
                                            "fuzz_rollout kek k:3 ...........",
                                            "fuzz_rollout kek k:4 ..........."};
    ks_mem_init(&mem);
    CHECK(ks_mem_add(&mem, "k", 1, 1, kek[0]) == 0);
    w->key_state[1] = KS_KEY_ACTIVE;
    if (!(h0 & 0x80)) {
        CHECK(ks_mem_add(&mem, "k", 2, 0, kek[1]) == 0);
        w->key_state[2] = KS_KEY_ACTIVE;
    }
    w->ctx = new_ctx();

    unsigned n = (h0 >> 4) & 7;
    for (unsigned i = 1; i <= n; i++) {
        unsigned id = w->key_mode && !(i & 1) ? MAX_ROWS / 2 + i : i; /* both tables */
        CHECK(write_row(w, id, i % N_TENANTS, &w->cur.source) == KS_OK);
    }
}

/* ---- the model ------------------------------------------------------------------ */

/* Nonzero when slot s is live at the model's now. */
static int slot_live(const world *w, const slot *s)
{
    return s->registered && s->heartbeat >= w->now - (int64_t)w->cur.reader_ttl_s;
}

/* Nonzero when the capabilities of slot s cover class c (the model's own
 * rule, independent of ks_rollout_reader_supports). */
static int slot_reads(const slot *s, const ks_rollout_class *c)
{
    if (c->is_plaintext)
        return 1;
    return s->r.max_format >= c->version && c->algorithm == KS_ALG_XCHACHA20POLY1305 &&
           strcmp(c->key_id, "k") == 0 && c->key_version >= 1 && c->key_version <= MAX_KV &&
           (s->held >> c->key_version & 1u) != 0;
}

/* Count the model's rows of class c. */
static uint64_t rows_of(const world *w, const ks_rollout_class *c)
{
    uint64_t n = 0;
    for (size_t i = 0; i < MAX_ROWS; i++)
        n += w->rows[i].present && ks_rollout_class_equal(&w->rows[i].cls, c);
    return n;
}

/* The model's key-state fact for version v. */
static int key_fact(const world *w, uint32_t v)
{
    return v <= MAX_KV && w->key_state[v] != 0 ? w->key_state[v] : KS_ROLLOUT_KEY_MISSING;
}

/* Nonzero when the always-allowed rollbacks can bring source writes back
 * to the governing rollout: any phase but finalized (from finalized, the
 * guard itself refuses while a live reader cannot read the source). */
static int source_may_return(const world *w)
{
    /* finalized -> backfill refuses while a live reader cannot read the
     * source, so in finalized an instance need not hold it */
    return w->cur.phase != KS_PHASE_FINALIZED;
}

/* Nonzero when a new instance with slot s's capabilities may start now:
 * it reads every stored class, what the phase writes, and what a
 * permitted rollback would write. */
static int may_start(const world *w, const slot *s)
{
    for (size_t i = 0; i < MAX_ROWS; i++)
        if (w->rows[i].present && !slot_reads(s, &w->rows[i].cls))
            return 0;
    const ks_rollout *r = &w->cur;
    if (r->phase >= KS_PHASE_WRITE_UPGRADE && !slot_reads(s, &r->target))
        return 0;
    return !source_may_return(w) || slot_reads(s, &r->source);
}

/* The reference model of the guards (docs/rollout.md, "Transitions and
 * their guards"), written apart from guard.c: what a transition of r
 * from `from` to `to` on facts f must return. */
static ks_err model_guard(const slot *const *rd, size_t n_rd, const ks_rollout *r, int is_latest,
                          const ks_rollout_facts *f, ks_rollout_phase from, ks_rollout_phase to)
{
    int ok;
    if (from < KS_PHASE_PLANNED || from > KS_PHASE_FINALIZED || to < KS_PHASE_PLANNED ||
        to > KS_PHASE_FINALIZED || (f->readers == NULL && f->n_readers > 0))
        return KS_ERR_INVALID_ARGUMENT;
    if (from == KS_PHASE_PLANNED && to == KS_PHASE_READ_COMPAT) {
        ok = f->target_key_state == KS_KEY_ACTIVE || f->target_key_state == KS_KEY_DECRYPT_ONLY;
    } else if (from == KS_PHASE_READ_COMPAT && to == KS_PHASE_WRITE_UPGRADE) {
        ok = f->now - r->phase_since >= (int64_t)r->min_soak_s;
        for (size_t i = 0; i < n_rd; i++)
            if (!slot_reads(rd[i], &r->target))
                ok = 0;
    } else if (from == KS_PHASE_WRITE_UPGRADE && to == KS_PHASE_BACKFILL) {
        ok = f->health_known && f->health == KS_HEALTH_OK;
    } else if (from == KS_PHASE_BACKFILL && to == KS_PHASE_FINALIZED) {
        ok = f->census_known && f->rows_at_source == 0;
        if (r->scope == KS_SCOPE_KEY) /* every listed column verified since backfill */
            for (size_t i = 0; i < r->n_columns; i++)
                ok &= r->columns[i].verified_at != 0 && r->columns[i].verified_at >= r->phase_since;
        else
            ok &= r->verified_at != 0 && r->verified_at >= r->phase_since;
    } else if ((from == KS_PHASE_WRITE_UPGRADE || from == KS_PHASE_BACKFILL) &&
               to == KS_PHASE_READ_COMPAT) {
        ok = 1;
    } else if (from == KS_PHASE_READ_COMPAT && to == KS_PHASE_PLANNED) {
        ok = f->census_known && f->rows_at_target == 0;
    } else if (from == KS_PHASE_FINALIZED && to == KS_PHASE_BACKFILL) {
        int s = f->source_key_state;
        ok = is_latest && (r->source.is_plaintext || s == KS_KEY_ACTIVE ||
                           s == KS_KEY_DECRYPT_ONLY || s == KS_KEY_DISABLED);
        for (size_t i = 0; i < n_rd; i++) /* every live reader reads the source again */
            if (!slot_reads(rd[i], &r->source))
                ok = 0;
    } else {
        return KS_ERR_STATE;
    }
    return ok ? KS_OK : KS_ERR_GUARD;
}

/* Expect one log row from the current step. */
static void expect_log(world *w, int64_t rollout_id, int from, int to, const char *reason, int automatic)
{
    CHECK(w->n_want < sizeof w->want / sizeof w->want[0]);
    w->rollout_changed = 1; /* every logged change is a change of keyshift_rollout */
    want_log *l = &w->want[w->n_want++];
    l->rollout_id = rollout_id;
    l->from = from;
    l->to = to;
    snprintf(l->reason, sizeof l->reason, "%s", reason);
    l->automatic = automatic;
}

/* ---- facts ------------------------------------------------------------------------ */

/* The verdict of window sum under t, as `rollout check` gives it for the
 * checks the harness feeds (sample count, auth-failure and parse-error
 * rates), judged here from the thresholds' definitions rather than by
 * ks_health_evaluate, so the guards' facts have a reference of their own. */
static ks_health_status judge(const ks_health_sample *sum, const ks_thresholds *t)
{
    uint64_t samples = sum->seals + sum->opens;
    if (samples < t->min_samples)
        return KS_HEALTH_INSUFFICIENT;
    if (sum->opens != 0 && ((double)sum->auth_failures > t->max_auth_failure_rate * (double)sum->opens ||
                            (double)sum->parse_errors > t->max_parse_error_rate * (double)sum->opens))
        return KS_HEALTH_TRIPPED;
    return KS_HEALTH_OK;
}

/* Gather the facts of a transition of rollout r as an operator tool does;
 * sloppy bits 0-2 leave out the census, the key states, the health. */
static void gather(world *w, const ks_rollout *r, unsigned sloppy, ks_rollout_facts *f)
{
    memset(f, 0, sizeof *f);
    f->now = w->now;
    uint64_t at_src = 0, at_dst = 0;
    for (int t = 0; t < 1 + w->key_mode; t++) { /* every column of the scope */
        ks_census c;
        CHECK(ks_census_run(t ? &w->st_u : &w->st, &c) == KS_OK);
        at_src += r->source.is_plaintext ? c.plaintext_rows : 0;
        for (size_t i = 0; i < c.n_classes; i++) {
            ks_rollout_class k = cls_of(c.classes[i].version, c.classes[i].key_version);
            k.algorithm = c.classes[i].algorithm;
            snprintf(k.key_id, sizeof k.key_id, "%s", c.classes[i].key_id);
            at_src += ks_rollout_class_equal(&k, &r->source) ? c.classes[i].rows : 0;
            at_dst += ks_rollout_class_equal(&k, &r->target) ? c.classes[i].rows : 0;
        }
        CHECK(c.malformed_rows == 0 && c.null_rows == 0);
        ks_census_free(&c);
    }
    /* the census agrees with the model */
    CHECK(at_src == rows_of(w, &r->source) && at_dst == rows_of(w, &r->target));
    if (!(sloppy & 1)) {
        f->census_known = 1;
        f->rows_at_source = at_src;
        f->rows_at_target = at_dst;
    }
    if (!(sloppy & 2)) {
        const ks_rollout_class *k[2] = {&r->target, &r->source};
        int *out[2] = {&f->target_key_state, &f->source_key_state};
        for (int i = 0; i < 2; i++) {
            if (k[i]->is_plaintext)
                continue;
            ks_key_info info;
            ks_err err = ks_ctx_key_info(w->ctx, (ks_bytes){(const uint8_t *)"k", 1},
                                         k[i]->key_version, &info);
            CHECK(err == KS_OK || err == KS_ERR_NOT_FOUND);
            *out[i] = err == KS_OK ? (int)info.state : KS_ROLLOUT_KEY_MISSING;
            CHECK(*out[i] == key_fact(w, k[i]->key_version));
        }
    }
    if (!(sloppy & 4)) {
        ks_health_sample sum;
        CHECK(ks_rollout_db_metrics_sum(w->db, r->id, w->now - (int64_t)r->thresholds.window_s,
                                        &sum) == KS_OK);
        f->health_known = 1;
        f->health = KS_HEALTH_OK;
        if (sum.time != 0)
            f->health = judge(&sum, &r->thresholds);
    }
}

/* ---- operations ---------------------------------------------------------------------- */

/* ADVANCE / ROLLBACK: a transition asked for by an operator. */
static void op_transition(world *w, int forward, uint8_t a, uint8_t b)
{
    int on_prev = (a & 0x20) && w->prev_id != 0;
    /* the rollout as the model has it: the stored one is compared with
     * the model after every step that asked to change it (check_world),
     * and the previous rollout never changes once finalized; read before
     * the model moves below */
    const ks_rollout *r = on_prev ? &prev_rollout : &w->cur;
    ks_rollout_phase from = r->phase, to;
    if (a & 0x10)
        to = (ks_rollout_phase)(1 + b % 5);
    else if (forward)
        to = (ks_rollout_phase)(from == KS_PHASE_FINALIZED ? KS_PHASE_PLANNED : from + 1);
    else
        to = from == KS_PHASE_READ_COMPAT   ? KS_PHASE_PLANNED
             : from == KS_PHASE_FINALIZED ? KS_PHASE_BACKFILL
             : from == KS_PHASE_PLANNED   ? KS_PHASE_BACKFILL /* no such rollback */
                                          : KS_PHASE_READ_COMPAT;
    ks_rollout_facts f;
    gather(w, r, (a & 0x80) ? a & 7u : 0u, &f);
    ks_rollout_phase asked = (a & 0x08) ? (ks_rollout_phase)(1 + (from + b) % 5) : from;
    char reason[64];
    snprintf(reason, sizeof reason, "fuzz %s at %" PRId64, forward ? "advance" : "rollback", w->now);
    ks_rollout_change c = {r->id, asked, to, ACTOR, reason, (a >> 6) & 1};
    char why[512];
    ks_err err = ks_rollout_db_transition(w->db, &c, &f, why, sizeof why);
    w->touched = 1;
    const slot *rd[N_SLOTS];
    size_t n_rd = 0;
    for (size_t i = 0; i < N_SLOTS; i++)
        if (slot_live(w, &w->slots[i]))
            rd[n_rd++] = &w->slots[i];
    ks_err want = asked != from ? KS_ERR_STALE : model_guard(rd, n_rd, r, !on_prev, &f, from, to);
    if (w->verbose)
        fprintf(stderr, "  %s -> %s: %s (model %s) %s\n", ks_rollout_phase_name((int)from),
                ks_rollout_phase_name((int)to), ks_err_name(err), ks_err_name(want), why);
    if (err != want)
        fprintf(stderr, "fuzz_rollout: %s -> %s gave %s, the model says %s (%s)\n",
                ks_rollout_phase_name((int)from), ks_rollout_phase_name((int)to), ks_err_name(err),
                ks_err_name(want), why);
    CHECK(err == want);
    CHECK(err == KS_OK || why[0] != '\0');
    if (err != KS_OK)
        return;
    expect_log(w, r->id, (int)from, (int)to, reason, (a >> 6) & 1);
    if (on_prev)
        return; /* unreachable: the previous rollout is never the latest */
    w->cur.phase = to;
    w->cur.phase_since = w->now;
    if (to == KS_PHASE_BACKFILL) {
        w->cur.verified_at = 0;
        for (size_t i = 0; i < w->cur.n_columns; i++)
            w->cur.columns[i].verified_at = 0;
    }
}

/* The first live slot from index i on (wrapping), or NULL. */
static slot *live_slot(world *w, unsigned i)
{
    for (unsigned k = 0; k < N_SLOTS; k++) {
        slot *s = &w->slots[(i + k) % N_SLOTS];
        if (slot_live(w, s))
            return s;
    }
    return NULL;
}

/* Whether tenant t writes the target in write-upgrade (the model's
 * canary). */
static int model_in_canary(const ks_rollout *r, unsigned t)
{
    const ks_rollout_canary *c = &r->canary;
    if (c->kind == KS_CANARY_ALL)
        return 1;
    if (c->kind == KS_CANARY_PERCENT)
        return ks_rollout_canary_bucket(r->id, (ks_bytes){(const uint8_t *)TENANTS[t],
                                                          strlen(TENANTS[t])}) < c->percent * 100u;
    for (size_t i = 0; i < c->n_tenants; i++)
        if (strcmp(c->tenants[i], TENANTS[t]) == 0)
            return 1;
    return 0;
}

/* WRITE: a live instance writes one row under its policy's answer. */
static void op_write(world *w, uint8_t a, uint8_t b)
{
    slot *s = live_slot(w, (a & 3u) % N_SLOTS);
    if (s == NULL)
        return;
    unsigned id = b % MAX_ROWS + 1, t = (b >> 4) % N_TENANTS;
    ks_rollout_class c;
    ks_bytes tenant = {(const uint8_t *)TENANTS[t], strlen(TENANTS[t])};
    if (w->key_mode) {
        /* only key scopes cover the column: the keyless question has no
         * answer, the one for key k has */
        CHECK(ks_policy_write_target(s->pol, tbl_of(w, id), "v", tenant, &c) == KS_ERR_STATE);
        CHECK(ks_policy_write_target_key(s->pol, tbl_of(w, id), "v", "k", tenant, &c) == KS_OK);
    } else {
        CHECK(ks_policy_write_target(s->pol, "t", "v", tenant, &c) == KS_OK);
    }
    const ks_rollout *r = &w->cur;
    int target = r->phase >= KS_PHASE_BACKFILL ||
                 (r->phase == KS_PHASE_WRITE_UPGRADE && model_in_canary(r, t));
    CHECK(ks_rollout_class_equal(&c, target ? &r->target : &r->source));
    /* the app's one-section question gives the same class, and the
     * column's encoding beside it (every rollout here is binary) */
    ks_rollout_class c2;
    ks_value_encoding enc = KS_ENCODING_BASE64;
    ks_err enc_err = KS_ERR_STORE;
    CHECK(ks_policy_write_plan(s->pol, w->key_mode ? tbl_of(w, id) : "t", "v", w->key_mode ? "k" : NULL,
                               tenant, &c2, &enc, &enc_err) == KS_OK);
    CHECK(enc_err == KS_OK && enc == KS_ENCODING_BINARY && ks_rollout_class_equal(&c2, &c));
    ks_err err = write_row(w, id, t, &c);
    if (w->verbose)
        fprintf(stderr, "  row %u (%s) <- %s: %s\n", id, TENANTS[t],
                c.is_plaintext ? "plaintext" : target ? "target" : "source", ks_err_name(err));
    if (c.is_plaintext)
        return;
    int st = key_fact(w, c.key_version);
    CHECK((err == KS_OK) == (st == KS_KEY_ACTIVE));
    CHECK(err == KS_OK || err == KS_ERR_DENIED || err == KS_ERR_REVOKED || err == KS_ERR_NOT_FOUND);
}

/* Read row id's stored value with the application's connection into buf;
 * returns its length (the model says it is present). */
static size_t read_value(world *w, unsigned id, uint8_t *buf, size_t cap, int *is_blob)
{
    sqlite3_stmt *q = ks_fuzz_sqlite_stmt(w->raw, strcmp(tbl_of(w, id), "u") == 0 ? "SELECT v FROM u WHERE id = ?1"
                                                                  : "SELECT v FROM t WHERE id = ?1");
    CHECK(sqlite3_bind_int(q, 1, (int)id) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    int type = sqlite3_column_type(q, 0);
    CHECK(type == SQLITE_BLOB || type == SQLITE_TEXT);
    const void *p = type == SQLITE_BLOB ? sqlite3_column_blob(q, 0) : (const void *)sqlite3_column_text(q, 0);
    size_t n = (size_t)sqlite3_column_bytes(q, 0);
    CHECK(n <= cap);
    memcpy(buf, p, n);
    *is_blob = type == SQLITE_BLOB;
    ks_fuzz_sqlite_done(q);
    return n;
}

/* Open row id as an application would and compare with the model: the
 * plaintext, or KS_ERR_DENIED when its key version is disabled. */
static void open_row(world *w, unsigned id)
{
    const mrow *m = &w->rows[id - 1];
    uint8_t v[ENV_CAP], pt[ENV_CAP];
    int blob = 0;
    size_t n = read_value(w, id, v, sizeof v, &blob);
    if (m->cls.is_plaintext) {
        CHECK(!blob && n == m->pt_len && memcmp(v, m->pt, n) == 0);
        return;
    }
    CHECK(blob);
    char cb[16];
    ks_open_params op = {row_context(id, cb),
                         {(const uint8_t *)TENANTS[m->tenant], strlen(TENANTS[m->tenant])},
                         purpose_of(&m->cls)};
    size_t pt_len = 0;
    ks_err err = ks_open(w->ctx, v, n, &op, pt, sizeof pt, &pt_len, NULL);
    if (key_fact(w, m->cls.key_version) == KS_KEY_DISABLED) {
        CHECK(err == KS_ERR_DENIED);
        return;
    }
    if (err != KS_OK)
        fprintf(stderr, "fuzz_rollout: row %u does not open: %s\n", id, ks_err_name(err));
    CHECK(err == KS_OK && pt_len == m->pt_len && memcmp(pt, m->pt, pt_len) == 0);
}

/* READ: a live instance reads one row. */
static void op_read(world *w, uint8_t a, uint8_t b)
{
    slot *s = live_slot(w, (a & 3u) % N_SLOTS);
    unsigned id = b % MAX_ROWS + 1;
    if (s == NULL || !w->rows[id - 1].present)
        return;
    uint8_t v[ENV_CAP];
    int blob = 0, ok = 0;
    size_t n = read_value(w, id, v, sizeof v, &blob);
    ks_bytes value = {v, n};
    CHECK(ks_policy_may_read(s->pol, tbl_of(w, id), "v", &value, &ok) == KS_OK);
    CHECK(ok);
    /* the application layer's entry for a value it parsed answers alike
     * (on one read in eight: each answer is a policy lookup), and refuses
     * what ks_policy_may_read refuses */
    ks_envelope e;
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    if ((b & 7u) != 0) {
        c.is_plaintext = 1;
    } else if (ks_envelope_parse(v, n, NULL, &e, NULL) == KS_OK) {
        c.version = e.version;
        c.algorithm = e.algorithm;
        memcpy(c.key_id, e.key_id.ptr, e.key_id.len);
        c.key_version = e.key_version;
    } else {
        c.is_plaintext = 1;
    }
    int ok2 = 0;
    CHECK((b & 7u) != 0 ||
          (ks_policy_may_read_class(s->pol, tbl_of(w, id), "v", &c, &ok2) == KS_OK && ok2 == ok));
    CHECK(ks_policy_may_read_class(NULL, "t", "v", &c, &ok2) == KS_ERR_INVALID_ARGUMENT && !ok2);
    CHECK(ks_policy_may_read_class(s->pol, NULL, "v", &c, &ok2) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read_class(s->pol, "t", NULL, &c, &ok2) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read_class(s->pol, "t", "v", NULL, &ok2) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read_class(s->pol, "t", "v", &c, NULL) == KS_ERR_INVALID_ARGUMENT);
    /* the column's encoding, as the latest rollout covering it records it
     * (every rollout here is binary); a column none covers has none, and
     * a missing argument is refused with *out still set */
    ks_value_encoding enc = KS_ENCODING_BASE64;
    CHECK(ks_policy_column_encoding(s->pol, tbl_of(w, id), "v", &enc) == KS_OK);
    CHECK(enc == KS_ENCODING_BINARY);
    enc = KS_ENCODING_BASE64;
    CHECK(ks_policy_column_encoding(s->pol, tbl_of(w, id), "nope", &enc) == KS_ERR_NOT_FOUND);
    CHECK(enc == KS_ENCODING_BINARY);
    enc = KS_ENCODING_BASE64;
    CHECK((ks_policy_column_encoding(s->pol, (b & 1u) ? NULL : "t", (b & 2u) ? NULL : "v", &enc) ==
           KS_ERR_INVALID_ARGUMENT) == ((b & 3u) != 0));
    CHECK(enc == KS_ENCODING_BINARY);
    CHECK(ks_policy_column_encoding(NULL, "t", "v", &enc) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_column_encoding(s->pol, "t", "v", NULL) == KS_ERR_INVALID_ARGUMENT);
    /* the one-section question refuses the same, and a bad key id, with
     * both answers set */
    ks_rollout_class wc;
    ks_err enc_err = KS_OK;
    const ks_bytes t0 = {(const uint8_t *)TENANTS[0], strlen(TENANTS[0])};
    enc = KS_ENCODING_BASE64;
    CHECK(ks_policy_write_plan(NULL, "t", "v", NULL, t0, &wc, &enc, &enc_err) == KS_ERR_INVALID_ARGUMENT &&
          enc_err == KS_ERR_INVALID_ARGUMENT && enc == KS_ENCODING_BINARY);
    CHECK(ks_policy_write_plan(s->pol, "t", "v", (b & 4u) ? "k k" : NULL, t0, &wc, NULL, &enc_err) ==
          KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_write_plan(s->pol, "t", "v", NULL, t0, &wc, &enc, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_write_plan(s->pol, "t", "v", "k k", t0, &wc, &enc, &enc_err) == KS_ERR_INVALID_ARGUMENT &&
          enc_err == KS_ERR_INVALID_ARGUMENT);
    /* may_read refuses a missing argument, or a length without bytes,
     * answering no */
    ks_bytes hollow = {NULL, 1};
    ok = 1;
    CHECK(ks_policy_may_read(NULL, "t", "v", &value, &ok) == KS_ERR_INVALID_ARGUMENT && !ok);
    CHECK(ks_policy_may_read(s->pol, NULL, "v", &value, &ok) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read(s->pol, "t", NULL, &value, &ok) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read(s->pol, "t", "v", &value, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_may_read(s->pol, "t", "v", &hollow, &ok) == KS_ERR_INVALID_ARGUMENT && !ok);
    open_row(w, id);
}

/* The migration parameters of the governing rollout (encrypt from
 * plaintext, rewrap from an envelope class of the same format). */
static ks_migrate_params migrate_params(const world *w, size_t batch)
{
    const ks_rollout *r = &w->cur;
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    p.mode = r->source.is_plaintext ? KS_MIGRATE_ENCRYPT : KS_MIGRATE_REWRAP;
    p.to_key_id = (ks_bytes){(const uint8_t *)"k", 1};
    p.to_key_version = r->target.key_version;
    p.to_format = r->target.version;
    p.algorithm = r->target.algorithm;
    p.purpose = purpose_of(&r->target);
    p.context_template = (ks_bytes){(const uint8_t *)"t:{id}", 6};
    p.batch_size = batch;
    p.max_failure_rate = -1.0;
    p.supersede = 1; /* as `migrate run` under a rollout: an older run is obsolete */
    return p;
}

/* The stop flag of a migration run. */
typedef struct stopper {
    volatile sig_atomic_t stop;
} stopper;

/* Stop the migration after its first committed batch. */
static void stop_after_batch(void *arg, const ks_migrate_progress *p)
{
    if (p->batch_rows != 0)
        ((stopper *)arg)->stop = 1;
}

/* MIGRATE: one batch (or a whole run) of the engine in backfill, then the
 * model follows the rows it converted. */
static void op_migrate(world *w, uint8_t a)
{
    if (w->cur.phase != KS_PHASE_BACKFILL)
        return; /* `migrate` refuses in any other phase */
    ks_migrate_params p = migrate_params(w, 1 + a % 4u);
    p.serial = (a & 0x30) != 0x30;
    stopper sp = {0};
    ks_checkpoint cp;
    memset(&cp, 0, sizeof cp);
    int in_u = w->key_mode && (a & 8);
    ks_err err = ks_migrate_run(w->ctx, in_u ? &w->st_u : &w->st, &p, &sp.stop,
                                (a & 4) ? NULL : stop_after_batch, &sp, &cp);
    if (w->verbose)
        fprintf(stderr, "  migrate: %s\n", ks_err_name(err));
    int src = key_fact(w, w->cur.source.key_version), dst = key_fact(w, w->cur.target.key_version);
    int keys_ok = dst == KS_KEY_ACTIVE && (w->cur.source.is_plaintext || src == KS_KEY_ACTIVE ||
                                          src == KS_KEY_DECRYPT_ONLY);
    CHECK(err == KS_OK || err == KS_ERR_STOPPED || !keys_ok);
    CHECK(cp.quarantined == 0 || !keys_ok);
    /* follow the rows: each is unchanged or now at the target, same plaintext */
    for (unsigned id = 1; id <= MAX_ROWS; id++) {
        mrow *m = &w->rows[id - 1];
        if (!m->present || !ks_rollout_class_equal(&m->cls, &w->cur.source) ||
            (strcmp(tbl_of(w, id), "u") == 0) != in_u)
            continue;
        uint8_t v[ENV_CAP];
        int blob = 0;
        size_t n = read_value(w, id, v, sizeof v, &blob);
        ks_envelope e;
        if (n >= 3 && memcmp(v, "KSE", 3) == 0 && ks_envelope_parse_header(v, n, NULL, &e, NULL) == KS_OK &&
            e.key_version == w->cur.target.key_version) {
            CHECK(blob && e.version == w->cur.target.version);
            m->cls = w->cur.target;
            open_row(w, id);
        }
    }
}

/* VERIFY: `migrate verify` (of t.v, or of u.v when a bit 0 in a key
 * scope), recorded when it passed in backfill: for the column scope, or
 * for that column of the key scope (the whole key scope cannot be). */
static void op_verify(world *w, uint8_t a)
{
    int in_u = w->key_mode && (a & 1);
    ks_migrate_params p = migrate_params(w, 0);
    ks_verify_result vr;
    ks_err err = ks_migrate_verify(w->ctx, in_u ? &w->st_u : &w->st, &p, 0, NULL, NULL, &vr);
    CHECK(err == KS_OK);
    int disabled = 0;
    for (unsigned id = 1; id <= MAX_ROWS; id++) {
        const mrow *m = &w->rows[id - 1];
        disabled |= m->present && !m->cls.is_plaintext && (strcmp(tbl_of(w, id), "u") == 0) == in_u &&
                    key_fact(w, m->cls.key_version) == KS_KEY_DISABLED;
    }
    CHECK(vr.failed == 0 || disabled);
    if (vr.failed != 0)
        return;
    int in_backfill = w->cur.phase == KS_PHASE_BACKFILL;
    w->touched = 1;
    if (!w->key_mode) {
        err = ks_rollout_db_record_verify(w->db, w->cur.id, ACTOR, w->now);
        CHECK(err == (in_backfill ? KS_OK : KS_ERR_STATE));
        if (err == KS_OK) {
            w->cur.verified_at = w->now;
            expect_log(w, w->cur.id, KS_PHASE_BACKFILL, KS_PHASE_BACKFILL, "migrate verify passed", 0);
        }
        return;
    }
    err = ks_rollout_db_record_verify(w->db, w->cur.id, ACTOR, w->now);
    CHECK(err == (in_backfill ? KS_ERR_INVALID_ARGUMENT : KS_ERR_STATE));
    err = ks_rollout_db_record_verify_column(w->db, w->cur.id, in_u ? "U" : "t", "V", ACTOR, w->now);
    CHECK(err == (in_backfill ? KS_OK : KS_ERR_STATE));
    if (err == KS_OK) {
        w->cur.columns[in_u].verified_at = w->now;
        expect_log(w, w->cur.id, KS_PHASE_BACKFILL, KS_PHASE_BACKFILL,
                   in_u ? "migrate verify passed for u.v" : "migrate verify passed for t.v", 0);
    }
}

/* JOIN: an instance starts in slot (a & 3) mod 3 (replacing one that stopped). */
static void op_join(world *w, uint8_t a, uint8_t b)
{
    slot *s = &w->slots[(a & 3u) % N_SLOTS];
    if (slot_live(w, s))
        return;
    slot n;
    memset(&n, 0, sizeof n);
    strcpy(n.r.instance_id, INSTANCES[(a & 3u) % N_SLOTS]);
    n.r.max_format = (a >> 2) & 1 ? KS_FORMAT_V2 : KS_FORMAT_V1;
    n.r.algorithms = 1u << KS_ALG_XCHACHA20POLY1305;
    for (uint32_t v = 1; v <= MAX_KV; v++) {
        int st = w->key_state[v];
        if ((b >> (v - 1) & 1) && st != 0 && st != KS_KEY_DESTROYED) {
            CHECK(ks_rollout_keys_add(n.r.keys, sizeof n.r.keys, "k", v) == KS_OK);
            n.held |= 1u << v;
        }
    }
    if (!may_start(w, &n))
        return;
    /* the instance's policy, opened once per run (init_policies), made
     * what a new one would be: its key list, and rules loaded now */
    n.pol = kept.pol[(a & 3u) % N_SLOTS][n.r.max_format == KS_FORMAT_V2];
    CHECK(ks_policy_set_keys(n.pol, n.r.keys) == KS_OK);
    CHECK(ks_policy_refresh(n.pol) == KS_OK);
    /* without its heartbeat a policy registers nothing itself: a heartbeat
     * does nothing, a malformed key list is refused, and setting the keys
     * it already holds changes nothing */
    CHECK(ks_policy_heartbeat(n.pol) == KS_OK);
    CHECK(ks_policy_set_keys(n.pol, "not a key list") == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_policy_set_keys(n.pol, n.r.keys) == KS_OK);
    CHECK(ks_rollout_db_reader_register(w->db, &n.r, w->now) == KS_OK);
    n.registered = 1;
    n.heartbeat = w->now;
    *s = n;
    if (w->verbose)
        fprintf(stderr, "  %s joins holding \"%s\", format %u\n", n.r.instance_id, n.r.keys,
                (unsigned)n.r.max_format);
}

/* LEAVE: the instance in slot (a & 3) mod 3 stops and deregisters. */
static void op_leave(world *w, uint8_t a)
{
    slot *s = &w->slots[(a & 3u) % N_SLOTS];
    if (!s->registered)
        return;
    CHECK(ks_rollout_db_reader_deregister(w->db, s->r.instance_id) == KS_OK);
    s->pol = NULL;
    s->registered = 0;
}

/* HEARTBEAT: a live instance beats. */
static void op_heartbeat(world *w, uint8_t a)
{
    slot *s = &w->slots[(a & 3u) % N_SLOTS];
    if (!slot_live(w, s))
        return;
    CHECK(ks_rollout_db_reader_heartbeat(w->db, s->r.instance_id, w->now) == KS_OK);
    s->heartbeat = w->now;
}

/* The references of k:v, counted as `keys set-state destroyed` does: rows
 * (through the census), live readers holding it (from the registry),
 * rollouts not finalized naming it. */
static void count_refs(world *w, uint32_t v, ks_rollout_destroy_facts *f)
{
    for (int t = 0; t < 1 + w->key_mode; t++) { /* every column of the scope */
        ks_census c;
        CHECK(ks_census_run(t ? &w->st_u : &w->st, &c) == KS_OK);
        for (size_t i = 0; i < c.n_classes; i++)
            if (strcmp(c.classes[i].key_id, "k") == 0 && c.classes[i].key_version == v)
                f->rows += c.classes[i].rows;
        ks_census_free(&c);
    }
    f->rows_known = 1;
    ks_rollout_reader rd[N_SLOTS + 1];
    size_t n = 0;
    CHECK(ks_rollout_db_readers_live(w->db, w->cur.reader_ttl_s, w->now, rd, N_SLOTS + 1, &n) == KS_OK);
    for (size_t i = 0; i < n; i++)
        f->live_readers += ks_rollout_keys_holds(rd[i].keys, "k", v) != 0;
    f->readers_known = 1;
    const ks_rollout *r = &w->cur;
    if (r->phase != KS_PHASE_FINALIZED &&
        ((!r->source.is_plaintext && r->source.key_version == v) || r->target.key_version == v))
        f->open_rollouts = 1;
}

/* KEY: add a key version or change its state (destroy through the guard). */
static void op_key(world *w, uint8_t a, uint8_t b)
{
    static const uint8_t kek[32] = "fuzz_rollout added kek .........";
    uint32_t v = 1 + a % MAX_KV;
    unsigned what = b % 5;
    int *st = &w->key_state[v];
    if (what == 0) {
        if (*st == 0) {
            CHECK(ks_mem_add(&mem, "k", v, 0, kek) == 0);
            *st = KS_KEY_ACTIVE;
        }
        return;
    }
    if (*st == 0 || *st == KS_KEY_DESTROYED)
        return; /* nothing to change; destroyed is final */
    if (what == 4) {
        ks_rollout_destroy_facts f;
        memset(&f, 0, sizeof f);
        f.key_id = "k";
        f.key_version = v;
        count_refs(w, v, &f);
        /* the model's references: rows, live instances holding it, the
         * governing rollout while not finalized */
        int referenced = f.open_rollouts != 0;
        for (size_t i = 0; i < MAX_ROWS; i++)
            referenced |= w->rows[i].present && !w->rows[i].cls.is_plaintext &&
                          w->rows[i].cls.key_version == v;
        for (size_t i = 0; i < N_SLOTS; i++)
            referenced |= slot_live(w, &w->slots[i]) && (w->slots[i].held >> v & 1u);
        CHECK(referenced == (f.rows != 0 || f.live_readers != 0 || f.open_rollouts != 0));
        char why[256];
        ks_err err = ks_rollout_destroy_guard(&f, why, sizeof why);
        if (w->verbose)
            fprintf(stderr, "  destroy k:%u: %s %s\n", (unsigned)v, ks_err_name(err), why);
        CHECK(err == (referenced ? KS_ERR_GUARD : KS_OK));
        if (a & 0x5c) {
            /* a dry run of what an operator could also ask, never applied:
             * --force with (or without) a reason, or counts not gathered
             * (--force with a reason overrides both) */
            ks_rollout_destroy_facts g = f;
            g.force = (a >> 2) & 1;
            g.reason = (a >> 3) & 1 ? "fuzz: forced" : "";
            g.rows_known = !((a >> 4) & 1);
            g.readers_known = !((a >> 5) & 1) || !g.rows_known;
            ks_err want = g.force && !((a >> 3) & 1) ? KS_ERR_INVALID_ARGUMENT
                          : g.force                           ? KS_OK
                          : !g.rows_known || !g.readers_known ? KS_ERR_GUARD
                          : referenced                        ? KS_ERR_GUARD
                                                              : KS_OK;
            CHECK(ks_rollout_destroy_guard(&g, why, sizeof why) == want);
            if (a & 0x40) {
                /* calls a tool must never make: refused, whatever the facts */
                ks_rollout_destroy_facts h = g;
                h.key_version = 0;
                CHECK(ks_rollout_destroy_guard(&h, NULL, 0) == KS_ERR_INVALID_ARGUMENT);
                h = g;
                h.key_id = (a & 0x80) ? NULL : "bad id";
                CHECK(ks_rollout_destroy_guard(&h, NULL, 0) == KS_ERR_INVALID_ARGUMENT);
                h = g;
                h.force = 1;
                h.reason = (a & 0x80) ? NULL : "tab\there";
                char why2[256];
                CHECK(ks_rollout_destroy_guard(&h, why2, sizeof why2) == KS_ERR_INVALID_ARGUMENT);
                CHECK(ks_rollout_destroy_guard(NULL, why2, sizeof why2) == KS_ERR_INVALID_ARGUMENT);
            }
            CHECK(want == KS_OK ? !referenced || strstr(why, "destroy was forced") != NULL : why[0] != '\0');
            return;
        }
        if (err != KS_OK)
            return;
    }
    static const int states[5] = {0, KS_KEY_ACTIVE, KS_KEY_DECRYPT_ONLY, KS_KEY_DISABLED,
                                  KS_KEY_DESTROYED};
    *st = states[what];
    ks_mem_set_state(&mem, "k", v, (ks_key_state)*st);
}

/* METRICS: an application flushes a health sample for the rollout. */
static void op_metrics(world *w, uint8_t a, uint8_t b)
{
    ks_health_sample s;
    memset(&s, 0, sizeof s);
    s.time = w->now;
    s.opens = 10u * (1u + a % 16u);
    s.seals = s.opens / 2;
    if (b & 8)
        s.parse_errors = b % 8u;
    else
        s.auth_failures = b % 8u;
    CHECK(ks_rollout_db_metrics_insert(w->db, w->cur.id, "app-0", "app", &s) == KS_OK);
}

/* The canary the input asks for: kind k (0, 3 all; 1 tenants; 2 percent). */
static ks_rollout_canary canary_of(unsigned k, unsigned percent)
{
    ks_rollout_canary c;
    memset(&c, 0, sizeof c);
    if (k == 1) {
        c.kind = KS_CANARY_TENANTS;
        c.n_tenants = 2;
        strcpy(c.tenants[0], TENANTS[0]);
        strcpy(c.tenants[1], TENANTS[1]);
    } else if (k == 2) {
        c.kind = KS_CANARY_PERCENT;
        c.percent = percent % 101u;
    }
    return c;
}

/* Start rollout spec in the store and take it as the governing one. */
static void start(world *w, ks_rollout *spec)
{
    int64_t id = 0;
    char eb[256];
    ks_err err = ks_rollout_db_start(w->db, spec, ACTOR, w->now, &id, eb, sizeof eb);
    if (err != KS_OK)
        fprintf(stderr, "fuzz_rollout: start: %s: %s\n", ks_err_name(err), eb);
    CHECK(err == KS_OK);
    CHECK(ks_rollout_db_get(w->db, id, spec) == KS_OK);
    CHECK(spec->phase == KS_PHASE_PLANNED && spec->phase_since == w->now && spec->verified_at == 0);
    if (w->cur.id != 0) {
        w->prev_id = w->cur.id;
        prev_rollout = w->cur;
    }
    w->cur = *spec;
    expect_log(w, id, 0, KS_PHASE_PLANNED, "", 0);
}

/* The reference model of the abort guard (docs/rollout.md, "Abort and
 * settings"), written apart from guard.c: planned always, read-compat
 * while the census is known and shows no row at the target, no other
 * phase. */
static ks_err model_abort(const ks_rollout *r, const ks_rollout_facts *f)
{
    if (r->phase == KS_PHASE_PLANNED)
        return KS_OK;
    if (r->phase != KS_PHASE_READ_COMPAT)
        return KS_ERR_STATE;
    return f->census_known && f->rows_at_target == 0 ? KS_OK : KS_ERR_GUARD;
}

/* ABORT (START with a & 3 == 1): an operator aborts the governing
 * rollout; b bit 0 asks from a wrong phase (stale), bit 1 leaves the
 * census out, bit 2 gives no reason (refused).  The result must be the
 * model's; an aborted rollout is gone, its two log rows stay, and the
 * operator starts the same rollout again at once (so a rollout governs
 * the scope, as the model assumes), with a new id. */
static void op_abort(world *w, uint8_t b)
{
    ks_rollout_facts f;
    gather(w, &w->cur, (b & 2) ? 1u : 0u, &f);
    ks_rollout_phase from = w->cur.phase;
    ks_rollout_phase asked = (b & 1) ? (ks_rollout_phase)(1 + from % 5) : from;
    char reason[64], why[512] = "";
    snprintf(reason, sizeof reason, "fuzz abort at %" PRId64, w->now);
    ks_err err = ks_rollout_db_abort(w->db, w->cur.id, asked, &f, ACTOR, (b & 4) ? "" : reason,
                                     why, sizeof why);
    w->touched = 1;
    ks_err want = (b & 4) ? KS_ERR_INVALID_ARGUMENT
                  : asked != from ? KS_ERR_STALE
                                  : model_abort(&w->cur, &f);
    if (err != want)
        fprintf(stderr, "fuzz_rollout: abort in %s gave %s, the model says %s (%s)\n",
                ks_rollout_phase_name((int)from), ks_err_name(err), ks_err_name(want), why);
    CHECK(err == want);
    CHECK(err == KS_OK || err == KS_ERR_INVALID_ARGUMENT || why[0] != '\0');
    if (err != KS_OK)
        return;
    ks_rollout gone;
    CHECK(ks_rollout_db_get(w->db, w->cur.id, &gone) == KS_ERR_NO_ROLLOUT);
    expect_log(w, w->cur.id, (int)from, (int)from, "abort: the rollout of ", 0);
    expect_log(w, w->cur.id, (int)from, (int)from, "aborted: fuzz abort", 0);
    ks_rollout spec = w->cur;
    int64_t old = w->cur.id;
    w->cur.id = 0; /* gone: the previous rollout stays the previous one */
    start(w, &spec);
    CHECK(spec.id > old);
}

/* SET (START with a & 3 == 2): an operator changes a setting of the
 * governing rollout, b bits 0-1 which: min_samples 16 * (b >> 2), the
 * window 60 * (b >> 2) s (0 is refused), the auth-failure rate limit
 * (b >> 2) / 64, min_soak_s 4 * (b >> 2).  Refused once finalized; a
 * change is logged, a no-change is not. */
static void op_set(world *w, uint8_t b)
{
    ks_thresholds t = w->cur.thresholds;
    uint32_t soak = w->cur.min_soak_s, v = b >> 2;
    switch (b & 3) {
    case 0: t.min_samples = 16u * v; break;
    case 1: t.window_s = 60u * v; break;
    case 2: t.max_auth_failure_rate = v / 64.0; break;
    default: soak = 4u * v; break;
    }
    const ks_thresholds *o = &w->cur.thresholds;
    int changed = t.min_samples != o->min_samples || t.window_s != o->window_s ||
                  t.max_auth_failure_rate != o->max_auth_failure_rate || soak != w->cur.min_soak_s;
    char changes[256];
    ks_err err = ks_rollout_db_set_settings(w->db, w->cur.id, &t, soak, w->cur.reader_ttl_s, ACTOR,
                                            NULL, w->now, changes, sizeof changes);
    w->touched = 1;
    ks_err want = t.window_s == 0 ? KS_ERR_INVALID_ARGUMENT
                  : w->cur.phase == KS_PHASE_FINALIZED ? KS_ERR_STATE
                                                       : KS_OK;
    CHECK(err == want);
    if (err != KS_OK)
        return;
    CHECK((changes[0] != '\0') == changed);
    if (!changed)
        return;
    expect_log(w, w->cur.id, (int)w->cur.phase, (int)w->cur.phase, "set: ", 0);
    w->cur.thresholds = t;
    w->cur.min_soak_s = soak;
}

/* START: after finalize, rotate on: the old target to the next version
 * (a & 3 is 0 or 3; 1 is ABORT, 2 is SET). */
static void op_start(world *w, uint8_t a, uint8_t b)
{
    if ((a & 3) == 1) {
        op_abort(w, b);
        return;
    }
    if ((a & 3) == 2) {
        op_set(w, b);
        return;
    }
    if (w->cur.phase != KS_PHASE_FINALIZED || w->cur.target.key_version >= MAX_KV)
        return;
    ks_rollout spec = w->cur;
    spec.source = w->cur.target;
    spec.target = cls_of(w->cur.target.version, w->cur.target.key_version + 1);
    start(w, &spec);
}

/* CANARY: an operator changes the canary. */
static void op_canary(world *w, uint8_t a)
{
    ks_rollout_canary c = canary_of((a >> 6) & 3, a);
    ks_err err = ks_rollout_db_set_canary(w->db, w->cur.id, &c, ACTOR, w->now);
    w->touched = 1;
    CHECK(err == (w->cur.phase == KS_PHASE_FINALIZED ? KS_ERR_STATE : KS_OK));
    if (err == KS_OK) {
        w->cur.canary = c;
        expect_log(w, w->cur.id, (int)w->cur.phase, (int)w->cur.phase, "canary: ", 0);
    }
}

/* RAW_READER: a key list from the input is registered exactly when it is
 * canonical; then it is removed (it never reads). */
static void op_raw_reader(world *w, const uint8_t *p, size_t n)
{
    ks_rollout_reader r;
    memset(&r, 0, sizeof r);
    strcpy(r.instance_id, "raw");
    r.max_format = KS_FORMAT_V2;
    memcpy(r.keys, p, n);
    r.keys[n] = '\0';
    int canonical = ks_rollout_keys_check(r.keys) == KS_OK; /* up to a NUL: what is stored */
    ks_err err = ks_rollout_db_reader_register(w->db, &r, w->now);
    CHECK((err == KS_OK) == canonical);
    if (err != KS_OK)
        return;
    CHECK(ks_rollout_db_reader_deregister(w->db, "raw") == KS_OK);
    /* adding an entry keeps a canonical list canonical and makes it hold it */
    char grown[KS_READER_KEYS_MAX + 1];
    memcpy(grown, r.keys, n + 1);
    err = ks_rollout_keys_add(grown, sizeof grown, "k", 1u + n);
    CHECK(err == KS_OK || err == KS_ERR_TOO_LARGE);
    CHECK(err != KS_OK || (ks_rollout_keys_check(grown) == KS_OK && ks_rollout_keys_holds(grown, "k", 1u + n)));
}

/* Key ids for PURE's class checks, and whether [F-KEYID-1] admits them. */
static const struct {
    const char *id;
    int ok;
} KEY_IDS[4] = {{"k", 1}, {"", 0}, {"bad id", 0}, {"payments:kek", 1}};

/* PURE: the pure functions of rollout.h on facts and arguments straight
 * from the input (12 bytes p[0..11]): ks_rollout_guard against the
 * reference model (any phases, key facts, health values, census counts,
 * soak times, the registered instances as readers), the class check, the
 * phase names and ks_rollout_keys_add into a short buffer. */
static void op_pure(world *w, const uint8_t *p)
{
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.rollout = w->cur;
    f.rollout.phase = (ks_rollout_phase)((p[0] & 7) % 7);
    ks_rollout_phase to = (ks_rollout_phase)((p[0] >> 3) % 7);
    f.target_key_state = (int)(p[1] % 7) - 1;
    f.source_key_state = (int)((p[1] >> 4) % 7) - 1;
    f.census_known = p[2] & 1;
    f.health_known = (p[2] >> 1) & 1;
    f.is_latest = (p[2] >> 2) & 1;
    if ((p[2] >> 3) & 1)
        f.rollout.source = plain_cls();
    f.health = (ks_health_status)(p[3] % 4);
    f.rows_at_source = (uint64_t)p[4] << (p[5] % 40);
    f.rows_at_target = (uint64_t)p[5] << (p[4] % 40);
    f.now = T0 + 1000;
    f.rollout.phase_since = f.now - ((int64_t)p[6] * 10 - 100);
    f.rollout.min_soak_s = 8u * p[7];
    f.rollout.verified_at = (p[2] >> 4) & 1 ? f.rollout.phase_since + (p[3] >> 2) % 3 - 1 : 0;
    for (size_t i = 0; i < f.rollout.n_columns; i++) /* a key scope: p3 bit 7 leaves u.v out */
        f.rollout.columns[i].verified_at = i == 1 && (p[3] >> 7) ? 0 : f.rollout.verified_at;
    /* a class from the input, checked, compared, and (p[8] bit 6) the
     * rollout's target */
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.is_plaintext = (p[8] >> 7) & 1;
    c.version = p[8] % 4;
    c.algorithm = (p[8] >> 2) % 4;
    c.key_version = p[9] % 3;
    snprintf(c.key_id, sizeof c.key_id, "%s", KEY_IDS[(p[9] >> 2) % 4].id);
    int may_plain = (p[9] >> 4) & 1;
    int valid = c.is_plaintext ? may_plain && c.version == 0 && c.algorithm == 0 &&
                                     c.key_version == 0 && c.key_id[0] == '\0'
                               : (c.version == 1 || c.version == 2) &&
                                     (c.algorithm == 1 || c.algorithm == 2) && c.key_version != 0 &&
                                     KEY_IDS[(p[9] >> 2) % 4].ok;
    CHECK((ks_rollout_class_check(&c, may_plain) == KS_OK) == valid);
    CHECK(ks_rollout_class_check(NULL, 1) == KS_ERR_INVALID_ARGUMENT);
    const ks_rollout_class *other = (p[9] >> 5) & 1 ? &w->cur.source : &w->cur.target;
    int same = c.is_plaintext || other->is_plaintext
                   ? c.is_plaintext == other->is_plaintext
                   : c.version == other->version && c.algorithm == other->algorithm &&
                         c.key_version == other->key_version && strcmp(c.key_id, other->key_id) == 0;
    CHECK(ks_rollout_class_equal(&c, other) == same && ks_rollout_class_equal(&c, &c));
    if ((p[8] >> 6) & 1)
        f.rollout.target = c;
    /* the registered instances as readers: none to three, or ten copies
     * (more than the eight a refusal names) */
    static ks_rollout_reader rd[10];
    const slot *srd[10];
    size_t want_n = (p[2] >> 5) & 3, n = 0, reg = 0;
    for (size_t i = 0; i < N_SLOTS; i++)
        reg += w->slots[i].registered != 0;
    if (want_n == 3 && reg != 0)
        want_n = 10;
    for (size_t i = 0; n < want_n && i < 10 * N_SLOTS; i++) {
        const slot *sl = &w->slots[i % N_SLOTS];
        if (sl->registered && (want_n == 10 || i < N_SLOTS)) {
            rd[n] = sl->r;
            srd[n++] = sl;
        }
    }
    f.readers = (p[2] >> 7) & 1 ? NULL : rd;
    f.n_readers = (p[2] >> 7) & 1 ? 1 : n;
    char why[512];
    ks_err got = ks_rollout_guard(&f, to, why, sizeof why);
    ks_err want = model_guard(srd, n, &f.rollout, f.is_latest, &f, f.rollout.phase, to);
    if (got != want)
        fprintf(stderr, "fuzz_rollout: pure guard %d -> %d gave %s, the model says %s (%s)\n",
                (int)f.rollout.phase, (int)to, ks_err_name(got), ks_err_name(want), why);
    CHECK(got == want);
    CHECK((got == KS_OK || got == KS_ERR_INVALID_ARGUMENT) == (why[0] == '\0'));
    CHECK(ks_rollout_guard(&f, to, NULL, 0) == want && ks_rollout_guard(NULL, to, why, sizeof why) == KS_ERR_INVALID_ARGUMENT);
    /* phase names round-trip; other names are unknown */
    int ph = p[10] % 8;
    const char *name = ks_rollout_phase_name(ph);
    CHECK((name != NULL) == (ph >= KS_PHASE_PLANNED && ph <= KS_PHASE_FINALIZED));
    CHECK(name == NULL || ks_rollout_phase_from_name(name) == ph);
    char odd[3] = {(char)p[10], (char)p[11], '\0'};
    CHECK(ks_rollout_phase_from_name(odd) == 0 && ks_rollout_phase_from_name(NULL) == 0);
    /* keys_add into a short buffer: the list is canonical and holds the
     * entry, or is unchanged */
    char list[32], before[32];
    size_t cap = 1 + p[11] % sizeof list;
    snprintf(list, sizeof list, "%s", (p[11] >> 5) & 1 ? "k:1,k:3" : (p[11] >> 6) & 1 ? "k:2" : "");
    if (strlen(list) >= cap)
        list[cap - 1] = '\0';
    memcpy(before, list, sizeof list);
    uint32_t v = 1 + (p[10] >> 3) % 4;
    static char long_id[KS_KEY_ID_MAX + 2];
    memset(long_id, 'a', KS_KEY_ID_MAX + 1);
    const char *ids[6] = {KEY_IDS[0].id, KEY_IDS[1].id, KEY_IDS[2].id, KEY_IDS[3].id, NULL, long_id};
    const char *id = ids[(p[10] >> 5) % 6];
    ks_err err = ks_rollout_keys_add(list, cap, id, v);
    if (err == KS_OK)
        CHECK(ks_rollout_keys_check(list) == KS_OK && ks_rollout_keys_holds(list, id, v));
    else
        CHECK(memcmp(list, before, sizeof list) == 0 &&
              (err == KS_ERR_BUFFER_TOO_SMALL || err == KS_ERR_INVALID_ARGUMENT || err == KS_ERR_BAD_VALUE));
    CHECK(ks_rollout_keys_check(NULL) == KS_ERR_INVALID_ARGUMENT && !ks_rollout_keys_holds(NULL, "k", 1) &&
          !ks_rollout_keys_holds("k:1", NULL, 1));
}

/* ---- invariants -------------------------------------------------------------------------- */

/* What the last full check saw: the model, and the database's version
 * (ks_fuzz_sqlite_version: every row change of every connection, counted
 * by SQLite's update hook, and every table a restore rewrote). */
static struct {
    int valid;
    world model;
    unsigned long long version;
} last_check;

/* Nonzero when the checks would read exactly what the last full check of
 * this input read, which passed: no log entry and no rollout change is
 * expected, no row of the database changed since, and the model (clock,
 * rows, readers, keys, rollout) is byte for byte the same, touched aside
 * (the stored rollout is the same, so re-reading it compares the same
 * values with the same model).  Each check is a function of those alone,
 * so it is skipped; about two checks in three. */
static int check_unchanged(world *w)
{
    if (!last_check.valid || w->n_want != 0 || w->rollout_changed ||
        ks_fuzz_sqlite_version() != last_check.version)
        return 0;
    int touched = w->touched;
    w->touched = 0; /* compared without it; a skipped check leaves it clear */
    if (memcmp(w, &last_check.model, sizeof *w) == 0)
        return 1;
    w->touched = touched;
    return 0;
}

/* Remember what a full check saw (check_unchanged). */
static void check_remember(const world *w)
{
    memcpy(&last_check.model, w, sizeof *w);
    last_check.version = ks_fuzz_sqlite_version();
    last_check.valid = 1;
}

static void check_rows(world *w);
static void check_log(world *w);

/* Check every invariant after a step (see the file comment), unless
 * nothing it reads changed since the last check (check_unchanged). */
static void check_world(world *w)
{
    if (check_unchanged(w))
        return;
    /* the stored rollout is the model's (after each step that asked the
     * store to change it, refused or not: reading it costs a statement) */
    if (w->touched) {
        ks_rollout r;
        CHECK(ks_rollout_db_get(w->db, w->cur.id, &r) == KS_OK);
        CHECK(r.phase == w->cur.phase && r.phase_since == w->cur.phase_since &&
              r.verified_at == w->cur.verified_at && r.scope == w->cur.scope &&
              r.n_columns == w->cur.n_columns && r.min_soak_s == w->cur.min_soak_s &&
              r.thresholds.min_samples == w->cur.thresholds.min_samples &&
              r.thresholds.window_s == w->cur.thresholds.window_s &&
              r.thresholds.max_auth_failure_rate == w->cur.thresholds.max_auth_failure_rate);
        for (size_t i = 0; i < r.n_columns; i++)
            CHECK(r.columns[i].verified_at == w->cur.columns[i].verified_at);
        w->touched = 0;
    }
    /* the live readers are the model's */
    ks_rollout_reader rd[N_SLOTS + 1];
    size_t n = 0;
    CHECK(ks_rollout_db_readers_live(w->db, w->cur.reader_ttl_s, w->now, rd, N_SLOTS + 1, &n) == KS_OK);
    size_t live = 0;
    for (size_t i = 0; i < N_SLOTS; i++)
        live += slot_live(w, &w->slots[i]) != 0;
    CHECK(n == live);
    /* a change of keyshift_rollout reaches every live policy before the
     * next answer (an application's refresh, without its delay); other
     * commits leave the rules as they were, so no reload is forced */
    for (size_t k = 0; k < N_SLOTS && w->rollout_changed; k++)
        if (slot_live(w, &w->slots[k]))
            CHECK(ks_policy_refresh(w->slots[k].pol) == KS_OK);
    w->rollout_changed = 0;
    check_rows(w);
    /* 2. (readers) no live reader holds a destroyed version */
    for (size_t i = 0; i < n; i++)
        for (uint32_t v = 1; v <= MAX_KV; v++)
            CHECK(w->key_state[v] != KS_KEY_DESTROYED || !ks_rollout_keys_holds(rd[i].keys, "k", v));
    /* 4. the log only grows, by exactly the step's entries: its row count
     * (read through the application's connection) grows by them, and the
     * new rows, read through the store, are them */
    check_log(w);
    assert(!w->touched && !w->rollout_changed);
    check_remember(w);
}

/* The rows part of check_world: invariants 1 to 3 over every stored row. */
static void check_rows(world *w)
{
    sqlite3_stmt *q = ks_fuzz_sqlite_stmt(w->raw, w->key_mode
                                      ? "SELECT id, v FROM t UNION ALL SELECT id, v FROM u ORDER BY id"
                                      : "SELECT id, v FROM t ORDER BY id");
    size_t stored = 0, present = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(q, 0);
        CHECK(id >= 1 && id <= MAX_ROWS && w->rows[id - 1].present);
        const char *tbl = tbl_of(w, (unsigned)id); /* each row is in its own table only */
        const mrow *m = &w->rows[id - 1];
        stored++;
        /* 1. every stored record can be read by every live reader */
        const void *p = sqlite3_column_type(q, 1) == SQLITE_BLOB ? sqlite3_column_blob(q, 1)
                                                                 : (const void *)sqlite3_column_text(q, 1);
        ks_bytes value = {p, (size_t)sqlite3_column_bytes(q, 1)};
        for (size_t k = 0; k < N_SLOTS; k++) {
            slot *s = &w->slots[k];
            if (!slot_live(w, s))
                continue;
            int ok = 0;
            CHECK(ks_policy_may_read(s->pol, tbl, "v", &value, &ok) == KS_OK);
            if (!ok || !ks_rollout_reader_supports(&s->r, &m->cls))
                fprintf(stderr, "fuzz_rollout: live reader %s cannot read row %lld (%s, phase %s)\n",
                        s->r.instance_id, (long long)id, ok ? "not supported" : "policy refuses",
                        ks_rollout_phase_name((int)w->cur.phase));
            CHECK(ok && ks_rollout_reader_supports(&s->r, &m->cls));
        }
        /* 2. (rows) no destroyed key version is referenced */
        CHECK(m->cls.is_plaintext || key_fact(w, m->cls.key_version) != KS_KEY_DESTROYED);
        /* 3. finalized implies no source rows */
        CHECK(w->cur.phase != KS_PHASE_FINALIZED || !ks_rollout_class_equal(&m->cls, &w->cur.source));
    }
    ks_fuzz_sqlite_done(q);
    for (size_t i = 0; i < MAX_ROWS; i++)
        present += w->rows[i].present != 0;
    CHECK(stored == present);
}

/* The log part of check_world: invariant 4. */
static void check_log(world *w)
{
    sqlite3_stmt *q = ks_fuzz_sqlite_stmt(w->raw, "SELECT count(*), coalesce(max(id), 0) FROM keyshift_rollout_log");
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    int64_t count = sqlite3_column_int64(q, 0), last = sqlite3_column_int64(q, 1);
    ks_fuzz_sqlite_done(q);
    CHECK(count == w->log_count + (int64_t)w->n_want);
    if (w->n_want != 0) {
        ks_rollout_log_entry e[5];
        size_t n = 0;
        CHECK(ks_rollout_db_log(w->db, 0, w->log_last_id, e, 5, &n) == KS_OK);
        CHECK(n == w->n_want);
        for (size_t i = 0; i < n; i++) {
            const want_log *l = &w->want[i];
            CHECK(e[i].id > w->log_last_id && e[i].rollout_id == l->rollout_id &&
                  e[i].time == w->now && e[i].from == l->from && e[i].to == l->to &&
                  e[i].automatic == l->automatic && strcmp(e[i].actor, ACTOR) == 0 &&
                  strncmp(e[i].reason, l->reason, strlen(l->reason)) == 0);
            w->log_last_id = e[i].id;
        }
    }
    CHECK(last == w->log_last_id);
    w->log_count = count;
    w->n_want = 0;
}

/* ---- the run ------------------------------------------------------------------------------- */


/* The rollout spec of the input's header. */
static void spec_of(uint8_t h0, uint8_t h1, uint8_t h2, uint8_t h3, ks_rollout *s)
{
    memset(s, 0, sizeof *s);
    if ((h0 & 3) == 3) { /* a key scope over two tables (the model's key_mode) */
        s->scope = KS_SCOPE_KEY;
        s->n_columns = 2;
        strcpy(s->columns[0].table, "t");
        strcpy(s->columns[0].column, "v");
        strcpy(s->columns[1].table, "u");
        strcpy(s->columns[1].column, "v");
    } else {
        strcpy(s->table, "t");
        strcpy(s->column, "v");
    }
    s->source = (h0 & 1) ? cls_of(KS_FORMAT_V2, 1) : plain_cls();
    s->target = cls_of((h0 & 3) == 2 ? KS_FORMAT_V1 : KS_FORMAT_V2, 2);
    s->canary = canary_of((h0 >> 2) & 3, h1);
    s->thresholds = (ks_thresholds){0.05, 0.05, 0.05, 0, 0, 20, 60};
    s->min_soak_s = 4u * h2;
    s->reader_ttl_s = 1u + h3;
}

/* Close everything of the input's world (the provider too). */
static void teardown(world *w)
{
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&mem);
}

/* Run the operations of in, at most max_ops, checking the world after
 * each. */
static void run_ops(world *w, ks_fuzz_input *in, unsigned max_ops)
{
    for (unsigned k = 0; k < max_ops && in->off < in->n; k++) {
        unsigned op = ks_fuzz_next(in) % N_OPS;
        uint8_t a = ks_fuzz_next(in), b = op == OP_RAW_READER ? 0 : ks_fuzz_next(in);
        if (w->verbose)
            fprintf(stderr, "fuzz_rollout: t+%" PRId64 " %s %u %u (phase %s)\n", w->now - T0,
                    OP_NAMES[op], a, b, ks_rollout_phase_name((int)w->cur.phase));
        switch (op) {
        case OP_ADVANCE: op_transition(w, 1, a, b); break;
        case OP_ROLLBACK: op_transition(w, 0, a, b); break;
        case OP_WRITE: op_write(w, a, b); break;
        case OP_READ: op_read(w, a, b); break;
        case OP_MIGRATE: op_migrate(w, a); break;
        case OP_VERIFY: op_verify(w, a); break;
        case OP_JOIN: op_join(w, a, b); break;
        case OP_LEAVE: op_leave(w, a); break;
        case OP_HEARTBEAT: op_heartbeat(w, a); break;
        case OP_KEY: op_key(w, a, b); break;
        case OP_TIME: w->now += a < 64 ? a : (int64_t)(a - 63) * 60; break;
        case OP_METRICS: op_metrics(w, a, b); break;
        case OP_START: op_start(w, a, b); break;
        case OP_CANARY: op_canary(w, a); break;
        case OP_PURE: {
            uint8_t p[12] = {a, b};
            for (size_t i = 2; i < sizeof p; i++)
                p[i] = ks_fuzz_next(in);
            op_pure(w, p);
            break;
        }
        default: {
            size_t len = a % 24u, avail = in->n - in->off < len ? in->n - in->off : len;
            op_raw_reader(w, in->p + in->off, avail);
            in->off += avail;
            break;
        }
        }
        check_world(w);
    }
}

/* Begin an input in a new world: the header of in (spec_of), the provider
 * and the rows of build, the rollout started. */
static void begin_fresh(world *w, ks_fuzz_input *in)
{
    uint8_t h0 = ks_fuzz_next(in), h1 = ks_fuzz_next(in), h2 = ks_fuzz_next(in), h3 = ks_fuzz_next(in);
    ks_rollout spec;
    spec_of(h0, h1, h2, h3, &spec);
    w->cur.source = spec.source;
    w->key_mode = spec.scope == KS_SCOPE_KEY;
    w->db = kept.db;
    w->st = kept.st;
    w->st_u = kept.st_u;
    w->raw = kept.raw;
    build(w, h0);
    start(w, &spec);
    check_world(w);
}

/* ---- start states ------------------------------------------------------------------------ */

/* An input may start from one of the states below instead of a new world
 * (docs/fuzzing.md, "fuzz_rollout"): each was reached once per run, in
 * init, by a recipe (a fresh input of the same format, run with every
 * check), and saved: the database (ks_fuzz_sqlite_snap_save), the model,
 * the provider's keys and the random stream's position.  Loading one
 * costs a few statements; reaching it again costs up to 29 operations and
 * their checks, which is what bounded the target's speed. */
#define A_(slot, keys) OP_JOIN, (slot) | 4, (keys)                 /* JOIN, format 2 */
#define A1(slot, keys) OP_JOIN, (slot), (keys)                     /* JOIN, format 1 */
#define W_(slot, row, t) OP_WRITE, (slot), ((row) - 1) | (t) << 4  /* WRITE */
#define ADV OP_ADVANCE, 0, 0
#define MIG(batch, full, in_u) OP_MIGRATE, ((batch) - 1) | (full) << 2 | (in_u) << 3, 0
#define VER(in_u) OP_VERIFY, (in_u), 0
#define MET(n) OP_METRICS, (n) - 1, 0
#define LEAVE(slot) OP_LEAVE, (slot), 0
/* header (spec_of), then two readers of k:1..k:3 and k:1..k:2 */
#define HDR(h0) (h0), 0, 0, 119, A_(0, 7), A_(1, 3)
/* the lifecycle of fuzz/rollout_seeds.py (lifecycle), up to each phase */
#define TO_READ_COMPAT(h0) HDR(h0), ADV
#define TO_WRITE_UPGRADE(h0) TO_READ_COMPAT(h0), W_(1, 4, 1), ADV, W_(0, 5, 0), W_(1, 6, 2), MET(10)
#define TO_BACKFILL(h0) TO_WRITE_UPGRADE(h0), ADV, W_(0, 7, 0), MIG(2, 0, 0)
#define TO_FINALIZED(h0) TO_BACKFILL(h0), MIG(4, 1, 0), VER(0), ADV
#define TO_NEXT(h0) TO_FINALIZED(h0), W_(0, 8, 3), OP_START, 0, 0, OP_KEY, 2, 0, LEAVE(0), \
                    A_(0, 6), LEAVE(1), A_(1, 6)
/* h0: plaintext source, 3 rows; v2 k:1 source, 3 rows; a key scope, 4
 * rows; plaintext to format 1 with a tenant canary, 2 rows */
#define PLAIN 0x30
#define SEALED 0x31
#define SCOPE 0x43
#define TO_V1 0x26

#define RECIPE(phase, ...) {(phase), (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})}
/* the lifecycle's five states from header h0 */
#define LIFECYCLE(h0)                                                                               \
    RECIPE(KS_PHASE_READ_COMPAT, TO_READ_COMPAT(h0)), RECIPE(KS_PHASE_WRITE_UPGRADE, TO_WRITE_UPGRADE(h0)), \
        RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(h0)), RECIPE(KS_PHASE_FINALIZED, TO_FINALIZED(h0)),          \
        RECIPE(KS_PHASE_PLANNED, TO_NEXT(h0))
static const struct recipe {
    ks_rollout_phase phase; /* where it ends: checked in init */
    const uint8_t *p;
    size_t n;
} RECIPES[] = {
    LIFECYCLE(PLAIN),
    LIFECYCLE(SEALED),
    RECIPE(KS_PHASE_WRITE_UPGRADE, TO_WRITE_UPGRADE(SCOPE)),
    RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(SCOPE)),
    RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(SCOPE), MIG(4, 1, 1), VER(1)),
    RECIPE(KS_PHASE_FINALIZED, TO_BACKFILL(SCOPE), MIG(4, 1, 1), VER(1), MIG(4, 1, 0), VER(0), ADV),
    RECIPE(KS_PHASE_WRITE_UPGRADE, TO_V1, 0, 0, 119, A1(0, 2), ADV, ADV, W_(0, 3, 0), W_(0, 4, 2)),
    /* backfill done and verified: finalize is next */
    RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(PLAIN), MIG(4, 1, 0), VER(0)),
    RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(SEALED), MIG(4, 1, 0), VER(0)),
    /* a threshold trip: the advance refused, an automatic rollback */
    RECIPE(KS_PHASE_READ_COMPAT, SEALED, 0, 0, 119, A_(0, 3), ADV, ADV, W_(0, 4, 0), OP_METRICS, 9, 7,
           ADV, OP_ROLLBACK, 0x40, 0),
    /* an instance without k:2 blocks write-upgrade until it expires (30 s) */
    RECIPE(KS_PHASE_READ_COMPAT, SEALED, 0, 0, 29, A_(0, 1), A_(1, 3), ADV, ADV),
    /* read-compat with a 120 s minimum soak not yet served */
    RECIPE(KS_PHASE_READ_COMPAT, PLAIN, 0, 30, 119, A_(0, 2), ADV, ADV, MET(10)),
    /* backfill with the source key k:1 disabled */
    RECIPE(KS_PHASE_BACKFILL, TO_BACKFILL(SEALED), OP_KEY, 0, 3),
    /* the next rotation planned, no instance running, the last migration
     * left paused after its last batch (the next one supersedes its
     * checkpoint; the first 8 operations of corpus/regressions/531a98...) */
    RECIPE(KS_PHASE_PLANNED, SEALED, 0, 0, 119, ADV, ADV, ADV, MIG(2, 0, 0), VER(0), ADV, OP_START, 0, 0,
           OP_KEY, 2, 0),
};
#define N_STARTS (sizeof RECIPES / sizeof RECIPES[0])
/* The start byte is read mod START_MOD: 1 .. N_STARTS name a start state,
 * the rest a new world, so that a state added later changes the meaning
 * of no corpus input but those that started new worlds by that byte. */
#define START_MOD 32u
_Static_assert(N_STARTS < START_MOD, "start states fit in the start byte");

/* A saved start state. */
static struct start_state {
    world w;
    ks_rollout prev;             /* prev_rollout */
    size_t n_keys;               /* the provider's keys, in the order added */
    struct {
        uint32_t version;
        ks_key_state state;
        int primary;
        uint8_t kek[KS_MEM_KEK_LEN];
    } keys[KS_MEM_MAX_KEYS];
    uint64_t drbg;               /* the random stream's position */
} starts[N_STARTS];

/* Save the world of the input being run as start state k. */
static void start_save(const world *w, size_t k)
{
    struct start_state *s = &starts[k];
    CHECK(ks_fuzz_sqlite_snap_save() == (int)k);
    s->w = *w;
    s->w.ctx = NULL; /* each input has its own */
    s->prev = prev_rollout;
    s->n_keys = mem.n;
    for (size_t i = 0; i < mem.n; i++) {
        CHECK(mem.keys[i].id_len == 1 && mem.keys[i].id[0] == 'k');
        s->keys[i].version = mem.keys[i].version;
        s->keys[i].state = mem.keys[i].state;
        s->keys[i].primary = mem.keys[i].primary;
        memcpy(s->keys[i].kek, mem.keys[i].kek, KS_MEM_KEK_LEN);
    }
    s->drbg = ks_fuzz_drbg_tell();
}

/* Begin an input from start state k, the database being it already
 * (ks_fuzz_sqlite_restore): the model, a provider and a context as they
 * were, every registered instance's policy given its keys and rules again
 * (all the state a kept policy has), the random stream where it was.
 * full: the checks read it all back (init does, once per state); else the
 * last full check is the one made when the state was saved, which read
 * exactly this database and model (check_unchanged). */
static void begin_start(world *w, size_t k, int full)
{
    const struct start_state *s = &starts[k];
    int verbose = w->verbose;
    *w = s->w;
    w->verbose = verbose;
    prev_rollout = s->prev;
    ks_mem_init(&mem);
    for (size_t i = 0; i < s->n_keys; i++) {
        CHECK(ks_mem_add(&mem, "k", s->keys[i].version, s->keys[i].primary, s->keys[i].kek) == 0);
        ks_mem_set_state(&mem, "k", s->keys[i].version, s->keys[i].state);
    }
    w->ctx = new_ctx();
    for (size_t i = 0; i < N_SLOTS; i++) {
        slot *sl = &w->slots[i];
        if (sl->registered) {
            CHECK(ks_policy_set_keys(sl->pol, sl->r.keys) == KS_OK);
            CHECK(ks_policy_refresh(sl->pol) == KS_OK);
        }
    }
    ks_fuzz_drbg_seek(s->drbg);
    if (full) {
        w->touched = 1;
        check_world(w);
    } else {
        check_remember(w);
    }
}

/* The last checks of an input: every invariant, and every stored record
 * opens (or is refused only for a disabled key). */
static void final_checks(world *w)
{
    w->touched = 1;
    check_world(w);
    for (unsigned id = 1; id <= MAX_ROWS; id++)
        if (w->rows[id - 1].present)
            open_row(w, id);
}

/* End an input: the last checks, the world closed, SQLite's memory
 * checked (the next input restores its start state). */
static void finish(world *w)
{
    final_checks(w);
    teardown(w);
    ks_fuzz_sqlite_world_check_kept();
}

/* A new world for an input (the connections are the kept ones). */
static void world_clear(world *w)
{
    memset(w, 0, sizeof *w);
    memset(&prev_rollout, 0, sizeof prev_rollout);
    last_check.valid = 0;
    ks_fuzz_drbg_seek(drbg_start);
    w->verbose = getenv("FUZZ_ROLLOUT_VERBOSE") != NULL;
    w->now = T0;
}

/* Once per run, after init: run every recipe and save where it ends. */
static void init_starts(void)
{
    static world w;
    for (size_t k = 0; k < N_STARTS; k++) {
        world_clear(&w);
        ks_fuzz_sqlite_restore(0);
        ks_fuzz_input in = {RECIPES[k].p, RECIPES[k].n, 0};
        begin_fresh(&w, &in);
        run_ops(&w, &in, (unsigned)RECIPES[k].n);
        CHECK(in.off == in.n);
        if (w.cur.phase != RECIPES[k].phase)
            fprintf(stderr, "fuzz_rollout: start state %zu ends in %s\n", k,
                    ks_rollout_phase_name((int)w.cur.phase));
        CHECK(w.cur.phase == RECIPES[k].phase);
        final_checks(&w);
        start_save(&w, k);
        teardown(&w);
        ks_fuzz_sqlite_world_check_kept();
    }
    /* each state, loaded as an input loads it, reads back as it was saved */
    for (size_t k = 0; k < N_STARTS; k++) {
        world_clear(&w);
        ks_fuzz_sqlite_restore((int)k + 1);
        begin_start(&w, k, 1);
        finish(&w);
    }
    ks_fuzz_sqlite_snap_seal();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static world w;
    if (!initialised) {
        init();
        init_starts();
    }
    world_clear(&w);
    ks_fuzz_input in = {data, size, 0};
    unsigned from = ks_fuzz_next(&in) % START_MOD;
    if (from > N_STARTS)
        from = 0;
    ks_fuzz_sqlite_restore((int)from); /* 0: the template, else start state from - 1 */
    if (from == 0)
        begin_fresh(&w, &in);
    else
        begin_start(&w, from - 1, 0);
    run_ops(&w, &in, MAX_OPS);
    finish(&w);
    return 0;
}
