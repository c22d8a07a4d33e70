/*
 * migrate/keys/plugin_proc.c -- one KMS plugin process: see plugin_proc.h.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../crypto/mono_clock.h"
#include "plugin_proc.h"
#include "../alloc_hook.h"

/* Bytes the stderr drain reads at a time. */
#define DRAIN_CHUNK 4096u

/* ---- standard error --------------------------------------------------------- */

/* Whether c is of the alphabets a key would be written in (base64,
 * base64url, hex), or a byte already masked. */
static int keyish(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/' || c == '=' || c == '-' || c == '_' || c == KS_PSTDERR_MASK;
}

/* See plugin_proc.h. */
void ks_pdeks_note(ks_pdeks *d, const uint8_t *dek)
{
    for (size_t i = 0; i < d->n; i++) {
        if (sodium_memcmp(d->dek[i], dek, KS_DEK_LEN) == 0) {
            return;
        }
    }
    memcpy(d->dek[d->next], dek, KS_DEK_LEN);
    d->next = (d->next + 1) % KS_PDEKS_KEPT;
    if (d->n < KS_PDEKS_KEPT) {
        d->n++;
    }
}

/* Mask every occurrence of needle[0, m) in buf[0, n). */
static void mask_all(char *buf, size_t n, const char *needle, size_t m)
{
    size_t at = 0;
    while (m > 0 && at + m <= n) {
        char *hit = memmem(buf + at, n - at, needle, m);
        if (hit == NULL) {
            return;
        }
        memset(hit, KS_PSTDERR_MASK, m);
        at = (size_t)(hit - buf) + 1;
    }
}

/* Mask in buf[0, n) every DEK of d in each spelling [KP-BRIDGE-9]: raw,
 * hex in lower and upper case, base64 and base64url.  An encoding is
 * matched without its padding, so the padded and the unpadded forms are
 * both masked (and the '=' left over is a short run the pattern rule
 * does not need). */
