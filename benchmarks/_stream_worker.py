"""The blackhole (b, kb) and Python-sink (c) sides of benchmarks/streaming.py, run in the streaming venv:
the compiled job of the project, fed like the runner feeds it, with its tile and last-value sinks swapped.

Usage (benchmarks/streaming.py starts it): _stream_worker.py KIND CONFIG STATE PARALLELISM RUNNER_ARGS_JSON;
the last line printed is the side's figures as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import _stream_kafka

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]  # as benchmarks/streaming.py: this checkout's quiver


def worker(kind: str, config_path: str, state: str, parallelism: int, runner_args: list[str]) -> None:
    """Feed the stream dir like the runner, then run the compiled job with its tile and last-value sinks
    swapped: `blackhole` (Flink's floor for our SQL) or `pysink` (a pandas UDF writing Redis per bundle)."""
    import re

    from pyflink.table import EnvironmentSettings, TableEnvironment

    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.streaming.feeder import Feeder, source_feeds
    from quiver.streaming.job import JobOptions, flink_config
    from quiver.streaming.late import late_dir
    from quiver.streaming.options import kafka_job_jars
    from quiver.streaming.paths import StreamPaths
    from quiver.streaming.runner import StreamRunner, parse_args
    from quiver.streaming.status import tree_cpu_s

    args = parse_args(["--config", config_path, "--state-dir", state, *runner_args])
    cfg = load_config(config_path)
    cat = load_catalog(cfg.catalog_dir, root=cfg.root)
    paths = StreamPaths.at(state)
    options = _stream_options(args, parallelism)
    runner = StreamRunner(cfg, cat, paths, options, store=None)
    feed_began = time.perf_counter()
    fed = Feeder(runner.streams, paths, source_feeds(cat, runner.views), late_dir(Path(state) / "late"),
                 options.max_future_ms).feed()
    feed_s = time.perf_counter() - feed_began
    job = runner.job
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    connectors = tuple(kafka_job_jars()) if runner.kafka else ()  # the connector and the parser (sinks swapped)
    settings = flink_config(job, JobOptions(parallelism, options.checkpoint_interval_ms, options.state_backend,
                                            extra=options.flink_settings, jars=connectors), paths, None)
    for k, v in settings.items():
        conf.set(k, v)
    conf.set("python.executable", sys.executable)
    conf.set("python.fn-execution.bundle.time", "100")
    ss = env.create_statement_set()
    swapped = {}
    for statement in job.statements:
        # A bounded scan: the job ends when the data does (no monitoring of the inbox; Kafka to its end now).
        statement = _stream_kafka.bounded_scan(re.sub(r",\n  'source.monitor-interval' = '[^']*'", "", statement))
        name = statement.split("`")[1] if statement.startswith("CREATE TABLE") else ""
        if name.split("__")[0] in ("tiles", "last"):
            swapped[name] = statement
            if kind == "blackhole":
                statement = statement[:statement.index(") WITH (")] + ") WITH ('connector' = 'blackhole')"
            else:
                continue
        env.execute_sql(statement)
    for insert in job.inserts:
        table = insert.split("`")[1]
        if kind == "pysink" and table in swapped:
            ss.add_insert_sql(_python_sink(env, cat, cfg, table, insert))
        else:
            ss.add_insert_sql(insert)
    began = time.time()
    result = ss.execute()
    running = time.time()
    cpu0 = tree_cpu_s()  # after planning and submission, like the runner's "running" mark
    result.wait()
    done = time.time()
    cpu1 = tree_cpu_s()
    print(json.dumps({"submit_s": running - began, "job_s": done - running, "feed_s": feed_s,
                      "fed_lines": fed.total_lines, "cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 else None}))


def _stream_options(args: Any, parallelism: int) -> Any:
    from quiver.streaming.options import StreamOptions, settings_pairs

    return StreamOptions(bounded=True, parallelism=parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                         monitor_interval_ms=args.monitor_interval_ms, roll_interval_ms=args.roll_interval_ms,
                         state_backend=args.state_backend, mini_batch_ms=args.mini_batch_ms,
                         table_settings=settings_pairs(args.table_set), flink_settings=settings_pairs(args.flink_set))


def _python_sink(env: Any, cat: Any, cfg: Any, table: str, insert: str) -> str:
    """The per-row Python hand-off of the old design: a pandas UDF that writes each bundle to Redis."""
    import pandas as pd
    import pyarrow as pa
    from pyflink.table import DataTypes
    from pyflink.table.udf import ScalarFunction, udf

    from quiver.offline.layout import last_values_schema, tile_schema

    kind, _, name = table.partition("__")
    view = cat.views[name]
    schema = tile_schema(view) if kind == "tiles" else last_values_schema(view)

    class RedisWriter(ScalarFunction):  # type: ignore[misc]
        def __init__(self, view: Any, schema: pa.Schema, url: str, project: str):
            self.view, self.schema, self.url, self.project = view, schema, url, project

        def open(self, function_context: Any) -> None:
            from quiver.online.redis_store import RedisOnlineStore

            self.store = RedisOnlineStore(self.url, self.project, timeout_s=10)

        def eval(self, *columns: pd.Series) -> pd.Series:
            data = pa.table({f.name: pa.array(c.to_numpy(), type=pa.int64() if pa.types.is_timestamp(f.type)
                                               else f.type, from_pandas=True)
                             for f, c in zip(self.schema, columns, strict=True)})
            if self.view.kind == "agg":
                self.store.write_tiles(self.view, data)
            else:
                self.store.write_last_values(self.view, data.cast(self.schema))
            return pd.Series([0] * len(columns[0]))

    fn = udf(RedisWriter(view, schema, cfg.redis_url, cfg.project), result_type=DataTypes.BIGINT(), func_type="pandas")
    env.create_temporary_function(f"write_{name}", fn)
    env.execute_sql(f"CREATE TABLE `peer_{name}` (x BIGINT) WITH ('connector' = 'blackhole')")
    cols = ", ".join(f"`{f.name}`" for f in schema)
    body = insert.partition("\n")[2]
    return f"INSERT INTO `peer_{name}` SELECT write_{name}({cols}) FROM (\n{body}\n)"


if __name__ == "__main__":
    kind, config, state, level, extra = sys.argv[1:6]
    worker(kind, config, state, int(level), json.loads(extra))
