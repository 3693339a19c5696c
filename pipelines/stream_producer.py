"""Write events as time-ordered JSON-lines files into a stream directory (the local stand-in for Kafka).

Each line holds `ts_us` (epoch microseconds of the event time: the catalog's resolution, so the stream
and the batch files agree on which side of `< t` every event falls) plus the other columns (timestamps
as epoch µs too); floats are written with their shortest exact representation and NaN / ±Infinity as
the tokens `NaN` / `Infinity` (NaN is a value, as in the batch files), so the stream carries exactly the
values of the batch files.
Files are named `<stream time, 13 digits>-<seq, 8 digits>.jsonl`, where the stream time is the greatest
event time written so far, so name order is write order even when some events arrive out of order, and
each file appears atomically (written under a hidden name, then renamed). `keyed_records` turns the same
rows into Kafka records (strict JSON, keyed by an entity column).

    python -m quiver.pipelines.stream_producer --out data/stream/transactions --demo-days 1 --rate 20000
    python -m quiver.pipelines.stream_producer --out data/stream/transactions --from data/events/transactions
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds


def _dumps() -> Callable[[Any], bytes]:
    try:
        import orjson

        return orjson.dumps  # type: ignore[no-any-return]
    except ImportError:
        return lambda row: json.dumps(row, separators=(",", ":")).encode()


def epoch_us(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Epoch microseconds of a timestamp column (nanoseconds are refused, not cut)."""
    if pa.types.is_timestamp(column.type) and column.type.unit == "ns":
        raise ValueError("nanosecond timestamps: the catalog's time resolution is microseconds; cast first")
    us = pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return np.asarray(us.to_numpy(zero_copy_only=False))


def epoch_ms(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Epoch milliseconds of a timestamp column, floored (file names, pacing)."""
    return epoch_us(column) // 1000


_NON_FINITE_TEXT = {0: "NaN", 1.0: "Infinity", -1.0: "-Infinity"}  # Java's spelling (Double.parseDouble)


def to_ndjson(events: pa.Table, ts_column: str = "event_ts", strict: bool = False) -> bytes:
    """The rows of `events` as JSON lines: `ts_us` first, then the other columns (timestamps as epoch µs).

    NaN and ±infinity are the bare tokens `NaN` / `Infinity` the feeder reads, or with `strict` the strings
    "NaN" / "Infinity" / "-Infinity": strict JSON, which is what Kafka records must be (Flink's JSON
    functions reject the bare tokens; the Kafka job reads the strings as those values)."""
    columns: dict[str, list[Any]] = {"ts_us": epoch_us(events.column(ts_column)).tolist()}
    non_finite = np.zeros(events.num_rows, dtype=bool)
    for name in events.column_names:
        if name == ts_column:
            continue
        column = events.column(name)
        if pa.types.is_timestamp(column.type):
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            us = epoch_us(pc.fill_null(column, 0)).tolist()
            columns[name] = [v if ok else None for v, ok in zip(us, valid, strict=True)]
        else:
            if pa.types.is_floating(column.type):
                non_finite |= ~pc.is_finite(pc.fill_null(column, 0.0)).to_numpy(zero_copy_only=False)
            columns[name] = column.to_pylist()
    dumps = _dumps()
    names = list(columns)
    lines = []
    for row, odd in zip(zip(*columns.values(), strict=True), non_finite.tolist(), strict=True):
        record = dict(zip(names, row, strict=True))
        if odd and strict:
            record = {k: (_NON_FINITE_TEXT[math.copysign(1, v) if math.isinf(v) else 0]
                          if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            lines.append(dumps(record))
        else:
            # orjson writes NaN as null; the stdlib writes the NaN / Infinity tokens the feeder reads.
            lines.append(json.dumps(record, separators=(",", ":")).encode() if odd else dumps(record))
    return b"".join(line + b"\n" for line in lines)


def keyed_records(events: pa.Table, key_column: str, ts_column: str = "event_ts") -> list[tuple[bytes | None, bytes]]:
    """Kafka records of `events`, in their order: each row as strict JSON (`to_ndjson(strict=True)`, the line a
    stream file holds but with NaN / ±infinity as strings), keyed by its `key_column` value (None where null), so
    one key's events share a partition and keep their order."""
    lines = to_ndjson(events, ts_column, strict=True).splitlines()
    keys = events.column(key_column).to_pylist()
    return [(None if key is None else str(key).encode(), line) for key, line in zip(keys, lines, strict=True)]


class StreamWriter:
    """Appends files to a stream directory, continuing the sequence of the files already there."""

    def __init__(self, stream_dir: str | Path):
        self.dir = Path(stream_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        existing = [p.name for p in self.dir.glob("*.jsonl") if not p.name.startswith(".")]
        self.seq = max((int(n.split("-")[1].split(".")[0]) + 1 for n in existing), default=0)
        self.stream_ms = max((int(n.split("-")[0]) for n in existing), default=0)

    def write(self, events: pa.Table, ts_column: str = "event_ts") -> Path:
        """Write one file holding `events` in their order; returns its path."""
        if events.num_rows:
            self.stream_ms = max(self.stream_ms, int(epoch_ms(events.column(ts_column)).max()))
        path = self.dir / f"{self.stream_ms:013d}-{self.seq:08d}.jsonl"
        tmp = self.dir / f".{path.name}.tmp"
        tmp.write_bytes(to_ndjson(events, ts_column))
        os.replace(tmp, path)
        self.seq += 1
        return path


def chunks(events: pa.Table, rows_per_file: int) -> Iterator[pa.Table]:
    for start in range(0, events.num_rows, rows_per_file):
        yield events.slice(start, rows_per_file)


def produce(events: pa.Table, stream_dir: str | Path, *, rows_per_file: int = 10_000, rate: float | None = None,
            ts_column: str = "event_ts", sort: bool = True) -> list[Path]:
    """Write `events` as files of `rows_per_file` rows, sorted by time unless `sort=False` (then in the given
    order, e.g. with deliberate out-of-order rows); `rate` (events/s) paces the writes like a live stream."""
    if rows_per_file < 1:
        raise ValueError("rows_per_file must be >= 1")
    if sort:
        events = events.take(pc.sort_indices(events, sort_keys=[(ts_column, "ascending")]))
    writer = StreamWriter(stream_dir)
    paths = []
    began = time.perf_counter()
    written = 0
    for chunk in chunks(events, rows_per_file):
        if rate:
            delay = began + written / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        paths.append(writer.write(chunk, ts_column))
        written += chunk.num_rows
    return paths


def read_events(path: str | Path) -> pa.Table:
    """Events from a Parquet file or a (date-partitioned) folder of Parquet files."""
    return ds.dataset(str(path), format="parquet", partitioning="hive").to_table()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m quiver.pipelines.stream_producer", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="stream directory (a source's StreamBinding path)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="source", help="Parquet file or folder of events (e.g. data/events/transactions)")
    src.add_argument("--demo-days", type=int, help="generate this many days of synthetic transactions")
    p.add_argument("--rows-per-file", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=None, help="events per second (default: as fast as possible)")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)
    if a.source:
        events = read_events(a.source)
    else:
        import tempfile

        from quiver.pipelines.demo_data import generate

        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp, days=a.demo_days, seed=a.seed)
            events = read_events(Path(tmp) / "events" / "transactions")
    events = events.drop_columns([c for c in ("date",) if c in events.column_names])
    began = time.perf_counter()
    paths = produce(events, a.out, rows_per_file=a.rows_per_file, rate=a.rate)
    print(f"wrote {events.num_rows:,} events in {len(paths)} files to {a.out} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
