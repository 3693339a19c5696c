"""Label and feature validation: every mistake is a QuiverError that names what is wrong and what would do."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from quiver import QuiverError
from quiver.offline.pit import get_historical_features
from tests.unit.test_pit_reference import BASE, World, make_world, reference_features


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("labels"), seed=5, n_events=120, n_labels=30)


def _labels(**columns: object) -> pd.DataFrame:
    base: dict[str, object] = {"user_id": [1, 2], "merchant_code": ["m-a", "m-b"],
                               "event_ts": pd.to_datetime([BASE, BASE + 1], unit="us", utc=True)}
    base.update(columns)
    return pd.DataFrame({k: v for k, v in base.items() if v is not None})


def _run(world: World, labels: object, features: object = ("pair_spend:amount_sum_20m",), **kw: object) -> pd.DataFrame:
    return get_historical_features(labels, list(features) if not isinstance(features, str) else features,  # type: ignore[arg-type]
                                   catalog=world.catalog, config=world.config, **kw)  # type: ignore[arg-type]


def test_missing_join_keys_and_timestamp_name_columns_and_views(world: World) -> None:
    with pytest.raises(QuiverError) as err:
        _run(world, _labels(merchant_code=None, event_ts=None, ts=[1, 2]),
             ["pair_spend:amount_sum_20m", "merchant_stats:amount_max_1h", "user_profile:score"])
    message = str(err.value)
    assert "'merchant_code' (needed by pair_spend, merchant_stats)" in message
    assert "timestamp column 'event_ts'" in message and "timestamp_column" in message
    assert "label columns: user_id, ts" in message
    assert "'user_id'" not in message.split("label columns")[0]


def test_other_timestamp_column_name(world: World) -> None:
    labels = _labels().rename(columns={"event_ts": "scored_at"})
    got = _run(world, labels, timestamp_column="scored_at")
    assert len(got) == 2 and "amount_sum_20m" in got


def test_wrong_key_dtypes(world: World) -> None:
    with pytest.raises(QuiverError, match=r"'user_id' must hold int64 join keys for pair_spend, got float64.*Int64"):
        _run(world, _labels(user_id=[1.0, None]))
    with pytest.raises(QuiverError, match="'merchant_code' must hold string join keys"):
        _run(world, _labels(merchant_code=[1, 2]))
    with pytest.raises(QuiverError, match="'merchant_code' must hold string join keys"):
        _run(world, _labels(merchant_code=["m-a", 3]))


def _busy(world: World) -> tuple[list[int], list[str], list[int]]:
    """Two (user, merchant) pairs and, for each, a time 1 µs after one of its events with an amount: their
    20-minute sums are not 0, so label variants that read the wrong keys or times give other numbers."""
    tx = world.events["tx"].dropna(subset=["user_id", "merchant_code", "ts", "amount"])
    tx = tx[tx["amount"] != 0].drop_duplicates(["user_id", "merchant_code"]).head(2)
    return ([int(u) for u in tx["user_id"]], list(tx["merchant_code"]), [int(t) + 1 for t in tx["ts"]])


def _expected_sums(world: World, users: list[int], merchants: list[str], times: list[int]) -> list[float]:
    labels = pd.DataFrame({"user_id": pd.array(users, dtype="Int64"), "merchant_code": merchants,
                           "event_ts": pd.to_datetime(times, unit="us", utc=True)})
    sums = reference_features(replace(world, labels=labels), ["pair_spend:amount_sum_20m"])["amount_sum_20m"]
    assert all(v != 0 for v in sums), "the chosen labels must see events"
    return [float(v) for v in sums]


def test_nullable_and_narrow_integer_keys_are_fine(world: World) -> None:
    users, merchants, times = _busy(world)
    at = pd.to_datetime(times, unit="us", utc=True)
    expected = _expected_sums(world, users, merchants, times)
    got = _run(world, _labels(user_id=pd.array([users[0], None], dtype="Int64"), merchant_code=merchants,
                              event_ts=at))
    assert got["amount_sum_20m"].tolist() == pytest.approx([expected[0], 0.0])
    narrow = _run(world, _labels(user_id=pd.array(users, dtype="int32"), merchant_code=merchants, event_ts=at))
    wide = _run(world, _labels(user_id=users, merchant_code=merchants, event_ts=at))
    assert wide["amount_sum_20m"].tolist() == pytest.approx(expected)
    assert narrow["amount_sum_20m"].tolist() == wide["amount_sum_20m"].tolist()


def test_naive_timestamps_need_assume_utc(world: World) -> None:
    users, merchants, times = _busy(world)
    naive = _labels(user_id=users, merchant_code=merchants, event_ts=pd.to_datetime(times, unit="us"))
    with pytest.raises(QuiverError, match=r"timezone-naive.*assume_utc=True"):
        _run(world, naive)
    as_utc = _run(world, naive, assume_utc=True)
    assert as_utc["amount_sum_20m"].tolist() == pytest.approx(_expected_sums(world, users, merchants, times))


def test_other_time_zones_are_converted(world: World) -> None:
    users, merchants, times = _busy(world)
    berlin = pd.to_datetime(times, unit="us", utc=True).tz_convert("Europe/Berlin")
    got = _run(world, _labels(user_id=users, merchant_code=merchants, event_ts=berlin))
    assert got["amount_sum_20m"].tolist() == pytest.approx(_expected_sums(world, users, merchants, times))
    # A naive wall-clock time read as UTC is another instant (1 h off): the conversion is what makes it equal.
    shifted = _run(world, _labels(user_id=users, merchant_code=merchants,
                                  event_ts=berlin.tz_localize(None)), assume_utc=True)
    assert shifted["amount_sum_20m"].tolist() != got["amount_sum_20m"].tolist()


def test_timestamps_must_be_timestamps_and_not_null(world: World) -> None:
    with pytest.raises(QuiverError, match="'event_ts' must hold timestamps"):
        _run(world, _labels(event_ts=["2026-11-01", "2026-11-02"]))
    with pytest.raises(QuiverError, match=r"1 null timestamp\(s\) \(rows 1\)"):
        _run(world, _labels(event_ts=pd.to_datetime([BASE, None], unit="us", utc=True)))


def test_unknown_views_features_and_services_list_the_valid_ones(world: World) -> None:
    with pytest.raises(QuiverError, match="unknown feature view 'nope'; views: merchant_stats, pair_spend"):
        _run(world, _labels(), ["nope:x"])
    with pytest.raises(QuiverError, match="view 'user_profile' has no feature 'age'; its features: score, level"):
        _run(world, _labels(), ["user_profile:age"])
    with pytest.raises(QuiverError, match="unknown feature service 'nope'"):
        _run(world, _labels(), "nope")
    with pytest.raises(QuiverError, match="must be written 'view:feature'"):
        _run(world, _labels(), ["user_profile"])
    with pytest.raises(QuiverError, match="no features requested"):
        _run(world, _labels(), [])


def test_bad_inputs(world: World, tmp_path: Path) -> None:
    with pytest.raises(QuiverError, match="does not exist"):
        _run(world, tmp_path / "missing.parquet")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(QuiverError, match="cannot read labels"):
        _run(world, tmp_path / "bad.parquet")
    with pytest.raises(QuiverError, match="pandas DataFrame, a pyarrow Table or a Parquet path"):
        _run(world, [1, 2, 3])
    with pytest.raises(QuiverError, match="unknown engine 'polars'"):
        _run(world, _labels(), engine="polars")
    table = pa.Table.from_pandas(_labels(), preserve_index=False)
    assert len(_run(world, table)) == 2


def test_nanosecond_label_times_floor_to_the_microsecond(world: World) -> None:
    """One rule for label and source times: floored to the µs (never rounded up, which would let an event
    later than t in). Events in t's own microsecond are left out, as events at t are."""
    events = world.events["tx"].dropna(subset=["user_id", "ts", "amount"])
    user, t = int(events["user_id"].iloc[0]), int(events["ts"].iloc[0])
    at_t = int(((events["ts"] == t) & (events["user_id"] == user)).sum())
    assert at_t >= 1
    at = pd.Timestamp(t * 1000, unit="ns", tz="UTC")
    offsets = [0, 1, 999, 1000]  # ns after the event's microsecond
    labels = pd.DataFrame({"user_id": [user] * 4, "event_ts": [at + pd.Timedelta(n, "ns") for n in offsets]})
    assert labels["event_ts"].dt.unit == "ns"
    got = _run(world, labels, ["user_spend:amount_count_30m"])["amount_count_30m"].tolist()
    assert got[1] == got[2] == got[0]  # t + 1 ns and t + 999 ns are t at µs resolution: the events are out
    assert got[3] == got[0] + at_t  # t + 1 µs: they are in


