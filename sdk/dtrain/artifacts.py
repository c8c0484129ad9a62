"""The compiled BSM shipped inside the package (built by scripts/build_artifacts.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CONTRACT = "DistributedTrainingBSM"
ARTIFACT_PATH = Path(__file__).resolve().parent / "artifacts" / f"{CONTRACT}.json"


@dataclass(frozen=True)
class Artifact:
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str
    source_hash: str


@cache
def load() -> Artifact:
    raw = json.loads(ARTIFACT_PATH.read_text())
    return Artifact(raw["abi"], raw["bytecode"], raw["deployedBytecode"], raw["sourceHash"])


def source_hash(root: Path | None = None) -> str:
    """sha256 over contracts/src (path and content of every .sol file, sorted)."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted((root / "contracts" / "src").rglob("*.sol")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()
