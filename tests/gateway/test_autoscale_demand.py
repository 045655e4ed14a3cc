"""The gateway's autoscale sensor: demand is calls that ended (refused too) at the mean work of a
served call, where work leaves out cached prompt tokens."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from inferplane.gateway.autoscale import AutoscaleConfig, AutoscaleController, PoolScaleConfig

MODEL = "llama-3-8b"


def _controller() -> tuple[AutoscaleController, Counter, Counter]:
    registry = CollectorRegistry()
    requests = Counter(
        "inferplane_requests", "r", ("model", "priority", "status"), registry=registry
    )
    tokens = Counter("inferplane_tokens", "t", ("model", "kind"), registry=registry)
    config = AutoscaleConfig(enabled=True, pools=(PoolScaleConfig(model=MODEL, gpus=("h100",)),))
    return AutoscaleController(config, registry, lambda now: [], []), requests, tokens


def _served(requests: Counter, tokens: Counter, calls: int, prompt: int, cached: int) -> None:
    for _ in range(calls):
        requests.labels(MODEL, "standard", "200").inc()
        tokens.labels(MODEL, "prompt").inc(prompt)
        tokens.labels(MODEL, "cached").inc(cached)
        tokens.labels(MODEL, "completion").inc(100)


def test_demand_counts_refused_calls_at_the_work_of_a_served_one() -> None:
    ctl, requests, tokens = _controller()
    ctl.sense(0.0)  # the counters' baseline
    _served(requests, tokens, calls=10, prompt=1000, cached=800)  # work 300 per call
    requests.labels(MODEL, "standard", "429").inc(5)  # refused: no tokens, still demand
    (signal,) = ctl.sense(10.0)
    assert signal.window_s == 10.0 and signal.requests == 15
    assert signal.tokens == 15 * 300
    assert signal.slo_attainment == 10 / 15
    # A quiet window: no demand, no attainment.
    (quiet,) = ctl.sense(20.0)
    assert quiet.tokens == 0 and quiet.slo_attainment is None
    # Later calls with no cache hits raise the mean work per call.
    _served(requests, tokens, calls=10, prompt=500, cached=0)  # work 600 per call
    (later,) = ctl.sense(30.0)
    assert later.tokens == 10 * (10 * 300 + 10 * 600) / 20


def test_a_surge_is_seen_in_the_window_so_far_without_consuming_it() -> None:
    ctl, requests, tokens = _controller()
    assert not ctl.surging(0.0)  # no window yet
    ctl.sense(0.0)
    for i in range(1, 9):  # a steady 3 calls/s, ticks every 15 s
        _served(requests, tokens, calls=45, prompt=1000, cached=0)
        (signal,) = ctl.sense(15.0 * i)
        _, ctl.state = ctl.autoscaler.decide([signal], ctl.state)
    _served(requests, tokens, calls=4, prompt=1000, cached=0)
    assert not ctl.surging(122.0)  # 2 s in: 6 expected, 4 came
    _served(requests, tokens, calls=40, prompt=1000, cached=0)
    assert ctl.surging(123.0)  # 3 s in: 9 expected, 44 came
    # Looking did not restart the window: the tick sees all 44 calls over 3 s.
    (signal,) = ctl.sense(123.0)
    assert signal.requests == 44 and signal.window_s == 3.0


def test_demand_counts_calls_that_started_not_only_those_that_ended() -> None:
    from prometheus_client import CollectorRegistry as Registry

    from inferplane.core.types import EndpointInfo, EndpointState, EndpointView, EngineKind

    registry = Registry()
    requests = Counter(
        "inferplane_requests", "r", ("model", "priority", "status"), registry=registry
    )
    tokens = Counter("inferplane_tokens", "t", ("model", "kind"), registry=registry)
    info = EndpointInfo("e0", "http://127.0.0.1:1", EngineKind.VLLM, (MODEL,), "h100", 2.0, "r")
    in_flight = [3]

    def views(now: float) -> list[EndpointView]:
        return [EndpointView(info, EndpointState.READY, in_flight=in_flight[0])]

    config = AutoscaleConfig(enabled=True, pools=(PoolScaleConfig(model=MODEL, gpus=("h100",)),))
    ctl = AutoscaleController(config, registry, views, [])
    ctl.sense(0.0)
    _served(requests, tokens, calls=4, prompt=1000, cached=0)  # 4 ended ...
    in_flight[0] = 9  # ... and 6 more are in flight than at the window's start
    (signal,) = ctl.sense(5.0)
    assert signal.requests == 10 and signal.tokens == 10 * 1100
    assert signal.serving == {"h100": 1}
    in_flight[0] = 1  # 8 of those ended, nothing new started
    _served(requests, tokens, calls=8, prompt=1000, cached=0)
    (quiet,) = ctl.sense(10.0)
    assert quiet.requests == 0


def test_policy_overrides_set_core_knobs_the_config_does_not_carry() -> None:
    registry = CollectorRegistry()
    config = AutoscaleConfig(enabled=True, pools=(PoolScaleConfig(model=MODEL, gpus=("h100",)),))
    plain = AutoscaleController(config, registry, lambda now: [], [])
    tuned = AutoscaleController(
        config, registry, lambda now: [], [], None, {"burst_prior": 4.0, "burst_memory_s": 90.0}
    )
    assert plain.autoscaler.policies[MODEL].burst_prior == 1.0
    policy = tuned.autoscaler.policies[MODEL]
    assert (policy.burst_prior, policy.burst_memory_s) == (4.0, 90.0)
    # The rest of the policy is the config's.
    assert policy.max_replicas == plain.autoscaler.policies[MODEL].max_replicas
