"""Built-in SFT, DPO and GRPO backends over a job's start model and its tokenizer (start.py: the
built-in byte-level Llama or any Hugging Face causal LM; see docs/methods.md).

They implement the same protocol as backend.CausalLMBackend. Every batch is a tuple whose first
element is a token tensor (the runner counts tokens with batch[0].numel()). About the last 10% of
a dataset's records, in whole prompt groups (at most one group over), are the held-out split every
node evaluates on, never trained on (tasks.split).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dtrain_node.errors import DatasetError
from dtrain_node.train import losses, models, rewards, shard, tasks
from dtrain_node.train.devices import to_device
from dtrain_node.train.job import context
from dtrain_node.train.start import adapt, export_model, start_model

EVAL_RECORDS = 128  # cap on held-out records evaluated (keeps evaluate() cheap on big sets)
Prompt = str | list[dict[str, str]]  # plain text, or chat messages ({"role", "content"})


@dataclass(frozen=True)
class MethodOptions:
    """Method hyper-parameters (defaults are the usual published ones, scaled to tiny tasks)."""

    dpo_beta: float = 0.1
    grpo_group: int = 8  # G samples per prompt
    grpo_clip: float = 0.2
    grpo_kl: float = 0.04
    grpo_temperature: float = 1.0
    grpo_iterations: int = 1  # gradient steps per sampled rollout (mu); > 1 makes the clip bite
    heldout_fraction: float = 0.1
    reward: str = "exact"  # GRPO reward function (rewards.py)
    reward_pattern: str = ""  # the `format` reward's regex
    grpo_completions: str = "alphabet"  # or "free" (FreeGRPOBackend)
    grpo_max_new_tokens: int = 16  # free completions' length cap

    @classmethod
    def for_job(cls, job: Any) -> MethodOptions:
        """The job's recipe's method settings (`TrainJob.recipe`), the defaults without one."""
        r = getattr(job, "recipe", None)
        if r is None:
            return cls()
        return cls(
            dpo_beta=r.dpo_beta,
            grpo_group=r.grpo_group,
            grpo_clip=r.grpo_clip,
            grpo_kl=r.grpo_kl,
            grpo_temperature=r.grpo_temperature,
            grpo_iterations=r.grpo_iterations,
            heldout_fraction=r.heldout_fraction,
            reward=r.reward,
            reward_pattern=r.reward_pattern,
            grpo_completions=r.grpo_completions,
            grpo_max_new_tokens=r.grpo_max_new_tokens,
        )

    def __post_init__(self) -> None:
        if self.dpo_beta <= 0:
            raise ValueError(f"dpo_beta must be > 0, got {self.dpo_beta}")
        if self.grpo_group < 2:
            raise ValueError(
                f"grpo_group must be >= 2 (advantages are group-relative), got {self.grpo_group}"
            )
        if not 0 < self.grpo_clip < 1 or self.grpo_kl < 0 or self.grpo_temperature <= 0:
            raise ValueError("need 0 < grpo_clip < 1, grpo_kl >= 0, grpo_temperature > 0")
        if self.grpo_iterations < 1:
            raise ValueError(f"grpo_iterations must be >= 1, got {self.grpo_iterations}")
        if not 0 < self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.grpo_completions not in ("alphabet", "free") or self.grpo_max_new_tokens < 1:
            raise ValueError("need grpo_completions in (alphabet, free), grpo_max_new_tokens >= 1")


class Coder:
    """Token ids of prompts and completions through a model's tokenizer, as every method trains
    on them: a text prompt is BOS (when the tokenizer has one) + its tokens; a chat prompt is the
    tokenizer's chat template with the generation prompt; a completion is its tokens + EOS."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.bos: int | None = tok.bos_token_id
        self.eos: int = tok.eos_token_id
        self.pad: int = tok.pad_token_id if tok.pad_token_id is not None else self.eos
        self.vocab = len(tok)

    def encode(self, text: str) -> list[int]:
        """Without the tokenizer's too-long warning: records are cut to `seq_len` after."""
        return self.tok.encode(text, add_special_tokens=False, verbose=False)

    def prompt(self, p: Prompt) -> list[int]:
        if isinstance(p, str):
            return ([] if self.bos is None else [self.bos]) + self.encode(p)
        if not getattr(self.tok, "chat_template", None):
            raise DatasetError(
                "chat-format records need a model with a chat template; this model has none "
                "(use prompt/completion text records)"
            )
        text = self.tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        return self.encode(text)

    def completion(self, text: str) -> list[int]:
        return [*self.encode(text), self.eos]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([i for i in ids if i < self.vocab], skip_special_tokens=True)


