"""The fleet launcher: many engines in one process, async and threaded, clean shutdown."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import aiohttp
import pytest

from inferplane.config import EndpointConfig
from inferplane.engine.fleet import EngineSpec, Fleet, FleetThread, engine_configs
from inferplane.engine.kv_publisher import KVEncoding


def test_specs_expand_to_named_engines_with_port_offsets() -> None:
    specs = [
        EngineSpec(count=2, port=9100, kv_events=True, kv_events_port=5600, kv_replay_port=5700),
        EngineSpec(model="llama-3-70b", gpu="h200", tensor_parallel=4, name_prefix="big"),
    ]
    expanded = engine_configs(specs)
    assert [name for name, _, _ in expanded] == ["llama-3-8b-h100-0", "llama-3-8b-h100-1", "big-0"]
    assert [c.port for _, _, c in expanded] == [9100, 9101, 0]
    assert [c.kv_events_port for _, _, c in expanded][:2] == [5600, 5601]
    assert [c.seed for _, _, c in expanded] == [0, 1, 2]
    with pytest.raises(ValueError, match="unique"):
        engine_configs([EngineSpec(name_prefix="x"), EngineSpec(name_prefix="x")])
    with pytest.raises(ValueError):
        EngineSpec(count=0)


async def test_async_fleet_serves_every_engine_on_its_own_port() -> None:
    specs = [
        EngineSpec(count=2, time_scale=0.05, kv_events=True, kv_encoding=KVEncoding.MAP),
        EngineSpec(gpu="a100", time_scale=0.05, price_per_hour_usd=1.5),
    ]
    tasks_before = len(asyncio.all_tasks())
    async with Fleet(specs) as fleet:
        assert len({e.port for e in fleet.engines}) == 3
        async with aiohttp.ClientSession() as session:
            for url in fleet.urls:
                async with session.get(url + "/health") as resp:
                    assert resp.status == 200
        configs = [EndpointConfig.model_validate(e.endpoint_config()) for e in fleet.engines]
        assert configs[0].kv_events is not None and configs[2].kv_events is None
        assert configs[2].price_per_hour_usd == 1.5 and configs[2].gpu == "a100"
        assert configs[0].price_per_hour_usd > 0
        topic = fleet.engines[0].topic
        assert topic == f"kv@127.0.0.1:{fleet.engines[0].port}@llama-3-8b"
    assert fleet.engines == []
    assert len(asyncio.all_tasks()) == tasks_before


def test_fleet_thread_serves_sync_callers_and_stops_cleanly() -> None:
    threads_before = threading.active_count()
    with FleetThread([EngineSpec(count=2, time_scale=0.05)]) as fleet:
        for url in fleet.urls:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                assert resp.status == 200
        in_flight = fleet.call(lambda: [e.server.driver.num_in_flight for e in fleet.engines])
        assert in_flight == [0, 0]
        urls = fleet.urls
    assert threading.active_count() == threads_before
    with pytest.raises(OSError):
        urllib.request.urlopen(urls[0] + "/health", timeout=2)


def test_a_failing_engine_stops_the_ones_already_started() -> None:
    with pytest.raises((KeyError, ValueError)):
        FleetThread([EngineSpec(), EngineSpec(model="no-such-model", name_prefix="bad")]).start()


def test_engine_cli_flags_map_to_the_engine_config() -> None:
    from inferplane.cli import build_parser
    from inferplane.engine.cli import _config

    args = build_parser().parse_args(
        ["engine", "--model", "llama-3-70b", "--gpu", "h200", "--tp", "2", "--port", "0",
         "--time-scale", "10", "--kv-events-port", "0", "--kv-encoding", "map",
         "--cold-start", "--crash-after-tokens", "7", "--error-rate", "0.25"]
    )  # fmt: skip
    config = _config(args)
    assert (config.model, config.gpu, config.tensor_parallel) == ("llama-3-70b", "h200", 2)
    assert config.time_scale == 10 and config.cold_start and config.kv_events
    assert config.kv_encoding is KVEncoding.MAP and config.kv_replay_port is None
    assert config.faults.crash_after_tokens == 7 and config.faults.error_rate == 0.25
    with pytest.raises(ValueError):
        _config(build_parser().parse_args(["engine", "--error-rate", "2"]))
