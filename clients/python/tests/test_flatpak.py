"""Sandboxed apps: callers in a Flatpak-like sandbox are identified by the app ID of their sandbox.

The sandboxes are made with Debian's `bubblewrap` in Flatpak's layout: the host's /usr read-only
(with the /lib, /lib64 and /bin symlinks), new user and pid namespaces, the app ID in a read-only
`/.flatpak-info` (`--ro-bind-data`, as Flatpak mounts it), and the keychaind socket and the session
bus socket bound in. No Flathub, no registration: a new user's view.
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

import pytest

from test_secret_service import DEADLINE, SECRET_TOOL, make_daemon, unique, wait_for

BWRAP = shutil.which("bwrap")
SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(not (BWRAP and SECRET_TOOL), reason="needs bwrap (bubblewrap); scripts/deps installs it")


def swift_runtime() -> list[str]:
    """The directories of the Swift runtime keychainctl links to, when outside /usr (a toolchain in /opt)."""
    out = subprocess.run(["ldd", str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")],
                         capture_output=True, text=True).stdout
    dirs = set()
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/") and not parts[1].strip().startswith("/usr"):
            dirs.add(os.path.dirname(parts[1].split()[0]))
    return sorted(dirs)


class Sandbox:
    """`bwrap` with Flatpak's layout around one command, its `/.flatpak-info` naming `app_id`."""

    def __init__(self, d, app_id: str | None, writable_info: bool = False, info_text: str | None = None,
                 binds: tuple[str, ...] = (), writable_binds: tuple[str, ...] = (), as_user: list[str] | None = None,
                 dev_bind: bool = False):
        self.d = d
        self.app_id = app_id
        self.writable_info = writable_info
        self.info_text = info_text
        self.binds = binds   # more host paths, bound read-only at the same place
        self.writable_binds = writable_binds   # and writable (an app's own data)
        self.as_user = as_user   # a setpriv command line: the sandbox is made by that uid, without the build tree
        self.dev_bind = dev_bind   # the host's /dev (Flatpak's --device=all) rather than a new one with a devpts

    def run(self, argv, input: bytes | None = None) -> subprocess.CompletedProcess:
        bus_path = self.d.bus.address.split("path=", 1)[1].split(",", 1)[0]
        args = [BWRAP, "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--proc", "/proc",
                *(["--dev-bind", "/dev", "/dev"] if self.dev_bind else ["--dev", "/dev"]), "--tmpfs", "/tmp",
                "--unshare-user", "--unshare-pid", "--die-with-parent",
                "--bind", self.d.socket, self.d.socket, "--bind", bus_path, bus_path]
        if self.as_user is None:
            build = str(Path(make_daemon.__globals__["daemon_binary"]()).parent)
            args += ["--ro-bind", build, build]
            for lib in swift_runtime():
                args += ["--ro-bind", lib, lib]
        for path in self.binds:
            args += ["--ro-bind", path, path]
        for path in self.writable_binds:
            args += ["--bind", path, path]
        pass_fds = ()
        if self.app_id is not None or self.info_text is not None:
            text = self.info_text if self.info_text is not None else f"[Application]\nname={self.app_id}\nruntime=runtime/org.example.Platform/x86_64/1\n"
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            args += ["--file" if self.writable_info else "--ro-bind-data", str(r), "/.flatpak-info"]
            pass_fds = (r,)
        env = {"DBUS_SESSION_BUS_ADDRESS": self.d.bus.address, "KEYCHAIND_SOCKET": self.d.socket, "PATH": "/usr/bin"}
        try:
            return subprocess.run((self.as_user or []) + args + ["--"] + list(argv), input=input, capture_output=True,
                                  timeout=DEADLINE, env=env, pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)


