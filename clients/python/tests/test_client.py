"""Unit tests of the Client against a fake daemon on a temporary socket: no keychaind needed."""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest

from keychaind import (Client, KeychainError, errSecDuplicateItem, errSecItemNotFound, errSecMissingEntitlement,
                       errSecNotAvailable, errSecParam, kSecAttrAccessible, kSecAttrAccount, kSecAttrService,
                       kSecClass, kSecClassGenericPassword, kSecReturnData, kSecValueData, wire)
from keychaind.client import DEVICE_ID_ACCOUNT, DEVICE_ID_SERVICE

from fakes import FakeDaemon, ok  # noqa: F401 — FakeDaemon.Close is used by handlers


def test_requests_have_the_envelope_and_results_come_back(fake):
    server = fake(lambda req, conn: ok(req, b"s3cret") if req["op"] == "copy" else ok(req))
    with Client(server.path) as c:
        q = {kSecClass: kSecClassGenericPassword, kSecAttrService: "svc", kSecAttrAccount: "alice"}
        assert c.add(dict(q, **{kSecValueData: b"s3cret"})) is None
        assert c.copy(dict(q, **{kSecReturnData: True})) == b"s3cret"
        c.update(q, {kSecValueData: b"new"})
        c.delete(q)
    ops = [(r["v"], r["op"]) for r in server.requests]
    assert ops == [(1, "add"), (1, "copy"), (1, "update"), (1, "delete")]
    assert server.requests[2]["attributes"] == {kSecValueData: b"new"}
    assert "attributes" not in server.requests[0]
    ids = [r["id"] for r in server.requests]
    assert 0 not in ids and len(set(ids)) == 4 and ids == sorted(ids)
    assert server.connections == 1  # one connection, reused


def test_errors_raise_keychain_error_with_status_and_message(fake):
    server = fake(lambda req, conn: {"id": req["id"], "status": -25300, "message": "nothing matched"})
    with Client(server.path) as c, pytest.raises(KeychainError) as e:
        c.copy({kSecClass: kSecClassGenericPassword})
    assert e.value.status == errSecItemNotFound and e.value.message == "nothing matched"


def test_responses_are_matched_by_id_even_out_of_order(fake):
    held = []
    lock = threading.Lock()

    def handler(req, conn):
        with lock:
            held.append(req)
            if len(held) < 2:
                return None
            for r in reversed(held):  # answer the second request first
                conn.sendall(wire.frame(wire.encode(ok(r, r["query"]["svce"].encode()))))
            held.clear()
        return None

    server = fake(handler)
    results = {}
    with Client(server.path, timeout=10) as c:
        def call(name):
            results[name] = c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: name, kSecReturnData: True})
        threads = [threading.Thread(target=call, args=(n,)) for n in ("first", "second")]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(120)
    assert results == {"first": b"first", "second": b"second"}


def test_many_threads_share_one_connection(fake):
    server = fake(lambda req, conn: ok(req, req["query"]["svce"].encode()))
    errors = []
    with Client(server.path, timeout=20) as c:
        def worker(n):
            try:
                for i in range(50):
                    name = f"t{n}-{i}"
                    assert c.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: name, kSecReturnData: True}) == name.encode()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors
    assert server.connections == 1 and len(server.requests) == 400
    assert len({r["id"] for r in server.requests}) == 400


def test_an_unattributed_error_finishes_the_connection_and_the_next_call_reconnects(fake):
    calls = []

    def handler(req, conn):
        calls.append(req["op"])
        if len(calls) == 1:
            conn.sendall(wire.frame(wire.encode({"id": 0, "status": -34018, "message": "other uid"})))
            raise FakeDaemon.Close
        return ok(req, {"version": "x"})

    server = fake(handler)
    with Client(server.path, timeout=10) as c:
        with pytest.raises(KeychainError) as e:
            c.add({kSecClass: kSecClassGenericPassword})
        assert e.value.status == errSecMissingEntitlement and e.value.message == "other uid"
        assert c.status() == {"version": "x"}
    assert server.connections == 2


def test_idle_close_by_the_daemon_is_survived(fake):
    server = fake(lambda req, conn: ok(req, {"n": 1}))
    with Client(server.path, timeout=10) as c:
        assert c.status() == {"n": 1}
        # the daemon ends the connection (idle timeout): simulate by closing our side's peer
        c._conn.sock.shutdown(socket.SHUT_RDWR)
        time.sleep(0.1)
        assert c.status() == {"n": 1}
    assert server.connections == 2


def test_a_dropped_add_is_not_resent_but_a_dropped_copy_is(fake):
    seen = []

    def handler(req, conn):
        seen.append(req["op"])
        if seen.count(req["op"]) == 1:
            raise FakeDaemon.Close  # drop the connection without answering
        return ok(req, b"x")

    server = fake(handler)
    with Client(server.path, timeout=10) as c:
        with pytest.raises(KeychainError) as e:
            c.add({kSecClass: kSecClassGenericPassword})
        assert e.value.status == errSecNotAvailable
        assert c.copy({kSecClass: kSecClassGenericPassword, kSecReturnData: True}) == b"x"
    assert seen == ["add", "copy", "copy"]


