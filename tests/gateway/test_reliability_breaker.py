"""Breakers and the retry budget in the gateway: ejection, flapping, storms, stats."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from inferplane.config import parse_config
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.retry import FailureKind
from inferplane.core.types import EndpointLoad, EndpointState
from inferplane.gateway.reliability import AttemptTiming, Reliability
from inferplane.gateway.reliability_config import BreakerSection, ReliabilityConfig
from inferplane.gateway.tracker import EndpointTracker
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reliability(num: int, **breaker: Any) -> tuple[Reliability, EndpointTracker, _Clock]:
    cfg = parse_config(
        {
            "endpoints": [
                {
                    "name": f"e{i}",
                    "url": f"http://127.0.0.1:{9 + i}",
                    "models": ["m"],
                    "gpu": "h100",
                    "price_per_hour_usd": 3.0,
                }
                for i in range(num)
            ]
        }
    )
    clock = _Clock()
    tracker = EndpointTracker(cfg.endpoints, cfg.gateway, clock)
    for name in tracker.names():
        tracker.set_state(name, EndpointState.READY)
    section = BreakerSection(max_ejected_share=0.5, **breaker)
    return Reliability(ReliabilityConfig(breaker=section), tracker, clock), tracker, clock


def _fail(rel: Reliability, name: str, clock: _Clock, times: int) -> None:
    for _ in range(times):
        rel.record(name, FailureKind.SERVER_ERROR, AttemptTiming(), clock.now)


def test_flapping_endpoint_is_ejected_for_longer_each_time() -> None:
    rel, tracker, clock = _reliability(4, base_ejection_s=10.0, sweep_interval_s=0.5)
    durations = []
    for _ in range(3):
        _fail(rel, "e0", clock, 5)
        assert tracker.state("e0") is EndpointState.EJECTED
        assert [v.name for v in tracker.views(clock.now) if v.state.accepts_work] == [
            "e1", "e2", "e3",
        ]  # fmt: skip
        ejected_at = clock.now
        while tracker.state("e0") is EndpointState.EJECTED:
            clock.now += 0.5
            tracker.views(clock.now)  # routing reads views: that sweeps the breakers
        durations.append(clock.now - ejected_at)
        assert rel.breaker_state("e0") == "half_open"
        # The probe fails at once: the endpoint flaps.
        rel.dispatch("e0")
        _fail(rel, "e0", clock, 1)
        assert tracker.state("e0") is EndpointState.EJECTED
        while tracker.state("e0") is EndpointState.EJECTED:
            clock.now += 0.5
            tracker.views(clock.now)
        for _ in range(3):  # probes pass: closed again
            rel.dispatch("e0")
            rel.record("e0", None, AttemptTiming(), clock.now)
        assert rel.breaker_state("e0") == "closed"
    assert durations[0] < durations[1] < durations[2]
    stats = {s["name"]: s for s in tracker.stats(clock.now)}
    assert stats["e0"]["breaker"] == "closed" and stats["e1"]["breaker"] == "closed"


def test_latency_outlier_is_ejected_against_its_predictions() -> None:
    rel, tracker, clock = _reliability(4, latency_min_samples=3, sweep_interval_s=1.0)
    for _ in range(6):
        clock.now += 0.1
        for name in ("e0", "e1", "e2", "e3"):
            ttft = 1.0 if name == "e3" else 0.2  # e3 is 5x slower than predicted
            rel.record(name, None, AttemptTiming(ttft, 0.2, 0.02, 0.02), clock.now)
    clock.now += 1.0
    views = {v.name: v.state for v in tracker.views(clock.now)}
    assert views["e3"] is EndpointState.EJECTED
    assert all(views[n] is EndpointState.READY for n in ("e0", "e1", "e2"))
    assert rel.counts["breaker_latency_outlier"] == 1


def test_a_queued_attempts_ttft_is_unjudged_until_a_call_has_finished() -> None:
    """``expected`` on a KV-bound engine (3 calls queued): before any call has finished the
    wait behind its queue is unknown, so the TTFT is None (not judged), never the bare TTFT;
    after one, the TTFT includes that wait."""
    rel, tracker, clock = _reliability(4)
    predictor = rel.predictor = LatencyPredictor()
    plain = tracker.view("e0", clock.now)
    tracker.observe_load("e0", EndpointLoad(3, 4, 0.95, clock.now))
    queued = tracker.view("e0", clock.now)
    assert queued.load.num_waiting == 3
    ttft_s, tpot_s = rel.expected("e0", "m", 100, clock.now)
    assert ttft_s is None and tpot_s > 0
    assert rel.counts["queued_dispatches_unjudged"] == 1
    est = predictor.predict(plain, "m", 100, clock.now)  # one call runs on an idle engine
    predictor.on_dispatch("c", "e1", 100, est)
    predictor.on_first_token("c", 0.02, clock.now)
    predictor.on_finish("c", clock.now + 20 * est.raw_tpot_s)
    ttft_s, tpot_s = rel.expected("e0", "m", 100, clock.now)
    bare = predictor.predict(queued, "m", 100, clock.now).raw_ttft_s
    assert ttft_s is not None and ttft_s > bare + (3 + 1) * 19 * tpot_s / 4


async def test_error_burst_ejects_the_endpoint_and_traffic_moves() -> None:
    async with fake_engines(3) as engines:
        config = fleet_config(engines, retries_before_first_byte=2)
        async with running_gateway(config) as (gw, url), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                bad_name = resp.headers["X-Inferplane-Endpoint"]  # routing's favourite
            bad = next(e for e in engines if e.name == bad_name)
            bad.mode = "error500"
            for _ in range(40):
                async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200  # retried on a healthy engine
                if gw.tracker.state(bad_name) is EndpointState.EJECTED:
                    break
            assert gw.tracker.state(bad_name) is EndpointState.EJECTED
            seen = len(bad.bodies)
            for _ in range(10):
                async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Inferplane-Endpoint"] != bad_name
            assert len(bad.bodies) == seen  # no traffic to the ejected engine
            async with s.get(url + "/v1/stats") as resp:
                stats = {e["name"]: e for e in (await resp.json())["endpoints"]}
            assert stats[bad_name]["breaker"] == "open"
            assert stats[bad_name]["state"] == "ejected"
            good = [e.name for e in engines if e is not bad]
            assert all(stats[name]["breaker"] == "closed" for name in good)
            assert any(stats[name]["recent_ttft_ms"] is not None for name in good)


async def test_retry_budget_caps_retries_in_a_failure_storm() -> None:
    async with fake_engines(4) as engines:
        hits = [0]
        for engine in engines:
            engine.mode = "error500"
        config = fleet_config(engines, retries_before_first_byte=3)
        async with running_gateway(config) as (gw, url), aiohttp.ClientSession() as s:
            gw.proxy.reliability.board = _never_ejecting(gw.proxy.reliability)

            async def one() -> int:
                async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                    await resp.read()
                    hits[0] += 1
                    return resp.status

            statuses = await asyncio.gather(*(one() for _ in range(60)))
        assert all(status >= 500 for status in statuses)
        attempts = sum(len(e.bodies) for e in engines)
        counts = gw.proxy.reliability.counts
        # Up to 3 attempts each would be 180; the budget allows far fewer retries.
        assert counts["retry_budget_exhausted"] > 0
        assert attempts == 60 + counts["retry_replay"]
        assert attempts < 120


def _never_ejecting(rel: Reliability) -> Any:
    from inferplane.core.breaker import BreakerBoard, BreakerConfig

    board = BreakerBoard(BreakerConfig(consecutive_failures=10_000, min_requests=10_000))
    for name in ("e0", "e1", "e2", "e3"):
        board.register(name, "m")
    return board
