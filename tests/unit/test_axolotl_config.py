"""dtrain.axolotl: an axolotl YAML config read as a dtrain job (model, records, recipe), checked
by `dtrain data check CONFIG.yml`, and trained through the built-in and torchtune backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtrain import axolotl
from dtrain.errors import ConfigError
from dtrain.recipe import ZERO_HASH, Recipe

SFT = """\
base_model: ./model
datasets:
  - path: data.jsonl
    type: alpaca
learning_rate: 0.0003
sequence_len: 96
micro_batch_size: 3
gradient_accumulation_steps: 2
lr_scheduler: constant
"""


def write(folder: Path, config: str, rows: list[dict] | None = None, name="data.jsonl") -> Path:
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_text("{}")
    if rows is not None:
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "axolotl.yml"
    path.write_text(config)
    return path


def alpaca_rows(n: int = 6) -> list[dict]:
    return [{"instruction": "Add.", "input": f"{i}+1", "output": str(i + 1)} for i in range(n)]


def test_alpaca_records_are_axolotls_prompt_and_the_output(tmp_path) -> None:
    rows = [
        {"instruction": "Add.", "input": "2+2", "output": "4"},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
        {"instruction": "Say yo.", "output": "yo"},
    ]
    job = axolotl.read_config(write(tmp_path, SFT, rows))
    assert job.method == "sft" and job.types == ("alpaca",)
    assert job.model == str((tmp_path / "model").resolve())
    with_input = (
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nAdd.\n\n### Input:\n2+2\n\n### Response:\n"
    )
    no_input = (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n"
    )
    assert job.records == [
        {"prompt": with_input, "completion": "4"},
        {"prompt": no_input, "completion": "hi"},
        {"prompt": no_input.replace("Say hi.", "Say yo."), "completion": "yo"},
    ]


def test_every_mapped_field_reaches_the_recipe(tmp_path) -> None:
    config = """\
