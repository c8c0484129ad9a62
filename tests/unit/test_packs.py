"""Model-folder packs: the same files give the same sha256; unpack refuses every tar that is not
one `pack_folder` would write."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from dtrain_node.p2p.packs import PackError, pack_entries, pack_folder, unpack


def model_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "gpt2"}')
    (root / "model.safetensors").write_bytes(os.urandom(70_000))
    (root / "tokenizer.json").write_text("{}")
    (root / "sub").mkdir()
    (root / "sub" / "chat_template.jinja").write_text("{{ messages }}")
    return root


def test_pack_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    a = model_folder(tmp_path / "a")
    sha1 = pack_folder(a, tmp_path / "1.tar")
    for i, p in enumerate(sorted(a.rglob("*"))):
        os.utime(p, (1_000_000 + i, 2_000_000 + i))  # other mtimes
    (a / "model.safetensors").chmod(0o600)
    (a / ".cache").mkdir()  # hidden: left out
    (a / ".cache" / "x").write_text("lock")
    sha2 = pack_folder(a, tmp_path / "2.tar")
    assert sha1 == sha2
    assert (tmp_path / "1.tar").read_bytes() == (tmp_path / "2.tar").read_bytes()

    b = tmp_path / "b"  # a copy made elsewhere, with a symlinked weights file (hub snapshot)
    model_folder(b)
    for name in ("config.json", "tokenizer.json", "sub/chat_template.jinja"):
        (b / name).write_bytes((a / name).read_bytes())
    (tmp_path / "blob").write_bytes((a / "model.safetensors").read_bytes())
    (b / "model.safetensors").unlink()
    (b / "model.safetensors").symlink_to(tmp_path / "blob")
    assert pack_folder(b, tmp_path / "3.tar") == sha1

    out = unpack(tmp_path / "1.tar", tmp_path / "out")
    assert [n for n, _ in pack_entries(out)] == [
        "config.json",
        "model.safetensors",
        "sub/chat_template.jinja",
        "tokenizer.json",
    ]
    for name, path in pack_entries(out):
        assert path.read_bytes() == (a / name).read_bytes()
    with tarfile.open(tmp_path / "1.tar") as tar:
        for m in tar:
            assert (m.mode, m.mtime, m.uid, m.gid, m.uname, m.type) == (
                0o644,
                0,
                0,
                0,
                "",
                tarfile.REGTYPE,
            )

    (a / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
    assert pack_folder(a, tmp_path / "4.tar") != sha1


def evil_tar(path: Path, *entries: tarfile.TarInfo | tuple[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tar.addfile(e)
            else:
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tar.addfile(info, io.BytesIO(e[1]))
    return path


def link(name: str, kind: bytes, target: str = "/etc/passwd") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


ATTACKS = {
    "parent": ([("config.json", b"{}"), ("../escape.txt", b"x")], "'..'"),
    "nested parent": ([("sub/../../escape.txt", b"x")], "'..'"),
    "absolute": ([("/tmp/escape.txt", b"x")], "absolute"),
    "symlink": ([link("model.safetensors", tarfile.SYMTYPE)], "not a regular file"),
    "hardlink": ([link("model.safetensors", tarfile.LNKTYPE)], "not a regular file"),
    "device": ([link("dev", tarfile.CHRTYPE, "")], "not a regular file"),
    "fifo": ([link("fifo", tarfile.FIFOTYPE, "")], "not a regular file"),
    "directory": ([link("sub", tarfile.DIRTYPE, "")], "not a regular file"),
    "duplicate": ([("a", b"1"), ("a", b"2")], "duplicate"),
    "file then folder": ([("a", b"1"), ("a/b", b"2")], "a file and a folder"),
    "folder then file": ([("a/b", b"1"), ("a", b"2")], "a file and a folder"),
    "too many files": ([(f"f{i}", b"") for i in range(11)], "more than 10 files"),
    "too big": ([("a", b"x" * 600), ("b", b"x" * 600)], "more than 1000 bytes"),
}


@pytest.mark.parametrize("kind", ATTACKS)
def test_unpack_refuses(tmp_path: Path, kind: str) -> None:
    entries, why = ATTACKS[kind]
    pack = evil_tar(tmp_path / "evil.tar", *entries)
    dest = tmp_path / "cache" / "models" / "abc"
    dest.parent.mkdir(parents=True)
    with pytest.raises(PackError, match=why):
        unpack(pack, dest, max_files=10, max_bytes=1000)
    assert list(dest.parent.iterdir()) == []  # nothing extracted, no temporary folder left
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/escape.txt").exists()


def test_unpack_refuses_compressed_and_garbage(tmp_path: Path) -> None:
    gz = tmp_path / "m.tar.gz"
    with tarfile.open(gz, "w:gz") as tar:
        info = tarfile.TarInfo("config.json")
        tar.addfile(info, io.BytesIO(b""))
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(5000))
    for bad in (gz, junk):
        with pytest.raises(PackError):
            unpack(bad, tmp_path / "out")
        assert not (tmp_path / "out").exists()
