"""The error feedback held as DCT coefficients (optim/feedback.py) against the spatial
definition: e = beta * e + delta; send the top-k DCT part of e and take it out of e."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dtrain_node.operator import roundstate
from dtrain_node.optim import dct, select
from dtrain_node.optim.compress import (
    EXP_MAX,
    EXP_MIN,
    CompressConfig,
    compress_ef,
    levels,
    quantize,
    scale_exp,
)
from dtrain_node.optim.feedback import C_MAX, Feedback, _topk_rows
from dtrain_node.optim.optimizer import DeMo, DeMoConfig

# padded and unpadded matrices, a >2-D tensor, padded and unpadded vectors, a scalar
SHAPES = [(128, 384), (96, 200), (3, 40, 7), (130, 64), (64,), (100,), ()]
CFGS = [CompressConfig(), CompressConfig(k2d=16, k1d=3, bits=2), CompressConfig(chunk=32, k2d=2)]


def _tensors(seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) * scale * 10.0 ** (i % 3 - 1) for i, s in enumerate(SHAPES)]


def _spatial(fb: Feedback, i: int) -> torch.Tensor:
    """Tensor i's e back in parameter space (float64 inverse DCT, padding cropped)."""
    c = fb.coefficients(i).double()
    return dct.idct(c, SHAPES[i], fb.cfg.chunk)


