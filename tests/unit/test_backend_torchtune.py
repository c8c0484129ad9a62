"""The `torchtune` backend (recipe `backend = "torchtune"`): torchtune's collators and SFT / DPO
losses behind our runner's protocol, our optimizer and DeMo sync, the built-in backend's shared
state and export. torchtune is installed by scripts/setup.sh (the `dev` extra pulls
`dtrain[torchtune]`), so nothing here is skipped."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtrain.recipe import Recipe
from dtrain_node.errors import BackendUnavailable, RecipeInvalid
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import finetune, losses, shard, torchtune_backend
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.toy_models import save_gpt2


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


def write(path: Path, records: list[dict]) -> tuple[str, bytes]:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path), hashlib.sha256(path.read_bytes()).digest()


def chat_sft(n: int = 6) -> list[dict]:
    """Sums with one- to three-digit terms, so a batch is padded."""
    return [
        {
            "messages": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": f"{a}+{b * 19}="},
                {"role": "assistant", "content": str(a + b * 19)},
            ]
        }
        for a in range(n)
        for b in range(n)
    ]


def text_sft() -> list[dict]:
    """Prompts of different lengths, so a batch is padded."""
    return [
        {"prompt": f"What is {a} plus {b}{'?' * (a % 3)}", "completion": f" {a + b}"}
        for a in range(8)
        for b in range(8)
    ]


def text_dpo() -> list[dict]:
    return [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": f"{a + b + 1} or so"}
        for a in range(8)
        for b in range(8)
    ]


def job(tmp_path: Path, gpt2: Path, method: str, records: list[dict], **recipe) -> TrainJob:
    uri, digest = write(tmp_path / f"{method}.jsonl", records)
    recipe.setdefault("backend", "torchtune")
    return TrainJob(1, method, str(gpt2), uri, digest, recipe=Recipe(**recipe))


def perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every weight a little (seeded), so a policy differs from its reference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def pair(tmp_path: Path, gpt2: Path, method: str, records: list[dict], **recipe):
    """(torchtune backend, built-in backend) of one job, the same moved-off-start weights."""
    j = job(tmp_path, gpt2, method, records, **recipe)
    ours, builtin = make_backend(j), make_backend(j, "builtin")
    perturb(builtin.model)
    ours.model.load_state_dict(builtin.model.state_dict())
    return ours, builtin


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------- selection and errors


def test_the_recipe_selects_the_torchtune_backend(tmp_path, gpt2) -> None:
    j = job(tmp_path, gpt2, "sft", chat_sft(4))
    b = make_backend(j)
    assert isinstance(b, torchtune_backend.SFTBackend) and b.name == "torchtune"
    assert make_backend(j, "builtin").name == "builtin"
    d = make_backend(job(tmp_path, gpt2, "dpo", text_dpo()))
    assert isinstance(d, torchtune_backend.DPOBackend) and d.name == "torchtune"
    assert Recipe.from_dict({"backend": "torchtune"}).backend == "torchtune"


@pytest.mark.parametrize("method", ["grpo", "cpt"])
def test_methods_torchtune_does_not_train_are_refused(tmp_path, gpt2, method) -> None:
    j = TrainJob(1, method, str(gpt2), "unused", b"\0" * 32, recipe=Recipe(backend="torchtune"))
    with pytest.raises(RecipeInvalid, match=f"method '{method}' is not supported by the torchtune"):
        make_backend(j)


def test_torchtune_missing_is_one_line_naming_the_install(tmp_path, gpt2, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchtune", None)  # import torchtune now fails
    with pytest.raises(BackendUnavailable) as err:
        make_backend(job(tmp_path, gpt2, "sft", chat_sft(4)))
    msg = str(err.value)
    assert "\n" not in msg
    assert "needs the torchtune package, which is not installed" in msg
    assert "pip install 'dtrain[torchtune]'" in msg


def test_torchtune_without_a_usable_torchao_is_one_line(tmp_path, gpt2, monkeypatch) -> None:
    """torchtune imports torchao first thing; without it the backend says so in one line."""
    for name in [m for m in sys.modules if m == "torchtune" or m.startswith("torchtune.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(BackendUnavailable) as err:
        torchtune_backend.load()
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("backend 'torchtune': torchtune cannot be imported (torchao not")
    assert "torchao 0.16.0" in msg


# ---------------------------------------------------------------- SFT: the built-in's loss


@pytest.mark.parametrize("records", [chat_sft, text_sft], ids=["chat", "text"])
def test_sft_batches_are_the_builtin_tokens_and_labels(tmp_path, gpt2, records) -> None:
    """torchtune's collator pads the built-in's tokens and labels to the same tensors: the
    prompt and the padding carry no loss, the completion and EOS do."""
    ours, builtin = pair(tmp_path, gpt2, "sft", records())
    recs = builtin.train[:8]
    tokens, labels, t_mask = ours.collate(recs, 0)
    ids, b_labels, mask = builtin.collate(recs, 0)
    assert torch.equal(tokens, ids) and torch.equal(labels, b_labels)
    assert torch.equal(t_mask, mask)
    assert len({int(n) for n in mask.sum(-1)}) > 1  # a padded batch
    coder = builtin.coder
    for rec, row in zip(recs, labels, strict=True):
        n_prompt = len(coder.prompt(rec["prompt"]))
        assert (row[:n_prompt] == losses.IGNORE).all()
        assert row[row != losses.IGNORE].tolist() == coder.completion(rec["completion"])


@pytest.mark.parametrize("records", [chat_sft, text_sft], ids=["chat", "text"])
def test_sft_loss_and_gradients_equal_the_builtin(tmp_path, gpt2, records) -> None:
    """torchtune's chunked cross-entropy on its shifted labels is the built-in SFT loss of the
    same batch, and so are the gradients (float summation order only)."""
    ours, builtin = pair(tmp_path, gpt2, "sft", records())
    ours.model.eval(), builtin.model.eval()
    recs = builtin.train[:8]
    got = ours.loss(ours.collate(recs, 0))
    want = builtin.loss(builtin.collate(recs, 0))
    got.backward(), want.backward()
    assert abs(float(got) - float(want)) <= 1e-6
    for g, w in zip(grads(ours.model), grads(builtin.model), strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-7)


def test_sft_loss_is_the_mean_over_completion_tokens_only(tmp_path, gpt2) -> None:
    """By hand from the model's logits: the mean -log p of the completion tokens (EOS included);
    training on the prompt too would give a loss far from it."""
    ours, _ = pair(tmp_path, gpt2, "sft", text_sft())
    ours.model.eval()
    recs = ours.train[:4]
    tokens, labels, mask = ours.collate(recs, 0)
    with torch.no_grad():
        got = float(ours.loss((tokens, labels, mask)))
        logp = torch.log_softmax(
            ours.model(input_ids=tokens, attention_mask=mask).logits.float(), -1
        )
    coder, terms, every = ours.coder, [], []
    for i, rec in enumerate(recs):
        ids, n_prompt = finetune.labelled(coder, rec["prompt"], rec["completion"])
        every += [-float(logp[i, t - 1, ids[t]]) for t in range(1, len(ids))]
        terms += [-float(logp[i, t - 1, ids[t]]) for t in range(n_prompt, len(ids))]
    assert got == pytest.approx(sum(terms) / len(terms), abs=1e-5)
    assert abs(sum(every) / len(every) - got) > 0.1


def test_sft_evaluate_equals_the_builtin(tmp_path, gpt2) -> None:
    ours, builtin = pair(tmp_path, gpt2, "sft", chat_sft())
    got, want = ours.evaluate(), builtin.evaluate()
    assert set(got) == {"heldout_loss", "accuracy"} and got["accuracy"] == want["accuracy"]
    assert got["heldout_loss"] == pytest.approx(want["heldout_loss"], abs=1e-6)


# ---------------------------------------------------------------- DPO: the built-in's loss


def test_dpo_loss_and_rewards_equal_the_builtin(tmp_path, gpt2) -> None:
    """torchtune's DPOLoss on its per-sequence log-probs, with the recipe's beta (0.5, not
    torchtune's default 0.1), is the built-in DPO loss once the policy moved off the reference;
    so are the chosen/rejected rewards and the gradients."""
    ours, builtin = pair(tmp_path, gpt2, "dpo", text_dpo(), dpo_beta=0.5)
    recs = builtin.train[:6]
    tokens, labels, t_mask = ours.collate(recs, 0)
    ids, b_labels, mask = builtin.collate(recs, 0)
    assert torch.equal(tokens, ids) and torch.equal(labels, b_labels)
    assert torch.equal(t_mask, mask)
    got, want = ours._terms((tokens, labels, t_mask)), builtin._terms((ids, b_labels, mask))
    assert abs(float(want[0]) - math.log(2)) > 0.05  # far from the tie
    assert abs(float(got[0]) - float(want[0])) <= 1e-6
    for g, w in zip(got[1:], want[1:], strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    got[0].backward(), want[0].backward()
    for g, w in zip(grads(ours.model), grads(builtin.model), strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-7)
    m = ours.evaluate()
    assert set(m) == {"heldout_loss", "preference_accuracy", "reward_margin"}
    assert m["heldout_loss"] == pytest.approx(builtin.evaluate()["heldout_loss"], abs=1e-6)


def test_dpo_loss_follows_the_recipe_beta_by_hand(tmp_path, gpt2) -> None:
    """-log sigmoid(beta * margin) with the recipe's beta, the margin from the two models'
    sequence log-probs computed here; beta 0.1 would give a clearly different loss."""
    ours, _ = pair(tmp_path, gpt2, "dpo", text_dpo(), dpo_beta=2.0)
    tokens, labels, mask = ours.collate(ours.train[:6], 0)
    with torch.no_grad():
        loss = float(ours.loss((tokens, labels, mask)))
        pol = losses.sequence_logps(
            ours.model.eval()(input_ids=tokens, attention_mask=mask).logits, labels
        )
        ref = losses.sequence_logps(ours.ref(input_ids=tokens, attention_mask=mask).logits, labels)
    margin = (pol[:6] - ref[:6]) - (pol[6:] - ref[6:])

    def by_hand(beta: float) -> float:
        return float(-torch.nn.functional.logsigmoid(beta * margin).mean())

    assert loss == pytest.approx(by_hand(2.0), abs=1e-6)
    assert abs(by_hand(0.1) - loss) > 0.05


def test_dpo_at_init_is_log_2_on_a_model_with_dropout(tmp_path, gpt2) -> None:
    """Policy = reference at the start and the policy's log-probs taken without dropout (GPT-2
    has dropout 0.1): the loss is exactly log 2 in training mode too."""
    b = make_backend(job(tmp_path, gpt2, "dpo", text_dpo()))
    b.model.train()
    loss = b.loss(b.collate(b.train[:8], 0))
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6)
    assert b.model.training


# ---------------------------------------------------------------- shared state and export


@pytest.mark.parametrize(("method", "records"), [("sft", chat_sft(8)), ("dpo", text_dpo())])
def test_two_torchtune_workers_sync_bitwise_identically_and_learn(
    tmp_path, gpt2, method, records
) -> None:
    """Two workers on disjoint shards: torchtune computes each batch's loss, our AdamW steps,
    DeMo syncs with lockstep; the shared state is bitwise identical on both after every sync,
    the models equal it, the held-out loss went down, and the export reloads with
    from_pretrained and scores the held-out loss the worker reports."""
    from transformers import AutoModelForCausalLM

    j = job(tmp_path, gpt2, method, records)
    workers = [make_backend(j), make_backend(j)]
    before = workers[0].evaluate()["heldout_loss"]
    cfg = DeMoConfig(mode="local", sync_interval=2, inner_lr=3e-3)
    opts = [DeMo(w.model.named_parameters(), cfg, sender=i) for i, w in enumerate(workers)]
    n = workers[0].n_items()
    batches = [
        w.batches(shard.assign(n, 1, 0, ["a", "b"], me), 8, seed=7)
        for me, w in zip("ab", workers, strict=True)
    ]
    for _ in range(2):
        for _ in range(cfg.sync_interval):
            for w, o, it in zip(workers, opts, batches, strict=True):
                w.loss(next(it)).backward()
                o.inner_step()
        lockstep(opts)
        for a, b in zip(opts[0].theta_sync, opts[1].theta_sync, strict=True):
            assert torch.equal(a, b)
    for o in opts:
        assert all(torch.equal(p.detach(), t) for p, t in zip(o.params, o.theta_sync, strict=True))
    after = workers[1].evaluate()["heldout_loss"]
    assert after < before
    workers[1].model = AutoModelForCausalLM.from_pretrained(workers[0].export(tmp_path / "out"))
    assert workers[1].evaluate()["heldout_loss"] == pytest.approx(after, rel=1e-6)


def test_lora_trains_only_the_adapters_and_the_export_loads(tmp_path, gpt2) -> None:
    """LoRA through the recipe: only adapters are trainable (what DeMo syncs); the merged export
    loads with from_pretrained and scores the backend's held-out loss."""
    from transformers import AutoModelForCausalLM

    b = make_backend(job(tmp_path, gpt2, "sft", chat_sft(4), lora_rank=4, seed=3))
    trainable = [n for n, p in b.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    b.loss(next(b.batches(torch.arange(b.n_items()), 4, seed=0))).backward()
    assert all(p.grad is not None for p in b.model.parameters() if p.requires_grad)
    with torch.no_grad():
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)  # adapters that change the output
    want = b.evaluate()["heldout_loss"]
    loaded = AutoModelForCausalLM.from_pretrained(b.export(tmp_path / "out")).eval()
    b.model = loaded
    assert b.evaluate()["heldout_loss"] == pytest.approx(want, rel=1e-5)


def test_lora_and_torchtune_imports_print_nothing() -> None:
    """peft imports torchao whenever it is installed, and torchao 0.16 logs at import that it
    skips its C++ extensions on this torch: the node's imports of peft (LoRA) and torchtune
    keep that off stderr. A fresh interpreter, so the import really happens."""
    quiet = (
        "from dtrain_node.train import start, torchtune_backend\n"
        "with start.torchao_quiet():\n    import peft\n"
        "torchtune_backend.load()\n"
    )
    run = [sys.executable, "-c"]
    got = subprocess.run([*run, quiet], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    loud = subprocess.run([*run, "import peft"], capture_output=True, text=True, timeout=120)
    assert "Skipping import of cpp extensions" in loud.stderr  # what the quiet import hides


def test_the_nodes_transformers_imports_print_nothing() -> None:
    """transformers imports torchao too: once the node's package is imported, a model class
    import writes nothing to stderr (every node log and `dtrain` command started with it)."""
    code = "import dtrain_node\nfrom transformers import AutoModelForCausalLM\nimport peft\n"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stderr == "", got.stderr
