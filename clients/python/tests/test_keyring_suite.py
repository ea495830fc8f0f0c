"""keyring's own backend test suite (keyring.testing.backend.BackendBasicTests) against keychaind."""

from __future__ import annotations

import pytest

pytest.importorskip("keyring")
from keyring.testing.backend import BackendBasicTests  # noqa: E402

from keychaind import keyring_backend  # noqa: E402
from keychaind.keyring_backend import KeychaindKeyring  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _daemon_socket(daemon):
    TestKeyringsOwnSuite.socket_path = daemon.socket
    keyring_backend._forget_probes()
    yield
    keyring_backend._forget_probes()


class TestKeyringsOwnSuite(BackendBasicTests):
    socket_path: str | None = None

    def init_keyring(self):
        return KeychaindKeyring().with_properties(socket=self.socket_path)
