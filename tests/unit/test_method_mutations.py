"""Direct tests for the method mutations the equivalence tests let through (issue 31): the GRPO
backends' old policy and reference kept apart, free GRPO's completion mask in the loss, the
policy's log-probs taken without dropout in DPO and GRPO (ratio exactly 1 at the first inner
step, DPO at init exactly log 2 on a model with dropout, built-in and trl), the recipe's
`dpo_beta` in the DPO loss, and SFT's prompt masking (the loss's value, and a zero gradient on
every logit that predicts a prompt token). Each expected value is computed by hand from the
models, not through the backend's rollout cache or its collation."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from harness.jobs import tiny_job

from dtrain.recipe import Recipe
from dtrain_node.train import finetune, losses, tasks
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.toy_models import save_gpt2

VOCAB = 259  # the built-in byte tokenizer: 256 bytes + BOS/EOS/PAD
EOS = finetune.EOS


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the current token: a trainable
    [VOCAB, VOCAB] table, so its log-probs are known exactly and carry gradients."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.table[input_ids])


def bigram(seed: int, eos_bias: float = 0.0) -> Bigram:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn((VOCAB, VOCAB), generator=g)
    table[:, EOS] += eos_bias
    return Bigram(table)


def grpo_job(tmp_path: Path, **opts):
    path = tmp_path / "grpo.jsonl"
    h = tasks.make_dataset(path, "grpo", tasks.last_letter(60, length=4, seed=0))
    return make_backend(tiny_job("grpo", path, h), options=finetune.MethodOptions(**opts))


def hand_grpo(
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    adv: torch.Tensor,
    m: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """The GRPO loss at the first inner step (pi_old = pi, so ratio = exp(logp - logp.detach())
    = 1 with pi's gradient; the clip is inactive), k3 KL to the reference, masked mean per
    completion then mean over completions."""
    ratio = torch.exp(logp - logp.detach())
    d = logp_ref - logp
    per_tok = -ratio * adv[:, None] + kl_coef * (torch.exp(d) - d - 1)
    m = m.to(logp.dtype)
    return ((per_tok * m).sum(-1) / m.sum(-1)).mean()


def grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    ps = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, ps))


# ---------------------------------------------------------------- GRPO: old policy vs reference


@pytest.mark.parametrize("completions", ["alphabet", "free"])
def test_grpo_ratio_is_against_the_old_policy_and_kl_against_the_reference(tmp_path, completions):
    """Policy and reference differ: the backend's loss (value and gradient) is the hand loss
    with ratio pi / pi_old = 1 and KL(pi || ref) > 0. Swapping pi_old and the reference (ratio
    against ref, KL against pi_old = pi, i.e. 0) changes both."""
    kl = 0.5
    b = grpo_job(
        tmp_path, grpo_completions=completions, grpo_max_new_tokens=4, grpo_kl=kl, grpo_group=4
    )
    b.model, b.ref = bigram(1, eos_bias=3.0), bigram(2, eos_bias=3.0).requires_grad_(False)
    b.reward = lambda text, answer: float(sum(map(ord, text)) % 5)  # varied: advantages != 0
    batch = next(b.batches(torch.arange(b.n_items()), 4, seed=0))
    got = b.loss(batch)
    got_grads = grads(b.model, got)
    cache = b.rollout(batch)
    ids, mask, comp, adv = cache[0], cache[1], cache[2], cache[-1]
    assert adv.abs().sum() > 0
    if completions == "free":
        m = cache[3]
        logp = b._logps(b.model, ids, mask, comp, m)
        with torch.no_grad():
            ref = b._logps(b.ref, ids, mask, comp, m)
    else:
        m = torch.ones_like(comp)
        logp = b._completion_logps(b.model, ids, mask, comp)
        with torch.no_grad():
            ref = b._completion_logps(b.ref, ids, mask, comp)
    want = hand_grpo(logp, ref, adv, m, kl)
    kl_term = hand_grpo(logp, ref, torch.zeros_like(adv), m, kl)
    assert kl_term.item() > 1e-3  # the reference is off the policy: the swap would show
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    for g, w in zip(got_grads, grads(b.model, want), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- free GRPO: completion mask


def test_free_grpo_loss_weights_only_tokens_up_to_eos(tmp_path):
    """Completions that end before grpo_max_new_tokens: the loss and its gradient average each
    completion over its own tokens (up to and with EOS), as the hand loss with the sampler's
    mask; averaging over all grpo_max_new_tokens positions gives another value and gradient."""
    kl = 0.5
    b = grpo_job(tmp_path, grpo_completions="free", grpo_max_new_tokens=5, grpo_kl=kl)
    b.model, b.ref = bigram(3, eos_bias=4.0), bigram(4).requires_grad_(False)
    b.reward = lambda text, answer: float(sum(map(ord, text)) % 5)
    batch = next(b.batches(torch.arange(b.n_items()), 4, seed=1))
    got = b.loss(batch)
    got_grads = grads(b.model, got)
    ids, mask, comp, cmask, _, _, adv = b.rollout(batch)
    n = cmask.sum(-1)
    assert (n < comp.size(1)).sum() >= 4 and adv.abs().sum() > 0  # the mask matters
    # Recomputed from the sampled tokens alone: the mask is 1 up to and with the first EOS.
    first_eos = [row.index(EOS) if EOS in row else len(row) - 1 for row in comp.tolist()]
    hand_mask = torch.arange(comp.size(1))[None, :] <= torch.tensor(first_eos)[:, None]
    assert torch.equal(cmask.bool(), hand_mask)
    logp = b._logps(b.model, ids, mask, comp, cmask)
    with torch.no_grad():
        ref = b._logps(b.ref, ids, mask, comp, cmask)
    want = hand_grpo(logp, ref, adv, cmask, kl)
    unmasked = hand_grpo(logp, ref, adv, torch.ones_like(cmask), kl)
    assert abs(unmasked.item() - want.item()) > 1e-3
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    for g, w in zip(got_grads, grads(b.model, want), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- dropout: DPO and GRPO


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


def gpt2_job(tmp_path: Path, gpt2: Path, method: str, recipe: Recipe | None = None) -> TrainJob:
    path = tmp_path / f"{method}.jsonl"
    h = tasks.make_dataset(path, method, tasks.last_letter(60, length=4, seed=0))
    return TrainJob(1, method, str(gpt2), str(path), h, recipe=recipe or Recipe())


def test_the_gpt2_folder_has_dropout(gpt2):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(gpt2)
    assert min(cfg.resid_pdrop, cfg.attn_pdrop, cfg.embd_pdrop) > 0


@pytest.mark.parametrize("completions", ["alphabet", "free"])
def test_grpo_ratio_is_exactly_one_at_the_first_step_with_dropout(
    tmp_path, gpt2, completions, monkeypatch
):
    """A GPT-2 with dropout 0.1 in train mode (as the runner leaves it): the log-probs the loss
    sees are pi_old's exactly, twice in a row, and the training flag is restored."""
    b = make_backend(
        gpt2_job(tmp_path, gpt2, "grpo"),
        options=finetune.MethodOptions(grpo_completions=completions, grpo_max_new_tokens=3),
    )
    seen = []
    real = losses.grpo_loss
    monkeypatch.setattr(
        losses,
        "grpo_loss",
        lambda logp, old, *a, **k: seen.append((logp, old)) or real(logp, old, *a, **k),
    )
    b.model.train()
    batch = next(b.batches(torch.arange(b.n_items()), 4, seed=0))
    for _ in range(2):
        b.loss(batch).backward()
        assert b.model.training
    for logp, old in seen:
        ratio = torch.exp(logp.detach() - old)
        assert torch.equal(ratio, torch.ones_like(ratio)), (ratio.min(), ratio.max())


@pytest.mark.parametrize("backend", ["builtin", "trl"])
def test_dpo_loss_at_init_is_log_2_with_dropout(tmp_path, gpt2, backend):
    """A GPT-2 with dropout 0.1 in train mode: at init the policy equals the reference, so
    every implicit reward is 0 and the loss is log 2, every time, with gradients flowing (the
    built-in backend's eval-mode forward; TRL's `disable_dropout`, which the trl backend pins)."""
    if backend == "trl":
        pytest.importorskip("trl")
    b = make_backend(gpt2_job(tmp_path, gpt2, "dpo", Recipe(backend=backend)))
    b.model.train()
    batch = b.collate_rows(b.rows[:8]) if backend == "trl" else b.collate(b.train[:8], 0)
    for _ in range(3):
        loss = b.loss(batch)
        assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
        loss.backward()
        assert b.model.training
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in b.model.parameters())


