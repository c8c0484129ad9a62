"""A job's start model, from its model URI: a built-in preset or any Hugging Face causal LM.

Model URIs (docs/node.md):
  builtin:tiny | builtin:small | a model-config JSON file, each optionally "?seed=N"
  a local folder (or file://folder) in `from_pretrained` layout (config.json, weights, tokenizer)
  hf://org/name@revision, resolved through the Hugging Face cache (downloaded when online)
Fetched models (p2p:, https:) reach this module as the local folder they were unpacked into.

The pin (`modelHash`) covers everything a node trains from:
  sha256("dtrain-model/1" 0x00 meta 0x00 canonical weights hash), where
  meta = sha256(canonical config JSON, then for each tokenizer file present, in name order:
  name 0x00 sha256(file)) and the weights are the float32 state dict (checkpoint.canonical_hash).
So two folders with the same weights but another config or tokenizer pin differently, and a
node checks the pin of what it loaded before it trains.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dtrain_node.errors import ModelUnavailable
from dtrain_node.train import checkpoint, models

PIN_TAG = b"dtrain-model/1"
# Files of a folder that shape tokenisation and prompting (hashed into the pin when present).
TOKENIZER_FILES = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
)
# Config keys that describe the saving library, not the model.
VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path", "torch_dtype", "dtype")


def canonical_config(config: Mapping[str, Any]) -> bytes:
    kept = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()


def pin(meta: bytes, tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The model pin of weights `tensors` under metadata digest `meta`."""
    weights = checkpoint.canonical_hash(dict(tensors))
    return hashlib.sha256(PIN_TAG + b"\0" + meta + b"\0" + weights).digest()


class Builtin:
    """A preset of the built-in byte-level Llama family, initialised from a seed."""

    byte_level = True

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.cfg = models.model_config(uri)
        self.seed = models.init_seed(uri)
        self.ctx = self.cfg.ctx

    def fresh(self) -> torch.nn.Module:
        return models.build(self.cfg, self.seed)

    @cached_property
    def tokenizer(self) -> Any:
        return models.tokenizer(self.ctx)

    @cached_property
    def meta(self) -> bytes:
        return hashlib.sha256(canonical_config({"builtin": asdict(self.cfg)})).digest()

    def pin(self, tensors: Mapping[str, torch.Tensor]) -> bytes:
        return pin(self.meta, tensors)

    def export(self, model: torch.nn.Module, out: str | Path) -> Path:
        return models.export(model, out)


