"""Checkpoints: safetensors files with a canonical sha256 that goes on-chain.

canonical hash = sha256 of the canonical stream: for each tensor in name order,
    utf-8 name, 0x00, dtype name, 0x00, shape as comma-separated decimals, 0x00,
    8-byte little-endian byte count, the tensor's little-endian bytes.
It depends only on names, dtypes, shapes and values, not on file layout or metadata. The stream
is also the transfer format between nodes: whoever receives it checks sha256(stream) against
the on-chain hash before parsing it (`from_stream`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dtrain_node.errors import CheckpointInvalid

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def _parts(tensors: dict[str, torch.Tensor]):
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        head = (
            name.encode()
            + b"\0"
            + str(t.dtype).removeprefix("torch.").encode()
            + b"\0"
            + ",".join(str(s) for s in t.shape).encode()
            + b"\0"
            + len(data).to_bytes(8, "little")
        )
        yield head, data


def canonical_hash(tensors: dict[str, torch.Tensor]) -> bytes:
    h = hashlib.sha256()
    for head, data in _parts(tensors):
        h.update(head)
        h.update(data)
    return h.digest()


def stream_size(tensors: dict[str, torch.Tensor]) -> int:
    """The bytes of `to_stream(tensors)`, without building it: what a checkpoint of a model
    with these tensors' names, dtypes and shapes must weigh (a fetch's exact size cap)."""
    n = 0
    for name, t in tensors.items():
        shape = ",".join(str(s) for s in t.shape)
        dtype = str(t.dtype).removeprefix("torch.")
        n += len(name.encode()) + len(dtype) + len(shape) + 3 + 8 + t.numel() * t.element_size()
    return n


def to_stream(tensors: dict[str, torch.Tensor]) -> bytes:
    return b"".join(head + data for head, data in _parts(tensors))


def from_stream(stream: bytes, expected: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a canonical stream whose sha256 must equal `expected` (the on-chain hash)."""
    if hashlib.sha256(stream).digest() != expected:
        raise CheckpointInvalid("checkpoint stream does not match the expected hash")
    out: dict[str, torch.Tensor] = {}
    pos, last = 0, None
    try:
        while pos < len(stream):
            fields = []
            for _ in range(3):
                end = stream.index(b"\0", pos)
                fields.append(stream[pos:end].decode())
                pos = end + 1
            name, dtype, shape_text = fields
            n = int.from_bytes(stream[pos : pos + 8], "little")
            pos += 8
            if last is not None and name <= last:
                raise CheckpointInvalid(f"tensor {name!r} out of canonical order")
            shape = [int(s) for s in shape_text.split(",")] if shape_text else []
            data = bytearray(stream[pos : pos + n])
            if len(data) != n:
                raise CheckpointInvalid(f"tensor {name!r} truncated")
            pos += n
            t = (
                torch.frombuffer(data, dtype=_DTYPES[dtype])
                if n
                else torch.empty(0, dtype=_DTYPES[dtype])
            )
            out[name] = t.reshape(shape)
            last = name
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointInvalid(f"malformed checkpoint stream: {exc}") from None
    return out


def save(path: str | os.PathLike, tensors: dict[str, torch.Tensor]) -> bytes:
    """Writes atomically (temp file + rename) and returns the canonical hash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = canonical_hash(tensors)
    tmp = path.with_suffix(path.suffix + ".tmp")
    cpu = _unshared(tensors)
    save_file(cpu, str(tmp), metadata={"sha256": digest.hex()})
    os.replace(tmp, path)
    return digest


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors safetensors can write: a tensor sharing storage with an earlier one (tied
    embeddings, e.g. GPT-2's lm_head and wte) is copied."""
    out, seen = {}, set()
    for k, v in tensors.items():
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def load(path: str | os.PathLike, expected: bytes | None = None) -> dict[str, torch.Tensor]:
    """Reads a checkpoint; with `expected`, refuses one whose canonical hash differs."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointInvalid(f"checkpoint {path} does not exist")
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise CheckpointInvalid(f"checkpoint {path} is unreadable: {exc}") from None
    if expected is not None:
        got = canonical_hash(tensors)
        if got != expected:
            raise CheckpointInvalid(
                f"checkpoint {path} hash {got.hex()[:16]}.. != expected {expected.hex()[:16]}.."
            )
    return tensors
