"""A champion call that raises fails its request, but every routed row is still logged (issue 30): the
champion's with its error, the canary's as not run, so the judge's sample-ratio check counts what the router
assigned and never mistakes an outage of the champion for a broken split or a failing canary."""

from __future__ import annotations

import pytest

from quiver.registry import rollouts
from quiver.serving.logs import ServingLogger, read_serving_logs
from tests.integration.test_prediction_service import MODEL, USERS, Project, project, register, rows

pytestmark = pytest.mark.integration
__all__ = ["project"]


def test_a_failed_champion_call_logs_the_canary_rows_as_not_run(project: Project) -> None:
    broken = register(project.models, project.root, seed=3, numeric=("f0", "category"), categorical=())
    v2 = register(project.models, project.root, seed=2)
    project.models.verify_artifacts = False  # let an alias reach a version whose inputs do not fit (see above)
    project.models.set_alias(MODEL, "champion", broken, expected=None, reason="first")
    project.models.set_alias(MODEL, "canary", v2, expected=None, reason="test canary")
    rollouts.start_rollout(project.registry, MODEL, champion_version=broken, canary_version=v2, fraction=0.5,
                           settings={}, salt="s1")
    users = list(range(USERS))
    with ServingLogger(project.config.offline_dir) as logger:
        service = project.service(logger=logger)
        with pytest.raises(Exception):  # noqa: B017 - whatever the champion raised fails the request
            service.predict(rows(users, prefix="o"))
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    assert len(logged) == USERS  # every row the router assigned
    from quiver.serving.arms import NOT_RUN

    canary, champion = logged[logged["arm"] == "canary"], logged[logged["arm"] == "champion"]
    assert len(canary) > 0 and len(champion) > 0
    assert canary["error"].str.startswith(NOT_RUN).all() and canary["prediction"].isna().all()
    assert (champion["error"] != "").all() and not champion["error"].str.startswith(NOT_RUN).any()
    assert logged["call_id"].nunique() == 1
