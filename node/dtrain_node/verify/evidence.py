"""An epoch's evidence: its canonical transcript as one file anyone can check and re-execute
(docs/protocol.md 4.7).

An epoch's checkpoint is a pure function of the state it started from and its canonical
transcript (the packets each round applied, docs/protocol.md 4.5). Every member writes the
transcript it ended the epoch with to `transcript-<attempt>.bin` in the job's directory, each
packet with its sender's signed commitment: `verify` checks every packet's origin without
trusting whoever handed the file over, and the optimizer's `replay` recomputes the checkpoint
from it (aggregation only, no training). `root` commits to the whole transcript, one leaf per
round, in a binary Merkle tree a contract can check one round against.

Layout (big-endian):

    magic "DTEV", version 1, chain id u64, contract 20 bytes, job id u64, epoch u64,
    attempt u64 (the gossip envelopes' epoch field), rounds u32, then per round:
    packets u16, then per packet: sender 20 bytes, payload length u32, payload,
    commitment length u16, commitment (an encoded envelope; empty when the transport signs
    none, as the in-process test transport)

Senders are in ascending order within a round (the order the aggregation applies them in) and
nothing follows the last round.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eth_utils import keccak, to_checksum_address

from dtrain_node.errors import EnvelopeError, TranscriptInvalid
from dtrain_node.framing import Frame
from dtrain_node.p2p import envelope as envmod

MAGIC = b"DTEV"
VERSION = 1
_HEAD = struct.Struct(">4sBQ20sQQQI")
MAX_ROUNDS = 1 << 16
MAX_PACKETS = 32  # the contract's MAX_OPERATORS_CAP: one packet per member and round
MAX_PAYLOAD = 16 << 20
MAX_COMMITMENT = envmod.OVERHEAD + envmod.STATE_LEN  # its chunk: nothing or a state digest
_FRAME = Frame(MAGIC, VERSION, _HEAD.size)


def size_bound(rounds: int, members: int, packet_bytes: int) -> int:
    """The most bytes a transcript of `rounds` sync rounds among `members` can have, each
    packet at most `packet_bytes` with its commitment: a fetch's size cap."""
    packet = 20 + 4 + packet_bytes + 2 + MAX_COMMITMENT
    return _HEAD.size + rounds * (2 + members * packet)


def path(job_dir: Path, attempt: int) -> Path:
    return Path(job_dir) / f"transcript-{attempt}.bin"


@dataclass(frozen=True)
class Packet:
    sender: str  # checksummed address
    payload: bytes
    commitment: bytes = b""  # the sender's signed commitment envelope, encoded

    @property
    def state(self) -> bytes | None:
        """The private-state digest the sender signed into its commitment for the round
        (docs/protocol.md 4.6); None when it named none or the commitment does not decode."""
        try:
            return envmod.decode(self.commitment).state_digest if self.commitment else None
        except EnvelopeError:
            return None