base_model: model
datasets: [{path: data.jsonl, type: alpaca}]
learning_rate: 0.0007
sequence_len: 77
micro_batch_size: 3
gradient_accumulation_steps: 5
lr_scheduler: cosine
warmup_steps: 7
cosine_min_lr_ratio: 0.1
max_grad_norm: 0.5
optimizer: adamw_torch_fused
adam_beta1: 0.8
adam_beta2: 0.97
weight_decay: 0.01
seed: 9
val_set_size: 0.2
bf16: auto
adapter: lora
lora_r: 4
lora_alpha: 12
lora_dropout: 0.05
lora_target_modules: [q_proj, v_proj]
"""
    r = axolotl.read_config(write(tmp_path, config, alpaca_rows()), backend="torchtune").recipe
    want = Recipe(
        backend="torchtune",
        inner_lr=0.0007,
        seq_len=77,
        batch_size=3,
        grad_accum=5,
        lr_schedule="cosine",
        warmup_steps=7,
        min_lr_ratio=0.1,
        max_grad_norm=0.5,
        inner_beta1=0.8,
        inner_beta2=0.97,
        inner_weight_decay=0.01,
        seed=9,
        heldout_fraction=0.2,
        bf16=True,
        lora_rank=4,
        lora_alpha=12.0,
        lora_dropout=0.05,
        lora_targets="q_proj,v_proj",
    )
    assert r == want


def test_fields_left_out_take_axolotls_defaults_and_are_noted(tmp_path) -> None:
    config = "base_model: model\ndatasets: [{path: data.jsonl, type: alpaca}]\n"
    config += "learning_rate: 0.001\nnum_epochs: 3\n"
    job = axolotl.read_config(write(tmp_path, config, alpaca_rows()))
    r = job.recipe
    assert (r.batch_size, r.seq_len, r.lora_rank) == (1, 512, 0)
    assert (r.inner_beta1, r.inner_beta2, r.inner_weight_decay) == (0.9, 0.999, 0.0)
    assert r.backend == "builtin" and r.heldout_fraction == 0.1 and not r.bf16
    assert (r.lr_schedule, r.warmup_steps, r.min_lr_ratio) == ("cosine", 0, 0.0)
    assert (r.max_grad_norm, r.grad_accum) == (1.0, 1)
    assert job.notes == (
        "num_epochs is the job's (job submit --epochs/--steps)",
        "held out 0.1 (no val_set_size)",
        "cosine learning rate over the job's steps (axolotl's default scheduler)",
        "gradients clipped to norm 1.0 (axolotl's default max_grad_norm)",
    )


def test_clipping_off_and_accumulation_map_as_axolotl_means_them(tmp_path) -> None:
    """max_grad_norm 0 or null turns clipping off (Hugging Face's Trainer); micro_batch_size
    is each micro-batch's size and gradient_accumulation_steps how many an inner step takes."""
    for value in ("0", "null"):
        config = SFT + f"max_grad_norm: {value}\n"
        r = axolotl.read_config(write(tmp_path, config, alpaca_rows())).recipe
        assert (r.max_grad_norm, r.batch_size, r.grad_accum) == (0.0, 3, 2)
        assert r.lr_schedule == "constant"


def test_numbers_yaml_reads_as_strings_are_read_as_axolotl_reads_them(tmp_path) -> None:
    config = SFT.replace("learning_rate: 0.0003", "learning_rate: 2e-5") + "weight_decay: 1e-2\n"
    r = axolotl.read_config(write(tmp_path, config, alpaca_rows())).recipe
    assert (r.inner_lr, r.inner_weight_decay) == (2e-5, 1e-2)
    with pytest.raises(ConfigError, match=r": learning_rate: .*'fast'"):
        axolotl.read_config(write(tmp_path, SFT.replace("0.0003", "fast"), alpaca_rows()))


def test_dpo_beta_comes_from_rl_beta(tmp_path) -> None:
    rows = [{"question": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(4)]
    config = SFT.replace("type: alpaca", "type: chatml.intel") + "rl: dpo\nrl_beta: 0.25\n"
    job = axolotl.read_config(write(tmp_path, config, rows))
    assert job.method == "dpo" and job.recipe.dpo_beta == 0.25


def test_sharegpt_style_conversations_give_one_record_per_assistant_turn(tmp_path) -> None:
    config = SFT.replace(
        "    type: alpaca\n",
        "    type: chat_template\n    field_messages: conversations\n"
        "    message_property_mappings: {role: from, content: value}\n",
    )
    conv = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "1+1="},
        {"from": "gpt", "value": "2"},
        {"from": "human", "value": "2+2="},
        {"from": "gpt", "value": "4"},
    ]
    job = axolotl.read_config(write(tmp_path, config, [{"conversations": conv}]))
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ]
    assert job.records == [{"messages": msgs[:3]}, {"messages": msgs}]


def test_input_output_and_completion(tmp_path) -> None:
    segs = [
        {"label": False, "text": "Q: 1+1\n"},
        {"label": False, "text": "A: "},
        {"label": True, "text": "2"},
        {"label": True, "text": "."},
    ]
    config = SFT.replace("type: alpaca", "type: input_output")
    job = axolotl.read_config(write(tmp_path, config, [{"segments": segs}]))
    assert job.records == [{"prompt": "Q: 1+1\nA: ", "completion": "2."}]
    bad = [{"segments": [segs[2], segs[0]]}]
    with pytest.raises(ConfigError, match=r"datasets\[0\]\.path: data.jsonl record 1: segments"):
        axolotl.read_config(write(tmp_path, config, bad))
    config = SFT.replace("type: alpaca", "type: completion")
    job = axolotl.read_config(write(tmp_path, config, [{"text": "def f(): pass"}]))
    assert job.method == "cpt" and job.records == [{"text": "def f(): pass"}]


