"""Deterministic shard assignment: every honest node computes the same split.

A permutation of the dataset's items, seeded by sha256(job id, epoch), is cut into contiguous
parts over the epoch's members sorted by address (lowercase hex); member i gets part i.
"""

from __future__ import annotations

import hashlib

import torch


def seed_of(job_id: int, epoch: int) -> int:
    digest = hashlib.sha256(f"dtrain-shard:{job_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def assign(n_items: int, job_id: int, epoch: int, members: list[str], me: str) -> torch.Tensor:
    """Indices of the items `me` trains on in `epoch` (disjoint across members, covering all)."""
    order = sorted(m.lower() for m in members)
    if me.lower() not in order:
        raise ValueError(f"{me} is not a member of job {job_id} epoch {epoch}")
    if n_items < len(order):
        raise ValueError(f"{n_items} items cannot be split over {len(order)} members")
    g = torch.Generator().manual_seed(seed_of(job_id, epoch))
    perm = torch.randperm(n_items, generator=g)
    return torch.tensor_split(perm, len(order))[order.index(me.lower())]
