"""Load: 1000 hostile or useless connections while well-behaved clients measure copy latency
(run through scripts/load-test).

Phase 1 (idle daemon): well-behaved clients do `copy` round trips for `--seconds`; p50/p99.
Phase 2: a separate process (so the measuring process's GIL is not shared) opens the crowd and keeps it
busy — idle connections, half frames then silence, slowloris clients trickling one byte at a time,
clients that pipeline requests and never read the answers, clients whose wrong request is answered
and then idle — all held open — plus a churn of misbehaving connects
(garbage, oversize headers, invalid CBOR, truncated frames, disconnect mid-request) — while the same
well-behaved clients measure again. Reports both, the ratio (goal ≤ 2×), the daemon's RSS and
threads with and without the crowd, and RSS per connection.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kcwire as kw  # noqa: E402

SERVICE = "com.example.load"


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


def measure(socket_path: str, clients: int, seconds: float) -> dict:
    """`clients` threads, each on its own connection, doing copy (r_Data) round trips."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def run(i: int):
        c = kw.Conn(socket_path)
        q = kw.item(SERVICE, f"good-{i % 4}", r_Data=True)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            r = c.call("copy", query=q)
            lat[i].append((time.perf_counter() - t0) * 1e6)
            if r["status"] != 0:
                errors[i] += 1
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    allv = [x for l in lat for x in l]
    return {"requests": len(allv), "errors": sum(errors), "p50_us": round(percentile(allv, 0.50), 1),
            "p99_us": round(percentile(allv, 0.99), 1), "max_us": round(max(allv), 1) if allv else None}


# ---------------------------------------------------------------------------------------------------
# The crowd (runs in its own process: `load_test.py --crowd SOCKET N SECONDS`)

