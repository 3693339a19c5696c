"""Request-time features at `/predict` on the real parts (Redis, artifacts, a uvicorn server): the model sees
the request's fields through an on-demand view, a missing / unknown / mis-typed field is a 400 naming it (it depends on the model, like unknown keys),
fields and missing-input counts are logged with the row, and a prediction from mostly missing inputs is
flagged or refused by the model's policy — never an ordinary-looking score."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.catalog.definitions import (
    Check,
    Contract,
    Entity,
    FeatureView,
    Field,
    OnDemandFeatureView,
    RequestSource,
    Source,
)
from quiver.catalog.validate import build_catalog
from quiver.serving.logs import ServingLogger, read_serving_logs
from quiver.serving.prediction import PredictionService
from quiver.serving.store import FeatureStore
from tests.integration.test_prediction_service import (
    BEAT_BASELINE,
    COLUMNS,
    MODEL,
    T0,
    USERS,
    Project,
    Server,
    project,
)

pytestmark = pytest.mark.integration
__all__ = ["project"]


def order_features(frame: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=frame.index)
    out["amount_x_f0"] = frame["amount"] * frame["f0"]
    return out


def odfv_catalog(contract: Contract | None = None) -> Any:
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused")
    stats = FeatureView("stats", [user], source, ttl="30d",
                        schema=[Field("f0", "float64"), Field("f1", "float64"), Field("category", "string")])
    order = RequestSource("order", schema=[Field("amount", "float64"), Field("channel", "string")],
                          contract=contract)
    ctx = OnDemandFeatureView("ctx", schema=[Field("amount_x_f0", "float64")], udf=order_features,
                              request_sources=[order], inputs=["stats:f0"])
    return build_catalog([user, source, stats, order, ctx], schema_reader=lambda s: COLUMNS)


def register_odfv_model(project: Project, policy: dict[str, Any] | None = None) -> int:
    """A real artifact reading a stored feature and an on-demand one, with a missing-input policy."""
    import torch

    from quiver.models.artifact import MissingPolicy, save_artifact
    from quiver.models.network import NetworkConfig, TabularNet
    from quiver.models.scoring import Preprocessor

    prep = Preprocessor(("f0", "f1", "amount_x_f0"), (), (0.0,) * 3, (1.0,) * 3, ())
    torch.manual_seed(3)
    net = TabularNet(NetworkConfig(n_numeric=3, cardinalities=(), hidden=(8,), dropout=0.0))
    reference = pd.DataFrame({"f0": [0.0], "f1": [0.0], "amount_x_f0": [0.0], "score": [0.5]})
    folder, sha = save_artifact(project.root, MODEL, net, prep, feature_refs=["stats:f0", "stats:f1", "ctx:amount_x_f0"],
                                catalog_version=None, catalog_hash="test", label_column="label", reference=reference,
                                extra={"missing_policy": MissingPolicy(**(policy or {})).to_dict()})
    version = project.models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics=BEAT_BASELINE,
                                      window_start=T0 - timedelta(days=7), cutoff=T0,
                                      features=["f0", "f1", "amount_x_f0"], catalog_version=None, label_column="label",
                                      lineage={}, reference_path=str(folder / "reference.parquet"))
    project.models.set_alias(MODEL, "champion", version.version, expected=project.models.aliases(MODEL).get(
        "champion"), reason="test")
    return version.version


def service(project: Project, contract: Contract | None = None, **kwargs: Any) -> PredictionService:
    store = FeatureStore(config=project.config, catalog=odfv_catalog(contract), online_store=project.store.online)
    return PredictionService(store, MODEL, models=project.models, **kwargs)


def test_predict_scores_request_fields_through_the_on_demand_view_and_logs_them(project: Project) -> None:
    from quiver.serving.predict_server import create_app

    version = register_odfv_model(project)
    with ServingLogger(project.config.offline_dir) as logger:
        svc = service(project, logger=logger)
        with Server(create_app(svc, api_key="")) as client:
            rows = [{"request_id": f"r{u}", "entities": {"user_id": u}, "fields": {"amount": 2.0 + u, "channel": "web"}}
                    for u in range(20)]
            reply = client.post("/predict", json={"rows": rows})
        svc.close()
    assert reply.status_code == 200, reply.text
    got = {p["request_id"]: p for p in reply.json()["predictions"]}
    features = project.features.set_index("user_id").loc[list(range(20))]
    expected = project.models.load(MODEL, version).predict(
        {"f0": features["f0"].to_numpy(), "f1": features["f1"].to_numpy(),
         "amount_x_f0": (2.0 + np.arange(20)) * features["f0"].to_numpy()})
    np.testing.assert_allclose([got[f"r{u}"]["score"] for u in range(20)], expected, atol=1e-12)
    assert all(p["missing"] == 0 and not p["flagged"] and not p["refused"] for p in got.values())
    logged = read_serving_logs(project.config.offline_dir).to_pandas().set_index("request_id")
    assert logged.loc["r3", "request.amount"] == 5.0 and logged.loc["r3", "request.channel"] == "web"
    assert logged.loc["r3", "feature.amount_x_f0"] == pytest.approx(5.0 * features.loc[3, "f0"])
    assert (logged["missing_inputs"] == 0).all()


@pytest.mark.parametrize(("fields", "named"), [
    ({"channel": "web"}, "fields.amount: missing"),
    ({"amount": "12.5", "channel": "web"}, "fields.amount: expected float64, got str"),
    ({"amount": True, "channel": "web"}, "fields.amount: expected float64, got bool"),
    ({"amount": 1.0, "channel": 7}, "fields.channel: expected string, got int"),
    ({"amount": 1.0, "channel": "web", "coupon": "x"}, "fields.coupon: unknown field"),
])
def test_a_missing_unknown_or_mistyped_request_field_is_a_400_naming_it(project: Project, fields: dict[str, Any],
                                                                       named: str) -> None:
    from quiver.serving.predict_server import create_app

    register_odfv_model(project)
    svc = service(project)
    with Server(create_app(svc, api_key="")) as client:
        ok = {"request_id": "ok", "entities": {"user_id": 1}, "fields": {"amount": 1.0, "channel": None}}
        reply = client.post("/predict", json={"rows": [ok, {"request_id": "bad", "entities": {"user_id": 2},
                                                             "fields": fields}]})
    svc.close()
    assert reply.status_code == 400, reply.text
    assert named in reply.json()["detail"] and "rows[1]" in reply.json()["detail"]


def test_mostly_missing_inputs_are_flagged_or_refused_by_the_models_policy(project: Project) -> None:
    unknown = USERS + 7  # no stored features at all for this user: f0 and f1 NOT_FOUND, the product null
    register_odfv_model(project, {"action": "flag", "max_missing_share": 0.5})
    rows = [{"request_id": "known", "entities": {"user_id": 1}, "fields": {"amount": 1.0, "channel": "web"}},
            {"request_id": "gone", "entities": {"user_id": unknown}, "fields": {"amount": 1.0, "channel": "web"}}]
    flagged = {p.request_id: p for p in service(project).predict(rows, explain_missing=True)}
    assert flagged["known"].missing == 0 and not flagged["known"].flagged
    gone = flagged["gone"]
    assert gone.missing == 3 and gone.flagged and not gone.refused and np.isfinite(gone.score)
    assert set(gone.missing_features) == {"f0", "f1", "amount_x_f0"}
    register_odfv_model(project, {"action": "refuse", "max_missing_share": 0.5})
    with ServingLogger(Path(project.config.offline_dir)) as logger:
        refused = {p.request_id: p for p in service(project, logger=logger).predict(rows)}
    assert refused["gone"].refused and np.isnan(refused["gone"].score) and not refused["known"].refused
    logged = read_serving_logs(project.config.offline_dir).to_pandas().set_index("request_id")
    assert logged.loc["gone", "missing_inputs"] == 3 and logged.loc["gone", "error"].startswith("refused")


def test_request_fields_failing_their_contract_are_a_400_counted_on_metrics(project: Project) -> None:
    """The request source's contract is the rule the stored rows follow: a row failing it is refused by name,
    and every refused row is counted per source, check and path on /metrics."""
    from quiver.serving.predict_server import create_app

    register_odfv_model(project)
    svc = service(project, Contract({"amount": Check(finite=True, min=0.0), "channel": Check(one_of=["web", "pos"])}))
    rows = [{"request_id": "ok", "entities": {"user_id": 1}, "fields": {"amount": 3.0, "channel": "web"}},
            {"request_id": "neg", "entities": {"user_id": 2}, "fields": {"amount": -3.0, "channel": "web"}},
            {"request_id": "odd", "entities": {"user_id": 3}, "fields": {"amount": 1.0, "channel": "fax"}},
            {"request_id": "null", "entities": {"user_id": 4}, "fields": {"amount": None, "channel": None}}]
    with Server(create_app(svc, api_key="")) as client:
        before = _refused(client)
        refused = client.post("/predict", json={"rows": rows})
        accepted = client.post("/predict", json={"rows": [rows[0], rows[3]]})  # nulls pass every rule but not_null
        after = _refused(client)
    svc.close()
    assert refused.status_code == 400, refused.text
    assert refused.json()["detail"].startswith("rows[1].fields.amount: refused by the contract of 'order' "
                                               "(min:amount; value -3.0)") and "2 rows refused" in refused.text
    assert accepted.status_code == 200, accepted.text
    assert {k: after.get(k, 0) - before.get(k, 0) for k in after} == {"min:amount": 1, "one_of:channel": 1}


def _refused(client: Any) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("quiver_contract_refused_rows_total{") and 'path="request"' in line:
            check = line.split('check="', 1)[1].split('"', 1)[0]
            out[check] = float(line.rsplit(" ", 1)[1])
    return out
