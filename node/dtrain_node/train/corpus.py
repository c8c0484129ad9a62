"""Dataset files for continued pre-training: raw text bytes, addressed by their sha256.

A job's dataset is a file whose sha256 is in the job spec; every node checks it before use. The
built-in corpus is this machine's Python standard library sources (no download). The last
`heldout_fraction` of the bytes is the held-out split; the rest is cut into training windows of
ctx + 1 tokens (byte tokens, see hf.py).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from dtrain_node.errors import DatasetError


def build_stdlib_corpus(path: str | os.PathLike, max_bytes: int = 2_000_000) -> bytes:
    """Writes a deterministic corpus of stdlib .py files; returns its sha256."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
    )
    out, n = [], 0
    for p in files:
        try:
            b = p.read_bytes()
        except OSError:
            continue
        out.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    data = b"".join(out)[:max_bytes]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class TextData:
    train: torch.Tensor  # int64 byte tokens
    heldout: torch.Tensor
    ctx: int

    @property
    def n_windows(self) -> int:
        return (len(self.train) - 1) // self.ctx

    def windows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) for training windows `idx`, each ctx tokens."""
        starts = idx * self.ctx
        offs = torch.arange(self.ctx + 1)
        w = self.train[starts[:, None] + offs[None, :]]
        return w[:, :-1], w[:, 1:]

    def heldout_windows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        count = min(n, (len(self.heldout) - 1) // self.ctx)
        starts = torch.arange(count) * self.ctx
        offs = torch.arange(self.ctx + 1)
        w = self.heldout[starts[:, None] + offs[None, :]]
        return w[:, :-1], w[:, 1:]


def read_dataset(path: str | os.PathLike, expected: bytes | None) -> bytes:
    """A dataset file's bytes, checked against the job's sha256 (None or all zeros: unchecked)."""
    path = Path(str(path).removeprefix("file://"))
    if not path.is_file():
        raise DatasetError(f"dataset {path} does not exist")
    data = path.read_bytes()
    if expected is not None and any(expected):
        got = hashlib.sha256(data).digest()
        if got != expected:
            raise DatasetError(
                f"dataset {path} sha256 {got.hex()[:16]}.. != job's {expected.hex()[:16]}.."
            )
    return data


def load_text(
    path: str | os.PathLike, expected: bytes | None, ctx: int, heldout_fraction: float = 0.1
) -> TextData:
    data = read_dataset(path, expected)
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - heldout_fraction))
    if cut < 4 * (ctx + 1) or len(tokens) - cut < ctx + 1:
        raise DatasetError(f"dataset {path} of {len(tokens)} bytes is too small for ctx {ctx}")
    return TextData(tokens[:cut], tokens[cut:], ctx)
