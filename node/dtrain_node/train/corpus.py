"""Dataset files for continued pre-training, addressed by their sha256.

A job's dataset is a file whose sha256 is in the job spec; every node checks it before use. The
built-in corpus is this machine's Python standard library sources (no download). The built-in
byte-level models read the file's raw bytes (`load_text`); other models read its documents
(`load_documents`, dataset.py: a text file, or JSONL {"text"} lines) through their tokenizer.
The last `heldout_fraction` of the tokens is the held-out split; the rest is cut into training
windows of ctx + 1 tokens.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from dtrain_node.errors import DatasetError
from dtrain_node.train.dataset import is_jsonl, load_documents, read_dataset


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
    data = _whole_characters(b"".join(out)[:max_bytes])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).digest()


def _whole_characters(data: bytes) -> bytes:
    """`data` without a UTF-8 character cut in two at its end (a cpt text file is UTF-8)."""
    for drop in range(4):
        try:
            (data[: len(data) - drop] if drop else data).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return data[: len(data) - drop] if drop else data
    return data


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


BYTE_EOS = 257  # the built-in byte tokenizer's EOS (models.SPECIALS)


def load_text(
    path: str | os.PathLike, expected: bytes | None, ctx: int, heldout_fraction: float = 0.1
) -> TextData:
    data = read_dataset(path, expected)
    if is_jsonl(data):  # documents: their UTF-8 bytes, each followed by EOS (never the JSON)
        ids: list[int] = []
        for doc in load_documents(path, expected):
            ids += doc.encode()
            ids.append(BYTE_EOS)
        tokens = torch.tensor(ids, dtype=torch.long)
    else:
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - heldout_fraction))
    if cut < 4 * (ctx + 1) or len(tokens) - cut < ctx + 1:
        raise DatasetError(f"dataset {path} of {len(tokens)} bytes is too small for ctx {ctx}")
    return TextData(tokens[:cut], tokens[cut:], ctx)


__all__ = ["TextData", "build_stdlib_corpus", "load_documents", "load_text", "read_dataset"]
