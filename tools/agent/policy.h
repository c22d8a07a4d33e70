/*
 * tools/agent/policy.h -- the agent policy file of `keyshift serve`
 * (docs/agent-policy.md): who, by the uid and gid the kernel reports for
 * a peer of the agent's socket (SO_PEERCRED), may seal, open or parse in
 * which scopes (TABLE.COLUMN) and for which tenants.  Deny by default.
 *
 * ks_agent_policy_parse is the strict reader of the file's bytes (what
 * fuzz/fuzz_agent_policy.c fuzzes): no file, no user database, one
 * allocation for the result (tools/agent/policy.c).  ks_agent_policy_load
 * opens and checks the file, then parses it (tools/agent/policy_load.c).
 * ks_agent_policy_allows is the per-request decision: no allocation, a
 * binary search and the rules of the peer's uid and gid.  A policy is immutable once made, so any number of
 * threads may call allows() on it at once.
 */
#ifndef KS_TOOLS_AGENT_POLICY_H
#define KS_TOOLS_AGENT_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <keyshift/common.h>
#include <keyshift/error.h>

/* The limits of [AP-FILE-1], [AP-LINE-2], [AP-RULE-3], [AP-SCOPE-1]. */
#define KS_AGENT_POLICY_FILE_MAX 65536u /* bytes in a file */
#define KS_AGENT_POLICY_LINE_MAX 1024u  /* bytes in a line, its LF not counted */
#define KS_AGENT_POLICY_RULES_MAX 1024u /* rule lines in a file */
#define KS_AGENT_POLICY_ID_MAX 4294967294u /* the largest uid or gid; (uid_t)-1 is none */

/* The header line's text, without its LF [AP-HEAD-1]. */
#define KS_AGENT_POLICY_HEADER "keyshift-agent-policy 1"

/* The operations a rule grants [AP-OPS-1]; a request asks for one. */
typedef enum { KS_AGENT_OP_SEAL = 1u, KS_AGENT_OP_OPEN = 2u, KS_AGENT_OP_PARSE = 4u } ks_agent_op;

typedef struct ks_agent_policy ks_agent_policy;

/* One rule of a parsed policy, as ks_agent_policy_rule gives it: views
 * into the policy's own copy of the file, valid while the policy is. */
typedef struct ks_agent_rule {
    int is_gid;        /* 0: `uid ID`, 1: `gid ID` */
    uint32_t id;       /* 0 .. KS_AGENT_POLICY_ID_MAX */
    int any_scope;     /* `scope *`: table and column are empty */
    ks_bytes table;    /* as written (matched ASCII case-insensitively) */
    ks_bytes column;
    int any_tenant;    /* `tenant *`: tenant is empty */
    ks_bytes tenant;   /* as written (matched exactly) */
    unsigned ops;      /* KS_AGENT_OP_x bits, at least one */
    size_t offset;     /* of the rule line's first byte in the file */
} ks_agent_rule;

/*
 * Open the policy file at path and parse it [AP-LOAD-1..2]: open with
 * O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK (a symbolic link is KS_ERR_INSECURE,
 * any other failure to open or read KS_ERR_IO), then fstat: it must be a
 * regular file owned by root or the effective uid, not writable by group
 * or others (KS_ERR_INSECURE otherwise); read at most
 * KS_AGENT_POLICY_FILE_MAX + 1 bytes and parse.  A rejected file returns
 * the rejection's code (docs/agent-policy.md [AP-ERR-1]); no memory,
 * KS_ERR_NO_MEMORY; NULL path or out, KS_ERR_INVALID_ARGUMENT.  A
 * sentence (for a rejection "PATH:LINE:COLUMN: NAME: what is wrong")
 * goes to errbuf (may be NULL).  *out is NULL on failure.
 */
KS_WUR ks_err ks_agent_policy_load(const char *path, ks_agent_policy **out, char *errbuf,
                                   size_t errlen);

/*
 * Parse a policy file buf[0, len) strictly (docs/agent-policy.md).  On
 * success *out is a new policy (free with ks_agent_policy_free) and
 * KS_OK is returned.  On a rejection *out is NULL, the code of
 * [AP-ERR-1] is returned, the offset of the byte at fault goes to
 * *err_off (may be NULL) and "LINE:COLUMN: NAME: what is wrong" to
 * errbuf (may be NULL).  KS_ERR_NO_MEMORY when the one allocation fails,
 * KS_ERR_INVALID_ARGUMENT for a NULL out or a NULL buf with len > 0.
 * Reads only buf[0, len); work O(len + rules * log(rules)).
 */
KS_WUR ks_err ks_agent_policy_parse(const uint8_t *buf, size_t len, ks_agent_policy **out,
                                    size_t *err_off, char *errbuf, size_t errlen);

/*
 * 1 when the policy lets a peer of uid and gid do op in scope
 * ("TABLE.COLUMN", or NULL / "" for a request that names none) for
 * tenant[0, tenant_len) (tenant_len 0: none, e.g. an open of any
 * tenant), else 0 [AP-MATCH-1..5].  A NULL policy, an op that is not
 * exactly one KS_AGENT_OP_x, or a NULL tenant with tenant_len > 0 is 0.
 * No allocation; O(log rules + the rules of uid and gid).
 */
int ks_agent_policy_allows(const ks_agent_policy *p, uid_t uid, gid_t gid, const char *scope,
                           const uint8_t *tenant, size_t tenant_len, ks_agent_op op);

/* The number of rules of p (0 for NULL). */
size_t ks_agent_policy_count(const ks_agent_policy *p);

/* Rule i of p, in file order, into *out.  KS_ERR_INVALID_ARGUMENT for a
 * NULL p or out, KS_ERR_NOT_FOUND for i past the last rule. */
KS_WUR ks_err ks_agent_policy_rule(const ks_agent_policy *p, size_t i, ks_agent_rule *out);

/*
 * Write the canonical form of p [AP-CANON-1] into out[0, cap); its
 * length goes to *out_len.  KS_ERR_BUFFER_TOO_SMALL (*out_len still the
 * length needed) when cap is short, KS_ERR_INVALID_ARGUMENT for NULL p
 * or out_len, or NULL out with cap > 0.  Never longer than
 * KS_AGENT_POLICY_FILE_MAX.
 */
KS_WUR ks_err ks_agent_policy_encode(const ks_agent_policy *p, uint8_t *out, size_t cap,
                                     size_t *out_len);

/* Free p; NULL is a no-op. */
void ks_agent_policy_free(ks_agent_policy *p);

#endif /* KS_TOOLS_AGENT_POLICY_H */
