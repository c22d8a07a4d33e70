/*
 * keyshift/rollout.h -- rollouts: moving one scope (a table and column of
 * the application's SQLite database, or every envelope of one key_id in a
 * listed set of columns) from a source to a target through
 * guarded phases, with a reader registry, a transition log and health
 * metrics (docs/rollout.md, "Model, tables and guards").
 *
 * Phases, in order:
 *   planned        apps write the source, read the source;
 *   read-compat    write the source, read source + target;
 *   write-upgrade  write the target for canary tenants (all, a tenant
 *                  list, or a percentage by a stable hash), the source for
 *                  the rest; read source + target;
 *   backfill       write the target; `migrate` converts old rows; read
 *                  source + target;
 *   finalized      write the target, read the target only.
 * The latest rollout of a scope governs it; at most one rollout of a
 * scope is not finalized.
 *
 * Three parts:
 *   - pure functions (no I/O, no clock): phase names, class and key-list
 *     checks, the guards (ks_rollout_guard), the canary bucket;
 *   - ks_rollout_db: the state in the application's database (tables
 *     keyshift_rollout, keyshift_rollout_log, keyshift_readers,
 *     keyshift_metrics, keyshift_rollout_column; schema version 4 of
 *     keyshift_meta), reached through a rollout store
 *     (keyshift/rollout_store.h: SQLite by ks_rollout_db_open, any other
 *     by ks_rollout_db_wrap);
 *   - ks_policy: what an application embeds to ask "what do I write" and
 *     "may I read this", cached in memory.
 *
 * Ownership.  The caller owns every struct passed in or out; the library
 * keeps no pointer to them after a call returns.  Strings in records are
 * NUL-terminated copies inside the record.  Times are Unix seconds; every
 * function that depends on the time takes `now` from the caller (tests
 * pass it explicitly; applications pass time(NULL)), except ks_policy_*,
 * which read the clock.
 *
 * Values read back from the database are untrusted: every row is checked
 * (phase names, classes, key lists, histogram blob lengths, counters) and
 * a malformed row fails with KS_ERR_STORE, never a crash.
 *
 * Threads.  A ks_rollout_db is used by one thread at a time.  A ks_policy
 * may be used from several threads at once: answers take no lock (each
 * thread marks its reading on a flag of its own; a reload swaps the rules
 * in once none is reading), so threads answering at once scale; a
 * refresh that is due, a reload and the instance's writes take mutexes.
 * A child of fork() must not use its parent's policy.
 */
#ifndef KEYSHIFT_ROLLOUT_H
#define KEYSHIFT_ROLLOUT_H

#include <keyshift/common.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/health.h>
#include <keyshift/provider.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits ------------------------------------------------------------ */

#define KS_ROLLOUT_IDENT_MAX 255      /* bytes of a table or column name */
#define KS_ROLLOUT_TENANTS_MAX 64     /* tenants in a canary list */
#define KS_ROLLOUT_ACTOR_MAX 128      /* bytes of an actor in the log */
#define KS_ROLLOUT_REASON_MAX 1024    /* bytes of a reason in the log */
#define KS_INSTANCE_ID_MAX 128        /* bytes of a reader's instance id */
#define KS_LIBRARY_VERSION_MAX 32     /* bytes of a reader's library version */
#define KS_READER_KEYS_MAX 4096       /* bytes of a reader's key-version list */
#define KS_ROLLOUT_COLUMNS_MAX 16     /* columns of a key-scoped rollout */

/* ---- classes and phases ------------------------------------------------ */

/* What values of a scope are: plaintext, or envelopes of one (format
 * version, algorithm, key_id, key_version).  A target is never plaintext. */
typedef struct ks_rollout_class {
    int is_plaintext;                  /* nonzero: the other fields are 0 / empty */
    uint8_t version;                   /* KS_FORMAT_V1 or KS_FORMAT_V2 */
    uint32_t algorithm;                /* KS_ALG_* */
    char key_id[KS_KEY_ID_MAX + 1];    /* [F-KEYID-1], NUL-terminated */
    uint32_t key_version;              /* >= 1 */
} ks_rollout_class;

typedef enum ks_rollout_phase {
    KS_PHASE_PLANNED = 1,
    KS_PHASE_READ_COMPAT = 2,
    KS_PHASE_WRITE_UPGRADE = 3,
    KS_PHASE_BACKFILL = 4,
    KS_PHASE_FINALIZED = 5
} ks_rollout_phase;

/* The name of a phase ("planned", "read-compat", "write-upgrade",
 * "backfill", "finalized"), or NULL for another value.  Static storage. */
KS_API const char *ks_rollout_phase_name(int phase);

/* The phase for a name (exact, case-sensitive), or 0 when unknown. */
KS_API int ks_rollout_phase_from_name(const char *name);

