/*
 * fuzz/fuzz_faults.c -- fault injection driven by the input, as libxml2's
 * fuzzers do it: the input chooses which SQLite call fails (the allocator
 * or one I/O method of the VFS shim of tests/fault_inject.h), from which
 * call on, with which result, and the data the operation runs over, so
 * libFuzzer explores fault points together with data (docs/fuzzing.md,
 * "Fault injection"; tests/test_faults.c sweeps every point of fixed
 * fixtures).
 *
 * Input (short inputs read as zeros):
 *   byte 0  bits 0-1 the operation (0 encrypt, 1 rewrap, 2 reencrypt
 *           migration, 3 census), bits 4-7 the fault (FAULTS: none,
 *           SQLite's allocator, xRead, xWrite, xWrite full, xTruncate,
 *           xSync, xLock busy, xLock)
 *   byte 1  bits 0-2 batch size - 1
 *   bytes 2-3  the call to fail, big-endian (0 counts as 1)
 *   then up to MAX_ROWS rows, each a length byte (0..MAX_PT) and that
 *   many plaintext bytes
 *
 * World (built once): the allocator and the VFS shim installed before
 * SQLite initialises, libsodium's random source replaced by a fixed-seed
 * generator, the in-memory provider of tests/mem_provider.h (k:1 and k:2,
 * 2 primary), an oracle context.  The database is a file under /dev/shm
 * (when writable), recreated for every input with faults off: for rewrap,
 * reencrypt and the census its rows are envelopes of k:1.
 *
 * Per input: arm the fault; run the operation (a fresh context, the
 * store opened, the migration or census, the store closed); disarm.
 * Oracles (abort() on failure):
 *   1. the result is KS_OK, or (only when a fault fired) no-memory,
 *      store, full or busy;
 *   2. sqlite3_memory_used() is back to its value before the run;
 *   3. PRAGMA integrity_check is "ok";
 *   4. every row is its original value, or every row an envelope of k:2
 *      that opens to its original plaintext (one batch: all alike; over
 *      several batches, a prefix of the rows), and the checkpoint counts
 *      exactly the rows done; a census changes nothing;
 *   5. running the operation again with faults off returns KS_OK and
 *      leaves every row done with a complete checkpoint.
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/crypto.h>
#include <keyshift/envelope.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

#include "../tests/fault_inject.h"
#include "../tests/mem_provider.h"
#include "fuzz_check.h"
#include "fuzz_drbg.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define MAX_ROWS 6
#define MAX_PT 48
#define ENV_CAP 512
#define DRBG_LABEL "keyshift fuzz_faults fixed"

/* The faults byte 0 chooses (bits 4-7, modulo their number). */
static const struct {
    kf_kind kind;
    int rc;
} FAULTS[] = {
    {KF_NONE, 0},           {KF_SQLITE_MALLOC, 0},       {KF_READ, SQLITE_IOERR_READ},
    {KF_WRITE, SQLITE_IOERR_WRITE}, {KF_WRITE, SQLITE_FULL}, {KF_TRUNCATE, SQLITE_IOERR_TRUNCATE},
    {KF_SYNC, SQLITE_IOERR_FSYNC}, {KF_LOCK, SQLITE_BUSY},  {KF_LOCK, SQLITE_IOERR_LOCK},
};
#define N_FAULTS (sizeof FAULTS / sizeof FAULTS[0])

enum { OP_CENSUS = 3 };

static ks_mem_provider mem;
static ks_ctx *oracle_ctx;
static char db_path[256];

/* One input, decoded. */
typedef struct input {
    unsigned op;
    unsigned fault;
    unsigned long at;
    size_t batch;
    size_t n_rows;
    uint8_t pt[MAX_ROWS][MAX_PT];
    size_t pt_len[MAX_ROWS];
    uint8_t env[MAX_ROWS][ENV_CAP];
    size_t env_len[MAX_ROWS];
} input;

/* atexit: remove the database, its journal and its directory. */
static void cleanup(void)
{
    char j[300];
    snprintf(j, sizeof j, "%s-journal", db_path);
    (void)unlink(j);
    (void)unlink(db_path);
    char *slash = strrchr(db_path, '/');
    if (slash != NULL) {
        *slash = '\0';
        (void)rmdir(db_path);
    }
}

