"""The output head's mean row (CompressConfig.k_mean, recipe `head_mean_topk`).

The attack on the codec without it, written first: the rows of tokens no batch holds all
move the same way (the softmax pushes their logits down along one hidden direction), but each
block of rows sends only k coefficients of that common move per round, so the shared head
takes many rounds to follow it. With a mean row the common move is one vector tensor of the
packet, applied to every row. A member that inflates that vector moves every row of the
head: the robust screen weighs it by the rows it moves, and leaves that member out.
"""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dtrain.errors import ConfigError
from dtrain.recipe import Recipe
from dtrain_node.optim import codec, robust, segments
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.feedback import Feedback
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep

VOCAB, HIDDEN, BUSY = 320, 128, 64
REACH = BUSY  # the tokenizer's length: rows BUSY.. no token reaches
TOKENS, HEADS = ("emb", "head"), ("head",)


def named(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"emb": (VOCAB, HIDDEN), "w": (HIDDEN, HIDDEN), "head": (VOCAB, HIDDEN)}
    return [(n, torch.nn.Parameter(torch.randn(s, generator=g) * 0.02)) for n, s in shapes.items()]


def config(k_mean: int = 0) -> DeMoConfig:
    # few coefficients per token block, as a large vocabulary's budget leaves (the GPT-2 folder)
    compress = CompressConfig(k2d=4, k_token=2, token_rows=64, k_mean=k_mean)
    return DeMoConfig(mode="local", sync_interval=1, lr=1.0, beta=0.8, compress=compress)


def members(cfg: DeMoConfig, n: int = 4, reach: int = REACH) -> list[DeMo]:
    return [DeMo(named(), cfg, f"m{i}", TOKENS, HEADS, reach) for i in range(n)]


def common_move(seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(HIDDEN, generator=g) * 1e-3


def push_down(opts: list[DeMo], seed: int) -> None:
    """What K inner steps do to the head: every row of a token no batch held moves by the same
    vector (the rows no token reaches, and more), the first BUSY rows each their own way; the
    other weights move at random."""
    g = torch.Generator().manual_seed(seed)
    v = common_move()
    for o in opts:
        for name, p in zip(o.names, o.params, strict=True):
            d = torch.randn(p.shape, generator=g) * 1e-3
            if name == "head":
                d[BUSY:] = v
            p.data.sub_(d)


def head(o: DeMo) -> torch.Tensor:
    return o.theta_sync[o.names.index("head")]


def delivered(k_mean: int, rounds: int) -> float:
    """The share of the idle rows' common move (one per round) the shared head made, after
    `rounds` rounds."""
    opts = members(config(k_mean))
    before = head(opts[0]).clone()
    for r in range(rounds):
        push_down(opts, seed=r)
        assert all(not s.excluded and not s.rejected for s in lockstep(opts))
    moved = (before - head(opts[0]))[BUSY:]
    return float((moved @ common_move()).mean() / common_move().pow(2).sum()) / rounds


def test_without_a_mean_row_the_idle_rows_common_move_arrives_slowly() -> None:
    assert delivered(k_mean=0, rounds=3) < 0.35


def test_with_a_mean_row_the_idle_rows_follow_their_common_move() -> None:
    without, with_mean = delivered(0, rounds=3), delivered(64, rounds=3)
    assert with_mean > 0.5 and with_mean > 2 * without, (without, with_mean)


def test_members_hold_bitwise_the_same_state_and_a_replay_gives_it() -> None:
    opts = members(config(64))
    start = [t.clone() for t in opts[0].theta_sync]
    rounds = []
    for r in range(3):
        push_down(opts, seed=r)
        packets = [(o.sender, o.prepare()) for o in opts]
        rounds.append(packets)
        for o in opts:
            o.apply(packets)
    for o in opts[1:]:
        assert all(torch.equal(a, b) for a, b in zip(o.theta_sync, opts[0].theta_sync, strict=True))
    checker = DeMo(named(), config(64), "checker", TOKENS, HEADS, REACH)
    checker.replay(start, rounds)
    for a, b in zip(checker.theta_sync, opts[0].theta_sync, strict=True):
        assert torch.equal(a, b)


def test_only_the_head_has_a_mean_row_and_it_weighs_as_many_rows_as_it_moves() -> None:
    spec = members(config(16), n=1)[0].spec
    means = [n for i, n in enumerate(spec.names) if spec.is_mean(i)]
    assert means == ["head[mean 64:]"]
    i = spec.names.index("head[mean 64:]")
    assert spec.shapes[i] == (HIDDEN,) and spec.layout[i][2] == 16
    assert spec.weights[i] == VOCAB and set(spec.weights) == {1, VOCAB}
    blocks = [j for j, n in enumerate(spec.names) if n.startswith("head[")]
    assert {spec.parents[j] for j in blocks} == {spec.parents[i]}


def test_the_mean_row_is_bound_in_the_packet_signature() -> None:
    sigs = {members(config(k), n=1)[0].spec.signature for k in (0, 16, 64)}
    assert len(sigs) == 3
    without = members(config(0), n=1)[0].spec
    assert not any(without.is_mean(i) for i in range(len(without.names)))


def test_a_head_whose_tokenizer_reaches_into_its_last_block_has_no_mean_row() -> None:
    """The built-in models' case (259 of 320 rows): a mean of busy and idle rows would follow
    neither, so there is none, and the packet is the one without mean rows."""
    for reach in (0, 300, VOCAB):
        spec = members(config(64), n=1, reach=reach)[0].spec
        assert not any(spec.is_mean(i) for i in range(len(spec.names))), reach
        assert spec.signature == members(config(0), n=1, reach=reach)[0].spec.signature


def test_a_head_that_is_not_a_token_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="not token tensors"):
        DeMo(named(), config(16), tokens=("emb",), heads=HEADS)