/* KS_OK when c is a well-formed class (plaintext only if may_be_plaintext;
 * an envelope class with version 1|2, a defined algorithm, a key_id of
 * 1..KS_KEY_ID_MAX bytes of [F-KEYID-1] and key_version >= 1), else
 * KS_ERR_INVALID_ARGUMENT. */
KS_API KS_WUR ks_err ks_rollout_class_check(const ks_rollout_class *c, int may_be_plaintext);

/* Nonzero when a and b are the same class. */
KS_API int ks_rollout_class_equal(const ks_rollout_class *a, const ks_rollout_class *b);

/* ---- canary ------------------------------------------------------------ */

typedef enum ks_canary_kind {
    KS_CANARY_ALL = 0,       /* every tenant writes the target in write-upgrade */
    KS_CANARY_TENANTS = 1,   /* only the listed tenants */
    KS_CANARY_PERCENT = 2    /* tenants whose bucket is below percent * 100 */
} ks_canary_kind;

/* Who writes the target during write-upgrade.  Tenants are 1..KS_TENANT_MAX
 * bytes of [F-NAME-1], distinct, NUL-terminated. */
typedef struct ks_rollout_canary {
    ks_canary_kind kind;
    uint32_t percent;                                        /* KS_CANARY_PERCENT: 0..100 */
    size_t n_tenants;                                        /* KS_CANARY_TENANTS: 1.. */
    char tenants[KS_ROLLOUT_TENANTS_MAX][KS_TENANT_MAX + 1];
} ks_rollout_canary;

/*
 * The canary bucket of a tenant in rollout rollout_id, 0..9999: the first
 * 8 bytes, read big-endian, of BLAKE2b-256 (unkeyed) of
 *   "keyshift-canary" (15 bytes) || rollout_id (8 bytes, big-endian,
 *   two's complement) || tenant bytes
 * modulo 10000.  A tenant is in a KS_CANARY_PERCENT canary when its
 * bucket < percent * 100.  Stable across processes, hosts and releases;
 * independent between rollouts.  Needs libsodium (initialised here).
 */
KS_API uint32_t ks_rollout_canary_bucket(int64_t rollout_id, ks_bytes tenant);

/* ---- the rollout record ------------------------------------------------ */

/* What a rollout moves (docs/rollout.md, "Scopes"). */
typedef enum ks_rollout_scope {
    KS_SCOPE_COLUMN = 0,   /* one table and column: every value in it */
    KS_SCOPE_KEY = 1       /* every envelope of one key_id (the source's, which is also
                              the target's) in a listed set of columns */
} ks_rollout_scope;

/* One column of a key-scoped rollout. */
typedef struct ks_rollout_column {
    char table[KS_ROLLOUT_IDENT_MAX + 1];    /* the schema's spelling */
    char column[KS_ROLLOUT_IDENT_MAX + 1];
    int64_t verified_at;                     /* 0, or when a complete `migrate verify` of this
                                                column last passed in backfill (reset on
                                                entering backfill) */
} ks_rollout_column;

typedef struct ks_rollout {
    int64_t id;                              /* assigned by ks_rollout_db_start */
    char table[KS_ROLLOUT_IDENT_MAX + 1];    /* the schema's spelling */
    char column[KS_ROLLOUT_IDENT_MAX + 1];
    ks_rollout_class source;                 /* plaintext or a class */
    ks_rollout_class target;                 /* a class */
    ks_rollout_phase phase;
    int64_t phase_since;                     /* when the current phase was entered */
    ks_rollout_canary canary;
    ks_thresholds thresholds;                /* health thresholds, stored as given */
    uint32_t min_soak_s;                     /* least time in read-compat before write-upgrade */
    uint32_t reader_ttl_s;                   /* a reader is live if its heartbeat is this recent;
                                                >= 1 */
    int64_t created, updated;
    int64_t verified_at;                     /* 0, or when `migrate verify` last passed while
                                                in backfill (reset on entering backfill);
                                                column scope only */
    /* The scope.  KS_SCOPE_COLUMN: table and column above, n_columns 0.
     * KS_SCOPE_KEY: table and column are empty; the key_id is
     * source.key_id (== target.key_id; the source is never plaintext);
     * columns[0, n_columns) are distinct, n_columns >= 1, each with its
     * own verify time. */
    ks_rollout_scope scope;
    size_t n_columns;
    ks_rollout_column columns[KS_ROLLOUT_COLUMNS_MAX];
    /* How the scope's columns hold envelopes (docs/format.md section 10):
     * binary (0, the default, and what a rollout recorded before the field
     * existed reads as) or base64 text.  Every column of a key scope holds
     * them alike.  The rollout's census and the migrate and verify runs it
     * counts use it; ks_policy_column_encoding answers it. */
    ks_value_encoding encoding;
} ks_rollout;

/* Nonzero when r's scope covers table.column (names compared as SQLite
 * compares identifiers, ASCII case-insensitive): its column, or one of
 * its listed columns. */
KS_API int ks_rollout_scope_covers(const ks_rollout *r, const char *table, const char *column);

