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
 * server or directory behind.  The signal path uses only fork, execv,
 * waitpid and raise.
 *
 * Test support code: static functions in one test file only.
 */
#ifndef KS_TESTS_PG_TEST_H
#define KS_TESTS_PG_TEST_H

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

/* Run the script's stop on the cluster's directory, if one runs, and
 * wait for it.  Async-signal-safe (fork, execv, waitpid only). */
static void ks_pg_test_stop_now(void)
{
    if (ks_pg_test_dir[0] == '\0')
        return;
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {"sh", ks_pg_test_script_path, "stop", ks_pg_test_dir, NULL};
        execv("/bin/sh", argv);
        _exit(127);
    }
    if (pid > 0) {
        int st;
        while (waitpid(pid, &st, 0) < 0) {
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
    int rc = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
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
    if (rc != 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
        ks_pg_test_conninfo[0] == '\0') {
        fprintf(stderr, "pg_test: %s start %s failed\n", ks_pg_test_script_path, dir);
        rmdir(dir); /* the script removes what it made; an empty dir may be left */
        return -1;
    }
    memcpy(ks_pg_test_dir, dir, sizeof dir);
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
    return 0;
}

#endif /* KS_TESTS_PG_TEST_H */
