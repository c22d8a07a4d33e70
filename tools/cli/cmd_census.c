/*
 * tools/cli/cmd_census.c -- `keyshift census`: count the rows of one column by
 * class (NULL, plaintext, envelope per format/algorithm/key/version,
 * malformed per error), reading headers only.
 *
 * Read-only: the database is opened read-only, no key is needed, and
 * nothing but counts and key identifiers is ever printed.
 */
#define _POSIX_C_SOURCE 200809L

#include <string.h>

#include "cli.h"

/* Print the subcommand's manual to f. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift census - count the rows of a column by encryption state\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift census --db DB --table T --column C [--id-column I]\n"
          "        [--encoding binary|base64] [--json]\n"
          "\n"
          "DESCRIPTION\n"
          "    Reads every value of column C of table T in the database DB (a SQLite\n"
          "    file or a PostgreSQL connection string) and counts it as one of:\n"
          "      null       the value is NULL\n"
          "      plaintext  it does not start with the envelope magic \"KSE\"\n"
          "                 (with --encoding base64: with \"S1NF\", the magic's base64)\n"
          "      envelope   it parses strictly; counted per (format version,\n"
          "                 algorithm, key id, key version)\n"
          "      malformed  it starts with \"KSE\" but does not parse (base64: starts\n"
          "                 with \"S1NF\" but is not canonical base64, or its bytes do\n"
          "                 not parse); counted per rejection (truncated, bad-value, ...)\n"
          "    Only headers are read: no key is needed and nothing is decrypted.\n"
          "    The database is opened read-only and nothing is written. Run it\n"
          "    before a migration to see what there is, and after to confirm that\n"
          "    no plaintext and no old key version remains (docs/migration.md).\n"
          "    On PostgreSQL the session is read-only and the table is read in\n"
          "    batches by its id (its primary key, or --id-column), each batch its\n"
          "    own statement, so no snapshot is held for the whole census.\n"
          "\n"
          "OPTIONS\n"
          "    --db DB         " KS_CLI_DB_RULE
          "    --table T       the table\n"
          "    --column C      the column holding plaintext and/or envelopes\n"
          "    --id-column I   a unique, NOT NULL column identifying rows (default:\n"
          "                    the rowid; PostgreSQL: the primary key)\n"
          KS_CLI_ENCODING_RULE
          "    --json          print one JSON object instead of a table\n"
          "    -h, --help      print this manual\n"
          "\n"
          "ENVIRONMENT\n"
          KS_CLI_PG_ENV
          "\n"
          "EXIT STATUS\n"
          "    0 counted; 64 usage, or a password in a PostgreSQL --db; 66 no such\n"
          "    database, table or column; 69 the PostgreSQL database unreachable or\n"
          "    gone away (retry once it is back); 74 database error; 75 the database\n"
          "    stayed locked or a statement timed out (retry).\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift census --db shop.db --table payments --column card\n"
          "    keyshift census --db shop.db --table payments --column card --json\n"
          "    keyshift census --db shop.db --table orders --column card_text \\\n"
          "        --encoding base64\n"
          "    keyshift census --db 'postgresql://reader@db.example/shop' \\\n"
          "        --table payments --column card\n",
          f);
}

/* Print the census as one JSON object. */
static void print_json(const ks_census *c)
{
    uint64_t envelopes = c->rows - c->null_rows - c->plaintext_rows - c->malformed_rows;
    printf("{\"rows\":%llu,\"null\":%llu,\"plaintext\":%llu,\"envelopes\":%llu,\"malformed\":%llu,"
           "\"classes\":[",
           (unsigned long long)c->rows, (unsigned long long)c->null_rows,
           (unsigned long long)c->plaintext_rows, (unsigned long long)envelopes,
           (unsigned long long)c->malformed_rows);
    for (size_t i = 0; i < c->n_classes; i++) {
        const ks_census_class *k = &c->classes[i];
        const char *alg = ks_alg_name(k->algorithm);
        printf("%s{\"version\":%u,\"algorithm\":", i ? "," : "", (unsigned)k->version);
        if (alg != NULL) {
            printf("\"%s\"", alg);
        } else {
            printf("%u", (unsigned)k->algorithm);
        }
        printf(",\"key_id\":");
        ks_cli_put_json_string(stdout, (const uint8_t *)k->key_id, strlen(k->key_id));
        printf(",\"key_version\":%u,\"rows\":%llu}", (unsigned)k->key_version,
               (unsigned long long)k->rows);
    }
    printf("],\"malformed_by_error\":{");
    int first = 1;
    for (int code = 1; code < 32; code++) {
        if (c->malformed[code] != 0) {
            printf("%s\"%s\":%llu", first ? "" : ",", ks_err_name((ks_err)code),
                   (unsigned long long)c->malformed[code]);
            first = 0;
        }
    }
    printf("}}\n");
}