/*
 * The rollout among rs[0, n) that governs values of table.column whose
 * key_id is key_id (NULL or "" for values without one: plaintext, NULL,
 * unparseable): of the column-scoped rollouts of table.column and (with a
 * key_id) the key-scoped rollouts of key_id covering table.column, the
 * one with the highest id; NULL when there is none.  The same rule
 * decides for the policy, `migrate run` and the fuzzer.
 */
KS_API const ks_rollout *ks_rollout_scope_find(const ks_rollout *rs, size_t n, const char *table,
                                               const char *column, const char *key_id);

/* Bytes that ks_rollout_scope_text always fits in, with its NUL. */
#define KS_ROLLOUT_SCOPE_TEXT_MAX \
    (KS_KEY_ID_MAX + 16 + KS_ROLLOUT_COLUMNS_MAX * (2 * KS_ROLLOUT_IDENT_MAX + 3))

/* The scope of r as text for messages into out (cut to out_len, which
 * must be >= 1): "payments.card", or "key payments-kek (payments.card,
 * orders.card)".  Returns out. */
KS_API const char *ks_rollout_scope_text(const ks_rollout *r, char *out, size_t out_len);

/* ---- readers ----------------------------------------------------------- */

/*
 * Key-version lists.  A reader's held key versions are stored as canonical
 * text: entries "key_id:version" joined by ',' with no spaces, key_id per
 * [F-KEYID-1] (which allows ':': the version follows the LAST ':'),
 * version decimal 1..4294967295 without leading zeros, entries in strictly
 * ascending order (key_id bytewise, then version numerically: no
 * duplicates), at most KS_READER_KEYS_MAX bytes.  "" is the empty list.
 */

/* KS_OK when text is a canonical list, else KS_ERR_BAD_VALUE
 * (KS_ERR_INVALID_ARGUMENT for NULL). */
KS_API KS_WUR ks_err ks_rollout_keys_check(const char *text);

/* Nonzero when canonical list text holds (key_id, version); 0 for a list
 * that is not canonical. */
KS_API int ks_rollout_keys_holds(const char *text, const char *key_id, uint32_t version);

/* Add (key_id, version) to the canonical list in list[0, cap) where it
 * sorts, keeping it canonical (already there: KS_OK, unchanged).
 * KS_ERR_BAD_VALUE when list is not canonical; KS_ERR_INVALID_ARGUMENT for
 * a bad key_id, version 0 or a list not NUL-terminated within cap;
 * KS_ERR_TOO_LARGE past KS_READER_KEYS_MAX bytes; KS_ERR_BUFFER_TOO_SMALL
 * when cap is short.  list is unchanged on error.  Start from "". */
KS_API KS_WUR ks_err ks_rollout_keys_add(char *list, size_t cap, const char *key_id,
                                         uint32_t version);

/* One application instance as registered in keyshift_readers. */
typedef struct ks_rollout_reader {
    char instance_id[KS_INSTANCE_ID_MAX + 1];        /* 1.. bytes of [F-NAME-1] */
    char library_version[KS_LIBRARY_VERSION_MAX + 1]; /* printable ASCII, may be empty */
    uint8_t max_format;                              /* highest format version it reads */
    uint32_t algorithms;                             /* bit (1u << KS_ALG_x) per algorithm read */
    char keys[KS_READER_KEYS_MAX + 1];               /* canonical key-version list */
    int64_t started, heartbeat;
} ks_rollout_reader;

/* Nonzero when reader r can read class c: everyone reads plaintext; an
 * envelope class needs max_format >= c->version, the algorithm's bit and
 * (c->key_id, c->key_version) in r->keys. */
KS_API int ks_rollout_reader_supports(const ks_rollout_reader *r, const ks_rollout_class *c);

/* ---- guards ------------------------------------------------------------ */

/* What a guard knows about a key version, as ks_ctx_key_info reports it:
 * KS_ROLLOUT_KEY_UNKNOWN when nobody asked (a guard that needs it
 * refuses), KS_ROLLOUT_KEY_MISSING when the provider said not-found, else
 * the ks_key_state. */
#define KS_ROLLOUT_KEY_UNKNOWN 0
#define KS_ROLLOUT_KEY_MISSING (-1)

/* Everything a guard decides on.  The caller fills now, the key states,
 * the census and the health status; ks_rollout_db_transition fills
 * rollout, readers and is_latest inside its transaction. */