def inflated(packet: bytes, spec: codec.Spec, by: int) -> bytes:
    """The packet with its mean row's scale raised 2^by (every row of the head moved more)."""
    sparse = codec.decode(spec, packet)
    i = spec.names.index("head[mean 64:]")
    sparse[i] = replace(sparse[i], exp=sparse[i].exp + by)
    return codec.encode(spec, sparse)


def test_a_member_that_inflates_its_mean_row_is_left_out() -> None:
    opts = members(config(64), n=5)
    spec = opts[0].spec
    push_down(opts, seed=0)
    packets = [(o.sender, o.prepare()) for o in opts]
    packets[-1] = (packets[-1][0], inflated(packets[-1][1], spec, by=5))  # 32x, every row
    decoded = [(s, codec.decode(spec, p)) for s, p in packets]
    cfg = robust.RobustConfig()
    kept, out = robust.screen(spec, decoded, cfg)
    assert out == {"m4": "norm_high:head"} and len(kept) == 4
    # counted once instead of once per row, the inflated mean row would pass the norm rule
    G = robust.gram(spec, robust.aggregate.by_sender(decoded))
    i = spec.names.index("head[mean 64:]")
    head_parts = [j for j in range(len(spec.names)) if spec.parents[j] == spec.parents[i]]
    unweighted = [sum(G[j][a][a] for j in head_parts) for a in range(5)]
    assert unweighted[4] < cfg.hi**2 * unweighted[0]


def test_feedback_takes_each_vectors_own_k() -> None:
    fb = Feedback([(64,), (HIDDEN,), (64,)], CompressConfig(k_mean=8), ks=[1, 8, 1])
    fb.vec.normal_()
    got = fb.take()
    assert [tuple(s.idx.shape) for s in got] == [(1, 1), (2, 8), (1, 1)]


def test_the_recipe_sets_the_mean_row_and_a_recipe_without_it_keeps_its_meaning(tmp_path) -> None:
    from dtrain_node.optim.settings import compress_config

    assert Recipe().head_mean_topk == 64  # the job default
    assert json.loads(Recipe().canonical())["head_mean_topk"] == 64
    # a recipe written before the field existed: read without one, hashed as it was
    old = tmp_path / "old.toml"
    old.write_text("batch_size = 4\n")
    read = Recipe.from_toml(old)
    assert read.head_mean_topk == 0 and "head_mean_topk" not in read.canonical()
    job = SimpleNamespace(topk_per_chunk=4, quant_bits=1, max_operators=4)
    assert compress_config(job, read).k_mean == 0  # type: ignore[arg-type]
    assert compress_config(job, None).k_mean == 64  # type: ignore[arg-type]
    written = tmp_path / "new.toml"
    written.write_text(Recipe(batch_size=4).to_toml())
    assert Recipe.from_toml(written) == Recipe(batch_size=4)
    with pytest.raises(ConfigError, match="head_mean_topk"):
        Recipe(head_mean_topk=65)
    paper = Recipe(demo_mode="paper", outer_lr=0.001)  # its sign step per tensor: no mean row
    assert compress_config(job, paper).k_mean == 0  # type: ignore[arg-type]


