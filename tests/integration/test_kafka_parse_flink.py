"""`quiver_parse` (infra/jvm/redis-sink, dev.quiver.jvm.parse) against the SQL it replaced, on real Flink: for
every line of tests/vectors/kafka_parse_lines.json, the reason, the event time and (for good lines) the typed
values of the JVM parser equal those of the JSON_VALUE / TRY_CAST expressions the Kafka job used to run. The
reference expressions are spelled out here, so a Flink upgrade that changes either side shows up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from quiver.jars import REDIS_SINK, bundle_jars
from tests.integration.test_streaming_e2e import REPO, STREAM_PYTHON

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = r'''
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment

COLUMNS = [("user_id", "int64"), ("qty", "int64"), ("amount", "float64"), ("ok", "bool"), ("cat", "string"),
           ("at", "timestamp")]
TYPES = {"int64": "BIGINT", "timestamp": "BIGINT", "float64": "DOUBLE"}


def raw(field):
    return f"JSON_VALUE(`line`, '$.{field}')"


def typed(field, dtype):  # the old compile/flink_sources._parse
    if dtype == "bool":
        return f"CASE {raw(field)} WHEN 'true' THEN TRUE WHEN 'false' THEN FALSE END"
    return raw(field) if dtype == "string" else f"TRY_CAST({raw(field)} AS {TYPES[dtype]})"


def bad_type(field, dtype):  # the old _bad_type
    if dtype in ("int64", "timestamp"):
        return (f"{raw(field)} IS NOT NULL AND ({typed(field, dtype)} IS NULL "
                f"OR CAST({typed(field, dtype)} AS STRING) <> {raw(field)})")
    return f"{raw(field)} IS NOT NULL AND {typed(field, dtype)} IS NULL"


lines = json.load(open(sys.argv[1]))
env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
env.get_config().set("pipeline.jars", sys.argv[2])
env.get_config().set("parallelism.default", "1")
env.execute_sql("CREATE TEMPORARY SYSTEM FUNCTION quiver_parse AS 'dev.quiver.jvm.parse.ParseRecord' LANGUAGE JAVA")
literal = lambda s: "CAST(NULL AS STRING)" if s is None else "'" + s.replace("'", "''") + "'"
rows = ",\n".join(f"({i}, {literal(line)})" for i, line in enumerate(lines))
env.execute_sql(f"CREATE TEMPORARY VIEW src AS SELECT * FROM (VALUES {rows}) AS t(i, line)")
checks = [("NOT (`line` IS JSON OBJECT)", "unparseable_json"),
          (f"{raw('ts_us')} IS NULL AND {raw('ts_ms')} IS NULL", "null_event_ts"),
          (bad_type("ts_us", "int64"), "bad_type:ts_us"), (bad_type("ts_ms", "int64"), "bad_type:ts_ms")]
checks += [(bad_type(c, t), f"bad_type:{c}") for c, t in COLUMNS if t != "string"]
reason = "CASE " + " ".join(f"WHEN {c} THEN '{r}'" for c, r in checks) + " END"
ts = f"COALESCE(TRY_CAST({raw('ts_us')} AS BIGINT), TRY_CAST({raw('ts_ms')} AS BIGINT) * 1000)"
old = ", ".join(f"CAST({typed(c, t)} AS STRING)" for c, t in COLUMNS)
new = ", ".join(f"CAST(p.`{c}` AS STRING)" for c, _ in COLUMNS)
spec = ",".join(f"{c}:{t}" for c, t in COLUMNS)
n = len(COLUMNS) + 2
differences = []
with env.execute_sql(f"SELECT i, {reason}, CAST({ts} AS STRING), {old}, p.__reason, CAST(p.__ts_us AS STRING), {new} "
                     f"FROM (SELECT i, line, quiver_parse(line, '{spec}') AS p FROM src)").collect() as results:
    for r in results:
        was, now = list(r)[1:1 + n], list(r)[1 + n:]
        if was[0] is not None:  # a refused line's values are never read: its reason and event time are
            was, now = was[:2], now[:2]
        if was != now:
            differences.append({"line": lines[r[0]], "sql": was, "quiver_parse": now})
print(json.dumps({"lines": len(lines), "differences": differences}))
'''


def test_quiver_parse_means_what_the_json_value_sql_meant(tmp_path: Path) -> None:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    script = tmp_path / "compare.py"
    script.write_text(SCRIPT)
    jars = ";".join(p.resolve().as_uri() for p in bundle_jars(REDIS_SINK))
    lines = REPO / "tests" / "vectors" / "kafka_parse_lines.json"
    out = subprocess.run([str(STREAM_PYTHON), str(script), str(lines), jars], capture_output=True, text=True,
                         timeout=600, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["lines"] > 80
    assert result["differences"] == []


CLOCK_SCRIPT = r'''
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment

env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
cases = json.loads(sys.argv[1])
query = "SELECT " + ", ".join(f"{sql} AS c{i}" for i, sql in enumerate(cases)) + " FROM (VALUES (1)) AS t(x)"
with env.execute_sql(query).collect() as rows:
    print(json.dumps([list(r) for r in rows][0]))
'''


def test_an_event_of_the_current_second_is_not_in_the_future() -> None:
    """The Kafka job's clock reads whole seconds: an event stamped later in the current second (any fresh
    record) is not "future" with max_future_ms = 0, an event a second and more ahead is; and the slack counts."""
    from quiver.compile.flink_sources import not_future

    now = "UNIX_TIMESTAMP() * 1000000"  # the current second's start, µs
    cases = [not_future(f"{now} + 999999", 0),  # the last µs of the current second: on time
             not_future(f"{now}", 0),
             not_future(f"{now} + 2000000", 0),  # two seconds ahead: future
             not_future(f"{now} + 2000000", 5000)]  # unless max_future_ms allows it
    out = subprocess.run([str(STREAM_PYTHON), "-c", CLOCK_SCRIPT, json.dumps(cases)], capture_output=True,
                         text=True, timeout=300, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True, False, True]
