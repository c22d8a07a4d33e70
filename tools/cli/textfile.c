/*
 * tools/cli/textfile.c -- atomic Prometheus text files (textfile.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "textfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "cli.h"

/* Write all of p[0, n) to fd, retrying short writes and EINTR.  0 or -1. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* See textfile.h.  The temporary name starts with a dot so that the
 * collector, which reads only *.prom, never picks it up. */
int ks_cli_textfile_write(const char *dir, const char *name, const char *text, size_t len)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ks_cli_error("--textfile %s is not a directory: give node_exporter's "
                     "--collector.textfile.directory",
                     dir);
        return EX_NOINPUT;
    }
    char tmp[4096], final[4096];
    int a = snprintf(tmp, sizeof tmp, "%s/.%s.%ld.tmp", dir, name, (long)getpid());
    int b = snprintf(final, sizeof final, "%s/%s", dir, name);
    if (a < 0 || (size_t)a >= sizeof tmp || b < 0 || (size_t)b >= sizeof final) {
        ks_cli_error("--textfile %s: the path is too long", dir);
        return EX_CANTCREAT;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ks_cli_error("cannot create %s: %s", tmp, strerror(errno));
        return EX_CANTCREAT;
    }
    if (write_all(fd, text, len) != 0 || fsync(fd) != 0) {
        ks_cli_error("cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return EX_CANTCREAT;
    }
    if (close(fd) != 0 || rename(tmp, final) != 0) {
        ks_cli_error("cannot rename %s to %s: %s", tmp, final, strerror(errno));
        unlink(tmp);
        return EX_CANTCREAT;
    }
    /* The rename is durable once the directory is. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return EX_OK;
}
