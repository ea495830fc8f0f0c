"""keychaind as the freedesktop Secret Service, tested with the clients users run.

Each daemon here runs `keychaind --secret-service` on a private session bus that the test starts with
`dbus-run-session`; the clients are Debian's `secret-tool` (libsecret), Python `secretstorage`, and
`keyring`'s SecretService backend, plus hand-made calls (jeepney) for what no client sends.

Who is who (apps.d of each daemon):
  - this test interpreter: app T.py1 (groups T.py1, T.shared)
  - a copy of it, app2-python: app T.py2 (groups T.py2, T.shared)
  - copies of secret-tool, tool1 / tool2: apps T.tool1 / T.tool2
  - a copy of keychainctl, kc-bridge: app T.bridge with the group secret-service (the shared
    collection), to see Secret Service items through the keychain API
  - /usr/bin/secret-tool and a copy of the interpreter (stranger-python): not registered

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import REPO, daemon_binary, interpreter, python_env
from keychaind import Client, KeychainError

jeepney = pytest.importorskip("jeepney")
secretstorage = pytest.importorskip("secretstorage")
from jeepney import DBusAddress, MatchRule, message_bus, new_method_call  # noqa: E402
from jeepney.io.blocking import open_dbus_connection  # noqa: E402
from jeepney.wrappers import DBusErrorResponse, unwrap_msg  # noqa: E402

DEADLINE = 60.0
SECRETS = "org.freedesktop.secrets"
ROOT = "/org/freedesktop/secrets"
SECRET_TOOL = shutil.which("secret-tool")
DBUS_RUN_SESSION = shutil.which("dbus-run-session")

pytestmark = pytest.mark.skipif(not (SECRET_TOOL and DBUS_RUN_SESSION),
                                reason="needs secret-tool (libsecret-tools) and dbus-run-session (dbus); scripts/deps installs them")


def wait_for(what, predicate, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class SessionBus:
    """A private session bus: `dbus-run-session` around a shell that reports the address and sleeps."""

    def __init__(self, root: Path):
        address_file = root / "bus-address"
        self.process = subprocess.Popen(
            [DBUS_RUN_SESSION, "--", "sh", "-c", 'echo "$DBUS_SESSION_BUS_ADDRESS" > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 100000', "sh",
             str(address_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.address = wait_for("the session bus", lambda: address_file.exists() and address_file.read_text().strip())

    def close(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)   # its own process group: dbus-run-session, the bus, sleep
            self.process.wait(30)


class SecretServiceDaemon:
    def __init__(self, root: Path, config: dict | None = None, env: dict | None = None):
        self.root = root
        self.socket = str(root / "run" / "kc.sock")
        self.data = root / "data"
        self.config = root / "config" / "keychaind.json"
        self.apps = root / "config" / "apps.d"
        self.bin = root / "bin"
        self.log_path = root / "keychaind.log"
        self.apps.mkdir(parents=True)
        self.bin.mkdir()
        # Root-owned registrations (the suite runs as root; /tmp above is a sticky root directory).
        self.system_apps = root / "system-apps"
        self.system_apps.mkdir(mode=0o755)
        self.config.write_text(json.dumps(dict({"kdfProfile": "interactive"}, **(config or {}))))
        self.app2_python = self._copy(interpreter(), "app2-python")
        self.stranger_python = self._copy(interpreter(), "stranger-python")
        self.tool1 = self._copy(SECRET_TOOL, "tool1")
        self.tool2 = self._copy(SECRET_TOOL, "tool2")
        self.keychainctl = str(Path(daemon_binary()).parent / "keychainctl")
        self.bridge = self._copy(self.keychainctl, "kc-bridge")
        self._app("py1", "T.py1", ["T.py1", "T.shared"], [interpreter()])
        self._app("py2", "T.py2", ["T.py2", "T.shared"], [self.app2_python])
        self._app("tool1", "T.tool1", ["T.tool1"], [self.tool1])
        self._app("tool2", "T.tool2", ["T.tool2"], [self.tool2])
        self._app("bridge", "T.bridge", ["secret-service"], [self.bridge])
        # The bundled keychainctl as an admin (it sets the passphrase in the prompt tests).
        self._app("admin", "T.admin", ["T.admin"], [os.path.realpath(self.keychainctl)], admin=True)
        self.bus = SessionBus(root)
        self.env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=self.bus.address, KEYCHAIND_SOCKET=self.socket)
        # No display unless a test gives one: a prompt then waits for `keychainctl unlock`, and no
        # real pinentry opens on the desktop of whoever runs the tests.
        for k in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "DISPLAY", "WAYLAND_DISPLAY"):
            self.env.pop(k, None)
        self.env.update(env or {})
        self.process = None
        self.start()

    def _copy(self, source, name):
        target = self.bin / name
        shutil.copy2(source, target)
        return str(target)

    def _app(self, name, identifier, groups, executables, admin=False, system=False, secret_service=None):
        entry = {"application-identifier": identifier, "keychain-access-groups": groups, "executables": executables}
        if admin:
            entry["admin"] = True
        if secret_service is not None:
            entry["secretService"] = secret_service
        (self.system_apps if system else self.apps).joinpath(f"{name}.json").write_text(json.dumps(entry))

    def start(self):
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(daemon_binary()), "--socket", self.socket, "--data-dir", str(self.data), "--config", str(self.config),
             "--system-apps-dir", str(self.system_apps), "--secret-service", "--log-level", "debug"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=dict(self.env, SWIFT_BACKTRACE="enable=no"))

        def serving():
            if self.process.poll() is not None:
                raise AssertionError(f"keychaind exited with {self.process.returncode}:\n{self.log_text()}")
            try:
                with Client(self.socket, timeout=10) as c:
                    c.status()     # answered only once the bus name is taken (it is taken before serving)
                return True
            except (KeychainError, OSError):
                return False
        wait_for("keychaind to serve", serving)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.log.close()

    def close(self):
        self.stop()
        self.bus.close()

    def log_text(self):
        return self.log_path.read_text(errors="replace")[-6000:]

    def run(self, argv, input: bytes | None = None, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
        return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, env=self.env)

    def python(self, executable: str, code: str, deadline: float = DEADLINE) -> dict:
        """Runs `code` under `executable`; its last line of output is one JSON object. Reads until
        every process holding its stdout is gone (children included)."""
        env = python_env(dict(DBUS_SESSION_BUS_ADDRESS=self.bus.address, KEYCHAIND_SOCKET=self.socket))
        proc = subprocess.Popen([executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out, err = proc.communicate(timeout=deadline)      # EOF on stdout: the child that kept it exited too
        assert proc.returncode == 0, f"{executable} failed ({proc.returncode}):\n{err}"
        lines = out.strip().splitlines()
        assert lines, f"{executable} printed nothing:\n{err}"
        return json.loads(lines[-1])

    @contextmanager
    def bus_environment(self):
        """This process's own clients (secretstorage, keyring, jeepney) talk to this daemon's bus."""
        old = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = self.bus.address
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
            else:
                os.environ["DBUS_SESSION_BUS_ADDRESS"] = old

    def connection(self):
        return open_dbus_connection(bus=self.bus.address)

    def status(self) -> str:
        proc = self.run([self.keychainctl, "status"])
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.decode()

    def locked(self) -> bool:
        with Client(self.socket, timeout=10) as c:
            return c.status()["locked"]


def make_daemon(config=None, env=None):
    binary = daemon_binary()
    if not binary.exists():
        pytest.skip(f"keychaind binary not found at {binary}")
    root = Path(tempfile.mkdtemp(prefix="kcd-ss-"))
    try:
        d = SecretServiceDaemon(root, config, env)
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return d, root


@pytest.fixture(scope="module")
def ss():
    d, root = make_daemon()
    yield d
    d.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh():
    """A daemon of its own (for tests that lock the keychain or change settings)."""
    made = []

    def make(config=None, env=None):
        d, root = make_daemon(config, env)
        made.append((d, root))
        return d
    yield make
    for d, root in made:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


def unique(prefix="svc"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def call(conn, path, interface, member, signature=None, body=()):
    msg = new_method_call(DBusAddress(path, bus_name=SECRETS, interface=interface), member, signature, body)
    return unwrap_msg(conn.send_and_get_reply(msg, timeout=DEADLINE))


def error_of(conn, path, interface, member, signature=None, body=()):
    with pytest.raises(DBusErrorResponse) as e:
        call(conn, path, interface, member, signature, body)
    return e.value.name, str(e.value.data)


def first_item(json_output: bytes) -> dict:
    """The first item `keychainctl find --json` printed (one object, or a list of them)."""
    found = json.loads(json_output)
    return found[0] if isinstance(found, list) else found


SERVICE = "org.freedesktop.Secret.Service"
LIMITS_EXCEEDED = "org.freedesktop.DBus.Error.LimitsExceeded"
# keychaind's limits on the bus (SecretService.swift)
MAX_OBJECTS_PER_CALL, MAX_SESSIONS_PER_CALLER, MAX_SESSIONS, MAX_PROMPTS = 4096, 32, 1024, 128
COLLECTION = "org.freedesktop.Secret.Collection"
ITEM = "org.freedesktop.Secret.Item"


# MARK: secret-tool, as users run it


def test_secret_tool_store_lookup_search_clear(ss):
    service = unique()
    r = ss.run([SECRET_TOOL, "store", "--label=Mail password", "service", service, "account", "alice"], input=b"s3cret")
    assert r.returncode == 0, r.stderr
    r = ss.run([SECRET_TOOL, "lookup", "service", service, "account", "alice"])
    assert r.returncode == 0 and r.stdout == b"s3cret"
    r = ss.run([SECRET_TOOL, "search", "--all", "service", service])
    out = r.stdout.decode()
    assert r.returncode == 0 and "label = Mail password" in out and "secret = s3cret" in out
    # secret-tool prints the attributes on stderr
    assert f"attribute.service = {service}" in r.stderr.decode() and "attribute.account = alice" in r.stderr.decode()
    # store again replaces (libsecret stores with replace): still one item, the new secret
    assert ss.run([SECRET_TOOL, "store", "--label=Mail password", "service", service, "account", "alice"], input=b"new").returncode == 0
    r = ss.run([SECRET_TOOL, "search", "--all", "service", service])
    assert r.stdout.decode().count("secret = ") == 1 and b"secret = new" in r.stdout
    assert ss.run([SECRET_TOOL, "clear", "service", service, "account", "alice"]).returncode == 0
    r = ss.run([SECRET_TOOL, "lookup", "service", service, "account", "alice"])
    assert r.returncode != 0 and r.stdout == b""


def test_items_are_keychain_items_in_both_directions(ss):
    # secret-tool (unregistered: the shared collection, group secret-service) → the keychain API.
    service = unique()
    assert ss.run([SECRET_TOOL, "store", "--label=Shared", "service", service, "account", "bob"], input=b"from-ss").returncode == 0
    r = ss.run([ss.bridge, "find", "-g", "secret-service", "-s", service, "-a", "bob", "-w"])
    assert r.returncode == 0 and r.stdout == b"from-ss\n", r.stderr
    r = ss.run([ss.bridge, "find", "-g", "secret-service", "-s", service, "-a", "bob", "--json"])
    assert first_item(r.stdout)["labl"] == "Shared"
    # the keychain API → secret-tool
    other = unique()
    assert ss.run([ss.bridge, "add", "-g", "secret-service", "-s", other, "-a", "carol", "-l", "From SecItem", "-w", "from-secitem"]).returncode == 0
    r = ss.run([SECRET_TOOL, "lookup", "service", other, "account", "carol"])
    assert r.returncode == 0 and r.stdout == b"from-secitem"
    r = ss.run([SECRET_TOOL, "search", "--all", "service", other])
    assert b"label = From SecItem" in r.stdout and b"attribute.account = carol" in r.stderr
    # an update through the keychain API is what the Secret Service reads next
    assert ss.run([ss.bridge, "update", "-g", "secret-service", "-s", other, "-a", "carol", "-w", "changed"]).returncode == 0
    assert ss.run([SECRET_TOOL, "lookup", "service", other, "account", "carol"]).stdout == b"changed"
    # attributes other than service+account are the item's own; its account is its id
    odd = unique()
    assert ss.run([SECRET_TOOL, "store", "--label=Odd", "service", odd, "username", "dave", "xdg:schema", "org.example.Odd"],
                  input=b"odd-secret").returncode == 0
    r = ss.run([ss.bridge, "find", "-g", "secret-service", "-s", odd, "--json"])
    assert r.returncode == 0, r.stderr
    found = first_item(r.stdout)
    assert found["labl"] == "Odd" and len(found["acct"]) == 32
    r = ss.run([ss.bridge, "find", "-g", "secret-service", "-s", odd, "-w"])
    assert r.stdout == b"odd-secret\n"
    assert ss.run([SECRET_TOOL, "clear", "service", odd, "username", "dave"]).returncode == 0
    assert ss.run([ss.bridge, "find", "-g", "secret-service", "-s", odd]).returncode == 44     # errSecItemNotFound


NETWORK_SCHEMA = "org.gnome.keyring.NetworkPassword"


def shown_fields(out: bytes) -> list[tuple[str, str]]:
    """The `name   value` lines `keychainctl find-internet-password` prints."""
    return [tuple(line.split(None, 1) + [""])[:2] for line in out.decode().splitlines() if line.strip()]


def test_network_password_items_are_internet_passwords_in_both_directions(ss):
    # secret-tool under the NetworkPassword schema → an internet password the keychain API finds
    server, user = unique("host") + ".example.com", unique("alice")
    r = ss.run([SECRET_TOOL, "store", "--label=x", "xdg:schema", NETWORK_SCHEMA, "user", user, "server", server,
                "protocol", "https", "port", "443"], input=b"net-secret")
    assert r.returncode == 0, r.stderr
    r = ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", server, "-a", user, "-r", "htps",
                "-P", "443", "-w"])
    assert r.returncode == 0 and r.stdout == b"net-secret\n", r.stderr
    r = ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", server, "-a", user])
    fields = shown_fields(r.stdout)
    assert r.returncode == 0 and ("protocol", "htps") in fields and ("port", "443") in fields, r.stdout
    # a generic query never returns it
    assert ss.run([ss.bridge, "find", "-g", "secret-service", "-a", user]).returncode == 44
    # storing again replaces it: one item, the new secret
    r = ss.run([SECRET_TOOL, "store", "--label=x", "xdg:schema", NETWORK_SCHEMA, "user", user, "server", server,
                "protocol", "https", "port", "443"], input=b"renewed")
    assert r.returncode == 0, r.stderr
    r = ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", server, "--all"])
    assert shown_fields(r.stdout).count(("protocol", "htps")) == 1, r.stdout
    assert ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", server, "-w"]).stdout == b"renewed\n"

    # keychainctl add-internet-password → secret-tool finds it by the schema's attributes
    other, bob = unique("host") + ".example.org", unique("bob")
    r = ss.run([ss.bridge, "add-internet-password", "--group", "secret-service", "-a", bob, "-s", other, "-r", "htps",
                "-P", "8443", "-p", "/login", "-d", "realm", "-t", "form", "-l", "From SecItem", "-w", "inet-pw"])
    assert r.returncode == 0, r.stderr
    r = ss.run([SECRET_TOOL, "lookup", "server", other, "user", bob])
    assert r.returncode == 0 and r.stdout == b"inet-pw", r.stderr
    r = ss.run([SECRET_TOOL, "lookup", "xdg:schema", NETWORK_SCHEMA, "server", other, "protocol", "https", "port", "8443"])
    assert r.returncode == 0 and r.stdout == b"inet-pw", r.stderr
    r = ss.run([SECRET_TOOL, "search", "--all", "xdg:schema", NETWORK_SCHEMA])
    assert r.returncode == 0 and b"label = From SecItem" in r.stdout and b"secret = inet-pw" in r.stdout, r.stderr
    shown = r.stderr.decode()
    # (secret-tool does not print xdg:schema; the search above found the item by it)
    for name, value in [("user", bob), ("server", other), ("protocol", "https"),
                        ("port", "8443"), ("object", "/login"), ("domain", "realm"), ("authtype", "form")]:
        assert f"attribute.{name} = {value}" in shown, shown
    # another port, or a generic password's attributes, finds nothing
    assert ss.run([SECRET_TOOL, "lookup", "server", other, "user", bob, "port", "80"]).returncode != 0
    assert ss.run([SECRET_TOOL, "lookup", "service", other, "account", bob]).returncode != 0
    assert ss.run([SECRET_TOOL, "clear", "server", other, "user", bob]).returncode == 0
    r = ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", other])
    assert r.returncode == 44, r.stdout


def test_network_password_attributes_that_are_no_internet_password_stay_the_items_own(ss):
    # an unknown protocol is kept as written; an attribute the schema lacks keeps the item a Secret Service one
    server, user = unique("host") + ".example.net", unique("carol")
    r = ss.run([SECRET_TOOL, "store", "--label=y", "xdg:schema", NETWORK_SCHEMA, "user", user, "server", server,
                "protocol", "gopher"], input=b"g")
    assert r.returncode == 0, r.stderr
    r = ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", server, "-a", user])
    assert r.returncode == 0 and ("protocol", "gopher") in shown_fields(r.stdout), r.stdout
    r = ss.run([SECRET_TOOL, "search", "--all", "server", server])
    assert "attribute.protocol = gopher" in r.stderr.decode(), r.stderr
    odd = unique("host")
    r = ss.run([SECRET_TOOL, "store", "--label=z", "xdg:schema", NETWORK_SCHEMA, "server", odd, "colour", "blue"], input=b"o")
    assert r.returncode == 0, r.stderr
    assert ss.run([ss.bridge, "find-internet-password", "--group", "secret-service", "-s", odd]).returncode == 44
    r = ss.run([SECRET_TOOL, "lookup", "server", odd, "colour", "blue"])
    assert r.returncode == 0 and r.stdout == b"o"


def test_a_login_screen_ported_from_ios_saves_an_internet_password_secret_tool_finds(ss):
    # Examples/login-example: iOS code (import Security, SecItemAdd of kSecClassInternetPassword) as
    # a registered app that names the shared collection's group.
    # (beside the daemon, else in the debug build: scripts/test runs the daemon from a folder of links)
    example = next((p for p in [Path(daemon_binary()).parent / "login-example", REPO / ".build" / "debug" / "login-example"]
                    if p.exists()), None)
    assert example, "Examples/login-example is not built: `swift build` builds it with keychaind"
    app = ss._copy(str(example), "login-app")
    ss._app("login", "T.login", ["T.login", "secret-service"], [app])
    server, user = unique("mail") + ".example.com", unique("alice")
    url = f"https://{server}:8443"
    r = ss.run([app, "save", url, user, "--group", "secret-service"], input=b"typed-at-login\n")
    assert r.returncode == 0, r.stderr
    r = ss.run([app, "load", url, user, "--group", "secret-service"])
    assert r.returncode == 0 and r.stdout == b"typed-at-login\n", r.stderr

    # keychainctl find-internet-password finds it by server, with the attributes the app gave it
    r = ss.run([ss.keychainctl, "find-internet-password", "--group", "secret-service", "-s", server, "-a", user, "-w"])
    assert r.returncode == 0 and r.stdout == b"typed-at-login\n", r.stderr
    r = ss.run([ss.keychainctl, "find-internet-password", "--group", "secret-service", "-s", server])
    shown = dict(line.split("  ", 1) for line in r.stdout.decode().splitlines() if "  " in line)
    shown = {name: value.strip() for name, value in shown.items()}
    assert r.returncode == 0 and shown["account"] == user and shown["protocol"] == "htps", r.stdout
    assert shown["port"] == "8443" and shown["authentication type"] == "form", r.stdout
    assert shown["label"] == f"{server} ({user})", r.stdout

    # secret-tool (not registered: the shared collection) finds it under the network schema
    r = ss.run([SECRET_TOOL, "search", "--all", "xdg:schema", NETWORK_SCHEMA, "server", server])
    assert r.returncode == 0 and b"secret = typed-at-login" in r.stdout, (r.stdout, r.stderr)
    for name, value in [("user", user), ("server", server), ("protocol", "https"), ("port", "8443"),
                        ("authtype", "form")]:
        assert f"attribute.{name} = {value}" in r.stderr.decode(), r.stderr
    assert ss.run([SECRET_TOOL, "lookup", "xdg:schema", NETWORK_SCHEMA, "server", server, "user", user]).stdout \
        == b"typed-at-login"

    # the user changes the password at the login screen: one item, the new secret, for both
    r = ss.run([app, "save", url, user, "--group", "secret-service"], input=b"changed\n")
    assert r.returncode == 0, r.stderr
    r = ss.run([SECRET_TOOL, "search", "--all", "xdg:schema", NETWORK_SCHEMA, "server", server])
    assert r.stdout.count(b"secret = ") == 1 and b"secret = changed" in r.stdout, r.stdout
    # and a password libsecret stores for that login is what the app reads
    r = ss.run([SECRET_TOOL, "store", "--label=x", "xdg:schema", NETWORK_SCHEMA, "user", user, "server", server,
                "protocol", "https", "port", "8443", "authtype", "form"], input=b"from-libsecret")
    assert r.returncode == 0, r.stderr
    r = ss.run([app, "load", url, user, "--group", "secret-service"])
    assert r.returncode == 0 and r.stdout == b"from-libsecret\n", r.stderr


# MARK: Python clients


def test_secretstorage_with_an_encrypted_session(ss):
    with ss.bus_environment():
        conn = secretstorage.dbus_init()
        try:
            collection = secretstorage.get_default_collection(conn)
            assert collection.collection_path.endswith("/aliases/default") or collection.collection_path.endswith("/collection/login")
            assert not collection.is_locked()
            service = unique()
            attributes = {"service": service, "username": "erin", "xdg:schema": "org.example.Test"}
            item = collection.create_item("py item", attributes, b"py-secret", replace=True)
            assert item.item_path.startswith(ROOT + "/collection/login/")
            assert item.get_secret() == b"py-secret" and item.get_label() == "py item"
            assert item.get_attributes() == attributes
            again = collection.create_item("py item 2", attributes, b"second", replace=True)
            assert again.item_path == item.item_path and item.get_secret() == b"second"
            found = list(collection.search_items({"service": service}))
            assert [i.item_path for i in found] == [item.item_path]
            item.set_label("renamed")
            item.set_attributes(dict(attributes, extra="1"))
            assert item.get_label() == "renamed" and item.get_attributes()["extra"] == "1"
            assert [i.item_path for i in secretstorage.search_items(conn, {"extra": "1", "service": service})] == [item.item_path]
            item.set_secret(b"third", content_type="application/octet-stream")
            assert item.get_secret() == b"third" and item.get_secret_content_type() == "application/octet-stream"
            assert item.get_created() > 0 and item.get_modified() >= item.get_created()
            item.delete()
            assert list(collection.search_items({"service": service})) == []
        finally:
            conn.close()


def test_plain_session_over_the_bus(ss):
    with ss.connection() as conn:
        output, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        attrs = {"service": unique(), "account": "frank"}
        props = {"org.freedesktop.Secret.Item.Label": ("s", "plain"), "org.freedesktop.Secret.Item.Attributes": ("a{ss}", attrs)}
        item, prompt = call(conn, ROOT + "/aliases/default", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                            (props, (session, b"", b"plain-secret", "text/plain"), True))
        assert prompt == "/"
        (secret,) = call(conn, item, ITEM, "GetSecret", "o", (session,))
        assert secret == (session, b"", b"plain-secret", "text/plain")
        unlocked, locked = call(conn, ROOT, SERVICE, "SearchItems", "a{ss}", (attrs,))
        assert unlocked == [item] and locked == []
        (secrets,) = call(conn, ROOT, SERVICE, "GetSecrets", "aoo", ([item, item + "x", ROOT + "/collection/login/" + "0" * 32], session))
        assert secrets == {item: (session, b"", b"plain-secret", "text/plain")}
        call(conn, session, "org.freedesktop.Secret.Session", "Close")
        name, _ = error_of(conn, item, ITEM, "GetSecret", "o", (session,))
        assert name in ("org.freedesktop.Secret.Error.NoSession", "org.freedesktop.DBus.Error.UnknownObject")


def test_keyring_secret_service_backend(ss):
    from keyring.backends import SecretService
    service = unique()
    with ss.bus_environment():
        backend = SecretService.Keyring()
        backend.set_password(service, "gina", "kr-secret")
        assert backend.get_password(service, "gina") == "kr-secret"
        backend.set_password(service, "gina", "kr-secret-2")
        assert backend.get_password(service, "gina") == "kr-secret-2"
        # app T.py2 (another registered executable) does not see app T.py1's item
        seen = ss.python(ss.app2_python, f"""
