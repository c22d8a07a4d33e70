/*
 * migrate/store/sqlite/sqlite_util.c -- the helpers every SQLite connection of the
 * library shares (sqlite_util.h): safe opening, the busy handler, error
 * mapping and messages.
 *
 * Busy handling.  Every statement of a connection waits for locks through
 * a busy handler with exponential backoff (1 ms doubling to 100 ms, plus
 * up to 50% jitter) up to the connection's timeout in all, then fails with
 * SQLITE_BUSY (KS_ERR_BUSY).  sqlite3_busy_timeout has no jitter, and its
 * fixed schedule makes waiters collide.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sqlite_util.h"

/* Backoff of the busy handler: first sleep and cap, in milliseconds. */
#define BUSY_FIRST_MS 1u
#define BUSY_CAP_MS 100u

/* See sqlite_util.h: a name cannot forge terminal output. */
const char *ks_sqlite_printable(const char *name, char *out, size_t out_len)
{
    assert(out != NULL && out_len > 4);
    size_t i = 0;
    for (; name != NULL && name[i] != '\0' && i + 4 < out_len; i++) {
        unsigned char c = (unsigned char)name[i];
        out[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (name != NULL && name[i] != '\0') {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

/* See sqlite_util.h: full, busy (after the handler gave up), out of
 * memory, or any other store error. */
ks_err ks_sqlite_map_rc(int rc)
{
    assert(rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE);
    switch (rc & 0xff) {
    case SQLITE_FULL:
        return KS_ERR_FULL;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return KS_ERR_BUSY;
    case SQLITE_NOMEM:
        return KS_ERR_NO_MEMORY;
    default:
        return KS_ERR_STORE;
    }
}

/* See sqlite_util.h. */
ks_err ks_sqlite_fail_rc(char *errbuf, size_t errbuf_len, int rc, const char *what)
{
    if ((rc & 0xff) == SQLITE_NOTADB)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_STORE, "not an SQLite database");
    return ks_sqlite_fail(errbuf, errbuf_len, ks_sqlite_map_rc(rc), "%s: %s", what,
                          sqlite3_errstr(rc));
}

/* See sqlite_util.h (for the lock wait and refresh intervals only). */
uint64_t ks_sqlite_mono_ms(void)
{
    struct timespec ts;
    int rc = clock_gettime(CLOCK_MONOTONIC, &ts);
    assert(rc == 0);
    (void)rc;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Next xorshift64 value: jitter only, so that waiting processes do not
 * retry in lockstep; nothing secret depends on it. */
static uint64_t next_rand(ks_sqlite_busy *b)
{
    uint64_t x = b->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b->rng = x;
    return x;
}

/* Sleep ms milliseconds (restarting after signals). */
static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* See sqlite_util.h. */
void ks_sqlite_busy_init(ks_sqlite_busy *b, uint32_t timeout_ms)
{
    assert(b != NULL);
    memset(b, 0, sizeof *b);
    b->timeout_ms = timeout_ms != 0 ? timeout_ms : KS_SQLITE_BUSY_DEFAULT_MS;
    b->rng = ks_sqlite_mono_ms() ^ ((uint64_t)(uintptr_t)b << 16) ^ (uint64_t)getpid() ^
             0x9e3779b97f4a7c15u;
}

/* SQLite's busy callback: count is 0 at the first wait for a lock, so the
 * wait starts there; sleep with exponential backoff plus jitter, and give
 * up (return 0: the statement fails with SQLITE_BUSY) once the total wait
 * reaches the timeout. */
static int busy_handler(void *arg, int count)
{
    ks_sqlite_busy *b = arg;
    assert(b != NULL && count >= 0);
    uint64_t now = ks_sqlite_mono_ms();
    if (count == 0) {
        b->start_ms = now;
        b->delay_ms = BUSY_FIRST_MS;
    }
    uint64_t waited = now - b->start_ms;
    if (waited >= b->timeout_ms)
        return 0;
    uint64_t left = b->timeout_ms - waited;
    uint64_t delay = b->delay_ms + next_rand(b) % (b->delay_ms / 2u + 1u);
    sleep_ms(delay < left ? delay : left);
    b->delay_ms = b->delay_ms * 2u > BUSY_CAP_MS ? BUSY_CAP_MS : b->delay_ms * 2u;
    return 1;
}

/* See sqlite_util.h. */
ks_err ks_sqlite_connect(const char *path, int read_only, int full_mutex, ks_sqlite_busy *busy,
                         sqlite3 **out, char *errbuf, size_t errbuf_len)
{
    assert(path != NULL && busy != NULL && out != NULL);
    int flags = (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) |
                (full_mutex ? SQLITE_OPEN_FULLMUTEX : SQLITE_OPEN_NOMUTEX);
    sqlite3 *db = NULL;
    *out = NULL;
    int rc = sqlite3_open_v2(path, &db, flags, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_close_v2(db);
        int missing = access(path, F_OK) != 0 && errno == ENOENT;
        char pname[256];
        ks_sqlite_printable(path, pname, sizeof pname);
        if (missing)
            return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_TARGET,
                                  "no database file \"%s\"", pname);
        return ks_sqlite_fail(errbuf, errbuf_len, ks_sqlite_map_rc(rc),
                              "cannot open database \"%s\": %s", pname, sqlite3_errstr(rc));
    }
    rc = sqlite3_extended_result_codes(db, 1);
    if (rc == SQLITE_OK)
        rc = sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
#ifdef SQLITE_DBCONFIG_TRUSTED_SCHEMA
    if (rc == SQLITE_OK)
        rc = sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)NULL);
#endif
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_handler(db, busy_handler, busy);
    if (rc != SQLITE_OK) {
        sqlite3_close_v2(db);
        return ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "configuring the connection");
    }
    *out = db;
    return KS_OK;
}
