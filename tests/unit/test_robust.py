"""The robust aggregation rule (optim/robust.py) and the attack transforms (optim/attacks.py)."""

import math
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain_node.optim import codec
from dtrain_node.optim.aggregate import aggregate
from dtrain_node.optim.attacks import _SCALED, KINDS, Attack, Attacker
from dtrain_node.optim.codec import Spec
from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, LEVELS, CompressConfig, Sparse, compress
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.optim.robust import (
    RobustConfig,
    _cmp,
    below,
    gram,
    screen,
    screen_clipped,
    screen_weighted,
)

SHAPES = {"w": (128, 96), "v": (70,), "m": (64, 64)}
CFG = DeMoConfig(mode="local", sync_interval=4, lr=1.0, inner_lr=0.01)


def members(n, cfg=CFG, seed=0):
    g = torch.Generator().manual_seed(seed)
    init = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    return [
        DeMo([(k, torch.nn.Parameter(t.clone())) for k, t in init.items()], cfg, sender=w)
        for w in range(n)
    ]


def train(opts, steps, seed):
    """Quadratic pull toward a shared target plus member noise: honest updates agree."""
    tg = torch.Generator().manual_seed(999)
    target = [torch.randn(p.shape, generator=tg) for p in opts[0].params]
    for w, o in enumerate(opts):
        g = torch.Generator().manual_seed(1000 * seed + w)
        for _ in range(steps):
            loss = sum(
                ((p - t - 0.5 * torch.randn(p.shape, generator=g)) ** 2).sum()
                for p, t in zip(o.params, target, strict=True)
            )
            loss.backward()
            o.inner_step()


def test_poison_is_excluded_and_the_state_survives():
    # the attack: one member's packets carry EXP_MAX scales; without the rule one sync
    # destroys every honest member's shared weights
    opts = members(4)
    atk = Attacker(Attack.parse("poison"), who=3)
    for r in range(3):
        train(opts, 4, r)
        before = [t.clone() for t in opts[0].theta_sync]
        for s in atk.lockstep(opts):
            assert s.applied == (0, 1, 2)
            assert list(s.excluded) == [3] and s.excluded[3].startswith("norm_high:")
        for a, b in zip(opts[0].theta_sync, before, strict=True):
            assert torch.isfinite(a).all()
            assert (a - b).abs().max() < 1.0  # an honest-sized step
        for o in opts[1:3]:
            for a, b in zip(o.theta_sync, opts[0].theta_sync, strict=True):
                assert torch.equal(a, b)
    opts[0].prepare()  # and the node keeps going


def test_without_the_rule_poison_wrecks_the_model_but_state_stays_finite():
    cfg = DeMoConfig(mode="local", sync_interval=4, lr=1.0, robust=RobustConfig(enabled=False))
    opts = members(4, cfg)
    atk = Attacker(Attack.parse("poison"), who=3)
    for r in range(3):
        train(opts, 4, r)
        st = atk.lockstep(opts)[0]
        assert st.applied == (0, 1, 2, 3) and not st.excluded
    big = max(float(t.abs().max()) for t in opts[0].theta_sync)
    assert big > 1000  # destroyed ...
    assert all(torch.isfinite(t).all() for t in opts[0].theta_sync)  # ... but finite (clamp)
    assert big <= cfg.robust.theta_max
    opts[0].prepare()


def decoded(opts):
    return [(o.sender, codec.decode(o.spec, o.prepare())) for o in opts]


def test_screen_is_order_invariant_and_honest_packets_pass():
    opts = members(6)
    train(opts, 4, 0)
    pk = decoded(opts)
    pk[5] = swap(opts[0].spec, pk[5], "signflip")
    ref_keep, ref_out = screen(opts[0].spec, pk, RobustConfig())
    assert ref_out == {5: "direction"}
    for seed in range(4):
        p = list(pk)
        random.Random(seed).shuffle(p)
        keep, out = screen(opts[0].spec, p, RobustConfig())
        assert out == ref_out and [s for s, _ in keep] == [s for s, _ in ref_keep]


def swap(spec, p, kind):
    """Sender p[0]'s decoded packet replaced by the attack's."""
    return (p[0], codec.decode(spec, Attack.parse(kind)(spec, codec.encode(spec, p[1]))))


