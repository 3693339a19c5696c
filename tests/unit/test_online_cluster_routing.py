"""The Redis Cluster store's pure parts: URLs, the slots of layout keys, the slot map, and the calls it packs
(byte for byte what the single server's one-call-at-a-time packing sends)."""

from __future__ import annotations

import itertools

import hiredis
import numpy as np
import pytest
from redis.crc import key_slot

from quiver import Entity, FeatureView, Field, Float64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.online.base import OnlineStoreError
from quiver.online.cluster_wire import (
    evalsha_template,
    is_cluster_url,
    key_slots,
    mget_template,
    pack_calls,
    parse_cluster_url,
    script_sha,
    slot_owners,
)
from quiver.online.layout import entity_keys, entity_tags, key_prefix
from quiver.online.redis_store import _eval, pack


@pytest.fixture(scope="module")
def views():
    user = Entity("user", ["user_id"])
    shop = Entity("shop", {"shop": String, "region": String})
    src = Source("tx", "unused")
    last = FeatureView("last", [user], src, ttl="1h", schema=[Field("amount", Float64)])
    pair = FeatureView("pair", [user, shop], src, ttl="1h", schema=[Field("amount", Float64)])
    columns = {"user_id": "int64", "shop": "string", "region": "string", "event_ts": "timestamp",
               "amount": "float64"}
    return build_catalog([user, shop, src, last, pair], schema_reader=lambda s: columns).views


def test_cluster_urls() -> None:
    url = parse_cluster_url("redis+cluster://alice:s3cret@10.0.0.1:7000,10.0.0.2:7001?ssl_cert_reqs=none")
    assert url.seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert url.node_url("10.0.0.3", 7002) == "redis://alice:s3cret@10.0.0.3:7002/0?ssl_cert_reqs=none"
    assert parse_cluster_url("rediss+cluster://h:1").node_url("h", 1) == "rediss://h:1/0"
    assert is_cluster_url("redis+cluster://h:1") and not is_cluster_url("redis://h:1/0")
    for bad, why in (("redis+cluster://", "no seed node"), ("redis+cluster://h", "is not host:port"),
                     ("redis+cluster://:pw@h:x", "is not host:port"), ("redis://h:1", "not a Redis Cluster URL")):
        with pytest.raises(OnlineStoreError, match=why) as caught:
            parse_cluster_url(bad)
        assert "pw" not in str(caught.value)


def test_the_slot_of_a_layout_key_is_its_entitys(views) -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64, endpoint=True)
    last, pair = views["last"], views["pair"]
    columns = {"user_id": ids, "shop": np.array([f"s{{{i}}}:%" for i in range(500)], dtype=object),
               "region": np.array(["eu", "us:{east}"] * 250, dtype=object)}
    for view in (last, pair):
        keys = entity_keys(key_prefix("proj", view), view, columns)
        want = [key_slot(key) for key in keys]
        assert key_slots(keys).tolist() == want
        # What plan_read hashes (the tags alone) places a key where Redis does.
        assert [key_slot(tag) for tag in entity_tags(view, columns)] == want
    assert len(set(key_slots(entity_keys(key_prefix("proj", last), last, columns)).tolist())) > 400


def test_the_slot_map_covers_every_slot_or_says_which_are_missing() -> None:
    reply = [[0, 5460, [b"10.0.0.1", 7000, b"a"], [b"10.0.0.4", 7003, b"d"]],
             [5461, 10922, [b"", 7001, b"b"]], [10923, 16383, [b"10.0.0.3", 7002, b"c"]]]
    owner, masters = slot_owners(reply, "10.0.0.9", "u")
    assert masters == [("10.0.0.1", 7000), ("10.0.0.9", 7001), ("10.0.0.3", 7002)]  # empty host: the one asked
    assert owner[0] == 0 and owner[5461] == 1 and owner[16383] == 2
    with pytest.raises(OnlineStoreError, match=r"assigns no node to 5461 of 16384 slots \(first 10923\)"):
        slot_owners(reply[:2], "h", "u")


def _parse(data: bytes, count: int) -> list:
    """The commands in RESP `data`, as lists of arguments (hiredis reads requests as arrays)."""
    reader = hiredis.Reader()
    reader.feed(data)
    commands = [reader.gets() for _ in range(count)]
    assert reader.gets() is False
    return commands


def test_packed_calls_are_the_single_servers_calls() -> None:
    rng = np.random.default_rng(5)
    counts = [1, 3, 1, 2, 5, 1]
    n = sum(counts)
    keys = [b"q:p:v:t:{%d}" % i for i in range(n)]
    values = [rng.bytes(int(rng.integers(0, 40))).replace(b"%", b"%%") for _ in range(n)]
    extra = [b"24", b"0", b"3600000000"]
    blob = b"".join(b"$%d\r\n%s\r\n" % (len(e), e) for e in extra)
    at = np.cumsum([0, *counts]).tolist()
    groups = [(keys[a:b], values[a:b]) for a, b in itertools.pairwise(at)]
    nx = _parse(b"".join(pack_calls("nx", "tile", blob, keys, values, counts, extra)), len(counts))
    assert nx == _parse(b"".join(pack(b"MSETNX", *[x for kv in zip(k, v, strict=True) for x in kv])
                                 for k, v in groups), len(counts))
    scripts = _parse(b"".join(pack_calls("eval", "tile", blob, keys, values, counts, extra)), len(counts))
    assert scripts == [[b"EVALSHA", script_sha("tile"), b"%d" % len(k), *k, *extra, *v] for k, v in groups]
    assert _parse(b"".join(pack_calls("body", "tile", blob, keys, values, counts, extra)), len(counts)) == \
        _parse(b"".join(_eval("tile", k, [*extra, *v]) for k, v in groups), len(counts))
    one = pack_calls("eval", "last", b"", keys[:4], values[:4], [1, 1, 1, 1], [])
    assert _parse(b"".join(one), 4) == [[b"EVALSHA", script_sha("last"), b"1", k, v] for k, v in zip(keys[:4], values[:4],
                                                                                            strict=True)]
    assert mget_template(2) % (3, b"abc", 1, b"d") == pack(b"MGET", b"abc", b"d")
    assert evalsha_template(script_sha("last"), b"", 1).count(b"%") == 4
