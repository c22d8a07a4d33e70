/*
 * tools/cli/cli.h -- shared helpers of the keyshift command-line tool,
 * defined in cli.c (messages, options, parsing, output), cli_input.c
 * (bounded input, the passphrase), cli_keys.c (keyrings, registries,
 * contexts) and cli_db.c (databases, rollout stores, censuses).
 *
 * Exit codes follow sysexits(3); each command documents which it uses.
 */
#ifndef KS_TOOLS_CLI_H
#define KS_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sysexits.h>

#include <keyshift/keyshift.h>

/* The program name used in messages. */
#define KS_PROG "keyshift"

/* One subcommand: its name, a one-line summary for `keyshift --help`, and
 * its entry point, called with argv[0] being the subcommand's name. */
typedef struct ks_cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} ks_cli_command;

/* Name the program in messages (default KS_PROG): for another tool built
 * on these helpers, e.g. keyshift-demo-app.  NULL restores the default. */
void ks_cli_set_prog(const char *name);

/* Print the program name, ": " and a formatted message to stderr, with a
 * newline. */
void ks_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a usage error for subcommand cmd (NULL: a program without
 * subcommands) and return EX_USAGE. */
int ks_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Read all of FILE (or standard input for NULL or "-") into a malloc'd
 * buffer of at most max bytes.  Input longer than max is refused before
 * more than max + 1 bytes are read (for a regular file, before any is):
 * *too_long is set and EX_DATAERR returned.  Returns EX_OK, EX_NOINPUT
 * (cannot open), EX_IOERR (read error) or EX_OSERR (out of memory), having
 * printed the error.  The caller frees *out.
 */
int ks_cli_read_input(const char *path, size_t max, uint8_t **out, size_t *out_len, int *too_long);

/* Parse a decimal size in [lo, hi] from s.  Returns 0 on success. */
int ks_cli_parse_size(const char *s, size_t lo, size_t hi, size_t *out);

/* Parse --encoding (NULL: binary) into *out: EX_OK, or the usage error's
 * exit code after printing it for cmd. */
int ks_cli_parse_encoding(const char *cmd, const char *s, ks_value_encoding *out);

/* The --encoding line of a manual's OPTIONS. */
#define KS_CLI_ENCODING_RULE                                                             \
    "    --encoding E    how the column holds envelopes: binary (the default; BLOB,\n"  \
    "                    bytea) or base64, their canonical text, which begins\n"        \
    "                    \"S1NF\" (a SQLite TEXT, a PostgreSQL text or varchar\n"    \
    "                    column; docs/format.md section 10). A value beginning\n"     \
    "                    \"S1NF\" that is not canonical base64 is malformed.\n"

/* Write len bytes as lowercase hex. */
void ks_cli_put_hex(FILE *f, const uint8_t *p, size_t len);

/* Write bytes as a JSON string literal, quotes included, escaping
 * quotes, backslashes, control characters and bytes >= 0x80. */
void ks_cli_put_json_string(FILE *f, const uint8_t *p, size_t len);

/* Print the SEE ALSO that ends every manual --help prints: the manual
 * page of command cmd (its first word; NULL: the program's) and where
 * `make install' put the documents the manual cites as docs/NAME.md. */
void ks_cli_help_footer(FILE *f, const char *cmd);

/* Nonzero when arg is -h or --help. */
int ks_cli_is_help(const char *arg);

/* One option of a subcommand: "--name VALUE" / "--name=VALUE" when value
 * is set, a flag when flag is set. */
typedef struct ks_cli_opt {
    const char *name;
    const char **value;
    int *flag;
} ks_cli_opt;

/*
 * Parse argv[1, argc) against opts (terminated by a {NULL} entry): options
 * anywhere, "--" ending them, and at most max_pos positional arguments
 * into pos (count in *npos; "-" counts as positional).  Returns 0 when the
 * command should go on.  Otherwise the command is over and *rc is its exit
 * code: EX_OK after printing usage() for -h/--help, EX_USAGE after
 * printing the problem.
 */
int ks_cli_parse_opts(const char *cmd, void (*usage)(FILE *), int argc, char **argv,
                      const ks_cli_opt *opts, const char **pos, int max_pos, int *npos, int *rc);

/* The sysexits code for a library error (docs in `keyshift --help`). */
int ks_cli_exit_code(ks_err err);

/* Parse a duration: seconds, or a number followed by s, m, h or d, into
 * *out seconds; 0, or -1 for anything else (or past UINT32_MAX s). */
int ks_cli_parse_duration(const char *s, uint32_t *out);

/* Parse a duration in milliseconds: a number of seconds with up to three
 * decimals ("0.5", "2"), or followed by ms, s, m or h ("500ms", "0.5s",
 * "1m"), into *out_ms; 0, or -1 for anything else (or past UINT32_MAX
 * ms).  ks_cli_parse_duration's syntax, plus fractions and ms. */
