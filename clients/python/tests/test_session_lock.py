"""keychaind locking with the session (`"lockWithSession": true`), against logind as python-dbusmock's
`logind` template plays it on a private system bus (a `dbus-daemon` of the test's own, given to
keychaind as DBUS_SYSTEM_BUS_ADDRESS). No desktop is needed: the test makes the mock emit what
logind emits — a session's `Lock`, its `LockedHint`, the Manager's `PrepareForSleep` — and checks
what a user would notice: `status` says locked and a WhenUnlocked item reads as
errSecInteractionNotAllowed; before sleep the "delay" inhibitor keychaind holds is let go once locked.

The mock runs under Debian's /usr/bin/python3 (python3-dbusmock, installed by scripts/deps); this
interpreter talks to it with jeepney. Nothing waits for a fixed time: every wait is for an event.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import daemon_binary, interpreter
from keychaind import Client, KeychainError
from keychaind.constants import (errSecInteractionNotAllowed, kSecAttrAccessible, kSecAttrAccessibleWhenUnlocked,
                                 kSecAttrAccount, kSecAttrService, kSecClass, kSecClassGenericPassword,
                                 kSecReturnData, kSecValueData)

jeepney = pytest.importorskip("jeepney")
from jeepney import DBusAddress, HeaderFields, new_method_call, new_signal  # noqa: E402
from jeepney.io.blocking import open_dbus_connection  # noqa: E402
from jeepney.wrappers import unwrap_msg  # noqa: E402

from test_secret_service import DEADLINE, wait_for  # noqa: E402

DBUS_DAEMON = shutil.which("dbus-daemon")
SYSTEM_PYTHON = "/usr/bin/python3"
HAVE_DBUSMOCK = subprocess.run([SYSTEM_PYTHON, "-c", "import dbusmock.templates.logind"],
                               capture_output=True).returncode == 0

pytestmark = pytest.mark.skipif(not (DBUS_DAEMON and HAVE_DBUSMOCK),
                                reason="needs dbus-daemon and python3-dbusmock; scripts/deps installs them")

LOGIND = "org.freedesktop.login1"
MANAGER_PATH = "/org/freedesktop/login1"
MANAGER = "org.freedesktop.login1.Manager"
SESSION = "org.freedesktop.login1.Session"
MOCK = "org.freedesktop.DBus.Mock"
BUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus")
PASSPHRASE = "session pass phrase"


def bus_call(conn, address, member, signature=None, body=()):
    return unwrap_msg(conn.send_and_get_reply(new_method_call(address, member, signature, body), timeout=DEADLINE))


class Logind:
    """A private system bus with the logind mock on it."""

    def __init__(self, root: Path):
        self.bus = subprocess.Popen([DBUS_DAEMON, "--session", "--nofork", "--nopidfile", "--print-address=1"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        self.address = self.bus.stdout.readline().decode().strip()
        assert self.address, "dbus-daemon printed no address"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["DBUS_SYSTEM_BUS_ADDRESS"] = self.address
        self.mock_log = open(root / "logind-mock.log", "wb")
        self.mock = subprocess.Popen([SYSTEM_PYTHON, "-m", "dbusmock", "--template", "logind"], env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.mock_log, stderr=subprocess.STDOUT)
        self.conn = open_dbus_connection(bus=self.address)
        wait_for("the logind mock on the bus", lambda: bus_call(self.conn, BUS, "NameHasOwner", "s", (LOGIND,))[0])

    def close(self):
        self.conn.close()
        for p in (self.mock, self.bus):
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        self.mock_log.close()

    def add_session(self, uid: int, name: str) -> str:
        session_id = "c" + uuid.uuid4().hex[:8]
        (path,) = bus_call(self.conn, DBusAddress(MANAGER_PATH, bus_name=LOGIND, interface=MOCK), "AddSession",
                           "ssusb", (session_id, "seat0", uid, name, True))
        return path

    def session(self, path: str, member: str, signature=None, body=()):
        bus_call(self.conn, DBusAddress(path, bus_name=LOGIND, interface=SESSION), member, signature, body)

    def prepare_for_sleep(self, sleeping: bool):
        bus_call(self.conn, DBusAddress(MANAGER_PATH, bus_name=LOGIND, interface=MOCK), "EmitSignal", "sssav",
                 (MANAGER, "PrepareForSleep", "b", [("b", sleeping)]))

    def keychaind_inhibitors(self) -> list:
        (inhibitors,) = bus_call(self.conn, DBusAddress(MANAGER_PATH, bus_name=LOGIND, interface=MANAGER),
                                 "ListInhibitors")
        return [i for i in inhibitors if i[1] == "keychaind"]

    def connections_of(self, pid: int) -> list[str]:
        (names,) = bus_call(self.conn, BUS, "ListNames")
        found = []
        for name in names:
            if name.startswith(":"):
                try:
                    (owner_pid,) = bus_call(self.conn, BUS, "GetConnectionUnixProcessID", "s", (name,))
                except Exception:
                    continue       # gone meanwhile
                if owner_pid == pid:
                    found.append(name)
        return found


class Daemon:
    """keychaind with a passphrase set, this interpreter registered (root-owned, so it counts with a
    passphrase) and one WhenUnlocked item stored."""

    def __init__(self, root: Path, system_bus: str, config: dict):
        self.root = root
        root.mkdir()
        self.socket = str(root / "run" / "kc.sock")
        self.log_path = root / "keychaind.log"
        config_file = root / "config" / "keychaind.json"
        config_file.parent.mkdir()
        config_file.write_text(json.dumps(dict({"kdfProfile": "interactive"}, **config)))
        system_apps = root / "system-apps"
        system_apps.mkdir(mode=0o755)
        self.keychainctl = str(Path(daemon_binary()).parent / "keychainctl")
        for name, entry in {
            "py1": {"application-identifier": "T.py1", "keychain-access-groups": ["T.py1"],
                    "executables": [interpreter()]},
            "admin": {"application-identifier": "T.admin", "keychain-access-groups": ["T.admin"],
                      "executables": [os.path.realpath(self.keychainctl)], "admin": True},
        }.items():
            (system_apps / f"{name}.json").write_text(json.dumps(entry))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")}
        self.env.update(DBUS_SYSTEM_BUS_ADDRESS=system_bus, KEYCHAIND_SOCKET=self.socket, SWIFT_BACKTRACE="enable=no")
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(daemon_binary()), "--socket", self.socket, "--data-dir", str(root / "data"), "--config",
             str(config_file), "--system-apps-dir", str(system_apps), "--log-level", "debug"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)

        def serving():
            if self.process.poll() is not None:
                raise AssertionError(f"keychaind exited with {self.process.returncode}:\n{self.log_text()}")
            try:
                with Client(self.socket, timeout=10) as c:
                    c.status()
                return True
            except (KeychainError, OSError):
                return False
        wait_for("keychaind to serve", serving)
        self.passphrase_file = root / "pw"
        self.passphrase_file.write_text(PASSPHRASE + "\n")
        self.ctl("passwd", "--new-passphrase-file", str(self.passphrase_file))
        self.service = "session-lock-" + uuid.uuid4().hex[:8]
        with Client(self.socket, timeout=10) as c:
            c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: self.service, kSecAttrAccount: "a",
                   kSecValueData: b"kept", kSecAttrAccessible: kSecAttrAccessibleWhenUnlocked})
        assert not self.locked() and self.read() == b"kept"

    def ctl(self, *argv):
        r = subprocess.run([self.keychainctl, *argv], capture_output=True, timeout=DEADLINE, env=self.env)
        assert r.returncode == 0, r.stderr.decode()

    def unlock(self):
        self.ctl("unlock", "--passphrase-file", str(self.passphrase_file))
        assert not self.locked()

    def locked(self) -> bool:
        with Client(self.socket, timeout=10) as c:
            return c.status()["locked"]

    def read(self):
        """The item's secret, or the status a failed read gives."""
        try:
            with Client(self.socket, timeout=10) as c:
                return c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: self.service, kSecAttrAccount: "a",
                               kSecReturnData: True})
        except KeychainError as e:
            return e.status

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def close(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.log.close()


@pytest.fixture
def world():
    """make(config) → (logind, daemon); a fresh system bus and logind mock for each test."""
    binary = daemon_binary()
    if not binary.exists():
        pytest.skip(f"keychaind binary not found at {binary}")
    root = Path(tempfile.mkdtemp(prefix="kcd-sl-"))
    made = []

    def make(config, system_bus=None):
        logind = None
        if system_bus is None:
            logind = Logind(root)
            made.append(logind)
        d = Daemon(root / "daemon", system_bus or logind.address, config)
        made.append(d)
        return logind, d
    yield make
    for thing in reversed(made):
        thing.close()
    shutil.rmtree(root, ignore_errors=True)


def watching(logind, d):
    """keychaind is subscribed: it takes its sleep inhibitor after adding its match rules."""
    wait_for("keychaind's sleep inhibitor", lambda: len(logind.keychaind_inhibitors()) == 1)


def locked_out(d):
    return d.locked() and d.read() == errSecInteractionNotAllowed


def test_a_session_lock_signal_locks_the_keychain(world):
    logind, d = world({"lockWithSession": True})
    watching(logind, d)
    session = logind.add_session(os.getuid(), "user")
    logind.session(session, "Lock")
    wait_for("the keychain to lock", lambda: locked_out(d))
    assert "keychain locked by=session-lock" in d.log_text()
    d.unlock()
    assert d.read() == b"kept"


def test_a_locked_hint_locks_the_keychain(world):
    logind, d = world({"lockWithSession": True})
    watching(logind, d)
    session = logind.add_session(os.getuid(), "user")
    logind.session(session, "SetLockedHint", "b", (True,))
    wait_for("the keychain to lock", lambda: locked_out(d))
    assert "signal=LockedHint" in d.log_text()


def test_another_users_session_locking_leaves_the_keychain_unlocked(world):
    logind, d = world({"lockWithSession": True})
    watching(logind, d)
    other = logind.add_session(os.getuid() + 4242, "someone-else")
    logind.session(other, "Lock")
    wait_for("keychaind to see the other user's lock", lambda: "a session of another user locked" in d.log_text())
    assert not d.locked() and d.read() == b"kept"


def test_a_lock_signal_not_from_logind_is_ignored(world):
    # Any connection, another user's included, may send a signal to keychaind's own name with
    # logind's interface and a session's path: only logind's unique name counts.
    logind, d = world({"lockWithSession": True})
    watching(logind, d)
    session = logind.add_session(os.getuid(), "user")
    (target,) = logind.connections_of(d.process.pid)
    forged = new_signal(DBusAddress(session, interface=SESSION), "Lock")
    forged.header.fields[HeaderFields.destination] = target      # unicast to keychaind
    logind.conn.send(forged)
    wait_for("keychaind to refuse the forged signal", lambda: "not sent by logind ignored" in d.log_text())
    assert not d.locked() and d.read() == b"kept"


def test_sleep_locks_first_and_releases_the_inhibitor_then_takes_it_again(world):
    logind, d = world({"lockWithSession": True})
    watching(logind, d)
    assert logind.keychaind_inhibitors()[0][3] == "delay"
    logind.prepare_for_sleep(True)
    wait_for("the keychain to lock", lambda: locked_out(d))
    wait_for("the inhibitor to be released", lambda: logind.keychaind_inhibitors() == [])
    assert "keychain locked by=sleep" in d.log_text()
    logind.prepare_for_sleep(False)
    wait_for("the inhibitor again after resume", lambda: len(logind.keychaind_inhibitors()) == 1)
    assert d.locked()       # resuming unlocks nothing
    d.unlock()
    logind.prepare_for_sleep(True)
    wait_for("the keychain to lock on the next sleep", lambda: locked_out(d))


@pytest.mark.parametrize("config", [{}, {"lockWithSession": False}], ids=["default", "false"])
def test_with_the_setting_off_nothing_locks(world, config):
    # Off by default in a build from source (the Debian package builds it on: debian/rules).
    logind, d = world(config)
    # Serving (the watcher starts before that): keychaind never joined the system bus.
    assert logind.connections_of(d.process.pid) == []
    assert logind.keychaind_inhibitors() == []
    session = logind.add_session(os.getuid(), "user")
    logind.session(session, "Lock")
    logind.prepare_for_sleep(True)
    assert not d.locked() and d.read() == b"kept"


def test_without_a_system_bus_the_daemon_says_so_and_keeps_serving(world):
    _, d = world({"lockWithSession": True}, system_bus="unix:path=/nonexistent/system_bus_socket")
    assert "session lock: not locking with the session or before sleep" in d.log_text()
    assert d.read() == b"kept"
    d.ctl("lock")
    assert locked_out(d)


def test_a_setting_that_is_not_a_boolean_is_refused(tmp_path):
    config = tmp_path / "keychaind.json"
    config.write_text(json.dumps({"lockWithSession": "yes"}))
    r = subprocess.run([str(daemon_binary()), "--config", str(config), "--check-config"], capture_output=True,
                       timeout=DEADLINE)
    assert r.returncode == 1
    assert '"lockWithSession" must be true or false' in r.stderr.decode()
