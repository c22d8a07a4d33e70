/*
 * migrate/keys/plugin_proc.h -- one KMS plugin process (docs/kms-plugin.md
 * [KP-PROC-1..3], [KP-BRIDGE-1..]): starting it, writing a request line and
 * reading one response line within a deadline, draining and keeping its
 * standard error, and ending it.
 *
 * Internal header: hidden visibility, not part of the ABI.  The policy
 * (retries, the rate limit, the pool, restarts) is provider_plugin.c's;
 * this part knows one process and one deadline at a time.
 *
 * Channels.  The plugin's standard input and output are both one end of a
 * Unix stream socketpair (as inetd does), so that keyshift writes with
 * send(MSG_NOSIGNAL) and a dead plugin is EPIPE, never a SIGPIPE in the
 * application.  Its standard error is a pipe.  keyshift's ends are
 * non-blocking and close-on-exec; the plugin gets no other descriptor.
 *
 * Not thread-safe: the caller owns a ks_pproc while it uses it.
 */
#ifndef KS_MIGRATE_PLUGIN_PROC_H
#define KS_MIGRATE_PLUGIN_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <keyshift/error.h>

#include "plugin_proto.h"

/* The standard error a provider keeps: the last KS_PSTDERR_CAP bytes its
 * plugins wrote, raw but for the DEKs cut out of it (ks_pstderr_add), and
 * redacted again when shown (ks_pstderr_show). */
#define KS_PSTDERR_CAP 1024u

/* How many DEKs a plugin process is known to have seen: the DEKs of its
 * last KS_PDEKS_KEPT wrap requests and unwrap answers. */
#define KS_PDEKS_KEPT 16u

/* The byte that stands in the kept stderr for a byte of a DEK (or of a
 * run of key characters cut by the window): never shown, a run of them
 * is shown as "[redacted]". */
#define KS_PSTDERR_MASK 0x01

typedef struct ks_pstderr {
    char buf[KS_PSTDERR_CAP];
    size_t len;
} ks_pstderr;

/* The DEKs one plugin process saw, a ring; wiped when the process ends. */
typedef struct ks_pdeks {
    uint8_t dek[KS_PDEKS_KEPT][KS_DEK_LEN];
    size_t n;    /* entries used, at most KS_PDEKS_KEPT */
    size_t next; /* the entry the next DEK replaces */
} ks_pdeks;

/* Remember dek (KS_DEK_LEN bytes) in d, replacing the oldest when full;
 * a DEK d already holds is not added twice. */
void ks_pdeks_note(ks_pdeks *d, const uint8_t *dek);

/*
 * Append n bytes to e, keeping the last KS_PSTDERR_CAP, so that no DEK of
 * d (may be NULL) survives in any spelling ([KP-BRIDGE-9]): on e's text
 * and the new bytes together, before the window is cut, every
 * occurrence of a DEK of d raw, in hex (lower or upper case), base64 and
 * base64url (padded or not) becomes KS_PSTDERR_MASK bytes; and when the
 * cut falls inside a run of key characters, what is left of that run is
 * masked too.
 */
void ks_pstderr_add(ks_pstderr *e, const char *p, size_t n, const ks_pdeks *d);

/* Mask in e every DEK of d, as ks_pstderr_add does (for a DEK learnt
 * after its bytes were kept: an unwrap's answer). */
void ks_pstderr_mask(ks_pstderr *e, const ks_pdeks *d);

/*
 * Write e's text into out[0, cap) (NUL-terminated) as it may be shown:
 * bytes outside printable ASCII become '?' (a line feed becomes " | "),
 * and every run of KS_PSTDERR_MASK bytes, and every run of 16 or more
 * characters of the base64, base64url and hex alphabets
 * ([A-Za-z0-9+/=_-], masked bytes counted in), becomes "[redacted]": a
 * DEK in base64 (44 characters) or hex (64) is never shown, whatever a
 * plugin wrote and whether or not keyshift knew it ([KP-SEC-4],
 * [KP-BRIDGE-9]).
 */
