"""A job's model, dataset and recipe, fetched by content hash into a local cache.

A job names each by a URI:

- `p2p:<multiaddr>/p2p/<peer id>#sha256=<hex>`: from a libp2p peer (the caller's
  `dtrain data serve`), over the file protocol (docs/protocol.md 5);
- `https://host/path#sha256=<hex>` (or http://): the fragment may be left out for the dataset,
  whose on-chain hash is its file's sha256;
- `file://PATH` or a plain path: a file or folder on this machine, used where it is (the
  dataset loader checks the dataset's sha256);
- `builtin:...` and `hf://org/name@rev` model references: passed on unchanged.

A fetched file lands in `<cache>/sha256/<hex>` only once its bytes hash to `<hex>`; a transfer
in progress lives in `<hex>.part` and the next fetch resumes it. A model is a pack (a
deterministic tar of its folder, `p2p.packs`) unpacked into `<cache>/models/<hex>/`, the folder
the job's model is then loaded from. Files bigger than `Cache.max_bytes` are refused before
their bytes are read. A cached file is hashed again before its first use in a process (and
whenever its size or mtime change): cheap next to training on it (sha256 runs at about 1 GB/s),
and it catches a cache file changed on disk. Processes sharing a cache take a lock per hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain_node.errors import CheckpointUnavailable, DatasetError, ModelUnavailable, RecipeInvalid
from dtrain_node.p2p import files, packs
from dtrain_node.p2p.dataserve import DEFAULT_MAX_BYTES
from dtrain_node.train.job import LocalSources

if TYPE_CHECKING:
    from dtrain.models import Job
    from dtrain_node.p2p.dataserve import DataPeer

log = logging.getLogger("dtrain.sources")

DEFAULT_CACHE = Path("~/.dtrain/cache")
PASS_THROUGH = ("builtin:", "hf://")  # model references a backend resolves itself
HTTP_BLOCK = 1 << 20

_verified: dict[Path, tuple[int, int]] = {}  # cache file -> (size, mtime_ns) when it verified


@dataclass(frozen=True)
class Cache:
    """Where fetched files go, and how much a peer may make us fetch."""

    root: Path = DEFAULT_CACHE
    max_bytes: int = DEFAULT_MAX_BYTES  # per file (a dataset, or a model's pack)
    max_files: int = packs.MAX_PACK_FILES  # per model pack
    timeout_s: float = 30.0  # to reach a peer or server; also the longest silence mid-transfer
    progress: str = "auto"  # "bar" (rich), "log" (a line every few seconds), "auto": bar on a tty

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).expanduser())
        if self.progress not in ("auto", "bar", "log"):
            raise ValueError(f"progress {self.progress!r}: auto, bar or log")

    def file(self, sha256_hex: str) -> Path:
        return self.root / "sha256" / sha256_hex

    def model_dir(self, sha256_hex: str) -> Path:
        return self.root / "models" / sha256_hex


def split_hash(uri: str) -> tuple[str, bytes | None]:
    """(uri without its `#sha256=` fragment, the sha256 it names or None)."""
    base, sep, frag = uri.partition("#")
    if not sep:
        return uri, None
    if not frag.startswith("sha256="):
        raise ValueError(f"{uri!r}: the fragment must be #sha256=<64 hex>")
    try:
        return base, files.sha256_bytes(frag.removeprefix("sha256="))
    except ValueError:
        raise ValueError(f"{uri!r}: #sha256= needs 64 hex digits") from None


def is_remote(uri: str) -> bool:
    return uri.startswith(("p2p:", "https://", "http://"))


class Fetcher:
    """Resolves URIs to local paths; starts a libp2p fetching host the first time a p2p URI
    needs it and stops it on `close()` (use it as a context manager)."""

    def __init__(self, cache: Cache, mirrors: list[tuple[bytes, list[str]]] | None = None) -> None:
        self.cache = cache
        # Peers that may also hold a p2p-named file by its hash (a job's members keep what they
        # fetched): tried after the URI's own peer, which may have stopped serving.
        self.mirrors = list(mirrors or [])
        self._peer: DataPeer | None = None

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._peer is not None:
            self._peer.stop()
            self._peer = None

    def file(
        self,
        uri: str,
        sha256: bytes | None = None,
        what: str = "file",
        error: type[Exception] = DatasetError,
    ) -> Path:
        """The local path of the file `uri` names, fetched and verified if remote. `sha256` is
        the hash the job pins for it (None or zeros: the URI's fragment must name one for a
        remote file). Raises `error` ("<what> <uri>: why") when it cannot be had intact."""
        pinned = sha256 if sha256 is not None and any(sha256) else None
        try:
            base, named = split_hash(uri)
        except ValueError as exc:
            raise error(f"{what} {uri}: {exc}") from None
        if named is not None and pinned is not None and named != pinned:
            raise error(f"{what} {uri}: sha256 {named.hex()} != pinned {pinned.hex()}")
        want = named or pinned
        if not is_remote(uri):
            path = Path(base.removeprefix("file://")).expanduser()
            if named is not None:  # else the loader checks the pinned hash as it reads it
                self._check_in_place(path, named, what, uri, error)
            return path
        if want is None:
            raise error(f"{what} {uri}: a remote file needs #sha256=<hex> in its URI")
        try:
            return self._cached(uri, base, want, what)
        except (CheckpointUnavailable, OSError, ValueError, packs.PackError) as exc:
            raise error(f"{what} {uri}: {exc}") from None

    def model(self, uri: str) -> str:
        """A model reference a backend loads: a local folder for a fetched pack (unpacked in
        the cache), `uri` itself for builtin:, hf:// and local references."""
        if uri.startswith(PASS_THROUGH):
            return uri
        try:
            _, sha = split_hash(uri)
        except ValueError as exc:
            raise ModelUnavailable(f"model {uri}: {exc}") from None
        if sha is None:
            if is_remote(uri):
                raise ModelUnavailable(f"model {uri}: a remote model needs #sha256=<pack hash>")
            return uri  # a local folder or config
        pack = self.file(uri, None, "model", ModelUnavailable)
        folder = self.cache.model_dir(sha.hex())
        with _locked(folder.with_name(folder.name + ".lock")):
            if not folder.is_dir():
                try:
                    packs.unpack(pack, folder, self.cache.max_files, self.cache.max_bytes)
                except packs.PackError as exc:
                    raise ModelUnavailable(f"model {uri}: {exc}") from None
        return str(folder)

    # -- fetching ----------------------------------------------------------------------------
    def _check_in_place(
        self, path: Path, want: bytes, what: str, uri: str, error: type[Exception]
    ) -> None:
        if not path.is_file():
            raise error(f"{what} {uri}: {path} is not a file")
        got = files.sha256_file(path)
        if got != want:
            raise error(f"{what} {uri}: sha256 {got.hex()} != pinned {want.hex()}")

    def _cached(self, uri: str, base: str, sha: bytes, what: str) -> Path:
        dest = self.cache.file(sha.hex())
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _locked(dest.with_name(dest.name + ".lock")):
            if dest.exists():
                if _still_verified(dest, sha):
                    return dest
                log.warning("cached %s %s changed on disk; fetching it again", what, dest)
                dest.unlink()
            part = files.part_path(dest)
            resumed = part.stat().st_size if part.exists() else 0
            t0 = time.monotonic()
            with _progress(f"{what} {sha.hex()[:12]}", self.cache.progress) as bar:
                if uri.startswith("p2p:"):
                    moved = self._p2p(uri, dest, bar)
                else:
                    moved = _http(base, sha, dest, self.cache, bar)
            _verified[dest] = _stamp(dest)
            secs = time.monotonic() - t0
            size = dest.stat().st_size
            log.info(
                "fetched %s %s: %.1f MB in %.1f s (%.1f MB/s)%s, verified sha256 %s",
                what,
                uri.split("#")[0],
                size / 1e6,
                secs,
                moved / 1e6 / max(secs, 1e-9),
                f", resumed at {resumed / 1e6:.1f} MB" if resumed else "",
                sha.hex()[:16],
            )
            return dest

    def _p2p(self, uri: str, dest: Path, bar: files.Progress) -> int:
        from dtrain_node.p2p.dataserve import DataConfig, DataPeer, parse_p2p_uri

        ref = parse_p2p_uri(uri)
        if self._peer is None:
            cfg = DataConfig(
                request_timeout_s=self.cache.timeout_s,
                idle_timeout_s=self.cache.timeout_s,
                max_file_bytes=self.cache.max_bytes,
            )
            silence_libp2p()
            self._peer = DataPeer(cfg).start()
        before = self._peer.metrics()["bytes_in_total"]
        peers = [ref.peer, *(m for m in self.mirrors if m[0] != ref.peer[0])]
        self._peer.fetch(ref.sha256.hex(), peers, dest, resume=True, progress=bar)
        return self._peer.metrics()["bytes_in_total"] - before


