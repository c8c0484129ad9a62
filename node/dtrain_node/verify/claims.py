"""A failed replay spot check as signed, self-contained evidence (docs/protocol.md 4.6).

A `Claim` says: checker C replayed member M's round r of this job's attempt and did not get
the packet M committed to. It carries M's own signed commitment of the round (the packet's
sha256 and M's private-state digest, both signed by M), so whoever reads it needs no
transcript to know what M bound itself to; whoever holds the shared state of round r (the
epoch's start checkpoint and its transcript) can re-run the replay: fetch the state by its
digest from M, check it, replay, compare (`replaycheck`). Reasons: MISMATCH (the replay gives
another packet: `replayed` is its sha256), WITHHELD (M did not hand over the committed state),
INVALID_STATE (what M handed over does not fit the model), NO_STATE (M's commitment names no
state).

Layout (big-endian): magic "DTCL", version 1, reason u8, chain id u64, contract 20, job id
32 (uint256), attempt u64, round u64, member 20, checker 20, state 32, packet 32, replayed 32,
commitment length u16, commitment (an encoded gossip envelope, kind 1), signature 65 by the
checker over keccak256("dtrain/replay-claim/v1" || everything before the signature), raw
hash, v 27/28, low s. `decode` refuses anything else with `ClaimInvalid` (fuzzed).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from dtrain_node.errors import EnvelopeError
from dtrain_node.p2p import envelope as envmod

MAGIC = b"DTCL"
VERSION = 1
DOMAIN = b"dtrain/replay-claim/v1"
MISMATCH, WITHHELD, INVALID_STATE, NO_STATE = 0, 1, 2, 3
REASONS = ("mismatch", "withheld", "invalid_state", "no_state")
_BODY = struct.Struct(">4sBBQ20s32sQQ20s20s32s32s32sH")
MAX_COMMITMENT = envmod.OVERHEAD + envmod.STATE_LEN
SIG_LEN = 65
MAX_SIZE = _BODY.size + 0xFFFF + SIG_LEN  # the most bytes an encoded claim can have
_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


class ClaimInvalid(ValueError):
    """A claim that does not decode, is not signed by its checker, or whose commitment is not
    the member's for that round."""


@dataclass(frozen=True)
class Claim:
    chain_id: int
    contract: str
    job_id: int
    attempt: int  # the gossip envelopes' epoch field
    round: int
    member: str  # the checked member
    checker: str
    reason: int
    state: bytes  # the private-state digest the member committed to (zeros: none)
    packet: bytes  # sha256 of the packet the member committed to
    replayed: bytes  # sha256 of the packet the replay gave (zeros: no replay)
    commitment: bytes  # the member's signed commitment envelope, encoded
    signature: bytes = b""

    def __post_init__(self) -> None:
        if not 0 <= self.reason < len(REASONS):
            raise ClaimInvalid(f"reason {self.reason}")
        for name in ("state", "packet", "replayed"):
            if len(getattr(self, name)) != 32:
                raise ClaimInvalid(f"{name} has {len(getattr(self, name))} bytes")
        ranges = (
            ("chain_id", self.chain_id, 64),
            ("job_id", self.job_id, 256),
            ("attempt", self.attempt, 64),
            ("round", self.round, 64),
        )
        for name, v, bits in ranges:
            if not 0 <= v < 1 << bits:
                raise ClaimInvalid(f"{name}={v} outside uint{bits}")
        if len(self.commitment) > MAX_COMMITMENT:
            raise ClaimInvalid(f"commitment of {len(self.commitment)} bytes")
        if self.signature and len(self.signature) != SIG_LEN:
            raise ClaimInvalid(f"signature of {len(self.signature)} bytes")

    def body(self) -> bytes:
        return (
            _BODY.pack(
                MAGIC, VERSION, self.reason, self.chain_id, _addr(self.contract),
                self.job_id.to_bytes(32, "big"), self.attempt, self.round, _addr(self.member),
                _addr(self.checker), self.state, self.packet, self.replayed,
                len(self.commitment),
            )
            + self.commitment
        )  # fmt: skip

    def digest(self) -> bytes:
        return keccak(DOMAIN + self.body())

    def encode(self) -> bytes:
        if not self.signature:
            raise ClaimInvalid("unsigned claim")
        return self.body() + self.signature

    def sign(self, account: LocalAccount) -> Claim:
        sig = bytes(account.unsafe_sign_hash(self.digest()).signature)
        return dataclasses.replace(self, checker=account.address, signature=sig)

    @property
    def reason_name(self) -> str:
        return REASONS[self.reason]