def test_the_parts_of_a_head_add_up_to_it() -> None:
    opt = members(config(16), n=1)[0]
    tensors = [p.detach() for p in opt.params]
    parts = segments.parts(tensors, opt.segs)
    h = opt.names.index("head")
    mean = next(x for x, s in zip(parts, opt.segs, strict=True) if s.mean and s.param == h)
    blocks = [x for x, s in zip(parts, opt.segs, strict=True) if s.param == h and not s.mean]
    assert torch.allclose(mean, tensors[h][REACH:].mean(0), atol=1e-7)  # of the rows cut
    assert torch.allclose(torch.cat(blocks) + mean, tensors[h][:REACH], atol=1e-7)
    e = opt.names.index("emb")  # no mean row: its blocks are its rows as they are
    emb = [x for x, s in zip(parts, opt.segs, strict=True) if s.param == e]
    assert torch.equal(torch.cat(emb), tensors[e])


def test_a_heads_rows_beyond_its_tokenizer_move_by_the_mean_row_alone() -> None:
    reach = 100  # the tokenizer's length: rows 100.. no token reaches
    opts = [DeMo(named(), config(64), f"m{i}", TOKENS, HEADS, reach) for i in range(4)]
    spec = opts[0].spec
    assert [n for n in spec.names if n.startswith("head")] == [
        "head[0:64]",
        "head[64:128]",  # the block that holds row 99 stays whole
        "head[mean 128:]",
    ]
    assert spec.weight(spec.names.index("head[mean 128:]")) == VOCAB
    assert sum(n.startswith("emb[") for n in spec.names) == VOCAB // 64  # not a head
    before = head(opts[0]).clone()
    push_down(opts, seed=0)
    lockstep(opts)
    moved = before - head(opts[0])
    tail = moved[128:]
    # one move for all of them (to the float32 rounding of weights around 0.02)
    assert torch.allclose(tail, tail[:1].expand_as(tail), rtol=0, atol=1e-8)
    v = common_move()
    assert float(tail[0] @ v) > 0.5 * float(v @ v)
    assert not torch.equal(moved[:64], moved[:1].expand(64, -1))  # busy rows their own ways


def test_the_budget_of_a_head_cut_at_its_tokenizer_is_the_whole_models() -> None:
    """A 50,257-row tied head of width 32 with a 1,024-token tokenizer (the GPT-2 folder's
    shape): without its tail the auto k is not starved by rows no token reaches."""
    named_shapes = [("wte", (50257, 32)), ("h", (32, 96)), ("ln", (32,))]
    auto = CompressConfig(k2d=4, k_token=-1, token_rows=64, ring=4)
    cut = segments.plan(named_shapes, replace(auto, k_mean=64), ("wte",), ("wte",), 1024)[0]
    whole = segments.plan(named_shapes, auto, ("wte",), ())[0]
    assert whole.cfg.k_token <= 2 and cut.cfg.k_token == segments.K_TOKEN_MAX
    ring = segments.ring_upload(50257 * 32 + 32 * 96 + 32, 4)
    assert cut.packet_bytes + segments.ENVELOPES <= ring * segments.BUDGET


def test_the_deltas_of_a_head_are_the_parts_of_its_difference() -> None:
    opt = members(config(16), n=1)[0]
    g = torch.Generator().manual_seed(3)
    a = [p.detach().clone() for p in opt.params]
    b = [x + torch.randn(x.shape, generator=g) * 1e-3 for x in a]
    got_a, got_b = segments.deltas(a, b, opt.segs)
    want = segments.parts([x - y for x, y in zip(a, b, strict=True)], opt.segs)
    for s, x, y, w in zip(opt.segs, got_a, got_b, want, strict=True):
        diff = x if y is None else x - y
        assert torch.allclose(diff, w, rtol=0, atol=1e-9), s
        assert (y is None) == (s.param == opt.names.index("head"))  # one centred copy
