"""Sandboxed apps in the real `flatpak`: a runtime and two apps built here, offline, and run.

The runtime is made of the host's own files: `secret-tool`, `keychainctl`, `sh` and `python3` (its
standard library and jeepney, for the Secret portal's frontend call), with the shared libraries
`ldd` finds for them, as its `/usr`. It is exported with `flatpak build-export --runtime`
into an ostree repository in a temporary directory; two apps, `org.keychaind.TestA` and
`org.keychaind.TestB`, are made with `flatpak build-init` / `build-finish` (the keychaind socket
through `--filesystem=xdg-run/keychaind`, the Secret Service through
`--talk-name=org.freedesktop.secrets`) and exported to it too. Every installation is private
(`FLATPAK_USER_DIR`, `FLATPAK_SYSTEM_DIR`, `HOME` and `XDG_RUNTIME_DIR` in the temporary
directory), added with `--no-gpg-verify`: nothing of the machine's Flatpak state is read or touched.

Each test runs keychaind with `--secret-service` on a private session bus, its socket where clients
look for it (`$XDG_RUNTIME_DIR/keychaind/keychaind.sock`), no registration for either app, and
`flatpak run`s the apps against it as a new user would: as the uid running the tests (root in CI:
Flatpak then runs the app in keychaind's own user namespace) and as `nobody` (an ordinary uid:
unprivileged bubblewrap puts the app two user namespaces deep, and its D-Bus proxy one deep). On
the bus keychaind's caller is the app's D-Bus proxy (xdg-dbus-proxy in a sandbox of its own), for
the Secret Service and for the Secret portal alike.

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import jeepney
import pytest

from conftest import REPO, daemon_binary
from test_flatpak import BWRAP, SETPRIV
from test_portal import ASK
from test_secret_service import DEADLINE, SECRET_TOOL, unique, wait_for

FLATPAK = shutil.which("flatpak")
DBUS_RUN_SESSION = shutil.which("dbus-run-session")
pytestmark = pytest.mark.skipif(not (FLATPAK and BWRAP and SECRET_TOOL and DBUS_RUN_SESSION),
                                reason="needs flatpak, bwrap, secret-tool and dbus-run-session; scripts/deps installs them")

RUNTIME = "org.keychaind.Platform"
BRANCH = "test"
APPS = ("org.keychaind.TestA", "org.keychaind.TestB")
# Neither exists on the test's bus (no accessibility bus, no FUSE for the document portal).
RUN = ["run", "--no-a11y-bus", "--no-documents-portal"]


def libraries(*executables: str) -> tuple[list[str], str]:
    """The shared libraries `ldd` resolves for `executables`, and their dynamic loader."""
    out = subprocess.run(["ldd", *executables], capture_output=True, text=True, check=True).stdout
    found, loader = set(), None
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            found.add(parts[1].split()[0])
        elif line.strip().startswith("/"):
            loader = line.split()[0]
    assert loader, out
    return sorted(found), loader


def flatpak_env(root: Path, bus: str | None = None) -> dict:
    """A private Flatpak installation under `root`: no file of the machine's own is read or written."""
    env = {"HOME": str(root / "home"), "XDG_RUNTIME_DIR": str(root / "xrun"), "PATH": "/usr/bin:/bin",
           "FLATPAK_USER_DIR": str(root / "flatpak-user"), "FLATPAK_SYSTEM_DIR": str(root / "flatpak-system"),
           "XDG_DATA_HOME": str(root / "home" / ".local" / "share"), "XDG_CONFIG_HOME": str(root / "home" / ".config"),
           "XDG_CACHE_HOME": str(root / "home" / ".cache"), "SWIFT_BACKTRACE": "enable=no"}
    if bus:
        # The system bus too: as an ordinary uid `flatpak install` asks it for parental controls
        # (accounts-service), and goes on when no such service is there.
        env.update(DBUS_SESSION_BUS_ADDRESS=bus, DBUS_SYSTEM_BUS_ADDRESS=bus)
    return env


def flatpak(argv, env, as_user=(), input: bytes | None = None, check=True) -> subprocess.CompletedProcess:
    got = subprocess.run([*as_user, FLATPAK, *argv], input=input, capture_output=True, timeout=DEADLINE, env=env)
    if check:
        assert got.returncode == 0, f"flatpak {' '.join(argv)}: {got.stderr.decode(errors='replace')}"
    return got


