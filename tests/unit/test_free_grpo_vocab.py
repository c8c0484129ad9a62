"""Free GRPO on a model with more output rows than its tokenizer has entries (issue 31): the
toy GPT-2 folder keeps GPT-2's 50,257 rows with a 1,024-token tokenizer, so at the start the
model's full softmax puts ~98% of its mass on rows the tokenizer lacks (what a sampler over the
whole output, as TRL's `generate`, would draw). The backend cuts those rows off the logits in
the sampler, in every log-prob and in the greedy evaluation, identically on every node."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness.jobs import tiny_job

from dtrain.recipe import Recipe
from dtrain_node.train import finetune, tasks
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.toy_models import save_gpt2

G, NEW = 8, 6


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


def free_grpo(tmp_path: Path, model: str | None = None):
    """A free-GRPO backend on `model` (a folder), or on the built-in tiny model."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "grpo.jsonl"
    h = tasks.make_dataset(path, "grpo", tasks.last_letter(40, length=4, seed=0))
    opts = finetune.MethodOptions(grpo_completions="free", grpo_group=G, grpo_max_new_tokens=NEW)
    if model is None:
        job = tiny_job("grpo", path, h)
    else:
        job = TrainJob(1, "grpo", model, str(path), h, recipe=Recipe())
    return make_backend(job, options=opts)


def rows(b) -> int:
    return b.model.get_output_embeddings().weight.shape[0]


def test_the_gpt2_folder_puts_most_starting_mass_on_rows_its_tokenizer_lacks(tmp_path, gpt2):
    """The case itself: 1,024 tokens, 50,257 rows, ~98% of the starting next-token mass (and of
    draws over the whole output) on the 49,233 rows no token decodes to."""
    b = free_grpo(tmp_path, str(gpt2))
    v = b.coder.vocab
    assert (v, rows(b)) == (1024, 50257)
    ids, mask, _, _ = b.collate(b.train[:8], 0)
    with torch.no_grad():
        p = torch.softmax(finetune.forward(b.model.eval(), ids, mask)[:, -1].float(), -1)
    lacking = p[:, v:].sum(-1)
    assert lacking.min() > 0.95, lacking
    draws = torch.multinomial(p, 256, replacement=True, generator=torch.Generator().manual_seed(0))
    assert (draws >= v).float().mean() > 0.95


def test_free_grpo_samples_scores_and_evaluates_only_tokenizer_entries(tmp_path, gpt2, monkeypatch):
    b = free_grpo(tmp_path, str(gpt2))
    v = b.coder.vocab
    batch = next(b.batches(torch.arange(b.n_items()), 4, seed=0))
    ids, mask, comp, cmask, old, ref, _ = b.rollout(batch)
    assert comp.size(0) == 4 * G and comp.size(1) <= NEW
    assert int(comp.max()) < v  # never a row the tokenizer lacks, among 4 x 8 x 6 draws

    # every log-prob is of the softmax over the tokenizer's entries only (pi_old and ref here)
    full, fmask = torch.cat([ids, comp], 1), torch.cat([mask, cmask], 1)
    for model, got in ((b.model, old), (b.ref, ref)):
        with torch.no_grad(), b._eval():
            logits = finetune.forward(model, full, fmask)[:, -comp.size(1) - 1 : -1].float()
        want = torch.log_softmax(logits[..., :v], -1).gather(-1, comp[..., None])[..., 0]
        torch.testing.assert_close(got, want * cmask, rtol=0, atol=1e-6)
        whole = torch.log_softmax(logits, -1).gather(-1, comp[..., None])[..., 0]
        assert ((want - whole)[cmask.bool()] > 3).all()  # the 98% cut off: log(1/0.02) ~ 3.9

    # the greedy evaluation decodes only tokenizer entries (before: argmax on a lacking row)
    seen: list[list[int]] = []
    real = finetune.Coder.decode
    monkeypatch.setattr(
        finetune.Coder, "decode", lambda self, i: seen.append(list(i)) or real(self, i)
    )
    metrics = b.evaluate()
    assert seen and all(i < v for row in seen for i in row)
    assert 0 <= metrics["accuracy"] <= 1
    seen.clear()  # over the whole output (as before) greedy picks rows the tokenizer lacks
    finetune.greedy(b.model, b.coder, [r["prompt"] for r in b.eval_recs[:4]], NEW)
    assert any(i >= v for row in seen for i in row)

    # the loss sends no gradient to the rows the tokenizer lacks (tied input/output embedding);
    # the policy moved off the reference so the KL term has a gradient (rewards are all 0 here)
    with torch.no_grad():
        w = b.model.transformer.ln_f.weight
        w.add_(0.1 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    b.model.zero_grad()
    b.loss(batch).backward()
    grad = b.model.get_output_embeddings().weight.grad
    assert grad[:v].abs().sum() > 0 and torch.count_nonzero(grad[v:]) == 0


def test_two_nodes_sample_and_score_bit_identically(tmp_path, gpt2):
    a, b = free_grpo(tmp_path / "a", str(gpt2)), free_grpo(tmp_path / "b", str(gpt2))
    batch_a = next(a.batches(torch.arange(a.n_items()), 4, seed=3))
    batch_b = next(b.batches(torch.arange(b.n_items()), 4, seed=3))
    for x, y in zip(a.rollout(batch_a), b.rollout(batch_b), strict=True):
        assert torch.equal(x, y)


def test_builtin_model_padding_rows_are_never_sampled(tmp_path):
    """The built-in byte model pads 259 tokens to 320 rows (a multiple of 64)."""
    b = free_grpo(tmp_path)
    assert (b.coder.vocab, rows(b)) == (259, 320)
    batch = next(b.batches(torch.arange(b.n_items()), 8, seed=1))
    comp = b.rollout(batch)[2]
    assert int(comp.max()) < 259