/* Build the world once. */
static void init(void)
{
    static const uint8_t kek1[32] = "fuzz_faults kek of k, version 1";
    static const uint8_t kek2[32] = "fuzz_faults kek of k, version 2";
    CHECK(kf_install() == SQLITE_OK);
    CHECK(ks_fuzz_drbg_install(DRBG_LABEL) == 0);
    CHECK(sodium_init() >= 0);
    ks_mem_init(&mem);
    CHECK(ks_mem_add(&mem, "k", 1, 0, kek1) == 0);
    CHECK(ks_mem_add(&mem, "k", 2, 1, kek2) == 0);
    ks_provider prov = ks_mem_provider_of(&mem);
    CHECK(ks_ctx_new(&prov, NULL, &oracle_ctx) == KS_OK);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char dir[200];
    snprintf(dir, sizeof dir, "%s/ks_fuzz_faults.XXXXXX", base);
    CHECK(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/db.sqlite", dir);
    atexit(cleanup);
}

/* Decode the input; seal the rows under k:1 for the modes that need it. */
static void decode(const uint8_t *data, size_t size, input *in)
{
    ks_fuzz_input c = {data, size, 0};
    uint8_t b0 = ks_fuzz_next(&c), b1 = ks_fuzz_next(&c);
    in->op = b0 & 3;
    in->fault = (b0 >> 4) % N_FAULTS;
    in->batch = 1 + (b1 & 7);
    in->at = (unsigned long)ks_fuzz_next(&c) << 8;
    in->at |= ks_fuzz_next(&c);
    in->at = in->at == 0 ? 1 : in->at;
    in->n_rows = 0;
    while (c.off < c.n && in->n_rows < MAX_ROWS) {
        size_t i = in->n_rows++, len = ks_fuzz_next(&c) % (MAX_PT + 1);
        in->pt_len[i] = 0;
        for (size_t k = 0; k < len && c.off < c.n; k++) {
            in->pt[i][in->pt_len[i]++] = ks_fuzz_next(&c);
        }
        /* A value that begins "KSE" is an envelope to the engine
         * (ks_engine_is_envelope): as a plaintext it would be quarantined
         * as malformed with or without a fault, which oracle 5 does not
         * model.  The harness's plaintexts never begin with it. */
        if (in->pt_len[i] >= 3 && memcmp(in->pt[i], "KSE", 3) == 0) {
            in->pt[i][0] = 'k';
        }
        char ctx[32];
        ks_seal_params sp = {2, KS_ALG_XCHACHA20POLY1305, BV("acme"), BV("k"), 1, BV("db.cards"),
                             kf_row_context((int64_t)i + 1, ctx, sizeof ctx)};
        CHECK(ks_seal(oracle_ctx, &sp, in->pt[i], in->pt_len[i], in->env[i], ENV_CAP,
                      &in->env_len[i]) == KS_OK);
    }
}

/* Create the database of in with faults off: plaintext BLOBs for encrypt,
 * envelopes otherwise; keyshift's tables made by one open of the store. */
static void build_db(const input *in)
{
    char j[300];
    snprintf(j, sizeof j, "%s-journal", db_path);
    (void)unlink(j);
    (void)unlink(db_path);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    CHECK(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) ==
          SQLITE_OK);
    CHECK(sqlite3_exec(db, "CREATE TABLE payments(id INTEGER PRIMARY KEY, card BLOB);", NULL, NULL,
                       NULL) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(db, "INSERT INTO payments VALUES(?1, ?2)", -1, &st, NULL) == SQLITE_OK);
    for (size_t i = 0; i < in->n_rows; i++) {
        sqlite3_bind_int64(st, 1, (sqlite3_int64)i + 1);
        if (in->op == KS_MIGRATE_ENCRYPT - 1) {
            sqlite3_bind_blob(st, 2, in->pt_len[i] ? in->pt[i] : (const uint8_t *)"", (int)in->pt_len[i],
                              SQLITE_STATIC);
        } else {
            sqlite3_bind_blob(st, 2, in->env[i], (int)in->env_len[i], SQLITE_STATIC);
        }
        CHECK(sqlite3_step(st) == SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    CHECK(sqlite3_close(db) == SQLITE_OK);
    ks_rowstore store = {0};
    ks_rowstore_target t = kf_target();
    CHECK(ks_rowstore_sqlite_open(db_path, &t, NULL, &store, NULL, 0) == KS_OK);
    ks_rowstore_close(&store);
}

/* The operation of in: a migration (kf_migrate_once), or a census (the
 * store opened read-only, the census, whose counts it checks, the store
 * closed). */
static ks_err run(const input *in)
{
    ks_provider prov = ks_mem_provider_of(&mem);
    if (in->op != OP_CENSUS) {
        return kf_migrate_once(&prov, db_path, (ks_migrate_mode)(in->op + 1), 2, in->batch);
    }
    ks_rowstore store = {0};
    ks_rowstore_target t = kf_target();
    ks_sqlite_options so = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    ks_err e = ks_rowstore_sqlite_open(db_path, &t, &so, &store, NULL, 0);
    if (e != KS_OK) {
        return e;
    }
    ks_census c;
    memset(&c, 0, sizeof c);
    if ((e = ks_census_run(&store, &c)) == KS_OK) {
        CHECK(c.rows == in->n_rows);
        CHECK(in->n_rows == 0 || (c.n_classes == 1 && c.classes[0].key_version == 1));
        ks_census_free(&c);
    }
    ks_rowstore_close(&store);
    return e;
}

/* Nonzero when row i's value v[0, n) is done: an envelope of k:2 that
 * opens to the row's plaintext; zero when it is the original; abort
 * otherwise. */
static int row_done(const input *in, size_t i, const uint8_t *v, size_t n)
{
    int census_or_source = in->op == KS_MIGRATE_ENCRYPT - 1
                               ? n == in->pt_len[i] && (n == 0 || memcmp(v, in->pt[i], n) == 0)
                               : n == in->env_len[i] && memcmp(v, in->env[i], n) == 0;
    if (census_or_source) {
        return 0;
    }
    CHECK(in->op != OP_CENSUS);
    ks_envelope e;
    CHECK(ks_envelope_parse(v, n, NULL, &e, NULL) == KS_OK);
    CHECK(e.key_version == 2 && e.key_id.len == 1 && e.key_id.ptr[0] == 'k');
    char ctx[32];
    ks_open_params op = {kf_row_context((int64_t)i + 1, ctx, sizeof ctx), BV("acme"), BV("db.cards")};
    uint8_t out[MAX_PT + 1];
    size_t out_len = 0;
    CHECK(ks_open(oracle_ctx, v, n, &op, out, sizeof out, &out_len, NULL) == KS_OK);
    CHECK(out_len == in->pt_len[i] && (out_len == 0 || memcmp(out, in->pt[i], out_len) == 0));
    return 1;
}

/* Oracles 3 and 4 (and 5 when final): returns nonzero when every row is done. */
static int check_state(const input *in, int final)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    CHECK(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    CHECK(strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0);
    sqlite3_finalize(st);
    CHECK(sqlite3_prepare_v2(db, "SELECT id, card FROM payments ORDER BY id", -1, &st, NULL) ==
          SQLITE_OK);
    size_t rows = 0, done = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        CHECK(sqlite3_column_int64(st, 0) == (sqlite3_int64)rows + 1 && rows < in->n_rows);
        const uint8_t *v = sqlite3_column_blob(st, 1);
        int d = row_done(in, rows, v, (size_t)sqlite3_column_bytes(st, 1));
        CHECK(d ? done == rows : 1); /* the done rows are a prefix */
        done += (size_t)d;
        rows++;
    }
    sqlite3_finalize(st);
    CHECK(sqlite3_close(db) == SQLITE_OK);
    CHECK(rows == in->n_rows);
    /* whole batches only */
    CHECK(done == in->n_rows || done % in->batch == 0);
    kf_checkpoint cp = {0, 0, 0};
    CHECK(ks_rowstore_sqlite_checkpoints(db_path, "payments", "card", kf_checkpoint_one, &cp, NULL, 0) == KS_OK);
    if (in->op == OP_CENSUS) {
        CHECK(cp.n == 0);
    } else {
        CHECK(cp.n <= 1 && (cp.n == 1 ? cp.done : 0) == done);
        CHECK(!final || cp.complete);
    }
    return done == in->n_rows;
}

/* One input: build, fault, check, run again, check. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        init();
        ready = 1;
    }
    static input in;
    decode(data, size, &in);
    build_db(&in);
    sqlite3_int64 mem0 = sqlite3_memory_used();
    kf_arm(FAULTS[in.fault].kind, in.at, FAULTS[in.fault].rc);
    ks_err e = run(&in);
    unsigned long fired = kf_fired();
    kf_arm(KF_NONE, 0, 0);
    CHECK(sqlite3_memory_used() == mem0);
    CHECK(e == KS_OK || (fired > 0 && (e == KS_ERR_NO_MEMORY || e == KS_ERR_STORE ||
                                       e == KS_ERR_FULL || e == KS_ERR_BUSY)));
    (void)check_state(&in, e == KS_OK);
    CHECK(run(&in) == KS_OK);
    CHECK(check_state(&in, 1) || in.op == OP_CENSUS);
    return 0;
}
