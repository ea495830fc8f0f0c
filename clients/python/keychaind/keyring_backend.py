"""A backend for the ``keyring`` library that stores passwords in keychaind.

``keyring`` finds it through the ``keyring.backends`` entry point once this package is installed;
select it explicitly with ``PYTHON_KEYRING_BACKEND=keychaind.keyring_backend.KeychaindKeyring``.

Each password is a generic-password item: ``svce`` = service, ``acct`` = username, ``v_Data`` = the
password in UTF-8. The backend has **one namespace**, one access group, for reads, writes and deletes
alike: the ``group`` property when set, else the calling app's default group (the first of its
``keychain-access-groups``). Items of the same service and username in the app's other groups (shared
with other apps) are neither read, nor overwritten, nor deleted.

Properties (also from the environment as ``KEYRING_PROPERTY_SOCKET`` / ``KEYRING_PROPERTY_GROUP``):
``socket`` (path of the daemon's socket; default ``$KEYCHAIND_SOCKET``, else
``$XDG_RUNTIME_DIR/keychaind/keychaind.sock``), ``group`` (the access group).

The backend is viable only when a round trip to the daemon works and the daemon knows this program
(for Python: this interpreter), checked once and remembered for a few seconds. Only keyring's own
exceptions leave it: ``PasswordSetError``, ``PasswordDeleteError``, ``KeyringError``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

try:
    from keyring.compat import properties
except ImportError:  # pragma: no cover — older/newer keyring layouts
    from jaraco.classes import properties

from keyring.backend import KeyringBackend
from keyring.credentials import SimpleCredential
from keyring.errors import KeyringError, PasswordDeleteError, PasswordSetError

from . import constants as C
from . import wire
from .client import Client
from .errors import KeychainError

#: How long a viability check is remembered (keyring asks for the priority several times per call).
PROBE_TTL_SECONDS = 5.0
#: Attempts of add-then-update while other processes delete the same item in between.
SET_ATTEMPTS = 100


def interpreter_path() -> str:
    """What keychaind sees as this program's executable: the interpreter's real path."""
    return os.path.realpath(sys.executable)


def registration_hint(socket_path: str | None = None, daemon_reason: str | None = None) -> str:
    """What to register, and where, so that keychaind knows this interpreter. ``daemon_reason``: why
    the daemon says it does not know this program (its `status` answer's ``unidentified``), which
    names the daemon's own apps.d and whether a file there is enough (not while a passphrase is set)."""
    exe = interpreter_path()
    name = os.path.basename(exe) or "python"
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    entry = {
        "application-identifier": f"LOCAL.{name}",
        "keychain-access-groups": [f"LOCAL.{name}"],
        "executables": [exe],
    }
    where = f" at {socket_path}" if socket_path else ""
    if daemon_reason:
        return (
            f"keychaind{where} does not know this program: {daemon_reason}. Python programs are "
            f"identified by their interpreter, {exe} (the real path of sys.executable {sys.executable}); "
            f"an apps.d entry for it: {json.dumps(entry)}. Every Python program this interpreter runs "
            f"then shares that app's items."
        )
    return (
        f"keychaind{where} does not know this program. Python programs are identified by their "
        f"interpreter, {exe} (the real path of sys.executable {sys.executable}). Register it: create "
        f"{os.path.join(config, 'keychaind', 'apps.d', name + '.json')} (the apps.d directory beside "
        f"the daemon's keychaind.json) containing {json.dumps(entry)}, then "
        f"reload keychaind (systemctl --user reload keychaind, or pkill -HUP -u \"$(id -u)\" -x keychaind). "
        f"Every Python program this interpreter runs then shares that app's items."
    )


class _Probe:
    """The outcome of one viability check: the caller's groups, or why (and with which OSStatus) the
    backend is unusable."""

    def __init__(self, groups: list[str] | None = None, problem: str | None = None, status: int = 0):
        self.groups = groups or []
        self.problem = problem
        self.status = status
        self.when = time.monotonic()


_probes: dict[tuple, _Probe] = {}
_probes_lock = threading.Lock()


def _probe(path: str, group: str | None, *, trust_failures: bool = True) -> _Probe:
    """One cheap round trip (`status`), remembered for PROBE_TTL_SECONDS per socket, group and
    process. With ``trust_failures=False`` a remembered failure is checked again (a call about to be
    made should not fail because the daemon was down a moment ago)."""
    key = (path, group, os.getpid())
    with _probes_lock:
        found = _probes.get(key)
        if (found is not None and time.monotonic() - found.when < PROBE_TTL_SECONDS
                and (trust_failures or not found.problem)):
            return found
    try:
        with Client(path, timeout=10.0) as c:
            status = c.status() or {}
    except KeychainError as e:
        if e.status == C.errSecNotAvailable:
            result = _Probe(problem=f"keychaind is not running or not reachable at {path} ({e.message})",
                            status=e.status)
        else:
            result = _Probe(problem=f"keychaind at {path} does not answer status: {e}", status=e.status)
    else:
        raw = status.get("groups") if isinstance(status, dict) else None
        groups = [g for g in raw if isinstance(g, str)] if isinstance(raw, list) else []
        if not isinstance(status, dict):
            result = _Probe(problem=f"the process at {path} answered status with a {type(status).__name__}, "
                                    f"not keychaind's map", status=C.errSecDecode)
        elif status.get("caller") is None or not groups:
            reason = status.get("unidentified")
            result = _Probe(problem=registration_hint(path, reason if isinstance(reason, str) else None),
                            status=C.errSecMissingEntitlement)
        elif group is not None and group not in groups:
            result = _Probe(problem=f"the keyring group {group!r} is not one of this app's access groups "
                                    f"({', '.join(map(str, groups))})", status=C.errSecMissingEntitlement)
        else:
            result = _Probe(groups=groups)
    with _probes_lock:
        _probes[key] = result
    return result


def _forget_probes() -> None:
    with _probes_lock:
        _probes.clear()


class KeychaindKeyring(KeyringBackend):
    """keychaind (Apple's Keychain Services for Linux)."""

    socket: str | None = None
    group: str | None = None

    @classmethod
    def _socket_setting(cls) -> str:
        return os.environ.get("KEYRING_PROPERTY_SOCKET") or cls.socket or wire.socket_path()

    @classmethod
    def _group_setting(cls) -> str | None:
        return os.environ.get("KEYRING_PROPERTY_GROUP") or cls.group or None

    @properties.classproperty
    def priority(cls) -> float:
        """9 when the daemon answers and knows this program: above every backend keyring ships (≤ 5).
        When other backends are viable too, keyring's chainer (10) is chosen and consults this backend
        first. Raises RuntimeError, saying why, when the backend cannot be used."""
        probe = _probe(cls._socket_setting(), cls._group_setting())
        if probe.problem:
            raise RuntimeError(probe.problem)
        return 9

    def __init__(self):
        super().__init__()  # applies KEYRING_PROPERTY_* to this instance
        self._client: Client | None = None
        self._client_path: str | None = None

    # -- the namespace ----------------------------------------------------------------------------------

    @property
    def _path(self) -> str:
        return self.socket or wire.socket_path()

    @property
    def client(self) -> Client:
        path = self._path
        if self._client is None or self._client_path != path:
            if self._client is not None:
                self._client.close()
            self._client = Client(path)
            self._client_path = path
        return self._client

    def _namespace(self) -> str:
        """The one access group this backend reads, writes and deletes in. Raises KeychainError."""
        probe = _probe(self._path, self.group or None, trust_failures=False)
        if probe.problem:
            raise KeychainError(probe.status, probe.problem)
        return self.group or probe.groups[0]

    def _query(self, service: str, username: str | None) -> dict:
        q = {C.kSecClass: C.kSecClassGenericPassword, C.kSecAttrService: service,
             C.kSecAttrAccessGroup: self._namespace()}
        if username is not None:
            q[C.kSecAttrAccount] = username
        return q

    @staticmethod
    def _text(value, what: str) -> str:
        if isinstance(value, str):
            return value
        if not isinstance(value, (bytes, bytearray)):
            # Only a broken or impostor daemon answers so: never turned into bytes (an integer would
            # become that many NULs).
            raise KeyringError(f"the {what} came back as a {type(value).__name__}, not bytes or text; "
                               f"is the process at the socket keychaind?")
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise KeyringError(f"the stored {what} is not UTF-8 text (another client wrote raw bytes); "
                               f"read it with keychaind.Client") from None

    # -- keyring's API -------------------------------------------------------------------------------------

    def get_password(self, service: str, username: str) -> str | None:
        try:
            data = self.client.copy(dict(self._query(service, username), **{C.kSecReturnData: True}))
        except KeychainError as e:
            if e.status == C.errSecItemNotFound:
                return None
            raise KeyringError(str(e)) from e
        return self._text(data, "password")

    def set_password(self, service: str, username: str, password: str) -> None:
        try:
            secret = password.encode("utf-8")
        except UnicodeEncodeError:
            raise PasswordSetError("the password is not valid Unicode text (it holds a lone surrogate)") from None
        except AttributeError:
            raise PasswordSetError(f"the password must be a str, not {type(password).__name__}") from None
        try:
            query = self._query(service, username)
            item = dict(query, **{
                C.kSecValueData: secret,
                C.kSecAttrLabel: f"Password for '{username}' on '{service}'",
            })
            # Apple's upsert: add, and on errSecDuplicateItem update that item (same group). Another
            # process may delete it in between: then add again.
            for attempt in range(SET_ATTEMPTS):
                try:
                    self.client.add(item)
                    return
                except KeychainError as e:
                    if e.status != C.errSecDuplicateItem:
                        raise
                try:
                    self.client.update(query, {C.kSecValueData: secret})
                    return
                except KeychainError as e:
                    if e.status != C.errSecItemNotFound:
                        raise
                if attempt >= 3:
                    time.sleep(random.uniform(0, 0.002 * attempt))
        except KeychainError as e:
            raise PasswordSetError(str(e)) from e
        raise PasswordSetError(f"the item kept being added and removed by other processes ({SET_ATTEMPTS} attempts)")

    def delete_password(self, service: str, username: str) -> None:
        try:
            self.client.delete(self._query(service, username))
        except KeychainError as e:
            if e.status == C.errSecItemNotFound:
                raise PasswordDeleteError("Password not found") from e
            raise PasswordDeleteError(str(e)) from e

    def get_credential(self, service: str, username: str | None):
        if username is not None:
            password = self.get_password(service, username)
            return None if password is None else SimpleCredential(username, password)
        try:
            item = self.client.copy(dict(self._query(service, None), **{
                C.kSecReturnAttributes: True, C.kSecReturnData: True}))
        except KeychainError as e:
            if e.status == C.errSecItemNotFound:
                return None
            raise KeyringError(str(e)) from e
        if not isinstance(item, dict):
            raise KeyringError(f"the item came back as a {type(item).__name__}, not a map of attributes; "
                               f"is the process at the socket keychaind?")
        return SimpleCredential(self._text(item.get(C.kSecAttrAccount, ""), "username"),
                                self._text(item.get(C.kSecValueData, b""), "password"))
