"""The keyring backend: viability, one namespace, set against delete, exceptions, frame limit."""

from __future__ import annotations

import json
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
from keyring.errors import KeyringError, PasswordDeleteError, PasswordSetError  # noqa: E402

from keychaind import (Client, kSecAttrAccessGroup, kSecAttrAccount, kSecAttrService, kSecClass,  # noqa: E402
                       kSecClassGenericPassword, kSecReturnAttributes, kSecReturnData, kSecValueData)
from keychaind import keyring_backend, wire  # noqa: E402
from keychaind.keyring_backend import KeychaindKeyring  # noqa: E402

from conftest import APP1, Daemon, SHARED  # noqa: E402
from fakes import ok  # noqa: E402

BACKEND = "keychaind.keyring_backend.KeychaindKeyring"


@pytest.fixture(autouse=True)
def _fresh_probes(monkeypatch):
    """Each test decides viability afresh; no KEYRING_PROPERTY_* of the caller's leaks in."""
    for name in ("KEYRING_PROPERTY_SOCKET", "KEYRING_PROPERTY_GROUP"):
        monkeypatch.delenv(name, raising=False)
    keyring_backend._forget_probes()
    yield
    keyring_backend._forget_probes()


def _status_server(fake, result):
    """A fake daemon whose `status` answers `result`; it counts the requests it got."""
    return fake(lambda req, conn: ok(req, result) if req["op"] == "status" else ok(req))


def _registered(groups=("G1", "G2")):
    return {"caller": "TEAM.app", "groups": list(groups), "locked": False}


# -- viability ----------------------------------------------------------------------------------------

def test_not_viable_without_a_socket(monkeypatch, tmp_path):
    monkeypatch.setenv("KEYCHAIND_SOCKET", str(tmp_path / "none.sock"))
    with pytest.raises(RuntimeError, match="not running"):
        KeychaindKeyring.priority  # noqa: B018
    assert not KeychaindKeyring.viable


