/*
 * migrate/keys/registry_format.c -- the strict provider registry parser,
 * its route query and its canonical encoder (docs/providers.md,
 * "Registry").
 *
 * Like the keyring and envelope parsers, this is a place at which
 * untrusted bytes enter the library: it reads only through ks_cursor,
 * checks each byte and each element as soon as it is read, stops at the
 * first fault and reports it with a code and an offset, never allocates
 * and keeps its results as views into the input.  Each check names the
 * clause it enforces; the order of the checks is the order of
 * [P-ERR-2].
 *
 * Nothing here includes libsodium or touches a file: opening the
 * providers a registry names is migrate/keys/registry.c's work.
 */
#include <assert.h>
#include <string.h>

#include <keyshift/plugin.h>

#include "registry_format.h"

#include "../../format/rules.h"
#include "../../parser/cursor.h"

/* ---- the key table [P-SET-3], [P-LOCAL-1], [P-PKCS11-1], [P-PLUGIN-1] ---------- */

/* Which provider types a key belongs to: bit (type - 1). */
#define FOR_LOCAL 1u
#define FOR_PKCS11 2u
#define FOR_PLUGIN 4u
#define FOR_ALL (FOR_LOCAL | FOR_PKCS11 | FOR_PLUGIN)

/* How a key's value is checked [P-VAL]. */
typedef enum value_rule {
    V_TYPE,     /* local | pkcs11 | plugin */
    V_PATTERN,  /* 1..256 bytes of [F-KEYID-1] */
    V_PATH,     /* an absolute path */
    V_ENV,      /* an environment variable name */
    V_LABEL,    /* 1..32 printable bytes */
    V_URI,      /* pkcs11:..., no space */
    V_GCM,      /* p11kit | no-ivbits */
    V_NUMBER,   /* decimal in [min, max] [P-VAL-4] */
    V_COMMAND,  /* an absolute path or a plugin NAME [P-PLUGIN-2] */
    V_ANY       /* any bytes of [P-LINE-3] [P-PLUGIN-3] */
} value_rule;

/* One key: its text, the types it is allowed in, its value rule, the
 * key that excludes it (the other spelling of one setting) or -1, and
 * for a number its range. */
typedef struct key_def {
    const char *name;
    uint8_t types;
    uint8_t rule;
    int8_t partner;
    uint32_t min, max;
} key_def;

static const key_def keys[] = {
    [KS_REGF_TYPE] = {"type", FOR_ALL, V_TYPE, -1, 0, 0},
    [KS_REGF_KEYRING] = {"keyring", FOR_LOCAL, V_PATH, -1, 0, 0},
    [KS_REGF_PASSPHRASE_FILE] = {"passphrase-file", FOR_LOCAL, V_PATH, KS_REGF_PASSPHRASE_ENV, 0, 0},
    [KS_REGF_PASSPHRASE_ENV] = {"passphrase-env", FOR_LOCAL, V_ENV, KS_REGF_PASSPHRASE_FILE, 0, 0},
    [KS_REGF_MODULE] = {"module", FOR_PKCS11, V_PATH, -1, 0, 0},
    [KS_REGF_TOKEN_LABEL] = {"token-label", FOR_PKCS11, V_LABEL, KS_REGF_TOKEN_URI, 0, 0},
    [KS_REGF_TOKEN_URI] = {"token-uri", FOR_PKCS11, V_URI, KS_REGF_TOKEN_LABEL, 0, 0},
    [KS_REGF_PIN_FILE] = {"pin-file", FOR_PKCS11, V_PATH, KS_REGF_PIN_ENV, 0, 0},
    [KS_REGF_PIN_ENV] = {"pin-env", FOR_PKCS11, V_ENV, KS_REGF_PIN_FILE, 0, 0},
    [KS_REGF_GCM_PARAMS] = {"gcm-params", FOR_PKCS11, V_GCM, -1, 0, 0},
    [KS_REGF_TIMEOUT_MS] = {"timeout-ms", FOR_PKCS11 | FOR_PLUGIN, V_NUMBER, -1, 1,
                            KS_REGF_TIMEOUT_MAX},
    [KS_REGF_COMMAND] = {"command", FOR_PLUGIN, V_COMMAND, -1, 0, 0},
    [KS_REGF_RETRIES] = {"retries", FOR_PLUGIN, V_NUMBER, -1, 0, KS_PLUGIN_RETRIES_MAX},
    [KS_REGF_RETRY_BUDGET_MS] = {"retry-budget-ms", FOR_PLUGIN, V_NUMBER, -1, 1,
                                 KS_PLUGIN_BUDGET_MAX},
    [KS_REGF_RATE_LIMIT] = {"rate-limit", FOR_PLUGIN, V_NUMBER, -1, 0, KS_PLUGIN_RATE_MAX},
    [KS_REGF_CONCURRENCY] = {"concurrency", FOR_PLUGIN, V_NUMBER, -1, 1,
                             KS_PLUGIN_CONCURRENCY_MAX},
    [KS_REGF_SERVE] = {"serve", FOR_ALL, V_PATTERN, -1, 0, 0},
    [KS_REGF_SERVE_PREFIX] = {"serve-prefix", FOR_ALL, V_PATTERN, -1, 0, 0},
    [KS_REGF_ARG] = {"arg", FOR_PLUGIN, V_ANY, -1, 0, 0},
    [KS_REGF_ENV] = {"env", FOR_PLUGIN, V_ENV, -1, 0, 0},
    [KS_REGF_ENV_PREFIX] = {"env-prefix", FOR_PLUGIN, V_ENV, -1, 0, 0},
};

