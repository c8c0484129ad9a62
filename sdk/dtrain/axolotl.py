"""Axolotl YAML configs as dtrain jobs: the subset of an axolotl config that maps onto a job.

An axolotl user already has a YAML file naming the base model, the datasets with their `type`
(the record format) and the hyper-parameters. `read_config` turns it into what a dtrain job
takes: the method (`sft`, `dpo`, or `cpt` for `type: completion`), the start model (a local
Hugging Face folder), the records in this project's JSONL formats (docs/methods.md "Datasets")
and a `Recipe`. axolotl itself is not imported (it does not install beside the pinned node);
the job then trains through the recipe's backend (`builtin` or `torchtune`). A field whose
value cannot be honoured is a one-line `ConfigError` naming it; fields that only steer logging,
saving or kernels are ignored; `num_epochs`/`max_steps` are the job's (`job submit --epochs`,
`--steps`). `dtrain data check CONFIG.yml --method M` validates a config (`check_config`);
`python -m dtrain.axolotl CONFIG OUT_DIR` writes its dataset.jsonl and recipe.toml.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import pins
from .errors import ConfigError
from .recipe import BACKENDS, Recipe

SUFFIXES = (".yml", ".yaml")
# Fields that change nothing a node computes: where and how often axolotl logs, saves and
# evaluates, and attention kernels / memory savers that give the same loss.
IGNORED = frozenset(
    [
        "output_dir",
        "dataset_prepared_path",
        "logging_steps",
        "save_steps",
        "saves_per_epoch",
        "save_strategy",
        "save_total_limit",
        "save_safetensors",
        "eval_steps",
        "evals_per_epoch",
        "eval_strategy",
        "eval_batch_size",
        "eval_sample_packing",
        "wandb_project",
        "wandb_entity",
        "wandb_name",
        "wandb_watch",
        "wandb_log_model",
        "wandb_run_id",
        "wandb_mode",
        "flash_attention",
        "sdp_attention",
        "xformers_attention",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "strict",
        "debug",
        "pad_to_sequence_len",
        "tf32",
        "local_rank",
        "hub_model_id",
    ]
)
AT_SUBMIT = frozenset({"num_epochs", "max_steps"})  # the job's epochs and steps (job submit)
# field -> (values that can be honoured, why others cannot)
FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    "model_type": (("AutoModelForCausalLM",), "the node loads every model as a causal LM"),
    "tokenizer_type": (("AutoTokenizer",), "the node loads the model folder's AutoTokenizer"),
    "chat_template": (
        ("tokenizer_default",),
        "chat records are rendered with the model folder's own chat template",
    ),
    "optimizer": (
        ("adamw_torch", "adamw_torch_fused"),
        "the inner optimizer is always the node's AdamW",
    ),
    "lr_scheduler": (
        ("constant", "linear", "cosine"),
        "the recipe's schedules are constant, linear and cosine",
    ),
    "warmup_ratio": (
        (0,),
        "give warmup_steps instead: the job's length is set at submit (--epochs x --steps)",
    ),
    "train_on_inputs": ((False,), "the prompt is always masked out of the SFT loss"),
    "sample_packing": ((False,), "every record is its own padded row"),
    "load_in_8bit": ((False,), "quantized loading needs bitsandbytes and CUDA"),
    "load_in_4bit": ((False,), "quantized loading needs bitsandbytes and CUDA"),
    "fp16": ((False,), "half precision is the recipe's bf16 (on CUDA) only"),
    "lora_target_linear": ((False,), "name the modules in lora_target_modules"),
    "rl": ((None, "dpo"), "dtrain's preference method is DPO (sigmoid loss)"),
    "dpo_loss_type": ((["sigmoid"], "sigmoid"), "dtrain's DPO is the sigmoid loss"),
    "dpo_label_smoothing": ((0,), "dtrain's DPO has no label smoothing"),
}
# field -> recipe field, taken as is (the Recipe checks its range)
DIRECT = {
    "learning_rate": "inner_lr",
    "sequence_len": "seq_len",
    "adam_beta1": "inner_beta1",
    "adam_beta2": "inner_beta2",
    "weight_decay": "inner_weight_decay",
    "rl_beta": "dpo_beta",
    "seed": "seed",
    "lora_dropout": "lora_dropout",
    "lr_scheduler": "lr_schedule",
    "warmup_steps": "warmup_steps",
    "cosine_min_lr_ratio": "min_lr_ratio",
    "gradient_accumulation_steps": "grad_accum",
}
# axolotl's (Hugging Face TrainingArguments') values of fields a config leaves out
AXOLOTL_DEFAULTS = {
    "inner_beta1": 0.9,
    "inner_beta2": 0.999,
    "inner_weight_decay": 0.0,
    "lr_schedule": "cosine",
    "max_grad_norm": 1.0,
}
DEFAULT_SEQUENCE_LEN = 512  # axolotl's sequence_len default
OWN = frozenset(
    {"base_model", "datasets", "micro_batch_size", "adapter", "max_grad_norm"}
    | {"lora_r", "lora_alpha", "lora_target_modules", "bf16", "val_set_size"}
)
SFT_TYPES = ("alpaca", "chat_template", "input_output", "completion")
DPO_TYPES = ("chat_template.default", "chatml.prompt_pairs", "chatml.intel", "chatml.icr")
DATASET_KEYS = frozenset(
    {"path", "type", "ds_type", "split", "field", "field_messages", "message_property_mappings"}
    | {"roles", "roles_to_train", "train_on_eos", "field_chosen", "field_rejected"}
)
ALPACA_SYSTEM = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
)
ALPACA_SYSTEM_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n"
)
DEFAULT_ROLES = {
    "user": ["human", "user"],
    "assistant": ["gpt", "assistant"],
    "system": ["system"],
}


@dataclass(frozen=True)
class AxolotlJob:
    """What an axolotl config becomes: method, start model, records and recipe."""

    method: str  # "sft", "dpo" or "cpt"
    model: str  # the base_model folder, absolute
    records: list[dict[str, Any]]  # this project's JSONL records (CPT: {"text": ...})
    recipe: Recipe
    types: tuple[str, ...]  # each dataset's type, in order
    notes: tuple[str, ...] = field(default=())  # what the summary says beyond the records

    def jsonl(self) -> str:
        return "".join(
            json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in self.records
        )


class _Where:
    """Names the config file in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, name: str, what: str) -> ConfigError:
        return ConfigError(f"axolotl config {self.path}: {name}: {what}")


