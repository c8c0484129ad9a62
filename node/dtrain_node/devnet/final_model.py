"""The caller's side of the end: fetch the final checkpoint from the operators (`dtrain job
fetch`, which verifies it against its on-chain hash), load it with transformers, evaluate it
against the initial model with the job's method and let it generate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtrain import JobSpec

    from .report import Checks

FETCH_TIMEOUT = 180


def fetch(rpc: str, contract: str, job_id: int, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dtrain.cli", "--rpc-url", rpc, "--contract", contract]
    cmd += ["--json", "job", "fetch", str(job_id), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT)


def fetch_and_evaluate(
    rpc: str, contract: str, spec: JobSpec, job_id: int, out: Path, checks: Checks
) -> dict[str, Any]:
    """The result's keys about the caller's copy (none when it could not be fetched)."""
    fetched = fetch(rpc, contract, job_id, out)
    checks.add(
        "caller fetched the final checkpoint",
        fetched.returncode == 0,
        fetched.stderr.strip()[-300:],
    )
    if fetched.returncode != 0:
        return {}
    return {"final_model_dir": str(out), **evaluate_export(out, spec, job_id, checks)}


def evaluate_export(out: Path, spec: JobSpec, job_id: int, checks: Checks) -> dict[str, Any]:
    """Loads the caller's copy with transformers, evaluates it against the initial model with
    the job's method (held-out loss for CPT/SFT, preference accuracy for DPO, reward for GRPO)
    and generates text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_node.train.backend import TrainJob, make_backend

    backend = make_backend(
        TrainJob(
            job_id, spec.method.name.lower(), spec.model_uri, spec.dataset_uri, spec.dataset_hash
        )
    )
    before = backend.evaluate()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    backend.model.load_state_dict(model.state_dict())
    after = backend.evaluate()
    with torch.no_grad():
        ids = tok("def " if spec.method.name == "CPT" else "3+4=", return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=24, do_sample=False)
    sample = tok.decode(gen[0])
    result: dict[str, Any] = {"eval_before": before, "eval_after": after, "sample": sample}
    if "heldout_loss" in after:
        checks.add(
            "held-out loss went down",
            after["heldout_loss"] < before["heldout_loss"],
            f"{before['heldout_loss']:.3f} -> {after['heldout_loss']:.3f}",
        )
        result["heldout_loss_before"] = before["heldout_loss"]
        result["heldout_loss_after"] = after["heldout_loss"]
    checks.add("final checkpoint loads with transformers and generates", len(gen[0]) > len(ids[0]))
    print(f"\nevaluation before {before} after {after}; sample: {sample!r}")
    return result
