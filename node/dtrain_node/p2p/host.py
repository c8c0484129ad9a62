"""Gossip sync for DeMo rounds over py-libp2p, with a synchronous API for the training loop.

A `GossipNode` runs a libp2p host (GossipSub + two stream protocols) on a trio event loop in its
own thread; its methods hand work to that thread and wait for the answer. The work itself lives
next door: `dial` (connecting to members), `collect` (one sync round and its settle), `sync`
(re-requests of missing packets, client and server), `intake` (every incoming envelope),
`files` (checkpoint transfer) and `metrics`; `state` is what they share and `config` what
they are configured with.

py-libp2p gossip drops silently (>= 1 MiB messages, per-sender rate limit, 32-deep queues), so
gossip is only the fast path: the sync protocol is what makes a round complete.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from libp2p import new_host
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from dtrain_node.errors import CheckpointUnavailable, GossipError
from dtrain_node.p2p import dial, files, wire
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p.collect import RoundCollector, RoundResult
from dtrain_node.p2p.config import GossipConfig, PeerSpec
from dtrain_node.p2p.intake import Intake
from dtrain_node.p2p.looper import Looper
from dtrain_node.p2p.noteboard import NOTES_PROTOCOL, NoteBoard
from dtrain_node.p2p.pubsub import SafePubsub
from dtrain_node.p2p.receipts import RECEIPT_PROTOCOL, ReceiptBox, send_receipt
from dtrain_node.p2p.reconcile import Reconciler, Transcript
from dtrain_node.p2p.rounds import PayloadValidator, RoundStore, StoreLimits
from dtrain_node.p2p.state import HostState
from dtrain_node.p2p.sync import SyncClient, SyncServer

__all__ = [
    "GossipConfig",
    "GossipError",
    "GossipNode",
    "PeerSpec",
    "RoundResult",
    "Transcript",
    "topic_name",
]

log = logging.getLogger(__name__)


def topic_name(chain_id: int, contract: str, job_id: int) -> str:
    return f"/dtrain/{chain_id}/{to_checksum_address(contract)}/job/{job_id}/packets/2"


class GossipNode(Looper):
    """The libp2p host of one member; every method is synchronous and thread-safe."""

    thread_name = "gossip"

    def __init__(self, config: GossipConfig, account: LocalAccount) -> None:
        super().__init__()
        self.config = config
        self.account = account
        self._kp = ident.key_pair(ident.load_or_create_seed(config.data_dir))
        self.peer_key = ident.peer_key_of(self._kp)
        self.peer_id = ident.peer_id_from_key(self.peer_key)
        self.topic = topic_name(config.chain_id, config.contract, config.job_id)
        limits = StoreLimits(config.max_payload_bytes, config.relay_rounds, config.ahead_rounds)
        self.store = RoundStore(config.chain_id, config.contract, config.job_id, limits)
        st = HostState(config, account, self.peer_key, self.peer_id, self.topic, self.store)
        self._state = st
        self._intake = Intake(st)
        self._sync = SyncClient(st, self._intake.accept)
        self._sync_server = SyncServer(st)
        self._rounds = RoundCollector(st, self._sync)
        self._reconciler = Reconciler(st, self._sync)
        self._files = files.FileService(st)
        self.notes = NoteBoard(st)
        self.receipts = ReceiptBox(config.chain_id, config.contract)
        self.listen_addrs: list[str] = []

    @property
    def settle_s(self) -> float:
        """Longest time a round may take after its deadline to agree with peers."""
        return self.config.settle_s

    async def _run(self) -> None:
        st = self._state
        st.changed = trio.Event()
        st.host = new_host(key_pair=self._kp)
        st.gossipsub = _gossipsub(self.config)
        st.pubsub = SafePubsub(st.host, st.gossipsub)
        async with (
            st.host.run(listen_addrs=[Multiaddr(self.config.listen)]),
            background_trio_service(st.pubsub),
            background_trio_service(st.gossipsub),
        ):
            sub = await self._subscribe(st.pubsub)
            st.pubsub.set_topic_validator(self.notes.topic, self.notes.validate_gossip, False)
            progress = await st.pubsub.subscribe(self.notes.topic)
            self.listen_addrs = [str(a).split("/p2p/")[0] for a in st.host.get_transport_addrs()]
            async with trio.open_nursery() as nursery:
                st.nursery = nursery
                nursery.start_soon(_drain, sub)
                nursery.start_soon(_drain, progress)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    async def _subscribe(self, ps: SafePubsub) -> Any:
        await ps.wait_until_ready()
        ps.set_topic_validator(self.topic, self._intake.validate_gossip, False)
        sub = await ps.subscribe(self.topic)
        host = self._state.host
        host.set_stream_handler(TProtocol(wire.SYNC_PROTOCOL), self._sync_server.serve)
        host.set_stream_handler(TProtocol(wire.CKPT_PROTOCOL), self._files.serve)
        host.set_stream_handler(TProtocol(NOTES_PROTOCOL), self.notes.serve)
        host.set_stream_handler(TProtocol(RECEIPT_PROTOCOL), self.receipts.serve)
        return sub

    # -- peers and rounds --------------------------------------------------------------------
    def connect(self, peers: list[PeerSpec], timeout: float = 10.0) -> list[bytes]:
        """Dial peers by (peer_key, multiaddrs without /p2p); return the keys now connected.

        Waits (up to timeout) until connected peers have subscribed to the job topic, so the
        first round's gossip has somewhere to go. Unreachable peers are skipped, not fatal.
        """
        return self._call(dial.connect, self._state, peers, timeout)

    def set_epoch(
        self, epoch: int, members: Sequence[str], validate: PayloadValidator | None
    ) -> None:
        """Start accepting packets of this epoch attempt from these members only.

        validate raises on a payload that must not be relayed (None: no payload check). The
        last attempt's rounds are forgotten.
        """
        self._call_sync(self.store.set_epoch, epoch, members, validate)

    def collect_round(
        self,
        rnd: int,
        payload: bytes,
        deadline_s: float | None = None,
        patience_s: float | None = None,
        state: bytes = b"",
    ) -> RoundResult:
        """Publish our packet for round `rnd` and collect every member's (docs/protocol.md 4.2).

        payload b"" publishes nothing. Our own payload passes the same validation as peers'
        (EnvelopeError if it fails). deadline_s overrides config.round_deadline_s;
        patience_s (longer) is how long a live member that has not begun the round is waited
        for (None: deadline_s). state: our private-state digest at the round's start (32
        bytes), signed into our commitment (b"": none; docs/protocol.md 4.6).
        """
        return self._call(self._rounds.collect, rnd, payload, deadline_s, patience_s, state)

    def reconcile(self, rounds: int, deadline_s: float) -> Transcript:
        """After the last round: agree with the members on the epoch's transcript (rounds
        0..rounds-1) and return every round's canonical packets (docs/protocol.md 4.5).

        Waits until every live peer finished all rounds holding nothing we lack, or
        deadline_s. No round can be collected afterwards in this epoch attempt.
        """
        if self.store.epoch is None:
            raise GossipError("set_epoch() before reconcile()")
        return self._call(self._reconciler.reconcile, rounds, deadline_s)

    def participation(self) -> dict[str, int]:
        """Rounds of the current epoch in which each member's packet was applied."""
        return self._call_sync(lambda: dict(self.store.participation))

    def metrics(self) -> dict[str, Any]:
        st = self._state

        def snapshot() -> dict[str, Any]:
            out = st.metrics.snapshot(st.store, st.pubsub)
            out["progress_dropped"] = dict(self.notes.dropped)
            out["progress_relayed"] = self.notes.relayed
            return out

        return self._call_sync(snapshot)

    # -- signed notes (docs/protocol.md 4.8) -------------------------------------------------
    def publish_progress(self, body: dict[str, Any]) -> None:
        """Sign and publish our round's progress on the job's progress topic. Returns at once:
        the signing and the publish run on the host's thread, never the caller's."""
        st = self._state
        if st.nursery is None:
            return
        self._call_sync(st.nursery.start_soon, self.notes.publish_progress, body)

    def refuse(self, job_id: int, reason: str, detail: str) -> None:
        """Sign our refusal of `job_id` (a key of notes.REASONS, and the details) and serve it
        to whoever asks over the notes protocol."""
        self._call_sync(self.notes.refuse, job_id, reason, detail)

    # -- checkpoint transfer ----------------------------------------------------------------
    def serve_file(self, sha256_hex: str, path: Path | str) -> None:
        """Serve a finalized file by its sha256 (checked now, and by every fetcher)."""
        sha, path = files.sha256_bytes(sha256_hex), Path(path)
        got = files.sha256_file(path)
        if got != sha:
            raise ValueError(f"{path} has sha256 {got.hex()}, not {sha256_hex}")
        self._call_sync(self._files.add, sha, path)

    def fetch_file(
        self,
        sha256_hex: str,
        peers: list[PeerSpec],
        dest: Path | str,
        timeout_s: float | None = None,
        race: bool = False,
        max_bytes: int | None = None,
    ) -> Path:
        """Fetch a file by sha256 from the first peer that delivers it intact: asking the
        peers in order, or all at once (`race`), all within `timeout_s` (None: each peer's own
        timeouts). A peer offering more than `max_bytes` (None: the host's `max_file_bytes`)
        is refused before a byte of the file is read.

        The bytes go to a temporary file next to dest, are hashed as they arrive and are
        renamed onto dest only if the sha256 matches. Raises CheckpointUnavailable otherwise.
        """
        sha = files.sha256_bytes(sha256_hex)
        fetch = self._files.race if race else self._files.fetch
        get = functools.partial(fetch, max_bytes=max_bytes)
        if timeout_s is None:
            return self._call(get, sha, peers, Path(dest))

        async def bounded() -> Path:
            with trio.move_on_after(max(0.0, timeout_s)):
                return await get(sha, peers, Path(dest))
            raise CheckpointUnavailable(f"no peer delivered {sha256_hex} in {timeout_s:.0f} s")

        return self._call(bounded)

    # -- the caller's receipt for the final checkpoint (receipts.py) ---------------------------
    def expect_receipt(self, job_id: int, caller: str, checkpoint: bytes) -> None:
        """Wait for `caller`'s receipt of `checkpoint` (see `receipt_confirmed`)."""
        self._call_sync(self.receipts.expect, job_id, caller, checkpoint)

    def receipt_confirmed(self, job_id: int) -> bool:
        return self._call_sync(lambda: job_id in self.receipts.confirmed)

    def send_receipt(self, data: bytes, peers: list[PeerSpec], timeout: float = 15.0) -> int:
        """Hand a receipt to each peer in turn; how many accepted it."""

        async def send() -> int:
            return sum([await send_receipt(self._state.host, p, data, timeout) for p in peers])

        return self._call(send)


def _gossipsub(cfg: GossipConfig) -> GossipSub:
    return GossipSub(
        protocols=[PROTOCOL_ID_V11],
        degree=cfg.gossip_degree,
        degree_low=max(1, cfg.gossip_degree - 2),
        degree_high=cfg.gossip_degree * 2,
        heartbeat_interval=cfg.heartbeat_s,
        max_messages_per_topic_per_second=cfg.gossip_rate_per_s,
        # every test peer shares 127.0.0.1; the IP-diversity rule would fight the mesh
        eclipse_protection_enabled=False,
    )


async def _drain(sub: Any) -> None:
    # packets are stored by the topic validator; the subscription queue only needs emptying
    while True:
        await sub.get()
