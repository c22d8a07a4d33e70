/*
 * keyshift/app.h -- the application API: everything an application that
 * stores envelopes in its database needs, and nothing more
 * (docs/embedding.md).
 *
 * One ks_app holds a context (keyshift/crypto.h) over the key providers,
 * and, when the application names its database, a rollout policy
 * (keyshift/rollout.h) on it.  Opening registers the instance as a reader
 * with the key versions it holds; a background thread then refreshes its
 * heartbeat and reports its health (seal and open counts, auth failures,
 * parse and provider errors, latency histograms) every interval_ms to
 * every rollout under way; closing stops the thread, reports once more and
 * deregisters.  With a keyring file for keys, the thread also reopens it
 * when the file changed (a version added, retired or destroyed is seen
 * within interval_ms; calls already running finish on the old keys, which
 * are kept until close) and registers the key versions it then holds; the
 * passphrase is kept in locked memory for that until close.  ks_app_seal
 * asks the rollout what to write for the record's tenant and seals
 * exactly that; ks_app_open_value checks that the rollout's phase allows
 * the value's class to be read, then opens it.  Both work in the form the
 * column holds envelopes in (ks_app_column_encoding: binary, or base64
 * text), which the rollout records, so an application calls the same two
 * functions for every column.  Without a database there is no thread:
 * seal writes the configured default key in the default encoding and
 * open opens anything the providers hold.
 *
 * Ownership.  Every buffer passed in or out is the caller's: the library
 * keeps no pointer to it after a call returns, and writes only into the
 * output buffers it is given (plaintext outputs are the caller's to wipe).
 * A cap of ks_app_seal_max_len(pt_len) always suffices for a seal's output
 * (in either encoding) and a cap of the stored value's length always
 * suffices for an open's.  On
 * any failure an output buffer holds no plaintext.
 *
 * Errors.  Every error is a ks_err with a stable name (ks_err_name) and
 * one class (ks_err_class): retryable (the same call may succeed later),
 * refused (this record or call is refused; retrying will not help) or
 * configuration (the setup is wrong: fix it and open again).  Bindings map
 * the class to their idiomatic errors.
 *
 * Threads.  A ks_app may be used from any number of threads at once; seal
 * and open scale as ks_ctx does (no lock and no shared write on the hot
 * path, with or without a database: the policy's answers take no lock,
 * and the latency histograms are kept per thread).  ks_app_close must run once every
 * other call on the app has returned.
 *
 * fork().  A child process must neither use nor close a ks_app its parent
 * opened (its background thread and database connection belong to the
 * parent): it opens its own, under another instance id, or execs.
 */
#ifndef KEYSHIFT_APP_H
#define KEYSHIFT_APP_H

#include <keyshift/common.h>
#include <keyshift/crypto.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>
#include <keyshift/rollout.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The default period of the heartbeat, the health report and the
 * keyring's reload check, in ms: a few writes to the rollout database a
 * minute per instance, well inside the default reader TTL (60 s). */
#define KS_APP_INTERVAL_DEFAULT_MS 5000u
/* The policy's refresh period with the default interval, in ms: a phase
 * change reaches the instance within it (a refresh is a read, and only
 * when another connection committed). */
#define KS_APP_REFRESH_DEFAULT_MS 500u

/* ---- errors -------------------------------------------------------------- */

/* The class of an error (ks_err_class). */
typedef enum ks_error_class {
    KS_ERROR_CLASS_OK = 0,            /* KS_OK */
    KS_ERROR_CLASS_RETRYABLE = 1,     /* may succeed later: a provider or database that is
                                         unavailable, timed out or busy; out of memory */
    KS_ERROR_CLASS_REFUSED = 2,       /* this record or call is refused: auth-failed, a
                                         malformed envelope (codes 1..31), a class the
                                         rollout's phase does not allow (phase), a key
                                         version disabled, destroyed or unknown, a bad
                                         argument or a buffer too small */
    KS_ERROR_CLASS_CONFIGURATION = 3  /* the setup is wrong: keyring, registry, database,
                                         options, an algorithm the CPU lacks; also any
                                         code this library does not define */
} ks_error_class;