/* Print the census as a readable table. */
static void print_text(const ks_census *c)
{
    uint64_t envelopes = c->rows - c->null_rows - c->plaintext_rows - c->malformed_rows;
    printf("%-12s %llu\n%-12s %llu\n%-12s %llu\n%-12s %llu\n%-12s %llu\n", "rows",
           (unsigned long long)c->rows, "null", (unsigned long long)c->null_rows, "plaintext",
           (unsigned long long)c->plaintext_rows, "envelopes", (unsigned long long)envelopes,
           "malformed", (unsigned long long)c->malformed_rows);
    if (c->n_classes > 0) {
        printf("\n%-7s %-19s %-32s %-12s %s\n", "FORMAT", "ALGORITHM", "KEY_ID", "KEY_VERSION",
               "ROWS");
        for (size_t i = 0; i < c->n_classes; i++) {
            const ks_census_class *k = &c->classes[i];
            const char *alg = ks_alg_name(k->algorithm);
            char algbuf[16];
            if (alg == NULL) {
                snprintf(algbuf, sizeof algbuf, "%u", (unsigned)k->algorithm);
                alg = algbuf;
            }
            printf("v%-6u %-19s %-32s %-12u %llu\n", (unsigned)k->version, alg, k->key_id,
                   (unsigned)k->key_version, (unsigned long long)k->rows);
        }
    }
    if (c->malformed_rows > 0) {
        printf("\n%-20s %s\n", "MALFORMED (ERROR)", "ROWS");
        for (int code = 1; code < 32; code++) {
            if (c->malformed[code] != 0) {
                printf("%-20s %llu\n", ks_err_name((ks_err)code),
                       (unsigned long long)c->malformed[code]);
            }
        }
    }
}

/* See cli.h. */
int ks_cmd_census(int argc, char **argv)
{
    const char *db = NULL, *table = NULL, *column = NULL, *id_column = NULL, *encoding = NULL;
    int json = 0, npos = 0, rc;
    const ks_cli_opt opts[] = {
        {"--db", &db, NULL},         {"--table", &table, NULL},
        {"--column", &column, NULL}, {"--id-column", &id_column, NULL},
        {"--encoding", &encoding, NULL}, {"--json", NULL, &json}, {NULL, NULL, NULL},
    };
    if (ks_cli_parse_opts("census", usage, argc, argv, opts, NULL, 0, &npos, &rc)) {
        return rc;
    }
    if (db == NULL || table == NULL || column == NULL) {
        return ks_cli_usage_error("census", "--db, --table and --column are required");
    }
    ks_rowstore_target t = {.table = table, .column = column, .id_column = id_column};
    if ((rc = ks_cli_parse_encoding("census", encoding, &t.encoding)) != EX_OK) {
        return rc;
    }
    ks_rowstore store;
    if ((rc = ks_cli_store_open(db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store)) != EX_OK) {
        return rc;
    }
    ks_census c;
    memset(&c, 0, sizeof c);
    ks_err e = ks_census_run(&store, &c);
    ks_rowstore_close(&store);
    if (e != KS_OK) {
        ks_cli_error("census of %s.%s failed: %s", table, column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (json) {
        print_json(&c);
    } else {
        print_text(&c);
    }
    ks_census_free(&c);
    return EX_OK;
}
