"""What goes in is what comes out: the exported Hugging Face folder (model + tokenizer), loaded
with `from_pretrained`, scores held-out text exactly as training's own evaluation does."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from harness.jobs import tiny_job
from transformers import AutoModelForCausalLM, AutoTokenizer

from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain_node.devnet import final_model
from dtrain_node.devnet.report import Checks
from dtrain_node.operator.checkpoints import export_final
from dtrain_node.train import checkpoint, corpus, finetune, losses, tasks
from dtrain_node.train import models as hf
from dtrain_node.train.backend import make_backend

# Lines that put multi-byte UTF-8 (2, 3 and 4 bytes) and control bytes into the held-out text.
ODD_LINES = ("# naïve café — 東京 ✓ €\t😀\n", "x = '\x01\x1b\x7f\r'  # ünïcödé\f\n")


def _cpt_dataset(tmp_path) -> tuple[str, bytes]:
    """Stdlib sources interleaved with non-ASCII and control-byte lines, as a CPT dataset."""
    corpus.build_stdlib_corpus(tmp_path / "src.txt", max_bytes=60_000)
    lines = (tmp_path / "src.txt").read_bytes().decode("utf-8", "ignore").splitlines(True)
    text = "".join(line + ODD_LINES[i // 7 % 2] * (i % 7 == 0) for i, line in enumerate(lines))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8", newline="")
    return str(path), hashlib.sha256(path.read_bytes()).digest()


def _train(backend, steps: int, lr: float = 3e-3) -> None:
    opt = torch.optim.AdamW(backend.model.parameters(), lr=lr)
    batches = backend.batches(torch.arange(backend.n_items()), 8, seed=0)
    for _ in range(steps):
        opt.zero_grad()
        backend.loss(next(batches)).backward()
        opt.step()


def _spec(method: Method, dataset: str, digest: bytes) -> JobSpec:
    return JobSpec(
        price_per_operator_epoch=1,
        method=method,
        model_uri="builtin:tiny",
        dataset_uri=dataset,
        dataset_hash=digest,
    )


def _export(out, backend, spec: JobSpec):
    """The operator's export of the backend's weights (the path `dtrain job fetch` takes)."""
    tensors = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
    out.mkdir(parents=True)
    stream = out / "final.stream"
    stream.write_bytes(checkpoint.to_stream(tensors))
    state = JobState(
        "0x" + "00" * 20, JobStatus.COMPLETED, 0, 0, 0, 0, 0, checkpoint.canonical_hash(tensors)
    )
    return export_final(Job(id=1, spec=spec, state=state), stream, out / "final")


@dataclass
class Trained:
    backend: Any
    spec: JobSpec
    out: Path  # the exported folder
    loss: float  # training's held-out loss

    def load(self, out: Path | None = None):
        out = out or self.out
        return AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)


def _trained(tmp: Path, method: Method, dataset: tuple[str, bytes], steps: int) -> Trained:
    backend = make_backend(tiny_job(method.name.lower(), *dataset))
    _train(backend, steps)
    spec = _spec(method, *dataset)
    loss = backend.evaluate()["heldout_loss"]
    return Trained(backend, spec, _export(tmp / "export", backend, spec), loss)


@pytest.fixture(scope="module")
def cpt(tmp_path_factory) -> Trained:
    tmp = tmp_path_factory.mktemp("cpt")
    return _trained(tmp, Method.CPT, _cpt_dataset(tmp), steps=16)


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Trained:
    tmp = tmp_path_factory.mktemp("sft")
    return _trained(tmp, Method.SFT, _sft_dataset(tmp), steps=30)


@torch.no_grad()
def test_exported_tokenizer_scores_heldout_text_as_training_does(cpt) -> None:
    backend = cpt.backend
    model, tok = cpt.load()
    # The held-out split as text, encoded by the exported tokenizer, cut into the same windows.
    text = bytes(backend.data.heldout.tolist()).decode("utf-8")
    assert any(ord(c) > 0xFFFF for c in text) and "\x1b" in text  # the odd bytes are in it
    ids = torch.tensor(tok(text)["input_ids"])
    x, y = corpus.TextData(ids, ids, backend.ctx).heldout_windows(len(backend.heldout[0]))
    loss = float(F.cross_entropy(model(input_ids=x).logits.transpose(1, 2), y))
    assert cpt.loss < 5.0  # trained: a wrong id mapping would cost it several nats
    assert loss == pytest.approx(cpt.loss, abs=1e-4)
    assert tok.decode(ids) == text


def test_tokenizer_ids_are_the_bytes_and_specials_are_the_models() -> None:
    from tokenizers import pre_tokenizers

    assert sorted(hf.byte_symbols()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = hf.tokenizer()
    assert tok.convert_ids_to_tokens(list(range(256))) == hf.byte_symbols()
    for text in ("def f(x):\n\treturn x\r\n", "".join(chr(c) for c in range(128)), *ODD_LINES):
        ids = tok(text)["input_ids"]
        assert ids == list(text.encode()) and tok.decode(ids) == text
    # Every byte a valid UTF-8 text can hold: 2-, 3- and 4-byte sequences of every lead byte.
    wide = "".join(chr(c) for c in (*range(0x80, 0x800, 7), *range(0x800, 0xFFFF, 331)))
    wide = (
        "".join(c for c in wide if not 0xD800 <= ord(c) < 0xE000)
        + "\U00010000\U00040000\U00080000\U000c0000\U0010fffd"
    )
    assert tok(wide)["input_ids"] == list(wide.encode())
    assert {b for b in wide.encode()} >= set(range(0x80, 0xC0)) | set(range(0xC2, 0xF5))
    cfg = hf.build(hf.PRESETS["tiny"], seed=0).config
    specials = (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert specials == (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id)
    assert specials == (finetune.BOS, finetune.EOS, finetune.PAD)
    assert len(tok) == 256 + len(hf.SPECIALS) <= cfg.vocab_size


def _sft_dataset(tmp_path) -> tuple[str, bytes]:
    path = tmp_path / "sft.jsonl"
    return str(path), tasks.make_dataset(path, "sft", tasks.addition(300, digits=2, seed=0))


def test_chat_template_renders_the_training_format(tmp_path) -> None:
    tok = hf.tokenizer()
    prompt, answer = "12+30=", "42 é"
    ids, plen = finetune.labelled(finetune.byte_coder(), prompt, answer)
    user = [{"role": "user", "content": prompt}]
    got = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    assert list(getattr(got, "input_ids", got)) == ids[:plen]  # what greedy / GRPO prompt with
    full = [*user, {"role": "assistant", "content": answer}]
    got = tok.apply_chat_template(full, tokenize=True)
    assert list(getattr(got, "input_ids", got)) == ids  # BOS + prompt + response + EOS


@torch.no_grad()
def test_exported_sft_model_scores_chat_template_as_training_does(sft) -> None:
    model, tok = sft.load()
    seqs, labels = [], []
    for r in sft.backend.eval_recs:
        user = [{"role": "user", "content": r["prompt"]}]
        p = tok.apply_chat_template(user, add_generation_prompt=True, return_dict=True)
        full = [*user, {"role": "assistant", "content": r["completion"]}]
        s = tok.apply_chat_template(full, return_dict=True)["input_ids"]
        seqs.append(s)
        labels.append([losses.IGNORE] * len(p["input_ids"]) + s[len(p["input_ids"]) :])
    batch = tok.pad({"input_ids": seqs}, padding_side="right", return_tensors="pt")
    lab = torch.full_like(batch["input_ids"], losses.IGNORE)
    for i, row in enumerate(labels):
        lab[i, : len(row)] = torch.tensor(row)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert losses.sft_loss(logits, lab).item() == pytest.approx(sft.loss, abs=1e-4)


def test_export_folder_names_its_format(tmp_path) -> None:
    out = hf.export(hf.build(hf.PRESETS["tiny"], seed=3), tmp_path / "m")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg.get("model_max_length") == hf.PRESETS["tiny"].ctx


def _sorted_alphabet_tokenizer():
    """The tokenizer exported before byte ids were byte values: the ByteLevel symbols in
    sorted order ('d' -> 67, while CPT trained 'd' as 100)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for s in hf.SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=hf.BOS, eos_token=hf.EOS)
    fast.pad_token, fast.chat_template = hf.PAD, hf.CHAT_TEMPLATE
    return fast