def fetch_job(job: Job, cache: Cache) -> LocalSources:
    """Everything `job` trains from, fetched and verified: its model (a p2p or https pack
    becomes a folder in the cache), its dataset (checked against `datasetHash`) and its recipe
    file (checked against `recipeHash` by `train.job.load_recipe`). Raises ModelUnavailable,
    DatasetError or RecipeInvalid saying which reference failed and why."""
    spec = job.spec
    with Fetcher(cache) as f:
        model = f.model(spec.model_uri)
        data = f.file(spec.dataset_uri, bytes(spec.dataset_hash), "dataset", DatasetError)
        recipe = spec.recipe_uri
        if recipe and any(bytes(spec.recipe_hash)):
            recipe = str(f.file(recipe, None, "recipe", RecipeInvalid))
    return LocalSources(model, str(data), recipe)


def resolve_file(
    uri: str,
    sha256: bytes | None,
    cache: Cache,
    what: str = "file",
    mirrors: list[tuple[bytes, list[str]]] | None = None,
) -> Path:
    """The local path of the file `uri` names (see `Fetcher.file`); DatasetError if not had."""
    with Fetcher(cache, mirrors) as f:
        return f.file(uri, sha256, what)


def resolve_model(
    uri: str, cache: Cache, mirrors: list[tuple[bytes, list[str]]] | None = None
) -> str:
    """A model reference a backend loads (see `Fetcher.model`); ModelUnavailable if not had."""
    with Fetcher(cache, mirrors) as f:
        return f.model(uri)


