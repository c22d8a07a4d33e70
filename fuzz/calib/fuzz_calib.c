/*
 * fuzz/calib/fuzz_calib.c -- the host's speed for the fuzz gate's exec/s
 * floors: a libFuzzer target that does the same fixed work for every
 * input, built only for `make fuzz-smoke` (fuzz/fuzz.mk).  It is not in
 * FUZZ_TARGETS, not built by fuzz/build.sh (OSS-Fuzz, ClusterFuzzLite),
 * not installed, and links nothing of the library, so no change to
 * keyshift or its harnesses moves its speed: only the host, the compiler,
 * the sanitizers and libFuzzer do, and those move every target alike.
 *
 * The work is the kind the slow targets do (fuzz_rollout, fuzz_migrate):
 * SQLite statements on a connection kept for the whole run, heap blocks
 * of assorted sizes under ASan, and a byte loop under the fuzzer's
 * comparison tracing.  Per input: one transaction that writes 8 rows of
 * a 96-byte blob, reads them back and checks every byte, and deletes
 * them; 16 heap blocks of 32 to 1,024 bytes.  The input's bytes choose
 * nothing, so the work never changes and the corpus never grows.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ROWS 8
#define BLOB 96

/* Abort on a failed step: the work is fixed, so any failure is the host's. */
#define MUST(x)                                                                                    \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* ASan's quarantine as the SQLite harnesses set it (fuzz/fuzz_sqlite.h):
 * at the default 256 MiB the run's first seconds fault in fresh pages,
 * and the figure would measure the kernel's page faults. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}

static sqlite3 *db;
static sqlite3_stmt *ins, *sel, *del, *begin, *commit;

/* Once per process: the connection, its table and its statements. */
static void init(void)
{
    MUST(sqlite3_open(":memory:", &db) == SQLITE_OK);
    MUST(sqlite3_exec(db, "CREATE TABLE c(id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, v BLOB)",
                      NULL, NULL, NULL) == SQLITE_OK);
    MUST(sqlite3_prepare_v2(db, "INSERT INTO c(id, tenant, v) VALUES(?1, 'acme', ?2)", -1, &ins,
                            NULL) == SQLITE_OK);
    MUST(sqlite3_prepare_v2(db, "SELECT id, v FROM c ORDER BY id", -1, &sel, NULL) == SQLITE_OK);
    MUST(sqlite3_prepare_v2(db, "DELETE FROM c", -1, &del, NULL) == SQLITE_OK);
    MUST(sqlite3_prepare_v2(db, "BEGIN", -1, &begin, NULL) == SQLITE_OK);
    MUST(sqlite3_prepare_v2(db, "COMMIT", -1, &commit, NULL) == SQLITE_OK);
}

/* Run a statement that returns no row, then reset it. */
static void run(sqlite3_stmt *q)
{
    MUST(sqlite3_step(q) == SQLITE_DONE);
    MUST(sqlite3_reset(q) == SQLITE_OK);
}

/* Check that blob p of row id holds the bytes it was written with. */
static void check_blob(const uint8_t *p, int n, int id)
{
    MUST(n == BLOB);
    for (int i = 0; i < n; i++) {
        MUST(p[i] == (uint8_t)(id * 31 + i));
    }
}

/* The SQLite part of one input: write, read back, delete. */
static void rows(void)
{
    uint8_t blob[BLOB];
    run(begin);
    for (int id = 1; id <= ROWS; id++) {
        for (int i = 0; i < BLOB; i++) {
            blob[i] = (uint8_t)(id * 31 + i);
        }
        MUST(sqlite3_bind_int(ins, 1, id) == SQLITE_OK);
        MUST(sqlite3_bind_blob(ins, 2, blob, BLOB, SQLITE_TRANSIENT) == SQLITE_OK);
        run(ins);
    }
    int seen = 0;
    while (sqlite3_step(sel) == SQLITE_ROW) {
        int id = sqlite3_column_int(sel, 0);
        check_blob(sqlite3_column_blob(sel, 1), sqlite3_column_bytes(sel, 1), id);
        seen++;
    }
    MUST(sqlite3_reset(sel) == SQLITE_OK && seen == ROWS);
    run(del);
    run(commit);
}

/* The heap part of one input: 16 blocks of 32 to 1,024 bytes, filled and freed. */
static void heap(void)
{
    void *b[16];
    for (size_t i = 0; i < 16; i++) {
        size_t n = (size_t)32 << (i % 6);
        b[i] = malloc(n);
        MUST(b[i] != NULL);
        memset(b[i], (int)i, n);
    }
    for (size_t i = 0; i < 16; i++) {
        free(b[i]);
    }
}

/* libFuzzer's entry: the same work whatever the input. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    if (db == NULL) {
        init();
    }
    rows();
    heap();
    return 0;
}
