"""Bad definitions are refused at load time with a message naming the definition, its file and its line.

Every case writes a real catalog file and real Parquet sources into tmp_path and loads them the way
`quiver apply` does; the line marked `# <-` is where the offending definition is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from quiver import CatalogError, load_catalog
from quiver.catalog.errors import DefinitionProblem
from tests.unit.catalogs.builders import (
    PREAMBLE,
    TX_SCHEMA,
    line_of,
    transactions,
    write_catalog,
    write_parquet,
)

KIND_TEXT = {"entity": "entity", "source": "source", "feature_view": "feature view",
             "feature_service": "feature service"}


@dataclass(frozen=True)
class Case:
    id: str
    body: str  # appended to PREAMBLE; the bad definition's first line carries `# <-`
    kind: str
    name: str
    fragment: str  # must appear in the problem's message
    files: dict[str, pa.Table | bytes] = field(default_factory=dict)  # extra data files under tmp_path


def _view(extra: str, name: str = "v", entities: str = "[user]", source: str = "tx") -> str:
    return f'v = FeatureView("{name}", {entities}, {source}, {extra})  # <-\n'


def _agg(*aggs: str, extra: str = "") -> str:
    return _view(f"aggregations=[{', '.join(aggs)}]{extra}")


WEIRD = pa.schema([("user_id", pa.int64()), ("amount; DROP TABLE x", pa.float64()), ("event_ts", pa.timestamp("us"))])
TX_NO_CATEGORY = pa.schema([f for f in TX_SCHEMA if f.name != "category"])
TX_AMOUNT_STRING = pa.schema([f if f.name != "amount" else pa.field("amount", pa.string()) for f in TX_SCHEMA])


def _amount_as_string() -> pa.Table:
    table = transactions()
    return table.set_column(table.schema.get_field_index("amount"), "amount",
                            pa.array([str(v) for v in table["amount"].to_pylist()]))


CASES = [
    # --- columns checked against the source's real Parquet schema ---
    Case("unknown_field_column", _view('schema=[Field("nope", Float64)], ttl="1d"'),
         "feature_view", "v", "reads column 'nope', which the source does not have"),
    Case("unknown_agg_column", _agg('Aggregation("nope", "sum", "1h")'),
         "feature_view", "v", "reads column 'nope', which the source does not have"),
    Case("field_dtype_differs_from_parquet", _view('schema=[Field("amount", Int64)], ttl="1d"'),
         "feature_view", "v", "declared int64 but column 'amount' is float64"),
    Case("field_string_declared_float", _view('schema=[Field("category", Float64)], ttl="1d"'),
         "feature_view", "v", "declared float64 but column 'category' is string"),
    Case("field_unknown_dtype", _view('schema=[Field("amount", "float")], ttl="1d"'),
         "feature_view", "v", "unknown dtype 'float'"),
    Case("field_on_unsupported_parquet_type", _view('schema=[Field("tags", String)], ttl="1d"'),
         "feature_view", "v", "whose Parquet type Quiver does not support"),
    Case("agg_on_unsupported_parquet_type", _agg('Aggregation("tags", "count", "1h")'),
         "feature_view", "v", "whose Parquet type Quiver does not support"),
    # --- windows and tiles ---
    Case("window_not_multiple_of_tile", _agg('Aggregation("amount", "sum", "1h")', extra=', tile="40m"'),
         "feature_view", "v", "window 1h is not a whole multiple of the tile 40m"),
    Case("tile_not_dividing_a_day", _agg('Aggregation("amount", "sum", "7h")', extra=', tile="7m"'),
         "feature_view", "v", "tile 7m ('7m') must divide one day"),
    Case("tile_garbage", _agg('Aggregation("amount", "sum", "1h")', extra=', tile="often"'),
         "feature_view", "v", "tile: not a duration: 'often'"),
    Case("tile_on_last_value_view", _view('schema=[Field("amount", Float64)], ttl="1d", tile="5m"'),
         "feature_view", "v", "tile is only meaningful for aggregations"),
    Case("window_garbage", _agg('Aggregation("amount", "sum", "forever")'),
         "feature_view", "v", "window of amount/sum: not a duration: 'forever'"),
    Case("window_negative", _agg('Aggregation("amount", "sum", timedelta(hours=-1))'),
         "feature_view", "v", "window of amount/sum must be positive"),
    Case("window_zero", _agg('Aggregation("amount", "sum", "0h")'),
         "feature_view", "v", "window of amount/sum must be positive"),
    Case("window_none_in_a_view_a_service_uses", _agg('Aggregation("amount", "sum", None)')
         + 's = FeatureService("svc", [v])\n',
         "feature_view", "v", "window of amount/sum: not a duration: None"),
    # --- ttl ---
    Case("ttl_zero", _view('schema=[Field("amount", Float64)], ttl=0'),
         "feature_view", "v", "ttl must be positive, got 0"),
    Case("ttl_negative_timedelta", _view('schema=[Field("amount", Float64)], ttl=timedelta(days=-1)'),
         "feature_view", "v", "ttl must be positive"),
    Case("ttl_negative_string", _view('schema=[Field("amount", Float64)], ttl="-1d"'),
         "feature_view", "v", "ttl: not a duration: '-1d'"),
    Case("ttl_garbage", _view('schema=[Field("amount", Float64)], ttl="soon"'),
         "feature_view", "v", "ttl: not a duration: 'soon'"),
    Case("ttl_infinite", _view('schema=[Field("amount", Float64)], ttl=float("inf")'),
         "feature_view", "v", "ttl: not a duration: inf"),
    Case("ttl_shorter_than_longest_window", _agg('Aggregation("amount", "sum", "7d")', extra=', ttl="1d"'),
         "feature_view", "v", "ttl 1d is shorter than the longest window 7d"),
    # --- names: duplicates and clashes ---
    Case("duplicate_view_names", _view('schema=[Field("amount", Float64)], ttl="1d"', name="good"),
         "feature_view", "good", "name clashes with feature view 'good' defined at"),
    Case("view_named_like_entity", _view('schema=[Field("amount", Float64)], ttl="1d"', name="user"),
         "feature_view", "user", "name clashes with entity 'user' defined at"),
    Case("names_clash_ignoring_case", _view('schema=[Field("amount", Float64)], ttl="1d"', name="Good"),
         "feature_view", "Good", "name clashes with feature view 'good'"),
    Case("duplicate_feature_in_view", _agg('Aggregation("amount", "sum", "1h")', 'Aggregation("amount", "sum", "1h")'),
         "feature_view", "v", "feature 'amount_sum_1h' is defined twice"),
    Case("features_differ_only_in_case",
         _view('schema=[Field("amount", Float64), Field("AMOUNT", Float64, column="amount")], ttl="1d"'),
         "feature_view", "v", "is defined twice (names are case-insensitive)"),
    Case("feature_named_like_join_key", _view('schema=[Field("user_id", Int64)], ttl="1d"'),
         "feature_view", "v", "feature name 'user_id' clashes with a join key"),
    Case("feature_named_like_reserved_column", _view('schema=[Field("event_ts", Timestamp)], ttl="1d"'),
         "feature_view", "v", "feature name 'event_ts' clashes with a join key or a reserved column"),
    # --- entities and join keys ---
    Case("entity_key_type_clash", 'customer = Entity("customer", {"user_id": String})  # <-\n',
         "entity", "customer", "join key 'user_id' is string here but int64 in entity 'user'"),
    Case("join_key_missing_in_source",
         'shop = Entity("shop", ["shop_id"])\n' + _view('schema=[Field("amount", Float64)], ttl="1d"', entities="[shop]"),
         "feature_view", "v", "join key 'shop_id' is not a column of source 'tx'"),
    Case("join_key_type_differs_from_source",
         'cat = Entity("cat", {"category": Int64})\n' + _view('schema=[Field("amount", Float64)], ttl="1d"', entities="[cat]"),
         "feature_view", "v", "join key 'category' is int64 in its entity but string in source 'tx'"),
    Case("entity_float_key", 'e = Entity("e", {"amount": Float64})  # <-\n',
         "entity", "e", "keys must be int64, string or bool"),
    Case("entity_without_keys", 'e = Entity("e", [])  # <-\n', "entity", "e", "needs at least one join key"),
    Case("entity_keys_garbage", 'e = Entity("e", 5)  # <-\n', "entity", "e", "join_keys must be a list"),
    # --- unsafe identifiers, everywhere a name enters SQL ---
    Case("unsafe_entity_name", 'e = Entity("user; DROP TABLE x", ["user_id"])  # <-\n',
         "entity", "user; DROP TABLE x", "name must be a plain identifier"),
    Case("unsafe_join_key_quote", 'e = Entity("e", [\'user"id\'])  # <-\n',
         "entity", "e", "join key 'user\"id' is not a plain identifier"),
    Case("unsafe_join_key_trailing_newline", 'e = Entity("e", ["user_id\\n"])  # <-\n',
         "entity", "e", "join key 'user_id\\n' is not a plain identifier"),
    Case("unsafe_source_name", 's = Source("tx-2", "data/tx")  # <-\n', "source", "tx-2", "plain identifier"),
    Case("unsafe_timestamp_field", 's = Source("s", "data/tx", timestamp_field="event ts")  # <-\n',
         "source", "s", "timestamp_field 'event ts' is not a plain identifier"),
    Case("unsafe_source_column", 's = Source("weird", "data/weird")  # <-\n',
         "source", "weird", "column 'amount; DROP TABLE x' is not a plain identifier",
         files={"data/weird/p.parquet": pa.table({"user_id": [1], "amount; DROP TABLE x": [1.0],
                                                  "event_ts": pa.array([0], pa.timestamp("us"))}, schema=WEIRD)}),
    Case("unsafe_field_name_unicode", _view('schema=[Field("montánt", Float64, column="amount")], ttl="1d"'),
         "feature_view", "v", "field 'montánt' (column 'amount') is not a plain identifier"),
    Case("unsafe_field_column_quote", _view('schema=[Field("amt", Float64, column="amount\'--")], ttl="1d"'),
         "feature_view", "v", "is not a plain identifier"),
    Case("unsafe_agg_column", _agg('Aggregation("amount; DROP TABLE x", "sum", "1h")'),
         "feature_view", "v", "aggregation column 'amount; DROP TABLE x' is not a plain identifier"),
    Case("unsafe_agg_name_too_long", _agg('Aggregation("amount", "sum", "1h", name="a" * 64)'),
         "feature_view", "v", f"feature name {'a' * 64!r} is not a plain identifier"),
    Case("unsafe_agg_name_space", _agg('Aggregation("amount", "sum", "1h", name="amount sum")'),
         "feature_view", "v", "feature name 'amount sum' is not a plain identifier"),
    Case("unsafe_view_name_space", _view('schema=[Field("amount", Float64)], ttl="1d"', name="my view"),
         "feature_view", "my view", "name must be a plain identifier"),
    Case("unsafe_view_name_too_long", _view('schema=[Field("amount", Float64)], ttl="1d"', name="v" * 64),
         "feature_view", "v" * 64, "at most 63 characters"),
    Case("unsafe_service_name_newline", 's = FeatureService("svc\\n", ["good:amount"])  # <-\n',
         "feature_service", "svc\n", "name must be a plain identifier"),
    # --- aggregation functions ---
    Case("unknown_agg_fn", _agg('Aggregation("amount", "median", "1h")'),
         "feature_view", "v", "aggregation fn 'median' is unknown"),
    Case("numeric_fn_on_string_column", _agg('Aggregation("category", "sum", "1h")'),
         "feature_view", "v", "sum needs a numeric column, 'category' is string"),
    # --- view shape ---
    Case("view_without_features", _view('ttl="1d"'), "feature_view", "v", "defines no features"),
    Case("view_mixes_fields_and_aggregations",
         _view('schema=[Field("amount", Float64)], aggregations=[Aggregation("amount", "sum", "1h")]'),
         "feature_view", "v", "mixes last-value fields and aggregations"),
    # --- stream bindings ---
    Case("stream_without_path_or_topic", 's = Source("s", "data/tx", stream=StreamBinding())  # <-\n',
         "source", "s", "stream binding needs a local path or a kafka_topic"),
    Case("stream_unknown_format", 's = Source("s", "data/tx", stream=StreamBinding(path="in", format="avro"))  # <-\n',
         "source", "s", "stream format 'avro': the stream reads JSON records only"),
    Case("stream_watermark_garbage",
         's = Source("s", "data/tx", stream=StreamBinding(path="in", watermark_delay="soon"))  # <-\n',
         "source", "s", "watermark_delay: not a duration"),
    # --- feature services ---
    Case("service_unknown_view", 's = FeatureService("svc", ["nope:x"])  # <-\n',
         "feature_service", "svc", "feature 'nope:x' names unknown view 'nope'"),
    Case("service_unknown_feature", 's = FeatureService("svc", ["good:nope"])  # <-\n',
         "feature_service", "svc", "view 'good' has no feature 'nope'"),
    Case("service_reference_without_view", 's = FeatureService("svc", ["amount"])  # <-\n',
         "feature_service", "svc", "must be 'view:feature' or a FeatureView"),
    Case("service_lists_feature_twice", 's = FeatureService("svc", ["good:amount", good])  # <-\n',
         "feature_service", "svc", "feature 'good:amount' is listed twice"),
    Case("service_reference_not_a_string", 's = FeatureService("svc", [5])  # <-\n',
         "feature_service", "svc", "feature 5 must be 'view:feature' or a FeatureView"),
    Case("service_without_features", 's = FeatureService("svc", [])  # <-\n',
         "feature_service", "svc", "lists no features"),
    # --- source files ---
    Case("source_path_matches_no_files", 's = Source("s", "data/missing/*.parquet")  # <-\n',
         "source", "s", "no Parquet files match 'data/missing/*.parquet'"),
    Case("source_path_empty", 's = Source("s", "")  # <-\n', "source", "s", "path must name Parquet files"),
    Case("source_file_not_parquet", 's = Source("s", "data/corrupt")  # <-\n',
         "source", "s", "cannot read Parquet file", files={"data/corrupt/p.parquet": b"this is not parquet\n"}),
    Case("source_schema_drift_type", 's = Source("s", "data/drift")  # <-\n',
         "source", "s", "schema drift in", files={"data/drift/a.parquet": transactions(),
                                                 "data/drift/b.parquet": _amount_as_string()}),
    Case("source_schema_drift_missing_column", 's = Source("s", "data/drift")  # <-\n',
         "source", "s", "lacks column 'category'",
         files={"data/drift/a.parquet": transactions(), "data/drift/b.parquet": transactions(schema=TX_NO_CATEGORY)}),
    Case("source_schema_drift_added_column", 's = Source("s", "data/drift")  # <-\n',
         "source", "s", "lacks column 'category'",
         files={"data/drift/a.parquet": transactions(schema=TX_NO_CATEGORY), "data/drift/b.parquet": transactions()}),
    Case("timestamp_field_missing", 's = Source("s", "data/tx", timestamp_field="ts")  # <-\n',
         "source", "s", "timestamp_field 'ts' is not a column of 'data/tx'"),
    Case("timestamp_field_not_a_timestamp", 's = Source("s", "data/tx", timestamp_field="amount")  # <-\n',
         "source", "s", "timestamp_field 'amount' has type float64, expected a timestamp"),
]


def _load_problems(tmp_path: Path, case: Case) -> tuple[Path, list[DefinitionProblem]]:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    for relative, content in case.files.items():
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            write_parquet(target, content)
    paths = write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE + case.body})
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path / "defs", root=tmp_path)
    return paths["defs.py"], info.value.problems


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_definition_is_reported_with_kind_name_file_and_line(tmp_path: Path, case: Case) -> None:
    path, problems = _load_problems(tmp_path, case)
    line = line_of(path)
    # Only the offending definition is blamed: no cascade of follow-up errors elsewhere.
    assert {(p.kind, p.name) for p in problems} == {(case.kind, case.name)}, [str(p) for p in problems]
    matching = [p for p in problems if case.fragment in p.message]
    assert matching, f"{case.fragment!r} not in {[p.message for p in problems]}"
    problem = matching[0]
    assert problem.location.file == str(path)
    assert problem.location.line == line
    text = str(problem)
    assert f"defs.py:{line}: " in text
    assert f"{KIND_TEXT[case.kind]} {case.name!r}" in text


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    paths = write_catalog(tmp_path / "defs", {
        "base.py": 'from quiver import Entity, Source\n'
                   'user = Entity("user", ["user_id"])\n'
                   'tx = Source("tx", "data/tx")\n'
                   'nowhere = Source("nowhere", "data/none")  # <-\n',
        "views.py": 'from base import tx, user\n'
                    'from quiver import Aggregation, FeatureView, Field, Float64, Int64\n'
                    'a = FeatureView("a", [user], tx, schema=[Field("amount", Int64)], ttl="1d")  # <-\n'
                    'b = FeatureView("b", [user], tx, aggregations=[Aggregation("amount", "median", "1h")])\n'
                    'c = FeatureView("c", [user], tx, schema=[Field("amount", Float64)], ttl="soon")\n',
        "services.py": 'from quiver import FeatureService\n'
                       'svc = FeatureService("svc", ["a:amount", "zzz:x"])  # <-\n',
    })
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path / "defs", root=tmp_path)
    found = {(p.kind, p.name, Path(p.location.file).name, p.location.line) for p in info.value.problems}
    views = line_of(paths["views.py"])
    assert found == {
        ("source", "nowhere", "base.py", 4),
        ("feature_view", "a", "views.py", views),
        ("feature_view", "b", "views.py", views + 1),
        ("feature_view", "c", "views.py", views + 2),
        ("feature_service", "svc", "services.py", 2),
    }
    message = str(info.value)
    assert message.startswith("invalid catalog (5 problems):")
    assert len(message.splitlines()) == 6  # the header and one line per problem


def test_example_catalog_validates_against_demo_data(tmp_path: Path) -> None:
    from quiver.pipelines.demo_data import generate

    generate(tmp_path / "data", days=2, users=50, merchants=10, transactions_per_day=500, seed=3)
    repo = Path(__file__).resolve().parents[2]
    catalog = load_catalog(repo / "feature_defs", root=tmp_path)

    assert sorted(catalog.entities) == ["merchant", "user"]
    assert sorted(catalog.sources) == ["merchant_risk", "transactions", "user_profiles"]
    assert sorted(catalog.views) == ["merchant_profile", "merchant_traffic", "user_last_transaction",
                                     "user_profile", "user_spend"]
    spend = catalog.view("user_spend")
    assert spend.kind == "agg" and spend.keys == (("user_id", "int64"),)
    assert spend.tile_us == 5 * 60 * 1_000_000  # the default tile for a smallest window of 1 h
    assert spend.max_window_us == 7 * 86_400 * 1_000_000
    assert spend.feature_dtype("amount_count_1h") == "int64"
    assert spend.feature_dtype("online_share_24h") == "float64"
    assert [a.input_dtype for a in spend.aggregations if a.column == "is_online"] == ["bool"]
    last = catalog.view("user_last_transaction")
    assert last.kind == "last" and last.ttl_us == 7 * 86_400 * 1_000_000
    assert [(f.name, f.column, f.dtype) for f in last.fields] == [("last_amount", "amount", "float64"),
        ("last_merchant_id", "merchant_id", "int64"), ("last_category", "category", "string")]
    assert dict(catalog.sources["transactions"].columns)["event_ts"] == "timestamp"
    assert sorted(catalog.request_sources) == ["transaction"] and sorted(catalog.on_demand) == ["transaction_context"]
    context = catalog.on_demand["transaction_context"]
    assert context.inputs == (("user_spend", "amount_mean_7d"),) and context.feature_dtype("tx_amount") == "float64"
    assert dict(context.request_fields) == {"amount": "float64", "is_online": "bool"}
    service = catalog.services["fraud_model"]
    assert len(service.features) == sum(len(v.feature_names) for v in catalog.views.values()) + len(context.feature_names)
    # Locations point at the user's files, never at quiver's or at dataclass-generated code.
    assert Path(spend.location.file) == repo / "feature_defs" / "user_features.py"
    assert spend.location.line == line_of(repo / "feature_defs" / "user_features.py", "user_spend = FeatureView(")


def test_default_tile_always_divides_a_day_and_every_window(tmp_path: Path) -> None:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE + _agg('Aggregation("amount", "sum", "7m")',
                                                                  'Aggregation("amount", "sum", "1d")')})
    view = load_catalog(tmp_path / "defs", root=tmp_path).view("v")
    assert view.tile_us == 60 * 1_000_000  # gcd(7 min, 1 day): a coarser tile would not align to days
    assert all(a.window_us % view.tile_us == 0 for a in view.aggregations)


def test_explicit_tile_and_timedelta_windows_are_kept(tmp_path: Path) -> None:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    body = _agg('Aggregation("amount", "sum", timedelta(hours=2))', 'Aggregation("amount", "max", "30m")',
                extra=', tile="10m", ttl="1d"')
    write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE + body})
    view = load_catalog(tmp_path / "defs", root=tmp_path).view("v")
    assert view.tile_us == 600 * 1_000_000
    assert view.ttl_us == 86_400 * 1_000_000
    assert [(a.name, a.window_us) for a in view.aggregations] == [
        ("amount_sum_2h", 2 * 3600 * 1_000_000), ("amount_max_30m", 1800 * 1_000_000)]


def test_hidden_and_underscored_source_files_are_not_data(tmp_path: Path) -> None:
    # Writers stage partitions in hidden folders and leave _SUCCESS markers: neither may break validation.
    write_parquet(tmp_path / "data/tx/date=2026-11-01/part-0.parquet", transactions())
    (tmp_path / "data/tx/.tmp-date=2026-11-02").mkdir()
    (tmp_path / "data/tx/.tmp-date=2026-11-02/part-0.parquet").write_bytes(b"half written")
    (tmp_path / "data/tx/_SUCCESS").write_bytes(b"")
    write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE})
    assert "good" in load_catalog(tmp_path / "defs", root=tmp_path).views


def test_source_glob_reads_every_matching_file(tmp_path: Path) -> None:
    for day in ("2026-11-01", "2026-11-02"):
        write_parquet(tmp_path / f"data/g/date={day}/part-0.parquet", transactions())
    write_parquet(tmp_path / "data/g/date=2026-11-03/part-0.parquet", _amount_as_string())
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE + 's = Source("s", "data/g/date=2026-11-0[12]/*.parquet")\n'})
    assert "s" in load_catalog(tmp_path / "defs", root=tmp_path).sources
    write_catalog(tmp_path / "defs", {"defs.py": PREAMBLE + 's = Source("s", "data/g/*/*.parquet")\n'})
    with pytest.raises(CatalogError, match="schema drift"):
        load_catalog(tmp_path / "defs", root=tmp_path)


def test_timedelta_windows_name_features_by_their_shortest_label() -> None:
    from quiver import Aggregation

    assert Aggregation("amount", "sum", timedelta(minutes=90)).feature_name == "amount_sum_90m"
    assert Aggregation("amount", "sum", timedelta(days=7)).feature_name == "amount_sum_7d"
    assert Aggregation("amount", "sum", "24h").feature_name == "amount_sum_24h"
    assert Aggregation("amount", "sum", "1 H".lower()).feature_name == "amount_sum_1h"
    assert Aggregation("amount", "sum", "1h", name="spend").feature_name == "spend"


def test_each_problem_prints_as_one_line() -> None:
    from quiver.catalog.definitions import Location

    problem = DefinitionProblem("source", "s", Location("/p/defs.py", 3), "cannot read:\nline two")
    assert str(problem) == "/p/defs.py:3: source 's': cannot read: line two"
    assert str(CatalogError([problem, problem])).splitlines()[1:] == [f"  {problem}"] * 2