def cached_job_files(job: Job, cache: Cache) -> list[tuple[str, Path]]:
    """(sha256 hex, path) of the job's p2p-named files in our cache: what a member serves on to
    late joiners and to the caller's `job fetch` once the caller stopped serving."""
    out = []
    for uri in (job.spec.model_uri, job.spec.dataset_uri, job.spec.recipe_uri):
        if not uri.startswith("p2p:"):
            continue
        try:
            _, sha = split_hash(uri)
        except ValueError:
            continue
        path = cache.file(sha.hex()) if sha else None
        if path is not None and path.is_file():
            out.append((sha.hex(), path))
    return out


def silence_libp2p() -> None:
    """libp2p logs every failed dial attempt; ours is one line per fetch."""
    lg = logging.getLogger("libp2p")
    if lg.level < logging.CRITICAL:
        lg.setLevel(logging.CRITICAL)


# -- helpers ---------------------------------------------------------------------------------
def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _still_verified(path: Path, sha: bytes) -> bool:
    if _verified.get(path) == _stamp(path):
        return True
    if files.sha256_file(path) != sha:
        return False
    _verified[path] = _stamp(path)
    return True


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _http(url: str, sha: bytes, dest: Path, cache: Cache, bar: files.Progress) -> int:
    """Download url to dest via `<dest>.part` (resumed with a Range request), verified."""
    part = files.part_path(dest)
    for _ in range(2):
        offset = part.stat().st_size if part.exists() else 0
        moved, digest = _http_once(url, part, offset, cache, bar)
        if digest == sha:
            os.replace(part, dest)
            return moved
        part.unlink(missing_ok=True)
        if not offset:
            raise CheckpointUnavailable(f"sha256 {digest.hex()} != expected {sha.hex()}")
    raise CheckpointUnavailable(f"sha256 {digest.hex()} != expected {sha.hex()}")


