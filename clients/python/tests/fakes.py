"""A fake keychaind for unit tests: answers each request with a handler, on a temporary socket."""

from __future__ import annotations

import os
import socket
import tempfile
import threading

from keychaind import wire


class FakeDaemon:
    """Accepts connections and answers each request with `handler(request, conn) -> response | None`.
    A handler may return None to answer later (see `deferred`) or raise _Close to drop the connection."""

    class Close(Exception):
        pass

    def __init__(self, handler):
        self.dir = tempfile.mkdtemp(prefix="kcd-fake-")
        self.path = os.path.join(self.dir, "s")
        self.handler = handler
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(16)
        self.requests = []
        self.connections = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        reader = wire.FrameReader()
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                reader.feed(data)
                for body in reader.frames():
                    request = wire.decode(body)
                    with self.lock:
                        self.requests.append(request)
                    response = self.handler(request, conn)
                    if response is not None:
                        conn.sendall(wire.frame(wire.encode(response)))
        except FakeDaemon.Close:
            pass
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.rmdir(self.dir)


def ok(request, result=None, **extra):
    r = {"id": request["id"], "status": 0}
    if result is not None:
        r["result"] = result
    r.update(extra)
    return r