def test_one_and_two_senders():
    opts = members(2)
    train(opts, 4, 0)
    spec = opts[0].spec
    pk = decoded(opts)
    # one sender: nothing to compare, kept whatever it is
    bad = swap(spec, pk[1], "poison")
    assert screen(spec, [bad], RobustConfig()) == ([bad], {})
    # two: the lower median is the smaller norm, so only the larger can go
    keep, out = screen(spec, [pk[0], bad], RobustConfig())
    assert [s for s, _ in keep] == [0] and out[1].startswith("norm_high:")
    flip = swap(spec, pk[1], "signflip")
    keep, out = screen(spec, [pk[0], flip], RobustConfig())
    assert out == {} and len(keep) == 2  # direction needs >= 3 senders


def test_norm_low_and_disabled():
    opts = members(4)
    train(opts, 4, 0)
    spec = opts[0].spec
    pk = decoded(opts)
    tiny = [Sparse(s.idx, s.lvl, EXP_MIN) for s in pk[2][1]]
    pk[2] = (2, tiny)
    _, out = screen(spec, pk, RobustConfig())
    assert out == {2: f"norm_low:{spec.names[0]}"}
    assert screen(spec, pk, RobustConfig(enabled=False)) == (pk, {})


def test_gram_is_exact():
    spec = Spec(("a", "b"), ((64, 64), (64,)), CompressConfig(k2d=3, k1d=2, bits=2))
    rows = [Sparse(torch.tensor([[1, 5, 9]]), torch.tensor([[3, -1, 1]], dtype=torch.int8), -3)]
    rows.append(Sparse(torch.tensor([[5, 9, 40]]), torch.tensor([[1, -3, 3]], dtype=torch.int8), 2))
    vec = Sparse(torch.tensor([[0, 1]]), torch.tensor([[1, 1]], dtype=torch.int8), EXP_MAX)
    G = gram(spec, [(0, [rows[0], vec]), (1, [rows[1], vec])])
    scale = Fraction(2) ** (-2 * EXP_MIN)
    assert G[0][0][1] == (-1 * 1 + 1 * -3) * Fraction(2) ** (-3 + 2) * scale
    assert G[0][0][0] == 11 * Fraction(2) ** -6 * scale
    assert G[1][1][1] == 2 * Fraction(4) ** EXP_MAX * scale


@pytest.mark.parametrize("seed", range(3))
def test_below_matches_exact_reals(seed):
    r = random.Random(seed)
    for _ in range(2000):
        dot, n2, s2 = r.randint(-50, 50), r.randint(0, 40), r.randint(0, 40)
        c = Fraction(r.randint(-10, 9), 10)
        # decide in exact rationals by squaring the sides only where that is sound
        rhs2 = c * c * n2 * s2
        want = (
            dot < 0
            if c == 0
            else ((dot < 0 or dot * dot < rhs2) if c > 0 else (dot < 0 and dot * dot > rhs2))
        )
        assert below(dot, n2, s2, c) == want
        assert want == (dot < float(c) * math.sqrt(n2 * s2)) or dot * dot == rhs2


def test_config_validation():
    for bad in (
        dict(hi=0.5),
        dict(lo=2),
        dict(cos_min=1),
        dict(min_direction=2),
        dict(theta_max=float("inf")),
        dict(hi=float("nan")),
        dict(clip=0.5),
        dict(clip=float("inf")),
        dict(cos_copy=0.4),
        dict(cos_copy=1.5),
    ):
        with pytest.raises(ValueError):
            RobustConfig(**bad)
    with pytest.raises(ValueError):
        Attack.parse("scale")
    with pytest.raises(ValueError):
        Attack.parse("poison=3")
    with pytest.raises(ValueError):
        Attack.parse("bogus")
    with pytest.raises(ValueError):
        Attack("scale", -1.0)
    assert str(Attack.parse("scale=100")) == "scale=100"


