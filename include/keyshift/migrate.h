/*
 * keyshift/migrate.h -- the census and the re-encryption engine
 * (docs/migration.md).
 *
 * The engine reaches records only through a ks_rowstore and keys only
 * through a ks_ctx (and so a ks_provider): adding a store or a provider
 * never touches it.
 *
 * Safety (docs/migration.md):
 *   - every write is a compare-and-swap inside a short write transaction
 *     that also saves the checkpoint, so a crash at any moment loses
 *     nothing and the next run resumes where the last committed batch
 *     ended;
 *   - a row changed underneath by the application is never overwritten: it
 *     is counted as raced and retried in a later pass;
 *   - every new value is parsed and opened (and, for encrypt and
 *     reencrypt, decrypted and compared with the old plaintext; for
 *     rewrap, whose nonce and ciphertext must be the old ones byte for
 *     byte, checked with ks_verify, which decrypts nothing) before its
 *     UPDATE unless verification is turned off;
 *   - a row that does not parse or open is quarantined and never modified;
 *     quarantine belongs to the migration (its parameters): a migration
 *     with other parameters tries the row again;
 *   - no mode ever writes plaintext.
 */
#ifndef KEYSHIFT_MIGRATE_H
#define KEYSHIFT_MIGRATE_H

#include <signal.h>

#include <keyshift/common.h>
#include <keyshift/crypto.h>
#include <keyshift/error.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- census ------------------------------------------------------------- */

/* One envelope class of a census: rows per (format, algorithm, key_id,
 * key_version). */
typedef struct ks_census_class {
    uint8_t version;
    uint32_t algorithm;
    char key_id[KS_KEY_ID_MAX + 1]; /* NUL-terminated; the charset has no NUL */
    uint32_t key_version;
    uint64_t rows;
} ks_census_class;

/* The result of a census.  Malformed rows are counted per rejection code
 * (index = code, 1..31; the name is ks_err_name(code)). */
typedef struct ks_census {
    uint64_t rows;
    uint64_t null_rows;
    uint64_t plaintext_rows;      /* no envelope magic */
    uint64_t malformed[32];
    uint64_t malformed_rows;
    size_t n_classes;
    ks_census_class *classes;     /* sorted by (key_id, key_version, version, algorithm) */
} ks_census;

/*
 * Count the rows of store by class, reading headers only (no key is
 * needed; nothing is written).  A value counts as an envelope when it
 * starts with the magic "KSE"; one that then fails to parse is malformed
 * under its error.  Free with ks_census_free().
 */
KS_API KS_WUR ks_err ks_census_run(const ks_rowstore *store, ks_census *out);

/* Free what ks_census_run allocated; the struct is cleared. */
KS_API void ks_census_free(ks_census *census);

/* ---- migrate -------------------------------------------------------------- */

typedef enum ks_migrate_mode {
    KS_MIGRATE_ENCRYPT = 1,   /* plaintext rows become envelopes */
    KS_MIGRATE_REWRAP = 2,    /* envelopes get their DEK rewrapped under the target key */
    KS_MIGRATE_REENCRYPT = 3  /* envelopes are opened and sealed again with a fresh DEK */
} ks_migrate_mode;

/* The name of a mode ("encrypt", "rewrap", "reencrypt") or NULL. */
KS_API const char *ks_migrate_mode_name(int mode);

/* The most bytes of a context template. */
#define KS_CONTEXT_TEMPLATE_MAX 1024

/*
 * List the distinct context columns template tmpl references (every
 * "{name}" but "{id}"), in order of first appearance, into names[0, *n);
 * the names are NUL-terminated strings in storage.  This is the order the
 * engine expects in ks_rowstore_target.context_columns: ks_row.context[k]
 * holds the value of names[k].  "{{" and "}}" are literal braces.
 * KS_ERR_INVALID_ARGUMENT for a template over KS_CONTEXT_TEMPLATE_MAX
 * bytes, an unbalanced brace, an empty name, or more than
 * KS_ROWSTORE_MAX_CONTEXT_COLUMNS distinct names; KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_context_template_columns(ks_bytes tmpl,
                                                 const char *names[KS_ROWSTORE_MAX_CONTEXT_COLUMNS],
                                                 char storage[KS_CONTEXT_TEMPLATE_MAX], size_t *n);

/*
 * Where template tmpl is malformed, for a message that points at it:
 * KS_OK when ks_context_template_columns accepts it; else
 * KS_ERR_INVALID_ARGUMENT with *offset the byte offset of the fault (the
 * "{" of an unclosed or empty placeholder or of one distinct name too
 * many, a lone "}", or KS_CONTEXT_TEMPLATE_MAX for a longer template) and
 * *why a static phrase saying what it is, e.g. "an unclosed \"{\" ...".
 * KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_context_template_check(ks_bytes tmpl, size_t *offset, const char **why);

/*
 * May contexts rendered from template tmpl be bound to store's rows?  An
 * envelope's context is authenticated, so an id it binds must never
 * change: KS_OK when tmpl does not bind {id} or the store's id is stable
 * (ks_rowstore.id_stable: a primary key, a UNIQUE NOT NULL column,
 * SQLite's INTEGER PRIMARY KEY); KS_ERR_UNSTABLE_ID when it binds the
 * bare rowid of a SQLite table without an INTEGER PRIMARY KEY, which
 * VACUUM and a dump/restore renumber (docs/migration.md, "Ids").
 * KS_ERR_INVALID_ARGUMENT for a malformed template; KS_ERR_NO_MEMORY.
 * ks_migrate_run, ks_migrate_verify and ks_migrate_run_workers check this
 * before reading or writing a row; an application that renders contexts
 * from a template itself calls it once on a store opened on its target.
 * The census binds nothing and reads any table.
 */
