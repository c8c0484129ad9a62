"""Compiles contracts/src with py-solc-x through the solc wrapper and writes the ABI, bytecode
and NatSpec the SDK ships (sdk/dtrain/artifacts/DistributedTrainingBSM.json): the BSM's with
those of its two extensions (views, hooks) merged in, as clients see them at the BSM's address.

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
# The BSM's extensions, deployed before it (hooks, then views with the hooks' address, then the
# BSM with the views' address): the BSM delegates every selector it does not have to the views
# extension, which delegates every selector it does not have to the hooks extension. Their
# functions are part of the BSM's interface at its one address, so the shipped ABI and NatSpec
# merge all three (the BSM's own entries first, then the views', then the hooks'); each is also
# shipped as artifacts/<Name>.json for its bytecode.
VIEWS = f"{CONTRACT}Views"
HOOKS = f"{CONTRACT}Hooks"
EXTENSIONS = (VIEWS, HOOKS)
# Devnet-only contracts (contracts/src/devnet) the SDK deploys on a local chain, shipped with
# ABI and bytecode only, each as artifacts/<Name>.json.
DEVNET = ("TestUSD", "DevMulticall")
# Contracts the SDK deploys next to the BSM (contracts/src/<Name>.sol), shipped with ABI,
# bytecode and NatSpec as artifacts/<Name>.json.
COMPANIONS = ("SignedAttestationVerifier",)
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
                for name in (CONTRACT, *EXTENSIONS)
            }
            | {
                f"contracts/src/devnet/{name}.sol": {
                    name: ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]
                }
                for name in DEVNET
            }
            | {
                f"contracts/src/{name}.sol": {
                    name: ["abi", "userdoc", "evm.bytecode.object", "evm.deployedBytecode.object"]
                }
                for name in COMPANIONS
            },
        },
    }


def _abi_key(item: dict) -> tuple:
    return (item["type"], item.get("name"), tuple(i["type"] for i in item.get("inputs", [])))


def merge_abi(main: list[dict], *extensions: list[dict]) -> list[dict]:
    """The BSM's ABI plus each extension's entries not already there (not its constructor or
    fallback): the interface a client sees at the BSM's address. Earlier ABIs win."""
    out = list(main)
    seen = {_abi_key(x) for x in out}
    for extension in extensions:
        for x in extension:
            if x["type"] in ("constructor", "fallback", "receive") or _abi_key(x) in seen:
                continue
            seen.add(_abi_key(x))
            out.append(x)
    return out


def merge_doc(main: dict, *extensions: dict) -> dict:
    """NatSpec of all; the BSM's own entries win, then the earlier extension's."""
    out: dict = {}
    for doc in (*reversed(extensions), main):
        for key, value in doc.items():
            if key in ("methods", "errors", "events"):
                out[key] = {**out.get(key, {}), **value}
            else:
                out[key] = value
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
    ext = [out["contracts"][f"contracts/src/{name}.sol"][name] for name in EXTENSIONS]
    artifact = {
        "contractName": CONTRACT,
        "sourceHash": source_hash(),
        "compiler": "solc 0.8.28 (solcjs), via-ir, optimizer 200 runs, evm cancun",
        "abi": merge_abi(c["abi"], *(e["abi"] for e in ext)),
        "userdoc": merge_doc(c["userdoc"], *(e["userdoc"] for e in ext)),
        "devdoc": merge_doc(c["devdoc"], *(e["devdoc"] for e in ext)),
        "bytecode": "0x" + c["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + c["evm"]["deployedBytecode"]["object"],
    }
    ARTIFACT_PATH.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT_PATH.write_text(json.dumps(artifact, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ARTIFACT_PATH.relative_to(ROOT)} ({len(artifact['bytecode']) // 2 - 1} bytes)")
    for name in (*DEVNET, *COMPANIONS, *EXTENSIONS):
        where = "contracts/src/devnet" if name in DEVNET else "contracts/src"
        d = out["contracts"][f"{where}/{name}.sol"][name]
        path = ARTIFACT_PATH.parent / f"{name}.json"
        devnet = {
            "contractName": name,
            "sourceHash": artifact["sourceHash"],
            "abi": d["abi"],
            "bytecode": "0x" + d["evm"]["bytecode"]["object"],
            "deployedBytecode": "0x" + d["evm"]["deployedBytecode"]["object"],
        }
        if name in COMPANIONS:  # the extensions' NatSpec is merged into the BSM's
            devnet["userdoc"] = d["userdoc"]
        path.write_text(json.dumps(devnet, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(ROOT)} ({len(devnet['bytecode']) // 2 - 1} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
