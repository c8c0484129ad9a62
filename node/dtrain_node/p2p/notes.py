"""Signed notes: what a member says about a job besides its packets, read by anyone.

Two kinds: a member's `progress` of one sync round (step, loss, tokens, the method's own metric)
published on the job's progress topic, and an operator's `refusal` of a job it passed by (why),
served over the notes stream protocol. Both are signed with the operator's Ethereum key and
name the chain, contract and job they are about (docs/protocol.md 4.8).

Wire layout (big-endian):

    magic      4  b"DTPN"
    version    1  1
    kind       1  0 = progress, 1 = refusal, 2 = receipt (a caller's, receipts.py)
    body_len   4  uint32 (<= MAX_BODY)
    body       body_len bytes: a JSON object, UTF-8, keys sorted, no spaces, finite numbers
    signature 65  r || s || v over keccak256(DOMAIN || kind || body_len || body)
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from dtrain_node.errors import NoteError
from dtrain_node.framing import Frame

MAGIC = b"DTPN"
VERSION = 1
DOMAIN = b"dtrain/note/v1"
PROGRESS, REFUSAL, RECEIPT = 0, 1, 2
KINDS = {PROGRESS: "progress", REFUSAL: "refusal", RECEIPT: "receipt"}  # receipt: receipts.py
MAX_BODY = 4096
SIG_LEN = 65
_HEAD = struct.Struct(">BI")
_HEADER_LEN = len(MAGIC) + 1 + _HEAD.size
_FRAME = Frame(MAGIC, VERSION, _HEADER_LEN + SIG_LEN, _HEADER_LEN + MAX_BODY + SIG_LEN)
_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0
# What every body names, and its type: the note is about this job and signed by `sender`.
_REQUIRED: dict[str, type] = {"chain_id": int, "contract": str, "job": int, "sender": str}
# The reasons an operator passes a job by (`refusal` bodies' `reason`).
REASONS = {
    "ask": "ask above price",
    "preflight": "failed pre-flight",
    "capacity": "not enough capacity",
    "tee": "no TEE attestation",
}


@dataclass(frozen=True)
class Note:
    kind: int
    body: dict[str, Any]
    signature: bytes

    @property
    def sender(self) -> str:
        return str(self.body["sender"])

    def encode(self) -> bytes:
        raw = canonical(self.body)
        return MAGIC + bytes([VERSION]) + _HEAD.pack(self.kind, len(raw)) + raw + self.signature


def canonical(body: dict[str, Any]) -> bytes:
    """The one encoding of a body that is signed (NoteError on a non-finite number)."""
    try:
        return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise NoteError("malformed", f"body cannot be encoded: {e}") from None


def _digest(kind: int, raw: bytes) -> bytes:
    return keccak(DOMAIN + _HEAD.pack(kind, len(raw)) + raw)


def sign(account: LocalAccount, kind: int, body: dict[str, Any]) -> Note:
    """A note of `kind` with `body` (chain_id, contract, job and the fields of its kind),
    its sender set to `account`, signed by it."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind} not in {sorted(KINDS)}")
    body = {**body, "sender": account.address}
    raw = canonical(body)
    if len(raw) > MAX_BODY:
        raise NoteError("oversized", f"body of {len(raw)} bytes > {MAX_BODY}")
    sig = bytes(account.unsafe_sign_hash(_digest(kind, raw)).signature)
    return Note(kind, json.loads(raw), sig)


def _reject(reason: str, msg: str) -> NoteError:
    return NoteError("malformed", f"{reason}: {msg}")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a finite number")


def decode(data: bytes, first: Callable[[Note], None] | None = None) -> Note:
    """Parse and authenticate a note: its body names a sender and that sender signed it.
    Raises NoteError (never anything else): `malformed`, `oversized` or `bad_signature`.
    `first` runs the caller's cheap checks (about what, from whom) on the parsed note before
    the signature is recovered, so junk from outsiders costs no ECDSA recovery."""
    data = _FRAME.open(data, _reject)
    kind, n = _HEAD.unpack_from(data, len(MAGIC) + 1)
    if kind not in KINDS or len(data) != _HEADER_LEN + n + SIG_LEN:
        raise NoteError("malformed", f"kind {kind}, {len(data)} bytes for a {n}-byte body")
    raw, sig = data[_HEADER_LEN : _HEADER_LEN + n], data[_HEADER_LEN + n :]
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise NoteError("malformed", f"body is not JSON: {e}") from None
    _check_body(body)
    if raw != canonical(body):
        raise NoteError("malformed", "body is not in its canonical encoding")
    if first is not None:
        first(Note(kind, body, sig))
    if sig[64] not in (27, 28) or int.from_bytes(sig[32:64]) > _HALF_N:
        raise NoteError("bad_signature", "signature not canonical (v 27/28, low s)")
    try:
        signer = Account._recover_hash(_digest(kind, raw), signature=sig)
    except Exception as e:  # eth-keys raises several types for malformed r, s, v
        raise NoteError("bad_signature", f"cannot recover signer: {e}") from None
    if signer != body["sender"]:
        raise NoteError("bad_signature", f"signed by {signer}, not by {body['sender']}")
    return Note(kind, body, sig)


def _check_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise NoteError("malformed", "body is not a JSON object")
    for name, typ in _REQUIRED.items():
        value = body.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise NoteError("malformed", f"body field {name!r} missing or not {typ.__name__}")
    for name in ("contract", "sender"):
        try:
            if to_checksum_address(body[name]) != body[name]:
                raise ValueError("not checksummed")
        except ValueError:
            raise NoteError("malformed", f"{name} {body[name]!r} is not an address") from None
    for value in body.values():
        if isinstance(value, float) and not math.isfinite(value):
            raise NoteError("malformed", "non-finite number")


def check_about(note: Note, chain_id: int, contract: str, job: int, kind: int) -> None:
    """NoteError `other_job` unless the note is of `kind` about this chain, contract and job."""
    b = note.body
    if note.kind != kind or (b["chain_id"], b["contract"], b["job"]) != (chain_id, contract, job):
        raise NoteError(
            "other_job",
            f"{KINDS[note.kind]} about job {b['job']} on chain {b['chain_id']} at "
            f"{b['contract']}, not {KINDS[kind]} about job {job}",
        )
