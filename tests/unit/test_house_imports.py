"""The house stands on its own: no import cycle among Quiver's own modules.

Every module of `quiver` (platform/quiver), `pipelines` and `monitoring` is parsed, and every import it makes
— at the top and inside functions, since a lazy import is still a dependency — becomes an edge. Imports under
`if TYPE_CHECKING:` are left out (they never run). Any strongly connected group of two or more modules, or a
module importing itself, fails the test with the cycle spelled out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"quiver": REPO / "platform" / "quiver", "quiver.pipelines": REPO / "pipelines",
         "quiver.monitoring": REPO / "monitoring"}


def module_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in ROOTS.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or "migrations" in path.relative_to(folder).parts:
                continue
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a.b import c` depends on a.b.c when c is a module, else on a.b
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def test_the_walker_sees_lazy_imports_and_finds_a_planted_cycle() -> None:
    graph = import_graph()
    assert "quiver.compile.duckdb" in graph["quiver.compile"]  # a lazy import inside dialect_for counts
    assert "quiver.monitoring.stats" in graph["quiver.monitoring.drift"]
    planted = {name: set(deps) for name, deps in graph.items()}
    planted["quiver.compile.sql"].add("quiver.compile.duckdb")  # the cycle the issue found
    assert ["quiver.compile.duckdb", "quiver.compile.sql"] in cycles(planted)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" ↔ ".join(group) for group in found)
