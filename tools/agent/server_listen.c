/*
 * tools/agent/server_listen.c -- the agent's listening sockets: the Unix socket with
 * its mode and group, the TCP metrics socket, or systemd's (server.h).
 */
#define _GNU_SOURCE /* struct ucred */

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <sodium.h>
#include <systemd/sd-daemon.h>

#include "server.h"

/* ---- listeners -------------------------------------------------------------------- */

/* Create the Unix socket at path with mode and group [AG-SOCK-1..2].  A
 * stale socket file (nothing listening) is replaced; a live one refused. */
static int listen_unix(agent *a, const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        ks_agent_logf("the socket path is longer than %zu bytes", sizeof sa.sun_path - 1);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ks_agent_logf("cannot create a Unix socket: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            ks_agent_logf("%s exists and is not a socket; remove it or choose another path", path);
            close(fd);
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            ks_agent_logf("another process is serving %s; stop it first", path);
            close(fd);
            return -1;
        }
        close(fd);
        unlink(path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            ks_agent_logf("cannot create a Unix socket: %s", strerror(errno));
            return -1;
        }
    }
    mode_t old = umask(0177); /* never wider than 0600 before the chmod below */
    int b = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (b != 0) {
        ks_agent_logf("cannot bind %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    strcpy(a->unix_path, path);
    a->own_unix = 1;
    if (chmod(path, (mode_t)a->cfg->socket_mode) != 0 ||
        (a->cfg->socket_gid >= 0 && chown(path, (uid_t)-1, (gid_t)a->cfg->socket_gid) != 0)) {
        ks_agent_logf("cannot set the mode or group of %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (listen(fd, 128) != 0) {
        ks_agent_logf("cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Listen on 127.0.0.1:port (metrics only) [AG-SOCK-3]; the port bound is
 * logged (port 0 picks one). */
static int listen_tcp(const char *spec)
{
    const char *colon = strrchr(spec, ':');
    char host[64];
    if (colon == NULL || (size_t)(colon - spec) >= sizeof host) {
        ks_agent_logf("--listen tcp: wants tcp:127.0.0.1:PORT");
        return -1;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    if (*end != '\0' || colon[1] == '\0' || port > 65535 || inet_pton(AF_INET, host, &sin.sin_addr) != 1 ||
        (ntohl(sin.sin_addr.s_addr) >> 24) != 127) {
        ks_agent_logf("--listen tcp: wants a loopback address (127.0.0.0/8) and a port");
        return -1;
    }
    sin.sin_port = htons((uint16_t)port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 || listen(fd, 64) != 0) {
        ks_agent_logf("cannot listen on %s: %s", spec, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    socklen_t sl = sizeof sin;
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    ks_agent_logf("metrics on tcp:%s:%u", host, (unsigned)ntohs(sin.sin_port));
    return fd;
}

/* The listeners: systemd's (sd_listen_fds) when it passed any, else the
 * --listen options.  Returns 0, or -1 after logging. */
int ks_agent_open_listeners(agent *a)
{
    a->api_fd = a->metrics_fd = -1;
    int n = sd_listen_fds(1);
    if (n > 0) {
        for (int i = 0; i < n; i++) {
            int fd = SD_LISTEN_FDS_START + i;
            if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) > 0 && a->api_fd < 0) {
                a->api_fd = fd;
            } else if (sd_is_socket_inet(fd, AF_INET, SOCK_STREAM, 1, 0) > 0 && a->metrics_fd < 0) {
                a->metrics_fd = fd;
            } else {
                ks_agent_logf("systemd passed a socket that is not a listening Unix or TCP stream socket");
                return -1;
            }
        }
        ks_agent_logf("listening on %d socket(s) from systemd", n);
        return 0;
    }
    for (size_t i = 0; i < a->cfg->n_listen; i++) {
        const char *s = a->cfg->listen[i];
        if (strncmp(s, "unix:", 5) == 0 && a->api_fd < 0) {
            a->api_fd = listen_unix(a, s + 5);
            if (a->api_fd < 0) {
                return -1;
            }
        } else if (strncmp(s, "tcp:", 4) == 0 && a->metrics_fd < 0) {
            a->metrics_fd = listen_tcp(s + 4);
            if (a->metrics_fd < 0) {
                return -1;
            }
        } else {
            ks_agent_logf("--listen %s: one unix:PATH and one tcp:127.0.0.1:PORT at most", s);
            return -1;
        }
    }
    return 0;
}
