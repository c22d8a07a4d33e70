"""The C library and its structures, mirrored for ctypes (include/keyshift/app.h).

Every structure here has the field order and types of its C declaration;
tools/python/tests/test_keyshift.py checks every field's offset and every
size against what a C program including the header prints.  Nothing here
is public: keyshift/__init__.py is the API.

The library is loaded with ``ctypes.CDLL``, whose foreign calls release the
GIL for their duration (``ctypes.PyDLL`` would hold it): a seal or an open
in one thread lets every other Python thread run.
"""

import ctypes
import ctypes.util
import os

# Limits of the C headers (keyshift/envelope.h, aad.h, rollout.h).
KS_TENANT_MAX = 64
KS_PURPOSE_MAX = 64
KS_CONTEXT_MAX = 4096
KS_KEY_ID_MAX = 256
KS_INSTANCE_ID_MAX = 128
KS_READER_KEYS_MAX = 4096

KS_FORMAT_V1 = 1
KS_FORMAT_V2 = 2
KS_ALG_AES256GCM = 1
KS_ALG_XCHACHA20POLY1305 = 2

KS_OK = 0
KS_ERR_BUFFER_TOO_SMALL = 33


class Bytes(ctypes.Structure):
    """ks_bytes: a borrowed view (the bytes object assigned to ptr is kept
    alive by the structure)."""

    _fields_ = [("ptr", ctypes.c_char_p), ("len", ctypes.c_size_t)]


class AppOptions(ctypes.Structure):
    """ks_app_options."""

    _fields_ = [
        ("provider", ctypes.c_void_p),
        ("providers", ctypes.c_char_p),
        ("keyring", ctypes.c_char_p),
        ("passphrase", Bytes),
        ("ctx_config", ctypes.c_void_p),
        ("database", ctypes.c_char_p),
        ("instance_id", ctypes.c_char_p),
        ("max_format", ctypes.c_uint8),
        ("algorithms", ctypes.c_uint32),
        ("keys", ctypes.c_char_p),
        ("interval_ms", ctypes.c_uint32),
        ("default_key_id", ctypes.c_char_p),
        ("default_key_version", ctypes.c_uint32),
        ("default_format", ctypes.c_uint8),
        ("default_algorithm", ctypes.c_uint32),
        ("purpose", ctypes.c_char_p),
        ("default_encoding", ctypes.c_int),
    ]


class AppRecord(ctypes.Structure):
    """ks_app_record."""

    _fields_ = [
        ("table", ctypes.c_char_p),
        ("column", ctypes.c_char_p),
        ("tenant", Bytes),
        ("context", Bytes),
        ("purpose", Bytes),
    ]


class RolloutClass(ctypes.Structure):
    """ks_rollout_class."""

    _fields_ = [
        ("is_plaintext", ctypes.c_int),
        ("version", ctypes.c_uint8),
        ("algorithm", ctypes.c_uint32),
        ("key_id", ctypes.c_char * (KS_KEY_ID_MAX + 1)),
        ("key_version", ctypes.c_uint32),
    ]


class ParseError(ctypes.Structure):
    """ks_parse_error."""

    _fields_ = [("code", ctypes.c_int), ("offset", ctypes.c_size_t), ("field", ctypes.c_uint32)]


class AppItem(ctypes.Structure):
    """ks_app_item."""

    _fields_ = [
        ("tenant", Bytes),
        ("context", Bytes),
        ("purpose", Bytes),
        ("in_", Bytes),
        ("out", ctypes.c_void_p),
        ("cap", ctypes.c_size_t),
        ("out_len", ctypes.c_size_t),
        ("err", ctypes.c_int),
        ("cls", RolloutClass),
    ]


class AppSpan(ctypes.Structure):
    """ks_app_span."""

    _fields_ = [("offset", ctypes.c_size_t), ("len", ctypes.c_size_t)]


SPAN_NAMES = ("tenant", "key_id", "wrapped_dek", "nonce", "purpose", "commitment", "ciphertext")


