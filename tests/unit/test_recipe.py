"""The training recipe (`dtrain.recipe`): defaults, canonical form, hash and validation."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields

import pytest

from dtrain.errors import ConfigError
from dtrain.recipe import ABSENT, LATER_FIELDS, RULES, Recipe


def test_defaults_are_the_reference_node_constants() -> None:
    from dtrain_node.operator.node import NodeConfig
    from dtrain_node.optim.optimizer import DeMoConfig
    from dtrain_node.train.finetune import MethodOptions

    r, node, demo, opts = Recipe(), NodeConfig, DeMoConfig(), MethodOptions()
    field_default = {f.name: f.default for f in fields(node)}
    assert r.batch_size == field_default["batch_size"]
    assert r.inner_lr == field_default["inner_lr"]
    assert r.outer_lr == field_default["outer_lr"]
    assert r.outer_momentum == field_default["beta"]
    assert (r.inner_beta1, r.inner_beta2) == demo.inner_betas
    assert r.inner_weight_decay == demo.inner_weight_decay
    assert r.outer_weight_decay == demo.weight_decay
    assert (r.dpo_beta, r.grpo_group, r.grpo_kl) == (opts.dpo_beta, opts.grpo_group, opts.grpo_kl)
    assert (r.grpo_clip, r.grpo_temperature) == (opts.grpo_clip, opts.grpo_temperature)
    assert (r.grpo_iterations, r.heldout_fraction) == (opts.grpo_iterations, opts.heldout_fraction)
    assert set(RULES) == {f.name for f in fields(Recipe)}  # every field is validated


def test_canonical_form_and_hash() -> None:
    r = Recipe()
    text = r.canonical()
    assert " " not in text and json.loads(text)["batch_size"] == 8
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert r.hash() == hashlib.sha256(text.encode()).digest()
    assert Recipe(inner_lr=2e-3).hash() == r.hash()  # a default written out changes nothing
    assert Recipe(outer_lr=1).canonical() == text  # an int for a float is the same float
    assert Recipe(dpo_beta=0.2).hash() != r.hash()


def test_hash_is_stable_under_key_order_whitespace_and_comments(tmp_path) -> None:
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("batch_size = 4\ndpo_beta = 0.25\nseed = 7\n")
    b.write_text("# a comment\n\n  seed=7\ndpo_beta   =   0.250\n\nbatch_size = 4 # four\n")
    want = Recipe(batch_size=4, dpo_beta=0.25, seed=7, **ABSENT)
    assert Recipe.from_toml(a) == Recipe.from_toml(b) == want
    assert Recipe.from_toml(a).hash() == Recipe.from_toml(f"file://{b}").hash()
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    # a file means what it meant when written: a field it leaves out that has an ABSENT value
    # takes that value, not today's default
    assert Recipe.from_toml(empty).hash() == Recipe(**ABSENT).hash() != Recipe().hash()
    assert Recipe.from_dict({}) == Recipe(**ABSENT)


BAD = [
    ("batch_size", 0, "'batch_size' must be >= 1, got 0"),
    ("batch_size", 2.5, "'batch_size' must be an integer"),
    ("inner_lr", 0, "'inner_lr' must be > 0"),
    ("inner_lr", "0.1", "'inner_lr' must be a number"),
    ("inner_lr", float("nan"), "'inner_lr' must be > 0, got nan"),
    ("inner_beta1", 1.0, "'inner_beta1' must be in [0, 1)"),
    ("inner_beta2", -0.1, "'inner_beta2' must be in [0, 1)"),
    ("inner_weight_decay", -1, "'inner_weight_decay' must be >= 0"),
    ("outer_lr", -1.0, "'outer_lr' must be > 0"),
    ("outer_momentum", 1.5, "'outer_momentum' must be in [0, 1]"),
    ("outer_weight_decay", -0.5, "'outer_weight_decay' must be >= 0"),
    ("outer_weight_decay", 1.0, "'outer_weight_decay' times 'outer_lr' must be < 1"),
    ("dpo_beta", 0, "'dpo_beta' must be > 0"),
    ("grpo_group", 1, "'grpo_group' must be >= 2"),
    ("grpo_group", True, "'grpo_group' must be a number"),
    ("grpo_kl", -0.01, "'grpo_kl' must be >= 0"),
    ("grpo_clip", 1.0, "'grpo_clip' must be in (0, 1)"),
    ("grpo_temperature", 0.0, "'grpo_temperature' must be > 0"),
    ("grpo_iterations", 0, "'grpo_iterations' must be >= 1"),
    ("heldout_fraction", 1, "'heldout_fraction' must be in (0, 1)"),
    ("seed", -1, "'seed' must be in [0, 2**32)"),
    ("reward", "fuzzy", "'reward' must be one of exact, numeric, contains, regex, format"),
    ("reward", 1, "'reward' must be a string"),
    ("reward", "format", "'reward_pattern' must be set for reward 'format'"),
    ("reward_pattern", "<a>(", "'reward_pattern' is not a valid regex"),
    ("reward_pattern", "(a+)+", "'reward_pattern' repeats a variable-length part"),
    ("reward_pattern", "a" * 201, "'reward_pattern' is 201 characters long (at most 200)"),
    ("grpo_max_new_tokens", 0, "'grpo_max_new_tokens' must be >= 1"),
    ("seq_len", 4, "'seq_len' must be >= 8"),
    ("lora_rank", -1, "'lora_rank' must be >= 0"),
    ("lora_alpha", 0, "'lora_alpha' must be > 0"),
    ("lora_dropout", 1.0, "'lora_dropout' must be in [0, 1)"),
    ("lora_targets", "q_proj;v_proj", "'lora_targets' must be comma-separated module names"),
    ("lora_targets", "q_proj,,v_proj", "'lora_targets' must be comma-separated module names"),
    ("bf16", 1, "'bf16' must be true or false"),
    ("bf16", "true", "'bf16' must be true or false"),
    ("backend", "unsloth", "'backend' must be builtin, trl or torchtune, got 'unsloth'"),
    ("backend", 1, "'backend' must be a string"),
    ("lr_schedule", "step", "'lr_schedule' must be constant, linear or cosine, got 'step'"),
    ("lr_schedule", 1, "'lr_schedule' must be a string"),
    ("warmup_steps", -1, "'warmup_steps' must be >= 0"),
    ("warmup_steps", 2.5, "'warmup_steps' must be an integer"),
    ("min_lr_ratio", 1.5, "'min_lr_ratio' must be in [0, 1]"),
    ("min_lr_ratio", 0.1, "'min_lr_ratio' applies to lr_schedule 'linear' or 'cosine' only"),
    ("max_grad_norm", -1.0, "'max_grad_norm' must be >= 0 (0: no clipping)"),
    ("max_grad_norm", float("inf"), "'max_grad_norm' must be >= 0 (0: no clipping), got inf"),
    ("grad_accum", 0, "'grad_accum' must be >= 1"),
    ("grad_accum", "2", "'grad_accum' must be a number"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD)
def test_each_bad_field_is_named(name, value, message) -> None:
    with pytest.raises(ConfigError) as exc:
        Recipe(**{name: value})
    assert message in str(exc.value) and len(str(exc.value).splitlines()) == 1


def test_string_and_bool_fields(tmp_path) -> None:
    p = tmp_path / "r.toml"
    p.write_text(
        "reward = \"format\"\nreward_pattern = '<answer>(.*)</answer>'\nbf16 = true\n"
        'lora_rank = 8\nlora_targets = " v_proj, q_proj,q_proj"\n'
    )
    r = Recipe.from_toml(p)
    assert (r.reward, r.reward_pattern, r.bf16) == ("format", "<answer>(.*)</answer>", True)
    assert r.lora_targets == "q_proj,v_proj"  # one spelling, one hash
    same = {k: getattr(r, k) for k in ("reward", "reward_pattern", "bf16", "lora_rank", *ABSENT)}
    assert r.hash() == Recipe(lora_targets="v_proj,q_proj", **same).hash()
    canonical = json.loads(r.canonical())
    assert canonical["bf16"] is True and canonical["reward"] == "format"
    assert Recipe().lora_targets == "" and Recipe(lora_targets=" ").lora_targets == ""
    p.write_text("bf16 = 1\n")
    with pytest.raises(ConfigError, match="'bf16' must be true or false"):
        Recipe.from_toml(p)


def test_default_canonical_form_is_pinned() -> None:
    """The default recipe's hash changes only when a field is added or a default changes: then
    update docs/methods.md "Recipe" and this pin together."""
    assert Recipe().canonical() == (
        '{"backend":"builtin","batch_size":8,"bf16":false,"dpo_beta":0.1,"grpo_clip":0.2,'
        '"grpo_completions":"alphabet","grpo_group":8,"grpo_iterations":1,"grpo_kl":0.04,"grpo_max_new_tokens":16,"grpo_temperature":1.0,'
        '"head_mean_topk":64,"heldout_fraction":0.1,"inner_beta1":0.9,"inner_beta2":0.95,"inner_lr":0.002,'
        '"inner_weight_decay":0.0,"lora_alpha":16.0,"lora_dropout":0.0,"lora_rank":0,'
        '"lora_targets":"","outer_lr":1.0,"outer_momentum":0.8,"outer_weight_decay":0.0,'
        '"reward":"exact","reward_pattern":"","seed":0,"seq_len":128}'
    )


def test_schedule_fields_enter_the_hash_only_when_set(tmp_path) -> None:
    """The fields added after the pinned form (LATER_FIELDS) leave every older recipe's hash as
    it was: at their defaults they are neither hashed nor written out; set, they are both."""
    assert set(LATER_FIELDS) < {f.name for f in fields(Recipe)}
    old = Recipe(batch_size=4, seed=3, **ABSENT)  # as a recipe written before them reads
    written = Recipe(
        batch_size=4,
        seed=3,
        lr_schedule="constant",
        warmup_steps=0,
        max_grad_norm=0,
        grad_accum=1,
        **ABSENT,
    )
    assert written.hash() == old.hash() and written.canonical() == old.canonical()
    assert not any(name in old.to_toml() for name in LATER_FIELDS)
    for change in (
        {"lr_schedule": "linear"},
        {"lr_schedule": "cosine", "min_lr_ratio": 0.1},
        {"warmup_steps": 10},
        {"max_grad_norm": 1.0},
        {"grad_accum": 4},
    ):
        r = Recipe(batch_size=4, seed=3, **{**ABSENT, **change})
        assert r.hash() != old.hash(), change
        assert all(json.loads(r.canonical())[k] == v for k, v in change.items())
        p = tmp_path / "r.toml"
        p.write_text(r.to_toml())
        assert Recipe.from_toml(p) == r and Recipe.from_toml(p).hash() == r.hash()
    a, b = (
        Recipe(lr_schedule="cosine", warmup_steps=5),
        Recipe(lr_schedule="linear", warmup_steps=5),
    )
    assert a.hash() != b.hash()


def test_to_toml_reads_back(tmp_path) -> None:
    p = tmp_path / "r.toml"
    for r in [
        Recipe(),
        Recipe(inner_lr=1e-5, outer_lr=0.5, seed=2**32 - 1, bf16=True, lora_targets="q,k"),
        Recipe(reward="format", reward_pattern='<a>"(.*)"\\s\x7f\t\u00e9\U0001f600</a>'),
    ]:
        p.write_text(r.to_toml(), encoding="utf-8")
        assert Recipe.from_toml(p) == r and Recipe.from_toml(p).hash() == r.hash()


def test_bad_files(tmp_path) -> None:
    p = tmp_path / "r.toml"
    p.write_text("batch_size = 4\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown recipe field.*'learning_rate'"):
        Recipe.from_toml(p)
    # what a Hugging Face / TRL / axolotl user writes, and a near spelling, name our field
    for key, meant in [
        ("learning_rate", "inner_lr"),
        ("gradient_accumulation_steps", "grad_accum"),
        ("max_seq_length", "seq_len"),
        ("lora_r", "lora_rank"),
        ("batchsize", "batch_size"),
    ]:
        with pytest.raises(ConfigError, match=rf"\('{key}' is '{meant}'\); known:"):
            Recipe.from_dict({key: 1})
    with pytest.raises(ConfigError, match=r"unknown recipe field\(s\) 'zzz'; known:"):
        Recipe.from_dict({"zzz": 1})
    p.write_text("[inner]\nlr = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown recipe field.*'inner'"):
        Recipe.from_toml(p)
    p.write_text("batch_size = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        Recipe.from_toml(p)
    p.write_text('batch_size = "8"\n')
    with pytest.raises(ConfigError, match="'batch_size' must be a number"):
        Recipe.from_toml(p)
    with pytest.raises(ConfigError, match="cannot be read"):
        Recipe.from_toml(tmp_path / "missing.toml")
