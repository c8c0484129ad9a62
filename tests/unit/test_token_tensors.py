"""Token tensors (input embedding, output head): their own k and one scale per block of rows.

The attack on the old codec, written first: a member whose batches touch only some token
rows sends, with one scale per tensor, k values at the busy rows' magnitude into every chunk,
also the chunks of rows no batch touched (1-bit levels have no zero): the shared update moves
tokens nobody saw. With one scale per block of rows an untouched block's scale is 2^EXP_MIN,
below the precision of any weight there, which therefore keeps its bits.
"""

from dataclasses import replace

import pytest
import torch

from dtrain_node.optim import codec, robust, segments
from dtrain_node.optim.compress import K_AUTO, CompressConfig
from dtrain_node.optim.feedback import Feedback
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train.start import start_model

VOCAB, HIDDEN = 320, 64
TOKENS = ("emb", "head")


def named(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "emb": (VOCAB, HIDDEN),
        "w": (HIDDEN, HIDDEN),
        "norm": (HIDDEN,),
        "head": (VOCAB, HIDDEN),
    }
    return [(n, torch.nn.Parameter(torch.randn(s, generator=g) * 0.02)) for n, s in shapes.items()]


def members(cfg: DeMoConfig, n: int = 4, tokens=TOKENS) -> list[DeMo]:
    return [DeMo(named(), cfg, sender=f"m{i}", tokens=tokens) for i in range(n)]


def touch_first_rows(opts: list[DeMo], rows: int, seed: int) -> None:
    """Every member moves only the first `rows` token rows (its batches held only those
    tokens) and every other weight, as K inner steps would."""
    g = torch.Generator().manual_seed(seed)
    for o in opts:
        for name, p in zip(o.names, o.params, strict=True):
            d = torch.randn(p.shape, generator=g) * 1e-3
            if name in TOKENS:
                d[rows:] = 0
            p.data.add_(d)


def config(**compress) -> DeMoConfig:
    return DeMoConfig(mode="local", sync_interval=1, lr=1.0, compress=CompressConfig(**compress))


def shared(opt: DeMo, name: str) -> torch.Tensor:
    return opt.theta_sync[opt.names.index(name)]


def test_one_scale_per_tensor_moves_token_rows_no_batch_touched():
    opts = members(config(k2d=4))
    before = shared(opts[0], "emb").clone()
    touch_first_rows(opts, 64, seed=1)
    lockstep(opts)
    assert not torch.equal(shared(opts[0], "emb")[64:], before[64:])


def test_one_scale_per_block_leaves_untouched_token_rows_exactly():
    opts = members(config(k2d=4, k_token=16, token_rows=64))
    before = [shared(opts[0], n).clone() for n in TOKENS]
    for r in range(3):
        touch_first_rows(opts, 64, seed=r)
        stats = lockstep(opts)
        assert all(not s.excluded and not s.rejected for s in stats)
    for n, b in zip(TOKENS, before, strict=True):
        after = shared(opts[0], n)
        assert torch.equal(after[64:], b[64:])
        assert not torch.equal(after[:64], b[:64])


def test_members_hold_bitwise_the_same_shared_state():
    opts = members(config(k2d=4, k_token=32, token_rows=128))
    for r in range(3):
        touch_first_rows(opts, 200, seed=10 + r)
        lockstep(opts)
    first = [t.numpy().tobytes() for t in opts[0].theta_sync]
    for o in opts[1:]:
        assert [t.numpy().tobytes() for t in o.theta_sync] == first


def test_replay_of_the_packets_gives_the_same_bits():
    opts = members(config(k2d=4, k_token=32, token_rows=64))
    start = [t.clone() for t in opts[0].theta_sync]
    rounds = []
    for r in range(2):
        touch_first_rows(opts, 100, seed=20 + r)
        packets = [(o.sender, o.prepare()) for o in opts]
        for o in opts:
            o.apply(packets)
        rounds.append(packets)
    fresh = DeMo(named(), opts[0].cfg, sender="referee", tokens=TOKENS)
    fresh.replay(start, rounds)
    assert [t.numpy().tobytes() for t in fresh.theta_sync] == [
        t.numpy().tobytes() for t in opts[0].theta_sync
    ]


