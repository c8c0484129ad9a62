import math
import threading

import pytest
import torch
from harness import bench_corpus as corpus
from harness import bench_model as model
from harness.baselines import DDP, AdamWConfig, DiLoCo, DiLoCoConfig, ring_allreduce_bytes

from dtrain_node.optim import codec, dct
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep

SHAPES = {"w": (128, 96), "v": (70,), "m": (64, 64)}


def tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def params(init):
    return [(n, torch.nn.Parameter(t.clone())) for n, t in init.items()]


def reference_paper(init, grads, cfg, steps, workers):
    """Plain float64 DeMo paper mode, written from the definition (no library code)."""
    n, c = cfg.compress.chunk, cfg.compress
    B = torch.tensor(
        [[math.cos(math.pi * (2 * j + 1) * k / (2 * n)) for j in range(n)] for k in range(n)],
        dtype=torch.float64,
    )
    B[0] *= math.sqrt(1 / n)
    B[1:] *= math.sqrt(2 / n)
    theta = {k: v.double().clone() for k, v in init.items()}
    e = [{k: torch.zeros_like(v) for k, v in theta.items()} for _ in range(workers)]

    def fwd(x):  # -> list of coefficient blocks
        return dct.dct(x, n)  # layout helper; checked against B below

    assert torch.allclose(dct.basis(n), B)
    for t in range(steps):
        for name in theta:
            shape = theta[name].shape
            is1 = len(shape) == 1
            k = c.k1d if is1 else c.k2d
            sent = []
            for w in range(workers):
                e[w][name] = cfg.beta * e[w][name] + grads[t][w][name].double()
                C = fwd(e[w][name])
                idx = C.abs().topk(k, dim=1).indices
                v = C.gather(1, idx)
                ex = round(math.log2(v.abs().mean().item()))
                q = torch.zeros_like(C).scatter(1, idx, torch.sign(v) * 2.0**ex)
                x = dct.idct(q, shape, n)
                e[w][name] -= x
                sent.append(x)
            U = sum(sent) / workers
            theta[name] -= cfg.lr * (torch.sign(U) if cfg.sign else U)
    return theta


@pytest.mark.parametrize("sign", [False, True])
def test_paper_mode_matches_float_reference(sign):
    W, steps = 3, 4
    cfg = DeMoConfig(
        mode="paper", lr=0.01, beta=0.9, sign=sign, compress=CompressConfig(k2d=6, k1d=2, bits=1)
    )
    init = tensors(0)
    grads = [[tensors(100 + 10 * t + w) for w in range(W)] for t in range(steps)]
    opts = [DeMo(params(init), cfg, sender=w) for w in range(W)]
    for t in range(steps):
        for w, o in enumerate(opts):
            for name, p in zip(o.names, o.params, strict=True):
                p.grad = grads[t][w][name].clone()
        stats = lockstep(opts)
        assert stats[0].applied == tuple(range(W))
    ref = reference_paper(init, grads, cfg, steps, W)
    for i, name in enumerate(opts[0].names):
        got = opts[0].params[i].detach().double()
        for o in opts[1:]:
            assert torch.equal(o.params[i], opts[0].params[i])  # shared state bitwise equal
        moved = (got - init[name].double()).abs().max().item()
        assert moved > 0.005
        if sign:
            # signs can only differ where U is ~0 (Bq approximates B to 2^-16)
            bad = (got - ref[name]).abs() > 1e-6
            assert bad.float().mean().item() < 0.01
        else:
            assert torch.allclose(got, ref[name], atol=1e-4 * moved, rtol=0)


class ThreadGather:
    """In-process transport for threads: everybody publishes, then everybody reads all."""

    def __init__(self, n):
        self.b, self.box, self.n = threading.Barrier(n), {}, n

    def make(self, sender, corrupt=False):
        def gather(pkt):
            self.box[sender] = pkt[:-1] if corrupt else pkt
            self.b.wait()
            out = sorted(self.box.items(), key=lambda kv: str(kv[0]), reverse=True)
            self.b.wait()
            return out

        return gather


