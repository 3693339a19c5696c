"""The serving hot path's shortcuts give exactly what the general paths give (issue 26: speed, same answers).

Each shortcut is checked against the general code it stands in for, on data with nulls, missing entities,
TTL edges and odd shapes: the one-entity validity test of the decoder, the packed MGET keys, the result
conversions worked out once per request shape, whole-block model inputs, the network's direct-kernel
inference, the serving log's joined blocks and one-call off-path logging, and the fast JSON parser.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from quiver import Entity, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.models.network import NetworkConfig, TabularNet
from quiver.models.scoring import Preprocessor
from quiver.offline.layout import last_values_schema
from quiver.online.base import Batch, Column, ColumnBlock, FieldStatus
from quiver.online.codec import LastCodec
from quiver.online.layout import INT64_MIN, entity_keys, key_prefix
from quiver.online.redis_store import _bulk, _bulk_keys
from quiver.serving.arms import Arm, ServiceStats
from quiver.serving.edge import fast_loads, strict_loads
from quiver.serving.logs import ServingLogger, read_serving_logs
from quiver.serving.logs.tables import Batch as LogBatch
from quiver.serving.logs.tables import batches_to_table, split_by_hour
from quiver.serving.off_path import OffPath, score_off_path
from quiver.serving.result import OnlineResult

H = 3_600_000_000
T0 = 1_800_000_000_000_000 // H * H
COLUMNS = {"user_id": "int64", "shop": "string", "event_ts": "timestamp", "amount": "float64", "n": "int64",
           "label": "string"}


@pytest.fixture(scope="module")
def cat():
    user = Entity("user", ["user_id"])
    shop = Entity("shop", {"shop": String})
    src = Source("tx", "unused", timestamp_field="event_ts")
    fields = [Field("amount", Float64), Field("n", Int64), Field("label", String)] + \
        [Field(f"f{i}", Float64) for i in range(9)]
    last = FeatureView("last", [user], src, ttl="1h", schema=fields)
    plain = FeatureView("plain", [user], src, schema=[Field("amount", Float64)])  # no TTL
    by_shop = FeatureView("by_shop", [shop], src, ttl="1h", schema=[Field("amount", Float64)])
    columns = {**COLUMNS, **{f"f{i}": "float64" for i in range(9)}}
    return build_catalog([user, shop, src, last, plain, by_shop], schema_reader=lambda s: columns)


def records(view, rng, n):
    """n encoded last values with random nulls and event times around T0."""
    keys = {name: np.arange(n) if dtype == "int64" else np.array([f"s{i}" for i in range(n)], dtype=object)
            for name, dtype in view.keys}
    data = {**keys, "event_ts": pa.array(T0 + rng.integers(-2 * H, H, n), pa.timestamp("us", tz="UTC"))}
    for f in view.fields:
        kind = f.dtype
        values = rng.random(n) if kind == "float64" else rng.integers(0, 9, n) if kind == "int64" else \
            np.array([f"s{v}" for v in rng.integers(0, 9, n)], dtype=object)
        mask = rng.random(n) < 0.2
        data[f.name] = pa.array([None if m else (v.item() if hasattr(v, "item") else v)
                                 for v, m in zip(values, mask, strict=True)])
    table = pa.table(data).cast(last_values_schema(view))
    return LastCodec(view).encode(table)


@pytest.mark.parametrize("view_name", ["last", "plain", "by_shop"])
def test_one_entity_decodes_as_it_does_among_others(cat, view_name):
    # n == 1 with one request time takes the byte-level shortcut; in a batch of two the numpy rule runs.
    view = cat.views[view_name]
    codec = LastCodec(view)
    rng = np.random.default_rng(3)
    values, event_ts = records(view, rng, 300)
    features = [f.name for f in view.fields]
    ttl = view.ttl_us
    checked_edges = 0
    for value, ts in zip(values, event_ts.tolist(), strict=True):
        for at in (ts, ts + 1, ts + (ttl or H), ts + (ttl or H) + 1, T0):  # the strict < and the TTL's edges
            alone = codec.decode([value], features, np.asarray(at), ttl)
            among = codec.decode([value, None], features, np.asarray(at), ttl)
            fresh = ts < at and (ttl is None or ts >= at - ttl)
            checked_edges += fresh
            for key in alone:
                a, b = alone[key], among[key]
                assert a.valid.tolist() == b.valid[:1].tolist()
                assert a.valid.any() <= fresh  # never a value from a row that does not count as of `at`
                assert [v for v, ok in zip(a.values.tolist(), a.valid.tolist(), strict=True) if ok] == \
                    [v for v, ok in zip(b.values[:1].tolist(), b.valid[:1].tolist(), strict=True) if ok]
    assert checked_edges > 100
    missing = codec.decode([None], features, np.asarray(T0), ttl)
    assert not any(column.valid.any() for column in missing.values())
    never = codec.empty  # the stored record of "no value": event time INT64_MIN, every field null
    assert int.from_bytes(never[:8], "little", signed=True) == INT64_MIN


def test_packed_mget_keys_are_the_layout_keys(cat):
    rng = np.random.default_rng(0)
    for view_name in ("last", "by_shop"):
        view = cat.views[view_name]
        for prefix in (key_prefix("proj", view), b"q:p%d:" + key_prefix("x", view)):  # a % in the prefix
            for n in (0, 1, 15, 16, 17, 300):
                if view_name == "last":
                    ids = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64, endpoint=True)
                    ids[:min(n, 8)] = [0, -1, 9, 10, -10, 2**63 - 1, -2**63, 99][:min(n, 8)]
                    entities = {"user_id": ids}
                else:
                    entities = {"shop": np.array([f"s:{i}%{{}}" for i in range(n)], dtype=object)}
                packed, count = _bulk_keys(prefix, view, entities)
                keys = entity_keys(prefix, view, entities)
                assert (packed, count) == (_bulk(keys), len(keys))


# A decoder keeps its prepared index parts and hands the same ones to every read of the same features.
_PARTS = ({("a", "x"): (0, 0), ("a", "y"): (0, 1), ("a", "z"): (0, 2)}, {("b", "k"): (1, 0), ("b", "m"): (1, 1)})


def _read_batch():
    """A read as the store's decoder builds it: two prepared blocks, one with a null and an inf."""
    batch = Batch()
    numbers = np.array([[1.5, 2.5, 3.5], [4.5, np.inf, 6.5]])
    batch.add_indexed(_PARTS[0], numbers, np.array([[True, True, True], [True, True, False]]), "float64")
    batch.add_indexed(_PARTS[1], np.array([[1, 2], [3, 4]]), np.ones((2, 2), dtype=bool), "int64", True)
    return batch