typedef struct ks_rollout_facts {
    int64_t now;
    ks_rollout rollout;                   /* as it is now: rollout.phase is the "from" */
    int is_latest;                        /* no later rollout touches its scope: for a column
                                             scope, no later rollout of that column and no
                                             later key-scoped rollout covering it; for a key
                                             scope, no later rollout of its key_id and no later
                                             column-scoped rollout of one of its columns */
    int target_key_state;                 /* KS_ROLLOUT_KEY_* or ks_key_state */
    int source_key_state;                 /* idem (ignored for a plaintext source) */
    const ks_rollout_reader *readers;     /* the live readers (heartbeat within reader_ttl_s) */
    size_t n_readers;
    int census_known;                     /* 0: not computed (guards that need it refuse) */
    uint64_t rows_at_source;              /* rows of the scope in the source class (summed
                                             over every column of a key scope) */
    uint64_t rows_at_target;              /* rows of the scope in the target class (idem) */
    int health_known;                     /* 0: not evaluated */
    ks_health_status health;              /* the verdict over the thresholds' window */
} ks_rollout_facts;

/*
 * Decide whether f->rollout may move from its phase to `to`.  Pure: no
 * I/O, no clock.  Returns KS_OK, or:
 *   KS_ERR_STATE  there is no such transition (e.g. planned -> backfill);
 *   KS_ERR_GUARD  the transition exists but a condition is not met;
 * with a sentence in why (when given) saying what is missing, e.g.
 * "2 live readers do not hold payments-kek:2: web-7, web-9".
 * The rules (docs/rollout.md):
 *   planned -> read-compat: the target key version exists and is neither
 *     disabled nor destroyed;
 *   read-compat -> write-upgrade: every live reader supports the target,
 *     and read-compat has lasted at least min_soak_s;
 *   write-upgrade -> backfill: the health verdict is OK;
 *   backfill -> finalized: the census shows 0 rows at the source, and a
 *     verify pass was recorded at or after entering backfill (for a key
 *     scope: of every listed column; the refusal names those without);
 *   write-upgrade | backfill -> read-compat: always;
 *   read-compat -> planned: the census shows 0 rows at the target;
 *   finalized -> backfill: the rollout is still the latest of its scope
 *     and the source key version is known to exist and is not destroyed
 *     (a missing or unchecked key refuses; a plaintext source passes).
 */
KS_API KS_WUR ks_err ks_rollout_guard(const ks_rollout_facts *f, ks_rollout_phase to, char *why,
                                      size_t why_len);

/*
 * May f->rollout be aborted (ks_rollout_db_abort)?  Only a rollout that
 * has written its target nowhere: planned always; read-compat while the
 * census shows 0 rows at the target (census_known; a rollout rolled back
 * from write-upgrade may have left some).  Pure.  KS_OK, or KS_ERR_STATE
 * for write-upgrade, backfill (roll back to read-compat first) and
 * finalized, or KS_ERR_GUARD when the census is unknown or not 0, with
 * a sentence in why.  KS_ERR_INVALID_ARGUMENT for NULL or a bad phase.
 */
KS_API KS_WUR ks_err ks_rollout_abort_guard(const ks_rollout_facts *f, char *why, size_t why_len);

/* ---- the rollout store ------------------------------------------------- */

typedef struct ks_rollout_db ks_rollout_db;

/* ks_rollout_db_open flags. */
#define KS_ROLLOUT_DB_READ_ONLY 1u

/*
 * Open the application's SQLite database at path (never created: a
 * missing file is KS_ERR_NO_TARGET).  Unless KS_ROLLOUT_DB_READ_ONLY,
 * creates keyshift's tables, or upgrades those of schema version 1 (made
 * by the row store), 2 or 3 to version 4 in place, in one BEGIN IMMEDIATE
 * transaction.  A database of a newer version is refused (KS_ERR_STORE);
 * read-only, a database without the version 2 tables opens, and reads
 * find no rollout; a version 2 or 3 database is read as it is (every
 * rollout in a version 2 one is column-scoped; every rollout of either
 * is of binary encoding).  Messages go to errbuf.  Lock waits back off up to
 * 30 s (KS_ERR_BUSY).
 */
KS_API KS_WUR ks_err ks_rollout_db_open(const char *path, unsigned flags, ks_rollout_db **out,
                                        char *errbuf, size_t errbuf_len);

/* Close (every operation commits or rolls back before it returns, so
 * nothing is pending); NULL is a no-op.  Every change (start, transition,
 * canary, verify, readers, metrics) on a store opened read-only fails with
 * KS_ERR_INVALID_ARGUMENT. */
KS_API void ks_rollout_db_close(ks_rollout_db *db);

