"""Print Quiver's package-level import graph, from the same walker as the module-cycle test
(tests/unit/test_house_imports.py: every import, at the top and inside functions, with the install mapping
pipelines/ → quiver.pipelines, monitoring/ → quiver.monitoring).

    python scripts/import_graph.py            # "a -> b  (n module imports)", one line per package edge
    python scripts/import_graph.py --cycles   # groups of packages that import each other

A package is a subpackage (quiver.offline), or, for a module at the top of quiver, the module (quiver.config);
the demo (quiver.pipelines.demo) is its own. The layers the edges must follow: tests/unit/test_house_layers.py.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_house_imports import cycles, import_graph
from tests.unit.test_house_layers import package_of


def package_edges() -> Counter[tuple[str, str]]:
    edges: Counter[tuple[str, str]] = Counter()
    for module, targets in import_graph().items():
        for target in targets:
            if package_of(module) != package_of(target):
                edges[(package_of(module), package_of(target))] += 1
    return edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", action="store_true", help="print only the groups that import each other")
    args = parser.parse_args()
    edges = package_edges()
    if args.cycles:
        graph: dict[str, set[str]] = {}
        for a, b in edges:
            graph.setdefault(a, set()).add(b)
        for group in cycles(graph):
            print(" ⟲ ".join(group))
        return
    for (a, b), count in sorted(edges.items()):
        print(f"{a} -> {b}  ({count})")


if __name__ == "__main__":
    main()
