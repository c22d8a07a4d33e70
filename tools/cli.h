/*
 * tools/cli.h -- shared helpers of the keyshift command-line tool.
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

/* Print "keyshift: " and a formatted message to stderr, with a newline. */
void ks_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a usage error for subcommand cmd and return EX_USAGE. */
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

/* Write len bytes as lowercase hex. */
void ks_cli_put_hex(FILE *f, const uint8_t *p, size_t len);

/* Write bytes as a JSON string literal, quotes included, escaping
 * quotes, backslashes, control characters and bytes >= 0x80. */
void ks_cli_put_json_string(FILE *f, const uint8_t *p, size_t len);

/* Nonzero when arg is -h or --help. */
int ks_cli_is_help(const char *arg);

/* Subcommands. */
int ks_cmd_inspect(int argc, char **argv);

#endif /* KS_TOOLS_CLI_H */