def is_config(path: str) -> bool:
    """Whether `path` names an axolotl YAML config (by its suffix)."""
    return str(path).lower().endswith(SUFFIXES)


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as exc:
        raise ConfigError("reading an axolotl config needs PyYAML: pip install pyyaml") from exc
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"axolotl config {path} cannot be read: {exc.strerror}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        one_line = " ".join(str(exc).split())
        raise ConfigError(f"axolotl config {path} is not valid YAML: {one_line}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"axolotl config {path} must be a YAML mapping of fields")
    return data


def read_config(path: str | Path, backend: str = "builtin") -> AxolotlJob:
    """The job an axolotl config describes; `backend` is the recipe's training backend."""
    p = Path(str(path).removeprefix("file://")).resolve()
    cfg, where = load_yaml(p), _Where(p)
    known = IGNORED | AT_SUBMIT | FIXED.keys() | DIRECT.keys() | OWN
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise where.error(unknown[0], "is not a field dtrain can honour (no mapping to a job)")
    for name, (allowed, why) in FIXED.items():
        if name in cfg and cfg[name] not in allowed:
            raise where.error(name, f"{cfg[name]!r} cannot be honoured: {why}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    method, types, records = read_datasets(cfg, where)
    recipe = make_recipe(cfg, where, backend)
    notes = tuple(notes_for(cfg, recipe))
    model = base_model(cfg, where)
    return AxolotlJob(method, model, records, recipe, types, notes)


def notes_for(cfg: dict[str, Any], recipe: Recipe) -> list[str]:
    """What the job does differently from axolotl for fields the config leaves out or that
    the job sets elsewhere (a field set to a value that cannot be honoured is an error)."""
    notes = [
        f"{k} is the job's (job submit --epochs/--steps)" for k in sorted(AT_SUBMIT & set(cfg))
    ]
    if "val_set_size" not in cfg:
        notes.append(f"held out {recipe.heldout_fraction} (no val_set_size)")
    if "lr_scheduler" not in cfg:
        notes.append("cosine learning rate over the job's steps (axolotl's default scheduler)")
    if "max_grad_norm" not in cfg:
        notes.append("gradients clipped to norm 1.0 (axolotl's default max_grad_norm)")
    return notes


def base_model(cfg: dict[str, Any], where: _Where) -> str:
    """base_model as an absolute folder path (relative to the config's folder)."""
    name = cfg.get("base_model")
    if not isinstance(name, str) or not name:
        raise where.error("base_model", "required: a local Hugging Face model folder")
    folder = (where.path.parent / name).resolve()
    if not (folder / "config.json").is_file():
        raise where.error(
            "base_model",
            f"{name!r} is not a local Hugging Face model folder (no {folder / 'config.json'}); "
            "download it first (a hub id is not fetched here)",
        )
    return str(folder)


def make_recipe(cfg: dict[str, Any], where: _Where, backend: str) -> Recipe:
    """The recipe of a config's hyper-parameters, axolotl's defaults where a field is left out."""
    if "learning_rate" not in cfg:
        raise where.error("learning_rate", "required")
    out: dict[str, Any] = {"backend": backend, **AXOLOTL_DEFAULTS}
    out["seq_len"] = DEFAULT_SEQUENCE_LEN
    out.update({DIRECT[k]: _number(v) for k, v in cfg.items() if k in DIRECT})
    micro, accum = cfg.get("micro_batch_size", 1), cfg.get("gradient_accumulation_steps", 1)
    for name, v in (("micro_batch_size", micro), ("gradient_accumulation_steps", accum)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise where.error(name, f"must be an integer >= 1, got {v!r}")
    out["batch_size"] = micro
    if "max_grad_norm" in cfg:  # null or 0: no clipping, as in Hugging Face's Trainer
        out["max_grad_norm"] = _number(cfg["max_grad_norm"]) or 0.0
    if "bf16" in cfg:
        if cfg["bf16"] not in (True, False, "auto"):
            raise where.error("bf16", f"true, false or auto, got {cfg['bf16']!r}")
        out["bf16"] = cfg["bf16"] in (True, "auto")
    if "val_set_size" in cfg:
        v = _number(cfg["val_set_size"])
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
            raise where.error(
                "val_set_size", f"a fraction in (0, 1) (a job holds out records), got {v!r}"
            )
        out["heldout_fraction"] = v
    out.update(lora_fields(cfg, where))
    try:
        return Recipe(**out)  # a new recipe: today's defaults for what the config leaves out
    except ConfigError as exc:  # name the axolotl field behind the recipe's
        back = {v: k for k, v in DIRECT.items()} | {"batch_size": "micro_batch_size"}
        back |= {"max_grad_norm": "max_grad_norm"}
        back |= {"lora_rank": "lora_r", "lora_targets": "lora_target_modules"}
        msg = str(exc)
        name = next((a for r, a in back.items() if f"'{r}'" in msg), "config")
        raise where.error(name, msg) from exc


def _number(value: Any) -> Any:
    """A YAML string such as `2e-5` (PyYAML reads an exponent without a dot as a string; axolotl's
    schema coerces it) as a float; anything else as is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def lora_fields(cfg: dict[str, Any], where: _Where) -> dict[str, Any]:
    """adapter: lora -> the recipe's LoRA fields; no adapter: full fine-tuning."""
    adapter = cfg.get("adapter")
    lora_keys = [k for k in ("lora_r", "lora_alpha", "lora_target_modules") if k in cfg]
    if adapter in (None, ""):
        if lora_keys:
            raise where.error(lora_keys[0], "set without adapter: lora (full fine-tuning)")
        return {}
    if adapter != "lora":
        raise where.error(
            "adapter",
            f"{adapter!r} cannot be honoured: lora or none (qlora needs bitsandbytes and CUDA)",
        )
    for k in ("lora_r", "lora_alpha"):
        if k not in cfg:
            raise where.error(k, "required with adapter: lora")
    out = {"lora_rank": cfg["lora_r"], "lora_alpha": _number(cfg["lora_alpha"])}
    targets = cfg.get("lora_target_modules")
    if targets is not None:
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise where.error("lora_target_modules", "a list of module names")
        out["lora_targets"] = ",".join(targets)
    if out["lora_rank"] == 0:
        raise where.error("lora_r", "must be >= 1 with adapter: lora")
    return out


def read_datasets(cfg: dict[str, Any], where: _Where) -> tuple[str, tuple[str, ...], list]:
    """(method, each dataset's type, the records of every dataset in order)."""
    sets = cfg.get("datasets")
    if not isinstance(sets, list) or not sets:
        raise where.error("datasets", "required: a list of {path, type} entries")
    rl = cfg.get("rl")
    methods, types, records = set(), [], []
    for i, ds in enumerate(sets):
        name = f"datasets[{i}]"
        if not isinstance(ds, dict):
            raise where.error(name, "must be a mapping with path and type")
        extra = sorted(set(ds) - DATASET_KEYS)
        if extra:
            raise where.error(f"{name}.{extra[0]}", "is not a dataset field dtrain can honour")
        kind = ds.get("type")
        if not isinstance(kind, str):
            raise where.error(f"{name}.type", f"one of {', '.join(SFT_TYPES + DPO_TYPES)}")
        rows = read_rows(ds, where, name)
        method, recs = convert_rows(kind, rows, ds, where.error, (name, rl))
        methods.add(method)
        types.append(kind)
        records.extend(recs)
    if len(methods) > 1:
        raise where.error("datasets", f"mix methods {', '.join(sorted(methods))}: one per job")
    return methods.pop(), tuple(types), records


def read_rows(ds: dict[str, Any], where: _Where, name: str) -> list[tuple[int, dict[str, Any]]]:
    """A dataset entry's records, numbered from 1: a local JSON Lines file or a JSON array."""
    if ds.get("ds_type", "json") != "json" or ds.get("split", "train") != "train":
        key = "ds_type" if ds.get("ds_type", "json") != "json" else "split"
        raise where.error(
            f"{name}.{key}", f"{ds[key]!r}: a local JSON/JSONL file (ds_type json, split train)"
        )
    path = ds.get("path")
    if not isinstance(path, str) or not path:
        raise where.error(f"{name}.path", "required: a local .json or .jsonl file")
    file = (where.path.parent / path).resolve()
    if not file.is_file():
        raise where.error(
            f"{name}.path", f"{path!r} is not a file here (hub datasets are not fetched)"
        )
    try:
        text = file.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            items = list(enumerate(json.loads(text), 1))
        else:
            items = [(n, json.loads(s)) for n, s in enumerate(text.splitlines(), 1) if s.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise where.error(
            f"{name}.path", f"{file} is not JSON Lines or a JSON array: {exc}"
        ) from exc
    bad = next((n for n, r in items if not isinstance(r, dict)), None)
    if bad is not None:
        raise where.error(f"{name}.path", f"{file} record {bad} is not a JSON object")
    return items


def convert_rows(
    kind: str, rows: list, ds: dict[str, Any], error: Any, at: tuple
) -> tuple[str, list]:
    """(method, records) of one dataset entry of type `kind`; `at` is (its name, the rl)."""
    name, rl = at
    if kind == "sharegpt":
        raise error(
            f"{name}.type",
            "sharegpt was removed from axolotl: use type: chat_template "
            "with field_messages: conversations and message_property_mappings {role: from, "
            "content: value}",
        )
    allowed = DPO_TYPES if rl == "dpo" else SFT_TYPES
    if kind not in allowed:
        what = "rl: dpo" if rl == "dpo" else "SFT (no rl)"
        raise error(
            f"{name}.type", f"{kind!r} is not supported for {what}; one of {', '.join(allowed)}"
        )
    convert = CONVERTERS[kind]
    method = "dpo" if rl == "dpo" else "cpt" if kind == "completion" else "sft"
    records = []
    for n, row in rows:
        try:
            records.extend(convert(row, ds))
        except _Bad as exc:
            raise error(f"{name}.path", f"{ds['path']} record {n}: {exc}") from None
    return method, records


class _Bad(Exception):
    """A record that does not have its type's fields."""


def _field(row: dict[str, Any], key: str, optional: bool = False) -> str:
    value = row.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str) or (not value and not optional):
        raise _Bad(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def alpaca(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
    """axolotl's alpaca prompt (AlpacaPrompter, instruct style), the output as completion."""
    instruction, extra = _field(row, "instruction"), _field(row, "input", optional=True)
    if extra:
        prompt = f"{ALPACA_SYSTEM}### Instruction:\n{instruction}\n\n### Input:\n{extra}\n\n"
    else:
        prompt = f"{ALPACA_SYSTEM_NO_INPUT}### Instruction:\n{instruction}\n\n"
    return [{"prompt": prompt + "### Response:\n", "completion": _field(row, "output")}]


def completion(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole text trained on (CPT document)."""
    return [{"text": _field(row, ds.get("field") or "text")}]


def input_output(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
    """Template-free segments: the untrained ones are the prompt, the trained ones after them
    the completion."""
    segs = row.get("segments")
    if not isinstance(segs, list) or not segs:
        raise _Bad("'segments' must be a list of {label, text}")
    labels = [s.get("label") if isinstance(s, dict) else None for s in segs]
    texts = [_field(s, "text") for s in segs]
    if any(not isinstance(x, bool) for x in labels):
        raise _Bad("every segment needs label true or false")
    first = labels.index(True) if True in labels else 0
    if first == 0 or not all(labels[first:]):
        raise _Bad(
            "segments must be untrained (label false) first, then trained (label true): dtrain "
            "trains one completion after its prompt"
        )
    return [{"prompt": "".join(texts[:first]), "completion": "".join(texts[first:])}]


def _messages(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, str]]:
    """A record's conversation as role/content messages, through the entry's mappings."""
    key = ds.get("field_messages") or "messages"
    given = ds.get("message_property_mappings") or {}
    if not isinstance(given, dict):
        raise _Bad(
            "message_property_mappings must be a mapping such as {role: from, content: value}"
        )
    maps = {"role": "role", "content": "content", **given}
    roles = {
        alias: role
        for role, aliases in (ds.get("roles") or DEFAULT_ROLES).items()
        for alias in aliases
    }
    msgs = row.get(key)
    if not isinstance(msgs, list) or not msgs:
        raise _Bad(f"{key!r} must be a list of messages")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or roles.get(m.get(maps["role"])) not in (
            "system",
            "user",
            "assistant",
        ):
            got = m.get(maps["role"]) if isinstance(m, dict) else m
            raise _Bad(f"message role {got!r} is not one of {', '.join(sorted(roles))}")
        out.append({"role": roles[m[maps["role"]]], "content": _field(m, maps["content"])})
    return out


def chat_template(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per assistant turn, the conversation before it as its prompt (axolotl trains
    every assistant turn of a conversation; a dtrain record trains its last message)."""
    if ds.get("roles_to_train", ["assistant"]) != ["assistant"]:
        raise _Bad("roles_to_train: only [assistant] (the completion) is trained")
    if ds.get("train_on_eos", "turn") != "turn":
        raise _Bad("train_on_eos: only turn (each trained turn ends with EOS)")
    msgs = _messages(row, ds)
    out = []
    for j, m in enumerate(msgs):
        if m["role"] == "assistant":
            if not any(x["role"] == "user" for x in msgs[:j]):
                raise _Bad("an assistant message before any user message")
            out.append({"messages": msgs[: j + 1]})
    if not out:
        raise _Bad("no assistant message to train on")
    return out


def _chatml(key: str) -> Any:
    """axolotl's dpo chatml.<type>: the prompt in ChatML, chosen/rejected closed by <|im_end|>."""

    def convert(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
        system = _field(row, "system", optional=True)
        head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        prompt = f"{head}<|im_start|>user\n{_field(row, key)}<|im_end|>\n<|im_start|>assistant\n"
        pair = {k: _field(row, k) + "<|im_end|>" for k in ("chosen", "rejected")}
        return [{"prompt": prompt, **pair}]

    return convert


def dpo_chat_template(row: dict[str, Any], ds: dict[str, Any]) -> list[dict[str, Any]]:
    """axolotl's dpo chat_template.default: the conversation, then chosen/rejected messages."""
    prompt = _messages(row, ds)
    if prompt[-1]["role"] != "user":
        raise _Bad("the conversation before chosen/rejected must end with a user message")
    maps = {"content": "content", **(ds.get("message_property_mappings") or {})}
    out: dict[str, Any] = {"prompt": prompt}
    for k in ("chosen", "rejected"):
        msg = row.get(ds.get(f"field_{k}") or k)
        if not isinstance(msg, dict):
            raise _Bad(f"{k!r} must be a message {{role, content}}")
        out[k] = _field(msg, maps["content"])
    return [out]


CONVERTERS = {
    "alpaca": alpaca,
    "completion": completion,
    "input_output": input_output,
    "chat_template": chat_template,
    "chat_template.default": dpo_chat_template,
    "chatml.prompt_pairs": _chatml("prompt"),
    "chatml.intel": _chatml("question"),
    "chatml.icr": _chatml("input"),
}


def check_config(path: str, method: str, recipe: Recipe | None = None) -> str:
    """`dtrain data check CONFIG.yml --method M`: reads the config, converts its datasets and
    validates them as a job's dataset; returns the summary. The config carries its own recipe."""
    if recipe is not None:
        raise ConfigError(f"axolotl config {path}: --recipe: the config's fields are the recipe")
    job = read_config(path)
    if job.method != method:
        raise ConfigError(
            f"axolotl config {path}: --method {method}: the config trains {job.method}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "dataset.jsonl"
        data.write_text(job.jsonl(), encoding="utf-8")
        summary = pins.check_dataset(str(data), job.method, job.recipe)
    notes = "; ".join(job.notes)
    return (
        f"axolotl {', '.join(dict.fromkeys(job.types))} -> {summary}; model {job.model}; "
        f"recipe 0x{job.recipe.hash().hex()[:16]}..." + (f"; {notes}" if notes else "")
    )


@dataclass(frozen=True)
class Converted:
    """The files a job of an axolotl config takes."""

    job: AxolotlJob
    dataset: Path
    recipe: Path

    def submit_args(self) -> list[str]:
        """`dtrain job submit` options for these files."""
        return [
            "--method",
            self.job.method,
            "--model-uri",
            self.job.model,
            "--dataset-uri",
            str(self.dataset),
            "--recipe",
            str(self.recipe),
        ]


def convert(path: str | Path, out_dir: str | Path, backend: str = "builtin") -> Converted:
    """Writes the config's records to OUT/dataset.jsonl and its recipe to OUT/recipe.toml."""
    job = read_config(path, backend)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data, recipe = out / "dataset.jsonl", out / "recipe.toml"
    data.write_text(job.jsonl(), encoding="utf-8")
    recipe.write_text(job.recipe.to_toml(), encoding="utf-8")
    return Converted(job, data, recipe)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dtrain.axolotl",
        description="Write an axolotl config's dataset.jsonl and recipe.toml for a dtrain job.",
    )
    ap.add_argument("config", help="the axolotl YAML config")
    ap.add_argument("out", help="folder for dataset.jsonl and recipe.toml")
    ap.add_argument("--backend", default="builtin", choices=BACKENDS, help="the recipe's backend")
    a = ap.parse_args(argv)
    try:
        c = convert(a.config, a.out, a.backend)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(c.job.records)} records ({c.job.method}) -> {c.dataset}\nrecipe -> {c.recipe}")
    print("dtrain job submit " + " ".join(c.submit_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
