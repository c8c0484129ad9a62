"""The recipe's inner-step fields (train/inner.py): the learning-rate schedule and its warm-up,
gradient clipping and accumulation, as the inner AdamW sees them at each step; a recipe leaving
them at their defaults trains exactly as before; two workers using them stay bitwise identical
on every backend (built-in, TRL, torchtune)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from harness.jobs import tiny_job

from dtrain.recipe import Recipe
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import corpus, inner, shard
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.inner import Accumulated, InnerPlan, lr_factor

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("cpt") / "cpt.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


def cpt(text: tuple[Path, bytes], recipe: Recipe | None = None, batch_size: int = 4):
    return make_backend(replace(tiny_job("cpt", text[0], text[1], batch_size), recipe=recipe))


def demo(backend, inner_lr: float = 2e-3, sender: int = 0) -> DeMo:
    cfg = DeMoConfig(mode="local", sync_interval=2, inner_lr=inner_lr)
    return DeMo(backend.model.named_parameters(), cfg, sender=sender)


def watch(opt: DeMo) -> list[tuple[float, float]]:
    """(learning rate, global gradient norm) of every step the inner AdamW takes from now on."""
    seen: list[tuple[float, float]] = []

    def hook(optimizer, _args, _kwargs) -> None:
        norms = [p.grad.norm() for p in opt.params if p.grad is not None]
        seen.append((optimizer.param_groups[0]["lr"], float(torch.stack(norms).norm())))

    opt.inner.register_step_pre_hook(hook)
    return seen


def trainer(backend, opt: DeMo, recipe: Recipe | None, epoch: int, steps: int, epochs: int):
    """What `inner.run_round` reads of the runner (operator/epoch.py `EpochTrainer`)."""
    spec = SimpleNamespace(sync_interval=2, steps_per_epoch=steps, total_epochs=epochs)
    return SimpleNamespace(
        job=SimpleNamespace(spec=spec, state=SimpleNamespace(epoch=epoch)),
        train_job=SimpleNamespace(recipe=recipe),
        backend=backend,
        opt=opt,
        batches=backend.batches(torch.arange(backend.n_items()), 4, seed=0),
        device=CPU,
        rewards=[],
    )


# ---------------------------------------------------------------- the schedule


def test_lr_factor_by_hand() -> None:
    flat = Recipe()
    assert [lr_factor(flat, s, 10) for s in (0, 5, 9)] == [1.0, 1.0, 1.0]
    warm = Recipe(warmup_steps=4)
    assert [lr_factor(warm, s, 10) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    lin = Recipe(lr_schedule="linear", warmup_steps=2)
    assert [lr_factor(lin, s, 10) for s in (0, 1, 2, 6, 9)] == [0.5, 1.0, 1.0, 0.5, 0.125]
    cos = Recipe(lr_schedule="cosine", min_lr_ratio=0.2)
    assert lr_factor(cos, 0, 4) == 1.0
    assert lr_factor(cos, 2, 4) == pytest.approx(0.6)  # half-way: the mean of 1 and 0.2
    assert lr_factor(cos, 3, 4) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(0.75 * math.pi)))
    assert lr_factor(cos, 100, 4) == pytest.approx(0.2)  # past the end: the floor


def test_the_optimizer_sees_the_schedule_over_the_whole_job(text) -> None:
    """Epoch 1 of a 2 x 6-step job: its steps are the job's steps 6..11, so the rates continue
    the cosine where epoch 0 left it; a node resumed after its first round (DeMo's step count
    restored) takes up the schedule at step 9, not 6."""
    recipe = Recipe(lr_schedule="cosine", warmup_steps=2, inner_lr=1e-3)
    b = cpt(text, recipe)
    opt = demo(b, inner_lr=recipe.inner_lr)
    seen = watch(opt)
    t = trainer(b, opt, recipe, epoch=1, steps=6, epochs=2)
    for _ in range(3):
        tokens, loss = inner.run_round(t)
        assert tokens == 2 * 4 * 128 and math.isfinite(loss)
    want = [1e-3 * lr_factor(recipe, s, 12) for s in range(6, 12)]
    assert [lr for lr, _ in seen] == want
    assert len(set(want)) == 6 and want[0] < 1e-3  # it moves, below the peak past the warm-up

    again = cpt(text, recipe)
    resumed = demo(again, inner_lr=recipe.inner_lr)
    resumed.steps = 3  # what roundstate.load restores
    seen = watch(resumed)
    inner.run_round(trainer(again, resumed, recipe, epoch=1, steps=6, epochs=2))
    assert [lr for lr, _ in seen] == want[3:5]


def test_without_a_schedule_the_rate_is_never_written(text) -> None:
    """No recipe (the node's own inner_lr) and a recipe without schedule fields both leave the
    optimizer's rate as it was built."""
    for recipe, lr in ((None, 7e-4), (Recipe(inner_lr=7e-4), 7e-4)):
        b = cpt(text, recipe)
        opt = demo(b, inner_lr=lr)
        seen = watch(opt)
        inner.run_round(trainer(b, opt, recipe, epoch=3, steps=4, epochs=5))
        assert [x for x, _ in seen] == [lr, lr]


# ---------------------------------------------------------------- clipping


def test_gradients_are_clipped_to_the_global_norm(text) -> None:
    recipe = Recipe(max_grad_norm=0.05)
    clipped, free = cpt(text, recipe), cpt(text)
    opts = [demo(clipped), demo(free)]
    seen = [watch(o) for o in opts]
    batch = next(free.batches(torch.arange(free.n_items()), 4, seed=0))
    done = InnerPlan(recipe, 10).step(opts[0], clipped, batch, 0, CPU)
    InnerPlan(None, 10).step(opts[1], free, batch, 0, CPU)
    raw = seen[1][0][1]
    assert raw > 0.05 and done.grad_norm == pytest.approx(raw, rel=1e-6)  # reported before
    assert seen[0][0][1] == pytest.approx(0.05, rel=1e-4)  # what AdamW stepped on
    big = Recipe(max_grad_norm=1e6)  # above the norm: the gradients pass unchanged
    b = cpt(text, big)
    o = demo(b)
    s = watch(o)
    InnerPlan(big, 10).step(o, b, batch, 0, CPU)
    assert s[0][1] == pytest.approx(raw, rel=1e-6)


# ---------------------------------------------------------------- accumulation


def test_accumulating_two_micro_batches_equals_one_batch_of_both(text) -> None:
    """CPT windows all have the same length, so the mean of two micro-batches' mean losses is
    the mean loss of the batch holding both: the gradients and the loss agree to rounding,
    and neither micro-batch alone gives them. (The weights after the step are not compared:
    AdamW's first step is about lr x g / |g|, which blows rounding up on near-zero gradients.)"""
    recipe = Recipe(grad_accum=2)
    accum, whole, half = cpt(text, recipe), cpt(text), cpt(text)
    first, second = itertools.islice(whole.batches(torch.arange(whole.n_items()), 4, 0), 2)
    both = tuple(torch.cat(pair) for pair in zip(first, second, strict=True))
    grads: dict[str, list[torch.Tensor]] = {}
    losses: dict[str, float] = {}
    for name, b in (("accum", accum), ("whole", whole), ("half", half)):
        opt = demo(b)
        opt.inner.register_step_pre_hook(
            lambda *_a, name=name, opt=opt: grads.__setitem__(
                name, [p.grad.clone() for p in opt.params]
            )
        )
        batch = {"accum": Accumulated((first, second)), "whole": both, "half": first}[name]
        done = InnerPlan(recipe if name == "accum" else None, 10).step(opt, b, batch, 0, CPU)
        losses[name] = done.loss
        assert done.tokens == {"accum": 8 * 128, "whole": 8 * 128, "half": 4 * 128}[name]
    for a, w in zip(grads["accum"], grads["whole"], strict=True):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-7)
    assert losses["accum"] == pytest.approx(losses["whole"], rel=1e-6)  # the mean of both
    assert not all(
        torch.allclose(h, w, rtol=1e-2, atol=1e-5)
        for h, w in zip(grads["half"], grads["whole"], strict=True)
    )