/* The class of err; stable across releases for every defined code. */
KS_API ks_error_class ks_err_class(ks_err err);

/* The name of a class: "ok", "retryable", "refused", "configuration";
 * NULL for another value.  Static storage. */
KS_API const char *ks_error_class_name(ks_error_class c);

/* ---- opening and closing ------------------------------------------------- */

/* How to open an application. */
typedef struct ks_app_options {
    /* Keys: at most one of provider, providers and keyring.  None given:
     * KEYSHIFT_PROVIDERS (a registry file) from the environment, else
     * KEYSHIFT_KEYRING with KEYSHIFT_PASSPHRASE (its passphrase itself,
     * one trailing newline dropped; unset for an unsealed keyring). */
    const ks_provider *provider;  /* borrowed: must outlive the app; not destroyed by it */
    const char *providers;        /* a registry file (keyshift/registry.h), every provider
                                     opened at ks_app_open */
    const char *keyring;          /* a local keyring file (keyshift/keyring.h) */
    ks_bytes passphrase;          /* keyring's passphrase; empty: none */
    const ks_ctx_config *ctx_config; /* NULL: the defaults with latency histograms on */

    /* The rollout state: a SQLite file (which must exist) or a PostgreSQL
     * URI (postgresql:// or postgres://) or libpq key=value string
     * ("host=H dbname=D", recognized by its first word being a libpq
     * keyword followed by '='; a SQLite file so named is given as
     * ./NAME); keep its password in PGPASSFILE or PGPASSWORD.  NULL: no
     * rollout governs any column. */
    const char *database;
    const char *instance_id;      /* 1..KS_INSTANCE_ID_MAX bytes of [F-NAME-1]; required
                                     with a database */
    uint8_t max_format;           /* highest format read, registered; 0: KS_FORMAT_V2 */
    uint32_t algorithms;          /* bits (1u << KS_ALG_x) read, registered; 0: every
                                     algorithm this CPU runs */
    const char *keys;             /* key versions held, canonical (ks_rollout_keys_check);
                                     NULL: every active or decrypt-only version the
                                     providers list (none when they cannot list),
                                     listed again after each keyring reload */
    uint32_t interval_ms;         /* heartbeat, health report and keyring reload period,
                                     also the policy's refresh period; 0: the first three
                                     every KS_APP_INTERVAL_DEFAULT_MS, the refresh every
                                     KS_APP_REFRESH_DEFAULT_MS */

    /* What to write where no rollout governs the column (and, with
     * default_key_id, the key a key-scoped rollout is asked about). */
    const char *default_key_id;   /* NULL: seal fails with no-rollout there */
    uint32_t default_key_version; /* 0: the key's primary */
    uint8_t default_format;       /* 0: KS_FORMAT_V2 */
    uint32_t default_algorithm;   /* 0: KS_ALG_XCHACHA20POLY1305 */

    /* The purpose bound into (and required of) format-2 envelopes, 1..
     * KS_PURPOSE_MAX bytes of [F-NAME-1]; NULL: the column's name. */
    const char *purpose;

    /* How columns that no rollout covers hold envelopes (also every
     * column without a database): KS_ENCODING_BINARY (0, the default) or
     * KS_ENCODING_BASE64.  A column a rollout covers is in the rollout's
     * encoding, whatever this says (ks_app_column_encoding). */
    ks_value_encoding default_encoding;
} ks_app_options;

typedef struct ks_app ks_app;

