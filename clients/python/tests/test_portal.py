"""The Secret portal: Debian's xdg-desktop-portal calling keychaind's backend for sandboxed apps.

Each daemon here is `keychaind --secret-service` on a private session bus (test_secret_service.py);
on the same bus runs the real `/usr/libexec/xdg-desktop-portal`, reading portal files from a
directory that holds only the package's `dbus/keychaind.portal` (`XDG_DESKTOP_PORTAL_DIR`, which
xdg-desktop-portal 1.16 reads instead of /usr/share/xdg-desktop-portal/portals). The apps are Python
programs in bubblewrap sandboxes in Flatpak's layout (test_flatpak.py) that call
`org.freedesktop.portal.Secret.RetrieveSecret` with a pipe, as libsecret inside a Flatpak does, and
read their secret from it.

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import REPO
from test_flatpak import BWRAP, Sandbox
from test_secret_service import DEADLINE, SECRET_TOOL, fresh, make_daemon, set_passphrase, wait_for  # noqa: F401 (fresh: a fixture)

from jeepney import DBusAddress, new_method_call  # noqa: E402
from jeepney.bus_messages import message_bus  # noqa: E402
from jeepney.io.blocking import open_dbus_connection  # noqa: E402
from jeepney.low_level import HeaderFields, MessageType  # noqa: E402

XDP = "/usr/libexec/xdg-desktop-portal"
PORTAL_FILE = REPO / "dbus" / "keychaind.portal"
pytestmark = pytest.mark.skipif(not (BWRAP and SECRET_TOOL and os.path.exists(XDP)),
                                reason="needs bwrap and xdg-desktop-portal; scripts/deps installs them")

# What an app in a sandbox runs: the frontend call with a pipe, then the Response signal and what the
# pipe held. Its last line is one JSON object.
ASK = r"""
import json, os, select, sys
from jeepney import DBusAddress, MatchRule, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

conn = open_dbus_connection(bus="SESSION", enable_fds=True)
token = "t%d" % os.getpid()
handle = "/org/freedesktop/portal/desktop/request/%s/%s" % (conn.unique_name[1:].replace(".", "_"), token)
rule = MatchRule(type="signal", interface="org.freedesktop.portal.Request", member="Response", path=handle)
conn.send_and_get_reply(new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),)), timeout=60)
portal = DBusAddress("/org/freedesktop/portal/desktop", bus_name="org.freedesktop.portal.Desktop",
                     interface="org.freedesktop.portal.Secret")
r, w = os.pipe()
if sys.argv[1] == "read-end":      # the wrong end: not open for writing
    given = r
else:
    given = w
with conn.filter(rule) as queue:
    reply = conn.send_and_get_reply(new_method_call(portal, "RetrieveSecret", "ha{sv}", (given, {"handle_token": ("s", token)})), timeout=60)
    os.close(w)
    response = conn.recv_until_filtered(queue, timeout=60)