int ks_cli_parse_duration_ms(const char *s, uint32_t *out_ms);

/* Seconds on the monotonic clock (run times, throttled time). */
double ks_cli_mono_s(void);

/*
 * Open the keyring named by path (NULL: $KEYSHIFT_KEYRING) with the
 * passphrase read from passphrase_file (NULL: $KEYSHIFT_PASSPHRASE, if
 * set; otherwise none).  Prints the error and returns its exit code.
 */
int ks_cli_keyring_open(const char *path, const char *passphrase_file, ks_keyring **out);

/*
 * Resolve the keyring path (path, else $KEYSHIFT_KEYRING) and load the
 * passphrase (see ks_cli_passphrase_load) into *pass.  Returns EX_OK, or
 * an exit code after printing the problem (EX_USAGE when no keyring is
 * named).  The caller frees *pass with ks_cli_passphrase_free().
 */
int ks_cli_keyring_args(const char **path, const char *passphrase_file, ks_bytes *pass);

/* How every manual states the passphrase rule of ks_cli_passphrase_load()
 * (docs/keyring.md [K-SEAL-7]); a string literal, to paste into help text. */
#define KS_CLI_PASSPHRASE_RULE "one trailing newline (LF) removed, nothing else"

/*
 * Read the passphrase from passphrase_file, else $KEYSHIFT_PASSPHRASE, into
 * sodium_malloc'd memory, exactly one trailing LF removed if present and
 * nothing else (no CR, no second LF, no spaces) [K-SEAL-7].  *out is {NULL, 0}
 * when there is none.  Free with ks_cli_passphrase_free().  Returns EX_OK
 * or an exit code after printing the error.
 */
int ks_cli_passphrase_load(const char *passphrase_file, ks_bytes *out);

/* Wipe and free a passphrase from ks_cli_passphrase_load(). */
void ks_cli_passphrase_free(ks_bytes *pass);

/* Where a command's keys come from: a keyring file (the local provider
 * over it) or a provider registry (its routing provider). */
typedef struct ks_cli_keys {
    ks_keyring *kr;       /* --keyring / $KEYSHIFT_KEYRING, else NULL */
    ks_registry *reg;     /* --providers / $KEYSHIFT_PROVIDERS, else NULL */
    ks_provider prov;     /* the provider to use: local over kr, or reg's router */
    char source[320];     /* for messages: "keyring PATH" or "providers PATH" */
    const char *providers; /* the registry's path (argv or environment), else NULL */
} ks_cli_keys;

/* How every manual states which of --keyring and --providers applies; a
 * string literal, to paste into help text. */
#define KS_CLI_KEYS_RULE                                                                       \
    "a provider registry (docs/providers.md; default:\n"                                   \
    "                      $KEYSHIFT_PROVIDERS) routing each key_id to its provider,\n"     \
    "                      a keyring, an HSM through PKCS#11 or a KMS through a\n"        \
    "                      plugin, instead of --keyring;\n"                               \
    "                      both options is a usage error, and --keyring beats\n"           \
    "                      $KEYSHIFT_PROVIDERS\n"

/*
 * Open the keys a command uses: the registry named by providers (else
 * $KEYSHIFT_PROVIDERS when keyring is NULL), else the keyring (as
 * ks_cli_keyring_open).  Both named: EX_USAGE for subcommand cmd.
 * Returns EX_OK, or an exit code after printing the problem (then *out
 * holds nothing).  Close with ks_cli_keys_close().
 */
int ks_cli_keys_open(const char *cmd, const char *keyring, const char *passfile,
                     const char *providers, ks_cli_keys *out);

/*
 * As ks_cli_keys_open(), but a registry's providers open only when a key
 * they serve is first needed (ks_registry_load_lazy, docs/providers.md
 * [P-LOAD-5]): for commands that touch few keys (encrypt, decrypt, keys),
 * so that a decrypt under a keyring key logs in to no HSM and starts no
 * plugin.  A command whose call failed asks ks_cli_keys_open_failed()
 * whether a provider's open was the cause.
 */
int ks_cli_keys_open_lazy(const char *cmd, const char *keyring, const char *passfile,
                          const char *providers, ks_cli_keys *out);

/* When a provider of k's registry failed to open when first needed, say
 * so as a failed load of the registry is said (ks_cli_registry_failed:
 * the provider's name, its setting or plugin stage) and return that exit
 * code; else EX_OK, having printed nothing. */
int ks_cli_keys_open_failed(const ks_cli_keys *k);

/* Report a failed ks_registry_load() or ks_registry_read() of path (with
 * line and column for a rejection, the provider's name for a provider
 * that did not open) and return its exit code. */
