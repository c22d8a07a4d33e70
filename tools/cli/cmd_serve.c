/*
 * tools/cli/cmd_serve.c -- `keyshift serve`: run the local encryption
 * agent (tools/agent/, docs/agent.md) with the keys and the rollout state
 * every other command takes.
 *
 * This file only reads the command line: keys as ks_cli_keys_open names
 * them (the passphrase in sodium_malloc'd memory, kept for reloads), the
 * repeatable --listen and --scope, and the limits.  The agent itself runs
 * in ks_agent_run.
 */
#define _POSIX_C_SOURCE 200809L

#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../agent/agent.h"
#include "cli.h"

/* Manual of `keyshift serve`. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift serve - run the local encryption agent\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift serve --listen unix:PATH --policy FILE --scope TABLE.COLUMN...\n"
          "                   [--listen tcp:127.0.0.1:PORT] [--socket-mode MODE]\n"
          "                   [--socket-group GROUP] [--db DB --instance-id ID\n"
          "                   [--interval DURATION]]\n"
          "                   [--key KEY_ID] [--keyring FILE [--passphrase-file FILE] |\n"
          "                   --providers FILE] [LIMITS]\n"
          "\n"
          "DESCRIPTION\n"
          "    Serves seal, open and parse of records over HTTP/1.1 on a Unix socket\n"
          "    (docs/agent.md), so that a service in any language encrypts its\n"
          "    database values without holding a key, a keyring passphrase or an\n"
          "    HSM PIN. Each request names its records' scope (TABLE.COLUMN), tenant,\n"
          "    purpose and context; the agent seals each record in the class the\n"
          "    rollout of its scope says, refuses an open that the rollout's phase\n"
          "    forbids, and reports its health to the rollouts as one registered\n"
          "    reader (--instance-id) with the key versions it holds.\n"
          "\n"
          "    Every peer is identified by its uid and gid (SO_PEERCRED) and denied\n"
          "    unless the agent policy file (--policy) allows it the operation on\n"
          "    the record's scope and tenant; a denial is answered 403 and logged\n"
          "    with the uid, never with any payload. A TCP listener, on a loopback\n"
          "    address only, serves /metrics, /healthz and /readyz and nothing else.\n"
          "\n"
          "    Each connection has a thread that reads and serves its requests; at\n"
          "    most --workers requests are served at once, at most --queue more wait\n"
          "    for a turn, and one more is answered 503 with Retry-After. Signals:\n"
          "    SIGHUP reopens\n"
          "    the keyring or provider registry, the rollout state and the policy,\n"
          "    all or nothing (a bad file keeps the configuration in use, is logged\n"
          "    and counted in /metrics); SIGTERM or SIGINT stops accepting, answers\n"
          "    every request already accepted within --drain, deregisters the\n"
          "    instance and exits 0. Under systemd socket activation (the\n"
          "    keyshift-agent.socket unit) the sockets systemd passes are used and\n"
          "    --listen is not needed. Log lines go to standard error.\n"
          "\n"
          "OPTIONS\n"
          "    --listen unix:PATH  serve the API on a Unix socket at PATH (created;\n"
          "                    a stale socket file is replaced, a live one refused)\n"
          "    --listen tcp:127.0.0.1:PORT  serve /metrics, /healthz and /readyz on a\n"
          "                    loopback address (PORT 0: any free port, logged)\n"
          "    --socket-mode MODE  the Unix socket's mode, octal (default 0660)\n"
          "    --socket-group GROUP  the Unix socket's group, a name or a gid\n"
          "                    (default: the agent's)\n"
          "    --policy FILE   the agent policy (docs/agent-policy.md), required with a\n"
          "                    Unix listener; refused when group or others can write it\n"
          "    --scope TABLE.COLUMN  a column the agent serves; repeat for more (at\n"
          "                    least one, at most 64)\n"
          "    --db DB         " KS_CLI_DB_RULE
          "          The application's, where the rollouts live; without --db no\n"
          "          rollout governs: seal writes --key\n"
          "    --instance-id ID  this agent's reader id in the rollouts, 1..128 bytes\n"
          "                    of [A-Za-z0-9._:-] (required with --db)\n"
          "    --interval DURATION  the heartbeat, health report and keyring reload\n"
          "                    period, and the rollout state's refresh period\n"
          "                    (500ms, 2s); default: the first three every 5 s,\n"
          "                    the refresh every 500 ms\n"
          "    --key KEY_ID    the key sealed under where no rollout governs a scope\n"
          "    --keyring FILE  default: $KEYSHIFT_KEYRING\n"
          "    --passphrase-file FILE  keyring passphrase (default: $KEYSHIFT_PASSPHRASE);\n"
          "                    " KS_CLI_PASSPHRASE_RULE "; kept in locked memory for reloads\n"
          "    --providers FILE  " KS_CLI_KEYS_RULE
          "    -h, --help      print this manual\n"
          "\n"
          "LIMITS\n"
          "    --max-request BYTES  largest request body (default 4194304); larger is\n"
          "                    answered 413\n"
          "    --max-batch N   most records in a batch (default 1000)\n"
          "    --max-connections N  open connections at once (default 256)\n"
          "    --workers N     requests served at once (default: the number of CPUs)\n"
          "    --queue N       requests waiting for a turn (default 1024); beyond,\n"
          "                    503 with Retry-After\n"
          "    --deadline MS   a request not started within MS of arriving is answered\n"
          "                    503 (default 5000)\n"
          "    --idle-timeout S  close a connection idle or stalled for S seconds\n"
          "                    (default 30)\n"
          "    --drain MS      on SIGTERM, how long accepted requests may take\n"
          "                    (default 10000)\n"
          "    --dek-max-messages N  seals under one data key before a fresh one is\n"
          "                    wrapped (default 16777216; 1: one provider wrap per seal)\n"
          "    --cache-entries N  unwrapped data keys kept for opens (default 4096;\n"
          "                    0: one provider unwrap per open)\n"
          "\n"
          "ENVIRONMENT\n"
          "    KEYSHIFT_KEYRING, KEYSHIFT_PASSPHRASE, KEYSHIFT_PROVIDERS  as for every\n"
          "                    command (keyshift --help)\n"
          "    LISTEN_FDS, LISTEN_PID  systemd socket activation (sd_listen_fds(3))\n"
          KS_CLI_PG_ENV
          "\n"
          "FILES\n"
          "    tools/agent/keyshift-agent.service, tools/agent/keyshift-agent.socket\n"
          "                    systemd units with hardening (docs/agent.md section 9)\n"
          "\n"
          "EXIT STATUS\n"
          "    0 stopped by SIGTERM or SIGINT after draining; 64 usage (a Unix listener\n"
          "    without --policy, no --scope); 69 a socket could not be created or\n"
          "    bound; 71 out of memory or threads; 78 the keys, the rollout state or\n"
          "    the policy did not open (insecure, unreadable or corrupt file, wrong\n"
          "    passphrase, unreachable database).\n"
          "\n"
          "EXAMPLE\n"
          "    keyshift serve --listen unix:/run/keyshift/agent.sock --policy agent.policy \\\n"
          "        --scope payments.card --db app.db --instance-id agent-1 \\\n"
          "        --keyring keyring --listen tcp:127.0.0.1:9464 &\n"
          "    curl --unix-socket /run/keyshift/agent.sock -d \\\n"
          "        '{\"scope\":\"payments.card\",\"tenant\":\"acme\",\"plaintext\":\"NDExMQ==\"}' \\\n"
          "        http://agent/v1/seal\n",
          f);
}

/* Collect every value of the repeatable option name ("--scope") from argv
 * into out[0, max); *n their count.  Returns EX_OK or EX_USAGE. */
