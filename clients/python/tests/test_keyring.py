"""The keyring backend: viability without a daemon, and round trips against the real one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

keyring = pytest.importorskip("keyring")
from keyring.errors import PasswordDeleteError  # noqa: E402

from keychaind import Client, kSecAttrAccount, kSecAttrService, kSecClass, kSecClassGenericPassword, kSecReturnAttributes  # noqa: E402
from keychaind.keyring_backend import KeychaindKeyring  # noqa: E402

BACKEND = "keychaind.keyring_backend.KeychaindKeyring"


def test_not_viable_without_a_socket(monkeypatch):
    monkeypatch.setenv("KEYCHAIND_SOCKET", os.path.join(tempfile.mkdtemp(prefix="kcd-"), "none.sock"))
    with pytest.raises(RuntimeError, match="not running"):
        KeychaindKeyring.priority  # noqa: B018
    assert not KeychaindKeyring.viable


def test_viable_when_the_socket_exists(monkeypatch):
    d = tempfile.mkdtemp(prefix="kcd-")
    path = os.path.join(d, "s.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    try:
        monkeypatch.setenv("KEYCHAIND_SOCKET", path)
        assert KeychaindKeyring.priority >= 9 and KeychaindKeyring.viable
    finally:
        s.close()
        shutil.rmtree(d)


def test_registered_as_a_keyring_entry_point():
    from importlib.metadata import entry_points
    eps = entry_points()
    group = eps.select(group="keyring.backends") if hasattr(eps, "select") else eps.get("keyring.backends", [])
    assert any(ep.name == "keychaind" and ep.value == "keychaind.keyring_backend" for ep in group)


@pytest.fixture
def backend(daemon, monkeypatch):
    monkeypatch.setenv("KEYCHAIND_SOCKET", daemon.socket)
    kr = KeychaindKeyring()
    yield kr
    if kr._client is not None:
        kr._client.close()


def test_backend_round_trip(backend, daemon):
    service = f"kr.{uuid.uuid4().hex[:10]}"
    assert backend.get_password(service, "bob") is None
    backend.set_password(service, "bob", "pässwörd")
    assert backend.get_password(service, "bob") == "pässwörd"
    backend.set_password(service, "bob", "second")  # add → duplicate → update
    assert backend.get_password(service, "bob") == "second"
    cred = backend.get_credential(service, None)
    assert (cred.username, cred.password) == ("bob", "second")
    # stored as Apple's generic password: svce = service, acct = username
    with daemon.client() as c:
        attrs = c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecReturnAttributes: True})
    assert attrs[kSecAttrAccount] == "bob" and attrs[kSecAttrService] == service
    backend.delete_password(service, "bob")
    assert backend.get_password(service, "bob") is None
    with pytest.raises(PasswordDeleteError):
        backend.delete_password(service, "bob")


def _keyring_cli(daemon, *args, stdin=None, backend_env=True):
    # a keyringrc.cfg of the user's must not choose another backend: an empty config home
    env = dict(os.environ, KEYCHAIND_SOCKET=daemon.socket, XDG_CONFIG_HOME=str(daemon.root / "xdg-config"),
               XDG_DATA_HOME=str(daemon.root / "xdg-data"))
    env.pop("PYTHON_KEYRING_BACKEND", None)
    if backend_env:
        env["PYTHON_KEYRING_BACKEND"] = BACKEND
    # `python -m keyring` runs under this interpreter, the executable registered as app1
    return subprocess.run([sys.executable, "-m", "keyring", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=300)


def test_keyring_cli_round_trip(daemon):
    service = f"cli.{uuid.uuid4().hex[:10]}"
    r = _keyring_cli(daemon, "set", service, "carol", stdin="hunter2\n")
    assert r.returncode == 0, r.stderr
    r = _keyring_cli(daemon, "get", service, "carol")
    assert (r.returncode, r.stdout) == (0, "hunter2\n"), r.stderr
    # through the entry point, without naming the backend
    r = _keyring_cli(daemon, "get", service, "carol", backend_env=False)
    assert (r.returncode, r.stdout) == (0, "hunter2\n"), r.stderr
    with Client(daemon.socket) as c:
        assert c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecAttrAccount: "carol",
                       "r_Data": True}) == b"hunter2"
    r = _keyring_cli(daemon, "del", service, "carol")
    assert r.returncode == 0, r.stderr
    r = _keyring_cli(daemon, "get", service, "carol")
    assert r.returncode == 1 and r.stdout == ""


def test_keyring_console_script_if_installed(daemon):
    script = Path(sys.executable).parent / "keyring"
    if not script.exists():
        pytest.skip("no keyring console script beside the interpreter")
    service = f"cli.{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, KEYCHAIND_SOCKET=daemon.socket, PYTHON_KEYRING_BACKEND=BACKEND)
    assert subprocess.run([str(script), "set", service, "dave"], input="pw\n", text=True, env=env,
                          capture_output=True, timeout=300).returncode == 0
    r = subprocess.run([str(script), "get", service, "dave"], text=True, env=env, capture_output=True, timeout=300)
    assert (r.returncode, r.stdout) == (0, "pw\n"), r.stderr