def test_an_accumulating_backend_yields_one_group_per_inner_step(text) -> None:
    """The stream groups consecutive batches of the plain stream, so skipping r x K items on
    resume (operator/epoch.py `from_round`) skips r x K inner steps of micro-batches."""
    plain, grouped = cpt(text), cpt(text, Recipe(grad_accum=3))
    assert isinstance(grouped, inner.Accumulating) and not isinstance(plain, inner.Accumulating)
    assert grouped.model is grouped.wrapped.model and grouped.n_items() == plain.n_items()
    idx = torch.arange(plain.n_items())
    flat = list(itertools.islice(plain.batches(idx, 4, 5), 12))
    steps = list(itertools.islice(grouped.batches(idx, 4, 5), 2, 4))  # resumed at step 2
    assert all(isinstance(s, Accumulated) and len(s) == 3 for s in steps)
    for got, want in zip(itertools.chain(*steps), flat[6:12], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
    # a caller stepping without the plan gets the group's mean loss (one graph)
    group_loss = grouped.loss(steps[0])
    with torch.no_grad():
        want = sum(float(plain.loss(b)) for b in flat[6:9]) / 3
    assert float(group_loss) == pytest.approx(want, rel=1e-6) and group_loss.requires_grad


# ---------------------------------------------------------------- defaults change nothing


def test_default_fields_train_exactly_as_the_step_before_them(text) -> None:
    """The old inner loop (backward, step) against the plan with no recipe and with a recipe at
    the defaults: bitwise the same weights and losses after four steps."""
    runs = []
    for how in ("old", None, Recipe()):
        b = cpt(text, how if isinstance(how, Recipe) else None)
        assert not isinstance(b, inner.Accumulating)
        opt = demo(b)
        it = b.batches(torch.arange(b.n_items()), 4, seed=1)
        losses = []
        for s in range(4):
            if how == "old":
                loss = b.loss(next(it))
                loss.backward()
                opt.inner_step()
                losses.append(float(loss.detach()))
            else:
                losses.append(InnerPlan(how, 8).step(opt, b, next(it), s, CPU).loss)
        runs.append((losses, [p.detach().clone() for p in b.model.parameters()]))
    for losses, params in runs[1:]:
        assert losses == runs[0][0]
        assert all(torch.equal(p, q) for p, q in zip(params, runs[0][1], strict=True))


# ---------------------------------------------------------------- two workers, bitwise


def chat_sft(n: int = 6) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{b * 7}="},
                {"role": "assistant", "content": str(a + b * 7)},
            ]
        }
        for a in range(n)
        for b in range(n)
    ]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    from dtrain_node.train.toy_models import save_gpt2

    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