static int collect(int argc, char **argv, const char *name, const char **out, size_t max,
                   size_t *n)
{
    const size_t nl = strlen(name);
    *n = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            break;
        }
        const char *v = NULL;
        if (strcmp(argv[i], name) == 0 && i + 1 < argc) {
            v = argv[++i];
        } else if (strncmp(argv[i], name, nl) == 0 && argv[i][nl] == '=') {
            v = argv[i] + nl + 1;
        }
        if (v == NULL) {
            continue;
        }
        if (*n == max) {
            return ks_cli_usage_error("serve", "%s is given more than %zu times", name, max);
        }
        out[(*n)++] = v;
    }
    return EX_OK;
}

/* Parse a decimal option value s into *out within [lo, hi] (NULL s keeps
 * the default); EX_OK or EX_USAGE. */
static int num(const char *name, const char *s, size_t lo, size_t hi, size_t *out)
{
    if (s != NULL && ks_cli_parse_size(s, lo, hi, out) != 0) {
        return ks_cli_usage_error("serve", "%s wants a number from %zu to %zu", name, lo, hi);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cmd_serve(int argc, char **argv)
{
    const char *listen = NULL, *mode = NULL, *group = NULL, *policy = NULL, *scope = NULL;
    const char *db = NULL, *instance = NULL, *key = NULL, *keyring = NULL, *passfile = NULL;
    const char *providers = NULL, *max_request = NULL, *max_batch = NULL, *max_conn = NULL;
    const char *workers = NULL, *queue = NULL, *deadline = NULL, *idle = NULL, *drain = NULL;
    const char *dek_max = NULL, *cache = NULL, *interval = NULL;
    const ks_cli_opt opts[] = {
        {"--listen", &listen, NULL},         {"--socket-mode", &mode, NULL},
        {"--socket-group", &group, NULL},    {"--policy", &policy, NULL},
        {"--scope", &scope, NULL},           {"--db", &db, NULL},
        {"--instance-id", &instance, NULL},  {"--key", &key, NULL},
        {"--keyring", &keyring, NULL},       {"--passphrase-file", &passfile, NULL},
        {"--providers", &providers, NULL},   {"--max-request", &max_request, NULL},
        {"--max-batch", &max_batch, NULL},   {"--max-connections", &max_conn, NULL},
        {"--workers", &workers, NULL},       {"--queue", &queue, NULL},
        {"--deadline", &deadline, NULL},     {"--idle-timeout", &idle, NULL},
        {"--drain", &drain, NULL},           {"--dek-max-messages", &dek_max, NULL},
        {"--cache-entries", &cache, NULL},   {"--interval", &interval, NULL},
        {NULL, NULL, NULL},
    };
    int rc, npos;
    if (ks_cli_parse_opts("serve", usage, argc, argv, opts, NULL, 0, &npos, &rc)) {
        return rc;
    }
    ks_agent_config c;
    memset(&c, 0, sizeof c);
    if ((rc = collect(argc, argv, "--listen", c.listen, KS_AGENT_LISTEN_MAX, &c.n_listen)) != EX_OK ||
        (rc = collect(argc, argv, "--scope", c.scopes, KS_AGENT_SCOPES_MAX, &c.n_scopes)) != EX_OK) {
        return rc;
    }
    if (c.n_scopes == 0) {
        return ks_cli_usage_error("serve", "name at least one --scope TABLE.COLUMN to serve");
    }
    if (c.n_listen == 0 && getenv("LISTEN_FDS") == NULL) {
        return ks_cli_usage_error("serve", "give --listen unix:PATH (or run under systemd "
                                           "socket activation)");
    }
    for (size_t i = 0; i < c.n_listen && policy == NULL; i++) {
        if (strncmp(c.listen[i], "unix:", 5) == 0) {
            return ks_cli_usage_error("serve", "a Unix listener needs --policy FILE: the agent "
                                               "denies every peer its policy does not name");
        }
    }
    if (db != NULL && instance == NULL) {
        return ks_cli_usage_error("serve", "--db needs --instance-id, this agent's reader id");
    }
    if (db != NULL && (rc = ks_cli_db_check(db, NULL)) != EX_OK) {
        return rc;
    }
    c.socket_mode = 0660;
    if (mode != NULL) {
        char *end;
        unsigned long m = strtoul(mode, &end, 8);
        if (*mode == '\0' || *end != '\0' || m > 0777) {
            return ks_cli_usage_error("serve", "--socket-mode wants octal mode bits, e.g. 0660");
        }
        c.socket_mode = (uint32_t)m;
    }
    c.socket_gid = -1;
    if (group != NULL) {
        size_t gid;
        struct group *g = getgrnam(group);
        if (g != NULL) {
            c.socket_gid = (int)g->gr_gid;
        } else if (ks_cli_parse_size(group, 0, 0x7FFFFFFF, &gid) == 0) {
            c.socket_gid = (int)gid;
        } else {
            return ks_cli_usage_error("serve", "--socket-group: no such group '%s'", group);
        }
    }
    size_t v_body = 4u << 20, v_batch = 1000, v_conn = 256, v_queue = 1024, v_deadline = 5000;
    size_t v_idle = 30, v_drain = 10000, v_dek = 0, v_cache = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t v_workers = cpus > 0 ? (size_t)cpus : 2;
    if ((rc = num("--max-request", max_request, 256, (size_t)64 << 20, &v_body)) != EX_OK ||
        (rc = num("--max-batch", max_batch, 1, 100000, &v_batch)) != EX_OK ||
        (rc = num("--max-connections", max_conn, 1, 65536, &v_conn)) != EX_OK ||
        (rc = num("--workers", workers, 1, 1024, &v_workers)) != EX_OK ||
        (rc = num("--queue", queue, 1, 1u << 20, &v_queue)) != EX_OK ||
        (rc = num("--deadline", deadline, 1, 3600000, &v_deadline)) != EX_OK ||
        (rc = num("--idle-timeout", idle, 1, 86400, &v_idle)) != EX_OK ||
        (rc = num("--drain", drain, 0, 3600000, &v_drain)) != EX_OK ||
        (rc = num("--dek-max-messages", dek_max, 1, (size_t)1 << 32, &v_dek)) != EX_OK ||
        (rc = num("--cache-entries", cache, 0, 1u << 24, &v_cache)) != EX_OK) {
        return rc;
    }
    c.max_body = v_body;
    c.max_batch = v_batch;
    c.max_connections = (unsigned)v_conn;
    c.workers = (unsigned)v_workers;
    c.queue = v_queue;
    c.deadline_ms = (uint32_t)v_deadline;
    c.idle_timeout_s = (unsigned)v_idle;
    c.drain_ms = (uint32_t)v_drain;
    c.dek_max_messages = v_dek;
    c.cache_entries = cache != NULL ? (long)v_cache : -1;
    if (interval != NULL && (db == NULL || ks_cli_parse_duration_ms(interval, &c.interval_ms) != 0 ||
                             c.interval_ms == 0 || c.interval_ms > 3600000)) {
        return ks_cli_usage_error("serve", db == NULL ? "--interval is the rollout's: it needs --db"
                                                      : "--interval must be a duration from 1ms to 1h "
                                                        "(500ms, 2s)");
    }
    c.policy = policy;
    c.database = db;
    c.instance_id = instance;
    c.default_key_id = key;

    /* The keys: as every command names them [P-LOAD-1]; the app opens them. */
    if (keyring != NULL && providers != NULL) {
        return ks_cli_usage_error("serve", "give --keyring or --providers, not both");
    }
    ks_bytes pass = {NULL, 0};
    if (providers == NULL && keyring == NULL) {
        providers = getenv("KEYSHIFT_PROVIDERS");
    }
    if (providers == NULL) {
        if ((rc = ks_cli_keyring_args(&keyring, passfile, &pass)) != EX_OK) {
            return rc;
        }
    }
    c.keyring = providers == NULL ? keyring : NULL;
    c.providers = providers;
    c.passphrase = pass;
    rc = ks_agent_run(&c);
    ks_cli_passphrase_free(&pass);
    return rc;
}
