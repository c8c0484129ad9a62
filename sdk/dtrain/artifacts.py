"""The compiled BSM shipped inside the package (built by scripts/build_artifacts.py): ABI,
bytecode and the compiler's NatSpec output (userdoc and devdoc)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

CONTRACT = "DistributedTrainingBSM"
ARTIFACT_PATH = Path(__file__).resolve().parent / "artifacts" / f"{CONTRACT}.json"
# The attestation verifier the SDK deploys next to a BSM (artifacts/<name>.json).
VERIFIER = "SignedAttestationVerifier"
# The BSM's extensions, deployed before it: hooks, then views (taking the hooks' address), then
# the BSM (taking the views' address). Their ABIs are merged into the BSM's.
HOOKS = f"{CONTRACT}Hooks"
VIEWS = f"{CONTRACT}Views"


@dataclass(frozen=True)
class Artifact:
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str
    source_hash: str
    userdoc: dict[str, Any] = field(default_factory=dict)
    devdoc: dict[str, Any] = field(default_factory=dict)

    def natspec(self, kind: str, signature: str) -> str:
        """One line of NatSpec for an error or event (`kind` "errors" or "events") given by its
        canonical signature, e.g. "UnknownJob(uint256)": its `@notice`, else its `@dev` text
        (library errors document themselves with `@dev` only), else ""."""
        for doc, tag in ((self.userdoc, "notice"), (self.devdoc, "details")):
            entries = doc.get(kind, {}).get(signature, [])
            for entry in entries if isinstance(entries, list) else [entries]:
                if entry.get(tag):
                    return " ".join(entry[tag].split())
        return ""


@cache
def load() -> Artifact:
    raw = json.loads(ARTIFACT_PATH.read_text())
    return Artifact(
        abi=raw["abi"],
        bytecode=raw["bytecode"],
        deployed_bytecode=raw["deployedBytecode"],
        source_hash=raw["sourceHash"],
        userdoc=raw.get("userdoc", {}),
        devdoc=raw.get("devdoc", {}),
    )


@cache
def load_named(name: str) -> Artifact:
    """A companion contract's artifact (e.g. `VERIFIER`), shipped next to the BSM's."""
    raw = json.loads((ARTIFACT_PATH.parent / f"{name}.json").read_text())
    return Artifact(
        abi=raw["abi"],
        bytecode=raw["bytecode"],
        deployed_bytecode=raw["deployedBytecode"],
        source_hash=raw["sourceHash"],
        userdoc=raw.get("userdoc", {}),
    )


def source_hash(root: Path | None = None) -> str:
    """sha256 over contracts/src (path and content of every .sol file, sorted)."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted((root / "contracts" / "src").rglob("*.sol")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()