@pytest.mark.parametrize("bits", [1, 2])
def test_attacks_return_valid_packets(bits):
    cfg = DeMoConfig(mode="local", sync_interval=1, compress=CompressConfig(k2d=4, bits=bits))
    opts = members(3, cfg)
    train(opts, 1, 0)
    pk = [o.prepare() for o in opts]
    spec = opts[0].spec
    honest = codec.decode(spec, pk[0])
    for kind in (k for k in KINDS if k != "adapt"):  # adapt: a coalition's (test_robust_attacks)
        a = Attack.parse(f"{kind}=100" if kind in _SCALED else kind)
        out = a(spec, pk[0], prev=pk[1], other=pk[2], seed=7)
        got = codec.decode(spec, out)
        assert codec.encode(spec, got) == out
        if kind == "poison":
            assert all(s.exp == EXP_MAX for s in got)
        elif kind == "scale":
            assert [s.exp for s in got] == [min(EXP_MAX, h.exp + 7) for h in honest]
        elif kind == "signflip":
            assert all(torch.equal(s.lvl, -h.lvl) for s, h in zip(got, honest, strict=True))
        elif kind in ("flip", "push"):
            base = honest if kind == "flip" else codec.decode(spec, pk[2])
            for s, h in zip(got, base, strict=True):
                assert torch.equal(s.lvl, -h.lvl) and s.exp == min(EXP_MAX, h.exp + 7)
        elif kind in ("noise", "orth"):
            assert out != pk[0] and out == a(spec, pk[0], seed=7)
            if kind == "orth":
                assert [s.exp for s in got] == [min(EXP_MAX, h.exp + 7) for h in honest]
        elif kind in ("edge", "skew"):
            flipped = [int((s.lvl != h.lvl).sum()) for s, h in zip(got, honest, strict=True)]
            assert 0 < sum(flipped) < sum(h.lvl.numel() for h in honest)
            assert [s.exp for s in got] == [min(EXP_MAX, h.exp + 7) for h in honest]
        else:
            assert out == (pk[1] if kind == "stale" else pk[2])
            assert a(spec, pk[0]) == pk[0]  # no context: the honest packet


# --- property: no set of codec-valid packets stops an honest node or desyncs the state ---

SPEC_SHAPES = (("w", (64, 80)), ("v", (70,)), ("s", ()))


def _spec(bits):
    return Spec(
        tuple(n for n, _ in SPEC_SHAPES),
        tuple(s for _, s in SPEC_SHAPES),
        CompressConfig(k2d=4, k1d=1, bits=bits),
    )


@st.composite
def adversarial(draw, spec):
    """A codec-valid packet: honest-looking (compressed noise) or any exponents/levels/indices."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        ts = [compress(torch.randn(s, generator=g) * 0.01, spec.cfg) for s in spec.shapes]
    else:
        ts = []
        levels = torch.tensor(LEVELS[spec.cfg.bits], dtype=torch.int8)
        for nc, ce, k, _, _ in spec.layout:
            idx = torch.rand(nc, ce, generator=g).topk(k, dim=1).indices.sort(dim=1).values
            lvl = levels[torch.randint(len(levels), (nc, k), generator=g)]
            ts.append(Sparse(idx, lvl, draw(st.integers(EXP_MIN, EXP_MAX))))
    return codec.encode(spec, ts)


def node(spec, seed, mode, rule=True):
    cfg = DeMoConfig(
        robust=RobustConfig(enabled=rule),
        mode=mode,
        sync_interval=1,
        lr=1.0 if mode == "local" else 1e-3,
        sign=mode == "paper",
        compress=spec.cfg,
    )
    init = torch.Generator().manual_seed(0)
    ps = [(n, torch.nn.Parameter(torch.randn(s, generator=init))) for n, s in SPEC_SHAPES]
    o = DeMo(ps, cfg, sender="me")
    g = torch.Generator().manual_seed(seed)  # a different local state per instance
    for p in o.params:
        p.grad = torch.randn(p.shape, generator=g)
        if mode == "local":
            p.data.add_(torch.randn(p.shape, generator=g))
    return o


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    bits=st.sampled_from([1, 2]),
    mode=st.sampled_from(["local", "paper"]),
    rule=st.booleans(),
)
def test_any_valid_packets_keep_state_finite_and_identical(data, bits, mode, rule):
    spec = _spec(bits)
    n = data.draw(st.integers(1, 8))
    pkts = [(f"s{i}", data.draw(adversarial(spec))) for i in range(n)]
    a, b = node(spec, 1, mode, rule), node(spec, 2, mode, rule)
    for _ in range(2):  # two rounds: the second starts from whatever the first left
        sa, sb = a.apply(pkts), b.apply(pkts)
        assert sa.applied == sb.applied and sa.excluded == sb.excluded
        assert set(sa.applied).isdisjoint(sa.excluded)
        shared = (lambda o: o.theta_sync) if mode == "local" else (lambda o: o.params)
        for x, y in zip(shared(a), shared(b), strict=True):
            assert torch.isfinite(x).all()
            assert torch.equal(x, y)
        for o in (a, b):
            for p in o.params:
                p.grad = torch.randn(p.shape)
            o.prepare()  # never raises


def test_cosine_order_is_exact():
    r = random.Random(0)
    for _ in range(3000):
        x = (r.randint(-30, 30), r.randint(1, 50), 0)
        y = (r.randint(-30, 30), r.randint(1, 50), 1)
        fx, fy = Fraction(x[0] ** 2, x[1]), Fraction(y[0] ** 2, y[1])  # cos^2, exactly
        sx, sy = (fx if x[0] >= 0 else -fx), (fy if y[0] >= 0 else -fy)
        assert _cmp(x, y) == (sx > sy) - (sx < sy)


def test_one_bad_sender_does_not_drag_honest_ones_out():
    # the signflipped sender is judged first and removed before the others are judged
    opts = members(4)
    train(opts, 4, 3)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[3] = swap(spec, pk[3], "signflip")
    assert screen(spec, pk, RobustConfig())[1] == {3: "direction"}


def test_one_blown_up_small_tensor_is_caught():
    opts = members(4)
    train(opts, 4, 1)
    spec = opts[0].spec
    pk = decoded(opts)
    v = spec.names.index("v")
    pk[1][1][v] = Sparse(pk[1][1][v].idx, pk[1][1][v].lvl, pk[1][1][v].exp + 5)  # 32x
    assert screen(spec, pk, RobustConfig())[1] == {1: "norm_high:v"}


def norms2(spec, pk):
    """Per sender, per tensor: |v|^2 in the Gram's integer units."""
    G = gram(spec, pk)
    return [[g[a][a] for g in G] for a in range(len(pk))]