SCHEDULED = Recipe(
    lr_schedule="cosine",
    warmup_steps=2,
    min_lr_ratio=0.1,
    max_grad_norm=0.5,
    grad_accum=2,
    batch_size=4,
    inner_lr=3e-3,
)


@pytest.mark.parametrize("name", ["builtin", "trl", "torchtune"])
def test_two_workers_with_the_fields_stay_bitwise_identical(tmp_path, gpt2, name) -> None:
    """Two workers of one job on disjoint shards, each backend computing the loss and the
    recipe's schedule, clipping and accumulation stepping the inner AdamW: after every DeMo
    sync their shared state is bitwise the same and their models equal it."""
    if name != "builtin":
        pytest.importorskip(name)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chat_sft()))
    recipe = replace(SCHEDULED, backend=name)
    tj = TrainJob(1, "sft", str(gpt2), str(data), b"\0" * 32, 4, recipe)
    workers = [make_backend(tj), make_backend(tj)]
    assert all(isinstance(w, inner.Accumulating) for w in workers)
    cfg = DeMoConfig(mode="local", sync_interval=2, inner_lr=recipe.inner_lr)
    opts = [DeMo(w.model.named_parameters(), cfg, sender=i) for i, w in enumerate(workers)]
    seen = [watch(o) for o in opts]
    n = workers[0].n_items()
    runners = []
    for me, w, o in zip("ab", workers, opts, strict=True):
        t = trainer(w, o, recipe, epoch=0, steps=4, epochs=1)
        t.batches = w.batches(shard.assign(n, 1, 0, ["a", "b"], me), 4, seed=7)
        runners.append(t)
    for _ in range(2):  # the job's 4 steps: two rounds of K = 2
        for t in runners:
            inner.run_round(t)
        lockstep(opts)
        for a, b in zip(opts[0].theta_sync, opts[1].theta_sync, strict=True):
            assert torch.equal(a, b)
    for o in opts:
        assert all(torch.equal(p.detach(), t) for p, t in zip(o.params, o.theta_sync, strict=True))
    want = [3e-3 * lr_factor(recipe, s, 4) for s in range(4)]
    assert [lr for lr, _ in seen[0]] == [lr for lr, _ in seen[1]] == want
    assert all(norm <= 0.5 * (1 + 1e-4) for s in seen for _, norm in s)


# ---------------------------------------------------------------- replays