void ks_pstderr_show(const ks_pstderr *e, char *out, size_t cap);

/* One plugin process.  pid 0: none. */
typedef struct ks_pproc {
    pid_t pid;
    int io;              /* our end of the socketpair */
    int err;             /* the read end of its stderr pipe */
    uint64_t next_id;    /* the id of the next request [KP-PROC-3] */
    uint8_t *line;       /* KS_KP_LINE_MAX + 1 bytes, owned (ks_pproc_init) */
    size_t have;         /* bytes of line read and not yet consumed */
    const ks_pdeks *deks; /* the DEKs cut out of its stderr (the caller's), or NULL */
} ks_pproc;

/* Allocate p's line buffer; p is left with no process.  KS_ERR_NO_MEMORY. */
ks_err ks_pproc_init(ks_pproc *p);

/* End p's process (ks_pproc_kill) and free its buffer, wiped. */
void ks_pproc_free(ks_pproc *p);

/*
 * Start argv[0] (a path when it holds '/', else looked up on PATH) with
 * argv and the environment envp (NULL-terminated "NAME=value" strings:
 * the caller chooses them, [KP-SEC-1]), as the leader of a process group
 * of its own (so a terminal's ^C reaches keyshift, which then closes the
 * plugin's input, rather than the plugin in the middle of a call; and so
 * that a kill reaches whatever the plugin started), with default signal
 * dispositions and an empty signal mask.  KS_ERR_NOT_FOUND when no such
 * program exists, KS_ERR_UNAVAILABLE when it cannot be run,
 * KS_ERR_NO_MEMORY.  p must have no process.
 */
ks_err ks_pproc_start(ks_pproc *p, char *const argv[], char *const envp[]);

/*
 * Write req[0, len) (one request line) to p, then read one response line
 * into p->line, all before deadline_ns (ks_mono_ns).  On KS_OK the line is
 * p->line[0, *line_len), its LF included, or a line longer than
 * KS_KP_LINE_MAX (*line_len KS_KP_LINE_MAX + 1) for the reader to refuse;
 * *extra is set when the plugin wrote more than that one line
 * ([KP-PROC-2]: a duplicate response).  Its stderr is drained into e all
 * the while.  Errors: KS_ERR_TIMEOUT (the deadline passed),
 * KS_ERR_UNAVAILABLE (the plugin closed its output, exited or its socket
 * failed, whether or not mid-line).  After any error, and after a reply
 * with *extra, the process must be killed: the channel is out of step.
 */
ks_err ks_pproc_call(ks_pproc *p, const uint8_t *req, size_t len, uint64_t deadline_ns, ks_pstderr *e,
                     size_t *line_len, int *extra);

/* Wipe and forget the line ks_pproc_call() returned. */
void ks_pproc_consume(ks_pproc *p);

/* Whether p's idle process wrote something or ended since its last reply
 * (it must not, [KP-PROC-2]); drains its stderr into e. */
int ks_pproc_idle_broken(ks_pproc *p, ks_pstderr *e);

/* Kill p's process group (SIGKILL: the plugin and every process it
 * started that stayed in its group) and reap the plugin, close its
 * channels and wipe any buffered bytes.  A no-op without a process. */
void ks_pproc_kill(ks_pproc *p);

/* End p's process politely: close its input, wait up to grace_ms for it
 * to exit, then kill its process group (what it left running included).
 * Its last stderr goes to e (may be NULL). */
void ks_pproc_stop(ks_pproc *p, uint32_t grace_ms, ks_pstderr *e);

/* Forget p's process without signalling or reaping it (in a child after
 * fork: the process is the parent's). */
void ks_pproc_abandon(ks_pproc *p);

#endif /* KS_MIGRATE_PLUGIN_PROC_H */