/*
 * Create a rollout in planned from spec's table, column, source, target,
 * canary, thresholds, min_soak_s, reader_ttl_s and encoding (its other fields are
 * ignored); its id goes to *id and a log row (from none to planned) is
 * written by actor.  The table and column are looked up in the schema
 * (KS_ERR_NO_TARGET if absent; keyshift_* and sqlite_* tables refused
 * with KS_ERR_INVALID_ARGUMENT) and stored in the schema's spelling.
 * KS_ERR_ROLLOUT_EXISTS when a rollout of the scope is not finalized;
 * KS_ERR_INVALID_ARGUMENT for a bad spec (bad class, equal source and
 * target, plaintext target, bad canary, NaN rate, reader_ttl_s 0, an
 * encoding neither binary nor base64).
 *
 * With spec->scope KS_SCOPE_KEY: table and column must be empty and
 * columns[0, n_columns) name 1..KS_ROLLOUT_COLUMNS_MAX distinct columns,
 * each looked up as above; the source must be an envelope class
 * (plaintext has no key_id) and the target must keep its key_id
 * (KS_ERR_INVALID_ARGUMENT otherwise).  Overlaps are refused with
 * KS_ERR_ROLLOUT_EXISTS, naming the rollout: another key-scoped rollout
 * of the same key_id that is not finalized, or a column-scoped rollout
 * that is not finalized of one of the columns; and, for a column scope,
 * a key-scoped rollout that is not finalized covering the column.
 */
KS_API KS_WUR ks_err ks_rollout_db_start(ks_rollout_db *db, const ks_rollout *spec,
                                         const char *actor, int64_t now, int64_t *id,
                                         char *errbuf, size_t errbuf_len);

/* The rollout with this id (KS_ERR_NO_ROLLOUT if none). */
KS_API KS_WUR ks_err ks_rollout_db_get(ks_rollout_db *db, int64_t id, ks_rollout *out);

/* The latest rollout of table.column (names compared as SQLite compares
 * identifiers, ASCII case-insensitive), KS_ERR_NO_ROLLOUT if none. */
KS_API KS_WUR ks_err ks_rollout_db_latest(ks_rollout_db *db, const char *table,
                                          const char *column, ks_rollout *out);

/* The latest key-scoped rollout of key_id, KS_ERR_NO_ROLLOUT if none. */
KS_API KS_WUR ks_err ks_rollout_db_latest_key(ks_rollout_db *db, const char *key_id,
                                              ks_rollout *out);

/* Up to max rollouts with id > after_id, in id order, into out[0, *n);
 * *n < max means the end. */
KS_API KS_WUR ks_err ks_rollout_db_list(ks_rollout_db *db, int64_t after_id, ks_rollout *out,
                                        size_t max, size_t *n);

/* A transition asked for by an operator (or by `check --auto-rollback`). */
typedef struct ks_rollout_change {
    int64_t id;                  /* the rollout */
    ks_rollout_phase from;       /* the phase the caller saw */
    ks_rollout_phase to;
    const char *actor;           /* who: 1..KS_ROLLOUT_ACTOR_MAX printable bytes */
    const char *reason;          /* why: 0..KS_ROLLOUT_REASON_MAX printable bytes; NULL = "" */
    int automatic;               /* nonzero when no human asked */
} ks_rollout_change;

/*
 * Make a transition.  In one BEGIN IMMEDIATE transaction: re-read the
 * rollout (KS_ERR_NO_ROLLOUT), check it is still in c->from
 * (KS_ERR_STALE: someone moved it first), fill facts->rollout, readers
 * (live at facts->now) and is_latest into a copy of *facts, run
 * ks_rollout_guard, then write the phase, phase_since = now (verified_at
 * reset to 0 on entering backfill) and a log row, and commit.  Two
 * operators racing cannot both advance.  why receives the guard's
 * sentence on KS_ERR_GUARD / KS_ERR_STATE / KS_ERR_STALE.
 */
KS_API KS_WUR ks_err ks_rollout_db_transition(ks_rollout_db *db, const ks_rollout_change *c,
                                              const ks_rollout_facts *facts, char *why,
                                              size_t why_len);

/* Replace the canary of a rollout that is not finalized (KS_ERR_STATE
 * otherwise), logging it (from = to = the phase, reason "canary: ...").
 * KS_ERR_INVALID_ARGUMENT for a bad canary. */
KS_API KS_WUR ks_err ks_rollout_db_set_canary(ks_rollout_db *db, int64_t id,
                                              const ks_rollout_canary *canary, const char *actor,
                                              int64_t now);

/*
 * Abort rollout id, which the caller saw in phase `from`: in one
 * transaction, re-read it (KS_ERR_NO_ROLLOUT; KS_ERR_STALE when it is no
 * longer in from), fill facts' rollout-side fields as
 * ks_rollout_db_transition does (the caller gives now and the census),
 * run ks_rollout_abort_guard, append two log rows (from = to = from: the
 * classes of the rollout, then "aborted: " and reason, by actor) and
 * delete the rollout and its listed columns.  Its log rows and health
 * samples stay; its id is never reused.  The scope is then governed as
 * before the rollout began, and is free for a new ks_rollout_db_start.
 * reason: 1..KS_ROLLOUT_REASON_MAX - 16 printable bytes, actor as for a
 * change (KS_ERR_INVALID_ARGUMENT otherwise).  why receives the
 * refusal's sentence.
 */
KS_API KS_WUR ks_err ks_rollout_db_abort(ks_rollout_db *db, int64_t id, ks_rollout_phase from,
                                         const ks_rollout_facts *facts, const char *actor,
                                         const char *reason, char *why, size_t why_len);