KS_API KS_WUR ks_err ks_migrate_check_context(const ks_rowstore *store, ks_bytes tmpl);

/* Defaults and limits of the adaptive batch size (ks_migrate_params
 * batch_target_ms, batch_min, batch_max). */
#define KS_MIGRATE_BATCH_MIN_DEFAULT 10u
#define KS_MIGRATE_BATCH_MAX_DEFAULT 10000u
#define KS_MIGRATE_BATCH_TARGET_MAX_MS 3600000u

typedef struct ks_migrate_params {
    ks_migrate_mode mode;
    ks_bytes to_key_id;        /* target key */
    uint32_t to_key_version;   /* 0: the key's primary, resolved once at the first run and
                                  recorded in the checkpoint's parameters */
    uint8_t to_format;         /* encrypt/reencrypt: 1 or 2 (0: 2) */
    uint32_t algorithm;        /* encrypt/reencrypt: KS_ALG_* (0: xchacha20-poly1305) */
    ks_bytes tenant;           /* constant tenant when the store has no tenant column */
    ks_bytes purpose;          /* format 2: the purpose written and expected */
    ks_bytes context_template; /* e.g. "payments:{id}:card": {name} is replaced by the
                                  value of the id or a context column (docs/migration.md) */
    size_t batch_size;         /* rows per transaction, 0..100000 (0: 500); with
                                  batch_target_ms, the first batch's size (clamped into
                                  [batch_min, batch_max]) */
    uint32_t batch_target_ms;  /* 0 (the default): every batch has batch_size rows.  1 ..
                                  KS_MIGRATE_BATCH_TARGET_MAX_MS: after each committed batch
                                  the next one's size is chosen so that a batch takes about
                                  this long (docs/migration.md, "Batch size"): the batch's
                                  wall time (read, crypto, writes and COMMIT, on the
                                  monotonic clock; not the progress callback, so not a
                                  caller's pauses, nor max_rows_per_second's sleeps)
                                  divided by its rows gives a smoothed time per row; the
                                  next size is the target over it, at most twice the last
                                  size, at once smaller after a batch over the target, and
                                  within [batch_min, batch_max].  Per run, and per worker
                                  of ks_migrate_run_workers (across its chunks).  Not part
                                  of the migration's identity: a run resumed with another
                                  target (or none) continues the same checkpoint. */
    size_t batch_min;          /* with batch_target_ms: the fewest rows of a batch (but the
                                  last of a pass or chunk); 0: KS_MIGRATE_BATCH_MIN_DEFAULT */
    size_t batch_max;          /* with batch_target_ms: the most rows of a batch, at most
                                  100000 (the engine's two batches are allocated for this
                                  many rows: about 1 KiB of memory per row, per run or
                                  worker); 0: KS_MIGRATE_BATCH_MAX_DEFAULT.  The bounds
                                  are checked whether or not a target is set:
                                  KS_ERR_INVALID_ARGUMENT when batch_min or batch_max is
                                  over 100000 or batch_min (or its default) exceeds
                                  batch_max (or its default). */
    double max_failure_rate;   /* stop once quarantined/processed exceeds it (0.001 default
                                  when negative) */
    uint32_t max_rows_per_second; /* 0: unlimited */
    int no_verify;             /* skip verify-before-commit (not recommended) */
    int serial;                /* nonzero: compute every batch on the calling thread; 0 (the
                                  default): a helper thread computes batch k+1 while batch k
                                  is written (docs/migration.md, "Pipeline"), except when
                                  max_rows_per_second throttles the run.  Same results and
                                  the same writes either way. */
    ks_bytes from_key_id;      /* rewrap/reencrypt and verify: empty, or only envelopes whose
                                  key_id is this one are migrated (verified); every other
                                  value (plaintext, another key's envelope) is left as it is
                                  and counted skipped.  A key-scoped rollout's run
                                  (docs/rollout.md, "Scopes").  Must be empty for encrypt;
                                  part of the checkpoint's parameters when set. */
    ks_value_encoding encoding; /* how the column holds envelopes (docs/format.md section
                                  10): binary (0) or base64 text.  Must be the store's
                                  (KS_ERR_INVALID_ARGUMENT otherwise); part of the
                                  checkpoint's parameters when base64.  A base64 value
                                  that does not decode canonically is malformed and
                                  quarantined under the decoder's error, never
                                  re-encoded. */
    int supersede;             /* nonzero: an unfinished migration of the store with other
                                  parameters does not refuse the run (KS_ERR_MISMATCH): it
                                  is marked "superseded" (counts and cursor kept; running it
                                  again resumes it).  For a run that a rollout governs, whose
                                  target makes any other migration of the column obsolete. */
} ks_migrate_params;

