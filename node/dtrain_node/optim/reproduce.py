"""Every packet is reproducible: a member's packet for a round is a pure function of the shared
state at the round's start, the member's private state then (error feedback, inner AdamW
state, step count; paper mode has no inner state), its batches for the round and the recipe.
A member commits to `digest` of its private state; whoever holds that state and the batches
recomputes the packet with `reproduce` and compares bytes. On the same CPU kind and thread
count the bytes match exactly (tests/unit/test_reproduce.py); a member that skipped the work
(a re-sent, copied or made-up packet) does not.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from dtrain_node.optim.optimizer import DeMo

PrivateState = dict[str, Any]


NO_INNER: dict[str, Any] = {"state": {}, "param_groups": []}  # paper mode's inner state


def private_state(opt: DeMo) -> PrivateState:
    """A copy of what the member alone holds at the start of a round: e, the step count and
    the inner AdamW state (paper mode: `NO_INNER`)."""
    inner = NO_INNER if opt.inner is None else opt.inner.state_dict()
    return {
        "e": copy.deepcopy(opt.feedback.state()),
        "inner": copy.deepcopy(inner),
        "steps": opt.steps,
    }


def _tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}:{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def digest(state: PrivateState) -> bytes:
    """sha256 over the private state in a fixed order: what a member commits to per round."""
    h = hashlib.sha256(b"dtrain/private-state/1")
    h.update(struct.pack(">Q", int(state["steps"])))
    e = state["e"]
    h.update(str(e["layout"]).encode())
    for name in ("mat", "vec"):
        _tensor(h, e[name])
    inner = state["inner"]
    for group in inner["param_groups"]:
        for key in sorted(k for k in group if k != "params"):
            h.update(f"{key}={group[key]!r};".encode())
    for index in sorted(inner["state"]):
        h.update(struct.pack(">Q", index))
        slot = inner["state"][index]
        for key in sorted(slot):
            v = slot[key]
            if isinstance(v, torch.Tensor):
                _tensor(h, v)
            else:
                h.update(f"{key}={v!r};".encode())
    return h.digest()


@torch.no_grad()
def load_state(opt: DeMo, shared: Sequence[torch.Tensor], state: PrivateState) -> None:
    """Puts `opt` (and its model) where a member was: shared state and private state."""
    if opt.inner is None and state["inner"]["state"]:
        raise ValueError("paper mode has no inner optimizer: the state holds AdamW moments")
    if len(shared) != len(opt.theta_sync):
        raise ValueError(f"shared has {len(shared)} tensors, the model {len(opt.theta_sync)}")
    for p, th, s in zip(opt.params, opt.theta_sync, shared, strict=True):
        th.copy_(s)
        p.copy_(s)
    opt.feedback.load(state["e"])
    if opt.inner is not None:
        opt.inner.load_state_dict(copy.deepcopy(state["inner"]))
    opt.steps = int(state["steps"])


def reproduce(
    opt: DeMo,
    shared: Sequence[torch.Tensor],
    state: PrivateState,
    batches: Iterable[Any],
    loss: Callable[[Any], torch.Tensor],
) -> bytes:
    """The packet a member with private `state` sends after training `batches` (the round's K)
    from `shared`. `opt` is a DeMo over the job's model with the job's config; its state is
    overwritten."""
    load_state(opt, shared, state)
    for batch in batches:
        loss(batch).backward()
        opt.inner_step()
    return opt.prepare()