/*
 * Replace the thresholds, min_soak_s and reader_ttl_s of rollout id,
 * which is not finalized (KS_ERR_STATE otherwise), in one transaction.
 * When a value changes, a log row by actor names each change with its
 * old and new value ("set: min_samples 1000 -> 10, ..."; a copy without
 * "set: " goes to changes), followed by reason when not NULL or empty;
 * when nothing changes nothing is written (changes empty).  Guards judge
 * the new values from the next transition on.  KS_ERR_INVALID_ARGUMENT
 * for thresholds ks_rollout_db_start would refuse (a NaN rate, a window
 * of 0, a counter above INT64_MAX), reader_ttl_s 0 or a bad actor or
 * reason.
 */
KS_API KS_WUR ks_err ks_rollout_db_set_settings(ks_rollout_db *db, int64_t id,
                                                const ks_thresholds *t, uint32_t min_soak_s,
                                                uint32_t reader_ttl_s, const char *actor,
                                                const char *reason, int64_t now, char *changes,
                                                size_t changes_len);

/* Record that `migrate verify` passed at `now` over the rollout's scope:
 * only in backfill (KS_ERR_STATE otherwise); logged (from = to).  A
 * key-scoped rollout is verified column by column:
 * ks_rollout_db_record_verify_column (KS_ERR_INVALID_ARGUMENT here). */
KS_API KS_WUR ks_err ks_rollout_db_record_verify(ks_rollout_db *db, int64_t id,
                                                 const char *actor, int64_t now);

/* Record that a complete `migrate verify` of table.column passed at `now`
 * for rollout id, whose scope must cover it (KS_ERR_NOT_FOUND otherwise):
 * a column scope as ks_rollout_db_record_verify; a key scope sets that
 * column's verified_at.  Only in backfill (KS_ERR_STATE); logged. */
KS_API KS_WUR ks_err ks_rollout_db_record_verify_column(ks_rollout_db *db, int64_t id,
                                                        const char *table, const char *column,
                                                        const char *actor, int64_t now);

/* Append a note to the log of rollout id (KS_ERR_NO_ROLLOUT if none),
 * from = to = its current phase, in any phase: why an operator started
 * it, changed its canary, or forced a key state change that affects it.
 * reason: 1..KS_ROLLOUT_REASON_MAX printable bytes; otherwise (and for a
 * bad actor) KS_ERR_INVALID_ARGUMENT. */
KS_API KS_WUR ks_err ks_rollout_db_note(ks_rollout_db *db, int64_t id, const char *actor,
                                        const char *reason, int64_t now);

/* One row of keyshift_rollout_log. */
typedef struct ks_rollout_log_entry {
    int64_t id;                                /* increasing */
    int64_t rollout_id;
    int64_t time;
    char actor[KS_ROLLOUT_ACTOR_MAX + 1];
    int from;                                  /* a ks_rollout_phase, or 0 at creation */
    int to;                                    /* a ks_rollout_phase */
    char reason[KS_ROLLOUT_REASON_MAX + 1];
    int automatic;
} ks_rollout_log_entry;

/* Up to max log rows of rollout_id (0: of every rollout) with id >
 * after_id, in id order, into out[0, *n); *n < max means the end. */
KS_API KS_WUR ks_err ks_rollout_db_log(ks_rollout_db *db, int64_t rollout_id, int64_t after_id,
                                       ks_rollout_log_entry *out, size_t max, size_t *n);

/* Register (or re-register, replacing) reader r with started = heartbeat
 * = now.  KS_ERR_INVALID_ARGUMENT for a bad instance id, version string
 * or a key list that is not canonical. */
KS_API KS_WUR ks_err ks_rollout_db_reader_register(ks_rollout_db *db, const ks_rollout_reader *r,
                                                   int64_t now);

/* Set the heartbeat of instance_id to now (KS_ERR_NOT_FOUND if it is not
 * registered). */
KS_API KS_WUR ks_err ks_rollout_db_reader_heartbeat(ks_rollout_db *db, const char *instance_id,
                                                    int64_t now);

/* Remove instance_id from the registry (no error when absent). */
KS_API KS_WUR ks_err ks_rollout_db_reader_deregister(ks_rollout_db *db, const char *instance_id);

/* The live readers (heartbeat >= now - ttl_s), by instance id, into
 * out[0, *n); KS_ERR_BUFFER_TOO_SMALL with *n = their number when more
 * than max. */
KS_API KS_WUR ks_err ks_rollout_db_readers_live(ks_rollout_db *db, uint32_t ttl_s, int64_t now,
                                                ks_rollout_reader *out, size_t max, size_t *n);

/* Store sample s (its time is s->time) from instance_id (1.. bytes of
 * [F-NAME-1]), source "app" or "migrate", for rollout_id.  Counters and
 * latency sums above INT64_MAX are refused (KS_ERR_INVALID_ARGUMENT). */
