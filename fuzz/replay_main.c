/*
 * fuzz/replay_main.c -- run a fuzz target's LLVMFuzzerTestOneInput over
 * files and directories, without a fuzzing engine.
 *
 *   replay_<target> PATH...
 *
 * Each PATH is a file or a directory (its regular files, recursively, in
 * sorted order; names starting with '.' and README* are skipped).  Each
 * input is read into a malloc buffer of exactly its size, so that ASan
 * reports any read past the end.  Prints the number of inputs replayed.
 * Exit status: 0 when every input ran (an oracle failure aborts), 2 on an
 * I/O error or when no input was found.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long replayed;
static int verbose;

static int run_file(const char *path, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    /* Exact size; an empty input still gets a distinct (zero-byte) block. */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL || fread(buf, 1, size, f) != size) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    if (size == 0) {
        free(buf);
        buf = malloc(0); /* may be NULL: the target must accept (NULL, 0) */
    }
    if (verbose) {
        fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    }
    LLVMFuzzerTestOneInput(buf, size);
    free(buf);
    replayed++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (S_ISREG(st.st_mode)) {
        return run_file(path, (size_t)st.st_size);
    }
    if (!S_ISDIR(st.st_mode)) {
        return 0;
    }
    DIR *d = opendir(path);
    if (d == NULL) {
        perror(path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strncmp(de->d_name, "README", 6) == 0) {
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (grown == NULL) {
                closedir(d);
                return -1;
            }
            names = grown;
        }
        size_t len = strlen(path) + strlen(de->d_name) + 2;
        names[n] = malloc(len);
        if (names[n] == NULL) {
            closedir(d);
            return -1;
        }
        snprintf(names[n], len, "%s/%s", path, de->d_name);
        n++;
    }
    closedir(d);
    if (n > 1) {
        qsort(names, n, sizeof *names, cmp_str);
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (run_path(names[i]) != 0) {
            rc = -1;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0;
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    verbose = getenv("REPLAY_VERBOSE") != NULL;
    for (int i = 1; i < argc; i++) {
        if (run_path(argv[i]) != 0) {
            rc = 2;
        }
    }
    printf("%s: replayed %lu inputs\n", name, replayed);
    if (replayed == 0) {
        fprintf(stderr, "%s: no inputs\n", name);
        return 2;
    }
    return rc;
}
