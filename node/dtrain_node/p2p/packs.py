"""Model folders as deterministic tar "packs", so a folder has one sha256 to fetch it by.

A pack is an uncompressed POSIX (pax) tar of the folder's regular files, sorted by relative
path, each with mode 0644, mtime 0, uid/gid 0 and no owner names; no directory entries, no
links. Hidden entries (any path component starting with ".") are left out; a symlink to a
regular file is packed as that file's bytes (a Hugging Face hub snapshot is made of them).
The same files give the same bytes, whenever and wherever they are packed.

`unpack` extracts only what `pack_folder` writes: it refuses absolute paths, `..`, links,
devices, directories, duplicate names, more than `max_files` files or `max_bytes` bytes, and
extracts into a temporary folder renamed onto the destination when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from dtrain_node.errors import NodeError

MAX_PACK_FILES = 4096
MAX_PACK_BYTES = 20 * 10**9
COPY_BLOCK = 1 << 20


class PackError(NodeError, ValueError):
    """A pack that is not one `pack_folder` would write (or exceeds the limits)."""


class _HashingWriter:
    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.size += len(data)
        return self.f.write(data)


def pack_entries(folder: Path) -> list[tuple[str, Path]]:
    """(name in the pack, file) for every visible regular file under folder, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PackError(f"{folder} is not a folder")
    out = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_file():  # follows a symlink to a regular file
            out.append((rel.as_posix(), path))
    if not out:
        raise PackError(f"{folder} holds no files to pack")
    return sorted(out)


def pack_folder(folder: Path, out: Path) -> str:
    """Write the pack of `folder` to `out`; its sha256 (hex)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        writer = _HashingWriter(f)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for name, path in pack_entries(folder):
                with path.open("rb") as src:
                    info = tarfile.TarInfo(name)
                    info.size = os.fstat(src.fileno()).st_size
                    info.mode, info.mtime = 0o644, 0
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.type = tarfile.REGTYPE
                    tar.addfile(info, src)
    return writer.h.hexdigest()


def _checked_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or path.is_absolute():
        raise PackError(f"entry {name!r}: absolute or empty path")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise PackError(f"entry {name!r}: '..', '.' or empty path component")
    return path


def check_members(tar: tarfile.TarFile, max_files: int, max_bytes: int) -> list[tarfile.TarInfo]:
    """Every entry of the pack, checked; PackError at the first one out of bounds (reading
    no further: a pack of a million entries is refused after max_files + 1 headers)."""
    members: list[tarfile.TarInfo] = []
    names: set[str] = set()
    dirs: set[str] = set()
    total = 0
    for m in tar:
        if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise PackError(f"entry {m.name!r}: not a regular file (type {m.type!r})")
        name = _checked_name(m.name)
        parents = {str(p) for p in name.parents if str(p) != "."}
        if m.name in names or m.name in dirs or parents & names:
            raise PackError(f"entry {m.name!r}: a duplicate, or a file and a folder at once")
        names.add(m.name)
        dirs |= parents
        total += m.size
        if len(names) > max_files:
            raise PackError(f"more than {max_files} files")
        if total > max_bytes:
            raise PackError(f"more than {max_bytes} bytes unpacked")
        members.append(m)
    if not members:
        raise PackError("an empty pack")
    return members


def unpack(
    pack: Path, dest: Path, max_files: int = MAX_PACK_FILES, max_bytes: int = MAX_PACK_BYTES
) -> Path:
    """Extract a pack into the folder `dest` (which must not exist yet); dest."""
    if dest.exists():
        raise PackError(f"{dest} exists already")
    tmp = dest.with_name(f".{dest.name}.unpack-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with _open_tar(pack) as tar:
            try:
                members = check_members(tar, max_files, max_bytes)
                tmp.mkdir(parents=True)
                for m in members:
                    _extract(tar, m, tmp)
            except tarfile.TarError as exc:
                raise PackError(f"{pack}: {exc}") from None
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _open_tar(pack: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(pack, mode="r:")
    except tarfile.TarError as exc:
        raise PackError(f"{pack} is not an uncompressed tar: {exc}") from None


def _extract(tar: tarfile.TarFile, m: tarfile.TarInfo, root: Path) -> None:
    target = root.joinpath(*PurePosixPath(m.name).parts)
    target.parent.mkdir(parents=True, exist_ok=True)  # only dirs we made: no links inside root
    src = tar.extractfile(m)
    if src is None:
        raise PackError(f"entry {m.name!r} has no data")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    left = m.size
    with os.fdopen(fd, "wb") as out:
        while left > 0:
            block = src.read(min(COPY_BLOCK, left))
            if not block:
                raise PackError(f"entry {m.name!r} is truncated")
            out.write(block)
            left -= len(block)