/*
 * Open an application with opts: open the keys, create a context, open the
 * policy on the database (registering instance_id with max_format,
 * algorithms and keys; re-registering replaces an older registration of
 * the same id) and start the background thread.  Nothing is left open on
 * failure.  A sentence saying what is wrong goes to errbuf (may be NULL);
 * it never holds a secret or a connection string.  Errors:
 * KS_ERR_INVALID_ARGUMENT (bad options, two key sources, no key source at
 * all), the errors of ks_keyring_open, ks_registry_load, ks_ctx_new,
 * ks_policy_open, ks_rollout_store_pg_open, KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_app_open(const ks_app_options *opts, ks_app **out, char *errbuf,
                                 size_t errbuf_len);

/*
 * Stop the background thread, report the health once more, deregister the
 * instance (best effort: a registration left behind expires after the
 * rollout's reader TTL), wipe every key and free; NULL is a no-op.  Call
 * it once every other call on app has returned.  While another app of
 * this process is open on the same database with the same instance_id
 * (a service reloading by opening a new app before closing the old one),
 * the registration is that app's: it is left in place, and the last of
 * them to close deregisters.
 */
KS_API void ks_app_close(ks_app *app);

/* ---- sealing and opening ------------------------------------------------- */

/* One value of the application's table: where it lives and what binds it. */
typedef struct ks_app_record {
    const char *table;     /* the table and column, as the rollout names them */
    const char *column;
    ks_bytes tenant;       /* 1..KS_TENANT_MAX bytes of [F-NAME-1], required to seal (the
                              envelope carries it); to open, empty means any tenant */
    ks_bytes context;      /* 0..KS_CONTEXT_MAX bytes the reader rebuilds from trusted
                              data, e.g. "payments:42:card" */
    ks_bytes purpose;      /* format 2: the purpose bound into (and required of) the
                              envelope, 1..KS_PURPOSE_MAX bytes of [F-NAME-1]; empty: the
                              app's purpose option, or else the column's name */
    /* A view of length 0 is empty whatever its ptr (unlike ks_bytes elsewhere). */
} ks_app_record;

/* An upper bound on the output of sealing pt_len bytes, whatever the
 * class, tenant, context and encoding (the base64 text is the longer
 * form); 0 past the format's limits. */
KS_API size_t ks_app_seal_max_len(size_t pt_len);

/*
 * How table.column holds envelopes, the form ks_app_seal writes and
 * ks_app_open_value, ks_app_seal_update and ks_app_may_read read there:
 * the encoding recorded with the latest rollout covering the column (its
 * column-scoped rollout or a key-scoped one listing it, finalized or
 * not: ks_policy_column_encoding); where none covers it, or without a
 * database, the default_encoding option.  KS_ENCODING_BINARY: the
 * envelope's bytes (BLOB, bytea).  KS_ENCODING_BASE64: its canonical
 * base64 text, which begins "S1NF" (docs/format.md section 10: a SQLite
 * TEXT, a PostgreSQL text or varchar column).  Errors:
 * KS_ERR_INVALID_ARGUMENT (NULL app, table, column or out), the
 * policy's (it could not answer: fail closed, *out binary).
 */
KS_API KS_WUR ks_err ks_app_column_encoding(ks_app *app, const char *table, const char *column,
                                            ks_value_encoding *out);

/*
 * Seal pt[0, pt_len) for record r into out[0, cap), its length to
 * *out_len.  The class is the rollout's answer for r's tenant
 * (ks_policy_write_target_key with default_key_id, else
 * ks_policy_write_target): the source or the target, the target for a
 * canary tenant in write-upgrade; where no rollout governs, the default
 * key.  The envelope is written in the column's encoding
 * (ks_app_column_encoding): its bytes, or its canonical base64 text
 * [F-TEXT-1].  When the answer is plaintext (a rollout from plaintext
 * before write-upgrade) out receives pt itself, unsealed, in either
 * encoding: the column still holds plaintext for readers that cannot
 * open envelopes.  The class written goes to *written when not NULL.  Seals are counted (latency, provider
 * errors) for the health report.
 * Errors: KS_ERR_INVALID_ARGUMENT (NULL app, r, table, column or out_len,
 * a bad tenant, context or purpose), KS_ERR_NO_ROLLOUT (no rollout and no
 * default key), KS_ERR_BUFFER_TOO_SMALL (nothing written; a cap of
 * ks_app_seal_max_len always suffices), the policy's errors (e.g.
 * KS_ERR_STATE: a key-scoped rollout covers the column and no
 * default_key_id says which key this application uses), ks_seal's,
 * KS_ERR_NO_MEMORY (base64).
 */