def test_no_daemon_is_errSecNotAvailable_naming_the_path(tmp_path):
    path = str(tmp_path / "missing.sock")
    with pytest.raises(KeychainError) as e:
        Client(path).status()
    assert e.value.status == errSecNotAvailable and path in e.value.message


def test_oversize_requests_are_refused_locally(fake):
    server = fake(lambda req, conn: ok(req))
    with Client(server.path, max_frame_bytes=1024) as c:
        with pytest.raises(KeychainError) as e:
            c.add({kSecClass: kSecClassGenericPassword, kSecValueData: b"x" * 2000})
        assert e.value.status == errSecParam
        c.add({kSecClass: kSecClassGenericPassword, kSecValueData: b"x" * 100})
    assert len(server.requests) == 1


def test_timeout(fake):
    server = fake(lambda req, conn: None)  # never answers
    with Client(server.path, timeout=0.3) as c, pytest.raises(KeychainError) as e:
        c.status()
    assert e.value.status == errSecNotAvailable


def _device_store(race: bool):
    """A fake keychain of one device-id item; with `race`, another process adds it between our copy
    and our add."""
    state = {"value": None, "copies": 0}

    def handler(req, conn):
        q = req.get("query") or {}
        if req["op"] == "status":
            return ok(req, {"groups": ["G1", "G2"]})
        assert q[kSecAttrService] == DEVICE_ID_SERVICE and q[kSecAttrAccount] == DEVICE_ID_ACCOUNT
        assert q["agrp"] == "G1"
        if req["op"] == "copy":
            state["copies"] += 1
            if race and state["copies"] == 1:
                state["value"] = b"AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE"
                return {"id": req["id"], "status": errSecItemNotFound}
            if state["value"] is None:
                return {"id": req["id"], "status": errSecItemNotFound}
            return ok(req, state["value"])
        if req["op"] == "add":
            assert q[kSecAttrAccessible] == "cku"
            if state["value"] is not None:
                return {"id": req["id"], "status": errSecDuplicateItem}
            state["value"] = q[kSecValueData]
            return ok(req)
        raise AssertionError(req)

    return handler, state


def test_device_id_creates_once_then_reads(fake):
    handler, state = _device_store(race=False)
    server = fake(handler)
    with Client(server.path) as c:
        first = c.device_id()
        assert re.fullmatch(r"[0-9A-F]{8}-[0-9A-F]{4}-4[0-9A-F]{3}-[89AB][0-9A-F]{3}-[0-9A-F]{12}", first)
        assert c.device_id() == first
        assert c.device_id("G1") == first
    assert state["value"] == first.encode()


def test_device_id_takes_the_winners_value_after_a_duplicate(fake):
    handler, state = _device_store(race=True)
    server = fake(handler)
    with Client(server.path) as c:
        assert c.device_id("G1") == "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE"
    assert [r["op"] for r in server.requests] == ["copy", "add", "copy"]


def test_default_group_without_status_groups_uses_a_probe_item(fake):
    def handler(req, conn):
        if req["op"] == "status":
            return ok(req, {"caller": "x"})  # an older daemon: no "groups"
        if req["op"] == "add":
            assert req["query"]["r_Attributes"] is True and "agrp" not in req["query"]
            return ok(req, {"agrp": "FIRST", "acct": req["query"]["acct"]})
        if req["op"] == "delete":
            assert req["query"]["agrp"] == "FIRST" and req["query"]["acct"].startswith("probe-")
            return ok(req)
        raise AssertionError(req)

    server = fake(handler)
    with Client(server.path) as c:
        assert c.default_group() == "FIRST"
    assert [r["op"] for r in server.requests] == ["status", "add", "delete"]


def test_the_request_frame_is_zeroed_once_sent(fake, monkeypatch):
    """The frame the client builds (a bytearray) holds the secret until it is sent, then zeros."""
    sent = []
    real = wire.encode_request

    def keep(*args, **kwargs):
        frame = real(*args, **kwargs)
        sent.append(frame)
        return frame

    monkeypatch.setattr(wire, "encode_request", keep)
    server = fake(lambda req, conn: ok(req))
    with Client(server.path) as c:
        c.add({kSecClass: kSecClassGenericPassword, kSecAttrService: "svc", kSecAttrAccount: "a",
               kSecValueData: b"wipe-me-secret"})
    assert server.requests[0]["query"][kSecValueData] == b"wipe-me-secret"
    assert len(sent) == 1 and isinstance(sent[0], bytearray) and len(sent[0]) > 20
    assert sent[0] == bytearray(len(sent[0]))
