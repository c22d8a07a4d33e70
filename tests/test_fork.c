/*
 * tests/test_fork.c -- fork() while other threads use the same ks_ctx
 * (keyshift/crypto.h: "a ks_ctx may be used from several threads at
 * once"; docs/format.md [F-CRYPTO-NONCE-2]).
 *
 * Background threads seal (and one opens) in a tight loop through one
 * shared context, so that its locks -- the DEK writer's table lock, its
 * DEK-creation lock, the read cache's lock -- are held at random instants;
 * the main thread forks again and again meanwhile.  Each child, under
 * alarm(CHILD_ALARM) so that a deadlock becomes a failure instead of a
 * hang, seals one envelope with the parameters the threads use, opens it,
 * checks that its nonce and wrapped DEK differ from those of an envelope
 * the parent sealed just before the fork (a DEK of its own, so fresh
 * nonces), opens it again on libsodium (its messages are long enough for
 * the OpenSSL engine, whose per-thread state the parent had keyed: the
 * bytes must be those of the child's own DEK), and opens the parent's
 * envelope.  The child reports by its
 * _exit code only (no cmocka in the child); the parent waits for it with a
 * bounded poll and kills it past PARENT_WAIT_MS.
 *
 * The claim: a child forked while other threads are sealing and opening
 * can seal, with fresh nonces, and open, within a bounded time.
 *
 * The in-memory provider has a mutex of its own, taken while the library
 * holds its DEK-creation lock.  That is the test's lock, not the
 * library's, so main() makes it fork-safe with pthread_atfork, registered
 * before any context exists: prepare handlers run in reverse order of
 * registration, so the library's (registered later) take their locks
 * before this one, the order in which sealing takes them.
 *
 * Each test forks at most MAX_FORKS times or for RUN_MS, whichever ends
 * first, and stops at the first failing child.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>

#include <keyshift/crypto.h>
#include <keyshift/envelope.h>

#include "../migrate/crypto/aead.h"
#include "mem_provider.h"

#define KEY "app-key"
#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

enum {
    MAX_FORKS = 200,
    RUN_MS = 2000,        /* per test */
    CHILD_ALARM = 5,      /* seconds a child may take before SIGALRM kills it */
    PARENT_WAIT_MS = 10000,
    /* Messages past both algorithms' OpenSSL thresholds (aead.h), so that
     * every seal and open here runs on the OpenSSL engine: the child's
     * first seal is on a shard slot whose EVP state the parent keyed for
     * its own DEK. */
    MSG_LEN = 600,
    ENV_CAP = 1024,
};

/* A child's exit codes. */
enum {
    C_OK = 0,
    C_SEAL = 10,         /* ks_seal failed in the child */
    C_PARSE_OWN = 11,    /* the child's envelope does not parse */
    C_PARSE_PARENT = 12, /* the parent's envelope does not parse */
    C_SAME_NONCE = 13,   /* the child reused the parent's nonce */
    C_SAME_DEK = 14,     /* the child reused the parent's wrapped DEK */
    C_OPEN_OWN = 15,     /* the child cannot open its own envelope */
    C_PT_OWN = 16,       /* ... or it opens to something else */
    C_OPEN_PARENT = 17,  /* the child cannot open the parent's envelope */
    C_PT_PARENT = 18,    /* ... or it opens to something else */
    C_OPEN_OWN_SODIUM = 19, /* libsodium does not open the child's envelope */
};

static const char *child_code_name(int code)
{
    switch (code) {
    case C_SEAL: return "ks_seal failed in the child";
    case C_PARSE_OWN: return "the child's envelope does not parse";
    case C_PARSE_PARENT: return "the parent's envelope does not parse";
    case C_SAME_NONCE: return "the child sealed with the parent's nonce";
    case C_SAME_DEK: return "the child sealed with the parent's DEK";
    case C_OPEN_OWN: return "the child cannot open its own envelope";
    case C_PT_OWN: return "the child's own envelope opens to other bytes";
    case C_OPEN_PARENT: return "the child cannot open the parent's envelope";
    case C_PT_PARENT: return "the parent's envelope opens to other bytes in the child";
    case C_OPEN_OWN_SODIUM: return "libsodium does not open the child's envelope to its bytes";
    default: return "unexpected exit code";
    }
}

/* ---- the provider's lock across fork --------------------------------- */

static ks_mem_provider g_mem; /* one per process: its lock is fork-guarded */

static void mem_prepare(void)
{
    pthread_mutex_lock(&g_mem.mu);
}

static void mem_release(void)
{
    pthread_mutex_unlock(&g_mem.mu);
}

/* ---- background threads ------------------------------------------------ */

typedef struct shared {
    ks_ctx *ctx;
    ks_seal_params p;
    ks_open_params op;
    uint8_t env[ENV_CAP]; /* what the opener opens (sealed before it starts) */
    size_t env_len;
    atomic_int stop;
    atomic_int errors;       /* seals or opens that failed in the parent */
    atomic_ulong seals, opens;
} shared;

