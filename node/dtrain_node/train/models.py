"""The built-in model family: a small Llama-style causal LM (Hugging Face classes) over a
byte-level tokenizer, both built offline and exported in Hugging Face format.

Every weight dimension is a multiple of 64 so DCT chunks tile it (the vocabulary is padded from
259 byte/special tokens to 320 rows). Initialisation is deterministic on the CPU for a seed, so
every node of a job starts from the same bits and the caller can put their hash on-chain.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dtrain_node.errors import ModelUnavailable

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIALS = (BOS, EOS, PAD)


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 320
    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 2
    ctx: int = 128

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "intermediate", "ctx"):
            v = getattr(self, name)
            if v <= 0 or v % 64:
                raise ValueError(f"{name} must be a positive multiple of 64, got {v}")
        if self.vocab < 256 + len(SPECIALS):
            raise ValueError(f"vocab {self.vocab} cannot hold 256 bytes + {len(SPECIALS)} specials")
        if self.layers < 1 or self.heads < 1 or self.hidden % self.heads:
            raise ValueError(
                f"need layers >= 1 and hidden % heads == 0 ({self.hidden} % {self.heads})"
            )


PRESETS = {
    "tiny": ModelConfig(),
    "small": ModelConfig(hidden=256, intermediate=512, layers=4, heads=4, ctx=128),
}


def split_uri(uri: str) -> tuple[str, int]:
    """A model URI's source and initialisation seed: "builtin:tiny?seed=7" -> ("builtin:tiny",
    7); no `?seed=` means seed 0. The seed is part of what the caller pins (the model hash is
    the hash of the weights it gives), so nothing depends on the job id."""
    source, sep, query = uri.partition("?")
    if not sep:
        return uri, 0
    key, _, value = query.partition("=")
    if key != "seed" or not value.isdigit():
        raise ModelUnavailable(f"model URI {uri!r}: the only option is ?seed=N (N >= 0)")
    return source, int(value)


def init_seed(uri: str) -> int:
    return split_uri(uri)[1]


def initial_model(uri: str):
    """The model a job of model URI `uri` starts from (epoch 0)."""
    return build(model_config(uri), init_seed(uri))


def model_config(uri: str) -> ModelConfig:
    """A config from a job's model URI: "builtin:tiny", "builtin:small" or a JSON file path,
    each optionally with "?seed=N"."""
    uri = split_uri(uri)[0]
    if uri.startswith("builtin:"):
        name = uri.removeprefix("builtin:")
        if name not in PRESETS:
            raise ModelUnavailable(f"unknown builtin model {name!r}; known: {', '.join(PRESETS)}")
        return PRESETS[name]
    path = Path(uri.removeprefix("file://"))
    try:
        return ModelConfig(**json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise ModelUnavailable(f"cannot read model config {uri!r}: {exc}") from None


# Prompts are formatted as the SFT/DPO/GRPO backends train on them (finetune.labelled):
# BOS, the prompt (system and user turns, concatenated as they are), then each assistant turn
# followed by EOS; a generation prompt adds nothing after the prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


def byte_symbols() -> list[str]:
    """The symbol the ByteLevel pre-tokenizer gives each byte value (GPT-2's bytes_to_unicode:
    printable Latin-1 bytes are themselves, the others are shifted past 255)."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, shifted = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(256 + shifted))
        shifted += b not in keep
    return out


def tokenizer(max_length: int | None = None):
    """The byte-level tokenizer, as a HF fast tokenizer: the token id of a byte is its value
    (what CPT trains on), BOS/EOS/PAD are 256/257/258, and the chat template formats prompts as
    the fine-tuning methods train on them. No token is added to plain text (`tok(text)` gives
    exactly its UTF-8 bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {sym: b for b, sym in enumerate(byte_symbols())}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        **({"model_max_length": max_length} if max_length else {}),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


_GLOBAL_RNG = threading.RLock()  # reentrant: a seeded build may run inside a seeded step


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's global RNG seeded with `seed` inside, restored after. transformers and peft
    initialise from the global RNG, and inner steps draw their dropout masks from it
    (inner.dropout_seed): builds and steps in other threads (nodes in threads, as in the
    operator tests; a replay check beside training) must not interleave their draws with ours."""
    with _GLOBAL_RNG:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            yield
        finally:
            torch.random.set_rng_state(state)


def build(cfg: ModelConfig, seed: int):
    """A LlamaForCausalLM initialised deterministically on the CPU from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.ctx,
        tie_word_embeddings=False,
        bos_token_id=256 + SPECIALS.index(BOS),
        eos_token_id=256 + SPECIALS.index(EOS),
        pad_token_id=256 + SPECIALS.index(PAD),
    )
    with seeded(seed):
        return LlamaForCausalLM(hf)


def export(model, out_dir: str | os.PathLike) -> Path:
    """config.json, model.safetensors, generation_config.json and the tokenizer's files
    (tokenizer.json, tokenizer_config.json, chat_template.jinja) that `from_pretrained` loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer(model.config.max_position_embeddings).save_pretrained(out)
    return out