/* A plugin's timeout-ms is one attempt's deadline, with the same range. */
_Static_assert(KS_REGF_TIMEOUT_MAX == KS_PLUGIN_TIMEOUT_MAX, "one timeout-ms range");
/* seen (a uint32_t) has a bit per key. */
_Static_assert(KS_REGF_ENV_PREFIX < 32, "a bit per key");

#define N_KEYS (sizeof keys / sizeof keys[0])

/* See registry_format.h. */
const char *ks_regf_key_name(int key)
{
    return key >= 0 && (size_t)key < N_KEYS ? keys[key].name : NULL;
}

/* The provider types by ks_regf_type [P-TYPE-1]. */
static const char *const type_names[] = {
    [KS_REGF_LOCAL] = "local",
    [KS_REGF_PKCS11] = "pkcs11",
    [KS_REGF_PLUGIN] = "plugin",
};

#define N_TYPES (sizeof type_names / sizeof type_names[0])

/* See registry_format.h. */
const char *ks_regf_type_name(int type)
{
    return type > 0 && (size_t)type < N_TYPES ? type_names[type] : NULL;
}

/* ---- small helpers -------------------------------------------------------------- */

/* Nonzero when v holds exactly the NUL-terminated text s. */
static int view_is(ks_bytes v, const char *s)
{
    const size_t n = strlen(s);
    return v.len == n && memcmp(v.ptr, s, n) == 0;
}