import json
from keyring.backends import SecretService
print(json.dumps({{"value": SecretService.Keyring().get_password({service!r}, "gina")}}))
""")
        assert seen == {"value": None}
        backend.delete_password(service, "gina")
        assert backend.get_password(service, "gina") is None


# MARK: per-app isolation


def test_two_registered_apps_cannot_see_each_others_items(ss):
    service = unique()
    assert ss.run([ss.tool1, "store", "--label=one", "service", service, "account", "a"], input=b"tool1-secret").returncode == 0
    assert ss.run([ss.tool2, "lookup", "service", service, "account", "a"]).stdout == b""
    assert b"tool1-secret" not in ss.run([ss.tool2, "search", "--all", "service", service]).stdout
    assert ss.run([ss.tool2, "store", "--label=two", "service", service, "account", "a"], input=b"tool2-secret").returncode == 0
    assert ss.run([ss.tool1, "lookup", "service", service, "account", "a"]).stdout == b"tool1-secret"
    assert ss.run([ss.tool2, "lookup", "service", service, "account", "a"]).stdout == b"tool2-secret"
    # neither is in the shared collection that unregistered processes use
    assert ss.run([SECRET_TOOL, "lookup", "service", service, "account", "a"]).stdout == b""
    # clearing in one app leaves the other's
    assert ss.run([ss.tool1, "clear", "service", service, "account", "a"]).returncode == 0
    assert ss.run([ss.tool2, "lookup", "service", service, "account", "a"]).stdout == b"tool2-secret"
    # an item path of another app's collection is not an object for this caller
    with ss.bus_environment():
        conn = secretstorage.dbus_init()
        try:
            mine = {c.collection_path for c in secretstorage.get_all_collections(conn)}
            assert mine == {ROOT + "/collection/login", ROOT + "/collection/T_2eshared"}
        finally:
            conn.close()


def test_apps_sharing_a_group_share_its_collection(ss):
    service = unique()
    with ss.bus_environment():
        conn = secretstorage.dbus_init()
        try:
            shared = secretstorage.Collection(conn, ROOT + "/collection/T_2eshared")
            assert shared.get_label() == "T.shared"
            shared.create_item("both", {"service": service}, b"shared-secret")
        finally:
            conn.close()
    seen = ss.python(ss.app2_python, f"""