def _http_once(
    url: str, part: Path, offset: int, cache: Cache, bar: files.Progress
) -> tuple[int, bytes]:
    import requests

    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with requests.get(url, headers=headers, stream=True, timeout=cache.timeout_s) as r:
        if r.status_code == 416 and offset:  # the part is longer than the file
            part.unlink()
            return _http_once(url, part, 0, cache, bar)
        if r.status_code not in (200, 206):
            raise CheckpointUnavailable(f"HTTP {r.status_code}")
        if r.status_code == 200 or not r.headers.get("Content-Range", "").startswith(
            f"bytes {offset}-"
        ):
            offset = 0  # the server sends the whole file
        length = r.headers.get("Content-Length")
        total = offset + int(length) if length is not None else 0
        if total > cache.max_bytes:
            raise files.Rejected(f"{total} bytes > limit {cache.max_bytes}")
        # a server slower than LEAST_RATE on average is given up: its socket is shut down
        left = (total or cache.max_bytes) - offset
        cut = threading.Event()
        cutoff = threading.Timer(files.RATE_GRACE_S + left / files.LEAST_RATE, _cut, (r, cut))
        cutoff.daemon = True
        cutoff.start()
        try:
            return _http_body(r, part, offset, total, cache, bar)
        except Exception as exc:
            if not cut.is_set():
                raise
            raise CheckpointUnavailable(
                f"{url}: slower than {files.LEAST_RATE >> 10} KiB/s ({exc})"
            ) from None
        finally:
            cutoff.cancel()


def _cut(r: Any, cut: threading.Event) -> None:
    """Ends a streaming response now, from another thread: shuts its socket down (closing
    the response instead would wait for the read in progress, a byte at a time); `cut` is
    set first, so the reader knows why its read failed."""
    cut.set()
    fp = getattr(getattr(r.raw, "_fp", None), "fp", None)
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    if sock is None:
        r.close()
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _http_body(
    r: Any, part: Path, offset: int, total: int, cache: Cache, bar: files.Progress
) -> tuple[int, bytes]:
    """The response's body appended to `part` (from `offset`), hashed with what it holds."""
    h = hashlib.sha256()
    with part.open("r+b" if offset else "wb") as f:
        while offset and (block := f.read(HTTP_BLOCK)):
            h.update(block)
        f.seek(offset)
        f.truncate()
        got, moved = offset, 0
        for block in r.iter_content(HTTP_BLOCK):
            got += len(block)
            moved += len(block)
            if got > cache.max_bytes:
                part.unlink()
                raise files.Rejected(f"more than {cache.max_bytes} bytes")
            h.update(block)
            f.write(block)
            bar(got, max(total, got))
    return moved, h.digest()


class _LogProgress:
    """A line when a transfer starts, every `every_s` seconds, and when it ends."""

    def __init__(self, label: str, every_s: float = 5.0) -> None:
        self.label, self.every_s = label, every_s
        self.last = 0.0
        self.done = self.total = 0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        first = self.last == 0.0
        self.done, self.total = done, total
        if first or now - self.last >= self.every_s:
            self.last = now
            pct = 100 * done / total if total else 100.0
            verb = "fetching" if first and done == 0 else "resuming" if first else "fetched"
            log.info(
                "%s %s: %.1f of %.1f MB (%.0f%%)", verb, self.label, done / 1e6, total / 1e6, pct
            )


@contextlib.contextmanager
def _progress(label: str, mode: str) -> Iterator[files.Progress]:
    if mode == "log" or (mode == "auto" and not sys.stderr.isatty()):
        yield _LogProgress(label)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update
