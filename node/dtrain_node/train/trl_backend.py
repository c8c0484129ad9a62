"""The `trl` backend (recipe `backend = "trl"`): SFT and DPO through Hugging Face TRL's own
trainers, driven one batch at a time by our runner.

What TRL does here, and what it does not:
  - TRL prepares the data: each trainer's `_prepare_dataset` (run by its constructor on the
    datasets we hand it) formats and tokenizes the records its own way (chat template or plain
    text, EOS appended, prompt/completion split by the common prefix) and TRL's collators
    (`DataCollatorForLanguageModeling`, `DataCollatorForPreference`) pad the batches.
  - TRL computes the loss: `SFTTrainer.compute_loss` / `DPOTrainer.compute_loss` on a collated
    batch, through TRL's fused LM head (per-token log-probs without the full logits), against a
    frozen reference (DPO: a fresh start model, as the built-in DPO).
  - TRL never steps an optimizer and never orders data: `train()` is never called and no
    dataloader is built. The shard, the batch order and the seed come from us (shard.py), the
    inner AdamW step and the DeMo sync from the runner (operator/epoch.py), so the shared state
    is exactly the built-in backend's: `theta_sync` depends only on the packets.
Why this entry point: `compute_loss` is the trainers' public per-batch seam (what `train()`
calls each step), so the method is TRL's own code, not a re-implementation, while everything
that decides the shared state stays ours. TRL's functional pieces alone would skip its data
preparation, where formats differ between libraries.

Where TRL's formatting differs from the built-in backend's (docs/methods.md "Backends"):
  - chat records: the same tokens (the template renders the prompt, then the assistant turn;
    EOS comes from the template), so the same loss;
  - text records: TRL tokenizes prompt + completion + EOS as one string with the tokenizer's
    own special tokens: no BOS unless the tokenizer adds one (the built-in prepends BOS), and
    tokens may merge across the prompt/completion boundary (TRL then trains from where the two
    tokenizations diverge);
  - DPO: TRL turns dropout off in the policy and the reference (`disable_dropout`, its DPO
    default, pinned here), as the built-in backend does (finetune.RecordBackend._dropout_off):
    no difference.
TRL's own precision default (bf16 autocast, even on the reference model) is turned off: the
runner decides precision (recipe `bf16`, on CUDA), as for the built-in backend.
Records are checked to fit `seq_len` in TRL's tokens too: nothing is truncated or dropped.

TRL's trainers patch the model's `forward` with the fused head; the patch is live only inside
`loss()` and `evaluate()`, so the model the runner, export and copies see is the plain one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from dtrain_node.errors import BackendUnavailable, DatasetError, RecipeInvalid
from dtrain_node.train import finetune, losses, shard
from dtrain_node.train.devices import to_device

PACKAGE = "trl"
INSTALL = "pip install trl (or pip install 'dtrain[trl]')"
METHODS = ("sft", "dpo")
Row = dict[str, list[int]]


def make(job: Any, options: finetune.MethodOptions | None = None) -> finetune.RecordBackend:
    """The trl backend for the job's method: `RecipeInvalid` for a method it does not train,
    `BackendUnavailable` naming the install command when trl is not installed."""
    if job.method not in METHODS:
        raise RecipeInvalid(
            f"backend 'trl' trains {' and '.join(METHODS)}; method {job.method!r} is not "
            'supported by the trl backend yet (use backend = "builtin" in the recipe)'
        )
    if importlib.util.find_spec(PACKAGE) is None:
        raise BackendUnavailable(
            f"backend 'trl' needs the {PACKAGE} package, which is not installed: {INSTALL}"
        )
    return BACKENDS[job.method](job, options)


def is_chat(prompt: finetune.Prompt) -> bool:
    return isinstance(prompt, list)


def as_turn(prompt: finetune.Prompt, text: str) -> str | list[dict[str, str]]:
    """A completion as TRL wants it: an assistant turn after a chat prompt, else the text."""
    return [{"role": "assistant", "content": text}] if is_chat(prompt) else text


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """The global random states as they were: TRL's constructors call `set_seed`."""
    import numpy as np

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def quiet_datasets() -> None:
    import datasets

    datasets.disable_progress_bars()


