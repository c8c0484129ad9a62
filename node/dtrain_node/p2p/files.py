"""File transfer `/dtrain/ckpt/1.0.0` (docs/protocol.md 5): serving files by sha256, and fetching
them from peers so that only a verified file reaches its destination.

Used for checkpoints (a `GossipNode` serves and fetches them) and for a job's model and dataset
(`dataserve.DataPeer`). A fetch may be resumable: the bytes go to `<dest>.part`, which survives
a dropped connection, and the next fetch asks for the rest only (a version 2 request carries
the offset); the prefix already on disk is hashed again, so the whole file is still verified.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from dtrain_node.errors import CheckpointUnavailable
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p import wire
from dtrain_node.p2p.metrics import Metrics

if TYPE_CHECKING:
    from dtrain_node.p2p.config import PeerSpec

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes on disk, of total); called on the host's thread
IDLE_TIMEOUT_S = 60.0  # a fetch gives up on a peer that sends nothing for this long
# Whatever its caller's deadline, a transfer gives up on a peer (and asks the next) that
# sends slower than this on average, past a grace for the first bytes: a peer sending a byte
# every minute holds nothing up for good.
LEAST_RATE = 64 << 10  # bytes per second
RATE_GRACE_S = 10.0
DRIP_S = 55.0  # fault `drip`: one byte of a private state per this many seconds
STATE_SUFFIX = ".dtps"  # a private-state file (spotcheck.StateRing)


class FileHostState(Protocol):
    """What the file service uses of its host: `p2p.state.HostState` or a data peer's."""

    config: Any  # .request_timeout_s, .file_timeout_s, .max_file_bytes
    metrics: Metrics
    host: Any
    store: Any  # .dropped: a Counter


class Rejected(CheckpointUnavailable):
    """A peer delivered something else than the file asked for (or announced too much)."""


class _RestartFromZero(Exception):
    """A resumed download did not verify; the partial file is gone, ask again from byte 0."""


def sha256_bytes(sha256_hex: str) -> bytes:
    sha = bytes.fromhex(sha256_hex.removeprefix("0x"))
    if len(sha) != 32:
        raise ValueError(f"sha256 must be 32 bytes, got {len(sha)}")
    return sha


