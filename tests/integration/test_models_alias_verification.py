"""An alias never points at a version a server could not load: the registry verifies the artifact (files,
checksums, the sha256 it recorded, the features registered and those of the applied catalog) before it
moves `champion`, `canary`, `shadow` or rolls back — on real artifacts saved with torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quiver.catalog.errors import QuiverError
from quiver.models.artifact import MODEL_FILE, WEIGHTS_FILE
from tests.integration.test_prediction_service import MODEL, Project, project, register

pytestmark = pytest.mark.integration
__all__ = ["project"]


def artifact(project: Project, version: int) -> Path:
    return project.models.artifacts.local_dir(project.models.get(MODEL, version).artifact_path)


def test_a_corrupt_artifact_never_becomes_champion(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    weights = artifact(project, v2) / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-16] + b"\0" * 16)  # flipped bytes: the checksum no longer holds
    with pytest.raises(QuiverError, match=r"fraud:2 cannot get alias 'champion': its artifact fails verification.*"
                                          r"checksum mismatch"):
        project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="promote a damaged model")
    with pytest.raises(QuiverError, match="fails verification"):
        project.models.set_alias(MODEL, "canary", v2, expected=None, reason="canary a damaged model")
    assert project.models.aliases(MODEL) == {"champion": v1}
    assert [m.to_version for m in project.models.history(MODEL)] == [v1]  # nothing recorded for the refusals


def test_a_missing_artifact_or_other_features_are_refused(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2, numeric=("f0",))  # trained on fewer features
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    with pytest.raises(QuiverError, match=r"scores features \['f0', 'category'\], the registry recorded"):
        project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="features differ")
    meta = artifact(project, v1) / MODEL_FILE
    meta.rename(meta.with_suffix(".gone"))
    with pytest.raises(QuiverError, match="fails verification"):
        project.models.set_alias(MODEL, "shadow", v1, expected=None, reason="artifact gone")


def test_rollback_to_a_damaged_previous_is_refused(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="second")
    checksum = artifact(project, v1) / "checksum.json"
    manifest = json.loads(checksum.read_text())
    manifest["sha256"] = "0" * 64
    checksum.write_text(json.dumps(manifest))
    with pytest.raises(QuiverError, match="fails verification"):
        project.models.rollback(MODEL, reason="back to a damaged v1")
    assert project.models.aliases(MODEL)["champion"] == v2
