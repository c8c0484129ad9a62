"""One sync round (docs/protocol.md 4.2): publish our packet, collect every member's packet until
all are in or the deadline passes, pulling missing ones from peers, then settle with the peers
so that honest nodes apply the same set (4.4 states the guarantee and its limits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from dtrain_node.errors import GossipError
from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.rounds import Phase
from dtrain_node.p2p.state import HostState
from dtrain_node.p2p.sync import SyncClient


@dataclass(frozen=True)
class RoundResult:
    round: int
    packets: list[tuple[str, bytes]]  # (sender, payload), sorted by sender address
    missing: list[str]  # members whose packet was not applied
    latency_s: float
    bytes_in: int
    bytes_out: int
    settled: bool  # False: hit deadline + settle_s before peers agreed (see docs/protocol.md)
    re_requests: int


class RoundCollector:
    def __init__(self, state: HostState, sync: SyncClient) -> None:
        self._state = state
        self._sync = sync

    async def collect(self, rnd: int, payload: bytes, deadline_s: float | None) -> RoundResult:
        st, cfg, store = self._state, self._state.config, self._state.store
        if store.epoch is None:
            raise GossipError("set_epoch() before collect_round()")
        t0 = time.monotonic()
        m = st.metrics
        before = (m.total_in, m.total_out, m.re_requests)
        store.begin(rnd)
        await self._publish(rnd, payload)
        st.notify()
        deadline = t0 + (cfg.round_deadline_s if deadline_s is None else deadline_s)
        await self._wait_for_packets(rnd, t0, deadline)
        settled = True
        if store.missing(rnd):
            settled = await self._settle(rnd, deadline + cfg.settle_s)
        return self._finish(rnd, t0, before, settled)

    async def _publish(self, rnd: int, payload: bytes) -> None:
        st, cfg, store = self._state, self._state.config, self._state.store
        assert st.pubsub is not None and store.epoch is not None
        if not payload:
            return  # this node only collects this round (it will be missing)
        envs = envmod.seal(
            st.account,
            chain_id=cfg.chain_id,
            contract=cfg.contract,
            job_id=cfg.job_id,
            epoch=store.epoch,
            round=rnd,
            payload=payload,
            chunk_size=cfg.chunk_bytes,
        )
        for e in envs:
            # our own packet goes through the same rules: a bad payload is a caller bug
            store.offer(e, relayed=True)
        # gossip bytes sent are estimated as size x mesh peers (py-libp2p does not report them)
        n_mesh = len(st.gossipsub.mesh.get(st.topic, ())) if st.gossipsub is not None else 0
        for e in envs:
            data = e.encode()
            await st.pubsub.publish(st.topic, data)
            st.metrics.add_out("gossip", len(data) * max(1, n_mesh))

    async def _wait_for_packets(self, rnd: int, t0: float, deadline: float) -> None:
        st, store, base = self._state, self._state.store, self._state.config.re_request_s
        # pull interval doubles while we wait (a slow member is the common case, not loss),
        # capped at 8x so a lost packet still comes back within ~2 s by default
        interval = base
        next_pull = t0 + interval
        while store.missing(rnd) and time.monotonic() < deadline:
            if time.monotonic() >= next_pull:
                await self._sync.ask_all(rnd)
                next_pull = time.monotonic() + interval
                interval = min(interval * 2, base * 8)
                continue
            with trio.move_on_at(min(next_pull, deadline)) as waited:
                await st.changed.wait()
            if not waited.cancelled_caught:
                # progress: packets are flowing, so a straggler is likely lost, not late
                interval = base
                next_pull = min(next_pull, time.monotonic() + interval)

    async def _settle(self, rnd: int, hard: float) -> bool:
        """After the deadline: accept only relays, and finish once every reachable peer has
        closed the round and we hold every packet any of them holds (or at `hard`)."""
        st, store = self._state, self._state.store
        store.close(rnd)
        while True:
            views = await self._sync.ask_all(rnd)
            mine = set(store.have(rnd))
            if not store.missing(rnd):
                return True
            live = [v for v in views.values() if v is None or v.reachable]
            if all(v is not None and v.phase >= Phase.CLOSED and v.have <= mine for v in live):
                return True
            if time.monotonic() >= hard:
                return False
            with trio.move_on_at(min(hard, time.monotonic() + st.config.re_request_s)):
                await st.changed.wait()

    def _finish(
        self, rnd: int, t0: float, before: tuple[int, int, int], settled: bool
    ) -> RoundResult:
        st, m = self._state, self._state.metrics
        packets = st.store.finish(rnd)
        got = {s for s, _ in packets}
        missing = [s for s in st.store.members if s not in got]
        latency = time.monotonic() - t0
        if not settled:
            m.settle_timeouts += 1
        in0, out0, rr0 = before
        record = {
            "round": rnd,
            "latency_s": latency,
            "bytes_in": m.total_in - in0,
            "bytes_out": m.total_out - out0,
            "missing": missing,
            "settled": settled,
        }
        m.record_round(record)
        return RoundResult(
            round=rnd,
            packets=packets,
            missing=missing,
            latency_s=latency,
            bytes_in=record["bytes_in"],
            bytes_out=record["bytes_out"],
            settled=settled,
            re_requests=m.re_requests - rr0,
        )