class TRLBackend(finetune.RecordBackend):
    """Shared parts: one TRL trainer over the train and held-out records, each record's
    prepared row (in record order), batches collated by TRL, and its loss per batch."""

    name = "trl"
    example_keys: tuple[str, ...] = ()

    def __init__(self, job: Any, opts: finetune.MethodOptions | None = None) -> None:
        super().__init__(job, opts)
        self.trainer = self._build()
        self.rows = self._prepared(self.train, "train")
        self.eval_rows = self._prepared(self.eval_recs, "heldout")

    # ---------------------------------------------------------------- TRL trainer

    def example(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A record as TRL's dataset format: completions as assistant turns after chat prompts."""
        out = {"prompt": rec["prompt"]}
        out.update({k: as_turn(rec["prompt"], rec[k]) for k in self.example_keys})
        return out

    def datasets(self) -> dict[str, Any]:
        """The records to prepare, one dataset per split and format (TRL decides a dataset's
        format from its first record, so chat and text records are never mixed in one)."""
        from datasets import Dataset

        out = {}
        for split, recs in (("train", self.train), ("heldout", self.eval_recs)):
            for kind in ("chat", "text"):
                group = [self.example(r) for r in recs if is_chat(r["prompt"]) == (kind == "chat")]
                if group:
                    out[f"{split}-{kind}"] = Dataset.from_list(group)
        return out

    def trainer_args(self, out_dir: str) -> dict[str, Any]:
        """TRL arguments for a trainer that never trains: no logging, saving or truncation."""
        return {
            "output_dir": out_dir,
            "report_to": "none",
            "use_cpu": True,  # construction only; the runner moves the model (`to`)
            "save_strategy": "no",
            "logging_strategy": "no",
            "disable_tqdm": True,
            "seed": self.job.seed_offset,
            "bf16": False,  # TRL's default is True: precision is the runner's (recipe `bf16`)
            "fp16": False,
            "gradient_checkpointing": False,  # TRL's default is True; memory is the node's call
            "max_length": None,  # lengths are checked against seq_len instead (_prepared)
        }

    def new_trainer(self, data: dict[str, Any], out_dir: str) -> Any:
        raise NotImplementedError

    def _build(self) -> Any:
        """The TRL trainer, its datasets prepared, its forward patch taken off the model."""
        quiet_datasets()
        before = patched_modules(self.model)
        with kept_rng(), tempfile.TemporaryDirectory() as out_dir:
            trainer = self.new_trainer(self.datasets(), out_dir)
        if trainer.model is not self.model:
            raise RuntimeError("the TRL trainer replaced the model: its updates would be lost")
        self._patches = take_patches(self.model, before)
        return trainer

    def _prepared(self, recs: list[dict[str, Any]], split: str) -> list[Row]:
        """TRL's prepared row of each record, in the records' order, checked to fit seq_len."""
        prepared = self.trainer.eval_dataset
        queues = {kind: iter(prepared.get(f"{split}-{kind}", [])) for kind in ("chat", "text")}
        rows = []
        for i, rec in enumerate(recs):
            row = self.row(next(queues["chat" if is_chat(rec["prompt"]) else "text"]))
            if self.row_length(row) > self.ctx:
                raise DatasetError(
                    f"dataset {self.job.dataset_uri}: {split} record {i + 1} is "
                    f"{self.row_length(row)} tokens in TRL's format, longer than the sequence "
                    f"length {self.ctx} (shorten it or raise the recipe's seq_len)"
                )
            rows.append(row)
        return rows

    def row(self, prepared: dict[str, Any]) -> Row:
        raise NotImplementedError

    def row_length(self, row: Row) -> int:
        raise NotImplementedError

    # ---------------------------------------------------------------- the protocol

    def batches(self, indices: torch.Tensor, batch_size: int, seed: int) -> Iterator[Any]:
        """Endless batches over this node's shard, in our order (shard.py), collated by TRL."""
        for idx, _ in shard.batch_indices(indices, batch_size, seed):
            yield self.collate_rows([self.rows[int(j)] for j in idx])

    def collate_rows(self, rows: Sequence[Row]) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def inputs(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.trl_loss(batch)[0]

    def trl_loss(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, dict[str, float]]:
        """TRL's loss of the batch (its `compute_loss`) and the metrics it logged meanwhile."""
        with patched(self._patches):
            loss = self.trainer.compute_loss(self.model, self.inputs(to_device(batch, self.device)))
        return loss, self.metrics()

    def metrics(self) -> dict[str, float]:
        """The mean of each metric TRL logged since the last call, then forgets them (TRL keeps
        them until `log()`, which we never call: they would grow with every step)."""
        out: dict[str, float] = {}
        for mode in self.trainer._metrics.values():
            out.update({k: sum(v) / len(v) for k, v in mode.items() if v})
            mode.clear()
        return out


class SFTBackend(TRLBackend):
    """SFT through `trl.SFTTrainer`: completion-only loss (mean over the completion tokens)."""

    method = "sft"
    example_keys = ("completion",)

    def new_trainer(self, data: dict[str, Any], out_dir: str) -> Any:
        from trl import SFTConfig, SFTTrainer

        args = SFTConfig(**self.trainer_args(out_dir), completion_only_loss=True)
        return SFTTrainer(
            model=self.model,
            args=args,
            train_dataset=next(iter(data.values())),  # required; never iterated
            eval_dataset=data,
            processing_class=self.start.tokenizer,
        )

    def row(self, prepared: dict[str, Any]) -> Row:
        return {"input_ids": prepared["input_ids"], "labels": prepared["labels"]}

    def row_length(self, row: Row) -> int:
        return len(row["input_ids"])

    def collate_rows(self, rows: Sequence[Row]) -> tuple[torch.Tensor, ...]:
        """(input ids, attention mask, labels): TRL's collator, right padding."""
        b = self.trainer.data_collator([dict(r) for r in rows])
        return b["input_ids"], b["attention_mask"], b["labels"]

    def inputs(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        ids, mask, labels = batch
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def evaluate(self) -> dict[str, float]:
        """heldout_loss: TRL's loss on the held-out records; accuracy: greedy completions of
        TRL's prompt tokens equal to the record's completion."""
        with self._eval():
            loss = float(self.loss(self.collate_rows(self.eval_rows)))
            prompts = [prompt_ids(r["labels"], r["input_ids"]) for r in self.eval_rows]
            max_new = max(
                self.row_length(r) - len(p) for r, p in zip(self.eval_rows, prompts, strict=True)
            )
            got = finetune.greedy(self.model, TokenCoder(self.start.tokenizer), prompts, max_new)
        recs = self.eval_recs
        acc = sum(g == r["completion"] for g, r in zip(got, recs, strict=True)) / len(recs)
        return {"heldout_loss": loss, "accuracy": acc}


def prompt_ids(labels: list[int], ids: list[int]) -> list[int]:
    """The tokens before the first trained one: the prompt as TRL tokenized it."""
    first = next(i for i, t in enumerate(labels) if t != losses.IGNORE)
    return ids[:first]


class TokenCoder(finetune.Coder):
    """A coder whose prompts are already token ids (TRL's), for `finetune.greedy`."""

    def prompt(self, p: Any) -> list[int]:
        return list(p)


class DPOBackend(TRLBackend):
    """DPO through `trl.DPOTrainer` (sigmoid loss, the recipe's beta) against a frozen
    reference: a fresh start model, as the built-in DPO."""

    method = "dpo"
    example_keys = ("chosen", "rejected")

    def new_trainer(self, data: dict[str, Any], out_dir: str) -> Any:
        from trl import DPOConfig, DPOTrainer

        self.ref = self.start.fresh().eval().requires_grad_(False)
        # disable_dropout is TRL's DPO default, pinned: the policy without dropout, as its
        # reference and as the built-in DPO (at init the loss is exactly log 2)
        args = DPOConfig(
            **self.trainer_args(out_dir), beta=self.opts.dpo_beta, disable_dropout=True
        )
        return DPOTrainer(
            model=self.model,
            ref_model=self.ref,
            args=args,
            train_dataset=next(iter(data.values())),
            eval_dataset=data,
            processing_class=self.start.tokenizer,
        )

    def row(self, prepared: dict[str, Any]) -> Row:
        return {k: prepared[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}

    def row_length(self, row: Row) -> int:
        return len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))

    def collate_rows(self, rows: Sequence[Row]) -> tuple[torch.Tensor, ...]:
        """(input ids, attention mask, completion mask): chosen rows, then rejected rows."""
        b = self.trainer.data_collator([dict(r) for r in rows])
        return b["input_ids"], b["attention_mask"], b["completion_mask"]

    def inputs(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        ids, mask, completion = batch
        return {"input_ids": ids, "attention_mask": mask, "completion_mask": completion}

    def evaluate(self) -> dict[str, float]:
        with self._eval():
            loss, m = self.trl_loss(self.collate_rows(self.eval_rows))
        return {
            "heldout_loss": float(loss),
            "preference_accuracy": m["rewards/accuracies"],
            "reward_margin": m["rewards/margins"],
        }


BACKENDS = {"sft": SFTBackend, "dpo": DPOBackend}


# ---------------------------------------------------------------- TRL's forward patch

Patches = list[tuple[torch.nn.Module, Any]]


def patched_modules(model: torch.nn.Module) -> set[int]:
    """ids of the modules whose `forward` is an instance attribute (patched)."""
    return {id(m) for m in model.modules() if "forward" in vars(m)}


def take_patches(model: torch.nn.Module, before: set[int]) -> Patches:
    """The forward patches added since `before`, removed from their modules."""
    return [
        (m, vars(m).pop("forward"))
        for m in model.modules()
        if "forward" in vars(m) and id(m) not in before
    ]


@contextlib.contextmanager
def patched(patches: Patches) -> Iterator[None]:
    """TRL's patched forwards in place for the duration (the graph they build outlives it)."""
    for module, forward in patches:
        module.forward = forward
    try:
        yield
    finally:
        for module, _ in patches:
            vars(module).pop("forward", None)
