/*
 * tools/agent/policy_load.c -- loading the agent policy file
 * (docs/agent-policy.md [AP-LOAD-1..2]): open it without following a
 * symbolic link, check its type, owner and mode on the open descriptor,
 * read at most one byte more than the limit, and parse it with
 * tools/agent/policy.c.  Kept apart from the parser, which touches no
 * file, so that the parser's file is all that the fuzz target and its
 * coverage gate see.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy.h"

#include "../../migrate/alloc_hook.h"

/* Read the open file fd into buf[0, cap); its length to *len.  Stops at
 * cap bytes (a longer file is then refused by the parse, [AP-FILE-1]). */
static ks_err read_all(int fd, uint8_t *buf, size_t cap, size_t *len)
{
    size_t n = 0;
    while (n < cap) {
        const ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return KS_ERR_IO;
        }
        if (r == 0) {
            break;
        }
        n += (size_t)r;
    }
    *len = n;
    return KS_OK;
}

/* Open path and check it [AP-LOAD-1]; the descriptor to *fd. */
static ks_err open_checked(const char *path, int *fd, char *errbuf, size_t errlen)
{
    struct stat sb;
    *fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        const int err = errno;
        snprintf(errbuf, errlen,
                 err == ELOOP ? "%s: the agent policy is a symbolic link; name the file itself."
                              : "%s: cannot open the agent policy: %s.",
                 path, strerror(err));
        return err == ELOOP ? KS_ERR_INSECURE : KS_ERR_IO;
    }
    const char *why = NULL;
    if (fstat(*fd, &sb) != 0) {
        snprintf(errbuf, errlen, "%s: cannot stat the agent policy: %s.", path, strerror(errno));
        close(*fd);
        return KS_ERR_IO;
    }
    if (!S_ISREG(sb.st_mode)) {
        why = "is not a regular file";
    } else if (sb.st_uid != 0 && sb.st_uid != geteuid()) {
        why = "belongs neither to root nor to the agent's user; chown it";
    } else if ((sb.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        why = "is writable by its group or by others; chmod go-w it";
    }
    if (why != NULL) {
        snprintf(errbuf, errlen, "%s: the agent policy %s.", path, why);
        close(*fd);
        return KS_ERR_INSECURE;
    }
    return KS_OK;
}

/* See policy.h. */
ks_err ks_agent_policy_load(const char *path, ks_agent_policy **out, char *errbuf, size_t errlen)
{
    char scratch[1];
    char msg[512];
    size_t len = 0, off = 0;
    int fd;
    ks_err e;

    if (errbuf == NULL || errlen == 0) {
        errbuf = scratch;
        errlen = sizeof scratch;
    }
    errbuf[0] = '\0';
    if (path == NULL || out == NULL) {
        snprintf(errbuf, errlen, "no agent policy file was named.");
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if ((e = open_checked(path, &fd, errbuf, errlen)) != KS_OK) {
        return e;
    }
    uint8_t *buf = malloc(KS_AGENT_POLICY_FILE_MAX + 1);
    if (buf == NULL) {
        close(fd);
        snprintf(errbuf, errlen, "%s: no memory to read the agent policy.", path);
        return KS_ERR_NO_MEMORY;
    }
    e = read_all(fd, buf, KS_AGENT_POLICY_FILE_MAX + 1, &len);
    const int err = errno;
    close(fd);
    if (e != KS_OK) {
        snprintf(errbuf, errlen, "%s: cannot read the agent policy: %s.", path, strerror(err));
    } else if ((e = ks_agent_policy_parse(buf, len, out, &off, msg, sizeof msg)) != KS_OK) {
        snprintf(errbuf, errlen, "%s:%s", path, msg);
    }
    free(buf);
    return e;
}

