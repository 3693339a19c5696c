"""Event time as a team's records carry it, on real Flink and a real broker: an ISO-8601 field with a zone, the
Kafka record's own timestamp, a producer whose clock runs a little fast (served online) or far ahead (the batch
route), and a job that starts at a timestamp. The compiled Kafka job runs bounded at the topics' ends and its
sinks are read back."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from quiver.streaming.kafka_broker import KafkaBroker, admin_config, create_topic
from quiver.streaming.options import kafka_job_jars
from tests.integration.test_streaming_e2e import REPO, STREAM_PYTHON

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
MS = 1000

SCRIPT = '''
import sys
sys.path[:0] = [{platform!r}]
from pyflink.table import EnvironmentSettings, TableEnvironment
from quiver import KAFKA_TIMESTAMP, Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import FlinkTarget, compile_flink
user = Entity("user", ["user_id"])
iso = Source("iso", "iso", timestamp_field="ts", stream=StreamBinding(
    kafka_topic={iso_topic!r}, event_time="at", event_time_format="iso8601", watermark_delay="1s"))
stamped = Source("stamped", "stamped", timestamp_field="ts", stream=StreamBinding(
    kafka_topic={stamped_topic!r}, event_time=KAFKA_TIMESTAMP, watermark_delay="1s"))
views = [FeatureView(f"{{s.name}}_qty", [user], s, aggregations=[Aggregation("qty", "sum", "1d")], tile="1h")
         for s in (iso, stamped)]
columns = {{"user_id": "int64", "qty": "int64", "ts": "timestamp"}}
cat = build_catalog([user, iso, stamped, *views], schema_reader=lambda s: dict(columns))
job = compile_flink(cat, FlinkTarget(inbox={{}}, sink_root={sinks!r}, kafka=True, kafka_bootstrap={bootstrap!r},
                                     kafka_groups={{"iso": "it.iso", "stamped": "it.stamped"}},
                                     kafka_startup={startup!r}), {views!r})
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
env.get_config().set("parallelism.default", "1")
env.get_config().set("pipeline.jars", {jars!r})
for key, value in job.settings:
    env.get_config().set(key, value)
for statement in job.statements:
    if statement.startswith("CREATE TABLE `src__"):  # stop at the topic's end
        statement = statement.replace("'format' = 'raw'", "'format' = 'raw', 'scan.bounded.mode' = 'latest-offset'")
    env.execute_sql(statement)
statements = env.create_statement_set()
for insert in job.inserts:
    statements.add_insert_sql(insert)
statements.execute().wait()
'''


def send(bootstrap: str, topic: str, records: list[tuple[bytes, int | None]]) -> None:
    """(value, record timestamp in epoch ms or None) in order, to partition 0."""
    from confluent_kafka import Producer

    producer = Producer({**admin_config(bootstrap), "enable.idempotence": True})
    for value, ts_ms in records:
        if ts_ms is None:
            producer.produce(topic, value=value, partition=0)
        else:
            producer.produce(topic, value=value, partition=0, timestamp=ts_ms)
    assert producer.flush(60) == 0


def run_job(tmp_path: Path, broker: KafkaBroker, views: list[str], startup: str, name: str) -> Path:
    sinks = tmp_path / name
    script = tmp_path / f"{name}.py"
    jars = ";".join(p.resolve().as_uri() for p in kafka_job_jars())
    script.write_text(SCRIPT.format(platform=str(REPO / "platform"), iso_topic=f"iso-{tmp_path.name}",
                                    stamped_topic=f"stamped-{tmp_path.name}", sinks=sinks.as_uri(),
                                    bootstrap=broker.bootstrap, startup=startup, views=views, jars=jars))
    out = subprocess.run([str(STREAM_PYTHON), str(script)], capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    return sinks


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(folder.glob("part-*")) for line in p.read_text().splitlines()]


def sums(sinks: Path, view: str) -> dict[int, tuple[int, float]]:
    """user → (events, qty) over the view's final tiles (the change files' last image of each tile)."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for change in rows(sinks / "tiles" / view):
        if change.get("after"):
            last[(change["after"]["user_id"], change["after"]["tile_start"])] = change["after"]
    out: dict[int, tuple[int, float]] = {}
    for (user, _), tile in last.items():
        n, qty = out.get(user, (0, 0.0))
        out[user] = (n + tile["n_events"], qty + tile["qty__sum"])
    return out


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def test_event_time_from_an_iso_field_and_from_the_record_timestamp(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    bootstrap = kafka_broker.bootstrap
    iso_topic, stamped_topic = f"iso-{tmp_path.name}", f"stamped-{tmp_path.name}"
    for topic in (iso_topic, stamped_topic):
        create_topic(bootstrap, topic, 1)
    now = datetime.now(UTC)
    send(bootstrap, iso_topic, [
        (json.dumps({"at": iso(T0), "user_id": 1, "qty": 2}).encode(), None),
        # a minute later written with another offset, and a space for the T
        (json.dumps({"at": "2026-11-01T13:01:00+01:00", "user_id": 1, "qty": 3}).encode(), None),
        (json.dumps({"at": "2026-11-01 12:02:00.5+00:00", "user_id": 2, "qty": 5}).encode(), None),
        (json.dumps({"at": "2026-11-01T12:03:00", "user_id": 2, "qty": 100}).encode(), None),  # no zone
        (json.dumps({"at": iso(now + timedelta(hours=1)), "user_id": 3, "qty": 7}).encode(), None),  # far ahead
        # a producer whose clock runs two minutes fast: within the 5-minute tolerance, served online (last, so it
        # moves the watermark past nothing else)
        (json.dumps({"at": iso(now + timedelta(minutes=2)), "user_id": 4, "qty": 11}).encode(), None),
    ])
    # Record timestamps within the topic's retention (7 days): the broker deletes older records on its own.
    hour = now.replace(minute=0, second=0, microsecond=0)
    old, new = int((hour - timedelta(hours=3)).timestamp() * MS), int((hour - timedelta(hours=1)).timestamp() * MS)
    send(bootstrap, stamped_topic, [(b'{"user_id": 1, "qty": 1}', old), (b'{"user_id": 1, "qty": 2}', old + 10),
                                    (b'{"user_id": 2, "qty": 4}', new), (b'{"user_id": 2, "qty": 8}', new + 10)])

    sinks = run_job(tmp_path, kafka_broker, ["iso_qty", "stamped_qty"], "earliest", "all")
    assert sums(sinks, "iso_qty") == {1: (2, 5.0), 2: (1, 5.0), 4: (1, 11.0)}
    assert [(r["reason"], json.loads(r["line"])["qty"]) for r in rows(sinks / "quarantine" / "iso")] == \
        [("bad_type:at", 100)]
    late = rows(sinks / "late" / "iso")
    assert [(r["user_id"], r["qty"]) for r in late] == [(3, 7)]  # beyond max_future: the batch route
    assert abs(late[0]["ts_us"] - int((now + timedelta(hours=1)).timestamp() * 1e6)) < 1000
    assert sums(sinks, "stamped_qty") == {1: (2, 3.0), 2: (2, 12.0)}

    # Started at a timestamp, a job with no state reads only the records at or after it.
    later = run_job(tmp_path, kafka_broker, ["stamped_qty"], f"timestamp:{new}", "from_new")
    assert sums(later, "stamped_qty") == {2: (2, 12.0)}



PLAN = '''
import sys
sys.path[:0] = [{platform!r}]
from pyflink.table import EnvironmentSettings, TableEnvironment
from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import FlinkTarget, compile_flink
user = Entity("user", ["user_id"])
tx = Source("tx", "tx", timestamp_field="ts", stream=StreamBinding(kafka_topic="tx", kafka_bootstrap_servers="k:1",
            idle_timeout="15s", watermark_alignment="30s"))
view = FeatureView("spend", [user], tx, aggregations=[Aggregation("qty", "sum", "1d")], tile="1h")
cat = build_catalog([user, tx, view], schema_reader=lambda s: {{"user_id": "int64", "qty": "int64", "ts": "timestamp"}})
job = compile_flink(cat, FlinkTarget(inbox={{}}, sink_root="file:///tmp/unused", kafka=True))
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
env.get_config().set("pipeline.jars", {jars!r})
for key, value in job.settings:
    env.get_config().set(key, value)
for statement in job.statements:
    env.execute_sql(statement)
print(next(line for line in env.explain_sql(job.inserts[0]).splitlines() if "TableSourceScan" in line))
'''


def test_a_sources_idleness_and_watermark_alignment_reach_flinks_kafka_scan(tmp_path: Path) -> None:
    """Flink's planner takes the binding's own idle timeout (over the job's minute) and puts the source in the
    alignment group with its max drift: the optimized plan's scan, planned on real Flink with the connector."""
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    script = tmp_path / "plan.py"
    jars = ";".join(p.resolve().as_uri() for p in kafka_job_jars())
    script.write_text(PLAN.format(platform=str(REPO / "platform"), jars=jars))
    out = subprocess.run([str(STREAM_PYTHON), str(script)], capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    scan = out.stdout.strip().splitlines()[-1]
    assert "idletimeout=[15000]" in scan and "watermarkAlignment=[quiver, PT30S" in scan, scan[-400:]
