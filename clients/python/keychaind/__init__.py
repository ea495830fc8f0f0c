"""Python client for keychaind, Apple's Keychain Services for Linux.

    from keychaind import *

    c = Client()
    c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: "com.example.app",
           kSecAttrAccount: "alice", kSecValueData: b"s3cret"})
    c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: "com.example.app",
            kSecAttrAccount: "alice", kSecReturnData: True})          # -> b"s3cret"

The protocol is docs/protocol.md in the keychaind repository.
"""

from .constants import *  # noqa: F401,F403 — kSec…, errSec…, SecCopyErrorMessageString
from .constants import __all__ as _constant_names
from .errors import KeychainError
from .client import (Client, SecItemAdd, SecItemCopyMatching, SecItemDelete, SecItemUpdate,
                     DEVICE_ID_ACCOUNT, DEVICE_ID_SERVICE, shared_client)
from .wire import socket_path

__version__ = "0.1.0"

__all__ = list(_constant_names) + [
    "KeychainError", "Client", "SecItemAdd", "SecItemCopyMatching", "SecItemUpdate", "SecItemDelete",
    "DEVICE_ID_SERVICE", "DEVICE_ID_ACCOUNT", "shared_client", "socket_path",
]
