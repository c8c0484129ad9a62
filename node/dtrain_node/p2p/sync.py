"""The sync protocol `/dtrain/sync/1.0.0` (docs/protocol.md 4.3): asking peers for the packets of
a round that we lack, and answering such requests, rate-limited per peer.

Gossip drops silently, so these requests are what makes a round complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p import wire
from dtrain_node.p2p.rounds import Phase, RoundStore
from dtrain_node.p2p.state import HostState

log = logging.getLogger(__name__)

# (encoded envelope, relayed, the member who signed the sync reply or None) -> forward it?
Accept = Callable[[bytes, bool, str | None], bool]


@dataclass
class PeerView:
    """What one peer told us about a round."""

    reachable: bool
    phase: Phase = Phase.NOT_STARTED
    have: frozenset[tuple[str, bytes]] = frozenset()  # complete packets it holds
    commits: frozenset[tuple[str, bytes]] = frozenset()  # commitments it holds
    signer: str | None = None  # who signed the reply


@contextlib.contextmanager
def _failures_counted(store: RoundStore, what: str, peer: str) -> Iterator[None]:
    # a failed exchange with one peer is routine (slow, gone, hostile): count it, never raise
    try:
        yield
    except wire.WireError as e:
        store.dropped[f"sync_{e.reason}"] += 1
    except trio.TooSlowError:
        store.dropped["sync_timeout"] += 1
    except Exception as e:
        log.debug("%s %s failed: %r", what, peer, e)


class SyncClient:
    def __init__(self, state: HostState, accept: Accept) -> None:
        self._state = state
        self._accept = accept
        self._inflight: set[ID] = set()

    async def ask_all(
        self, rnd: int, only: set[ID] | None = None, by: float | None = None
    ) -> dict[ID, PeerView | None]:
        """One sync request to every known peer, concurrently. None: no answer in time.

        The requests run in the host's long-lived nursery and we wait at most
        request_timeout_s for them: py-libp2p cleans up failed streams under a shielded cancel
        scope, which can hang on a half-dead connection where no timeout of ours reaches it.
        A peer whose previous request is still stuck is not asked again until it returns.
        only: ask these peers only (the answer still names every known peer).
        by: wait only until this time.monotonic() (or one re-request interval, when it is
        that close or past: a step's last look still hears the peers that answer at once),
        however long the request timeout: a peer that holds our request open (slow or
        stalling on purpose) cannot stretch a round past its own deadline; its request goes
        on and its answer counts when it comes.
        """
        st = self._state
        out: dict[ID, PeerView | None] = {}
        asked = st.peers if only is None else only
        pending = {pid for pid in asked if pid in st.peers and pid not in self._inflight}
        self._inflight |= pending
        done = trio.Event()

        async def one(pid: ID) -> None:
            try:
                out[pid] = await self._ask(pid, rnd)
            finally:
                self._inflight.discard(pid)
                pending.discard(pid)
                if not pending:
                    done.set()

        assert st.nursery is not None
        for pid in list(pending):
            st.nursery.start_soon(one, pid)
        if pending:
            wait = st.config.request_timeout_s + 0.5
            if by is not None:
                wait = min(wait, max(by - time.monotonic(), st.config.re_request_s))
            with trio.move_on_after(wait):
                await done.wait()
        return {pid: out.get(pid) for pid in st.peers}

    async def _ask(self, pid: ID, rnd: int) -> PeerView | None:
        st = self._state
        st.metrics.re_requests += 1
        try:
            with trio.fail_after(st.config.request_timeout_s):
                stream = await st.host.new_stream(pid, [TProtocol(wire.SYNC_PROTOCOL)])
        except trio.TooSlowError:
            st.store.dropped["sync_timeout"] += 1
            return None  # slow is not dead: keep waiting for this peer
        except Exception:
            if st.host.get_network().get_connections(pid):
                return None  # still connected: a transient failure
            # a dead or unreachable peer cannot hold back the round (docs/protocol.md)
            return PeerView(reachable=False)
        peer = pid.to_base58()
        try:
            with (
                _failures_counted(st.store, "sync with", peer),
                trio.fail_after(st.config.request_timeout_s),
            ):
                return await self._exchange(stream, peer, rnd)
            return None
        finally:
            await wire.close_quietly(stream)

    async def _exchange(self, stream: Any, peer: str, rnd: int) -> PeerView | None:
        st, store = self._state, self._state.store
        assert store.epoch is not None
        nonce = secrets.token_bytes(16)
        held, commits = tuple(store.have(rnd)), tuple(store.commitments(rnd))
        body = wire.SyncRequest(st.config.job_id, store.epoch, rnd, held, commits, nonce).encode()
        await wire.write_frame(stream, body)
        st.metrics.add_out(peer, len(body) + 4)
        max_head = 128 + 52 * 8 * max(1, len(store.members))
        raw = await wire.read_frame(stream, max_head)
        st.metrics.add_in(peer, len(raw) + 4)
        head = wire.decode_sync_reply(raw)
        if head.status != wire.SYNC_OK:
            return None if head.status == wire.SYNC_BUSY else PeerView(reachable=False)
        signer = head.signer(nonce)
        for _ in range(head.count):
            data = await wire.read_frame(stream, envmod.OVERHEAD + envmod.MAX_CHUNK)
            st.metrics.add_in(peer, len(data) + 4)
            self._accept(data, True, signer)
        views = (frozenset(head.have), frozenset(head.commits))
        return PeerView(True, Phase(head.phase), *views, signer=signer)


class TokenBuckets:
    """One token bucket per peer: `rate` tokens a second, holding at most `rate`."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._buckets: dict[ID, tuple[float, float]] = {}  # peer -> (tokens, last refill)

    def take(self, pid: ID) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.get(pid, (self._rate, now))
        tokens = min(self._rate, tokens + (now - last) * self._rate)
        if tokens < 1:
            self._buckets[pid] = (tokens, now)
            return False
        self._buckets[pid] = (tokens - 1, now)
        return True


class SyncServer:
    def __init__(self, state: HostState) -> None:
        self._state = state
        self._buckets = TokenBuckets(state.config.serve_rate_per_s)

    async def serve(self, stream: Any) -> None:
        """Stream handler: answer one sync request."""
        st = self._state
        pid = stream.muxed_conn.peer_id
        try:
            with (
                _failures_counted(st.store, "serving sync to", pid.to_base58()),
                trio.fail_after(st.config.request_timeout_s),
            ):
                await self._answer(stream, pid)
        finally:
            await wire.close_quietly(stream)

    async def _answer(self, stream: Any, pid: ID) -> None:
        st, store, peer = self._state, self._state.store, pid.to_base58()
        data = await wire.read_frame(stream, wire.MAX_REQUEST)
        st.metrics.add_in(peer, len(data) + 4)
        req = wire.decode_sync_request(data)
        if not self._buckets.take(pid):
            st.metrics.rate_limited += 1
            await wire.write_frame(
                stream, self._signed(wire.SyncReply(wire.SYNC_BUSY, 0, (), 0), req)
            )
            return
        if req.job_id != st.config.job_id or req.epoch != store.epoch:
            reply = wire.SyncReply(wire.SYNC_WRONG_JOB, 0, (), 0)
            await wire.write_frame(stream, self._signed(reply, req))
            return
        if st.config.stall_sync:  # fault: hold the request open, answer nothing
            st.metrics.stalled_sync += 1
            await trio.sleep(st.config.request_timeout_s * 0.95)  # the asker's timeout, about
            return
        rnd = req.round
        envs = store.commits_for(rnd, set(req.commits)) + store.envelopes_for(rnd, set(req.have))
        have, commits = tuple(store.have(rnd)), tuple(store.commitments(rnd))
        # fault `reveal_to_one_rounds`: late (once our deadline passed) and to one peer only
        hidden = st.hidden.get(rnd) if store.phase(rnd) >= Phase.CLOSED else None
        if hidden and rnd not in st.favored:
            st.favored[rnd] = pid
            log.warning("fault: round %d revealed to peer %s only", rnd, peer)
        if hidden and st.favored[rnd] == pid:
            ours = (hidden[0].sender, hidden[0].payload_sha256)
            envs += [] if ours in req.have else hidden
            have = tuple(sorted({*have, ours}))
        reply = wire.SyncReply(wire.SYNC_OK, int(store.phase(rnd)), have, len(envs), commits)
        head = self._signed(reply, req)
        await wire.write_frame(stream, head)
        sent = len(head) + 4
        for e in envs:
            data = e.encode()
            await wire.write_frame(stream, data)
            sent += len(data) + 4
        st.metrics.add_out(peer, sent)
        st.metrics.relayed += len(envs)

    def _signed(self, reply: wire.SyncReply, req: wire.SyncRequest) -> bytes:
        """The reply, signed by this node's operator key (so relays name their relayer)."""
        sig = self._state.account.unsafe_sign_hash(reply.signing_digest(req.nonce)).signature
        return dataclasses.replace(reply, signature=bytes(sig)).encode()