def _walk(result):
    """The conversions the way the general code does them: one column at a time."""
    to_dict, to_lists, codes = {}, {}, {}
    for name, key in result.outputs:
        column = result.batch[key]
        values = column.values
        if column.dtype == "float64" or not column.valid.all():  # ints holding a null turn float, as documented
            values = np.where(column.valid, values, np.nan)
        to_dict[name] = values
        plain = values.tolist()
        to_lists[name] = [v if ok and not (isinstance(v, float) and not math.isfinite(v)) else None
                          for v, ok in zip(plain, column.valid.tolist(), strict=True)]
        view_codes = result.batch.view_status(key[0])
        rows = view_codes if view_codes is not None else np.full(len(values), FieldStatus.PRESENT)
        codes[name] = np.where(column.valid, rows, np.where(rows == FieldStatus.PRESENT, FieldStatus.NULL_VALUE,
                                                            rows)).tolist()
    return to_dict, to_lists, codes


@pytest.mark.parametrize("order", [["x", "y", "z", "k", "m"], ["m", "y", "k", "x", "z"], ["z", "x"]])
def test_conversions_worked_out_once_per_request_shape_equal_a_column_walk(order):
    where = {"x": "a", "y": "a", "z": "a", "k": "b", "m": "b"}
    outputs = tuple((name, (where[name], name)) for name in order)
    for _ in range(3):  # the first call works the runs out, the others reuse them
        result = OnlineResult({"user_id": np.array([1, 2])}, _read_batch(), outputs, T0)
        to_dict, to_lists, codes = _walk(result)
        got = result.to_dict()
        assert list(got) == ["user_id", *order]
        for name in order:
            np.testing.assert_array_equal(got[name], to_dict[name])
            assert got[name].dtype == to_dict[name].dtype or name in ("z", "y")
        assert result.to_lists() == {"user_id": [1, 2], **to_lists}
        assert {k: v.tolist() for k, v in result.statuses().items()} == codes
        assert result.status_lists() == {k: [FieldStatus(c).name for c in v] for k, v in codes.items()}
        assert result.all_present() == ("z" not in order)
    # The same outputs over a batch built column by column (no prepared parts) are worked out afresh.
    loose = Batch()
    for name in order:
        loose.add((where[name], name), Column(np.array([7.0, 8.0]), np.array([True, True]), "float64"))
    result = OnlineResult({"user_id": np.array([1, 2])}, loose, outputs, T0)
    assert result.to_lists() == {"user_id": [1, 2], **{name: [7.0, 8.0] for name in order}}


