"""The `trl` backend (recipe `backend = "trl"`): TRL's SFT/DPO data preparation and losses behind
our runner's protocol, our optimizer and DeMo sync, and the same exact shared state."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from dtrain.recipe import Recipe
from dtrain_node.errors import BackendUnavailable, RecipeInvalid
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import finetune, losses, shard, trl_backend
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.toy_models import save_gpt2


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


def write(path: Path, records: list[dict]) -> tuple[str, bytes]:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path), hashlib.sha256(path.read_bytes()).digest()


def chat_sft(n: int = 12) -> list[dict]:
    """Addition problems as chat records (system, user, the assistant's answer)."""
    return [
        {
            "messages": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": f"{a}+{b}="},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(n)
        for b in range(n)
    ]


def text_sft() -> list[dict]:
    return [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(8) for b in range(8)]


def chat_dpo() -> list[dict]:
    out = []
    for a in range(8):
        for b in range(8):
            user = [{"role": "user", "content": f"{a}+{b}="}]
            out.append({"prompt": user, "chosen": str(a + b), "rejected": str(a + b + 1)})
    return out


def job(tmp_path: Path, gpt2: Path, method: str, records: list[dict], **recipe) -> TrainJob:
    uri, digest = write(tmp_path / f"{method}.jsonl", records)
    return TrainJob(1, method, str(gpt2), uri, digest, recipe=Recipe(backend="trl", **recipe))


def same_weights(src: torch.nn.Module, *dst: torch.nn.Module) -> None:
    for d in dst:
        d.load_state_dict(src.state_dict())


def perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every weight a little (seeded), so a policy differs from its reference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


# ---------------------------------------------------------------- selection and errors


def test_the_recipe_selects_the_trl_backend(tmp_path, gpt2) -> None:
    j = job(tmp_path, gpt2, "sft", chat_sft(4))
    b = make_backend(j)
    assert isinstance(b, trl_backend.SFTBackend) and b.name == "trl"
    assert make_backend(j, "builtin").name == "builtin"  # the name argument still wins
    plain = TrainJob(1, "sft", j.model_uri, j.dataset_uri, j.dataset_hash)
    assert make_backend(plain).name == "builtin"  # no recipe: the built-in backend


def test_trl_missing_names_the_install_command(tmp_path, gpt2, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a)
    )
    with pytest.raises(BackendUnavailable, match=r"needs the trl package.*pip install trl"):
        make_backend(job(tmp_path, gpt2, "sft", chat_sft(4)))


@pytest.mark.parametrize("method", ["grpo", "cpt"])
def test_methods_trl_does_not_train_are_refused_clearly(tmp_path, gpt2, method) -> None:
    j = TrainJob(1, method, str(gpt2), "unused", b"\0" * 32, recipe=Recipe(backend="trl"))
    with pytest.raises(RecipeInvalid, match=f"method '{method}' is not supported by the trl"):
        make_backend(j)
    with pytest.raises(ValueError, match="unknown method 'rlhf'"):
        make_backend(TrainJob(1, "rlhf", str(gpt2), "x", b"\0" * 32), "trl")


def test_other_external_backends_keep_their_errors(tmp_path, gpt2) -> None:
    j = job(tmp_path, gpt2, "sft", chat_sft(4))
    for name in ("axolotl", "unsloth"):  # torchtune has an adapter: test_backend_torchtune.py
        with pytest.raises(BackendUnavailable, match=name):
            make_backend(j, name)


# ---------------------------------------------------------------- same loss as the built-in


def test_chat_sft_loss_equals_the_builtin_loss(tmp_path, gpt2) -> None:
    """Chat records: TRL's tokens and completion-only labels (EOS included, from the template)
    are the built-in backend's, and so is the loss of a batch (1e-5)."""
    j = job(tmp_path, gpt2, "sft", chat_sft(6))
    ours, builtin = make_backend(j), make_backend(j, "builtin")
    perturb(builtin.model)
    same_weights(builtin.model, ours.model)
    recs = builtin.train[:8]
    ids, labels, mask = builtin.collate(recs, 0)
    t_ids, t_mask, t_labels = ours.collate_rows(ours.rows[:8])
    assert torch.equal(t_ids[t_mask.bool()], ids[mask.bool()])
    assert torch.equal(t_labels, labels)
    eos = builtin.coder.eos
    assert all(row[row != losses.IGNORE][-1] == eos for row in t_labels)
    ours.model.eval(), builtin.model.eval()
    with torch.no_grad():
        got, want = ours.loss((t_ids, t_mask, t_labels)), builtin.loss((ids, labels, mask))
    assert float(got) == pytest.approx(float(want), abs=1e-5)


def test_text_sft_follows_trl_formatting_without_bos(tmp_path, gpt2) -> None:
    """Text records: TRL tokenizes prompt + completion + EOS as one string with the tokenizer's
    own special tokens, so on this tokenizer there is no BOS (the built-in prepends one); the
    completion and EOS are trained as in the built-in. The loss is the completion-only loss
    on TRL's tokens (1e-5)."""
    j = job(tmp_path, gpt2, "sft", text_sft())
    ours, builtin = make_backend(j), make_backend(j, "builtin")
    tok, coder = ours.start.tokenizer, builtin.coder
    rec, row = ours.train[0], ours.rows[0]
    assert row["input_ids"] == tok(rec["prompt"] + rec["completion"] + tok.eos_token)["input_ids"]
    builtin_ids, _ = finetune.labelled(coder, rec["prompt"], rec["completion"])
    assert builtin_ids == [coder.bos, *row["input_ids"]]  # the one difference: BOS
    trained = [t for t in row["labels"] if t != losses.IGNORE]
    assert trained == coder.completion(rec["completion"])  # completion + EOS
    same_weights(builtin.model, ours.model)
    ours.model.eval(), builtin.model.eval()
    ids, mask, labels = ours.collate_rows(ours.rows[:8])
    with torch.no_grad():
        got = ours.loss((ids, mask, labels))
        want = builtin.loss((ids, labels, mask))  # the built-in's loss on TRL's tokens
    assert float(got) == pytest.approx(float(want), abs=1e-5)


def test_chat_dpo_loss_equals_the_builtin_loss(tmp_path, gpt2) -> None:
    """DPO on chat records against a fresh start model as reference: TRL's sigmoid loss with
    the recipe's beta equals the built-in's (1e-5) once the policy has moved off the reference."""
    j = job(tmp_path, gpt2, "dpo", chat_dpo(), dpo_beta=0.5)
    ours, builtin = make_backend(j), make_backend(j, "builtin")
    assert isinstance(ours, trl_backend.DPOBackend)
    perturb(builtin.model)
    same_weights(builtin.model, ours.model)
    recs = builtin.train[:6]
    ids, labels, mask = builtin.collate(recs, 0)
    t_ids, t_mask, t_comp = ours.collate_rows(ours.rows[:6])
    assert torch.equal(t_ids[t_mask.bool()], ids[mask.bool()])
    ours.model.eval(), builtin.model.eval()
    with torch.no_grad():
        got, want = ours.loss((t_ids, t_mask, t_comp)), builtin.loss((ids, labels, mask))
    assert abs(float(want) - torch.log(torch.tensor(2.0)).item()) > 1e-3  # not the tie
    assert float(got) == pytest.approx(float(want), abs=1e-5)
    m = ours.evaluate()
    assert set(m) == {"heldout_loss", "preference_accuracy", "reward_margin"}


# ---------------------------------------------------------------- one DeMo sync, exact


def test_two_trl_workers_sync_bitwise_identically_and_learn(tmp_path, gpt2) -> None:
    """Two TRL-backend workers on disjoint shards: TRL computes each batch's loss, our AdamW
    steps, DeMo syncs with lockstep; the shared state is bitwise identical on both after every
    sync, the models equal it, and the held-out loss went down."""
    j = job(tmp_path, gpt2, "sft", chat_sft(8))
    workers = [make_backend(j), make_backend(j)]
    assert all(isinstance(w, trl_backend.SFTBackend) for w in workers)
    before = workers[0].evaluate()["heldout_loss"]
    cfg = DeMoConfig(mode="local", sync_interval=2, inner_lr=3e-3)
    opts = [DeMo(w.model.named_parameters(), cfg, sender=i) for i, w in enumerate(workers)]
    n = workers[0].n_items()
    batches = [
        w.batches(shard.assign(n, 1, 0, ["a", "b"], me), 8, seed=7)
        for me, w in zip("ab", workers, strict=True)
    ]
    for _ in range(2):  # two syncs of K = 2 inner steps
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


# ---------------------------------------------------------------- hygiene


def test_trl_leaves_the_model_and_global_rng_alone(tmp_path, gpt2) -> None:
    """TRL's forward patch is on only inside loss(); building the trainer keeps the global
    RNG; a copy of the model computes with its own weights; the export loads."""
    from transformers import AutoModelForCausalLM

    random.seed(7)
    torch.manual_seed(7)
    want = random.random(), torch.rand(1)
    random.seed(7)
    torch.manual_seed(7)
    b = make_backend(job(tmp_path, gpt2, "sft", chat_sft(4)))
    assert (random.random(), torch.rand(1)) == want
    assert not any("forward" in vars(m) for m in b.model.modules())
    b.loss(next(b.batches(torch.arange(b.n_items()), 4, seed=0))).backward()
    assert not any("forward" in vars(m) for m in b.model.modules())
    twin = copy.deepcopy(b.model).eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        perturb(b.model)
        assert not torch.allclose(twin(input_ids=ids).logits, b.model.eval()(input_ids=ids).logits)
    out = b.export(tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, b.model(input_ids=ids).logits)


def test_lora_through_trl_trains_only_the_adapters(tmp_path, gpt2) -> None:
    b = make_backend(job(tmp_path, gpt2, "sft", chat_sft(4), lora_rank=4, seed=3))
    trainable = [n for n, p in b.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    b.loss(next(b.batches(torch.arange(b.n_items()), 4, seed=0))).backward()
    assert all(p.grad is not None for p in b.model.parameters() if p.requires_grad)


def test_mixed_chat_and_text_records_keep_their_order(tmp_path, gpt2) -> None:
    """TRL prepares chat and text records as separate datasets; each prepared row is still the
    row of the record at the same index (shards index records)."""
    chat, text = chat_sft(4), text_sft()[:16]
    mixed = [r for pair in zip(chat, text, strict=True) for r in pair]
    b = make_backend(job(tmp_path, gpt2, "sft", mixed))
    tok = b.start.tokenizer
    for rec, row in zip(b.train + b.eval_recs, b.rows + b.eval_rows, strict=True):
        trained = [t for t in row["labels"] if t != losses.IGNORE]
        assert tok.decode(trained[:-1]) == rec["completion"]
        assert (tok.decode(row["input_ids"]).startswith("<|system|>")) == trl_backend.is_chat(
            rec["prompt"]
        )
