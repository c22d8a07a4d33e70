/*
 * migrate/rollout/rollout_internal.h -- what the parts of the rollout code
 * (guard.c, retire.c, rollout_db.c, policy.c) share.  Internal to the
 * library (no KS_API, hidden in the shared library).  Nothing here knows a
 * database: the state is reached through keyshift/rollout_store.h.
 */
#ifndef KS_MIGRATE_ROLLOUT_INTERNAL_H
#define KS_MIGRATE_ROLLOUT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/rollout.h>

#include "../errbuf.h"

/* Nonzero when s is 1..max bytes (NUL-terminated within max + 1) of the
 * character class kind (KS_RULE_NAME or KS_RULE_KEY_ID of format/rules.h). */
int ks_rollout_charset_ok(const char *s, size_t max, uint8_t kind);

/* Class c as text for messages ("plaintext", "k:2 (v2, xchacha20-poly1305)"). */
const char *ks_rollout_class_text(const ks_rollout_class *c, char *out, size_t out_len);

/* Bytes that ks_rollout_scope_text always fits in. */
#define SCOPE_TEXT_MAX KS_ROLLOUT_SCOPE_TEXT_MAX

/* The refusals of the guards and the rollout layer are written with the
 * library's one formatter. */
#define ks_rollout_fail ks_errbuf_fail

/* Compare two names as SQLite compares identifiers (ASCII letters in
 * either case): 0 when equal, else the sign of the first difference. */
int ks_rollout_name_cmp(const char *a, const char *b);

/* Make p stop heartbeating its registration and leave the registration
 * in keyshift_readers when p closes, rather than delete it: another
 * policy of this process registered the same instance id since and now
 * owns that row (migrate/app/app.c).  p is not NULL. */
void ks_policy_leave_registration(ks_policy *p);

/* ks_policy_may_read of a value whose class c the caller took from the
 * envelope it parsed (ks_envelope_parse), so that the value is not
 * parsed again: the same answer and errors. */
KS_WUR ks_err ks_policy_may_read_class(ks_policy *p, const char *table, const char *column,
                                       const ks_rollout_class *c, int *ok);

/* ks_policy_column_encoding (into *enc, its error into *enc_err) and
 * ks_policy_write_target, or with key_id ks_policy_write_target_key
 * (into *out, its error returned), from one refresh check and one read
 * section: both answers come from the same rules, for the cost of one.
 * A failed refresh is both errors. */
KS_WUR ks_err ks_policy_write_plan(ks_policy *p, const char *table, const char *column,
                                   const char *key_id, ks_bytes tenant, ks_rollout_class *out,
                                   ks_value_encoding *enc, ks_err *enc_err);

/* The store's data_version (keyshift/rollout_store.h): changes when
 * another connection commits to the database. */
KS_WUR ks_err ks_rollout_db_data_version(ks_rollout_db *db, int64_t *out);

/* Start (begin nonzero) or end a read transaction on db, so that several
 * reads see one snapshot. */
KS_WUR ks_err ks_rollout_db_snapshot(ks_rollout_db *db, int begin);

#endif /* KS_MIGRATE_ROLLOUT_INTERNAL_H */
