"""A gossip host's signed notes (notes.py): the progress it publishes and relays on the job's
progress topic, the refusals it made, and the notes stream protocol that serves both to anyone
who asks (a caller's `dtrain job watch` or `dtrain job status`; docs/protocol.md 4.8).

Every progress message is checked before it is relayed: a valid note, about this job, from a
member of the current epoch. Anything else is dropped and counted (`dropped`).
"""

from __future__ import annotations

import logging
import struct
from collections import Counter, deque
from typing import Any

from eth_utils import to_checksum_address
from libp2p.peer.id import ID

from dtrain_node.errors import NoteError, WireError
from dtrain_node.p2p import notes, wire
from dtrain_node.p2p.state import HostState

log = logging.getLogger(__name__)

NOTES_PROTOCOL = "/dtrain/notes/1.0.0"
KEPT_PROGRESS = 256  # the last notes of the job, for a watcher that joins late
KEPT_REFUSALS = 64
MAX_SERVED = KEPT_PROGRESS + 1
REQUEST = struct.Struct(">32s")  # the job id, uint256


def progress_topic(chain_id: int, contract: str, job_id: int) -> str:
    return f"/dtrain/{chain_id}/{to_checksum_address(contract)}/job/{job_id}/progress/1"


def encode_request(job_id: int) -> bytes:
    return REQUEST.pack(job_id.to_bytes(32, "big"))


async def request_notes(stream: Any, job_id: int, max_len: int = 1 << 20) -> list[bytes]:
    """Ask a peer's notes protocol for what it holds about `job_id` (encoded notes, unchecked)."""
    await wire.write_frame(stream, encode_request(job_id))
    (count,) = struct.unpack(">H", await wire.read_exactly(stream, 2))
    if count > MAX_SERVED:
        raise WireError("oversized", f"{count} notes > {MAX_SERVED}")
    return [await wire.read_frame(stream, max_len) for _ in range(count)]


class NoteBoard:
    def __init__(self, state: HostState) -> None:
        self._state = state
        cfg = state.config
        self.topic = progress_topic(cfg.chain_id, cfg.contract, cfg.job_id)
        self.progress: deque[bytes] = deque(maxlen=KEPT_PROGRESS)
        self.refusals: dict[int, bytes] = {}
        self.dropped: Counter[str] = Counter()
        self.relayed = 0

    # -- progress ------------------------------------------------------------------------
    def check_progress(self, data: bytes) -> notes.Note:
        """The note, if it is progress about our job from a current member (else NoteError)."""
        cfg, store = self._state.config, self._state.store

        def ours(note: notes.Note) -> None:
            notes.check_about(note, cfg.chain_id, cfg.contract, cfg.job_id, notes.PROGRESS)
            if note.sender not in store.members:
                raise NoteError("not_member", f"{note.sender} is not a member of the epoch")

        return notes.decode(data, ours)

    def validate_gossip(self, forwarder: ID, msg: Any) -> bool:
        """Topic validator of the progress topic: False drops (and counts) the message."""
        if forwarder == self._state.peer_id:
            return True
        try:
            self.check_progress(msg.data)
        except NoteError as e:
            self.dropped[e.reason] += 1
            return False
        self.progress.append(bytes(msg.data))
        self.relayed += 1
        return True

    async def publish_progress(self, body: dict[str, Any]) -> None:
        """Sign our round's progress and publish it (a failure is logged: progress is best
        effort, training never waits for it)."""
        st = self._state
        cfg = st.config
        about = {"chain_id": cfg.chain_id, "contract": cfg.contract, "job": cfg.job_id}
        try:
            data = notes.sign(st.account, notes.PROGRESS, {**body, **about}).encode()
            self.progress.append(data)
            assert st.pubsub is not None
            await st.pubsub.publish(self.topic, data)
        except Exception:
            log.warning("progress of round %s not published", body.get("round"), exc_info=True)

    # -- refusals ------------------------------------------------------------------------
    def refuse(self, job_id: int, reason: str, detail: str) -> None:
        """Sign and keep our refusal of `job_id` (served until the host stops)."""
        st = self._state
        cfg = st.config
        body = {
            "chain_id": cfg.chain_id,
            "contract": cfg.contract,
            "job": job_id,
            "reason": reason,
            "detail": detail[:500],
        }
        self.refusals[job_id] = notes.sign(st.account, notes.REFUSAL, body).encode()
        while len(self.refusals) > KEPT_REFUSALS:
            self.refusals.pop(next(iter(self.refusals)))

    # -- the notes protocol --------------------------------------------------------------
    async def serve(self, stream: Any) -> None:
        """One request (a job id): every note we hold about that job, each framed."""
        try:
            raw = await wire.read_frame(stream, REQUEST.size)
            if len(raw) != REQUEST.size:
                raise WireError("malformed", f"request of {len(raw)} bytes")
            job = int.from_bytes(REQUEST.unpack(raw)[0], "big")
            held = list(self.progress) if job == self._state.config.job_id else []
            if job in self.refusals:
                held.append(self.refusals[job])
            await stream.write(struct.pack(">H", len(held)))
            for data in held:
                await wire.write_frame(stream, data)
        except Exception as e:  # a peer that hangs up or sends junk costs it the answer
            log.debug("notes request failed: %r", e)
        finally:
            await wire.close_quietly(stream)
