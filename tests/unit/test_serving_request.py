"""The HTTP request body: `at` has one unambiguous form (ISO-8601 with an offset, or `at_us` in epoch µs);
the online path resolves feature names without the offline engine; the SDK's historical read honours the
configured engine."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from quiver.serving.schemas import OnlineRequest

BASE: dict[str, Any] = {"features": ["v:f"], "entities": {"user_id": [1]}}


@pytest.mark.parametrize("at", [1794657600.5, 1794657600.0, 1794657600, True, "2026-11-03T12:00:00",
                                "2026-11-03", "soon", "1794657600", [1, 2]])
def test_every_other_form_of_at_is_refused(at: Any) -> None:
    with pytest.raises(ValidationError):
        OnlineRequest.model_validate({**BASE, "at": at})


@pytest.mark.parametrize("at_us", [1.5, True, "1794657600", 2**62, -(2**62)])
def test_at_us_takes_only_integers(at_us: Any) -> None:
    with pytest.raises(ValidationError):
        OnlineRequest.model_validate({**BASE, "at_us": at_us})


def test_at_us_is_an_integer_as_json_schema_means_it() -> None:
    # JSON has one number type: 1794657600.0 is the integer 1794657600 (what the OpenAPI schema's "integer"
    # admits, so schemathesis sends it); a fraction, a boolean or a string is not.
    assert OnlineRequest.model_validate({**BASE, "at_us": 1794657600.0}).at_us_value() == 1794657600


def test_the_two_forms_give_the_same_time() -> None:
    iso = OnlineRequest.model_validate({**BASE, "at": "2026-11-03T12:00:00.000001Z"})
    offset = OnlineRequest.model_validate({**BASE, "at": "2026-11-03T13:00:00.000001+01:00"})
    micros = OnlineRequest.model_validate({**BASE, "at_us": 1_793_707_200_000_001})
    assert iso.at_us_value() == offset.at_us_value() == micros.at_us_value() == 1_793_707_200_000_001
    assert OnlineRequest.model_validate(BASE).at_us_value() is None  # now
    with pytest.raises(ValidationError, match="at most one"):
        OnlineRequest.model_validate({**BASE, "at": "2026-11-03T12:00:00Z", "at_us": 1})


def test_online_path_does_not_import_the_offline_engine() -> None:
    code = """
import sys
from quiver import Entity, FeatureView, Field, Float64, Source
from quiver.catalog.validate import build_catalog
from quiver.serving.store import resolve
user = Entity("user", ["user_id"])
src = Source("tx", "unused")
view = FeatureView("v", [user], src, ttl="1h", schema=[Field("f", Float64)])
catalog = build_catalog([user, src, view], schema_reader=lambda s: {"user_id": "int64", "event_ts": "timestamp",
                                                                    "f": "float64"})
assert [o[0] for o in resolve(catalog, ["v:f"], True).outputs] == ["v__f"]
assert "quiver.offline.pit" not in sys.modules, "the online path imported quiver.offline.pit"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from quiver.catalog.references import resolve_features
    from quiver.offline.pit import resolve_features as old_name

    assert old_name is resolve_features  # older imports keep working


def test_historical_features_use_the_configured_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.catalog.ir import Catalog
    from quiver.config import Config
    from quiver.offline import pit
    from quiver.serving.store import FeatureStore

    seen: list[str] = []
    monkeypatch.setattr(pit, "get_historical_features", lambda *a, engine="duckdb", **k: seen.append(engine))
    empty = Catalog({}, {}, {}, {})
    FeatureStore(config=Config(engine="spark"), catalog=empty).get_historical_features(None, [])
    FeatureStore(config=Config(engine="spark"), catalog=empty).get_historical_features(None, [], engine="duckdb")
    FeatureStore(config=Config(), catalog=empty).get_historical_features(None, [])
    assert seen == ["spark", "duckdb", "duckdb"]
