"""Compiles contracts/src with py-solc-x through the solc wrapper and writes the ABI, bytecode
and NatSpec the SDK ships (sdk/dtrain/artifacts/DistributedTrainingBSM.json).

The compiler's `userdoc` (the `@notice` of every error, event and function) and `devdoc`
(`@dev`/`@param`) are kept: the SDK builds each contract error's message from its notice.

The SDK then needs neither Node.js nor a compiler. `sourceHash` records which sources the
artifact was built from; a test fails when it no longer matches contracts/src.
"""

from __future__ import annotations

import json
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk"))

from dtrain.artifacts import ARTIFACT_PATH, CONTRACT, source_hash  # noqa: E402

SOLC = ROOT / "scripts" / "solc"
# The read-only extension the BSM deploys in its constructor and delegates unknown selectors to:
# its functions are part of the BSM's interface, so the shipped ABI and NatSpec merge both.
VIEWS = f"{CONTRACT}Views"
OZ = ROOT / "scripts" / "toolchain" / "node_modules" / "@openzeppelin"


IMPORT = re.compile(r'^\s*import\s+(?:[^"\']*\s+from\s+)?["\']([^"\']+)["\']', re.M)


def _resolve(name: str, importer: str) -> tuple[str, Path]:
    key = (
        name
        if name.startswith("@")
        else posixpath.normpath(posixpath.join(posixpath.dirname(importer), name))
    )
    if key.startswith("@openzeppelin/"):
        return key, OZ / key.removeprefix("@openzeppelin/")
    return key, ROOT / key


def standard_input() -> dict:
    """Sources of contracts/src plus, transitively, exactly the files they import."""
    todo = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "contracts/src").rglob("*.sol"))]
    paths = {key: ROOT / key for key in todo}
    sources: dict[str, dict[str, str]] = {}
    while todo:
        key = todo.pop()
        if key in sources:
            continue
        text = paths[key].read_text()
        sources[key] = {"content": text}
        for name in IMPORT.findall(text):
            dep, path = _resolve(name, key)
            if dep not in sources:
                paths[dep] = path
                todo.append(dep)
    return {
        "language": "Solidity",
        "sources": dict(sorted(sources.items())),
        "settings": {
            "optimizer": {"enabled": True, "runs": 200},
            "evmVersion": "cancun",
            # Same settings as foundry.toml: only the IR pipeline fits the 24 KiB limit.
            "viaIR": True,
            "outputSelection": {
                f"contracts/src/{name}.sol": {
                    name: [
                        "abi",
                        "userdoc",
                        "devdoc",
                        "evm.bytecode.object",
                        "evm.deployedBytecode.object",
                    ]
                }
                for name in (CONTRACT, VIEWS)
            },
        },
    }


def _abi_key(item: dict) -> tuple:
    return (item["type"], item.get("name"), tuple(i["type"] for i in item.get("inputs", [])))


def merge_abi(main: list[dict], extension: list[dict]) -> list[dict]:
    """The BSM's ABI plus the extension's entries it does not already have (not its
    constructor): the interface a client sees at the BSM's address."""
    seen = {_abi_key(x) for x in main}
    extra = [x for x in extension if x["type"] != "constructor" and _abi_key(x) not in seen]
    return main + extra


def merge_doc(main: dict, extension: dict) -> dict:
    """NatSpec of both; the BSM's own entries win."""
    out = dict(extension)
    out.update(main)
    for kind in ("methods", "errors", "events"):
        if kind in main or kind in extension:
            out[kind] = {**extension.get(kind, {}), **main.get(kind, {})}
    return out


def main() -> int:
    import solcx

    out = solcx.compile_standard(standard_input(), solc_binary=str(SOLC))
    errors = [e for e in out.get("errors", []) if e.get("severity") == "error"]
    if errors:
        for e in errors:
            print(e.get("formattedMessage", e), file=sys.stderr)
        return 1
    c = out["contracts"][f"contracts/src/{CONTRACT}.sol"][CONTRACT]
    v = out["contracts"][f"contracts/src/{VIEWS}.sol"][VIEWS]
    artifact = {
        "contractName": CONTRACT,
        "sourceHash": source_hash(),
        "compiler": "solc 0.8.28 (solcjs), via-ir, optimizer 200 runs, evm cancun",
        "abi": merge_abi(c["abi"], v["abi"]),
        "userdoc": merge_doc(c["userdoc"], v["userdoc"]),
        "devdoc": merge_doc(c["devdoc"], v["devdoc"]),
        "bytecode": "0x" + c["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + c["evm"]["deployedBytecode"]["object"],
    }
    ARTIFACT_PATH.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT_PATH.write_text(json.dumps(artifact, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ARTIFACT_PATH.relative_to(ROOT)} ({len(artifact['bytecode']) // 2 - 1} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
