"""What `dtrain job submit` pins on-chain for a job's model and dataset, computed from the
references the caller gives, so nobody computes a hash by hand.

A model's hash comes from a hasher plugin (entry point group `dtrain.model_hash`; the node
package installs one for its built-in models, `dtrain_node.train.start:model_hash`): the
canonical hash of the weights the job starts from. A dataset's hash is the sha256 of its file;
`check_dataset` validates the file for the job's method first, through a checker plugin (entry
point group `dtrain.dataset_check`; the node's is `dtrain_node.train.dataset:check_dataset`).
"""

from __future__ import annotations

import hashlib
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .errors import ConfigError

MODEL_HASHERS = "dtrain.model_hash"
DATASET_CHECKERS = "dtrain.dataset_check"


def model_hash(uri: str) -> bytes:
    """The `modelHash` of model URI `uri` (e.g. "builtin:tiny", "builtin:small?seed=7")."""
    if not uri:
        raise ConfigError(
            "a job needs a model: --model-uri builtin:tiny (or builtin:small, or a model "
            "config JSON), optionally with ?seed=N for its initialisation"
        )
    hashers = entry_points(group=MODEL_HASHERS)
    if not hashers:
        raise ConfigError(
            f"no model hasher is installed to pin {uri!r}: install the dtrain node package "
            "(pip install -e .) or pass --model-hash"
        )
    failures = []
    for ep in hashers:
        try:
            return bytes(ep.load()(uri))
        except Exception as exc:  # a plugin's own error type: report it, try the next
            failures.append(f"{exc}")
    raise ConfigError(f"cannot pin model {uri!r}: {'; '.join(failures)}")


def dataset_hash(uri: str) -> bytes:
    """The sha256 of the dataset file `uri` (a path or file:// URI readable here)."""
    if not uri:
        raise ConfigError(
            "a job needs a dataset: --dataset-uri PATH (a text corpus, or a JSONL file for "
            "SFT/DPO/GRPO); every operator reads it at that path"
        )
    path = Path(uri.removeprefix("file://"))
    if not path.is_file():
        raise ConfigError(
            f"dataset {uri!r} is not a file on this machine: give a readable path, or pass "
            "--dataset-hash (its sha256) for a file only the operators have"
        )
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


REMOTE_SCHEMES = ("p2p:", "https://", "http://")


def is_remote(uri: str) -> bool:
    """Whether `uri` names bytes fetched by their sha256 (p2p: or https:), as a node fetches."""
    return uri.startswith(REMOTE_SCHEMES)


def uri_sha256(uri: str) -> bytes | None:
    """The sha256 a URI's `#sha256=<64 hex>` fragment names; None without a fragment."""
    _, sep, frag = uri.partition("#")
    if not sep:
        return None
    hexa = frag.removeprefix("sha256=")
    if not frag.startswith("sha256=") or not re.fullmatch(r"[0-9a-fA-F]{64}", hexa):
        raise ConfigError(f"{uri!r}: the fragment must be #sha256=<64 hex digits>")
    return bytes.fromhex(hexa)


def is_local(uri: str) -> bool:
    """Whether dataset URI `uri` names a file here (a path or file://), not a p2p: or https:
    reference."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):", uri)  # two letters at least: not C:
    return scheme is None or scheme.group(1).lower() == "file"


def check_dataset(uri: str, method: str, recipe: Any = None) -> str:
    """Validates the local dataset file `uri` for `method` (SFT/DPO/GRPO records, CPT text) and
    the recipe's GRPO reward; returns a summary ("412 records (sft, messages)"). A bad file is a
    ConfigError listing its bad lines by number."""
    checkers = entry_points(group=DATASET_CHECKERS)
    if not checkers:
        raise ConfigError(
            f"no dataset checker is installed to validate {uri!r}: install the dtrain node "
            "package (pip install -e .), or pass --dataset-hash to pin a file without reading it"
        )
    checker = next(iter(checkers))
    try:
        check = checker.load()
    except ImportError as exc:
        raise ConfigError(f"the dataset checker {checker.value!r} cannot load: {exc}") from None
    try:
        return str(check(uri.removeprefix("file://"), method, recipe))
    except ValueError as exc:  # the node's DatasetError is a ValueError
        raise ConfigError(str(exc)) from None


JOB_CHECKERS = "dtrain.job_check"


def check_job(
    model_uri: str,
    dataset_uri: str,
    method: str,
    recipe: Any = None,
    compression: tuple[int, int, int] | None = None,
    fit_topk: bool = False,
) -> tuple[bytes, dict[str, int] | None]:
    """Builds the job the way every node will (the model loads, the dataset's records fit its
    tokenizer and sequence length, the recipe fits the model: LoRA targets, seq_len, GRPO's
    answers; with `compression` = (top-k per chunk, bits, seats), its members can sync the
    model; with `fit_topk`, at the largest top-k up to the given one whose packet fits the
    gossip limit) and returns the model's pin and the sync checked: top-k per chunk, a
    member's packet bytes and the parameters synced (None without `compression`, or without a
    node package to check it); a job that cannot train is a ConfigError."""
    checkers = entry_points(group=JOB_CHECKERS)
    if not checkers or not model_uri:  # no node package, or no model: model_hash says what
        return model_hash(model_uri), None
    checker = next(iter(checkers))
    try:
        check = checker.load()
    except ImportError as exc:
        raise ConfigError(f"the job checker {checker.value!r} cannot load: {exc}") from None
    try:
        data = dataset_uri.removeprefix("file://")
        extra: dict[str, Any] = {} if compression is None else {"compression": compression}
        if fit_topk:
            extra["fit_topk"] = True
        pin, sync = check(model_uri, data, method, recipe, **extra)
        return bytes(pin), sync
    except Exception as exc:  # the node's own error types: report the line it gives
        raise ConfigError(f"this job could not train: {exc}") from None


def check_job_inputs(
    model_uri: str,
    dataset_uri: str,
    method: str,
    recipe: Any = None,
    compression: tuple[int, int, int] | None = None,
    fit_topk: bool = False,
) -> tuple[str, bytes, dict[str, int] | None]:
    """The one validation of a job's inputs, which `dtrain data check` and `dtrain job submit`
    both run on local copies: the dataset's records for `method` (`check_dataset`), then the job
    built as every node will build it (`check_job`). (the dataset's summary, the model's pin,
    the sync checked)."""
    summary = check_dataset(dataset_uri, method, recipe)
    return summary, *check_job(model_uri, dataset_uri, method, recipe, compression, fit_topk)
