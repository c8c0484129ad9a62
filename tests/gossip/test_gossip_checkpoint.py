"""Checkpoint transfer over the libp2p stream protocol, from a server in another OS process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from harness import harness_env
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID, ROOT

from dtrain_node.errors import CheckpointUnavailable
from dtrain_node.p2p import files
from dtrain_node.p2p.files import sha256_file
from dtrain_node.p2p.host import GossipConfig, GossipNode


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(
        files: dict[str, Path], stall: bool = False, drip: bool = False
    ) -> tuple[bytes, list[str]]:
        conf = tmp_path / f"server{len(procs)}.json"
        served = {k: str(v) for k, v in files.items()}
        data_dir = str(tmp_path / f"srv{len(procs)}")
        faults = {"stall": stall, "drip": drip}
        conf.write_text(json.dumps({"data_dir": data_dir, "files": served, **faults}))
        p = subprocess.Popen(
            [sys.executable, "-m", "harness.file_server", str(conf)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(tmp_path / "server.err").open("w"),
            text=True,
            cwd=ROOT,
            env=harness_env(),
        )
        procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()  # blocks until ready or the process dies (then: "")
        assert line, (tmp_path / "server.err").read_text()[-2000:]
        ready = json.loads(line)
        return bytes.fromhex(ready["peer_key"]), ready["addrs"]

    yield start
    for p in procs:
        if p.poll() is None:
            assert p.stdin is not None
            p.stdin.write("exit\n")
            p.stdin.flush()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.mark.timeout(120)
def test_a_peer_that_answers_and_sends_nothing_holds_up_no_race(
    server: Any, tmp_path: Path
) -> None:
    """A staller says "found" and then sends nothing (its fetcher's idle timeout is a minute):
    a fetch bounded at 2 s that asks it first gives up at the bound; one that asks every peer
    at once (`race`) gets the file from its holder, however long the staller would stall."""
    f = tmp_path / "transcript.bin"
    f.write_bytes(os.urandom(10_000))
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    staller, holder = server({sha: f}, stall=True), server({sha: f})
    cfg = GossipConfig(tmp_path / "client", CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, Account.create()) as node:
        dest = tmp_path / "fetched.bin"
        with pytest.raises(CheckpointUnavailable, match=r"in 2 s"):
            node.fetch_file(sha, [staller, holder], dest, timeout_s=2.0)
        assert not dest.exists()
        assert node.fetch_file(sha, [staller, holder], dest, timeout_s=50.0, race=True) == dest
        assert dest.read_bytes() == f.read_bytes()
        assert [p.name for p in dest.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.timeout(120)
def test_checkpoint_transfer_20mb_and_corruption_rejected(server: Any, tmp_path: Path) -> None:
    good = tmp_path / "ckpt.safetensors"
    good.write_bytes(os.urandom(20 * 1000 * 1000))
    bad = tmp_path / "other.safetensors"
    bad.write_bytes(os.urandom(3 * 1000 * 1000))
    h_good = hashlib.sha256(good.read_bytes()).hexdigest()
    h_bad = hashlib.sha256(bad.read_bytes()).hexdigest()
    peer = server({h_good: good, h_bad: bad})
    # the server registered (and checked) the file; now it rots on disk: one flipped byte
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))

    cfg = GossipConfig(tmp_path / "client", CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, Account.create()) as node:
        dest = tmp_path / "fetched" / "start.safetensors"
        t0 = time.monotonic()
        out = node.fetch_file(h_good, [peer], dest)
        secs = time.monotonic() - t0
        assert out == dest and dest.read_bytes() == good.read_bytes()
        print(f"\n20 MB checkpoint fetched in {secs:.2f} s ({20 / secs:.1f} MB/s)")

        bad_dest = tmp_path / "fetched" / "bad.safetensors"
        with pytest.raises(CheckpointUnavailable, match="sha256"):
            node.fetch_file(h_bad, [peer], bad_dest)
        assert not bad_dest.exists()
        with pytest.raises(CheckpointUnavailable, match="status 1"):
            node.fetch_file("ab" * 32, [peer], bad_dest)  # nobody serves this hash
        assert not bad_dest.exists()
        assert sorted(p.name for p in dest.parent.iterdir()) == ["start.safetensors"]
        assert node.metrics()["dropped"]["file_rejected"] == 2


@pytest.mark.timeout(120)
def test_a_state_offer_larger_than_its_known_size_is_refused_before_download(
    server: Any, tmp_path: Path
) -> None:
    """Attack: a member offers a 512 MiB "state", far more than a state of the job has (its
    size is bounded by the model and recipe: `statefile.size_bound`), to fill the checker's
    disk, memory and time. The fetch names the most it takes: the offer is refused from the
    peer's first reply, before a byte of the file is read."""
    f = tmp_path / "state.dtps"
    with f.open("wb") as out:
        out.truncate(512 << 20)  # sparse: 512 MiB of zeros
    sha = sha256_file(f).hex()
    peer = server({sha: f})
    cfg = GossipConfig(tmp_path / "client", CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, Account.create()) as node:
        dest = tmp_path / "got.dtps"
        with pytest.raises(CheckpointUnavailable, match=r"536870912 bytes > limit 1048576"):
            node.fetch_file(sha, [peer], dest, timeout_s=30.0, max_bytes=1 << 20)
        assert not dest.exists()
        assert [p.name for p in dest.parent.iterdir() if p.name.startswith(".")] == []
        assert node.metrics()["bytes_in_total"] < 1 << 16


def _dripping(server: Any, tmp_path: Path) -> tuple[str, str, Path, tuple[bytes, list[str]]]:
    """A peer (fault `drip`) serving a private state a byte per 55 s and another file at full
    speed: (the state's sha256, the other's, the other's path, the peer)."""
    state, other = tmp_path / "state.dtps", tmp_path / "transcript.bin"
    state.write_bytes(os.urandom(10_000))
    other.write_bytes(os.urandom(10_000))
    sha, sha_other = sha256_file(state).hex(), sha256_file(other).hex()
    return sha, sha_other, other, server({sha: state, sha_other: other}, drip=True)


@pytest.mark.timeout(120)
def test_a_state_served_a_byte_a_minute_is_given_up_at_its_deadline(
    server: Any, tmp_path: Path
) -> None:
    """Attack: a member serves its state at one byte per 55 s (fault `drip`): the fetch's idle
    timeout (a minute) never fires and the transfer never ends. A fetch bounded by the state's
    deadline gives up at it, and a file the same peer serves at full speed still comes."""
    sha, sha_other, other, peer = _dripping(server, tmp_path)
    cfg = GossipConfig(tmp_path / "client", CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, Account.create()) as node:
        dest = tmp_path / "got.dtps"
        with pytest.raises(CheckpointUnavailable, match=r"in 3 s"):
            node.fetch_file(sha, [peer], dest, timeout_s=3.0, max_bytes=10_000)
        assert not dest.exists()
        assert node.metrics()["bytes_in_total"] < 1_000  # a byte, not the state
        got = node.fetch_file(sha_other, [peer], tmp_path / "got.bin", timeout_s=30.0)
        assert got.read_bytes() == other.read_bytes()


@pytest.mark.timeout(120)
def test_a_file_served_a_byte_a_minute_is_given_up_without_any_deadline_of_its_callers(
    server: Any, tmp_path: Path
) -> None:
    """Attack: a peer serves a file at one byte per 55 s (fault `drip`) to a fetch whose
    caller set no deadline (a job's files, a checkpoint): the minute's idle timeout never
    fires. The transfer gives up once it runs slower than `LEAST_RATE` on average past its
    grace, and the same peer's other file still comes."""
    sha, sha_other, other, peer = _dripping(server, tmp_path)
    cfg = GossipConfig(tmp_path / "client", CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, Account.create()) as node:
        t0 = time.monotonic()
        with pytest.raises(CheckpointUnavailable, match=r"slower than 64 KiB/s"):
            node.fetch_file(sha, [peer], tmp_path / "got.dtps")
        took = time.monotonic() - t0
        assert files.RATE_GRACE_S <= took < files.IDLE_TIMEOUT_S, took
        got = node.fetch_file(sha_other, [peer], tmp_path / "got.bin")
        assert got.read_bytes() == other.read_bytes()