def _addr(a: str) -> bytes:
    raw = bytes.fromhex(a.removeprefix("0x"))
    if len(raw) != 20:
        raise ClaimInvalid(f"address {a!r}")
    return raw


def decode(data: bytes) -> Claim:
    """Parse an encoded claim; raise ClaimInvalid (never anything else) if malformed."""
    if len(data) < _BODY.size + SIG_LEN:
        raise ClaimInvalid(f"{len(data)} bytes: too short")
    f = _BODY.unpack_from(data)
    if f[0] != MAGIC or f[1] != VERSION:
        raise ClaimInvalid(f"magic {f[0]!r} version {f[1]}")
    size = f[13]
    if len(data) != _BODY.size + size + SIG_LEN:
        raise ClaimInvalid(f"{len(data)} bytes, header says {_BODY.size + size + SIG_LEN}")
    return Claim(
        chain_id=f[3],
        contract=to_checksum_address(f[4]),
        job_id=int.from_bytes(f[5], "big"),
        attempt=f[6],
        round=f[7],
        member=to_checksum_address(f[8]),
        checker=to_checksum_address(f[9]),
        reason=f[2],
        state=f[10],
        packet=f[11],
        replayed=f[12],
        commitment=data[_BODY.size : _BODY.size + size],
        signature=data[_BODY.size + size :],
    )


def signer(c: Claim) -> str:
    """The address that signed the claim (ClaimInvalid if none, or not canonical)."""
    sig = c.signature
    if len(sig) != SIG_LEN or sig[64] not in (27, 28) or int.from_bytes(sig[32:64]) > _HALF_N:
        raise ClaimInvalid("signature not canonical (v 27/28, low s)")
    try:
        return Account._recover_hash(c.digest(), signature=sig)
    except Exception as e:  # eth-keys raises several types for malformed r, s, v
        raise ClaimInvalid(f"cannot recover signer: {e}") from None


def verify(c: Claim) -> None:
    """The claim is signed by its checker and carries the member's own signed commitment for
    this chain, contract, job, attempt and round, naming the claim's packet and state (raise
    ClaimInvalid otherwise). It does not say the claim is true: re-running the replay does."""
    if signer(c) != c.checker:
        raise ClaimInvalid(f"signed by {signer(c)}, not the checker {c.checker}")
    if c.checker == c.member:
        raise ClaimInvalid("a member cannot check itself")
    try:
        env = envmod.decode(c.commitment)
        by = env.recover_signer()
    except EnvelopeError as e:
        raise ClaimInvalid(f"commitment: {e}") from None
    head = (env.kind, env.chain_id, env.contract, env.job_id, env.epoch, env.round, env.sender)
    want = (envmod.COMMIT, c.chain_id, c.contract, c.job_id, c.attempt, c.round, c.member)
    if head != want or by != c.member:
        raise ClaimInvalid(f"commitment {head[1:]} signed by {by}, not {want[1:]}")
    named = env.state_digest or bytes(32)
    if env.payload_sha256 != c.packet or named != c.state:
        raise ClaimInvalid("the claim's packet or state is not what the member committed to")
    if (c.reason == NO_STATE) != (env.state_digest is None):
        raise ClaimInvalid(f"reason {c.reason_name} with a commitment naming state {named.hex()}")


def save(directory: Path, c: Claim) -> Path:
    """Write the encoded claim to `directory/<attempt>-<round>-<member>.claim`; the path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{c.attempt}-{c.round}-{c.member}.claim"
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(c.encode())
    tmp.replace(out)
    return out


def load_all(directory: Path) -> list[Claim]:
    """Every claim saved in `directory` (a job's `claims/`), by name."""
    if not directory.is_dir():
        return []
    return [decode(p.read_bytes()) for p in sorted(directory.glob("*.claim"))]
