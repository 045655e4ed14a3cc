"""Fleet-wide demand: every gateway process sizes from the calls of all of them (summed in the
real Redis on 127.0.0.1:6379), falls back on its own when Redis is away, and the loop logs
and counts a tick that raises instead of swallowing it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from inferplane.config import parse_config
from inferplane.core.autoscaler import ScaleDecision
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.autoscale import (
    CONTROLLER_KEY,
    AutoscaleConfig,
    AutoscaleController,
    PoolScaleConfig,
)
from inferplane.gateway.autoscale_demand import PoolCounts, SharedDemand
from tests.state.conftest import SHARED_URL, free_port, require_redis

MODEL = "llama-3-8b"
CONFIG = AutoscaleConfig(enabled=True, pools=(PoolScaleConfig(model=MODEL, gpus=("h100",)),))


@pytest.fixture
async def shared() -> AsyncIterator[Callable[..., SharedDemand]]:
    """SharedDemand makers on one fresh key prefix of the shared Redis."""
    require_redis()
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    made: list[SharedDemand] = []

    def make(**kw: float) -> SharedDemand:
        made.append(SharedDemand(SHARED_URL, prefix=prefix, op_timeout_s=2.0, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for s in made:
        await s._conn.execute("DEL", f"{prefix}autoscale:{MODEL}:live")
        await s._conn.execute("DEL", f"{prefix}autoscale:{MODEL}:retired")
        await s.close()


def _gateway_process(shared: SharedDemand | None) -> tuple[AutoscaleController, Counter]:
    """One gateway process's controller over its own registry (its own share of the calls)."""
    registry = CollectorRegistry()
    requests = Counter(
        "inferplane_requests", "r", ("model", "priority", "status"), registry=registry
    )
    tokens = Counter("inferplane_tokens", "t", ("model", "kind"), registry=registry)
    tokens.labels(MODEL, "prompt").inc(0)
    ctl = AutoscaleController(CONFIG, registry, lambda now: [], [], shared=shared)
    return ctl, requests


def _serve(requests: Counter, calls: int, status: str = "200") -> None:
    requests.labels(MODEL, "standard", status).inc(calls)


async def test_every_process_sizes_from_the_calls_of_all(
    shared: Callable[..., SharedDemand],
) -> None:
    a, a_requests = _gateway_process(shared())
    b, b_requests = _gateway_process(shared())
    for ctl in (a, b):  # the baseline of the window
        await ctl.refresh(0.0)
        ctl.sense(0.0)
    _serve(a_requests, 10)
    _serve(b_requests, 30)
    _serve(b_requests, 5, "429")
    await a.refresh(15.0)
    await b.refresh(15.0)
    assert a.sense(15.0, restart=False)[0].requests == 10  # b had not published yet
    await a.refresh(15.0)  # the loop refreshes every watch (1 s): b's share has come
    (sa,), (sb,) = a.sense(15.0), b.sense(15.0)
    assert a.demand_scope == b.demand_scope == "fleet"
    assert sa.requests == sb.requests == 45  # not 10 and 35: each its own share
    assert sa.slo_attainment == sb.slo_attainment == 40 / 45


async def test_a_local_process_counts_only_its_own_share() -> None:
    ctl, requests = _gateway_process(None)
    ctl.sense(0.0)
    _serve(requests, 10)
    await ctl.refresh(15.0)  # nothing to exchange
    (signal,) = ctl.sense(15.0)
    assert ctl.demand_scope == "local" and signal.requests == 10


async def test_exchange_is_idempotent_and_a_retired_process_still_counts(
    shared: Callable[..., SharedDemand],
) -> None:
    gone, live = shared(ttl_s=0.0), shared()  # ttl 0: retired by the next exchange
    assert (await gone.exchange({MODEL: PoolCounts(100.0, 4.0, 5.0, 3.0)}))[MODEL] == (
        PoolCounts(100.0, 4.0, 5.0, 0.0)  # retired at once: its calls count, in flight not
    )
    counts = PoolCounts(50.0, 2.0, 2.0, 7.0)
    first = await live.exchange({MODEL: counts})
    again = await live.exchange({MODEL: counts})  # a retry counts nothing twice
    assert first == again == {MODEL: PoolCounts(150.0, 6.0, 7.0, 7.0)}


async def test_redis_away_falls_back_on_local_calls_and_back(
    shared: Callable[..., SharedDemand],
) -> None:
    dead = SharedDemand(f"redis://127.0.0.1:{free_port()}/0", op_timeout_s=0.5)
    ctl, requests = _gateway_process(dead)
    await ctl.refresh(0.0)
    ctl.sense(0.0)
    _serve(requests, 10)
    await ctl.refresh(15.0)
    (signal,) = ctl.sense(15.0)
    assert ctl.demand_scope == "local" and signal.requests == 10
    other = shared()  # another process published its calls meanwhile
    await other.exchange({MODEL: PoolCounts(1e4, 100.0, 100.0, 0.0)})
    ctl.shared = shared()  # Redis is back: the fleet's counts, from a fresh baseline
    await ctl.refresh(30.0)
    (switch,) = ctl.sense(30.0)
    assert ctl.demand_scope == "fleet" and switch.requests == 0
    _serve(requests, 3)
    await ctl.refresh(45.0)
    (after,) = ctl.sense(45.0)
    assert after.requests == 3
    await dead.close()


class _Broken:
    async def apply(self, decision: ScaleDecision) -> None:
        raise RuntimeError("actuator down")


async def test_a_failing_tick_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(
        {
            "gateway": {"log_requests": False},
            "endpoints": [
                {"name": "e0", "url": f"http://127.0.0.1:{free_port()}", "models": [MODEL],
                 "gpu": "h100", "price_per_hour_usd": 3.0}
            ],
            "autoscale": {"enabled": True, "tick_s": 0.05,
                          "pools": [{"model": MODEL, "gpus": ["h100"]}]},
        }
    )  # fmt: skip
    app = Gateway(config).build_app()
    runner, port = await start_server(app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        ctl = app[CONTROLLER_KEY]["ctl"]
        ctl._actuators = [_Broken()]
        with caplog.at_level(logging.ERROR, "inferplane.gateway.autoscale"):
            for _ in range(200):
                if ctl.tick_errors >= 1:
                    break
                await asyncio.sleep(0.05)
        assert ctl.tick_errors >= 1
        failed = [r for r in caplog.records if r.getMessage() == "autoscale tick failed"]
        assert failed and failed[0].exc_info and "actuator down" in str(failed[0].exc_info[1])
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/autoscale") as r:
                body = orjson.loads(await r.read())
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
        assert body["tick_errors"] >= 1 and body["demand"] == "local"
        assert "inferplane_autoscale_errors_total" in metrics
    finally:
        await runner.cleanup()