def test_a_read_with_added_columns_keeps_its_layout_and_converts_as_a_column_walk():
    # An on-demand view adds its outputs to the read with `Batch.add` on every call: their index parts are
    # interned, so the read keeps a layout and the conversions are worked out once — on fresh values each time.
    outputs = (("x", ("a", "x")), ("amount_x", ("ctx", "amount_x")), ("k", ("b", "k")), ("flag", ("ctx", "flag")))
    layouts = []
    for call in range(3):
        batch = _read_batch()
        batch.add(("ctx", "amount_x"), Column(np.array([1.5 * call, np.nan]), np.array([True, call == 1]), "float64"))
        batch.add(("ctx", "flag"), Column(np.array([True, bool(call % 2)]), np.array([True, True]), "bool"))
        assert batch.layout is not None
        layouts.append(batch.layout)
        result = OnlineResult({"user_id": np.array([1, 2])}, batch, outputs, T0)
        to_dict, to_lists, _ = _walk(result)
        assert result.to_lists() == {"user_id": [1, 2], **to_lists}
        for name, values in result.to_dict().items():
            if name != "user_id":
                np.testing.assert_array_equal(values, to_dict[name])
    assert all(a is b for a, b in zip(layouts[0], layouts[2], strict=True))  # the same parts: one cache entry


def test_a_block_of_inputs_holds_what_to_dict_holds():
    outputs = tuple((name, ("a", name)) for name in ("x", "y", "z"))
    result = OnlineResult({"user_id": np.array([1, 2])}, _read_batch(), outputs, T0)
    columns = result.to_dict()
    for names in (("x", "y", "z"), ("z", "x"), ("y",)):
        block = result.block(names)
        assert block is not None and block.names == names
        np.testing.assert_array_equal(block.array, np.column_stack([columns[n] for n in names]))
        assert all(np.array_equal(block[n], columns[n], equal_nan=True) for n in names)
    assert result.block(("x", "nope")) is None
    mixed = OnlineResult({"user_id": np.array([1, 2])}, _read_batch(),
                         (("x", ("a", "x")), ("k", ("b", "k"))), T0)
    assert mixed.block(("x", "k")) is None  # an int64 column: the columns path serves it