/* Nonzero when a and b hold the same bytes. */
static int same_bytes(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Nonzero for a byte of a provider name after the first [P-PROV-1]. */
static int name_byte(uint8_t b, int first)
{
    return (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || (!first && b == '-');
}

/* Nonzero for a byte of an environment variable name [P-VAL-3]. */
static int env_byte(uint8_t b, int first)
{
    return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || b == '_' ||
           (!first && b >= '0' && b <= '9');
}

/* The state of one parse. */
typedef struct regf_parse {
    ks_regf_file *out;
    int have_header;       /* [P-HEAD-1] seen */
    ks_regf_provider *cur; /* the open section, or NULL */
    uint32_t seen;         /* bit k: key k given in the open section */
    uint32_t section;      /* 1-based index of the last section begun; 0 before */
    size_t offset;         /* where the fault is, when a check fails */
} regf_parse;

/* Fail with code at offset: note the offset, return the code. */
static ks_err fault(regf_parse *st, ks_err code, size_t offset)
{
    st->offset = offset;
    return code;
}

/* Check v (at file offset off) byte by byte: a byte that `ok` refuses is
 * bad-value at that byte, a byte at index max is too-large there
 * ([P-VAL-1]'s left-to-right rule). */
static ks_err scan_value(regf_parse *st, ks_bytes v, size_t off, size_t max,
                         int (*ok)(uint8_t b, int first))
{
    for (size_t i = 0; i < v.len; i++) {
        if (i == max) {
            return fault(st, KS_ERR_TOO_LARGE, off + i);
        }
        if (ok != NULL && !ok(v.ptr[i], i == 0)) {
            return fault(st, KS_ERR_BAD_VALUE, off + i);
        }
    }
    return KS_OK;
}

/* Nonzero for a byte of the key_id class [F-KEYID-1]. */
static int pattern_byte(uint8_t b, int first)
{
    (void)first;
    return ks_rules_charset_scan(KS_RULE_KEY_ID, &b, 1) == 1;
}

/* Nonzero for a decimal digit [P-VAL-4]. */
static int digit_byte(uint8_t b, int first)
{
    (void)first;
    return b >= '0' && b <= '9';
}

/* Check a NUMBER value [P-VAL-4] (timeout-ms, retries, ...): digits only
 * (bad-value at the first other byte), then no leading zero but "0"
 * itself and within min..max (bad-value at the value's first byte). */
static ks_err check_number(regf_parse *st, ks_bytes v, size_t off, uint32_t min, uint32_t max,
                           uint32_t *out)
{
    ks_err e = scan_value(st, v, off, SIZE_MAX, digit_byte);
    if (e != KS_OK) {
        return e;
    }
    uint64_t n = 0;
    for (size_t i = 0; i < v.len && n <= max; i++) {
        n = n * 10 + (uint64_t)(v.ptr[i] - '0');
    }
    if ((v.ptr[0] == '0' && v.len > 1) || n < min || n > max) {
        return fault(st, KS_ERR_BAD_VALUE, off);
    }
    *out = (uint32_t)n;
    return KS_OK;
}

/* Check a command value [P-PLUGIN-2]: an absolute path [P-VAL-2], else a
 * NAME of the provider name's class and length [P-PROV-1]. */
static ks_err check_command(regf_parse *st, ks_bytes v, size_t off)
{
    return v.ptr[0] == '/' ? KS_OK : scan_value(st, v, off, KS_REGF_NAME_MAX, name_byte);
}

/* Check the value v (at file offset off) of key k by its rule [P-VAL]. */
static ks_err check_value(regf_parse *st, int k, ks_bytes v, size_t off)
{
    static const char uri_scheme[] = "pkcs11:";
    switch ((value_rule)keys[k].rule) {
    case V_TYPE:
        for (size_t t = 1; t < N_TYPES; t++) {
            if (view_is(v, type_names[t])) {
                st->cur->type = (ks_regf_type)t;
                return KS_OK;
            }
        }
        return fault(st, KS_ERR_BAD_VALUE, off); /* [P-TYPE-1] */
    case V_PATTERN:
        return scan_value(st, v, off, KS_REGF_PATTERN_MAX, pattern_byte); /* [P-SERVE-1] */
    case V_PATH:
        return v.ptr[0] == '/' ? KS_OK : fault(st, KS_ERR_BAD_VALUE, off); /* [P-VAL-2] */
    case V_ENV:
        return scan_value(st, v, off, KS_REGF_ENV_MAX, env_byte); /* [P-VAL-3] */
    case V_LABEL:
        return scan_value(st, v, off, KS_REGF_LABEL_MAX, NULL); /* [P-PKCS11-2] */
    case V_URI:
        if (v.len < sizeof uri_scheme - 1 || memcmp(v.ptr, uri_scheme, sizeof uri_scheme - 1) != 0) {
            return fault(st, KS_ERR_BAD_VALUE, off); /* [P-PKCS11-2] */
        }
        for (size_t i = 0; i < v.len; i++) {
            if (v.ptr[i] == ' ') {
                return fault(st, KS_ERR_BAD_VALUE, off + i);
            }
        }
        return KS_OK;
    case V_GCM:
        if (view_is(v, "p11kit") || view_is(v, "no-ivbits")) {
            return KS_OK;
        }
        return fault(st, KS_ERR_BAD_VALUE, off); /* [P-PKCS11-4] */
    case V_NUMBER: /* [P-PKCS11-5], [P-PLUGIN-4..8] */
        return check_number(st, v, off, keys[k].min, keys[k].max, &st->cur->number[k]);
    case V_COMMAND:
        return check_command(st, v, off); /* [P-PLUGIN-2] */
    case V_ANY:
        return KS_OK; /* [P-PLUGIN-3]: [P-LINE-3] and [P-SET-6] have checked it */
    }
    assert(0);
    return KS_ERR_BAD_VALUE;
}

/* ---- lines -------------------------------------------------------------------------- */

/* The header line [P-HEAD-1]: exactly "keyshift-providers 1". */
static ks_err parse_header(regf_parse *st, ks_bytes line, size_t base)
{
    static const char stem[] = "keyshift-providers ";
    const size_t n = sizeof stem - 1;
    if (view_is(line, KS_REGF_HEADER)) {
        st->have_header = 1;
        return KS_OK;
    }
    if (line.len >= n && memcmp(line.ptr, stem, n) == 0) {
        return fault(st, KS_ERR_UNSUPPORTED_VERSION, base + n);
    }
    return fault(st, KS_ERR_BAD_MAGIC, base);
}

/* Close the open section, if any, at file offset off: its required
 * settings and at least one serve line [P-SECT-1]. */
static ks_err close_section(regf_parse *st, size_t off)
{
    const ks_regf_provider *p = st->cur;
    if (p == NULL) {
        return KS_OK;
    }
    const uint32_t s = st->seen;
    int ok = (s & (1u << KS_REGF_TYPE)) != 0;
    if (ok && p->type == KS_REGF_LOCAL) {
        ok = (s & (1u << KS_REGF_KEYRING)) != 0; /* [P-LOCAL-1] */
    } else if (ok && p->type == KS_REGF_PLUGIN) {
        ok = (s & (1u << KS_REGF_COMMAND)) != 0; /* [P-PLUGIN-1] */
    } else if (ok) {
        ok = (s & (1u << KS_REGF_TOKEN_LABEL | 1u << KS_REGF_TOKEN_URI)) != 0 &&
             (s & (1u << KS_REGF_PIN_FILE | 1u << KS_REGF_PIN_ENV)) != 0; /* [P-PKCS11-1] */
    }
    if (!ok || p->serves == 0) {
        return fault(st, KS_ERR_MISSING_FIELD, off);
    }
    st->cur = NULL;
    return KS_OK;
}

/* A section line, "provider NAME" [P-PROV-1..2]; the open section is
 * closed first [P-SECT-1]. */
static ks_err parse_provider(regf_parse *st, ks_cursor *lc)
{
    static const char word[] = "provider";
    const size_t base = ks_cursor_offset(lc), n = ks_cursor_remaining(lc);
    ks_bytes kw, name = {NULL, 0};
    uint8_t sp;
    ks_err e;

    if ((e = close_section(st, base)) != KS_OK) {
        return e;
    }
    if (n < sizeof word - 1 || memcmp(lc->buf + lc->pos, word, sizeof word - 1) != 0 ||
        (n > sizeof word - 1 && lc->buf[lc->pos + sizeof word - 1] != ' ')) {
        return fault(st, KS_ERR_UNKNOWN_FIELD, base);
    }
    e = ks_cursor_read_view(lc, sizeof word - 1, &kw);
    assert(e == KS_OK);
    st->section = (uint32_t)st->out->nproviders + 1;
    if (ks_cursor_read_u8(lc, &sp) != KS_OK) {
        return fault(st, KS_ERR_MISSING_FIELD, ks_cursor_offset(lc)); /* no name */
    }
    if (st->out->nproviders == KS_REGF_PROVIDERS_MAX) {
        return fault(st, KS_ERR_TOO_LARGE, base); /* [P-PROV-2] */
    }
    const size_t name_off = ks_cursor_offset(lc);
    e = ks_cursor_read_view(lc, ks_cursor_remaining(lc), &name);
    assert(e == KS_OK && name.len > 0); /* [P-LINE-4]: no trailing space */
    if ((e = scan_value(st, name, name_off, KS_REGF_NAME_MAX, name_byte)) != KS_OK) {
        return e;
    }
    for (size_t i = 0; i < st->out->nproviders; i++) {
        if (same_bytes(st->out->providers[i].name, name)) {
            return fault(st, KS_ERR_CONFLICT, name_off); /* [P-PROV-1] unique */
        }
    }
    ks_regf_provider *p = &st->out->providers[st->out->nproviders++];
    p->name = name;
    p->offset = base;
    st->cur = p;
    st->seen = 0;
    return KS_OK;
}

/* Look up the key k[0, n): its index in the key table, or -1. */
static int find_key(ks_bytes k)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (view_is(k, keys[i].name)) {
            return (int)i;
        }
    }
    return -1;
}