def test_the_bound_scales_a_loud_sender_down_to_the_median_by_a_power_of_two():
    opts = members(5)
    train(opts, 4, 2)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[4] = swap(spec, pk[4], "scale=64")  # 64x: out of the norm band, excluded
    pk[3] = swap(spec, pk[3], "scale=8")  # 8x: inside the band, kept and scaled down
    cfg = RobustConfig(cos_echo=1.0, cos_copy=1.0)  # no near copies: the clip alone
    kept, out, clipped = screen_clipped(spec, pk, cfg)
    assert set(out) == {4}
    assert [s for s, _ in kept] == [0, 1, 2, 3] and clipped[3] >= 3
    before, after = norms2(spec, pk[:4]), norms2(spec, kept)
    for t in range(len(spec.names)):
        m = sorted(n[t] for n in before)[1]  # the lower median of the 4 kept senders
        for a in range(4):
            s = before[a][t] // max(after[a][t], 1)  # 4^shift exactly: a power of two scaling
            assert after[a][t] <= m or before[a][t] <= m, (a, t)
            assert after[a][t] == before[a][t] or 4 * after[a][t] > m  # the least shift
            assert after[a][t] == before[a][t] or s & (s - 1) == 0
    # the same rule without the bound keeps the packets as they came
    raw, _, none = screen_clipped(spec, pk, RobustConfig(clip=0, cos_echo=1.0, cos_copy=1.0))
    assert none == {} and norms2(spec, raw) == before


def test_near_copies_share_one_senders_weight():
    opts = members(7)
    train(opts, 4, 4)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[6] = (6, pk[5][1])  # 6 sends 5's update: two votes for one update
    kept, out, clipped = screen_clipped(spec, pk, RobustConfig())
    assert out == {} and clipped[5] >= 1 and clipped[6] >= 1
    agg = aggregate(spec, kept)
    alone = aggregate(spec, [*kept[:5], (5, lowered_by(spec, kept[5][1], -1))])
    # together the two copies sum to one of them at its clipped size, exactly
    assert agg.senders == (0, 1, 2, 3, 4, 5, 6) and alone.senders == (0, 1, 2, 3, 4, 5)
    for i in range(len(spec.names)):
        a = agg.sums[i] * 2.0 ** agg.exps[i]
        b = alone.sums[i] * 2.0 ** alone.exps[i]
        assert torch.equal(a, b), spec.names[i]


def lowered_by(spec, packet, s):
    from dtrain_node.optim.robust import lowered

    return lowered(spec, packet, [s] * len(spec.names))


def test_the_bound_is_bitwise_the_same_whatever_the_order():
    opts = members(6)
    train(opts, 4, 5)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[2] = swap(spec, pk[2], "scale=8")
    ref = aggregate(spec, screen_clipped(spec, pk, RobustConfig())[0]).digest()
    for seed in range(4):
        p = list(pk)
        random.Random(seed).shuffle(p)
        assert aggregate(spec, screen_clipped(spec, p, RobustConfig())[0]).digest() == ref


