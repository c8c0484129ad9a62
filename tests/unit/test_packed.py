"""Decoded packets read through their arrays (codec.Decoded, optim/packed.py) give the very
numbers of the per-tensor parts: aggregation digests, Gram matrices and screen decisions, for
any valid packet, including exponent spreads that round senders and configs whose level
codes share a width with an index field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain_node.optim import aggregate as agg
from dtrain_node.optim import codec, packed, robust
from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, LEVELS, CompressConfig, Sparse

SHAPES = [(128, 96), (64,), (3, 20, 7), (), (70, 64), (100,), (64, 64)]
CONFIGS = [
    CompressConfig(),
    CompressConfig(k2d=16, k1d=3, bits=2),
    CompressConfig(chunk=4, k2d=3, k1d=2, bits=2),  # 2-bit levels beside 2-bit vector indices
]


def _spec(cfg: CompressConfig) -> codec.Spec:
    return codec.Spec(tuple(f"t{i}" for i in range(len(SHAPES))), tuple(SHAPES), cfg)


def _packet(spec: codec.Spec, seed: int, exps: list[int]) -> list[Sparse]:
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor(LEVELS[spec.cfg.bits], dtype=torch.int8)
    out = []
    for (nc, ce, k, _, _), e in zip(spec.layout, exps, strict=True):
        idx = torch.rand(nc, ce, generator=g).topk(k, dim=1).indices.sort(dim=1).values
        out.append(Sparse(idx, levels[torch.randint(len(levels), (nc, k), generator=g)], e))
    return out


def _round(spec: codec.Spec, seeds: list[int], exps: list[list[int]]):
    """The same packets twice: Decoded, and as plain lists of fresh parts."""
    datas = [codec.encode(spec, _packet(spec, s, e)) for s, e in zip(seeds, exps, strict=True)]
    decoded = [(f"0x{i:02x}", d) for i, d in enumerate(codec.decode_many(spec, datas))]
    plain = [(s, [Sparse(t.idx.clone(), t.lvl.clone(), t.exp) for t in d]) for s, d in decoded]
    fresh = [(s, codec.decode_many(spec, [codec.encode(spec, d)])[0]) for s, d in plain]
    return fresh, plain


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**20),
    exps=st.lists(
        st.lists(st.integers(EXP_MIN, EXP_MAX), min_size=7, max_size=7), min_size=1, max_size=6
    ),
)
def test_fuzz_arrays_and_parts_agree(cfg, seed, exps) -> None:
    spec = _spec(cfg)
    fresh, plain = _round(spec, [seed + i for i in range(len(exps))], exps)
    assert all(isinstance(d, codec.Decoded) and d.intact() for _, d in fresh)
    assert robust.gram(spec, fresh) == robust.gram(spec, plain)
    rc = robust.RobustConfig()
    assert robust.screen(spec, fresh, rc)[1] == robust.screen(spec, plain, rc)[1]
    for per in (False, True):
        want = agg.aggregate(spec, plain, per_coefficient=per).digest()
        assert agg.aggregate(spec, fresh, per_coefficient=per).digest() == want
    assert all(d.intact() for _, d in fresh)


def test_exponent_spread_rounds_senders_on_both_paths() -> None:
    """Senders 2^40 apart: the group's common exponent rounds the small ones (negative shift),
    half away from zero, on the array path as on the parts path."""
    spec = _spec(CompressConfig(k2d=16, k1d=3, bits=2))
    exps = [[EXP_MAX] * 7, [EXP_MAX - 40] * 7, [EXP_MAX - 9] * 7, [EXP_MAX - 10] * 7]
    fresh, plain = _round(spec, [1, 2, 3, 4], exps)
    ts = [i for i, lay in enumerate(spec.layout) if lay[1] != spec.cfg.chunk]
    ex = torch.tensor([[e[i] for i in ts] for e in exps])
    got, want = (agg._integers(spec, p, ts, ex, 8) for p in (fresh, plain))
    assert got[0] == want[0] and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert bool((got[2] == 0).any()) and bool((got[2].abs() == 2).any())  # rounded, not cut


def test_entries_rounds_half_away_from_zero() -> None:
    lvl = np.array([[3, -3, 1, -1, 3, -3]], np.int8)
    idx = np.arange(6, dtype=np.int64).reshape(1, 6)
    _, v = packed.entries(idx, lvl, np.array([[-1]]), np.array([1]), 6)
    assert v.tolist() == [[2, -2, 1, -1, 2, -2]]
    _, v = packed.entries(idx, lvl, np.array([[3]]), np.array([1]), 6)
    assert v.tolist() == [[24, -24, 8, -8, 24, -24]]
    _, v = packed.entries(idx, lvl, np.array([[-40]]), np.array([1]), 6)
    assert v.tolist() == [[0] * 6]


def test_dots_counts_only_shared_indices() -> None:
    idx = np.array([[1, 5, 9, 0, 2], [5, 9, 40, 0, 3]], np.int64)
    lvl = np.array([[3, -1, 1, 1, -3], [1, -3, 3, 1, 1]], np.int8)
    D = packed.dots(idx, lvl, np.array([[0, 1, 3], [3, 1, 2]]))
    assert D[0].tolist() == [[11, -1 * 1 + 1 * -3], [-4, 19]]
    assert D[1].tolist() == [[10, 1], [1, 2]]


def test_packed_refuses_shapes_that_do_not_fit() -> None:
    i, lv = np.zeros((2, 6), np.int64), np.ones((2, 6), np.int8)
    with pytest.raises(ValueError, match="entries"):
        packed.entries(i, lv, np.zeros((2, 1), np.int64), np.array([2]), 2)  # 4 != 6 entries
    with pytest.raises(ValueError, match="entries"):
        packed.entries(i, lv[:, :5], np.zeros((2, 1), np.int64), np.array([3]), 2)
    with pytest.raises(ValueError, match="past"):
        packed.dots(i, lv, np.array([[2, 2, 3]]))
    with pytest.raises(ValueError, match="dots"):
        packed.dots(i, lv[:1], np.array([[0, 1, 1]]))
    with pytest.raises(ValueError, match="negative"):
        packed.dots(i, lv, np.array([[-2, 1, 2]]))


def test_put_bits_packs_little_endian_and_refuses_what_does_not_fit() -> None:
    buf = np.zeros(4, np.uint8)
    packed.put_bits(buf, np.array([0b101, 0xABC, 1]), np.array([0, 3, 15]))
    assert int.from_bytes(buf.tobytes(), "little") == 0b101 | 0xABC << 3 | 1 << 15
    with pytest.raises(ValueError, match="negative"):
        packed.put_bits(buf, np.array([-1]), np.array([0]))
    with pytest.raises(ValueError, match="past"):
        packed.put_bits(buf, np.array([0xFFF]), np.array([17]))
    with pytest.raises(ValueError, match="positions"):
        packed.put_bits(buf, np.array([1, 2]), np.array([0]))


def test_get_bits_reads_what_put_bits_wrote_and_checks_bounds_and_order() -> None:
    buf = np.zeros(8, np.uint8)
    vals, first = np.array([5, 4000, 4001, 7]), np.array([0, 12, 24, 40])
    packed.put_bits(buf, vals, first)
    no_step = np.zeros(4, np.bool_)
    got, ok = packed.get_bits(buf[None], first, 12, np.full(4, 4096), no_step)
    assert got.tolist() == [vals.tolist()] and ok.tolist() == [True]
    _, ok = packed.get_bits(buf[None], first, 12, np.full(4, 4001), no_step)
    assert ok.tolist() == [False]  # 4001 is not below its bound
    _, ok = packed.get_bits(buf[None], first, 12, np.full(4, 4096), np.array([0, 1, 1, 1], bool))
    assert ok.tolist() == [False]  # 7 after 4001 where the order must increase
    with pytest.raises(ValueError, match="outside"):
        packed.get_bits(buf[None], np.array([60]), 12, np.array([9]), np.zeros(1, np.bool_))
    with pytest.raises(ValueError, match="get_bits"):
        packed.get_bits(buf[None], first, 25, np.full(4, 9), no_step)


def test_decoded_makes_parts_on_access_and_reads_like_a_list() -> None:
    spec = _spec(CompressConfig())
    parts = _packet(spec, 7, list(range(-3, 4)))
    d = codec.decode(spec, codec.encode(spec, parts))
    assert isinstance(d, codec.Decoded) and len(d) == len(parts)
    assert d == parts and parts == d and d[-1] == parts[-1] and d[1:3] == parts[1:3]
    assert d[2] is d[2] and d.exps.tolist() == [p.exp for p in parts]
    other = codec.Spec(tuple(f"u{i}" for i in range(len(SHAPES))), spec.shapes, spec.cfg)
    assert d.readable(spec) and not d.readable(other)  # positions of another spec never read it
    assert d != parts[:-1] and d != [*parts[:-1], parts[0]]


def test_a_changed_part_takes_the_packet_off_its_arrays() -> None:
    spec = _spec(CompressConfig())
    rounds = [codec.encode(spec, _packet(spec, s, [0] * 7)) for s in range(3)]
    for change in ("part", "tensor", "exp", "inplace"):
        ds = codec.decode_many(spec, rounds)
        pk = [(f"0x{i}", d) for i, d in enumerate(ds)]
        d = ds[0]
        if change == "part":
            d[1] = Sparse(ds[1][1].idx.clone(), ds[1][1].lvl.clone(), 3)
        elif change == "tensor":
            d[0].lvl = -d[0].lvl
        elif change == "exp":
            d[2].exp += 1
        else:
            d[0].lvl.neg_()  # shows in the arrays too
        assert d.intact() == (change == "inplace")
        plain = [(s, [Sparse(t.idx.clone(), t.lvl.clone(), t.exp) for t in p]) for s, p in pk]
        assert agg.aggregate(spec, pk).digest() == agg.aggregate(spec, plain).digest()
        assert robust.gram(spec, pk) == robust.gram(spec, plain)
