"""The model registry on real SQLite files and a real PostgreSQL server: versions, aliases (compare-and-set),
the append-only alias history, rollback — and several processes moving `champion` at once."""

from __future__ import annotations

import multiprocessing as mp
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from quiver.catalog.errors import QuiverError
from quiver.registry import Registry
from quiver.registry.models import AliasConflict, ModelRegistry, ModelVersion

pytestmark = pytest.mark.integration

START, CUTOFF = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 11, tzinfo=UTC)


def register(models: ModelRegistry, name: str = "fraud", status: str = "registered", auc: float = 0.8,
             sha256: str = "") -> ModelVersion:
    """A version whose metrics make the registry give it `status` (the registry decides, not the caller)."""
    auc = auc if status == "registered" else 0.6
    sha = sha256 or f"{name}:{auc}:{status}".encode().hex().ljust(64, "0")[:64]
    return models.register(name, artifact_path=f"models/{name}/x", sha256=sha,
                           metrics={"roc_auc": auc, "baseline": {"roc_auc": 0.7}}, window_start=START, cutoff=CUTOFF,
                           features=["amount_count_1h", "risk_score"], catalog_version=2, label_column="is_fraud",
                           lineage={"rows": {"train": 10, "validation": 3}}, reference_path="models/ref.parquet")


def test_versions_are_numbered_per_name_and_read_back_whole(registry_url: str) -> None:
    models = ModelRegistry(Registry(registry_url, project="m"), verify_artifacts=False)
    first, second, other = register(models), register(models, auc=0.85), register(models, "churn")
    assert (first.version, second.version, other.version) == (1, 2, 1)
    got = models.get("fraud", 2)
    assert got == second and got.label == "fraud:2"
    assert got.window_start == START and got.cutoff == CUTOFF and got.created_at.tzinfo is not None
    assert got.metrics["baseline"] == {"roc_auc": 0.7} and got.lineage["rows"]["train"] == 10
    assert [v.version for v in models.versions("fraud")] == [1, 2] and models.names() == ["churn", "fraud"]
    assert models.resolve("fraud", "v1") == first
    with pytest.raises(QuiverError, match=r"no version 9 \(its versions: 1, 2\)"):
        models.get("fraud", 9)
    other_project = ModelRegistry(Registry(registry_url, project="elsewhere"), verify_artifacts=False)
    assert other_project.versions() == []


def test_alias_compare_and_set_history_and_rollback(registry_url: str) -> None:
    models = ModelRegistry(Registry(registry_url, project="m"), verify_artifacts=False)
    for _ in range(3):
        register(models)
    first = models.set_alias("fraud", "champion", 1, expected=None, reason="first model", by="alice")
    assert (first.from_version, first.to_version, first.by) == (None, 1, "alice")
    with pytest.raises(AliasConflict, match="points at version 1, not the expected nothing") as info:
        models.set_alias("fraud", "champion", 2, expected=None, reason="stale read")
    assert (info.value.expected, info.value.actual) == (None, 1)
    models.set_alias("fraud", "champion", 2, expected=1, reason="beat v1 in canary", decision_id=41)
    assert models.aliases("fraud") == {"champion": 2, "previous": 1}
    # A retried move that already happened returns the entry that made it (idempotent), writes nothing.
    retried = models.set_alias("fraud", "champion", 2, expected=2, reason="retry")
    assert retried.decision_id == 41 and len(models.history("fraud")) == 3
    models.set_alias("fraud", "shadow", 3, expected=None, reason="shadow v3")
    back = models.rollback("fraud", reason="canary guardrail", decision_id=42)
    assert (back.from_version, back.to_version) == (2, 1)
    assert models.aliases("fraud") == {"champion": 1, "previous": 2, "shadow": 3}
    assert models.alias("fraud", "champion") == models.get("fraud", 1)
    models.set_alias("fraud", "shadow", None, expected=3, reason="shadow done")
    assert "shadow" not in models.aliases("fraud")
    moves = [(m.alias, m.from_version, m.to_version) for m in models.history("fraud")]
    assert moves == [("champion", None, 1), ("champion", 1, 2), ("previous", None, 1), ("shadow", None, 3),
                     ("champion", 2, 1), ("previous", 1, 2), ("shadow", 3, None)]
    assert [m.reason for m in models.history("fraud", "previous")] == [
        "replaced as champion by fraud:2: beat v1 in canary", "rollback: canary guardrail"]
    with pytest.raises(QuiverError, match="needs a reason"):
        models.set_alias("fraud", "canary", 3, expected=None, reason=" ")
    with pytest.raises(QuiverError, match="plain identifier"):
        models.set_alias("fraud", "bad alias", 3, expected=None, reason="x")
    with pytest.raises(AliasConflict):
        models.rollback("fraud", reason="stale", expected=2)


