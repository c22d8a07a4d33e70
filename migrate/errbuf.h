/*
 * migrate/errbuf.h -- the one formatter of the library's messages: every
 * layer that explains a refusal in a caller's buffer (the SQLite and
 * PostgreSQL stores of migrate/store/, the guards and the rollout layer of
 * migrate/rollout/) writes it with ks_errbuf_fail.  At the bottom of migrate/, like
 * alloc_hook.h, so that no layer includes another's internals for it.
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_ERRBUF_H
#define KS_MIGRATE_ERRBUF_H

#include <stddef.h>

#include <keyshift/error.h>

/* Format a message into errbuf[0, errbuf_len) (NULL or 0: none; a
 * formatting failure leaves it empty); returns err so that callers can
 * write `return ks_errbuf_fail(...)`. */
__attribute__((format(printf, 4, 5))) ks_err ks_errbuf_fail(char *errbuf, size_t errbuf_len,
                                                           ks_err err, const char *fmt, ...);

#endif /* KS_MIGRATE_ERRBUF_H */