/* The parent's and the child's messages (MSG_LEN bytes each, distinct),
 * filled by main() before any thread starts. */
static uint8_t msg[MSG_LEN];
static uint8_t child_msg[MSG_LEN];

static void *seal_loop(void *arg)
{
    shared *s = arg;
    uint8_t env[ENV_CAP];
    while (!atomic_load(&s->stop)) {
        size_t len = 0;
        if (ks_seal(s->ctx, &s->p, msg, sizeof msg, env, sizeof env, &len) != KS_OK) {
            atomic_fetch_add(&s->errors, 1);
        }
        atomic_fetch_add(&s->seals, 1);
    }
    return NULL;
}

static void *open_loop(void *arg)
{
    shared *s = arg;
    uint8_t pt[sizeof msg];
    while (!atomic_load(&s->stop)) {
        size_t n = 0;
        ks_parse_error pe;
        if (ks_open(s->ctx, s->env, s->env_len, &s->op, pt, sizeof pt, &n, &pe) != KS_OK ||
            n != sizeof msg) {
            atomic_fetch_add(&s->errors, 1);
        }
        atomic_fetch_add(&s->opens, 1);
    }
    return NULL;
}

/* ---- the child --------------------------------------------------------- */

static int same_bytes(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0;
}

/* Everything the child does; returns its exit code.  parent_env is what
 * the parent sealed just before fork(). */
static int child_main(shared *s, const uint8_t *parent_env, size_t parent_len)
{
    uint8_t env[ENV_CAP], pt[MSG_LEN + 1];
    size_t len = 0, n = 0;
    ks_parse_error pe;
    if (ks_seal(s->ctx, &s->p, child_msg, sizeof child_msg, env, sizeof env, &len) != KS_OK) {
        return C_SEAL;
    }
    ks_envelope mine, theirs;
    if (ks_envelope_parse(env, len, NULL, &mine, NULL) != KS_OK) {
        return C_PARSE_OWN;
    }
    if (ks_envelope_parse(parent_env, parent_len, NULL, &theirs, NULL) != KS_OK) {
        return C_PARSE_PARENT;
    }
    if (same_bytes(mine.nonce, theirs.nonce)) {
        return C_SAME_NONCE;
    }
    if (same_bytes(mine.wrapped_dek, theirs.wrapped_dek)) {
        return C_SAME_DEK;
    }
    if (ks_open(s->ctx, env, len, &s->op, pt, sizeof pt, &n, &pe) != KS_OK) {
        return C_OPEN_OWN;
    }
    if (n != sizeof child_msg || memcmp(pt, child_msg, n) != 0) {
        return C_PT_OWN;
    }
    /* the oracle: its bytes open on libsodium too, so the child's seal did
     * not run on a key schedule of the parent's */
    ks_aead_test_force(KS_AEAD_SODIUM);
    ks_err rc = ks_open(s->ctx, env, len, &s->op, pt, sizeof pt, &n, &pe);
    ks_aead_test_force(KS_AEAD_AUTO);
    if (rc != KS_OK || n != sizeof child_msg || memcmp(pt, child_msg, n) != 0) {
        return C_OPEN_OWN_SODIUM;
    }
    if (ks_open(s->ctx, parent_env, parent_len, &s->op, pt, sizeof pt, &n, &pe) != KS_OK) {
        return C_OPEN_PARENT;
    }
    if (n != sizeof msg || memcmp(pt, msg, n) != 0) {
        return C_PT_PARENT;
    }
    return C_OK;
}

/* ---- the parent -------------------------------------------------------- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait for pid at most PARENT_WAIT_MS, then kill it.  Returns a message
 * for a child that did not exit 0, or NULL; its exit code or signal in
 * *code (*signalled nonzero for a signal), the time waited in *ms. */
static const char *wait_child(pid_t pid, int *code, int *signalled, uint64_t *ms)
{
    const uint64_t t0 = now_ms();
    int status = 0;
    *code = 0;
    *signalled = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            *ms = now_ms() - t0;
            return "waitpid failed";
        }
        if (now_ms() - t0 > PARENT_WAIT_MS) {
            kill(pid, SIGKILL);
            (void)waitpid(pid, &status, 0);
            *ms = now_ms() - t0;
            return "the child did not finish in time and was killed (deadlock?)";
        }
        struct timespec d = {0, 1000000}; /* 1 ms */
        nanosleep(&d, NULL);
    }
    *ms = now_ms() - t0;
    if (WIFSIGNALED(status)) {
        *code = WTERMSIG(status);
        *signalled = 1;
        return WTERMSIG(status) == SIGALRM ? "the child hung: its alarm fired (deadlock)"
                                           : "the child died of a signal";
    }
    if (!WIFEXITED(status)) {
        return "the child neither exited nor died";
    }
    *code = WEXITSTATUS(status);
    return *code == C_OK ? NULL : child_code_name(*code);
}

typedef struct fork_case {
    uint8_t format;
    uint32_t algorithm;
    uint64_t dek_max_messages; /* 0: the default */
    unsigned sealers;          /* background sealing threads */
} fork_case;