BOS, EOS, PAD = 256, 257, 258  # the built-in byte tokenizer's special ids (models.SPECIALS)


@functools.lru_cache(maxsize=1)
def byte_coder() -> Coder:
    """The coder of the built-in models' byte-level tokenizer."""
    return Coder(models.tokenizer())


def encode(text: str) -> list[int]:
    """Byte-level ids of `text` (the built-in models' tokenizer)."""
    return byte_coder().encode(text)


def decode(ids: Sequence[int]) -> str:
    return byte_coder().decode(ids)


def right_pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) padded on the right with `pad`."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def left_pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) padded on the left, so every prompt ends at the last column."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, t - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, t - len(s) :] = 1
    return ids, mask


def forward(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with positions counted from each row's first real token (left padding safe)."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def labelled(coder: Coder, prompt: Prompt, completion: str) -> tuple[list[int], int]:
    """Prompt + completion + EOS ids, and the number of leading tokens that carry no loss."""
    p = coder.prompt(prompt)
    return [*p, *coder.completion(completion)], len(p)


def collate_labelled(coder: Coder, pairs: Sequence[tuple[Prompt, str]]) -> tuple[torch.Tensor, ...]:
    """(ids, labels, attention mask) with the prompt and padding masked out of the labels."""
    seqs = [labelled(coder, p, c) for p, c in pairs]
    ids, mask = right_pad([s for s, _ in seqs], coder.pad)
    plen = torch.tensor([n for _, n in seqs])
    labels = losses.mask_prompt(ids, plen, mask.sum(-1))
    return ids, labels, mask


@torch.no_grad()
def greedy(
    model: torch.nn.Module,
    coder: Coder,
    prompts: Sequence[Prompt],
    max_new: int,
    vocab: int | None = None,
) -> list[str]:
    """Greedy completions (stop at EOS) without a KV cache: answers are short. The argmax is
    over the model's whole output, or over its first `vocab` rows when given (free GRPO: the
    tokenizer's entries, as its sampler)."""
    dev = next(model.parameters()).device
    ids, mask = to_device(left_pad([coder.prompt(p) for p in prompts], coder.pad), dev)
    eos, pad = coder.eos, coder.pad
    out = torch.full((len(prompts), 0), pad, dtype=torch.long, device=dev)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=dev)
    for _ in range(max_new):
        nxt = forward(model, ids, mask)[:, -1, :vocab].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        done |= nxt == eos
        out = torch.cat([out, nxt[:, None]], 1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, (~done | (nxt == eos)).long()[:, None]], 1)
        if done.all():
            break
    rows = [r.tolist() for r in out]
    return [coder.decode(r[: r.index(eos)] if eos in r else r) for r in rows]


