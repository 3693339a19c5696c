"""The DSL's plain objects and the shared rules for types, durations and identifiers."""

from __future__ import annotations

import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.types import duration_label, is_identifier, parse_duration, to_micros


def test_definitions_record_the_users_file_and_line() -> None:
    user = Entity("user", ["user_id"]); here = sys._getframe().f_lineno  # noqa: E702
    assert user.location.file == __file__
    assert user.location.line == here
    view = FeatureView(
        "v", [user], Source("tx", "data/tx"), schema=[Field("amount", Float64)], ttl="1d",
    ); start = sys._getframe().f_lineno - 2  # noqa: E702
    assert view.location.file == __file__
    assert view.location.line == start  # the line where the call starts, not dataclass code ("<string>")


def test_location_of_code_run_from_a_string_is_that_string(tmp_path: Path) -> None:
    # `python -c` code has the file name "<string>" like dataclass-generated code; it is still the user's.
    out = subprocess.run([sys.executable, "-c", "from quiver import Entity\nprint(Entity('x', ['a']).location)"],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "<string>:2"


def test_location_prints_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.catalog.definitions import Location

    monkeypatch.chdir(tmp_path)
    assert str(Location(str(tmp_path / "defs" / "a.py"), 3)) == "defs/a.py:3"
    assert str(Location("/elsewhere/a.py", 3)) == "/elsewhere/a.py:3"


def test_location_is_not_part_of_equality() -> None:
    a = Entity("user", ["user_id"])
    b = Entity("user", ["user_id"])
    assert a.location != b.location and a == b


def test_entity_keys_forms() -> None:
    assert Entity("u", ["user_id"]).keys == {"user_id": "int64"}
    assert Entity("u", ["a", "b"], dtype=String).keys == {"a": "string", "b": "string"}
    assert Entity("u", {"a": Int64, "b": String}).keys == {"a": "int64", "b": "string"}
    assert Entity("u", "user_id").keys == {"user_id": "int64"}  # a lone string is one key, not characters


def test_view_normalizes_sequences_and_lists_features() -> None:
    user = Entity("user", ["user_id"])
    merchant = Entity("merchant", ["merchant_id"])
    view = FeatureView("v", [user, merchant], Source("tx", "data/tx"),
                       aggregations=[Aggregation("amount", "sum", "1h"), Aggregation("amount", "count", "7d")])
    assert isinstance(view.entities, tuple) and isinstance(view.aggregations, tuple)
    assert view.feature_names == ["amount_sum_1h", "amount_count_7d"]
    assert view.join_keys == {"user_id": "int64", "merchant_id": "int64"}


def test_service_references_expand_views() -> None:
    user = Entity("user", ["user_id"])
    view = FeatureView("v", [user], Source("tx", "data/tx"),
                       schema=[Field("amount", Float64), Field("cat", String, column="category")], ttl="1d")
    service = FeatureService("svc", [view, "other:x"])
    assert service.references == ["v:amount", "v:cat", "other:x"]
    assert Field("cat", String, column="category").source_column == "category"
    assert Field("amount", Float64).source_column == "amount"


def test_definitions_are_frozen_and_picklable() -> None:
    user = Entity("user", ["user_id"])
    with pytest.raises(AttributeError):
        user.name = "other"  # type: ignore[misc]
    clone = pickle.loads(pickle.dumps(user))
    assert clone == user and clone.location == user.location


@pytest.mark.parametrize(("text", "expected"), [
    ("5m", timedelta(minutes=5)), ("5min", timedelta(minutes=5)), ("1h", timedelta(hours=1)),
    ("7d", timedelta(days=7)), ("2w", timedelta(weeks=2)), ("250ms", timedelta(milliseconds=250)),
    (" 30 s ", timedelta(seconds=30)), (90, timedelta(seconds=90)), (1.5, timedelta(seconds=1.5)),
    (timedelta(hours=-1), timedelta(hours=-1)),  # a timedelta passes through; the validator rejects negatives
])
def test_parse_duration_accepts(text: object, expected: timedelta) -> None:
    parsed = parse_duration(text)  # type: ignore[arg-type]
    assert parsed == expected


@pytest.mark.parametrize("bad", ["", "soon", "-1h", "1H", "1.5h", "1h30m", "h", True, None, [1], float("nan"),
                                 float("inf"), 10**20, "9" * 30 + "d"])
def test_parse_duration_refuses(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "label"), [
    (timedelta(hours=1), "1h"), (timedelta(minutes=90), "90m"), (timedelta(days=7), "7d"),
    (timedelta(seconds=45), "45s"), (timedelta(milliseconds=500), "500ms"), (timedelta(microseconds=7), "7us"),
    (timedelta(days=1, seconds=1), "86401s"),
])
def test_duration_label_is_exact(value: timedelta, label: str) -> None:
    got = duration_label(value)
    assert got == label


def test_to_micros() -> None:
    one_day_and_a_bit = to_micros(timedelta(days=1, seconds=1, microseconds=5))
    minus_one_hour = to_micros(timedelta(hours=-1))
    assert (one_day_and_a_bit, minus_one_hour) == (86_401_000_005, -3_600_000_000)


@pytest.mark.parametrize("name", ["a", "_x", "user_id", "A1", "x" * 63])
def test_identifiers_accepted(name: str) -> None:
    assert is_identifier(name)


@pytest.mark.parametrize("name", ["", "1a", "a b", "a-b", "a;b", "amount; DROP TABLE x", 'a"b', "a'b", "a`b",
                                  "é", "naïve", "x" * 64, "a\n", "a\x00", None, 5, ["a"]])
def test_identifiers_refused(name: object) -> None:
    assert not is_identifier(name)