def test_token_blocks_carry_their_own_k_and_name():
    spec, segs = segments.plan(
        [(n, tuple(p.shape)) for n, p in named()],
        CompressConfig(k2d=4, k_token=16, token_rows=128),
        TOKENS,
    )
    assert spec.names[:3] == ("emb[0:128]", "emb[128:256]", "emb[256:320]")
    assert spec.shapes[2] == (64, HIDDEN)
    assert [t[2] for t in spec.layout] == [16, 16, 16, 4, 1, 16, 16, 16]
    assert spec.groups == ((0, 1, 2), (3,), (4,), (5, 6, 7))
    x = torch.arange(VOCAB * HIDDEN, dtype=torch.float32).view(VOCAB, HIDDEN)
    assert segments.views([x, None, None, None], segs[:3])[1].data_ptr() == x[128].data_ptr()


def test_the_token_settings_are_bound_in_the_packet_signature():
    items = [(n, tuple(p.shape)) for n, p in named()]
    plain = segments.plan(items, CompressConfig(k2d=4), TOKENS)[0]
    assert plain == codec.Spec.of(named(), CompressConfig(k2d=4))  # version-1 packets unchanged
    sigs = {
        segments.plan(items, CompressConfig(k2d=4, **kw), TOKENS)[0].signature
        for kw in ({}, {"k_token": 8}, {"k_token": 16}, {"token_rows": 64}, {"token_rows": 128})
    }
    assert len(sigs) == 5


def test_a_member_that_touched_other_token_blocks_is_not_excluded_for_norm():
    """Rows are judged per parameter: a member whose batches held other tokens than the
    others' sends nothing in their blocks and is still honest."""
    opts = members(config(k2d=4, k_token=16, token_rows=64))
    g = torch.Generator().manual_seed(5)
    for i, o in enumerate(opts):
        for name, p in zip(o.names, o.params, strict=True):
            d = torch.randn(p.shape, generator=g) * 1e-3
            if name in TOKENS:
                lo = 0 if i < 3 else 128  # the last member saw only tokens 128..191
                d[:lo] = 0
                d[lo + 64 :] = 0
            p.data.add_(d)
    packets = [(o.sender, o.prepare()) for o in opts]
    good, _ = opts[0].decode_all(packets)
    _, excluded = robust.screen(opts[0].spec, good, opts[0].cfg.robust)
    assert excluded == {}
    per_block = codec.Spec(
        opts[0].spec.names, opts[0].spec.shapes, opts[0].spec.cfg, opts[0].spec.tokens
    )
    assert robust.screen(per_block, good, opts[0].cfg.robust)[1]  # judged per block: excluded


def test_feedback_takes_each_tensors_own_k():
    cfg = CompressConfig(k2d=4, k_token=16)
    fb = Feedback([(64, 64), (128, 64), (64,)], cfg, ks=[4, 16, 1])
    g = torch.Generator().manual_seed(0)
    fb.fold(1.0, [torch.randn(s, generator=g) for s in [(64, 64), (128, 64), (64,)]])
    out = fb.take()
    assert [tuple(s.idx.shape) for s in out] == [(1, 4), (2, 16), (1, 1)]


def test_token_names_of_the_builtin_model_are_its_embedding_and_head():
    model = start_model("builtin:tiny").fresh()
    names = segments.token_names(model)
    assert names == ("model.embed_tokens.weight", "lm_head.weight")


@pytest.mark.parametrize(
    "bad",
    [{"k_token": -2}, {"k_token": 4097}, {"token_rows": 63}, {"token_rows": -64}, {"ring": 1}],
)
def test_bad_token_settings_are_refused(bad):
    with pytest.raises(ValueError):
        CompressConfig(**bad)


def test_an_unknown_token_tensor_is_refused():
    with pytest.raises(ValueError, match="not among the parameters"):
        DeMo(named(), config(k_token=8), tokens=("nope",))