def prepare_home(root: Path, uid: int):
    """The installation's directories, the user's own; an empty system installation (an ordinary
    uid may not create one)."""
    for sub in ("home", "xrun", "flatpak-user", "flatpak-system"):
        (root / sub).mkdir(mode=0o700)
    repo = root / "flatpak-system" / "repo"
    for sub in ("objects", "tmp/cache", "refs/heads", "refs/mirrors", "refs/remotes", "state", "extensions"):
        (repo / sub).mkdir(parents=True)
    (repo / "config").write_text("[core]\nrepo_version=1\nmode=bare-user-only\n")
    for path in [root / "home", root / "xrun", root / "flatpak-user", *(root / "flatpak-system").rglob("*"),
                 root / "flatpak-system"]:
        os.chown(path, uid, uid)


@pytest.fixture(scope="module")
def repo():
    """An ostree repository with the runtime and the two apps, built here from the host's files."""
    if not daemon_binary().exists():
        pytest.skip(f"keychaind binary not found at {daemon_binary()}")
    root = Path(tempfile.mkdtemp(prefix="kcd-fpr-build-"))
    os.chmod(root, 0o755)
    try:
        prepare_home(root, os.getuid())
        env = flatpak_env(root)
        keychainctl = str(daemon_binary().parent / "keychainctl")
        runtime = root / "runtime"
        usr = runtime / "usr"
        (runtime / "files").mkdir(parents=True)
        (usr / "bin").mkdir(parents=True)
        shutil.copy2(SECRET_TOOL, usr / "bin" / "secret-tool")
        shutil.copy2(keychainctl, usr / "bin" / "keychainctl")
        shutil.copy2("/bin/dash", usr / "bin" / "sh")
        # Python with jeepney, for the Secret portal's frontend call (test_portal.ASK).
        python = os.path.realpath("/usr/bin/python3")
        shutil.copy2(python, usr / "bin" / "python3")
        shutil.copytree(Path("/usr/lib") / os.path.basename(python), usr / "lib" / os.path.basename(python), symlinks=True,
                        ignore=shutil.ignore_patterns("test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data",
                                                      "turtledemo", "__pycache__", "config-*", "site-packages", "dist-packages"))
        shutil.copytree(Path(jeepney.__file__).parent, usr / "lib" / "python3" / "dist-packages" / "jeepney",
                        ignore=shutil.ignore_patterns("__pycache__", "tests"))
        # Each library where the host has it (/lib/<triplet>/… becomes the runtime's /usr/lib/<triplet>/…,
        # the loader's /lib64 the runtime's /usr/lib64); those from elsewhere (the Swift runtime in
        # /opt) beside libc, on the loader's default path.
        libs, loader = libraries(SECRET_TOOL, keychainctl, "/bin/dash", python)
        libc_dir = next(os.path.dirname(lib) for lib in libs if os.path.basename(lib) == "libc.so.6")
        for lib in [*libs, loader]:
            home = lib if lib.startswith(("/lib", "/usr/lib")) else os.path.join(libc_dir, os.path.basename(lib))
            target = usr / home.removeprefix("/usr").lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, target)
        arch = subprocess.run([FLATPAK, "--default-arch"], capture_output=True, text=True, check=True).stdout.strip()
        (runtime / "metadata").write_text(
            f"[Runtime]\nname={RUNTIME}\nruntime={RUNTIME}/{arch}/{BRANCH}\nsdk={RUNTIME}/{arch}/{BRANCH}\n")
        exported = root / "repo"
        flatpak(["build-export", "--runtime", str(exported), str(runtime), BRANCH], env)
        # build-init needs the runtime installed (as the app's SDK and runtime).
        flatpak(["remote-add", "--user", "--no-gpg-verify", "local", f"file://{exported}"], env)
        flatpak(["install", "--user", "--noninteractive", "-y", "local", f"{RUNTIME}//{BRANCH}"], env)
        for app in APPS:
            build = root / app
            flatpak(["build-init", str(build), app, RUNTIME, RUNTIME, BRANCH], env)
            flatpak(["build-finish", str(build), "--command=secret-tool", "--filesystem=xdg-run/keychaind",
                     "--talk-name=org.freedesktop.secrets"], env)
            flatpak(["build-export", str(exported), str(build), BRANCH], env)
        yield exported
    finally:
        shutil.rmtree(root, ignore_errors=True)


