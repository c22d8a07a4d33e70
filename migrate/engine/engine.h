/*
 * migrate/engine/engine.h -- internal declarations shared by the files of
 * the migration engine (census.c, migrate.c, pipeline.c, rows.c,
 * verify.c, context.c, batch_size.c, workers.c).  Not
 * installed; nothing here is exported from the shared library.
 *
 * The engine reaches the database only through a ks_rowstore and must
 * never include sqlite3.h.
 */
#ifndef KS_MIGRATE_ENGINE_H
#define KS_MIGRATE_ENGINE_H

#include <stdatomic.h>

#include <keyshift/aad.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

/* Rows per scan of the census and of verify. */
#define KS_ENGINE_SCAN_BATCH 1000

/* The kinds of piece a compiled context template is made of. */
typedef enum ks_tmpl_kind {
    KS_TMPL_LITERAL = 0, /* bytes of the template's literal text */
    KS_TMPL_ID = 1,      /* the row id */
    KS_TMPL_COLUMN = 2   /* a context column, by index into ks_row.context */
} ks_tmpl_kind;

/* One piece of a compiled template. */
typedef struct ks_tmpl_part {
    uint8_t kind;    /* ks_tmpl_kind */
    uint8_t column;  /* KS_TMPL_COLUMN: index into the target's context columns */
    uint16_t off;    /* KS_TMPL_LITERAL: offset into ks_context_tmpl.literal */
    uint16_t len;    /* KS_TMPL_LITERAL: byte count */
} ks_tmpl_part;

/*
 * A compiled context template (docs/migration.md).  "{name}" is replaced
 * by the row id when name is "id", else by the context column of that
 * name; "{{" and "}}" stand for literal braces.  The distinct column
 * names (other than "id") in order of first appearance are the target's
 * context columns: the k-th name is ks_row.context[k].
 */
typedef struct ks_context_tmpl {
    uint8_t literal[KS_CONTEXT_TEMPLATE_MAX]; /* unescaped literal bytes */
    ks_tmpl_part parts[KS_CONTEXT_TEMPLATE_MAX];
    size_t n_parts;
    const char *columns[KS_ROWSTORE_MAX_CONTEXT_COLUMNS]; /* into names */
    size_t n_columns;
    char names[KS_CONTEXT_TEMPLATE_MAX];      /* NUL-terminated column names */
    size_t fault_off;                         /* after KS_ERR_INVALID_ARGUMENT: where */
    const char *fault;                        /* and what (static), else NULL */
} ks_context_tmpl;

/* Compile tmpl (at most KS_CONTEXT_TEMPLATE_MAX bytes) into *out.
 * KS_ERR_INVALID_ARGUMENT for an unbalanced brace, an empty name, or
 * more than KS_ROWSTORE_MAX_CONTEXT_COLUMNS distinct column names, with
 * out->fault_off and out->fault saying where and what. */
ks_err ks_context_tmpl_compile(ks_bytes tmpl, ks_context_tmpl *out);

/* KS_OK when contexts rendered from t may be bound to store's rows: t
 * does not bind {id}, or store->id_stable; else KS_ERR_UNSTABLE_ID
 * (ks_migrate_check_context).  Called by every run and verify before
 * its first read. */
ks_err ks_context_tmpl_check_store(const ks_context_tmpl *t, const ks_rowstore *store);

/* Render t for row into buf[0, cap) (cap <= KS_CONTEXT_MAX is the
 * engine's use): INTEGER in decimal, TEXT as its bytes, BLOB in lowercase
 * hex, NULL as nothing.  KS_ERR_TOO_LARGE when the result exceeds cap
 * (the buffer then holds a prefix). */
ks_err ks_context_tmpl_render(const ks_context_tmpl *t, const ks_row *row, uint8_t *buf, size_t cap,
                              size_t *out_len);

/* Nonzero when v is TEXT or BLOB starting with the envelope magic "KSE". */
int ks_engine_is_envelope(const ks_value *v);