/* The position rules of key k at file offset off in the open section
 * [P-SET-3..5], and for a repeatable key its limits [P-SERVE-4],
 * [P-PLUGIN-3], [P-PLUGIN-9]. */
static ks_err check_key(regf_parse *st, int k, size_t off)
{
    const int repeats = k >= KS_REGF_KEY_COUNT;
    if (k < 0) {
        return fault(st, KS_ERR_UNKNOWN_FIELD, off); /* [P-SET-3] */
    }
    if ((st->seen & 1u << KS_REGF_TYPE) == 0) {
        return k == KS_REGF_TYPE ? KS_OK : fault(st, KS_ERR_MISSING_FIELD, off); /* [P-SET-4] */
    }
    if ((keys[k].types & 1u << (st->cur->type - 1)) == 0) {
        return fault(st, KS_ERR_UNKNOWN_FIELD, off); /* [P-SET-3] */
    }
    if (!repeats && ((st->seen >> k & 1u) != 0 ||
                     (keys[k].partner >= 0 && (st->seen >> keys[k].partner & 1u) != 0))) {
        return fault(st, KS_ERR_FIELD_ORDER, off); /* [P-SET-5] */
    }
    if ((k == KS_REGF_SERVE || k == KS_REGF_SERVE_PREFIX) && st->out->nserves == KS_REGF_SERVES_MAX) {
        return fault(st, KS_ERR_TOO_LARGE, off); /* [P-SERVE-4] */
    }
    if (k == KS_REGF_ARG &&
        (st->cur->args == KS_PLUGIN_ARGS_MAX || st->out->nargs == KS_REGF_ARGS_MAX)) {
        return fault(st, KS_ERR_TOO_LARGE, off); /* [P-PLUGIN-3] */
    }
    if ((k == KS_REGF_ENV || k == KS_REGF_ENV_PREFIX) &&
        (st->cur->envs == KS_PLUGIN_ENV_MAX || st->out->nenvs == KS_REGF_ENVS_MAX)) {
        return fault(st, KS_ERR_TOO_LARGE, off); /* [P-PLUGIN-9] */
    }
    return KS_OK;
}

