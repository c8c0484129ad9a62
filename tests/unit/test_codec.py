import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain_node.optim import codec
from dtrain_node.optim.codec import PacketError, Spec, decode, decode_many, encode
from dtrain_node.optim.compress import CompressConfig, Sparse, compress

SHAPES = [("w", (128, 192)), ("v", (100, 70)), ("b", (130,)), ("s", ())]


def make(cfg=None, seed=0, shapes=SHAPES):
    cfg = cfg or CompressConfig(k2d=4, k1d=2, bits=2)
    g = torch.Generator().manual_seed(seed)
    named = [(n, torch.randn(s, generator=g)) for n, s in shapes]
    spec = Spec.of(named, cfg)
    return spec, [compress(t, cfg) for _, t in named]


def reason(spec, data, **kw):
    with pytest.raises(PacketError) as ei:
        decode(spec, data, **kw)
    return ei.value.reason


@pytest.mark.parametrize("bits", [1, 2])
def test_round_trip(bits):
    spec, ts = make(CompressConfig(k2d=5, k1d=3, bits=bits))
    data = encode(spec, ts)
    assert len(data) == spec.packet_bytes
    assert decode(spec, data) == ts


def test_size_is_bit_packed():
    spec, ts = make(CompressConfig(k2d=4, k1d=1, bits=1), shapes=[("w", (4096, 4096))])
    # 4096 chunks x 4 x (12 + 1) bits = 26624 bytes, + header and one exponent byte
    assert len(encode(spec, ts)) == codec.HEADER + 1 + 4096 * 4 * 12 // 8 + 4096 * 4 // 8


def test_signature_binds_names_shapes_and_config():
    cfg = CompressConfig()
    a = Spec(("w", "b"), ((64, 64), (64,)), cfg).signature
    assert a == Spec(("w", "b"), ((64, 64), (64,)), CompressConfig()).signature
    assert a != Spec(("w", "c"), ((64, 64), (64,)), cfg).signature
    assert a != Spec(("w", "b"), ((64, 128), (64,)), cfg).signature
    assert a != Spec(("b", "w"), ((64,), (64, 64)), cfg).signature
    assert a != Spec(("w", "b"), ((64, 64), (64,)), CompressConfig(k2d=5)).signature
    assert a != Spec(("w", "b"), ((64, 64), (64,)), CompressConfig(bits=2)).signature


def test_rejects_truncated_and_trailing_and_oversized():
    spec, ts = make()
    data = encode(spec, ts)
    assert reason(spec, data[:-1]) == "truncated"
    assert reason(spec, data[:10]) == "truncated"
    assert reason(spec, b"") == "truncated"
    assert reason(spec, data + b"\0") == "trailing"
    assert reason(spec, data, max_bytes=len(data) - 1) == "oversized"
    assert reason(spec, data + bytes(1 << 20)) == "oversized"


def test_rejects_magic_version_signature():
    spec, ts = make()
    data = encode(spec, ts)
    assert reason(spec, b"XXXX" + data[4:]) == "magic"
    assert reason(spec, data[:4] + bytes([2]) + data[5:]) == "version"
    other, _ = make(shapes=[("w", (128, 192)), ("v", (100, 71)), ("b", (130,)), ("s", ())])
    assert reason(other, data) == "signature"
    cfg1, _ = make(CompressConfig(k2d=4, k1d=2, bits=1))
    assert reason(cfg1, data) == "signature"


def test_rejects_bad_exponent():
    # a scale is 2^exp with exp an int8: NaN cannot be encoded, and exponents that would
    # overflow to inf (or are absurd) are outside [EXP_MIN, EXP_MAX] and rejected
    spec, ts = make()
    data = bytearray(encode(spec, ts))
    for e in (127, -128, 21, -101):
        bad = bytearray(data)
        bad[codec.HEADER] = struct.pack("<b", e)[0]
        assert reason(spec, bytes(bad)) == "exponent"
    with pytest.raises(ValueError):
        encode(spec, [Sparse(ts[0].idx, ts[0].lvl, 99), *ts[1:]])


