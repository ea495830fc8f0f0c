"""Other apps' items on the Secret Service, confirmed per item (`"secretServiceForeignItems": "confirm"`).

Two apps registered system-wide for the bus (so they are themselves while a passphrase is set): app A
(a copy of secret-tool, group T.a) stores an item; app B (another copy of secret-tool, and a copy of
the interpreter for hand-made calls, group T.b) looks it up. The person is fake_pinentry.py, which
answers the yes/no dialog as the test says and writes down what it was shown.

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import os
import signal

import pytest

from conftest import interpreter
from test_prompts import PASSPHRASE, pinentry  # noqa: F401
from test_secret_service import SECRET_TOOL, fresh, set_passphrase, unique, wait_for  # noqa: F401

jeepney = pytest.importorskip("jeepney")


def two_apps(fresh, pinentry, mode="confirm"):  # noqa: F811
    """A daemon with a passphrase set (unlocked), A's item stored; (daemon, A's tool, B's tool, B's
    interpreter, the item's service)."""
    config = {"pinentryProgram": str(pinentry.program)}
    if mode is not None:
        config["secretServiceForeignItems"] = mode
    d = fresh(config, env={"DISPLAY": ":99"})
    tool_a = d._copy(SECRET_TOOL, "tool-a")
    tool_b = d._copy(SECRET_TOOL, "tool-b")
    python_b = d._copy(interpreter(), "python-b")
    d._app("a", "T.a", ["T.a"], [tool_a], system=True, secret_service=True)
    d._app("b", "T.b", ["T.b"], [tool_b, python_b], system=True, secret_service=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the reload", lambda: "apps reloaded why=SIGHUP" in d.log_text())
    service = unique("foreign")
    stored = d.run([tool_a, "store", "--label=A's mail password", "service", service, "account", "alice"],
                   input=b"a-secret")
    assert stored.returncode == 0, stored
    set_passphrase(d, PASSPHRASE)
    assert not d.locked()
    return d, tool_a, tool_b, python_b, service


def test_secret_tool_of_another_app_is_asked_about_and_gets_the_secret_after_yes(fresh, pinentry):  # noqa: F811
    d, tool_a, tool_b, _, service = two_apps(fresh, pinentry)
    pinentry.answer("yes")
    looked = d.run([tool_b, "lookup", "service", service, "account", "alice"])
    assert looked.returncode == 0 and looked.stdout == b"a-secret", looked
    # What the person saw: a yes/no question naming the asking app, the item and whose group it is.
    assert pinentry.count("CONFIRM") == 1 and pinentry.count("GETPIN") == 0
    [description] = pinentry.argument("SETDESC")
    assert "T.b" in description and "A's mail password" in description
    assert f"service={service}" in description and "account=alice" in description
    assert "access group T.a" in description
    assert pinentry.argument("SETTITLE") == ["Allow access to another app's item"]
    assert pinentry.argument("SETOK") == ["Allow"] and pinentry.argument("SETCANCEL") == ["Deny"]
    # A's own lookup never asks.
    assert d.run([tool_a, "lookup", "service", service, "account", "alice"]).stdout == b"a-secret"
    assert pinentry.count("CONFIRM") == 1


def test_on_a_locked_keychain_the_passphrase_comes_first_then_the_yes_or_no(fresh, pinentry):  # noqa: F811
    d, _, tool_b, _, service = two_apps(fresh, pinentry)
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    pinentry.answer({"pin": PASSPHRASE}, "yes")
    looked = d.run([tool_b, "lookup", "service", service, "account", "alice"])
    assert looked.returncode == 0 and looked.stdout == b"a-secret", (pinentry.lines(), d.log_text()[-3000:])
    assert pinentry.count("GETPIN") == 1 and pinentry.count("CONFIRM") == 1
    unlock, confirm = pinentry.argument("SETDESC")
    assert "T.b" in unlock and "other apps" in unlock
    assert "T.b" in confirm and "access group T.a" in confirm
    assert not d.locked()


@pytest.mark.parametrize("answer", ["cancel", "no"])
def test_a_denied_confirmation_gives_nothing(fresh, pinentry, answer):  # noqa: F811
    d, _, tool_b, _, service = two_apps(fresh, pinentry)
    pinentry.answer(answer)
    looked = d.run([tool_b, "lookup", "service", service, "account", "alice"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    assert pinentry.count("CONFIRM") == 1
    assert "confirmation prompt was dismissed" in d.log_text() or "prompt was dismissed" in d.log_text()


@pytest.mark.parametrize("mode", [None, "refuse"])
def test_refuse_shows_another_apps_item_to_nobody_and_asks_nothing(fresh, pinentry, mode):  # noqa: F811
    d, _, tool_b, python_b, service = two_apps(fresh, pinentry, mode=mode)
    pinentry.answer("yes")
    looked = d.run([tool_b, "lookup", "service", service, "account", "alice"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    found = d.python(python_b, SCRIPT_HEAD + f"""
unlocked, locked = call(ROOT, SERVICE, "SearchItems", "a{{ss}}", ({{"service": {service!r}}},))
print(json.dumps({{"unlocked": unlocked, "locked": locked}}))
""")
    assert found == {"unlocked": [], "locked": []}
    assert pinentry.lines() == []


SCRIPT_HEAD = """
import json, subprocess
from jeepney import DBusAddress, MatchRule, message_bus, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

ROOT = "/org/freedesktop/secrets"
SERVICE = "org.freedesktop.Secret.Service"
ITEM = "org.freedesktop.Secret.Item"
PROPS = "org.freedesktop.DBus.Properties"
conn = open_dbus_connection(bus="SESSION")

def call(path, interface, member, signature=None, body=()):
    msg = new_method_call(DBusAddress(path, bus_name="org.freedesktop.secrets", interface=interface), member, signature, body)
    return unwrap_msg(conn.send_and_get_reply(msg, timeout=120))

def error(path, interface, member, signature=None, body=()):
    try:
        call(path, interface, member, signature, body)
    except DBusErrorResponse as e:
        return e.name
    return None

def prompt(path):
    rule = MatchRule(type="signal", interface="org.freedesktop.Secret.Prompt", member="Completed", path=path)
    conn.send_and_get_reply(new_method_call(message_bus, "AddMatch", "s", (rule.serialise(),)), timeout=120)
    with conn.filter(rule) as queue:
        call(path, "org.freedesktop.Secret.Prompt", "Prompt", "s", ("77",))
        dismissed, (_, objects) = conn.recv_until_filtered(queue, timeout=120).body
    return dismissed, objects
"""


def test_a_yes_lets_that_connection_read_until_the_keychain_locks_and_never_write(fresh, pinentry):  # noqa: F811
    d, tool_a, _, python_b, service = two_apps(fresh, pinentry)
    pinentry.answer("yes")
    pw = d.root / "pw"
    out = d.python(python_b, SCRIPT_HEAD + f"""
out = {{}}
session = call(ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))[1]
query = {{"service": {service!r}}}
unlocked, locked = call(ROOT, SERVICE, "SearchItems", "a{{ss}}", (query,))
out["search"] = [unlocked, len(locked)]
[item] = locked
out["before"] = {{
    "get": error(item, ITEM, "GetSecret", "o", (session,)),
    "secrets": call(ROOT, SERVICE, "GetSecrets", "aoo", ([item], session))[0],
    "props": call(item, PROPS, "GetAll", "s", (ITEM,))[0],
}}
done, prompt_path = call(ROOT, SERVICE, "Unlock", "ao", ([item],))
out["unlock"] = [done, prompt_path.startswith(ROOT + "/prompt/")]
out["completed"] = prompt(prompt_path)
out["after"] = {{
    "secret": bytes(call(item, ITEM, "GetSecret", "o", (session,))[0][2]).decode(),
    "secrets": len(call(ROOT, SERVICE, "GetSecrets", "aoo", ([item], session))[0]),
    "label": call(item, PROPS, "Get", "ss", (ITEM, "Label"))[0][1],
    "search": [len(x) for x in call(ROOT, SERVICE, "SearchItems", "a{{ss}}", (query,))],
    "delete": error(item, ITEM, "Delete"),
    "set": error(item, ITEM, "SetSecret", "(oayays)", ((session, b"", b"changed", "text/plain"),)),
    "label_set": error(item, PROPS, "Set", "ssv", (ITEM, "Label", ("s", "changed"))),
    "attributes_set": error(item, PROPS, "Set", "ssv", (ITEM, "Attributes", ("a{{ss}}", {{"service": "x"}}))),
}}
# Another connection of the same app: the grant is not its own, and the path is not even nameable
# until its own search lists it.
other = open_dbus_connection(bus="SESSION")
def other_call(path, interface, member, signature=None, body=()):
    msg = new_method_call(DBusAddress(path, bus_name="org.freedesktop.secrets", interface=interface), member, signature, body)
    return unwrap_msg(other.send_and_get_reply(msg, timeout=120))
other_session = other_call(ROOT, SERVICE, "OpenSession", "sv", ("plain", ("s", "")))[1]
def other_error(*args):
    try:
        other_call(*args)
    except DBusErrorResponse as e:
        return e.name
out["other"] = {{"unlisted": other_error(item, ITEM, "GetSecret", "o", (other_session,))}}
out["other"]["search"] = [len(x) for x in other_call(ROOT, SERVICE, "SearchItems", "a{{ss}}", (query,))]
out["other"]["listed"] = other_error(item, ITEM, "GetSecret", "o", (other_session,))
kc = {str(d.keychainctl)!r}
subprocess.run([kc, "lock"], check=True)
subprocess.run([kc, "unlock", "--passphrase-file", {str(pw)!r}], check=True)
out["relocked"] = {{
    "get": error(item, ITEM, "GetSecret", "o", (session,)),
    "search": [len(x) for x in call(ROOT, SERVICE, "SearchItems", "a{{ss}}", (query,))],
    "locked": call(item, PROPS, "Get", "ss", (ITEM, "Locked"))[0][1],
}}
out["item"] = item
print(json.dumps(out))
""")
    item = out["item"]
    assert item.startswith("/org/freedesktop/secrets/collection/_foreign/")
    assert out["search"] == [[], 1]
    # Before the person's yes: locked, no secret, and nothing shown but what the search matched.
    before = out["before"]
    assert before["get"] == "org.freedesktop.Secret.Error.IsLocked" and before["secrets"] == {}
    props = {k: v[1] for k, v in before["props"].items()}
    assert props == {"Locked": True, "Attributes": {"service": service}, "Label": "", "Created": 0, "Modified": 0}
    assert out["unlock"] == [[], True]
    assert out["completed"] == [False, [item]]
    after = out["after"]
    assert after["secret"] == "a-secret" and after["secrets"] == 1 and after["label"] == "A's mail password"
    assert after["search"] == [1, 0]
    # Read-only: no write of A's item, even after the yes.
    assert after["delete"] == after["set"] == after["label_set"] == after["attributes_set"] == \
        "org.freedesktop.DBus.Error.AccessDenied"
    assert out["other"] == {"unlisted": "org.freedesktop.DBus.Error.UnknownObject", "search": [0, 1],
                            "listed": "org.freedesktop.Secret.Error.IsLocked"}
    # The keychain locked: the grant is gone, the item is locked again for B.
    assert out["relocked"] == {"get": "org.freedesktop.Secret.Error.IsLocked", "search": [0, 1], "locked": True}
    assert pinentry.count("CONFIRM") == 1
    assert d.run([tool_a, "lookup", "service", service, "account", "alice"]).stdout == b"a-secret"


def test_another_apps_user_presence_item_is_not_offered(fresh, pinentry):  # noqa: F811
    from test_presence import presence_daemon
    d, _, service = presence_daemon(fresh, pinentry, secretServiceForeignItems="confirm")
    tool_b = d._copy(SECRET_TOOL, "tool-b")
    python_b = d._copy(interpreter(), "python-b")
    d._app("b", "T.b", ["T.b"], [tool_b, python_b], system=True, secret_service=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the second reload", lambda: d.log_path.read_text(errors="replace").count("apps reloaded why=SIGHUP") >= 2)
    pinentry.answer("yes")
    looked = d.run([tool_b, "lookup", "service", service, "account", "a"])
    assert looked.returncode != 0 and looked.stdout == b"", looked
    # Not even listed: such an item is never served on the bus, so nobody is asked about it.
    found = d.python(python_b, SCRIPT_HEAD + f"""
print(json.dumps(call(ROOT, SERVICE, "SearchItems", "a{{ss}}", ({{"service": {service!r}}},))))
""")
    assert found == [[], []]
    assert pinentry.lines() == []