import json, secretstorage
conn = secretstorage.dbus_init()
items = list(secretstorage.search_items(conn, {{"service": {service!r}}}))
print(json.dumps({{"secrets": [i.get_secret().decode() for i in items], "paths": [i.item_path for i in items]}}))
""")
    assert seen["secrets"] == ["shared-secret"]
    assert seen["paths"][0].startswith(ROOT + "/collection/T_2eshared/")
    # a stranger does not see it
    seen = ss.python(ss.stranger_python, f"""
import json, secretstorage
conn = secretstorage.dbus_init()
print(json.dumps({{"n": len(list(secretstorage.search_items(conn, {{"service": {service!r}}})))}}))
""")
    assert seen == {"n": 0}


def test_unregistered_callers_share_one_collection_and_status_says_so(ss):
    service = unique()
    assert ss.run([SECRET_TOOL, "store", "--label=s", "service", service, "account", "x"], input=b"stranger").returncode == 0
    seen = ss.python(ss.stranger_python, f"""
import json, secretstorage
conn = secretstorage.dbus_init()
items = list(secretstorage.search_items(conn, {{"service": {service!r}}}))
print(json.dumps({{"secrets": [i.get_secret().decode() for i in items]}}))
""")
    assert seen == {"secrets": ["stranger"]}
    assert ss.run([ss.tool1, "lookup", "service", service, "account", "x"]).stdout == b""
    status = ss.status()
    assert "secret service" in status and "share one collection (access group secret-service)" in status


def test_refuse_mode_turns_unregistered_callers_away(fresh):
    d = fresh({"secretServiceUnregistered": "refuse"})
    r = d.run([SECRET_TOOL, "store", "--label=x", "service", "s", "account", "a"], input=b"nope")
    assert r.returncode != 0
    assert b"registered apps only" in r.stderr
    assert d.run([SECRET_TOOL, "lookup", "service", "s", "account", "a"]).returncode != 0
    # registered apps are served as before
    assert d.run([d.tool1, "store", "--label=x", "service", "s", "account", "a"], input=b"ok").returncode == 0
    assert d.run([d.tool1, "lookup", "service", "s", "account", "a"]).stdout == b"ok"
    assert "processes that are not registered apps: refused" in d.status()


def test_a_connection_outliving_its_process_is_refused(ss):
    # The bus gives no per-message credentials: a connection stands for the process that opened it,
    # pinned by a pidfd at its first call. Once that process has exited, a child that inherited the
    # connection is refused instead of speaking as it.
    result = ss.python(ss.app2_python, """
