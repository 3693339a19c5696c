"""The loader on real change files (as Flink's debezium-json sink writes them) with a recording store."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, StreamBinding, String
from quiver.catalog.ir import ViewSpec
from quiver.catalog.validate import build_catalog
from quiver.online.base import Column, OnlineStore, ViewRead
from quiver.streaming.loader import Loader, read_changes
from quiver.streaming.paths import StreamPaths

COLUMNS = {"user_id": "int64", "amount": "float64", "cat": "string", "qty": "int64", "ts": "timestamp"}


def views() -> dict[str, ViewSpec]:
    user = Entity("user", ["user_id"])
    tx = Source("tx", "tx", timestamp_field="ts", stream=StreamBinding(path="s"))
    spend = FeatureView("spend", [user], tx, tile="5m", aggregations=[
        Aggregation("amount", "sum", "1h"), Aggregation("cat", "last", "1h")])
    last = FeatureView("last_tx", [user], tx, ttl="1d", schema=[Field("amount", Float64), Field("qty", Int64),
                                                                Field("cat", String)])
    return dict(build_catalog([user, tx, spend, last], schema_reader=lambda s: dict(COLUMNS)).views)


class RecordingStore(OnlineStore):
    """Keeps what it was asked to write (a fake: only for this pure unit test)."""

    def __init__(self) -> None:
        self.tiles: list[pa.Table] = []
        self.last: list[pa.Table] = []
        self.meta: dict[tuple[str, str], str] = {}

    def write_tiles(self, view: ViewSpec, table: pa.Table) -> int:
        self.tiles.append(table)
        return table.num_rows

    def write_last_values(self, view: ViewSpec, table: pa.Table) -> int:
        self.last.append(table)
        return table.num_rows

    def read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
             at: int | np.ndarray) -> dict[tuple[str, str], Column]:
        raise NotImplementedError

    def freshness(self, views: Sequence[str]) -> dict[str, int | None]:
        return {}

    def get_meta(self, view: str, field: str) -> str | None:
        return self.meta.get((view, field))

    def set_meta(self, view: str, field: str, value: str) -> None:
        self.meta[(view, field)] = value

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass


def tile(user: int | None, n: int, amount_sum: float | None, cat: str | None, batch: str | None = None,
         newest: int = 1_800_000_000_200_000) -> dict[str, Any]:
    return {"user_id": user, "tile_start": 1_800_000_000_000_000, "n_events": n, "__newest_us": newest,
            "amount__cnt": n, "amount__sum": amount_sum, "cat__cnt": 1 if cat else 0, "cat__last": cat,
            "cat__last_ts": 1_800_000_000_123_000 if cat else None, "__batch": batch}


def changes(rows: list[tuple[str, dict[str, Any]]]) -> str:
    out = []
    for op, row in rows:
        out.append(json.dumps({"before": row if op == "d" else None, "after": row if op == "c" else None, "op": op}))
    return "\n".join(out) + "\n"


def test_read_changes_keeps_new_values_typed_like_the_offline_tiles(tmp_path: Path) -> None:
    spend = views()["spend"]
    (tmp_path / "part-a-0-0").write_text(changes([("c", tile(1, 1, 2.5, None)), ("d", tile(1, 1, 2.5, None)),
                                                  ("c", tile(1, 2, 3.75, "ü"))]))
    (tmp_path / "part-a-0-1").write_text(changes([("c", tile(2, 1, None, "a"))]).rstrip("\n"))
    table = read_changes(spend, [tmp_path / "part-a-0-0", tmp_path / "part-a-0-1"])
    assert table.schema.field("amount__sum").type == pa.float64()
    assert table.column("n_events").to_pylist() == [1, 2, 1]
    assert table.column("cat__last").to_pylist() == [None, "ü", "a"]
    assert table.column("amount__sum").to_pylist() == [2.5, 3.75, None]


def test_last_value_changes_get_their_event_time_back(tmp_path: Path) -> None:
    last = views()["last_tx"]
    row = {"user_id": 7, "event_ts": 1_800_000_000_123_000, "amount": 1.5, "qty": None, "cat": "x"}
    (tmp_path / "part-b-0-0").write_text(changes([("c", row)]))
    table = read_changes(last, [tmp_path / "part-b-0-0"])
    assert table.column("event_ts").to_pylist() == [datetime.fromtimestamp(1_800_000_000.123, UTC)]
    assert table.column("qty").to_pylist() == [None]


def test_poll_loads_deletes_and_counts_the_logs(tmp_path: Path) -> None:
    spec = views()
    paths = StreamPaths.at(tmp_path)
    tiles_dir, last_dir = paths.sink("tiles", "spend"), paths.sink("last", "last_tx")
    for folder in (tiles_dir, last_dir, paths.sink("late", "tx"), paths.sink("quarantine", "tx")):
        folder.mkdir(parents=True)
    (tiles_dir / "part-x-0-0").write_text(changes([("c", tile(1, 3, 1.0, "a", newest=1_800_000_000_250_000)),
                                                   ("c", tile(None, 1, None, None, batch="upto-a.jsonl"))]))
    (tiles_dir / ".part-x-0-1.inprogress.123").write_text(changes([("c", tile(1, 4, 9.0, "a"))]))  # not committed
    (last_dir / "part-y-0-0").write_text(changes([("c", {"user_id": 1, "event_ts": 5_000_000, "amount": 1.0,
                                                         "qty": 2, "cat": "a"})]))
    (paths.sink("late", "tx") / "part-z-0-0").write_text('{"ts_ms": 1000, "user_id": 1, "amount": 2.0}\n' * 3)
    (paths.sink("quarantine", "tx") / "part-q-0-0").write_text("\n".join(json.dumps(r) for r in [
        {"reason": "null_key", "view": "spend", "line": "{}"},
        {"reason": "bad_type:amount", "view": "", "line": '{"amount": "lots"}'}]) + "\n")
    (paths.sink("quarantine", "tx") / "feeder-upto-a.jsonl").write_text(
        json.dumps({"reason": "unparseable_json", "view": "", "line": "oops"}) + "\n")
    store = RecordingStore()
    loader = Loader([spec["spend"], spec["last_tx"]], ["tx"], store, paths, marking=["spend"])
    assert loader.poll() == 2
    # The marker row is bookkeeping: it is recorded, never written to the store.
    assert [t.num_rows for t in store.tiles] == [1] and [t.num_rows for t in store.last] == [1]
    assert "__batch" not in store.tiles[0].column_names and "__newest_us" not in store.tiles[0].column_names
    # Freshness is the newest event time (not the tile start), raised in the store's metadata.
    assert loader.stats.newest_event_us["spend"] == 1_800_000_000_250_000
    assert store.meta[("spend", "max_event_ts")] == "1800000000250000"
    assert [p.name for p in tiles_dir.iterdir()] == [".part-x-0-1.inprogress.123"]  # loaded ones are gone
    assert loader.stats.late == {"tx": 3}
    assert loader.stats.quarantined == {"tx": {"null_key:spend": 1, "bad_type:amount": 1, "unparseable_json": 1}}
    assert loader.markers == {"upto-a.jsonl"}
    assert loader.poll() == 0 and len(store.tiles) == 1
    again = Loader([spec["spend"]], ["tx"], RecordingStore(), paths)  # counts and markers survive a restart
    assert again.stats.late == {"tx": 3} and again.markers == {"upto-a.jsonl"}
    again.forget_markers({"upto-a.jsonl"})  # retention
    assert Loader([spec["spend"]], ["tx"], RecordingStore(), paths).markers == set()


def test_nan_and_infinity_written_as_strings_by_flink_are_read_as_values(tmp_path: Path) -> None:
    """Flink's JSON writer spells NaN as "NaN"; a string column holding the text "NaN" stays a string."""
    import math

    last = views()["last_tx"]
    rows = [{"user_id": 7, "event_ts": 1, "amount": "NaN", "qty": 1, "cat": "NaN"},
            {"user_id": 8, "event_ts": 2, "amount": "-Infinity", "qty": 2, "cat": "x"}]
    (tmp_path / "part-n-0-0").write_text("".join(json.dumps({"before": None, "after": r, "op": "c"}) + "\n"
                                                 for r in rows))
    table = read_changes(last, [tmp_path / "part-n-0-0"])
    amounts = table.column("amount").to_pylist()
    assert math.isnan(amounts[0]) and amounts[1] == -math.inf
    assert table.column("cat").to_pylist() == ["NaN", "x"]