def test_a_replay_through_the_plan_gives_the_members_packet_byte_for_byte(text) -> None:
    """A replay check (verify/replaycheck.py) of a member's round with the inner-step fields:
    from the member's private state and the round's batches, `replay_round` gives the packet the
    member sent, byte for byte; the plain backward-and-step loop does not."""
    from dtrain_node.optim import reproduce

    recipe = replace(SCHEDULED, batch_size=2)
    member = cpt(text, recipe)
    opt = demo(member, inner_lr=recipe.inner_lr)
    t = trainer(member, opt, recipe, epoch=1, steps=4, epochs=3)
    t.batches = member.batches(torch.arange(member.n_items()), 2, seed=3)
    inner.run_round(t)  # round 0
    opt.apply([(opt.sender, opt.prepare())])
    shared, state = [x.clone() for x in opt.theta_sync], reproduce.private_state(opt)
    inner.run_round(t)  # round 1: the one checked
    sent = opt.prepare()
    round_1 = list(itertools.islice(member.batches(torch.arange(member.n_items()), 2, 3), 2, 4))

    def replica() -> tuple[object, DeMo]:
        b = cpt(text, recipe)
        o = demo(b, inner_lr=recipe.inner_lr)
        reproduce.load_state(o, shared, state)
        return b, o

    b, o = replica()
    inner.replay_round(o, b, round_1, InnerPlan(recipe, 12), 4, CPU)
    assert o.prepare() == sent
    b, o = replica()
    for batch in round_1:  # the plain loop: no schedule, no clipping, one graph a group
        b.loss(batch).backward()
        o.inner_step()
    assert o.prepare() != sent


def with_dropout(backend, p: float = 0.1):
    """The backend's model with dropout in every attention (a GPT-2 folder's 0.1 default)."""
    for m in backend.model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = p
    return backend


def test_a_replay_draws_the_members_dropout_masks(text) -> None:
    """With dropout in the model a replay still gives the member's packet byte for byte: the
    draws of a step are seeded by the step and the batch (inner.dropout_seed); unseeded, the
    member's and the replay's masks differ and an honest member's packet does not reproduce."""
    from dtrain_node.optim import reproduce

    recipe = Recipe(batch_size=2)
    member = with_dropout(cpt(text, recipe))
    opt = demo(member)
    t = trainer(member, opt, recipe, epoch=0, steps=4, epochs=1)
    t.batches = member.batches(torch.arange(member.n_items()), 2, seed=3)
    shared, state = [x.clone() for x in opt.theta_sync], reproduce.private_state(opt)
    inner.run_round(t)
    sent = opt.prepare()
    round_0 = list(itertools.islice(member.batches(torch.arange(member.n_items()), 2, 3), 2))

    def replay(seeded: bool) -> bytes:
        b = with_dropout(cpt(text, recipe))
        o = demo(b)
        reproduce.load_state(o, shared, state)
        if seeded:
            inner.replay_round(o, b, round_0, InnerPlan(recipe, 4), 0, CPU)
        else:
            for batch in round_0:
                b.loss(batch).backward()
                o.inner_step()
        return o.prepare()

    assert replay(seeded=True) == sent
    assert replay(seeded=False) != sent


def test_a_build_beside_a_training_thread_gets_the_models_own_weights(text) -> None:
    """Nodes in one process (the operator tests run them in threads; a replay check runs beside
    training): one thread's inner steps seed torch's global RNG for their dropout draws, and a
    build in another thread draws its initial weights from the same RNG. Interleaved, the build
    pinned another model than the job's (a restarted node voted UNWORKABLE); both hold one lock."""
    import threading

    from dtrain_node.train.start import model_hash

    want = model_hash("builtin:tiny")
    recipe = Recipe(batch_size=2)
    b = with_dropout(cpt(text, recipe))
    opt, plan, stop = demo(b), InnerPlan(recipe, 10**6), threading.Event()
    batches = itertools.cycle(list(itertools.islice(b.batches(torch.arange(b.n_items()), 2, 1), 4)))

    def train() -> None:
        for step in itertools.count():
            if stop.is_set():
                return
            plan.step(opt, b, next(batches), step, CPU)

    worker = threading.Thread(target=train)
    worker.start()
    try:
        pins = [model_hash("builtin:tiny") for _ in range(8)]
    finally:
        stop.set()
        worker.join()
    assert pins == [want] * 8


# ---------------------------------------------------------------- the runner


def test_the_runner_steps_through_the_plan(text) -> None:
    """The node's runner takes its inner steps through `inner.run_round`: the rates its AdamW
    sees follow the recipe's schedule."""
    from dtrain_node.operator.epoch import EpochTrainer

    recipe = Recipe(lr_schedule="linear", inner_lr=1e-3)
    b = cpt(text, recipe)
    opt = demo(b, inner_lr=1e-3)
    seen = watch(opt)
    t = trainer(b, opt, recipe, epoch=0, steps=4, epochs=1)
    EpochTrainer._inner_steps(t)  # type: ignore[arg-type]
    assert [lr for lr, _ in seen] == [1e-3, 0.75e-3]
