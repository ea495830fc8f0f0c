"""A backend for the ``keyring`` library that stores passwords in keychaind.

``keyring`` finds it through the ``keyring.backends`` entry point once this package is installed;
select it explicitly with ``PYTHON_KEYRING_BACKEND=keychaind.keyring_backend.KeychaindKeyring``.

Each password is a generic-password item: ``svce`` = service, ``acct`` = username, ``v_Data`` = the
password in UTF-8, in the calling app's default access group (its first ``keychain-access-groups``
entry) unless the ``group`` property names another. Properties (also from the environment as
``KEYRING_PROPERTY_SOCKET`` / ``KEYRING_PROPERTY_GROUP``): ``socket`` (path of the daemon's socket),
``group`` (access group).
"""

from __future__ import annotations

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


class KeychaindKeyring(KeyringBackend):
    """keychaind (Apple's Keychain Services for Linux)."""

    socket: str | None = None
    group: str | None = None

    @properties.classproperty
    def priority(cls) -> float:
        """9 when the daemon's socket exists: above every backend keyring ships (≤ 5). When other
        backends are viable too, keyring's chainer (10) is chosen and consults this backend first."""
        path = wire.socket_path()
        if not wire.socket_exists(path):
            raise RuntimeError(f"keychaind is not running (no socket at {path})")
        return 9

    def __init__(self):
        super().__init__()
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.socket or None)
        return self._client

    def _query(self, service: str, username: str | None) -> dict:
        q = {C.kSecClass: C.kSecClassGenericPassword, C.kSecAttrService: service}
        if username is not None:
            q[C.kSecAttrAccount] = username
        if self.group:
            q[C.kSecAttrAccessGroup] = self.group
        return q

    def get_password(self, service: str, username: str) -> str | None:
        try:
            data = self.client.copy(dict(self._query(service, username), **{C.kSecReturnData: True}))
        except KeychainError as e:
            if e.status == C.errSecItemNotFound:
                return None
            raise KeyringError(str(e)) from e
        return bytes(data).decode("utf-8")

    def set_password(self, service: str, username: str, password: str) -> None:
        self._validate_username(username)
        secret = password.encode("utf-8")
        item = dict(self._query(service, username), **{
            C.kSecValueData: secret,
            C.kSecAttrLabel: f"Password for '{username}' on '{service}'",
        })
        try:
            self.client.add(item)
            return
        except KeychainError as e:
            if e.status != C.errSecDuplicateItem:
                raise PasswordSetError(str(e)) from e
        try:  # Apple's upsert: add, and on errSecDuplicateItem update the existing item
            # ...the one the add collided with, in the group the add went to, not every group.
            query = self._query(service, username)
            query.setdefault(C.kSecAttrAccessGroup, self.client.default_group())
            self.client.update(query, {C.kSecValueData: secret})
        except KeychainError as e:
            raise PasswordSetError(str(e)) from e

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
        return SimpleCredential(item.get(C.kSecAttrAccount, ""), bytes(item.get(C.kSecValueData, b"")).decode("utf-8"))