def test_dpo_chatml_types_build_axolotls_chatml_strings(tmp_path) -> None:
    rows = [
        {"system": "S", "question": "Q", "chosen": "good", "rejected": "bad"},
        {"question": "R", "chosen": "yes", "rejected": "no"},
    ]
    config = SFT.replace("type: alpaca", "type: chatml.intel") + "rl: dpo\n"
    job = axolotl.read_config(write(tmp_path, config, rows))
    assert job.records == [
        {
            "prompt": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n",
            "chosen": "good<|im_end|>",
            "rejected": "bad<|im_end|>",
        },
        {
            "prompt": "<|im_start|>user\nR<|im_end|>\n<|im_start|>assistant\n",
            "chosen": "yes<|im_end|>",
            "rejected": "no<|im_end|>",
        },
    ]
    pairs = [{"prompt": "P", "chosen": "c", "rejected": "r"}]
    config = config.replace("chatml.intel", "chatml.prompt_pairs")
    job = axolotl.read_config(write(tmp_path, config, pairs))
    assert job.records[0]["prompt"] == "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n"


def test_dpo_chat_template_default_keeps_the_conversation(tmp_path) -> None:
    config = SFT.replace(
        "    type: alpaca\n",
        "    type: chat_template.default\n    field_chosen: good\n    field_rejected: bad\n",
    )
    row = {
        "messages": [{"role": "user", "content": "hi"}],
        "good": {"role": "assistant", "content": "hello"},
        "bad": {"role": "assistant", "content": "go away"},
    }
    job = axolotl.read_config(write(tmp_path, config + "rl: dpo\n", [row]))
    assert job.records == [
        {"prompt": [{"role": "user", "content": "hi"}], "chosen": "hello", "rejected": "go away"}
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("lr_scheduler: one_cycle", "lr_scheduler"),
        ("warmup_ratio: 0.1", "warmup_ratio"),
        ("warmup_steps: -1", "warmup_steps"),
        ("cosine_min_lr_ratio: 0.2", "cosine_min_lr_ratio"),
        ("gradient_accumulation_steps: 0", "gradient_accumulation_steps"),
        ("load_in_4bit: true", "load_in_4bit"),
        ("sample_packing: true", "sample_packing"),
        ("train_on_inputs: true", "train_on_inputs"),
        ("rl: kto", "rl"),
        ("chat_template: chatml", "chat_template"),
        ("max_grad_norm: -1", "max_grad_norm"),
        ("fp16: true", "fp16"),
        ("adapter: qlora", "adapter"),
        ("deepspeed: zero2.json", "deepspeed"),
        ("val_set_size: 0", "val_set_size"),
        ("lora_r: 8", "lora_r"),
        ("micro_batch_size: 0", "micro_batch_size"),
        ("sequence_len: 4", "sequence_len"),
        ("learning_rate: -1", "learning_rate"),
    ],
)
def test_a_field_that_cannot_be_honoured_is_one_line_naming_it(tmp_path, change, field) -> None:
    key = change.split(":")[0]
    config = "".join(x for x in SFT.splitlines(keepends=True) if not x.startswith(key + ":"))
    with pytest.raises(ConfigError) as e:
        axolotl.read_config(write(tmp_path, config + change + "\n", alpaca_rows()))
    msg = str(e.value)
    assert "\n" not in msg and f": {field}: " in msg, msg


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (SFT.replace("type: alpaca", "type: sharegpt"), r"datasets\[0\]\.type: sharegpt"),
        (SFT.replace("type: alpaca", "type: chatml.intel"), r"datasets\[0\]\.type"),
        (SFT.replace("./model", "./nowhere"), "base_model"),
        (SFT.replace("learning_rate: 0.0003\n", ""), "learning_rate: required"),
        (SFT.replace("    type: alpaca\n", "    type: alpaca\n    split: test\n"), "split"),
        (SFT + "rl: dpo\n", r"datasets\[0\]\.type: 'alpaca' is not supported for rl: dpo"),
    ],
)
def test_dataset_and_model_errors_name_the_field(tmp_path, config, field) -> None:
    with pytest.raises(ConfigError, match=field):
        axolotl.read_config(write(tmp_path, config, alpaca_rows()))


