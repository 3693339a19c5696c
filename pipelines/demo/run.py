"""`make demo`: the main job end to end on embedded defaults, on freshly generated synthetic data.

Each step prints what it did; the data lives under ./data and the registry under ./.quiver.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from quiver.catalog.ir import Catalog
from quiver.cli import console  # one console for the demo and the CLI: wide when piped
from quiver.config import Config, load_config

if TYPE_CHECKING:
    import pyarrow as pa

START = date(2026, 11, 1)


def step(title: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    def wrap(func: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            console.rule(f"[bold]{title}")
            started = time.perf_counter()
            result = func(*args, **kwargs)
            console.print(f"[dim]({time.perf_counter() - started:.1f} s)[/dim]")
            return result

        return run

    return wrap


@step("1. Synthetic events and labels")
def generate_data(config: Config, days: int, drift_from_day: int, transactions_per_day: int = 20_000,
                  users: int = 2_000) -> None:
    from quiver.pipelines.demo_data import generate

    summary = generate(config.root / "data", days=days, start=START, seed=7, drift_from_day=drift_from_day,
                       late_fraction=0.01, malformed_fraction=0.001, transactions_per_day=transactions_per_day,
                       users=users)
    console.print(summary)


@step("2. Apply the feature catalog (feature_defs/)")
def apply_catalog(config: Config) -> Catalog:
    from quiver.catalog.loader import load_catalog
    from quiver.cli import _print_diff, list_views
    from quiver.registry import Registry

    catalog = load_catalog(config.catalog_dir, root=config.root)
    result = Registry(config.registry, project=config.project).apply(catalog, author="make demo")
    _print_diff(result.diff)
    console.print(f"catalog version {result.version} ({'new' if result.created else 'unchanged'})")
    list_views(config=None, catalog=None)
    return catalog


@step("3. Backfill the offline store (DuckDB; `--engine spark` for Spark)")
def run_backfill(config: Config, catalog: Catalog, days: int, engine: str) -> None:
    from rich.table import Table

    from quiver.cli.offline import refused_text
    from quiver.offline.backfill import backfill

    report = backfill(config, catalog, START, START + timedelta(days=days - 1), engine=engine)
    table = Table("view", "kind", "events read", "rows written", "null keys", "no time", "refused by contract")
    for name, view in sorted(report.views.items()):
        table.add_row(name, view.kind, f"{view.events_read:,}", f"{view.rows_written:,}",
                      f"{view.quarantined_null_keys:,}", f"{view.quarantined_null_ts:,}",
                      refused_text(view.quarantined_by_check))
    console.print(table)
    console.print(f"offline store: {config.offline_dir}")


def labelled_features(config: Config, catalog: Catalog, first: date, last: date, out: Path) -> object:
    """Training set for the labels of days first..last (inclusive) × the fraud_model service → `out`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from quiver.offline.pit import get_historical_features

    labels = pq.read_table(config.root / "data/labels/labels.parquet")
    day = pc.cast(labels["event_ts"], "date32")
    keep = pc.and_(pc.greater_equal(day, pa.scalar(first)), pc.less_equal(day, pa.scalar(last)))
    frame = get_historical_features(labels.filter(keep), "fraud_model", catalog=catalog, config=config)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out, index=False)
    return frame


@step("4. Point-in-time training set (labels of the last 3 days × the fraud_model service)")
def training_set(config: Config, catalog: Catalog, days: int) -> None:
    import pyarrow as pa

    out = config.root / "data/training/fraud_model.parquet"
    frame = labelled_features(config, catalog, START + timedelta(days=days - 3), START + timedelta(days=days - 1), out)
    console.print(f"training set {frame.shape[0]:,} rows × {frame.shape[1]} columns → {out}")  # type: ignore[attr-defined]
    # The join's pandas frame reads a float null as NaN (docs/edges.md). The contract refuses NaN amounts, so
    # in these columns a NaN is a missing value (an empty window, no row yet): Arrow holds it as a null.
    columns = ["user_id", "event_ts", "is_fraud", "amount_count_1h", "amount_mean_24h", "last_amount",
               "credit_limit", "risk_score"]
    show(pa.Table.from_pandas(frame[columns].head(5), preserve_index=False))  # type: ignore[index]


