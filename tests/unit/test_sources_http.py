"""https/http job files: fetched by sha256 into the cache, resumed with a Range request, refused
when the bytes are wrong or too many (a local HTTP server stands in for the web)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtrain_node.errors import DatasetError, ModelUnavailable
from dtrain_node.operator.sources import Cache, Fetcher
from dtrain_node.p2p import files
from dtrain_node.p2p.packs import pack_folder


class RangeHandler(http.server.BaseHTTPRequestHandler):
    root: Path
    sent: list[int]

    def do_GET(self) -> None:
        if self.path.startswith("/drip/"):  # a byte every half second, under any read timeout
            data = (self.root / self.path.removeprefix("/drip/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client hangs up
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.5)
            return
        data = (self.root / self.path.lstrip("/")).read_bytes()
        start = 0
        if rng := self.headers.get("Range"):
            start = int(rng.removeprefix("bytes=").split("-")[0])
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # counted before the write: the client may have read every byte and moved on to its
        # assertions before this thread returns from the write
        self.sent.append(len(body))
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, list[int]]]:
    sent: list[int] = []
    handler = type("H", (RangeHandler,), {"root": tmp_path, "sent": sent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", sent
    server.shutdown()
    t.join(5)


def test_http_dataset_resumes_caches_and_refuses(
    web: tuple[str, list[int]], tmp_path: Path
) -> None:
    base, sent = web
    (tmp_path / "d.jsonl").write_bytes(data := os.urandom(300_000))
    sha = hashlib.sha256(data).digest()
    cache = Cache(tmp_path / "cache", timeout_s=5, progress="log")
    part = files.part_path(cache.file(sha.hex()))
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:100_000])

    got = Fetcher(cache).file(f"{base}/d.jsonl", sha, "dataset")  # no fragment: the pin
    assert got.read_bytes() == data and sent == [200_000] and not part.exists()
    assert Fetcher(cache).file(f"{base}/d.jsonl#sha256={sha.hex()}", sha, "dataset") == got
    assert sent == [200_000]  # cached

    other = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(DatasetError, match=f"sha256 {sha.hex()} != expected {other}"):
        Fetcher(cache).file(f"{base}/d.jsonl#sha256={other}", None, "dataset")
    assert not cache.file(other).exists() and not files.part_path(cache.file(other)).exists()

    small = Cache(tmp_path / "small", max_bytes=1000, timeout_s=5, progress="log")
    with pytest.raises(DatasetError, match="300000 bytes > limit 1000"):
        Fetcher(small).file(f"{base}/d.jsonl", sha, "dataset")
    with pytest.raises(DatasetError, match="needs #sha256"):
        Fetcher(cache).file(f"{base}/d.jsonl", None, "dataset")


def test_http_model_pack_unpacks_into_the_cache(web: tuple[str, list[int]], tmp_path: Path) -> None:
    base, _ = web
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    sha = pack_folder(folder, tmp_path / "model.tar")
    cache = Cache(tmp_path / "cache", timeout_s=5, progress="log")
    with Fetcher(cache) as f:
        out = Path(f.model(f"{base}/model.tar#sha256={sha}"))
        assert out == cache.model_dir(sha) and (out / "config.json").is_file()
        assert f.model("builtin:tiny?seed=3") == "builtin:tiny?seed=3"
        assert f.model("hf://openai-community/gpt2@main") == "hf://openai-community/gpt2@main"
        assert f.model(str(folder)) == str(folder)
        with pytest.raises(ModelUnavailable, match="needs #sha256"):
            f.model(f"{base}/model.tar")


def test_a_server_that_drips_a_file_is_given_up_at_the_least_rate(
    web: tuple[str, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a server sends a job's file a byte at a time, each well within the read
    timeout, so that no single read ever times out: the download is given up once it runs
    slower than `files.LEAST_RATE` on average past its grace (shortened here)."""
    base, _ = web
    (tmp_path / "d.jsonl").write_bytes(data := os.urandom(10_000))
    monkeypatch.setattr(files, "RATE_GRACE_S", 1.0)
    cache = Cache(tmp_path / "cache", timeout_s=5, progress="log")
    t0 = time.monotonic()
    with pytest.raises(DatasetError, match="slower than 64 KiB/s"):
        Fetcher(cache).file(f"{base}/drip/d.jsonl", hashlib.sha256(data).digest(), "dataset")
    assert time.monotonic() - t0 < 5  # the read timeout alone would never have fired