static void run_case(const fork_case *fc)
{
    ks_provider prov = ks_mem_provider_of(&g_mem);
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    if (fc->dek_max_messages != 0) {
        cfg.dek_max_messages = fc->dek_max_messages;
    }
    shared *s = calloc(1, sizeof *s);
    assert_non_null(s);
    assert_int_equal(ks_ctx_new(&prov, &cfg, &s->ctx), KS_OK);
    s->p = (ks_seal_params){fc->format, fc->algorithm, BV("acme"), BV(KEY), 0, {NULL, 0}, BV("row:42")};
    if (fc->format != KS_FORMAT_V1) {
        s->p.purpose = BV("db.users");
    }
    s->op = (ks_open_params){BV("row:42"), {NULL, 0}, {NULL, 0}};
    assert_int_equal(ks_seal(s->ctx, &s->p, msg, sizeof msg, s->env, sizeof s->env, &s->env_len), KS_OK);

    enum { MAX_THREADS = 4 };
    assert_true(fc->sealers >= 1 && fc->sealers < MAX_THREADS);
    pthread_t th[MAX_THREADS];
    unsigned nth = 0;
    for (unsigned i = 0; i < fc->sealers; i++) {
        assert_int_equal(pthread_create(&th[nth++], NULL, seal_loop, s), 0);
    }
    assert_int_equal(pthread_create(&th[nth++], NULL, open_loop, s), 0);
    while (atomic_load(&s->seals) < 10 || atomic_load(&s->opens) < 10) {
        sched_yield(); /* both loops are running before the first fork */
    }

    const uint64_t t0 = now_ms();
    unsigned forks = 0;
    uint64_t slowest = 0;
    const char *fail = NULL;
    int code = 0, signalled = 0;
    while (forks < MAX_FORKS && now_ms() - t0 < RUN_MS) {
        uint8_t penv[ENV_CAP];
        size_t plen = 0;
        assert_int_equal(ks_seal(s->ctx, &s->p, msg, sizeof msg, penv, sizeof penv, &plen), KS_OK);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            alarm(CHILD_ALARM);
            _exit(child_main(s, penv, plen));
        }
        forks++;
        uint64_t ms = 0;
        fail = wait_child(pid, &code, &signalled, &ms);
        slowest = ms > slowest ? ms : slowest;
        if (fail != NULL) {
            break;
        }
    }
    const uint64_t elapsed = now_ms() - t0;

    atomic_store(&s->stop, 1);
    for (unsigned i = 0; i < nth; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
    }
    ks_metrics m;
    ks_ctx_metrics(s->ctx, &m);
    const int errors = atomic_load(&s->errors);
    printf("# fork: format %u, %s, dek_max_messages %llu, %u sealer(s): %u fork(s) in %llu ms, "
           "slowest child %llu ms; parent %lu seals, %lu opens, %llu DEKs\n",
           fc->format, ks_alg_name(fc->algorithm), (unsigned long long)cfg.dek_max_messages,
           fc->sealers, forks, (unsigned long long)elapsed, (unsigned long long)slowest,
           atomic_load(&s->seals), atomic_load(&s->opens), (unsigned long long)m.deks_created);
    ks_ctx_free(s->ctx);
    free(s);
    if (fail != NULL) {
        fail_msg("fork %u: %s (%s %d)", forks, fail, signalled ? "signal" : "exit code", code);
    }
    assert_int_equal(errors, 0);
}

/* A thread seals v2 xchacha20-poly1305 in a loop, one opens. */
static void test_fork_while_sealing_v2(void **state)
{
    (void)state;
    const fork_case fc = {KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305, 0, 1};
    run_case(&fc);
}

/* The same with v1 aes-256-gcm (its per-DEK expanded AES state). */
static void test_fork_while_sealing_v1_aes(void **state)
{
    (void)state;
    if (!crypto_aead_aes256gcm_is_available()) {
        skip(); /* no AES-NI */
    }
    const fork_case fc = {KS_FORMAT_V1, KS_ALG_AES256GCM, 0, 1};
    run_case(&fc);
}

/* Two threads seal with a DEK per message, so the DEK-creation lock (and
 * the provider's wrap) are held most of the time at the fork. */
static void test_fork_while_creating_deks(void **state)
{
    (void)state;
    const fork_case fc = {KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305, 1, 2};
    run_case(&fc);
}

int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    ks_mem_init(&g_mem);
    if (ks_mem_add(&g_mem, KEY, 1, 1, NULL) != 0 ||
        pthread_atfork(mem_prepare, mem_release, mem_release) != 0) {
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* no buffered output duplicated into children */
    for (size_t i = 0; i < MSG_LEN; i++) {
        msg[i] = (uint8_t)(i * 7 + 1);
        child_msg[i] = (uint8_t)(i * 13 + 5);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_while_sealing_v2),
        cmocka_unit_test(test_fork_while_sealing_v1_aes),
        cmocka_unit_test(test_fork_while_creating_deks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ks_mem_cleanup(&g_mem);
    return rc;
}
