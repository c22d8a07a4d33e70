/*
 * tools/agent/policy_stub.c -- a minimal agent policy, built only while
 * tools/agent/policy.c (the strict policy reader, docs/agent-policy.md)
 * is absent from the tree, reading a subset of that format: the header
 * line "keyshift-agent-policy 1", then one rule per line
 *
 *     allow uid|gid ID scope TABLE.COLUMN|* tenant NAME|* ops seal,open,parse
 *
 * '#' starts a comment line; empty lines are ignored.  Anything else is
 * refused.  Deny by default.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define RULES_MAX 256
#define FIELD_MAX 256
#define FILE_MAX 65536

typedef struct rule {
    int by_gid;
    unsigned long id;
    unsigned ops;
    char scope[FIELD_MAX];
    char tenant[FIELD_MAX];
} rule;

struct ks_agent_policy {
    size_t n;
    rule r[RULES_MAX];
};

/* Parse one rule line p[0, n) into *r; 0 when it is not one. */
static int parse_rule(const char *p, size_t n, rule *r)
{
    char w[9][FIELD_MAX];
    size_t k = 0, i = 0;
    while (i < n && k < 9) {
        size_t j = i;
        while (j < n && p[j] != ' ') {
            j++;
        }
        if (j == i || j - i >= FIELD_MAX) {
            return 0;
        }
        memcpy(w[k], p + i, j - i);
        w[k][j - i] = '\0';
        k++;
        i = j + 1;
    }
    if (k != 9 || i < n || strcmp(w[0], "allow") != 0 || strcmp(w[3], "scope") != 0 ||
        strcmp(w[5], "tenant") != 0 || strcmp(w[7], "ops") != 0) {
        return 0;
    }
    if (strcmp(w[1], "uid") != 0 && strcmp(w[1], "gid") != 0) {
        return 0;
    }
    r->by_gid = w[1][0] == 'g';
    char *end;
    errno = 0;
    r->id = strtoul(w[2], &end, 10);
    if (errno != 0 || *end != '\0' || w[2][0] < '0' || w[2][0] > '9') {
        return 0;
    }
    strcpy(r->scope, w[4]);
    strcpy(r->tenant, w[6]);
    r->ops = 0;
    for (char *save = NULL, *t = strtok_r(w[8], ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        r->ops |= strcmp(t, "seal") == 0 ? KS_AGENT_OP_SEAL
                  : strcmp(t, "open") == 0 ? KS_AGENT_OP_OPEN
                  : strcmp(t, "parse") == 0 ? KS_AGENT_OP_PARSE : 0x100u;
    }
    return r->ops != 0 && !(r->ops & 0x100u);
}

/* See agent.h. */
ks_err ks_agent_policy_parse(const uint8_t *buf, size_t len, ks_agent_policy **out, size_t *err_off,
                             char *errbuf, size_t errlen)
{
    ks_agent_policy *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    size_t i = 0;
    int header = 0;
    while (i < len) {
        const uint8_t *nl = memchr(buf + i, '\n', len - i);
        size_t n = nl != NULL ? (size_t)(nl - (buf + i)) : len - i;
        const char *line = (const char *)buf + i;
        if (n > 0 && line[0] != '#') {
            static const char head[] = "keyshift-agent-policy 1";
            const int ok = header ? p->n < RULES_MAX && parse_rule(line, n, &p->r[p->n])
                                  : n == sizeof head - 1 && memcmp(line, head, n) == 0;
            if (!ok) {
                if (err_off != NULL) {
                    *err_off = i;
                }
                snprintf(errbuf, errlen, "the policy's line at byte %zu is not a rule", i);
                free(p);
                return KS_ERR_BAD_VALUE;
            }
            p->n += header;
            header = 1;
        }
        i += n + 1;
    }
    *out = p;
    return KS_OK;
}

/* See agent.h. */
ks_err ks_agent_policy_load(const char *path, ks_agent_policy **out, char *errbuf, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(errbuf, errlen, "cannot open the policy file: %s", strerror(errno));
        return KS_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > FILE_MAX) {
        close(fd);
        snprintf(errbuf, errlen, "the policy file is not a regular file of at most %d bytes",
                 FILE_MAX);
        return KS_ERR_IO;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        close(fd);
        snprintf(errbuf, errlen, "the policy file is writable by group or others: chmod go-w it");
        return KS_ERR_INSECURE;
    }
    uint8_t *buf = malloc(FILE_MAX);
    ssize_t n = buf != NULL ? read(fd, buf, FILE_MAX) : -1;
    close(fd);
    if (n < 0) {
        snprintf(errbuf, errlen, "cannot read the policy file: %s", strerror(errno));
        free(buf);
        return KS_ERR_IO;
    }
    ks_err e = ks_agent_policy_parse(buf, (size_t)n, out, NULL, errbuf, errlen);
    free(buf);
    return e;
}

/* Nonzero when pattern (or "*") matches s[0, n). */
static int match(const char *pattern, const char *s, size_t n)
{
    return strcmp(pattern, "*") == 0 || (n > 0 && strlen(pattern) == n && memcmp(pattern, s, n) == 0);
}

/* See agent.h. */
int ks_agent_policy_allows(const ks_agent_policy *p, uid_t uid, gid_t gid, const char *scope,
                           const uint8_t *tenant, size_t tenant_len, ks_agent_op op)
{
    for (size_t i = 0; p != NULL && i < p->n; i++) {
        const rule *r = &p->r[i];
        if ((r->by_gid ? (unsigned long)gid : (unsigned long)uid) == r->id && (r->ops & op) &&
            match(r->scope, scope, strlen(scope)) &&
            match(r->tenant, tenant != NULL ? (const char *)tenant : "", tenant_len)) {
            return 1;
        }
    }
    return 0;
}

/* See agent.h. */
void ks_agent_policy_free(ks_agent_policy *p)
{
    free(p);
}
