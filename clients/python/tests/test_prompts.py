"""Passphrase prompts through pinentry, without a desktop.

keychaind (and keychainctl) speak Assuan to the program the config names as `pinentryProgram`: here
fake_pinentry.py, which answers GETPIN as the test says (a passphrase, a cancel, a timeout) and
writes down every command it got, so a test can read what the person would have seen. Once, the
real `pinentry-tty` runs under a pseudo-terminal and a passphrase is typed into it.

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import daemon_binary, python_env
from test_secret_service import (DEADLINE, ROOT, SECRET_TOOL, SERVICE, call, fresh, set_passphrase,  # noqa: F401
                                 unique, wait_for)

jeepney = pytest.importorskip("jeepney")
from jeepney import MatchRule, message_bus, new_method_call  # noqa: E402

FAKE = Path(__file__).resolve().parent / "fake_pinentry.py"
# A percent sign and spaces: Assuan escapes them on the way (%25), libassuan undoes it.
PASSPHRASE = "pass 100% phrase"
PINENTRY_TTY = shutil.which("pinentry-tty") or "/usr/bin/pinentry-tty"


class FakePinentry:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="kcd-pinentry-"))
        self.program = self.dir / "pinentry"
        shutil.copy2(FAKE, self.program)
        self.program.chmod(0o755)

    def answer(self, *answers):
        (self.dir / "answers.json").write_text(json.dumps(list(answers)))

    def lines(self):
        path = self.dir / "pinentry.log"
        return path.read_text().splitlines() if path.exists() else []

    def count(self, command):
        return sum(1 for line in self.lines() if line.split(" ", 1)[0] == command)

    def argument(self, command):
        return [line.split(" ", 1)[1] for line in self.lines() if line.split(" ", 1)[0] == command and " " in line]


@pytest.fixture
def pinentry():
    p = FakePinentry()
    yield p
    shutil.rmtree(p.dir, ignore_errors=True)


def locked_daemon(fresh, pinentry, display=":99"):  # noqa: F811
    """A daemon with the fake pinentry, a root-registered secret-tool (T.systool) whose item waits
    in a locked keychain; (daemon, its secret-tool, the item's service)."""
    d = fresh({"pinentryProgram": str(pinentry.program)}, env={"DISPLAY": display} if display else {})
    tool = d._copy(SECRET_TOOL, "sys-tool")
    d._app("systool", "T.systool", ["T.systool"], [tool], system=True, secret_service=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the reload", lambda: "apps reloaded why=SIGHUP" in d.log_text())
    service = unique()
    assert d.run([tool, "store", "--label=x", "service", service, "account", "a"], input=b"the secret").returncode == 0
    set_passphrase(d, PASSPHRASE)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    return d, tool, service


def test_secret_tool_lookup_asks_through_pinentry_and_prints_the_secret(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE})
    looked = d.run([tool, "lookup", "service", service, "account", "a"])
    assert looked.returncode == 0 and looked.stdout == b"the secret", looked
    # What the person saw: who asks (the app's registration) and for what (its search).
    [description] = pinentry.argument("SETDESC")
    assert "T.systool" in description and f"service={service}" in description and "account=a" in description
    assert pinentry.argument("SETTITLE") == ["Unlock the keychain"]
    assert "display=:99" in pinentry.argument("OPTION")
    assert pinentry.argument("SETTIMEOUT") == ["120"]
    assert pinentry.count("GETPIN") == 1 and pinentry.count("SETERROR") == 0
    assert not d.locked()
    assert PASSPHRASE not in d.log_text()


def test_a_cancelled_prompt_is_dismissed_and_secret_tool_gets_nothing(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.answer("cancel")
    looked = d.run([tool, "lookup", "service", service, "account", "a"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    assert pinentry.count("GETPIN") == 1
    assert d.locked()
    assert "prompt was dismissed" in d.log_text() and "cancelled" in d.log_text()


def test_a_wrong_passphrase_asks_again_saying_so(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.answer({"pin": "wrong"}, {"pin": PASSPHRASE})
    looked = d.run([tool, "lookup", "service", service, "account", "a"])
    assert looked.returncode == 0 and looked.stdout == b"the secret", looked
    assert pinentry.count("GETPIN") == 2
    [error] = pinentry.argument("SETERROR")
    assert "try 2 of 3" in error
    assert not d.locked()


def test_three_wrong_passphrases_dismiss_the_prompt(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.answer({"pin": "wrong 1"}, {"pin": "wrong 2"}, {"pin": "wrong 3"}, {"pin": PASSPHRASE})
    looked = d.run([tool, "lookup", "service", service, "account", "a"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    assert pinentry.count("GETPIN") == 3 and pinentry.count("SETERROR") == 2
    assert d.locked()


def test_a_prompt_nobody_answers_times_out_and_is_dismissed(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.answer("timeout")
    looked = d.run([tool, "lookup", "service", service, "account", "a"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    assert "nobody answered the passphrase prompt" in d.log_text()
    assert d.locked()


def test_the_bus_is_served_while_a_dialog_shows_and_an_unlock_from_elsewhere_completes_it(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    release = pinentry.dir / "release"
    pinentry.answer({"hold": str(release)})
    lookup = subprocess.Popen([tool, "lookup", "service", service, "account", "a"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=d.env)
    try:
        wait_for("the dialog", lambda: "HOLDING" in pinentry.lines())
        # The dialog runs on a thread of its own: other callers are answered meanwhile.
        other = d.run([d.tool2, "search", "service", "nothing-" + service])
        assert other.returncode in (0, 1) and other.stderr == b"", other
        assert lookup.poll() is None
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(d.root / "pw")]).returncode == 0
        out, err = lookup.communicate(timeout=DEADLINE)
        assert lookup.returncode == 0 and out == b"the secret", err
    finally:
        release.touch()
        if lookup.poll() is None:
            lookup.kill()
            lookup.wait()
    # The dialog's late cancel changes nothing.
    wait_for("the late cancel", lambda: "passphrase prompt was dismissed" in d.log_text())
    assert not d.locked() and d.process.poll() is None


def completed_after_prompt(d, window="4242"):
    """Unlock of the login collection, then Prompt(window); the Completed signal's body."""
    with d.connection() as conn:
        unlocked, prompt = call(conn, ROOT, SERVICE, "Unlock", "ao", ([ROOT + "/collection/login"],))
        assert unlocked == [] and prompt.startswith(ROOT + "/prompt/")
        rule = MatchRule(type="signal", interface="org.freedesktop.Secret.Prompt", member="Completed", path=prompt)
        conn.send_and_get_reply(new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),)), timeout=DEADLINE)
        with conn.filter(rule) as queue:
            call(conn, prompt, "org.freedesktop.Secret.Prompt", "Prompt", "s", (window,))
            return conn.recv_until_filtered(queue, timeout=DEADLINE).body


def test_prompt_passes_the_window_on_and_completes_with_the_unlocked_paths(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE})
    assert completed_after_prompt(d) == (False, ("ao", [ROOT + "/collection/login"]))
    assert "parent-wid=4242" in pinentry.argument("OPTION")
    [description] = pinentry.argument("SETDESC")
    assert "open its collection" in description


def test_cancel_completes_the_prompt_as_dismissed(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry)
    pinentry.answer("cancel")
    assert completed_after_prompt(d) == (True, ("ao", []))


def test_without_a_display_the_prompt_waits_for_keychainctl_unlock(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry, display=None)
    lookup = subprocess.Popen([tool, "lookup", "service", service, "account", "a"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=d.env)
    try:
        wait_for("the prompt", lambda: "waits for the keychain to be unlocked" in d.log_text())
        assert "DISPLAY and WAYLAND_DISPLAY are unset" in d.log_text()
        assert lookup.poll() is None and pinentry.lines() == []
        pw = d.root / "pw"
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(pw)]).returncode == 0
        out, err = lookup.communicate(timeout=DEADLINE)
        assert lookup.returncode == 0 and out == b"the secret", err
    finally:
        if lookup.poll() is None:
            lookup.kill()
            lookup.wait()


def test_a_pinentry_program_that_is_missing_leaves_the_prompt_waiting_saying_why(fresh, pinentry):  # noqa: F811
    d, tool, service = locked_daemon(fresh, pinentry)
    pinentry.program.unlink()
    lookup = subprocess.Popen([tool, "lookup", "service", service, "account", "a"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=d.env)
    try:
        wait_for("the prompt", lambda: "waits for the keychain to be unlocked" in d.log_text())
        assert "is not an executable; install pinentry" in d.log_text() and str(pinentry.program) in d.log_text()
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(d.root / "pw")]).returncode == 0
        out, err = lookup.communicate(timeout=DEADLINE)
        assert lookup.returncode == 0 and out == b"the secret", err
    finally:
        if lookup.poll() is None:
            lookup.kill()
            lookup.wait()


@pytest.mark.parametrize("value, reason", [("bin/pinentry", "must be an absolute path or a program name on PATH"),
                                           ("", "must be a non-empty string"),
                                           (7, "pinentryProgram")])
def test_a_bad_pinentry_program_setting_is_refused_at_start(tmp_path, value, reason):
    config = tmp_path / "keychaind.json"
    config.write_text(json.dumps({"pinentryProgram": value}))
    r = subprocess.run([str(daemon_binary()), "--socket", str(tmp_path / "s"), "--data-dir", str(tmp_path / "d"),
                        "--config", str(config)], capture_output=True, timeout=DEADLINE, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and str(config).encode() in r.stderr and reason.encode() in r.stderr, r.stderr


def keychainctl_without_terminal(d, *args, env=None):
    """keychainctl in a session of its own (no controlling terminal), stdin /dev/null."""
    return subprocess.run([d.keychainctl, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=DEADLINE,
                          env=dict(d.env, **(env or {})), start_new_session=True)


def test_keychainctl_unlock_without_a_terminal_asks_through_pinentry(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry)
    pinentry.answer({"pin": "wrong"}, {"pin": PASSPHRASE})
    r = keychainctl_without_terminal(d, "unlock", env={"DISPLAY": ":98"})
    assert r.returncode == 0, r.stderr
    assert not d.locked()
    assert pinentry.count("GETPIN") == 2 and "display=:98" in pinentry.argument("OPTION")
    assert "keychainctl unlock" in pinentry.argument("SETDESC")[0]


def test_keychainctl_unlock_cancelled_says_so(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry)
    pinentry.answer("cancel")
    r = keychainctl_without_terminal(d, "unlock", env={"DISPLAY": ":98"})
    assert r.returncode != 0 and b"errSecUserCanceled" in r.stderr and b"cancelled" in r.stderr, r.stderr
    assert d.locked()


def test_keychainctl_unlock_with_no_display_and_no_terminal_says_why(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry, display=None)
    r = keychainctl_without_terminal(d, "unlock")
    assert r.returncode != 0 and b"errSecInteractionNotAllowed" in r.stderr, r.stderr
    assert b"DISPLAY and WAYLAND_DISPLAY are unset" in r.stderr, r.stderr
    assert pinentry.lines() == []


@pytest.mark.skipif(not os.access(PINENTRY_TTY, os.X_OK), reason="needs pinentry-tty; scripts/deps installs it")
def test_the_real_pinentry_tty_under_a_pseudo_terminal(fresh, pinentry):  # noqa: F811
    d, _, _ = locked_daemon(fresh, pinentry)
    d.config.write_text(json.dumps({"kdfProfile": "interactive", "pinentryProgram": PINENTRY_TTY}))
    d.stop()
    d.start()
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve(d.keychainctl, [d.keychainctl, "unlock", "--pinentry"], dict(d.env, TERM="dumb"))
        finally:
            os._exit(127)
    seen = b""
    try:
        def read_until(marker):
            nonlocal seen
            end = time.monotonic() + DEADLINE
            while marker not in seen:
                assert time.monotonic() < end, f"no {marker!r} on the terminal: {seen!r}"
                ready, _, _ = select.select([fd], [], [], 1)
                if ready:
                    try:
                        chunk = os.read(fd, 4096)
                    except OSError:
                        chunk = b""
                    assert chunk, f"the terminal closed before {marker!r}: {seen!r}"
                    seen += chunk
        read_until(b"Passphrase:")
        assert b"keychainctl unlock asks for the keychain passphrase" in seen
        os.write(fd, PASSPHRASE.encode() + b"\r")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0, seen
        assert PASSPHRASE.encode() not in seen      # not echoed
        assert not d.locked()
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


# SecItem calls on a locked keychain: the daemon asks through pinentry when the caller allows UI.

def python_app(d):
    """A copy of the interpreter registered (system-wide, so no approval is needed) as T.syspy."""
    from conftest import interpreter
    exe = d._copy(interpreter(), "sys-python")
    d._app("syspy", "T.syspy", ["T.syspy"], [exe], system=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the reload", lambda: "apps reloaded why=SIGHUP" in d.log_text())
    return exe


def locked_with_app_item(fresh, pinentry, env=None):  # noqa: F811
    """A daemon with the fake pinentry (and a display unless env says otherwise), T.syspy's item in a
    locked keychain; (daemon, the app's executable, the item's service)."""
    d = fresh({"pinentryProgram": str(pinentry.program)}, env={"DISPLAY": ":99"} if env is None else env)
    exe = python_app(d)
    service = unique("secitem")
    d.python(exe, f"""
import json
from keychaind import Client
with Client() as c:
    c.add({{"class": "genp", "svce": "{service}", "acct": "a", "v_Data": b"py secret"}})
print(json.dumps({{"ok": True}}))
""")
    set_passphrase(d, PASSPHRASE)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    return d, exe, service


def app_copy(d, exe, service, extra="", returns='"r_Data": True'):
    """The app reads its item with SecItemCopyMatching; {"data": ...} or {"status": ..., "message": ...}."""
    return d.python(exe, f"""
import json
from keychaind import Client, KeychainError
try:
    with Client(timeout=300) as c:
        r = c.copy({{"class": "genp", "svce": "{service}", "acct": "a", {returns} {extra}}})
    print(json.dumps({{"data": r.decode() if isinstance(r, bytes) else repr(r)}}))
except KeychainError as e:
    print(json.dumps({{"status": e.status, "message": str(e)}}))
""")


def test_secitem_on_a_locked_keychain_asks_then_answers(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    pinentry.answer({"pin": "wrong"}, {"pin": PASSPHRASE})
    assert app_copy(d, exe, service) == {"data": "py secret"}
    [description] = pinentry.argument("SETDESC")
    assert "T.syspy" in description and f"service={service}" in description and "account=a" in description
    assert pinentry.count("GETPIN") == 2 and "try 2 of 3" in pinentry.argument("SETERROR")[0]
    assert not d.locked()
    assert PASSPHRASE not in d.log_text()


def test_secitem_allowing_ui_explicitly_asks(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE})
    assert app_copy(d, exe, service, extra=', "u_AuthUI": "u_AuthUIA"') == {"data": "py secret"}
    assert pinentry.count("GETPIN") == 1


@pytest.mark.parametrize("extra", [', "u_AuthUI": "u_AuthUIF"', ', "u_NoAuthUI": True', ', "u_AuthUI": "u_AuthUIS"'])
def test_secitem_refusing_ui_gets_interaction_not_allowed_without_a_prompt(fresh, pinentry, extra):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE})
    seen = app_copy(d, exe, service, extra=extra)
    assert seen["status"] == -25308, seen
    assert pinentry.lines() == []
    assert d.locked()
    # The same read allowing UI (the default) asks, and is answered.
    assert app_copy(d, exe, service) == {"data": "py secret"}
    assert pinentry.count("GETPIN") == 1


def test_secitem_prompt_cancelled_is_user_canceled(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    pinentry.answer("cancel")
    seen = app_copy(d, exe, service)
    assert seen["status"] == -128 and "cancelled" in seen["message"], seen
    assert pinentry.count("GETPIN") == 1
    assert d.locked()


def test_secitem_with_no_display_and_no_terminal_is_interaction_not_allowed(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry, env={})
    seen = app_copy(d, exe, service)
    assert seen["status"] == -25308, seen
    assert pinentry.lines() == [] and "DISPLAY and WAYLAND_DISPLAY are unset" in d.log_text()


def test_secitem_bad_authentication_ui_value_is_a_param_error(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    seen = app_copy(d, exe, service, extra=', "u_AuthUI": "always"')
    assert seen["status"] == -50 and "u_AuthUIA" in seen["message"], seen
    assert pinentry.lines() == []


def test_a_repeated_secitem_read_on_one_connection_asks_after_a_lock(fresh, pinentry):  # noqa: F811
    # The second read of the same query on one connection is served from the connection's memo of
    # compiled queries: it must ask too once the keychain locked between the two.
    d, exe, service = locked_with_app_item(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE}, {"pin": PASSPHRASE})
    seen = d.python(exe, f"""
import json, os, subprocess
from keychaind import Client
q = {{"class": "genp", "svce": "{service}", "acct": "a", "r_Data": True}}
with Client(timeout=300) as c:
    first = c.copy(q).decode()
    subprocess.run([{str(d.keychainctl)!r}, "lock"], check=True)
    second = c.copy(q).decode()
print(json.dumps([first, second]))
""")
    assert seen == ["py secret", "py secret"]
    assert pinentry.count("GETPIN") == 2


def test_a_secitem_dialog_keeps_no_other_client_waiting_and_shows_once(fresh, pinentry):  # noqa: F811
    d, exe, service = locked_with_app_item(fresh, pinentry)
    release = pinentry.dir / "release"
    pinentry.answer({"hold": str(release)})
    code = f"""
import json
from keychaind import Client
with Client(timeout=300) as c:
    print(json.dumps({{"data": c.copy({{"class": "genp", "svce": "{service}", "acct": "a", "r_Data": True}}).decode()}}))
"""
    env = python_env(dict(KEYCHAIND_SOCKET=d.socket))
    first = subprocess.Popen([exe, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    second = None
    try:
        wait_for("the dialog", lambda: "HOLDING" in pinentry.lines())
        # The dialog runs on the asking connection's thread: other clients are answered meanwhile.
        assert d.locked()
        second = subprocess.Popen([exe, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
        assert d.run([d.keychainctl, "unlock", "--passphrase-file", str(d.root / "pw")]).returncode == 0
        release.touch()     # the dialog is cancelled now, after the unlock from elsewhere
        for proc in (first, second):
            out, err = proc.communicate(timeout=DEADLINE)
            assert proc.returncode == 0 and json.loads(out) == {"data": "py secret"}, err
    finally:
        release.touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # One dialog for both callers.
    assert pinentry.count("GETPIN") == 1 and pinentry.count("START") == 1