static void mask_deks(char *buf, size_t n, const ks_pdeks *d)
{
    if (d == NULL) {
        return;
    }
    char enc[2 * KS_DEK_LEN + 1];
    for (size_t i = 0; i < d->n; i++) {
        mask_all(buf, n, (const char *)d->dek[i], KS_DEK_LEN);
        sodium_bin2hex(enc, sizeof enc, d->dek[i], KS_DEK_LEN);
        mask_all(buf, n, enc, 2 * KS_DEK_LEN);
        for (size_t j = 0; j < 2 * KS_DEK_LEN; j++) {
            enc[j] = (char)(enc[j] >= 'a' && enc[j] <= 'f' ? enc[j] - 'a' + 'A' : enc[j]);
        }
        mask_all(buf, n, enc, 2 * KS_DEK_LEN);
        sodium_bin2base64(enc, sizeof enc, d->dek[i], KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
        mask_all(buf, n, enc, strlen(enc));
        sodium_bin2base64(enc, sizeof enc, d->dek[i], KS_DEK_LEN, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
        mask_all(buf, n, enc, strlen(enc));
    }
    sodium_memzero(enc, sizeof enc);
}

/* See plugin_proc.h. */
void ks_pstderr_mask(ks_pstderr *e, const ks_pdeks *d)
{
    mask_deks(e->buf, e->len, d);
}

/* Append p[0, n) to e, n at most DRAIN_CHUNK: mask the DEKs of d in the
 * window and the new bytes together, then keep the last KS_PSTDERR_CAP
 * bytes, masking what is left of a run of key characters the cut falls
 * in. */
static void add_piece(ks_pstderr *e, const char *p, size_t n, const ks_pdeks *d)
{
    char tmp[KS_PSTDERR_CAP + DRAIN_CHUNK];
    assert(n <= DRAIN_CHUNK && e->len <= KS_PSTDERR_CAP);
    memcpy(tmp, e->buf, e->len);
    memcpy(tmp + e->len, p, n);
    const size_t all = e->len + n;
    mask_deks(tmp, all, d);
    const size_t drop = all > KS_PSTDERR_CAP ? all - KS_PSTDERR_CAP : 0;
    if (drop > 0 && keyish((unsigned char)tmp[drop - 1])) {
        for (size_t i = drop; i < all && keyish((unsigned char)tmp[i]); i++) {
            tmp[i] = KS_PSTDERR_MASK;
        }
    }
    memcpy(e->buf, tmp + drop, all - drop);
    e->len = all - drop;
    sodium_memzero(tmp, sizeof tmp);
}

/* See plugin_proc.h. */
void ks_pstderr_add(ks_pstderr *e, const char *p, size_t n, const ks_pdeks *d)
{
    while (n > 0) {
        const size_t m = n < DRAIN_CHUNK ? n : DRAIN_CHUNK;
        add_piece(e, p, m, d);
        p += m;
        n -= m;
    }
}

/* Append s[0, len) to out[*n, cap - 1), keeping room for the NUL. */
static void show_put(char *out, size_t cap, size_t *n, const char *s, size_t len)
{
    while (len-- > 0 && *n + 1 < cap) {
        out[(*n)++] = *s++;
    }
}

/* See plugin_proc.h.  Linear: each byte is looked at twice at most. */
void ks_pstderr_show(const ks_pstderr *e, char *out, size_t cap)
{
    if (cap == 0) {
        return;
    }
    size_t n = 0, i = 0;
    while (i < e->len) {
        const unsigned char c = (unsigned char)e->buf[i];
        if (keyish(c)) {
            size_t j = i;
            int masked = 0;
            while (j < e->len && keyish((unsigned char)e->buf[j])) {
                masked |= e->buf[j] == KS_PSTDERR_MASK;
                j++;
            }
            if (j - i >= 16 || masked) {
                show_put(out, cap, &n, "[redacted]", 10); /* [KP-BRIDGE-9] */
            } else {
                show_put(out, cap, &n, e->buf + i, j - i);
            }
            i = j;
        } else if (c == '\n') {
            show_put(out, cap, &n, i + 1 < e->len ? " | " : "", i + 1 < e->len ? 3 : 0);
            i++;
        } else {
            show_put(out, cap, &n, c >= 0x20 && c < 0x7F ? (const char *)&e->buf[i] : "?", 1);
            i++;
        }
    }
    out[n] = '\0';
}

/* Read whatever the plugin's stderr holds now into e, without blocking.
 * At end of file the descriptor is closed. */
static void drain_stderr(ks_pproc *p, ks_pstderr *e)
{
    char chunk[DRAIN_CHUNK];
    while (p->err >= 0) {
        const ssize_t r = read(p->err, chunk, sizeof chunk);
        if (r > 0) {
            if (e != NULL) {
                ks_pstderr_add(e, chunk, (size_t)r, p->deks);
            }
            continue;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r == 0) {
            close(p->err);
            p->err = -1;
        }
        break;
    }
    sodium_memzero(chunk, sizeof chunk);
}

/* ---- life ------------------------------------------------------------------ */

/* See plugin_proc.h. */
ks_err ks_pproc_init(ks_pproc *p)
{
    memset(p, 0, sizeof *p);
    p->io = p->err = -1;
    p->line = malloc(KS_KP_LINE_MAX + 1);
    return p->line != NULL ? KS_OK : KS_ERR_NO_MEMORY;
}

/* See plugin_proc.h. */
void ks_pproc_free(ks_pproc *p)
{
    ks_pproc_kill(p);
    if (p->line != NULL) {
        sodium_memzero(p->line, KS_KP_LINE_MAX + 1);
        free(p->line);
        p->line = NULL;
    }
}

/* Close p's descriptors and wipe its buffered bytes; pid is the caller's. */
static void close_channels(ks_pproc *p)
{
    if (p->io >= 0) {
        close(p->io);
    }
    if (p->err >= 0) {
        close(p->err);
    }
    p->io = p->err = -1;
    ks_pproc_consume(p);
}

/* The file actions and attributes of a plugin's start: its three
 * standard descriptors, nothing else, a group of its own, default
 * signals. */
static int spawn_setup(posix_spawn_file_actions_t *fa, posix_spawnattr_t *at, int child_io, int child_err)
{
    if (posix_spawn_file_actions_init(fa) != 0) {
        return -1;
    }
    if (posix_spawnattr_init(at) != 0) {
        posix_spawn_file_actions_destroy(fa);
        return -1;
    }
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    static const int defaulted[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM};
    for (size_t i = 0; i < sizeof defaulted / sizeof defaulted[0]; i++) {
        sigaddset(&dfl, defaulted[i]);
    }
    int rc = posix_spawn_file_actions_adddup2(fa, child_io, 0);
    rc |= posix_spawn_file_actions_adddup2(fa, child_io, 1);
    rc |= posix_spawn_file_actions_adddup2(fa, child_err, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    rc |= posix_spawn_file_actions_addclosefrom_np(fa, 3);
#endif
    rc |= posix_spawnattr_setflags(at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    rc |= posix_spawnattr_setpgroup(at, 0);
    rc |= posix_spawnattr_setsigmask(at, &none);
    rc |= posix_spawnattr_setsigdefault(at, &dfl);
    if (rc != 0) {
        posix_spawnattr_destroy(at);
        posix_spawn_file_actions_destroy(fa);
        return -1;
    }
    return 0;
}

/* See plugin_proc.h. */
ks_err ks_pproc_start(ks_pproc *p, char *const argv[], char *const envp[])
{
    if (p->pid != 0 || p->line == NULL || argv == NULL || argv[0] == NULL || envp == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    int sv[2], ep[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return errno == ENOMEM || errno == ENOBUFS ? KS_ERR_NO_MEMORY : KS_ERR_UNAVAILABLE;
    }
    if (pipe2(ep, O_CLOEXEC) != 0) {
        close(sv[0]);
        close(sv[1]);
        return KS_ERR_UNAVAILABLE;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    ks_err rc = KS_ERR_NO_MEMORY;
    if (spawn_setup(&fa, &at, sv[1], ep[1]) == 0) {
        pid_t pid;
        const int s = strchr(argv[0], '/') != NULL ? posix_spawn(&pid, argv[0], &fa, &at, argv, envp)
                                                    : posix_spawnp(&pid, argv[0], &fa, &at, argv, envp);
        posix_spawnattr_destroy(&at);
        posix_spawn_file_actions_destroy(&fa);
        if (s == 0) {
            p->pid = pid;
            rc = KS_OK;
        } else {
            rc = (s == ENOENT || s == ENOTDIR) ? KS_ERR_NOT_FOUND : KS_ERR_UNAVAILABLE;
        }
    }
    close(sv[1]);
    close(ep[1]);
    if (rc != KS_OK) {
        close(sv[0]);
        close(ep[0]);
        return rc;
    }
    p->io = sv[0];
    p->err = ep[0];
    (void)fcntl(p->io, F_SETFL, fcntl(p->io, F_GETFL) | O_NONBLOCK);
    (void)fcntl(p->err, F_SETFL, fcntl(p->err, F_GETFL) | O_NONBLOCK);
    p->next_id = 1;
    p->have = 0;
    return KS_OK;
}

/* Reap p's process after it was signalled (or has exited). */
static void reap(ks_pproc *p)
{
    while (p->pid > 0 && waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    p->pid = 0;
}

/* See plugin_proc.h.  The group is signalled while its leader is not yet
 * reaped (running, or a zombie), so its id cannot have been reused. */
void ks_pproc_kill(ks_pproc *p)
{
    if (p->pid > 0) {
        if (kill(-p->pid, SIGKILL) != 0) {
            (void)kill(p->pid, SIGKILL); /* no group: the plugin alone */
        }
        reap(p);
    }
    close_channels(p);
}

/* See plugin_proc.h. */
void ks_pproc_abandon(ks_pproc *p)
{
    p->pid = 0;
    close_channels(p);
}

/* See plugin_proc.h. */
void ks_pproc_stop(ks_pproc *p, uint32_t grace_ms, ks_pstderr *e)
{
    if (p->pid <= 0) {
        close_channels(p);
        return;
    }
    (void)shutdown(p->io, SHUT_WR);
    const uint64_t end = ks_mono_ns() + (uint64_t)grace_ms * 1000000u;
    for (;;) {
        drain_stderr(p, e);
        /* Whether it exited, without reaping it: ks_pproc_kill then ends
         * what it left running in its group, then reaps it. */
        siginfo_t si;
        memset(&si, 0, sizeof si);
        const int w = waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT);
        if (w < 0 && errno == ECHILD) {
            p->pid = 0;
            break;
        }
        if (w == 0 && si.si_pid == p->pid) {
            break;
        }
        if (ks_mono_ns() >= end) {
            break;
        }
        const struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    drain_stderr(p, e);
    ks_pproc_kill(p);
}

/* ---- one exchange ------------------------------------------------------------- */

/* Milliseconds from now to deadline_ns for poll(), at least 0, rounded up. */
static int poll_ms(uint64_t deadline_ns)
{
    const uint64_t now = ks_mono_ns();
    if (now >= deadline_ns) {
        return 0;
    }
    const uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > 60000u ? 60000 : (int)ms;
}

/* Wait until p->io is ready for `events` or the deadline passes, draining
 * stderr meanwhile.  KS_OK, KS_ERR_TIMEOUT or KS_ERR_UNAVAILABLE. */
static ks_err wait_io(ks_pproc *p, short events, uint64_t deadline_ns, ks_pstderr *e)
{
    for (;;) {
        struct pollfd fds[2] = {{p->io, events, 0}, {p->err, POLLIN, 0}};
        const int ms = poll_ms(deadline_ns);
        const int n = poll(fds, p->err >= 0 ? 2 : 1, ms);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return KS_ERR_UNAVAILABLE;
        }
        if (p->err >= 0 && fds[1].revents != 0) {
            drain_stderr(p, e);
        }
        if (fds[0].revents & (events | POLLHUP | POLLERR)) {
            return KS_OK;
        }
        if (n == 0 || ks_mono_ns() >= deadline_ns) {
            return KS_ERR_TIMEOUT;
        }
    }
}

/* Write buf[0, len) to p before the deadline. */
static ks_err send_all(ks_pproc *p, const uint8_t *buf, size_t len, uint64_t deadline_ns, ks_pstderr *e)
{
    size_t off = 0;
    while (off < len) {
        const ssize_t w = send(p->io, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            const ks_err rc = wait_io(p, POLLOUT, deadline_ns, e);
            if (rc != KS_OK) {
                return rc;
            }
            continue;
        }
        return KS_ERR_UNAVAILABLE; /* EPIPE, ECONNRESET: the plugin is gone */
    }
    return KS_OK;
}

/* Read until p->line holds an LF, or more than KS_KP_LINE_MAX bytes, before
 * the deadline.  The line's length (its LF included) goes to *line_len. */
static ks_err recv_line(ks_pproc *p, uint64_t deadline_ns, ks_pstderr *e, size_t *line_len)
{
    size_t scanned = 0;
    for (;;) {
        const uint8_t *lf = memchr(p->line + scanned, '\n', p->have - scanned);
        if (lf != NULL) {
            *line_len = (size_t)(lf - p->line) + 1;
            return KS_OK;
        }
        scanned = p->have;
        if (p->have > KS_KP_LINE_MAX) {
            *line_len = KS_KP_LINE_MAX + 1; /* [KP-MSG-2]: refused as line-too-long */
            return KS_OK;
        }
        const ssize_t r = recv(p->io, p->line + p->have, KS_KP_LINE_MAX + 1 - p->have, MSG_DONTWAIT);
        if (r > 0) {
            p->have += (size_t)r;
            continue;
        }
        if (r == 0) {
            return KS_ERR_UNAVAILABLE; /* end of output, maybe mid-line [KP-BRIDGE-4] */
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return KS_ERR_UNAVAILABLE;
        }
        const ks_err rc = wait_io(p, POLLIN, deadline_ns, e);
        if (rc != KS_OK) {
            return rc;
        }
    }
}

/* See plugin_proc.h. */
ks_err ks_pproc_call(ks_pproc *p, const uint8_t *req, size_t len, uint64_t deadline_ns, ks_pstderr *e,
                     size_t *line_len, int *extra)
{
    *line_len = 0;
    *extra = 0;
    if (p->pid <= 0 || p->io < 0) {
        return KS_ERR_UNAVAILABLE;
    }
    ks_pproc_consume(p);
    ks_err rc = send_all(p, req, len, deadline_ns, e);
    if (rc == KS_OK) {
        rc = recv_line(p, deadline_ns, e, line_len);
    }
    if (rc == KS_OK) {
        *extra = p->have > *line_len;
        p->next_id++;
    }
    drain_stderr(p, e);
    return rc;
}

/* See plugin_proc.h. */
void ks_pproc_consume(ks_pproc *p)
{
    if (p->line != NULL && p->have > 0) {
        sodium_memzero(p->line, p->have);
    }
    p->have = 0;
}

/* See plugin_proc.h. */
int ks_pproc_idle_broken(ks_pproc *p, ks_pstderr *e)
{
    if (p->pid <= 0 || p->io < 0) {
        return 1;
    }
    drain_stderr(p, e);
    struct pollfd fd = {p->io, POLLIN, 0};
    int n;
    while ((n = poll(&fd, 1, 0)) < 0 && errno == EINTR) {
    }
    return n != 0;
}