KS_API KS_WUR ks_err ks_rollout_db_metrics_insert(ks_rollout_db *db, int64_t rollout_id,
                                                  const char *instance_id, const char *source,
                                                  const ks_health_sample *s);

/* Sum (saturating) every sample of rollout_id with time >= since into
 * *out (out->time: the latest sample's time, 0 when none). */
KS_API KS_WUR ks_err ks_rollout_db_metrics_sum(ks_rollout_db *db, int64_t rollout_id,
                                               int64_t since, ks_health_sample *out);

/* As ks_rollout_db_metrics_sum, over the samples of one source only:
 * "app" (the applications' health, which the guards and `rollout check`
 * judge) or "migrate" (the migration's own figures); NULL is both.
 * KS_ERR_INVALID_ARGUMENT for another source. */
KS_API KS_WUR ks_err ks_rollout_db_metrics_sum_source(ks_rollout_db *db, int64_t rollout_id,
                                                      int64_t since, const char *source,
                                                      ks_health_sample *out);

/* ---- the application policy ------------------------------------------- */

typedef struct ks_policy ks_policy;

typedef struct ks_policy_options {
    const char *instance_id;   /* 1..KS_INSTANCE_ID_MAX bytes of [F-NAME-1] */
    uint8_t max_format;        /* highest format version this instance reads (1 or 2) */
    uint32_t algorithms;       /* bit (1u << KS_ALG_x) per algorithm it reads */
    const char *keys;          /* key versions it holds: canonical list (NULL = ""),
                                  e.g. built with ks_rollout_keys_add */
    uint32_t refresh_ms;       /* least time between two checks of the database; 0: 1000 */
    int heartbeat;             /* nonzero: register in keyshift_readers at open, refresh
                                  the heartbeat with ks_policy_heartbeat, deregister at close */
} ks_policy_options;

/*
 * Open a policy on the database at path: load the rollouts (the latest of
 * each scope) into memory and, with opts->heartbeat, register the
 * instance.  The policy re-reads the rollouts at most once per refresh_ms
 * (to within a tick of the coarse monotonic clock), and only when `PRAGMA
 * data_version` says another connection committed: answering never costs
 * a query per record.  With opts->heartbeat the
 * instance's own writes (registration, heartbeat, key list, health
 * samples) go through a second connection, so that an answer never waits
 * while one of them waits for the database's write lock (the busy
 * timeout).  Errors of ks_rollout_db_open;
 * KS_ERR_INVALID_ARGUMENT for bad options.  ks_policy_open_store
 * (keyshift/rollout_store.h) opens one over any rollout store instead,
 * e.g. PostgreSQL's.
 */
KS_API KS_WUR ks_err ks_policy_open(const char *path, const ks_policy_options *opts,
                                    ks_policy **out);

/*
 * What to write for tenant into table.column: KS_ERR_NOT_FOUND when no
 * rollout governs the scope (the application's own default applies);
 * planned, read-compat: the source; write-upgrade: the target for canary
 * tenants (an empty tenant is never in a list or percent canary), the
 * source for the rest; backfill, finalized: the target.
 *
 * The column-scoped rollout of table.column answers first; when its
 * answer is an envelope class whose key_id a later key-scoped rollout
 * covering the column moves, that rollout answers instead.  When no
 * column-scoped rollout governs but a key-scoped one covers the column,
 * the policy cannot know the key the application would use: KS_ERR_STATE
 * (fail closed; ask ks_policy_write_target_key).
 */
KS_API KS_WUR ks_err ks_policy_write_target(ks_policy *p, const char *table, const char *column,
                                            ks_bytes tenant, ks_rollout_class *out);

/*
 * What to write for tenant into table.column, for an application about
 * to seal under key_id (its default): the rollout governing envelopes of
 * key_id in table.column (ks_rollout_scope_find) answers as
 * ks_policy_write_target describes, and an answer under another key_id
 * that a later key-scoped rollout moves is answered by that rollout.
 * Seal with exactly the class named (it may be of another key_id, when a
 * column-scoped rollout moves the column to it).  KS_ERR_NOT_FOUND when
 * no rollout governs (the application's default applies).
 */
KS_API KS_WUR ks_err ks_policy_write_target_key(ks_policy *p, const char *table,
                                                const char *column, const char *key_id,
                                                ks_bytes tenant, ks_rollout_class *out);

/*
 * May a value of table.column be read (*ok 1) or not (*ok 0)?  value NULL
 * is an SQL NULL and always readable (it holds nothing).  A value that
 * does not start with "KSE" is plaintext; one that does is classified by
 * its header (ks_envelope_parse_header, strict: a malformed header is
 * never readable).  planned: the source only; read-compat, write-upgrade,
 * backfill: the source or the target; finalized: the target only.  Any
 * other class is not readable (fail closed).  KS_ERR_NOT_FOUND when no
 * rollout governs the scope (*ok 0).  The governing rollout is
 * ks_rollout_scope_find's for the value's key_id: an envelope whose
 * key_id a key-scoped rollout covering the column moves is judged by it
 * when it is later than the column's own rollout.
 */
