"""Every compiled kernel is ready when the optimizer starts: a sync round (compress, encode,
decode, screen, aggregate) must never wait for the compiler. Run in a fresh interpreter, so
that nothing compiled by another test hides a kernel the warm-up missed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    from dtrain_node.optim import inverse, packed, select
    from dtrain_node.optim.compress import CompressConfig
    from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep

    shapes = [(128, 96), (64,), (70, 64), (3,)]
    cfg = DeMoConfig(mode="local", compress=CompressConfig(k2d=6))
    opts = []
    for s in range(4):
        ps = [torch.nn.Parameter(torch.randn(sh)) for sh in shapes]
        opts.append(DeMo([(f"p{i}", p) for i, p in enumerate(ps)], cfg, sender=f"0x{s:02x}"))
    kernels = {
        name: getattr(mod, name)
        for mod, names in (
            (inverse, ("_matrices", "_vectors")),
            (packed, ("_entries", "_dots", "_put_bits", "_get_bits")),
            (select, ("_topk", "_quantize")),
        )
        for name in names
    }
    before = {n: len(k.signatures) for n, k in kernels.items()}
    for _ in range(2):
        for o in opts:
            for p in o.params:
                p.data.add_(torch.randn_like(p) * 1e-2)
            o.steps += 1
        stats = lockstep(opts)
    assert all(st.applied == tuple(o.sender for o in opts) for st in stats), stats
    after = {n: len(k.signatures) for n, k in kernels.items()}
    print({n: (before[n], after[n]) for n in kernels})
    assert all(before[n] >= 1 for n in kernels), before
    assert after == before, f"compiled inside a round: {before} -> {after}"
    """
)


def test_a_round_compiles_nothing_once_the_optimizer_started() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