def test_a_block_joins_a_views_numbers_and_an_on_demand_views_numbers():
    # An on-demand view's outputs are columns of their own beside the read's block: a model over both still gets
    # one array (to_dict's values, nulls as NaN), in the model's order, whatever that order is.
    outputs = (("x", ("a", "x")), ("y", ("a", "y")), ("z", ("a", "z")), ("k", ("b", "k")),
               ("amount_x", ("ctx", "amount_x")), ("ratio", ("ctx", "ratio")))
    for call in range(3):
        batch = _read_batch()
        batch.add(("ctx", "amount_x"), Column(np.array([1.5 * call, 9.0]), np.array([True, call != 1]), "float64"))
        batch.add(("ctx", "ratio"), Column(np.array([0.25, -1.0]), np.array([True, True]), "float64"))
        result = OnlineResult({"user_id": np.array([1, 2])}, batch, outputs, T0)
        columns = result.to_dict()
        for names in (("x", "y", "z", "amount_x", "ratio"), ("ratio", "x", "amount_x"), ("amount_x",),
                      ("z", "y")):
            block = result.block(names)
            assert block is not None and block.names == names, names
            np.testing.assert_array_equal(block.array, np.column_stack([columns[n] for n in names]))
        assert result.block(("x", "amount_x", "k")) is None  # an int64 column among them
        assert result.block(("x", "nope")) is None
        assert np.isnan(result.block(("amount_x", "x")).array[1, 0]) == (call == 1)  # a null is NaN, as in to_dict


@pytest.mark.parametrize("config", [
    NetworkConfig(n_numeric=4, cardinalities=(), hidden=(8, 4), dropout=0.3),
    NetworkConfig(n_numeric=3, cardinalities=(5, 7), hidden=(6,), dropout=0.0, wide=True),
])
def test_direct_kernel_inference_is_forward_bit_for_bit(config):
    torch.manual_seed(0)
    net = TabularNet(config).eval()
    numeric = torch.randn(33, 2 * config.n_numeric)
    categorical = torch.stack([torch.randint(0, c, (33,)) for c in config.cardinalities], dim=1) \
        if config.cardinalities else torch.zeros(33, 0, dtype=torch.int64)
    with torch.inference_mode():
        for rows in (slice(0, 1), slice(0, 33)):
            assert torch.equal(net(numeric[rows], categorical[rows]), net.infer(numeric[rows], categorical[rows]))
    with pytest.raises(RuntimeError, match="eval mode"):
        net.train().infer(numeric, categorical)


def test_a_block_of_inputs_is_encoded_as_its_columns_are():
    names = ("a", "b", "c")
    prep = Preprocessor(names, (), (0.5, -1.0, 3.0), (0.2, 2.0, 1.0), ())
    values = np.array([[0.1, np.nan, 1e300], [2.0, -3.0, np.inf], [0.5, 0.0, -7.0]])
    block = ColumnBlock(names, values)
    from_block = prep.transform(block)
    from_columns = prep.transform({n: values[:, i].copy() for i, n in enumerate(names)})
    assert all(np.array_equal(x, y) for x, y in zip(from_block, from_columns, strict=True))
    with pytest.raises(ValueError, match="3 names"):
        ColumnBlock(names, values[:, :2])


def _log_batches(blockify: bool):
    names = tuple(f"f{i}" for i in range(4))
    out = []
    for i in range(12):
        values = np.random.default_rng(i).random((2, 4))
        values[0, 1] = np.nan
        if i % 4 == 3:  # a shadow's rows: no features of their own
            features = {}
        else:
            features = ColumnBlock(names, values) if blockify else dict(zip(names, list(values.T), strict=True))
        ts = np.array([T0 + i * H // 3, T0 + i * H // 3 + 1])  # crosses hours
        out.append(LogBatch(2, ts, [f"r{i}", f"s{i}"], {"user_id": [i, i + 1]}, features, "m:1", "champion", 1.5,
                            np.array([0.5, 0.2]), "", None, f"c{i}", None, np.zeros(2, dtype=np.int64)))
    return out


def _same(a: pa.Table, b: pa.Table) -> bool:
    if a.schema != b.schema:
        return False
    nan_equal = lambda x, y: x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)  # noqa: E731
                                        and math.isnan(y))
    return all(all(nan_equal(x, y) for x, y in zip(a.column(n).to_pylist(), b.column(n).to_pylist(), strict=True))
               for n in a.column_names)