/*
 * Whether v holds an envelope in a column of encoding enc, and its bytes
 * [F-TEXT-4].  0 for NULL, an integer and plaintext (binary: not starting
 * "KSE"; base64: starting neither "S1NF" nor "KSE").  1 otherwise, with
 * *perr: KS_ERR_BAD_MAGIC for a base64 column's value starting "KSE" (a
 * binary envelope, malformed there), or KS_OK and
 * *env the envelope's bytes (binary: v's own; base64: decoded into *buf,
 * grown with realloc to at most the largest envelope, *cap its size), or
 * the decoder's rejection (the value is malformed: never re-encoded), or
 * KS_ERR_NO_MEMORY.  The bytes are not parsed.
 */
int ks_engine_value_env(ks_value_encoding enc, const ks_value *v, uint8_t **buf, size_t *cap,
                        ks_bytes *env, ks_err *perr);

/*
 * Encode the envelope buf[off, off + len) as the column's encoding wants
 * it: nothing for binary; for base64, its text replaces it at off (buf
 * grown with realloc, *cap its size) and *len becomes the text's length.
 */
ks_err ks_engine_encode_value(ks_value_encoding enc, uint8_t **buf, size_t *cap, size_t off,
                              size_t *len);

/*
 * Nonzero when params restrict the work to one key (from_key_id) and a
 * value is outside it: plaintext (is_env 0), or an envelope env whose
 * header names another key_id.  A value that is an envelope candidate but
 * does not decode (perr) or whose header does not parse is not outside:
 * the caller treats it as any malformed value (quarantine, a verify
 * failure), since its key cannot be known.
 */
int ks_engine_outside_key(const ks_migrate_params *params, int is_env, ks_err perr, ks_bytes env);

/* The parameters to open envelope env of a row with: its context and
 * tenant, and p->purpose only when env is of format 2.  Format 1 has no
 * purpose, and ks_open fails an envelope without the purpose it is asked
 * to expect, so a format-1 row opened with the purpose of a migration to
 * format 2 (or of a verify after one) must not be asked for it. */
ks_open_params ks_engine_open_params(const ks_migrate_params *p, ks_bytes env, ks_bytes context,
                                     ks_bytes tenant);

/* Nonzero when b is a valid tenant or purpose name [F-NAME-1]: 1..64
 * bytes of [A-Za-z0-9._:-]. */
int ks_engine_name_ok(ks_bytes b);

/* The tenant of row under params: the constant params->tenant when set,
 * else the row's tenant column.  KS_OK with *out set; KS_ERR_BAD_VALUE
 * when the row's tenant is NULL, not text/blob, or not a valid name
 * (the row is then quarantined as "bad-tenant"); KS_ERR_INVALID_ARGUMENT
 * when params->tenant is set and the row also carries a tenant value
 * (the configuration is ambiguous: refuse rather than guess). */
ks_err ks_engine_row_tenant(const ks_migrate_params *params, const ks_row *row, ks_bytes *out);

/* The quarantine (and verify failure) names of a row whose tenant is
 * NULL or not a name, and of one whose rendered context is too long. */
#define KS_ENGINE_BAD_TENANT "bad-tenant"
#define KS_ENGINE_BAD_CONTEXT "bad-context"

/* Copy v into owned storage *buf (grown with realloc as needed; *cap its
 * size) and return the copy in *out (views into *buf). */
ks_err ks_engine_value_copy(const ks_value *v, uint8_t **buf, size_t *cap, ks_value *out);

/* Write the canonical parameter string of a migration (which identifies
 * its checkpoint) into buf[0, cap), with the resolved target version.
 * KS_ERR_BUFFER_TOO_SMALL when it does not fit. */
ks_err ks_migrate_canonical_params(const ks_migrate_params *p, uint32_t to_version, char *buf,
                                   size_t cap, size_t *out_len);

/* The most bytes of a canonical parameter string: every byte of the
 * variable fields may be percent-escaped (3 bytes). */
#define KS_PARAMS_MAX (256 + 3 * (KS_KEY_ID_MAX + KS_TENANT_MAX + KS_PURPOSE_MAX + \
                                  KS_CONTEXT_TEMPLATE_MAX))


/* ---- the adaptive batch size (batch_size.c) --------------------------------- */

/* Rows of a batch: params' batch_size when 0, and the most it or a bound
 * may be. */
#define KS_MIGRATE_BATCH_DEFAULT 500
#define KS_MIGRATE_BATCH_MAX 100000