KS_API KS_WUR ks_err ks_app_seal(ks_app *app, const ks_app_record *r, const uint8_t *pt,
                                 size_t pt_len, uint8_t *out, size_t cap, size_t *out_len,
                                 ks_rollout_class *written);

/*
 * Open the stored value v[0, v_len) of record r into pt[0, cap), its
 * length to *pt_len, reading it in the column's encoding
 * (ks_app_column_encoding); a base64 column's value is read exactly as
 * ks_app_open_text says (a binary envelope there is malformed), a binary
 * column's as follows.  The value's class (its header, parsed strictly; a
 * value not starting with "KSE" is plaintext) must be one the rollout's
 * phase reads, else KS_ERR_PHASE; a plaintext the phase reads is copied
 * out as it is.  Then the envelope is opened, its tenant required to be
 * r->tenant (when not empty) and, in format 2, its purpose r's (as ks_app_record says).
 * Opens, auth failures and parse errors are counted for the health
 * report.  The class read goes to *read when not NULL.  Errors: a parse
 * rejection (codes 1..31, *perr filled when not NULL), KS_ERR_PHASE,
 * KS_ERR_AUTH_FAILED (wrong context, tenant or key; tampering),
 * KS_ERR_BUFFER_TOO_SMALL (a cap of v_len always suffices), the policy's
 * errors, ks_open's.  No unauthenticated plaintext is ever released.
 */
KS_API KS_WUR ks_err ks_app_open_value(ks_app *app, const ks_app_record *r, const uint8_t *v,
                                       size_t v_len, uint8_t *pt, size_t cap, size_t *pt_len,
                                       ks_rollout_class *read, ks_parse_error *perr);

/*
 * Seal pt[0, pt_len) for record r to replace its stored value prev[0,
 * prev_len) (prev NULL: SQL NULL; in the column's encoding), as an
 * application updating a row does: where a rollout governs the column,
 * exactly as ks_app_seal;
 * where none does, in the stored value's own class instead of the
 * default key, so that an update keeps the column's form until a rollout
 * says otherwise: a plaintext stays plaintext (out receives pt itself),
 * an envelope is sealed again in its own format, algorithm, key_id and
 * key_version.  Errors: ks_app_seal's, and KS_ERR_NO_ROLLOUT where no
 * rollout governs and prev has no class (NULL, or a header that does not
 * parse): nothing says what to write (ks_app_seal writes the default
 * key there).  KS_ERR_INVALID_ARGUMENT also for NULL prev with
 * prev_len > 0.
 */
KS_API KS_WUR ks_err ks_app_seal_update(ks_app *app, const ks_app_record *r,
                                        const uint8_t *prev, size_t prev_len, const uint8_t *pt,
                                        size_t pt_len, uint8_t *out, size_t cap,
                                        size_t *out_len, ks_rollout_class *written);

/*
 * May the stored value v[0, v_len) of table.column (v NULL: SQL NULL,
 * always readable; in the column's encoding, a malformed text never
 * readable) be read now: *ok 1 when the rollout's phase reads its
 * class (as ks_app_open_value checks), 0 when it does not.
 * KS_ERR_NOT_FOUND (*ok 0) when no rollout governs the value (also
 * without a database): the application's own rule applies, e.g. reading
 * a plaintext column as it is.  For applications that must tell "no
 * rollout" from a refusal, or that read plaintext themselves.  Errors:
 * KS_ERR_INVALID_ARGUMENT (NULL app, table, column or ok, NULL v with
 * v_len > 0), the policy's (it could not answer: fail closed).
 */
