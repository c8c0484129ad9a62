"""Signed gossip envelope: one chunk of one member's DeMo packet for one sync round, or that
member's commitment to the packet (its sha256, sent before the packet: docs/protocol.md 4.2).

Wire layout (version 2, big-endian integers), specified in docs/protocol.md:

    magic        4  b"DTGE"
    version      1  2
    kind         1  0 = packet chunk, 1 = commitment (chunk_index 0; as chunk bytes either
                    nothing or the 32-byte commitment to the sender's private state at the
                    round's start, docs/protocol.md 4.6)
    chain_id     8  uint64
    contract    20  address
    job_id      32  uint256
    epoch        8  uint64
    round        8  uint64
    sender      20  address (the operator's Ethereum account)
    payload_len  4  uint32, length of the whole payload
    payload_sha 32  sha256 of the whole payload (binds the chunks of one packet together)
    chunk_index  2  uint16
    chunk_count  2  uint16
    chunk_len    4  uint32
    chunk        chunk_len bytes
    signature   65  r || s || v over signing_digest()

The signature covers keccak256(DOMAIN || every field above from kind to chunk_len ||
keccak256(chunk)), signed as a raw 32-byte hash (no EIP-191 prefix): the domain prefix keeps the
digest from ever being a transaction or personal-message hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from dtrain_node.errors import EnvelopeError
from dtrain_node.framing import Frame

MAGIC = b"DTGE"
VERSION = 2
DOMAIN = b"dtrain/gossip-packet/v2"
CHUNK, COMMIT = 0, 1  # envelope kinds
_FIELDS = struct.Struct(">BQ20s32sQQ20sI32sHHI")
HEADER_LEN = len(MAGIC) + 1 + _FIELDS.size
SIG_LEN = 65
# One encoding per signature, as the contract's ECDSA.tryRecover accepts: v is 27 or 28 and s
# is in the lower half of the curve order (eth-keys alone also takes v = 0, 35, 59, ... and
# high s, so a relayer could re-encode a member's signature into other valid bytes).
_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0
OVERHEAD = HEADER_LEN + SIG_LEN
_FRAME = Frame(MAGIC, VERSION, OVERHEAD)
MAX_CHUNK = 512 * 1024  # every gossip message stays well under py-libp2p's silent 1 MiB limit
MAX_CHUNKS = 0xFFFF
STATE_LEN = 32  # a commitment's chunk: sha256 of the sender's private-state file, or nothing


@dataclass(frozen=True)
class Envelope:
    chain_id: int
    contract: str
    job_id: int
    epoch: int
    round: int
    sender: str
    payload_len: int
    payload_sha256: bytes
    chunk_index: int
    chunk_count: int
    chunk: bytes
    signature: bytes = b""
    kind: int = CHUNK

    def __post_init__(self) -> None:
        if self.kind not in (CHUNK, COMMIT):
            raise EnvelopeError("field", f"kind={self.kind} not in (0, 1)")
        if self.kind == COMMIT and (len(self.chunk) not in (0, STATE_LEN) or self.chunk_index):
            raise EnvelopeError(
                "field", "a commitment's chunk is empty or a 32-byte state digest (chunk_index 0)"
            )
        for name, value, bits in (
            ("chain_id", self.chain_id, 64),
            ("job_id", self.job_id, 256),
            ("epoch", self.epoch, 64),
            ("round", self.round, 64),
            ("payload_len", self.payload_len, 32),
        ):
            if not 0 <= value < (1 << bits):
                raise EnvelopeError("field", f"{name}={value} outside uint{bits}")
        if len(self.payload_sha256) != 32:
            raise EnvelopeError("field", f"payload_sha256 has {len(self.payload_sha256)} bytes")
        if not 1 <= self.chunk_count <= MAX_CHUNKS:
            raise EnvelopeError("field", f"chunk_count={self.chunk_count} not in [1, {MAX_CHUNKS}]")
        if not 0 <= self.chunk_index < self.chunk_count:
            raise EnvelopeError(
                "field", f"chunk_index={self.chunk_index} not in [0, {self.chunk_count})"
            )
        if len(self.chunk) > MAX_CHUNK:
            raise EnvelopeError("oversized", f"chunk of {len(self.chunk)} bytes > {MAX_CHUNK}")
        if self.signature and len(self.signature) != SIG_LEN:
            raise EnvelopeError("field", f"signature has {len(self.signature)} bytes")

    def _fields(self) -> bytes:
        return _FIELDS.pack(
            self.kind,
            self.chain_id,
            _addr_bytes(self.contract),
            self.job_id.to_bytes(32, "big"),
            self.epoch,
            self.round,
            _addr_bytes(self.sender),
            self.payload_len,
            self.payload_sha256,
            self.chunk_index,
            self.chunk_count,
            len(self.chunk),
        )

    def signing_digest(self) -> bytes:
        return keccak(DOMAIN + self._fields() + keccak(self.chunk))

    def encode(self) -> bytes:
        if not self.signature:
            raise EnvelopeError("unsigned", "envelope has no signature")
        return MAGIC + bytes([VERSION]) + self._fields() + self.chunk + self.signature

    def recover_signer(self) -> str:
        """The checksummed address that signed this envelope (raise EnvelopeError if none, or
        if the signature is not in its one canonical encoding)."""
        sig = self.signature
        if len(sig) != SIG_LEN or sig[64] not in (27, 28) or int.from_bytes(sig[32:64]) > _HALF_N:
            raise EnvelopeError("bad_signature", "signature not canonical (v 27/28, low s)")
        try:
            return Account._recover_hash(self.signing_digest(), signature=self.signature)
        except Exception as e:  # eth-keys raises several types for malformed r, s, v
            raise EnvelopeError("bad_signature", f"cannot recover signer: {e}") from None

    def auth_id(self) -> bytes:
        """What the signature covers, plus the signature: equal ids, equally authentic."""
        return hashlib.sha256(self._fields() + self.signature + self.chunk).digest()

    @property
    def state_digest(self) -> bytes | None:
        """A commitment's signed private-state digest (None: it names none, or not a
        commitment)."""
        return self.chunk if self.kind == COMMIT and self.chunk else None

    @property
    def key(self) -> tuple[int, str, bytes]:
        """Identity of the packet this chunk belongs to: (round, sender, payload sha256)."""
        return (self.round, self.sender, self.payload_sha256)


def _addr_bytes(addr: str) -> bytes:
    raw = bytes.fromhex(addr[2:] if addr.startswith("0x") else addr)
    if len(raw) != 20:
        raise EnvelopeError("field", f"address {addr!r} is not 20 bytes")
    return raw


def _malformed(_reason: str, msg: str) -> EnvelopeError:
    return EnvelopeError("malformed", msg)  # one reason for every framing fault: metrics stay small


def decode(data: bytes) -> Envelope:
    """Parse an encoded envelope; raise EnvelopeError (never anything else) if malformed."""
    data = _FRAME.open(data, _malformed)
    kind, *f = _FIELDS.unpack_from(data, 5)
    chunk_len = f[10]
    if len(data) != OVERHEAD + chunk_len:
        raise EnvelopeError("malformed", f"{len(data)} bytes, header says {OVERHEAD + chunk_len}")
    try:
        return Envelope(
            chain_id=f[0],
            contract=to_checksum_address(f[1]),
            job_id=int.from_bytes(f[2], "big"),
            epoch=f[3],
            round=f[4],
            sender=to_checksum_address(f[5]),
            payload_len=f[6],
            payload_sha256=f[7],
            chunk_index=f[8],
            chunk_count=f[9],
            chunk=data[HEADER_LEN : HEADER_LEN + chunk_len],
            signature=data[HEADER_LEN + chunk_len :],
            kind=kind,
        )
    except EnvelopeError as e:
        raise EnvelopeError("malformed", str(e)) from None


def seal(
    account: LocalAccount,
    *,
    chain_id: int,
    contract: str,
    job_id: int,
    epoch: int,
    round: int,
    payload: bytes,
    chunk_size: int = MAX_CHUNK,
) -> list[Envelope]:
    """Split `payload` into chunks of at most chunk_size bytes and sign each chunk envelope."""
    head = _head(account, chain_id, contract, job_id, epoch, round, payload, chunk_size)
    count = head.chunk_count
    chunks = [
        dataclasses.replace(
            head, chunk_index=i, chunk=payload[i * chunk_size : (i + 1) * chunk_size]
        )
        for i in range(count)
    ]
    return [_signed(account, env) for env in chunks]


def commitment(account: LocalAccount, chunks: list[Envelope], state: bytes = b"") -> Envelope:
    """The signed commitment to the packet whose chunks seal() returned, naming `state` (the
    sha256 of our private state at the round's start, or b"": none)."""
    head = dataclasses.replace(chunks[0], kind=COMMIT, chunk=state, chunk_index=0, signature=b"")
    return _signed(account, head)


def _head(
    account: LocalAccount, chain_id: int, contract: str, job_id: int, epoch: int, round: int,
    payload: bytes, chunk_size: int,
) -> Envelope:  # fmt: skip
    if not 1 <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size={chunk_size} not in [1, {MAX_CHUNK}]")
    count = max(1, -(-len(payload) // chunk_size))
    if count > MAX_CHUNKS:
        raise ValueError(f"payload of {len(payload)} bytes needs {count} > {MAX_CHUNKS} chunks")
    return Envelope(
        chain_id=chain_id,
        contract=to_checksum_address(contract),
        job_id=job_id,
        epoch=epoch,
        round=round,
        sender=account.address,
        payload_len=len(payload),
        payload_sha256=hashlib.sha256(payload).digest(),
        chunk_index=0,
        chunk_count=count,
        chunk=b"",
    )


def _signed(account: LocalAccount, env: Envelope) -> Envelope:
    sig = account.unsafe_sign_hash(env.signing_digest()).signature
    return _with_signature(env, bytes(sig))


def _with_signature(env: Envelope, sig: bytes) -> Envelope:
    return dataclasses.replace(env, signature=sig)


def assemble(chunks: list[Envelope]) -> bytes:
    """Join a complete, ordered set of chunks and check the payload's length and sha256."""
    payload = b"".join(c.chunk for c in sorted(chunks, key=lambda c: c.chunk_index))
    first = chunks[0]
    if len(payload) != first.payload_len:
        raise EnvelopeError("malformed", f"{len(payload)} bytes, header says {first.payload_len}")
    if hashlib.sha256(payload).digest() != first.payload_sha256:
        raise EnvelopeError("malformed", "payload sha256 does not match the signed digest")
    return payload