class RecordBackend:
    """Shared parts: model from the job, validated records, shuffled batches, export."""

    name = "builtin"
    method = ""
    repeats = 1  # times each batch is yielded in a row (GRPO reuses a rollout mu times)

    def __init__(self, job: Any, opts: MethodOptions | None = None) -> None:
        self.job, self.opts = job, opts or MethodOptions.for_job(job)
        self.start = start_model(job.model_uri)
        self.ctx = context(job, self.start)
        self.coder = Coder(self.start.tokenizer)
        # Validate the whole dataset before building anything: bad data fails fast and up front.
        recs = tasks.load_records(
            job.dataset_uri, self.method, job.dataset_hash, reward=self.opts.reward
        )
        self._check_lengths(recs)
        self.train, self.heldout = tasks.split(recs, self.opts.heldout_fraction)
        self.eval_recs = self.heldout[:EVAL_RECORDS]
        base = self.start.fresh()
        self.start_pin = self.start.pin(base.state_dict())
        self.model = adapt(base, getattr(job, "recipe", None))

    def _check_lengths(self, recs: list[dict[str, Any]]) -> None:
        """Every record's prompt + longest completion fits a training sequence."""
        for i, r in enumerate(recs, 1):
            completions = [r[k] for k in ("completion", "chosen", "rejected", "answer") if k in r]
            n = len(self.coder.prompt(r["prompt"])) + max(
                len(self.coder.completion(c)) for c in completions
            )
            if n > self.ctx:
                raise DatasetError(
                    f"dataset {self.job.dataset_uri} record {i}: {n} tokens, longer than the "
                    f"sequence length {self.ctx} (shorten it or raise the recipe's seq_len)"
                )

    device = torch.device("cpu")

    def to(self, device: torch.device) -> None:
        """Train on `device` (the model, and the frozen reference when there is one)."""
        self.model.to(device)
        if getattr(self, "ref", None) is not None:
            self.ref.to(device)
        if getattr(self, "alphabet_ids", None) is not None:
            self.alphabet_ids = self.alphabet_ids.to(device)
        self.device = device

    def n_items(self) -> int:
        return len(self.train)

    def batches(self, indices: torch.Tensor, batch_size: int, seed: int) -> Iterator[Any]:
        """Endless batches over this node's shard `indices`, reshuffled each pass; each batch
        carries its own sampling seed, drawn from `seed` mixed with the shard (shard.py), so
        nodes given the same `seed` still sample independently."""
        for idx, batch_seed in shard.batch_indices(indices, batch_size, seed):
            batch = self.collate([self.train[int(j)] for j in idx], batch_seed)
            for _ in range(self.repeats):
                yield batch

    def collate(self, recs: list[dict[str, str]], seed: int) -> tuple[Any, ...]:
        raise NotImplementedError

    def export(self, out_dir: str | Path) -> Path:
        return export_model(self.start, self.model, out_dir)

    @contextlib.contextmanager
    def _dropout_off(self) -> Iterator[None]:
        """The policy in eval mode (no dropout) with gradients still on, restoring the training
        flag afterwards. DPO and GRPO take every policy log-prob this way (the loss's and
        GRPO's pi_old alike), so the policy is one deterministic function: the GRPO ratio is
        exactly 1 at the first inner step and DPO starts at log 2, as TRL with
        `disable_dropout=True` (its DPO default; for GRPO TRL advises it with a reference
        model, docs/methods.md "Dropout"). Eval mode rather than zeroing the nn.Dropout modules:
        it also turns off dropout a model keeps as a float (Llama's `attention_dropout`)."""
        was = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was)

    @contextlib.contextmanager
    def _eval(self) -> Iterator[None]:
        """Eval mode and no grad, restoring the training flag afterwards."""
        with self._dropout_off(), torch.no_grad():
            yield


class SFTBackend(RecordBackend):
    """Supervised fine-tuning: cross-entropy on the response tokens of prompt/response pairs."""

    method = "sft"

    def collate(self, recs: list[dict[str, Any]], seed: int) -> tuple[torch.Tensor, ...]:
        return collate_labelled(self.coder, [(r["prompt"], r["completion"]) for r in recs])

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        ids, labels, mask = to_device(batch, self.device)
        return losses.sft_loss(self.model(input_ids=ids, attention_mask=mask).logits, labels)

    def evaluate(self) -> dict[str, float]:
        with self._eval():
            loss = float(self.loss(self.collate(self.eval_recs, 0)))
            max_new = max(len(self.coder.completion(r["completion"])) for r in self.eval_recs)
            got = greedy(self.model, self.coder, [r["prompt"] for r in self.eval_recs], max_new)
        acc = sum(g == r["completion"] for g, r in zip(got, self.eval_recs, strict=True))
        return {"heldout_loss": loss, "accuracy": acc / len(self.eval_recs)}


