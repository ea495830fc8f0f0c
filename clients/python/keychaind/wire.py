"""Framing and the CBOR subset of the keychaind protocol (docs/protocol.md §1–§3).

Nothing here touches a socket except :func:`connect`; everything else is pure and testable.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import struct

import cbor2

from .errors import KeychainError
from . import constants as C

PROTOCOL_VERSION = 1
#: Default largest request body the daemon accepts (protocol.md §2); a daemon may be set higher.
DEFAULT_MAX_FRAME_BYTES = 1 << 20
#: The highest ``maxFrameBytes`` a daemon can be set to: no daemon accepts a larger request body, so
#: the client refuses those itself. Below it, the daemon in use judges by its own limit.
MAX_REQUEST_BYTES = 64 << 20
#: Largest response body this client accepts; responses are not bound by maxFrameBytes.
MAX_RESPONSE_BYTES = 256 << 20
MAX_DEPTH = 16
MAX_COUNT = 4096
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 63) - 1

_HEADER = struct.Struct(">I")


def socket_path(environ=None) -> str:
    """The daemon's socket path: ``$KEYCHAIND_SOCKET``, else ``$XDG_RUNTIME_DIR/keychaind/keychaind.sock``,
    else ``/run/user/<uid>/keychaind/keychaind.sock`` (protocol.md §1)."""
    env = os.environ if environ is None else environ
    explicit = env.get("KEYCHAIND_SOCKET")
    if explicit:
        return explicit
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return os.path.join(runtime, "keychaind", "keychaind.sock")


def socket_exists(path: str | None = None) -> bool:
    """Whether a daemon socket seems to be there (abstract names are assumed to exist)."""
    path = path or socket_path()
    if path.startswith("@"):
        return True
    try:
        import stat

        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def connect(path: str, timeout: float | None = None) -> socket.socket:
    """A connected stream socket; failures are ``errSecNotAvailable``."""
    address = "\0" + path[1:] if path.startswith("@") else path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.settimeout(None)
    except OSError as e:
        sock.close()
        reason = e.strerror or str(e)
        raise KeychainError(C.errSecNotAvailable, f"cannot connect to keychaind at {path}: {reason}") from None
    # Only a daemon of this user (or root) may receive our secrets: a socket in a directory someone
    # else controls could lead to an impostor.
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        uid = -1
    if uid not in (os.getuid(), 0):
        sock.close()
        raise KeychainError(C.errSecNotAvailable,
                            f"refusing {path}: the process serving it runs as uid {uid}, not as this user")
    return sock


def send_identifying(sock: socket.socket, data: bytes) -> None:
    """Sends all of ``data``, its first part with a pidfd of this process attached (SCM_RIGHTS).

    A connection's first write should go this way (protocol.md §1): on a kernel without
    ``SO_PEERPIDFD`` keychaind answers bytes that arrived before it pinned the connecting process
    only when they come with their writer's pidfd. Without ``os.pidfd_open`` the bytes go plain.
    """
    try:
        pidfd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        sock.sendall(data)
        return
    try:
        sent = socket.send_fds(sock, [data], [pidfd])
    finally:
        os.close(pidfd)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _check(value, depth: int, where: str) -> None:
    """Refuses, before sending, what the daemon would reject as undecodable (which would close the
    connection): only the CBOR subset of protocol.md §3 passes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise KeychainError(C.errSecParam, f"{where}: text is not valid Unicode (it holds a lone surrogate)") from None
        return
    if value is None or isinstance(value, (bool, float, bytes, bytearray, memoryview, _dt.datetime)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise KeychainError(C.errSecParam, f"{where}: integer does not fit in 64 signed bits")
        return
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise KeychainError(C.errSecParam, f"{where}: nesting deeper than {MAX_DEPTH}")
        if len(value) > MAX_COUNT:
            raise KeychainError(C.errSecParam, f"{where}: array of {len(value)} elements exceeds {MAX_COUNT}")
        for i, e in enumerate(value):
            _check(e, depth + 1, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise KeychainError(C.errSecParam, f"{where}: nesting deeper than {MAX_DEPTH}")
        if len(value) > MAX_COUNT:
            raise KeychainError(C.errSecParam, f"{where}: map of {len(value)} entries exceeds {MAX_COUNT}")
        for k, v in value.items():
            if not isinstance(k, str):
                raise KeychainError(C.errSecParam, f"{where}: map keys must be text, not {type(k).__name__}")
            _check(k, depth + 1, f"{where}: a key")
            _check(v, depth + 1, f"{where}.{k}")
        return
    raise KeychainError(C.errSecParam, f"{where}: a {type(value).__name__} cannot be sent to keychaind")


def encode(value) -> bytes:
    """CBOR for ``value`` within the protocol's subset: keys sorted length-first then bytewise (as the
    daemon sends), datetimes as tag 1 (naive ones taken as UTC), bytearray/memoryview as byte strings."""
    _check(value, 0, "request")
    return cbor2.dumps(_plain(value), canonical=True, datetime_as_timestamp=True, timezone=_dt.timezone.utc)


def _plain(value):
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


#: Deepest nesting accepted in a response (the daemon's are at most 4 deep).
MAX_RESPONSE_DEPTH = 64
_FLOAT = {25: struct.Struct(">e"), 26: struct.Struct(">f"), 27: struct.Struct(">d")}
_SIMPLE = {20: False, 21: True, 22: None}


class _Bad(Exception):
    pass


def decode(body: bytes):
    """One CBOR data item (a response body), in the subset of protocol.md §3 and nothing more:
    definite lengths, integers within 64 signed bits, UTF-8 text, text map keys without duplicates,
    tag 1 (a date, returned as an aware ``datetime`` in UTC) and no other tag, false/true/null and
    floats. Anything else — whatever a broken or impostor daemon sends — is ``errSecDecode``: no
    bignum, no other semantic tag, nothing whose decoding costs more than its length."""
    view = memoryview(body)
    try:
        value, end = _item(view, 0, 0)
        if end != len(view):
            raise _Bad(f"{len(view) - end} bytes after the data item")
    except _Bad as e:
        raise KeychainError(C.errSecDecode, f"response is not valid CBOR: {e}") from None
    return value


def _head(view: memoryview, at: int):
    if at >= len(view):
        raise _Bad("the body ends inside a data item")
    initial = view[at]
    major, info = initial >> 5, initial & 0x1F
    at += 1
    if info < 24:
        return major, info, info, at
    if info > 27:
        raise _Bad("indefinite lengths and reserved heads are not used")
    size = 1 << (info - 24)
    if at + size > len(view):
        raise _Bad("the body ends inside a head")
    return major, info, int.from_bytes(view[at:at + size], "big"), at + size


def _item(view: memoryview, at: int, depth: int):
    if depth > MAX_RESPONSE_DEPTH:
        raise _Bad(f"nesting deeper than {MAX_RESPONSE_DEPTH}")
    major, info, n, at = _head(view, at)
    remaining = len(view) - at
    if major == 0 or major == 1:
        if n > _INT_MAX:
            raise _Bad("an integer beyond 64 signed bits")
        return (n if major == 0 else -1 - n), at
    if major == 2 or major == 3:
        if n > remaining:
            raise _Bad("a string longer than the body")
        raw = bytes(view[at:at + n])
        if major == 2:
            return raw, at + n
        try:
            return raw.decode("utf-8"), at + n
        except UnicodeDecodeError:
            raise _Bad("text that is not UTF-8") from None
    if major == 4:
        if n > remaining:  # every element takes a byte at least
            raise _Bad("an array longer than the body")
        out = []
        for _ in range(n):
            value, at = _item(view, at, depth + 1)
            out.append(value)
        return out, at
    if major == 5:
        if 2 * n > remaining:
            raise _Bad("a map longer than the body")
        out = {}
        for _ in range(n):
            key, at = _item(view, at, depth + 1)
            if not isinstance(key, str):
                raise _Bad("a map key that is not text")
            if key in out:
                raise _Bad(f"the key {key!r} twice")
            out[key], at = _item(view, at, depth + 1)
        return out, at
    if major == 6:
        if n != 1:
            raise _Bad(f"tag {n} (only tag 1, a date, is used)")
        seconds, at = _item(view, at, depth + 1)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise _Bad("tag 1 over something other than a number")
        try:
            return _dt.datetime.fromtimestamp(seconds, tz=_dt.timezone.utc), at
        except (OverflowError, ValueError, OSError):
            raise _Bad(f"a date out of range ({seconds})") from None
    # major 7
    if info in _SIMPLE:
        return _SIMPLE[info], at
    if info in _FLOAT:
        size = _FLOAT[info].size
        return _FLOAT[info].unpack(bytes(view[at - size:at]))[0], at
    raise _Bad(f"the simple value {n} is not used")


def frame(body: bytes) -> bytes:
    """Header + body."""
    return _HEADER.pack(len(body)) + body


def encode_request(request_id: int, op: str, query=None, attributes=None, **arguments) -> bytearray:
    """The frame of one request (protocol.md §4.1), in a ``bytearray`` the caller zeroes with
    ``wipe`` once it is sent (a request may carry a secret or a passphrase). The CBOR encoder's own
    ``bytes`` output cannot be wiped (Python's bytes are immutable): see docs/security.md."""
    message = dict(arguments)
    message["v"] = PROTOCOL_VERSION
    message["id"] = request_id
    message["op"] = op
    if query is not None:
        message["query"] = query
    if attributes is not None:
        message["attributes"] = attributes
    body = encode(message)
    out = bytearray(_HEADER.pack(len(body)))
    out += body
    return out


def wipe(buffer: bytearray) -> None:
    """Overwrites ``buffer`` with zeros in place (its length stays)."""
    buffer[:] = bytes(len(buffer))


class FrameReader:
    """Cuts a byte stream into frame bodies: ``feed`` bytes, then iterate ``frames()``."""

    def __init__(self, max_bytes: int = MAX_RESPONSE_BYTES):
        self.max_bytes = max_bytes
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def frames(self):
        while len(self._buffer) >= 4:
            (n,) = _HEADER.unpack_from(self._buffer)
            if n > self.max_bytes:
                raise KeychainError(C.errSecDecode, f"frame of {n} bytes exceeds the limit of {self.max_bytes} bytes")
            if len(self._buffer) < 4 + n:
                return
            body = bytes(self._buffer[4:4 + n])
            del self._buffer[:4 + n]
            yield body


class Response:
    """A decoded response map (protocol.md §4.2)."""

    __slots__ = ("id", "status", "message", "result", "has_result")

    def __init__(self, value):
        if not isinstance(value, dict):
            raise KeychainError(C.errSecDecode, "response is not a CBOR map")
        rid, status = value.get("id"), value.get("status")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise KeychainError(C.errSecDecode, 'response lacks an integer "id"')
        if not isinstance(status, int) or isinstance(status, bool) or not -(1 << 31) <= status < (1 << 31):
            raise KeychainError(C.errSecDecode, 'response lacks an integer "status" (an OSStatus, 32 bits)')
        self.id = rid
        self.status = status
        message = value.get("message")
        self.message = message if isinstance(message, str) else None
        self.has_result = "result" in value
        self.result = value.get("result")

    def error(self) -> KeychainError:
        return KeychainError(self.status, self.message)