def test_a_record_without_its_types_field_names_the_record(tmp_path) -> None:
    rows = [*alpaca_rows(3), {"instruction": "x", "input": ""}]
    with pytest.raises(ConfigError, match=r"data.jsonl record 4: 'output' must be a non-empty"):
        axolotl.read_config(write(tmp_path, SFT, rows))


def test_data_check_validates_a_config(tmp_path, capsys) -> None:
    from dtrain.cli import main

    path = str(write(tmp_path, SFT, alpaca_rows(6)))
    assert main(["data", "check", path, "--method", "sft"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dataset  {path}  axolotl alpaca -> 6 records (sft, prompt/completion)")
    assert main(["data", "check", path, "--method", "dpo"]) == 1
    assert "--method dpo: the config trains sft" in capsys.readouterr().err
    config = SFT.replace("type: alpaca", "type: chatml.intel") + "rl: dpo\n"
    same = [{"question": f"q{i}", "chosen": "a", "rejected": "a"} for i in range(3)]
    path = str(write(tmp_path, config, same))
    assert main(["data", "check", path, "--method", "dpo"]) == 1  # the node's validator
    assert "chosen" in capsys.readouterr().err


def test_convert_writes_the_jobs_files(tmp_path, capsys) -> None:
    path = write(tmp_path, SFT + "adapter: lora\nlora_r: 2\nlora_alpha: 4\n", alpaca_rows(4))
    assert axolotl.main([str(path), str(tmp_path / "out"), "--backend", "torchtune"]) == 0
    job = axolotl.read_config(path, "torchtune")
    data = (tmp_path / "out" / "dataset.jsonl").read_text()
    assert [json.loads(x) for x in data.splitlines()] == job.records
    assert Recipe.from_toml(tmp_path / "out" / "recipe.toml") == job.recipe
    assert "dtrain job submit --method sft --model-uri" in capsys.readouterr().out


@pytest.mark.parametrize(("backend", "method"), [("builtin", "sft"), ("torchtune", "dpo")])
def test_a_converted_config_trains_on_a_gpt2_folder(tmp_path, backend, method) -> None:
    import torch

    from dtrain_node.train.backend import TrainJob, make_backend
    from dtrain_node.train.toy_models import save

    save("gpt2", tmp_path / "gpt2")
    if method == "sft":
        rows, config = alpaca_rows(8), SFT.replace("./model", "./gpt2").replace("96", "128")
        config += "adapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_target_modules: [c_attn]\n"
    else:
        rows = [{"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": "x"} for i in range(8)]
        config = SFT.replace("./model", "./gpt2").replace(
            "type: alpaca", "type: chatml.prompt_pairs"
        )
        config += "rl: dpo\n"
    c = axolotl.convert(write_only(tmp_path, config, rows), tmp_path / "job", backend)
    job = TrainJob(0, method, c.job.model, str(c.dataset), ZERO_HASH, recipe=c.job.recipe)
    b = make_backend(job)
    assert b.n_items() == len(rows) - 1  # one record held out at 0.1
    loss = b.loss(next(b.batches(torch.arange(b.n_items()), 3, seed=0)))
    assert torch.isfinite(loss)
    if method == "dpo":
        assert loss.item() == pytest.approx(0.6931, abs=1e-3)  # log 2: policy = reference
    loss.backward()
    assert any(p.grad is not None for p in b.model.parameters() if p.requires_grad)


def write_only(folder: Path, config: str, rows: list[dict]) -> Path:
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "axolotl.yml"
    path.write_text(config)
    return path