def _checks(trained: Trained, out: Path) -> dict[str, tuple[bool, str]]:
    checks = Checks()
    result = final_model.evaluate_export(out, trained.spec, 1, checks)
    named = {n: (ok, d) for n, ok, d in checks.items}
    assert len(named) == len(checks.items) and result["sample"] is not None
    return named


TOKENIZER = "exported tokenizer gives the training-side held-out loss"
GENERATION = "greedy continuations match held-out text better than the initial model's"
LOSS = "held-out loss went down"


@pytest.mark.parametrize("method", ["cpt", "sft"])
def test_demo_checks_pass_on_the_trained_export(method, request) -> None:
    trained = request.getfixturevalue(method)
    named = _checks(trained, trained.out)
    assert list(named) == [LOSS, TOKENIZER, GENERATION]
    assert all(ok for ok, _ in named.values()), named


def test_demo_checks_fail_an_untrained_export_and_a_mismatched_tokenizer(cpt, tmp_path) -> None:
    untrained = make_backend(tiny_job("cpt", cpt.spec.dataset_uri, cpt.spec.dataset_hash))
    named = _checks(cpt, _export(tmp_path / "untrained", untrained, cpt.spec))
    assert not named[LOSS][0] and not named[GENERATION][0]
    assert named[TOKENIZER][0]  # its tokenizer still agrees with training
    # The trained weights shipped with the old tokenizer (the bug this guards against).
    mismatched = tmp_path / "mismatched"
    shutil.copytree(cpt.out, mismatched)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (mismatched / f).unlink(missing_ok=True)
    _sorted_alphabet_tokenizer().save_pretrained(mismatched)
    named = _checks(cpt, mismatched)
    assert named[LOSS][0] and not named[TOKENIZER][0] and not named[GENERATION][0], named


def test_continuation_match_counts_leading_characters() -> None:
    assert final_model.common_prefix("def f", "def g") == 4
    assert final_model.common_prefix("", "x") == 0 == final_model.common_prefix("a", "b")
    assert final_model.common_prefix("ab", "abc") == 2


def test_heldout_text_starts_at_a_whole_character() -> None:
    from types import SimpleNamespace

    cut = torch.tensor(list("é—x\n".encode())[1:])  # the split cut 'é' in two
    backend = SimpleNamespace(
        data=SimpleNamespace(heldout=cut), start=SimpleNamespace(byte_level=True)
    )
    assert final_model.heldout_text(backend) == "—x\n"


def test_fetching_the_final_model_needs_no_dataset(cpt, tmp_path) -> None:
    """`dtrain job fetch` exports the final checkpoint from the model reference alone: a
    caller without the job's dataset (here: a path that does not exist) gets the same folder."""
    spec = _spec(Method.CPT, str(tmp_path / "not-here.txt"), b"\x01" * 32)
    out = _export(tmp_path / "nodata", cpt.backend, spec)
    got = AutoModelForCausalLM.from_pretrained(out).state_dict()
    want = cpt.backend.model.state_dict()
    assert got.keys() >= want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