KS_API KS_WUR ks_err ks_policy_may_read(ks_policy *p, const char *table, const char *column,
                                        const ks_bytes *value, int *ok);

/*
 * How table.column holds envelopes, as recorded with the latest rollout
 * (highest id) whose scope covers it: its column-scoped rollout, or a
 * key-scoped one listing it; finalized rollouts count (the column keeps
 * its form after them).  KS_ERR_NOT_FOUND (*out binary) when no rollout
 * covers the column: the application's own choice applies.
 */
KS_API KS_WUR ks_err ks_policy_column_encoding(ks_policy *p, const char *table,
                                               const char *column, ks_value_encoding *out);

/* Check the database now (PRAGMA data_version), reloading the rollouts
 * when it changed, whatever refresh_ms says.  On failure the policy keeps
 * the rollouts it had, and the next answer checks again: while the
 * database cannot be checked, ks_policy_write_target and
 * ks_policy_may_read fail with the error (fail closed) rather than answer
 * from a policy they could not refresh. */
KS_API KS_WUR ks_err ks_policy_refresh(ks_policy *p);

/* With opts->heartbeat: set this instance's heartbeat to now (registering
 * it again if an operator removed it).  KS_OK without. */
KS_API KS_WUR ks_err ks_policy_heartbeat(ks_policy *p);

/*
 * Replace the key versions this instance holds (canonical list as for
 * ks_policy_options.keys; NULL = "") -- for an application that reloads
 * its keyring and now holds other versions.  With opts->heartbeat the
 * instance is registered again at once with the new list (under the
 * policy's lock; its started and heartbeat become now), so that a guard
 * sees what it really holds.  KS_ERR_INVALID_ARGUMENT for p NULL or a list
 * that is not canonical (or longer than KS_READER_KEYS_MAX); a failed
 * registration returns its error and leaves the policy's list as it was,
 * so the caller can simply try again.
 */
KS_API KS_WUR ks_err ks_policy_set_keys(ks_policy *p, const char *keys);

/*
 * Report this instance's health to every rollout under way (read-compat,
 * write-upgrade, backfill) in keyshift_metrics, source "app": the growth
 * of totals (e.g. ks_ctx_health_sample of the application's context)
 * since the previous report, stamped with the current time.  Call it
 * periodically (e.g. with the heartbeat); `keyshift rollout check` sums a
 * window of such rows.  A growth of nothing (every counter, bucket and
 * sum 0: an idle instance) writes no row, since it would add nothing to
 * any sum.  A failed report is carried into the next one.  Totals that
 * went down (a new context) count as new from zero.
 */
KS_API KS_WUR ks_err ks_policy_report(ks_policy *p, const ks_health_sample *totals);

/* Deregister (with opts->heartbeat; best effort: a reader left behind
 * expires after the TTL) and free; NULL is a no-op.  Call it once every
 * other call on p has returned. */
KS_API void ks_policy_close(ks_policy *p);

/* ==== key retirement (migrate/rollout/retire.c) ===========================
 * The reference check of `keys set-state ... destroyed`: a key version is
 * not destroyed while anything still needs it.  Pure, like the guards: the
 * caller counts the references, the function decides. */

/* What the destroy guard decides on. */
typedef struct ks_rollout_destroy_facts {
    const char *key_id;        /* the version to destroy: [F-KEYID-1] */
    uint32_t key_version;      /* >= 1 */
    int rows_known;            /* 0: the rows were not counted (refused) */
    uint64_t rows;             /* rows whose envelope names the version (every scope checked) */
    int readers_known;         /* 0: the live readers were not read (refused) */
    size_t live_readers;       /* live readers whose key list holds the version */
    size_t open_rollouts;      /* rollouts not finalized whose source or target is the
                                  version */
    int force;                 /* nonzero: destroy despite references, and despite
                                  facts that could not be gathered */
    const char *reason;        /* with force: 1..KS_ROLLOUT_REASON_MAX printable bytes */
} ks_rollout_destroy_facts;

/*
 * May (f->key_id, f->key_version) be destroyed?  KS_OK when nothing
 * references it, or when f->force with a reason overrides the references
 * or the counts that could not be gathered (e.g. no database to check):
 * why then says what was overridden, for the log; KS_ERR_GUARD with a
 * sentence in why, e.g. "k:1 is still referenced by 12 rows and 2 live
 * readers", when a count is not zero or was not gathered;
 * KS_ERR_INVALID_ARGUMENT for NULL, a bad key_id, version 0, or force
 * without a printable reason.
 */
KS_API KS_WUR ks_err ks_rollout_destroy_guard(const ks_rollout_destroy_facts *f, char *why,
                                              size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ROLLOUT_H */