@dataclass(frozen=True)
class EpochTranscript:
    chain_id: int
    contract: str
    job_id: int
    epoch: int
    attempt: int
    rounds: tuple[tuple[Packet, ...], ...]

    def encode(self) -> bytes:
        contract = bytes.fromhex(self.contract.removeprefix("0x"))
        out = [
            _HEAD.pack(
                MAGIC,
                VERSION,
                self.chain_id,
                contract,
                self.job_id,
                self.epoch,
                self.attempt,
                len(self.rounds),
            )
        ]
        for packets in self.rounds:
            out.append(struct.pack(">H", len(packets)))
            for p in packets:
                sender = bytes.fromhex(p.sender.removeprefix("0x"))
                out += [sender, struct.pack(">I", len(p.payload)), p.payload]
                out += [struct.pack(">H", len(p.commitment)), p.commitment]
        return b"".join(out)

    def packets(self) -> list[list[tuple[str, bytes]]]:
        """Each round's (sender, payload), as the optimizer's `replay` takes them."""
        return [[(p.sender, p.payload) for p in packets] for packets in self.rounds]

    def leaves(self) -> list[bytes]:
        """keccak256(round u256 || (sender || sha256(payload)) for each packet) per round."""
        return [
            keccak(
                r.to_bytes(32, "big")
                + b"".join(
                    bytes.fromhex(p.sender.removeprefix("0x")) + hashlib.sha256(p.payload).digest()
                    for p in packets
                )
            )
            for r, packets in enumerate(self.rounds)
        ]

    def root(self) -> bytes:
        return merkle_root(self.leaves())


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Binary Merkle root: parent = keccak256(left || right), an odd last node moves up as it
    is; 32 zero bytes for no leaves."""
    level = list(leaves)
    if not level:
        return bytes(32)
    while len(level) > 1:
        nxt = [keccak(level[i] + level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _reject(reason: str, msg: str) -> TranscriptInvalid:
    return TranscriptInvalid(f"transcript {reason}: {msg}")


class _Reader:
    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def take(self, n: int, what: str) -> bytes:
        if self.at + n > len(self.data):
            raise _reject("truncated", f"{what} needs {n} bytes at offset {self.at}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def uint(self, fmt: str, what: str) -> int:
        s = struct.Struct(fmt)
        return int(s.unpack(self.take(s.size, what))[0])


def decode(data: bytes) -> EpochTranscript:
    """Parse a transcript file; raise TranscriptInvalid (never anything else) if malformed."""
    data = _FRAME.open(data, _reject)
    _, _, chain_id, contract, job_id, epoch, attempt, n = _HEAD.unpack_from(data)
    if n > MAX_ROUNDS:
        raise _reject("oversized", f"{n} rounds > {MAX_ROUNDS}")
    rd = _Reader(data, _HEAD.size)
    rounds = []
    for r in range(n):
        count = rd.uint(">H", f"round {r}'s packet count")
        if count > MAX_PACKETS:
            raise _reject("oversized", f"round {r} has {count} packets > {MAX_PACKETS}")
        packets = []
        for _ in range(count):
            sender = to_checksum_address(rd.take(20, f"round {r}'s sender"))
            size = rd.uint(">I", f"round {r}'s payload length")
            if size > MAX_PAYLOAD:
                raise _reject("oversized", f"round {r} payload of {size} bytes > {MAX_PAYLOAD}")
            payload = rd.take(size, f"round {r}'s payload")
            size = rd.uint(">H", f"round {r}'s commitment length")
            if size > MAX_COMMITMENT:
                raise _reject("oversized", f"round {r} commitment of {size} bytes")
            packets.append(Packet(sender, payload, rd.take(size, f"round {r}'s commitment")))
        senders = [p.sender.lower() for p in packets]
        if senders != sorted(set(senders)):
            raise _reject("order", f"round {r}'s senders are not strictly ascending")
        rounds.append(tuple(packets))
    if rd.at != len(data):
        raise _reject("trailing", f"{len(data) - rd.at} bytes after the last round")
    return EpochTranscript(
        chain_id, to_checksum_address(contract), job_id, epoch, attempt, tuple(rounds)
    )


def verify(t: EpochTranscript, members: Iterable[str]) -> None:
    """Every packet is a member's, committed by that member for this job, attempt and round
    (its signed commitment names the payload's sha256); raise TranscriptInvalid if one is not."""
    allowed = {to_checksum_address(m) for m in members}
    for r, packets in enumerate(t.rounds):
        for p in packets:
            where = f"round {r} packet of {p.sender}"
            if p.sender not in allowed:
                raise _reject("member", f"{where}: not a member")
            if not p.commitment:
                raise _reject("unsigned", f"{where}: no commitment")
            try:
                c = envmod.decode(p.commitment)
                signer = c.recover_signer()
            except EnvelopeError as e:
                raise _reject("commitment", f"{where}: {e}") from None
            head = (c.kind, c.chain_id, c.contract, c.job_id, c.epoch, c.round, c.sender)
            want = (envmod.COMMIT, t.chain_id, t.contract, t.job_id, t.attempt, r, p.sender)
            if head != want:
                raise _reject("commitment", f"{where}: commits to {head[1:]}, not {want[1:]}")
            if signer != p.sender:
                raise _reject("signature", f"{where}: signed by {signer}")
            if (c.payload_len, c.payload_sha256) != (
                len(p.payload),
                hashlib.sha256(p.payload).digest(),
            ):
                raise _reject("payload", f"{where}: not the committed payload")


def union(ts: Sequence[EpochTranscript]) -> EpochTranscript:
    """Every packet of several transcripts of one attempt (verify each first): per round, each
    sender's packet. A sender whose packets for one round differ between the files signed two
    (an equivocation, provable on its own) and has none in that round, as in the members'
    reconcile. A packet one file holds and another lacks is in: a challenger that leaves
    packets out of its file cannot change the referees' result while their senders, or any
    member that saw them, posted theirs. Raises TranscriptInvalid for files of other attempts."""
    if not ts:
        raise _reject("union", "no transcript")
    first = ts[0]
    head = (first.chain_id, first.contract, first.job_id, first.epoch, first.attempt)
    for t in ts[1:]:
        other = (t.chain_id, t.contract, t.job_id, t.epoch, t.attempt)
        if other != head or len(t.rounds) != len(first.rounds):
            raise _reject("union", f"{other} with {len(t.rounds)} rounds is another attempt")
    rounds = []
    for r in range(len(first.rounds)):
        by: dict[str, Packet] = {}
        twice: set[str] = set()
        for t in ts:
            for p in t.rounds[r]:
                q = by.get(p.sender)
                if q is not None and q.payload != p.payload:
                    twice.add(p.sender)
                by.setdefault(p.sender, p)
        rounds.append(tuple(by[s] for s in sorted(by, key=str.lower) if s not in twice))
    return EpochTranscript(*head, tuple(rounds))


def save(job_dir: Path, t: EpochTranscript) -> Path:
    """Writes t as the attempt's evidence file; raises TranscriptInvalid, writing nothing, for
    a transcript its readers would refuse (senders out of order, sizes over the limits)."""
    out = path(job_dir, t.attempt)
    data = t.encode()
    decode(data)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


def load(file: Path) -> EpochTranscript:
    return decode(Path(file).read_bytes())
