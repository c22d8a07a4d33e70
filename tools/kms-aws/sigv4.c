/*
 * tools/kms-aws/sigv4.c -- AWS Signature Version 4, header form, with
 * libsodium's SHA-256 and HMAC-SHA256 (see sigv4.h for the rules).
 */
#define _POSIX_C_SOURCE 200809L
#include "sigv4.h"

#include <sodium.h>
#include <string.h>

#define SIGV4_SECRET_MAX 256

/* An output buffer being filled; ok drops to 0 on the first overflow and
 * everything after it is ignored. */
typedef struct {
    char *p;
    size_t cap;
    size_t len;
    int ok;
} wbuf;

/* Start writing into p (cap bytes); a cap of 0 is an overflow at once. */
static void wb_init(wbuf *w, char *p, size_t cap)
{
    w->p = p;
    w->cap = cap;
    w->len = 0;
    w->ok = cap > 0;
    if (w->ok) {
        p[0] = '\0';
    }
}

/* Append n bytes, keeping room for the NUL. */
static void wb_put(wbuf *w, const char *s, size_t n)
{
    if (!w->ok) {
        return;
    }
    if (n >= w->cap - w->len) {
        w->ok = 0;
        return;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
    w->p[w->len] = '\0';
}

/* Append a NUL-terminated string. */
static void wb_str(wbuf *w, const char *s)
{
    wb_put(w, s, strlen(s));
}

/* Append one byte. */
static void wb_chr(wbuf *w, char c)
{
    wb_put(w, &c, 1);
}

/* Whether c is in RFC 3986's unreserved set. */
static int unreserved(uint8_t c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
           c == '_' || c == '~';
}

/* The encoded form of byte c into e (up to 3 chars); returns its length. */
static size_t enc_byte(uint8_t c, int keep_slash, char e[3])
{
    static const char hexu[] = "0123456789ABCDEF";
    if (unreserved(c) || (keep_slash && c == '/')) {
        e[0] = (char)c;
        return 1;
    }
    e[0] = '%';
    e[1] = hexu[c >> 4];
    e[2] = hexu[c & 15];
    return 3;
}

/* Append the encoding of in[0..len) to w. */
static void wb_enc(wbuf *w, const uint8_t *in, size_t len, int keep_slash)
{
    char e[3];
    for (size_t i = 0; i < len && w->ok; i++) {
        wb_put(w, e, enc_byte(in[i], keep_slash, e));
    }
}

/* Percent-encode in into out (sigv4.h). */
int sigv4_uri_encode(const uint8_t *in, size_t len, int keep_slash, char *out, size_t cap, size_t *out_len)
{
    wbuf w;
    wb_init(&w, out, cap);
    wb_enc(&w, in, len, keep_slash);
    *out_len = w.ok ? w.len : 0;
    return w.ok ? 0 : -1;
}

/* Lower-case hex of in (sigv4.h). */
void sigv4_hex(const uint8_t *in, size_t n, char *hex)
{
    static const char hexl[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = hexl[in[i] >> 4];
        hex[2 * i + 1] = hexl[in[i] & 15];
    }
    hex[2 * n] = '\0';
}

/* strlen bounded by SIGV4_FIELD_MAX: the length, or -1 if s is NULL or
 * longer. */
static long field_len(const char *s)
{
    if (s == NULL) {
        return -1;
    }
    size_t n = strnlen(s, SIGV4_FIELD_MAX + 1);
    return n > SIGV4_FIELD_MAX ? -1 : (long)n;
}

/* Compare the percent-encodings of a and b byte by byte, without building
 * them: <0, 0, >0. */
static int enc_cmp(const char *a, const char *b)
{
    const uint8_t *pa = (const uint8_t *)a, *pb = (const uint8_t *)b;
    char ea[3], eb[3];
    size_t na = 0, nb = 0, ia = 0, ib = 0;
    for (;;) {
        if (ia == na) {
            if (*pa == '\0') {
                na = 0;
            } else {
                na = enc_byte(*pa++, 0, ea);
            }
            ia = 0;
        }
        if (ib == nb) {
            if (*pb == '\0') {
                nb = 0;
            } else {
                nb = enc_byte(*pb++, 0, eb);
            }
            ib = 0;
        }
        if (na == 0 || nb == 0) {
            return (na != 0) - (nb != 0);
        }
        if (ea[ia] != eb[ib]) {
            return (uint8_t)ea[ia] < (uint8_t)eb[ib] ? -1 : 1;
        }
        ia++;
        ib++;
    }
}

/* Compare two header names case-insensitively (ASCII), as their lower-case
 * forms sort. */
static int lname_cmp(const char *a, const char *b)
{
    for (;; a++, b++) {
        int ca = (*a >= 'A' && *a <= 'Z') ? *a + 32 : (uint8_t)*a;
        int cb = (*b >= 'A' && *b <= 'Z') ? *b + 32 : (uint8_t)*b;
        if (ca != cb || ca == 0) {
            return ca - cb;
        }
    }
}

/* Whether name is a non-empty HTTP token (RFC 9110) of bounded length. */
static int header_name_ok(const char *name)
{
    long n = field_len(name);
    if (n <= 0) {
        return 0;
    }
    for (long i = 0; i < n; i++) {
        uint8_t c = (uint8_t)name[i];
        if (c <= 32 || c >= 127 || strchr("\"(),/:;<=>?@[\\]{}", c) != NULL) {
            return 0;
        }
    }
    return 1;
}

/* Whether a path is absolute and free of the segments SigV4 would
 * normalise ("//", ".", ".."), which this signer does not do. */
static int path_ok(const char *path)
{
    long n = field_len(path);
    if (n <= 0 || path[0] != '/') {
        return 0;
    }
    for (long i = 0; i < n; i++) {
        if (path[i] != '/') {
            continue;
        }
        const char *seg = path + i + 1;
        if (seg[0] == '/' || (seg[0] == '.' && (seg[1] == '/' || seg[1] == '\0')) ||
            (seg[0] == '.' && seg[1] == '.' && (seg[2] == '/' || seg[2] == '\0'))) {
            return 0;
        }
    }
    return 1;
}

/* Sort idx[0..n) by cmp over the strings key(i): insertion sort (n is at
 * most 16). */
static void sort_idx(size_t *idx, size_t n, const sigv4_pair *p, int by_header)
{
    for (size_t i = 1; i < n; i++) {
        size_t v = idx[i], j = i;
        while (j > 0) {
            const sigv4_pair *a = &p[idx[j - 1]], *b = &p[v];
            int c;
            if (by_header) {
                c = lname_cmp(a->name, b->name);
            } else {
                c = enc_cmp(a->name, b->name);
                if (c == 0) {
                    c = enc_cmp(a->value, b->value);
                }
            }
            if (c <= 0) {
                break;
            }
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* Append a header value trimmed, inner runs of spaces and tabs collapsed
 * to one space.  -1 if it holds a CR, LF or NUL-free control byte. */
static int wb_header_value(wbuf *w, const char *v, size_t n)
{
    size_t a = 0, b = n;
    while (a < b && (v[a] == ' ' || v[a] == '\t')) {
        a++;
    }
    while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t')) {
        b--;
    }
    int in_space = 0;
    for (size_t i = a; i < b; i++) {
        uint8_t c = (uint8_t)v[i];
        if (c == '\r' || c == '\n' || (c < 32 && c != '\t') || c == 127) {
            return -1;
        }
        if (c == ' ' || c == '\t') {
            if (!in_space) {
                wb_chr(w, ' ');
            }
            in_space = 1;
        } else {
            wb_chr(w, (char)c);
            in_space = 0;
        }
    }
    return 0;
}

/* Append a header name in lower case. */
static void wb_lower(wbuf *w, const char *s)
{
    for (; *s != '\0' && w->ok; s++) {
        wb_chr(w, (*s >= 'A' && *s <= 'Z') ? (char)(*s + 32) : *s);
    }
}

/* The canonical request (sigv4.h). */
int sigv4_canonical_request(const sigv4_request *req, char *out, size_t cap, size_t *out_len,
                            char *signed_headers, size_t sh_cap)
{
    size_t hidx[SIGV4_MAX_HEADERS], qidx[SIGV4_MAX_PARAMS];
    wbuf w, sh;
    char phash[SIGV4_HEX_LEN + 1];

    *out_len = 0;
    if (req == NULL || req->nheaders == 0 || req->nheaders > SIGV4_MAX_HEADERS || req->nquery > SIGV4_MAX_PARAMS ||
        (req->nquery > 0 && req->query == NULL) || req->headers == NULL || !path_ok(req->path) ||
        field_len(req->method) <= 0 || (req->payload == NULL && req->payload_len != 0)) {
        return -1;
    }
    for (size_t i = 0; i < req->nheaders; i++) {
        if (!header_name_ok(req->headers[i].name) || field_len(req->headers[i].value) < 0) {
            return -1;
        }
        hidx[i] = i;
    }
    for (size_t i = 0; i < req->nquery; i++) {
        if (field_len(req->query[i].name) <= 0 || field_len(req->query[i].value) < 0) {
            return -1;
        }
        qidx[i] = i;
    }
    sort_idx(hidx, req->nheaders, req->headers, 1);
    sort_idx(qidx, req->nquery, req->query, 0);
    for (size_t i = 1; i < req->nheaders; i++) {
        if (lname_cmp(req->headers[hidx[i - 1]].name, req->headers[hidx[i]].name) == 0) {
            return -1;
        }
    }
    if (req->payload_hash != NULL) {
        if (strnlen(req->payload_hash, SIGV4_HEX_LEN + 1) != SIGV4_HEX_LEN ||
            strspn(req->payload_hash, "0123456789abcdef") != SIGV4_HEX_LEN) {
            return -1;
        }
        memcpy(phash, req->payload_hash, sizeof phash);
    } else {
        uint8_t h[crypto_hash_sha256_BYTES];
        crypto_hash_sha256(h, req->payload != NULL ? req->payload : (const uint8_t *)"", req->payload_len);
        sigv4_hex(h, sizeof h, phash);
    }

    wb_init(&w, out, cap);
    wb_init(&sh, signed_headers, sh_cap);
    wb_str(&w, req->method);
    wb_chr(&w, '\n');
    wb_enc(&w, (const uint8_t *)req->path, strlen(req->path), 1);
    wb_chr(&w, '\n');
    for (size_t i = 0; i < req->nquery; i++) {
        const sigv4_pair *q = &req->query[qidx[i]];
        if (i > 0) {
            wb_chr(&w, '&');
        }
        wb_enc(&w, (const uint8_t *)q->name, strlen(q->name), 0);
        wb_chr(&w, '=');
        wb_enc(&w, (const uint8_t *)q->value, strlen(q->value), 0);
    }
    wb_chr(&w, '\n');
    for (size_t i = 0; i < req->nheaders; i++) {
        const sigv4_pair *h = &req->headers[hidx[i]];
        wb_lower(&w, h->name);
        wb_chr(&w, ':');
        if (wb_header_value(&w, h->value, strlen(h->value)) != 0) {
            return -1;
        }
        wb_chr(&w, '\n');
        if (i > 0) {
            wb_chr(&sh, ';');
        }
        wb_lower(&sh, h->name);
    }
    wb_chr(&w, '\n');
    wb_put(&w, sh.p, sh.ok ? sh.len : 0);
    wb_chr(&w, '\n');
    wb_str(&w, phash);
    if (!w.ok || !sh.ok) {
        return -1;
    }
    *out_len = w.len;
    return 0;
}

/* Whether d is YYYYMMDDTHHMMSSZ (digits where digits go). */
static int amz_date_ok(const char *d)
{
    if (d == NULL || strnlen(d, 17) != 16 || d[8] != 'T' || d[15] != 'Z') {
        return 0;
    }
    for (int i = 0; i < 15; i++) {
        if (i != 8 && (d[i] < '0' || d[i] > '9')) {
            return 0;
        }
    }
    return 1;
}

/* Whether a scope part (region, service) is 1..64 of [a-z0-9-]
 * (sigv4.h). */
int sigv4_scope_part_ok(const char *s)
{
    if (s == NULL) {
        return 0;
    }
    size_t n = strnlen(s, 65);
    if (n == 0 || n > 64) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-')) {
            return 0;
        }
    }
    return 1;
}

/* Append "date/region/service/aws4_request". */
static void wb_scope(wbuf *w, const sigv4_signer *s)
{
    wb_put(w, s->amz_date, 8);
    wb_chr(w, '/');
    wb_str(w, s->region);
    wb_chr(w, '/');
    wb_str(w, s->service);
    wb_str(w, "/aws4_request");
}

/* The string to sign (sigv4.h). */
int sigv4_string_to_sign(const sigv4_signer *s, const char *creq, size_t creq_len, char *out, size_t cap,
                         size_t *out_len)
{
    uint8_t h[crypto_hash_sha256_BYTES];
    char hex[SIGV4_HEX_LEN + 1];
    wbuf w;

    *out_len = 0;
    if (s == NULL || !amz_date_ok(s->amz_date) || !sigv4_scope_part_ok(s->region) ||
        !sigv4_scope_part_ok(s->service) || creq == NULL) {
        return -1;
    }
    crypto_hash_sha256(h, (const uint8_t *)creq, creq_len);
    sigv4_hex(h, sizeof h, hex);
    wb_init(&w, out, cap);
    wb_str(&w, "AWS4-HMAC-SHA256\n");
    wb_str(&w, s->amz_date);
    wb_chr(&w, '\n');
    wb_scope(&w, s);
    wb_chr(&w, '\n');
    wb_str(&w, hex);
    if (!w.ok) {
        return -1;
    }
    *out_len = w.len;
    return 0;
}

/* out = HMAC-SHA256(key[0..klen), msg[0..mlen)), the state wiped. */
static void hmac(uint8_t out[SIGV4_KEY_LEN], const uint8_t *key, size_t klen, const void *msg, size_t mlen)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, klen);
    crypto_auth_hmacsha256_update(&st, msg, mlen);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

