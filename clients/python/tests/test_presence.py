"""Items whose access control needs the person (kSecAttrAccessControl with .userPresence or
.devicePasscode): reading their data asks through pinentry — here fake_pinentry.py, which answers as
the test says and writes down what the person would have seen.

Nothing waits for a fixed time: every wait is for an event, with a generous deadline.
"""

from __future__ import annotations

import os
import signal

import pytest

from test_prompts import PASSPHRASE, pinentry, python_app  # noqa: F401
from test_secret_service import fresh, set_passphrase, unique, wait_for  # noqa: F401

USER_PRESENCE = 1
DEVICE_PASSCODE = 1 << 4
OR = 1 << 14
BIOMETRY_ANY = 1 << 1


def presence_daemon(fresh, pinentry, flags=USER_PRESENCE, **config):  # noqa: F811
    """A daemon with the fake pinentry and a passphrase set (unlocked), T.syspy's item whose access
    control has `flags`; (daemon, the app's executable, the item's service)."""
    d = fresh({"pinentryProgram": str(pinentry.program), **config}, env={"DISPLAY": ":99"})
    exe = python_app(d)
    set_passphrase(d, PASSPHRASE)
    service = unique("presence")
    from keychaind import SecAccessControlCreateWithFlags, kSecAttrAccessibleWhenUnlockedThisDeviceOnly
    control = SecAccessControlCreateWithFlags(kSecAttrAccessibleWhenUnlockedThisDeviceOnly, flags)
    added = calls(d, exe, [("add", {"class": "genp", "svce": service, "acct": "a", "v_Data": b"guarded",
                                    "accc": control})])
    assert added == [{"ok": None}], added
    assert pinentry.lines() == [], "an add does not ask"
    return d, exe, service


def calls(d, exe, ops):
    """Runs SecItem calls in order on one connection of the app `exe`: a list of {"ok": result} or
    {"status": ..., "message": ...}, one per call."""
    return d.python(exe, f"""
import json
from keychaind import Client, KeychainError
ops = {ops!r}
out = []

def plain(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {{k: plain(x) for k, x in v.items() if not hasattr(x, "timestamp")}}
    return v

with Client(timeout=300) as c:
    for op, *args in ops:
        try:
            out.append({{"ok": plain(getattr(c, op)(*args))}})
        except KeychainError as e:
            out.append({{"status": e.status, "message": str(e)}})
print(json.dumps(out))
""")


def read(service, **extra):
    return ("copy", {"class": "genp", "svce": service, "acct": "a", "r_Data": True, **extra})


def test_reading_a_user_presence_item_asks_for_the_passphrase_and_answers(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE})
    assert calls(d, exe, [read(service)]) == [{"ok": "guarded"}]
    # What the person saw: who asks (the app's registration) and for which item.
    [description] = pinentry.argument("SETDESC")
    assert "T.syspy" in description and f"service={service}" in description and "account=a" in description
    assert pinentry.argument("SETTITLE") == ["Allow access to a keychain item"]
    assert pinentry.count("GETPIN") == 1 and pinentry.count("CONFIRM") == 0
    assert PASSPHRASE not in d.log_text()


def test_every_read_asks_again_without_a_reuse_window_on_one_connection_too(fresh, pinentry):  # noqa: F811
    # The second read of the same query is served from the connection's memo of compiled queries:
    # it must ask as well.
    d, exe, service = presence_daemon(fresh, pinentry)
    pinentry.answer({"pin": PASSPHRASE}, {"pin": PASSPHRASE})
    assert calls(d, exe, [read(service), read(service)]) == [{"ok": "guarded"}, {"ok": "guarded"}]
    assert pinentry.count("GETPIN") == 2


