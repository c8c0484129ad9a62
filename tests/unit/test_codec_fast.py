"""The batched codec paths give the very bits of the per-tensor ones.

The one-pass packet decoder against the field-by-field one, and the sparse aggregation
against the dense exact path, including chunks whose entries all cancel.
"""

from __future__ import annotations

import pytest
import torch

from dtrain_node.optim import aggregate as agg
from dtrain_node.optim import codec
from dtrain_node.optim.compress import CompressConfig, Sparse, compress_ef

SHAPES = [(128, 384), (96, 200), (64,), (100,), (64,), (3, 40, 7), (), (130, 64), (128, 128)]


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) * 10.0 ** (i % 5 - 3) for i, s in enumerate(SHAPES)]


def _packets(cfg: CompressConfig, n: int, seed: int) -> tuple[codec.Spec, list]:
    spec = codec.Spec(tuple(f"t{i}" for i in range(len(SHAPES))), tuple(SHAPES), cfg)
    return spec, [
        (f"0x{s:02x}", [compress_ef(e, cfg) for e in _tensors(seed + s)]) for s in range(n)
    ]


@pytest.mark.parametrize("cfg", [CompressConfig(), CompressConfig(k2d=16, k1d=3, bits=2)])
def test_one_pass_codec_matches_field_by_field(cfg, monkeypatch) -> None:
    spec, pk = _packets(cfg, 3, 0)
    datas = [codec.encode(spec, s) for _, s in pk]
    fast = [codec.decode(spec, d) for d in datas]
    monkeypatch.setattr(codec, "_decode_rows", lambda spec, raw, levels: [None] * len(raw))
    slow = [codec.decode(spec, d) for d in datas]
    assert fast == slow == [s for _, s in pk]
    monkeypatch.setattr(codec, "_encode_fast", lambda *a: None)
    assert [codec.encode(spec, s) for _, s in pk] == datas  # one-pass encode, the same bytes


@pytest.mark.parametrize("n", [2, 5])
def test_sparse_aggregate_equals_dense_with_repeated_indices(n: int) -> None:
    cfg = CompressConfig(k2d=8)
    spec, pk = _packets(cfg, n, 1)
    # overlapping picks: every sender also sends sender 0's indices in half the tensors
    pk = [
        (s, [Sparse(pk[0][1][i].idx, x.lvl, x.exp) if i % 2 else x for i, x in enumerate(sp)])
        for s, sp in pk
    ]
    want = agg.aggregate(spec, pk, dense=True).digest()
    assert agg.aggregate(spec, pk, dense=False).digest() == want  # batched outer products
    assert agg.aggregate(spec, pk).digest() == want  # the compiled grouped inverse


def test_cancelled_chunks_read_plus_zero() -> None:
    cfg = CompressConfig()
    spec, pk = _packets(cfg, 1, 2)
    neg = [Sparse(x.idx, -x.lvl, x.exp) for x in pk[0][1]]
    both = [pk[0], ("0xff", neg)]
    for a in (agg.aggregate(spec, both, dense=False), agg.aggregate(spec, both)):
        assert a.digest() == agg.aggregate(spec, both, dense=True).digest()
        for x in a.sums:
            assert not torch.signbit(x).any()  # +0 everywhere, never -0


def test_a_zero_in_the_basis_still_reads_plus_zero() -> None:
    """Chunk 48: Bq[16, 1] == 0, so a chunk whose one entry sits in row 16 sums only +-0 in
    output row 1; sparse and dense must both read +0 there."""
    from dtrain_node.optim import dct

    assert dct.basis_has_zero(48) and not dct.basis_has_zero(64)  # 48: not a power of two
    cfg = CompressConfig(chunk=48, k2d=1, k1d=1)
    spec = codec.Spec(("w",), ((48, 48),), cfg)
    one = [Sparse(torch.tensor([[16 * 48 + 5]]), torch.tensor([[-1]], dtype=torch.int8), 0)]
    for dense in (False, None):
        a = agg.aggregate(spec, [("0x01", one)], dense=dense)
        assert a.digest() == agg.aggregate(spec, [("0x01", one)], dense=True).digest()
        zeros = a.sums[0] == 0
        assert bool(zeros.any()) and not bool(torch.signbit(a.sums[0][zeros]).any())


@pytest.mark.parametrize("cfg", [CompressConfig(), CompressConfig(k2d=16, k1d=3, bits=2)])
def test_aggregate_reads_decoded_packets_like_plain_lists(cfg) -> None:
    """Aggregation reads each group's fields straight from the packets' value arrays; the
    result is the one from the per-tensor parts."""
    spec, pk = _packets(cfg, 4, 3)
    decoded = codec.decode_many(spec, [codec.encode(spec, s) for _, s in pk])
    assert all(isinstance(d, codec.Decoded) for d in decoded)
    fast = [(s, d) for (s, _), d in zip(pk, decoded, strict=True)]
    groups: dict = {}
    for i, (_, ce, k, _, _) in enumerate(spec.layout):
        groups.setdefault((ce == cfg.chunk, k), []).append(i)
    assert all(agg._span(spec, tuple(ts)) is not None for ts in groups.values())
    want = agg.aggregate(spec, [(s, list(d)) for s, d in fast])
    for dense in (None, True):
        assert agg.aggregate(spec, fast, dense=dense).digest() == want.digest()


def test_a_changed_decoded_packet_is_read_from_its_parts() -> None:
    """Replace a part (or a part's tensor) of a decoded packet: its value arrays are stale
    then, and aggregation must read the parts."""
    cfg = CompressConfig()
    spec, pk = _packets(cfg, 3, 4)
    decoded = codec.decode_many(spec, [codec.encode(spec, s) for _, s in pk])
    fast = [(s, d) for (s, _), d in zip(pk, decoded, strict=True)]
    assert all(d.intact() for d in decoded)
    other = pk[2][1][0]
    fast[0][1][0] = Sparse(other.idx.clone(), other.lvl.clone(), other.exp)
    fast[1][1][1].lvl = -fast[1][1][1].lvl
    assert not fast[0][1].intact() and not fast[1][1].intact() and fast[2][1].intact()
    want = agg.aggregate(spec, [(s, list(d)) for s, d in fast])
    assert agg.aggregate(spec, fast).digest() == want.digest()