/* The signing key (sigv4.h). */
int sigv4_signing_key(const sigv4_signer *s, uint8_t out[SIGV4_KEY_LEN])
{
    uint8_t ksecret[4 + SIGV4_SECRET_MAX];
    uint8_t k1[SIGV4_KEY_LEN], k2[SIGV4_KEY_LEN];
    size_t n;

    sodium_memzero(out, SIGV4_KEY_LEN);
    if (s == NULL || s->secret_access_key == NULL || !amz_date_ok(s->amz_date) || !sigv4_scope_part_ok(s->region) ||
        !sigv4_scope_part_ok(s->service)) {
        return -1;
    }
    n = strnlen(s->secret_access_key, SIGV4_SECRET_MAX + 1);
    if (n == 0 || n > SIGV4_SECRET_MAX) {
        return -1;
    }
    memcpy(ksecret, "AWS4", 4);
    memcpy(ksecret + 4, s->secret_access_key, n);
    hmac(k1, ksecret, 4 + n, s->amz_date, 8);
    sodium_memzero(ksecret, sizeof ksecret);
    hmac(k2, k1, sizeof k1, s->region, strlen(s->region));
    hmac(k1, k2, sizeof k2, s->service, strlen(s->service));
    hmac(out, k1, sizeof k1, "aws4_request", 12);
    sodium_memzero(k1, sizeof k1);
    sodium_memzero(k2, sizeof k2);
    return 0;
}

