"""The online store's one small interface: write last values and tiles, read features as of a time.

Any store (Redis today) implements `OnlineStore`; the SDK, the HTTP server, materialization and the
streaming loader only ever hold this interface.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import ViewSpec


class OnlineStoreError(QuiverError):
    """The online store refused a request (bad credentials, wrong server type, corrupt data)."""


class OnlineStoreUnavailable(OnlineStoreError):
    """The online store did not answer within its timeout (down, unreachable, or restarting)."""


class Column(NamedTuple):
    """One feature for a batch of entities: values (typed numpy) and a validity mask (False = null)."""

    values: np.ndarray
    valid: np.ndarray
    dtype: str  # logical dtype; timestamps are int64 epoch µs in `values`


Key = tuple[str, str]  # (view, feature)


class FieldStatus(enum.IntEnum):
    """Why a returned value is what it is (Feast's codes and names, so Feast users read them the same way)."""

    PRESENT = 1  # the store holds a value for the entity, valid as of the request time
    NULL_VALUE = 2  # the entity's row is there, this feature is null in it
    NOT_FOUND = 3  # the store holds nothing for the entity (never written, flushed, or only newer than `at`)
    OUTSIDE_MAX_AGE = 4  # the newest value is older than the view's TTL at the request time


STATUS_NAMES = tuple(s.name for s in FieldStatus)


class EntityPresence(NamedTuple):
    """What one view's read found per entity, kept raw so the status is computed only when asked for."""

    values: Sequence[bytes | None]  # the stored records (None: no key)
    at: np.ndarray  # request time(s), epoch µs
    ttl_us: int | None  # None: an aggregation view (no TTL) or a last view without one
    timed: bool  # True for last-value records (they start with the event time, little-endian int64)


_ADDED: dict[tuple[Key, int], Mapping[Key, tuple[int, int]]] = {}  # `Batch.add`'s interned index parts
_ADDED_KEPT = 10_000


class Batch(Mapping[Key, Column]):
    """The columns of one read keyed by (view, feature), kept as blocks: a 2-D block per run of
    same-typed features of a view, or a single column. A wide read then costs a few numpy calls instead
    of a few per feature; a Column is sliced out only when someone asks for it."""

    def __init__(self) -> None:
        self.blocks: list[tuple[np.ndarray, np.ndarray, str]] = []  # (values, valid, dtype), 1-D or 2-D
        self.index: dict[Key, tuple[int, int]] = {}  # key → (block, column in a 2-D block or -1)
        self.presence: dict[str, EntityPresence] = {}  # view → what its read found (absent: unknown)
        self._status: dict[str, np.ndarray] = {}
        self._all_valid: dict[int, bool] = {}
        # The prepared index parts (`add_indexed`) in the order added; None once a block came without one.
        # Equal parts mean an equal index, so readers may key caches on them (see OnlineResult).
        self.layout: tuple[Mapping[Key, tuple[int, int]], ...] | None = ()

    def view_status(self, view: str) -> np.ndarray | None:
        """Per entity, the FieldStatus of `view`'s row (PRESENT, NOT_FOUND or OUTSIDE_MAX_AGE) as uint8;
        None when the store did not say."""
        cached = self._status.get(view)
        if cached is None and view in self.presence:
            cached = self._status[view] = entity_status(self.presence[view])
        return cached

    def add(self, key: Key, column: Column) -> None:
        """Add one column (its index part interned, so a read that adds the same columns every call — an
        on-demand view's outputs — keeps a layout readers can key caches on)."""
        number = len(self.blocks)
        self.index[key] = (number, -1)
        self.blocks.append((column.values, column.valid, column.dtype))
        if self.layout is not None:
            part = _ADDED.get((key, number))
            if part is None:
                if len(_ADDED) >= _ADDED_KEPT:
                    _ADDED.clear()
                part = _ADDED[(key, number)] = {key: (number, -1)}
            self.layout += (part,)

    def add_block(self, items: Sequence[tuple[Key, int]], values: np.ndarray, valid: np.ndarray,
                  dtype: str) -> None:
        """Add a 2-D block (entities × columns) and the keys of the columns wanted from it."""
        number = len(self.blocks)
        self.blocks.append((values, valid, dtype))
        for key, position in items:
            self.index[key] = (number, position)
        self.layout = None

    def add_indexed(self, index: Mapping[Key, tuple[int, int]], values: np.ndarray, valid: np.ndarray,
                    dtype: str, all_valid: bool | None = None) -> None:
        """`add_block` with the index entries prepared (they must name this block's number, `len(self.blocks)`):
        a decoder that reads the same features every call keeps them (and never changes them), and adding a
        50-feature block then costs one dict update instead of a Python loop. `all_valid`: whether `valid` is
        all True, when the decoder knows (None: `all_valid()` checks when asked)."""
        if all_valid is not None:
            self._all_valid[len(self.blocks)] = all_valid
        self.blocks.append((values, valid, dtype))
        self.index.update(index)
        if self.layout is not None:
            self.layout += (index,)

    def all_valid(self, number: int) -> bool:
        """Whether block `number` holds no null (checked once per block)."""
        known = self._all_valid.get(number)
        if known is None:
            known = self._all_valid[number] = bool(self.blocks[number][1].all())
        return known

    def __getitem__(self, key: Key) -> Column:
        number, position = self.index[key]
        values, valid, dtype = self.blocks[number]
        if position < 0:
            return Column(values, valid, dtype)
        return Column(values[:, position], valid[:, position], dtype)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


class ColumnBlock(Mapping[str, np.ndarray]):
    """Named columns of one 2-D array (rows × columns): a Mapping of name → column (a view), kept whole so
    that a consumer that knows it takes the array at once. The serving log joins a thousand requests' blocks
    in one numpy call where it would otherwise join fifty thousand one-row columns one by one."""

    __slots__ = ("_positions", "array", "names")

    def __init__(self, names: Sequence[str], array: np.ndarray):
        if array.ndim != 2 or array.shape[1] != len(names):
            raise ValueError(f"ColumnBlock: {len(names)} names for an array of shape {array.shape}")
        self.names = tuple(names)
        self.array = array  # not `values`: that is the Mapping's method
        self._positions: dict[str, int] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(self.names)}
        return self.array[:, self._positions[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:  # Mapping's would slice a column to answer
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(self.names)}
        return name in self._positions

    def __len__(self) -> int:
        return len(self.names)

    def rows(self) -> int:
        """How many rows every column holds."""
        return len(self.array)

    def take(self, index: np.ndarray) -> ColumnBlock:
        """The block of the rows at `index` (positions or a mask)."""
        return ColumnBlock(self.names, self.array[index])


@dataclass(frozen=True)
class ViewRead:
    """What to read from one view: its spec and the features wanted (in output order)."""

    view: ViewSpec
    features: tuple[str, ...]


class OnlineStore(abc.ABC):
    """Writer + reader of online feature values for one project."""

    @abc.abstractmethod
    def write_last_values(self, view: ViewSpec, table: pa.Table) -> int:
        """Write the newest row per entity (keys, event_ts, fields; offline last_values schema).

        Newer wins per entity: a row older than the stored value is ignored. Returns rows sent."""

    @abc.abstractmethod
    def write_tiles(self, view: ViewSpec, table: pa.Table) -> int:
        """Upsert whole tiles (offline tiles schema); replays never double count. Returns entities sent."""

    @abc.abstractmethod
    def read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
             at: int | np.ndarray) -> Batch:
        """Values of every (view, feature) as of `at` (epoch µs, scalar or one per entity), in one round trip."""

    # A read in three steps, so a server can run only the blocking one off its event loop. Stores that
    # cannot split a read do it all in `fetch` (these defaults).
    def plan_read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
                  at: int | np.ndarray) -> Any:
        """Everything a read needs before I/O (no I/O); hand it to `fetch`."""
        return (reads, entities, at)

    def fetch(self, pending: Any) -> Any:
        """The blocking step of a read planned by `plan_read`."""
        return self.read(*pending)

    def finish_read(self, pending: Any, fetched: Any) -> Batch:
        """The Batch of a fetched read (no I/O)."""
        result: Batch = fetched
        return result

    def async_fetch(self) -> Callable[[Any], Awaitable[Any]] | None:
        """`fetch` as a coroutine function a server awaits on its event loop, or None (the default): the
        server then runs `fetch` on its worker threads."""
        return None

    @abc.abstractmethod
    def freshness(self, views: Sequence[str], *, timeout_s: float | None = None) -> dict[str, int | None]:
        """Newest event time written per view (epoch µs), None when nothing was written (or it was lost).

        `timeout_s`: answer or raise OnlineStoreUnavailable within this (health probes), instead of the
        store's own timeout."""

    @abc.abstractmethod
    def get_meta(self, view: str, field: str) -> str | None:
        """One field of a view's metadata (e.g. the materialization marker), None when unset."""

    @abc.abstractmethod
    def set_meta(self, view: str, field: str, value: str) -> None:
        """Set one field of a view's metadata."""

    def raise_freshness(self, view: str, max_event_ts_us: int) -> None:
        """Raise a view's freshness (`max_event_ts`) to at least `max_event_ts_us`, never lower it.

        This default reads, compares and writes; a store with several writers (the stream loader and a
        batch materialization) should do it atomically, as RedisOnlineStore does."""
        current = self.get_meta(view, "max_event_ts")
        if current is None or int(current) < max_event_ts_us:
            self.set_meta(view, "max_event_ts", str(max_event_ts_us))

    @abc.abstractmethod
    def ping(self, *, timeout_s: float | None = None) -> None:
        """Raise OnlineStoreUnavailable unless the store answers (within `timeout_s` when given)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> OnlineStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def entity_status(presence: EntityPresence) -> np.ndarray:
    """FieldStatus per entity from the raw records of one view's read."""
    values, at = presence.values, presence.at
    if len(values) == 1 and at.ndim == 0:  # one entity (most online requests): plain Python is 5x cheaper
        return np.array([_one_status(values[0], int(at), presence)], dtype=np.uint8)
    found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    status = np.where(found, np.uint8(FieldStatus.PRESENT), np.uint8(FieldStatus.NOT_FOUND))
    if presence.timed and found.any():
        # The same test the last-value decoder applies: a value counts when ttl-old-or-younger and before `at`.
        heads = b"".join([v[:8] if v is not None and len(v) >= 8 else _NO_TIME for v in values])
        ts = np.frombuffer(heads, dtype="<i8")
        status[found & (ts >= at)] = FieldStatus.NOT_FOUND
        if presence.ttl_us is not None:
            status[found & (ts < at) & (ts < at - presence.ttl_us)] = FieldStatus.OUTSIDE_MAX_AGE
    return status