# ---------------------------------------------------------------- DPO beta, SFT prompt mask


def perturb(model: torch.nn.Module, seed: int = 1, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def dpo_terms_by_hand(b, recs) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy - reference log-ratio of chosen, of rejected) per record, each sequence scored
    on its own (no padding): summed log-probs of the completion tokens + EOS."""
    coder = b.coder

    def score(model, prompt, completion):
        p, c = coder.prompt(prompt), coder.completion(completion)
        ids = torch.tensor([p + c])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        return sum(float(lp[len(p) - 1 + i, t]) for i, t in enumerate(c))

    b.model.eval()
    chosen = [
        score(b.model, r["prompt"], r["chosen"]) - score(b.ref, r["prompt"], r["chosen"])
        for r in recs
    ]
    rejected = [
        score(b.model, r["prompt"], r["rejected"]) - score(b.ref, r["prompt"], r["rejected"])
        for r in recs
    ]
    return torch.tensor(chosen, dtype=torch.float64), torch.tensor(rejected, dtype=torch.float64)


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_recipe_dpo_beta_scales_the_loss_as_the_formula_says(tmp_path, beta):
    """The recipe's dpo_beta reaches the loss: with the policy moved off the reference the loss
    is -log sigmoid(beta * margin) for that beta, and the implicit rewards scale with it."""
    path = tmp_path / "dpo.jsonl"
    h = tasks.make_dataset(path, "dpo", tasks.last_letter(60, length=4, seed=0))
    job = TrainJob(1, "dpo", "builtin:tiny", str(path), h, recipe=Recipe(dpo_beta=beta))
    b = make_backend(job)
    assert b.opts.dpo_beta == beta
    perturb(b.model)
    recs = b.train[:8]
    chosen, rejected = dpo_terms_by_hand(b, recs)
    margin = chosen - rejected
    assert margin.abs().mean() > 0.5  # big enough that beta changes the loss visibly
    want = float(-torch.nn.functional.logsigmoid(beta * margin).mean())
    got = b.loss(b.collate(recs, 0)).item()
    assert got == pytest.approx(want, abs=1e-5)
    for other in (0.1, 0.5, 2.0):
        if other != beta:  # what the loss would read with another beta: clearly different
            alt = float(-torch.nn.functional.logsigmoid(other * margin).mean())
            assert abs(alt - want) > 1e-2
    b.eval_recs = recs
    m = b.evaluate()
    assert m["reward_margin"] == pytest.approx(float(beta * margin.mean()), abs=1e-5)


def test_sft_loss_is_the_mean_over_completion_tokens_only(tmp_path):
    """SFT's batch loss equals the mean cross-entropy over each record's completion tokens and
    EOS, computed per record on the unpadded sequence; counting the prompt's tokens (after BOS)
    too would read clearly differently."""
    path = tmp_path / "sft.jsonl"
    h = tasks.make_dataset(path, "sft", tasks.addition(40, digits=2, seed=0))
    b = make_backend(tiny_job("sft", path, h))
    perturb(b.model, scale=0.02)
    b.model.eval()
    recs = b.train[:6]
    completion_nll, all_nll = [], []
    for r in recs:
        p = [finetune.BOS, *finetune.encode(r["prompt"])]
        c = [*finetune.encode(r["completion"]), EOS]
        ids = torch.tensor([p + c])
        with torch.no_grad():
            lp = torch.log_softmax(b.model(input_ids=ids).logits[0].float(), -1)
        nll = [-float(lp[t - 1, ids[0, t]]) for t in range(1, ids.size(1))]
        completion_nll += nll[len(p) - 1 :]
        all_nll += nll
    want = sum(completion_nll) / len(completion_nll)
    with torch.no_grad():
        got = float(b.loss(b.collate(recs, 0)))
    assert got == pytest.approx(want, abs=1e-5)
    assert abs(sum(all_nll) / len(all_nll) - want) > 0.05


def test_sft_prompt_tokens_get_zero_gradient(tmp_path):
    """The gradient of SFT's loss on the logits: exactly 0 at every position that predicts a
    prompt token (BOS + prompt, counted by hand per record) or follows the record's EOS
    (padding), non-zero at every position that predicts a completion token or EOS."""
    path = tmp_path / "sft.jsonl"
    h = tasks.make_dataset(path, "sft", tasks.addition(40, digits=2, seed=0))
    b = make_backend(tiny_job("sft", path, h))
    recs = b.train[:6]
    seen: list[torch.Tensor] = []
    real = b.model.forward

    def forward(*a, **k):
        out = real(*a, **k)
        out.logits.retain_grad()
        seen.append(out.logits)
        return out

    b.model.forward = forward
    b.loss(b.collate(recs, 0)).backward()
    norms = seen[0].grad.abs().sum(-1)  # [B, T]: position t predicts token t + 1
    for row, r in zip(norms, recs, strict=True):
        n_prompt = 1 + len(finetune.encode(r["prompt"]))
        n_all = n_prompt + len(finetune.encode(r["completion"])) + 1
        assert torch.all(row[: n_prompt - 1] == 0), row[: n_prompt - 1]
        assert torch.all(row[n_prompt - 1 : n_all - 1] > 0), row[n_prompt - 1 : n_all - 1]
        assert torch.all(row[n_all - 1 :] == 0)


def test_trl_dpo_uses_the_recipe_beta(tmp_path, gpt2):
    """The trl backend's DPO loss with the recipe's beta = 2.0 (not TRL's default 0.1) is
    -log sigmoid(beta * margin) with the margin summed by hand over TRL's completion tokens."""
    pytest.importorskip("trl")
    beta = 2.0
    path = tmp_path / "dpo.jsonl"
    h = tasks.make_dataset(path, "dpo", tasks.last_letter(60, length=4, seed=0))
    job = TrainJob(1, "dpo", str(gpt2), str(path), h, recipe=Recipe(backend="trl", dpo_beta=beta))
    b = make_backend(job)
    assert b.opts.dpo_beta == beta
    perturb(b.model, scale=0.02)
    ids, mask, comp = b.collate_rows(b.rows[:6])
    b.model.eval()
    with torch.no_grad():

        def summed(model) -> torch.Tensor:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].double()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            return (lp * comp[:, 1:]).sum(-1)

        ratio = summed(b.model) - summed(b.ref)
        got = b.loss((ids, mask, comp)).item()
    n = ids.size(0) // 2
    margin = ratio[:n] - ratio[n:]
    want = float(-torch.nn.functional.logsigmoid(beta * margin).mean())
    default = float(-torch.nn.functional.logsigmoid(0.1 * margin).mean())
    assert abs(default - want) > 1e-2
    assert got == pytest.approx(want, abs=1e-4)
