"""Replaying a transcript (aggregation only) gives bitwise the shared state of a node that
applied exactly those packets live, whatever it applied itself."""

from __future__ import annotations

import pytest
import torch

from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig

SHAPES = {"w": (96, 80), "v": (70,), "m": (64, 64)}
CFG = DeMoConfig(mode="local", sync_interval=1, compress=CompressConfig(k2d=4, k1d=1, bits=2))


def _workers(n: int) -> list[DeMo]:
    g = torch.Generator().manual_seed(0)
    init = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    out = []
    for i in range(n):
        ps = [(k, torch.nn.Parameter(t.clone())) for k, t in init.items()]
        out.append(DeMo(ps, CFG, sender=f"0x{i:040x}"))
    return out


def _train(opt: DeMo, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in opt.params:
        p.grad = torch.randn(p.shape, generator=g)
    opt.inner_step()


def test_replay_of_the_canonical_rounds_matches_the_nodes_that_applied_them() -> None:
    opts = _workers(3)
    start = [t.clone() for t in opts[2].theta_sync]
    transcript = []
    for r in range(5):
        for i, o in enumerate(opts):
            _train(o, 100 * r + i)
        packets = [(o.sender, o.prepare()) for o in opts]
        transcript.append(packets)
        for i, o in enumerate(opts):
            # worker 2 was late in rounds 1 and 3: it applied its own packet only
            o.apply(packets[2:] if i == 2 and r in (1, 3) else packets)
    live = zip(opts[0].theta_sync, opts[2].theta_sync, strict=True)
    assert any(not torch.equal(a, b) for a, b in live)
    stats = opts[2].replay(start, transcript)
    for a, b in zip(opts[0].theta_sync, opts[2].theta_sync, strict=True):
        assert torch.equal(a, b)
    for p, th in zip(opts[2].params, opts[2].theta_sync, strict=True):
        assert torch.equal(p.detach(), th)  # the model holds the replayed state
    assert [len(s.applied) for s in stats] == [3] * 5


def test_replay_refuses_a_start_of_another_shape() -> None:
    opt = _workers(1)[0]
    with pytest.raises(ValueError, match="start has 1 tensors, the shared state 3"):
        opt.replay(opt.theta_sync[:1], [])