/* Record an arg line of the open section [P-PLUGIN-3], in file order. */
static ks_err add_arg(regf_parse *st, ks_bytes v)
{
    ks_regf_arg *a = &st->out->args[st->out->nargs++];
    a->value = v;
    a->provider = (uint8_t)(st->cur - st->out->providers);
    st->cur->args++;
    return KS_OK;
}

/* Record an env or env-prefix line of the open section [P-PLUGIN-9], in
 * file order: the same name, or the same prefix, given twice in one
 * section is a conflict. */
static ks_err add_env(regf_parse *st, int k, ks_bytes v, size_t off)
{
    const uint8_t prefix = k == KS_REGF_ENV_PREFIX;
    const uint8_t me = (uint8_t)(st->cur - st->out->providers);
    for (size_t i = st->out->nenvs; i-- > 0 && st->out->envs[i].provider == me;) {
        const ks_regf_env *x = &st->out->envs[i];
        if (x->prefix == prefix && same_bytes(x->name, v)) {
            return fault(st, KS_ERR_CONFLICT, off); /* [P-PLUGIN-9] */
        }
    }
    ks_regf_env *x = &st->out->envs[st->out->nenvs++];
    x->name = v;
    x->prefix = prefix;
    x->provider = me;
    st->cur->envs++;
    return KS_OK;
}