import json, os, sys, time
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import unwrap_msg, DBusErrorResponse
conn = open_dbus_connection(bus="SESSION")
svc = DBusAddress("/org/freedesktop/secrets", bus_name="org.freedesktop.secrets", interface="org.freedesktop.Secret.Service")
unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "SearchItems", "a{ss}", ({"service": "x"},)), timeout=60))
r, w = os.pipe()
parent = os.getpid()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)                       # returns at EOF: the parent has exited
    deadline = time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "SearchItems", "a{ss}", ({"service": "x"},)), timeout=60))
        outcome = {"refused": False}
    except DBusErrorResponse as e:
        outcome = {"refused": True, "name": e.name, "message": str(e.data)}
    print(json.dumps(outcome), flush=True)
    os._exit(0)
os._exit(0)
""")
    assert result["refused"] and result["name"] == "org.freedesktop.DBus.Error.AccessDenied"
    assert "has exited" in result["message"]


def test_with_a_passphrase_only_root_registered_apps_that_ask_are_apps_on_the_bus(fresh):
    # On the bus a caller is whatever its connecting process runs when first asked: any process of
    # the user can connect, then exec a registered app in the connecting process and use the
    # connection from a child. So while a passphrase is set, only a root-owned registration with
    # "secretService": true is identified on the bus; every other app is a process like any other
    # there (the shared collection), and reads nothing of its groups through it.
    d = fresh()
    sys_tool = d._copy(SECRET_TOOL, "sys-tool")
    d._app("systool", "T.systool", ["T.systool"], [sys_tool], system=True, secret_service=True)
    os.kill(d.process.pid, signal.SIGHUP)
    # Its own line: keychaind also reloads when apps.d changes, maybe before the file is complete.
    wait_for("the reload", lambda: d.log_text().count("apps reloaded why=SIGHUP") >= 1)
    mine, theirs = unique("sys"), unique("user")
    assert d.run([sys_tool, "store", "--label=x", "service", mine], input=b"system app").returncode == 0
    assert d.run([d.tool1, "store", "--label=x", "service", theirs], input=b"user app").returncode == 0
    set_passphrase(d)
    # The root-registered app that asked still is itself; the user-registered one is not.
    assert d.run([sys_tool, "lookup", "service", mine]).stdout == b"system app"
    looked = d.run([d.tool1, "lookup", "service", theirs])
    assert looked.stdout == b"", looked


def store_app2_secret(d, prefix):
    """Adds an item of app2's own group holding "py2 secret" through the socket; its service."""
    item = unique(prefix)
    stored = d.python(d.app2_python, f"""
import json
from keychaind import Client
with Client() as c:
    c.add({{"class": "genp", "svce": "{item}", "acct": "a", "v_Data": b"py2 secret", "agrp": "T.py2"}})
print(json.dumps({{"ok": True}}))
""")
    assert stored["ok"]
    return item


