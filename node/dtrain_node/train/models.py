"""The built-in model family: a small Llama-style causal LM (Hugging Face classes) over a
byte-level tokenizer, both built offline and exported in Hugging Face format.

Every weight dimension is a multiple of 64 so DCT chunks tile it (the vocabulary is padded from
259 byte/special tokens to 320 rows). Initialisation is deterministic on the CPU for a seed, so
every node of a job starts from the same bits and the caller can put their hash on-chain.
"""

from __future__ import annotations

import json
import os
import threading
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


def model_config(uri: str) -> ModelConfig:
    """A config from a job's model URI: "builtin:tiny", "builtin:small" or a JSON file path."""
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


def tokenizer():
    """Byte-level tokenizer (256 byte tokens, no merges) + BOS/EOS/PAD, as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


_GLOBAL_RNG = threading.Lock()


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
    # transformers initialises from torch's global RNG: builds in other threads (nodes in threads,
    # as in the operator tests) must not interleave their draws with ours.
    with _GLOBAL_RNG:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            model = LlamaForCausalLM(hf)
        finally:
            torch.random.set_rng_state(state)
    return model


def export(model, out_dir: str | os.PathLike) -> Path:
    """config.json, model.safetensors and tokenizer files that `from_pretrained` loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer().save_pretrained(out)
    return out
