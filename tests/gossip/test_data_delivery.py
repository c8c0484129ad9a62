"""A job's files delivered by content hash over libp2p, from a data peer in another OS process:
resumed transfers, the cache, lying and oversized peers, and pre-flight refusing a job whose
dataset cannot be had intact."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import harness_env
from harness.gossip_cluster import ROOT

from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain_node.errors import CheckpointUnavailable, DatasetError
from dtrain_node.operator import preflight
from dtrain_node.operator.sources import Cache, Fetcher, fetch_job
from dtrain_node.p2p import files, wire
from dtrain_node.p2p.dataserve import DataConfig, DataPeer, parse_p2p_uri

MB = 1000 * 1000


def framed(n: int) -> int:
    """Bytes a fetcher counts for n bytes of file: each data frame carries a 4-byte length."""
    return n + 4 * math.ceil(n / wire.CKPT_CHUNK)


class Server:
    def __init__(self, proc: subprocess.Popen[str], ready: dict[str, Any]) -> None:
        self.proc, self.uris, self.peer_id = proc, ready["uris"], ready["peer_id"]

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        done = json.loads(self.proc.stdout.readline())
        self.proc.wait(10)
        return done


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(files: list[Path] = (), lies: dict[str, Path] | None = None) -> Server:  # type: ignore[assignment]
        n = len(procs)
        conf = tmp_path / f"server{n}.json"
        conf.write_text(
            json.dumps(
                {
                    "key_file": str(tmp_path / "server.key"),
                    "files": [str(f) for f in files],
                    "lies": {k: str(v) for k, v in (lies or {}).items()},
                }
            )
        )
        err = tmp_path / f"server{n}.err"
        p = subprocess.Popen(
            [sys.executable, "-m", "harness.data_server", str(conf)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err.open("w"),
            text=True,
            cwd=ROOT,
            env=harness_env(),
        )
        procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()  # blocks until ready or the process dies (then: "")
        assert line, err.read_text()[-2000:]
        return Server(p, json.loads(line))

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


@pytest.fixture
def client() -> Iterator[DataPeer]:
    with DataPeer(DataConfig(request_timeout_s=5, idle_timeout_s=5)) as peer:
        yield peer


def blob(path: Path, n: int) -> tuple[Path, str]:
    path.write_bytes(os.urandom(n))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(180)
def test_resume_after_the_server_dies_mid_transfer_moves_only_the_rest(
    serve: Any, client: DataPeer, tmp_path: Path
) -> None:
    src, sha = blob(tmp_path / "data.bin", 50 * MB)
    server = serve([src])
    ref = parse_p2p_uri(server.uris[str(src)])
    dest = tmp_path / "cache" / sha

    # a full transfer first, to measure loopback throughput
    t0 = time.monotonic()
    client.fetch(sha, [ref.peer], tmp_path / "full.bin")
    secs = time.monotonic() - t0
    print(f"\n50 MB over libp2p loopback in {secs:.2f} s ({50 / secs:.1f} MB/s)")

    def kill_at_10mb(done: int, total: int) -> None:
        if done >= 10 * MB and server.proc.poll() is None:
            server.proc.kill()

    with pytest.raises(CheckpointUnavailable):
        client.fetch(sha, [ref.peer], dest, progress=kill_at_10mb)
    part = files.part_path(dest)
    kept = part.stat().st_size
    assert 10 * MB <= kept < 50 * MB and not dest.exists()

    again = serve([src])  # same key file: the same peer, at a new port
    assert again.peer_id == server.peer_id
    ref2 = parse_p2p_uri(again.uris[str(src)])
    before = client.metrics()["bytes_in_total"]
    client.fetch(sha, [ref2.peer], dest)
    moved = client.metrics()["bytes_in_total"] - before
    assert moved == framed(50 * MB - kept)
    assert dest.read_bytes() == src.read_bytes() and not part.exists()
    print(f"resumed at {kept / MB:.1f} MB: {moved / MB:.1f} MB moved")
    assert again.stop()["bytes_out_total"] == moved


@pytest.mark.timeout(120)
def test_fetcher_caches_by_hash_and_resumes_a_truncated_part(serve: Any, tmp_path: Path) -> None:
    src, sha = blob(tmp_path / "data.jsonl", 3 * MB)
    server = serve([src])
    uri = server.uris[str(src)]
    cache = Cache(tmp_path / "cache", timeout_s=5, progress="log")
    part = files.part_path(cache.file(sha))
    part.parent.mkdir(parents=True)
    part.write_bytes(src.read_bytes()[: MB + 17])  # an earlier transfer, cut short

    with Fetcher(cache) as f:
        got = f.file(uri, bytes.fromhex(sha), "dataset")
        assert f._peer is not None
        moved = f._peer.metrics()["bytes_in_total"]
    assert got == cache.file(sha) and got.read_bytes() == src.read_bytes()
    assert moved == framed(3 * MB - (MB + 17))

    with Fetcher(cache) as f:  # cached: verified again, nothing fetched, no host started
        assert f.file(uri, bytes.fromhex(sha), "dataset") == got
        assert f._peer is None
    assert server.stop()["bytes_out_total"] == moved


@pytest.mark.timeout(120)
def test_a_peer_serving_other_bytes_or_too_many_is_refused(
    serve: Any, client: DataPeer, tmp_path: Path
) -> None:
    _, sha = blob(tmp_path / "want.bin", 2 * MB)
    other, _ = blob(tmp_path / "other.bin", 2 * MB)
    big, big_sha = blob(tmp_path / "big.bin", 5 * MB)
    server = serve([big], lies={sha: other})
    liar = server.uris[sha]

    cache = Cache(tmp_path / "cache", timeout_s=5, progress="log")
    with pytest.raises(DatasetError, match=f"dataset {liar}: .*sha256 .* != expected {sha}"):
        Fetcher(cache).file(liar, bytes.fromhex(sha), "dataset")
    assert [p.name for p in (tmp_path / "cache" / "sha256").iterdir()] == [f"{sha}.lock"]

    ref = parse_p2p_uri(liar)
    with pytest.raises(CheckpointUnavailable, match="sha256"):
        client.fetch(sha, [ref.peer], tmp_path / "x" / sha)
    assert client.metrics()["dropped"] == {"file_rejected": 1}
    assert (
        not (tmp_path / "x" / sha).exists() and not files.part_path(tmp_path / "x" / sha).exists()
    )

    before = client.metrics()["bytes_in_total"]
    with pytest.raises(CheckpointUnavailable, match=f"{5 * MB} bytes > limit {MB}"):
        client.fetch(big_sha, [ref.peer], tmp_path / "x" / big_sha, max_bytes=MB)
    assert client.metrics()["bytes_in_total"] == before  # refused before a byte was read
    assert client.metrics()["dropped"] == {"file_rejected": 2}
    assert list((tmp_path / "x").iterdir()) == []

    # the pinned hash and the URI's disagree: refused without asking anyone
    with pytest.raises(DatasetError, match="!= pinned"):
        Fetcher(cache).file(liar, bytes(32 * [1]), "dataset")


def job_of(dataset_uri: str, dataset_hash: bytes) -> Job:
    spec = JobSpec(
        price_per_operator_epoch=1,
        method=Method.CPT,
        model_uri="builtin:tiny",
        dataset_uri=dataset_uri,
        dataset_hash=dataset_hash,
    )
    state = JobState("0x" + "11" * 20, JobStatus.OPEN, 0, 0, 0, 0, 0, bytes(32))
    return Job(7, spec, state)


@pytest.mark.timeout(120)
def test_preflight_skips_a_job_whose_p2p_dataset_is_wrong_or_unreachable(
    serve: Any, tmp_path: Path
) -> None:
    text = (b"the quick brown fox jumps over the lazy dog. " * 2000)[:64000]
    good = tmp_path / "corpus.txt"
    good.write_bytes(text)
    pinned = hashlib.sha256(text).digest()
    other, other_sha = blob(tmp_path / "other.txt", 64000)
    server = serve([good], lies={pinned.hex(): other})
    cache = Cache(tmp_path / "cache", timeout_s=3, progress="log")

    lying = job_of(server.uris[pinned.hex()], pinned)
    why = preflight.check(lying, 8, cache)
    assert why is not None and why.startswith(f"DatasetError: dataset {lying.spec.dataset_uri}: ")
    assert f"sha256 {other_sha} != expected {pinned.hex()}" in why and "\n" not in why

    # the URI names a hash other than the pinned one
    wrong_pin = job_of(server.uris[str(good)], hashlib.sha256(b"x").digest())
    assert "!= pinned" in (preflight.check(wrong_pin, 8, cache) or "")

    ref = parse_p2p_uri(server.uris[str(good)])
    server.stop()  # nobody serves it any more
    gone = job_of(server.uris[str(good)], pinned)
    t0 = time.monotonic()
    why = preflight.check(gone, 8, cache)
    assert why is not None and why.startswith("DatasetError: dataset p2p:") and "no peer" in why
    assert time.monotonic() - t0 < 60  # the cache's 3 s timeout, not a hang (loaded machines)
    assert not cache.file(ref.sha256.hex()).exists()


@pytest.mark.timeout(120)
def test_fetch_job_gives_local_paths_for_p2p_references(serve: Any, tmp_path: Path) -> None:
    data, sha = blob(tmp_path / "corpus.txt", 100_000)
    server = serve([data])
    job = job_of(server.uris[str(data)], bytes.fromhex(sha))
    local = fetch_job(job, Cache(tmp_path / "cache", timeout_s=5, progress="log"))
    assert local.dataset_uri == str(tmp_path / "cache" / "sha256" / sha)
    assert local.model_uri == "builtin:tiny" and local.recipe_uri == ""
    assert Path(local.dataset_uri).read_bytes() == data.read_bytes()


def test_preflight_retries_a_failed_check_after_a_while_and_never_a_passed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job refused because its caller's data server was not up yet is checked again once
    `retry_s` has passed (an --auto node would otherwise pass it by for its whole run); a job
    that passed is not rebuilt at every poll."""
    answers = iter(["DatasetError: dataset p2p:...: no peer delivered it", None])
    calls: list[int] = []

    def check(job: Job, batch_size: int, cache: Any, step_s: float = 0.0) -> str | None:
        calls.append(job.id)
        return next(answers)

    monkeypatch.setattr(preflight, "check", check)
    now = [0.0]
    pf = preflight.Preflight(8, retry_s=300, clock=lambda: now[0])
    job = job_of("p2p:/ip4/127.0.0.1/tcp/1/p2p/x#sha256=" + "ab" * 32, bytes(32))
    assert pf(job) is not None and pf(job) is not None and len(calls) == 1
    now[0] = 299.0
    assert pf(job) is not None and len(calls) == 1
    now[0] = 300.0
    assert pf(job) is None and len(calls) == 2
    now[0] = 10_000.0
    assert pf(job) is None and len(calls) == 2