int ks_cli_registry_failed(const char *path, ks_err e, const ks_registry_error *err);

/* Close what ks_cli_keys_open() opened; an empty *k is a no-op. */
void ks_cli_keys_close(ks_cli_keys *k);

/* Open the keys (as ks_cli_keys_open) and a ks_ctx over their provider.
 * Returns EX_OK, or an exit code after printing the error (then *keys
 * holds nothing and *ctx is NULL).  The caller frees ctx, then closes
 * keys. */
int ks_cli_ctx_open(const char *cmd, const char *keyring, const char *passfile,
                    const char *providers, ks_cli_keys *keys, ks_ctx **ctx);

/* As ks_cli_ctx_open(), with the keys of ks_cli_keys_open_lazy(). */
int ks_cli_ctx_open_lazy(const char *cmd, const char *keyring, const char *passfile,
                         const char *providers, ks_cli_keys *keys, ks_ctx **ctx);

/* Write all of p[0, n) to stdout; EX_OK or EX_IOERR after a message. */
int ks_cli_write_stdout(const uint8_t *p, size_t n);

/*
 * Collect the columns a context template references ({name} other than
 * {id}; "{{" and "}}" are literal braces) into t->context_columns, with
 * ks_context_template_columns() (the names point into storage).  NULL
 * tmpl: none.  Returns EX_OK, or EX_USAGE after printing the problem for
 * subcommand cmd.
 */
int ks_cli_template_columns(const char *cmd, const char *tmpl, ks_rowstore_target *t,
                            char storage[KS_CONTEXT_TEMPLATE_MAX]);

/* How every manual describes the two forms of --db; a string literal, to
 * paste into help text after "--db DB". */
#define KS_CLI_DB_RULE                                                                         \
    "the database: a SQLite file (must exist), or a\n"                                       \
    "          PostgreSQL connection URI (postgresql://[user@]host[:port]/db?...\n"           \
    "          or postgres://...) or libpq key=value string ('host=H dbname=D',\n"          \
    "          recognized by its first keyword). No password in it: a URI with\n"            \
    "          user:password@ or a password= keyword is refused (exit 64); give\n"           \
    "          it through PGPASSFILE or PGPASSWORD. A file whose name looks\n"               \
    "          like a connection string is given as ./NAME\n"

/* How every manual lists the environment of a PostgreSQL --db; a string
 * literal, to paste into an ENVIRONMENT section. */
#define KS_CLI_PG_ENV                                                                          \
    "    PGPASSFILE, PGPASSWORD  the PostgreSQL password (libpq): the only places\n"          \
    "                keyshift takes one from. Prefer PGPASSFILE (a 0600 file) over\n"      \
    "                PGPASSWORD, which other users may see in the process table on\n"        \
    "                some systems\n"                                                         \
    "    PGHOST, PGPORT, PGDATABASE, PGUSER, PGSSLMODE, PGSERVICE, ...  libpq's\n"           \
    "                defaults for whatever the --db connection string leaves out\n"

/*
 * Whether db names a PostgreSQL database rather than a SQLite file: it
 * starts with postgresql:// or postgres://, or its first word is a libpq
 * keyword followed by '=' (host=..., dbname=...).  Anything else is a
 * path.
 */
int ks_cli_db_is_pg(const char *db);

/*
 * Check a --db value before any command uses it: a PostgreSQL one must
 * parse (PQconninfoParse) and hold no password.  *is_pg (when not NULL)
 * says which kind it is.  Returns EX_OK, or EX_USAGE after printing the
 * problem (never the string itself, which may hold a password).
 */
int ks_cli_db_check(const char *db, int *is_pg);

/*
 * Open the database db with target t: a SQLite file (which must exist),
 * its connection at PRAGMA synchronous sync (ks_sqlite_sync) and
 * busy_timeout_ms, or a PostgreSQL database (ks_cli_db_is_pg; checked as
 * ks_cli_db_check) with busy_timeout_ms as its lock_timeout (sync does
 * not apply).  0: 30000.  Returns EX_OK, or an exit code after printing
 * the problem: EX_NOINPUT for no such database, table or column;
 * EX_USAGE for a bad name, a password in a connection string, or for
 * synchronous NORMAL on a database not in WAL mode; EX_UNAVAILABLE for a
 * PostgreSQL server that cannot be reached.
 */
int ks_cli_store_open(const char *db, const ks_rowstore_target *t, int read_only,
                      uint32_t busy_timeout_ms, ks_sqlite_sync sync, ks_rowstore *out);