/* The signature (sigv4.h). */
void sigv4_signature(const uint8_t key[SIGV4_KEY_LEN], const char *sts, size_t sts_len,
                     char hex[SIGV4_HEX_LEN + 1])
{
    uint8_t mac[SIGV4_KEY_LEN];
    hmac(mac, key, SIGV4_KEY_LEN, sts, sts_len);
    sigv4_hex(mac, sizeof mac, hex);
}

/* Whether an access key id is a short printable token with no '/' or
 * ',' (it goes into the Credential field as is). */
static int access_key_ok(const char *id)
{
    if (id == NULL) {
        return 0;
    }
    size_t n = strnlen(id, 129);
    if (n == 0 || n > 128) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)id[i];
        if (c <= 32 || c >= 127 || c == '/' || c == ',') {
            return 0;
        }
    }
    return 1;
}

/* The Authorization header value (sigv4.h). */
int sigv4_authorization(const sigv4_signer *s, const sigv4_request *req, char *out, size_t cap)
{
    enum { CREQ_MAX = 16384, STS_MAX = 512, SH_MAX = 1024 };
    char creq[CREQ_MAX];
    char sts[STS_MAX], sh[SH_MAX], sig[SIGV4_HEX_LEN + 1];
    uint8_t key[SIGV4_KEY_LEN];
    size_t creq_len, sts_len;
    wbuf w;
    int rc = -1;

    if (cap > 0) {
        out[0] = '\0';
    }
    if (s == NULL || !access_key_ok(s->access_key_id) ||
        sigv4_canonical_request(req, creq, sizeof creq, &creq_len, sh, sizeof sh) != 0 ||
        sigv4_string_to_sign(s, creq, creq_len, sts, sizeof sts, &sts_len) != 0 ||
        sigv4_signing_key(s, key) != 0) {
        goto out;
    }
    sigv4_signature(key, sts, sts_len, sig);
    wb_init(&w, out, cap);
    wb_str(&w, "AWS4-HMAC-SHA256 Credential=");
    wb_str(&w, s->access_key_id);
    wb_chr(&w, '/');
    wb_scope(&w, s);
    wb_str(&w, ", SignedHeaders=");
    wb_str(&w, sh);
    wb_str(&w, ", Signature=");
    wb_str(&w, sig);
    rc = w.ok ? 0 : -1;
out:
    sodium_memzero(key, sizeof key);
    /* The canonical request holds the session token header. */
    sodium_memzero(creq, sizeof creq);
    if (rc != 0 && cap > 0) {
        out[0] = '\0';
    }
    return rc;
}
