"""`dtrain data serve` as a subprocess: one URI per path, fetchable (a folder as its model pack),
the same peer id after a restart with the same key, a clean stop on SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_node.operator.sources import Cache, Fetcher
from dtrain_node.p2p.dataserve import parse_p2p_uri

DTRAIN = str(Path(sys.executable).with_name("dtrain"))
URI = re.compile(r"^(p2p:\S+)  (\S+) \((file|folder, packed), [0-9.]+ MB\)$")


def start(tmp_path: Path, *paths: Path) -> subprocess.Popen[str]:
    options = ["--port", "0", "--host", "127.0.0.1", "--key-file", str(tmp_path / "peer.key")]
    return subprocess.Popen(
        [DTRAIN, "data", "serve", *map(str, paths), *options, "--cache-dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def uris(proc: subprocess.Popen[str], n: int) -> dict[str, str]:
    assert proc.stdout is not None
    out = {}
    for _ in range(n):
        line = proc.stdout.readline().rstrip("\n")
        m = URI.match(line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        out[m[2]] = m[1]
    return out


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    return proc.returncode, out, err


@pytest.mark.timeout(120)
def test_data_serve_prints_uris_serves_them_and_stops_on_sigint(tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "2+2=", "completion": "4"}\n' * 100)
    model = tmp_path / "gpt2-tiny"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    (model / "model.safetensors").write_bytes(os.urandom(300_000))

    proc = start(tmp_path, data, model)
    try:
        got = uris(proc, 2)
        cache = Cache(tmp_path / "operator-cache", timeout_s=5, progress="log")
        with Fetcher(cache) as f:
            fetched = f.file(got[str(data)], None, "dataset")
            folder = Path(f.model(got[str(model)]))
        assert fetched.read_bytes() == data.read_bytes()
        assert folder == cache.model_dir(parse_p2p_uri(got[str(model)]).sha256.hex())
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
        assert (folder / "model.safetensors").read_bytes() == (
            model / "model.safetensors"
        ).read_bytes()
    finally:
        code, out, err = interrupt(proc)
    assert code == 0, err[-2000:]
    assert re.fullmatch(r"stopped serving \([0-9.]+ MB sent\)\n", out), out
    assert "Traceback" not in err

    proc = start(tmp_path, data)  # the same key file: the same peer, so old URIs stay valid
    try:
        again = uris(proc, 1)
    finally:
        code, _, _ = interrupt(proc)
    assert code == 0
    assert parse_p2p_uri(again[str(data)]).peer_key == parse_p2p_uri(got[str(data)]).peer_key