def run_threads(opts, fn):
    ts = [threading.Thread(target=fn, args=(i, o)) for i, o in enumerate(opts)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_local_mode_threads_bitwise_shared_state():
    W, K = 3, 2
    cfg = DeMoConfig(mode="local", sync_interval=K, lr=0.8, inner_lr=0.01)
    init = tensors(1)
    opts = [DeMo(params(init), cfg, sender=f"node{w}") for w in range(W)]
    tg = ThreadGather(W)
    results = [[] for _ in range(W)]

    def work(w, o):
        gather = tg.make(o.sender, corrupt=(w == 2))
        g = torch.Generator().manual_seed(w)
        for _ in range(3 * K):
            loss = sum(((p - torch.randn(p.shape, generator=g)) ** 2).sum() for p in o.params)
            loss.backward()
            st = o.step(gather)
            if st is not None:
                results[w].append(st)

    run_threads(opts, work)
    for w in range(W):
        assert len(results[w]) == 3
        for st in results[w]:
            assert st.applied == ("node0", "node1")
            assert st.rejected == {"node2": "truncated"}
            assert st.bytes_sent == opts[0].spec.packet_bytes
    for i in range(len(SHAPES)):
        for o in opts:
            assert torch.equal(o.theta_sync[i], opts[0].theta_sync[i])
            assert torch.equal(o.params[i].detach(), o.theta_sync[i])  # local reset to sync
        assert not torch.equal(opts[0].theta_sync[i], init[opts[0].names[i]])


def test_conflicting_and_foreign_packets_rejected():
    cfg = DeMoConfig(mode="local", sync_interval=1)
    opts = [DeMo(params(tensors(0)), cfg, sender=w) for w in range(2)]
    other = DeMo([*params(tensors(0)), ("x", torch.nn.Parameter(torch.ones(3)))], cfg, sender=9)
    for i, o in enumerate([*opts, other]):
        for p in o.params:
            p.data.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    pk = [(o.sender, o.prepare()) for o in opts]
    st = opts[0].apply([*pk, (1, pk[0][1]), (9, other.prepare())])
    assert st.applied == (0,)
    assert st.rejected == {1: "conflicting packets", 9: "signature"}
    # the same packet delivered twice is fine
    st = opts[1].apply([*pk, pk[1]])
    assert st.applied == (0, 1)


def test_config_validation():
    with pytest.raises(ValueError, match="sync_interval 1"):
        DeMoConfig(mode="paper", sync_interval=4)
    with pytest.raises(ValueError):
        DeMoConfig(mode="other")
    with pytest.raises(ValueError):
        DeMoConfig(beta=1.5)
    with pytest.raises(ValueError):
        DeMoConfig(lr=0)
    with pytest.raises(ValueError, match="exceeds"):
        DeMo(params({"w": torch.zeros(4096, 4096)}), DeMoConfig(max_packet_bytes=1000))


def tiny_setup():
    torch.manual_seed(0)
    train, held = corpus.stdlib_corpus(max_train=300_000, max_heldout=40_000)
    c = model.GPTConfig(d=64, n_layer=1, n_head=1, ctx=64)
    return train, corpus.eval_windows(held, 16, c.ctx), c


def evaluate(m, ev):
    with torch.no_grad():
        return float(m(*ev))


@pytest.mark.parametrize("mode", ["paper", "local"])
def test_short_training_loss_decreases(mode):
    torch.set_num_threads(1)
    train, ev, c = tiny_setup()
    W = 2
    if mode == "paper":
        cfg = DeMoConfig(mode="paper", lr=3e-3, beta=0.9, sign=True)
    else:
        cfg = DeMoConfig(mode="local", sync_interval=4, lr=1.0, sign=False, inner_lr=3e-3)
    models = [model.GPT(c) for _ in range(W)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [DeMo(m.named_parameters(), cfg, sender=w) for w, m in enumerate(models)]
    sh = corpus.shards(train, W)
    gens = [torch.Generator().manual_seed(w) for w in range(W)]
    before = evaluate(models[0], ev)
    for _ in range(40):
        for w, m in enumerate(models):
            m(*corpus.batch(sh[w], 8, c.ctx, gens[w])).backward()
            if mode == "local":
                opts[w].inner_step()
        if opts[0].due:
            lockstep(opts)
            for p in models[0].parameters():
                p.grad = None
            for m in models[1:]:
                for p in m.parameters():
                    p.grad = None
    after = evaluate(models[0], ev)
    assert after < before - 1.0, (before, after)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_ddp_is_exact_gradient_mean():
    torch.manual_seed(0)
    c = model.GPTConfig(d=64, n_layer=1, n_head=1, ctx=64)
    m1, m2 = model.GPT(c), model.GPT(c)
    m2.load_state_dict(m1.state_dict())
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (10_000,))
    batches = [corpus.batch(data, 4, 64, g) for _ in range(3)]
    loss_fn = lambda m, b: m(*b)  # noqa: E731
    DDP(m1, AdamWConfig(lr=1e-2)).step(batches, loss_fn)
    # reference: one big batch has the same mean loss, hence the same gradient
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    m2(x, y).backward()
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert a.grad.abs().max() > 0
        assert torch.allclose(a.grad, b.grad, atol=1e-7, rtol=1e-4)
        assert not torch.equal(a, b)  # and the optimizer stepped


def test_diloco_plain_average_limit():
    # outer lr 1 without momentum: theta_sync becomes the average of the workers' models
    torch.manual_seed(0)
    c = model.GPTConfig(d=64, n_layer=1, n_head=1, ctx=64)
    ms = [model.GPT(c) for _ in range(2)]
    d = DiLoCo(ms, DiLoCoConfig(sync_interval=2, outer_lr=1.0, outer_momentum=0.0))
    data = torch.randint(0, 256, (10_000,))
    g = torch.Generator().manual_seed(0)
    loss_fn = lambda m, b: m(*b)  # noqa: E731
    d.step([corpus.batch(data, 4, 64, g) for _ in ms], loss_fn)
    assert not torch.equal(next(ms[0].parameters()), next(ms[1].parameters()))
    d.step([corpus.batch(data, 4, 64, g) for _ in ms], loss_fn)
    assert d.t == 2
    # after the sync both replicas hold the same averaged parameters
    for a, b in zip(ms[0].parameters(), ms[1].parameters(), strict=True):
        assert torch.equal(a, b)
    assert ring_allreduce_bytes(1000, 2, 4) == 3000


@pytest.mark.parametrize(
    "dtypes", [(torch.float32,) * 3, (torch.float32, torch.bfloat16, torch.float64)]
)
def test_prepare_folds_theta_sync_minus_theta_local_into_e(dtypes):
    """In local mode a round folds delta = (theta_sync - theta_local).float() into e (held as
    DCT coefficients), for parameters of any float dtype."""
    init = tensors(3)
    named = [
        (n, torch.nn.Parameter(t.to(d))) for (n, t), d in zip(init.items(), dtypes, strict=True)
    ]
    opt = DeMo(named, DeMoConfig(mode="local", beta=0.9, compress=CompressConfig(k2d=4)))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _, p in named:
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype))
    delta = [(th - p.detach()).float() for th, (_, p) in zip(opt.theta_sync, named, strict=True)]
    sent = codec.decode(opt.spec, opt.prepare())
    for i, (d, s) in enumerate(zip(delta, sent, strict=True)):
        # nothing is lost: what was sent plus what stays in e is delta
        kept = opt.feedback.coefficients(i).double()
        kept.scatter_add_(1, s.idx, s.lvl.double() * 2.0**s.exp)
        assert torch.allclose(dct.idct(kept, d.shape), d.double(), atol=1e-4)
