"""Data-quality gate: Great Expectations 1.x suites on every ingested batch; failing batches are quarantined.

The suite of a source is built from three places, in this order:
1. **The catalog** (`catalog_expectations`): each column a view uses exists and has its declared type; join keys
   and the event time are never null; event times are not in the future (beyond `future_skew`).
2. **Tags** on the Source or its FeatureViews (the DSL is unchanged; tags are plain strings):
   `expect.<column>.min` / `.max` (number or ISO time), `.in` ("a,b,c"), `.not_null` ("true"), `.unique`
   ("true"), `.regex` (pattern) and `.mostly` (0–1, applies to that column's rules).
3. **User suites**: `<expectations_dir>/<source>.json` — a GE suite JSON (`{"expectations": [{"type": …,
   "kwargs": …}]}`) or a bare list of such entries — plus any expectations passed in Python.

Two ways to run a suite on a Parquet file, a folder of them, a DataFrame or an Arrow table:

* `QualityGate.check(batch, source)` — a check run by hand (`quiver quality`). It reports, and on failure
  writes `<quarantine_dir>/<source>/<batch_id>/` with `bad_rows.parquet` (every flagged row, its position and
  the expectations it failed), `validation.json` (summary + GE result, long lists cut to samples) and
  `validation.html` (a self-contained page: no CDN, every value escaped). **The input file stays where it is.**
* `QualityGate.gate(batch, source)` — the ingest gate a pipeline runs before data enters the offline path.
  The same, plus a failing *file* is moved (never copied and deleted) out of the offline path into
  `<quarantine_dir>/<source>/<batch_id>/batch/`, so downstream jobs never read it; the result
  (`source_moved`), the alert and `validation.json` say so. Only the gate removes input.
  `gate(path, source, store=location)` gates a file on an object store (`path` inside `location.fs`): the
  quarantine is `<location>/_quarantine/<source>/<batch_id>/` in the same bucket, and the file is *copied* to
  its `batch/` and then deleted (an object store cannot rename); see `QualityGate.quarantine_on_store`.

An in-memory batch (DataFrame / Arrow table) that fails is written to `batch/batch.parquet` by both. A
table-level failure (missing column, wrong type) marks every row bad. Then an alert is raised (one open per
source; a passing batch resolves it) and, per `on_failure`, the run continues (the result says what
happened) or stops with `QualityGateError`.

Timestamps are validated as naive UTC (GE 1.x cannot type-check tz-aware pandas columns); integer and bool
columns are read as pandas nullable types so a null does not turn them into floats.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.locations import Location
from quiver.monitoring.quality_suites import CONTRACT_REASON as CONTRACT_REASON
from quiver.monitoring.quality_suites import (
    REFUSED_BY,
    catalog_expectations,
    contract_columns,
    load_user_expectations,
)
from quiver.monitoring.quality_suites import REFUSED_COLUMN as REFUSED_COLUMN
from quiver.monitoring.quality_suites import contract_expectations as contract_expectations
from quiver.monitoring.quality_suites import tag_expectations as tag_expectations

_SAMPLE = 20
STORE_QUARANTINE = "_quarantine"  # under a source's prefix on an object store; `_` keeps it out of listings


class QualityGateError(QuiverError):
    """A batch failed its quality gate and the policy says stop (it has been quarantined already)."""

    def __init__(self, result: QualityResult):
        self.result = result
        place = result.quarantine_uri or result.quarantine_path
        where = f"; bad rows at {place}" if place else ""
        if result.source_moved:
            where += " (batch moved out of the offline path)"
        super().__init__(f"batch {result.batch_id} of {result.source!r} failed {len(result.failed)} "
                         f"expectation(s), {result.n_bad_rows} bad row(s){where}")


@dataclass(frozen=True)
class QualityResult:
    """Outcome of one batch: pass/fail, what failed, how many rows are bad and where the batch went."""

    source: str
    batch_id: str
    success: bool
    n_rows: int
    n_bad_rows: int
    failed: list[dict[str, Any]]
    bad_rows: np.ndarray = field(repr=False)
    validation: dict[str, Any] = field(repr=False)
    quarantine_path: Path | None = None
    elapsed_s: float = 0.0
    source_moved: bool = False  # True only when the pipeline gate moved the input file into quarantine
    quarantine_uri: str | None = None  # the quarantine on an object store (quarantine_path is a folder's)
    source_left: str | None = None  # why a file copied into a store's quarantine could not be deleted


# ----- running -----


class QualityGate:
    """Validate batches of catalog sources; quarantine, alert and continue or stop on failure."""

    def __init__(self, catalog: Catalog | None = None, *, quarantine_dir: str | Path,
                 expectations_dir: str | Path | None = None, on_failure: str = "continue",
                 alerts: Any | None = None, extra: Mapping[str, Sequence[dict[str, Any]]] | None = None,
                 future_skew: timedelta = timedelta(hours=1)):
        if on_failure not in ("continue", "stop"):
            raise ValueError("on_failure must be 'continue' or 'stop'")
        self.catalog, self.quarantine_dir = catalog, Path(quarantine_dir)
        self.expectations_dir = Path(expectations_dir) if expectations_dir else None
        self.on_failure, self.alerts, self.future_skew = on_failure, alerts, future_skew
        self.extra = {k: list(v) for k, v in (extra or {}).items()}
        self._validator: Any = None

    def suite_for(self, source: str) -> list[dict[str, Any]]:
        """The full list of expectation entries for `source`."""
        entries = catalog_expectations(self.catalog, source, future_skew=self.future_skew) if self.catalog else []
        entries += load_user_expectations(self.expectations_dir, source)
        entries += [dict(e) for e in self.extra.get(source, [])]
        if not entries:
            raise QuiverError(f"no expectations for source {source!r} (no catalog, suite file or extra)")
        return entries

    def validate(self, frame: pd.DataFrame, source: str, expectations: Sequence[dict[str, Any]] | None = None,
                 table: pa.Table | None = None) -> tuple[bool, dict[str, Any]]:
        """Run GE on `frame` (no side effects): (success, GE result as JSON-ready dict). `table`: the same
        batch as Arrow, when there is one (the contract's rules read it exactly; see `contract_columns`)."""
        entries = list(expectations) if expectations is not None else self.suite_for(source)
        return _run_suite(self._ge(), self.prepare(frame, source, table), source, entries)

    def prepare(self, frame: pd.DataFrame, source: str, table: pa.Table | None = None) -> pd.DataFrame:
        """`frame` with its source's contract columns added (see `contract_columns`), when it has a contract
        and they are not there yet; otherwise `frame` itself."""
        spec = self.catalog.sources.get(source) if self.catalog is not None else None
        if spec is None or spec.contract is None or REFUSED_COLUMN in frame.columns:
            return frame
        missing = [c for c in spec.contract.columns if c not in frame.columns]
        if missing:  # the structure expectations report it; no row can be judged
            return frame
        return contract_columns(frame, spec.contract, table=table)

    def _ge(self) -> Any:
        if self._validator is None:
            self._validator = _GeRunner()
        return self._validator

    def check(self, batch: str | Path | pd.DataFrame | pa.Table, source: str,
              batch_id: str | None = None) -> QualityResult:
        """Validate one batch by hand: report, write bad rows to quarantine, leave the input file in place."""
        return self._run(batch, source, batch_id, move_source=False)

    def gate(self, batch: str | Path | pd.DataFrame | pa.Table, source: str,
             batch_id: str | None = None, *, store: Location | None = None) -> QualityResult:
        """The pipeline's ingest gate: like `check`, and a failing file is moved out of the offline path.
        With `store`, `batch` is a file's path inside `store.fs` and the quarantine is under `store`'s root
        (`quarantine_on_store`)."""
        if store is not None:
            return self._run(str(batch), source, batch_id, move_source=True, store=store)
        return self._run(batch, source, batch_id, move_source=True)

    def _run(self, batch: str | Path | pd.DataFrame | pa.Table, source: str, batch_id: str | None,
             move_source: bool, store: Location | None = None) -> QualityResult:
        from quiver import metrics

        started = time.perf_counter()
        remote = str(batch) if store is not None else None  # a path inside store.fs
        origin = Path(batch) if remote is None and isinstance(batch, str | Path) else None
        if store is not None and remote is not None:
            table: pa.Table | None = pq.read_table(remote, filesystem=store.fs)
        else:
            table = batch if isinstance(batch, pa.Table) else pq.read_table(origin) if origin is not None else None
        frame = self.prepare(read_batch(table if table is not None else batch), source, table)
        batch_id = batch_id or _batch_id(PurePosixPath(remote) if remote is not None else origin)
        success, validation = self.validate(frame, source)
        failed, bad_rows, per_row = _summarize(validation, len(frame))
        for item in failed:
            metrics.QUALITY_FAILURES.labels(source=source, expectation=item["type"]).inc()
        metrics.QUALITY_BAD_ROWS.labels(source=source).inc(len(bad_rows))
        metrics.QUALITY_BATCHES.labels(source=source, outcome="passed" if success else "failed").inc()
        result = QualityResult(source, batch_id, success, len(frame), len(bad_rows), failed, bad_rows,
                               validation, None, 0.0)
        if success:
            if self.alerts is not None:
                self.alerts.resolve("quality", source)
            return _with(result, elapsed_s=time.perf_counter() - started)
        if store is not None and remote is not None:
            return self._fail_on_store(result, store, remote, frame, per_row, started)
        moved = move_source and origin is not None
        target = self._quarantine(result, batch, origin, frame, per_row, moved)
        result = _with(result, quarantine_path=target, elapsed_s=time.perf_counter() - started, source_moved=moved)
        where = (f"Batch moved out of the offline path to {target / 'batch'}." if moved else
                 f"Bad rows written to {target}" + (f"; {origin} left in place." if origin else "."))
        self._alert(result, where, {"quarantine": str(target), "source_moved": moved})
        if self.on_failure == "stop":
            raise QualityGateError(result)
        return result

    def _fail_on_store(self, result: QualityResult, store: Location, path: str, frame: pd.DataFrame,
                       per_row: dict[int, list[str]], started: float) -> QualityResult:
        target, left = self.quarantine_on_store(result, store, path, frame, per_row)
        result = _with(result, quarantine_uri=store.uri(target), source_moved=left is None, source_left=left,
                       elapsed_s=time.perf_counter() - started)
        kept = store.uri(f"{target}/batch")
        where = (f"Batch moved out of the offline path to {kept}." if left is None else
                 f"Batch copied to {kept}, but it could not be deleted from {store.uri(path)} ({left}): delete "
                 "it there by hand, or the next backfill reads it.")
        self._alert(result, where, {"quarantine": result.quarantine_uri, "source_moved": left is None,
                                    "origin": store.uri(path), "source_left": left},
                    severity="critical" if left is not None else None)
        if self.on_failure == "stop":
            raise QualityGateError(result)
        return result

    def _alert(self, result: QualityResult, where: str, details: dict[str, Any], severity: str | None = None) -> None:
        if self.alerts is None:
            return
        kinds = ", ".join(sorted({f["type"].removeprefix("expect_") for f in result.failed}))
        self.alerts.raise_alert(
            "quality", result.source, severity or ("critical" if self.on_failure == "stop" else "warning"),
            f"Data quality gate failed for {result.source}",
            f"Batch {result.batch_id}: {len(result.failed)} failed expectation(s) ({kinds}); {result.n_bad_rows} "
            f"of {result.n_rows} rows bad. {where}",
            {"batch_id": result.batch_id, "quarantine": details.pop("quarantine"), "failed": result.failed,
             "bad_rows": result.n_bad_rows, **details})

    def _quarantine(self, result: QualityResult, batch: Any, origin: Path | None, frame: pd.DataFrame,
                    per_row: dict[int, list[str]], move_source: bool) -> Path:
        target = self.quarantine_dir / result.source / result.batch_id
        staging = target.with_name(f".tmp-{target.name}")
        (staging / "batch").mkdir(parents=True)
        frame, bad = _bad_rows(result, frame, per_row)
        _to_parquet(bad, staging / "bad_rows.parquet")
        summary = _summary(result, str(origin) if origin else None, move_source)
        (staging / "validation.json").write_text(json.dumps(_for_json(summary), indent=2, default=str))
        (staging / "validation.html").write_text(render_validation_html(_for_json(summary)))
        if origin is not None:
            if move_source:
                # Move last, after everything else is written: the batch leaves the ingest path only once.
                shutil.move(str(origin), str(staging / "batch" / origin.name))
            else:
                (staging / "batch").rmdir()  # a check by hand leaves the input where it is
        else:
            frame_or_table = batch if isinstance(batch, pa.Table) else pa.Table.from_pandas(
                frame.drop(columns=[CONTRACT_REASON], errors="ignore"))
            pq.write_table(frame_or_table, staging / "batch" / "batch.parquet")
        os.replace(staging, target)
        return target

    def quarantine_on_store(self, result: QualityResult, store: Location, path: str, frame: pd.DataFrame,
                            per_row: dict[int, list[str]]) -> tuple[str, str | None]:
        """Quarantine the failing file `path` (inside `store.fs`) under `<store root>/_quarantine/<source>/
        <batch_id>/`: bad_rows.parquet, then a copy of the file in `batch/` (checked whole), then the
        original deleted, then validation.json/.html saying what happened (so the report is the last object
        written). Nothing is lost whatever step fails: the delete comes only after the copy. The `_` prefix
        keeps the quarantine out of every source listing. Returns (the quarantine's path inside `store.fs`,
        why the original could not be deleted, or None once it is gone)."""
        import pyarrow.fs as pafs

        target = store.path(STORE_QUARANTINE, result.source, result.batch_id)
        kept = f"{target}/batch/{path.rsplit('/', 1)[-1]}"
        _, bad = _bad_rows(result, frame, per_row)
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), buffer)
        store.put(f"{target}/bad_rows.parquet", buffer.getvalue().to_pybytes())
        store.fs.copy_file(path, kept)  # server side on S3: the bytes never pass through this process
        copied, original = store.fs.get_file_info([kept, path])
        if copied.type != pafs.FileType.File or copied.size != original.size:
            raise QuiverError(f"quality gate: the copy of {store.uri(path)} into quarantine ({store.uri(kept)}) "
                              f"is not whole ({copied.size} of {original.size} bytes); the original is left")
        left: str | None = None
        try:
            store.fs.delete_file(path)
        except OSError as exc:  # the copy is safe under _quarantine/, which no reader lists
            left = str(exc) or type(exc).__name__
        summary = _summary(result, store.uri(path), left is None)
        summary.update(batch=store.uri(kept), source_left=left)
        report = _for_json(summary)
        store.put(f"{target}/validation.html", render_validation_html(report).encode())
        store.put(f"{target}/validation.json", json.dumps(report, indent=2, default=str).encode())
        return target, left


def _bad_rows(result: QualityResult, frame: pd.DataFrame,
              per_row: dict[int, list[str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the batch without the gate's helper columns, its bad rows with their position and failures)."""
    helpers = [c for c in frame.columns if c == REFUSED_COLUMN or str(c).startswith(REFUSED_BY)]
    frame = frame.drop(columns=helpers)  # bad rows keep `contract_reason`, the batch is kept as it came
    bad = frame.iloc[result.bad_rows].copy()
    bad.insert(0, "_row", result.bad_rows)
    bad["_failed_expectations"] = [",".join(per_row.get(int(i), ["table-level"])) for i in result.bad_rows]
    return frame, bad


def _summary(result: QualityResult, origin: str | None, moved: bool) -> dict[str, Any]:
    return {"source": result.source, "batch_id": result.batch_id, "success": result.success,
            "n_rows": result.n_rows, "n_bad_rows": result.n_bad_rows, "failed": result.failed,
            "origin": origin, "source_moved": moved,
            "quarantined_at": datetime.now(UTC).isoformat(), "validation": result.validation}


def _with(result: QualityResult, **changes: Any) -> QualityResult:
    from dataclasses import replace

    return replace(result, **changes)


def _batch_id(origin: PurePath | None) -> str:
    stem = origin.stem if origin else "frame"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:60]
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{safe}-{uuid.uuid4().hex[:6]}"


def read_batch(batch: str | Path | pd.DataFrame | pa.Table) -> pd.DataFrame:
    """A batch as a DataFrame with positional index, nullable ints/bools and naive-UTC timestamps."""
    if isinstance(batch, pd.DataFrame):
        frame = batch.reset_index(drop=True)
    else:
        table = batch if isinstance(batch, pa.Table) else pq.read_table(Path(batch))
        mapping = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype()}
        frame = table.to_pandas(types_mapper=mapping.get)
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.DatetimeTZDtype):
            frame[name] = frame[name].dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


def _to_parquet(frame: pd.DataFrame, path: Path) -> None:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def _summarize(validation: dict[str, Any], n_rows: int) -> tuple[list[dict[str, Any]], np.ndarray,
                                                                   dict[int, list[str]]]:
    """Failed expectations, the positions of bad rows, and which expectations each bad row failed."""
    failed: list[dict[str, Any]] = []
    per_row: dict[int, list[str]] = {}
    table_level = False
    for item in validation["results"]:
        config, outcome = item["expectation_config"], item.get("result") or {}
        label = f"{config['type']}({config['kwargs'].get('column', '')})"
        indices = outcome.get("unexpected_index_list")
        if indices:
            for i in indices:
                per_row.setdefault(int(i), []).append(label)
        if not item["success"]:
            failed.append({"type": config["type"], "column": config["kwargs"].get("column"),
                           "unexpected_count": outcome.get("unexpected_count"),
                           "observed_value": outcome.get("observed_value"),
                           "exception": (item.get("exception_info") or {}).get("exception_message")})
            if indices is None:
                table_level = True
    bad = np.arange(n_rows) if table_level else np.array(sorted(per_row), dtype=np.int64)
    return failed, bad, per_row


def _run_suite(runner: _GeRunner, frame: pd.DataFrame, source: str,
               entries: Sequence[dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
    result = runner.validate(frame, source, entries)
    return bool(result["success"]), result


class _GeRunner:
    """One ephemeral GE context reused across batches (creating one costs ~0.1 s; importing GE ~3 s)."""

    def __init__(self) -> None:
        with _main_module_file():
            import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = self.context.data_sources.add_pandas("quiver_batches")
        self.batch_definition = source.add_dataframe_asset("batch").add_batch_definition_whole_dataframe("all")

    def validate(self, frame: pd.DataFrame, name: str, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        suite = self._gx.ExpectationSuite(name=f"quiver.{name}")
        for entry in entries:
            suite.add_expectation(ExpectationConfiguration(
                type=entry["type"], kwargs=dict(entry.get("kwargs", {})), meta=entry.get("meta")).to_domain_obj())
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        result: Any = batch.validate(suite, result_format={"result_format": "COMPLETE",
                                                      "partial_unexpected_count": _SAMPLE,
                                                      "return_unexpected_index_query": False})
        return dict(_trim(result.to_json_dict()))


_PAGE_STYLE = ("body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}"
               "td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}"
               ".ok{color:#2e7d32}.failed{color:#c62828;font-weight:bold}code{font-size:12px}")


def render_validation_html(summary: Mapping[str, Any]) -> str:
    """One self-contained validation page (inline style, no scripts, no external URL; every value escaped)."""
    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return f"<td><code>{html.escape(text)}</code></td>"

    rows = []
    for item in summary.get("validation", {}).get("results", []):
        config, outcome = item.get("expectation_config", {}), item.get("result") or {}
        kwargs = {k: v for k, v in (config.get("kwargs") or {}).items() if k not in ("batch_id", "column")}
        ok = bool(item.get("success"))
        sample = outcome.get("partial_unexpected_list") or outcome.get("unexpected_list") or []
        error = (item.get("exception_info") or {}).get("exception_message") or ""
        rows.append(f"<tr><td class='{'ok' if ok else 'failed'}'>{'passed' if ok else 'FAILED'}</td>"
                    + cell(config.get("type", "")) + cell(str((config.get("kwargs") or {}).get("column") or ""))
                    + cell(kwargs) + cell(outcome.get("unexpected_count", "")) + cell(sample[:_SAMPLE])
                    + cell(error) + "</tr>")
    title = f"Data quality: {summary.get('source')} — batch {summary.get('batch_id')}"
    where = ("The batch was moved out of the offline path into this folder (the pipeline's gate)."
             if summary.get("source_moved") else
             f"The input {summary.get('origin')} was left in place; bad rows are in bad_rows.parquet."
             if summary.get("origin") else "The batch is in batch/batch.parquet.")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(str(summary.get('n_bad_rows')))} of {html.escape(str(summary.get('n_rows')))} rows bad; "
            f"{len(summary.get('failed', []))} expectation(s) failed. {html.escape(where)}</p>"
            "<table><tr><th>result</th><th>expectation</th><th>column</th><th>arguments</th><th>unexpected</th>"
            f"<th>sample of unexpected values</th><th>error</th></tr>{''.join(rows)}</table></body></html>")


@contextmanager
def _main_module_file() -> Iterator[None]:
    """GE imports pyspark when present; pyspark.sql.connect calls sys.exit(0) on import when `__main__` has no
    file (it takes that for a doctest run) — true under pytest-xdist workers and `python -c`. Give `__main__`
    a placeholder file for the duration of the import."""
    main = sys.modules.get("__main__")
    patch = main is not None and getattr(main, "__spec__", None) is None and not hasattr(main, "__file__")
    if patch and main is not None:
        main.__file__ = "<quiver>"
    try:
        yield
    finally:
        if patch and main is not None:
            del main.__file__


def _for_json(summary: dict[str, Any]) -> dict[str, Any]:
    """A copy whose row-index lists are cut to samples (bad_rows.parquet holds every bad row)."""
    out = json.loads(json.dumps(summary, default=str))
    for item in out["validation"].get("results", []):
        outcome = item.get("result") or {}
        indices = outcome.get("unexpected_index_list")
        if isinstance(indices, list) and len(indices) > _SAMPLE:
            outcome["unexpected_index_list"] = indices[:_SAMPLE]
            outcome["unexpected_index_list_truncated"] = len(indices)
    return dict(out)


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    """Keep full index lists (bad rows are derived from them) but cut value lists to samples."""
    for item in result.get("results", []):
        outcome = item.get("result") or {}
        for key in ("unexpected_list",):
            if isinstance(outcome.get(key), list) and len(outcome[key]) > _SAMPLE:
                outcome[key] = outcome[key][:_SAMPLE]
    return result