/* Record a serve line of the open section [P-SERVE-1..3]: the same exact
 * key_id, or the same prefix, given twice in the file is a conflict. */
static ks_err add_serve(regf_parse *st, int k, ks_bytes v, size_t off)
{
    const uint8_t prefix = k == KS_REGF_SERVE_PREFIX;
    for (size_t i = 0; i < st->out->nserves; i++) {
        const ks_regf_serve *s = &st->out->serves[i];
        if (s->prefix == prefix && same_bytes(s->pattern, v)) {
            return fault(st, KS_ERR_CONFLICT, off); /* [P-SERVE-3] */
        }
    }
    ks_regf_serve *s = &st->out->serves[st->out->nserves++];
    s->pattern = v;
    s->prefix = prefix;
    s->provider = (uint8_t)(st->cur - st->out->providers);
    st->cur->serves++;
    return KS_OK;
}

/* A setting line, "  KEY VALUE" [P-SET-1..6]. */
static ks_err parse_setting(regf_parse *st, ks_cursor *lc)
{
    const size_t base = ks_cursor_offset(lc);
    const uint8_t *p = lc->buf + lc->pos;
    const size_t n = ks_cursor_remaining(lc);
    ks_bytes skip, key = {NULL, 0}, value = {NULL, 0};
    uint8_t sp;
    ks_err e;

    /* [P-LINE-4] leaves no line of spaces only: n >= 3 past a space. */
    assert(n >= 2 && p[0] == ' ');
    if (p[1] != ' ') {
        return fault(st, KS_ERR_BAD_VALUE, base + 1); /* [P-SET-1] */
    }
    if (p[2] == ' ') {
        return fault(st, KS_ERR_BAD_VALUE, base + 2); /* [P-SET-1] */
    }
    if (st->cur == NULL) {
        return fault(st, KS_ERR_MISSING_FIELD, base); /* [P-SET-2] */
    }
    e = ks_cursor_read_view(lc, 2, &skip);
    assert(e == KS_OK);
    size_t klen = 0;
    while (klen < n - 2 && p[2 + klen] != ' ') {
        klen++;
    }
    const size_t key_off = ks_cursor_offset(lc);
    e = ks_cursor_read_view(lc, klen, &key);
    assert(e == KS_OK);
    const int k = find_key(key);
    if ((e = check_key(st, k, key_off)) != KS_OK) {
        return e;
    }
    if (ks_cursor_read_u8(lc, &sp) != KS_OK) {
        return fault(st, KS_ERR_MISSING_FIELD, ks_cursor_offset(lc)); /* [P-SET-6] */
    }
    const size_t val_off = ks_cursor_offset(lc);
    e = ks_cursor_read_view(lc, ks_cursor_remaining(lc), &value);
    assert(e == KS_OK && value.len > 0); /* [P-LINE-4] */
    if (value.ptr[0] == ' ') {
        return fault(st, KS_ERR_BAD_VALUE, val_off); /* [P-SET-6] */
    }
    if ((e = check_value(st, k, value, val_off)) != KS_OK) {
        return e;
    }
    if (k == KS_REGF_ARG) {
        return add_arg(st, value);
    }
    if (k == KS_REGF_ENV || k == KS_REGF_ENV_PREFIX) {
        return add_env(st, k, value, val_off);
    }
    if (k == KS_REGF_SERVE || k == KS_REGF_SERVE_PREFIX) {
        return add_serve(st, k, value, val_off);
    }
    st->cur->value[k] = value;
    st->seen |= 1u << k;
    return KS_OK;
}

