/*
 * tools/cli/keyshift.c -- the keyshift command-line tool: global options and
 * dispatch to subcommands (tools/cli/cmd_*.c).
 */
#define _POSIX_C_SOURCE 200809L /* open(O_CLOEXEC), read, fstat */

#include <string.h>

#include <sodium.h>

#include "cli.h"

static const ks_cli_command commands[] = {
    {"inspect", "parse one envelope strictly and print its fields", ks_cmd_inspect},
    {"keys", "manage keys in the keyring or a provider: init, create, add-version, promote, "
             "set-state, list",
     ks_cmd_keys},
    {"providers", "the provider registry (keyring files, HSMs, KMS plugins): list, check",
     ks_cmd_providers},
    {"encrypt", "seal standard input into one envelope", ks_cmd_encrypt},
    {"decrypt", "open one envelope from standard input", ks_cmd_decrypt},
    {"census", "count a database column's rows by encryption state and key", ks_cmd_census},
    {"migrate", "encrypt, rewrap or re-encrypt a live database column: run, status, verify",
     ks_cmd_migrate},
    {"rollout", "move a column (or a key's envelopes in several columns) to a new key or "
                "format in guarded, logged phases: start, advance, rollback, canary, status, "
                "log, check, metrics, readers",
     ks_cmd_rollout},
    {"serve", "run the local encryption agent: seal and open over a Unix socket for the "
              "processes a policy names (docs/agent.md)",
     ks_cmd_serve},
};

/* Print the top-level manual to f. */
static void usage(FILE *f)
{
    fprintf(f,
            "NAME\n"
            "    keyshift - envelope encryption and key-rotation toolkit\n"
            "\n"
            "SYNOPSIS\n"
            "    keyshift [--version] [--help] COMMAND [ARGS...]\n"
            "    keyshift help COMMAND\n"
            "\n"
            "DESCRIPTION\n"
            "    keyshift reads and writes keyshift envelopes: field-level ciphertext\n"
            "    with a strict, canonical, length-bounded header (docs/format.md), and\n"
            "    migrates live SQLite columns to them in resumable, verified batches\n"
            "    (docs/migration.md), in rollouts whose phases keep every reader able\n"
            "    to read what is written (docs/rollout.md).\n"
            "\n"
            "COMMANDS\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        fprintf(f, "    %-10s %s\n", commands[i].name, commands[i].summary);
    }
    fprintf(f,
            "\n"
            "    Run 'keyshift COMMAND --help' for a command's options and exit codes.\n"
            "\n"
            "OPTIONS\n"
            "    -h, --help     print this manual and exit 0\n"
            "    --version      print the program and library versions and exit 0\n"
            "\n"
            "ENVIRONMENT\n"
            "    KEYSHIFT_KEYRING     the keyring file, when --keyring is not given\n"
            "    KEYSHIFT_PROVIDERS   the provider registry (docs/providers.md), when\n"
            "                         neither --providers nor --keyring is given\n"
            "    KEYSHIFT_PASSPHRASE  the keyring passphrase, when --passphrase-file is\n"
            "                         not given (passphrases are never taken from argv).\n"
            "                         From either, exactly one trailing newline (LF) is\n"
            "                         removed and nothing else: a CR or a second LF\n"
            "                         stays part of the passphrase\n"
            "    PGPASSFILE, PGPASSWORD, PGHOST, PGUSER, ...  libpq's, for a --db that is a\n"
            "                         PostgreSQL connection string (census, migrate):\n"
            "                         passwords only from these, never on the command line\n"
            "\n"
            "EXIT STATUS (sysexits.h)\n"
            "    0   success\n"
            "    64  usage error, or a password in a PostgreSQL --db (EX_USAGE)\n"
            "    65  invalid data: a malformed envelope, authentication failed, a refused\n"
            "        change; a migration stopped by its failure threshold or blocked by\n"
            "        another migration's checkpoint; rows that failed verify (EX_DATAERR)\n"
            "    66  input file, database, table or column missing or unreadable\n"
            "        (EX_NOINPUT)\n"
            "    69  key provider or algorithm unavailable, or the PostgreSQL database\n"
            "        unreachable or gone away mid-run: rerun once it is back, a migration\n"
            "        resumes from its checkpoint (EX_UNAVAILABLE)\n"
            "    71  out of memory or other system error (EX_OSERR)\n"
            "    73  cannot create the keyring (EX_CANTCREAT)\n"
            "    74  read or write error; database error or disk full, the batch rolled\n"
            "        back and the migration resumable once fixed (EX_IOERR)\n"
            "    75  try again: key provider timed out, database locked, or a migration\n"
            "        paused by SIGINT/SIGTERM; rerun to resume. A rollout guard refused:\n"
            "        not safe yet, the message says what is missing (EX_TEMPFAIL)\n"
            "    77  key disabled, destroyed, denied or missing (EX_NOPERM)\n"
            "    78  keyring or providers file insecure, unreadable or corrupt, wrong\n"
            "        passphrase, wrong or locked PIN, or a KMS plugin's command not\n"
            "        found or its hello refused (EX_CONFIG)\n"
            "\n"
            "    Migration outcomes and recovery: docs/migration.md. 'keyshift rollout\n"
            "    check' uses 0-3 as monitoring plugins do (see its --help).\n");
    ks_cli_help_footer(f, NULL);
}

/* Find a subcommand by name. */
static const ks_cli_command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i].name, name) == 0) {
            return &commands[i];
        }
    }
    return NULL;
}

/* Flush stdout and turn a late write error (e.g. a full disk or closed
 * pipe) into EX_IOERR, so output is never silently lost. */
static int finish(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        ks_cli_error("cannot write standard output");
        return rc == EX_OK ? EX_IOERR : rc;
    }
    return rc;
}

int main(int argc, char **argv)
{
    /* Before any sodium_malloc (passphrases, plaintext) and any key use. */
    if (sodium_init() < 0) {
        ks_cli_error("cannot initialise libsodium");
        return EX_OSERR;
    }
    if (argc < 2) {
        usage(stderr);
        return EX_USAGE;
    }
    const char *arg = argv[1];
    if (ks_cli_is_help(arg)) {
        usage(stdout);
        return finish(EX_OK);
    }
    if (strcmp(arg, "--version") == 0) {
        printf(KS_PROG " %s (libkeyshift %s)\n", KS_VERSION_STRING, ks_version());
        return finish(EX_OK);
    }
    if (strcmp(arg, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return finish(EX_OK);
        }
        const ks_cli_command *c = find_command(argv[2]);
        if (c == NULL) {
            ks_cli_error("no such command '%s'; see 'keyshift --help'", argv[2]);
            return EX_USAGE;
        }
        char help[] = "--help";
        char *help_argv[] = {argv[2], help, NULL};
        return finish(c->run(2, help_argv));
    }
    const ks_cli_command *c = find_command(arg);
    if (c == NULL) {
        ks_cli_error("no such command '%s'; see 'keyshift --help'", arg);
        return EX_USAGE;
    }
    return finish(c->run(argc - 1, argv + 1));
}
