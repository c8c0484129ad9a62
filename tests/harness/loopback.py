"""An in-process `Transport` (dtrain_node.operator.transport) for operator tests.

A `LoopbackHub` is shared by several nodes in one process: each round's packets go to every
member of the epoch (checked with the receiver's own validator, as gossip does), and files
served by any node are fetched from the hub's dict. No sockets, no libp2p, no settle phase.

    hub = LoopbackHub()
    node = Node(cfg, transport_factory=hub.factory)
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from web3 import Web3

from dtrain_node.errors import CheckpointUnavailable
from dtrain_node.operator.transport import PayloadValidator, PeerSpec, RoundResult, Transcript

RoundKey = tuple[int, int, int]  # (job, epoch attempt, round)


class LoopbackHub:
    def __init__(self, file_timeout_s: float = 30.0) -> None:
        self.cond = threading.Condition()
        self.packets: dict[RoundKey, dict[str, bytes]] = {}
        self.files: dict[str, bytes] = {}  # sha256 hex -> bytes
        self.file_timeout_s = file_timeout_s
        self._ports = itertools.count(42000)

    def factory(self, cfg: Any, bsm: Any, job_id: int) -> LoopbackTransport:
        """A node's `transport_factory`: (NodeConfig, BSM, job id) -> its transport."""
        return LoopbackTransport(self, bsm.sender, job_id, next(self._ports))

    def publish(self, key: RoundKey, sender: str, payload: bytes) -> None:
        with self.cond:
            self.packets.setdefault(key, {})[sender] = payload
            self.cond.notify_all()

    def wait_round(
        self, key: RoundKey, members: Sequence[str], deadline_s: float
    ) -> dict[str, bytes]:
        """The round's packets once every member published one, or at the deadline."""
        end = time.monotonic() + deadline_s
        with self.cond:
            while True:
                got = dict(self.packets.get(key, {}))
                left = end - time.monotonic()
                if all(m in got for m in members) or left <= 0:
                    return got
                self.cond.wait(left)

    def serve(self, sha256_hex: str, data: bytes) -> None:
        with self.cond:
            self.files[sha256_hex] = data
            self.cond.notify_all()

    def fetch(self, sha256_hex: str) -> bytes | None:
        end = time.monotonic() + self.file_timeout_s
        with self.cond:
            while sha256_hex not in self.files and time.monotonic() < end:
                self.cond.wait(end - time.monotonic())
            return self.files.get(sha256_hex)


class LoopbackTransport:
    """One node's end of a `LoopbackHub`."""

    def __init__(self, hub: LoopbackHub, address: str, job_id: int, port: int) -> None:
        self.hub = hub
        self.address = Web3.to_checksum_address(address)
        self.job_id = job_id
        self.peer_key = bytes(Web3.keccak(text=f"loopback:{self.address}"))
        self.listen_addrs = [f"/ip4/127.0.0.1/tcp/{port}"]
        self.epoch: int | None = None
        self.members: list[str] = []
        self.validate: PayloadValidator | None = None
        self.rounds: list[RoundResult] = []  # every round collected, for assertions
        self.after_round: Callable[[RoundResult], object] | None = None  # test hook
        self.stopped = False

    @property
    def settle_s(self) -> float:
        return 0.0

    def set_epoch(
        self, epoch: int, members: Sequence[str], validate: PayloadValidator | None
    ) -> None:
        self.epoch = epoch
        self.members = sorted((Web3.to_checksum_address(m) for m in members), key=str.lower)
        self.validate = validate

    def connect(self, peers: list[PeerSpec]) -> list[bytes]:
        return [key for key, _ in peers]

    def collect_round(
        self,
        rnd: int,
        payload: bytes,
        deadline_s: float,
        patience_s: float | None = None,
        state: bytes = b"",
    ) -> RoundResult:
        if self.epoch is None:
            raise RuntimeError("set_epoch() before collect_round()")
        t0 = time.monotonic()
        key = (self.job_id, self.epoch, rnd)
        if payload:
            self.hub.publish(key, self.address, payload)
        got = self.hub.wait_round(key, self.members, deadline_s)
        packets = [(m, got[m]) for m in self.members if m in got and self._valid(got[m])]
        have = {m for m, _ in packets}
        res = RoundResult(
            round=rnd,
            packets=sorted(packets, key=lambda p: p[0].lower()),
            missing=[m for m in self.members if m not in have],
            latency_s=time.monotonic() - t0,
            bytes_in=sum(len(p) for m, p in packets if m != self.address),
            bytes_out=len(payload) * max(0, len(self.members) - 1),
            settled=True,
            re_requests=0,
        )
        self.rounds.append(res)
        if self.after_round is not None:
            self.after_round(res)
        return res

    def reconcile(self, rounds: int, deadline_s: float) -> Transcript:
        """The hub holds every packet published, so each round's transcript is every valid
        member packet it holds (also those published after our deadline)."""
        if self.epoch is None:
            raise RuntimeError("set_epoch() before reconcile()")
        out = []
        with self.hub.cond:
            for r in range(rounds):
                got = self.hub.packets.get((self.job_id, self.epoch, r), {})
                out.append([(m, got[m]) for m in self.members if m in got])
        packets = [[(m, p) for m, p in rnd if self._valid(p)] for rnd in out]
        packets = [sorted(rnd, key=lambda p: p[0].lower()) for rnd in packets]
        return Transcript(packets, True, [], 0.0, len(self.members) - 1, 0)

    def _valid(self, payload: bytes) -> bool:
        if self.validate is None:
            return True
        try:
            self.validate(payload)
        except Exception:
            return False
        return True

    def serve_file(self, sha256_hex: str, path: Path | str) -> None:
        data = Path(path).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256_hex:
            raise ValueError(f"{path} does not have sha256 {sha256_hex}")
        self.hub.serve(sha256_hex, data)

    def fetch_file(
        self,
        sha256_hex: str,
        peers: list[PeerSpec],
        dest: Path | str,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> Path:
        data = self.hub.fetch(sha256_hex)
        if data is None:
            raise CheckpointUnavailable(f"no node serves {sha256_hex}")
        if max_bytes is not None and len(data) > max_bytes:
            raise CheckpointUnavailable(f"{len(data)} bytes > limit {max_bytes}")
        dest = Path(dest)
        tmp = dest.with_suffix(dest.suffix + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def stop(self) -> None:
        self.stopped = True