def test_not_viable_with_a_stale_socket(monkeypatch):
    """A socket file left behind by a killed daemon: nobody answers, so keyring must look elsewhere."""
    d = tempfile.mkdtemp(prefix="kcd-")
    path = os.path.join(d, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nothing listens
    try:
        monkeypatch.setenv("KEYCHAIND_SOCKET", path)
        with pytest.raises(RuntimeError, match="not running") as e:
            KeychaindKeyring.priority  # noqa: B018
        assert path in str(e.value)
        assert not KeychaindKeyring.viable
    finally:
        shutil.rmtree(d)


def test_viable_after_a_round_trip_which_is_remembered(fake, monkeypatch):
    server = _status_server(fake, _registered())
    monkeypatch.setenv("KEYCHAIND_SOCKET", server.path)
    assert KeychaindKeyring.priority == 9 and KeychaindKeyring.viable
    for _ in range(5):
        assert KeychaindKeyring.viable
    assert [r["op"] for r in server.requests] == ["status"], "one round trip for many questions"


def test_the_socket_property_decides_viability(fake, monkeypatch, tmp_path):
    server = _status_server(fake, _registered())
    monkeypatch.setenv("KEYCHAIND_SOCKET", str(tmp_path / "none.sock"))
    assert not KeychaindKeyring.viable
    monkeypatch.setenv("KEYRING_PROPERTY_SOCKET", server.path)
    keyring_backend._forget_probes()
    assert KeychaindKeyring.viable
    kr = KeychaindKeyring()
    assert kr.socket == server.path and kr.client.path == server.path


def test_an_unregistered_interpreter_is_not_viable_and_told_which_file_to_register(fake, monkeypatch):
    server = _status_server(fake, {"caller": None, "groups": None, "locked": False})
    monkeypatch.setenv("KEYCHAIND_SOCKET", server.path)
    with pytest.raises(RuntimeError) as e:
        KeychaindKeyring.priority  # noqa: B018
    message = str(e.value)
    exe = os.path.realpath(sys.executable)
    assert exe in message and "apps.d" in message and '"executables": ["%s"]' % exe in message
    assert not KeychaindKeyring.viable
    # Forced anyway (PYTHON_KEYRING_BACKEND), every call says the same, as keyring's own exception.
    kr = KeychaindKeyring()
    with pytest.raises(PasswordSetError, match="apps.d"):
        kr.set_password("svc", "alice", "pw")
    with pytest.raises(KeyringError, match="apps.d"):
        kr.get_password("svc", "alice")
    with pytest.raises(PasswordDeleteError, match="apps.d"):
        kr.delete_password("svc", "alice")


def test_a_group_the_app_lacks_is_not_viable(fake, monkeypatch):
    server = _status_server(fake, _registered())
    monkeypatch.setenv("KEYCHAIND_SOCKET", server.path)
    monkeypatch.setenv("KEYRING_PROPERTY_GROUP", "OTHER")
    with pytest.raises(RuntimeError, match="OTHER"):
        KeychaindKeyring.priority  # noqa: B018


# -- a process at the socket that is not keychaind ------------------------------------------------------
# Any process of the user can serve the socket (docs/security.md, "No trusted path"). What it answers
# must end as keyring's own exceptions, never as an IndexError, a TypeError, or a password made of
# NUL bytes.

def _impostor(fake, monkeypatch, status_result, copy_answer):
    """A fake daemon: `status` answers `status_result`; `copy` answers the raw body `copy_answer(req)`."""
    def handle(req, conn):
        if req["op"] == "status":
            return ok(req, status_result)
        conn.sendall(wire.frame(copy_answer(req)))
        return None
    server = fake(handle)
    monkeypatch.setenv("KEYCHAIND_SOCKET", server.path)
    return server


@pytest.mark.parametrize("result", [5, 1 << 40, True, 1.5, ["a"], {"a": 1}])
def test_a_result_of_the_wrong_type_is_a_keyring_error(fake, monkeypatch, result):
    _impostor(fake, monkeypatch, _registered(), lambda req: wire.encode(ok(req, result)))
    kr = KeychaindKeyring()
    with pytest.raises(KeyringError, match="keychaind"):
        kr.get_password("svc", "alice")
    if not isinstance(result, dict):
        with pytest.raises(KeyringError, match="keychaind"):
            kr.get_credential("svc", None)


def test_a_copy_answered_without_a_result_is_a_keyring_error(fake, monkeypatch):
    _impostor(fake, monkeypatch, _registered(), lambda req: wire.encode(ok(req)))
    kr = KeychaindKeyring()
    with pytest.raises(KeyringError):
        kr.get_password("svc", "alice")
    with pytest.raises(KeyringError):
        kr.get_credential("svc", None)


def test_an_answer_outside_the_protocol_is_a_keyring_error(fake, monkeypatch):
    """A bignum status (CBOR tag 2): its text form raised ValueError from inside KeychainError."""
    def bignum(req):
        return (bytes.fromhex("a2626964") + wire.encode(req["id"]) + bytes.fromhex("66737461747573c2590708")
                + b"\xff" * 1800)
    _impostor(fake, monkeypatch, _registered(), bignum)
    with pytest.raises(KeyringError, match="errSecDecode"):
        KeychaindKeyring().get_password("svc", "alice")


@pytest.mark.parametrize("status_result", [
    {"caller": "x", "groups": [1]}, {"caller": "x", "groups": "G1"}, [1], "text", 7, True])
def test_a_status_of_the_wrong_shape_makes_the_backend_unusable_not_broken(fake, monkeypatch, status_result):
    _impostor(fake, monkeypatch, status_result, lambda req: wire.encode(ok(req, b"pw")))
    with pytest.raises(RuntimeError):
        KeychaindKeyring.priority  # noqa: B018
    assert not KeychaindKeyring.viable
    with pytest.raises(KeyringError):
        KeychaindKeyring().get_password("svc", "alice")


def test_registered_as_a_keyring_entry_point():
    from importlib.metadata import entry_points
    eps = entry_points()
    group = eps.select(group="keyring.backends") if hasattr(eps, "select") else eps.get("keyring.backends", [])
    assert any(ep.name == "keychaind" and ep.value == "keychaind.keyring_backend" for ep in group)


# -- against the real daemon -----------------------------------------------------------------------

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
    # stored as Apple's generic password: svce = service, acct = username, in the app's first group
    with daemon.client() as c:
        attrs = c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecReturnAttributes: True})
    assert attrs[kSecAttrAccount] == "bob" and attrs[kSecAttrService] == service
    assert attrs[kSecAttrAccessGroup] == APP1
    backend.delete_password(service, "bob")
    assert backend.get_password(service, "bob") is None
    with pytest.raises(PasswordDeleteError):
        backend.delete_password(service, "bob")


