"""Canary routing: hash(salt, entity) < fraction sends the configured share of 10k entities, always the
same entities for one salt, a different set for another salt."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.serving.prediction import route_share


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5])
def test_fraction_within_tolerance_over_10k_keys_and_stable(fraction: float) -> None:
    keys = list(range(10_000))
    share = route_share("salt-1", keys)
    routed = share < fraction
    # Binomial(10k, f): 4 standard deviations is a tolerance a correct hash fails ~1 in 16,000 times.
    tolerance = 4 * np.sqrt(fraction * (1 - fraction) / len(keys))
    assert abs(routed.mean() - fraction) < tolerance
    again = route_share("salt-1", keys[::-1])[::-1]
    assert np.array_equal(share, again)  # the same entity always lands on the same side
    assert ((route_share("salt-1", ["7"]) < fraction) == routed[7]).all()  # "7" and 7 are one entity


def test_a_new_salt_reshuffles_and_steps_only_add_entities() -> None:
    keys = list(range(10_000))
    a, b = route_share("rollout-1", keys), route_share("rollout-2", keys)
    overlap = ((a < 0.25) & (b < 0.25)).mean()
    assert abs(overlap - 0.25 * 0.25) < 0.02  # independent across rollouts
    # Within a rollout, moving 5 % → 25 % keeps every canary entity on the canary.
    assert ((a < 0.05) <= (a < 0.25)).all()
    assert ((share := route_share("s", keys)) >= 0).all() and (share < 1).all()
