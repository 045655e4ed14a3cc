"""Peer baselines: each follows its published rule over the core's eligible endpoints."""

from __future__ import annotations

import random

import pytest

from inferplane.core.types import (
    CallContext,
    EndpointInfo,
    EndpointState,
    EndpointView,
    EngineKind,
    PriorityClass,
)
from inferplane.sim.baselines import (
    POLICY_NAMES,
    CacheAware,
    PowerOfTwo,
    RoundRobin,
    make_policy,
)


def _view(
    name: str, in_flight: int = 0, state: EndpointState = EndpointState.READY
) -> EndpointView:
    info = EndpointInfo(name, f"http://{name}", EngineKind.VLLM, ("m",), "h100", 3.0, "r")
    return EndpointView(info, state, in_flight=in_flight)


def _call(keys: tuple[int, ...] = (), model: str = "m") -> CallContext:
    return CallContext("r", "t", model, PriorityClass.STANDARD, 0.0, 100, 10,
                       prompt_block_keys=keys)  # fmt: skip


def test_round_robin_cycles_over_eligible_endpoints() -> None:
    views = [_view("a"), _view("b", state=EndpointState.COLD), _view("c")]
    rr, rng = RoundRobin(), random.Random(0)
    picks = [rr.route(_call(), views, 0.0, rng).primary for _ in range(4)]
    assert picks == ["a", "c", "a", "c"]


def test_power_of_two_prefers_the_less_loaded_of_its_pair() -> None:
    views = [_view("busy", 10), _view("idle", 0)]
    p2, rng = PowerOfTwo(), random.Random(0)
    assert {p2.route(_call(), views, 0.0, rng).primary for _ in range(20)} == {"idle"}


def test_cache_aware_follows_the_prefix_unless_load_is_imbalanced() -> None:
    ca, rng = CacheAware(), random.Random(0)
    prefix = tuple(range(10))
    views = [_view("a"), _view("b")]
    first = ca.route(_call(prefix), views, 0.0, rng).primary
    other = "b" if first == "a" else "a"
    loaded = [_view(first, 5), _view(other, 0)]
    assert ca.route(_call((*prefix[:8], 99, 98)), loaded, 0.0, rng).primary == first
    assert ca.route(_call((1000, 1001)), loaded, 0.0, rng).primary == other  # no match
    imbalanced = [_view(first, 200), _view(other, 10)]
    assert ca.route(_call(prefix), imbalanced, 0.0, rng).primary == other


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_ranks_only_eligible_endpoints(name: str) -> None:
    policy, rng = make_policy(name), random.Random(1)
    views = [_view("a", 1), _view("down", state=EndpointState.COLD), _view("c", 2)]
    decision = policy.route(_call(), views, 0.0, rng)
    assert set(decision.names()) == {"a", "c"}
    assert policy.route(_call(model="other"), views, 0.0, rng).primary is None
    with pytest.raises(ValueError):
        make_policy("nope")
