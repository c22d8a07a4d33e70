/*
 * tests/sqlite_test_util.h -- helpers shared by the tests that work on a
 * real SQLite file in a temporary directory (test_rowstore_sqlite.c,
 * test_rollout.c).  Include after <cmocka.h> and <sqlite3.h>.
 */
#ifndef KS_TESTS_SQLITE_TEST_UTIL_H
#define KS_TESTS_SQLITE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* One integer from a query on a separate, read-only connection. */
static inline int64_t query_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    return v;
}

/* Remove the database at path with its journal, WAL and shared-memory
 * files, then the directory dir holding it. */
static inline void remove_db_dir(const char *dir, const char *path)
{
    static const char *const suffix[] = {"", "-journal", "-wal", "-shm"};
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s%s", path, suffix[i]);
        unlink(p);
    }
    rmdir(dir);
}

#endif /* KS_TESTS_SQLITE_TEST_UTIL_H */
