"""A read-only libp2p peer for a job's caller: it follows the members' signed progress on the
job's progress topic and asks operators for their signed notes (noteboard.py), publishing
nothing. Every note is checked before it is handed on: a valid signature, about this job, and
(for progress) from a member the caller read from the chain.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import trio
from eth_utils import to_checksum_address
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from dtrain_node.errors import NoteError
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p import notes
from dtrain_node.p2p.looper import Looper
from dtrain_node.p2p.noteboard import NOTES_PROTOCOL, progress_topic, request_notes
from dtrain_node.p2p.pubsub import SafePubsub

log = logging.getLogger(__name__)

Peer = tuple[bytes, list[str]]  # (on-chain peer key, multiaddrs)
MAX_SEEN = 4096
# notes whose sender the watcher did not know as a member yet, checked again when it learns the
# members: a new epoch's member's first note can outrun the watcher's read of the chain
MAX_UNKNOWN = 512


class WatchPeer(Looper):
    """Follows job `job_id`'s progress; `on_note(note)` is called (on the peer's thread) once
    per authentic progress note from a member set by `set_members`."""

    thread_name = "watch"

    def __init__(
        self,
        chain_id: int,
        contract: str,
        job_id: int,
        on_note: Callable[[notes.Note], None],
        listen: str = "/ip4/127.0.0.1/tcp/0",
    ) -> None:
        super().__init__()
        self.chain_id, self.contract, self.job_id = chain_id, to_checksum_address(contract), job_id
        self.on_note = on_note
        self.listen = listen
        self.topic = progress_topic(chain_id, self.contract, job_id)
        self.members: frozenset[str] = frozenset()
        self.dropped: Counter[str] = Counter()
        self.received: Counter[str] = Counter()  # new notes by how they came: gossip, asked
        self._seen: dict[bytes, None] = {}
        self._unknown: dict[bytes, bytes] = {}  # sha256 -> note, oldest first
        self._host: Any = None
        self._pubsub: SafePubsub | None = None

    async def _run(self) -> None:
        self._host = new_host(key_pair=create_new_key_pair())
        gs = GossipSub(
            protocols=[PROTOCOL_ID_V11],
            degree=6,
            degree_low=1,
            degree_high=12,
            heartbeat_interval=1,
            eclipse_protection_enabled=False,
        )
        self._pubsub = ps = SafePubsub(self._host, gs)
        async with (
            self._host.run(listen_addrs=[Multiaddr(self.listen)]),
            background_trio_service(ps),
            background_trio_service(gs),
        ):
            await ps.wait_until_ready()
            ps.set_topic_validator(self.topic, self._validate, False)
            sub = await ps.subscribe(self.topic)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain, sub)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def _accept(self, data: bytes, via: str = "gossip") -> bool:
        """Check one progress note; hand it on once. False: dropped (and counted)."""
        if via == "held":  # counted as not_member when it came: counted again below
            self._undrop("not_member")
        try:
            note = notes.decode(data, self._ours)
        except NoteError as e:
            self.dropped[e.reason] += 1
            if e.reason == "not_member":
                self._hold(data)
            return False
        key = hashlib.sha256(data).digest()
        if key not in self._seen:
            self._seen[key] = None
            if len(self._seen) > MAX_SEEN:
                self._seen.pop(next(iter(self._seen)))
            self.received[via] += 1
            self.on_note(note)
        return True

    def _hold(self, data: bytes) -> None:
        key = hashlib.sha256(data).digest()
        if key in self._seen:
            return
        self._unknown.pop(key, None)
        self._unknown[key] = data
        if len(self._unknown) > MAX_UNKNOWN:
            self._unknown.pop(next(iter(self._unknown)))

    def _undrop(self, reason: str) -> None:
        self.dropped[reason] -= 1
        if self.dropped[reason] <= 0:
            del self.dropped[reason]

    def _set_members(self, members: frozenset[str]) -> None:
        """New members; the notes held for an unknown sender are checked again (those of
        senders still unknown stay held, and counted dropped, until they are evicted)."""
        self.members = members
        held, self._unknown = self._unknown, {}
        for data in held.values():
            self._accept(data, "held")

    def _ours(self, note: notes.Note) -> None:
        notes.check_about(note, self.chain_id, self.contract, self.job_id, notes.PROGRESS)
        if note.sender not in self.members:
            raise NoteError("not_member", f"{note.sender} is not a member")

    def _validate(self, _forwarder: ID, msg: Any) -> bool:
        return self._accept(bytes(msg.data))

    # -- synchronous API -----------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, int]]:
        """New notes by how they came, and the dropped ones by reason."""
        return self._call_sync(
            lambda: {"received": dict(self.received), "dropped": dict(self.dropped)}
        )

    def set_members(self, members: Iterable[str]) -> None:
        checked = frozenset(to_checksum_address(m) for m in members)
        self._call_sync(self._set_members, checked)

    def follow(self, peers: list[Peer], timeout: float = 10.0) -> int:
        """Dial these members and read what progress they hold (a late watcher's backlog);
        the number of peers that answered."""
        return int(self._call(self._follow, peers, timeout))

    async def _follow(self, peers: list[Peer], timeout: float) -> int:
        got: list[list[bytes]] = []
        async with trio.open_nursery() as nursery:
            for key, addrs in peers:
                nursery.start_soon(self._ask, key, addrs, self.job_id, timeout, got)
        for batch in got:
            for data in batch:
                self._accept(data, "asked")
        return len(got)

    async def _ask(
        self, key: bytes, addrs: list[str], job: int, timeout: float, out: list[list[bytes]]
    ) -> None:
        try:
            info = ident.peer_info(key, addrs)
            with trio.fail_after(timeout):
                await self._host.connect(info)
                stream = await self._host.new_stream(info.peer_id, [TProtocol(NOTES_PROTOCOL)])
                try:
                    out.append(await request_notes(stream, job))
                finally:
                    await stream.close()
        except Exception as e:  # unreachable, no such protocol, junk: that peer says nothing
            log.debug("no notes from %s: %r", addrs, e)

    def ask(self, peers: list[Peer], job: int, timeout: float = 5.0) -> list[bytes]:
        """The notes these peers hold about `job`, unchecked (the caller checks them)."""
        return [d for batch in self._call(self._ask_all, peers, job, timeout) for d in batch]

    async def _ask_all(self, peers: list[Peer], job: int, timeout: float) -> list[list[bytes]]:
        got: list[list[bytes]] = []
        async with trio.open_nursery() as nursery:
            for key, addrs in peers:
                nursery.start_soon(self._ask, key, addrs, job, timeout, got)
        return got


async def _drain(sub: Any) -> None:
    while True:
        await sub.get()