class AppHeader(ctypes.Structure):
    """ks_app_header."""

    _fields_ = [
        ("version", ctypes.c_uint8),
        ("algorithm", ctypes.c_uint32),
        ("key_version", ctypes.c_uint32),
    ] + [(n, AppSpan) for n in SPAN_NAMES] + [
        ("header_len", ctypes.c_size_t),
        ("total_len", ctypes.c_size_t),
    ]


class AppStats(ctypes.Structure):
    """ks_app_stats."""

    _fields_ = [
        ("heartbeats", ctypes.c_uint64),
        ("heartbeat_errors", ctypes.c_uint64),
        ("reports", ctypes.c_uint64),
        ("report_errors", ctypes.c_uint64),
        ("key_reloads", ctypes.c_uint64),
        ("reload_errors", ctypes.c_uint64),
        ("last_error", ctypes.c_int),
        ("key_changes", ctypes.c_uint64),
    ]


def _library_path():
    """KEYSHIFT_LIBRARY when set; else the library `make install` put
    beside this package (its LIBDIR, written into _libdir.py at install);
    else what the dynamic loader finds."""
    env = os.environ.get("KEYSHIFT_LIBRARY")
    if env:
        return env
    try:
        from ._libdir import LIBDIR  # written by make install
    except ImportError:
        LIBDIR = None
    if LIBDIR and os.path.exists(os.path.join(LIBDIR, "libkeyshift.so.0")):
        return os.path.join(LIBDIR, "libkeyshift.so.0")
    return ctypes.util.find_library("keyshift") or "libkeyshift.so.0"


def _load():
    """Load the library and declare the functions the package calls.

    Pointer arguments are declared c_void_p, which accepts a bytes object
    (passed without a copy), a ctypes array, byref() or an address.

    ks_app_seal and ks_app_open_value, called once per seal and open, get
    a result type and no argument types: ctypes then converts nothing
    (converting nine declared arguments costs as much as the foreign call
    itself or more), so every argument must already be a ctypes object of
    the C type (c_void_p, c_size_t, byref(), an array), a bytes object or
    None -- a Python int would be passed as a C int.  App.seal and
    App.open are their only callers (docs/PERFORMANCE.md, "The Python
    package against pyca/cryptography", has the figures).
    """
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise ImportError(
            "keyshift: cannot load the C library %r (%s); install libkeyshift "
            "(make install) or set KEYSHIFT_LIBRARY to its path" % (path, exc)
        ) from exc
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "ks_version": (ctypes.c_char_p, []),
        "ks_err_name": (ctypes.c_char_p, [i]),
        "ks_err_class": (i, [i]),
        "ks_error_class_name": (ctypes.c_char_p, [i]),
        "ks_app_open": (i, [vp, vp, vp, sz]),
        "ks_app_close": (None, [vp]),
        "ks_app_seal_max_len": (sz, [sz]),
        "ks_app_seal": (i, None),
        "ks_app_open_value": (i, None),
        "ks_app_seal_batch": (i, [vp, ctypes.c_char_p, ctypes.c_char_p, vp, sz]),
        "ks_app_open_batch": (i, [vp, ctypes.c_char_p, ctypes.c_char_p, vp, sz]),
        "ks_app_parse": (i, [vp, sz, vp, vp]),
        "ks_app_stats_get": (None, [vp, vp]),
        "ks_app_keys": (i, [vp, vp, sz]),
        "ks_app_column_encoding": (i, [vp, ctypes.c_char_p, ctypes.c_char_p, vp]),
        "ks_value_encoding_name": (ctypes.c_char_p, [i]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib, path


LIB, LIB_PATH = _load()


def releases_gil(fn=None):
    """True when the library's foreign calls release the GIL (CDLL without
    FUNCFLAG_PYTHONAPI), which is what lets seal and open run in parallel."""
    fn = fn if fn is not None else LIB.ks_app_seal
    return not (fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI)