/* Read the next line into *lc (its LF consumed, not part of it), checking
 * its bytes [P-LINE-1..4]. */
static ks_err read_line(regf_parse *st, ks_cursor *c, ks_cursor *lc)
{
    const size_t base = ks_cursor_offset(c), avail = ks_cursor_remaining(c);
    const uint8_t *p = c->buf + c->pos;
    size_t i = 0;
    uint8_t lf;

    for (;; i++) {
        if (i == avail) {
            return fault(st, KS_ERR_TRUNCATED, base + i); /* [P-LINE-1] */
        }
        if (p[i] == '\n') {
            break;
        }
        if (i == KS_REGF_LINE_MAX) {
            return fault(st, KS_ERR_TOO_LARGE, base + i); /* [P-LINE-2] */
        }
        if (p[i] < 0x20 || p[i] > 0x7E) {
            return fault(st, KS_ERR_BAD_VALUE, base + i); /* [P-LINE-3] */
        }
    }
    if (i > 0 && p[i - 1] == ' ') {
        size_t j = i - 1;
        while (j > 0 && p[j - 1] == ' ') {
            j--;
        }
        return fault(st, KS_ERR_BAD_VALUE, base + j); /* [P-LINE-4] */
    }
    ks_err e = ks_cursor_read_sub(c, i, lc);
    assert(e == KS_OK);
    e = ks_cursor_read_u8(c, &lf);
    assert(e == KS_OK && lf == '\n');
    (void)e;
    return KS_OK;
}

/* Dispatch one line [P-LINE-5], [P-HEAD-1], [P-SECT-1]. */
static ks_err parse_line(regf_parse *st, ks_cursor *lc)
{
    const size_t n = ks_cursor_remaining(lc);
    const uint8_t first = n > 0 ? lc->buf[lc->pos] : 0;
    if (n == 0 || first == '#') {
        return KS_OK; /* [P-LINE-5] */
    }
    if (!st->have_header) {
        return parse_header(st, (ks_bytes){lc->buf + lc->pos, n}, ks_cursor_offset(lc));
    }
    return first == ' ' ? parse_setting(st, lc) : parse_provider(st, lc);
}

/* Fill *err with a rejection: code, offset, its line and column, and the
 * section it is in. */
static ks_err reject(const uint8_t *buf, size_t len, ks_err code, size_t offset, uint32_t provider,
                     ks_regf_error *err)
{
    if (err != NULL) {
        size_t line = 1, col_start = 0;
        assert(offset <= len);
        for (size_t i = 0; i < offset && i < len; i++) {
            if (buf[i] == '\n') {
                line++;
                col_start = i + 1;
            }
        }
        err->code = code;
        err->offset = offset;
        err->line = (uint32_t)line;
        err->column = (uint32_t)(offset - col_start + 1);
        err->provider = provider;
    }
    return code;
}

/* See registry_format.h. */
ks_err ks_regf_parse(const uint8_t *buf, size_t len, ks_regf_file *out, ks_regf_error *err)
{
    regf_parse st;
    ks_err e = KS_OK;

    assert(out != NULL);
    assert(buf != NULL || len == 0);
    memset(out, 0, sizeof *out);
    memset(&st, 0, sizeof st);
    st.out = out;
    if (err != NULL) {
        memset(err, 0, sizeof *err);
    }
    if (len > KS_REGF_FILE_MAX) {
        e = fault(&st, KS_ERR_TOO_LARGE, KS_REGF_FILE_MAX); /* [P-FILE-1] */
    }
    ks_cursor c = ks_cursor_init(buf, e == KS_OK ? len : 0);
    while (e == KS_OK && !ks_cursor_is_empty(&c)) {
        ks_cursor lc = {NULL, 0, 0, 0};
        if ((e = read_line(&st, &c, &lc)) == KS_OK) {
            e = parse_line(&st, &lc);
        }
    }
    if (e == KS_OK && !st.have_header) {
        e = fault(&st, KS_ERR_TRUNCATED, len); /* [P-HEAD-1] */
    }
    if (e == KS_OK) {
        e = close_section(&st, len);
    }
    if (e == KS_OK && out->nproviders == 0) {
        e = fault(&st, KS_ERR_MISSING_FIELD, len); /* [P-PROV-3] */
    }
    if (e != KS_OK) {
        memset(out, 0, sizeof *out);
        return reject(buf, len, e, st.offset, st.section, err);
    }
    return KS_OK;
}