@pytest.mark.parametrize("cfg", CFGS)
def test_fold_is_beta_e_plus_the_dct_of_delta(cfg: CompressConfig) -> None:
    fb = Feedback(SHAPES, cfg)
    a, b = _tensors(1), _tensors(2)
    fb.fold(0.5, a)
    fb.fold(0.9, a, b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        want = 0.9 * dct.dct(x.double(), cfg.chunk) + dct.dct((x - y).double(), cfg.chunk)
        assert torch.allclose(fb.coefficients(i).double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg", CFGS)
def test_take_sends_what_compress_ef_sends_and_keeps_the_rest(cfg: CompressConfig) -> None:
    """From e = 0, one round sends what the spatial compress_ef sends for the same delta,
    and what stays is that residual: same exponents, the same picks but for float near-ties."""
    xs = _tensors(3)
    fb = Feedback(SHAPES, cfg)
    fb.fold(0.9, xs)
    got = fb.take()
    residual = [x.clone() for x in xs]
    want = [compress_ef(r, cfg) for r in residual]
    same = total = 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.exp == w.exp
        assert g.idx.shape == w.idx.shape and g.lvl.dtype == torch.int8
        same += int((g.idx == w.idx).sum())
        total += g.idx.numel()
        assert torch.allclose(_spatial(fb, i).float(), residual[i], atol=1e-5 * 10.0 ** (i % 3))
    assert same >= 0.99 * total


def test_padding_never_carries_error() -> None:
    """A padded chunk's sent values spread into its padding; e keeps none of that."""
    cfg = CompressConfig(k2d=8, k1d=2)
    fb = Feedback(SHAPES, cfg)
    for r in range(3):
        fb.fold(0.9, _tensors(10 + r))
        fb.take()
        for i, shape in enumerate(SHAPES):
            c = fb.coefficients(i).double()
            n = cfg.chunk
            full = (
                c @ dct.basis(n)
                if c.shape[1] == n
                else dct.basis(n).T @ c.view(-1, n, n) @ dct.basis(n)
            )
            inside = dct.to_chunks(torch.ones(shape, dtype=torch.float64), n).reshape(full.shape)
            assert float((full * (1 - inside)).abs().max()) < 1e-5


def test_grouped_top_k_picks_the_largest() -> None:
    g = torch.Generator().manual_seed(5)
    m3 = torch.randn(64, 30, 64, generator=g)
    m3[:, 3] = 1.0  # a chunk of ties
    m3[:, 4] = 0.0  # an all-zero chunk
    m3[7, 5, :] = torch.linspace(5, 6, 64)  # a chunk whose top values share one row
    for k in (1, 4, 16, 17, 40):
        idx, vals = _topk_rows(m3, k)  # type: ignore[misc]
        rows = m3.permute(1, 0, 2).reshape(30, -1)
        best = rows.abs().topk(k, dim=1).values
        assert torch.equal(rows.gather(1, idx), vals)
        assert torch.equal(vals.abs().sort(1, descending=True).values, best)
        assert bool((idx.diff(dim=1) > 0).all())  # ascending, no repeats


@pytest.mark.parametrize("n", [2, 5, 8])
def test_compiled_selection_takes_the_largest_for_any_k(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    m3 = torch.randn(n, 9, n, generator=g)
    m3[:, 0] = 0.5  # ties
    m3[:, 1] = 0.0
    rows = m3.permute(1, 0, 2).reshape(9, -1)
    for k in range(1, n + 1):
        idx, vals = select.topk(m3, k, C_MAX)  # type: ignore[misc]
        assert torch.equal(rows.gather(1, idx), vals) and bool((idx.diff(dim=1) > 0).all())
        best = rows.abs().topk(k, dim=1).values
        assert torch.equal(vals.abs().sort(1, descending=True).values, best)
    with pytest.raises(ValueError, match="top-"):
        select.topk(m3, n + 1, C_MAX)
    with pytest.raises(ValueError, match="top-"):
        select.topk(m3.double(), 1, C_MAX)
    assert select.topk(m3, 1, 100.0) is not None
    for bad in (float("nan"), float("inf"), -101.0):
        m3[n - 1, 8, 0] = bad
        assert select.topk(m3, 1, 100.0) is None  # above the bound or NaN: nothing selected


@pytest.mark.parametrize("bits", [1, 2])
def test_compiled_quantize_is_compress_quantize_per_tensor(bits: int) -> None:
    """Per tensor the levels and exponent of compress.quantize, and e keeps v - lvl * 2^exp:
    also for an all-zero tensor (EXP_MIN) and one beyond the largest scale (EXP_MAX)."""
    g = torch.Generator().manual_seed(bits)
    n, rows = 8, np.array([3, 1, 4, 2])
    m3 = torch.randn(n, int(rows.sum()), n, generator=g) * 1e-3
    m3[:, 3:4] = 0.0
    m3[:, 8:10] *= 1e12
    idx, vals = select.topk(m3, 2, 2.0**40)  # type: ignore[misc]
    before = m3.clone()
    lvl, exps = select.quantize(m3, idx, vals, rows, bits)
    assert exps[1] == EXP_MIN and exps[3] == EXP_MAX
    chunk = torch.arange(len(idx)).unsqueeze(1)
    r, c = idx.div(n, rounding_mode="floor"), idx.remainder(n)
    for t, (lv, v, e) in enumerate(
        zip(lvl.split(rows.tolist()), vals.split(rows.tolist()), exps, strict=True)
    ):
        want_lvl, want_exp = (
            quantize(v, bits) if t != 3 else (levels(v, 2.0**-EXP_MAX, bits), EXP_MAX)
        )
        assert e == want_exp and torch.equal(lv, want_lvl)
    sent = lvl.float() * torch.tensor([2.0**e for e in exps]).repeat_interleave(
        torch.tensor(rows)
    ).unsqueeze(1)
    assert torch.equal(m3[r, chunk, c], vals - sent)
    with pytest.raises(ValueError, match="index outside"):
        select.quantize(m3, idx + n * n, vals, rows, bits)
    with pytest.raises(ValueError, match="float32"):
        select.quantize(m3, idx, vals.double(), rows, bits)
    untouched = torch.ones_like(m3, dtype=torch.bool)
    untouched[r, chunk, c] = False
    assert torch.equal(m3[untouched], before[untouched])


def test_exponents_are_scale_exp_per_tensor() -> None:
    cfg = CompressConfig(k2d=6, bits=2)
    fb = Feedback(SHAPES, cfg)
    fb.fold(1.0, _tensors(6))
    mats = [fb.coefficients(i) for i in range(len(SHAPES))]
    for i, s in enumerate(fb.take()):
        k = cfg.k(SHAPES[i])
        picked = mats[i].gather(1, s.idx)
        assert s.exp == scale_exp(picked, 2)
        assert s.idx.shape == (dct.nchunks(SHAPES[i]), k)


def test_non_finite_delta_leaves_a_bounded_e() -> None:
    fb = Feedback(SHAPES, CompressConfig())
    xs = _tensors(7)
    xs[0][0, 0], xs[1][3, 4], xs[4][2] = float("nan"), float("inf"), -float("inf")
    xs[3].fill_(1e30)
    for _ in range(2):  # the second round starts from what the first one left
        fb.fold(0.9, xs)
        sent = fb.take()
        assert all(-100 <= s.exp <= 20 for s in sent)
        for t in (fb.mat, fb.vec):  # clamped to C_MAX, minus what was sent
            assert bool(torch.isfinite(t).all()) and float(t.abs().max()) <= 2 * C_MAX


def test_state_round_trip_and_a_foreign_layout_is_refused(tmp_path) -> None:
    fb = Feedback(SHAPES, CompressConfig())
    fb.fold(0.9, _tensors(8))
    other = Feedback(SHAPES, CompressConfig())
    other.load(fb.state())
    assert torch.equal(other.mat, fb.mat) and torch.equal(other.vec, fb.vec)
    with pytest.raises(ValueError, match="layout"):
        other.load({"layout": "spatial", "mat": fb.mat, "vec": fb.vec})
    with pytest.raises(ValueError, match="mat"):
        Feedback(SHAPES[1:], CompressConfig()).load(fb.state())


def test_round_state_saved_by_an_older_layout_is_not_resumed(tmp_path) -> None:
    model = torch.nn.Linear(64, 64)
    opt = DeMo(model.named_parameters(), DeMoConfig(mode="local", sync_interval=1))
    path = roundstate.path(tmp_path, 0)
    roundstate.save(path, opt, 3, {"0xa": 1})
    assert roundstate.load(path, opt)["round"] == 3
    state = torch.load(path, weights_only=False)
    state["e"] = [torch.zeros(64, 64), torch.zeros(64)]  # e as parameters, as saved before
    torch.save(state, path)
    assert roundstate.load(path, opt) is None


def test_round_state_of_another_packet_layout_is_not_resumed(tmp_path) -> None:
    """Error feedback of the same shape but another packet layout (token tensors with another
    k, after an upgrade mid-epoch) would load and send from misplaced coefficients."""
    model = torch.nn.Linear(64, 64)
    cfg = DeMoConfig(mode="local", sync_interval=1)
    path = roundstate.path(tmp_path, 0)
    roundstate.save(path, DeMo(model.named_parameters(), cfg), 3, {"0xa": 1})
    other = replace(cfg, compress=CompressConfig(k2d=5))
    opt = DeMo(model.named_parameters(), other)
    assert opt.feedback.mat.shape == DeMo(model.named_parameters(), cfg).feedback.mat.shape
    assert roundstate.load(path, opt) is None
    assert roundstate.load(path, DeMo(model.named_parameters(), cfg))["round"] == 3


def test_a_restarted_round_sends_the_packet_it_may_have_sent_before(tmp_path):
    """Two packets of one round are equivocation: the first one is saved before it goes out
    and a later run of the same attempt sends exactly it again."""
    from dtrain_node.operator import roundstate

    first = roundstate.sent_packet(tmp_path, 3, 5, b"packet one")
    again = roundstate.sent_packet(tmp_path, 3, 5, b"another packet")
    assert first == again == b"packet one"
    assert roundstate.sent_packet(tmp_path, 3, 6, b"next round") == b"next round"
    assert roundstate.sent_packet(tmp_path, 4, 5, b"next attempt") == b"next attempt"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "attempt-3.round-5.packet",
        "attempt-3.round-6.packet",
        "attempt-4.round-5.packet",
    ]
