"""The client of ``keyshift serve``, the local encryption agent
(docs/agent.md): :class:`AgentClient` seals and opens with the signatures
of :meth:`keyshift.App.seal` and :meth:`keyshift.App.open`, over the
agent's Unix socket with HTTP/1.1 and JSON (batches in the agent's batch
frame, docs/agent.md section 4a), using the standard library only
(``http.client`` over an ``AF_UNIX`` socket, ``json``, ``base64``,
``struct``).

Its errors are the package's exceptions, chosen by the agent's ``error``
name and ``class`` exactly as :class:`keyshift.App` chooses them by the C
error code (:class:`AuthFailed`, :class:`Malformed` with its ``offset``,
:class:`Unavailable`, ...), and for the agent's own refusals
:class:`NotAuthorized` (403), :class:`UnknownScope` (404) and
:class:`BadRequest` (400, 404, 405, 413).  Each also carries the HTTP
``status`` and the request ``member`` at fault.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import struct
import threading
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import Error, Refused, Unavailable, ValueClass, _error_type

Text = Union[str, bytes]
Buffer = Union[bytes, bytearray, memoryview]


class NotAuthorized(Refused):
    """The agent's policy does not allow this peer the operation on this
    scope and tenant (403 ``not-authorized``, docs/agent-policy.md)."""


class BadRequest(Refused):
    """The agent refused the request itself (400, 404, 405 or 413: a
    member out of [AG-REQ-2..8], an unknown endpoint, too large)."""


class UnknownScope(BadRequest):
    """The agent does not serve this scope (404 ``unknown-scope``: its
    ``--scope`` options)."""


# The media type of the batch frame [AG-BIN-1].
FRAME_TYPE = "application/vnd.keyshift.batch"


def _bytes(b: Union[Text, Buffer, None]) -> bytes:
    """``b`` as bytes (text as UTF-8; None as empty)."""
    if b is None:
        return b""
    if isinstance(b, str):
        return b.encode()
    return bytes(b)


def _frame(scope: bytes, records: Sequence[Tuple[Optional[Text], Optional[Text], Buffer]]) -> bytes:
    """The request frame [AG-BIN-2] of ``(tenant, context, data)``
    records of ``scope``: each field a big-endian u32 length and its bytes;
    a None or empty tenant and context are absent, and so is the purpose."""
    parts = [b"KSB1", struct.pack(">I", len(records))]
    for tenant, context, data in records:
        for f in (scope, _bytes(tenant), b"", _bytes(context), _bytes(data)):
            parts.append(struct.pack(">I", len(f)))
            parts.append(f)
    return b"".join(parts)


def _bad_answer(what: str) -> Error:
    """The error of an answer that does not follow the protocol."""
    return Error("bad-answer", None, "the agent's answer " + what, 0, "configuration")


def _results(raw: bytes, n: int) -> List[Union[bytes, Error]]:
    """The ``n`` results of the result frame ``raw`` [AG-BIN-4], read
    strictly: every length checked against the bytes left, no byte after
    the last result."""
    at = 0

    def take(k: int) -> bytes:
        nonlocal at
        if k > len(raw) - at:
            raise _bad_answer("is a result frame cut short")
        at += k
        return raw[at - k:at]

    def u8() -> int:
        return take(1)[0]

    def u16() -> int:
        return struct.unpack(">H", take(2))[0]

    def u32() -> int:
        return struct.unpack(">I", take(4))[0]

    if take(4) != b"KSR1" or u32() != n:
        raise _bad_answer("is not a result frame of %d results" % n)
    out: List[Union[bytes, Error]] = []
    for _ in range(n):
        kind = u8()
        if kind == 0:
            value = take(u32())
            sealed, fmt, _version = u8(), u8(), u32()
            alg, key_id = take(u16()), take(u16())
            if sealed > 1 or (sealed == 0 and (fmt or alg or key_id)):
                raise _bad_answer("has a malformed result class")
            out.append(value)
        elif kind == 1:
            name, class_name = take(u16()).decode(), take(u16()).decode()
            has, offset = u8(), u32()
            if has > 1 or (has == 0 and offset):
                raise _bad_answer("has a malformed error result")
            body: Dict[str, object] = {"error": name, "class": class_name}
            if has:
                body["offset"] = offset
            out.append(_agent_error(200, body))
        else:
            raise _bad_answer("has a result of an unknown kind")
    if at != len(raw):
        raise _bad_answer("has bytes after its last result")
    return out


# Only these statuses carry an error of the library, whose name maps to a
# subclass ([AG-ERR-2]; 200: a record's error in a batch, [AG-RESP-5]); a
# 404 ``not-found`` is an endpoint, not a key.
_LIBRARY_STATUSES = (200, 409, 422, 500, 503)


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over the Unix socket ``path``."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _b64(b: Union[Text, Buffer, None]) -> str:
    """Canonical base64 [F-TEXT-1] of ``b`` (text as UTF-8)."""
    if b is None:
        b = b""
    if isinstance(b, str):
        b = b.encode()
    return base64.b64encode(bytes(b)).decode("ascii")


def _text(b: Text) -> str:
    """A tenant or purpose as the JSON string the agent reads."""
    return b.decode() if isinstance(b, (bytes, bytearray)) else b


def _agent_error(status: int, body: Dict[str, object]) -> Error:
    """The exception for the agent's error answer ``body`` with ``status``
    ([AG-ERR-1..2])."""
    name = str(body.get("error", "bad-answer"))
    class_name = str(body.get("class", "configuration"))
    offset = body.get("offset")
    offset = offset if isinstance(offset, int) and status in (200, 422) else None
    if name == "not-authorized":
        cls: type = NotAuthorized
    elif name == "unknown-scope":
        cls = UnknownScope
    elif status in _LIBRARY_STATUSES:
        cls = _error_type(name, class_name, offset is not None)
    elif class_name == "refused":
        cls = BadRequest
    else:
        cls = _error_type("", class_name, False)
    message = body.get("message")
    e = cls(name, offset, message if isinstance(message, str) else None, 0, class_name)
    e.status = status
    member = body.get("member")
    e.member = member if isinstance(member, str) else None
    return e


class AgentClient:
    """A connection to the agent listening on the Unix socket
    ``socket_path``; use it as a context manager or :meth:`close` it.  One
    persistent connection, used by one thread at a time (a lock).

    ::

        with keyshift.AgentClient("/run/keyshift/agent.sock") as agent:
            env = agent.seal("payments", "card", "acme", b"4111",
                             context="payments:42:card")
            assert agent.open("payments", "card", "acme", env,
                              context="payments:42:card") == b"4111"
    """

    def __init__(self, socket_path: str, *, timeout: float = 30.0) -> None:
        self._path = socket_path
        self._timeout = timeout
        self._lock = threading.Lock()
        self._conn: Optional[_UnixConnection] = None

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; a later call opens a new one."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _post(self, path: str, record: Dict[str, object]) -> Dict[str, object]:
        """POST ``record`` to ``path`` and return the decoded answer, or
        raise its error."""
        body = json.dumps(record, separators=(",", ":")).encode()
        status, _, raw = self._send(path, body, "application/json")
        return self._answer(status, raw)

    @staticmethod
    def _answer(status: int, raw: bytes) -> Dict[str, object]:
        """The JSON answer ``raw`` of ``status``, or raise its error."""
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise Error("bad-answer", None, "the agent's answer is not a JSON object (HTTP %d)"
                        % status, 0, "configuration")
        if status != 200 or "error" in answer:
            raise _agent_error(status, answer)
        return answer

    def _send(self, path: str, body: bytes, ctype: str) -> Tuple[int, str, bytes]:
        """POST ``body`` of type ``ctype`` to ``path``: the answer's status,
        Content-Type and bytes.  A connection the agent closed while idle
        is opened anew and the request sent once more (RFC 9112 section
        9.3.1, [AG-RUN-3]); a failure to connect is :class:`Unavailable`."""
        headers = {"Content-Type": ctype}
        with self._lock:
            for attempt in (0, 1):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = _UnixConnection(self._path, self._timeout)
                try:
                    self._conn.request("POST", path, body, headers)
                    resp = self._conn.getresponse()
                    raw = resp.read()
                    status = resp.status
                    rtype = resp.getheader("Content-Type") or ""
                    if resp.will_close:
                        self._conn.close()
                        self._conn = None
                    break
                except (ConnectionError, http.client.HTTPException, OSError) as exc:
                    self._conn.close()
                    self._conn = None
                    if reused and attempt == 0 and isinstance(
                            exc, (ConnectionResetError, BrokenPipeError,
                                  http.client.RemoteDisconnected)):
                        continue
                    raise Unavailable("unavailable", None, "cannot reach the agent at %s: %s"
                                      % (self._path, exc), 0, "retryable") from exc
        return status, rtype, raw

    def _record(self, table: str, column: str, tenant: Optional[Text],
                context: Optional[Text], purpose: Optional[Text]) -> Dict[str, str]:
        """The request record [AG-REQ-7]; a None or empty tenant is absent
        (an open of any tenant), a None purpose too (the column's name), and
        an empty context."""
        r = {"scope": "%s.%s" % (table, column)}
        if context:
            r["context"] = _b64(context)
        if tenant:
            r["tenant"] = _text(tenant)
        if purpose is not None:
            r["purpose"] = _text(purpose)
        return r

    @staticmethod
    def _member(answer: Dict[str, object], member: str) -> bytes:
        """The base64 ``member`` of an answer, decoded."""
        v = answer.get(member)
        if not isinstance(v, str):
            raise Error("bad-answer", None, "the agent's answer has no %s" % member, 0,
                        "configuration")
        return base64.b64decode(v, validate=True)

    def seal(self, table: str, column: str, tenant: Text, plaintext: Buffer, *,
             context: Optional[Text] = None, purpose: Optional[Text] = None) -> bytes:
        """As :meth:`keyshift.App.seal`, through the agent (``POST
        /v1/seal``): the value to store, sealed in the class the agent's
        rollout names for ``tenant`` (else its ``--key``)."""
        r = self._record(table, column, tenant, context, purpose)
        r["plaintext"] = _b64(plaintext)
        return self._member(self._post("/v1/seal", r), "value")

    def seal_class(self, table: str, column: str, tenant: Text, plaintext: Buffer, *,
                   context: Optional[Text] = None,
                   purpose: Optional[Text] = None) -> Tuple[bytes, ValueClass]:
        """As :meth:`seal`, also returning the class written, from the
        answer's ``sealed``, ``format``, ``algorithm``, ``key_id`` and
        ``key_version`` ([AG-RESP-2]), as :meth:`keyshift.App.seal_class`
        returns it."""
        r = self._record(table, column, tenant, context, purpose)
        r["plaintext"] = _b64(plaintext)
        answer = self._post("/v1/seal", r)
        return self._member(answer, "value"), self._class(answer)

    @staticmethod
    def _class(answer: Dict[str, object]) -> ValueClass:
        """The class an answer names ([AG-RESP-2]): plaintext when
        ``sealed`` is false, else the envelope's format, algorithm and key
        version; an answer without them is ``bad-answer``."""
        sealed = answer.get("sealed")
        if sealed is False:
            return ValueClass(True)
        fmt, alg = answer.get("format"), answer.get("algorithm")
        key_id, key_version = answer.get("key_id"), answer.get("key_version")
        if sealed is not True or not isinstance(fmt, int) or not isinstance(alg, str) or \
                not isinstance(key_id, str) or not isinstance(key_version, int):
            raise Error("bad-answer", None, "the agent's answer does not name the class written",
                        0, "configuration")
        return ValueClass(False, fmt, alg, key_id, key_version)

    def open(self, table: str, column: str, tenant: Optional[Text], value: Buffer, *,
             context: Optional[Text] = None, purpose: Optional[Text] = None) -> bytes:
        """As :meth:`keyshift.App.open`, through the agent (``POST
        /v1/open``): the plaintext, given only after the envelope
        authenticated.  The ``bytes`` returned, and the strings of the
        request and answer, cannot be wiped (drop them soon)."""
        r = self._record(table, column, tenant, context, purpose)
        r["value"] = _b64(value)
        return self._member(self._post("/v1/open", r), "plaintext")

    def _batch(self, op: str, table: str, column: str,
               items: Sequence[Tuple[Optional[Text], Optional[Text], Buffer]]) -> List[Union[bytes, Error]]:
        """POST the batch of ``items`` to ``/v1/OP`` in the batch frame
        ([AG-REQ-8], [AG-BIN-1..4]) and return each result or its error
        ([AG-RESP-5])."""
        body = _frame(("%s.%s" % (table, column)).encode(), items)
        status, rtype, raw = self._send("/v1/" + op, body, FRAME_TYPE)
        if status != 200 or rtype != FRAME_TYPE:
            self._answer(status, raw)  # raises the request's error
            raise _bad_answer("is not a result frame (HTTP %d)" % status)
        return _results(raw, len(items))

    def seal_batch(self, table: str, column: str,
                   items: Sequence[Tuple[Text, Optional[Text], Buffer]]) -> List[Union[bytes, Error]]:
        """As :meth:`keyshift.App.seal_batch`, in one request (``POST
        /v1/seal-batch`` in the batch frame, at most the agent's
        ``--max-batch`` items): items
        are ``(tenant, context, plaintext)``; the result has, in order, each
        value or the :class:`Error` that item met.  An error of the request
        itself is raised."""
        return self._batch("seal-batch", table, column, items)

    def open_batch(self, table: str, column: str,
                   items: Sequence[Tuple[Optional[Text], Optional[Text], Buffer]]) -> List[Union[bytes, Error]]:
        """As :meth:`keyshift.App.open_batch`, in one request (``POST
        /v1/open-batch``): items are ``(tenant, context, value)``; the result
        has each plaintext or the :class:`Error` that item met."""
        return self._batch("open-batch", table, column, items)

    def parse(self, table: str, column: str, value: Buffer) -> Dict[str, object]:
        """Parse the envelope ``value`` of ``table.column`` strictly through
        the agent (``POST /v1/parse``) without opening it: the header's
        fields of [AG-RESP-4] (``version``, ``algorithm``, ``tenant``,
        ``key_id``, ``key_version``, ``purpose`` in format 2,
        ``ciphertext_len``, ``header_len``, ``total_len``).  A rejection
        raises :class:`Malformed` with its ``offset``; :func:`keyshift.parse`
        has the fields' spans, in process."""
        return self._post("/v1/parse", {"scope": "%s.%s" % (table, column), "value": _b64(value)})