@step("5. Materialize to Redis and read online features")
def online(config: Config, days: int) -> None:
    from datetime import UTC, datetime
    from datetime import time as clock

    import pyarrow.parquet as pq

    from quiver.serving.store import FeatureStore

    end = datetime.combine(START + timedelta(days=days), clock(), tzinfo=UTC)
    if not config.redis_url:
        import redis

        from quiver.online.embedded import ensure_redis

        # The embedded Redis outlives a demo run; start each run from an empty store (step 7's streamed
        # values would otherwise show up in this run's "before" column).
        redis.Redis.from_url(ensure_redis(config)).flushdb()
    with FeatureStore(config=config) as store:
        report = store.materialize(end=end)
        console.print(str(report))
        # Five of the last transactions, scored as they would be: the stored features of their user and
        # merchant, and the transaction itself (its amount, online or not) as the request fields.
        labels = pq.read_table(config.root / "data/labels/labels.parquet",
                               columns=["user_id", "merchant_id", "amount", "is_online"])
        last = labels.slice(max(0, labels.num_rows - 5)).to_pylist()
        entity_rows = [{"user_id": r["user_id"], "merchant_id": r["merchant_id"]} for r in last]
        request = {"amount": [r["amount"] for r in last], "is_online": [r["is_online"] for r in last]}
        result = store.get_online_features("fraud_model", entity_rows, at=end, request=request)
        show(result.to_arrow().select(["user_id", "amount_count_24h", "amount_mean_24h", "amount_stddev_7d",
                                       "last_amount", "tx_amount", "log_amount_vs_usual", "risk_score"]))


@step("6b. Train the first champion on the pre-drift window and register it (quiver train)")
def train_champion(config: Config, drift_from_day: int) -> None:
    from rich.table import Table

    from quiver.pipelines.training import metrics_table, run_training

    # Labels of the days before the drift, so the champion learns the world the drift check calls normal.
    cutoff = START + timedelta(days=drift_from_day)
    result = run_training(config, "fraud_model", f"{drift_from_day}d", cutoff, alias="champion",
                          log=lambda line: console.print(line, highlight=False))
    # Measured on the test window (the newest rows, which neither fit nor early stopping saw).
    table = Table("test-window metric", result.version.label, "baseline (logistic regression)")
    for row in metrics_table(result):
        table.add_row(*row)
    console.print(table)
    console.print(f"{result.version.label}: {result.status} ({result.device}, {result.samples_per_s:,.0f} "
                  f"samples/s); aliases {_model_aliases(config, result.version.name)}")


def _model_aliases(config: Config, name: str) -> dict[str, int]:
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    return ModelRegistry(Registry(config.registry, project=config.project)).aliases(name)


@step("7. The closed loop through Airflow: drift → retraining → shadow → canary → promotion, then a rollback")
def closed_loop(config: Config, days: int, drift_from_day: int) -> None:
    from quiver.pipelines.demo.loop import tell_story

    tell_story(config, START, days, drift_from_day, console)


@step("8. Stream two more hours of events (12:00–14:00 the next day) through Kafka (else stream files) and Flink "
      "into Redis (quiver stream --bounded)")
def stream(config: Config, catalog: Catalog, days: int, kafka: bool = True) -> None:
    import subprocess
    from datetime import UTC, datetime
    from datetime import time as clock

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from quiver.pipelines.stream_producer import StreamWriter
    from quiver.serving.store import FeatureStore

    # Fresh events: 12:00–14:00 of the last day, replayed one day later.
    day_end = datetime.combine(START + timedelta(days=days), clock(), tzinfo=UTC)
    source = ds.dataset(config.root / "data/events/transactions", format="parquet", partitioning="hive")
    ts = pc.field("event_ts")
    utc = pa.timestamp("us", "UTC")
    window = source.to_table(filter=(ts >= pa.scalar(day_end - timedelta(hours=12), utc))
                             & (ts < pa.scalar(day_end - timedelta(hours=10), utc)))
    window = window.drop_columns([c for c in window.column_names if c == "date"])
    window = window.set_column(window.schema.get_field_index("event_ts"), "event_ts",
                               pc.add(window["event_ts"], pa.scalar(timedelta(days=1), pa.duration("us"))))
    window = window.sort_by("event_ts")
    stream_dir = config.root / "data/stream/transactions"
    shutil.rmtree(stream_dir, ignore_errors=True)
    shutil.rmtree(config.root / ".quiver/stream", ignore_errors=True)  # a demo rerun starts a fresh job
    topic = _through_kafka(config, catalog, window) if kafka else None
    if topic is None:
        if not kafka:
            console.print("streaming from files (--no-kafka)")
        writer = StreamWriter(stream_dir)
        for start in range(0, window.num_rows, 5_000):
            writer.write(window.slice(start, 5_000))
    # The job reads the embedded broker or, with an empty address, the stream files: never a cluster that
    # quiver.yaml names, which this demo's topic must not touch.
    env = {**os.environ, "QUIVER_KAFKA_BOOTSTRAP": topic[0] if topic else ""}
    at = day_end + timedelta(hours=14)
    users = [{"user_id": int(u), "merchant_id": 1} for u in pc.unique(window["user_id"]).to_pylist()[:6] if u]
    features = ["user_spend:amount_count_1h", "user_spend:amount_count_24h", "user_last_transaction:last_amount"]
    with FeatureStore(config=config) as store:
        before = store.get_online_features(features, users, at=at).to_arrow()
        if topic is None:
            console.print(f"{window.num_rows:,} events in {len(list(stream_dir.glob('*.jsonl')))} files → Flink")
        subprocess.run(stream_job_command(), check=True, cwd=config.root, env=env)
        after = store.get_online_features(features, users, at=at).to_arrow()
    if topic is not None:
        _say_streamed(config, *topic)
    for name in ("amount_count_1h", "amount_count_24h", "last_amount"):
        before = before.append_column(f"{name} (streamed)", after[name])
    console.print(f"online values as of {at:%Y-%m-%d %H:%M} UTC, before and after the stream:")
    show(before)


def stream_job_command() -> list[str]:
    """`quiver stream --bounded` as the demo runs it: the CLI of this interpreter, wherever the venv lives (its
    path may itself contain "python"), logging only the job's warnings and errors. Its INFO lines (and Beam's,
    PyFlink's) would interrupt the story, which the lines after the run tell (`quiver stream-status`: the rest)."""
    return [sys.executable, "-m", "quiver.cli", "stream", "--bounded", "--log-level", "warning"]


def _through_kafka(config: Config, catalog: Catalog, window: pa.Table) -> tuple[str, str] | None:
    """Produce the window to the catalog's topic on the project's embedded broker: (bootstrap, topic), or
    None (the reason said) when there is no topic, no broker or no Flink Kafka connector: then the demo
    streams from files."""
    import logging

    from quiver.catalog.errors import QuiverError
    from quiver.pipelines.stream_producer import keyed_records
    from quiver.streaming.embedded_kafka import PARTITIONS, start_broker
    from quiver.streaming.kafka_broker import fresh_topic, produce
    from quiver.streaming.options import kafka_job_jars

    # librdkafka's retry notices (a fresh broker is still loading its coordinators) are no news here:
    # produce() raises when a record is not delivered.
    logging.getLogger("quiver.kafka.client").setLevel(logging.ERROR)
    binding = catalog.sources["transactions"].stream
    if binding is None or not binding.kafka_topic:
        console.print("streaming from files: the transactions stream binding names no kafka_topic")
        return None
    try:
        kafka_job_jars()  # the connector and the parser: without them `quiver stream` would refuse the topic
        bootstrap = start_broker(config)
        fresh_topic(bootstrap, binding.kafka_topic, PARTITIONS)  # a rerun's job replays this window only
        sent = produce(bootstrap, binding.kafka_topic, keyed_records(window, "user_id"))
    except QuiverError as exc:
        console.print(f"streaming from files, not Kafka: {exc}", highlight=False)
        return None
    console.print(f"{sent:,} events → Kafka topic {binding.kafka_topic!r} ({PARTITIONS} partitions, keyed by "
                  f"user_id) on the embedded broker at {bootstrap} → Flink", highlight=False)
    return bootstrap, binding.kafka_topic


