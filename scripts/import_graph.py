"""Print Quiver's package-level import graph: every `import` of a quiver module, at module level and inside
functions, read with the install mapping (pipelines/ → quiver.pipelines, monitoring/ → quiver.monitoring).

    python scripts/import_graph.py            # edges "a -> b  (count, of which lazy)"
    python scripts/import_graph.py --cycles   # strongly connected groups of packages
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"quiver": REPO / "platform" / "quiver", "quiver.pipelines": REPO / "pipelines",
         "quiver.monitoring": REPO / "monitoring"}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def package_of(module: str) -> str:
    """The subpackage (quiver.offline), or for a module at the top of quiver the module itself (quiver.config):
    those sit in different layers."""
    return ".".join(module.split(".")[:2])


PACKAGES: set[str] = set()


def imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported quiver module, lazy) for each import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, bool]] = []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                out.extend((a.name, inner) for a in child.names if a.name.startswith("quiver"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base.startswith("quiver"):
                    out.extend((f"{base}.{a.name}" if f"{base}.{a.name}" in KNOWN else base, inner)
                               for a in child.names)
            visit(child, inner)

    visit(tree, False)
    return out


KNOWN: dict[str, Path] = {}


def graph() -> dict[tuple[str, str], list[bool]]:
    edges: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for module, path in KNOWN.items():
        source = package_of(module)
        for target, lazy in imports(module, path):
            while target not in KNOWN and "." in target:
                target = target.rsplit(".", 1)[0]
            dest = package_of(target)
            if dest != source:
                edges[(source, dest)].append(lazy)
    return edges


def cycles(edges: dict[tuple[str, str], list[bool]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one package."""
    nodes = sorted({n for edge in edges for n in edge})
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in nodes:
        if v not in index:
            strong(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", action="store_true")
    args = parser.parse_args()
    KNOWN.update(modules())
    PACKAGES.update(m for m, p in KNOWN.items() if p.name == "__init__.py")
    edges = graph()
    if args.cycles:
        for group in cycles(edges):
            print(" ⟲ ".join(group))
        return
    for (a, b), kinds in sorted(edges.items()):
        print(f"{a} -> {b}  ({len(kinds)}, {sum(kinds)} lazy)")


if __name__ == "__main__":
    main()