class Folder:
    """A Hugging Face causal LM saved with `save_pretrained` (weights loaded as float32: the
    shared state is float32 whatever the file stores)."""

    byte_level = False

    def __init__(self, uri: str, path: Path) -> None:
        self.uri = uri
        self.path = path
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelUnavailable(
                f"model {uri!r}: {path} has no config.json (need a from_pretrained folder)"
            )
        try:
            self.config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelUnavailable(f"model {uri!r}: config.json is unreadable: {exc}") from None
        if not isinstance(self.config, dict):
            raise ModelUnavailable(f"model {uri!r}: config.json is not a JSON object")
        ctx = self.config.get("max_position_embeddings") or self.config.get("n_positions")
        self.ctx = int(ctx) if isinstance(ctx, int) and ctx > 0 else 2048

    def fresh(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32)
        except Exception as exc:  # transformers/safetensors raise many types for a bad folder
            raise ModelUnavailable(f"model {self.uri!r} does not load: {exc}") from None
        return model.train()

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        if not any((self.path / name).is_file() for name in TOKENIZER_FILES):
            # what transformers says then is to install a tokenizer library
            raise ModelUnavailable(
                f"model {self.uri!r}: {self.path} has no tokenizer files (tokenizer.json, or "
                "tokenizer.model, or vocab.json with merges.txt): save the model's tokenizer "
                "into the folder (tokenizer.save_pretrained)"
            )
        try:
            tok = AutoTokenizer.from_pretrained(self.path)
        except Exception as exc:  # as above, for tokenizer files
            raise ModelUnavailable(
                f"model {self.uri!r}: its tokenizer does not load: {exc}"
            ) from None
        if tok.eos_token_id is None:
            raise ModelUnavailable(f"model {self.uri!r}: its tokenizer has no EOS token")
        return tok

    @cached_property
    def meta(self) -> bytes:
        h = hashlib.sha256(canonical_config(self.config))
        for name in TOKENIZER_FILES:
            f = self.path / name
            if f.is_file():
                h.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
        return h.digest()

    def pin(self, tensors: Mapping[str, torch.Tensor]) -> bytes:
        return pin(self.meta, tensors)

    def export(self, model: Any, out: str | Path) -> Path:
        """The model and its tokenizer files, loadable with `from_pretrained`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        return out


StartModel = Builtin | Folder


def hf_snapshot(uri: str) -> Path:
    """The local folder of hf://org/name@revision: from the Hugging Face cache, downloaded
    into it when the hub is reachable (HF_HUB_OFFLINE=1 keeps it to the cache)."""
    ref = uri.removeprefix("hf://")
    repo, _, revision = ref.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelUnavailable(f"model {uri!r}: expected hf://org/name@revision")
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "generation_config.json", "*.safetensors", *TOKENIZER_FILES]
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=patterns))
    except Exception as exc:  # the hub raises many types (offline, not found, gated)
        raise ModelUnavailable(f"model {uri!r} is not in the Hugging Face cache: {exc}") from None


def start_model(uri: str) -> StartModel:
    """The start model a model URI names (`ModelUnavailable` when it cannot be read)."""
    if not uri:
        raise ModelUnavailable("the job has no model URI")
    if uri.startswith("builtin:"):
        return Builtin(uri)
    if uri.startswith("hf://"):
        return Folder(uri, hf_snapshot(uri))
    path = Path(uri.removeprefix("file://"))
    if path.is_dir():
        return Folder(uri, path)
    if models.split_uri(uri)[0].endswith(".json"):
        return Builtin(uri)
    raise ModelUnavailable(
        f"model {uri!r} is neither builtin:NAME, a model folder here, nor hf://org/name@rev"
    )


def model_hash(uri: str) -> bytes:
    """The `modelHash` a job starting from model URI `uri` pins (`dtrain model hash URI`)."""
    start = start_model(uri)
    return start.pin(start.fresh().state_dict())


@contextlib.contextmanager
def torchao_quiet() -> Iterator[None]:
    """Imports inside it do not print torchao's import-time notices: with torch 2.13, torchao
    0.16 logs a warning that it skips its C++/CUDA extensions, and warns about its deprecated
    import paths. peft imports torchao whenever it is installed (the `torchtune` extra), so
    LoRA would print them on every node; nothing here uses those extensions."""
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        log.setLevel(level)


def adapt(model: Any, recipe: Any) -> Any:
    """The model a job trains: `model` itself, or with LoRA adapters (peft) when the recipe has
    `lora_rank` > 0. Only the adapters train (DeMo syncs the trainable tensors only); their
    initialisation is drawn from the recipe's seed, so every node starts from the same bits."""
    rank = getattr(recipe, "lora_rank", 0)
    if not rank:
        return model
    try:
        with torchao_quiet():
            from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ModelUnavailable(f"the recipe asks for LoRA, which needs peft: {exc}") from None
    targets = [t.strip() for t in recipe.lora_targets.split(",") if t.strip()] or None
    cfg = LoraConfig(
        r=rank,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=targets,  # None: peft's default for the architecture (attention)
        # GPT-2-style Conv1D layers store weights transposed
        fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in model.modules()),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with models.seeded(recipe.seed):
            return get_peft_model(model, cfg)
    except ValueError as exc:  # e.g. target modules not in the model
        raise ModelUnavailable(f"the recipe's LoRA settings do not fit the model: {exc}") from None


def is_adapted(model: Any) -> bool:
    return hasattr(model, "merge_and_unload")


def export_model(start: StartModel, model: Any, out: str | Path) -> Path:
    """The trained model in `from_pretrained` layout with its tokenizer; a LoRA model is
    exported merged, with its adapter (peft layout) in `out/adapter`."""
    out = Path(out)
    if not is_adapted(model):
        return start.export(model, out)
    import copy

    start.export(copy.deepcopy(model).merge_and_unload(), out)
    model.save_pretrained(out / "adapter")
    return out
