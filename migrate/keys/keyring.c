/*
 * migrate/keys/keyring.c -- the local keyring (include/keyshift/keyring.h,
 * docs/keyring.md): reading a keyring file safely, unsealing it, holding
 * its keys in guarded memory, and changing it without ever leaving a
 * broken file or losing a concurrent update.
 *
 * The bytes are parsed by migrate/keys/keyring_format.c; this file does the
 * file system and the cryptography of sealing.  Every change follows one
 * path (change() below): take the lock file, re-read the keyring, build
 * the changed key list, encode it, write a temporary file, fsync, rename
 * over the keyring, fsync the directory, and reload the in-memory copy
 * from the bytes just written.  The in-memory copy is therefore always the
 * parse of a file that was valid on disk.
 *
 * Secrets: KEK material and the key derived from a passphrase live only in
 * sodium_malloc'd memory (guard pages, mlock where the limit allows); every
 * buffer that held a plaintext body is wiped (sodium_free() zeroes before
 * releasing) on every path.  Nothing here prints or logs.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/keyring.h>

#include "keyring_format.h"
#include "../alloc_hook.h"

/* The format's constants must be libsodium's (keyring_format.c may not
 * include sodium.h, so they are repeated there). */
_Static_assert(KS_KRF_SALT_LEN == crypto_pwhash_SALTBYTES, "salt length");
_Static_assert(KS_KRF_NONCE_LEN == crypto_secretbox_NONCEBYTES, "secretbox nonce length");
_Static_assert(KS_KRF_MAC_LEN == crypto_secretbox_MACBYTES, "secretbox MAC length");
_Static_assert(crypto_secretbox_KEYBYTES == 32, "secretbox key length");
_Static_assert(KS_KRF_OPSLIMIT_MIN >= crypto_pwhash_argon2id_OPSLIMIT_MIN, "opslimit floor");
_Static_assert(KS_KRF_MEMLIMIT_MIN >= crypto_pwhash_argon2id_MEMLIMIT_MIN, "memlimit floor");
_Static_assert(crypto_pwhash_OPSLIMIT_INTERACTIVE <= KS_KRF_OPSLIMIT_MAX, "default opslimit");
_Static_assert(crypto_pwhash_MEMLIMIT_INTERACTIVE <= KS_KRF_MEMLIMIT_MAX, "default memlimit");
_Static_assert(KS_LOCAL_WRAPPED_LEN == crypto_aead_xchacha20poly1305_ietf_NPUBBYTES + KS_DEK_LEN +
                                           crypto_aead_xchacha20poly1305_ietf_ABYTES,
               "local wrapped length");

/* [K-SEAL-5] The cost of a new seal: libsodium's interactive level. */
#define SEAL_OPSLIMIT ((uint64_t)crypto_pwhash_OPSLIMIT_INTERACTIVE)
#define SEAL_MEMLIMIT ((uint64_t)crypto_pwhash_MEMLIMIT_INTERACTIVE)

/* [K-FILE-6] The test hook: when this variable is "1", a writer exits with
 * status 99 after its temporary file is synced and before the rename. */
#define CRASH_HOOK_ENV "KEYSHIFT_TEST_CRASH_BEFORE_RENAME"
#define CRASH_HOOK_STATUS 99

/* [K-FILE-4] Temporary files: "<path>.tmp-" and 16 hex digits. */
#define TMP_INFIX ".tmp-"
#define TMP_RANDOM_HEX 16

/*
 * A keyring held in memory: the parse of one keyring body.  Key ids and
 * states are not secret and live in ordinary memory; all material lives in
 * one sodium_malloc'd region (one guarded allocation, not one per version).
 */
typedef struct kr_image {
    ks_krf_key *keys;         /* nkeys keys, in key_id order */
    size_t nkeys;
    ks_krf_version *versions; /* every version, key by key */
    size_t nversions;
    uint8_t *ids;             /* every key_id's bytes */
    uint8_t *material;        /* nmaterial * KS_KEK_LEN bytes, sodium_malloc'd */
    size_t nmaterial;
} kr_image;

struct ks_keyring {
    pthread_rwlock_t *lock;   /* readers: listing and the provider; writers: changes */
    char *path;
    int sealed;
    uint8_t *seal_key;        /* sealed: the Argon2id output, sodium_malloc'd */
    uint8_t salt[KS_KRF_SALT_LEN]; /* sealed: the parameters seal_key was derived with */
    uint64_t opslimit;
    uint64_t memlimit;
    kr_image img;
};

/* ---- memory ---------------------------------------------------------------- */

/* Release an image; sodium_free() zeroes the material before unmapping. */
static void image_free(kr_image *img)
{
    free(img->keys);
    free(img->versions);
    free(img->ids);
    sodium_free(img->material);
    memset(img, 0, sizeof *img);
}

/* A sodium_malloc'd buffer of n bytes (at least one, so that an empty
 * input still has an address), or NULL. */
static uint8_t *secure_alloc(size_t n)
{
    return sodium_malloc(n == 0 ? 1 : n);
}

/* Filling an image from a body that has already parsed once. */
typedef struct image_fill {
    kr_image *img;
    size_t id_pos;
} image_fill;

/* Visitor: copy one key's header into the image. */
static ks_err fill_key(void *ctx, const ks_krf_key *key)
{
    image_fill *f = ctx;
    kr_image *img = f->img;
    ks_krf_key *k = &img->keys[img->nkeys++];

    memcpy(img->ids + f->id_pos, key->key_id.ptr, key->key_id.len);
    k->key_id = (ks_bytes){img->ids + f->id_pos, key->key_id.len};
    f->id_pos += key->key_id.len;
    k->primary = key->primary;
    k->count = key->count;
    k->versions = img->versions + img->nversions;
    return KS_OK;
}

/* Visitor: copy one version, its material into the guarded region. */
static ks_err fill_version(void *ctx, const ks_krf_version *v)
{
    image_fill *f = ctx;
    kr_image *img = f->img;
    ks_krf_version *out = &img->versions[img->nversions++];

    *out = *v;
    if (v->material != NULL) {
        uint8_t *dst = img->material + img->nmaterial++ * KS_KEK_LEN;
        memcpy(dst, v->material, KS_KEK_LEN);
        out->material = dst;
    }
    return KS_OK;
}

/*
 * Parse body[0, len) (file offset base) and copy it into *img.  The first
 * pass checks everything and sizes the copy, so that the second, which
 * copies, sees only valid bytes and cannot fail.  KS_ERR_INTEGRITY with
 * *err filled, or KS_ERR_NO_MEMORY.
 */
static ks_err image_load(const uint8_t *body, size_t len, size_t base, kr_image *img,
                         ks_parse_error *err)
{
    ks_krf_summary sum;
    ks_err e;

    memset(img, 0, sizeof *img);
    if (ks_krf_parse_body(body, len, base, NULL, &sum, err) != KS_OK) {
        return KS_ERR_INTEGRITY;
    }
    img->keys = calloc(sum.keys ? sum.keys : 1, sizeof *img->keys);
    img->versions = calloc(sum.versions ? sum.versions : 1, sizeof *img->versions);
    img->ids = malloc(sum.id_bytes ? sum.id_bytes : 1);
    img->material = sum.material ? secure_alloc(sum.material * KS_KEK_LEN) : NULL;
    if (img->keys == NULL || img->versions == NULL || img->ids == NULL ||
        (sum.material != 0 && img->material == NULL)) {
        image_free(img);
        return KS_ERR_NO_MEMORY;
    }
    image_fill f = {img, 0};
    const ks_krf_visitor vis = {fill_key, fill_version, &f};
    e = ks_krf_parse_body(body, len, base, &vis, NULL, err);
    assert(e == KS_OK);
    (void)e;
    assert(img->nkeys == sum.keys && img->nversions == sum.versions && img->nmaterial == sum.material);
    return KS_OK;
}

/* Index of key_id in img (keys are sorted [K-KEY-3]), or -1; *at receives
 * the index it would be inserted at. */