def _one_status(value: bytes | None, at: int, presence: EntityPresence) -> int:
    if value is None:
        return FieldStatus.NOT_FOUND
    if not presence.timed or len(value) < 8:
        return FieldStatus.PRESENT
    ts = int.from_bytes(value[:8], "little", signed=True)
    if ts >= at:
        return FieldStatus.NOT_FOUND
    if presence.ttl_us is not None and ts < at - presence.ttl_us:
        return FieldStatus.OUTSIDE_MAX_AGE
    return FieldStatus.PRESENT


_NO_TIME = np.iinfo(np.int64).max.to_bytes(8, "little", signed=True)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The times the online path accepts (request times, serving-log rows): 1900-01-01T00:00:00Z up to, not
# including, 2200-01-01T00:00:00Z. Wide enough for replays of old data and far-future tests, far inside what
# datetimes and partition names hold (years 1..9999) and what int64 arithmetic on times ± windows holds.
MIN_TIME_US = -2_208_988_800_000_000  # 1900-01-01T00:00:00Z
MAX_TIME_US = 7_258_118_400_000_000  # 2200-01-01T00:00:00Z, excluded
TIME_RANGE = "1900-01-01T00:00:00Z <= t < 2200-01-01T00:00:00Z"


def check_time_us(value: int, what: str = "time") -> int:
    """`value` (epoch µs) when it lies in the supported range (TIME_RANGE); QuiverError naming `what` else."""
    if not MIN_TIME_US <= value < MAX_TIME_US:
        raise QuiverError(f"{what} {value} µs is outside the supported range {TIME_RANGE}")
    return value