def sha256_file(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.digest()


def part_path(dest: Path) -> Path:
    """Where a resumable fetch of `dest` keeps its bytes until they verify."""
    return dest.with_name(dest.name + ".part")


class FileService:
    def __init__(self, state: FileHostState, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self._state = state
        self._files: dict[bytes, Path] = {}  # sha256 -> path, checked when added
        self._dialing: dict[Any, trio.Lock] = {}
        self.idle_timeout_s = idle_timeout_s

    def add(self, sha: bytes, path: Path) -> None:
        self._files[sha] = path

    # -- serving -----------------------------------------------------------------------------
    async def serve(self, stream: Any) -> None:
        """Stream handler: send the file a peer asks for by sha256, from the offset it asks."""
        peer = stream.muxed_conn.peer_id.to_base58()
        try:
            with trio.fail_after(self._state.config.request_timeout_s):
                request = await wire.read_frame(stream, wire.MAX_FILE_REQUEST)
                sha, offset, version = wire.decode_file_request(request)
            path = self._files.get(sha)
            if getattr(self._state.config, "stall_files", False):
                await self._stall(stream, version)
                return
            if path is None or not path.exists():
                await wire.write_frame(
                    stream, wire.encode_ckpt_reply(wire.CKPT_NOT_FOUND, 0, version)
                )
                return
            with path.open("rb") as f:
                if path.suffix == STATE_SUFFIX and getattr(self._state.config, "drip_states", 0):
                    await self._drip(stream, f, offset, version)
                    return
                await self._send(stream, f, offset, version, peer)
        except Exception as e:
            log.debug("serving a file to %s failed: %r", peer, e)
        finally:
            await wire.close_quietly(stream)

    async def _stall(self, stream: Any, version: int) -> None:
        """Fault `stall`: "found, 1 MiB", then nothing until the serving timeout."""
        await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_OK, 1 << 20, version))
        with trio.move_on_after(self._state.config.file_timeout_s):
            await trio.sleep_forever()

    async def _drip(self, stream: Any, f: BinaryIO, offset: int, version: int) -> None:
        """Fault `drip`: the file's true size, then one byte per DRIP_S, until the serving
        timeout."""
        size = os.fstat(f.fileno()).st_size
        await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_OK, size, version))
        f.seek(offset)
        with trio.move_on_after(self._state.config.file_timeout_s):
            while block := f.read(1):
                await wire.write_frame(stream, block)
                await trio.sleep(DRIP_S)

    async def _send(self, stream: Any, f: BinaryIO, offset: int, version: int, peer: str) -> None:
        size = os.fstat(f.fileno()).st_size
        if offset > size:
            await wire.write_frame(
                stream, wire.encode_ckpt_reply(wire.CKPT_BAD_OFFSET, size, version)
            )
            return
        await wire.write_frame(stream, wire.encode_ckpt_reply(wire.CKPT_OK, size, version))
        f.seek(offset)
        left = size - offset
        with trio.fail_after(self._state.config.file_timeout_s):
            while left > 0:
                block = f.read(min(wire.CKPT_CHUNK, left))
                if not block:
                    break  # file shrank: the fetcher sees a short transfer
                await wire.write_frame(stream, block)
                left -= len(block)
                self._state.metrics.add_out(peer, len(block) + 4)

    # -- fetching ----------------------------------------------------------------------------
    async def fetch(
        self,
        sha: bytes,
        peers: list[PeerSpec],
        dest: Path,
        *,
        resume: bool = False,
        progress: Progress | None = None,
        max_bytes: int | None = None,
    ) -> Path:
        """Fetch from the first peer that delivers the file intact (see GossipNode.fetch_file).

        resume: keep the bytes of an interrupted transfer in `part_path(dest)` and continue
        from there next time (a part that then fails to verify is dropped and the file asked
        for again from byte 0). Files over max_bytes (default: the host's max_file_bytes) are
        refused before a byte of them is read."""
        limit = self._state.config.max_file_bytes if max_bytes is None else max_bytes
        errors = []
        for key, addrs in peers:
            info = ident.peer_info(key, addrs)
            part = part_path(dest) if resume else dest.with_name(f".{dest.name}.part-{os.getpid()}")
            try:
                for _ in range(2):
                    try:
                        with trio.fail_after(self._state.config.request_timeout_s):
                            await self._connect(info)
                        await self._fetch_from(info.peer_id, sha, part, limit, progress)
                        break
                    except _RestartFromZero:
                        continue
                else:
                    raise Rejected("a resumed download did not verify, nor did a fresh one")
                os.replace(part, dest)
                return dest
            except Exception as e:
                errors.append(f"{info.peer_id}: {e}")
                self._state.store.dropped["file_rejected"] += 1
                if isinstance(e, Rejected):
                    part.unlink(missing_ok=True)
            finally:
                if not resume:
                    part.unlink(missing_ok=True)
        raise CheckpointUnavailable(
            f"no peer delivered {sha.hex()}: {'; '.join(errors) or 'no peers'}"
        )

    async def race(
        self, sha: bytes, peers: list[PeerSpec], dest: Path, *, max_bytes: int | None = None
    ) -> Path:
        """Ask every peer at once; the first intact copy wins and the other transfers stop (a
        peer that answers and then sends nothing holds up nobody)."""
        tries = [dest.with_name(f".{dest.name}.from-{i}") for i in range(len(peers))]
        won: list[Path] = []

        async def one(peer: PeerSpec, path: Path, scope: trio.CancelScope) -> None:
            try:
                won.append(await self.fetch(sha, [peer], path, max_bytes=max_bytes))
            except CheckpointUnavailable:
                return
            scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                for peer, path in zip(peers, tries, strict=True):
                    nursery.start_soon(one, peer, path, nursery.cancel_scope)
            if not won:
                raise CheckpointUnavailable(f"no peer delivered {sha.hex()}")
            os.replace(won[0], dest)
            return dest
        finally:
            for path in tries:
                path.unlink(missing_ok=True)

    async def _connect(self, info: Any) -> None:
        host = self._state.host
        # one dial per peer at a time: fetches run at once (`race`, a referee's files)
        async with self._dialing.setdefault(info.peer_id, trio.Lock()):
            if info.peer_id not in host.get_connected_peers():
                # libp2p dials one known TCP address per peer: forget where a restarted peer was
                host.peerstore.clear_addrs(info.peer_id)
            await host.connect(info)

    async def _fetch_from(
        self, pid: ID, sha: bytes, part: Path, limit: int, progress: Progress | None
    ) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.exists() else 0
        if offset > limit:
            part.unlink()
            offset = 0
        h = hashlib.sha256()
        if offset:
            with part.open("rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        timeout = self._state.config.request_timeout_s
        with trio.fail_after(timeout):
            stream = await self._state.host.new_stream(pid, [TProtocol(wire.CKPT_PROTOCOL)])
        try:
            version = wire.RESUME_VERSION if offset else wire.VERSION
            with trio.fail_after(timeout):
                await wire.write_frame(stream, wire.encode_ckpt_request(sha, offset))
                reply = await wire.read_frame(stream, 64)
            status, size = wire.decode_ckpt_reply(reply, version)
            if status == wire.CKPT_BAD_OFFSET or (status == wire.CKPT_OK and offset > size):
                part.unlink()
                raise _RestartFromZero
            if status != wire.CKPT_OK:
                raise CheckpointUnavailable(f"peer answered status {status}")
            if size > limit:
                raise Rejected(f"{size} bytes > limit {limit}")
            with part.open("ab") as f:
                await self._receive(stream, f, h, offset, size, pid.to_base58(), progress)
        finally:
            await wire.close_quietly(stream)
        digest = h.digest()
        if digest != sha:
            part.unlink()
            if offset:
                raise _RestartFromZero
            raise Rejected(f"sha256 {digest.hex()} != expected {sha.hex()}")

    async def _receive(
        self,
        stream: Any,
        f: BinaryIO,
        h: Any,
        got: int,
        size: int,
        peer: str,
        progress: Progress | None,
    ) -> None:
        """Append bytes `got`..`size` from the stream to f, hashing them into h."""
        if progress is not None:
            progress(got, size)
        by = trio.current_time() + RATE_GRACE_S + (size - got) / LEAST_RATE
        while got < size:
            try:
                with trio.fail_at(min(by, trio.current_time() + self.idle_timeout_s)):
                    block = await wire.read_frame(stream, wire.CKPT_CHUNK)
            except wire.WireError as e:
                if e.reason == "oversized":
                    raise Rejected(str(e)) from None
                raise
            except trio.TooSlowError:
                if trio.current_time() < by:
                    raise
                raise CheckpointUnavailable(
                    f"{got} of {size} bytes: slower than {LEAST_RATE >> 10} KiB/s"
                ) from None
            if not block or got + len(block) > size:
                raise Rejected(f"bad block after {got} of {size} bytes")
            h.update(block)
            f.write(block)
            got += len(block)
            self._state.metrics.add_in(peer, len(block) + 4)
            if progress is not None:
                progress(got, size)
