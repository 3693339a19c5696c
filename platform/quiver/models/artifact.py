"""The model artifact: one folder, verified by a checksum before anything in it is used.

    model.json      network config, preprocessing (means, stds, vocabularies), features as columns and as
                    catalog references (view:feature), catalog version, label column, model name
    weights.pt      the state dict (loaded with torch.load(weights_only=True): no pickled code runs)
    reference.parquet  the training window in the traffic's hourly mix (timestamp, features, "score" by this model):
                    what drift checks compare with (quiver.models.reference)
    checksum.json   sha256 of every file above and one sha256 over that list (the registry keeps it too)

Folders are content-addressed (``<root>/<name>/<sha256[:16]>``) and never changed after they are written.
Scoring imports only torch, numpy and the light core.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quiver.artifacts import PRIVATE_DIR, file_sha256, make_private, manifest_sha256, private_dirs
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.models.network import NetworkConfig, TabularNet
from quiver.models.scoring import Columns, Preprocessor

FORMAT_VERSION = 1
MODEL_FILE, WEIGHTS_FILE, REFERENCE_FILE, CHECKSUM_FILE = "model.json", "weights.pt", "reference.parquet", \
    "checksum.json"


@dataclass(frozen=True)
class MissingPolicy:
    """What to do with a row whose inputs are missing (NOT_FOUND, OUTSIDE_MAX_AGE or null): `score` it as
    is, `flag` it (scored, marked) or `refuse` it (no score) when more than `max_missing_share` of the
    model's inputs are missing. Rows are always told how many inputs were missing."""

    action: str = "flag"
    max_missing_share: float = 0.5

    def __post_init__(self) -> None:
        if self.action not in ("score", "flag", "refuse") or not 0 <= self.max_missing_share <= 1:
            raise ValueError(f"missing policy: action score|flag|refuse and a share in [0, 1], got {self}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MissingPolicy:
        return cls(**{k: v for k, v in data.items() if k in ("action", "max_missing_share")})

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "max_missing_share": self.max_missing_share}


class Scorer:
    """A loaded model: `predict` turns feature columns into fraud probabilities (float64)."""

    def __init__(self, model: TabularNet, preprocessor: Preprocessor, meta: Mapping[str, Any], *,
                 path: Path, sha256: str, version_label: str):
        self.model = model.eval()
        self.preprocessor = preprocessor
        self.meta = dict(meta)
        self.path = path
        self.sha256 = sha256
        self.version_label = version_label

    @property
    def features(self) -> list[str]:
        """Input columns, in the training set's (the feature service's) order."""
        return list(self.meta["features"])

    @property
    def feature_refs(self) -> list[str]:
        """The same features as catalog references ``view:feature`` (position i names features[i])."""
        return list(self.meta["feature_refs"])

    @property
    def missing_policy(self) -> MissingPolicy:
        """What serving does with a row whose inputs are missing (chosen at training time; artifacts from
        before the policy existed: flag above half)."""
        return MissingPolicy.from_dict(self.meta.get("missing_policy") or {})

    def predict(self, columns: Columns, batch_size: int = 65_536) -> np.ndarray:
        """Probabilities of the positive class, one per row of `columns` (a DataFrame or name → array)."""
        numeric, categorical = self.preprocessor.transform(columns)
        out = np.empty(len(numeric), dtype=np.float64)
        with torch.inference_mode():
            for start in range(0, len(numeric), batch_size):
                stop = start + batch_size
                logits = self.model.infer(torch.from_numpy(numeric[start:stop]),
                                          torch.from_numpy(categorical[start:stop]))
                out[start:stop] = torch.sigmoid(logits.double()).numpy()
        return out

    def __repr__(self) -> str:
        return f"Scorer({self.version_label}, {len(self.features)} features, {self.path})"