class UserDaemon:
    """keychaind, its session bus and the sandboxes as a non-root uid (setpriv), as the
    IntegrationTests' UserSession runs them: what that user's processes can do is only seen from
    that uid (the suite runs as root). The daemon binary is a root-owned copy; the home is the uid's."""

    def __init__(self):
        assert os.geteuid() == 0 and SETPRIV, "needs root and setpriv to run keychaind as another uid"
        # nobody: dbus-daemon refuses to run as, or to admit, a uid without a passwd entry (it looks
        # up its groups), so the random uids of the IntegrationTests' UserSession cannot have a bus.
        # It is an ordinary uid all the same; everything of this daemon lives in a directory of its own.
        self.uid = pwd.getpwnam("nobody").pw_uid
        self.root = Path(tempfile.mkdtemp(prefix="kcd-fp-user-"))
        os.chmod(self.root, 0o755)
        home = self.root / "home"
        bin_dir, system_apps = self.root / "bin", self.root / "system-apps"
        for path in (bin_dir, system_apps, home / "run", home / "data", home / "config"):
            path.mkdir(parents=True)
        daemon = bin_dir / "keychaind"
        shutil.copy2(make_daemon.__globals__["daemon_binary"](), daemon)
        (home / "config" / "keychaind.json").write_text('{"kdfProfile": "interactive"}')
        for path in (home, home / "run", home / "data", home / "config", home / "config" / "keychaind.json"):
            os.chown(path, self.uid, self.uid)
            os.chmod(path, 0o600 if path.is_file() else 0o700)
        self.setpriv = [SETPRIV, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(home / "config")}
        address_file = home / "bus-address"
        self.bus_process = subprocess.Popen(
            self.setpriv + [shutil.which("dbus-run-session"), "--", "sh", "-c",
                            'echo "$DBUS_SESSION_BUS_ADDRESS" > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 100000', "sh",
                            str(address_file)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.bus = type("Bus", (), {})()
        self.bus.address = wait_for("the user's session bus", lambda: address_file.exists() and address_file.read_text().strip())
        self.socket = str(home / "run" / "kc.sock")
        self.log_path = self.root / "keychaind.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            self.setpriv + [str(daemon), "--socket", self.socket, "--data-dir", str(home / "data"),
                            "--config", str(home / "config" / "keychaind.json"), "--system-apps-dir", str(system_apps),
                            "--secret-service", "--log-level", "debug"],
            env=dict(env, DBUS_SESSION_BUS_ADDRESS=self.bus.address, SWIFT_BACKTRACE="enable=no"),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

        def serving():
            assert self.process.poll() is None, f"keychaind exited: {self.log_path.read_text(errors='replace')}"
            return "secret service: serving on the session bus" in self.log_path.read_text(errors="replace")
        wait_for("keychaind (as the throwaway uid) to serve the bus", serving)

    def run(self, argv, input: bytes | None = None) -> subprocess.CompletedProcess:
        """`argv` as the throwaway uid, outside any sandbox, on its bus."""
        return subprocess.run(self.setpriv + list(argv), input=input, capture_output=True, timeout=DEADLINE,
                              env={"DBUS_SESSION_BUS_ADDRESS": self.bus.address, "PATH": "/usr/bin:/bin"})

    def close(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.log.close()
        if os.environ.get("KEEP_LOG"):
            shutil.copy(self.log_path, os.environ["KEEP_LOG"])
        if self.bus_process.poll() is None:
            os.killpg(self.bus_process.pid, signal.SIGTERM)   # its own process group: dbus-run-session, the bus, sleep
            self.bus_process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def d():
    made, root = make_daemon()
    yield made
    made.close()
    shutil.rmtree(root, ignore_errors=True)


def store(box, attr, value, secret):
    return box.run(["secret-tool", "store", "--label", "sandboxed", attr, value], input=secret)


def lookup(box, attr, value):
    return box.run(["secret-tool", "lookup", attr, value])


def assert_walled_apart(one, two, host):
    """Each sandbox stores and reads its own secret under the same attribute; neither sees the
    other's item in a search, and an unsandboxed unregistered secret-tool (`host` runs it) sees neither."""
    key = unique("fp")
    stored = store(one, "key", key, b"one's secret")
    assert stored.returncode == 0, stored.stderr
    assert store(two, "key", key, b"two's secret").returncode == 0
    got1, got2 = lookup(one, "key", key), lookup(two, "key", key)
    assert (got1.returncode, got1.stdout) == (0, b"one's secret"), got1.stderr
    assert (got2.returncode, got2.stdout) == (0, b"two's secret"), got2.stderr
    search = one.run(["secret-tool", "search", "--all", "key", key])
    assert b"two's secret" not in search.stdout and b"one's secret" in search.stdout
    shown = host([SECRET_TOOL, "lookup", "key", key])
    assert shown.stdout == b"", shown.stdout


def test_two_unregistered_sandboxed_secret_tools_each_keep_their_own_secret(d):
    assert_walled_apart(Sandbox(d, "org.example.One"), Sandbox(d, "org.example.Two"), d.run)


def test_two_unregistered_sandboxed_secret_tools_are_walled_apart_as_a_non_root_user():
    # The same wall with keychaind, its bus and both sandboxes run by an ordinary uid (no root anywhere).
    u = UserDaemon()
    try:
        assert_walled_apart(Sandbox(u, "org.example.One", as_user=u.setpriv),
                            Sandbox(u, "org.example.Two", as_user=u.setpriv), u.run)
        assert "flatpak.org.example.One" in u.log_path.read_text(errors="replace")
    finally:
        u.close()


@pytest.mark.parametrize("dev_bind", [False, True], ids=["flatpak-dev", "device-all"])
def test_a_sandbox_made_inside_a_sandbox_claims_no_app_as_a_non_root_user(dev_bind):
    # As an ordinary uid, bubblewrap puts an app with a new /dev one user namespace deeper (it mounts
    # devpts as uid 0 of a namespace between): that sandbox is its app, and one made inside it is not.
    u = UserDaemon()
    try:
        key = unique("fp")
        assert store(Sandbox(u, "org.example.Two", as_user=u.setpriv), "key", key, b"two's secret").returncode == 0
        bus_path = u.bus.address.split("path=", 1)[1].split(",", 1)[0]
        nested = ('printf "[Application]\\nname=org.example.Two\\n" > /tmp/info && '
                  'exec bwrap --bind /proc /proc --dev-bind /dev /dev --ro-bind /usr /usr --symlink usr/lib /lib '
                  f'--symlink usr/lib64 /lib64 --symlink usr/bin /bin --bind {bus_path} {bus_path} '
                  f'--unshare-user --ro-bind-data 3 /.flatpak-info secret-tool lookup key {key} 3</tmp/info')
        got = Sandbox(u, "org.example.One", as_user=u.setpriv, dev_bind=dev_bind).run(["sh", "-c", nested])
        assert b"two's secret" not in got.stdout, got.stderr
        # Two only for its real sandbox; the one made inside One's is no app (the shared collection).
        log = u.log_path.read_text(errors="replace")
        assert log.count("app=flatpak.org.example.Two") == 1 and "app=(unregistered, shared collection)" in log, log
    finally:
        u.close()


def test_a_sandboxed_app_cannot_chroot_into_a_root_of_its_own_making_as_a_non_root_user():
    # An app whose sandbox lets it make user namespaces (bubblewrap with the host's /dev and no
    # seccomp filter) makes one, builds in a mount namespace of a child process a root holding a
    # read-only /.flatpak-info naming another app, and chroots into it through /proc/<child>/root.
    # Its own mount namespace stays the sandbox's, whose layout is trusted: only the mount the file
    # lies on, absent from the mounts the process itself sees, gives it away.
    u = UserDaemon()
    try:
        key = unique("fp")
        assert store(Sandbox(u, "org.example.Two", as_user=u.setpriv), "key", key, b"two's secret").returncode == 0
        bus_path = u.bus.address.split("path=", 1)[1].split(",", 1)[0]
        build_root = (
            "mount -t tmpfs none /tmp/x && cd /tmp/x && mkdir -p usr proc .$(dirname $BUS) && "
            "ln -s usr/lib lib && ln -s usr/lib64 lib64 && ln -s usr/bin bin && "
            "mount --rbind /usr usr && mount --rbind /proc proc && touch .$BUS && mount --bind $BUS .$BUS && "
            "touch .flatpak-info && mount --bind /tmp/info .flatpak-info && "
            "mount -o remount,bind,ro .flatpak-info && touch /tmp/x/ready && exec sleep 600")
        attack = (
            'printf "[Application]\\nname=org.example.Two\\n" > /tmp/info && mkdir -p /tmp/x && '
            "exec unshare -U -r sh -c '"
            f'unshare -m sh -c "{build_root}" & P1=$!; '
            "for i in $(seq 600); do [ -e /proc/$P1/root/tmp/x/ready ] && break; sleep 0.05; done; "
            f"/usr/sbin/chroot /proc/$P1/root/tmp/x secret-tool lookup key {key}; echo rc=$?; kill $P1'")
        got = Sandbox(u, "org.example.One", as_user=u.setpriv, dev_bind=True).run(
            ["env", f"BUS={bus_path}", "sh", "-c", attack])
        log = u.log_path.read_text(errors="replace")
        assert b"rc=" in got.stdout, (got.stdout, got.stderr)   # the chroot ran (the attack was possible)
        assert b"two's secret" not in got.stdout, (got.stdout, log)
        # Two only for its real sandbox; the chrooted process is no app (the shared collection).
        assert log.count("app=flatpak.org.example.Two") == 1 and "app=(unregistered, shared collection)" in log, log
    finally:
        u.close()


def test_a_sandboxed_secitem_client_has_a_group_of_its_own_on_the_socket(d):
    kc = str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")
    svc = unique("fp")
    one, two = Sandbox(d, "org.example.One"), Sandbox(d, "org.example.Two")
    added = one.run([kc, "--socket", d.socket, "add", "-s", svc, "-a", "acct", "-w", "one secret"])
    assert added.returncode == 0, added.stderr
    found = one.run([kc, "--socket", d.socket, "--json", "find", "-s", svc, "-a", "acct"])
    assert found.returncode == 0, found.stderr
    assert "flatpak.org.example.One" in found.stdout.decode()
    other = two.run([kc, "--socket", d.socket, "find", "-s", svc, "-a", "acct", "-w"])
    assert other.returncode != 0 and b"one secret" not in other.stdout
    # Nor can it name the other app's group.
    claimed = two.run([kc, "--socket", d.socket, "find", "-s", svc, "-a", "acct", "-w", "--group", "flatpak.org.example.One"])
    assert claimed.returncode != 0 and b"one secret" not in claimed.stdout


def test_a_writable_flatpak_info_names_no_app(d):
    key = unique("fp")
    assert store(Sandbox(d, "org.example.One"), "key", key, b"one's secret").returncode == 0
    forged = Sandbox(d, "org.example.One", writable_info=True)
    got = lookup(forged, "key", key)
    assert b"one's secret" not in got.stdout
    kc = str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")
    refused = forged.run([kc, "--socket", d.socket, "list"])
    assert refused.returncode != 0 and b"writable" in refused.stderr, refused.stderr


def test_an_ambiguous_or_invalid_flatpak_info_names_no_app(d):
    kc = str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")
    for text in ("[Application]\nname=org.example.One\nname=org.example.Two\n", "[Application]\nname=../etc\n"):
        refused = Sandbox(d, None, info_text=text).run([kc, "--socket", d.socket, "list"])
        assert refused.returncode != 0 and b"names no valid app ID" in refused.stderr, refused.stderr


def test_an_executable_registration_does_not_reach_into_a_sandbox(d):
    # tool1 is registered by its executable (app T.tool1); the same file run in a sandbox is the
    # sandbox's app ID, not T.tool1.
    key = unique("fp")
    host = d.run([d.tool1, "store", "--label", "host", "key", key], input=b"tool1's secret")
    assert host.returncode == 0, host.stderr
    box = Sandbox(d, "org.example.One")
    bind = box.run(["secret-tool", "lookup", "key", key])
    assert b"tool1's secret" not in bind.stdout


def test_a_registration_can_name_a_flatpak_app_id(d):
    (d.apps / "fp.json").write_text(json.dumps({
        "application-identifier": "T.fp", "keychain-access-groups": ["T.fp"], "flatpak-app-ids": ["org.example.Registered"]}))
    kc = str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")
    svc = unique("fp")
    box = Sandbox(d, "org.example.Registered")
    added = box.run([kc, "--socket", d.socket, "add", "-s", svc, "-a", "acct", "-w", "registered secret"])
    assert added.returncode == 0, added.stderr
    found = box.run([kc, "--socket", d.socket, "--json", "find", "-s", svc, "-a", "acct"])
    assert found.returncode == 0 and '"T.fp"' in found.stdout.decode(), found.stdout


def test_a_sandbox_cannot_claim_another_app_id_with_a_sandbox_of_its_own(d):
    kc = str(Path(make_daemon.__globals__["daemon_binary"]()).parent / "keychainctl")
    svc = unique("fp")
    two = Sandbox(d, "org.example.Two")
    assert two.run([kc, "--socket", d.socket, "add", "-s", svc, "-a", "acct", "-w", "two secret"]).returncode == 0
    # App One makes a namespace of its own inside its sandbox, with a read-only /.flatpak-info naming Two.
    nested = ('printf "[Application]\\nname=org.example.Two\\n" > /tmp/info && '
              'exec bwrap --bind /proc /proc --dev-bind /dev /dev --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin '
              f'--bind {d.socket} {d.socket} --ro-bind {Path(kc).parent} {Path(kc).parent} '
              + "".join(f"--ro-bind {lib} {lib} " for lib in swift_runtime())
              + f'--unshare-user --ro-bind-data 3 /.flatpak-info {kc} --socket {d.socket} find -s {svc} -a acct -w 3</tmp/info')
    got = Sandbox(d, "org.example.One").run(["sh", "-c", nested])
    assert b"two secret" not in got.stdout, (got.stdout, got.stderr, nested)
    assert got.returncode != 0 and b"a sandbox made inside a sandbox" in got.stderr, (got.returncode, got.stderr, nested)


def test_a_sandbox_made_inside_a_sandbox_is_no_app_on_the_bus_either(d):
    key = unique("fp")
    assert store(Sandbox(d, "org.example.Two"), "key", key, b"two's secret").returncode == 0
    bus_path = d.bus.address.split("path=", 1)[1].split(",", 1)[0]
    nested = ('printf "[Application]\\nname=org.example.Two\\n" > /tmp/info && '
              'exec bwrap --bind /proc /proc --dev-bind /dev /dev --ro-bind /usr /usr --symlink usr/lib /lib '
              f'--symlink usr/lib64 /lib64 --symlink usr/bin /bin --bind {bus_path} {bus_path} '
              f'--unshare-user --ro-bind-data 3 /.flatpak-info secret-tool lookup key {key} 3</tmp/info')
    got = Sandbox(d, "org.example.One").run(["sh", "-c", nested])
    # Not Two: like any caller that is no app, it sees at most the shared collection, without Two's item.
    assert got.returncode != 0 and b"two's secret" not in got.stdout, got.stderr


def test_a_sandbox_cannot_pass_for_flatpaks_bus_proxy(d):
    # Flatpak's D-Bus proxy has a writable /.flatpak-info and is trusted as the proxy only in
    # keychaind's pid namespace. A sandbox that writes its own file and runs xdg-dbus-proxy
    # inside its own pid namespace (as every Flatpak app has) is no app.
    if not os.path.exists("/usr/bin/xdg-dbus-proxy"):
        pytest.fail("xdg-dbus-proxy is missing (flatpak depends on it; scripts/deps installs flatpak)")
    key = unique("fp")
    assert store(Sandbox(d, "org.example.Two"), "key", key, b"two's secret").returncode == 0
    through_proxy = ('mkfifo /tmp/ready && exec 4<>/tmp/ready && '
                     '{ xdg-dbus-proxy --fd=5 "$DBUS_SESSION_BUS_ADDRESS" /tmp/proxy 5>/tmp/ready & } && '
                     'head -c1 <&4 >/dev/null && '
                     f'DBUS_SESSION_BUS_ADDRESS=unix:path=/tmp/proxy secret-tool lookup key {key}')
    got = Sandbox(d, "org.example.Two", writable_info=True).run(["sh", "-c", through_proxy])
    assert b"two's secret" not in got.stdout, got.stderr
    assert b"No such secret" in got.stderr or got.returncode != 0, (got.returncode, got.stderr)
