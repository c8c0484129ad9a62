"""The `torchtune` backend (recipe `backend = "torchtune"`): SFT and DPO through torchtune's own
collators and losses, driven one batch at a time by our runner.

What torchtune does here (torchtune 0.6.1, the pieces its `full_finetune_*` and
`lora_dpo_single_device` recipes use):
  - pads the batches: `torchtune.data.padded_collate_sft` (SFT: tokens padded with the pad id,
    labels with -100) and `padded_collate_dpo` (chosen rows, then rejected rows);
  - SFT loss: `torchtune.modules.loss.CEWithChunkedOutputLoss` on the logits cut into its
    default 8 chunks along the sequence, with the labels shifted left by one and -100 appended,
    as its recipes shift them (the mean cross-entropy over the trained tokens);
  - DPO loss: the per-sequence sums of the completion tokens' log-probs from
    `torchtune.rlhf.get_batch_log_probs`, then `torchtune.rlhf.loss.DPOLoss` (sigmoid, the
    recipe's `dpo_beta`, no label smoothing) averaged over the pairs, against a frozen reference
    (a fresh start model, as the built-in DPO).
What stays ours, so the shared state is the built-in backend's:
  - the model: the job's start model (any Hugging Face causal LM, LoRA-adapted by the recipe
    through peft), exported with `save_pretrained`. torchtune's model builders and its
    `FullModelHFCheckpointer` cover its own families (Llama, Qwen2, Gemma, Mistral, Phi), not
    GPT-2, and would hold the weights under other names and layouts than the job's folder;
  - the tokens: the built-in backend's (finetune.Coder: BOS + prompt or the chat template's
    rendering, completion + EOS, the prompt masked out of the labels). torchtune's tokenizers
    are per model family and read the family's own files;
  - the data order, the inner AdamW step and the DeMo sync (shard.py, operator/epoch.py).
The policy's DPO log-probs are taken without dropout, as the built-in DPO's (docs/methods.md
"Dropout"); SFT trains in the model's training mode, as the built-in SFT.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from dtrain_node.errors import BackendUnavailable, RecipeInvalid
from dtrain_node.train import finetune, losses
from dtrain_node.train.devices import to_device
from dtrain_node.train.start import torchao_quiet

PACKAGE = "torchtune"
INSTALL = "pip install 'dtrain[torchtune]' (torchtune 0.6.1 with torchao 0.16.0)"
METHODS = ("sft", "dpo")
OUTPUT_CHUNKS = 8  # torchtune's default number of output chunks for its chunked CE loss


def make(job: Any, options: finetune.MethodOptions | None = None) -> finetune.RecordBackend:
    """The torchtune backend for the job's method: `RecipeInvalid` for a method it does not
    train, `BackendUnavailable` (one line) when torchtune is missing or cannot be imported."""
    if job.method not in METHODS:
        raise RecipeInvalid(
            f"backend 'torchtune' trains {' and '.join(METHODS)}; method {job.method!r} is not "
            'supported by the torchtune backend yet (use backend = "builtin" in the recipe)'
        )
    load()
    return BACKENDS[job.method](job, options)


def load() -> ModuleType:
    """torchtune, imported; `BackendUnavailable` naming the install command when it is absent,
    or why its import failed (torchtune 0.6.1 imports torchao at the top and needs its
    `torchao.dtypes.nf4tensor`, which torchao 0.18 no longer has)."""
    try:
        with torchao_quiet():
            return importlib.import_module(PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name != PACKAGE:
            raise _broken(exc) from exc
        raise BackendUnavailable(
            f"backend 'torchtune' needs the {PACKAGE} package, which is not installed: {INSTALL}"
        ) from exc
    except ImportError as exc:
        raise _broken(exc) from exc


def _broken(exc: ImportError) -> BackendUnavailable:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()
    return BackendUnavailable(
        f"backend 'torchtune': torchtune cannot be imported ({first}): {INSTALL}"
    )


def labelled_row(coder: finetune.Coder, prompt: finetune.Prompt, completion: str) -> dict:
    """One sequence as torchtune's collators take it: tokens, and labels with the prompt
    masked (the built-in backend's tokens and labels, `finetune.labelled`)."""
    ids, n_prompt = finetune.labelled(coder, prompt, completion)
    return {"tokens": ids, "labels": [losses.IGNORE] * n_prompt + ids[n_prompt:]}


def attention_mask(tokens: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
    """1 on each row's real tokens, 0 on the padding torchtune's collator appended (its own
    models need none with right padding; a Hugging Face model is given one, as the built-in
    backend gives it, and the pad id may be a real token such as GPT-2's EOS)."""
    lengths = torch.tensor([len(r) for r in rows])
    return (torch.arange(tokens.size(1))[None, :] < lengths[:, None]).long()


def shifted(labels: torch.Tensor) -> torch.Tensor:
    """Labels shifted left by one with IGNORE appended: position t is scored on token t + 1,
    as torchtune's recipes shift them before the loss."""
    tail = torch.full_like(labels[:, :1], losses.IGNORE)
    return torch.hstack((labels[:, 1:], tail))


class SFTBackend(finetune.SFTBackend):
    """SFT: torchtune's collator and its chunked cross-entropy (mean over the completion
    tokens, EOS included). evaluate() is the built-in SFT's, on these batches and this loss."""

    name = "torchtune"

    def __init__(self, job: Any, opts: finetune.MethodOptions | None = None) -> None:
        super().__init__(job, opts)
        from torchtune.modules.loss import CEWithChunkedOutputLoss

        self.loss_fn = CEWithChunkedOutputLoss(OUTPUT_CHUNKS, ignore_index=losses.IGNORE)

    def collate(self, recs: list[dict[str, Any]], seed: int) -> tuple[torch.Tensor, ...]:
        """(tokens, labels, attention mask): right-padded by `torchtune.data.padded_collate_sft`."""
        from torchtune.data import padded_collate_sft

        rows = [labelled_row(self.coder, r["prompt"], r["completion"]) for r in recs]
        b = padded_collate_sft(rows, padding_idx=self.coder.pad, ignore_idx=losses.IGNORE)
        return b["tokens"], b["labels"], attention_mask(b["tokens"], [r["tokens"] for r in rows])

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        tokens, labels, mask = to_device(batch, self.device)
        logits = self.model(input_ids=tokens, attention_mask=mask).logits
        chunks = list(logits.chunk(self.loss_fn.num_output_chunks, dim=1))
        return self.loss_fn(chunks, shifted(labels))


class DPOBackend(finetune.DPOBackend):
    """DPO: torchtune's collator, its per-sequence log-probs and its sigmoid DPO loss with the
    recipe's beta. evaluate() is the built-in DPO's, on these terms."""

    name = "torchtune"

    def __init__(self, job: Any, opts: finetune.MethodOptions | None = None) -> None:
        super().__init__(job, opts)
        from torchtune.rlhf.loss import DPOLoss

        self.loss_fn = DPOLoss(beta=self.opts.dpo_beta, label_smoothing=0.0)

    def collate(self, recs: list[dict[str, Any]], seed: int) -> tuple[torch.Tensor, ...]:
        """(tokens, labels, attention mask): chosen rows, then rejected rows, right-padded by
        `torchtune.data.padded_collate_dpo`."""
        from torchtune.data import padded_collate_dpo

        rows = []
        for r in recs:
            chosen = labelled_row(self.coder, r["prompt"], r["chosen"])
            rejected = labelled_row(self.coder, r["prompt"], r["rejected"])
            rows.append(
                {
                    "chosen_input_ids": chosen["tokens"],
                    "chosen_labels": chosen["labels"],
                    "rejected_input_ids": rejected["tokens"],
                    "rejected_labels": rejected["labels"],
                }
            )
        tokens, labels = padded_collate_dpo(
            rows, padding_idx=self.coder.pad, ignore_idx=losses.IGNORE
        )
        seqs = [r["chosen_input_ids"] for r in rows] + [r["rejected_input_ids"] for r in rows]
        return tokens, labels, attention_mask(tokens, seqs)

    def _terms(self, batch: tuple[torch.Tensor, ...]):
        """(mean loss, chosen rewards, rejected rewards), as the built-in DPO's `_terms`."""
        from torchtune import rlhf

        tokens, labels, mask = to_device(batch, self.device)
        with self._dropout_off():  # as the reference: at init pi = ref exactly (loss log 2)
            pol = rlhf.get_batch_log_probs(
                self.model(input_ids=tokens, attention_mask=mask).logits, labels
            )
        with torch.no_grad():
            ref = rlhf.get_batch_log_probs(
                self.ref(input_ids=tokens, attention_mask=mask).logits, labels
            )
        b = tokens.size(0) // 2
        per_pair, chosen, rejected = self.loss_fn(pol[:b], pol[b:], ref[:b], ref[b:])
        return per_pair.mean(), chosen, rejected


BACKENDS = {"sft": SFTBackend, "dpo": DPOBackend}
