"""Small random-initialised Hugging Face models of real architectures, built offline: to try
a job on a model folder without downloading one (`dtrain model init`), and for the tests.

Each gets a byte-level BPE tokenizer trained by `tokenizers` on this machine's Python sources
and a chat template, saved with `save_pretrained` into a folder a job can name: a GPT-2 with
GPT-2's real 50,257-row vocabulary shape (tied embeddings, Conv1D weights) and a Llama
(untied, RMSNorm, rotary). Tiny widths keep them fast on a CPU.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]


def training_text(max_bytes: int = 300_000) -> list[str]:
    """Python sources of the standard library, in path order, up to `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for p in sorted(root.glob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        out.append(text)
        n += len(text)
        if n >= max_bytes:
            break
    return out


def bpe_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE fast tokenizer with <|endoftext|> as BOS/EOS, a pad token and the chat
    template above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save(arch: str, out: Path, seed: int = 0) -> Path:
    """A toy `arch` ("gpt2" or "llama") model folder at `out`."""
    makers = {"gpt2": save_gpt2, "llama": save_llama}
    if arch not in makers:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(makers)}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return makers[arch](Path(out), seed=seed)


def save_gpt2(out: Path, seed: int = 0, n_embd: int = 32, n_positions: int = 256) -> Path:
    """A GPT-2 with the real 50,257-row vocabulary, two layers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = bpe_tokenizer()
    cfg = GPT2Config(
        vocab_size=50257,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_llama(out: Path, seed: int = 0, hidden: int = 64, ctx: int = 256) -> Path:
    """A two-layer Llama over a 1,024-token BPE vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = bpe_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=ctx,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
