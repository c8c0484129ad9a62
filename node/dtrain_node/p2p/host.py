"""Gossip sync for DeMo rounds over py-libp2p, with a synchronous API for the training loop.

A `GossipNode` runs a libp2p host (GossipSub + two stream protocols) on a trio event loop in its
own thread. Per sync round it publishes this member's signed packet, collects every member's
packet until all are in or the deadline passes, re-requests missing packets from peers over a
stream protocol (anyone holding a signed packet relays it), then settles with its peers so that
honest nodes apply the same set (docs/protocol.md states the guarantee and its limits).

py-libp2p gossip drops silently (>= 1 MiB messages, per-sender rate limit, 32-deep queues), so
gossip is only the fast path: the sync protocol is what makes a round complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from libp2p import new_host
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from dtrain_node.errors import CheckpointUnavailable, GossipError
from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p import wire
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.pubsub import SafePubsub
from dtrain_node.p2p.rounds import MembersProvider, PayloadValidator, Phase, RoundStore, StoreLimits

log = logging.getLogger(__name__)

# valid and authentic, just not stored by this node: gossip still forwards them
_FORWARD_ANYWAY = frozenset({"duplicate", "late", "finished"})

PeerSpec = tuple[bytes, list[str]]  # (32-byte peer key, multiaddrs) as stored on chain


def topic_name(chain_id: int, contract: str, job_id: int) -> str:
    return f"/dtrain/{chain_id}/{to_checksum_address(contract)}/job/{job_id}/packets/1"


@dataclass(frozen=True)
class GossipConfig:
    data_dir: Path
    chain_id: int
    contract: str
    job_id: int
    listen: str = "/ip4/127.0.0.1/tcp/0"
    round_deadline_s: float = 10.0  # wait this long for all members' packets
    settle_s: float = 5.0  # at most this long after the deadline to agree with peers
    re_request_s: float = 0.25  # ask peers for missing packets this often
    relay_rounds: int = 4  # finished rounds kept (and served) for slow peers
    ahead_rounds: int = 2  # future rounds buffered (fast peers publish before we start)
    max_payload_bytes: int = 1 << 20
    chunk_bytes: int = 256 * 1024
    request_timeout_s: float = 3.0
    serve_rate_per_s: float = 40.0  # sync requests served per peer per second (token bucket)
    gossip_degree: int = 6
    gossip_rate_per_s: float = 200.0  # py-libp2p per-forwarder spam gate (its default: 10/s)
    heartbeat_s: int = 1
    max_file_bytes: int = 64 << 30
    file_timeout_s: float = 600.0
    drop_incoming_fraction: float = 0.0  # fault hook for tests: drop incoming packet chunks
    fault_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "contract", to_checksum_address(self.contract))
        if self.chain_id < 1 or self.job_id < 0:
            raise ValueError(f"chain_id {self.chain_id} must be >= 1, job_id {self.job_id} >= 0")
        Multiaddr(self.listen)  # raises on a malformed address
        for name in ("round_deadline_s", "re_request_s", "request_timeout_s", "file_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.settle_s < 0 or self.relay_rounds < 1 or self.ahead_rounds < 1:
            raise ValueError(
                f"settle_s {self.settle_s} >= 0, relay_rounds {self.relay_rounds} >= 1, "
                f"ahead_rounds {self.ahead_rounds} >= 1 required"
            )
        if not 1 <= self.chunk_bytes <= envmod.MAX_CHUNK:
            raise ValueError(f"chunk_bytes {self.chunk_bytes} not in [1, {envmod.MAX_CHUNK}]")
        if self.max_payload_bytes < 1 or self.max_file_bytes < 1:
            raise ValueError(
                f"max_payload_bytes {self.max_payload_bytes}, max_file_bytes "
                f"{self.max_file_bytes} must be >= 1"
            )
        if not 0.0 <= self.drop_incoming_fraction < 1.0:
            raise ValueError(f"drop_incoming_fraction {self.drop_incoming_fraction} not in [0, 1)")
        if self.serve_rate_per_s <= 0 or self.gossip_rate_per_s <= 0 or self.gossip_degree < 1:
            raise ValueError("serve_rate_per_s, gossip_rate_per_s > 0 and gossip_degree >= 1")


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


@dataclass
class _Metrics:
    bytes_in: Counter[str] = field(default_factory=Counter)  # per peer id
    bytes_out: Counter[str] = field(default_factory=Counter)
    total_in: int = 0
    total_out: int = 0
    relayed: int = 0  # envelopes we served to peers from sync requests
    recovered: int = 0  # envelopes we got from sync replies
    re_requests: int = 0
    rate_limited: int = 0
    settle_timeouts: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def add_in(self, peer: str, n: int) -> None:
        self.bytes_in[peer] += n
        self.total_in += n

    def add_out(self, peer: str, n: int) -> None:
        self.bytes_out[peer] += n
        self.total_out += n


@dataclass
class _PeerSync:
    reachable: bool
    phase: Phase = Phase.NOT_STARTED
    have: frozenset[tuple[str, bytes]] = frozenset()


class GossipNode:
    def __init__(
        self,
        config: GossipConfig,
        account: LocalAccount,
        members_provider: MembersProvider,
        validate_payload: PayloadValidator | None = None,
    ) -> None:
        self.config = config
        self.account = account
        self._kp = ident.key_pair(ident.load_or_create_seed(config.data_dir))
        self.peer_key = ident.peer_key_of(self._kp)
        self.peer_id = ident.peer_id_from_key(self.peer_key)
        self.topic = topic_name(config.chain_id, config.contract, config.job_id)
        limits = StoreLimits(config.max_payload_bytes, config.relay_rounds, config.ahead_rounds)
        self.store = RoundStore(
            config.chain_id,
            config.contract,
            config.job_id,
            members_provider,
            validate_payload,
            limits,
        )
        self._rng = random.Random(config.fault_seed)
        self._m = _Metrics()
        self._peers: dict[ID, bytes] = {}
        self._files: dict[bytes, Path] = {}
        self._buckets: dict[ID, tuple[float, float]] = {}
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: trio.Event | None = None
        self._changed = trio.Event()
        self._host: Any = None
        self._ps: SafePubsub | None = None
        self._gs: GossipSub | None = None
        self._nursery: trio.Nursery | None = None
        self._inflight: set[ID] = set()
        self.listen_addrs: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> GossipNode:
        if self._thread is not None:
            raise GossipError("start() called twice")
        self._thread = threading.Thread(target=self._thread_main, name="gossip", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise GossipError(f"libp2p host not ready after {timeout} s")
        if self._error is not None:
            raise GossipError(f"libp2p host failed to start: {self._error!r}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        t = self._thread
        if t is None or not t.is_alive():
            return
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        t.join(timeout)

    def __enter__(self) -> GossipNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # reported by start(); a crashed host must not hang callers
            self._error = e
            log.exception("gossip host crashed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._changed = trio.Event()
        cfg = self.config
        host = new_host(key_pair=self._kp)
        gs = GossipSub(
            protocols=[PROTOCOL_ID_V11],
            degree=cfg.gossip_degree,
            degree_low=max(1, cfg.gossip_degree - 2),
            degree_high=cfg.gossip_degree * 2,
            heartbeat_interval=cfg.heartbeat_s,
            max_messages_per_topic_per_second=cfg.gossip_rate_per_s,
            # every test peer shares 127.0.0.1; the IP-diversity rule would fight the mesh
            eclipse_protection_enabled=False,
        )
        ps = SafePubsub(host, gs)
        self._host, self._ps, self._gs = host, ps, gs
        async with (
            host.run(listen_addrs=[Multiaddr(cfg.listen)]),
            background_trio_service(ps),
            background_trio_service(gs),
        ):
            await ps.wait_until_ready()
            ps.set_topic_validator(self.topic, self._validate_gossip, False)
            sub = await ps.subscribe(self.topic)
            host.set_stream_handler(TProtocol(wire.SYNC_PROTOCOL), self._serve_sync)
            host.set_stream_handler(TProtocol(wire.CKPT_PROTOCOL), self._serve_file)
            self.listen_addrs = [str(a).split("/p2p/")[0] for a in host.get_transport_addrs()]
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._drain, sub)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    async def _drain(self, sub: Any) -> None:
        # packets are stored by the validator; the subscription queue only needs emptying
        while True:
            await sub.get()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._token is None or self._thread is None or not self._thread.is_alive():
            raise GossipError("gossip node is not running")
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._token is None or self._thread is None or not self._thread.is_alive():
            raise GossipError("gossip node is not running")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- peers ------------------------------------------------------------------------------
    def connect(self, peers: list[PeerSpec], timeout: float = 10.0) -> list[bytes]:
        """Dial peers by (peer_key, multiaddrs without /p2p); return the keys now connected.

        Waits (up to timeout) until connected peers have subscribed to the job topic, so the
        first round's gossip has somewhere to go. Unreachable peers are skipped, not fatal.
        """
        return self._call(self._connect, peers, timeout)

    async def _connect(self, peers: list[PeerSpec], timeout: float) -> list[bytes]:
        infos = []
        for key, addrs in peers:
            if key == self.peer_key:
                continue
            info = ident.peer_info(key, addrs)
            self._peers[info.peer_id] = key
            # remembered so that sync requests can (re)dial the peer on demand later
            self._host.get_peerstore().add_addrs(info.peer_id, info.addrs, 24 * 3600)
            infos.append((key, info))
        net = self._host.get_network()

        async def dial(key: bytes, info: Any) -> None:
            if key < self.peer_key:
                # The larger key dials. When both sides dial at once py-libp2p keeps one
                # connection and resets streams on the other (seen with 8 nodes).
                with trio.move_on_after(timeout / 2):
                    while not net.get_connections(info.peer_id):
                        await trio.sleep(0.05)
            if net.get_connections(info.peer_id):
                return
            try:
                with trio.fail_after(timeout):
                    await self._host.connect(info)
            except Exception as e:
                log.warning("cannot connect to %s: %r", info.peer_id, e)

        async with trio.open_nursery() as nursery:
            for key, info in infos:
                nursery.start_soon(dial, key, info)
        ok = [key for key, info in infos if net.get_connections(info.peer_id)]
        assert self._ps is not None
        with trio.move_on_after(timeout):
            want = {ident.peer_id_from_key(k) for k in ok}
            while not want <= set(self._ps.peer_topics.get(self.topic, ())):
                await trio.sleep(0.05)
        return ok

    def set_epoch(self, epoch: int) -> None:
        """Start an epoch: read its members from the provider, forget the last epoch's rounds."""
        self._call_sync(self.store.set_epoch, epoch)

    # -- rounds -----------------------------------------------------------------------------
    def collect_round(
        self, rnd: int, payload: bytes, deadline_s: float | None = None
    ) -> RoundResult:
        """Publish our packet for round `rnd` and collect every member's (docs/protocol.md 4.2).

        payload b"" publishes nothing. Our own payload passes the same validation as peers'
        (EnvelopeError if it fails). deadline_s overrides config.round_deadline_s.
        """
        return self._call(self._collect, rnd, payload, deadline_s)

    async def _collect(self, rnd: int, payload: bytes, deadline_s: float | None) -> RoundResult:
        cfg, store, ps = self.config, self.store, self._ps
        assert ps is not None
        if store.epoch is None:
            raise GossipError("set_epoch() before collect_round()")
        t0 = time.monotonic()
        in0, out0, rr0 = self._m.total_in, self._m.total_out, self._m.re_requests
        store.begin(rnd)
        # an empty payload publishes nothing: this node only collects (it will be missing)
        envs = []
        if payload:
            envs = envmod.seal(
                self.account,
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
            n_mesh = len(self._gs.mesh.get(self.topic, ())) if self._gs is not None else 0
            for e in envs:
                data = e.encode()
                await ps.publish(self.topic, data)
                self._m.add_out("gossip", len(data) * max(1, n_mesh))
        self._notify()
        deadline = t0 + (cfg.round_deadline_s if deadline_s is None else deadline_s)
        # pull interval doubles while we wait (a slow member is the common case, not loss),
        # capped at 8x so a lost packet still comes back within ~2 s by default
        interval = cfg.re_request_s
        next_pull = t0 + interval
        while store.missing(rnd) and time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_pull:
                await self._sync_all(rnd)
                next_pull = time.monotonic() + interval
                interval = min(interval * 2, cfg.re_request_s * 8)
                continue
            with trio.move_on_at(min(next_pull, deadline)) as waited:
                await self._changed.wait()
            if not waited.cancelled_caught:
                # progress: packets are flowing, so a straggler is likely lost, not late
                interval = cfg.re_request_s
                next_pull = min(next_pull, time.monotonic() + interval)
        settled = True
        if store.missing(rnd):
            settled = await self._settle(rnd, deadline + cfg.settle_s)
        packets = store.finish(rnd)
        got = {s for s, _ in packets}
        missing = [m for m in store.members if m not in got]
        latency = time.monotonic() - t0
        if not settled:
            self._m.settle_timeouts += 1
        rec = {
            "round": rnd,
            "latency_s": latency,
            "bytes_in": self._m.total_in - in0,
            "bytes_out": self._m.total_out - out0,
            "missing": missing,
            "settled": settled,
        }
        self._m.rounds.append(rec)
        del self._m.rounds[:-1000]
        return RoundResult(
            round=rnd,
            packets=packets,
            missing=missing,
            latency_s=latency,
            bytes_in=rec["bytes_in"],
            bytes_out=rec["bytes_out"],
            settled=settled,
            re_requests=self._m.re_requests - rr0,
        )

    async def _settle(self, rnd: int, hard: float) -> bool:
        """After the deadline: accept only relays, and finish once every reachable peer has
        closed the round and we hold every packet any of them holds (or at `hard`)."""
        store = self.store
        store.close(rnd)
        while True:
            views = await self._sync_all(rnd)
            mine = set(store.have(rnd))
            if not store.missing(rnd):
                return True
            live = [v for v in views.values() if v is None or v.reachable]
            if all(v is not None and v.phase >= Phase.CLOSED and v.have <= mine for v in live):
                return True
            if time.monotonic() >= hard:
                return False
            with trio.move_on_at(min(hard, time.monotonic() + self.config.re_request_s)):
                await self._changed.wait()

    async def _sync_all(self, rnd: int) -> dict[ID, _PeerSync | None]:
        """One sync request to every known peer, concurrently. None: no answer in time.

        The requests run in the host's long-lived nursery and we wait at most
        request_timeout_s for them: py-libp2p cleans up failed streams under a shielded cancel
        scope, which can hang on a half-dead connection where no timeout of ours reaches it.
        A peer whose previous request is still stuck is not asked again until it returns.
        """
        out: dict[ID, _PeerSync | None] = {}
        pending: set[ID] = set()
        done = trio.Event()

        async def one(pid: ID) -> None:
            try:
                out[pid] = await self._sync_one(pid, rnd)
            finally:
                self._inflight.discard(pid)
                pending.discard(pid)
                if not pending:
                    done.set()

        for pid in list(self._peers):
            if pid in self._inflight:
                out[pid] = None
                continue
            pending.add(pid)
            self._inflight.add(pid)
        assert self._nursery is not None
        for pid in list(pending):
            self._nursery.start_soon(one, pid)
        if pending:
            with trio.move_on_after(self.config.request_timeout_s + 0.5):
                await done.wait()
        return {pid: out.get(pid) for pid in self._peers}

    async def _sync_one(self, pid: ID, rnd: int) -> _PeerSync | None:
        store, cfg, peer = self.store, self.config, pid.to_base58()
        assert store.epoch is not None
        self._m.re_requests += 1
        try:
            with trio.fail_after(cfg.request_timeout_s):
                stream = await self._host.new_stream(pid, [TProtocol(wire.SYNC_PROTOCOL)])
        except trio.TooSlowError:
            store.dropped["sync_timeout"] += 1
            return None  # slow is not dead: keep waiting for this peer
        except Exception:
            if self._host.get_network().get_connections(pid):
                return None  # still connected: a transient failure
            # a dead or unreachable peer cannot hold back the round (docs/protocol.md)
            return _PeerSync(reachable=False)
        try:
            with trio.fail_after(cfg.request_timeout_s):
                req = wire.SyncRequest(cfg.job_id, store.epoch, rnd, tuple(store.have(rnd)))
                body = req.encode()
                await wire.write_frame(stream, body)
                self._m.add_out(peer, len(body) + 4)
                max_head = 64 + 52 * 4 * max(1, len(store.members))
                raw = await wire.read_frame(stream, max_head)
                self._m.add_in(peer, len(raw) + 4)
                head = wire.decode_sync_reply(raw)
                if head.status != wire.SYNC_OK:
                    if head.status == wire.SYNC_BUSY:
                        return None
                    return _PeerSync(reachable=False)
                limit = envmod.OVERHEAD + envmod.MAX_CHUNK
                for _ in range(head.count):
                    data = await wire.read_frame(stream, limit)
                    self._m.add_in(peer, len(data) + 4)
                    self._offer(data, relayed=True)
                return _PeerSync(True, Phase(head.phase), frozenset(head.have))
        except wire.WireError as e:
            store.dropped[f"sync_{e.reason}"] += 1
            return None
        except trio.TooSlowError:
            store.dropped["sync_timeout"] += 1
            return None
        except Exception as e:
            log.debug("sync with %s failed: %r", peer, e)
            return None
        finally:
            await _close(stream)

    def _offer(self, data: bytes, relayed: bool) -> bool:
        """Store one incoming envelope. True if gossip should forward it.

        Valid envelopes we do not store (already held, round closed or finished, or lost to the
        fault hook) are still forwarded: they are authentic, and peers whose mesh path runs
        through us may need them. Everything that fails a check is dropped and counted.
        """
        if self.config.drop_incoming_fraction and (
            self._rng.random() < self.config.drop_incoming_fraction
        ):
            self.store.dropped["fault_injected"] += 1
            return True
        try:
            self.store.offer(envmod.decode(data), relayed=relayed)
        except EnvelopeError as e:
            self.store.dropped[e.reason] += 1
            return e.reason in _FORWARD_ANYWAY
        if relayed:
            self._m.recovered += 1
        self._notify()
        return True

    def _validate_gossip(self, forwarder: ID, msg: Any) -> bool:
        """Topic validator: runs before py-libp2p forwards a message; False drops it."""
        if forwarder == self.peer_id:
            return True  # our own publish (already stored): let it go out
        self._m.add_in(forwarder.to_base58(), len(msg.data))
        return self._offer(msg.data, relayed=False)

    async def _serve_sync(self, stream: Any) -> None:
        store, cfg = self.store, self.config
        pid = stream.muxed_conn.peer_id
        peer = pid.to_base58()
        try:
            with trio.fail_after(cfg.request_timeout_s):
                data = await wire.read_frame(stream, wire.MAX_REQUEST)
                self._m.add_in(peer, len(data) + 4)
                req = wire.decode_sync_request(data)
                if not self._take_token(pid):
                    self._m.rate_limited += 1
                    await wire.write_frame(
                        stream, wire.SyncReply(wire.SYNC_BUSY, 0, (), 0).encode()
                    )
                    return
                if req.job_id != cfg.job_id or req.epoch != store.epoch:
                    reply = wire.SyncReply(wire.SYNC_WRONG_JOB, 0, (), 0)
                    await wire.write_frame(stream, reply.encode())
                    return
                envs = store.envelopes_for(req.round, set(req.have))
                phase = store.phase(req.round)
                have = tuple(store.have(req.round))
                head = wire.SyncReply(wire.SYNC_OK, int(phase), have, len(envs)).encode()
                await wire.write_frame(stream, head)
                sent = len(head) + 4
                for e in envs:
                    data = e.encode()
                    await wire.write_frame(stream, data)
                    sent += len(data) + 4
                self._m.add_out(peer, sent)
                self._m.relayed += len(envs)
        except wire.WireError as e:
            store.dropped[f"sync_{e.reason}"] += 1
        except trio.TooSlowError:
            store.dropped["sync_timeout"] += 1
        except Exception as e:
            log.debug("serving sync to %s failed: %r", peer, e)
        finally:
            await _close(stream)

    def _take_token(self, pid: ID) -> bool:
        rate = self.config.serve_rate_per_s
        now = time.monotonic()
        tokens, last = self._buckets.get(pid, (rate, now))
        tokens = min(rate, tokens + (now - last) * rate)
        if tokens < 1:
            self._buckets[pid] = (tokens, now)
            return False
        self._buckets[pid] = (tokens - 1, now)
        return True

    def participation(self) -> dict[str, int]:
        """Rounds of the current epoch in which each member's packet was applied."""
        return self._call_sync(lambda: dict(self.store.participation))

    def metrics(self) -> dict[str, Any]:
        def snap() -> dict[str, Any]:
            m = self._m
            lat = sorted(r["latency_s"] for r in m.rounds)
            return {
                "bytes_in_total": m.total_in,
                "bytes_out_total": m.total_out,
                "bytes_in_per_peer": dict(m.bytes_in),
                "bytes_out_per_peer": dict(m.bytes_out),
                "rounds": [dict(r) for r in m.rounds],
                "round_latency_median_s": lat[len(lat) // 2] if lat else None,
                "relayed": m.relayed,
                "recovered": m.recovered,
                "re_requests": m.re_requests,
                "rate_limited": m.rate_limited,
                "settle_timeouts": m.settle_timeouts,
                "dropped": dict(self.store.dropped),
                "pubsub_rpc_errors": dict(self._ps.rpc_errors) if self._ps is not None else {},
                "equivocations": list(self.store.equivocations),
                "missing_total": sum(len(r["missing"]) for r in m.rounds),
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }

        return self._call_sync(snap)

    # -- checkpoint transfer ----------------------------------------------------------------
    def serve_file(self, sha256_hex: str, path: Path | str) -> None:
        """Serve a finalized file by its sha256 (checked now, and by every fetcher)."""
        sha = bytes.fromhex(sha256_hex)
        path = Path(path)
        if len(sha) != 32:
            raise ValueError(f"sha256 must be 32 bytes, got {len(sha)}")
        got = _sha256_file(path)
        if got != sha:
            raise ValueError(f"{path} has sha256 {got.hex()}, not {sha256_hex}")
        self._call_sync(self._files.__setitem__, sha, path)

    async def _serve_file(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        try:
            with trio.fail_after(self.config.request_timeout_s):
                sha = wire.decode_ckpt_request(await wire.read_frame(stream, 64))
            path = self._files.get(sha)
            if path is None or not path.exists():
                await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_NOT_FOUND, 0))
                return
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_OK, size))
                left = size
                with trio.fail_after(self.config.file_timeout_s):
                    while left > 0:
                        block = f.read(min(wire.CKPT_CHUNK, left))
                        if not block:
                            break  # file shrank: the fetcher sees a short transfer
                        await wire.write_frame(stream, block)
                        left -= len(block)
                        self._m.add_out(peer, len(block) + 4)
        except Exception as e:
            log.debug("serving a file to %s failed: %r", peer, e)
        finally:
            await _close(stream)

    def fetch_file(self, sha256_hex: str, peers: list[PeerSpec], dest: Path | str) -> Path:
        """Fetch a file by sha256 from the first peer that delivers it intact.

        The bytes go to a temporary file next to dest, are hashed as they arrive and are
        renamed onto dest only if the sha256 matches. Raises CheckpointUnavailable otherwise.
        """
        sha = bytes.fromhex(sha256_hex)
        if len(sha) != 32:
            raise ValueError(f"sha256 must be 32 bytes, got {len(sha)}")
        return self._call(self._fetch, sha, peers, Path(dest))

    async def _fetch(self, sha: bytes, peers: list[PeerSpec], dest: Path) -> Path:
        errors = []
        for key, addrs in peers:
            info = ident.peer_info(key, addrs)
            tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
            try:
                with trio.fail_after(self.config.file_timeout_s):
                    await self._host.connect(info)
                    await self._fetch_from(info.peer_id, sha, tmp)
                os.replace(tmp, dest)
                return dest
            except Exception as e:
                errors.append(f"{info.peer_id}: {e}")
                self.store.dropped["file_rejected"] += 1
            finally:
                tmp.unlink(missing_ok=True)
        raise CheckpointUnavailable(
            f"no peer delivered {sha.hex()}: {'; '.join(errors) or 'no peers'}"
        )

    async def _fetch_from(self, pid: ID, sha: bytes, tmp: Path) -> None:
        stream = await self._host.new_stream(pid, [TProtocol(wire.CKPT_PROTOCOL)])
        peer = pid.to_base58()
        try:
            await wire.write_frame(stream, wire.encode_ckpt_request(sha))
            status, size = wire.decode_ckpt_reply(await wire.read_frame(stream, 64))
            if status != wire.CKPT_OK:
                raise CheckpointUnavailable(f"peer answered status {status}")
            if size > self.config.max_file_bytes:
                raise CheckpointUnavailable(f"{size} bytes > limit {self.config.max_file_bytes}")
            h, got = hashlib.sha256(), 0
            tmp.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                while got < size:
                    block = await wire.read_frame(stream, wire.CKPT_CHUNK)
                    if not block or got + len(block) > size:
                        raise CheckpointUnavailable(f"bad block after {got} of {size} bytes")
                    h.update(block)
                    f.write(block)
                    got += len(block)
                    self._m.add_in(peer, len(block) + 4)
            if h.digest() != sha:
                raise CheckpointUnavailable(f"sha256 {h.hexdigest()} != expected {sha.hex()}")
        finally:
            await _close(stream)


async def _close(stream: Any) -> None:
    with contextlib.suppress(Exception):
        await stream.close()


def _sha256_file(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.digest()
