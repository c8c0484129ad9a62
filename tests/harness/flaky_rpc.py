"""A loopback HTTP proxy in front of an RPC that drops every n-th request: it reads the request
and closes the connection without an answer (what a node behind a flaky load balancer sees)."""

from __future__ import annotations

import http.server
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def flaky_rpc(upstream: str, drop_every: int = 5) -> Iterator[tuple[str, dict[str, int]]]:
    """Yields (proxy url, counts {"forwarded", "dropped"})."""
    counts = {"forwarded": 0, "dropped": 0, "seen": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                counts["seen"] += 1
                drop = counts["seen"] % drop_every == 0
                counts["dropped" if drop else "forwarded"] += 1
            if drop:
                self.close_connection = True
                return  # no status line: the client sees the connection close
            req = urllib.request.Request(
                upstream, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                data = r.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", counts
    finally:
        server.shutdown()
        server.server_close()