KS_API KS_WUR ks_err ks_app_may_read(ks_app *app, const char *table, const char *column,
                                     const uint8_t *v, size_t v_len, int *ok);

/* One item of a batch: its tenant, context and input, the caller's output
 * buffer, and what became of it. */
typedef struct ks_app_item {
    ks_bytes tenant;       /* as ks_app_record */
    ks_bytes context;
    ks_bytes purpose;
    ks_bytes in;           /* the plaintext (seal) or the stored value (open) */
    uint8_t *out;          /* the caller's buffer, out[0, cap) */
    size_t cap;
    size_t out_len;        /* set: the output's length */
    ks_err err;            /* set: this item's result */
    ks_rollout_class cls;  /* set: the class written or read (when err is KS_OK) */
} ks_app_item;

/*
 * Seal (ks_app_seal_batch) or open (ks_app_open_batch) items[0, n), all
 * of table.column, as n calls of ks_app_seal / ks_app_open_value would,
 * each item getting its own err, out_len and cls: one call across a
 * language boundary per batch.  One failure does not stop the batch.
 * Returns KS_OK when every item succeeded, else the err of the first that
 * failed (KS_ERR_INVALID_ARGUMENT for NULL app, table, column or items
 * with n > 0, when no item is touched).
 */
KS_API KS_WUR ks_err ks_app_seal_batch(ks_app *app, const char *table, const char *column,
                                       ks_app_item *items, size_t n);
KS_API KS_WUR ks_err ks_app_open_batch(ks_app *app, const char *table, const char *column,
                                       ks_app_item *items, size_t n);

/* ---- inspecting ---------------------------------------------------------- */

/* Where a field lies in the input: bytes [offset, offset + len); len 0 and
 * offset 0 for a field the envelope does not have. */
typedef struct ks_app_span {
    size_t offset, len;
} ks_app_span;

/* An envelope's header fields and where each lies. */
typedef struct ks_app_header {
    uint8_t version;            /* KS_FORMAT_V1 or KS_FORMAT_V2 */
    uint32_t algorithm;         /* KS_ALG_* */
    uint32_t key_version;
    ks_app_span tenant, key_id, wrapped_dek, nonce, purpose, commitment;
    ks_app_span ciphertext;     /* ciphertext || tag */
    size_t header_len;          /* offset of the ciphertext field's tag: [0, header_len)
                                   holds the prefix and every header field */
    size_t total_len;           /* the envelope's length (== the input's) */
} ks_app_header;

/*
 * Parse envelope v[0, v_len) strictly (ks_envelope_parse, default limits)
 * into *out, without keys, a provider or an app: for inspect-like tools.
 * Errors: a rejection (codes 1..31, *perr filled when not NULL),
 * KS_ERR_INVALID_ARGUMENT for NULL out or v with v_len > 0.
 */
KS_API KS_WUR ks_err ks_app_parse(const uint8_t *v, size_t v_len, ks_app_header *out,
                                  ks_parse_error *perr);

/* ---- the background thread ----------------------------------------------- */

/* What the background thread did so far (counters only grow). */
typedef struct ks_app_stats {
    uint64_t heartbeats;        /* heartbeats refreshed */
    uint64_t heartbeat_errors;  /* heartbeats that failed (retried next interval) */
    uint64_t reports;           /* health reports made */
    uint64_t report_errors;     /* reports that failed (carried into the next) */
    uint64_t key_reloads;       /* keyring reloads after its file changed */
    uint64_t reload_errors;     /* reloads that failed (the keys in use stay) */
    ks_err last_error;          /* the last failure's code, KS_OK when none */
    uint64_t key_changes;       /* key-version lists registered because the keys held
                                   changed (ks_app_keys gives the current one) */
} ks_app_stats;

