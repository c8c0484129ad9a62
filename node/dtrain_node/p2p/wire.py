"""Framing and messages of the two stream protocols (sync re-requests, file transfer).

Every message is a frame: uint32 big-endian length, then that many bytes. A reader refuses a
frame longer than its limit before reading the body, so a peer cannot make us buffer 10 MiB.
Layouts are specified in docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from eth_account import Account
from eth_utils import keccak, to_checksum_address

from dtrain_node.errors import WireError

SYNC_PROTOCOL = "/dtrain/sync/2.0.0"
CKPT_PROTOCOL = "/dtrain/ckpt/1.0.0"
VERSION = 1  # checkpoint messages
SYNC_VERSION = 2  # sync messages (2: commitments, signed replies)
MAX_PHASE = 5  # rounds.Phase.FINISHED
MAX_REQUEST = 64 * 1024  # a sync request lists at most a few hundred (sender, digest) pairs
CKPT_CHUNK = 256 * 1024

SYNC_OK, SYNC_BUSY, SYNC_WRONG_JOB = 0, 1, 2
CKPT_OK, CKPT_NOT_FOUND, CKPT_BUSY, CKPT_BAD_OFFSET = 0, 1, 2, 3


class Stream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...
    async def write(self, data: bytes) -> None: ...


async def read_exactly(stream: Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            part = await stream.read(n - len(buf))
        except Exception as e:  # libp2p raises several EOF/reset types
            raise WireError("eof", f"stream ended after {len(buf)} of {n} bytes ({e!r})") from None
        if not part:
            raise WireError("eof", f"stream ended after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)


async def read_frame(stream: Stream, max_len: int) -> bytes:
    (n,) = struct.unpack(">I", await read_exactly(stream, 4))
    if n > max_len:
        raise WireError("oversized", f"frame of {n} bytes > limit {max_len}")
    return await read_exactly(stream, n)


async def write_frame(stream: Stream, body: bytes) -> None:
    await stream.write(struct.pack(">I", len(body)) + body)


async def close_quietly(stream: Any) -> None:
    # the peer may have reset the stream already; there is nothing left to report
    with contextlib.suppress(Exception):
        await stream.close()


# -- sync: "send me what you hold for round r that I do not" ---------------------------------
_SQ = struct.Struct(">4sB32sQQ16sHH")
_SR = struct.Struct(">4sBBBHHI")
_HAVE = struct.Struct(">20s32s")
SIG_LEN = 65
REPLY_DOMAIN = b"dtrain/sync-reply/v2"

Have = tuple[tuple[str, bytes], ...]  # (sender, payload sha256) pairs


@dataclass(frozen=True)
class SyncRequest:
    job_id: int
    epoch: int
    round: int
    have: Have  # complete packets the asker holds
    commits: Have = ()  # commitments the asker holds
    nonce: bytes = bytes(16)  # random; the reply's signature covers it

    def encode(self) -> bytes:
        head = _SQ.pack(
            b"DTSQ",
            SYNC_VERSION,
            self.job_id.to_bytes(32, "big"),
            self.epoch,
            self.round,
            self.nonce,
            len(self.have),
            len(self.commits),
        )
        return head + _pack_have(self.have) + _pack_have(self.commits)


def decode_sync_request(data: bytes) -> SyncRequest:
    if len(data) < _SQ.size:
        raise WireError("malformed", f"sync request of {len(data)} bytes")
    magic, ver, job, epoch, rnd, nonce, n, m = _SQ.unpack_from(data)
    if magic != b"DTSQ" or ver != SYNC_VERSION:
        raise WireError("malformed", f"sync request magic {magic!r} version {ver}")
    if len(data) != _SQ.size + (n + m) * _HAVE.size:
        raise WireError("malformed", f"sync request length {len(data)} for {n}+{m} entries")
    have = _unpack_have(data, _SQ.size, n)
    commits = _unpack_have(data, _SQ.size + n * _HAVE.size, m)
    return SyncRequest(int.from_bytes(job, "big"), epoch, rnd, have, commits, nonce)


@dataclass(frozen=True)
class SyncReply:
    status: int
    phase: int
    have: Have
    count: int  # envelope frames that follow (commitments first, then packet chunks)
    commits: Have = ()
    signature: bytes = b""  # the responder's, over signing_digest(nonce)

    def body(self) -> bytes:
        head = _SR.pack(
            b"DTSR",
            SYNC_VERSION,
            self.status,
            self.phase,
            len(self.have),
            len(self.commits),
            self.count,
        )
        return head + _pack_have(self.have) + _pack_have(self.commits)

    def signing_digest(self, nonce: bytes) -> bytes:
        return keccak(REPLY_DOMAIN + nonce + self.body())

    def encode(self) -> bytes:
        return self.body() + (self.signature or bytes(SIG_LEN))

    def signer(self, nonce: bytes) -> str | None:
        """The address that signed this reply to the request with this nonce (None: none)."""
        try:
            return Account._recover_hash(self.signing_digest(nonce), signature=self.signature)
        except Exception:  # eth-keys raises several types for malformed r, s, v
            return None


def decode_sync_reply(data: bytes) -> SyncReply:
    if len(data) < _SR.size + SIG_LEN:
        raise WireError("malformed", f"sync reply of {len(data)} bytes")
    magic, ver, status, phase, n, m, count = _SR.unpack_from(data)
    if magic != b"DTSR" or ver != SYNC_VERSION or phase > MAX_PHASE:
        raise WireError("malformed", f"sync reply magic {magic!r} version {ver} phase {phase}")
    if len(data) != _SR.size + (n + m) * _HAVE.size + SIG_LEN:
        raise WireError("malformed", f"sync reply length {len(data)} for {n}+{m} entries")
    have = _unpack_have(data, _SR.size, n)
    commits = _unpack_have(data, _SR.size + n * _HAVE.size, m)
    sig = data[-SIG_LEN:]
    return SyncReply(status, phase, have, count, commits, b"" if sig == bytes(SIG_LEN) else sig)


def _pack_have(have: Have) -> bytes:
    return b"".join(_HAVE.pack(bytes.fromhex(s[2:]), d) for s, d in have)


def _unpack_have(data: bytes, off: int, n: int) -> Have:
    out = []
    for i in range(n):
        s, d = _HAVE.unpack_from(data, off + i * _HAVE.size)
        out.append((to_checksum_address(s), d))
    return tuple(out)


# -- file transfer: "send me the file with this sha256 (from byte `offset` on)" -----------------
# Version 1 requests start at byte 0; version 2 requests carry an offset (a resumed download).
# A server answers in the version it was asked in; its reply's size is always the whole file's.
_CQ = struct.Struct(">4sB32s")
_CQ2 = struct.Struct(">4sB32sQ")
_CR = struct.Struct(">4sBBQ")
RESUME_VERSION = 2
MAX_FILE_REQUEST = _CQ2.size


def encode_ckpt_request(sha256: bytes, offset: int = 0) -> bytes:
    """Version 1 when offset is 0 (every server reads it), else version 2."""
    if offset == 0:
        return _CQ.pack(b"DTCQ", VERSION, sha256)
    return _CQ2.pack(b"DTCQ", RESUME_VERSION, sha256, offset)


def decode_ckpt_request(data: bytes) -> bytes:
    """The sha256 a request asks for (see decode_file_request for its offset)."""
    return decode_file_request(data)[0]


def decode_file_request(data: bytes) -> tuple[bytes, int, int]:
    """(sha256, offset, version) of a version 1 or 2 request."""
    if len(data) == _CQ.size:
        magic, ver, sha = _CQ.unpack(data)
        offset = 0
    elif len(data) == _CQ2.size:
        magic, ver, sha, offset = _CQ2.unpack(data)
        if ver != RESUME_VERSION:
            raise WireError("malformed", f"file request of {len(data)} bytes, version {ver}")
    else:
        raise WireError("malformed", f"checkpoint request of {len(data)} bytes")
    if magic != b"DTCQ" or ver not in (VERSION, RESUME_VERSION):
        raise WireError("malformed", f"checkpoint request magic {magic!r} version {ver}")
    return sha, offset, ver


def encode_ckpt_reply(status: int, size: int, version: int = VERSION) -> bytes:
    return _CR.pack(b"DTCR", version, status, size)


def decode_ckpt_reply(data: bytes, version: int = VERSION) -> tuple[int, int]:
    if len(data) != _CR.size:
        raise WireError("malformed", f"checkpoint reply of {len(data)} bytes")
    magic, ver, status, size = _CR.unpack(data)
    if magic != b"DTCR" or ver != version:
        raise WireError("malformed", f"checkpoint reply magic {magic!r} version {ver}")
    return status, size
