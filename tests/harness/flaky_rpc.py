"""A loopback HTTP proxy in front of an RPC that spoils every n-th request, each in the next of
`faults` in turn (what a node behind a flaky load balancer sees):
- "drop": it reads the request and closes the connection without forwarding or answering;
- "lost": it forwards the request and closes the connection without the answer (a sent
  transaction is in, its sender never hears so);
- "delay": it answers `delay_s` late.
For `lossy_s` seconds after it starts (None: as long as it runs), then it forwards everything.
With `batches=False` it answers every JSON-RPC batch with one error object, as RPCs that serve
no batches do (counted as "refused_batches", never forwarded)."""

from __future__ import annotations

import http.server
import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

FAULTS = ("drop", "lost", "delay")


@contextmanager
def flaky_rpc(
    upstream: str,
    drop_every: int = 5,
    faults: Sequence[str] = ("drop",),
    delay_s: float = 2.0,
    lossy_s: float | None = None,
    batches: bool = True,
) -> Iterator[tuple[str, dict[str, int]]]:
    """Yields (proxy url, counts {"seen", "forwarded", "refused_batches", and one per fault
    kind})."""
    if not faults or set(faults) - set(FAULTS):
        raise ValueError(f"faults must be some of {FAULTS}, got {faults!r}")
    counts = {"seen": 0, "forwarded": 0, "refused_batches": 0, **dict.fromkeys(FAULTS, 0)}
    lock = threading.Lock()
    kinds = itertools.cycle(faults)
    until = None if lossy_s is None else time.monotonic() + lossy_s

    def pick() -> str:
        with lock:
            counts["seen"] += 1
            lossy = until is None or time.monotonic() < until
            kind = next(kinds) if lossy and counts["seen"] % drop_every == 0 else "forward"
            counts["forwarded" if kind == "forward" else kind] += 1
            return kind

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if not batches and body.lstrip().startswith(b"["):
                with lock:
                    counts["refused_batches"] += 1
                refused = {"code": -32600, "message": "batch requests are not served"}
                self._answer(json.dumps({"jsonrpc": "2.0", "id": None, "error": refused}).encode())
                return
            kind = pick()
            if kind == "drop":
                self.close_connection = True
                return  # no status line: the client sees the connection close
            if kind == "delay":
                time.sleep(delay_s)
            req = urllib.request.Request(
                upstream, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                data = r.read()
            if kind == "lost":
                self.close_connection = True
                return
            self._answer(data)

        def _answer(self, data: bytes) -> None:
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
