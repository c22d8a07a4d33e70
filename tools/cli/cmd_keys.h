/*
 * tools/cli/cmd_keys.h -- what the files of `keyshift keys` share
 * (tools/cli/cmd_keys.c, cmd_keys_list.c and cmd_keys_guard.c).  A tool's
 * header: nothing here is part of the library.  Each function's comment
 * is at its definition.
 */
#ifndef KS_TOOLS_CMD_KEYS_H
#define KS_TOOLS_CMD_KEYS_H

#include "cli.h"

/* What set-state destroyed checks and does besides the keyring. */
typedef struct ks_cli_destroy_opts {
    const char *dbs[16];
    int n_dbs, force;
    const char *reason;
} ks_cli_destroy_opts;

/* tools/cli/cmd_keys_list.c: `keys list`. */
int ks_cli_list_keys(const ks_provider *p, const ks_registry *reg, int json);

/* tools/cli/cmd_keys_guard.c: the guard of set-state destroyed. */
int ks_cli_collect_dbs(int argc, char **argv, ks_cli_destroy_opts *d);
int ks_cli_note_forced(const char *db, const char *label, const int64_t *ids, size_t n,
                       const char *key_id, uint32_t version, const char *reason);
const char *ks_cli_db_label(const ks_cli_destroy_opts *d, int i, char *buf, size_t cap);
int ks_cli_destroy_guard(const ks_cli_destroy_opts *d, const char *key_id, uint32_t version,
                         int64_t affected[][64], size_t *n_affected);

#endif /* KS_TOOLS_CMD_KEYS_H */