def test_serving_log_joins_blocks_into_the_table_the_columns_give():
    blocks, columns = _log_batches(True), _log_batches(False)
    assert _same(batches_to_table(blocks), batches_to_table(columns))
    assert batches_to_table(blocks).column("feature.f2").null_count == 6  # the shadow rows: null, not 0
    for block_batch, column_batch in zip(blocks, columns, strict=True):
        hours = split_by_hour(block_batch)
        assert [h for h, _ in hours] == [h for h, _ in split_by_hour(column_batch)]
        assert _same(batches_to_table([b for _, b in hours]),
                     batches_to_table([b for _, b in split_by_hour(column_batch)]))


class _Model:
    def __init__(self) -> None:
        self.features, self.feature_refs, self.version_label = ["f0", "f1"], ["v:f0", "v:f1"], "m:2"

    def predict(self, columns):
        return np.asarray(columns["f0"]) + 10 * np.asarray(columns["f1"])


def test_off_path_rows_of_many_requests_are_one_log_call_each_row_with_its_own_request(tmp_path: Path):
    arm = Arm(2, "m:2", _Model())
    items = []
    for k, rows in enumerate((1, 3, 2)):
        values = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + k
        inputs = ColumnBlock(("f0", "f1"), values) if k != 1 else {"f0": values[:, 0], "f1": values[:, 1]}
        items.append(OffPath(arm, "shadow", [f"q{k}-{i}" for i in range(rows)], {"user_id": list(range(rows))},
                             inputs, 1.0 + k, T0 + k if k != 2 else np.array([T0 + 7, T0 + H]), None, f"call{k}"))
    logger = ServingLogger(tmp_path, flush_interval_s=3_600)
    calls = []
    original = logger.log_batch
    logger.log_batch = lambda *a, **kw: (calls.append(a), original(*a, **kw))  # type: ignore[method-assign]
    stats = ServiceStats()
    score_off_path(items, stats, logger)
    logger.close()
    assert len(calls) == 1 and stats.shadow_rows == 6 and stats.shadow_errors == 0
    table = read_serving_logs(tmp_path).to_pandas().sort_values("request_id")
    assert table["request_id"].tolist() == ["q0-0", "q1-0", "q1-1", "q1-2", "q2-0", "q2-1"]
    assert table["call_id"].tolist() == ["call0", "call1", "call1", "call1", "call2", "call2"]
    want = {}
    for item in items:
        scores = _Model().predict(item.columns)
        want.update(zip(item.request_ids, scores.tolist(), strict=True))
    assert table["prediction"].tolist() == [want[r] for r in table["request_id"]]
    micros = table["ts"].astype("int64").tolist()
    assert micros == [T0, T0 + 1, T0 + 1, T0 + 1, T0 + 7, T0 + H]
    assert table["arm"].unique().tolist() == ["shadow"]


BAD_BODIES = [b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": "\\ud800"}', b'{"a": "\\udc00\\ud800"}',
              b'\xff', b'{"a": "\xed\xa0\x80"}', b'{"a": 1}x', b"", b"[1,]", b'{"a" 1}', b"[" * 5000 + b"]" * 5000]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_the_fast_parser_refuses_what_the_strict_one_refuses(body):
    with pytest.raises((ValueError, RecursionError)):
        strict_loads(body)
    with pytest.raises(ValueError):
        fast_loads(body)


def test_the_fast_parser_reads_what_the_strict_one_reads():
    for body in [b'{"features": ["v:f0"], "entities": {"user_id": [7, 99999999999999999999]}, "at": null}',
                 b'{"a": [1.5E+3, -0, 1e-400, "\\u00e9\\ud83d\\ude00", true, false, {"b": {}}], "a2": 2}',
                 json.dumps({"x": [0.1 * i for i in range(50)]}).encode(), b' {"a":1,"a":2} ']:
        assert fast_loads(body) == strict_loads(body)