def _say_streamed(config: Config, bootstrap: str, topic: str) -> None:
    """What the topic holds (from the broker) and what the job read of it (its status, `quiver stream-status`)."""
    from quiver.streaming.kafka_broker import end_offsets
    from quiver.streaming.paths import StreamPaths
    from quiver.streaming.status import read_status

    ends = end_offsets(bootstrap, topic)
    status = read_status(StreamPaths.at(config.root / ".quiver/stream")) or {}
    committed = ((status.get("kafka") or {}).get("transactions") or {}).get("committed", 0)
    console.print(f"streamed through Kafka: topic {topic!r}, {len(ends)} partitions, {sum(ends.values()):,} records; "
                  f"the job read and committed {committed:,}", highlight=False)
    console.print(f"the broker keeps running at {bootstrap} (`quiver kafka status`, `quiver kafka stop`)",
                  highlight=False)


def fresh_start(config: Config) -> None:
    """A rerun of the demo tells its story from the start, as the first run did: the previous run's data/
    (events, offline store, serving logs, labels) and .quiver/ (registry, online store, models, loop and
    stream state) go. Kept, they failed the rerun (the champion left behind may only be replaced through the
    loop's gates) or, worse, fed it: the old run's serving logs and labels of the same version numbers
    reached the new run's shadow verdict."""
    gone = [path for path in (config.root / "data", config.root / ".quiver") if path.exists()]
    if not gone:
        return
    from quiver.online.embedded import stop_embedded
    from quiver.streaming.embedded_kafka import stop_embedded_broker

    stop_embedded(config)
    stop_embedded_broker(config)  # its topics and offsets live in .quiver/kafka/, deleted below
    for path in gone:
        shutil.rmtree(path)
    console.print(f"a fresh demo: removed the previous run's {' and '.join(f'{p.name}/' for p in gone)}")


def show(rows: pa.Table) -> None:
    """Print a small Arrow table as a rich table: floats to 4 significant digits, a null (no value) as `null`
    and a NaN (a value, docs/edges.md) as `NaN`, never pandas' `nan` for both."""
    from rich.table import Table

    table = Table(*rows.column_names)
    for row in rows.to_pylist():
        table.add_row(*[cell_text(v) for v in row.values()])
    console.print(table)


def cell_text(value: object) -> str:
    """One value of a demo table (see `show`)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return "NaN" if value != value else f"{value:.4g}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m quiver.pipelines.demo", description=__doc__)
    # Sized for the closed loop (step 7) on 2 cores: 15 days of traffic after the drift, 6k requests a day.
    # Labels arrive a day late (knowledge time), so the retrain waits a day or two for labels of the drifted
    # traffic, and shadow, canary and the watch each wait for theirs: 15 days leave room for the bad model's
    # rollback at the end.
    parser.add_argument("--days", type=int, default=23)
    parser.add_argument("--drift-from-day", type=int, default=8)
    parser.add_argument("--transactions-per-day", type=int, default=6_000)
    parser.add_argument("--users", type=int, default=1_500)
    parser.add_argument("--no-stream", action="store_true", help="skip the Flink streaming step")
    parser.add_argument("--no-kafka", action="store_true",
                        help="stream from files even when a local Kafka broker can be started")
    parser.add_argument("--engine", choices=["duckdb", "spark"], default="duckdb")
    args = parser.parse_args(argv)
    config = load_config(Path("quiver.yaml") if Path("quiver.yaml").exists() else None)
    fresh_start(config)
    generate_data(config, args.days, args.drift_from_day, args.transactions_per_day, args.users)
    catalog = apply_catalog(config)
    run_backfill(config, catalog, args.days, args.engine)
    training_set(config, catalog, args.days)
    online(config, args.days)
    train_champion(config, args.drift_from_day)
    closed_loop(config, args.days, args.drift_from_day)  # supersedes the file-vs-file drift check (step 6)
    if not args.no_stream:
        stream(config, catalog, args.days, kafka=not args.no_kafka)
    console.print(f"[green]demo done[/green]: data in {config.root / 'data'}, "
                  f"end date {START + timedelta(days=args.days - 1)}")


if __name__ == "__main__":
    main()
