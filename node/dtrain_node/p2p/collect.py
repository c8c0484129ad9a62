"""One sync round (docs/protocol.md 4.2), in two phases: publish a commitment to our packet and
collect every member's commitment (until all are in, or the commit deadline passed and the peers
agree on them); then reveal our packet and collect every committed member's packet until all
are in or the deadline passes, pulling missing ones from peers, then settle with the peers so
that honest nodes apply the same set (4.4 states the guarantee and its limits).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from dtrain_node.errors import GossipError
from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.rounds import Phase
from dtrain_node.p2p.state import HostState
from dtrain_node.p2p.sync import PeerView, SyncClient


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
    # per packet, its sender's signed commitment (an encoded envelope: names the packet's
    # sha256 and the sender's private-state digest, docs/protocol.md 4.6)
    commitments: list[bytes] = field(default_factory=list)


class RoundCollector:
    def __init__(self, state: HostState, sync: SyncClient) -> None:
        self._state = state
        self._sync = sync

    async def collect(
        self,
        rnd: int,
        payload: bytes,
        deadline_s: float | None,
        patience_s: float | None = None,
        state: bytes = b"",
    ) -> RoundResult:
        st, cfg, store = self._state, self._state.config, self._state.store
        if store.epoch is None:
            raise GossipError("set_epoch() before collect_round()")
        t0 = time.monotonic()
        m = st.metrics
        before = (m.total_in, m.total_out, m.re_requests)
        budget = cfg.round_deadline_s if deadline_s is None else deadline_s
        deadline = t0 + budget
        store.begin(rnd)
        commit_deadline = t0 + budget * cfg.commit_share
        # a member that is alive but has not begun the round yet is waited for this long
        patient = t0 + max(budget, patience_s or 0.0) * cfg.commit_share
        chunks, settled = await self._commit(rnd, payload, t0, commit_deadline, patient, state)
        t_reveal = time.monotonic()
        # the packets get their share of the round however long the commitments took
        deadline = max(deadline, t_reveal + budget * (1 - cfg.commit_share))
        if rnd in cfg.withhold_rounds:  # fault: committed, and the packet never goes out
            chunks = []
        if chunks and rnd in cfg.reveal_to_one_rounds:  # fault: one peer gets it, by sync
            st.hidden[rnd], chunks = chunks, []
            st.favored.pop(rnd, None)  # an earlier epoch's round of that number
        store.reveal(rnd)
        await self._publish(chunks)
        if chunks and rnd in cfg.equivocate_rounds:
            await self._equivocate(rnd, payload)
        st.notify()
        await self._wait(rnd, t_reveal, deadline, lambda: bool(store.awaited(rnd)))
        if store.awaited(rnd):
            store.close(rnd)
            settled = await self._settle(rnd, deadline + cfg.settle_s) and settled
        return self._finish(rnd, t0, before, settled)

    async def _commit(
        self,
        rnd: int,
        payload: bytes,
        t0: float,
        commit_deadline: float,
        patient: float,
        state: bytes = b"",
    ) -> tuple[list[envmod.Envelope], bool]:
        """Phase 1: publish our commitment, then wait until every member committed, or the
        commit deadline passed and the peers agree on the commitments.
        Returns the packet chunks to reveal ([] when we only collect, or committed too late)
        and False if the peers did not agree on the commitments in time."""
        st, store = self._state, self._state.store
        chunks: list[envmod.Envelope] = []
        # when 2/3 of the members revealed this round before we began it, our commitment would
        # be late at all of them, so we only collect (docs/protocol.md 4.2, step 1); fewer
        # reveals (a member that runs ahead) never stop us from committing
        behind = 0.0
        if payload and not store.revealed_by_quorum(rnd, st.account.address):
            commit, chunks = self._seal(rnd, payload, state)
            store.offer(commit, relayed=True)
            behind = store.began_behind_by(rnd, time.monotonic())
            await self._publish([commit])
            st.notify()
        # a member that will not commit (ourselves when only collecting) is not waited for
        me = st.account.address if not chunks else None

        def pending() -> bool:
            return any(m != me for m in store.uncommitted(rnd))

        await self._wait(rnd, t0, commit_deadline, pending)
        await self._wait_for_the_behind(rnd, patient, pending)
        agreed = True
        # may run past D (a peer that began the round late): the round still ends by
        # D + settle_s, since the packet phase then goes straight to its settle
        hard = commit_deadline + st.config.settle_s
        if pending():
            store.close_commits(rnd)
            agreed = await self._agree_commits(rnd, hard, pending)
            st.metrics.commit_timeouts += not agreed
        # begun far behind a peer: that peer may have closed its commit phase without our
        # commitment, and would then apply the round without us while we apply it with us
        far_behind = behind > (commit_deadline - t0) / 2
        if (
            chunks
            and far_behind
            and not await self._confirm_own(rnd, chunks[0].payload_sha256, hard)
        ):
            store.withdraw(rnd, st.account.address)
            st.metrics.withdrawn += 1
            chunks = []
        return chunks, agreed

    async def _wait_for_the_behind(
        self, rnd: int, patient: float, pending: Callable[[], bool]
    ) -> None:
        """Past the commit deadline, keep the commit phase open (until `patient`) while a
        member has not committed and some peer answers that it has not begun the round, or
        does not answer in time while still connected (a busy machine answers late): a slow
        honest machine is waited for as long as the epoch's schedule allows, a dead one (no
        connection) is not."""
        st = self._state
        while pending() and time.monotonic() < patient:
            views = await self._sync.ask_all(rnd, by=patient)
            behind = [v for v in views.values() if v is None or v.phase == Phase.NOT_STARTED]
            if not any(v is None or v.reachable for v in behind) or not pending():
                return
            st.metrics.waited_for_behind += 1
            with trio.move_on_at(min(patient, time.monotonic() + 2 * st.config.re_request_s)):
                await st.changed.wait()

    async def _confirm_own(self, rnd: int, digest: bytes, hard: float) -> bool:
        """Step 3a (docs/protocol.md 4.2): False (withdraw: do not reveal) when every live peer
        answered that it closed its commit phase without our commitment: none holds it, so none
        can relay it and none will wait for our packet. True (reveal) as soon as one live peer
        holds it or can still take it, or at `hard` without answers."""
        st = self._state
        ours = (st.account.address, digest)
        while True:
            views = list((await self._sync.ask_all(rnd, by=hard)).values())
            live = [v for v in views if v is None or v.reachable]
            if not live:
                return True  # nobody left to disagree with
            if any(v is not None and (ours in v.commits or v.phase <= Phase.COMMIT) for v in live):
                return True
            if all(v is not None for v in live):
                return False  # every one closed without it
            if time.monotonic() >= hard:
                return True
            with trio.move_on_at(min(hard, time.monotonic() + st.config.re_request_s)):
                await st.changed.wait()

    async def _equivocate(self, rnd: int, payload: bytes) -> None:
        """Fault hook: a second signed commitment, to another packet, for this round."""
        commit, _ = self._seal(rnd, payload[::-1] + b"\x00")
        self._state.store.offer(commit, relayed=True)
        await self._publish([commit])

    def _seal(
        self, rnd: int, payload: bytes, state: bytes = b""
    ) -> tuple[envmod.Envelope, list[envmod.Envelope]]:
        st, cfg, store = self._state, self._state.config, self._state.store
        assert store.epoch is not None
        args = {"chain_id": cfg.chain_id, "contract": cfg.contract, "job_id": cfg.job_id}
        args.update(epoch=store.epoch, round=rnd, payload=payload, chunk_size=cfg.chunk_bytes)
        chunks = envmod.seal(st.account, **args)
        return envmod.commitment(st.account, chunks, state), chunks

    async def _publish(self, envs: list[envmod.Envelope]) -> None:
        st, store = self._state, self._state.store
        assert st.pubsub is not None
        for e in envs:
            # our own packet goes through the same rules: a bad payload is a caller bug
            if e.kind == envmod.CHUNK:
                store.offer(e, relayed=True)
        # gossip bytes sent are estimated as size x mesh peers (py-libp2p does not report them)
        n_mesh = len(st.gossipsub.mesh.get(st.topic, ())) if st.gossipsub is not None else 0
        for e in envs:
            data = e.encode()
            await st.pubsub.publish(st.topic, data)
            st.metrics.add_out("gossip", len(data) * max(1, n_mesh))

    async def _wait(
        self, rnd: int, t0: float, deadline: float, pending: Callable[[], bool]
    ) -> None:
        """Wait while pending() and before the deadline, pulling from peers meanwhile."""
        st, base = self._state, self._state.config.re_request_s
        # pull interval doubles while we wait (a slow member is the common case, not loss),
        # capped at 8x so a lost packet still comes back within ~2 s by default
        interval = base
        next_pull = t0 + interval
        while pending() and time.monotonic() < deadline:
            if time.monotonic() >= next_pull:
                await self._sync.ask_all(rnd, by=deadline)
                next_pull = time.monotonic() + interval
                interval = min(interval * 2, base * 8)
                continue
            with trio.move_on_at(min(next_pull, deadline)) as waited:
                await st.changed.wait()
            if not waited.cancelled_caught:
                # progress: packets are flowing, so a straggler is likely lost, not late
                interval = base
                next_pull = min(next_pull, time.monotonic() + interval)

    async def _agree_commits(self, rnd: int, hard: float, pending: Callable[[], bool]) -> bool:
        """After the commit deadline: take relayed commitments, and reveal once every reachable
        peer closed its commit phase holding no commitment we lack (or at `hard`). A peer's own
        commitment is not compared: we could not take it from that peer any more."""

        def agreed(v: PeerView, mine: set[tuple[str, bytes]]) -> bool:
            own = {c for c in v.commits if c[0] == v.signer}
            return v.phase >= Phase.COMMIT_CLOSED and v.commits - own <= mine

        return await self._agree(
            rnd, hard, pending, lambda v: agreed(v, set(self._state.store.commitments(rnd)))
        )

    async def _settle(self, rnd: int, hard: float) -> bool:
        """After the deadline: accept only relays, and finish once every reachable peer has
        closed the round and we hold every packet any of them holds (or at `hard`)."""
        store = self._state.store

        def agreed(v: PeerView) -> bool:
            return v.phase >= Phase.CLOSED and v.have <= set(store.have(rnd))

        return await self._agree(rnd, hard, lambda: bool(store.awaited(rnd)), agreed)

    async def _agree(
        self, rnd: int, hard: float, pending: Callable[[], bool], agreed: Callable[[PeerView], bool]
    ) -> bool:
        st = self._state
        while True:
            views = await self._sync.ask_all(rnd, by=hard)
            if not pending():
                return True
            live = [v for v in views.values() if v is None or v.reachable]
            if all(v is not None and agreed(v) for v in live):
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
            commitments=[self._commitment(rnd, s, p) for s, p in packets],
        )

    def _commitment(self, rnd: int, sender: str, payload: bytes) -> bytes:
        env = self._state.store.commitment(rnd, sender, hashlib.sha256(payload).digest())
        return b"" if env is None else env.encode()
