"""Any Hugging Face causal LM as a job's start model: pins, loading, real shapes through DeMo,
CPT through the model's own tokenizer, and the export that loads back with `from_pretrained`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dtrain_node.errors import ModelUnavailable
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import checkpoint, start
from dtrain_node.train.backend import CausalLMBackend, TrainJob
from dtrain_node.train.toy_models import save_gpt2, save_llama, training_text


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "gpt2")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_llama(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text("".join(training_text(120_000)), encoding="utf-8")
    return p


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_pin_is_stable_and_ignores_the_saving_library(gpt2, tmp_path) -> None:
    twin = copy(gpt2, tmp_path / "twin")
    cfg = json.loads((twin / "config.json").read_text())
    cfg["transformers_version"] = "0.0.1"
    (twin / "config.json").write_text(json.dumps(cfg, indent=7))
    assert start.model_hash(str(twin)) == start.model_hash(str(gpt2))


def test_pin_covers_weights_config_and_tokenizer(gpt2, tmp_path) -> None:
    base = start.model_hash(str(gpt2))
    cfg_changed = copy(gpt2, tmp_path / "cfg")
    cfg = json.loads((cfg_changed / "config.json").read_text())
    cfg["layer_norm_epsilon"] = 1e-3
    (cfg_changed / "config.json").write_text(json.dumps(cfg))
    tok_changed = copy(gpt2, tmp_path / "tok")
    (tok_changed / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    weights_changed = save_gpt2(tmp_path / "seed1", seed=1)
    pins = {base, *(start.model_hash(str(p)) for p in (cfg_changed, tok_changed, weights_changed))}
    assert len(pins) == 4


def test_builtin_pin_depends_on_seed_and_preset() -> None:
    a, b = start.model_hash("builtin:tiny"), start.model_hash("builtin:tiny?seed=1")
    assert len({a, b, start.model_hash("builtin:small")}) == 3
    assert a == start.model_hash("builtin:tiny")


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda d: d, "no config.json"),
        (lambda d: (d / "config.json").write_text("{not json") and d, "unreadable"),
        (lambda d: (d / "config.json").write_text("[1]") and d, "not a JSON object"),
    ],
)
def test_broken_folders_are_model_unavailable(tmp_path, make, error) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(ModelUnavailable, match=error):
        start.start_model(str(make(d)))


def test_corrupt_weights_are_model_unavailable(gpt2, tmp_path) -> None:
    bad = copy(gpt2, tmp_path / "bad")
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelUnavailable, match="does not load"):
        start.start_model(str(bad)).fresh()


def test_a_folder_without_tokenizer_files_says_which_files_it_needs(gpt2, tmp_path) -> None:
    """Weights and config but no tokenizer file: the message names the folder and the files
    a tokenizer is read from, not a library to install."""
    bare = copy(gpt2, tmp_path / "bare")
    for name in start.TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ModelUnavailable) as err:
        start.start_model(str(bare)).tokenizer  # noqa: B018 (the property loads it)
    msg = str(err.value)
    assert "has no tokenizer files" in msg and str(bare) in msg and "tokenizer.json" in msg, msg
    assert "sentencepiece" not in msg and "tiktoken" not in msg, msg


def test_unknown_uris_are_rejected(tmp_path) -> None:
    for uri in ("", str(tmp_path / "missing"), "hf://just-a-name", "builtin:huge"):
        with pytest.raises(ModelUnavailable):
            start.start_model(uri)


def test_hf_uri_resolves_from_the_local_cache(gpt2, tmp_path, monkeypatch) -> None:
    """hf://org/name@rev reads the Hugging Face cache layout (offline: no download)."""
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--tiny-gpt2"
    shutil.copytree(gpt2, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    assert start.model_hash("hf://acme/tiny-gpt2@main") == start.model_hash(str(gpt2))
    with pytest.raises(ModelUnavailable, match="not in the Hugging Face cache"):
        start.start_model("hf://acme/other@main")


def test_gpt2_real_shapes_sync_bitwise_identically(gpt2) -> None:
    """Every GPT-2 tensor (a 50,257 x 32 embedding, Conv1D weights, 1-D norms and biases)
    goes through DCT chunking, top-k and the exact aggregation: two workers end identical and
    every tensor moved."""
    s = start.start_model(str(gpt2))
    models = [s.fresh(), s.fresh()]
    shapes = {tuple(p.shape) for p in models[0].parameters()}
    assert (50257, 32) in shapes and (32,) in shapes
    cfg = DeMoConfig(mode="local", sync_interval=1)
    opts = [DeMo(m.named_parameters(), cfg, sender=i) for i, m in enumerate(models)]
    before = [p.detach().clone() for p in models[0].parameters()]
    for i, (m, o) in enumerate(zip(models, opts, strict=True)):
        ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(i))
        m(input_ids=ids, labels=ids).loss.backward()
        o.inner_step()
    lockstep(opts)
    for a, b, p0 in zip(opts[0].theta_sync, opts[1].theta_sync, before, strict=True):
        assert torch.equal(a, b)
        assert not torch.equal(a, p0)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_cpt_through_the_model_tokenizer_and_export_agree(which, request, text_file, tmp_path):
    """What goes in is what comes out: the held-out loss the backend reports equals the loss of
    the exported folder, loaded with from_pretrained, on the held-out text encoded by the
    exported tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = request.getfixturevalue(which)
    digest = checkpoint.hashlib.sha256(text_file.read_bytes()).digest()
    job = TrainJob(1, "cpt", str(folder), str(text_file), digest)
    b = CausalLMBackend(job, heldout_windows=4)
    opt = torch.optim.AdamW(b.model.parameters(), lr=3e-3)
    first = b.evaluate()["heldout_loss"]
    batches = b.batches(torch.arange(b.n_items()), 4, seed=0)
    for _ in range(3):
        b.loss(next(batches)).backward()
        opt.step()
        opt.zero_grad()
    after = b.evaluate()["heldout_loss"]
    assert after < first and math.isfinite(after)
    out = b.export(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    x, y = b.heldout
    text = tok.decode(torch.cat([x[0], y[0, -1:]]).tolist())
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
        own = torch.nn.functional.cross_entropy(b.model.eval()(input_ids=x[:1]).logits[0], y[0])
    assert loss == pytest.approx(own.item(), rel=1e-3)


def test_recipe_seq_len_must_fit_the_model(gpt2, text_file) -> None:
    from dtrain.recipe import Recipe
    from dtrain_node.errors import RecipeInvalid

    if "seq_len" not in Recipe.__dataclass_fields__:
        pytest.fail("the recipe has no seq_len field")
    digest = checkpoint.hashlib.sha256(text_file.read_bytes()).digest()
    job = TrainJob(1, "cpt", str(gpt2), str(text_file), digest, recipe=Recipe(seq_len=512))
    with pytest.raises(RecipeInvalid, match="exceeds the context"):
        CausalLMBackend(job)


def sft_chat_file(path: Path) -> Path:
    """Addition problems as chat records (a system turn, a user turn, the assistant's answer)."""
    with path.open("w") as f:
        for a in range(12):
            for b in range(12):
                msgs = [
                    {"role": "system", "content": "Add."},
                    {"role": "user", "content": f"{a}+{b}="},
                    {"role": "assistant", "content": str(a + b)},
                ]
                f.write(json.dumps({"messages": msgs}) + "\n")
    return path


def test_sft_chat_records_on_gpt2_train_and_export_through_the_chat_template(gpt2, tmp_path):
    """SFT on a caller's chat dataset: prompts through the model's chat template, the loss on
    the assistant turn only; the exported folder, through its own tokenizer and template, scores
    the held-out records as training does, and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_node.train import finetune, losses
    from dtrain_node.train.backend import make_backend

    data = sft_chat_file(tmp_path / "sft.jsonl")
    digest = checkpoint.hashlib.sha256(data.read_bytes()).digest()
    b = make_backend(TrainJob(1, "sft", str(gpt2), str(data), digest))
    rec = b.train[0]
    _, labels, _ = b.collate([rec], 0)
    prompt_ids = b.coder.prompt(rec["prompt"])
    tok = b.start.tokenizer
    assert tok.decode(prompt_ids).endswith(
        "<|user|>" + rec["prompt"][-1]["content"] + "<|assistant|>"
    )
    trained = labels[0][labels[0] != losses.IGNORE].tolist()
    assert trained == [*tok.encode(rec["completion"], add_special_tokens=False), tok.eos_token_id]
    opt = torch.optim.AdamW(b.model.parameters(), lr=3e-3)
    before = b.evaluate()["heldout_loss"]
    batches = b.batches(torch.arange(b.n_items()), 8, seed=0)
    for _ in range(4):
        b.loss(next(batches)).backward()
        opt.step()
        opt.zero_grad()
    after = b.evaluate()["heldout_loss"]
    assert after < before
    out = b.export(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    coder = finetune.Coder(AutoTokenizer.from_pretrained(out))
    x, y, m = finetune.collate_labelled(
        coder, [(r["prompt"], r["completion"]) for r in b.eval_recs]
    )
    with torch.no_grad():
        loss = losses.sft_loss(model(input_ids=x, attention_mask=m).logits, y).item()
    assert loss == pytest.approx(after, rel=1e-4)
    got = finetune.greedy(model, coder, [b.eval_recs[0]["prompt"]], max_new=4)
    assert isinstance(got[0], str)


def test_chat_records_need_a_chat_template(gpt2, tmp_path) -> None:
    from dtrain_node.errors import DatasetError
    from dtrain_node.train.backend import make_backend

    bare = copy(gpt2, tmp_path / "bare")
    (bare / "chat_template.jinja").unlink()
    data = sft_chat_file(tmp_path / "sft.jsonl")
    digest = checkpoint.hashlib.sha256(data.read_bytes()).digest()
    with pytest.raises(DatasetError, match="chat template"):
        make_backend(TrainJob(1, "sft", str(bare), str(data), digest))


def test_lora_trains_only_adapters_identically_and_exports_merged(gpt2, tmp_path) -> None:
    """A recipe with lora_rank > 0: two nodes build bitwise-identical adapters from the recipe's
    seed, DeMo syncs only the adapter tensors (the base weights never move), and the export is
    the merged model (loads with from_pretrained, computes what the adapted model computes)
    plus the adapter in peft layout."""
    from transformers import AutoModelForCausalLM

    from dtrain.recipe import Recipe
    from dtrain_node.train.backend import make_backend

    data = sft_chat_file(tmp_path / "sft.jsonl")
    digest = checkpoint.hashlib.sha256(data.read_bytes()).digest()
    recipe = Recipe(lora_rank=4, lora_alpha=8.0, seed=3)
    job = TrainJob(1, "sft", str(gpt2), str(data), digest, recipe=recipe)
    a, b = make_backend(job), make_backend(job)
    assert a.start_pin == start.model_hash(str(gpt2))  # the pin is the base model's
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    trainable = [n for n, p in a.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = {n: p.detach().clone() for n, p in a.model.named_parameters() if not p.requires_grad}
    opts = [
        DeMo(m.model.named_parameters(), DeMoConfig(mode="local", sync_interval=1), i)
        for i, m in enumerate((a, b))
    ]
    for i, (m, o) in enumerate(zip((a, b), opts, strict=True)):
        batch = next(m.batches(torch.arange(m.n_items()), 8, seed=i))
        m.loss(batch).backward()
        o.inner_step()
    lockstep(opts)
    assert all(
        torch.equal(x, y) for x, y in zip(opts[0].theta_sync, opts[1].theta_sync, strict=True)
    )
    frozen = dict(a.model.named_parameters())
    assert all(torch.equal(frozen[n], t) for n, t in base.items())
    with torch.no_grad():  # make the adapters matter for the merged-model check
        for n, p in a.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    out = a.export(tmp_path / "out")
    assert (out / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([a.coder.prompt("1+2=")])
    with torch.no_grad():
        want = a.model.eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(
        got, start.start_model(str(gpt2)).fresh().eval()(input_ids=ids).logits, atol=1e-3
    )


def test_byte_level_cpt_reads_jsonl_documents_not_their_json(tmp_path) -> None:
    """A JSONL CPT dataset on a built-in model trains on the documents' bytes, each followed by
    EOS, never on the JSON syntax around them."""
    from dtrain_node.train import corpus

    docs = [f"document {i}: " + "abc " * 50 for i in range(20)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data = corpus.load_text(path, None, ctx=64)
    tokens = torch.cat([data.train, data.heldout]).tolist()
    want = []
    for d in docs:
        want += [*d.encode(), corpus.BYTE_EOS]
    assert tokens == want


def test_caller_export_of_a_lora_job_rebuilds_the_adapters_from_model_and_recipe(
    gpt2, tmp_path
) -> None:
    """What `job fetch` does with a LoRA job's final checkpoint: from the job's model and
    recipe alone (no dataset), the adapters are rebuilt, the verified tensors loaded and the
    merged model exported: it computes what the trained model computed."""
    from transformers import AutoModelForCausalLM

    from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
    from dtrain.recipe import Recipe
    from dtrain_node.operator.checkpoints import export_final
    from dtrain_node.operator.sources import Cache
    from dtrain_node.train.backend import make_backend

    data = sft_chat_file(tmp_path / "sft.jsonl")
    recipe = Recipe(lora_rank=4, seed=2)
    recipe_file = tmp_path / "recipe.toml"
    recipe_file.write_text(recipe.to_toml())
    digest = checkpoint.hashlib.sha256(data.read_bytes()).digest()
    b = make_backend(TrainJob(1, "sft", str(gpt2), str(data), digest, recipe=recipe))
    with torch.no_grad():
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
    tensors = dict(b.model.state_dict())
    stream = tmp_path / "final.stream"
    stream.write_bytes(checkpoint.to_stream(tensors))
    final = checkpoint.canonical_hash(tensors)
    spec = JobSpec(
        price_per_operator_epoch=1,
        method=Method.SFT,
        model_uri=str(gpt2),
        dataset_uri=str(tmp_path / "not-here.jsonl"),  # the caller need not have it
        recipe_hash=recipe.hash(),
        recipe_uri=str(recipe_file),
    )
    job = Job(1, spec, JobState("0x" + "11" * 20, JobStatus.COMPLETED, 1, 0, 0, 0, 0, final))
    out = export_final(job, stream, tmp_path / "out", Cache(tmp_path / "cache"))
    assert (out / "CHECKPOINT_SHA256").read_text().strip() == final.hex()
    assert (out / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([b.coder.prompt("4+5=")])
    with torch.no_grad():
        want = b.model.eval()(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-4)


def test_text_longer_than_the_models_context_is_encoded_without_the_tokenizers_warning() -> None:
    """Documents and records are cut to the context after encoding; the tokenizer's "Token
    indices sequence length is longer than..." line was noise in every CPT job's log (it
    marks the warning given in `deprecation_warnings`, on its own stderr handler)."""
    from dtrain_node.train import models
    from dtrain_node.train.finetune import Coder

    tok = models.tokenizer(max_length=8)
    assert Coder(tok).encode("x" * 64) == [ord("x")] * 64
    assert not tok.deprecation_warnings.get("sequence-length-is-longer-than-the-specified-maximum")
