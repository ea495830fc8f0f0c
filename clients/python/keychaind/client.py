"""The keychaind client: one connection, pipelined and thread-safe (docs/protocol.md)."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import uuid
import weakref

from . import constants as C
from . import wire
from .errors import KeychainError

# The device-identifier convention (protocol.md §15).
DEVICE_ID_SERVICE = "com.keychaind.device-identifier"
DEVICE_ID_ACCOUNT = "device-id"

_RETRYABLE_OPS = frozenset({"copy", "status"})  # safe to resend when the connection died under them


class _Finished(Exception):
    """Ends the reader loop."""


class _Pending:
    __slots__ = ("event", "response", "error")

    def __init__(self):
        self.event = threading.Event()
        self.response = None
        self.error = None


class _Connection:
    """One socket plus a reader thread that hands each response to the request with its id."""

    def __init__(self, path: str, connect_timeout: float | None):
        self.path = path
        self.sock = wire.connect(path, connect_timeout)
        self.pid = os.getpid()
        self._lock = threading.Lock()  # guards _pending and _failure
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._failure: KeychainError | None = None
        self._sent_first = False  # the first write carries our pidfd (wire.send_identifying)
        self._reader = threading.Thread(target=self._read_loop, name="keychaind-reader", daemon=True)
        self._reader.start()

    @property
    def usable(self) -> bool:
        return self._failure is None and self.pid == os.getpid()

    def send(self, request_id: int, data: bytes) -> _Pending:
        pending = _Pending()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                if self._sent_first:
                    self.sock.sendall(data)
                else:
                    self._sent_first = True
                    wire.send_identifying(self.sock, data)
        except OSError as e:
            # The daemon may have refused the frame (an id-0 error, e.g. over its maxFrameBytes) and
            # closed: let the reader hand that reason to the waiters before the generic one.
            if threading.current_thread() is not self._reader:
                self._reader.join(5.0)
            self._fail(KeychainError(C.errSecNotAvailable, f"cannot send to keychaind: {e.strerror or e}"))
        return pending

    def forget(self, request_id: int) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        self._fail(KeychainError(C.errSecNotAvailable, "connection closed by the client"))

    def _fail(self, error: KeychainError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error
            waiting, self._pending = self._pending, {}
        for p in waiting.values():
            p.error = error
            p.event.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_loop(self) -> None:
        reader = wire.FrameReader()
        error = KeychainError(C.errSecNotAvailable, "keychaind closed the connection")
        try:
            while True:
                data = self.sock.recv(256 * 1024)
                if not data:
                    if reader.pending:
                        error = KeychainError(C.errSecNotAvailable, "keychaind closed the connection in the middle of a frame")
                    break
                reader.feed(data)
                for body in reader.frames():
                    response = wire.Response(wire.decode(body))
                    with self._lock:
                        pending = self._pending.pop(response.id, None)
                    if pending is not None:
                        pending.response = response
                        pending.event.set()
                    elif response.id == 0 and response.status != 0:
                        # An error the daemon could not attribute: the connection is finished (§13).
                        error = response.error()
                        raise _Finished
        except _Finished:
            pass
        except KeychainError as e:
            error = e
        except Exception as e:  # noqa: BLE001 — a reader must never die silently
            error = KeychainError(C.errSecNotAvailable, f"connection to keychaind failed: {e}")
        self._fail(error)
        try:
            self.sock.close()
        except OSError:
            pass


class Client:
    """A connection to keychaind serving Apple's four SecItem calls.

    ``Client()`` finds the socket as protocol.md §1 says (``$KEYCHAIND_SOCKET``, else
    ``$XDG_RUNTIME_DIR/keychaind/keychaind.sock``). It connects on first use, keeps one connection,
    reconnects after the daemon closed it, and may be shared by any number of threads (their requests
    are pipelined on the one connection). Every failure raises :class:`KeychainError`.

    Queries are plain dicts with Apple's wire keys; use the ``kSec…`` constants::

        c = Client()
        c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: "svc", kSecAttrAccount: "alice",
               kSecValueData: b"s3cret"})
        secret = c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: "svc",
                         kSecAttrAccount: "alice", kSecReturnData: True})
    """

    def __init__(self, path: str | None = None, *, timeout: float | None = 60.0,
                 max_frame_bytes: int = wire.MAX_REQUEST_BYTES):
        self.path = path or wire.socket_path()
        self.timeout = timeout
        # Requests above this are refused here; below it the daemon applies its own maxFrameBytes
        # (1 MiB unless configured) and answers a larger frame with errSecParam and its limit.
        self.max_frame_bytes = max_frame_bytes
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._ids = itertools.count(1)  # never 0: the daemon answers unattributable errors with id 0
        _clients.add(self)

    def _after_fork_in_child(self) -> None:
        # The connection belongs to the parent (the daemon identified the parent when it connected,
        # and the reader thread stayed there): forget it without shutting it down — that would cut
        # the parent's connection too — and start fresh. Locks may have been held by parent threads.
        self._lock = threading.Lock()
        self._conn = None

    # -- connection --------------------------------------------------------------------------------

    def _connection(self) -> _Connection:
        with self._lock:
            if self._conn is None or not self._conn.usable:
                if self._conn is not None and self._conn.pid == os.getpid():
                    self._conn.close()
                self._conn = _Connection(self.path, self.timeout)
            return self._conn

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None and conn.pid == os.getpid():
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- requests ----------------------------------------------------------------------------------

    def call(self, op: str, query: dict | None = None, attributes: dict | None = None, **arguments):
        """Sends one request and returns its ``result`` (None when the response has none)."""
        with self._lock:
            request_id = next(self._ids)
        data = wire.encode_request(request_id, op, query, attributes, **arguments)
        try:
            return self._send_request(op, request_id, data)
        finally:
            wire.wipe(data)  # the frame may hold a secret or a passphrase

    def _send_request(self, op: str, request_id: int, data: bytearray):
        if len(data) - 4 > self.max_frame_bytes:
            raise KeychainError(C.errSecParam, f"request of {len(data) - 4} bytes exceeds the limit of {self.max_frame_bytes} bytes")
        attempts = 2 if op in _RETRYABLE_OPS else 1
        for attempt in range(attempts):
            conn = self._connection()
            pending = conn.send(request_id, data)
            if not pending.event.wait(self.timeout):
                conn.forget(request_id)
                raise KeychainError(C.errSecNotAvailable, f"no response from keychaind within {self.timeout:g} s")
            if pending.error is not None:
                if attempt + 1 < attempts and pending.error.status == C.errSecNotAvailable:
                    continue
                raise pending.error
            response = pending.response
            if response.status != 0:
                raise response.error()
            return response.result
        raise AssertionError("unreachable")

    def add(self, query: dict):
        """``SecItemAdd``: returns the new item shaped by its ``r_*`` keys, or None without them."""
        return self.call("add", query)

    def copy(self, query: dict):
        """``SecItemCopyMatching``: the result shaped by ``r_*`` and ``m_Limit`` (protocol.md §9);
        None when no ``r_*`` key is true (then success means "at least one item matched")."""
        return self.call("copy", query)

    def update(self, query: dict, attributes: dict) -> None:
        """``SecItemUpdate``: changes every item matching ``query``."""
        self.call("update", query, attributes)

    def delete(self, query: dict) -> None:
        """``SecItemDelete``: deletes every item matching ``query``."""
        self.call("delete", query)

    def status(self) -> dict:
        """The daemon's ``status`` map (version, lock state, caller, groups …)."""
        return self.call("status")

    def default_group(self) -> str:
        """The caller's first access group, where an ``add`` without ``agrp`` goes: ``groups[0]`` of
        ``status``; from a daemon whose ``status`` lacks ``groups``, learnt by adding (and deleting) a
        throw-away item and reading the group the daemon chose."""
        groups = (self.status() or {}).get("groups")
        if isinstance(groups, list) and groups and isinstance(groups[0], str):
            return groups[0]
        probe = {C.kSecClass: C.kSecClassGenericPassword, C.kSecAttrService: DEVICE_ID_SERVICE,
                 C.kSecAttrAccount: f"probe-{uuid.uuid4()}"}
        attrs = self.add(dict(probe, **{C.kSecAttrAccessible: C.kSecAttrAccessibleAlwaysThisDeviceOnly,
                                        C.kSecReturnAttributes: True}))
        group = attrs[C.kSecAttrAccessGroup]
        self.delete(dict(probe, **{C.kSecAttrAccessGroup: group}))
        return group

    def device_id(self, group: str | None = None) -> str:
        """This device's UUID for an access group (default: the caller's first group), created on first
        use; every app of the group gets the same value (protocol.md §15)."""
        if group is None:
            group = self.default_group()
        base = {C.kSecClass: C.kSecClassGenericPassword, C.kSecAttrService: DEVICE_ID_SERVICE,
                C.kSecAttrAccount: DEVICE_ID_ACCOUNT}
        if group is not None:
            base[C.kSecAttrAccessGroup] = group
        lookup = dict(base, **{C.kSecReturnData: True})
        try:
            return _uuid_text(self.copy(lookup))
        except KeychainError as e:
            if e.status != C.errSecItemNotFound:
                raise
        fresh = str(uuid.uuid4()).upper()
        try:
            self.add(dict(base, **{C.kSecAttrAccessible: C.kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly,
                                   C.kSecValueData: fresh.encode("ascii")}))
            return fresh
        except KeychainError as e:
            if e.status != C.errSecDuplicateItem:
                raise
        return _uuid_text(self.copy(lookup))  # another process won the race: use its value