static long image_find(const kr_image *img, ks_bytes key_id, size_t *at)
{
    size_t lo = 0, hi = img->nkeys;
    if (key_id.len == 0) {
        *at = 0;
        return -1; /* no key has an empty id [K-KEY-2] */
    }
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = ks_krf_key_id_cmp(img->keys[mid].key_id, key_id);
        if (c == 0) {
            *at = mid;
            return (long)mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *at = lo;
    return -1;
}

/* ---- files ------------------------------------------------------------------- */

/* Retry a system call interrupted by a signal. */
#define RETRY_EINTR(expr, res)                                                               \
    do {                                                                                     \
        (res) = (expr);                                                                      \
    } while ((res) == -1 && errno == EINTR)

/* Close fd, keeping errno. */
static void close_keep_errno(int fd)
{
    const int saved = errno;
    (void)close(fd);
    errno = saved;
}

/* [K-FILE-1] A keyring file must be a regular file, owned by the caller's
 * effective user (or root), that neither group nor others may read or
 * write: anything else is refused, as ssh refuses such private keys. */
static ks_err check_private(const struct stat *st)
{
    if (!S_ISREG(st->st_mode)) {
        return KS_ERR_INSECURE;
    }
    if ((st->st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        return KS_ERR_INSECURE;
    }
    if (st->st_uid != geteuid() && st->st_uid != 0) {
        return KS_ERR_INSECURE;
    }
    return KS_OK;
}

/* Read exactly n bytes of fd into buf; KS_ERR_IO on error or early end
 * of file, and when the file holds more than n bytes. */
static ks_err read_exact(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    ssize_t r;
    while (got < n) {
        RETRY_EINTR(read(fd, buf + got, n - got), r);
        if (r <= 0) {
            return KS_ERR_IO;
        }
        got += (size_t)r;
    }
    uint8_t extra;
    RETRY_EINTR(read(fd, &extra, 1), r);
    return r == 0 ? KS_OK : KS_ERR_IO;
}

/*
 * Read the keyring file at path into a sodium_malloc'd buffer (it may hold
 * plaintext keys) [K-FILE-1], [K-FILE-2].  The file is opened without
 * following a symbolic link and without blocking (a FIFO is refused, not
 * waited on); its type, owner and mode are checked on the open descriptor,
 * so there is no window between the check and the read.
 */
static ks_err read_keyring_file(const char *path, uint8_t **out, size_t *out_len,
                                ks_parse_error *err)
{
    struct stat st;
    ks_err e;
    int fd;

    RETRY_EINTR(open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC), fd);
    if (fd < 0) {
        return errno == ELOOP ? KS_ERR_INSECURE : KS_ERR_IO; /* [K-FILE-1] a symlink */
    }
    if (fstat(fd, &st) != 0) {
        close_keep_errno(fd);
        return KS_ERR_IO;
    }
    if ((e = check_private(&st)) != KS_OK) {
        close(fd);
        return e;
    }
    if (st.st_size < 0 || (uintmax_t)st.st_size > KS_KRF_FILE_MAX) {
        close(fd);
        *err = (ks_parse_error){KS_ERR_TOO_LARGE, KS_KRF_FILE_MAX, 0}; /* [K-FILE-2] */
        return KS_ERR_INTEGRITY;
    }
    const size_t n = (size_t)st.st_size;
    uint8_t *buf = secure_alloc(n);
    if (buf == NULL) {
        close(fd);
        return KS_ERR_NO_MEMORY;
    }
    e = read_exact(fd, buf, n);
    close(fd);
    if (e != KS_OK) {
        sodium_free(buf);
        return e;
    }
    *out = buf;
    *out_len = n;
    return KS_OK;
}

/* Split path into its directory ("." when it has none) and last
 * component, both malloc'd. */
static ks_err split_path(const char *path, char **dir, char **base)
{
    const char *slash = strrchr(path, '/');
    *dir = slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    *base = strdup(slash == NULL ? path : slash + 1);
    if (*dir == NULL || *base == NULL) {
        free(*dir);
        free(*base);
        *dir = *base = NULL;
        return KS_ERR_NO_MEMORY;
    }
    return KS_OK;
}

/* path || suffix, malloc'd. */
static char *path_with(const char *path, const char *suffix)
{
    const size_t a = strlen(path), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s != NULL) {
        memcpy(s, path, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}

/* [K-FILE-3] Take the exclusive lock on "<path>.lock" (created 0600,
 * never removed: removing a lock file races with its next user).  Each
 * call opens the file anew, so that processes and handles never share the
 * lock through an inherited descriptor.  Blocks until the lock is free;
 * *fd receives the descriptor whose close releases it. */
static ks_err lock_take(const char *path, int *fd)
{
    char *lpath = path_with(path, ".lock");
    struct stat st;
    int lfd, r;

    if (lpath == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    RETRY_EINTR(open(lpath, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                     S_IRUSR | S_IWUSR),
                lfd);
    free(lpath);
    if (lfd < 0) {
        return KS_ERR_IO;
    }
    if (fstat(lfd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(lfd);
        return KS_ERR_IO;
    }
    RETRY_EINTR(flock(lfd, LOCK_EX), r);
    if (r != 0) {
        close(lfd);
        return KS_ERR_IO;
    }
    *fd = lfd;
    return KS_OK;
}

/* [K-FILE-5] Under the lock, remove the temporary files an interrupted
 * writer left beside the keyring: no live writer can own one, since
 * writers create them only while holding the lock.  Best effort. */
static void remove_stale_temps(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    const size_t blen = strlen(base), ilen = strlen(TMP_INFIX);
    struct dirent *de;

    if (d == NULL) {
        return;
    }
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (strlen(name) == blen + ilen + TMP_RANDOM_HEX && memcmp(name, base, blen) == 0 &&
            memcmp(name + blen, TMP_INFIX, ilen) == 0) {
            (void)unlinkat(dirfd(d), name, 0);
        }
    }
    closedir(d);
}

/* Write all of buf[0, n) to fd. */
static ks_err write_all(int fd, const uint8_t *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w;
        RETRY_EINTR(write(fd, buf + done, n - done), w);
        if (w <= 0) {
            return KS_ERR_IO;
        }
        done += (size_t)w;
    }
    return KS_OK;
}

/* Create a fresh temporary file "<path>.tmp-<16 random hex digits>",
 * mode 0600 whatever the umask, with O_EXCL; its name goes to *tmp. */
static ks_err temp_create(const char *path, char **tmp, int *fd)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        uint8_t rnd[TMP_RANDOM_HEX / 2];
        char suffix[sizeof TMP_INFIX + TMP_RANDOM_HEX];
        randombytes_buf(rnd, sizeof rnd);
        memcpy(suffix, TMP_INFIX, sizeof TMP_INFIX - 1);
        sodium_bin2hex(suffix + sizeof TMP_INFIX - 1, TMP_RANDOM_HEX + 1, rnd, sizeof rnd);
        char *name = path_with(path, suffix);
        if (name == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        int f;
        RETRY_EINTR(open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
                         S_IRUSR | S_IWUSR),
                    f);
        if (f >= 0) {
            if (fchmod(f, S_IRUSR | S_IWUSR) != 0) {
                close(f);
                (void)unlink(name);
                free(name);
                return KS_ERR_IO;
            }
            *tmp = name;
            *fd = f;
            return KS_OK;
        }
        free(name);
        if (errno != EEXIST) {
            return KS_ERR_IO;
        }
    }
    return KS_ERR_IO;
}

/* fsync the directory dir, so that a rename or link in it is durable. */
static ks_err sync_dir(const char *dir)
{
    int fd, r;
    RETRY_EINTR(open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), fd);
    if (fd < 0) {
        return KS_ERR_IO;
    }
    RETRY_EINTR(fsync(fd), r);
    close(fd);
    return r == 0 ? KS_OK : KS_ERR_IO;
}

/* The test hook of [K-FILE-6]: simulate a crash between the temporary
 * file's fsync and the rename.  Compiled only into test builds
 * (-DKS_TEST_HOOKS); release builds never read the variable. */