/* What one call of ks_migrate_run (or one chunk's run) did, as opposed
 * to the checkpoint's counts, which add up every run of the migration:
 * the growth of the checkpoint's done, skipped, raced, quarantined and
 * wrong_state since the call began (skipped and wrong_state count pass 1
 * only, as in the checkpoint), and of its quarantined rows those
 * quarantined "auth-failed".  first_batch_rows and
 * first_batch_auth_failed are the rows the call's first committed batch
 * looked at (not NULL, not in quarantine) and how many of them were
 * quarantined "auth-failed": when that is most of them, the run's
 * context, purpose or tenant is likely not the one the values were
 * encrypted with. */
typedef struct ks_migrate_counts {
    uint64_t done, skipped, raced, quarantined, wrong_state;
    uint64_t auth_failed;
    uint64_t first_batch_rows, first_batch_auth_failed;
} ks_migrate_counts;

/* Progress, reported after every committed batch. */
typedef struct ks_migrate_progress {
    const ks_checkpoint *checkpoint; /* the counts so far, over every run of the migration */
    uint64_t total_rows;             /* rows in the target at the start (counted only
                                        when there is a progress callback: one read
                                        of every page of the table) */
    uint64_t batch_rows;             /* rows in the batch just committed */
    double elapsed_s;
    ks_migrate_counts run;           /* what this call did so far */
} ks_migrate_progress;

typedef void (*ks_migrate_progress_fn)(void *arg, const ks_migrate_progress *p);

/*
 * Run (or resume) a migration of store with params, sealing and opening
 * through ctx.  Stops after the current batch when *stop becomes nonzero
 * (KS_ERR_STOPPED; resumable).  Returns KS_OK when complete, or:
 * KS_ERR_THRESHOLD (failure rate exceeded; checkpoint valid),
 * KS_ERR_MISMATCH (a checkpoint of this store has other parameters and is
 * neither complete nor superseded, and params->supersede is 0; nothing
 * written), KS_ERR_VERIFY_FAILED (verify-before-commit found a new value
 * that does not open to the old plaintext: a bug or faulty hardware, the
 * batch not written, the checkpoint intact), KS_ERR_UNSTABLE_ID (the
 * context binds {id}, an unstable id: see ks_migrate_check_context;
 * nothing read or written), provider errors (the batch rolled back, checkpoint intact;
 * KS_ERR_UNAVAILABLE and KS_ERR_TIMEOUT are resumable), KS_ERR_BUSY,
 * KS_ERR_FULL, KS_ERR_STORE (rolled back; resumable).  *out, when not NULL,
 * receives the final checkpoint (views valid until the store's next call).
 */
KS_API KS_WUR ks_err ks_migrate_run(ks_ctx *ctx, const ks_rowstore *store,
                                    const ks_migrate_params *params,
                                    volatile sig_atomic_t *stop, ks_migrate_progress_fn progress,
                                    void *progress_arg, ks_checkpoint *out);

/* One row that failed verification. */
typedef struct ks_verify_failure {
    ks_value id;
    ks_err error;
    const char *name;    /* the failure's name, the one ks_migrate_run quarantines the
                            row under: "bad-tenant" (error KS_ERR_BAD_VALUE: the row's
                            tenant is NULL or not a name), "bad-context" (error
                            KS_ERR_TOO_LARGE: the rendered context is too long), else
                            ks_err_name(error).  Static storage. */
} ks_verify_failure;

typedef void (*ks_verify_failure_fn)(void *arg, const ks_verify_failure *f);

/* The result of a verification. */
typedef struct ks_verify_result {
    uint64_t checked;     /* envelope rows checked to open (ks_verify) */
    uint64_t failed;      /* of which did not open */
    uint64_t skipped;     /* NULL and plaintext rows */
} ks_verify_result;

/*
 * Check that every envelope row (sample 0), or a uniform random sample
 * of about `sample` rows, opens with the context template, tenant and
 * purpose of params (its mode and target are ignored): ks_verify, every
 * check of ks_open without decrypting, so no plaintext is ever in memory
 * and a value of any size is checked.  Each failure is reported through
 * on_failure by id, error and name (the name quarantine uses for the same
 * row).  Read-only.  KS_ERR_UNSTABLE_ID, before any row is read, when the
 * context binds an unstable id (ks_migrate_check_context).
 */
KS_API KS_WUR ks_err ks_migrate_verify(ks_ctx *ctx, const ks_rowstore *store,
                                       const ks_migrate_params *params, uint64_t sample,
                                       ks_verify_failure_fn on_failure, void *arg,
                                       ks_verify_result *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_MIGRATE_H */
