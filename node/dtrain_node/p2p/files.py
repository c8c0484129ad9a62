"""Checkpoint transfer `/dtrain/ckpt/1.0.0` (docs/protocol.md 5): serving finalized files by
sha256, and fetching them from peers so that only a verified file reaches its destination.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from dtrain_node.errors import CheckpointUnavailable
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p import wire
from dtrain_node.p2p.state import HostState

if TYPE_CHECKING:
    from dtrain_node.p2p.host import PeerSpec

log = logging.getLogger(__name__)


def sha256_bytes(sha256_hex: str) -> bytes:
    sha = bytes.fromhex(sha256_hex)
    if len(sha) != 32:
        raise ValueError(f"sha256 must be 32 bytes, got {len(sha)}")
    return sha


def sha256_file(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.digest()


class FileService:
    def __init__(self, state: HostState) -> None:
        self._state = state
        self._files: dict[bytes, Path] = {}  # sha256 -> path, checked when added

    def add(self, sha: bytes, path: Path) -> None:
        self._files[sha] = path

    async def serve(self, stream: Any) -> None:
        """Stream handler: send the file a peer asks for by sha256."""
        peer = stream.muxed_conn.peer_id.to_base58()
        try:
            with trio.fail_after(self._state.config.request_timeout_s):
                sha = wire.decode_ckpt_request(await wire.read_frame(stream, 64))
            path = self._files.get(sha)
            if path is None or not path.exists():
                await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_NOT_FOUND, 0))
                return
            with path.open("rb") as f:
                await self._send(stream, f, peer)
        except Exception as e:
            log.debug("serving a file to %s failed: %r", peer, e)
        finally:
            await wire.close_quietly(stream)

    async def _send(self, stream: Any, f: Any, peer: str) -> None:
        size = os.fstat(f.fileno()).st_size
        await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_OK, size))
        left = size
        with trio.fail_after(self._state.config.file_timeout_s):
            while left > 0:
                block = f.read(min(wire.CKPT_CHUNK, left))
                if not block:
                    break  # file shrank: the fetcher sees a short transfer
                await wire.write_frame(stream, block)
                left -= len(block)
                self._state.metrics.add_out(peer, len(block) + 4)

    async def fetch(self, sha: bytes, peers: list[PeerSpec], dest: Path) -> Path:
        """Fetch from the first peer that delivers the file intact (see GossipNode.fetch_file)."""
        errors = []
        for key, addrs in peers:
            info = ident.peer_info(key, addrs)
            tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
            try:
                with trio.fail_after(self._state.config.file_timeout_s):
                    await self._state.host.connect(info)
                    await self._fetch_from(info.peer_id, sha, tmp)
                os.replace(tmp, dest)
                return dest
            except Exception as e:
                errors.append(f"{info.peer_id}: {e}")
                self._state.store.dropped["file_rejected"] += 1
            finally:
                tmp.unlink(missing_ok=True)
        raise CheckpointUnavailable(
            f"no peer delivered {sha.hex()}: {'; '.join(errors) or 'no peers'}"
        )

    async def _fetch_from(self, pid: ID, sha: bytes, tmp: Path) -> None:
        stream = await self._state.host.new_stream(pid, [TProtocol(wire.CKPT_PROTOCOL)])
        try:
            await wire.write_frame(stream, wire.encode_ckpt_request(sha))
            status, size = wire.decode_ckpt_reply(await wire.read_frame(stream, 64))
            if status != wire.CKPT_OK:
                raise CheckpointUnavailable(f"peer answered status {status}")
            limit = self._state.config.max_file_bytes
            if size > limit:
                raise CheckpointUnavailable(f"{size} bytes > limit {limit}")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                digest = await self._receive(stream, f, size, pid.to_base58())
            if digest != sha:
                raise CheckpointUnavailable(f"sha256 {digest.hex()} != expected {sha.hex()}")
        finally:
            await wire.close_quietly(stream)

    async def _receive(self, stream: Any, f: Any, size: int, peer: str) -> bytes:
        """Write `size` bytes from the stream to f; their sha256."""
        h, got = hashlib.sha256(), 0
        while got < size:
            block = await wire.read_frame(stream, wire.CKPT_CHUNK)
            if not block or got + len(block) > size:
                raise CheckpointUnavailable(f"bad block after {got} of {size} bytes")
            h.update(block)
            f.write(block)
            got += len(block)
            self._state.metrics.add_in(peer, len(block) + 4)
        return h.digest()