def test_a_cancelled_confirmation_is_user_canceled(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    pinentry.answer("cancel")
    [seen] = calls(d, exe, [read(service)])
    assert seen["status"] == -128, seen


def test_three_wrong_passphrases_are_auth_failed(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    pinentry.answer({"pin": "wrong"}, {"pin": "wrong"}, {"pin": "wrong"})
    [seen] = calls(d, exe, [read(service)])
    assert seen["status"] == -25293, seen
    assert pinentry.count("GETPIN") == 3


@pytest.mark.parametrize("extra", [{"u_AuthUI": "u_AuthUIF"}, {"u_NoAuthUI": True}])
def test_refusing_ui_is_interaction_not_allowed_without_a_prompt(fresh, pinentry, extra):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    [seen] = calls(d, exe, [read(service, **extra)])
    assert seen["status"] == -25308 and "authentication UI" in seen["message"], seen
    assert pinentry.lines() == []


def test_skipping_ui_leaves_the_item_out(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    plain = unique("plain")
    seen = calls(d, exe, [
        ("add", {"class": "genp", "svce": plain, "acct": "a", "v_Data": b"open"}),
        read(service, u_AuthUI="u_AuthUIS"),
        ("copy", {"class": "genp", "acct": "a", "r_Data": True, "m_Limit": "m_LimitAll", "u_AuthUI": "u_AuthUIS"}),
    ])
    assert seen[1]["status"] == -25300, seen
    assert seen[2] == {"ok": ["open"]}, seen
    assert pinentry.lines() == []


def test_attributes_only_and_deletes_do_not_ask_but_updates_do(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry)
    [attributes] = calls(d, exe, [("copy", {"class": "genp", "svce": service, "acct": "a", "r_Attributes": True})])
    assert attributes["ok"]["accc"] == {"flags": USER_PRESENCE} and attributes["ok"]["pdmn"] == "aku", attributes
    # A persistent reference comes without asking; the data it names does not.
    ref = d.python(exe, f"""
import json
from keychaind import Client, KeychainError
with Client() as c:
    ref = c.copy({{"class": "genp", "svce": "{service}", "acct": "a", "r_PersistentRef": True}})
    try:
        c.copy({{"v_PersistentRef": ref, "r_Data": True, "u_AuthUI": "u_AuthUIF"}})
        print(json.dumps({{"status": 0}}))
    except KeychainError as e:
        print(json.dumps({{"status": e.status}}))
""")
    assert ref == {"status": -25308}, ref
    shown = d.run([d.keychainctl, "find", "-s", service])
    assert shown.returncode == 0 and b"access control" in shown.stdout and b"userPresence" in shown.stdout, shown
    assert pinentry.lines() == []
    # An update of the item needs the person (Apple's rule); refused UI, it is refused.
    query = {"class": "genp", "svce": service, "acct": "a"}
    pinentry.answer("cancel", {"pin": PASSPHRASE}, {"pin": PASSPHRASE})
    seen = calls(d, exe, [
        ("update", query, {"v_Data": b"changed"}),
        ("update", query, {"v_Data": b"changed"}),
        read(service),
    ])
    assert seen[0]["status"] == -128 and seen[1] == {"ok": None} and seen[2] == {"ok": "changed"}, seen
    [delete] = calls(d, exe, [("delete", query)])
    assert delete == {"ok": None} and pinentry.count("GETPIN") == 3


def test_confirm_mode_asks_yes_or_no_and_the_reuse_window_is_per_app(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry, presenceConfirmation="confirm", presenceReuseSeconds=3600)
    # A second app of the same access group.
    from conftest import interpreter
    other = d._copy(interpreter(), "sys-python-other")
    d._app("sysother", "T.sysother", ["T.syspy"], [other], system=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the reload", lambda: d.log_text().count("apps reloaded why=SIGHUP") >= 2)
    # Consumed in order: three dialogs now, then the unlock's passphrase and one more after the lock.
    pinentry.answer("no", "yes", "yes", {"pin": PASSPHRASE}, "yes")
    [refused] = calls(d, exe, [read(service)])
    assert refused["status"] == -128, refused
    # Allowed once: the same app reads again within the window without a dialog.
    assert calls(d, exe, [read(service), read(service)]) == [{"ok": "guarded"}, {"ok": "guarded"}]
    assert pinentry.count("CONFIRM") == 2 and pinentry.count("GETPIN") == 0
    assert any("T.syspy" in desc for desc in pinentry.argument("SETDESC"))
    # Another app is asked for itself.
    assert calls(d, other, [read(service)]) == [{"ok": "guarded"}]
    assert pinentry.count("CONFIRM") == 3 and "T.sysother" in pinentry.argument("SETDESC")[-1]
    # A lock ends the window: after the unlock the app is asked again.
    assert d.run([d.keychainctl, "lock"]).returncode == 0
    assert calls(d, exe, [read(service)]) == [{"ok": "guarded"}]
    assert pinentry.count("GETPIN") == 1 and pinentry.count("CONFIRM") == 4


def test_device_passcode_takes_the_passphrase_even_in_confirm_mode(fresh, pinentry):  # noqa: F811
    d, exe, service = presence_daemon(fresh, pinentry, flags=DEVICE_PASSCODE, presenceConfirmation="confirm")
    pinentry.answer({"pin": PASSPHRASE})
    assert calls(d, exe, [read(service)]) == [{"ok": "guarded"}]
    assert pinentry.count("GETPIN") == 1 and pinentry.count("CONFIRM") == 0


def test_unsupported_constraints_are_unimplemented_and_need_a_passphrase(fresh, pinentry):  # noqa: F811
    d = fresh({"pinentryProgram": str(pinentry.program)}, env={"DISPLAY": ":99"})
    exe = python_app(d)
    service = unique("presence")
    item = {"class": "genp", "svce": service, "acct": "a", "v_Data": b"x"}
    seen = calls(d, exe, [
        ("add", {**item, "accc": {"flags": BIOMETRY_ANY | OR | USER_PRESENCE}}),
        ("add", {**item, "accc": {"flags": USER_PRESENCE}}),
    ])
    assert seen[0]["status"] == -4 and "biometryAny" in seen[0]["message"], seen
    assert seen[1]["status"] == -25293 and "passphrase" in seen[1]["message"], seen


def test_the_secret_service_does_not_serve_such_items(fresh, pinentry):  # noqa: F811
    # The bus has no way to ask for the person: secret-tool of the same group finds the plain item's
    # secret, and not the guarded one's.
    from test_secret_service import SECRET_TOOL
    d, exe, service = presence_daemon(fresh, pinentry)
    tool = d._copy(SECRET_TOOL, "sys-tool")
    d._app("systool", "T.systool", ["T.syspy"], [tool], system=True, secret_service=True)
    os.kill(d.process.pid, signal.SIGHUP)
    wait_for("the reload", lambda: d.log_text().count("apps reloaded why=SIGHUP") >= 2)
    plain = unique("plain")
    assert calls(d, exe, [("add", {"class": "genp", "svce": plain, "acct": "a", "v_Data": b"open"})]) == [{"ok": None}]
    found = d.run([tool, "lookup", "service", plain, "account", "a"])
    assert found.returncode == 0 and found.stdout == b"open", found
    guarded = d.run([tool, "lookup", "service", service, "account", "a"])
    assert guarded.stdout == b"", guarded
    assert pinentry.lines() == []
