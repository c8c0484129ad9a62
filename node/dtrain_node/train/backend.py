"""The interface the runner trains through, and the built-in PyTorch + Hugging Face backend.

The runner only calls: `model`, `n_items()`, `batches(indices, batch_size, seed)`,
`loss(batch)`, `evaluate()` and `export(out_dir)`. External backends plug in behind the same
protocol, selected by the recipe's `backend`: `trl` (trl_backend.py, SFT and DPO) and
`torchtune` (torchtune_backend.py, SFT and DPO). axolotl and unsloth fail with a one-line
`BackendUnavailable` (unsloth: no CUDA device; not installed; or no adapter yet), which the
node's pre-flight turns into a refusal before joining.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dtrain_node.errors import BackendUnavailable, DatasetError
from dtrain_node.train import corpus, dataset, inner, shard
from dtrain_node.train import losses as methods
from dtrain_node.train.devices import to_device
from dtrain_node.train.job import TrainJob, context
from dtrain_node.train.start import StartModel, adapt, export_model, start_model

if TYPE_CHECKING:
    pass


class Backend(Protocol):
    name: str
    model: torch.nn.Module
    start: StartModel  # what the model started from: its tokenizer and export
    start_pin: bytes  # the pin of the start weights (before any adapter): the job's modelHash

    def n_items(self) -> int: ...

    def batches(self, indices: torch.Tensor, batch_size: int, seed: int) -> Iterator[Any]: ...

    def loss(self, batch: Any) -> torch.Tensor: ...

    def evaluate(self) -> dict[str, float]: ...

    def export(self, out_dir: str | Path) -> Path: ...

    def to(self, device: torch.device) -> None: ...


def token_text(job: TrainJob, tok: Any, ctx: int, heldout_fraction: float = 0.1) -> corpus.TextData:
    """A CPT dataset through the model's tokenizer: the documents' tokens, each document
    followed by EOS, concatenated; the last `heldout_fraction` of the tokens held out."""
    docs = dataset.load_documents(job.dataset_uri, job.dataset_hash)
    ids: list[int] = []
    for d in docs:
        # a document longer than the model's context is cut into windows here: no warning
        ids += tok.encode(d, add_special_tokens=False, verbose=False)
        ids.append(tok.eos_token_id)
    tokens = torch.tensor(ids, dtype=torch.long)
    cut = int(len(tokens) * (1 - heldout_fraction))
    if cut < 4 * (ctx + 1) or len(tokens) - cut < ctx + 1:
        raise DatasetError(
            f"dataset {job.dataset_uri} has {len(tokens)} tokens: too few for sequences of {ctx}"
        )
    return corpus.TextData(tokens[:cut], tokens[cut:], ctx)


class CausalLMBackend:
    """Continued pre-training: next-token loss on windows of a text corpus (the built-in models
    read bytes as tokens; any other model reads it through its own tokenizer)."""

    name = "builtin"

    def __init__(self, job: TrainJob, heldout_windows: int = 32) -> None:
        self.job = job
        self.start = start_model(job.model_uri)
        self.ctx = context(job, self.start)
        if self.start.byte_level:
            self.data = corpus.load_text(job.dataset_uri, job.dataset_hash, self.ctx)
        else:
            self.data = token_text(job, self.start.tokenizer, self.ctx)
        base = self.start.fresh()
        self.start_pin = self.start.pin(base.state_dict())
        self.model = adapt(base, job.recipe)
        self.heldout = self.data.heldout_windows(heldout_windows)

    device = torch.device("cpu")

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        self.device = device

    def n_items(self) -> int:
        return self.data.n_windows

    def batches(self, indices: torch.Tensor, batch_size: int, seed: int) -> Iterator[Any]:
        """Endless batches over `indices`, reshuffled each pass (local order need not match);
        a shard smaller than batch_size yields batches of the whole shard (shard.py)."""
        for idx, _ in shard.batch_indices(indices, batch_size, seed):
            yield self.data.windows(idx)

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = to_device(batch, self.device)
        return methods.cpt_loss(self.model(input_ids=x).logits, y)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        was = self.model.training
        self.model.eval()
        x, y = self.heldout
        loss = float(self.loss((x, y)))
        self.model.train(was)
        return {"heldout_loss": loss}

    def export(self, out_dir: str | Path) -> Path:
        return export_model(self.start, self.model, out_dir)


EXTERNAL = {
    "axolotl": ("axolotl", "pip install axolotl"),
    "unsloth": ("unsloth", "pip install unsloth"),
}
NEEDS_CUDA = ("unsloth",)  # its kernels run on GPUs only: refused up front on a node without one
ADAPTERS = ("builtin", "trl", "torchtune")


def external(name: str) -> BackendUnavailable:
    """Why the external backend `name` cannot train here, in one line: no CUDA device (for
    the backends that need one), the package is not installed, or no adapter exists yet."""
    if name in NEEDS_CUDA and not torch.cuda.is_available():
        return BackendUnavailable(
            f"backend {name!r} needs a CUDA GPU and this node has none "
            f"(use one of {', '.join(ADAPTERS)} on a CPU node)"
        )
    package, install = EXTERNAL[name]
    if importlib.util.find_spec(package) is None:
        return BackendUnavailable(
            f"backend {name!r} needs the {package} package, which is not installed: {install}"
        )
    return BackendUnavailable(f"backend {name!r} has no adapter in this version")


METHODS = ("cpt", "sft", "dpo", "grpo")


def token_reach(backend: Backend) -> int:
    """How many rows of the model's token tensors a token can reach: its tokenizer's length
    (DeMo.of_model: a head's rows beyond it move by its mean row alone)."""
    return len(backend.start.tokenizer)


def make_backend(job: TrainJob, name: str | None = None, options: Any = None) -> Backend:
    """The backend `name` for the job's method (None: the recipe's `backend`, "builtin" without
    a recipe); `options` is a finetune.MethodOptions (DPO beta, GRPO group size / clip / KL
    coefficient), defaults when None. With a recipe's `grad_accum` above 1 its batch stream
    yields one group of micro-batches per inner step (train/inner.py)."""
    backend = _make_backend(job, name, options)
    return inner.accumulating(backend, job.recipe)  # type: ignore[no-any-return]


def _make_backend(job: TrainJob, name: str | None, options: Any) -> Backend:
    name = name or getattr(job.recipe, "backend", "builtin")
    if name in ("trl", "torchtune"):
        if job.method not in METHODS:
            raise ValueError(f"unknown method {job.method!r}; known: {', '.join(METHODS)}")
        from dtrain_node.train import torchtune_backend, trl_backend

        return (trl_backend if name == "trl" else torchtune_backend).make(job, options)
    if name == "builtin":
        if job.method == "cpt":
            return CausalLMBackend(job)
        if job.method in METHODS:
            # Imported here: finetune builds on this module's protocol.
            from dtrain_node.train import finetune

            return finetune.BACKENDS[job.method](job, options)
        raise ValueError(f"unknown method {job.method!r}; known: {', '.join(METHODS)}")
    if name in EXTERNAL:
        raise external(name)
    known = ", ".join((*ADAPTERS, *EXTERNAL))
    raise ValueError(f"unknown backend {name!r}; known: {known}")
