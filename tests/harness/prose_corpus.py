"""Offline English-prose byte corpus from text this machine has (no download).

Sources, in this order, each sorted by path: the package descriptions in /var/lib/dpkg/status
(one document per package), the license texts in /usr/share/common-licenses, and README / NEWS /
.txt / .md / .rst files (plain or .gz) under /usr/share/doc. Documents that are not mostly
printable ASCII text are skipped. Deterministic like bench_corpus.stdlib_corpus: a document is
held out when the first 8 hex digits of sha256(its name) are 0 mod `heldout_every`.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch

DOC_ROOT = Path("/usr/share/doc")
LICENSES = Path("/usr/share/common-licenses")
DPKG_STATUS = Path("/var/lib/dpkg/status")
_DOC_NAME = re.compile(r"(^readme|^news|\.txt$|\.md$|\.rst$)", re.I)


def _descriptions() -> Iterator[tuple[str, bytes]]:
    try:
        text = DPKG_STATUS.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for block in text.split("\n\n"):
        name = re.search(r"^Package: (.+)$", block, re.M)
        desc = re.search(r"^Description: (.*(?:\n .*)*)", block, re.M)
        if name and desc:
            lines = [ln[1:] if ln.startswith(" ") else ln for ln in desc.group(1).split("\n")]
            body = "\n".join("" if ln == "." else ln for ln in lines)
            yield f"dpkg:{name.group(1)}", (body + "\n\n").encode()


def _files() -> Iterator[tuple[str, bytes]]:
    paths = sorted(p for p in LICENSES.glob("*") if p.is_file()) if LICENSES.is_dir() else []
    if DOC_ROOT.is_dir():
        docs = []
        for p in DOC_ROOT.rglob("*"):
            base = p.name[:-3] if p.name.endswith(".gz") else p.name
            ok = p.is_file() and not p.is_symlink() and _DOC_NAME.search(base)
            if ok and "changelog" not in base.lower():
                docs.append(p)
        paths += sorted(docs)
    for p in paths:
        try:
            raw = p.read_bytes()
            if p.name.endswith(".gz"):
                raw = gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        yield str(p), raw + b"\n\n"


def _is_prose(b: bytes) -> bool:
    """Mostly printable ASCII with enough letters and spaces (drops binaries and tables)."""
    if len(b) < 200:
        return False
    s = b[:20_000]
    printable = sum(32 <= c < 127 or c in (9, 10, 13) for c in s) / len(s)
    letters = sum(65 <= c <= 90 or 97 <= c <= 122 or c == 32 for c in s) / len(s)
    return printable > 0.97 and letters > 0.75


def prose_corpus(
    max_train: int = 4_000_000, max_heldout: int = 400_000, heldout_every: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout) int64 byte tensors of English prose."""
    train, held, nt, nh = [], [], 0, 0
    for name, b in (*_descriptions(), *_files()):
        if nt >= max_train and nh >= max_heldout:
            break
        is_held = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % heldout_every == 0
        if (is_held and nh >= max_heldout) or (not is_held and nt >= max_train):
            continue
        if not (name.startswith("dpkg:") or _is_prose(b)):
            continue
        if is_held:
            held.append(b)
            nh += len(b)
        else:
            train.append(b)
            nt += len(b)
    t = torch.frombuffer(bytearray(b"".join(train)[:max_train]), dtype=torch.uint8)
    h = torch.frombuffer(bytearray(b"".join(held)[:max_heldout]), dtype=torch.uint8)
    if len(t) < 10_000 or len(h) < 10_000:
        raise RuntimeError(f"prose corpus too small: {len(t)} train / {len(h)} heldout bytes")
    return t.long(), h.long()