def test_rejects_index_out_of_range():
    # chunk 48: 2304 coefficients per matrix chunk in 12-bit fields, so 2304..4095 are invalid
    cfg = CompressConfig(chunk=48, k2d=1, k1d=1, bits=1)
    spec, ts = make(cfg, shapes=[("w", (48, 48))])
    data = bytearray(encode(spec, ts))
    off = codec.HEADER + 1
    data[off : off + 2] = (4000).to_bytes(2, "little")  # 12-bit index 4000 (+ zero pad bits)
    assert reason(spec, bytes(data)) == "index_range"


def test_rejects_unsorted_and_duplicate_indices():
    spec, ts = make(CompressConfig(k2d=2, k1d=1, bits=1), shapes=[("w", (64, 64))])
    base = encode(spec, ts)
    off = codec.HEADER + 1
    for pair in ((5, 5), (9, 3)):
        packed = pair[0] | (pair[1] << 12)  # two 12-bit fields, little-endian bit order
        bad = bytearray(base)
        bad[off : off + 3] = packed.to_bytes(3, "little")
        assert reason(spec, bytes(bad)) == "index_order"


def test_rejects_nonzero_padding():
    # 1 chunk x 1 index x 6 bits: 2 pad bits in the index byte
    spec, ts = make(CompressConfig(k1d=1), shapes=[("b", (64,))])
    bad = bytearray(encode(spec, ts))
    bad[codec.HEADER + 1] |= 0x80
    assert reason(spec, bytes(bad)) == "padding"


def test_encode_validates():
    spec, ts = make()
    with pytest.raises(ValueError):
        encode(spec, ts[:-1])
    t = ts[0]
    with pytest.raises(ValueError):
        encode(spec, [Sparse(t.idx.flip(1), t.lvl, t.exp), *ts[1:]])
    with pytest.raises(ValueError):
        encode(spec, [Sparse(t.idx, torch.zeros_like(t.lvl), t.exp), *ts[1:]])


FUZZ_SPEC, FUZZ_TS = make(CompressConfig(k2d=3, k1d=2, bits=2))
FUZZ_DATA = encode(FUZZ_SPEC, FUZZ_TS)


def _check(data):
    try:
        out = decode(FUZZ_SPEC, data)
    except PacketError:
        return
    # whatever decodes is a valid packet: re-encoding gives the same bytes
    assert encode(FUZZ_SPEC, out) == data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2 * len(FUZZ_DATA)))
def test_fuzz_random_bytes(data):
    _check(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(FUZZ_DATA) - 1), st.integers(0, 255))
def test_fuzz_single_byte_mutation(pos, val):
    data = bytearray(FUZZ_DATA)
    data[pos] = val
    _check(bytes(data))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(FUZZ_DATA)), st.binary(max_size=8))
def test_fuzz_splice(pos, junk):
    _check(FUZZ_DATA[:pos] + junk + FUZZ_DATA[pos:])
    _check(FUZZ_DATA[:pos])


def _one(data):
    try:
        return decode(FUZZ_SPEC, data)
    except PacketError as e:
        return (e.reason, str(e))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(FUZZ_DATA) - 1), st.integers(0, 255)), max_size=5))
def test_fuzz_decode_many_is_decode_of_each(mutations):
    """A round's packets decoded together give, per packet, what decode() alone gives: the same
    tensors for a valid one and the same error for a broken one, next to valid ones."""
    datas = [FUZZ_DATA]
    for pos, val in mutations:
        d = bytearray(FUZZ_DATA)
        d[pos] = val
        datas += [bytes(d), FUZZ_DATA[:pos]]
    datas.append("not bytes")
    many = decode_many(FUZZ_SPEC, datas)
    got = [r if not isinstance(r, PacketError) else (r.reason, str(r)) for r in many]
    assert got == [_one(d) for d in datas]
    assert got[0] == FUZZ_TS and got[-1][0] == "type"
