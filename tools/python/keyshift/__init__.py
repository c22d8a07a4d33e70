"""keyshift for Python: the application API of libkeyshift (keyshift/app.h).

Open one :class:`App` per process, seal values before they are written to
the database and open them after they are read, and close it at exit::

    import keyshift

    with keyshift.App(keyring="keyring", default_key_id="payments-kek") as app:
        env = app.seal("payments", "card", "acme", b"4111 1111 1111 1111",
                       context="payments:42:card")
        assert app.open("payments", "card", "acme", env,
                        context="payments:42:card") == b"4111 1111 1111 1111"

With ``database=`` (a SQLite file or a PostgreSQL URI) the rollout stored
there decides what each seal writes and which values each open reads, and
the instance registers itself as a reader and reports its health
(docs/embedding.md and docs/rollout.md say what each call does).

The package loads the C library with ``ctypes`` (no compiler needed):
``$KEYSHIFT_LIBRARY`` when set, else ``libkeyshift.so.0`` as the dynamic
loader finds it.  Every seal and open releases the GIL while the C library
works, so threads sharing one App run in parallel.

Errors are exceptions under :class:`Error`, one subclass per error class
of the C API: :class:`Unavailable` (retryable), :class:`Refused` (this
record or call: :class:`AuthFailed`, :class:`Malformed`,
:class:`PhaseRefused`, :class:`KeyRefused`, :class:`InvalidArgument`) and
:class:`ConfigError` (the setup).  Each carries the stable error ``name``
(``ks_err_name``), its numeric ``code`` and, for a malformed envelope, the
byte ``offset`` at which the parser rejected it.

Agent mode.  :class:`AgentClient` has the same ``seal`` and ``open`` over
the Unix socket of ``keyshift serve`` (docs/agent.md), with the standard
library only, raising the same exceptions (module ``keyshift.agent``).

Plaintext.  The C buffers that held plaintext are zeroed before a call
returns; the ``bytes`` objects Python hands in and out cannot be wiped
(they are immutable and may be copied by the interpreter), so keep them
short-lived.  Pass a ``bytearray`` as the plaintext to seal to have it
read in place, then wipe it yourself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import platform
import struct
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import _native as _n

__all__ = [
    "App",
    "AgentClient",
    "NotAuthorized",
    "BadRequest",
    "UnknownScope",
    "ValueClass",
    "Header",
    "Stats",
    "parse",
    "seal_max_len",
    "BINARY",
    "BASE64",
    "version",
    "error_name",
    "Error",
    "Unavailable",
    "Refused",
    "AuthFailed",
    "Malformed",
    "PhaseRefused",
    "KeyRefused",
    "InvalidArgument",
    "ConfigError",
    "AES_256_GCM",
    "XCHACHA20_POLY1305",
]

__version__ = "0.2.0"

#: Algorithm names, as the CLI and the envelope inspector spell them.
AES_256_GCM = "aes-256-gcm"
XCHACHA20_POLY1305 = "xchacha20-poly1305"
_ALGORITHMS = {AES_256_GCM: _n.KS_ALG_AES256GCM, XCHACHA20_POLY1305: _n.KS_ALG_XCHACHA20POLY1305}
_ALGORITHM_NAMES = {v: k for k, v in _ALGORITHMS.items()}

_Record = _n.AppRecord
_Bytes = _n.Bytes
_byref = ctypes.byref
_string_at = ctypes.string_at
_memset = ctypes.memset
_seal = _n.LIB.ks_app_seal
_open = _n.LIB.ks_app_open_value

_pack_into = struct.pack_into
_pack_record = struct.Struct("8N").pack_into  # ks_app_record: 2 pointers, 3 (pointer, size_t)


def _probe_bytes_address() -> bool:
    """True when id(b) + bytes.__basicsize__ - 1 is where a bytes object's
    data starts (CPython's PyBytesObject), checked on a live object."""
    if platform.python_implementation() != "CPython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    probe = b"keyshift: the data of a bytes object"
    return ctypes.string_at(id(probe) + bytes.__basicsize__ - 1, len(probe)) == probe


_FAST = _probe_bytes_address()
_BYTES_DATA = bytes.__basicsize__ - 1


def _addr(b: bytes) -> int:
    """The address of b's data (CPython; valid while b is alive)."""
    return id(b) + _BYTES_DATA


_unpack_from = struct.unpack_from
_ITEM_SIZE = ctypes.sizeof(_n.AppItem)
_ITEM_OUT_LEN = _n.AppItem.out_len.offset
assert _n.AppItem.err.offset == _ITEM_OUT_LEN + 8 and _n.AppItem.out_len.offset == 80


#: Zeros that wipe a thread's output buffer through its memoryview (no
#: foreign call, no allocation up to this size).
_ZEROS = memoryview(bytes(65536))


def _zeros(m: int) -> Union[bytes, memoryview]:
    """m zero bytes, to assign over a slice of a buffer's memoryview."""
    return _ZEROS[:m] if m <= 65536 else bytes(m)


class _ThreadState:
    """One thread's output buffer (and a memoryview of it, through which a
    result is copied out and the buffer wiped without a foreign call), its
    size, out-parameters and record, with their byref()s made once.  The
    arguments of ks_app_seal and ks_app_open_value are ctypes objects made
    here (_native: those two take no argument conversion): ``size`` and
    ``in_len`` are the C size_t of the buffer and of the input."""

    __slots__ = ("buf", "view", "cap", "size", "in_len", "n", "cls", "perr", "rec", "n_ref",
                 "cls_ref", "perr_ref", "rec_ref")

    def __init__(self, cap: int) -> None:
        self.buf = ctypes.create_string_buffer(cap)
        self.view = memoryview(self.buf).cast("B")
        self.cap = cap
        self.size = ctypes.c_size_t(cap)
        self.in_len = ctypes.c_size_t()
        self.n = ctypes.c_size_t()
        self.cls = _n.RolloutClass()
        self.perr = _n.ParseError()
        self.rec = ctypes.create_string_buffer(ctypes.sizeof(_n.AppRecord))
        self.n_ref = ctypes.byref(self.n)
        self.cls_ref = ctypes.byref(self.cls)
        self.perr_ref = ctypes.byref(self.perr)
        self.rec_ref = ctypes.byref(self.rec)


Text = Union[str, bytes]
Buffer = Union[bytes, bytearray, memoryview]

# ---- errors ----------------------------------------------------------------


class Error(Exception):
    """Every failure of the library: its stable ``name`` (e.g.
    ``"auth-failed"``), numeric ``code``, error class (``"retryable"``,
    ``"refused"`` or ``"configuration"``) and, for an envelope the parser
    rejected, the byte ``offset`` (else None).  ``retryable`` is True for
    the class whose same call may succeed later."""

    retryable = False

    def __init__(self, name: str, offset: Optional[int] = None, message: Optional[str] = None,
                 code: int = 0, error_class: str = "configuration") -> None:
        self.name = name
        self.offset = offset
        self.code = code
        self.error_class = error_class
        self.message = message or name
        text = self.message if self.message.startswith(name) else "%s: %s" % (name, self.message)
        if offset is not None:
            text += " (at byte %d)" % offset
        super().__init__(text)


class Unavailable(Error):
    """Retryable: a key provider or the database is unavailable, timed out
    or busy, or memory ran out.  The same call may succeed later."""

    retryable = True


class Refused(Error):
    """This record or call is refused; retrying it will not help."""


class AuthFailed(Refused):
    """The envelope did not open: wrong key, context, tenant or purpose, or
    tampering (one error for every cause)."""


class Malformed(Refused):
    """The envelope is not in the canonical form (``offset`` says where)."""


class PhaseRefused(Refused):
    """The rollout's current phase does not read a value of this class."""


class KeyRefused(Refused):
    """The key version is disabled (``denied``), destroyed (``revoked``)
    or unknown (``not-found``)."""


class InvalidArgument(Refused, ValueError):
    """An argument is wrong (e.g. a tenant outside [A-Za-z0-9._:-] or over
    64 bytes, a context over 4096 bytes)."""


class ConfigError(Error):
    """The setup is wrong (keyring, providers, database, options, an
    algorithm the CPU lacks, no rollout and no default key): fix it and
    open the App again."""


_CLASS_NAMES = {1: "retryable", 2: "refused", 3: "configuration"}
_REFUSED_BY_NAME = {
    "auth-failed": AuthFailed,
    "phase": PhaseRefused,
    "denied": KeyRefused,
    "revoked": KeyRefused,
    "not-found": KeyRefused,
    "invalid-argument": InvalidArgument,
    "buffer-too-small": InvalidArgument,
}


def error_name(code: int) -> str:
    """The stable name of a C error code (``ks_err_name``)."""
    return _n.LIB.ks_err_name(code).decode()


def _error(code: int, offset: Optional[int] = None, message: Optional[str] = None) -> Error:
    """The exception for C error code ``code``: its class from
    ``ks_err_class``, then the subclass by name."""
    name = error_name(code)
    class_name = _CLASS_NAMES.get(_n.LIB.ks_err_class(code), "configuration")
    cls = _error_type(name, class_name, 1 <= code <= 31)
    if cls is not Malformed:
        offset = None
    return cls(name, offset, message, code, class_name)


def _error_type(name: str, class_name: str, malformed: bool) -> type:
    """The exception class of an error named ``name`` (``ks_err_name``) in
    class ``class_name`` (``ks_error_class_name``); ``malformed`` says it is
    a parse rejection of an envelope.  The one mapping of the library's
    errors, for :class:`App` and :class:`AgentClient` alike."""
    if class_name == "retryable":
        return Unavailable
    if class_name == "refused":
        return Malformed if malformed else _REFUSED_BY_NAME.get(name, Refused)
    return ConfigError


# ---- values ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ValueClass:
    """What a value is: plaintext, or an envelope's format, algorithm and
    key version (a rollout's class)."""

    plaintext: bool
    version: int = 0
    algorithm: Optional[str] = None
    key_id: Optional[str] = None
    key_version: int = 0


def _value_class(c: _n.RolloutClass) -> ValueClass:
    if c.is_plaintext:
        return ValueClass(True)
    return ValueClass(False, c.version, _ALGORITHM_NAMES.get(c.algorithm, str(c.algorithm)),
                      c.key_id.decode(), c.key_version)


@dataclasses.dataclass(frozen=True)
class Header:
    """An envelope's header (:func:`parse`).  ``spans`` maps each field
    (tenant, key_id, wrapped_dek, nonce, purpose, commitment, ciphertext) to
    its ``(offset, length)`` in the envelope; ``(0, 0)`` for a field the
    envelope does not have."""

    version: int
    algorithm: str
    key_id: str
    key_version: int
    tenant: str
    purpose: Optional[str]
    header_len: int
    total_len: int
    spans: Dict[str, Tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Stats:
    """The background thread's counters (:meth:`App.stats`)."""

    heartbeats: int
    heartbeat_errors: int
    reports: int
    report_errors: int
    key_reloads: int
    reload_errors: int
    last_error: Optional[str]
    key_changes: int


def _text(value: Optional[Text], what: str) -> bytes:
    """value as bytes (a str in UTF-8); None as empty."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError("keyshift: %s must be str or bytes, not %s" % (what, type(value).__name__))


def _cstr(value: Optional[Text], what: str) -> Optional[bytes]:
    """value as a C string, None stays None; a NUL inside is refused."""
    if value is None:
        return None
    b = _text(value, what)
    if b"\0" in b:
        raise InvalidArgument("invalid-argument", None, "%s must not contain a NUL byte" % what,
                              32, "refused")
    return b


def _in(buf: Buffer) -> Tuple[object, int]:
    """A pointer argument for buf, without a copy for bytes and bytearray."""
    if isinstance(buf, bytes):
        return buf, len(buf)
    if isinstance(buf, bytearray):
        n = len(buf)
        return ((ctypes.c_char * n).from_buffer(buf) if n else None), n
    if isinstance(buf, memoryview):
        b = buf.tobytes()
        return b, len(b)
    raise TypeError("keyshift: expected bytes, bytearray or memoryview, not %s" % type(buf).__name__)


def _set_bytes(view: _n.Bytes, b: bytes) -> None:
    """Point a ks_bytes at b (empty: NULL, 0)."""
    if b:
        view.ptr = b
        view.len = len(b)


def _algorithm(value: Union[None, int, str]) -> int:
    if value is None or value == 0:
        return 0
    if isinstance(value, str):
        try:
            return _ALGORITHMS[value]
        except KeyError:
            raise InvalidArgument("invalid-argument", None,
                                  "algorithm must be %s or %s, not %r"
                                  % (AES_256_GCM, XCHACHA20_POLY1305, value), 32, "refused") from None
    return int(value)


def _encodings() -> Dict[str, int]:
    """The encodings by name, as the C library names them
    (``ks_value_encoding_name``)."""
    out: Dict[str, int] = {}
    while _n.LIB.ks_value_encoding_name(len(out)) is not None:
        out[_n.LIB.ks_value_encoding_name(len(out)).decode()] = len(out)
    return out


_ENCODINGS = _encodings()
BINARY = "binary"
BASE64 = "base64"


def _encoding(value: str) -> int:
    try:
        return _ENCODINGS[value]
    except (KeyError, TypeError):
        raise InvalidArgument("invalid-argument", None,
                              "default_encoding must be %s or %s, not %r"
                              % (BINARY, BASE64, value), 32, "refused") from None


def seal_max_len(pt_len: int) -> int:
    """An upper bound on the length of a sealed value of pt_len bytes; 0
    past the format's limits."""
    return _n.LIB.ks_app_seal_max_len(pt_len)


def version() -> str:
    """The C library's version (``ks_version``)."""
    return _n.LIB.ks_version().decode()


def parse(envelope: Buffer) -> Header:
    """Parse an envelope strictly, without keys: its header fields and
    where each lies.  Raises :class:`Malformed` (with ``offset``) for an
    envelope not in the canonical form."""
    buf, n = _in(envelope)
    hdr = _n.AppHeader()
    perr = _n.ParseError()
    e = _n.LIB.ks_app_parse(buf, n, ctypes.byref(hdr), ctypes.byref(perr))
    if e != _n.KS_OK:
        raise _error(e, perr.offset)
    raw = envelope if isinstance(envelope, bytes) else bytes(envelope)
    spans = {name: (getattr(hdr, name).offset, getattr(hdr, name).len) for name in _n.SPAN_NAMES}

    def field(name: str) -> bytes:
        off, ln = spans[name]
        return raw[off:off + ln]

    return Header(
        version=hdr.version,
        algorithm=_ALGORITHM_NAMES.get(hdr.algorithm, str(hdr.algorithm)),
        key_id=field("key_id").decode(),
        key_version=hdr.key_version,
        tenant=field("tenant").decode(),
        purpose=field("purpose").decode() if hdr.version >= 2 else None,
        header_len=hdr.header_len,
        total_len=hdr.total_len,
        spans=spans,
    )


# ---- the application -------------------------------------------------------


class App:
    """One application's keys and, with a database, its part in a rollout
    (``ks_app``).  Use it as a context manager, or call :meth:`close`.

    Keys: at most one of ``keyring`` (a keyring file, with ``passphrase``
    when it is sealed) and ``providers`` (a provider registry file); with
    neither, ``$KEYSHIFT_PROVIDERS``, else ``$KEYSHIFT_KEYRING`` with
    ``$KEYSHIFT_PASSPHRASE``.

    ``passphrase`` (str or bytes) is zeroed in the buffer handed to C once
    the App is open; the Python object given cannot be.

    ``database``: a SQLite file (which must exist) or a ``postgresql://``
    URI holding the rollout state (its password in ``PGPASSFILE`` or
    ``PGPASSWORD``, never in the URI); ``instance_id`` (1..128 bytes of
    ``[A-Za-z0-9._:-]``) is then required.  ``max_format``, ``algorithms``
    (a sequence of algorithm names) and ``keys`` (``"kek:1,kek:2"``) are
    what this instance registers that it reads (defaults: format 2, every
    algorithm the CPU runs, every version the keys list).
    ``interval_ms`` is the heartbeat, health report and keyring reload
    period, and the policy's refresh period (default 0: the first three
    every 5 s, the refresh every 500 ms).  ``default_key_id`` (with ``default_key_version``,
    ``default_format`` and ``default_algorithm``) is what to seal where no
    rollout governs the column; ``purpose`` is the format-2 purpose when a
    call names none (default: the column's name).  ``default_encoding``
    (``"binary"``, the default, or ``"base64"``) is how columns that no
    rollout covers hold envelopes; a column a rollout covers is in the
    rollout's encoding, and :meth:`seal` and :meth:`open` work in the
    column's encoding (:meth:`column_encoding`).

    One App may be used from any number of threads at once.  :meth:`close`
    waits for the calls under way, then closes; later calls raise
    :class:`ConfigError`.  A child process after ``fork()`` must open an
    App of its own.

    Raises the :class:`Error` for what went wrong, its message saying what
    to do.
    """

    def __init__(self, *, keyring: Optional[str] = None, passphrase: Optional[Text] = None,
                 providers: Optional[str] = None, database: Optional[str] = None,
                 instance_id: Optional[str] = None, max_format: int = 0,
                 algorithms: Optional[Sequence[str]] = None, keys: Optional[str] = None,
                 interval_ms: int = 0, default_key_id: Optional[str] = None,
                 default_key_version: int = 0, default_format: int = 0,
                 default_algorithm: Union[None, int, str] = None,
                 purpose: Optional[str] = None, default_encoding: str = BINARY) -> None:
        self._app = None
        for name, value, top in (("max_format", max_format, 0xFF),
                                 ("default_format", default_format, 0xFF),
                                 ("interval_ms", interval_ms, 0xFFFFFFFF),
                                 ("default_key_version", default_key_version, 0xFFFFFFFF)):
            if not isinstance(value, int) or not 0 <= value <= top:
                raise InvalidArgument("invalid-argument", None,
                                      "%s must be an integer from 0 to %d, not %r"
                                      % (name, top, value), 32, "refused")
        o = _n.AppOptions()
        o.keyring = _cstr(keyring, "keyring")
        o.providers = _cstr(providers, "providers")
        o.database = _cstr(database, "database")
        o.instance_id = _cstr(instance_id, "instance_id")
        o.max_format = max_format
        bits = 0
        for a in algorithms or ():
            bits |= 1 << _algorithm(a)
        o.algorithms = bits
        o.keys = _cstr(keys, "keys")
        o.interval_ms = interval_ms
        o.default_key_id = _cstr(default_key_id, "default_key_id")
        o.default_key_version = default_key_version
        o.default_format = default_format
        o.default_algorithm = _algorithm(default_algorithm)
        o.purpose = _cstr(purpose, "purpose")
        o.default_encoding = _encoding(default_encoding)
        pw = None
        if passphrase is not None:
            pw = ctypes.create_string_buffer(_text(passphrase, "passphrase"))
            o.passphrase.ptr = ctypes.cast(pw, ctypes.c_char_p)
            o.passphrase.len = len(pw) - 1
        handle = ctypes.c_void_p()
        msg = ctypes.create_string_buffer(512)
        try:
            e = _n.LIB.ks_app_open(ctypes.byref(o), ctypes.byref(handle), msg, len(msg))
        finally:
            if pw is not None:
                ctypes.memset(pw, 0, len(pw))
        if e != _n.KS_OK:
            raise _error(e, None, msg.value.decode(errors="replace") or None)
        self._calls: List[None] = []
        self._closed = False
        self._close_lock = threading.Lock()
        self._tls = threading.local()
        self._names: Dict[Tuple[str, str], Tuple[Optional[bytes], Optional[bytes]]] = {}
        self._handle = handle  # the c_void_p every call passes
        self._app = handle.value

    # -- lifetime --

    def __enter__(self) -> "App":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_app", None):
            self.close()

    def close(self) -> None:
        """Wait for the calls under way, stop the background thread (a last
        health report, the instance deregistered), wipe the keys and free.
        A second close does nothing."""
        if not self._app:
            return
        with self._close_lock:
            self._closed = True
            while self._calls:
                time.sleep(0.001)
            app, self._app = self._app, None
        if app:
            _n.LIB.ks_app_close(app)

    def _enter(self) -> ctypes.c_void_p:
        """Count a call under way (list.append and pop are atomic: no lock
        on the hot path); the handle, as a c_void_p.  The caller pops when
        done."""
        self._calls.append(None)
        if self._closed or not self._app:
            self._calls.pop()
            raise ConfigError("invalid-argument", None, "the App is closed: open a new one",
                              32, "configuration")
        return self._handle

    def _state(self, cap: int = 0) -> "_ThreadState":
        """This thread's buffers, at least cap bytes of output (reused
        across calls: no output buffer is made per call; a buffer outgrown
        is wiped)."""
        st = getattr(self._tls, "st", None)
        if st is None or st.cap < cap:
            if st is not None:
                st.view[:] = _zeros(st.cap)
            st = _ThreadState(max(cap, 4096))
            self._tls.st = st
        return st

    def _record(self, st: "_ThreadState", table: str, column: str, tenant: Optional[Text],
                context: Optional[Text], purpose: Optional[Text]):
        """A pointer to the ks_app_record of a call, and the objects it
        points into (which the caller keeps alive until the call returns).
        On CPython the record is this thread's 64 bytes, written with
        struct.pack_into from the addresses of the bytes objects' data
        (checked at import; a ctypes structure elsewhere)."""
        names = self._names.get((table, column))
        if names is None:
            tb, cb = _cstr(table, "table"), _cstr(column, "column")
            names = (tb, cb, _addr(tb) if tb is not None and cb is not None and _FAST else 0,
                     _addr(cb) if cb is not None and tb is not None and _FAST else 0)
            if len(self._names) < 1024:
                self._names[(table, column)] = names
        # The common types first, inline (each function call costs ~50 ns).
        t = tenant if type(tenant) is bytes else tenant.encode() if type(tenant) is str \
            else _text(tenant, "tenant")
        c = context if type(context) is bytes else context.encode() if type(context) is str \
            else _text(context, "context")
        p = b"" if purpose is None else purpose if type(purpose) is bytes \
            else _text(purpose, "purpose")
        if _FAST and names[2]:
            _pack_record(st.rec, 0, names[2], names[3], id(t) + _BYTES_DATA, len(t),
                         id(c) + _BYTES_DATA, len(c), id(p) + _BYTES_DATA, len(p))
            return st.rec_ref, (names, t, c, p)  # all alive until the call returns
        r = _Record(names[0], names[1], _Bytes(t or None, len(t)), _Bytes(c or None, len(c)),
                    _Bytes(p or None, len(p)))
        return _byref(r), r

    # -- sealing and opening --

    def seal(self, table: str, column: str, tenant: Text, plaintext: Buffer, *,
             context: Optional[Text] = None, purpose: Optional[Text] = None) -> bytes:
        """Seal plaintext for the value of ``table.column`` belonging to
        ``tenant``, bound to ``context`` (bytes the reader rebuilds from
        trusted data, e.g. ``"payments:42:card"``) and, in format 2,
        ``purpose`` (default: the App's, else the column's name).  Returns
        the value to store: an envelope of the class the rollout says to
        write (the default key where none governs), or the plaintext itself
        while a rollout from plaintext has not reached write-upgrade.  The
        GIL is released during the call."""
        # Sealed into this thread's buffer (grown, then retried, when the
        # value does not fit); this thread's class is the one written,
        # which seal_class reads.  The body of every seal: no layer between.
        pt, n = (plaintext, len(plaintext)) if type(plaintext) is bytes else _in(plaintext)
        st = getattr(self._tls, "st", None) or self._state()
        r, keep = self._record(st, table, column, tenant, context, purpose)
        app = self._enter()
        try:
            st.in_len.value = n
            e = _seal(app, r, pt, st.in_len, st.buf, st.size, st.n_ref, st.cls_ref)
            if e == _n.KS_ERR_BUFFER_TOO_SMALL:
                cap = _n.LIB.ks_app_seal_max_len(n)
                if cap > st.cap:
                    st = self._state(cap)
                    r, keep = self._record(st, table, column, tenant, context, purpose)
                    st.in_len.value = n
                    e = _seal(app, r, pt, st.in_len, st.buf, st.size, st.n_ref, st.cls_ref)
            if e != 0:
                raise _error(e)
            m = st.n.value
            value = st.view[:m].tobytes()
            if st.cls.is_plaintext:
                st.view[:m] = _zeros(m)
            return value
        finally:
            self._calls.pop()

    def seal_class(self, table: str, column: str, tenant: Text, plaintext: Buffer, *,
                   context: Optional[Text] = None,
                   purpose: Optional[Text] = None) -> Tuple[bytes, ValueClass]:
        """As :meth:`seal`, also returning the class written."""
        value = self.seal(table, column, tenant, plaintext, context=context, purpose=purpose)
        return value, _value_class(self._tls.st.cls)  # this thread's: the seal's

    def open(self, table: str, column: str, tenant: Optional[Text], value: Buffer, *,
             context: Optional[Text] = None, purpose: Optional[Text] = None) -> bytes:
        """Open a stored value of ``table.column``: check that the rollout's
        phase reads its class, then open it, requiring its tenant to be
        ``tenant`` (None or empty: any), its context ``context`` and, in
        format 2, its purpose ``purpose`` (default: the App's, else the
        column's name).  A plaintext value the phase reads is returned as
        it is.  Raises :class:`AuthFailed`, :class:`Malformed`,
        :class:`PhaseRefused`, ...; no unauthenticated plaintext is ever
        returned.  The GIL is released during the call.  The C buffer the
        plaintext was opened into is zeroed before this returns; the
        ``bytes`` returned cannot be wiped (drop it soon)."""
        # Opened into this thread's buffer, then wiped; this thread's class
        # is the one read, which open_class reads.
        v, n = (value, len(value)) if type(value) is bytes else _in(value)
        st = getattr(self._tls, "st", None)
        if st is None or st.cap < n:
            st = self._state(n)
        r, keep = self._record(st, table, column, tenant, context, purpose)
        app = self._enter()
        try:
            st.in_len.value = n
            e = _open(app, r, v, st.in_len, st.buf, st.size, st.n_ref, st.cls_ref, st.perr_ref)
            if e != 0:
                raise _error(e, st.perr.offset)
            m = st.n.value
            pt = st.view[:m].tobytes()
            st.view[:m] = _zeros(m)  # wiped: the copy in pt is the caller's
            return pt
        finally:
            self._calls.pop()

    def open_class(self, table: str, column: str, tenant: Optional[Text], value: Buffer, *,
                   context: Optional[Text] = None,
                   purpose: Optional[Text] = None) -> Tuple[bytes, ValueClass]:
        """As :meth:`open`, also returning the class read."""
        pt = self.open(table, column, tenant, value, context=context, purpose=purpose)
        return pt, _value_class(self._tls.st.cls)  # this thread's: the open's

    def _batch(self, fn, table: str, column: str, items, slack: int, wipe: bool):
        """Run fn (ks_app_seal_batch or ks_app_open_batch) over items, each
        given len(input) + slack bytes of one output buffer; the outputs
        or errors in order, and the indexes that met buffer-too-small.  On
        CPython the ks_app_item array is packed with struct.pack_into (as
        the record of a single call); elsewhere it is a ctypes array."""
        count = len(items)
        outbuf = ctypes.create_string_buffer(max(sum(len(d) + slack for _, _, d in items), 1))
        base = ctypes.addressof(outbuf)
        keep = []
        if _FAST:
            arr = ctypes.create_string_buffer(_ITEM_SIZE * max(count, 1))
        else:
            arr = (_n.AppItem * max(count, 1))()
        pos = 0
        for i, (tenant, context, data) in enumerate(items):
            t = tenant if type(tenant) is bytes else _text(tenant, "tenant")
            c = context if type(context) is bytes else _text(context, "context")
            d, n = _in(data)
            keep.append((t, c, d, n))
            cap = n + slack
            if _FAST:
                da = 0 if not n else _addr(d) if type(d) is bytes else ctypes.addressof(d)
                _pack_into("10N", arr, i * _ITEM_SIZE, _addr(t), len(t), _addr(c), len(c), 0, 0,
                           da, n, base + pos, cap)
            else:
                it = arr[i]
                _set_bytes(it.tenant, t)
                _set_bytes(it.context, c)
                if n:
                    it.in_.ptr = d if type(d) is bytes else ctypes.cast(d, ctypes.c_char_p)
                    it.in_.len = n
                it.out = base + pos
                it.cap = cap
            pos += cap
        app = self._enter()
        try:
            fn(app, _cstr(table, "table"), _cstr(column, "column"), arr, count)
        finally:
            self._calls.pop()
        results: List[Union[bytes, Error]] = []
        retry = []
        pos = 0
        for i in range(count):
            if _FAST:
                out_len, err = _unpack_from("Ni", arr, i * _ITEM_SIZE + _ITEM_OUT_LEN)
            else:
                out_len, err = arr[i].out_len, arr[i].err
            if err == 0:
                results.append(_string_at(base + pos, out_len))
            else:
                results.append(_error(err))
                if err == _n.KS_ERR_BUFFER_TOO_SMALL:
                    retry.append(i)
            pos += keep[i][3] + slack
        if wipe:
            _memset(outbuf, 0, len(outbuf))
        return results, retry

    def seal_batch(self, table: str, column: str,
                   items: Sequence[Tuple[Text, Optional[Text], Buffer]]) -> List[Union[bytes, Error]]:
        """Seal many values of one column in one call into the C library
        (``ks_app_seal_batch``): items are ``(tenant, context, plaintext)``;
        the result has, in order, each value or the :class:`Error` that
        item met (one failure does not stop the others).  The GIL is
        released during the call."""
        longest = max((len(d) for _, _, d in items), default=0)
        slack = max(_n.LIB.ks_app_seal_max_len(longest) - longest, 0)
        results, retry = self._batch(_n.LIB.ks_app_seal_batch, table, column, items, slack, False)
        for i in retry:  # an output bound that did not hold for a shorter item
            try:
                results[i] = self.seal(table, column, items[i][0], items[i][2], context=items[i][1])
            except Error as e:
                results[i] = e
        return results

    def open_batch(self, table: str, column: str,
                   items: Sequence[Tuple[Optional[Text], Optional[Text], Buffer]]) -> List[Union[bytes, Error]]:
        """Open many values of one column in one call
        (``ks_app_open_batch``): items are ``(tenant, context, value)``;
        the result has each plaintext or the :class:`Error` that item met.
        The C buffer that held the plaintexts is zeroed before returning."""
        return self._batch(_n.LIB.ks_app_open_batch, table, column, items, 0, True)[0]

    # -- the background thread --

    def stats(self) -> Stats:
        """What the background thread did so far."""
        s = _n.AppStats()
        app = self._enter()
        try:
            _n.LIB.ks_app_stats_get(app, ctypes.byref(s))
        finally:
            self._calls.pop()
        return Stats(s.heartbeats, s.heartbeat_errors, s.reports, s.report_errors, s.key_reloads,
                     s.reload_errors, error_name(s.last_error) if s.last_error else None,
                     s.key_changes)

    def keys(self) -> str:
        """The key versions registered, e.g. ``"payments-kek:1,payments-kek:2"``."""
        buf = ctypes.create_string_buffer(_n.KS_READER_KEYS_MAX + 1)
        app = self._enter()
        try:
            e = _n.LIB.ks_app_keys(app, buf, len(buf))
        finally:
            self._calls.pop()
        if e != _n.KS_OK:
            raise _error(e)
        return buf.value.decode()

    # -- columns --

    def column_encoding(self, table: str, column: str) -> str:
        """How ``table.column`` holds envelopes, ``"binary"`` or
        ``"base64"`` (``ks_app_column_encoding``): the encoding recorded
        with the latest rollout covering the column, else the App's
        ``default_encoding``.  :meth:`seal` writes and :meth:`open` reads
        that form."""
        enc = ctypes.c_int(0)
        t, c = _cstr(table, "table"), _cstr(column, "column")
        app = self._enter()
        try:
            e = _n.LIB.ks_app_column_encoding(app, t, c, ctypes.byref(enc))
        finally:
            self._calls.pop()
        if e != _n.KS_OK:
            raise _error(e)
        return _n.LIB.ks_value_encoding_name(enc.value).decode()


from .agent import AgentClient, BadRequest, NotAuthorized, UnknownScope  # noqa: E402
