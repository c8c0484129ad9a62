"""Deterministic shard assignment: every honest node computes the same split.

A permutation of the dataset's items, seeded by sha256(job id, epoch), is cut into contiguous
parts over the epoch's members sorted by address (lowercase hex); member i gets part i.

A node then walks its shard in batches whose order and sampling seeds come from the caller's seed
mixed with the shard itself (`stream_seed`): deterministic for a node, different across nodes
(their shards are disjoint), so no two nodes shuffle or sample in lockstep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from dtrain_node.errors import DatasetError


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


def stream_seed(seed: int, indices: torch.Tensor) -> int:
    """The seed of a node's batch stream: `seed` (the same on every node, e.g. from the job and
    epoch attempt) mixed with the sha256 of the node's own shard `indices`, which differ across
    nodes, so every node gets its own shuffle and its own sampling seeds."""
    shard = ",".join(str(int(i)) for i in indices.tolist())
    digest = hashlib.sha256(f"dtrain-stream:{seed}:{shard}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def batch_indices(
    indices: torch.Tensor, batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, int]]:
    """Endless (item indices, sampling seed) batches over a shard, reshuffled each pass.

    Batches hold min(batch_size, len(indices)) items, so a shard smaller than the batch size
    still yields (one batch per pass); an empty shard raises DatasetError. The order and the
    per-batch seeds are deterministic from (seed, indices): see `stream_seed`.
    """
    if len(indices) == 0:
        raise DatasetError("this node's shard holds no items: nothing to train on")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    bs = min(batch_size, len(indices))
    g = torch.Generator().manual_seed(stream_seed(seed, indices))
    while True:
        perm = indices[torch.randperm(len(indices), generator=g)]
        for i in range(0, len(perm) - bs + 1, bs):
            yield perm[i : i + bs], int(torch.randint(0, 2**62, (1,), generator=g))
