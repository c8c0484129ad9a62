"""What `dtrain job submit` pins on-chain for a job's model and dataset, computed from the
references the caller gives, so nobody computes a hash by hand.

A model's hash comes from a hasher plugin (entry point group `dtrain.model_hash`; the node
package installs one for its built-in models, `dtrain_node.train.models:initial_hash`): the
canonical hash of the weights the job starts from. A dataset's hash is the sha256 of its file.
"""

from __future__ import annotations

import hashlib
from importlib.metadata import entry_points
from pathlib import Path

from .errors import ConfigError

MODEL_HASHERS = "dtrain.model_hash"


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
