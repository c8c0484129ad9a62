"""Run gossip nodes as OS processes (harness.gossip_worker) and collect their results.

Used by the multi-process tests and scripts/bench_gossip.py. Every wait is on a condition (a
line from the child, a process exit) with a timeout; close() stops or kills every child.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_utils import keccak

from dtrain_node.devnet import forks
from harness import harness_env

ROOT = Path(__file__).resolve().parents[2]

CHAIN_ID = 31337
CONTRACT = "0x" + "42" * 20
JOB_ID = 7


def account(i: int) -> Any:
    """Deterministic test/benchmark operator keys (never use for real funds)."""
    return Account.from_key(keccak(f"dtrain-gossip-test-{i}".encode()))


@dataclass
class Proc:
    index: int
    popen: subprocess.Popen[str] | forks.Forked
    result_path: Path
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    events: list[dict[str, Any]] = field(default_factory=list)

    def wait_event(self, pred: Any, timeout: float) -> dict[str, Any]:
        for ev in self.events:
            if pred(ev):
                return ev
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"node {self.index}: no matching event in {timeout} s")
            try:
                ev = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.popen.poll() is not None and self.lines.empty():
                    raise RuntimeError(
                        f"node {self.index} exited with {self.popen.returncode}"
                    ) from None
                continue
            self.events.append(ev)
            if pred(ev):
                return ev

    def send(self, obj: Any) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.popen.stdin.flush()


class Cluster:
    def __init__(
        self,
        workdir: Path,
        n: int,
        *,
        rounds: int,
        params: int = 4_000_000,
        gossip: dict[str, Any] | None = None,
        per_node: dict[int, dict[str, Any]] | None = None,
        hooks: dict[int, str] | None = None,
        nice: int = 0,
        distinct_packets: int | None = None,
        payload_bytes: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.workdir, self.n = workdir, n
        self.members = [account(i).address for i in range(n)]
        self.procs: list[Proc] = []
        self._closed = False
        self._args = (rounds, params, gossip, per_node, hooks, nice)
        self.distinct_packets = distinct_packets
        self.payload_bytes = payload_bytes  # set: random payloads, no codec (and no torch)
        self.extra = dict(extra or {})  # more worker config, e.g. {"reconcile": 30.0}

    def spawn(self) -> None:
        rounds, params, gossip, per_node, hooks, nice = self._args
        workdir = self.workdir
        for i in range(self.n):
            g = dict(gossip or {})
            g.update((per_node or {}).get(i, {}))
            conf = {
                "index": i,
                "key": account(i).key.hex(),
                "members": self.members,
                "chain_id": CHAIN_ID,
                "contract": CONTRACT,
                "job_id": JOB_ID,
                "data_dir": str(workdir / f"node{i}"),
                "rounds": rounds,
                "distinct_packets": self.distinct_packets,
                "payload_bytes": self.payload_bytes,
                "params": params,
                "gossip": g,
                "hook": (hooks or {}).get(i),
                "result": str(workdir / f"result{i}.json"),
                **self.extra,
            }
            self.procs.append(_spawn(i, "harness.gossip_worker", conf, workdir, nice))

    def start(self, timeout: float = 60.0) -> None:
        ready = [p.wait_event(lambda e: e["event"] == "ready", timeout) for p in self.procs]
        peers = [[r["peer_key"], r["addrs"]] for r in ready]
        for p in self.procs:
            p.send({"peers": peers})
        for p in self.procs:
            p.wait_event(lambda e: e["event"] == "connected", timeout)

    def wait_done(self, indices: list[int] | None = None, timeout: float = 120.0) -> list[Any]:
        idx = list(range(self.n)) if indices is None else indices
        end = time.monotonic() + timeout
        for i in idx:
            self.procs[i].wait_event(
                lambda e: e["event"] == "done", max(1.0, end - time.monotonic())
            )
        return [json.loads(self.procs[i].result_path.read_text()) for i in idx]

    def kill(self, i: int) -> None:
        self.procs[i].popen.kill()
        self.procs[i].popen.wait(10)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self.procs:
            if p.popen.poll() is None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    p.send("exit")
        end = time.monotonic() + 10
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)

    def stderr(self, i: int) -> str:
        return (self.workdir / f"stderr{i}.log").read_text()[-3000:]


def _spawn(i: int, module: str, conf: dict[str, Any], workdir: Path, nice: int = 0) -> Proc:
    """Start `python -m module CONF` with its stdout lines pumped into a Proc."""
    path = workdir / f"conf{i}.json"
    path.write_text(json.dumps(conf))
    cmd = [sys.executable, "-m", module, str(path)]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    with (workdir / f"stderr{i}.log").open("w") as err:
        env = harness_env(PYTHONUNBUFFERED="1")
        p = forks.popen(cmd, env, subprocess.PIPE, subprocess.PIPE, err)
    proc = Proc(i, p, Path(conf["result"]))
    threading.Thread(target=_pump, args=(proc,), daemon=True).start()
    return proc


def spawn_peer(workdir: Path, index: int, role: str, members: list[str]) -> Proc:
    """A non-member peer (harness.gossip_peer): role "inject" or "observe"; index >= 1000."""
    conf = {
        "role": role,
        "key": account(index).key.hex(),
        "members": members,
        "data_dir": str(workdir / f"peer{index}"),
        "result": str(workdir / f"result{index}.json"),
    }
    return _spawn(index, "harness.gossip_peer", conf, workdir)


def _pump(proc: Proc) -> None:
    assert proc.popen.stdout is not None
    for line in proc.popen.stdout:
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                proc.lines.put(json.loads(line))


def latency_summary(results: list[Any]) -> dict[str, float]:
    lat = sorted(r["latency_s"] for res in results for r in res["rounds"])
    return {
        "median_s": lat[len(lat) // 2],
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_s": lat[-1],
    }


def assert_identical_rounds(results: list[Any], rounds: range) -> None:
    """Every node applied the same packets (senders and payload hashes) in every round."""
    for r in rounds:
        views = {
            (tuple(res["rounds"][r]["senders"]), tuple(res["rounds"][r]["digests"]))
            for res in results
        }
        assert len(views) == 1, f"round {r}: nodes disagree: {views}"
