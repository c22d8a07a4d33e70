/*
 * tests/pg_test.h -- a throw-away PostgreSQL cluster for cmocka tests,
 * through tests/pg_cluster.sh (KS_PG_CLUSTER names another copy of it).
 *
 * ks_pg_test_start() makes a mkdtemp directory under /tmp, starts a
 * cluster there (Unix socket only) and keeps its connection string in
 * ks_pg_test_conninfo; ks_pg_test_stop() stops it and removes the
 * directory.  Call start from a group setup and stop from its teardown;
 * stop also runs at exit and on SIGINT, SIGTERM, SIGHUP and SIGABRT (an
 * ASan or assert abort), so a failing or interrupted test leaves no
 * server or directory behind; a signal while the cluster is still
 * starting stops the script, whose own trap removes what it made.  The
 * signal path uses only kill, fork, execv, waitpid, rmdir and raise.
 *
 * ks_pg_test_group_setup and ks_pg_test_group_teardown are a cmocka
 * group's setup and teardown doing just that; ks_pg_test_exec and
 * ks_pg_test_int run a test's own SQL (no values) on a connection of the
 * test and assert that it succeeded; ks_pg_test_admin connects one with
 * a fresh public schema (include cmocka.h and libpq-fe.h first).
 *
 * Test support code: static functions of the test files that include it.
 */
#ifndef KS_TESTS_PG_TEST_H
#define KS_TESTS_PG_TEST_H

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The cluster's directory ("" when none runs) and connection string. */
static char ks_pg_test_dir[64];
static char ks_pg_test_conninfo[256];
/* The script, resolved once by start (the signal path reads it). */
static char ks_pg_test_script_path[512];
/* The script's `start` while it runs (0 otherwise): a signal then stops
 * it, and its own trap removes what it made. */
static volatile pid_t ks_pg_test_starting;

/* Run the script's stop on the cluster's directory, if one runs, and
 * wait for it.  Async-signal-safe (fork, execv, waitpid only). */
static void ks_pg_test_stop_now(void)
{
    if (ks_pg_test_dir[0] == '\0')
        return;
    pid_t starting = ks_pg_test_starting;
    if (starting > 0) {
        int st;
        kill(starting, SIGTERM); /* its trap stops the cluster and removes the dir */
        while (waitpid(starting, &st, 0) < 0 && errno == EINTR) {
        }
        ks_pg_test_starting = 0;
        rmdir(ks_pg_test_dir); /* left empty when it was killed before initdb */
        ks_pg_test_dir[0] = '\0';
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {"sh", ks_pg_test_script_path, "stop", ks_pg_test_dir, NULL};
        execv("/bin/sh", argv);
        _exit(127);
    }
    if (pid > 0) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
    }
    ks_pg_test_dir[0] = '\0';
}

/* Stop the cluster (group teardown, and atexit). */
static void ks_pg_test_stop(void)
{
    ks_pg_test_stop_now();
}

/* On a fatal or interrupting signal: stop the cluster, then die of the
 * signal as the process would have. */
static void ks_pg_test_on_signal(int sig)
{
    ks_pg_test_stop_now();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Start a cluster (see the file comment); 0 on success, -1 with a
 * message on stderr. */
static int ks_pg_test_start(void)
{
    const char *script = getenv("KS_PG_CLUSTER");
    snprintf(ks_pg_test_script_path, sizeof ks_pg_test_script_path, "%s",
             script != NULL && script[0] != '\0' ? script : "tests/pg_cluster.sh");
    char dir[sizeof ks_pg_test_dir] = "/tmp/ks_pg_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("pg_test: mkdtemp");
        return -1;
    }
    static int hooked;
    if (!hooked) {
        hooked = 1;
        atexit(ks_pg_test_stop);
        const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGABRT};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = ks_pg_test_on_signal;
            sigemptyset(&sa.sa_mask);
            sigaction(sigs[i], &sa, NULL);
        }
    }
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pg_test: pipe");
        rmdir(dir);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    char *argv[] = {"sh", ks_pg_test_script_path, "start", dir, NULL};
    pid_t pid;
    /* every signal the handler serves is blocked until the pid is known */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGABRT);
    sigprocmask(SIG_BLOCK, &block, &old);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &old); /* the script's own traps work */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (rc == 0) {
        memcpy(ks_pg_test_dir, dir, sizeof dir);
        ks_pg_test_starting = pid;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    size_t got = 0;
    if (rc == 0) {
        ssize_t k;
        while (got + 1 < sizeof ks_pg_test_conninfo &&
               (k = read(fds[0], ks_pg_test_conninfo + got, sizeof ks_pg_test_conninfo - 1 - got)) > 0)
            got += (size_t)k;
    }
    close(fds[0]);
    ks_pg_test_conninfo[got] = '\0';
    ks_pg_test_conninfo[strcspn(ks_pg_test_conninfo, "\n")] = '\0';
    int st = 0;
    int waited = rc == 0 ? waitpid(pid, &st, 0) : -1;
    ks_pg_test_starting = 0;
    if (rc != 0 || waited < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
        ks_pg_test_conninfo[0] == '\0') {
        fprintf(stderr, "pg_test: %s start %s failed\n", ks_pg_test_script_path, dir);
        ks_pg_test_dir[0] = '\0';
        rmdir(dir); /* the script removes what it made; an empty dir may be left */
        return -1;
    }
    return 0;
}

/* A cmocka group setup: start the cluster for the whole group. */
static inline int ks_pg_test_group_setup(void **state)
{
    (void)state;
    return ks_pg_test_start() == 0 ? 0 : -1;
}

/* A cmocka group teardown: stop the cluster. */
static inline int ks_pg_test_group_teardown(void **state)
{
    (void)state;
    ks_pg_test_stop();
    return 0;
}

/* Run sql (no values of the test's own) on conn and assert that it
 * succeeded. */
static inline void ks_pg_test_exec(PGconn *conn, const char *sql)
{
    PGresult *res = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fprintf(stderr, "pg_test: %s: %s", sql, PQerrorMessage(conn));
    assert_true(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK);
    PQclear(res);
}

/* A connection to the cluster with a fresh, empty public schema (a
 * test's admin connection); asserts that it worked. */
static inline PGconn *ks_pg_test_admin(void)
{
    PGconn *conn = PQconnectdb(ks_pg_test_conninfo);
    assert_int_equal(PQstatus(conn), CONNECTION_OK);
    ks_pg_test_exec(conn, "SET client_min_messages = warning");
    ks_pg_test_exec(conn, "DROP SCHEMA IF EXISTS public CASCADE");
    ks_pg_test_exec(conn, "CREATE SCHEMA public");
    return conn;
}

/* A single-integer query's answer on conn. */
static inline long long ks_pg_test_int(PGconn *conn, const char *sql)
{
    PGresult *res = PQexec(conn, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(res), 1);
    long long v = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}

#endif /* KS_TESTS_PG_TEST_H */
