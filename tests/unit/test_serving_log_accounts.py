"""The serving log's accounts (issue 50): per replica and hour, rows written, quarantined, spooled and
dropped (by reason and arm), stored beside the hour's files and summed over every replica by readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quiver.catalog.locations import Location, local_location
from quiver.serving.logs import ServingLogger, Spool, read_serving_logs
from quiver.serving.logs.accounts import read_accounts

T0 = 1_793_696_400_000_000  # 2026-11-03 09:00 UTC
H = 3_600_000_000


def batch(logger: ServingLogger, tag: str, ts: np.ndarray, arm: str | np.ndarray = "champion") -> None:
    n = len(ts)
    logger.log_batch([f"{tag}{i}" for i in range(n)], {"user_id": np.arange(n)}, {"amount": np.ones(n)},
                     "m:1", arm, 1.0, np.full(n, 0.5), ts_us=ts.astype(np.int64))


def test_rows_dropped_under_pressure_are_counted_by_hour_reason_and_arm(tmp_path: Path) -> None:
    logger = ServingLogger(tmp_path, flush_interval_s=3_600, max_buffer_rows=10, replica="web-1")
    arms = np.array(["champion", "canary"] * 3, dtype=object)
    batch(logger, "old", T0 + np.arange(6), arms)  # 09:00, 3 per arm
    batch(logger, "new", T0 + H + np.arange(8))  # 10:00: does not fit beside them, the oldest go
    logger.close()
    written = read_serving_logs(tmp_path)
    accounts = read_accounts(tmp_path)
    assert written.num_rows == 8 and accounts.dropped == {"buffer_full": {"champion": 3, "canary": 3}}
    assert accounts.served == 14 and accounts.dropped_share == pytest.approx(6 / 14)
    assert accounts.written == {"champion": 8} and accounts.replicas == {"web-1"}
    ten = read_accounts(tmp_path, start=None, end=None)
    assert ten.to_dict()["dropped_by_reason"] == {"buffer_full": 6}
    files = sorted(p.parent.parent.name for p in tmp_path.rglob("_accounts/*.json"))
    assert files == ["hour=09", "hour=10"]


def test_every_replicas_accounts_are_summed(tmp_path: Path) -> None:
    for name in ("a", "b"):
        with ServingLogger(tmp_path, replica=name) as logger:
            batch(logger, name, T0 + np.arange(4))
            batch(logger, f"{name}-bad", np.array([4 * 10**18]))  # quarantined: no hour, no account
    accounts = read_accounts(tmp_path)
    assert accounts.written == {"champion": 8} and accounts.replicas == {"a", "b"} and accounts.files == 2


def test_spooled_rows_are_counted_then_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    down = {"now": True}
    real = Location.put

    def put(location: Location, path: str, data: bytes) -> None:
        if down["now"]:
            raise OSError("connection refused")
        real(location, path, data)

    monkeypatch.setattr(Location, "put", put)
    logger = ServingLogger(local_location(tmp_path / "store"), flush_interval_s=3_600, replica="r",
                           spool=Spool(tmp_path / "spool"))
    batch(logger, "s", T0 + np.arange(5), np.array(["champion"] * 4 + ["canary"], dtype=object))
    logger.flush()
    assert read_accounts(tmp_path / "store").files == 0  # the accounts wait for the store too
    down["now"] = False
    logger.flush()
    accounts = read_accounts(tmp_path / "store")
    assert accounts.spooled == {"champion": 4, "canary": 1} and accounts.written == {"champion": 4, "canary": 1}
    assert accounts.served == 5 and accounts.dropped_rows == 0
    logger.close()


def test_a_step_whose_loggers_lost_rows_holds_instead_of_advancing(tmp_path: Path) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime

    from quiver.config import Config
    from quiver.monitoring.canary_judge import _hold_on_losses, _logging_losses
    from quiver.monitoring.canary_stats import JudgeSettings, StepVerdict

    config = Config(root=tmp_path)
    logger = ServingLogger(config.offline_dir, flush_interval_s=3_600, max_buffer_rows=100, replica="r")
    arms = np.array(["champion", "canary"] * 50, dtype=object)
    batch(logger, "lost", T0 + np.arange(100), arms)
    batch(logger, "kept", T0 + 200 + np.arange(100), arms)  # the first 100 are dropped to make room
    logger.close()
    start = datetime.fromtimestamp(T0 / 1e6, UTC)
    losses = _logging_losses(config, start, start.replace(hour=10))
    assert losses["answering_dropped"] == 100 and losses["answering_dropped_share"] == pytest.approx(0.5)
    advance = StepVerdict("advance", "every guardrail passed at 0.05", 0.05, 0.25, {}, (), {}, {})
    held = _hold_on_losses(advance, losses, JudgeSettings())
    assert held.outcome == "hold" and held.next_fraction is None
    assert "dropped 100 answering rows" in held.reason and "50.0%: 100 buffer_full" in held.reason
    assert _hold_on_losses(advance, losses, JudgeSettings(max_dropped_share=0.6)) is advance
    rollback = replace(advance, outcome="rollback", next_fraction=0.0)
    assert _hold_on_losses(rollback, losses, JudgeSettings()) is rollback  # a failure still stands


def test_a_dead_processs_journal_is_settled_into_its_accounts(tmp_path: Path) -> None:
    from quiver.serving.logs.journal import Journal, reconcile

    journals = tmp_path / "journal"
    logger = ServingLogger(tmp_path / "store", flush_interval_s=3_600, replica="r", journal=journals)
    batch(logger, "flushed", T0 + np.arange(5))
    logger.flush()  # 5 written and accounted
    batch(logger, "lost", T0 + np.arange(3))  # given, never flushed: the process is killed here
    batch(logger, "later", T0 + H + np.arange(2))
    assert logger.journal is not None
    logger.journal.write()
    dead = logger.ledger.process  # (the logger is abandoned, as a killed process leaves it)
    settled = reconcile(journals, local_location(tmp_path / "store"), "serving_logs", current="r-next")
    assert settled == 5 and not (journals / f"{dead}.json").exists()
    accounts = read_accounts(tmp_path / "store")
    assert accounts.dropped == {"killed": {"?": 5}} and accounts.written == {"champion": 5}
    assert reconcile(journals, local_location(tmp_path / "store"), "serving_logs", current="r-next") == 0
    clean = Journal(journals, "r", "r-clean")
    clean.give(T0, 1)
    clean.write()
    clean.discard()
    assert not list(journals.glob("*.json"))
    logger.close()


def test_a_clean_stop_leaves_no_journal(tmp_path: Path) -> None:
    with ServingLogger(tmp_path / "store", replica="r", journal=tmp_path / "journal") as logger:
        batch(logger, "r", T0 + np.arange(4))
    assert not list((tmp_path / "journal").glob("*.json")) and read_accounts(tmp_path / "store").served == 4
