"""The autoscaler's live body: real gateway, real emulated engines with real cold starts.

The loop is ticked by hand (no background timer) with a pool policy sized so a few calls
are "a lot": the test can then watch a scale-up start a cold engine that only serves once
loaded, the desired-replicas metric, and a scale-down that drains and stops an engine.
"""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from inferplane.config import parse_config
from inferplane.core.autoscale_knowledge import as_json, knowledge
from inferplane.core.autoscaler import Autoscaler, GpuOption, PoolPolicy, ScaleAction
from inferplane.core.types import EndpointState
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.autoscale import (
    CONTROLLER_KEY,
    AutoscaleConfig,
    EmbeddedFleet,
    PoolScaleConfig,
    setup_autoscaling,
)
from tests.gateway.fakes import until

MODEL = "llama-3.2-1b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _get(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.read()


def test_config_defaults_off_and_builds_policies_from_profiles() -> None:
    assert AutoscaleConfig().enabled is False
    cfg = AutoscaleConfig(
        enabled=True, time_scale=0.1, pools=(PoolScaleConfig(model=MODEL, gpus=("h100", "a100")),)
    )
    (policy,) = cfg.policies()
    h100, a100 = policy.options
    assert h100.tokens_per_s > a100.tokens_per_s > 0  # the faster GPU serves more
    assert 0 < h100.cold_start_s < 5  # scaled by the time scale (0.1: 10x faster)


@pytest.mark.slow
async def test_embedded_fleet_scales_up_cold_and_drains_down() -> None:
    slots = EmbeddedFleet.plan(MODEL, "h100", 2, time_scale=0.05, prefix="as")
    holder: dict[str, EmbeddedFleet] = {}
    fleet = EmbeddedFleet(
        slots,
        lambda n, st: holder["gw"].tracker.set_state(n, st),  # type: ignore[attr-defined]
        lambda n: holder["gw"].tracker.in_flight(n),  # type: ignore[attr-defined]
    )
    config = parse_config(
        {
            "gateway": {"scrape_interval_s": 0.05, "health_interval_s": 0.1, "log_requests": False},
            "endpoints": [fleet.endpoint_config(s) for s in slots],
        }
    )
    await fleet.start_slot("as-0", cold=False)
    gateway = Gateway(config)
    holder["gw"] = gateway  # type: ignore[assignment]
    app = gateway.build_app()
    scale = AutoscaleConfig(
        enabled=True, tick_s=3600.0, pools=(PoolScaleConfig(model=MODEL, gpus=("h100",)),)
    )
    setup_autoscaling(app, gateway, scale, fleet)
    runner, port = await start_server(app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        ctl = app[CONTROLLER_KEY]["ctl"]
        # A tiny replica (20 tok/s) so that a few calls ask for a second one; no stabilisation
        # window, a 5 s cooldown after a scale-up (loop time, as the ticks are given).
        option = GpuOption("h100", 3.0, tokens_per_s=20.0, cold_start_s=1.0)
        ctl.autoscaler = Autoscaler(
            [PoolPolicy(MODEL, (option,), 1, 2, scale_down_window_s=0.0,
                        scale_down_cooldown_s=5.0, tick_s=1.0)]
        )  # fmt: skip
        await until(lambda: gateway.tracker.state("as-0") is EndpointState.READY)
        await until(lambda: gateway.tracker.state("as-1") is EndpointState.COLD)
        now = gateway.clock()
        await ctl.tick(now)  # baseline of the counters
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200
        await ctl.tick(now + 1.0)
        (up,) = ctl.decisions
        assert up.action is ScaleAction.UP and up.desired == {"h100": 2}
        # The new engine was started cold: it answers but does not serve until loaded.
        assert "as-1" in fleet.servers
        status, _ = await _get(f"http://127.0.0.1:{slots[1].config.port}/health")
        assert status == 503
        _, metrics = await _get(url + "/metrics")
        assert f'inferplane_desired_replicas{{pool="{MODEL}"}} 2.0'.encode() in metrics
        # While it loads, the loop counts it as starting and does not ask again.
        await ctl.tick(now + 2.0)
        assert ctl.decisions[0].current == {"h100": 2}
        assert ctl.decisions[0].action is ScaleAction.HOLD
        await until(lambda: gateway.tracker.state("as-1") is EndpointState.READY, 20.0)
        # No traffic: scale down to the minimum by draining one engine, then stopping it.
        await ctl.tick(now + 10.0)
        (down,) = ctl.decisions
        assert down.action is ScaleAction.DOWN and down.desired_total == 1
        await until(lambda: len(fleet.servers) == 1 and not fleet.draining)
        stopped = ({"as-0", "as-1"} - set(fleet.servers)).pop()
        assert gateway.tracker.state(stopped) is EndpointState.COLD
        status, body = await _get(url + "/v1/autoscale")
        assert status == 200 and orjson.loads(body)["decisions"][0]["action"] == "down"
        learned = orjson.loads(body)["learned"]  # what the loop learned, as it would keep it
        assert learned == as_json(knowledge(ctl.state, ctl.autoscaler.policies))
        assert learned[MODEL]["replica_tokens_per_s"] > 0
    finally:
        await runner.cleanup()
    assert not fleet.servers  # cleanup stopped the engines it ran
