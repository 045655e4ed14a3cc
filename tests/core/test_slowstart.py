"""Slow start: weights per state (table), the ramp's bounds and shape, routing agreement."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferplane.core.routing_config import RoutingConfig
from inferplane.core.scorers import slow_start_weight
from inferplane.core.slowstart import SlowStartConfig, ramp_weight, traffic_weight, weight_of
from inferplane.core.types import EndpointState
from tests.core.routing_helpers import view

CFG = SlowStartConfig(window_s=30.0, aggression=1.0, min_weight=0.1)


@pytest.mark.parametrize(
    ("state", "since_s", "weight", "done"),
    [
        (EndpointState.COLD, 100.0, 0.0, False),
        (EndpointState.DRAINING, 0.0, 0.0, False),
        (EndpointState.EJECTED, 5.0, 0.0, False),
        (EndpointState.READY, 0.0, 1.0, True),
        (EndpointState.WARMING, 0.0, 0.1, False),  # the floor
        (EndpointState.WARMING, 1.5, 0.1, False),  # 5% of the window, still the floor
        (EndpointState.WARMING, 15.0, 0.5, False),  # linear at aggression 1
        (EndpointState.WARMING, 30.0, 1.0, True),
        (EndpointState.WARMING, 300.0, 1.0, True),
    ],
)
def test_weight_per_state(state: EndpointState, since_s: float, weight: float, done: bool) -> None:
    got = traffic_weight(state, since_s, CFG)
    assert got.weight == pytest.approx(weight)
    assert got.ramp_done is done
    assert state.value in got.reason or state is EndpointState.WARMING


def test_aggression_bends_the_ramp() -> None:
    fast = SlowStartConfig(window_s=100.0, aggression=2.0, min_weight=0.0)
    assert ramp_weight(25.0, fast) == pytest.approx(math.sqrt(0.25))
    slow = SlowStartConfig(window_s=100.0, aggression=0.5, min_weight=0.0)
    assert ramp_weight(50.0, slow) == pytest.approx(0.25)


def test_weight_of_a_view_is_timed_from_its_state_change() -> None:
    v = view("a", state=EndpointState.WARMING, since_s=100.0)
    assert weight_of(v, 110.0, CFG).weight == pytest.approx(10.0 / 30.0)
    assert weight_of(v, 90.0, CFG).weight == pytest.approx(0.1)  # clock skew: floor, not < 0


@pytest.mark.parametrize(
    "kwargs", [{"window_s": 0.0}, {"aggression": 0.0}, {"min_weight": 1.5}, {"min_weight": -0.1}]
)
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SlowStartConfig(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    a=st.floats(0, 1000),
    b=st.floats(0, 1000),
    window=st.floats(0.1, 500),
    aggression=st.floats(0.1, 10),
    floor=st.floats(0, 1),
)
def test_ramp_is_bounded_and_monotone(
    a: float, b: float, window: float, aggression: float, floor: float
) -> None:
    cfg = SlowStartConfig(window_s=window, aggression=aggression, min_weight=floor)
    lo, hi = sorted((a, b))
    assert floor <= ramp_weight(lo, cfg) <= ramp_weight(hi, cfg) <= 1.0


@pytest.mark.parametrize("since_s", [0.0, 3.0, 12.0, 29.0, 45.0])
def test_agrees_with_the_routing_scorer(since_s: float) -> None:
    rc = RoutingConfig()
    cfg = SlowStartConfig(
        rc.slow_start_window_s, rc.slow_start_aggression, rc.slow_start_min_weight
    )
    assert ramp_weight(since_s, cfg) == pytest.approx(slow_start_weight(since_s, rc))