class DPOBackend(RecordBackend):
    """DPO against a frozen reference: the job's base model (seeded init), never trained."""

    method = "dpo"

    def __init__(self, job: Any, opts: MethodOptions | None = None) -> None:
        super().__init__(job, opts)
        self.ref = self.start.fresh().eval().requires_grad_(False)

    def collate(self, recs: list[dict[str, Any]], seed: int) -> tuple[torch.Tensor, ...]:
        # Chosen rows first, then rejected rows: one forward pass for both.
        pairs = [(r["prompt"], r["chosen"]) for r in recs]
        pairs += [(r["prompt"], r["rejected"]) for r in recs]
        return collate_labelled(self.coder, pairs)

    def _terms(self, batch: tuple[torch.Tensor, ...]):
        ids, labels, mask = to_device(batch, self.device)
        with self._dropout_off():  # as the reference: at init pi = ref exactly (loss log 2)
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        pol = losses.sequence_logps(logits, labels)
        with torch.no_grad():
            ref = losses.sequence_logps(self.ref(input_ids=ids, attention_mask=mask).logits, labels)
        b = ids.size(0) // 2
        return losses.dpo_loss(pol[:b], pol[b:], ref[:b], ref[b:], self.opts.dpo_beta)

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loss, chosen, rejected = self._terms(batch)
        self.last_accuracy = float((chosen > rejected).float().mean())  # preference accuracy
        return loss

    def evaluate(self) -> dict[str, float]:
        with self._eval():
            loss, chosen, rejected = self._terms(self.collate(self.eval_recs, 0))
        return {
            "heldout_loss": float(loss),
            # Ties (policy == reference at the start) count as wrong, as in TRL.
            "preference_accuracy": float((chosen > rejected).float().mean()),
            "reward_margin": float((chosen - rejected).mean()),
        }