STORE_IN_SHARED = """
import json
from keychaind import *
c = Client()
c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: %(service)r, kSecAttrAccount: "alice",
       kSecAttrAccessGroup: %(shared)r, kSecValueData: b"theirs"})
print(json.dumps({"ok": True}))
"""


def _shared_item(daemon, service):
    """The other app's item in the shared group, as the daemon has it (None when gone)."""
    with daemon.client() as c:
        try:
            return c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecAttrAccount: "alice",
                           kSecAttrAccessGroup: SHARED, kSecReturnData: True})
        except Exception:  # noqa: BLE001
            return None


def test_one_group_for_reads_writes_and_deletes(backend, daemon):
    """Another app stored service/alice in a group both apps share: the backend neither reads it, nor
    lets a set hide behind it, nor deletes it — it works in the app's default group only."""
    service = f"kr.{uuid.uuid4().hex[:10]}"
    assert daemon.run_python(daemon.app2_python, STORE_IN_SHARED % {"service": service, "shared": SHARED}) == {"ok": True}
    assert backend.get_password(service, "alice") is None, "the shared item is not this backend's"
    backend.set_password(service, "alice", "mine")
    assert backend.get_password(service, "alice") == "mine"
    backend.set_password(service, "alice", "mine, changed")
    assert backend.get_password(service, "alice") == "mine, changed"
    assert _shared_item(daemon, service) == b"theirs", "the other app's item is untouched"
    backend.delete_password(service, "alice")
    assert _shared_item(daemon, service) == b"theirs", "delete removed only the backend's own item"
    assert backend.get_password(service, "alice") is None
    with pytest.raises(PasswordDeleteError):
        backend.delete_password(service, "alice")
    assert _shared_item(daemon, service) == b"theirs"


def test_the_group_property_selects_the_namespace(daemon, monkeypatch):
    service = f"kr.{uuid.uuid4().hex[:10]}"
    assert daemon.run_python(daemon.app2_python, STORE_IN_SHARED % {"service": service, "shared": SHARED}) == {"ok": True}
    monkeypatch.setenv("KEYCHAIND_SOCKET", daemon.socket)
    monkeypatch.setenv("KEYRING_PROPERTY_GROUP", SHARED)
    kr = KeychaindKeyring()
    assert kr.group == SHARED
    assert kr.get_password(service, "alice") == "theirs"
    kr.set_password(service, "alice", "ours now")
    assert _shared_item(daemon, service) == b"ours now"
    kr.delete_password(service, "alice")
    assert _shared_item(daemon, service) is None


def test_keyring_cli_with_another_apps_item_in_a_shared_group(daemon):
    service = f"cli.{uuid.uuid4().hex[:10]}"
    assert daemon.run_python(daemon.app2_python, STORE_IN_SHARED % {"service": service, "shared": SHARED}) == {"ok": True}
    r = _keyring_cli(daemon, "set", service, "alice", stdin="mine\n")
    assert r.returncode == 0, r.stderr
    r = _keyring_cli(daemon, "get", service, "alice")
    assert (r.returncode, r.stdout) == (0, "mine\n"), r.stderr
    r = _keyring_cli(daemon, "del", service, "alice")
    assert r.returncode == 0, r.stderr
    assert _shared_item(daemon, service) == b"theirs"
    r = _keyring_cli(daemon, "get", service, "alice")
    assert (r.returncode, r.stdout) == (1, ""), "the other app's item is not read back"


RACER = """
import json, sys, time
from keyring.errors import PasswordDeleteError, PasswordSetError
from keychaind.keyring_backend import KeychaindKeyring
role, service, rounds, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
kr = KeychaindKeyring()
kr.get_password(service, "warm-up")  # connect and learn the group before the start line
while time.time() < start:
    time.sleep(0.001)
failures, errors = 0, []
for i in range(rounds):
    if role == "set":
        try:
            kr.set_password(service, "racer", "value-%d" % i)
        except PasswordSetError as e:
            failures += 1
            errors.append(str(e))
    else:
        try:
            kr.delete_password(service, "racer")
        except PasswordDeleteError:
            pass
print(json.dumps({"role": role, "failures": failures, "errors": errors[:3]}))
"""


def test_set_always_succeeds_while_other_processes_delete(daemon):
    """4 processes set one password while 4 others delete it: every set succeeds."""
    import time
    service = f"race.{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, KEYCHAIND_SOCKET=daemon.socket)
    env.pop("PYTHON_KEYRING_BACKEND", None)
    start = time.time() + 3
    procs = [subprocess.Popen([sys.executable, "-c", RACER, role, service, "150", str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role in ["set"] * 4 + ["delete"] * 4]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    setters = [r for r in results if r["role"] == "set"]
    assert len(setters) == 4
    assert sum(r["failures"] for r in setters) == 0, setters


def test_only_keyrings_exceptions_escape(backend, daemon):
    service = f"kr.{uuid.uuid4().hex[:10]}"
    with daemon.client() as c:  # raw bytes that are not UTF-8, as another client may store
        c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecAttrAccount: "raw",
               kSecValueData: b"\xff\xfe\x00"})
        c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: service + ".acct",
               kSecAttrAccount: "bytes-account".encode(), kSecValueData: "ünïcode".encode()})
    with pytest.raises(KeyringError, match="not UTF-8"):
        backend.get_password(service, "raw")
    with pytest.raises(KeyringError, match="not UTF-8"):
        backend.get_credential(service, None)
    # An account written as bytes (as Swift code using Data accounts does) is still a username.
    cred = backend.get_credential(service + ".acct", None)
    assert (cred.username, cred.password) == ("bytes-account", "ünïcode")
    assert backend.get_password(service + ".acct", "bytes-account") == "ünïcode"
    with pytest.raises(PasswordSetError, match="lone surrogate"):
        backend.set_password(service, "alice", "bad\ud800")
    with pytest.raises(PasswordSetError, match="lone surrogate"):
        backend.set_password(service + "\udc80", "alice", "pw")
    with pytest.raises(KeyringError, match="lone surrogate"):
        backend.get_password(service, "al\udfffice")
    with pytest.raises(PasswordDeleteError, match="lone surrogate"):
        backend.delete_password(service, "al\udfffice")
    backend.delete_password(service, "raw")


def test_large_passwords_follow_the_daemons_frame_limit(backend, daemon):
    service = f"kr.{uuid.uuid4().hex[:10]}"
    big = "x" * (2 << 20)
    with pytest.raises(PasswordSetError, match="exceeds the limit of 1048576 bytes.*must fit in maxFrameBytes"):  # the daemon's own limit
        backend.set_password(service, "big", big)
    backend.set_password(service, "small", "fine")  # the backend reconnects
    assert backend.get_password(service, "small") == "fine"

    root = Path(tempfile.mkdtemp(prefix="kcd-big-"))
    roomy = Daemon(root)
    roomy.config.write_text(json.dumps({"maxFrameBytes": 4 << 20}) + "\n")
    try:
        roomy.start()
        kr = KeychaindKeyring().with_properties(socket=roomy.socket)
        kr.set_password(service, "big", big)
        assert kr.get_password(service, "big") == big
    finally:
        roomy.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_an_unregistered_interpreter_is_told_which_file_to_register(daemon):
    code = """
import json, os
from keyring.errors import PasswordSetError
from keychaind.keyring_backend import KeychaindKeyring
out = {"viable": KeychaindKeyring.viable}
try:
    KeychaindKeyring.priority
except RuntimeError as e:
    out["priority"] = str(e)
try:
    KeychaindKeyring().set_password("svc", "alice", "pw")
except PasswordSetError as e:
    out["set"] = str(e)
print(json.dumps(out))
"""
    out = daemon.run_python(daemon.stranger_python, code)
    exe = os.path.realpath(daemon.stranger_python)
    assert out["viable"] is False
    for key in ("priority", "set"):
        assert exe in out[key] and "apps.d" in out[key] and '"executables": ["%s"]' % exe in out[key], out[key]
        # The folder is the daemon's own (its --config), as the daemon says, not a guess from $HOME.
        assert str(daemon.apps) in out[key], out[key]


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
