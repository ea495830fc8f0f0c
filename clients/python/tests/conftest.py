"""Fixtures: the real keychaind on a temporary socket, with the test interpreter registered as an app.

The daemon binary is $KEYCHAIND_BIN, else <repo>/.build/debug/keychaind. Integration tests skip only
when that file does not exist; a binary that exists but does not serve is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from keychaind import Client, KeychainError, wire

from fakes import FakeDaemon

HERE = Path(__file__).resolve().parent
CLIENT_DIR = HERE.parent
REPO = Path(os.environ.get("KEYCHAIND_REPO") or CLIENT_DIR.parent.parent).resolve()

TEAM = "TESTTEAM"
APP1 = f"{TEAM}.com.example.py1"
APP2 = f"{TEAM}.com.example.py2"
SHARED = f"{TEAM}.com.example.shared"
APP1_GROUPS = [APP1, SHARED]
APP2_GROUPS = [APP2, SHARED]


def daemon_binary() -> Path:
    explicit = os.environ.get("KEYCHAIND_BIN")
    return Path(explicit) if explicit else REPO / ".build" / "debug" / "keychaind"


def interpreter() -> str:
    """What the daemon sees as this process's executable."""
    return os.path.realpath(sys.executable)


def python_env(extra: dict | None = None) -> dict:
    """Environment for a copied interpreter: the base installation's stdlib plus this venv's packages."""
    env = dict(os.environ)
    paths = [str(CLIENT_DIR)] + site.getsitepackages()
    env["PYTHONHOME"] = sys.base_prefix
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("PYTHONSTARTUP", None)
    if extra:
        env.update(extra)
    return env


class Daemon:
    def __init__(self, root: Path):
        self.root = root
        self.socket = str(root / "run" / "keychaind.sock")
        self.data = root / "data"
        self.config_dir = root / "config"
        self.config = self.config_dir / "keychaind.json"
        self.apps = self.config_dir / "apps.d"
        self.bin = root / "bin"
        self.log_path = root / "keychaind.log"
        self.process: subprocess.Popen | None = None
        # Two more interpreters: app2 (registered, shares one group with app1) and an unregistered one.
        self.bin.mkdir(parents=True)
        self.app2_python = str(self.bin / "app2-python")
        self.stranger_python = str(self.bin / "stranger-python")
        shutil.copy2(interpreter(), self.app2_python)
        shutil.copy2(interpreter(), self.stranger_python)
        self.apps.mkdir(parents=True)
        self.config.write_text("{}\n")
        self._app("app1.json", APP1, APP1_GROUPS, [interpreter()])
        self._app("app2.json", APP2, APP2_GROUPS, [self.app2_python])

    def _app(self, name, identifier, groups, executables):
        (self.apps / name).write_text(json.dumps({
            "application-identifier": identifier,
            "keychain-access-groups": groups,
            "executables": executables,
        }, indent=2) + "\n")

    def start(self, timeout: float = 120.0) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")}
        env["SWIFT_BACKTRACE"] = "enable=no"
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(daemon_binary()), "--socket", self.socket, "--data-dir", str(self.data), "--config", str(self.config)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"keychaind exited with {self.process.returncode} before serving:\n{self.log_text()}")
            if os.path.exists(self.socket):
                try:
                    with Client(self.socket, timeout=5) as c:
                        c.status()
                    return
                except KeychainError as e:
                    last = e
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"keychaind did not serve within {timeout} s (last error: {last}):\n{self.log_text()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "log", None):
            self.log.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def client(self, **kw) -> Client:
        return Client(self.socket, **kw)

    def raw(self) -> "Raw":
        return Raw(self.socket)

    def run_python(self, executable: str, code: str, env: dict | None = None, timeout: float = 300) -> dict:
        """Runs `code` under another interpreter; it must print one JSON object as its last line."""
        proc = subprocess.run([executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env=python_env(dict(env or {}, KEYCHAIND_SOCKET=self.socket)))
        if proc.returncode != 0:
            raise AssertionError(f"{executable} failed ({proc.returncode}):\n{proc.stderr}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def daemon():
    binary = daemon_binary()
    if not binary.exists():
        pytest.skip(f"keychaind binary not found at {binary} (build it with `swift build`, or set KEYCHAIND_BIN)")
    root = Path(tempfile.mkdtemp(prefix="kcd-py-"))  # short: Unix socket paths are limited to 107 bytes
    d = Daemon(root)
    try:
        d.start()
    except Exception:
        d.stop()
        raise
    yield d
    d.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


@pytest.fixture
def service():
    """A service name no other test uses."""
    return f"com.example.test.{uuid.uuid4().hex[:12]}"


class Raw:
    """A bare connection for sending hand-made bytes and reading decoded responses."""

    def __init__(self, path: str, timeout: float = 10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.reader = wire.FrameReader()
        self.eof = False
        self.sent = False

    def send(self, data: bytes) -> None:
        if self.sent:
            self.sock.sendall(data)
        else:  # a connection's first bytes carry our pidfd, as protocol.md §1 asks
            self.sent = True
            wire.send_identifying(self.sock, bytes(data))

    def request(self, request_id: int, op: str, query=None, attributes=None, **arguments) -> None:
        self.send(wire.encode_request(request_id, op, query, attributes, **arguments))

    def recv(self):
        """The next response, decoded; None at end of stream."""
        while True:
            for body in self.reader.frames():
                return wire.decode(body)
            if self.eof:
                return None
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                continue
            self.reader.feed(data)

    def recv_until_eof(self) -> list:
        out = []
        while (r := self.recv()) is not None:
            out.append(r)
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def fake():
    servers = []

    def make(handler):
        s = FakeDaemon(handler)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()