def crowd(socket_path: str, total: int, seconds: float):
    raise_nofile()
    rng = random.Random(1)
    sel = selectors.DefaultSelector()
    kinds = {"idle": int(total * 0.4), "half_frame": int(total * 0.2), "slowloris": int(total * 0.2),
             "no_reader": int(total * 0.1)}
    kinds["bad_request_then_idle"] = total - sum(kinds.values())
    churn_rate = 5           # misbehaving connects per 20 ms tick, on top of the `total` held ones
    socks: list[tuple[str, socket.socket]] = []
    request = kw.frame({"v": 1, "id": 7, "op": "copy", "query": kw.item(SERVICE, "good-0", r_Data=True)})

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(socket_path)
        return s

    for kind in ("idle", "half_frame", "slowloris", "no_reader", "bad_request_then_idle"):
        for _ in range(kinds[kind]):
            s = connect()
            if kind == "half_frame":
                s.sendall(struct.pack(">I", 200) + b"\xa3\x61v\x01")      # 4 of 200 announced bytes
            if kind == "no_reader":
                s.setblocking(False)
                try:
                    for _ in range(2000):                                  # fill both socket buffers
                        s.send(request)
                except BlockingIOError:
                    pass
            if kind == "bad_request_then_idle":
                # Well-framed but wrong (errSecParam keeps the connection); the answer is never read.
                s.sendall(kw.frame({"v": 1, "id": 3, "op": "copy", "query": {"class": "genp", "zzzz": 1}}))
            socks.append((kind, s))
    slow = [s for k, s in socks if k == "slowloris"]
    positions = {s: 0 for s in slow}
    print(json.dumps({"opened": len(socks), "kinds": kinds}), flush=True)

    # Churn: misbehaving connections opened and dropped continuously in the remaining slots.
    bad_inputs = [
        b"\xff\xff\xff\xff",                                   # announces 4 GiB
        struct.pack(">I", 3) + b"\xff\xff\xff",                # not CBOR
        struct.pack(">I", 1) + b"\x01",                        # CBOR, not a map
        struct.pack(">I", 5) + b"\x9f\x9f\x9f\x9f\x9f",        # indefinite lengths
        struct.pack(">I", 100) + b"\xa1",                      # truncated, then close
        kw.frame({"v": 1, "id": 1, "op": "frobnicate"}),       # well-framed, wrong
        request[: len(request) // 2],                          # half a request, then close
        struct.pack(">I", 20001) + b"\xa1\x61v" + b"\xc1" * 19997 + b"\x01",   # a long tag chain
    ]
    churned = 0
    deadline = time.monotonic() + seconds
    next_trickle = time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_trickle:
            # Slowloris: one byte per connection every 200 ms; a complete request every len(request) steps.
            for s in slow:
                i = positions[s]
                try:
                    s.send(request[i:i + 1])
                except OSError:
                    pass
                positions[s] = (i + 1) % len(request)
            next_trickle = now + 0.2
        for _ in range(churn_rate):
            try:
                s = connect()
                s.settimeout(0.5)
                try:
                    s.sendall(rng.choice(bad_inputs))
                except OSError:
                    pass
                if rng.random() < 0.5:
                    try:
                        s.recv(4096)
                    except OSError:
                        pass
                s.close()
                churned += 1
            except OSError:
                pass
        time.sleep(0.02)
    print(json.dumps({"churned": churned}), flush=True)
    # Hold the crowd until told to go (stdin closes).
    sys.stdin.read()
    for _, s in socks:
        s.close()


def wait_for_connections(socket_path: str, done, timeout: float = 120.0) -> int:
    """Polls the daemon's connection count (this poll's own connection included) until `done(n)`."""
    deadline = time.monotonic() + timeout
    while True:
        n = status(socket_path).get("connections") or 0
        if done(n) or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def status(socket_path: str) -> dict:
    c = kw.Conn(socket_path)
    r = c.call("status")
    c.close()
    return r.get("result", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--good-clients", type=int, default=2)
    ap.add_argument("--crowd", nargs=3, metavar=("SOCKET", "N", "SECONDS"))
    ap.add_argument("--registered-crowd", action="store_true",
                    help="run the crowd as the registered app instead of an unregistered executable")
    args = ap.parse_args()
    if args.crowd:
        crowd(args.crowd[0], int(args.crowd[1]), float(args.crowd[2]))
        return
    raise_nofile()
    root = tempfile.mkdtemp(prefix="keychaind-load-")
    d = kw.Daemon(args.daemon, root, log_level="warning")
    out: dict = {"connections": args.connections, "seconds_per_phase": args.seconds, "good_clients": args.good_clients}
    crowd_proc = None
    try:
        d.start()
        c = kw.Conn(d.socket)
        for i in range(4):
            c.call("add", query=kw.item(SERVICE, f"good-{i}", v_Data=os.urandom(32)))
        c.close()
        measure(d.socket, args.good_clients, 1.0)                  # warm-up
        out["rss_kib_idle"] = d.rss_kib()
        out["threads_idle"] = d.threads()
        out["idle"] = measure(d.socket, args.good_clients, args.seconds)

        # The crowd runs from a copy of the interpreter that no registration names: hostile peers are
        # not identified apps, so they get the daemon's small frames and buffers (docs/security.md §2).
        interpreter = sys.executable
        if not args.registered_crowd:
            interpreter = os.path.join(root, "unregistered-python")
            shutil.copy(os.path.realpath(sys.executable), interpreter)
            os.chmod(interpreter, 0o755)
        out["crowd_registered"] = args.registered_crowd
        crowd_proc = subprocess.Popen([interpreter, os.path.abspath(__file__), "--crowd", d.socket,
                                       str(args.connections), str(args.seconds + 5)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))})
        opened = json.loads(crowd_proc.stdout.readline())
        out["crowd"] = opened
        # The crowd has connected; wait (generously) until the daemon has accepted them all.
        out["daemon_connections_with_crowd"] = wait_for_connections(d.socket, lambda n: n > args.connections)
        out["loaded"] = measure(d.socket, args.good_clients, args.seconds)
        out["rss_kib_crowd"] = d.rss_kib()
        out["threads_crowd"] = d.threads()
        out["daemon_connections_after"] = status(d.socket).get("connections")
        out["crowd"].update(json.loads(crowd_proc.stdout.readline()))
        crowd_proc.stdin.close()
        crowd_proc.wait(120)
        out["connections_after_crowd_left"] = wait_for_connections(d.socket, lambda n: n <= 1)
        out["rss_kib_after_crowd_left"] = d.rss_kib()
        out["daemon_alive"] = d.alive()
        held = max(1, (out["daemon_connections_with_crowd"] or 1) - 1)
        out["rss_kib_per_connection"] = round((out["rss_kib_crowd"] - out["rss_kib_idle"]) / held, 1)
        out["p50_ratio"] = round(out["loaded"]["p50_us"] / out["idle"]["p50_us"], 2)
        out["p99_ratio"] = round(out["loaded"]["p99_us"] / out["idle"]["p99_us"], 2)
        # Pass or fail on behaviour only: the daemon survives, every well-behaved request is
        # answered correctly, the crowd is held and let go. Latency ratios are reported against
        # their goals (docs/reliability.md) but a busy machine may miss them without failing.
        out["ok"] = (out["daemon_alive"] and out["idle"]["errors"] == 0 and out["loaded"]["errors"] == 0
                     and (out["daemon_connections_with_crowd"] or 0) >= args.connections
                     and out["connections_after_crowd_left"] <= 1)
        out["goal_p50_within_2x"] = out["p50_ratio"] <= 2.0
        out["goal_p99_within_2x"] = out["p99_ratio"] <= 2.0
        d.stop()
    finally:
        if crowd_proc and crowd_proc.poll() is None:
            crowd_proc.kill()
        d.kill9()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))
    sys.exit(0 if out.get("ok") else 1)


if __name__ == "__main__":
    main()