/* Copy app's background counters into *out (zeroed for NULL app). */
KS_API void ks_app_stats_get(ks_app *app, ks_app_stats *out);

/* The counters of app's contexts (keyshift/crypto.h ks_metrics: seals,
 * opens, DEK cache hits and misses, provider wraps and unwraps, errors by
 * class), summed over every keyring generation so that each only grows;
 * zeroed for NULL app.  No secrets.  For an agent's or service's own
 * metrics endpoint. */
KS_API void ks_app_metrics(ks_app *app, ks_metrics *out);

/* The health totals of app's contexts (keyshift/crypto.h
 * ks_ctx_health_sample: seals, opens, failures, provider calls, and the
 * seal and open latency histograms with their sums, timed unless the
 * options' ctx_config turns latency_histograms off),
 * summed over every keyring generation so that each only grows; the same
 * totals the background thread reports to the rollouts; out->time is 0;
 * zeroed for NULL app.  No secrets.  For a service's /metrics, written
 * with ks_metrics_write_totals (keyshift/health.h). */
KS_API void ks_app_health_sample(ks_app *app, ks_health_sample *out);

/* The key versions registered (a canonical list, "" for none; the
 * background thread re-registers them after a keyring reload) into
 * out[0, cap) with its NUL.  KS_ERR_BUFFER_TOO_SMALL when it does not fit
 * (KS_READER_KEYS_MAX + 1 always does). */
KS_API KS_WUR ks_err ks_app_keys(ks_app *app, char *out, size_t cap);

/* ---- base64 text, whatever the column's encoding ---------------------------
 *
 * ks_app_seal and ks_app_open_value already work in the encoding of the
 * column (ks_app_column_encoding); these two always use the base64 text
 * (docs/format.md section 10), for an application that knows a column is
 * text without a rollout or default_encoding saying so.  The rollout and
 * the health report see the same classes and counts.
 */

/* ks_app_seal_max_len (kept for callers of ks_app_seal_text). */
KS_API size_t ks_app_seal_text_max_len(size_t pt_len);

/*
 * ks_app_seal, in base64 whatever the column's encoding: the envelope's
 * canonical base64 text to out[0, cap) (*out_len its length).  Where the
 * rollout's answer is plaintext, out receives pt itself, as ks_app_seal.
 * Errors as ks_app_seal's (KS_ERR_BUFFER_TOO_SMALL: a cap of
 * ks_app_seal_max_len always suffices), and KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_app_seal_text(ks_app *app, const ks_app_record *r, const uint8_t *pt,
                                      size_t pt_len, uint8_t *out, size_t cap, size_t *out_len,
                                      ks_rollout_class *written);

/*
 * Open the stored text v[0, v_len) of record r [F-TEXT-4]: a value that
 * begins "S1NF" is decoded strictly (ks_envelope_text_decode; a
 * rejection, with its character offset in *perr, is returned and nothing
 * is opened), then opened as ks_app_open_value opens a binary column's envelope (a
 * parse error's offset then counts decoded bytes).  A value that begins
 * "KSE" (a binary envelope) is KS_ERR_BAD_MAGIC at 0.  Any other value is
 * plaintext: copied out when the rollout's
 * phase reads plaintext, else KS_ERR_PHASE, or, where no rollout governs
 * the column, KS_ERR_BAD_MAGIC at its first character that differs from
 * "S1NF" (KS_ERR_TRUNCATED at 0 for a value shorter than that and a
 * prefix of it).  A cap of v_len always suffices.  Other errors as
 * ks_app_open_value's, and KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_app_open_text(ks_app *app, const ks_app_record *r, const uint8_t *v,
                                      size_t v_len, uint8_t *pt, size_t cap, size_t *pt_len,
                                      ks_rollout_class *read, ks_parse_error *perr);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_APP_H */