def test_flinks_compact_shape_reads_like_the_general_reader(tmp_path: Path) -> None:
    """Flink writes `{"before":null,"after":{…},"op":"c"}` without spaces: the loader parses only those
    rows' objects (the fast path); any other shape goes through the general reader. Both agree."""
    import math

    spend, last = views()["spend"], views()["last_tx"]
    tricky = 'x","op":"c"}'  # a string value that looks like the envelope's end
    tile_rows = [("c", tile(1, 1, 2.5, None)), ("d", tile(1, 1, 2.5, tricky)), ("c", tile(1, 2, 3.75, tricky)),
                 ("c", tile(2, 1, None, "ü")), ("c", tile(None, 1, None, None, batch="upto-a.jsonl"))]
    last_rows = [("c", {"user_id": 7, "event_ts": 1, "amount": "NaN", "qty": 1, "cat": "NaN"}),
                 ("d", {"user_id": 7, "event_ts": 1, "amount": 1.0, "qty": 1, "cat": "a"}),
                 ("c", {"user_id": 8, "event_ts": 2, "amount": "-Infinity", "qty": None, "cat": "\n"})]

    def write(name: str, rows: list[tuple[str, dict[str, Any]]], compact: bool) -> Path:
        seps = (",", ":") if compact else (", ", ": ")
        path = tmp_path / name
        path.write_text("".join(json.dumps({"before": r if op == "d" else None, "after": r if op == "c" else None,
                                            "op": op}, separators=seps) + "\n" for op, r in rows))
        return path

    fast = read_changes(spend, [write("part-f-0-0", tile_rows, True)], marks=True)
    general = read_changes(spend, [write("part-g-0-0", tile_rows, False)], marks=True)
    assert fast.equals(general)
    assert fast.column("cat__last").to_pylist() == [None, tricky, "ü", None]
    assert fast.column("__batch").to_pylist() == [None, None, None, "upto-a.jsonl"]
    fast = read_changes(last, [write("part-f-0-1", last_rows, True)])
    general = read_changes(last, [write("part-g-0-1", last_rows, False)])
    assert fast.schema == general.schema and repr(fast.to_pylist()) == repr(general.to_pylist())  # NaN != NaN
    amounts = fast.column("amount").to_pylist()
    assert math.isnan(amounts[0]) and amounts[1] == -math.inf and fast.column("cat").to_pylist() == ["NaN", "\n"]
    only_old = write("part-f-0-2", [("d", tile(1, 1, 2.5, None))], True)
    assert read_changes(spend, [only_old]).num_rows == 0
