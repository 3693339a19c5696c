"""Golden snapshots of the generated Flink SQL job: tests/golden/flink/<name>.sql.

The generated script must equal the file exactly. After an intended compiler change, rewrite them with
`QUIVER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/golden/flink` and review the diff like code.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.compile.flink import FlinkTarget, compile_flink, streamed_views

HERE = Path(__file__).parent
COLUMNS = {"user_id": "int64", "merchant_id": "int64", "amount": "float64", "qty": "int64", "flag": "bool",
           "cat": "string", "ts": "timestamp"}
UPDATE = os.environ.get("QUIVER_UPDATE_GOLDEN") == "1"
LOCAL = FlinkTarget(inbox={"events": "file:///srv/quiver/stream/inbox/events"},
                    sink_root="file:///srv/quiver/stream/sinks")
KAFKA = FlinkTarget(inbox={}, sink_root="file:///srv/quiver/stream/sinks", kafka=True,
                    kafka_properties=(("security.protocol", "SASL_SSL"), ("sasl.mechanism", "SCRAM-SHA-512")),
                    kafka_groups={"clicks": "quiver.golden.clicks"}, kafka_startup="timestamp:1796638500000")


def golden_catalog() -> Catalog:
    return load_catalog(HERE / "catalog", root=HERE, schema_reader=lambda source: dict(COLUMNS))


def generated() -> dict[Path, str]:
    catalog = golden_catalog()
    by_source: dict[str, list[str]] = {}
    for view in streamed_views(catalog):
        by_source.setdefault(view.source, []).append(view.name)
    return {
        HERE / "events_local.sql": compile_flink(catalog, LOCAL, by_source["events"]).script(),
        HERE / "clicks_kafka.sql": compile_flink(catalog, KAFKA, by_source["clicks"]).script(),
    }


CASES = generated()


@pytest.mark.parametrize("path", sorted(CASES), ids=lambda p: p.name)
def test_generated_flink_sql_matches_golden_file(path: Path) -> None:
    sql = CASES[path]
    if UPDATE:
        path.write_text(sql)
    assert path.exists(), f"missing golden file {path}; run with QUIVER_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if sql != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), sql.splitlines(True), str(path), "generated"))
        pytest.fail(f"generated Flink SQL differs from {path} (QUIVER_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


def test_golden_jobs_cover_every_fn_and_both_view_kinds() -> None:
    local = CASES[HERE / "events_local.sql"]
    for fn_sql in ("count(`amount`)", "sum(`amount`)", "sum(`amount` * `amount`)",
                   "MIN(CASE WHEN ABS(`amount`) >= 0 THEN `amount` END)", "min(CAST(`flag` AS BIGINT))",
                   "MAX(CASE WHEN ABS(`amount`) >= 0 THEN `amount` END)", "max(`qty`)",
                   "`amount__last__key`", "`cat__last__key`", "ROW_NUMBER() OVER"):
        assert fn_sql in local
    assert "offline_only" not in local  # not online: not streamed
    kafka = CASES[HERE / "clicks_kafka.sql"]
    assert "'connector' = 'kafka'" in kafka and "'topic' = 'clicks'" in kafka and "'format' = 'raw'" in kafka
