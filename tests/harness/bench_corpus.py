"""Offline byte-level text corpus from this machine's Python standard library sources.

Deterministic: files are taken in sorted relative-path order; a file is held out when the first
8 hex digits of sha256(relative path) are 0 mod `heldout_every`, so the split does not depend on
which other files exist. Training bytes are cut into contiguous, disjoint worker shards.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch


def stdlib_corpus(
    max_train: int = 4_000_000, max_heldout: int = 400_000, heldout_every: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout) uint8 tensors of concatenated .py files (site-packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    train, held, nt, nh = [], [], 0, 0
    for rel in files:
        is_held = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % heldout_every == 0
        if (is_held and nh >= max_heldout) or (not is_held and nt >= max_train):
            continue
        try:
            b = (root / rel).read_bytes()
        except OSError:
            continue
        if is_held:
            held.append(b)
            nh += len(b)
        else:
            train.append(b)
            nt += len(b)
        if nt >= max_train and nh >= max_heldout:
            break
    t = torch.frombuffer(bytearray(b"".join(train)[:max_train]), dtype=torch.uint8)
    h = torch.frombuffer(bytearray(b"".join(held)[:max_heldout]), dtype=torch.uint8)
    if len(t) < 10_000 or len(h) < 10_000:
        raise RuntimeError(f"stdlib corpus too small: {len(t)} train / {len(h)} heldout bytes")
    return t.long(), h.long()


def shards(train: torch.Tensor, n: int, block: int = 0) -> list[torch.Tensor]:
    """n disjoint, equal-length shards: contiguous (block 0), or dealt round-robin in blocks of
    `block` bytes, so that every shard samples the whole corpus (the files are in path order:
    contiguous shards are whole packages, and the last ones mostly `encodings/` tables)."""
    if not block:
        size = len(train) // n
        return [train[i * size : (i + 1) * size] for i in range(n)]
    rows = len(train) // (block * n)
    if not rows:
        raise ValueError(f"{len(train)} bytes cannot deal {n} shards in blocks of {block}")
    dealt = train[: rows * block * n].reshape(rows, n, block)
    return [dealt[:, i].reshape(-1) for i in range(n)]


def batch(
    data: torch.Tensor, bsz: int, ctx: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows (x, y = x shifted by one) drawn with generator g."""
    ix = torch.randint(len(data) - ctx - 1, (bsz,), generator=g)
    x = torch.stack([data[i : i + ctx] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + ctx] for i in ix.tolist()])
    return x, y


def eval_windows(data: torch.Tensor, n: int, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n fixed, evenly spaced windows: the same held-out set for every run."""
    starts = torch.linspace(0, len(data) - ctx - 2, n).long().tolist()
    x = torch.stack([data[i : i + ctx] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + ctx] for i in starts])
    return x, y