def test_a_rejected_or_archived_version_never_gets_an_alias(registry_url: str) -> None:
    models = ModelRegistry(Registry(registry_url, project="m"), verify_artifacts=False)
    register(models)
    rejected = register(models, status="rejected", auc=0.6)
    with pytest.raises(QuiverError, match=r"fraud:2 is rejected .* can never get an alias"):
        models.set_alias("fraud", "champion", rejected.version, expected=None, reason="try anyway")
    models.set_alias("fraud", "champion", 1, expected=None, reason="ok")
    with pytest.raises(QuiverError, match="still holds alias"):
        models.archive("fraud", 1)
    third = register(models)
    assert models.archive("fraud", third.version).status == "archived"
    with pytest.raises(QuiverError, match="is archived"):
        models.set_alias("fraud", "shadow", third.version, expected=None, reason="x")
    with pytest.raises(QuiverError, match="no 'previous' version"):
        models.rollback("fraud", reason="nothing to go back to")
    assert models.aliases("fraud") == {"champion": 1}


def test_the_registry_derives_the_status_and_a_rejected_artifact_needs_a_recorded_override(registry_url: str) -> None:
    models = ModelRegistry(Registry(registry_url, project="m"))
    sha = "cd" * 32
    lost = register(models, status="rejected", sha256=sha)
    assert lost.status == "rejected"  # its metrics are worse than the baseline's: the registry says so
    no_evidence = models.register("fraud", artifact_path="models/y", sha256="ef" * 32, metrics={},
                                  window_start=START, cutoff=CUTOFF, features=["f"], catalog_version=None,
                                  label_column="is_fraud", lineage={}, reference_path="")
    assert no_evidence.status == "rejected"
    # The same artifact again, as a "new" serving version: refused without a recorded override.
    with pytest.raises(QuiverError, match=r"rejected as fraud:1.*override"):
        register(models, sha256=sha)
    forced = models.register("fraud", artifact_path="models/x", sha256=sha, metrics=lost.metrics, window_start=START,
                             cutoff=CUTOFF, features=["f"], catalog_version=None, label_column="is_fraud",
                             lineage={"note": "kept"}, reference_path="", override="incident #42: approved by risk",
                             created_by="operator")
    assert forced.status == "registered" and forced.lineage["note"] == "kept"
    assert forced.lineage["override"]["reason"] == "incident #42: approved by risk"
    assert forced.lineage["override"]["status_from_metrics"] == "rejected" and forced.lineage["override"]["by"] == "operator"


def test_history_rows_are_only_ever_inserted(registry_url: str) -> None:
    models = ModelRegistry(Registry(registry_url, project="m"), verify_artifacts=False)
    register(models), register(models)
    models.set_alias("fraud", "champion", 1, expected=None, reason="a")
    before = _history_rows(registry_url)
    models.set_alias("fraud", "champion", 2, expected=1, reason="b")
    models.rollback("fraud", reason="c")
    after = _history_rows(registry_url)
    assert after[: len(before)] == before and len(after) == len(before) + 4


def _history_rows(url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(
                "SELECT id, alias, from_version, to_version, reason FROM model_alias_history ORDER BY id"))]
    finally:
        engine.dispose()


# ----- several processes moving the same alias -----

def _promote_worker(url: str, worker: int, moves: int, versions: int, barrier: Any, out: Any) -> None:
    try:
        models = ModelRegistry(Registry(url, project="conc"), verify_artifacts=False)
        barrier.wait(timeout=120)
        done = conflicts = 0
        while done < moves:
            current = models.aliases("fraud").get("champion")
            target = (current or 0) % versions + 1  # always a different version than the one read
            try:
                move = models.set_alias("fraud", "champion", target, expected=current,
                                        reason=f"w{worker} move {done}", by=f"w{worker}")
            except AliasConflict:
                conflicts += 1
                continue
            out.put(("move", worker, move.id, move.from_version, move.to_version))
            done += 1
        out.put(("conflicts", worker, conflicts, 0, 0))
        models.registry.close()
    except BaseException as exc:
        out.put(("error", worker, repr(exc), 0, 0))
        raise


def test_concurrent_alias_moves_never_lose_or_interleave_a_history_entry(registry_url: str) -> None:
    workers, moves, versions = 4, 6, 4
    models = ModelRegistry(Registry(registry_url, project="conc"), verify_artifacts=False)
    for _ in range(versions):
        register(models)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_promote_worker, args=(registry_url, w, moves, versions, barrier, out))
             for w in range(workers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in range(workers * moves + workers)]
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * workers, results
    assert not [r for r in results if r[0] == "error"], results
    done = sorted((r[2], r[3], r[4]) for r in results if r[0] == "move")
    assert len(done) == workers * moves

    history = models.history("fraud")
    champion = [m for m in history if m.alias == "champion"]
    # Every successful move is in the history exactly once, as its process saw it, and nothing else is.
    assert sorted((m.id, m.from_version, m.to_version) for m in champion) == done
    # The moves form one chain: each starts where the one before ended (no lost update).
    assert [m.from_version for m in champion[1:]] == [m.to_version for m in champion[:-1]]
    assert champion[0].from_version is None
    # Each champion move is immediately followed by its own `previous` move (no interleaving).
    by_id = {m.id: m for m in history}
    for move in champion[1:]:
        follower = by_id[move.id + 1]
        assert (follower.alias, follower.to_version) == ("previous", move.from_version)
    assert len(history) == 2 * len(champion) - 1
    assert models.aliases("fraud") == {"champion": champion[-1].to_version, "previous": champion[-1].from_version}