class GRPOBackend(RecordBackend):
    """GRPO over constrained completions, scored by the recipe's named reward (rewards.py).
    Task definition (validated at load): every answer has the same width W, and a completion is
    exactly W tokens sampled from the answer alphabet (the set of characters of the dataset's
    answers, each one token of the model); this keeps generation cheap on small models. Free
    text completions (up to `grpo_max_new_tokens`, stopping at EOS) are not sampled yet, so the
    `regex` and `format` rewards only see alphabet strings."""

    method = "grpo"

    def __init__(self, job: Any, opts: MethodOptions | None = None) -> None:
        super().__init__(job, opts)
        answers = [r["answer"] for r in self.train + self.heldout]
        widths = {len(a.encode()) for a in answers}
        if len(widths) != 1:
            raise DatasetError(
                f"GRPO answers must all have one width, got {sorted(widths)}: for answers of "
                'any length set grpo_completions = "free" in the recipe'
            )
        self.width = widths.pop()
        chars = sorted({c for a in answers for c in a})
        if any(len(c.encode()) != 1 for c in chars):
            raise DatasetError("GRPO answers must be single-byte (ASCII) characters")
        ids = [self.coder.encode(c) for c in chars]
        if any(len(i) != 1 for i in ids):
            raise DatasetError("GRPO answer characters must each be one token of the model")
        self.alphabet = "".join(chars)
        self.alphabet_ids = torch.tensor([i[0] for i in ids])
        self.ref = self.start.fresh().eval().requires_grad_(False)
        self.reward = rewards.reward_fn(self.opts.reward, self.opts.reward_pattern)
        self.last_reward = float("nan")
        self.repeats = self.opts.grpo_iterations
        self._rollout: tuple[Any, ...] | None = None  # (batch, ids, mask, comp, old, ref, adv)

    def collate(self, recs: list[dict[str, Any]], seed: int) -> tuple[Any, ...]:
        ids, mask = left_pad([self.coder.prompt(r["prompt"]) for r in recs], self.coder.pad)
        return ids, mask, tuple(r["answer"] for r in recs), seed

    def _restricted(self, logits: torch.Tensor) -> torch.Tensor:
        """log-probs of the next-token distribution restricted to the answer alphabet."""
        logits = logits[..., self.alphabet_ids].float() / self.opts.grpo_temperature
        return torch.log_softmax(logits, dim=-1)

    def _alphabet_logps(self, model, ids, mask, completion_len: int) -> torch.Tensor:
        """log-probs [N, completion_len, |alphabet|] of the restricted next-token distribution
        at the completion's positions (the last completion_len tokens of ids are completion):
        position t predicts token t + 1, so the logits are those of the tokens just before."""
        return self._restricted(forward(model, ids, mask)[:, -completion_len - 1 : -1])

    def _next_logps(self, model, ids, mask) -> torch.Tensor:
        """log-probs [N, |alphabet|] of the token that follows ids (the last position's logits,
        which predict the next token; not the second to last, which predicts the last one)."""
        return self._restricted(forward(model, ids, mask)[:, -1])

    @torch.no_grad()
    def sample(self, ids: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
        """[N, W] alphabet indices sampled autoregressively, deterministic from `seed`."""
        g = torch.Generator().manual_seed(seed)
        out = torch.zeros((ids.size(0), 0), dtype=torch.long, device=ids.device)
        for _ in range(self.width):
            lp = self._next_logps(self.model, ids, mask)
            # drawn on the CPU from the seeded generator, whatever the model's device
            nxt = torch.multinomial(lp.exp().cpu(), 1, generator=g).to(ids.device)
            out = torch.cat([out, nxt], 1)
            ids = torch.cat([ids, self.alphabet_ids[nxt]], 1)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        return out

    def _completion_logps(self, model, ids, mask, comp: torch.Tensor) -> torch.Tensor:
        full = torch.cat([ids, self.alphabet_ids[comp]], 1)
        fmask = torch.cat([mask, torch.ones_like(comp)], 1)
        lp = self._alphabet_logps(model, full, fmask, comp.size(1))
        return lp.gather(-1, comp.unsqueeze(-1)).squeeze(-1)

    def rollout(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        """G samples per prompt with their sampling-policy and reference log-probs, rewards and
        advantages; cached so the same batch yielded again (grpo_iterations) reuses it."""
        ids, mask, answers, seed = batch
        # Keyed on the batch object itself (held here, so its identity cannot be reused): only
        # the same batch yielded again reuses the rollout, never an equal one from a new pass.
        if self._rollout is not None and self._rollout[0] is batch:
            return self._rollout[1:]
        g = self.opts.grpo_group
        ids, mask = to_device((ids, mask), self.device)
        ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
        with self._eval():  # the sampling policy pi_old, without dropout (as in loss())
            comp = self.sample(ids, mask, seed)
            old = self._completion_logps(self.model, ids, mask, comp)
            ref = self._completion_logps(self.ref, ids, mask, comp)
        texts = ["".join(self.alphabet[i] for i in row) for row in comp.tolist()]
        adv = self._advantages(texts, answers)
        self._rollout = (batch, ids, mask, comp, old, ref, adv)
        return self._rollout[1:]

    def _advantages(self, texts: list[str], answers: Sequence[str]) -> torch.Tensor:
        """Group-relative advantages of the completions' rewards (G per prompt, in order)."""
        g = self.opts.grpo_group
        scores = torch.tensor(
            [[self.reward(t, a) for t in texts[i * g : (i + 1) * g]] for i, a in enumerate(answers)]
        )
        self.last_reward = float(scores.mean())
        self.last_accuracy = float((scores >= 1.0).float().mean())  # full marks, as evaluate()
        return losses.group_advantages(scores).reshape(-1).to(self.device)

    def loss(self, batch: tuple[Any, ...]) -> torch.Tensor:
        ids, mask, comp, old, ref, adv = self.rollout(batch)
        with self._dropout_off():  # pi as pi_old was taken: the ratio is 1 at the first step
            logp = self._completion_logps(self.model, ids, mask, comp)
        return losses.grpo_loss(
            logp, old, ref, adv, clip_eps=self.opts.grpo_clip, kl_coef=self.opts.grpo_kl
        )

    def evaluate(self) -> dict[str, float]:
        """mean_reward: the exact expected exact-match reward of the sampling policy (the
        probability of the answer's W tokens); accuracy: the recipe's reward of the greedy
        (argmax) completions, averaged."""
        recs = self.eval_recs
        prompts = left_pad([self.coder.prompt(r["prompt"]) for r in recs], self.coder.pad)
        ids, mask = to_device(prompts, self.device)
        index = {c: i for i, c in enumerate(self.alphabet)}
        answer = torch.tensor([[index[c] for c in r["answer"]] for r in recs], device=self.device)
        with self._eval():
            p = self._completion_logps(self.model, ids, mask, answer).sum(-1).exp()
            out = torch.zeros((len(recs), 0), dtype=torch.long, device=self.device)
            cur_ids, cur_mask = ids, mask
            for _ in range(self.width):
                nxt = self._next_logps(self.model, cur_ids, cur_mask).argmax(-1)
                out = torch.cat([out, nxt[:, None]], 1)
                cur_ids = torch.cat([cur_ids, self.alphabet_ids[nxt][:, None]], 1)
                cur_mask = torch.cat([cur_mask, torch.ones_like(nxt)[:, None]], 1)
        texts = ["".join(self.alphabet[i] for i in row) for row in out.tolist()]
        acc = sum(self.reward(t, r["answer"]) for t, r in zip(texts, recs, strict=True))
        return {"mean_reward": float(p.mean()), "accuracy": acc / len(recs)}


class FreeGRPOBackend(GRPOBackend):
    """GRPO over free-text completions (`grpo_completions = "free"`): up to
    `grpo_max_new_tokens` tokens sampled from the model's whole vocabulary at the recipe's
    temperature, each completion ending at its first EOS (the tokens after it are masked out of
    the loss), decoded and scored by the recipe's reward. For answers of any length and shape
    (numbers, regexes, a format), on a model that already produces sensible text.

    The vocabulary is the tokenizer's: when the model has more output rows than the tokenizer
    has entries (a padded embedding: the built-in models' 320 rows for 259 tokens, a GPT-2
    folder's 50,257 rows for a smaller tokenizer), the rows the tokenizer lacks are cut off the
    logits before the softmax, in the sampler, in every log-prob (pi, pi_old, the reference) and
    in the greedy evaluation alike, so no completion holds an id the tokenizer cannot decode and
    those rows get no gradient (docs/methods.md, next to TRL's behaviour)."""

    method = "grpo"

    def __init__(self, job: Any, opts: MethodOptions | None = None) -> None:
        RecordBackend.__init__(self, job, opts)
        self.max_new = self.opts.grpo_max_new_tokens
        longest = max(len(self.coder.prompt(r["prompt"])) for r in self.train + self.heldout)
        if longest + self.max_new > self.ctx:
            raise DatasetError(
                f"dataset {job.dataset_uri}: a prompt of {longest} tokens plus "
                f"grpo_max_new_tokens {self.max_new} exceeds the sequence length {self.ctx}"
            )
        self.ref = self.start.fresh().eval().requires_grad_(False)
        self.reward = rewards.reward_fn(self.opts.reward, self.opts.reward_pattern)
        self.last_reward = float("nan")
        self.repeats = self.opts.grpo_iterations
        self._rollout: tuple[Any, ...] | None = None

    def _logps(self, model, ids, mask, comp, comp_mask) -> torch.Tensor:
        """log pi(comp_t | prompt, comp_<t) [N, T] at the recipe's temperature (full
        vocabulary of the tokenizer); zero where comp_mask is 0."""
        full = torch.cat([ids, comp], 1)
        fmask = torch.cat([mask, comp_mask], 1)
        logits = forward(model, full, fmask)[:, -comp.size(1) - 1 : -1, : self.coder.vocab]
        lp = torch.log_softmax(logits.float() / self.opts.grpo_temperature, dim=-1)
        return lp.gather(-1, comp.unsqueeze(-1)).squeeze(-1) * comp_mask

    @torch.no_grad()
    def sample(self, ids: torch.Tensor, mask: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...]:
        """(completion ids [N, T], their mask: 1 up to and with the first EOS), drawn
        autoregressively, deterministic from `seed` (on the CPU generator)."""
        g = torch.Generator().manual_seed(seed)
        eos, pad = self.coder.eos, self.coder.pad
        comp = torch.zeros((ids.size(0), 0), dtype=torch.long, device=ids.device)
        live = torch.ones(ids.size(0), dtype=torch.bool, device=ids.device)
        cmask = torch.zeros((ids.size(0), 0), dtype=torch.long, device=ids.device)
        for _ in range(self.max_new):
            logits = forward(self.model, ids, mask)[:, -1, : self.coder.vocab].float()
            p = torch.softmax(logits / self.opts.grpo_temperature, -1).cpu()
            nxt = torch.multinomial(p, 1, generator=g).to(ids.device)[:, 0]
            nxt = torch.where(live, nxt, torch.full_like(nxt, pad))
            comp = torch.cat([comp, nxt[:, None]], 1)
            cmask = torch.cat([cmask, live.long()[:, None]], 1)
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, live.long()[:, None]], 1)
            live &= nxt != eos
            if not live.any():
                break
        return comp, cmask

    def _text(self, row: list[int]) -> str:
        return self.coder.decode(row[: row.index(self.coder.eos)] if self.coder.eos in row else row)

    def rollout(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        ids, mask, answers, seed = batch
        if self._rollout is not None and self._rollout[0] is batch:
            return self._rollout[1:]
        g = self.opts.grpo_group
        ids, mask = to_device((ids, mask), self.device)
        ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
        with self._eval():  # pi_old without dropout, as loss() takes pi
            comp, cmask = self.sample(ids, mask, seed)
            old = self._logps(self.model, ids, mask, comp, cmask)
            ref = self._logps(self.ref, ids, mask, comp, cmask)
        adv = self._advantages([self._text(row) for row in comp.tolist()], answers)
        self._rollout = (batch, ids, mask, comp, cmask, old, ref, adv)
        return self._rollout[1:]

    def loss(self, batch: tuple[Any, ...]) -> torch.Tensor:
        ids, mask, comp, cmask, old, ref, adv = self.rollout(batch)
        with self._dropout_off():
            logp = self._logps(self.model, ids, mask, comp, cmask)
        return losses.grpo_loss(
            logp,
            old,
            ref,
            adv,
            cmask.bool(),
            clip_eps=self.opts.grpo_clip,
            kl_coef=self.opts.grpo_kl,
        )

    def evaluate(self) -> dict[str, float]:
        """answer_prob: the policy's probability of each answer's tokens then EOS (the exact
        expected reward of the `exact` reward); accuracy: the recipe's reward of the greedy
        completions, averaged."""
        recs = self.eval_recs
        prompts = left_pad([self.coder.prompt(r["prompt"]) for r in recs], self.coder.pad)
        ids, mask = to_device(prompts, self.device)
        comp, cmask = to_device(
            right_pad([self.coder.completion(r["answer"]) for r in recs], self.coder.pad),
            self.device,
        )
        with self._eval():
            p = self._logps(self.model, ids, mask, comp, cmask).sum(-1).exp()
            asked = [r["prompt"] for r in recs]
            got = greedy(self.model, self.coder, asked, self.max_new, self.coder.vocab)
        acc = sum(self.reward(t, r["answer"]) for t, r in zip(got, recs, strict=True))
        return {"mean_reward": float(p.mean()), "accuracy": acc / len(recs)}


def grpo_backend(job: Any, opts: MethodOptions | None = None) -> GRPOBackend:
    """The GRPO backend the recipe's `grpo_completions` names."""
    opts = opts or MethodOptions.for_job(job)
    free = opts.grpo_completions == "free"
    return (FreeGRPOBackend if free else GRPOBackend)(job, opts)


BACKENDS = {"sft": SFTBackend, "dpo": DPOBackend, "grpo": grpo_backend}
