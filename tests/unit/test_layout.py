"""The layout rules of docs/architecture.md, checked on the source tree."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "node" / "dtrain_node", ROOT / "sdk" / "dtrain"]
MAX_LINES = 60
MAX_PARAMS = 8


def _modules(*dirs: Path) -> Iterator[tuple[Path, ast.Module]]:
    for d in dirs:
        for path in sorted(d.rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _is_click_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    def name(d: ast.expr) -> str:
        d = d.func if isinstance(d, ast.Call) else d
        return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")

    return any(name(d) in {"command", "group"} for d in fn.decorator_list)


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_product_imports_no_test_harness() -> None:
    bad = []
    for path, tree in _modules(*PRODUCT):
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "harness"]
    assert not bad, bad


def test_no_test_loads_a_file_by_path() -> None:
    bad = [
        str(path.relative_to(ROOT))
        for path, _ in _modules(ROOT / "tests", ROOT / "scripts")
        if "spec_from_file_location" in path.read_text() and path != Path(__file__)
    ]
    assert not bad, bad


def test_functions_are_short_and_take_few_parameters() -> None:
    bad = []
    for path, tree in _modules(*PRODUCT):
        for fn in _functions(tree):
            if _is_click_command(fn):
                continue
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            params = [p for p in params if p.arg not in ("self", "cls")]
            lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            where = f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"
            if lines > MAX_LINES:
                bad.append(f"{where}: {lines} lines")
            if len(params) > MAX_PARAMS:
                bad.append(f"{where}: {len(params)} parameters")
    assert not bad, "\n".join(bad)
