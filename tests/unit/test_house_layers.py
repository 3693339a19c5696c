"""The layers hold: every import between Quiver's packages points down the order below, or is one of the few
commented exceptions.

The walker is `test_house_imports`'s (module level and inside functions, `TYPE_CHECKING` blocks left out, with
the install mapping `monitoring/` → `quiver.monitoring`, `pipelines/` → `quiver.pipelines`). A package may
import its own modules and any package earlier in `LAYERS`; an import of a later package fails the test
unless its (module, target package) pair is in `ALLOWED`. With one order for every package, no cycle between
packages can form outside the allowed pairs.
"""

from __future__ import annotations

from tests.unit.test_house_imports import import_graph

# Bottom first. The stores: offline below online (online reads offline tiles to materialize) below streaming
# (the stream writes the online store and leaves late events for the offline backfill).
LAYERS = ("quiver.catalog", "quiver.artifacts", "quiver.kafka_properties", "quiver.config", "quiver.metrics", "quiver.jars", "quiver",
          "quiver.compile", "quiver.offline", "quiver.online", "quiver.streaming", "quiver.registry",
          "quiver.models", "quiver.serving", "quiver.monitoring", "quiver.composition", "quiver.pipelines",
          "quiver.ui", "quiver.cli",
          "quiver.pipelines.demo")  # the demo uses the product as a user does; nothing imports it

# (importing module, imported package): the upward imports the house accepts, each for its reason.
ALLOWED = {
    # Backfill and materialize record their runs in the project's registry when the caller passes none.
    ("quiver.offline.backfill", "quiver.registry"),
    ("quiver.online.materialize", "quiver.registry"),
    # ModelRegistry.load returns the version's model, loaded and checked against its recorded sha256.
    ("quiver.registry.models", "quiver.models"),
}


def package_of(module: str) -> str:
    """The entry of LAYERS a module belongs to (`quiver.serving.store` → `quiver.serving`; the demo
    sub-package is its own entry)."""
    parts = module.split(".")
    if parts[:3] == ["quiver", "pipelines", "demo"]:
        return "quiver.pipelines.demo"
    return ".".join(parts[:2]) if len(parts) > 1 else module


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, imported module) pairs that point up the layers and are not allowed."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    out = []
    for module, targets in sorted(graph.items()):
        here = package_of(module)
        for target in sorted(targets):
            there = package_of(target)
            if there != here and rank[there] > rank[here] and (module, there) not in ALLOWED:
                out.append((module, target))
    return out


def test_every_package_has_a_layer() -> None:
    packages = {package_of(m) for m in import_graph()}
    assert packages == set(LAYERS), f"missing from LAYERS: {packages - set(LAYERS)}; gone: {set(LAYERS) - packages}"


def test_imports_point_down_the_layers() -> None:
    found = upward_imports(import_graph())
    assert not found, "upward imports: " + "; ".join(f"{a} → {b}" for a, b in found)


def test_every_allowed_exception_is_still_needed() -> None:
    graph = import_graph()
    used = {(m, package_of(t)) for m, targets in graph.items() for t in targets}
    assert used >= ALLOWED, f"allowed but no longer imported (remove them): {ALLOWED - used}"


def test_a_planted_upward_import_fails() -> None:
    planted = {name: set(deps) for name, deps in import_graph().items()}
    planted["quiver.offline.pit"].add("quiver.serving.store")  # a store reaching up into serving
    planted["quiver.cli"].add("quiver.pipelines.demo.run")  # the product importing the demo
    assert upward_imports(planted) == [("quiver.cli", "quiver.pipelines.demo.run"),
                                       ("quiver.offline.pit", "quiver.serving.store")]