static void crash_hook(void)
{
#ifdef KS_TEST_HOOKS
    const char *v = getenv(CRASH_HOOK_ENV);
    if (v != NULL && strcmp(v, "1") == 0) {
        _exit(CRASH_HOOK_STATUS);
    }
#endif
}

/*
 * Replace (or, when create is set, create) the file at path with
 * data[0, n) atomically [K-FILE-4]: write a temporary file in the same
 * directory, fsync it, then rename it over path (create: link it to path,
 * which fails with KS_ERR_EXISTS rather than replace anything), and fsync
 * the directory.  A crash at any point leaves the old file or the new one.
 * The caller holds the lock.
 */
static ks_err replace_file(const char *path, const uint8_t *data, size_t n, int create)
{
    char *dir = NULL, *base = NULL, *tmp = NULL;
    int fd = -1, r;
    ks_err e;

    if ((e = split_path(path, &dir, &base)) != KS_OK) {
        return e;
    }
    remove_stale_temps(dir, base); /* [K-FILE-5] */
    if ((e = temp_create(path, &tmp, &fd)) != KS_OK) {
        goto out;
    }
    e = write_all(fd, data, n);
    if (e == KS_OK) {
        RETRY_EINTR(fsync(fd), r);
        e = r == 0 ? KS_OK : KS_ERR_IO;
    }
    if (close(fd) != 0 && e == KS_OK) {
        e = KS_ERR_IO;
    }
    if (e != KS_OK) {
        goto out;
    }
    crash_hook();
    if (create) {
        r = link(tmp, path);
        e = r == 0 ? KS_OK : errno == EEXIST ? KS_ERR_EXISTS : KS_ERR_IO;
    } else {
        e = rename(tmp, path) == 0 ? KS_OK : KS_ERR_IO;
    }
    if (e == KS_OK) {
        e = sync_dir(dir); /* [K-FILE-4] the new name is durable */
    }
out:
    if (tmp != NULL && (create || e != KS_OK)) {
        (void)unlink(tmp);
    }
    free(tmp);
    free(dir);
    free(base);
    return e;
}

/* ---- sealing ------------------------------------------------------------------ */

/* Derive the secretbox key from a passphrase [K-SEAL-4] into key (32
 * bytes of guarded memory).  KS_ERR_NO_MEMORY when Argon2id cannot get
 * its memory. */
static ks_err derive_key(ks_bytes passphrase, const uint8_t *salt, uint64_t opslimit,
                         uint64_t memlimit, uint8_t *key)
{
    assert(opslimit <= KS_KRF_OPSLIMIT_MAX && memlimit <= KS_KRF_MEMLIMIT_MAX);
    if (crypto_pwhash(key, crypto_secretbox_KEYBYTES, (const char *)passphrase.ptr, passphrase.len,
                      salt, (unsigned long long)opslimit, (size_t)memlimit,
                      crypto_pwhash_ALG_ARGON2ID13) != 0) {
        return KS_ERR_NO_MEMORY;
    }
    return KS_OK;
}

/*
 * Get the secretbox key for a sealed file with header h [K-SEAL-4]: with a
 * passphrase, derive it and remember it and its parameters in kr; without
 * one (a re-read during a change), use the remembered key, which fits only
 * if the file still has the same salt and costs: a keyring resealed since
 * it was opened gives KS_ERR_BAD_PASSPHRASE.
 */
