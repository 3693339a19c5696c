"""The defaults a decision's settings are compared with (the console's decision page and `quiver decisions
show` alike): the canary judge's for canary steps and watches, the shadow verdict's for shadow verdicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from quiver.registry import explain
from quiver.registry.rollouts import Decision


def default_settings(kind: str) -> dict[str, Any]:
    """The settings a decision of `kind` is judged on when nobody changes them."""
    if kind == "shadow_evaluation":
        from quiver.monitoring.evaluation import ShadowSettings

        return asdict(ShadowSettings())
    from quiver.monitoring.canary_settings import JudgeSettings

    return dict(JudgeSettings().to_dict())


def settings_changes(decision: Decision, rollout_settings: Mapping[str, Any] | None) -> list[explain.SettingChange]:
    """The settings `decision` was judged on (its rollout's, the floors it recorded) that are not the defaults."""
    used = explain.judged_settings(decision, rollout_settings)
    return explain.non_default_settings(used, default_settings(decision.kind))