def _uuid_text(data) -> str:
    if not isinstance(data, (bytes, bytearray)):
        raise KeychainError(C.errSecDecode, "device identifier item holds no data")
    return bytes(data).decode("ascii")


# -- fork -----------------------------------------------------------------------------------------------

_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _reinit_after_fork() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for c in list(_clients):
        c._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


# -- Apple-style functions on a shared client ---------------------------------------------------------

_shared: Client | None = None
_shared_lock = threading.Lock()


def shared_client() -> Client:
    """The process-wide client the ``SecItem…`` functions use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Client()
        return _shared


def _status_of(fn, *args):
    try:
        return C.errSecSuccess, fn(*args)
    except KeychainError as e:
        return e.status, None


def SecItemAdd(attributes: dict):
    """Apple's ``SecItemAdd``: returns ``(status, result)`` instead of raising."""
    return _status_of(shared_client().add, attributes)


def SecItemCopyMatching(query: dict):
    """Apple's ``SecItemCopyMatching``: returns ``(status, result)``."""
    return _status_of(shared_client().copy, query)


def SecItemUpdate(query: dict, attributes: dict) -> int:
    """Apple's ``SecItemUpdate``: returns the status."""
    return _status_of(shared_client().update, query, attributes)[0]


def SecItemDelete(query: dict) -> int:
    """Apple's ``SecItemDelete``: returns the status."""
    return _status_of(shared_client().delete, query)[0]