# Attack scripts stop the daemon with kcwire.stop_process (it waits until every thread has stopped).
CAMPAIGN = str(Path(__file__).resolve().parents[3] / "scripts" / "campaign")


def test_a_forged_reply_to_the_daemons_credentials_call_is_refused(fresh):
    # dbus-daemon 1.14 delivers a method reply from any connection, and sd-bus matches replies by
    # serial alone. An unregistered process reads the daemon's last serial, stops the daemon, makes
    # its first call, and answers the daemon's GetConnectionCredentials calls itself with the pid of
    # a running registered app. The daemon must refuse replies that do not come from the bus.
    d = fresh()
    item = store_app2_secret(d, "forged")
    app = subprocess.Popen([d.app2_python, "-c", "import time; time.sleep(120)"])
    try:
        result = d.python(d.stranger_python, f"""
import json, os, signal, sys
sys.path.insert(0, {CAMPAIGN!r})
from kcwire import stop_process
from jeepney import DBusAddress, new_method_call, new_method_return, MessageType
from jeepney.low_level import Message, Header, HeaderFields as F, Endianness
from jeepney.io.blocking import open_dbus_connection
daemon, app = {d.process.pid}, {app.pid}
driver = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus")
forger = open_dbus_connection(bus="SESSION")
attacker = open_dbus_connection(bus="SESSION")
owner = forger.send_and_get_reply(new_method_call(driver, "GetNameOwner", "s", ("org.freedesktop.secrets",))).body[0]
intro = DBusAddress("/org/freedesktop/secrets", bus_name=owner, interface="org.freedesktop.DBus.Introspectable")
last = forger.send_and_get_reply(new_method_call(intro, "Introspect")).header.serial
svc = DBusAddress("/org/freedesktop/secrets", bus_name=owner, interface="org.freedesktop.Secret.Service")
stop_process(daemon)
try:
    attacker.send(new_method_call(svc, "OpenSession", "sv", ("plain", ("s", ""))), serial=7)
    # The bus handles one connection's messages in order and queues what it routes to a connection
    # in order: once it has answered a call sent after the OpenSession, the OpenSession waits for
    # the daemon ahead of the forged replies, and they ahead of anything the bus answers the daemon
    # once it runs again (its next serial is last + 1; a few more are forged in case).
    attacker.send_and_get_reply(new_method_call(driver, "GetId"), timeout=60)
    for cookie in range(last + 1, last + 5):
        parent = Message(Header(Endianness.little, MessageType.method_call, 0, 1, 0, cookie, {{F.sender: owner}}), ())
        forger.send(new_method_return(parent, "a{{sv}}", ({{"UnixUserID": ("u", os.getuid()), "ProcessID": ("u", app)}},)))
    forger.send_and_get_reply(new_method_call(driver, "GetId"), timeout=60)
finally:
    os.kill(daemon, signal.SIGCONT)
def reply_to(serial):
    while True:
        m = attacker.receive(timeout=60)
        if m.header.fields.get(F.reply_serial) == serial:
            return m
def outcome(opened, serial):
    out = {{"opened": opened.header.message_type == MessageType.method_return, "secrets": []}}
    if not out["opened"]:
        out["error"] = opened.header.fields.get(F.error_name)
        out["message"] = str(opened.body[0]) if opened.body else ""
        return out
    session = opened.body[1]
    attacker.send(new_method_call(svc, "SearchItems", "a{{ss}}", ({{"service": "{item}"}},)), serial=serial)
    unlocked, locked = reply_to(serial).body
    out["found"] = len(unlocked) + len(locked)
    if unlocked:
        attacker.send(new_method_call(svc, "GetSecrets", "aoo", (unlocked, session)), serial=serial + 1)
        out["secrets"] = [bytes(s[2]).decode() for s in reply_to(serial + 1).body[0].values()]
    return out
forged = outcome(reply_to(7), 8)
# The same connection asks again, nothing forged: it is served as what it is.
attacker.send(new_method_call(svc, "OpenSession", "sv", ("plain", ("s", ""))), serial=20)
again = outcome(reply_to(20), 21)
print(json.dumps({{"forged": forged, "again": again}}))
""")
    finally:
        app.kill()
        app.wait()
    forged, again = result["forged"], result["again"]
    assert not forged["opened"], result
    assert forged["error"] == "org.freedesktop.DBus.Error.AccessDenied", result
    assert "came from" in forged["message"] and "refused" in forged["message"], result
    # Not turned away for good, and still not app2: the shared collection has none of app2's items.
    assert again["opened"] and again["found"] == 0 and again["secrets"] == [], result
    assert "py2 secret" not in json.dumps(result)


