"""A member's hidden vote: what it commits to before an epoch's deadline and reveals after it.

`commitment_hash` is computed here exactly as the contract's pure view `commitmentHash` does
(keccak256 of the abi-encoded job id, epoch, operator, checkpoint, participation, evidence and
salt), so a member commits without a call. A member's evidence is the sha256 of the transcript
file its vote was made from; a referee's is the bitmap of the voters it found consistent.
The operator is part of the hash: a commitment copied from another member cannot be revealed
by the copier (`CommitmentMismatch`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from eth_abi import encode
from eth_utils import is_address, keccak, to_checksum_address

from .errors import ConfigError

# The reserved vote for an epoch that cannot be done (data or model unavailable or failing its
# hash): the ASCII bytes "UNWORKABLE", left aligned in 32 bytes, as Solidity's bytes32 literal.
UNWORKABLE: bytes = b"UNWORKABLE".ljust(32, b"\0")

_TYPES = ("uint256", "uint256", "address", "bytes32", "uint32[]", "bytes32", "bytes32")


def commitment_hash(
    job_id: int,
    epoch: int,
    operator: str,
    checkpoint: bytes,
    participation: Sequence[int],
    evidence: bytes,
    salt: bytes,
) -> bytes:
    """keccak256(abi.encode(jobId, epoch, operator, checkpoint, participation, evidence,
    salt))."""
    if not is_address(operator):
        raise ConfigError(f"{operator!r} is not an address")
    values = (
        job_id,
        epoch,
        to_checksum_address(operator),
        _bytes32(checkpoint, "checkpoint"),
        [int(p) for p in participation],
        _bytes32(evidence, "evidence"),
        _bytes32(salt, "salt"),
    )
    return keccak(encode(list(_TYPES), list(values)))


CAUGHT_SHIFT = 128  # a verdict's findings: bit i consistent, bit 128 + i caught (member i)


def findings(consistent: Iterable[int], caught: Iterable[int]) -> int:
    """A referee's findings word from member indices: those whose own transcript leads to
    their vote (`consistent`) and those whose replayed packet is not the one they sent
    (`caught`)."""
    return sum(1 << i for i in set(consistent)) | sum(1 << (CAUGHT_SHIFT + i) for i in set(caught))


def vote_key(checkpoint: bytes, participation: Sequence[int]) -> bytes:
    """keccak256(abi.encode(checkpoint, participation)): how the contract names a (checkpoint,
    participation) vote (`CheckpointRevealed.voteKey`, `certifiedVote`); `UNWORKABLE` is its
    own key, whatever participation came with it."""
    raw = _bytes32(checkpoint, "checkpoint")
    if raw == UNWORKABLE:
        return UNWORKABLE
    return keccak(encode(["bytes32", "uint32[]"], [raw, [int(p) for p in participation]]))


def new_salt() -> bytes:
    """32 random bytes: a fresh salt for every commitment keeps a vote hidden until revealed."""
    return secrets.token_bytes(32)


def _bytes32(value: bytes, what: str) -> bytes:
    raw = bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw
