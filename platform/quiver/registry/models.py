"""Model versions and aliases in the registry.

A model version is immutable once registered (only its status may move to ``archived``). Aliases
(``champion``, ``challenger``, ``shadow``, ``canary``, any identifier) point at versions; moving one is a
compare-and-set against the version the caller expects it to point at now, done under the registry's write
lock (SQLite ``BEGIN IMMEDIATE``, a Postgres advisory lock) and appended to an alias history that is never
rewritten. Promotion convention: when ``champion`` moves, the old champion becomes alias ``previous`` in the
same transaction, so a rollback is one move back.

Each move keeps two moments: `moved_at`, the wall time it was recorded, and `as_of`, the data time it acted on
— the data time of the decision that caused it, else the one the caller names (training: the version's
cutoff), else the wall time of the move itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, RowMapping, delete, func, insert, select, update

from quiver.catalog.errors import QuiverError, did_you_mean
from quiver.catalog.types import is_identifier
from quiver.registry.model_tables import model_alias_history, model_aliases, model_versions
from quiver.registry.repository import Registry, _author

if TYPE_CHECKING:
    from quiver.artifacts import ArtifactStore
    from quiver.catalog.ir import Catalog
    from quiver.models.artifact import Scorer

STATUSES = ("registered", "rejected", "archived")
CHAMPION, PREVIOUS = "champion", "previous"


class AliasConflict(QuiverError):
    """An alias move whose expected current version is not the actual one (someone else moved it first)."""

    def __init__(self, name: str, alias: str, expected: int | None, actual: int | None):
        self.name, self.alias, self.expected, self.actual = name, alias, expected, actual
        super().__init__(f"alias {alias!r} of model {name!r} points at {_label(actual)}, not the expected "
                         f"{_label(expected)}; re-read it and retry")


@dataclass(frozen=True)
class ModelVersion:
    """One registered model version (see the module docstring of quiver.registry.model_tables)."""

    name: str
    version: int
    status: str
    artifact_path: str
    sha256: str
    metrics: dict[str, Any]
    window_start: datetime
    cutoff: datetime
    features: list[str]
    catalog_version: int | None
    label_column: str
    lineage: dict[str, Any]
    reference_path: str
    created_at: datetime
    created_by: str = ""

    @property
    def label(self) -> str:
        """``name:version``, the label scorers and serving logs carry."""
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class AliasMove:
    """One entry of the alias history: `alias` moved from `from_version` to `to_version` (None = absent)."""

    id: int
    name: str
    alias: str
    from_version: int | None
    to_version: int | None
    reason: str
    by: str
    decision_id: int | None
    moved_at: datetime  # wall time recorded
    as_of: datetime | None = None  # data time it acted on (see the module docstring)

    @property
    def data_time(self) -> datetime:
        """The clock timelines sort by."""
        return self.as_of or self.moved_at


class ModelRegistry:
    """Model versions, aliases and alias history of one registry project.

    `artifacts` is the project's artifact store (quiver.artifacts): registered paths are recorded relative to
    it and `load` reads through it. Without one, only store keys and URIs can be registered.
    """

    def __init__(self, registry: Registry, artifacts: ArtifactStore | None = None, *,
                 verify_artifacts: bool | None = None):
        self.registry = registry
        self.project = registry.project
        self.artifacts = artifacts
        # An alias move checks the version's artifact (files, checksums, features) before it points anything
        # at it, through the store (default: whenever there is one). Off only for registries whose versions
        # have no artifact here (tests of the bookkeeping) or that only read aliases.
        if verify_artifacts and artifacts is None:
            raise QuiverError("verify_artifacts needs the artifact store: ModelRegistry(registry, "
                              "ArtifactStore.from_config(config))")
        self.verify_artifacts = artifacts is not None if verify_artifacts is None else verify_artifacts

    # ----- versions -----

    def register(self, name: str, *, artifact_path: str, sha256: str, metrics: Mapping[str, Any],
                 window_start: datetime, cutoff: datetime, features: Sequence[str], catalog_version: int | None,
                 label_column: str, lineage: Mapping[str, Any], reference_path: str,
                 created_by: str | None = None, override: str = "") -> ModelVersion:
        """Store a new version of model `name` (numbered 1, 2, … per name) and return it.

        The registry decides its status from the recorded metrics (`derive_status`): `registered` when it
        is not worse than its baseline on its test window, else `rejected` (it can never get an alias). An
        artifact (sha256) that was rejected once is refused as a new version, and metrics worse than the
        baseline make a rejected version, unless `override` says why it should serve anyway — kept in the
        lineage."""
        _check_name("model name", name)
        if len(sha256) != 64:
            raise QuiverError(f"sha256 must be 64 hex digits, got {sha256!r}")
        if not features:
            raise QuiverError(f"model {name!r}: a version needs at least one feature")
        if _utc(cutoff) <= _utc(window_start):
            raise QuiverError(f"model {name!r}: cutoff {cutoff} must be after window start {window_start}")
        status, why = derive_status(metrics)
        lineage = dict(lineage)
        if override.strip():
            lineage["override"] = {"reason": override.strip(), "by": (created_by or _author())[:255],
                                   "status_from_metrics": status, "why": why}
            status = "registered"
        artifact_path, reference_path = self._recorded(artifact_path), self._recorded(reference_path)
        now = datetime.now(UTC)
        with self.registry._write() as connection:
            rejected = connection.execute(select(model_versions.c.name, model_versions.c.version).where(
                model_versions.c.project == self.project, model_versions.c.sha256 == sha256,
                model_versions.c.status == "rejected")).first()
            if rejected is not None and not override.strip():
                raise QuiverError(f"artifact {sha256[:12]}… was rejected as {rejected.name}:{rejected.version}; it "
                                  f"serves only with a recorded override (register(..., override='why'))")
            latest = connection.execute(select(func.max(model_versions.c.version)).where(
                model_versions.c.project == self.project, model_versions.c.name == name)).scalar()
            version = int(latest or 0) + 1
            connection.execute(insert(model_versions).values(
                project=self.project, name=name, version=version, status=status, artifact_path=artifact_path,
                sha256=sha256, window_start=_utc(window_start), cutoff=_utc(cutoff),
                features_json=json.dumps(list(features)), catalog_version=catalog_version,
                label_column=label_column, metrics_json=json.dumps(dict(metrics), sort_keys=True, default=float),
                lineage_json=json.dumps(dict(lineage), sort_keys=True, default=str),
                reference_path=reference_path, created_at=now, created_by=(created_by or _author())[:255]))
        return self.get(name, version)

    def get(self, name: str, version: int) -> ModelVersion:
        """Version `version` of model `name`; a clear error when there is none."""
        with self.registry.engine.connect() as connection:
            row = connection.execute(select(model_versions).where(
                model_versions.c.project == self.project, model_versions.c.name == name,
                model_versions.c.version == version)).mappings().first()
        if row is None:
            self.require(name)
            known = [v.version for v in self.versions(name)]
            raise QuiverError(f"model {name!r} has no version {version} (its versions: {', '.join(map(str, known))})")
        return _version(row)

    def versions(self, name: str | None = None) -> list[ModelVersion]:
        """Versions of model `name` (every model when None), oldest first."""
        query = select(model_versions).where(model_versions.c.project == self.project)
        if name is not None:
            query = query.where(model_versions.c.name == name)
        with self.registry.engine.connect() as connection:
            rows = connection.execute(query.order_by(model_versions.c.name, model_versions.c.version)).mappings()
            return [_version(r) for r in rows]

    def names(self) -> list[str]:
        """Model names with at least one version, sorted."""
        with self.registry.engine.connect() as connection:
            return sorted(connection.execute(select(model_versions.c.name).distinct().where(
                model_versions.c.project == self.project)).scalars())

    def require(self, name: str) -> str:
        """`name` when the project has a model of that name; else an error naming the closest one."""
        known = self.names()
        if name not in known:
            raise QuiverError(f"unknown model {name!r}{did_you_mean(name, known)} (models: "
                              f"{', '.join(known) or 'none registered yet: run `quiver train`'})")
        return name

    def resolve(self, name: str, ref: str | int) -> ModelVersion:
        """A version by number (``3``, ``"3"``, ``"v3"``) or by alias (``"champion"``)."""
        text = str(ref)
        digits = text[1:] if text[:1] in ("v", "V") else text
        if digits.isdigit():
            return self.get(name, int(digits))
        found = self.alias(name, text)
        if found is None:
            self.require(name)
            aliases = sorted(self.aliases(name))
            raise QuiverError(f"model {name!r} has no alias {text!r}{did_you_mean(text, aliases)} (aliases: "
                              f"{', '.join(aliases) or 'none'}; or give a version number)")
        return found

    def load(self, name: str, ref: str | int = CHAMPION, catalog: Catalog | None = None) -> Scorer:
        """The scorer of a version or alias, verified against the sha256 recorded here (torch loads lazily)."""
        from quiver.models.artifact import load_model

        found = self.resolve(name, ref)
        folder = self._store().local_dir(found.artifact_path)
        return load_model(folder, catalog, expected_sha256=found.sha256, version_label=found.label)

    def _store(self) -> ArtifactStore:
        if self.artifacts is None:
            raise QuiverError("this ModelRegistry has no artifact store: pass ArtifactStore.from_config(config)")
        return self.artifacts

    def _recorded(self, location: str) -> str:
        """What the registry stores for a path: a key under the artifact root or a URI (quiver.artifacts)."""
        from quiver.artifacts import check_key, is_uri

        if not location:
            return ""  # no reference recorded
        if self.artifacts is not None:
            return self.artifacts.record(location)
        if is_uri(location) and not location.startswith("file://"):
            return location
        return check_key(location)  # a host-local path is refused here: no other worker could read it

    def archive(self, name: str, version: int) -> ModelVersion:
        """Mark a version archived; refused while an alias points at it."""
        with self.registry._write() as connection:
            self._get_locked(connection, name, version)
            held = [a for a, v in self._aliases(connection, name).items() if v == version]
            if held:
                raise QuiverError(f"model {name}:{version} still holds alias(es) {', '.join(sorted(held))}; "
                                  f"move them first")
            connection.execute(update(model_versions).where(
                model_versions.c.project == self.project, model_versions.c.name == name,
                model_versions.c.version == version).values(status="archived"))
        return self.get(name, version)

    # ----- aliases -----

    def aliases(self, name: str) -> dict[str, int]:
        """alias → version for model `name`."""
        with self.registry.engine.connect() as connection:
            return self._aliases(connection, name)

    def alias(self, name: str, alias: str) -> ModelVersion | None:
        """The version `alias` points at, or None."""
        version = self.aliases(name).get(alias)
        return None if version is None else self.get(name, version)

    def set_alias(self, name: str, alias: str, version: int | None, *, expected: int | None, reason: str,
                  by: str = "", decision_id: int | None = None, as_of: datetime | None = None) -> AliasMove:
        """Point `alias` at `version` (None removes it) if it points at `expected` now; else AliasConflict.

        Repeating a move that already happened (expected == version == current) returns the history entry
        that made it, so a retried task is idempotent. Moving ``champion`` also records the old champion as
        ``previous`` (in the same transaction, with its own history entry).
        """
        with self.registry._write() as connection:
            return self.set_alias_in(connection, name, alias, version, expected=expected, reason=reason, by=by,
                                     decision_id=decision_id, as_of=as_of)

    def set_alias_in(self, connection: Connection, name: str, alias: str, version: int | None, *,
                     expected: int | None, reason: str, by: str = "", decision_id: int | None = None,
                     as_of: datetime | None = None) -> AliasMove:
        """`set_alias` inside the caller's write transaction (so several moves and records commit together)."""
        _check_name("alias", alias)
        if not reason.strip():
            raise QuiverError("an alias move needs a reason (it is kept in the history)")
        current = self._aliases(connection, name)
        actual = current.get(alias)
        if actual != expected:
            raise AliasConflict(name, alias, expected, actual)
        if version == actual:
            last = self._history(connection, name, alias, limit=1)
            if last and last[0].to_version == version:
                return last[0]
            raise QuiverError(f"alias {alias!r} of model {name!r} already points at {_label(version)}")
        if version is not None:
            self._check_aliasable(connection, name, version, alias)
        move = self._move(connection, name, alias, actual, version, reason, by, decision_id, as_of)
        if alias == CHAMPION and actual is not None and version is not None:
            self._move(connection, name, PREVIOUS, current.get(PREVIOUS), actual,
                       f"replaced as champion by {name}:{version}: {reason}", by, decision_id, as_of)
        return move

    def rollback(self, name: str, *, reason: str, by: str = "", decision_id: int | None = None,
                 expected: int | None = None, as_of: datetime | None = None) -> AliasMove:
        """champion ← previous and previous ← the old champion, atomically; returns the champion's move.

        With `expected`, the rollback also refuses (AliasConflict) unless champion points at it now.
        """
        with self.registry._write() as connection:
            return self.rollback_in(connection, name, reason=reason, by=by, decision_id=decision_id,
                                    expected=expected, as_of=as_of)

    def rollback_in(self, connection: Connection, name: str, *, reason: str, by: str = "",
                    decision_id: int | None = None, expected: int | None = None,
                    as_of: datetime | None = None) -> AliasMove:
        """`rollback` inside the caller's write transaction."""
        if not reason.strip():
            raise QuiverError("a rollback needs a reason (it is kept in the history)")
        current = self._aliases(connection, name)
        champion, previous = current.get(CHAMPION), current.get(PREVIOUS)
        if expected is not None and champion != expected:
            raise AliasConflict(name, CHAMPION, expected, champion)
        if previous is None:
            raise QuiverError(f"model {name!r} has no 'previous' version to roll back to "
                              f"(champion: {_label(champion)})")
        self._check_aliasable(connection, name, previous, CHAMPION)
        move = self._move(connection, name, CHAMPION, champion, previous, f"rollback: {reason}", by, decision_id,
                          as_of)
        self._move(connection, name, PREVIOUS, previous, champion, f"rollback: {reason}", by, decision_id, as_of)
        return move

    def aliases_in(self, connection: Connection, name: str) -> dict[str, int]:
        """alias → version, read inside the caller's transaction."""
        return self._aliases(connection, name)

    def history(self, name: str, alias: str | None = None) -> list[AliasMove]:
        """Every alias move of model `name` (of one alias when given), oldest first."""
        with self.registry.engine.connect() as connection:
            return list(reversed(self._history(connection, name, alias)))

    # ----- internals (run inside one transaction) -----

    def _aliases(self, connection: Connection, name: str) -> dict[str, int]:
        rows = connection.execute(select(model_aliases.c.alias, model_aliases.c.version).where(
            model_aliases.c.project == self.project, model_aliases.c.name == name))
        return {r.alias: int(r.version) for r in rows}

    def _get_locked(self, connection: Connection, name: str, version: int) -> RowMapping:
        row = connection.execute(select(model_versions).where(
            model_versions.c.project == self.project, model_versions.c.name == name,
            model_versions.c.version == version)).mappings().first()
        if row is None:
            raise QuiverError(f"model {name!r} has no version {version}")
        return row

    def _check_aliasable(self, connection: Connection, name: str, version: int, alias: str) -> None:
        row = self._get_locked(connection, name, version)
        if row["status"] != "registered":
            why = ("it was worse than its baseline" if row["status"] == "rejected" else "it is archived")
            raise QuiverError(f"model {name}:{version} is {row['status']} ({why}) and can never get an alias "
                              f"(asked for {alias!r})")
        if self.verify_artifacts:
            self._check_artifact(connection, row, alias)

    def _check_artifact(self, connection: Connection, row: RowMapping, alias: str) -> None:
        """Refuse an alias to a version whose artifact a server could not load: files missing or changed
        (checksums, and the sha256 recorded here), or features other than those registered or the catalog's."""
        from quiver.models.artifact import MODEL_FILE, verify_artifact

        label = f"{row['name']}:{row['version']}"
        try:
            folder = self._store().local_dir(row["artifact_path"])
            verify_artifact(folder, expected_sha256=row["sha256"])
            meta = json.loads((folder / MODEL_FILE).read_text())
        except (QuiverError, OSError, ValueError) as exc:
            raise QuiverError(f"model {label} cannot get alias {alias!r}: its artifact fails verification "
                              f"({exc})") from None
        registered = json.loads(row["features_json"])
        if list(meta.get("features") or []) != registered:
            raise QuiverError(f"model {label} cannot get alias {alias!r}: its artifact scores features "
                              f"{meta.get('features')}, the registry recorded {registered}")
        latest = self.registry.latest(connection)
        if latest is not None:  # the catalog applied now must still define every feature the model reads
            from quiver.catalog.loader import catalog_from_dict
            from quiver.models.artifact import check_features

            try:
                check_features(meta.get("feature_refs", []), catalog_from_dict(latest[2]), label)
            except QuiverError as exc:
                raise QuiverError(f"model {label} cannot get alias {alias!r} under catalog version {latest[0]}: "
                                  f"{exc}") from None

    def _move(self, connection: Connection, name: str, alias: str, old: int | None, new: int | None,
              reason: str, by: str, decision_id: int | None, as_of: datetime | None = None) -> AliasMove:
        now = datetime.now(UTC)
        if as_of is None and decision_id is not None:  # the move happened at the data time of its cause
            from quiver.registry.rollout_tables import decisions

            judged = connection.execute(select(decisions.c.as_of, decisions.c.decided_at).where(
                decisions.c.project == self.project, decisions.c.id == decision_id)).first()
            as_of = (judged.as_of or judged.decided_at) if judged is not None else None
        as_of = _utc(as_of) if as_of is not None else now
        where = (model_aliases.c.project == self.project, model_aliases.c.name == name,
                 model_aliases.c.alias == alias)
        if new is None:
            connection.execute(delete(model_aliases).where(*where))
        elif old is None:
            connection.execute(insert(model_aliases).values(project=self.project, name=name, alias=alias,
                                                            version=new, updated_at=now))
        else:
            connection.execute(update(model_aliases).where(*where).values(version=new, updated_at=now))
        by = (by or _author())[:255]
        result = connection.execute(insert(model_alias_history).values(
            project=self.project, name=name, alias=alias, from_version=old, to_version=new, reason=reason,
            moved_by=by, decision_id=decision_id, moved_at=now, as_of=as_of))
        key = result.inserted_primary_key
        return AliasMove(int(key[0]) if key else 0, name, alias, old, new, reason, by, decision_id, now, as_of)

    def _history(self, connection: Connection, name: str, alias: str | None,
                 limit: int | None = None) -> list[AliasMove]:
        query = select(model_alias_history).where(model_alias_history.c.project == self.project,
                                                  model_alias_history.c.name == name)
        if alias is not None:
            query = query.where(model_alias_history.c.alias == alias)
        query = query.order_by(model_alias_history.c.id.desc())
        if limit:
            query = query.limit(limit)
        return [AliasMove(r.id, r.name, r.alias, r.from_version, r.to_version, r.reason, r.moved_by,
                          r.decision_id, _utc(r.moved_at), _utc(r.as_of) if r.as_of is not None else None)
                for r in connection.execute(query)]


# How much worse than its baseline a version may be on its test window and still be registered. Noise, not
# a loss of quality: on the demo's windows two fits of the same model differ by about this much.
AUC_SLACK = 0.005  # ROC-AUC points below the baseline's
LOG_LOSS_SLACK = 0.01  # relative: log loss at most 1 % above the baseline's


def derive_status(metrics: Mapping[str, Any]) -> tuple[str, str]:
    """(status, why) of a new version from its metrics on its test window: registered when it is **not
    worse than its logistic baseline** beyond noise — log loss (the proper scoring rule it optimises, and the
    loop's primary quality metric) at most `LOG_LOSS_SLACK` above, ROC-AUC at most `AUC_SLACK` below;
    rejected otherwise, and when the metrics hold no such comparison. Metrics without log losses use ROC-AUC
    alone.

    The gate keeps a broken or degraded training run from serving; whether a version is *better* than the
    champion is decided on live traffic by the shadow and canary judges, with valid statistics. Demanding a
    strict win here made the status a coin flip between near-equal fits (and training started from the
    baseline's weights, `best_epoch` -1, *is* the baseline: the reason says so)."""
    try:
        auc, base_auc = float(metrics["roc_auc"]), float(metrics["baseline"]["roc_auc"])
    except (KeyError, TypeError, ValueError):
        return "rejected", "its metrics hold no ROC-AUC beside a baseline's"
    same = ("It equals its logistic baseline: no epoch improved on the baseline's weights it started from. "
            if metrics.get("best_epoch") is not None and float(metrics["best_epoch"]) < 0 else "")
    loss, base_loss = metrics.get("log_loss"), metrics["baseline"].get("log_loss")
    versus = f"ROC-AUC {auc:.4f} vs the baseline's {base_auc:.4f} ({auc - base_auc:+.4f}; at most {AUC_SLACK} below)"
    if loss is None or base_loss is None:
        if auc >= base_auc - AUC_SLACK:
            return "registered", f"{same or _plain(auc, base_auc, None, None)}On its test window: {versus}"
        return "rejected", f"Worse than its baseline by more than the tolerance. On its test window: {versus}"
    change = float(loss) / float(base_loss) - 1 if float(base_loss) > 0 else 0.0
    versus = (f"log loss {float(loss):.5f} vs the baseline's {float(base_loss):.5f} ({change:+.1%}; at most "
              f"{LOG_LOSS_SLACK:.0%} above), {versus}")
    if float(loss) > float(base_loss) * (1 + LOG_LOSS_SLACK):
        return "rejected", f"Worse than its baseline: its log loss is more than {LOG_LOSS_SLACK:.0%} above. {versus}"
    if auc < base_auc - AUC_SLACK:
        return "rejected", f"Worse than its baseline: its ROC-AUC is more than {AUC_SLACK} below. {versus}"
    return "registered", f"{same or _plain(auc, base_auc, float(loss), float(base_loss))}On its test window: {versus}"


def _plain(auc: float, base_auc: float, loss: float | None, base_loss: float | None) -> str:
    """The first sentence of a registered version's reason: better than, or within the tolerance of, its
    baseline."""
    better_loss = loss is None or base_loss is None or loss < base_loss
    if auc > base_auc and better_loss:
        return "Better than its logistic baseline. "
    return "Not worse than its logistic baseline within the tolerance (not better on every metric). "


def _version(row: RowMapping) -> ModelVersion:
    return ModelVersion(
        name=row["name"], version=int(row["version"]), status=row["status"], artifact_path=row["artifact_path"],
        sha256=row["sha256"], metrics=json.loads(row["metrics_json"]), window_start=_utc(row["window_start"]),
        cutoff=_utc(row["cutoff"]), features=json.loads(row["features_json"]),
        catalog_version=row["catalog_version"], label_column=row["label_column"],
        lineage=json.loads(row["lineage_json"]), reference_path=row["reference_path"],
        created_at=_utc(row["created_at"]), created_by=row["created_by"])


def _utc(value: datetime) -> datetime:
    # SQLite hands timezone-aware columns back naive (they were stored as UTC).
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _label(version: int | None) -> str:
    return "nothing" if version is None else f"version {version}"


def _check_name(what: str, name: str) -> None:
    if not is_identifier(name):
        raise QuiverError(f"{what} {name!r} must be a plain identifier (letters, digits, _; at most 63)")