@pytest.mark.parametrize("ring", [3, 4, 8])
def test_auto_k_spends_the_upload_budget_the_other_tensors_leave(ring):
    """builtin:small (320-row embedding and head, 2.8M parameters): auto k keeps a sync's
    upload (packet and envelopes) within 1/1000 of a member's upload in a dense bf16 ring
    all-reduce among the job's seats (2 (N - 1) / N x 2 bytes a parameter); one more
    coefficient would not."""
    model = start_model("builtin:small").fresh()
    items = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    tokens = segments.token_names(model)
    cfg = CompressConfig(k2d=4, k_token=K_AUTO, token_rows=64, ring=ring)
    spec, _ = segments.plan(items, cfg, tokens)
    k = spec.cfg.k_token
    budget = 4 * (ring - 1) / ring * spec.numel / 1000 - segments.ENVELOPES
    assert 4 < k <= segments.K_TOKEN_MAX
    assert spec.packet_bytes <= budget
    if k < segments.K_TOKEN_MAX:
        over = segments.plan(items, CompressConfig(k2d=4, k_token=k + 1, token_rows=64), tokens)
        assert over[0].packet_bytes > budget
    if ring > 3:  # a bigger ring leaves more bytes to the token tensors
        fewer = segments.plan(items, replace(cfg, ring=3), tokens)
        assert fewer[0].cfg.k_token < k


@pytest.mark.parametrize("ring", [3, 4, 8, 16])
def test_auto_k_goes_below_the_matrices_k_when_tokens_are_most_of_the_model(ring):
    """The GPT-2 folder's shapes (a 50,257 x 32 tied embedding, 97% of the parameters): the
    job's k in every token block is over the budget (701x at 4 seats), so auto k takes the
    largest k below it that fits, and one more would not."""
    items = [("emb", (50257, 32)), ("pos", (256, 32)), ("w", (32, 128)), ("v", (128, 32))]
    k2d = 4 if ring <= 4 else 6
    cfg = CompressConfig(k2d=k2d, k_token=K_AUTO, token_rows=64, ring=ring)
    spec, _ = segments.plan(items, cfg, ("emb",))
    k = spec.cfg.k_token
    budget = 4 * (ring - 1) / ring * spec.numel / 1000 - segments.ENVELOPES
    assert 1 <= k < k2d
    assert spec.packet_bytes <= budget
    over = segments.plan(items, replace(cfg, k_token=k + 1), ("emb",))[0]
    assert over.packet_bytes > budget


def test_auto_k_keeps_the_matrices_k_when_no_k_fits_or_tokens_are_few():
    # two seats: no k brings the folder's shapes within 1/1000 of a ring of factor 1
    folder = [("emb", (50257, 32)), ("w", (32, 32))]
    cfg = CompressConfig(k_token=K_AUTO, token_rows=64, ring=2)
    assert segments.plan(folder, cfg, ("emb",))[0].cfg.k_token == 4
    one = segments.plan(folder, replace(cfg, k_token=1), ("emb",))[0]
    assert one.packet_bytes > segments.ring_upload(one.numel, 2) / 1000 - segments.ENVELOPES
    # builtin:tiny at 8 seats: k = 1 for its token tensors would fit the budget, but they are
    # a fifth of the model and lose the most under compression, so they keep the job's k
    model = start_model("builtin:tiny").fresh()
    items = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    tokens = segments.token_names(model)
    cfg = CompressConfig(k2d=6, k_token=K_AUTO, token_rows=64, ring=8)
    assert segments.plan(items, cfg, tokens)[0].cfg.k_token == 6
    low = segments.plan(items, replace(cfg, k_token=1), tokens)[0]
    assert low.packet_bytes <= segments.ring_upload(low.numel, 8) / 1000 - segments.ENVELOPES


def test_the_envelope_reserve_covers_a_packet_and_its_commitment():
    from dtrain_node.p2p import envelope

    assert segments.ENVELOPES >= 2 * envelope.OVERHEAD + envelope.STATE_LEN