def test_a_random_direction_at_the_median_norm_is_scaled_down_when_trust_is_on():
    """`orth`: a colluder's random direction at the honest scale is kept (it points nowhere,
    so the direction rule cannot exclude it) and, by the bound alone, weighs a full sender.
    With trust on, a kept sender whose cosine with the others' sum is under cos_trust is
    scaled down by a further 2^-trust_shift; the honest senders are not."""
    opts = members(7)
    train(opts, 4, 6)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[6] = swap(spec, pk[6], "orth=1")
    plain, out, clipped = screen_clipped(spec, pk, RobustConfig(trust_shift=0))
    assert out == {} and 6 not in clipped  # kept at its own scale
    kept, out, clipped = screen_clipped(spec, pk, RobustConfig(trust_shift=2))
    assert out == {} and [s for s, _ in kept] == [0, 1, 2, 3, 4, 5, 6]
    assert set(clipped) == {6} and clipped[6] >= 2
    before, after = norms2(spec, plain), norms2(spec, kept)
    assert after[:6] == before[:6]
    assert all(a * 16 <= b for a, b in zip(after[6], before[6], strict=True))
    with pytest.raises(ValueError, match="trust_shift"):
        RobustConfig(trust_shift=17)


def test_colluders_sending_one_direction_do_not_vouch_for_each_other():
    """Two colluders send the same random direction (`orth`, one seed): each one's cosine with
    the others' sum counted the other's copy, so both looked trusted. Judged against the sum
    without its echoes, as the direction rule judges, each is scaled down by the trust shift
    on top of the near copies' shared weight (2^-1); the honest senders are not."""
    opts = members(7)
    train(opts, 4, 6)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[5], pk[6] = swap(spec, pk[5], "orth=1"), swap(spec, pk[6], "orth=1")
    kept, out, clipped = screen_clipped(spec, pk, RobustConfig(trust_shift=2))
    assert out == {} and [s for s, _ in kept] == [0, 1, 2, 3, 4, 5, 6]
    assert set(clipped) == {5, 6} and min(clipped.values()) >= 1 + 2, clipped
    seen = screen_weighted(spec, pk, RobustConfig(trust_shift=2))  # what a node reports
    assert seen.distrusted == (5, 6) and seen.copies == ((5, 6),)


def test_a_scaled_down_sender_counts_for_less_in_the_mean_when_weighted():
    """`orth` dilutes: scaled down by the trust shift it moves the step little, but it still
    counts as a whole sender in the mean's divisor, so the honest senders' mean shrinks by
    (n - f) / n. Weighted, the divisor is the kept senders' weights: 6 + 2^-4 here, and the
    step is exactly sum / (6 + 1/16)."""
    opts = members(7)
    train(opts, 4, 6)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[6] = swap(spec, pk[6], "orth=1")
    cfg = RobustConfig(trust_shift=4, weighted=True)
    kept, out, clipped, weight = screen_weighted(spec, pk, cfg)[:4]
    assert out == {} and set(clipped) == {6} and weight == 6 + Fraction(1, 16)
    assert screen_weighted(spec, pk, RobustConfig(trust_shift=4, weighted=False))[3] is None
    agg = aggregate(spec, kept)
    plain = aggregate(spec, kept).update(0, 1.0, False, torch.float64)
    agg.weight = weight
    step = agg.update(0, 1.0, False, torch.float64)
    assert torch.allclose(step * float(weight), plain * 7, rtol=1e-12, atol=0)
    assert agg.digest() != aggregate(spec, kept).digest()  # the divisor is part of the state


def test_graded_trust_shifts_by_the_cosine_against_the_median_exactly():
    from dtrain_node.optim.robust import by_parameter, crowded, graded
    from dtrain_node.optim.robust import clipped as clip_dots

    opts = members(8)
    train(opts, 4, 7)
    spec = opts[0].spec
    pk = decoded(opts)
    pk[6] = swap(spec, pk[6], "orth=1")  # cosine about 0: the largest shift
    pk[7] = swap(spec, pk[7], "skew=1")  # about half the honest direction: a shift of 1 or 2
    G, _ = by_parameter(spec, gram(spec, pk))
    keep = list(range(8))
    dots = clip_dots(G, keep)
    t = graded(dots, keep, set(), 6)
    d = crowded(dots, keep, set())
    total = sum(d[a][b] for a in keep for b in keep)
    cos = []
    for a in keep:
        row = sum(d[a][b] for b in keep)
        cos.append((row - d[a][a]) / math.sqrt(d[a][a] * (total - 2 * row + d[a][a])))
    ref = sorted(cos)[3]  # the lower median of 8
    for a in keep:
        want = 6 if cos[a] <= 0 else min(6, max(0, math.ceil(math.log2(ref / cos[a]))))
        assert t[a] == want, (a, cos[a], ref)
    assert t[6] >= 4 and t[7] >= 1 and all(t[a] <= 1 for a in range(6))