def test_a_forged_name_owner_changed_signal_ends_nothing(fresh):
    # keychaind ends a connection's sessions, prompts and identification when the bus says its name
    # left (NameOwnerChanged). Any connection can send that signal to keychaind itself, naming
    # another connection: only the bus's own may count.
    d = fresh()
    item = store_app2_secret(d, "owner")
    victim = subprocess.Popen([d.app2_python, "-c", f"""
import json, sys
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import unwrap_msg, DBusErrorResponse
conn = open_dbus_connection(bus="SESSION")
svc = DBusAddress({ROOT!r}, bus_name={SECRETS!r}, interface={SERVICE!r})
session = unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "OpenSession", "sv", ("plain", ("s", ""))), timeout=60))[1]
found = unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "SearchItems", "a{{ss}}", ({{"service": {item!r}}},)), timeout=60))[0]
print(json.dumps({{"name": conn.unique_name}}), flush=True)
sys.stdin.readline()                    # the attacker has sent its signals and keychaind has read them
try:
    secrets = unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "GetSecrets", "aoo", (found, session)), timeout=60))[0]
    print(json.dumps({{"secrets": [bytes(s[2]).decode() for s in secrets.values()]}}), flush=True)
except DBusErrorResponse as e:
    print(json.dumps({{"error": e.name, "message": str(e.data)}}), flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=python_env(dict(DBUS_SESSION_BUS_ADDRESS=d.bus.address, KEYCHAIND_SOCKET=d.socket)))
    try:
        name = json.loads(victim.stdout.readline())["name"]
        sent = d.python(d.stranger_python, f"""
import json
from jeepney import DBusAddress, new_method_call, new_signal
from jeepney.low_level import HeaderFields
from jeepney.io.blocking import open_dbus_connection
conn = open_dbus_connection(bus="SESSION")
driver = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus")
owner = conn.send_and_get_reply(new_method_call(driver, "GetNameOwner", "s", ({SECRETS!r},)), timeout=60).body[0]
as_bus = DBusAddress("/org/freedesktop/DBus", interface="org.freedesktop.DBus")
for destination in (owner, None):      # to keychaind itself, and broadcast
    signal = new_signal(as_bus, "NameOwnerChanged", "sss", ({name!r}, {name!r}, ""))
    if destination:
        signal.header.fields[HeaderFields.destination] = destination
    conn.send(signal)
# keychaind reads one connection's messages in order: once it has answered this call, it has
# handled the signals sent before it.
intro = DBusAddress({ROOT!r}, bus_name=owner, interface="org.freedesktop.DBus.Introspectable")
conn.send_and_get_reply(new_method_call(intro, "Introspect"), timeout=60)
print(json.dumps({{"sent": True}}))
""")
        assert sent["sent"]
        victim.stdin.write("go\n")
        victim.stdin.flush()
        after = json.loads(victim.stdout.readline())
        victim.stdin.close()
        assert victim.wait(DEADLINE) == 0
    finally:
        victim.kill()
        victim.wait()
    assert after == {"secrets": ["py2 secret"]}, after
    assert "a NameOwnerChanged not sent by the bus ignored" in d.log_text()
    # The bus's own signal still counts: the victim's connection, gone, takes its session along.
    wait_for("the victim's departure", lambda: f"secret service: a caller left the bus name={name} sessions=1" in d.log_text())


def test_the_bus_name_held_by_another_provider(fresh):
    d = fresh()
    d.stop()            # this bus is ours now: another provider takes the name first
    holder = subprocess.Popen([d.stranger_python, "-c", """
import sys, time
from jeepney import message_bus, new_method_call
from jeepney.io.blocking import open_dbus_connection
conn = open_dbus_connection(bus="SESSION")
reply = conn.send_and_get_reply(new_method_call(message_bus, "RequestName", "su", ("org.freedesktop.secrets", 4)), timeout=60)
print(reply.body[0], flush=True)        # 1: primary owner
time.sleep(3600)
"""], stdout=subprocess.PIPE, text=True, env=python_env(dict(DBUS_SESSION_BUS_ADDRESS=d.bus.address)))
    try:
        assert holder.stdout.readline().strip() == "1"
        argv = [str(daemon_binary()), "--socket", d.socket, "--data-dir", str(d.data), "--config", str(d.config), "--secret-service"]
        refused = d.run(argv)
        assert refused.returncode == 1
        message = refused.stderr.decode()
        assert "another Secret Service provider holds org.freedesktop.secrets" in message
        assert f"pid {holder.pid} ({d.stranger_python})" in message and "--replace" in message
        # --replace: the holder (which did not allow replacement) is asked to stop, and keychaind serves
        d.log = open(d.log_path, "ab")
        d.process = subprocess.Popen(argv + ["--replace"], stdin=subprocess.DEVNULL, stdout=d.log, stderr=subprocess.STDOUT, env=d.env)
        assert holder.wait(DEADLINE) == -signal.SIGTERM
        wait_for("keychaind to serve", lambda: d.run([d.keychainctl, "status"]).returncode == 0)
        assert d.run([SECRET_TOOL, "store", "--label=x", "service", "s", "account", "a"], input=b"mine now").returncode == 0
        assert d.run([SECRET_TOOL, "lookup", "service", "s", "account", "a"]).stdout == b"mine now"
        assert "asked the provider holding the name to stop" in d.log_text()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# MARK: signals go only to those who may see the item


def test_item_signals_reach_only_callers_of_that_group(ss):
    with ss.connection() as listener, ss.connection() as writer:
        rule = MatchRule(type="signal", interface=COLLECTION)
        call_bus = new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),))
        listener.send_and_get_reply(call_bus, timeout=DEADLINE)
        # the listener is known to the service once it has called it
        call(listener, ROOT, SERVICE, "SearchItems", "a{ss}", ({"service": "none"},))
        with listener.filter(rule) as queue:
            # a stranger (the shared collection) and app T.tool1 create items: not T.py1's business
            assert ss.run([SECRET_TOOL, "store", "--label=a", "service", unique(), "account", "a"], input=b"a").returncode == 0
            assert ss.run([ss.tool1, "store", "--label=b", "service", unique(), "account", "b"], input=b"b").returncode == 0
            # then T.py1 itself (another connection of this process) creates one
            _, session = call(writer, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
            props = {"org.freedesktop.Secret.Item.Label": ("s", "mine"),
                     "org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"service": unique()})}
            item, _ = call(writer, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                           (props, (session, b"", b"s", "text/plain"), False))
            # signals are sent in order: the first one the listener gets is for its own group's item
            signal_msg = listener.recv_until_filtered(queue, timeout=DEADLINE)
            assert signal_msg.header.fields[jeepney.HeaderFields.member] == "ItemCreated"
            assert signal_msg.body == (item,)


# MARK: locked keychain: prompts, keyed search, lock


def set_passphrase(d, passphrase="pass phrase"):
    path = d.root / "pw"
    path.write_text(passphrase + "\n")
    # The admin registration (apps.d/admin.json) is approved by name: the first passphrase approves
    # nothing it is not told to.
    r = d.run([d.keychainctl, "passwd", "--new-passphrase-file", str(path), "--approve", "admin"])
    assert r.returncode == 0, r.stderr
    return path


def test_a_locked_keychain_prompts_until_keychainctl_unlock(fresh):
    d = fresh()
    service = unique()
    assert d.run([SECRET_TOOL, "store", "--label=x", "service", service, "account", "a"], input=b"waited-for").returncode == 0
    pw = set_passphrase(d)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    lookup = subprocess.Popen([SECRET_TOOL, "lookup", "service", service, "account", "a"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=d.env)
    try:
        wait_for("the prompt", lambda: "waits for the keychain to be unlocked" in d.log_text())
        assert lookup.poll() is None          # waiting on the prompt, not failed
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
        out, err = lookup.communicate(timeout=DEADLINE)
        assert lookup.returncode == 0 and out == b"waited-for", err
    finally:
        if lookup.poll() is None:
            lookup.kill()
            lookup.wait()


def test_a_prompt_can_be_dismissed(fresh):
    d = fresh()
    set_passphrase(d)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    with d.connection() as conn:
        unlocked, prompt = call(conn, ROOT, SERVICE, "Unlock", "ao", ([ROOT + "/collection/login"],))
        assert unlocked == [] and prompt.startswith(ROOT + "/prompt/")
        rule = MatchRule(type="signal", interface="org.freedesktop.Secret.Prompt", member="Completed", path=prompt)
        conn.send_and_get_reply(new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),)), timeout=DEADLINE)
        with conn.filter(rule) as queue:
            call(conn, prompt, "org.freedesktop.Secret.Prompt", "Prompt", "s", ("",))
            call(conn, prompt, "org.freedesktop.Secret.Prompt", "Dismiss")
            completed = conn.recv_until_filtered(queue, timeout=DEADLINE)
        assert completed.body == (True, ("ao", []))


def test_a_prompt_keeps_each_object_once(fresh):
    # A prompt keeps its object list until the keychain is unlocked: one path repeated as often as
    # one call may name objects (4096) is kept (and answered) once.
    d = fresh()
    pw = set_passphrase(d)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    login = ROOT + "/collection/login"
    with d.connection() as conn:
        unlocked, prompt = call(conn, ROOT, SERVICE, "Unlock", "ao", ([login] * MAX_OBJECTS_PER_CALL,))
        assert unlocked == [] and prompt.startswith(ROOT + "/prompt/")
        rule = MatchRule(type="signal", interface="org.freedesktop.Secret.Prompt", member="Completed", path=prompt)
        conn.send_and_get_reply(new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),)), timeout=DEADLINE)
        with conn.filter(rule) as queue:
            call(conn, prompt, "org.freedesktop.Secret.Prompt", "Prompt", "s", ("",))
            assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
            completed = conn.recv_until_filtered(queue, timeout=DEADLINE)
        assert completed.body == (False, ("ao", [login])), completed.body[:1]


def test_locked_items_are_found_through_the_keyed_index(fresh):
    d = fresh()
    service = unique()
    # The passphrase first: this process's bus identity (shared, once a passphrase is set: its
    # registration is the user's) is then the same when it stores and when it searches.
    set_passphrase(d)
    with d.bus_environment():
        conn = secretstorage.dbus_init()
        try:
            collection = secretstorage.get_default_collection(conn)
            item = collection.create_item("idx", {"service": service, "kind": "token"}, b"x")
            collection.create_item("other", {"service": service, "kind": "other"}, b"y")
        finally:
            conn.close()
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    with d.connection() as conn:
        unlocked, locked = call(conn, ROOT, SERVICE, "SearchItems", "a{ss}", ({"service": service, "kind": "token"},))
        assert unlocked == [] and locked == [item.item_path]
        unlocked, locked = call(conn, ROOT, SERVICE, "SearchItems", "a{ss}", ({"service": service, "kind": "none"},))
        assert unlocked == [] and locked == []
        name, _ = error_of(conn, item.item_path, ITEM, "GetSecret", "o",
                           (call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))[1],))
        assert name == "org.freedesktop.Secret.Error.IsLocked"
        (value,) = call(conn, ROOT + "/collection/login", "org.freedesktop.DBus.Properties", "Get", "ss", (COLLECTION, "Locked"))
        assert value == ("b", True)


def test_secret_tool_lock_locks_the_keychain(fresh):
    d = fresh()
    set_passphrase(d)
    pw = d.root / "pw"
    assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
    assert not d.locked()
    # Debian 12's secret-tool (libsecret 0.20.5) frees a string twice after the lock succeeded and
    # dies of SIGABRT/SIGSEGV, against GNOME Keyring too, so only the effect is checked here.
    d.run([SECRET_TOOL, "lock", "--collection=login"])
    assert d.locked()


def test_failing_searches_of_a_registered_app_do_not_postpone_auto_lock(fresh):
    # A registered bus app searching every 0.3 s for attributes nothing has kept a 2-second
    # auto-lock from ever striking: a failing (empty) search is not activity, so it locks anyway.
    d = fresh({"autoLockSeconds": 2})
    app = d._copy(interpreter(), "bus-app")
    d._app("bus-app", "T.bus", ["T.bus"], [app], system=True, secret_service=True)
    pw = set_passphrase(d)
    assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
    code = """
import json, sys, time
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection
conn = open_dbus_connection(bus='SESSION')
svc = DBusAddress('/org/freedesktop/secrets', bus_name='org.freedesktop.secrets', interface='org.freedesktop.Secret.Service')
(alias,) = conn.send_and_get_reply(new_method_call(svc, 'ReadAlias', 's', ('default',)), timeout=30).body
props = DBusAddress(alias, bus_name='org.freedesktop.secrets', interface='org.freedesktop.DBus.Properties')
(label,) = conn.send_and_get_reply(new_method_call(props, 'Get', 'ss', ('org.freedesktop.Secret.Collection', 'Label')), timeout=30).body
print(json.dumps({'collection': label[1]}), flush=True)
while True:
    reply = conn.send_and_get_reply(new_method_call(svc, 'SearchItems', 'a{ss}', ({'service': 'no-such-service'},)), timeout=30)
    print(json.dumps({'found': sum(len(paths) for paths in reply.body)}), flush=True)
    time.sleep(0.3)
"""
    env = python_env(dict(DBUS_SESSION_BUS_ADDRESS=d.bus.address, KEYCHAIND_SOCKET=d.socket))
    searcher = subprocess.Popen([app, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # It is the registered app that asks (its default collection is its own group, not the
        # shared one), and its searches run and find nothing.
        first = json.loads(searcher.stdout.readline() or "{}")
        assert first == {"collection": "T.bus"}, (first, searcher.stderr.read() if not first else "")
        assert json.loads(searcher.stdout.readline() or "{}") == {"found": 0}
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
        wait_for("auto-lock with failing searches running", d.locked)
        assert searcher.poll() is None, searcher.stderr.read()
        assert "by=auto-lock" in d.log_text()
    finally:
        searcher.kill()
        searcher.wait()


# MARK: bad input on the bus


def test_bad_input_gets_errors_and_the_service_keeps_serving(ss):
    service = unique()
    assert ss.run([SECRET_TOOL, "store", "--label=ok", "service", service, "account", "a"], input=b"still-here").returncode == 0
    with ss.connection() as conn:
        # wrong argument types
        name, _ = error_of(conn, ROOT, SERVICE, "SearchItems", "s", ("not a map",))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        name, _ = error_of(conn, ROOT, SERVICE, "OpenSession", "su", ("plain", 7))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        # unknown algorithm, malformed DH keys
        name, _ = error_of(conn, ROOT, SERVICE, "OpenSession", "sv", ("rot13", ("s", "")))
        assert name == "org.freedesktop.DBus.Error.NotSupported"
        for bad in (b"", b"\x00", b"\x01", b"\xff" * 128, b"\x02" * 300):
            name, _ = error_of(conn, ROOT, SERVICE, "OpenSession", "sv", ("dh-ietf1024-sha256-aes128-cbc-pkcs7", ("ay", bad)))
            assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        # unknown object paths and members
        for path in (ROOT + "/collection/nope", ROOT + "/collection/login/xyz", ROOT + "/collection/login/" + "0" * 32,
                     ROOT + "/session/s999999", ROOT + "/prompt/p1", ROOT + "/a/b/c/d"):
            name, _ = error_of(conn, path, ITEM, "GetSecret", "o", ("/",))
            assert name == "org.freedesktop.DBus.Error.UnknownObject", path
        name, _ = error_of(conn, ROOT, SERVICE, "NoSuchMethod")
        assert name == "org.freedesktop.DBus.Error.UnknownMethod"
        name, _ = error_of(conn, ROOT, "org.example.Nope", "X")
        assert name == "org.freedesktop.DBus.Error.UnknownInterface"
        # a session that is not this connection's, a secret that does not decrypt
        _, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        props = {"org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"service": unique()})}
        name, _ = error_of(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                           (props, (ROOT + "/session/s424242", b"", b"x", "text/plain"), False))
        assert name == "org.freedesktop.Secret.Error.NoSession"
        name, _ = error_of(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                           (props, (session, b"params-in-a-plain-session", b"x", "text/plain"), False))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        name, _ = error_of(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                           ({"org.freedesktop.Secret.Item.Label": ("u", 5)}, (session, b"", b"x", "text/plain"), False))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        # huge attribute maps: many entries, long values
        huge = {f"k{i}": "v" for i in range(20000)}
        name, _ = error_of(conn, ROOT, SERVICE, "SearchItems", "a{ss}", (huge,))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        long_value = {"service": "x" * 100_000}
        name, _ = error_of(conn, ROOT, SERVICE, "SearchItems", "a{ss}", (long_value,))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        name, _ = error_of(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                           ({"org.freedesktop.Secret.Item.Attributes": ("a{ss}", huge)}, (session, b"", b"x", "text/plain"), False))
        assert name == "org.freedesktop.DBus.Error.InvalidArgs"
        # properties: unknown ones, read-only ones, wrong types
        name, _ = error_of(conn, ROOT, "org.freedesktop.DBus.Properties", "Get", "ss", (SERVICE, "Nope"))
        assert name == "org.freedesktop.DBus.Error.UnknownProperty"
        name, _ = error_of(conn, ROOT + "/collection/login", "org.freedesktop.DBus.Properties", "Set", "ssv",
                           (COLLECTION, "Label", ("s", "mine")))
        assert name == "org.freedesktop.DBus.Error.PropertyReadOnly"
    # the provider keeps serving, and the daemon still runs
    assert ss.process.poll() is None
    assert ss.run([SECRET_TOOL, "lookup", "service", service, "account", "a"]).stdout == b"still-here"


def test_setting_attributes_takes_them_as_create_item_does(ss):
    # A name given twice, or a value beyond the limits, is InvalidArgs and the item keeps its own.
    service = unique()
    with ss.connection() as conn:
        _, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        props = {"org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"service": service})}
        item, _ = call(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                       (props, (session, b"", b"s", "text/plain"), False))
        # (jeepney writes a list of pairs as a{ss} too, so a name can be given twice)
        for value in ([("service", "a"), ("service", "b")], {"service": "x" * 5000},
                      {f"k{i}": "v" * 4000 for i in range(20)}):
            name, message = error_of(conn, item, "org.freedesktop.DBus.Properties", "Set", "ssv",
                                     (ITEM, "Attributes", ("a{ss}", value)))
            assert name == "org.freedesktop.DBus.Error.InvalidArgs", message
        (value,) = call(conn, item, "org.freedesktop.DBus.Properties", "Get", "ss", (ITEM, "Attributes"))
        assert value[1]["service"] == service


def test_a_call_naming_too_many_objects_is_refused_before_any_work(fresh):
    # Each path of GetSecrets costs a lookup on the bus thread and a prompt keeps Unlock's: 800 000
    # made-up item paths held every caller up for 17 s (an attack review's finding).
    d = fresh()
    with d.connection() as conn:
        _, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        made_up = [f"{ROOT}/collection/login/{i:032x}" for i in range(MAX_OBJECTS_PER_CALL + 1)]
        for member, signature, body in (("GetSecrets", "aoo", (made_up, session)), ("Unlock", "ao", (made_up,)),
                                        ("Lock", "ao", (made_up,))):
            name, message = error_of(conn, ROOT, SERVICE, member, signature, body)
            assert name == LIMITS_EXCEEDED and f"at most {MAX_OBJECTS_PER_CALL}" in message, (member, message)
        # as many as allowed are answered (none of them exists)
        assert call(conn, ROOT, SERVICE, "GetSecrets", "aoo", (made_up[:-1], session)) == ({},)


def test_get_secrets_answers_at_most_one_frame_of_secrets(fresh):
    # A caller that asks for much and reads nothing fills the bus's buffers for keychaind, which
    # stalls every caller: one GetSecrets answers at most what a socket client reads in one frame.
    d = fresh({"maxFrameBytes": 65536})
    service = unique()
    with d.connection() as conn:
        _, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        for account in ("a", "b", "c"):
            props = {"org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"service": service, "account": account})}
            call(conn, ROOT + "/collection/login", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                 (props, (session, b"", b"s" * 30_000, "text/plain"), False))
        unlocked, _ = call(conn, ROOT, SERVICE, "SearchItems", "a{ss}", ({"service": service},))
        assert len(unlocked) == 3
        name, message = error_of(conn, ROOT, SERVICE, "GetSecrets", "aoo", (unlocked, session))
        assert name == LIMITS_EXCEEDED and "ask for fewer items at a time" in message, message
        (secrets,) = call(conn, ROOT, SERVICE, "GetSecrets", "aoo", (unlocked[:2], session))
        assert sorted(len(bytes(s[2])) for s in secrets.values()) == [30_000, 30_000]


def test_transfer_sessions_and_prompts_are_limited_for_all_callers_together(fresh):
    # Each DH session's key is guarded memory: 700 connections × 32 sessions ran keychaind out of
    # memory mappings and it died (an attack review's finding). Sessions and pending prompts are
    # limited per connection and for all connections together, and processes that are not
    # registered apps share half of each: they cannot lock the apps out.
    d = fresh()
    plain = ("plain", ("s", ""))
    holder = subprocess.Popen([d.stranger_python, "-c", f"""
import json, sys
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import unwrap_msg, DBusErrorResponse
svc = DBusAddress({ROOT!r}, bus_name={SECRETS!r}, interface={SERVICE!r})
conns, opened, refused = [], 0, None
while refused is None:
    conn = open_dbus_connection(bus="SESSION")
    conns.append(conn)
    for _ in range({MAX_SESSIONS_PER_CALLER}):
        try:
            unwrap_msg(conn.send_and_get_reply(new_method_call(svc, "OpenSession", "sv", {plain!r}), timeout=60))
            opened += 1
        except DBusErrorResponse as e:
            refused = str(e.data)
            break
print(json.dumps({{"opened": opened, "refused": refused}}), flush=True)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=python_env(dict(DBUS_SESSION_BUS_ADDRESS=d.bus.address, KEYCHAIND_SOCKET=d.socket)))
    conns = []
    try:
        held = json.loads(holder.stdout.readline())
        assert held["opened"] == MAX_SESSIONS // 2, held
        assert f"not registered apps have {MAX_SESSIONS // 2} transfer sessions open" in held["refused"], held
        # This process is a registered app: it gets the rest, up to the limit for all.
        for _ in range(MAX_SESSIONS // 2 // MAX_SESSIONS_PER_CALLER):
            conns.append(d.connection())
            for _ in range(MAX_SESSIONS_PER_CALLER):
                call(conns[-1], ROOT, SERVICE, "OpenSession", "sv", plain)
        with d.connection() as late:
            name, message = error_of(late, ROOT, SERVICE, "OpenSession", "sv", plain)
            assert name == LIMITS_EXCEEDED and f"keychaind has {MAX_SESSIONS} transfer sessions open" in message, message
            conns.pop().close()         # a connection that leaves frees its sessions, once the bus says so

            def opened():
                try:
                    return call(late, ROOT, SERVICE, "OpenSession", "sv", plain)
                except DBusErrorResponse as e:
                    assert e.name == LIMITS_EXCEEDED, e
                    return None
            wait_for("a session to be free", opened)
    finally:
        for conn in conns:
            conn.close()
        holder.kill()
        holder.wait()
    # Once a passphrase is set, this process is no app on the bus either: prompts, half of them.
    set_passphrase(d)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    login = [ROOT + "/collection/login"]
    conns = [d.connection() for _ in range(MAX_PROMPTS // 2 // 32)]
    try:
        for conn in conns:
            for _ in range(32):
                unlocked, prompt = call(conn, ROOT, SERVICE, "Unlock", "ao", (login,))
                assert prompt.startswith(ROOT + "/prompt/")
        with d.connection() as late:
            name, message = error_of(late, ROOT, SERVICE, "Unlock", "ao", (login,))
            assert name == LIMITS_EXCEEDED and f"not registered apps have {MAX_PROMPTS // 2} prompts pending" in message, message
    finally:
        for conn in conns:
            conn.close()
    assert d.process.poll() is None


# MARK: protection at rest


def test_nothing_stored_through_the_bus_is_plaintext_at_rest(fresh):
    d = fresh()
    marks = [f"label-{uuid.uuid4().hex}", f"attr-{uuid.uuid4().hex}", f"value-{uuid.uuid4().hex}", f"secret-{uuid.uuid4().hex}"]
    r = d.run([SECRET_TOOL, "store", f"--label={marks[0]}", marks[1], marks[2], "xdg:schema", "org.example.Rest"],
              input=marks[3].encode())
    assert r.returncode == 0, r.stderr
    assert d.run([SECRET_TOOL, "lookup", marks[1], marks[2]]).stdout == marks[3].encode()
    d.stop()
    for path in d.data.iterdir():
        content = path.read_bytes()
        for mark in marks + ["org.example.Rest"]:
            assert mark.encode() not in content, f"{mark} in {path.name}"


LARGEST_MAPPING = 64 << 30   # a sanitizer runtime's shadow reservations are terabytes; the daemon's own are far less


def copies_in_memory(pid: int, secret: bytes) -> list[str]:
    """Where in the process's readable memory a 16-byte piece of `secret` appears."""
    pieces = [secret[i:i + 16] for i in range(0, len(secret), 16)]
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("r"):
                continue
            name = fields[5] if len(fields) >= 6 else "[anonymous]"
            if name in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start > LARGEST_MAPPING:
                pytest.skip("a sanitizer runtime keeps the daemon's heap in reservations too large to read; "
                            "the plain suite makes this claim")
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            for piece in pieces:
                at = data.find(piece)
                if at >= 0:
                    found.append(f"{name} +{at:#x}")
    return found


def test_a_plain_session_secret_leaves_no_copy_in_the_daemon(fresh):
    """A `plain` session carries secrets in the clear inside sd-bus's messages: the call that stores
    one and the answers that return it are wiped when freed (sd-bus's sensitive messages), like
    every buffer a secret crosses on the socket."""
    d = fresh()
    d.stop()
    d.env["KEYCHAIND_TEST_DUMPABLE"] = "1"   # debug builds stay readable to their user for this test
    d.start()
    secret = ("KCBUSSCAN:" + uuid.uuid4().hex + uuid.uuid4().hex)[:64].encode()
    with d.connection() as conn:
        _, session = call(conn, ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))
        attrs = {"service": unique(), "account": "scan"}
        props = {"org.freedesktop.Secret.Item.Label": ("s", "scan"), "org.freedesktop.Secret.Item.Attributes": ("a{ss}", attrs)}
        item, _ = call(conn, ROOT + "/aliases/default", COLLECTION, "CreateItem", "a{sv}(oayays)b",
                       (props, (session, b"", secret, "text/plain"), True))
        for _ in range(3):
            (got,) = call(conn, item, ITEM, "GetSecret", "o", (session,))
            assert got[2] == secret
            (many,) = call(conn, ROOT, SERVICE, "GetSecrets", "aoo", ([item], session))
            assert many[item][2] == secret
        call(conn, item, ITEM, "SetSecret", "(oayays)", ((session, b"", secret[::-1], "text/plain"),))
        # One bus thread serves in order: once this is answered, everything before it is done with.
        call(conn, ROOT, "org.freedesktop.DBus.Properties", "Get", "ss", (SERVICE, "Collections"))
        found = copies_in_memory(d.process.pid, secret) + copies_in_memory(d.process.pid, secret[::-1])
    assert found == [], f"the secret is still in keychaind's memory at {found}"
