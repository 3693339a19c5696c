"""Both servers' OpenAPI against the live servers (real HTTP, real Redis), with schemathesis: no 5xx, every
status and content type documented, responses match their schemas, every body the schema calls valid is
accepted (2xx, or 400 for names the catalog does not know), every body it calls invalid is refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from quiver.config import Config
from quiver.serving.predict_server import create_app as create_predict_app
from quiver.serving.server import create_app as create_feature_app
from quiver.serving.store import FeatureStore
from tests.integration.test_prediction_service import MODEL, project, register
from tests.integration.test_serving_http import KEY, Server, catalog, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration
__all__ = ["project"]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          positive_data_acceptance, negative_data_rejection]
# 400 is the documented answer to a well-formed body naming features, services or keys the catalog does not
# know (no schema can list them and still describe every project); 422 is the schema's, and only its.
# A schema-violating body can also be larger than the server's body limit: 413 rejects it too (schemathesis's
# default list of rejections, plus 413).
CONFIG = SchemathesisConfig.from_dict({
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "429"]},
               "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "406", "409",
                                                                 "413", "415", "422", "428", "429", "5xx"]}},
    "generation": {"mode": "all"},
})
# JSON Schema's `date-time` cannot say "between 1900 and 2200": generate times in the documented range.
_TIMES = st.datetimes(datetime(1901, 1, 1), datetime(2198, 12, 31), timezones=st.just(UTC)) \
    .map(lambda t: t.isoformat().replace("+00:00", "Z"))
schemathesis.openapi.format("date-time", _TIMES)

feature_schema = schemathesis.openapi.from_dict(
    create_feature_app(FeatureStore(config=Config(project="h"), catalog=catalog()), api_key=KEY).openapi(),
    config=CONFIG)


@pytest.fixture
def feature_url(store) -> Iterator[str]:  # noqa: F811  (the imported fixture)
    server = Server(create_feature_app(store, api_key=KEY))
    with server:
        yield f"http://127.0.0.1:{server.port}"


@feature_schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_feature_server_matches_its_openapi(case, feature_url) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(base_url=feature_url, headers={"X-API-Key": KEY}, checks=CHECKS)


def _prediction_spec() -> dict:
    """The prediction server's schema does not depend on the model loaded: build it without a registry."""
    from types import SimpleNamespace

    from quiver.serving.arms import Arm, ArmSet

    arms = ArmSet(Arm(1, f"{MODEL}:1", None))
    fake = SimpleNamespace(model_name=MODEL, arms=arms, logger=None,
                           store=SimpleNamespace(config=Config(project="p"),
                                                 online=SimpleNamespace(async_fetch=lambda: None)))
    return create_predict_app(fake, api_key=KEY).openapi()  # type: ignore[arg-type]


prediction_schema = schemathesis.openapi.from_dict(_prediction_spec(), config=CONFIG)


@pytest.fixture(scope="module")
def prediction_url(tmp_path_factory: pytest.TempPathFactory, redis_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A live prediction server (one per module: loading the model is the slow part) on a real Redis."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from quiver.artifacts import ArtifactStore
    from quiver.offline.layout import last_values_schema
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from tests.integration.test_prediction_service import T0, USERS
    from tests.integration.test_prediction_service import catalog as prediction_catalog

    tmp = tmp_path_factory.mktemp("fuzz")
    cat = prediction_catalog()
    config = Config(root=tmp, project="fz", redis_url=redis_server.url, registry_url=f"sqlite:///{tmp}/reg.db",
                    offline_root=str(tmp / "offline"))
    online = RedisOnlineStore(redis_server.url, "fz", timeout_s=1.0)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"user_id": np.arange(USERS, dtype=np.int64), "f0": rng.normal(size=USERS),
                          "f1": rng.normal(size=USERS), "category": rng.choice(["a", "b"], USERS),
                          "event_ts": pd.Timestamp(T0)})
    schema = last_values_schema(cat.views["stats"])
    online.write_last_values(cat.views["stats"], pa.Table.from_pandas(frame, preserve_index=False)
                             .select(schema.names).cast(schema))
    registry = Registry(config.registry, project="fz")
    models = ModelRegistry(registry, ArtifactStore.from_config(config))
    v1 = register(models, tmp / ".quiver" / "models", seed=1)
    models.set_alias(MODEL, "champion", v1, expected=None, reason="fuzz")
    from quiver.serving.prediction import PredictionService

    with FeatureStore(config=config, catalog=cat, online_store=online) as fs, \
            PredictionService(fs, MODEL, models=models) as service:
        server = Server(create_predict_app(service, api_key=KEY))
        with server:
            yield f"http://127.0.0.1:{server.port}"
    registry.close()


@prediction_schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_prediction_server_matches_its_openapi(case, prediction_url) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(base_url=prediction_url, headers={"X-API-Key": KEY}, checks=CHECKS)