class FlatpakUser:
    """One user's session: a private session bus, keychaind on it and on its socket, and a Flatpak
    installation with the runtime and both apps — all as `uid` (the caller's, or another one
    through setpriv), in a temporary directory of its own."""

    def __init__(self, repo: Path, uid: int):
        self.uid = uid
        self.as_user = [] if uid == os.getuid() else [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        self.root = Path(tempfile.mkdtemp(prefix="kcd-fpr-"))
        os.chmod(self.root, 0o755)
        self.bus_process = self.process = self.log = None
        prepare_home(self.root, uid)
        # keychaind and the admin's keychainctl: copies owned by the caller, which `uid` cannot modify.
        bin_dir, system_apps, data, config = (self.root / n for n in ("bin", "system-apps", "data", "config"))
        for path in (bin_dir, system_apps):
            path.mkdir(mode=0o755)
        self.daemon = bin_dir / "keychaind"
        self.keychainctl = bin_dir / "admin" / "keychainctl"
        self.keychainctl.parent.mkdir(mode=0o755)
        shutil.copy2(daemon_binary(), self.daemon)
        shutil.copy2(daemon_binary().parent / "keychainctl", self.keychainctl)
        (system_apps / "admin.json").write_text(json.dumps({
            "application-identifier": "T.admin", "keychain-access-groups": ["T.admin"],
            "executables": [str(self.keychainctl)], "admin": True}))
        for path in (data, config):
            path.mkdir(mode=0o700)
            os.chown(path, uid, uid)
        (config / "keychaind.json").write_text('{"kdfProfile": "interactive"}')
        os.chown(config / "keychaind.json", uid, uid)
        self.env = flatpak_env(self.root)
        address_file = self.root / "home" / "bus-address"
        self.bus_process = subprocess.Popen(
            [*self.as_user, DBUS_RUN_SESSION, "--", "sh", "-c",
             'echo "$DBUS_SESSION_BUS_ADDRESS" > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 100000', "sh", str(address_file)],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.bus = wait_for("the session bus", lambda: address_file.exists() and address_file.read_text().strip())
        self.env = flatpak_env(self.root, self.bus)
        self.socket = self.root / "xrun" / "keychaind" / "keychaind.sock"
        self.log_path = self.root / "keychaind.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [*self.as_user, str(self.daemon), "--socket", str(self.socket), "--data-dir", str(data),
             "--config", str(config / "keychaind.json"), "--system-apps-dir", str(system_apps), "--secret-service",
             "--log-level", "debug"],
            env=self.env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

        def serving():
            assert self.process.poll() is None, f"keychaind exited: {self.log_text()}"
            return "secret service: serving on the session bus" in self.log_text()
        wait_for("keychaind to serve the bus", serving)
        flatpak(["remote-add", "--user", "--no-gpg-verify", "local", f"file://{repo}"], self.env, self.as_user)
        flatpak(["install", "--user", "--noninteractive", "-y", "local", f"{RUNTIME}//{BRANCH}",
                 *(f"{app}//{BRANCH}" for app in APPS)], self.env, self.as_user)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def app(self, app: str, command: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
        """`flatpak run` of `command` in `app`'s sandbox, as a user would start it. Flatpak binds
        xdg-run/keychaind at the host's path, which on a desktop is the sandbox's own
        $XDG_RUNTIME_DIR (/run/user/<uid>); here the host's is in the temporary directory, so the
        client is told where the socket is."""
        return flatpak([*RUN, f"--env=KEYCHAIND_SOCKET={self.socket}", f"--command={command}", f"{app}//{BRANCH}", *args],
                       self.env, self.as_user, input=input, check=False)

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        """The registered admin's keychainctl, outside any sandbox."""
        return subprocess.run([*self.as_user, str(self.keychainctl), "--socket", str(self.socket), *args],
                              capture_output=True, timeout=DEADLINE, env=self.env)

    def host(self, *argv: str, input: bytes | None = None) -> subprocess.CompletedProcess:
        """An unsandboxed, unregistered program of the same user."""
        return subprocess.run([*self.as_user, *argv], input=input, capture_output=True, timeout=DEADLINE, env=self.env)

    def close(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        if self.log is not None:
            self.log.close()
        if os.environ.get("KEEP_LOG") and self.log_path.exists():
            shutil.copy(self.log_path, os.environ["KEEP_LOG"])
        if self.bus_process is not None and self.bus_process.poll() is None:
            os.killpg(self.bus_process.pid, signal.SIGTERM)   # its own process group: dbus-run-session, the bus, sleep
            self.bus_process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


def can_flatpak_run(u: FlatpakUser):
    """Skips (saying why) when this machine cannot make Flatpak's sandbox at all: bubblewrap itself
    fails (no user namespaces for this uid, say). Any other failure of `flatpak run` is the test's."""
    got = u.app(APPS[0], "sh", "-c", "exit 0")
    if got.returncode == 0:
        return
    bwrap = u.host(BWRAP, "--ro-bind", "/", "/", "--unshare-user", "--unshare-pid", "--proc", "/proc", "--", "true")
    if bwrap.returncode != 0:
        pytest.skip(f"bubblewrap cannot make a sandbox here as uid {u.uid}, so neither can flatpak: "
                    f"{bwrap.stderr.decode(errors='replace').strip()}")
    raise AssertionError(f"flatpak run failed although bubblewrap works: {got.stderr.decode(errors='replace')}")


def uids():
    yield pytest.param(os.getuid(), id="as-caller")
    yield pytest.param("nobody", id="as-nobody")


@pytest.fixture(params=list(uids()))
def user(request, repo):
    uid = request.param
    if uid == "nobody":
        if os.geteuid() != 0 or not SETPRIV:
            pytest.skip("the run as another uid needs root and setpriv (the as-caller run covers this uid)")
        uid = pwd.getpwnam("nobody").pw_uid
    u = FlatpakUser(repo, uid)
    try:
        can_flatpak_run(u)
        yield u
    finally:
        u.close()


def test_two_flatpak_apps_keep_their_own_secrets_on_the_socket(user):
    svc = unique("fpr")
    a, b = APPS
    for app, secret in ((a, "A's secret"), (b, "B's secret")):
        added = user.app(app, "keychainctl", "add", "-s", svc, "-a", "acct", "-w", secret)
        assert added.returncode == 0, (app, added.stderr.decode(errors="replace"), user.log_text()[-4000:])
    for app, secret in ((a, b"A's secret"), (b, b"B's secret")):
        got = user.app(app, "keychainctl", "find", "-s", svc, "-a", "acct", "-w")
        assert (got.returncode, got.stdout.strip()) == (0, secret), (app, got.stderr)
    # B cannot name A's group; an unsandboxed, unregistered program of the user reads neither.
    claimed = user.app(b, "keychainctl", "find", "-s", svc, "-a", "acct", "-w", "--group", f"flatpak.{a}")
    assert claimed.returncode != 0 and b"A's secret" not in claimed.stdout, claimed.stdout
    # With no registration each landed in a group of its own, and keychaind names each by its app ID.
    listed = user.admin("--json", "list")
    assert listed.returncode == 0, listed.stderr
    groups = sorted(item["agrp"] for item in json.loads(listed.stdout) if item.get("svce") == svc)
    assert groups == [f"flatpak.{a}", f"flatpak.{b}"], listed.stdout
    for app in APPS:
        status = user.app(app, "keychainctl", "--json", "status")
        assert status.returncode == 0, status.stderr
        seen = json.loads(status.stdout)
        assert (seen["caller"], seen["groups"]) == (f"flatpak.{app}", [f"flatpak.{app}"]), seen


def test_two_flatpak_secret_tools_keep_their_own_secrets_on_the_bus(user):
    key = unique("fpr")
    a, b = APPS
    for app, secret in ((a, b"A's secret"), (b, b"B's secret")):
        stored = user.app(app, "secret-tool", "store", "--label", f"{app} item", "key", key, input=secret)
        assert stored.returncode == 0, (app, stored.stderr.decode(errors="replace"), user.log_text()[-4000:])
    for app, secret in ((a, b"A's secret"), (b, b"B's secret")):
        got = user.app(app, "secret-tool", "lookup", "key", key)
        assert (got.returncode, got.stdout) == (0, secret), (app, got.stderr)
    search = user.app(a, "secret-tool", "search", "--all", "key", key)
    assert b"A's secret" in search.stdout and b"B's secret" not in search.stdout, search.stdout
    host = user.host(SECRET_TOOL, "lookup", "key", key)
    assert host.stdout == b"", host.stdout
    # The items are in the apps' own groups (the admin sees every group's attributes).
    listed = user.admin("--json", "list")
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)
    labels = {item.get("labl"): item["agrp"] for item in items}
    assert labels.get(f"{a} item") == f"flatpak.{a}" and labels.get(f"{b} item") == f"flatpak.{b}", items
    # keychaind identified each caller on the bus (Flatpak's D-Bus proxy for the app) by its app ID.
    log = user.log_text()
    assert f"app=flatpak.{a}" in log and f"app=flatpak.{b}" in log, log



XDP = "/usr/libexec/xdg-desktop-portal"



def test_flatpak_apps_get_keys_of_their_own_from_the_secret_portal(user):
    # xdg-desktop-portal on the bus offers keychaind's Secret backend (dbus/keychaind.portal); each
    # Flatpak app (no bus permission needed: Flatpak lets every app talk to the portals) gets a
    # 64-byte key of its own, the same at each request, kept as an item of its own group.
    if not os.path.exists(XDP):
        pytest.fail("xdg-desktop-portal is missing (scripts/deps installs it)")
    portals = user.root / "portals"
    portals.mkdir()
    shutil.copy(REPO / "dbus" / "keychaind.portal", portals / "keychaind.portal")
    portal_log_path = user.root / "xdg-desktop-portal.log"
    portal_log = open(portal_log_path, "wb")
    portal = subprocess.Popen([*user.as_user, XDP, "--verbose"], stdin=subprocess.DEVNULL, stdout=portal_log,
                              stderr=subprocess.STDOUT, start_new_session=True,
                              env=dict(user.env, XDG_DESKTOP_PORTAL_DIR=str(portals), XDG_CURRENT_DESKTOP="XFCE"))
    try:
        def serving():
            assert portal.poll() is None, portal_log_path.read_text(errors="replace")
            owned = user.host("dbus-send", "--session", "--print-reply", "--dest=org.freedesktop.DBus", "/",
                              "org.freedesktop.DBus.NameHasOwner", "string:org.freedesktop.portal.Desktop")
            return owned.returncode == 0 and b"boolean true" in owned.stdout
        wait_for("xdg-desktop-portal to serve", serving)

        def key(app):
            # What libsecret in a Flatpak does (test_portal.ASK): RetrieveSecret with the write end of
            # a pipe, the Response, then the key read from the pipe. Not libsecret itself: 0.20.5
            # (Debian 12) sends no handle_token and listens for the Response only once the reply has
            # named the request, so when the backend answers at once it now and then misses it and
            # waits for ever.
            got = user.app(app, "python3", "-c", ASK, "write-end")
            assert got.returncode == 0, (got.stderr, portal_log_path.read_text(errors="replace")[-3000:], user.log_text()[-3000:])
            answer = json.loads(got.stdout.decode().strip().splitlines()[-1])
            assert answer["response"] == 0, answer
            return bytes.fromhex(answer["secret"])
        a, b = APPS
        first = key(a)
        assert len(first) == 64 and key(a) == first
        other = key(b)
        assert len(other) == 64 and other != first
        # Made for each app by its app ID, as an item of its own group (the admin sees the attributes).
        log = user.log_text()
        assert f"made the Secret portal key of an app app={a}" in log and f"made the Secret portal key of an app app={b}" in log, log
        listed = json.loads(user.admin("--json", "list").stdout)
        keys = sorted((item["agrp"], item["acct"]) for item in listed if item.get("svce") == "org.freedesktop.portal.Secret")
        assert keys == [(f"flatpak.{a}", a), (f"flatpak.{b}", b)], listed
    finally:
        portal.send_signal(signal.SIGTERM)
        portal.wait(30)
        portal_log.close()
