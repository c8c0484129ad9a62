"""Framing and messages of the two stream protocols (sync re-requests, checkpoint transfer).

Every message is a frame: uint32 big-endian length, then that many bytes. A reader refuses a
frame longer than its limit before reading the body, so a peer cannot make us buffer 10 MiB.
Layouts are specified in docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from eth_utils import to_checksum_address

from dtrain_node.errors import WireError

SYNC_PROTOCOL = "/dtrain/sync/1.0.0"
CKPT_PROTOCOL = "/dtrain/ckpt/1.0.0"
VERSION = 1
MAX_REQUEST = 64 * 1024  # a sync request lists at most a few hundred (sender, digest) pairs
CKPT_CHUNK = 256 * 1024

SYNC_OK, SYNC_BUSY, SYNC_WRONG_JOB = 0, 1, 2
CKPT_OK, CKPT_NOT_FOUND = 0, 1


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
_SQ = struct.Struct(">4sB32sQQH")
_SR = struct.Struct(">4sBBBHI")
_HAVE = struct.Struct(">20s32s")


@dataclass(frozen=True)
class SyncRequest:
    job_id: int
    epoch: int
    round: int
    have: tuple[tuple[str, bytes], ...]

    def encode(self) -> bytes:
        head = _SQ.pack(
            b"DTSQ",
            VERSION,
            self.job_id.to_bytes(32, "big"),
            self.epoch,
            self.round,
            len(self.have),
        )
        return head + b"".join(_HAVE.pack(bytes.fromhex(s[2:]), d) for s, d in self.have)


def decode_sync_request(data: bytes) -> SyncRequest:
    if len(data) < _SQ.size:
        raise WireError("malformed", f"sync request of {len(data)} bytes")
    magic, ver, job, epoch, rnd, n = _SQ.unpack_from(data)
    if magic != b"DTSQ" or ver != VERSION:
        raise WireError("malformed", f"sync request magic {magic!r} version {ver}")
    if len(data) != _SQ.size + n * _HAVE.size:
        raise WireError("malformed", f"sync request length {len(data)} for {n} entries")
    have = _unpack_have(data, _SQ.size, n)
    return SyncRequest(int.from_bytes(job, "big"), epoch, rnd, have)


@dataclass(frozen=True)
class SyncReply:
    status: int
    phase: int
    have: tuple[tuple[str, bytes], ...]
    count: int  # envelope frames that follow

    def encode(self) -> bytes:
        head = _SR.pack(b"DTSR", VERSION, self.status, self.phase, len(self.have), self.count)
        return head + b"".join(_HAVE.pack(bytes.fromhex(s[2:]), d) for s, d in self.have)


def decode_sync_reply(data: bytes) -> SyncReply:
    if len(data) < _SR.size:
        raise WireError("malformed", f"sync reply of {len(data)} bytes")
    magic, ver, status, phase, n, count = _SR.unpack_from(data)
    if magic != b"DTSR" or ver != VERSION or phase > 3:
        raise WireError("malformed", f"sync reply magic {magic!r} version {ver} phase {phase}")
    if len(data) != _SR.size + n * _HAVE.size:
        raise WireError("malformed", f"sync reply length {len(data)} for {n} entries")
    return SyncReply(status, phase, _unpack_have(data, _SR.size, n), count)


def _unpack_have(data: bytes, off: int, n: int) -> tuple[tuple[str, bytes], ...]:
    out = []
    for i in range(n):
        s, d = _HAVE.unpack_from(data, off + i * _HAVE.size)
        out.append((to_checksum_address(s), d))
    return tuple(out)


# -- checkpoint: "send me the file with this sha256" -----------------------------------------
_CQ = struct.Struct(">4sB32s")
_CR = struct.Struct(">4sBBQ")


def encode_ckpt_request(sha256: bytes) -> bytes:
    return _CQ.pack(b"DTCQ", VERSION, sha256)


def decode_ckpt_request(data: bytes) -> bytes:
    if len(data) != _CQ.size:
        raise WireError("malformed", f"checkpoint request of {len(data)} bytes")
    magic, ver, sha = _CQ.unpack(data)
    if magic != b"DTCQ" or ver != VERSION:
        raise WireError("malformed", f"checkpoint request magic {magic!r} version {ver}")
    return sha


def encode_ckpt_reply(status: int, size: int) -> bytes:
    return _CR.pack(b"DTCR", VERSION, status, size)


def decode_ckpt_reply(data: bytes) -> tuple[int, int]:
    if len(data) != _CR.size:
        raise WireError("malformed", f"checkpoint reply of {len(data)} bytes")
    magic, ver, status, size = _CR.unpack(data)
    if magic != b"DTCR" or ver != VERSION:
        raise WireError("malformed", f"checkpoint reply magic {magic!r} version {ver}")
    return status, size
