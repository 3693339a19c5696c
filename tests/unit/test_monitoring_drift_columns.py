"""`quiver drift` without -f: the catalog's features, never join keys, timestamps or labels."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from quiver.catalog.loader import load_catalog
from quiver.monitoring.checks import default_drift_columns
from tests.unit.test_monitoring_quality import DEFS, transactions

SERVICE = '''
from quiver import FeatureService
from quality_defs import user_spend

fraud = FeatureService(name="fraud", features=[user_spend])
'''


@pytest.fixture
def catalog(tmp_path: Path) -> object:
    import pyarrow.parquet as pq

    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "quality_defs.py").write_text(textwrap.dedent(DEFS))
    (tmp_path / "feature_defs" / "services.py").write_text(textwrap.dedent(SERVICE))
    (tmp_path / "data" / "tx").mkdir(parents=True)
    pq.write_table(transactions(20), tmp_path / "data" / "tx" / "part-0.parquet")
    return load_catalog(tmp_path / "feature_defs", root=tmp_path)


def test_training_set_columns_compare_features_only(catalog: object) -> None:
    training = ["user_id", "event_ts", "is_fraud", "amount_sum_1h", "category", "transaction_id"]
    chosen = default_drift_columns(catalog, training, training)
    assert chosen.features == ["amount_sum_1h", "category"]
    assert chosen.left_out == {"user_id": "join key", "event_ts": "timestamp", "is_fraud": "not a catalog feature",
                               "transaction_id": "not a catalog feature"}
    assert default_drift_columns(catalog, training, training, service="fraud").features == ["amount_sum_1h"]


def test_raw_source_files_compare_the_columns_views_read(catalog: object) -> None:
    raw = ["user_id", "amount", "note", "event_ts", "date"]
    chosen = default_drift_columns(catalog, raw, raw)
    assert chosen.features == ["amount"] and "source columns" in chosen.origin
    assert chosen.left_out == {"user_id": "join key", "note": "not a catalog feature", "event_ts": "timestamp",
                               "date": "timestamp"}


def test_nothing_to_compare_and_unknown_service_are_clear_errors(catalog: object) -> None:
    with pytest.raises(ValueError, match="name the columns with -f"):
        default_drift_columns(catalog, ["user_id", "event_ts"], ["user_id", "event_ts"])
    with pytest.raises(ValueError, match="unknown feature service 'nope'; services: fraud"):
        default_drift_columns(catalog, ["amount_sum_1h"], ["amount_sum_1h"], service="nope")
    with pytest.raises(ValueError, match="amount_sum_1h are not in both tables"):
        default_drift_columns(catalog, ["amount_sum_1h"], ["category"], service="fraud")


def test_evidently_shows_the_rule_that_decided() -> None:
    """A feature drifted by KS while its PSI only warns shows KS D with KS's threshold, not PSI's."""
    from quiver.monitoring.drift import FeatureDrift, Thresholds
    from quiver.monitoring.plots import _verdict

    t = Thresholds()
    by_ks = FeatureDrift("amount", "numerical", "alert", {"psi": 0.134, "psi_bins": 11.0, "ks_statistic": 0.23,
                                                           "ks_pvalue": 1e-40}, 2000, 2000, 0, 0,
                         ("PSI 0.134 ≥ 0.1", "KS D=0.230 ≥ 0.1, p=1e-40 < 0.05"))
    verdict = _verdict(by_ks, t)
    assert (verdict.method.startswith("KS D"), verdict.score, verdict.threshold, verdict.drifted) == (
        True, 0.23, 0.1, True)
    by_psi = FeatureDrift("category", "categorical", "alert", {"psi": 0.31, "psi_bins": 8.0}, 2000, 2000, 0, 0,
                          ("PSI 0.310 ≥ 0.2",))
    assert (_verdict(by_psi, t).method, _verdict(by_psi, t).threshold) == ("PSI", 0.2)
    calm = FeatureDrift("flag", "categorical", "ok", {"psi": 0.01, "psi_bins": 2.0}, 2000, 2000, 0, 0)
    assert (_verdict(calm, t).method, _verdict(calm, t).drifted) == ("PSI", False)