/*
 * The batch size of one run, or of one worker across its chunks
 * (docs/migration.md, "Batch size").  ks_engine_batch_init sets it up
 * from params; after each committed batch, ks_engine_batch_next takes
 * the batch's rows and wall time and sets the next batch's size.  With
 * no target the size stays params' batch_size.  Used by one thread.
 */
typedef struct ks_engine_batch_sizer {
    double target_s;  /* 0: a fixed size */
    size_t min, max;  /* the bounds of size with a target */
    size_t size;      /* the next batch's rows, >= 1 */
    double row_s;     /* the smoothed seconds per row; 0 before the first batch */
} ks_engine_batch_sizer;

/* Set s up for params (checked: batch_size <= 100000, valid bounds). */
void ks_engine_batch_init(ks_engine_batch_sizer *s, const ks_migrate_params *params);

/* Nonzero when params' batch bounds and target are in range (see
 * keyshift/migrate.h). */
int ks_engine_batch_params_ok(const ks_migrate_params *params);

/* The most rows a batch of s can have: what a run allocates for. */
size_t ks_engine_batch_capacity(const ks_engine_batch_sizer *s);

/* After a batch of `rows` rows that took elapsed_s seconds: update s's
 * per-row time and return the next size (also s->size).  A batch of 0
 * rows, or a negative or NaN time, tells nothing: the size is kept. */
size_t ks_engine_batch_next(ks_engine_batch_sizer *s, size_t rows, double elapsed_s);

/* ---- chunked runs (workers.c over migrate.c) -------------------------------- */

/* A checkpoint save of a chunked run, inside the store's write
 * transaction (ks_chunks_ops.save, bound to one chunk and worker). */
typedef ks_err (*ks_engine_save_fn)(void *arg, const ks_checkpoint *cp);

/*
 * One chunk of a chunked run: the ids [lo, hi] to migrate, from the
 * chunk's state start (its cursor, pass and counts; the params view is
 * ignored), with the target version the caller settled
 * (ks_engine_settle).  Every checkpoint the run would save (each batch's,
 * the end of a pass's) goes to save instead of the store's
 * checkpoint_save, in the same transaction; the catch-up pass of a rerun
 * does not apply (a complete chunk is never claimed).  halt (or NULL) is
 * a second stop flag, read where *stop is: atomic, since another
 * worker's thread sets it.
 */
typedef struct ks_engine_slice {
    int64_t lo, hi;
    uint32_t to_version;
    const ks_checkpoint *start;
    ks_engine_save_fn save;
    void *save_arg;
    const atomic_int *halt;
    ks_engine_batch_sizer *sizer; /* the worker's batch size, carried from chunk to
                                     chunk (NULL: the run's own, from params) */
} ks_engine_slice;

/* ks_migrate_run over one slice (the store needs visit_rows_range, else
 * KS_ERR_INVALID_ARGUMENT): the same batches, pipeline, passes,
 * threshold and stop, within [lo, hi].  The progress callback's
 * checkpoint is the chunk's; total_rows is 0 (never counted). */
ks_err ks_engine_run_slice(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                           const ks_engine_slice *slice, volatile sig_atomic_t *stop,
                           ks_migrate_progress_fn progress, void *progress_arg);

/* The settled identity of a chunked run: what ks_migrate_run decides
 * before its first batch. */
typedef struct ks_engine_settled {
    uint32_t to_version;
    char params[KS_PARAMS_MAX];
    size_t params_len;
    int complete;      /* the migration's checkpoint was already complete */
    int64_t started;   /* its start (Unix seconds) */
} ks_engine_settled;

/* Settle the target version and parameters of params on store as
 * ks_migrate_run does (KS_ERR_MISMATCH, supersede, the pinned primary),
 * and unless complete save the migration's checkpoint "running" in a
 * transaction of its own, so that a single run and `status` see it. */
ks_err ks_engine_settle(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                        ks_engine_settled *out);

/* Save cp with the store's checkpoint_save in a transaction of its own
 * (rolled back on failure). */
ks_err ks_engine_save_alone(const ks_rowstore *store, const ks_checkpoint *cp);

#endif /* KS_MIGRATE_ENGINE_H */
