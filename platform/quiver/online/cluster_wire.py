"""The bytes of a Redis Cluster store (redis_cluster.py): its URLs, the slots of layout.py's keys, the slot
map, the calls packed for many slots at once and the replies read back as one array. No I/O but
`receive_array`'s socket reads; the store decides where each call goes.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from quiver.online.base import OnlineStoreError
from quiver.online.redis_scripts import SCRIPTS
from quiver.online.redis_store import _eval, _socket_of, redact_url

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SLOTS = 16384
SEND_CALLS = 2_000  # calls per send: a write's calls go out in pieces of about a megabyte
_MGET = b"*%d\r\n$4\r\nMGET\r\n"
_RECV_BYTES = 1 << 16


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


class ClusterUrl(NamedTuple):
    scheme: str  # "redis" or "rediss"
    credentials: str  # "user:password@", ":password@" or ""
    seeds: list[tuple[str, int]]
    query: str  # "?…" or ""

    def node_url(self, host: str, port: int) -> str:
        return f"{self.scheme}://{self.credentials}{host}:{port}/0{self.query}"


def parse_cluster_url(url: str) -> ClusterUrl:
    """The parts of a ``redis+cluster://`` URL; a clear error names what is wrong."""
    if not is_cluster_url(url):
        raise OnlineStoreError(f"not a Redis Cluster URL: {redact_url(url)!r} (redis+cluster://host:port,…)")
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    credentials, _, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0]
    seeds = []
    for part in filter(None, hosts.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise OnlineStoreError(f"invalid Redis Cluster URL {redact_url(url)!r}: {part!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise OnlineStoreError(f"invalid Redis Cluster URL {redact_url(url)!r}: no seed node (host:port,…)")
    return ClusterUrl(scheme.split("+")[0], f"{credentials}@" if credentials else "", seeds,
                      f"?{query}" if query else "")


def script_sha(name: str) -> bytes:
    return hashlib.sha1(SCRIPTS[name]).hexdigest().encode()


def interleaved(items: list[bytes]) -> list[Any]:
    """length, item, length, item …: the arguments of a bulk-string template."""
    flat: list[Any] = [None] * (2 * len(items))
    flat[0::2] = map(len, items)
    flat[1::2] = items
    return flat


def key_slots(keys: list[bytes]) -> np.ndarray:
    """The slots of layout.py's keys: CRC16 of the entity between the key's one pair of braces (what
    redis.crc.key_slot computes for any key, in a third of its time)."""
    tags = [key[key.rfind(b"{") + 1:-1] for key in keys]
    crc = np.fromiter(map(binascii.crc_hqx, tags, itertools.repeat(0, len(tags))), dtype=np.int64, count=len(tags))
    return crc & (SLOTS - 1)


def in_order(total: int, order: np.ndarray, values: list[Any]) -> list[Any]:
    """`values` (of the keys in `order`) back in the read's order."""
    out = np.empty(total, dtype=object)
    out[order] = objects(values)
    return out.tolist()  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=256)
def mget_template(count: int) -> bytes:
    return _MGET % (count + 1) + b"$%d\r\n%s\r\n" * count


def pack_calls(how: str, name: str, blob: bytes, keys: list[bytes], values: list[bytes], counts: list[int],
                extra: Sequence[bytes]) -> list[bytes]:
    """The calls of consecutive slots (`counts` keys each; `keys` and `values` in that order) as RESP, in
    pieces of at most `SEND_CALLS` calls: MSETNX ("nx"), the script by its SHA ("eval") or with its text
    ("body", after NOSCRIPT). One %-format per piece: formatting a call at a time cost more than Redis' work."""
    if how == "body":
        out, at = [], 0
        for count in counts:
            out.append(_eval(name, keys[at:at + count], [*extra, *values[at:at + count]]))
            at += count
        return out
    n = len(keys)
    flat: list[Any] = [None] * (4 * n)
    if how == "nx" or max(counts) == 1:  # key, value, key, value …: what MSETNX and one-key scripts take
        flat[0::4], flat[1::4], flat[2::4], flat[3::4] = map(len, keys), keys, map(len, values), values
    else:  # a script's keys, then its values, per call
        sizes = np.asarray(counts)
        first = np.repeat(np.r_[0, np.cumsum(sizes)[:-1]], sizes)
        rank = np.arange(n) - first
        items = np.empty(2 * n, dtype=object)
        items[2 * first + rank] = objects(keys)
        items[2 * first + np.repeat(sizes, sizes) + rank] = objects(values)
        ordered = items.tolist()
        flat[0::2], flat[1::2] = map(len, ordered), ordered
    template = msetnx_template if how == "nx" else functools.partial(evalsha_template, script_sha(name), blob)
    pieces = []
    at = 0
    for start in range(0, len(counts), SEND_CALLS):
        part = counts[start:start + SEND_CALLS]
        size = sum(part)
        pieces.append(b"".join(map(template, part)) % tuple(flat[4 * at:4 * (at + size)]))
        at += size
    return pieces


def objects(items: list[bytes]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


@functools.lru_cache(maxsize=256)
def msetnx_template(count: int) -> bytes:
    return b"*%d\r\n$6\r\nMSETNX\r\n" % (2 * count + 1) + b"$%d\r\n%s\r\n" * (2 * count)


@functools.lru_cache(maxsize=1024)
def evalsha_template(sha: bytes, blob: bytes, count: int) -> bytes:
    """EVALSHA of `count` keys: the SHA, the key count and the extra arguments (`blob`, %-escaped) written
    in, the keys and values left to format."""
    extra = blob.count(b"\r\n") // 2
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (3 + 2 * count + extra, sha)
    number = b"%d" % count
    return (head + b"$%d\r\n%s\r\n" % (len(number), number) + b"$%d\r\n%s\r\n" * count + blob
            + b"$%d\r\n%s\r\n" * count)


def receive_array(conn: Any, count: int) -> list[Any]:
    """`count` replies from a connection whose commands were sent; error replies stay hiredis.ReplyError.

    The reader is first told to expect an array of `count`: the replies of pipelined commands are exactly that
    array's elements, so hiredis parses all of them in C and hands them over in one call (one call per reply
    cost 0.7 µs each: 1000 replies were half of a 1000-entity read)."""
    sock, reader = _socket_of(conn)
    reader.feed(b"*%d\r\n" % count)
    replies = reader.gets()
    while replies is False:
        data = sock.recv(_RECV_BYTES)
        if not data:
            raise ConnectionResetError("Redis closed the connection")
        reader.feed(data)
        replies = reader.gets()
    return replies  # type: ignore[no-any-return]


def slot_owners(reply: Sequence[Any], asked: str, url: str) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """CLUSTER SLOTS as slot → master index and the masters; every slot must have one."""
    owner = np.full(SLOTS, -1, dtype=np.int64)
    masters: list[tuple[str, int]] = []
    for entry in reply:
        first, last, master = int(entry[0]), int(entry[1]), entry[2]
        host = bytes(master[0]).decode() or asked  # empty: the node we asked
        address = (host, int(master[1]))
        if address not in masters:
            masters.append(address)
        owner[first:last + 1] = masters.index(address)
    missing = np.flatnonzero(owner < 0)
    if len(missing):
        raise OnlineStoreError(f"the Redis Cluster at {url} assigns no node to {len(missing)} of {SLOTS} slots "
                               f"(first {int(missing[0])}): it answers CLUSTERDOWN until every slot is assigned "
                               f"(redis-cli --cluster fix)")
    return owner, masters