/* ---- routing ------------------------------------------------------------------------ */

/* See registry_format.h. */
ks_err ks_regf_route(const ks_regf_file *f, ks_bytes key_id, size_t *index)
{
    size_t best = SIZE_MAX, best_len = 0;

    if (f == NULL || index == NULL || (key_id.ptr == NULL && key_id.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < f->nserves; i++) {
        const ks_regf_serve *s = &f->serves[i];
        if (!s->prefix && same_bytes(s->pattern, key_id)) {
            *index = s->provider; /* [P-ROUTE-1] exact first */
            return KS_OK;
        }
        if (s->prefix && s->pattern.len <= key_id.len && s->pattern.len > best_len &&
            memcmp(s->pattern.ptr, key_id.ptr, s->pattern.len) == 0) {
            best = s->provider; /* [P-ROUTE-2] the longest prefix */
            best_len = s->pattern.len;
        }
    }
    if (best == SIZE_MAX) {
        return KS_ERR_NOT_FOUND; /* [P-ROUTE-3] no default */
    }
    *index = best;
    return KS_OK;
}

/* ---- the canonical encoder [P-CANON-1] ----------------------------------------------- */

/* An output buffer that counts what does not fit. */
typedef struct sink {
    uint8_t *out;
    size_t cap, len;
} sink;

/* Append p[0, n) to s (as far as it fits; len counts it all). */
static void put(sink *s, const void *p, size_t n)
{
    if (n != 0 && s->len <= s->cap && n <= s->cap - s->len) {
        memcpy(s->out + s->len, p, n);
    }
    s->len += n;
}

/* Append a line "<indent><key> <value>\n" to s. */
static void put_line(sink *s, const char *indent, const char *key, ks_bytes value)
{
    put(s, indent, strlen(indent));
    put(s, key, strlen(key));
    put(s, " ", 1);
    put(s, value.ptr, value.len);
    put(s, "\n", 1);
}

/* See registry_format.h. */
ks_err ks_regf_encode(const ks_regf_file *f, uint8_t *out, size_t cap, size_t *out_len)
{
    sink s = {out, cap, 0};

    if (f == NULL || (out == NULL && cap != 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    put(&s, KS_REGF_HEADER "\n", sizeof KS_REGF_HEADER);
    for (size_t i = 0; i < f->nproviders; i++) {
        const ks_regf_provider *p = &f->providers[i];
        const char *type = ks_regf_type_name(p->type);
        put_line(&s, "", "provider", p->name);
        put_line(&s, "  ", "type", (ks_bytes){(const uint8_t *)type, strlen(type)});
        for (int k = KS_REGF_TYPE + 1; k < KS_REGF_KEY_COUNT; k++) {
            if (p->value[k].len != 0) {
                put_line(&s, "  ", keys[k].name, p->value[k]);
            }
        }
        for (size_t j = 0; j < f->nargs; j++) {
            if (f->args[j].provider == i) {
                put_line(&s, "  ", keys[KS_REGF_ARG].name, f->args[j].value);
            }
        }
        for (size_t j = 0; j < f->nenvs; j++) {
            const ks_regf_env *ev = &f->envs[j];
            if (ev->provider == i) {
                put_line(&s, "  ", ev->prefix ? "env-prefix" : "env", ev->name);
            }
        }
        for (size_t j = 0; j < f->nserves; j++) {
            const ks_regf_serve *sv = &f->serves[j];
            if (sv->provider == i) {
                put_line(&s, "  ", sv->prefix ? "serve-prefix" : "serve", sv->pattern);
            }
        }
    }
    *out_len = s.len;
    return s.len <= cap ? KS_OK : KS_ERR_BUFFER_TOO_SMALL;
}