def timestamp_us(value: Any, what: str = "time") -> int:
    """Epoch microseconds of a datetime (naive = UTC), date, ISO string, numpy datetime64 or int µs, checked
    against the supported range (TIME_RANGE); QuiverError naming `what` for anything else."""
    if isinstance(value, bool):
        raise QuiverError(f"{what}: not a timestamp: {value!r}")
    if isinstance(value, int | np.integer):
        return check_time_us(int(value), what)
    if isinstance(value, float | np.floating):
        if not np.isfinite(value):
            raise QuiverError(f"{what}: not a timestamp: {value!r}")
        return check_time_us(round(float(value)), what)
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            raise QuiverError(f"{what}: not a timestamp: NaT")
        return check_time_us(int(value.astype("datetime64[us]").astype(np.int64)), what)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "now":
            return now_us()
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise QuiverError(f"{what}: not an ISO timestamp: {value!r} (e.g. 2026-11-03T12:00:00Z)") from None
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        delta = aware - _EPOCH
        return check_time_us((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, what)
    if isinstance(value, date):
        return timestamp_us(datetime(value.year, value.month, value.day, tzinfo=UTC), what)
    if hasattr(value, "to_pydatetime"):  # pandas Timestamp
        return timestamp_us(value.to_pydatetime(), what)
    raise QuiverError(f"{what}: not a timestamp: {value!r}")


def now_us() -> int:
    """The current time in epoch microseconds."""
    import time

    return time.time_ns() // 1000