data = b""
while select.select([r], [], [], 60)[0]:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    data += chunk
print(json.dumps({"handle": reply.body[0], "response": response.body[0], "secret": data.hex()}))
"""


def venv_site() -> str:
    return [p for p in site.getsitepackages() if p.endswith("site-packages")][0]


class Portal:
    """xdg-desktop-portal on the daemon's bus, with keychaind.portal as its only portal file."""

    def __init__(self, d, root: Path, desktop: str = "XFCE"):
        self.dir = root / "portals"
        self.dir.mkdir()
        shutil.copy(PORTAL_FILE, self.dir / "keychaind.portal")
        self.log_path = root / "xdg-desktop-portal.log"
        self.log = open(self.log_path, "wb")
        env = dict(d.env, XDG_DESKTOP_PORTAL_DIR=str(self.dir), XDG_CURRENT_DESKTOP=desktop)
        self.process = subprocess.Popen([XDP, "--verbose"], stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
        conn = d.connection()
        try:
            def serving():
                if self.process.poll() is not None:
                    raise AssertionError(f"xdg-desktop-portal exited with {self.process.returncode}:\n{self.log_text()}")
                reply = conn.send_and_get_reply(
                    new_method_call(message_bus, "NameHasOwner", "s", ("org.freedesktop.portal.Desktop",)), timeout=DEADLINE)
                return reply.body[0]
            wait_for("xdg-desktop-portal to serve", serving)
        finally:
            conn.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def pd():
    d, root = make_daemon()
    portal = Portal(d, root)
    d.portal = portal
    yield d
    portal.close()
    d.close()
    shutil.rmtree(root, ignore_errors=True)


def ask(d, box: Sandbox, end: str = "write-end") -> dict:
    """Runs ASK in `box` (jeepney from this venv, bound in read-only): its JSON answer."""
    box.binds = (venv_site(),)
    got = box.run(["env", f"PYTHONPATH={venv_site()}", "/usr/bin/python3", "-c", ASK, end])
    assert got.returncode == 0, (got.stderr.decode(), d.portal.log_text(), d.log_text())
    return json.loads(got.stdout.decode().strip().splitlines()[-1])


def test_a_sandboxed_app_gets_a_stable_secret_of_its_own(pd):
    one = ask(pd, Sandbox(pd, "org.example.PortalOne"))
    assert one["response"] == 0, (one, pd.portal.log_text(), pd.log_text())
    assert len(bytes.fromhex(one["secret"])) == 64
    assert ask(pd, Sandbox(pd, "org.example.PortalOne"))["secret"] == one["secret"]
    # Another app gets another secret.
    two = ask(pd, Sandbox(pd, "org.example.PortalTwo"))
    assert two["response"] == 0 and len(two["secret"]) == 128 and two["secret"] != one["secret"]
    # The same secret after keychaind restarts: it is an item of the app's group, not memory.
    pd.stop()
    pd.start()
    again = ask(pd, Sandbox(pd, "org.example.PortalOne"))
    assert (again["response"], again["secret"]) == (0, one["secret"]), (again, pd.portal.log_text())
    # The app sees it as an item of its own group (and the other app does not).
    kc = str(Path(pd.keychainctl))
    mine = Sandbox(pd, "org.example.PortalOne").run(
        [kc, "--socket", pd.socket, "--json", "find", "-s", "org.freedesktop.portal.Secret", "-a", "org.example.PortalOne"])
    assert mine.returncode == 0 and "flatpak.org.example.PortalOne" in mine.stdout.decode(), mine.stderr
    theirs = Sandbox(pd, "org.example.PortalTwo").run(
        [kc, "--socket", pd.socket, "find", "-s", "org.freedesktop.portal.Secret", "-a", "org.example.PortalOne", "-w"])
    assert theirs.returncode != 0 and one["secret"].encode() not in theirs.stdout


def test_a_registration_naming_the_app_id_keeps_the_secret_in_its_group(pd):
    (pd.apps / "portal-reg.json").write_text(json.dumps({
        "application-identifier": "T.portalreg", "keychain-access-groups": ["T.portalreg"],
        "flatpak-app-ids": ["org.example.PortalRegistered"]}))
    got = ask(pd, Sandbox(pd, "org.example.PortalRegistered"))
    assert got["response"] == 0, (got, pd.log_text())
    found = Sandbox(pd, "org.example.PortalRegistered").run(
        [pd.keychainctl, "--socket", pd.socket, "--json", "find", "-s", "org.freedesktop.portal.Secret"])
    assert found.returncode == 0 and '"T.portalreg"' in found.stdout.decode(), found.stdout


def test_a_sandbox_whose_flatpak_info_is_writable_gets_no_secret(pd):
    # xdg-desktop-portal 1.16 takes a writable /.flatpak-info at its word; keychaind identifies the
    # asking process itself and refuses.
    real = ask(pd, Sandbox(pd, "org.example.PortalOne"))
    forged = ask(pd, Sandbox(pd, "org.example.PortalOne", writable_info=True))
    assert forged["response"] != 0 and forged["secret"] == "" and real["secret"] != "", forged
    assert "/.flatpak-info is writable" in pd.portal.log_text(), pd.portal.log_text()


def test_a_sandbox_made_inside_a_sandbox_cannot_claim_another_apps_secret(pd):
    two = ask(pd, Sandbox(pd, "org.example.PortalTwo"))
    assert two["response"] == 0
    site_dir = venv_site()
    bus_path = pd.bus.address.split("path=", 1)[1].split(",", 1)[0]
    nested = ('printf "[Application]\\nname=org.example.PortalTwo\\n" > /tmp/info && '
              'exec bwrap --bind /proc /proc --dev-bind /dev /dev --ro-bind /usr /usr --symlink usr/lib /lib '
              f'--symlink usr/lib64 /lib64 --symlink usr/bin /bin --tmpfs /tmp --bind {bus_path} {bus_path} '
              f'--ro-bind {site_dir} {site_dir} --unshare-user --ro-bind-data 3 /.flatpak-info '
              f'env PYTHONPATH={site_dir} /usr/bin/python3 -c "$ASK" write-end 3</tmp/info')
    box = Sandbox(pd, "org.example.PortalOne", binds=(site_dir,))
    env_ask = box.run(["env", f"ASK={ASK}", "sh", "-c", nested])
    assert env_ask.returncode == 0, env_ask.stderr.decode()
    got = json.loads(env_ask.stdout.decode().strip().splitlines()[-1])
    assert got["secret"] == "" and got["response"] != 0, got
    assert "a sandbox made inside a sandbox" in pd.portal.log_text(), pd.portal.log_text()


def test_an_unsandboxed_caller_of_the_portal_gets_nothing(pd):
    # xdg-desktop-portal names no app ID for a process outside a sandbox: keychaind refuses.
    env = dict(pd.env)
    got = subprocess.run([shutil.which("python3") or "/usr/bin/python3", "-c", ASK, "write-end"],
                         capture_output=True, timeout=DEADLINE, env=dict(env, PYTHONPATH=venv_site()))
    assert got.returncode == 0, got.stderr.decode()
    answer = json.loads(got.stdout.decode().strip().splitlines()[-1])
    assert answer["response"] != 0 and answer["secret"] == "", answer
    assert "no app ID" in pd.portal.log_text()


def test_a_read_end_given_for_the_secret_is_refused(pd):
    got = ask(pd, Sandbox(pd, "org.example.PortalOne"), end="read-end")
    assert got["response"] != 0 and got["secret"] == ""
    assert "not open for writing" in pd.portal.log_text()


def test_only_xdg_desktop_portal_may_call_the_backend(pd):
    r, w = os.pipe()
    try:
        conn = open_dbus_connection(bus=pd.bus.address, enable_fds=True)
        handle = "/org/freedesktop/portal/desktop/request/" + conn.unique_name[1:].replace(".", "_") + "/t"
        impl = DBusAddress("/org/freedesktop/portal/desktop", bus_name="org.freedesktop.secrets",
                           interface="org.freedesktop.impl.portal.Secret")
        reply = conn.send_and_get_reply(new_method_call(impl, "RetrieveSecret", "osha{sv}",
                                                        (handle, "org.example.PortalOne", w, {})), timeout=DEADLINE)
        conn.close()
        os.close(w)
        w = -1
        assert reply.header.message_type == MessageType.error, reply.body
        assert reply.header.fields[HeaderFields.error_name] == "org.freedesktop.DBus.Error.AccessDenied"
        assert "only xdg-desktop-portal" in reply.body[0], reply.body
        assert os.read(r, 100) == b""
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_libsecret_in_a_sandbox_keeps_its_secrets_in_a_file_keyed_by_the_portal(pd, tmp_path):
    # libsecret inside a Flatpak (/.flatpak-info) asks the portal for its app's key and keeps its
    # items in a file keyring in the app's own data: the file opens again after keychaind restarts,
    # and not for another app.
    data = tmp_path / "app-data"
    data.mkdir()
    lookup = ["env", f"XDG_DATA_HOME={data}", "secret-tool", "lookup", "key", "libsecret"]
    box = Sandbox(pd, "org.example.PortalLibsecret", writable_binds=(str(data),))
    stored = box.run(["env", f"XDG_DATA_HOME={data}", "secret-tool", "store", "--label", "in a file", "key", "libsecret"],
                     input=b"kept in the file")
    assert stored.returncode == 0, (stored.stderr, pd.portal.log_text())
    assert (data / "keyrings" / "default.keyring").is_file()
    assert b"kept in the file" not in (data / "keyrings" / "default.keyring").read_bytes()
    pd.stop()
    pd.start()
    got = box.run(lookup)
    assert (got.returncode, got.stdout) == (0, b"kept in the file"), (got.stderr, pd.portal.log_text())
    other = Sandbox(pd, "org.example.PortalOther", writable_binds=(str(data),)).run(lookup)
    assert b"kept in the file" not in other.stdout, other.stdout


# Input xdg-desktop-portal never sends, sent by a program the daemon takes for it: a debug build's
# KEYCHAIND_TEST_PORTAL_FRONTEND names a copy of the interpreter (a release build has no such switch).
FRONTEND = r"""
import json, os, sys
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields, MessageType
conn = open_dbus_connection(bus="SESSION", enable_fds=True)
impl = DBusAddress("/org/freedesktop/portal/desktop", bus_name="org.freedesktop.secrets",
                   interface="org.freedesktop.impl.portal.Secret")
me = "/org/freedesktop/portal/desktop/request/%s/t" % conn.unique_name[1:].replace(".", "_")
out = []
r, w = os.pipe()
for signature, body in [
    ("osha{sv}", (me, "", w, {})),                                  # no app ID
    ("osha{sv}", (me, "not an app id", w, {})),                     # an invalid one
    ("osha{sv}", (me, "org.example.PortalOne", r, {})),             # a descriptor not open for writing
    ("osa{sv}", (me, "org.example.PortalOne", {})),                 # no descriptor at all
    ("osha{sv}", ("/elsewhere", "org.example.PortalOne", w, {})),   # a handle that is no request
    ("osha{sv}", (me, "org.example.PortalOne", w, {})),             # a caller that is no sandbox
]:
    reply = conn.send_and_get_reply(new_method_call(impl, "RetrieveSecret", signature, body), timeout=60)
    error = reply.header.fields.get(HeaderFields.error_name) if reply.header.message_type == MessageType.error else None
    out.append([error, str(reply.body[0]) if reply.body else ""])
os.close(w)
print(json.dumps({"replies": out, "written": os.read(r, 100).hex()}))
"""


def test_bad_input_gets_a_clear_error(fresh):
    d = fresh()
    d.stop()
    d.env["KEYCHAIND_TEST_PORTAL_FRONTEND"] = d.stranger_python
    d.start()
    got = d.python(d.stranger_python, FRONTEND)
    names = [name for name, _ in got["replies"]]
    messages = [message for _, message in got["replies"]]
    assert names == ["org.freedesktop.DBus.Error.InvalidArgs"] * 5 + ["org.freedesktop.DBus.Error.AccessDenied"], got
    assert "no app ID" in messages[0] and "not a valid Flatpak app ID" in messages[1]
    assert "not open for writing" in messages[2] and "osha{sv}" in messages[3]
    assert "not a portal request path" in messages[4] and "runs in no Flatpak sandbox" in messages[5], messages
    assert got["written"] == ""
    assert d.process.poll() is None     # still serving


def test_a_locked_keychain_answers_once_unlocked(fresh):
    d = fresh()
    pw = set_passphrase(d)
    d.portal = Portal(d, d.root)
    try:
        assert d.run([d.keychainctl, "lock"]).returncode == 0 and d.locked()
        result = {}
        asking = threading.Thread(target=lambda: result.update(ask(d, Sandbox(d, "org.example.PortalLocked"))))
        asking.start()
        wait_for("the portal call to wait for the unlock",
                 lambda: "the Secret portal waits for the keychain to be unlocked" in d.log_text())
        assert asking.is_alive() and not result     # waiting, not failed
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
        asking.join(DEADLINE)
        assert result["response"] == 0 and len(bytes.fromhex(result["secret"])) == 64, result
    finally:
        d.portal.close()
