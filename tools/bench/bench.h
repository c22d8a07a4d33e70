/*
 * tools/bench/bench.h -- what the parts of `make bench` share (tools/bench/bench.c,
 * tools/bench/bench_app.c, tools/bench/bench_migrate.c, tools/bench/bench_hsm.c,
 * tools/bench/bench_plugin.c, tools/bench/bench_remote.c, tools/bench/bench_pg.c):
 * the interleaved pair measurement, the throw-away keyring and the
 * migration fixtures (tools/bench/bench_migrate.c).  A tool's header: nothing here is
 * part of the library.
 */
#ifndef KS_TOOLS_BENCH_H
#define KS_TOOLS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/keyshift.h>

/* One operation under test: returns 0 on success. */
typedef int (*op_fn)(void *arg);

/* The result of measuring a contender against its baseline. */
typedef struct pair_result {
    double ns, base_ns;         /* fastest round of each: the figure compared */
    double med_ns, med_base_ns; /* median round of each, for reference */
    double allocs;
} pair_result;

/* ns/op of fn against base, interleaved (tools/bench/bench.c). */
pair_result measure_pair(op_fn fn, void *arg, op_fn base, void *base_arg);

/* A throw-away local keyring in a new temp directory dir, with the key
 * "bench/kek", and a context over it; bench_keyring_remove removes it. */
int bench_keyring(char *dir, size_t dir_cap, ks_keyring **kr, ks_ctx **ctx);
void bench_keyring_remove(const char *dir);

/* Run argv (a program on PATH) and wait: its standard output into
 * out[0, cap) (NUL-terminated, trailing newlines cut), or to /dev/null
 * with out NULL, so that only JSON lines reach ours.  0 when it exited
 * 0 (tools/bench/bench.c). */
int bench_spawn(char *const argv[], char *out, size_t cap);

/* Nanoseconds and seconds of monotonic time (tools/bench/bench.c). */
double now_ns(void);
double now_s(void);

/* Byte copies of a database, and their removal (with journals). */
int copy_file(const char *from, const char *to);
void remove_db(const char *path);

/* A database of n rows of MIG_VALUE random bytes (see tools/bench/bench_migrate.c). */
int mig_create(const char *path, long n);

/* One migration of path with the bench's parameters to (key, version),
 * timed into *secs, the context's metrics into *m. */
int mig_run_to(const ks_provider *prov, const char *path, ks_migrate_mode mode, const char *key,
               uint32_t version, uint64_t dek_messages, unsigned flags, double *secs, ks_metrics *m,
               ks_checkpoint *cp_out);

/* One migration through st (any store) with a fresh context: mig_run_to
 * without the SQLite file. */
int mig_run_store(const ks_provider *prov, const ks_rowstore *st, ks_migrate_mode mode, const char *key,
                  uint32_t version, uint64_t dek_messages, unsigned flags, double *secs, ks_metrics *m,
                  ks_checkpoint *cp_out);

/* The bench's migration parameters (MIG_TENANT, MIG_PURPOSE, MIG_TEMPLATE,
 * MIG_BATCH, format 2, xchacha20-poly1305) to (key, version). */
ks_migrate_params mig_params(ks_migrate_mode mode, const char *key, uint32_t version);

/* Print one goal line (JSON): the median of the n pair ratios r[] against
 * goal (at most, or at least), with every pair's ratio; sorts r. */
void mig_goal(const char *name, const char *ratio_name, double *r, int n, double goal, int at_most,
              long rows, double t, double base_t);

/* The median of v[0, n) (sorts v). */
double median(double *v, int n);

/* Threads of a scaling figure (the machine's cores: more says nothing),
 * and the baseline speedup below which the second core was busy and a
 * scaling goal says nothing. */
#define BENCH_THREADS 2
#define BENCH_THREAD_SCALED 1.5

/* Thread-scaling figures (tools/bench/bench.c): ops/s of fn with 1 and
 * BENCH_THREADS threads, thread i on cases + i * stride, and of base on
 * base_cases likewise, into best[] (fn 1t, fn 2t, base 1t, base 2t), each
 * the best of its rounds, the four interleaved.  -1 when a call failed. */
int bench_scaling(op_fn fn, void *cases, op_fn base, void *base_cases, size_t stride, double best[4]);

/* ks_app with a rollout on SQLite against the ks_ctx under it
 * (tools/bench/bench_app.c). */
int bench_app(void);

/* The migration and census part (tools/bench/bench_migrate.c). */
int bench_migrate(void);

/* The HSM part (tools/bench/bench_hsm.c) and the KMS plugin part
 * (tools/bench/bench_plugin.c). */
int bench_hsm(void);
int bench_plugin(void);

/* The PostgreSQL part (tools/bench/bench_pg.c). */
int bench_pg(void);

/* ---- a provider outside the process against the local keyring (tools/bench/bench_remote.c) ---- */

/* A router: key_ids beginning with prefix go to remote, the rest to local. */
typedef struct bench_router {
    ks_provider local;
    const ks_provider *remote;
    const char *prefix;
} bench_router;

/* The provider over r (which must outlive it). */
ks_provider bench_router_provider(bench_router *r);

/* What bench_remote() measures: the remote provider, the key_id prefix the
 * bench's router sends to it, and its key version, created by the caller. */
typedef struct remote_case {
    const char *name;          /* "hsm", "plugin": the JSON lines' names */
    const ks_provider *remote;
    const char *prefix;
    const char *key;
    uint32_t version;
} remote_case;

/* One call and a rewrap migration of rc->remote against the local
 * keyring kr (which holds MIG_KEY version 1; the bench adds version 2),
 * with the databases in dir.  0, or -1 after a message on stderr. */
int bench_remote(const remote_case *rc, ks_keyring *kr, const char *dir);

/* A source database in dir of rows rows sealed under MIG_KEY v1 of kr, a
 * new DEK every dek_messages seals; its path into src, its DEKs to *deks. */
int bench_source(ks_keyring *kr, const char *dir, long rows, uint64_t dek_messages, char *src, size_t cap,
                 uint64_t *deks);

/* One timed rewrap of a copy of src (at work, removed after) to (key,
 * version) under prov. */
int bench_rewrap_once(const ks_provider *prov, const char *src, const char *work, const char *key,
                      uint32_t version, double *secs, ks_metrics *m);

/* The rows of the migration benches: KS_BENCH_MIGRATE_ROWS, else MIG_ROWS_DEFAULT. */
long bench_rows(void);

/* Remove dir and everything under it (a run's own temp directory). */
void bench_tree_remove(const char *dir);

#define MIG_ROWS_DEFAULT 20000
#define MIG_VALUE 2048
#define MIG_VALUE_MAX 65536 /* KS_BENCH_MIGRATE_VALUE's largest (bench.c, mig_value()) */
#define MIG_BATCH 500
#define MIG_REPS_DEFAULT 21
#define MIG_REPS_MAX 64
#define MIG_DEK_MESSAGES 1000

/* mig_run flags: verification off (for the record only); no pipeline;
 * synchronous NORMAL for the store and the raw pass alike (a WAL
 * database: the store refuses it otherwise). */
#define MIG_NO_VERIFY 1u
#define MIG_SERIAL 2u
#define MIG_SYNC_NORMAL 4u

static const char MIG_KEY[] = "bench/kek";
static const char MIG_TENANT[] = "tenant-00042";
static const char MIG_PURPOSE[] = "card";
static const char MIG_TEMPLATE[] = "payments:{id}:card";

#endif /* KS_TOOLS_BENCH_H */
