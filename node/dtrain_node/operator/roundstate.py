"""The per-round resume state of an epoch attempt, saved after every round.

A restarted node loads it and resumes at the round after the last saved one with the same
theta_sync, error feedback, AdamW state and participation counts. Writes are temp file +
rename, so a crash never leaves half a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dtrain_node.optim.optimizer import DeMo


def path(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"attempt-{attempt}.round.pt"


def packet_path(job_dir: Path, attempt: int, rnd: int) -> Path:
    return job_dir / f"attempt-{attempt}.round-{rnd}.packet"


def sent_packet(job_dir: Path, attempt: int, rnd: int, packet: bytes) -> bytes:
    """The packet to publish in round `rnd`: the one saved by an earlier run of this attempt
    that may have published it before it stopped, else `packet`, saved (fsync) before it goes
    out. Two different packets of one round are equivocation, which is slashed: a restarted
    node must send the same bytes again."""
    path = packet_path(job_dir, attempt, rnd)
    if path.is_file():
        return path.read_bytes()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(packet)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return packet


def save(
    path: Path,
    opt: DeMo,
    next_round: int,
    participation: dict[str, int],
    applied: list[list[tuple[str, str]]] | None = None,
) -> None:
    """applied: per round so far, the (sender, packet sha256 hex) pairs applied live."""
    state = {
        "round": next_round,
        "participation": participation,
        "applied": applied or [],
        "theta_sync": opt.theta_sync,
        "e": opt.feedback.state(),
        "spec": opt.spec.signature.hex(),  # the packet layout e's coefficients belong to
        "steps": opt.steps,
        "inner": opt.inner.state_dict() if opt.inner is not None else None,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path, opt: DeMo) -> dict[str, Any] | None:
    """Restore `opt` (and its model's parameters) from the saved state; None when there is
    none. Returns the state: "round" is the next round to run, "participation" the counts,
    "applied" what each round applied."""
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if state.get("spec", opt.spec.signature.hex()) != opt.spec.signature.hex():
        return None  # saved for another packet layout (another version's): start over
    with torch.no_grad():
        try:
            opt.feedback.load(state["e"])
        except ValueError:  # saved by a version that kept e in another layout: start over
            return None
        for p, th, th_saved in zip(opt.params, opt.theta_sync, state["theta_sync"], strict=True):
            th.copy_(th_saved)
            p.copy_(th_saved)
    opt.steps = state["steps"]
    if opt.inner is not None and state["inner"] is not None:
        opt.inner.load_state_dict(state["inner"])
    state.setdefault("applied", [])  # saved before rounds recorded what they applied
    return state
