"""Checkpoint files of one job on an operator: the epoch's start state verified against the
chain, our own checkpoint adopted when the quorum chose it, files served to peers and callers,
and the final export in Hugging Face format.

Finalized checkpoints are canonical streams named by epoch (`epoch-E.stream`, the preimage of
the on-chain hash) and verified on every load; our own attempts are `attempt-A.safetensors`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dtrain.models import Job
from dtrain_node.errors import CheckpointInvalid, CheckpointUnavailable
from dtrain_node.operator.deadlines import VOTE_MARGIN_S
from dtrain_node.operator.sources import Cache, cached_job_files, resolve_file, resolve_model
from dtrain_node.operator.transport import PeerSpec, Transport
from dtrain_node.train import checkpoint
from dtrain_node.train.job import load_recipe
from dtrain_node.train.start import adapt, export_model, start_model

FETCH_BACKOFF_MAX_S = 16.0


def export_final(
    job: Job,
    stream: Path,
    out: Path,
    cache: Cache | None = None,
    mirrors: list[PeerSpec] | None = None,
    expected: bytes | None = None,
) -> Path:
    """The job's final checkpoint (its canonical stream, verified against the on-chain hash),
    or the epoch checkpoint `expected`, exported in Hugging Face format into `out`, with
    CHECKPOINT_SHA256 next to it. Needs the job's start model and recipe only (fetched into
    `cache` when remote, from their URI's peer or else from `mirrors`), never its dataset: a
    caller fetching its model need not have it."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar on the operator's terminal
    digest = job.state.checkpoint if expected is None else expected
    tensors = checkpoint.from_stream(stream.read_bytes(), digest)
    spec, cache = job.spec, cache or Cache()
    recipe = None
    if any(bytes(spec.recipe_hash)):
        local_recipe = resolve_file(spec.recipe_uri, None, cache, "recipe", mirrors)
        recipe = load_recipe(spec.recipe_hash, str(local_recipe))
    start = start_model(resolve_model(spec.model_uri, cache, mirrors))
    model = adapt(start.fresh(), recipe)  # the trained structure: LoRA adapters if any
    model.load_state_dict(tensors)
    path = export_model(start, model, out)
    (path / "CHECKPOINT_SHA256").write_text(digest.hex() + "\n")
    return path


class Checkpoints:
    """The checkpoint files in `job_dir` of the operator `me`."""

    def __init__(
        self,
        job_dir: Path,
        me: str,
        transport: Transport,
        peers: Callable[[Sequence[str]], list[PeerSpec]],
        metric: Callable[..., Any],
    ) -> None:
        self.dir = job_dir
        self.me = me
        self.transport = transport
        self._peers = peers  # members' addresses -> their (peer key, multiaddrs) on chain
        self._metric = metric

    def peers(self, members: Sequence[str]) -> list[PeerSpec]:
        """These members' (peer key, multiaddrs) as registered on chain."""
        return self._peers(members)

    def _fetch(self, job: Job, expected: bytes, path: Path, size: int) -> None:
        """The previous epoch's checkpoint from the members, retried with backoff (peers may be
        restarting too) until only the vote's margin is left before the commit deadline; then
        CheckpointUnavailable (and the epoch is voted UNWORKABLE). A peer offering more than
        `size` bytes (the stream of our model's tensors) is refused before the download."""
        peers = self._peers([m for m in job.members if m != self.me])
        until = job.deadline - VOTE_MARGIN_S
        wait = 1.0
        while True:
            self._metric(
                "fetching_checkpoint", job=job.id, epoch=job.state.epoch - 1, peers=len(peers)
            )
            try:
                # one deadline for the whole download: a peer that drips it holds us no longer
                left = max(1.0, until - time.time())
                self.transport.fetch_file(expected.hex(), peers, path, left, size)
                return
            except CheckpointUnavailable:
                if time.time() + wait > until:
                    raise
            time.sleep(wait)
            wait = min(2 * wait, FETCH_BACKOFF_MAX_S)

    def start_state(self, job: Job, start_pin: bytes, model: torch.nn.Module) -> dict[str, Any]:
        """The epoch's start state, verified against the chain: epoch 0 the job's start model
        (`start_pin`, the pin of the weights, config and tokenizer it was built from, before any
        adapter), epoch e the finalized checkpoint of e-1 (ours, or fetched from a peer)."""
        e = job.state.epoch
        expected = job.state.checkpoint
        if e == 0:
            tensors = {n: p.detach().clone() for n, p in model.state_dict().items()}
            got = start_pin
            if any(expected) and got != expected:
                raise CheckpointInvalid(
                    f"start model pin {got.hex()[:16]}.. != job's model hash "
                    f"{expected.hex()[:16]}.."
                )
            return tensors
        path = self.dir / f"epoch-{e - 1}.stream"
        if not path.is_file():
            self.adopt_local(expected, path)
        if not path.is_file():
            self._fetch(job, expected, path, checkpoint.stream_size(model.state_dict()))
        tensors = checkpoint.from_stream(path.read_bytes(), expected)
        self.transport.serve_file(expected.hex(), path)
        return tensors

    def adopt_local(self, expected: bytes, path: Path) -> None:
        """Our own checkpoint of a finished attempt, if it is the one the quorum chose, written
        to `path` as a canonical stream."""
        for f in sorted(self.dir.glob("attempt-*.safetensors")):
            try:
                tensors = checkpoint.load(f, expected)
            except CheckpointInvalid:
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(checkpoint.to_stream(tensors))
            os.replace(tmp, path)
            return

    def final_stream(self, job: Job) -> Path | None:
        """The job's final checkpoint (`Job.final_epoch`'s) as a canonical stream, if we hold
        the one the chain chose (fetched at the start of no epoch: ours, adopted from our last
        attempt)."""
        if job.final_epoch is None:
            return None
        path = self.dir / f"epoch-{job.final_epoch}.stream"
        if not path.is_file():
            self.adopt_local(job.state.checkpoint, path)
        return path if path.is_file() else None

    def serve_final(self, job: Job, cache: Cache | None = None) -> Path | None:
        """Serve the final checkpoint to callers (`dtrain job fetch`) if we hold it, with the
        job's p2p-named model pack and recipe from our `cache` (what the export needs besides
        the checkpoint), for a caller that stopped serving them."""
        path = self.final_stream(job)
        if path is not None:
            self.transport.serve_file(job.state.checkpoint.hex(), path)
            for sha, file in cached_job_files(job, cache) if cache else []:
                self.transport.serve_file(sha, file)
        return path

    def serve_epochs(self, finalized: dict[int, bytes]) -> list[int]:
        """Serve every finalized epoch's checkpoint we hold (`finalized`: epoch -> its on-chain
        hash), each checked against its hash; the epochs served (counted from 0)."""
        served = []
        for epoch, digest in sorted(finalized.items()):
            path = self.dir / f"epoch-{epoch}.stream"
            if not path.is_file():
                continue
            try:
                self.transport.serve_file(digest.hex(), path)
            except ValueError:  # not the bytes the chain finalized: never served
                continue
            served.append(epoch)
        return served

    def export(self, job: Job, cache: Cache | None = None) -> Path | None:
        """The final checkpoint in Hugging Face format, if we hold the one the chain chose."""
        path = self.final_stream(job)
        return None if path is None else export_final(job, path, self.dir / "final", cache)
