"""The import rules of docs/architecture.md: no import circle in the node or the SDK, and the
rooms below the operator never reach up into it.

Every import counts, wherever it stands: at the top, inside a function or under
`TYPE_CHECKING` (a circle of types is still a circle of knowledge).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "node" / "dtrain_node", ROOT / "sdk" / "dtrain"]
# rooms the operator builds on (the verifier among them): they get what they need passed in
BELOW_OPERATOR = ("train", "optim", "p2p", "serve", "verify")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the node and the SDK."""
    out = {}
    for root in PACKAGES:
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, here: str, is_pkg: bool, files: dict[str, Path]) -> Iterator[str]:
    """The modules an import statement loads: `from pkg import mod` the module, `from mod
    import name` the module that holds the name."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = here if is_pkg else here.rpartition(".")[0]
            for _ in range(node.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{base}" if base else pkg
        yield from (f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the node and the SDK it imports, anywhere in its file."""
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = _imported(node, mod, path.name == "__init__.py", files)
            graph[mod] |= {n for n in names if n in files and n != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


@functools.cache
def product_graph() -> dict[str, set[str]]:
    """The import graph of the node and the SDK as they are on disk (read once a session)."""
    return import_graph(module_files())


def test_no_import_circle_in_the_node_or_the_sdk() -> None:
    found = circles(product_graph())
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_rooms_below_the_operator_never_import_it() -> None:
    graph = product_graph()
    below = tuple(f"dtrain_node.{room}" for room in BELOW_OPERATOR)
    bad = sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod.startswith(below)
        for dep in deps
        if dep.startswith("dtrain_node.operator")
    )
    assert bad == []


def test_train_optim_and_p2p_never_import_each_other() -> None:
    """They meet only through plain data the operator hands over (docs/architecture.md)."""
    graph = product_graph()
    rooms = ("train", "optim", "p2p")

    def room(mod: str) -> str | None:
        parts = mod.split(".")
        return parts[1] if len(parts) > 2 and parts[0] == "dtrain_node" else None

    bad = sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if room(mod) in rooms
        for dep in deps
        if room(dep) in rooms and room(dep) != room(mod)
    )
    assert bad == []


def test_the_import_graph_sees_every_kind_of_import() -> None:
    """The checks above fail on a circle made by a deferred or type-only import."""
    graph = product_graph()
    assert graph["dtrain_node.operator.node"], "the node imports nothing?"
    made = {m: set(d) for m, d in graph.items()}
    made["dtrain_node.train.backend"].add("dtrain_node.operator.node")
    assert any("dtrain_node.train.backend" in c for c in circles(made))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
