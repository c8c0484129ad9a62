"""Engines generate text from a loaded model, one token at a time, on the caller's thread.

`TransformersEngine` runs the model with transformers (a KV cache, greedy or temperature/top-p
sampling). Prompts are tokenised exactly as the job trained on them (`finetune.Coder`): a text
prompt is BOS + its tokens, chat messages go through the tokenizer's chat template with the
generation prompt. vLLM is the seam for a faster engine: `vllm_installed()` detects it, and an
engine for it implements `Engine`.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dtrain_node.errors import DatasetError
from dtrain_node.serve.text import StopText
from dtrain_node.train.finetune import Coder

Messages = list[dict[str, str]]
FALLBACK_CONTEXT = 2048


class PromptError(ValueError):
    """A prompt this model cannot take (e.g. chat messages without a chat template)."""


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Step:
    """Text settled since the last step; the last step has a `finish_reason`."""

    text: str
    tokens: int  # completion tokens generated so far
    finish_reason: str | None = None  # "stop" (EOS or a stop string) | "length"


class Engine(Protocol):
    name: str
    context: int  # the most tokens (prompt + completion) the model takes

    def prompt_ids(self, prompt: str | Messages) -> list[int]: ...

    def generate(
        self, ids: Sequence[int], sampling: Sampling, cancelled: threading.Event
    ) -> Iterator[Step]: ...


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def engine_note() -> str:
    """Which engine runs, for the startup line."""
    if vllm_installed():
        return "transformers (vLLM is installed; its engine is not wired in yet)"
    return "transformers"


def context_length(config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return FALLBACK_CONTEXT


class TransformersEngine:
    name = "transformers"

    def __init__(self, folder: Path, model: Any | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.coder = Coder(AutoTokenizer.from_pretrained(folder))
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model = model.eval()
        self.context = context_length(model.config)
        self.vocab = self.coder.vocab  # logits past the tokenizer's vocabulary are never drawn
        self.eos = {self.coder.eos, *_ids(getattr(model.generation_config, "eos_token_id", None))}

    def prompt_ids(self, prompt: str | Messages) -> list[int]:
        try:
            return self.coder.prompt(prompt)
        except DatasetError as exc:
            raise PromptError(str(exc)) from None

    @torch.inference_mode()
    def generate(
        self, ids: Sequence[int], sampling: Sampling, cancelled: threading.Event
    ) -> Iterator[Step]:
        rng = None if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        text = StopText(self.coder.decode, sampling.stop)
        inputs, past, n, finish = torch.tensor([list(ids)]), None, 0, "length"
        for _ in range(sampling.max_tokens):
            if cancelled.is_set():
                return
            out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = self._pick(out.logits[0, -1], sampling, rng)
            n += 1
            if token in self.eos:
                finish = "stop"
                break
            delta = text.push(token)
            if text.stopped:
                yield Step(delta, n, "stop")
                return
            if delta:
                yield Step(delta, n)
            inputs = torch.tensor([[token]])
        yield Step(text.flush(), n, finish)

    def _pick(self, logits: torch.Tensor, s: Sampling, rng: torch.Generator | None) -> int:
        logits = logits.float()[: self.vocab]
        if s.temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits / s.temperature, -1)
        if s.top_p < 1:
            sorted_p, order = probs.sort(descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p >= s.top_p  # the nucleus keeps >= 1 token
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p.masked_fill(outside, 0))
        return int(torch.multinomial(probs, 1, generator=rng))


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []
