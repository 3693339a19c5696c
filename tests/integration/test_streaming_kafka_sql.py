"""The Kafka job's parse-and-classify SQL on real Flink and a real broker: the compiled Kafka job, read with
Flink's Kafka connector from a topic holding the records (bounded at the topic's end, so the job finishes).
Malformed records must come out as quarantine rows with their reason, valid ones as tiles."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from quiver.streaming.kafka_broker import KafkaBroker, create_topic, produce
from quiver.streaming.options import kafka_job_jars
from tests.integration.test_streaming_e2e import REPO, STREAM_PYTHON

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORDS = [
    (b'{"ts_us": 1793491200000000, "user_id": 1, "qty": 2}', None),
    (b"not json", "unparseable_json"),
    (b"[1, 2]", "unparseable_json"),
    (b'{"ts_ms": 1793491201000, "user_id": "x", "qty": 1}', "bad_type:user_id"),
    (b'{"ts_us": 1793491201000000, "user_id": 1, "qty": 1.5}', "bad_type:qty"),
    (b'{"user_id": 3}', "null_event_ts"),
    (b'{"ts_us": 4102444800000000, "user_id": 3, "qty": 1}', None),  # beyond max_future: the batch route
    (b'{"ts_ms": 1793491202000, "user_id": 2, "qty": 5}', None),
    (b'{"ts_us": 1793491203000000, "qty": 7}', "max:qty"),  # the contract comes before the view's keys
    (b'{"ts_us": 1793491203000001, "qty": 2}', "null_key"),
    # The source's contract, on the parsed values, with the reasons every other path gives:
    (b'{"ts_us": 1793491204000000, "user_id": 3, "qty": 0}', "min:qty"),
    (b'{"ts_us": 1793491204000001, "user_id": 3, "qty": 6}', "max:qty"),
    (b'{"ts_us": 1793491204000002, "user_id": 3, "qty": 1, "amount": "NaN"}', "finite:amount"),
    (b'{"ts_us": 1793491204000003, "user_id": 3, "qty": 1, "amount": "-Infinity"}', "finite:amount"),
    (b'{"ts_us": 1793491204000004, "user_id": 3, "qty": 1, "amount": -0.5}', "min:amount"),
    (b'{"ts_us": 1793491204000005, "user_id": 3, "qty": 1, "amount": -0.0, "cat": "a"}', None),
    (b'{"ts_us": 1793491204000006, "user_id": 3, "qty": 1, "cat": "it\'s"}', "one_of:cat"),
    (b'{"ts_us": 1793404800000000, "user_id": 3, "qty": 1}', "min:ts"),
]

SCRIPT = '''
import sys
from pathlib import Path
sys.path[:0] = [{platform!r}]
from pyflink.table import EnvironmentSettings, TableEnvironment
from quiver.catalog.loader import load_catalog
from quiver.compile.flink import FlinkTarget, compile_flink
here = Path({golden!r})
columns = {{"user_id": "int64", "merchant_id": "int64", "amount": "float64", "qty": "int64", "flag": "bool",
           "cat": "string", "ts": "timestamp"}}
cat = load_catalog(here / "catalog", root=here, schema_reader=lambda source: dict(columns))
job = compile_flink(cat, FlinkTarget(inbox={{}}, sink_root={sinks!r}, kafka=True, kafka_bootstrap={bootstrap!r}),
                    ["user_clicks"])
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
env.get_config().set("parallelism.default", "1")
env.get_config().set("pipeline.jars", {jars!r})
for key, value in job.settings:
    env.get_config().set(key, value)
for statement in job.statements:
    if statement.startswith("CREATE TABLE `src__"):  # the one change: stop at the topic's end
        statement = statement.replace("'format' = 'raw'", "'format' = 'raw', 'scan.bounded.mode' = 'latest-offset'")
    env.execute_sql(statement)
statements = env.create_statement_set()
for insert in job.inserts:
    statements.add_insert_sql(insert)
statements.execute().wait()
'''


def test_kafka_records_are_parsed_and_malformed_ones_quarantined(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    create_topic(kafka_broker.bootstrap, "clicks", 2)  # the golden catalog's topic
    produce(kafka_broker.bootstrap, "clicks", ((None, r) for r, _ in RECORDS))
    sinks = tmp_path / "sinks"
    script = tmp_path / "job.py"
    jars = ";".join(p.resolve().as_uri() for p in kafka_job_jars())  # the connector and the parser
    script.write_text(SCRIPT.format(platform=str(REPO / "platform"), golden=str(REPO / "tests/golden/flink"),
                                    sinks=sinks.as_uri(), bootstrap=kafka_broker.bootstrap, jars=jars))
    out = subprocess.run([str(STREAM_PYTHON), str(script)], capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(line) for p in sorted((sinks / "quarantine" / "clicks").glob("part-*"))
            for line in p.read_text().splitlines()]
    got = sorted((r["line"], r["reason"]) for r in rows)
    assert got == sorted((r.decode(), reason) for r, reason in RECORDS if reason)
    # A record dated beyond the source's max_future is not quarantined: it goes with the late ones to the batch
    # route, as on the file route (the runner stores it in the offline store's _late_events/).
    late = [json.loads(line) for p in sorted((sinks / "late" / "clicks").glob("part-*"))
            for line in p.read_text().splitlines()]
    assert late == [{"ts_us": 4102444800000000, "user_id": 3, "qty": 1, "amount": None, "cat": None}]
    tiles = [json.loads(line)["after"] for p in sorted((sinks / "tiles" / "user_clicks").glob("part-*"))
             for line in p.read_text().splitlines()]
    keyed = {(t["user_id"], t["tile_start"]): t for t in tiles if t and t["user_id"] is not None}
    assert {k: (t["n_events"], t["qty__sum"]) for k, t in keyed.items()} == {
        (1, 1793491200000000): (1, 2.0), (2, 1793491200000000): (1, 5.0),  # ts_ms read as µs
        (3, 1793491200000000): (1, 1.0)}  # the one valid row of user 3 (-0.0 is not below 0)
