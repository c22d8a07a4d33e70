/*
 * migrate/store/pg/pg_util.c -- the libpq helpers both PostgreSQL stores
 * share (pg_util.h), so that they connect, map errors and print names the
 * same way.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "pg_util.h"

/* A notice processor that drops the server's notices and warnings
 * (libpq's default prints them on stderr): they are the server's own
 * text, which keyshift never passes on (it may quote rows), and the one
 * that matters, a shutdown's warning, comes back as KS_ERR_UNAVAILABLE. */
static void drop_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* See pg_util.h. */
ks_err ks_pg_connect(const char *conninfo, PGconn **conn, char *errbuf, size_t errbuf_len)
{
    const char *keys[] = {"fallback_application_name", "dbname", NULL};
    const char *vals[] = {"keyshift", conninfo, NULL};
    *conn = PQconnectdbParams(keys, vals, 1);
    if (*conn == NULL) {
        if (errbuf != NULL && errbuf_len > 0)
            snprintf(errbuf, errbuf_len, "out of memory");
        return KS_ERR_NO_MEMORY;
    }
    PQsetNoticeProcessor(*conn, drop_notice, NULL);
    if (PQstatus(*conn) == CONNECTION_OK)
        return KS_OK;
    char msg[160];
    snprintf(msg, sizeof msg, "%s", PQerrorMessage(*conn));
    msg[strcspn(msg, "\n")] = '\0';
    if (errbuf != NULL && errbuf_len > 0)
        snprintf(errbuf, errbuf_len, "cannot connect: %s", msg);
    return KS_ERR_UNAVAILABLE;
}

/* See pg_util.h. */
ks_err ks_pg_map_sqlstate(const char *state)
{
    if (state == NULL || strlen(state) != 5)
        return KS_ERR_STORE;
    if (strcmp(state, "40P01") == 0 || strcmp(state, "40001") == 0 ||
        strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
        return KS_ERR_BUSY;
    if (strncmp(state, "08", 2) == 0 || strncmp(state, "57P0", 4) == 0)
        return KS_ERR_UNAVAILABLE;
    if (strcmp(state, "53100") == 0)
        return KS_ERR_FULL;
    return KS_ERR_STORE;
}

/* See pg_util.h. */
const char *ks_pg_printable(const char *name, char *out, size_t out_len)
{
    size_t i = 0;
    for (; name != NULL && name[i] != '\0' && i + 1 < out_len; i++)
        out[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    out[i] = '\0';
    return out;
}

/* See pg_util.h. */
uint64_t ks_pg_get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* See pg_util.h. */
const uint8_t *ks_pg_typed_cell(const PGresult *res, int row, int col, unsigned oid, size_t *n)
{
    if (res == NULL || row < 0 || col < 0 || row >= PQntuples(res) || col >= PQnfields(res) ||
        PQgetisnull(res, row, col) || PQftype(res, col) != oid || PQfformat(res, col) != 1)
        return NULL;
    int len = PQgetlength(res, row, col);
    if (len < 0)
        return NULL;
    *n = (size_t)len;
    return (const uint8_t *)PQgetvalue(res, row, col);
}