/*
 * Check, with ks_migrate_check_context, that the contexts of template
 * tmpl (NULL: the empty template) may be bound to the rows of store, a
 * store opened on table: EX_OK, or EX_USAGE after saying, for
 * subcommand cmd (NULL: a program without subcommands), that the context binds an id that VACUUM and a
 * dump/restore renumber, and the two fixes (--id-column, or a context
 * without {id}).  Every command that renders contexts calls it right
 * after opening its store, before any row is read or written.
 */
int ks_cli_check_context(const char *cmd, const ks_rowstore *store, const char *table,
                         const char *tmpl);

/* List the migration checkpoints of db (SQLite or PostgreSQL, as
 * ks_cli_store_open dispatches), as ks_rowstore_sqlite_checkpoints or
 * ks_rowstore_pg_checkpoints do; db has passed ks_cli_db_check. */
KS_WUR ks_err ks_cli_checkpoints(const char *db, const char *table, const char *column,
                                 ks_checkpoint_list_fn fn, void *arg, char *errbuf,
                                 size_t errbuf_len);

/* Parse the value of --synchronous (full or normal) into *out; on
 * anything else, say so and return EX_USAGE (cmd names the command). */
int ks_cli_parse_synchronous(const char *cmd, const char *s, ks_sqlite_sync *out);

/* Write a row id: an integer, text (a JSON string when json), a BLOB as
 * x'hex', or NULL.  Never used for secret values. */
void ks_cli_put_value(FILE *f, const ks_value *v, int json);

/* Refuse an option of opts (as given to ks_cli_parse_opts) that was set
 * but is not named in allowed (" --a --b ", spaces around each name).
 * Returns EX_OK or EX_USAGE after printing which option cmd does not
 * take. */
int ks_cli_only_options(const char *cmd, const ks_cli_opt *opts, const char *allowed);

/* For a command with subcommands: with no subcommand, print usage to
 * stderr (*rc EX_USAGE); for -h/--help, print it to stdout (*rc EX_OK).
 * Returns nonzero when it did either, so the command is over. */
int ks_cli_subcommand_help(int argc, char **argv, void (*usage)(FILE *), int *rc);

/* Nonzero when s is min..max bytes of printable ASCII (as rollout logs
 * require of actors and reasons). */
int ks_cli_printable(const char *s, size_t min, size_t max);

/* Format a Unix time as RFC 3339 UTC into out ("" for 0). */
void ks_cli_format_time(int64_t t, char *out, size_t cap);

/* This machine's host name into out[0, cap) (cap >= 2), terminated;
 * "localhost" when it cannot be read. */
void ks_cli_hostname(char *out, size_t cap);

/*
 * The actor written to rollout logs: given (checked: 1..KS_ROLLOUT_ACTOR_MAX
 * printable ASCII bytes), else "$USER@host" ($USER, else getlogin_r, else
 * "unknown"; the host from gethostname), unprintable bytes replaced by
 * '?' and cut to the limit.  Returns EX_OK, or EX_USAGE after a message
 * naming subcommand cmd.
 */
int ks_cli_actor(const char *cmd, const char *given, char *out, size_t cap);

/*
 * Open the rollout store of database path, read-only or not (a writer
 * creates or upgrades keyshift's tables): a SQLite file (which must
 * exist), or a PostgreSQL connection string (checked as ks_cli_db_check;
 * the store of ks_rollout_store_pg_open).  Returns EX_OK, or an exit code
 * after printing the problem (never the connection string).
 */
int ks_cli_rollout_open(const char *path, int read_only, ks_rollout_db **out);

/*
 * Every rollout of db, in id order, into a malloc'd array *out of *n (the
 * caller frees it; NULL when there is none).  Returns EX_OK, or an exit
 * code after printing the problem with path.
 */
int ks_cli_rollouts_all(ks_rollout_db *db, const char *path, ks_rollout **out, size_t *n);

/*
 * Count table.column of database path by class (ks_census_run over a
 * read-only store).  Returns EX_OK, or an exit code after printing the
 * problem.  The caller frees *out with ks_census_free.
 */
int ks_cli_census(const char *path, const char *table, const char *column,
                  ks_value_encoding encoding, ks_census *out);

/* The rows of census c in any class under (key_id, key_version). */
uint64_t ks_cli_census_key_rows(const ks_census *c, const char *key_id, uint32_t key_version);

/* Subcommands. */
int ks_cmd_inspect(int argc, char **argv);
int ks_cmd_keys(int argc, char **argv);
int ks_cmd_providers(int argc, char **argv);
int ks_cmd_encrypt(int argc, char **argv);
int ks_cmd_decrypt(int argc, char **argv);
int ks_cmd_census(int argc, char **argv);
int ks_cmd_migrate(int argc, char **argv);
int ks_cmd_rollout(int argc, char **argv);
int ks_cmd_serve(int argc, char **argv);

#endif /* KS_TOOLS_CLI_H */