static ks_err seal_key_for(ks_keyring *kr, const ks_krf_header *h, const ks_bytes *passphrase)
{
    if (passphrase == NULL) {
        if (kr->seal_key == NULL || h->opslimit != kr->opslimit || h->memlimit != kr->memlimit ||
            sodium_memcmp(h->salt.ptr, kr->salt, KS_KRF_SALT_LEN) != 0) {
            return KS_ERR_BAD_PASSPHRASE;
        }
        return KS_OK;
    }
    if (kr->seal_key == NULL && (kr->seal_key = secure_alloc(crypto_secretbox_KEYBYTES)) == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    memcpy(kr->salt, h->salt.ptr, KS_KRF_SALT_LEN);
    kr->opslimit = h->opslimit;
    kr->memlimit = h->memlimit;
    return derive_key(*passphrase, kr->salt, kr->opslimit, kr->memlimit, kr->seal_key);
}

/*
 * Turn a keyring file into an image [K-SEAL-3], [K-SEAL-4].  passphrase is
 * the caller's (ks_keyring_open) or NULL for a re-read, which must find
 * the file in the mode kr was opened in.  A plain file opened with a
 * passphrase, or a sealed one without, is KS_ERR_BAD_PASSPHRASE: the mode
 * is never guessed.
 */
static ks_err decode_file(ks_keyring *kr, const uint8_t *file, size_t len, const ks_bytes *passphrase,
                          kr_image *img, ks_parse_error *err)
{
    ks_krf_header h;
    ks_err e;

    if (ks_krf_parse_header(file, len, &h, err) != KS_OK) {
        return KS_ERR_INTEGRITY;
    }
    const int sealed = h.mode == KS_KRF_MODE_SEALED;
    const int want_sealed = passphrase != NULL ? passphrase->len != 0 : kr->sealed;
    if (sealed != want_sealed) {
        return KS_ERR_BAD_PASSPHRASE;
    }
    if (!sealed) {
        return image_load(h.payload.ptr, h.payload.len, h.payload_offset, img, err);
    }
    if ((e = seal_key_for(kr, &h, passphrase)) != KS_OK) {
        return e;
    }
    const size_t body_len = h.payload.len - KS_KRF_MAC_LEN;
    uint8_t *body = secure_alloc(body_len);
    if (body == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (crypto_secretbox_open_easy(body, h.payload.ptr, h.payload.len, h.nonce.ptr, kr->seal_key) !=
        0) {
        e = KS_ERR_BAD_PASSPHRASE; /* wrong passphrase, or the box was altered */
    } else {
        e = image_load(body, body_len, h.payload_offset + KS_KRF_MAC_LEN, img, err);
    }
    sodium_free(body);
    return e;
}

/* Read and decode the keyring file of kr into *img (see decode_file()). */
static ks_err load_file(ks_keyring *kr, const ks_bytes *passphrase, kr_image *img,
                        ks_parse_error *err)
{
    uint8_t *file = NULL;
    size_t len = 0;
    ks_err e = read_keyring_file(kr->path, &file, &len, err);
    if (e != KS_OK) {
        return e;
    }
    e = decode_file(kr, file, len, passphrase, img, err);
    sodium_free(file);
    return e;
}

/*
 * Encode keys[0, n) as a complete keyring file for kr (sealed with its
 * key and a fresh nonce [K-SEAL-3], or plain), in guarded memory.  The
 * plaintext body is also returned, in *body (the caller frees it with
 * sodium_free), at file offset *body_base, so the caller can reload from
 * exactly what was written.
 */
static ks_err encode_file(const ks_keyring *kr, const ks_krf_key *keys, size_t n, uint8_t **file,
                          size_t *file_len, uint8_t **body, size_t *body_len, size_t *body_base)
{
    uint8_t nonce[KS_KRF_NONCE_LEN];
    ks_krf_header h = {0};
    size_t blen, hlen;
    ks_err e;

    if ((e = ks_krf_body_len(keys, n, &blen)) != KS_OK) {
        return e == KS_ERR_TOO_LARGE ? e : KS_ERR_INTEGRITY; /* a bug: the edit broke a rule */
    }
    h.mode = kr->sealed ? KS_KRF_MODE_SEALED : KS_KRF_MODE_PLAIN;
    if (kr->sealed) {
        randombytes_buf(nonce, sizeof nonce);
        h.salt = (ks_bytes){kr->salt, KS_KRF_SALT_LEN};
        h.nonce = (ks_bytes){nonce, sizeof nonce};
        h.opslimit = kr->opslimit;
        h.memlimit = kr->memlimit;
    }
    const size_t flen = (kr->sealed ? KS_KRF_SEALED_HDR_LEN + KS_KRF_MAC_LEN : KS_KRF_PREFIX_LEN) + blen;
    uint8_t *f = secure_alloc(flen);
    uint8_t *b = secure_alloc(blen);
    if (f == NULL || b == NULL) {
        sodium_free(f);
        sodium_free(b);
        return KS_ERR_NO_MEMORY;
    }
    /* Both lengths were just computed for these keys, so neither encoder
     * can refuse; should one ever, nothing half-written is returned. */
    if (ks_krf_encode_header(&h, f, flen, &hlen) != KS_OK ||
        ks_krf_encode_body(keys, n, b, blen, &blen) != KS_OK) {
        assert(!"keyring encoders refused their own lengths");
        sodium_free(f);
        sodium_free(b);
        return KS_ERR_INTEGRITY;
    }
    if (kr->sealed) {
        crypto_secretbox_easy(f + hlen, b, blen, nonce, kr->seal_key);
        *body_base = hlen + KS_KRF_MAC_LEN;
    } else {
        memcpy(f + hlen, b, blen);
        *body_base = hlen;
    }
    *file = f;
    *file_len = flen;
    *body = b;
    *body_len = blen;
    return KS_OK;
}

/*
 * Write keys[0, n) as kr's keyring file (create: a new file that must not
 * exist) and, on success, load what was written into *img [K-FILE-4].
 * The image is loaded from the encoded body before the file is replaced:
 * once the new file is in place nothing is left that can fail, so an
 * error always means the file is unchanged (an allocation failing in the
 * load after the rename reported an error for a change that was already
 * durable, and a retried add-version then added a second version).
 */
static ks_err write_keys(const ks_keyring *kr, const ks_krf_key *keys, size_t n, int create,
                         kr_image *img)
{
    uint8_t *file = NULL, *body = NULL;
    size_t file_len = 0, body_len = 0, body_base = 0;
    ks_parse_error pe;

    ks_err e = encode_file(kr, keys, n, &file, &file_len, &body, &body_len, &body_base);
    if (e != KS_OK) {
        return e;
    }
    if (img != NULL) {
        e = image_load(body, body_len, body_base, img, &pe);
    }
    if (e == KS_OK && (e = replace_file(kr->path, file, file_len, create)) != KS_OK && img != NULL) {
        image_free(img);
    }
    sodium_free(file);
    sodium_free(body);
    return e;
}

/* ---- opening and closing ----------------------------------------------------- */

/* Check a passphrase view: {NULL, 0} or len bytes at ptr. */
static int passphrase_ok(ks_bytes p)
{
    return p.ptr != NULL || p.len == 0;
}

/* A new, empty keyring handle for path, or NULL. */
static ks_keyring *keyring_new(const char *path)
{
    ks_keyring *kr = calloc(1, sizeof *kr);
    if (kr == NULL) {
        return NULL;
    }
    kr->path = strdup(path);
    kr->lock = malloc(sizeof *kr->lock);
    if (kr->path == NULL || kr->lock == NULL || pthread_rwlock_init(kr->lock, NULL) != 0) {
        free(kr->path);
        free(kr->lock);
        free(kr);
        return NULL;
    }
    return kr;
}

/* The common start of init and open: check the arguments, initialise
 * libsodium (its result checked: without it nothing here is safe) and
 * make an empty handle for path in *out. */
static ks_err keyring_start(const char *path, ks_bytes passphrase, ks_keyring **out)
{
    if (path == NULL || *path == '\0' || !passphrase_ok(passphrase)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (sodium_init() < 0) {
        return KS_ERR_CRYPTO_INIT;
    }
    *out = keyring_new(path);
    return *out != NULL ? KS_OK : KS_ERR_NO_MEMORY;
}

/* See keyshift/keyring.h. */
void ks_keyring_close(ks_keyring *kr)
{
    if (kr == NULL) {
        return;
    }
    image_free(&kr->img);
    sodium_free(kr->seal_key);
    sodium_memzero(kr->salt, sizeof kr->salt);
    pthread_rwlock_destroy(kr->lock);
    free(kr->lock);
    free(kr->path);
    free(kr);
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_init(const char *path, ks_bytes passphrase)
{
    uint8_t salt[KS_KRF_SALT_LEN];
    struct stat st;
    int lfd;
    ks_err e = KS_OK;

    ks_keyring *kr;
    if ((e = keyring_start(path, passphrase, &kr)) != KS_OK) {
        return e;
    }
    if ((e = lock_take(path, &lfd)) != KS_OK) {
        ks_keyring_close(kr);
        return e;
    }
    if (lstat(path, &st) == 0) {
        e = KS_ERR_EXISTS; /* anything at all, even a dangling symlink */
    } else if (errno != ENOENT) {
        e = KS_ERR_IO;
    } else if (passphrase.len != 0) {
        /* [K-SEAL-5] A new seal: fresh salt, the default costs. */
        randombytes_buf(salt, sizeof salt);
        const ks_krf_header h = {.mode = KS_KRF_MODE_SEALED, .salt = {salt, sizeof salt},
                                 .opslimit = SEAL_OPSLIMIT, .memlimit = SEAL_MEMLIMIT};
        kr->sealed = 1;
        e = seal_key_for(kr, &h, &passphrase);
    }
    if (e == KS_OK) {
        e = write_keys(kr, NULL, 0, 1, NULL);
    }
    close(lfd);
    ks_keyring_close(kr);
    return e;
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_open(const char *path, ks_bytes passphrase, ks_keyring **out, ks_parse_error *err)
{
    ks_parse_error pe = {KS_OK, 0, 0};
    ks_err e;

    if (out != NULL) {
        *out = NULL;
    }
    if (err != NULL) {
        *err = pe;
    }
    ks_keyring *kr;
    if (out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((e = keyring_start(path, passphrase, &kr)) != KS_OK) {
        return e;
    }
    kr->sealed = passphrase.len != 0;
    e = load_file(kr, &passphrase, &kr->img, &pe);
    if (e != KS_OK) {
        if (err != NULL && e == KS_ERR_INTEGRITY) {
            *err = pe;
        }
        ks_keyring_close(kr);
        return e;
    }
    *out = kr;
    return KS_OK;
}

/* ---- changes ------------------------------------------------------------------ */

/* What a change asks for. */
typedef enum { OP_CREATE, OP_ADD_VERSION, OP_PROMOTE, OP_SET_STATE } change_op;

typedef struct change_req {
    change_op op;
    ks_bytes key_id;
    uint32_t version;           /* promote, set_state */
    ks_key_state state;         /* set_state */
    const uint8_t *kek;         /* create, add_version: imported material, or NULL for random */
    uint32_t *new_version;      /* add_version: receives the number */
} change_req;

/* The changed key list a change builds over the current image: shallow
 * copies of the image's keys, with one key added or changed. */
typedef struct change_out {
    ks_krf_key *keys;           /* malloc'd */
    size_t nkeys;
    ks_krf_version *versions;   /* malloc'd: the changed key's versions */
    uint8_t *kek;               /* guarded: a new version's material */
    int noop;                   /* already so: nothing to write */
} change_out;

/* Release what a change built. */
static void change_out_free(change_out *c)
{
    free(c->keys);
    free(c->versions);
    sodium_free(c->kek);
    memset(c, 0, sizeof *c);
}

/* The current time for a new version's `created` [K-VER-4]. */
static uint64_t now_seconds(void)
{
    const time_t t = time(NULL);
    return t < 0 ? 0 : (uint64_t)t;
}

/* Start a change: copy the image's keys, with room for one more at index
 * `insert` (or none when insert is SIZE_MAX), and fresh material for a
 * new version (imported kek, or random [K-VER-4]) when with_kek. */
static ks_err change_begin(const kr_image *img, size_t insert, int with_kek, const uint8_t *kek,
                           change_out *c)
{
    const size_t extra = insert != SIZE_MAX;
    c->nkeys = img->nkeys + extra;
    c->keys = calloc(c->nkeys ? c->nkeys : 1, sizeof *c->keys);
    if (c->keys == NULL || (with_kek && (c->kek = secure_alloc(KS_KEK_LEN)) == NULL)) {
        return KS_ERR_NO_MEMORY;
    }
    for (size_t i = 0, j = 0; i < img->nkeys; i++, j++) {
        j += extra && i == insert;
        c->keys[j] = img->keys[i];
    }
    if (with_kek) {
        if (kek != NULL) {
            memcpy(c->kek, kek, KS_KEK_LEN);
        } else {
            randombytes_buf(c->kek, KS_KEK_LEN);
        }
    }
    return KS_OK;
}

/* Give key k a private copy of its versions with `extra` more slots. */
static ks_err change_versions(ks_krf_key *k, uint32_t extra, change_out *c)
{
    c->versions = calloc((size_t)k->count + extra, sizeof *c->versions);
    if (c->versions == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (k->count != 0) {
        memcpy(c->versions, k->versions, (size_t)k->count * sizeof *c->versions);
    }
    k->versions = c->versions;
    return KS_OK;
}

/* Create: insert key_id with version 1, active and primary [K-KEY-5]. */
static ks_err apply_create(const kr_image *img, const change_req *rq, change_out *c)
{
    size_t at;
    ks_err e;

    if (ks_krf_check_key_id(rq->key_id) != KS_OK) {
        return KS_ERR_BAD_VALUE; /* [F-KEYID-1] */
    }
    if (image_find(img, rq->key_id, &at) >= 0) {
        return KS_ERR_EXISTS;
    }
    if (img->nkeys >= KS_KEYRING_MAX_KEYS) {
        return KS_ERR_TOO_LARGE; /* [K-BODY-1] */
    }
    if ((e = change_begin(img, at, 1, rq->kek, c)) != KS_OK) {
        return e;
    }
    ks_krf_key *k = &c->keys[at];
    *k = (ks_krf_key){rq->key_id, 1, 0, NULL};
    if ((e = change_versions(k, 1, c)) != KS_OK) {
        return e;
    }
    c->versions[0] = (ks_krf_version){KS_KEY_ACTIVE, now_seconds(), c->kek};
    k->count = 1;
    return KS_OK;
}

/* Find the key a change names, and copy the key list; *k is the key in
 * the copy. */
static ks_err change_key(const kr_image *img, const change_req *rq, int with_kek, change_out *c,
                         ks_krf_key **k)
{
    size_t at;
    ks_err e;

    if (image_find(img, rq->key_id, &at) < 0) {
        return KS_ERR_NOT_FOUND;
    }
    if ((e = change_begin(img, SIZE_MAX, with_kek, rq->kek, c)) != KS_OK) {
        return e;
    }
    *k = &c->keys[at];
    return KS_OK;
}

/* Add version count+1, active and not primary [K-KEY-6]. */
static ks_err apply_add_version(const kr_image *img, const change_req *rq, change_out *c)
{
    ks_krf_key *k;
    ks_err e;

    if ((e = change_key(img, rq, 1, c, &k)) != KS_OK) {
        return e;
    }
    if (k->count >= KS_KEYRING_MAX_VERSIONS) {
        return KS_ERR_TOO_LARGE; /* [K-KEY-4] */
    }
    if ((e = change_versions(k, 1, c)) != KS_OK) {
        return e;
    }
    c->versions[k->count] = (ks_krf_version){KS_KEY_ACTIVE, now_seconds(), c->kek};
    k->count++;
    *rq->new_version = k->count;
    return KS_OK;
}

/* The version of the copied key k a change names: KS_ERR_INVALID_ARGUMENT
 * for 0, KS_ERR_NOT_FOUND past the last. */
static ks_err change_version_of(const ks_krf_key *k, uint32_t version)
{
    if (version == 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return version <= k->count ? KS_OK : KS_ERR_NOT_FOUND;
}

/* Promote: the version must be active [K-STATE-3]. */
static ks_err apply_promote(const kr_image *img, const change_req *rq, change_out *c)
{
    ks_krf_key *k;
    ks_err e;

    if ((e = change_key(img, rq, 0, c, &k)) != KS_OK ||
        (e = change_version_of(k, rq->version)) != KS_OK) {
        return e;
    }
    if (k->versions[rq->version - 1].state != KS_KEY_ACTIVE) {
        return KS_ERR_STATE;
    }
    c->noop = k->primary == rq->version;
    k->primary = rq->version;
    return KS_OK;
}

/* Set a state [K-STATE-2]: destroyed is final, the primary stays active;
 * destroying drops the material. */
static ks_err apply_set_state(const kr_image *img, const change_req *rq, change_out *c)
{
    ks_krf_key *k;
    ks_err e;

    if (rq->state < KS_KEY_ACTIVE || rq->state > KS_KEY_DESTROYED) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((e = change_key(img, rq, 0, c, &k)) != KS_OK ||
        (e = change_version_of(k, rq->version)) != KS_OK) {
        return e;
    }
    const ks_key_state from = (ks_key_state)k->versions[rq->version - 1].state;
    if (from == rq->state) {
        c->noop = 1;
        return KS_OK;
    }
    if (from == KS_KEY_DESTROYED || (rq->version == k->primary && rq->state != KS_KEY_ACTIVE)) {
        return KS_ERR_STATE;
    }
    if ((e = change_versions(k, 0, c)) != KS_OK) {
        return e;
    }
    ks_krf_version *v = &c->versions[rq->version - 1];
    v->state = (uint8_t)rq->state;
    if (rq->state == KS_KEY_DESTROYED) {
        v->material = NULL; /* [K-VER-3] the new file carries none */
    }
    return KS_OK;
}

/* Apply a change to the current image. */
static ks_err apply(const kr_image *img, const change_req *rq, change_out *c)
{
    switch (rq->op) {
    case OP_CREATE:
        return apply_create(img, rq, c);
    case OP_ADD_VERSION:
        return apply_add_version(img, rq, c);
    case OP_PROMOTE:
        return apply_promote(img, rq, c);
    case OP_SET_STATE:
        return apply_set_state(img, rq, c);
    }
    assert(0);
    return KS_ERR_INVALID_ARGUMENT;
}

/*
 * Make one change [K-FILE-3], [K-FILE-4]: under kr's write lock and the
 * lock file, re-read the keyring (so that changes made by other processes
 * are kept), apply the change, write the file and reload kr from it.  kr
 * takes the re-read state even when the change is refused, so that it
 * shows what the refusal was based on.
 */
static ks_err change(ks_keyring *kr, const change_req *rq)
{
    kr_image cur, next;
    change_out c = {0};
    ks_parse_error pe;
    int lfd;
    ks_err e;

    if (kr == NULL || (rq->key_id.ptr == NULL && rq->key_id.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (pthread_rwlock_wrlock(kr->lock) != 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((e = lock_take(kr->path, &lfd)) != KS_OK) {
        pthread_rwlock_unlock(kr->lock);
        return e;
    }
    if ((e = load_file(kr, NULL, &cur, &pe)) == KS_OK) {
        e = apply(&cur, rq, &c);
        if (e == KS_OK && !c.noop && (e = write_keys(kr, c.keys, c.nkeys, 0, &next)) == KS_OK) {
            image_free(&cur);
            cur = next;
        }
        change_out_free(&c);
        image_free(&kr->img);
        kr->img = cur;
    }
    close(lfd);
    pthread_rwlock_unlock(kr->lock);
    return e;
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_create(ks_keyring *kr, ks_bytes key_id)
{
    const change_req rq = {.op = OP_CREATE, .key_id = key_id};
    return change(kr, &rq);
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_add_version(ks_keyring *kr, ks_bytes key_id, uint32_t *version)
{
    if (version == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const change_req rq = {.op = OP_ADD_VERSION, .key_id = key_id, .new_version = version};
    return change(kr, &rq);
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_import_version(ks_keyring *kr, ks_bytes key_id, const uint8_t kek[KS_KEK_LEN],
                                 uint32_t *version)
{
    if (version == NULL || kek == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const change_req rq = {.op = OP_ADD_VERSION, .key_id = key_id, .kek = kek, .new_version = version};
    return change(kr, &rq);
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_promote(ks_keyring *kr, ks_bytes key_id, uint32_t version)
{
    const change_req rq = {.op = OP_PROMOTE, .key_id = key_id, .version = version};
    return change(kr, &rq);
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_set_state(ks_keyring *kr, ks_bytes key_id, uint32_t version, ks_key_state state)
{
    const change_req rq = {.op = OP_SET_STATE, .key_id = key_id, .version = version, .state = state};
    return change(kr, &rq);
}

/* ---- listing -------------------------------------------------------------------- */

/* See keyshift/keyring.h. */
size_t ks_keyring_count(const ks_keyring *kr)
{
    if (kr == NULL) {
        return 0;
    }
    pthread_rwlock_rdlock(kr->lock);
    const size_t n = kr->img.nkeys;
    pthread_rwlock_unlock(kr->lock);
    return n;
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_key_at(const ks_keyring *kr, size_t i, ks_keyring_key *out)
{
    ks_err e = KS_ERR_NOT_FOUND;
    if (kr == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    pthread_rwlock_rdlock(kr->lock);
    if (i < kr->img.nkeys) {
        const ks_krf_key *k = &kr->img.keys[i];
        *out = (ks_keyring_key){k->key_id, k->primary, k->count};
        e = KS_OK;
    }
    pthread_rwlock_unlock(kr->lock);
    return e;
}

/* See keyshift/keyring.h. */
ks_err ks_keyring_version_at(const ks_keyring *kr, size_t i, uint32_t version,
                             ks_keyring_version *out)
{
    ks_err e = KS_ERR_NOT_FOUND;
    if (kr == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    pthread_rwlock_rdlock(kr->lock);
    if (i < kr->img.nkeys && version >= 1 && version <= kr->img.keys[i].count) {
        const ks_krf_version *v = &kr->img.keys[i].versions[version - 1];
        *out = (ks_keyring_version){version, (ks_key_state)v->state, v->created};
        e = KS_OK;
    }
    pthread_rwlock_unlock(kr->lock);
    return e;
}

/* ---- for the local provider (migrate/keys/provider_local.c) ------------------------- */

/* See keyring_format.h. */
ks_err ks_keyring_use(const ks_keyring *kr, ks_bytes key_id, uint32_t version, ks_krf_use_fn fn,
                      void *ctx)
{
    size_t at;
    ks_err e;

    if (kr == NULL || fn == NULL || (key_id.ptr == NULL && key_id.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (pthread_rwlock_rdlock(kr->lock) != 0) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const long idx = image_find(&kr->img, key_id, &at);
    if (idx < 0) {
        e = KS_ERR_NOT_FOUND;
    } else {
        const ks_krf_key *k = &kr->img.keys[idx];
        const uint32_t v = version == 0 ? k->primary : version;
        e = v <= k->count ? fn(ctx, k, v) : KS_ERR_NOT_FOUND;
    }
    pthread_rwlock_unlock(kr->lock);
    return e;
}