def save_artifact(root: str | Path, name: str, model: TabularNet, preprocessor: Preprocessor, *,
                  feature_refs: Sequence[str], features: Sequence[str] | None = None, catalog_version: int | None, catalog_hash: str, label_column: str,
                  reference: Any, extra: Mapping[str, Any] | None = None) -> tuple[Path, str]:
    """Write the artifact of `model` under `root/name/`; returns (folder, sha256).

    `reference` is a DataFrame of feature columns plus "score" (see quiver.models.reference); `features`
    are the column names in the training set's order (default: the preprocessor's), `feature_refs` the same
    as ``view:feature``.
    """
    columns = list(features) if features is not None else preprocessor.features
    if sorted(columns) != sorted(preprocessor.features) or len(columns) != len(feature_refs):
        raise ValueError(f"features {columns} and refs {list(feature_refs)} do not match the preprocessor's "
                         f"{preprocessor.features}")
    base = Path(root) / name
    private_dirs(base)  # owner-only, as every folder and file of the artifact (see quiver.artifacts)
    staging = base / f".staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir(mode=PRIVATE_DIR)
    try:
        meta = {"format_version": FORMAT_VERSION, "name": name, "network": model.config.to_dict(),
                "preprocessing": preprocessor.to_dict(), "features": columns,
                "feature_refs": list(feature_refs), "catalog_version": catalog_version,
                "catalog_hash": catalog_hash, "label_column": label_column, "torch": torch.__version__,
                **(extra or {})}
        (staging / MODEL_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        torch.save(state, staging / WEIGHTS_FILE)
        reference.to_parquet(staging / REFERENCE_FILE, index=False)
        files = {f: file_sha256(staging / f) for f in (MODEL_FILE, WEIGHTS_FILE, REFERENCE_FILE)}
        digest = manifest_sha256(files)
        (staging / CHECKSUM_FILE).write_text(json.dumps({"files": files, "sha256": digest}, indent=2))
        make_private(staging)
        final = base / digest[:16]
        if final.exists():  # the same bytes were written before: keep the first copy, it is identical
            shutil.rmtree(staging)
        else:
            os.replace(staging, final)
        return final, digest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_model(path: str | Path, catalog: Catalog | None = None, *, expected_sha256: str | None = None,
               version_label: str | None = None) -> Scorer:
    """Verify and load an artifact folder.

    Refuses (QuiverError) a file whose checksum does not match, a checksum other than `expected_sha256`
    (what the registry recorded), and — given `catalog` — features the catalog no longer defines, naming them.
    """
    folder = Path(path)
    digest = verify_artifact(folder, expected_sha256)
    meta = json.loads((folder / MODEL_FILE).read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise QuiverError(f"artifact {folder}: format version {meta.get('format_version')!r}, this Quiver reads "
                          f"{FORMAT_VERSION}")
    if catalog is not None:
        check_features(meta["feature_refs"], catalog, folder)
    network = TabularNet(NetworkConfig.from_dict(meta["network"]))
    state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    network.load_state_dict(state)
    label = version_label or f"{meta['name']}:{digest[:12]}"
    return Scorer(network, Preprocessor.from_dict(meta["preprocessing"]), meta, path=folder, sha256=digest,
                  version_label=label)


def verify_artifact(folder: Path, expected_sha256: str | None = None) -> str:
    """The artifact's sha256 after checking every file against checksum.json; QuiverError on any mismatch."""
    manifest_path = folder / CHECKSUM_FILE
    if not manifest_path.exists():
        raise QuiverError(f"{folder} is not a model artifact (no {CHECKSUM_FILE})")
    manifest = json.loads(manifest_path.read_text())
    files: dict[str, str] = manifest.get("files", {})
    absent = [f for f in (MODEL_FILE, WEIGHTS_FILE) if f not in files or not (folder / f).exists()]
    if absent:
        raise QuiverError(f"artifact {folder} lacks {', '.join(absent)}")
    bad = [f for f, sha in sorted(files.items()) if not (folder / f).exists() or file_sha256(folder / f) != sha]
    if bad:
        raise QuiverError(f"artifact {folder}: checksum mismatch for {', '.join(bad)}; refusing to load a "
                          f"modified or damaged model")
    digest = manifest_sha256(files)
    if digest != manifest.get("sha256"):
        raise QuiverError(f"artifact {folder}: {CHECKSUM_FILE} is inconsistent (files hash to {digest[:16]}…)")
    if expected_sha256 is not None and digest != expected_sha256:
        raise QuiverError(f"artifact {folder} has checksum {digest[:16]}…, the registry recorded "
                          f"{expected_sha256[:16]}…; refusing to load it")
    return digest


def check_features(feature_refs: Sequence[str], catalog: Catalog, where: Path | str = "") -> None:
    """QuiverError naming every ``view:feature`` the catalog no longer defines."""
    gone = []
    for ref in feature_refs:
        view, _, feature = ref.partition(":")
        spec = catalog.views.get(view) or catalog.on_demand.get(view)
        if spec is None or feature not in spec.feature_names:
            gone.append(ref)
    if gone:
        raise QuiverError(f"model {where} was trained on feature(s) the catalog no longer defines: "
                          f"{', '.join(gone)}; retrain it or restore them")
