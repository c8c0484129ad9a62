"""The model a server serves: a completed job's final checkpoint, verified against its on-chain
hash. Either fetched from the job's operators (`fetched`: `dtrain job fetch`'s path, which
verifies the canonical stream before exporting it) or an already exported folder (`exported`),
whose CHECKPOINT_SHA256 file and whose weights must both match the chain."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtrain.client import BSM
from dtrain.errors import DtrainError
from dtrain.models import Job, JobStatus

MARKER = "CHECKPOINT_SHA256"

# (bsm, job id, export folder, work folder, timeout) -> (the export, its checkpoint hash): the
# operator's `fetch.fetch_final`, handed in where the command is registered
FetchFinal = Callable[[BSM, int, Path, Path, float], tuple[Path, bytes]]


class ModelRefused(DtrainError):
    """A model folder that is not the job's final checkpoint: never served."""


@dataclass(frozen=True)
class Verified:
    folder: Path
    checkpoint: bytes  # the on-chain final checkpoint its weights hash to
    model: Any | None = None  # loaded while verifying it (None: not loaded yet)


def completed(job: Job) -> bytes:
    """The job's final checkpoint hash; a `DtrainError` unless the job completed."""
    if job.state.status != JobStatus.COMPLETED:
        name = job.state.status.name.lower()
        raise DtrainError(f"job {job.id} is {name}, not completed: it has no final model yet")
    return bytes(job.state.checkpoint)


def fetched(bsm: BSM, job_id: int, out: Path, timeout: float, fetch_final: FetchFinal) -> Verified:
    """The final checkpoint fetched from the job's operators by `fetch_final`, verified and
    exported to `out`."""
    completed(bsm.job(job_id))
    with tempfile.TemporaryDirectory(prefix="dtrain-serve-") as work:
        folder, digest = fetch_final(bsm, job_id, out, Path(work), timeout)
    return Verified(folder, digest)


def exported(job: Job, folder: Path) -> Verified:
    """`folder`, an export of the job's final checkpoint, loaded and checked: its CHECKPOINT_SHA256
    names the on-chain hash and its weights (float32, as trained) re-hash to it."""
    digest = completed(job)
    marker = folder / MARKER
    if not marker.is_file():
        raise ModelRefused(
            f"{folder} has no {MARKER} file: not a `dtrain job fetch` export of job {job.id}"
        )
    said = marker.read_text(encoding="utf-8", errors="replace").strip().removeprefix("0x")
    if said != digest.hex():
        raise ModelRefused(
            f"{folder} holds checkpoint 0x{said[:16]}.., not job {job.id}'s final checkpoint "
            f"0x{digest.hex()[:16]}.."
        )
    if (folder / "adapter").is_dir():
        raise ModelRefused(
            f"{folder} is a LoRA export (merged weights, no canonical hash to check): serve "
            f"job {job.id} without --model-dir, which fetches and verifies its checkpoint"
        )
    from dtrain_node.train import checkpoint

    model = _load(folder)
    got = checkpoint.canonical_hash(dict(model.state_dict()))
    if got != digest:
        raise ModelRefused(
            f"{folder}: its weights hash to 0x{got.hex()[:16]}.., not to job {job.id}'s final "
            f"checkpoint 0x{digest.hex()[:16]}.. that its {MARKER} names: refusing to serve it"
        )
    return Verified(folder, digest, model)


def _load(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except Exception as exc:  # transformers/safetensors raise many types for a bad folder
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelRefused(f"{folder} does not load as a model: {first}") from None