def test_feast_habits_entity_df_and_timestamp_detection(world: World) -> None:
    """Feast's `entity_df=` is accepted, and the time column is found as Feast finds it (plus `event_ts`)."""
    labels = _labels()
    by_name = _run(world, labels)
    feast_style = get_historical_features(entity_df=labels, features=["pair_spend:amount_sum_20m"],
                                          catalog=world.catalog, config=world.config)
    pd.testing.assert_frame_equal(by_name, feast_style)
    renamed = labels.rename(columns={"event_ts": "event_timestamp"})  # Feast's default name
    assert _run(world, renamed)["amount_sum_20m"].tolist() == by_name["amount_sum_20m"].tolist()
    only_one = labels.rename(columns={"event_ts": "scored_at"})  # the one datetime column
    assert _run(world, only_one)["amount_sum_20m"].tolist() == by_name["amount_sum_20m"].tolist()
    two = only_one.assign(created=only_one["scored_at"])
    with pytest.raises(QuiverError, match=r"several datetime columns \(scored_at, created\).*timestamp_column"):
        _run(world, two)
    with pytest.raises(QuiverError, match=r"labels=… or .*entity_df="):
        get_historical_features(labels, ["pair_spend:amount_sum_20m"], entity_df=labels, catalog=world.catalog,
                                config=world.config)
