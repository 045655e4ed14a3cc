"""Admission in the live gateway: refusals carry Retry-After and the reason, queued calls are
dispatched when capacity frees (late binding), quotas name themselves, nothing is lost."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from inferplane.config import FleetConfig, hash_api_key
from inferplane.core.admission_config import AdmissionConfig, QueueConfig, QuotaLimits, QuotasConfig
from inferplane.core.routing_config import EndpointPrior, PredictorConfig, RoutingConfig
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _one_slot(config: FleetConfig, **admission: Any) -> FleetConfig:
    """Each engine runs one call at a time as the gateway sees it; the rest queue here."""
    predictor = PredictorConfig(default_prior=EndpointPrior(max_num_seqs=1))
    adm = AdmissionConfig(engine_queue_allowance=0, **admission)
    return config.model_copy(
        update={"routing": RoutingConfig(predictor=predictor), "admission": adm}
    )


async def _stats(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/v1/stats") as r:
        body: dict[str, Any] = orjson.loads(await r.read())
        return body


async def _post(s: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any, bytes]:
    async with s.post(url + "/v1/chat/completions", json=CHAT, **kw) as r:
        return r.status, r.headers, await r.read()


async def test_queued_calls_are_dispatched_as_capacity_frees() -> None:
    async with (
        fake_engines(1, token_delay_s=0.02) as engines,
        running_gateway(_one_slot(fleet_config(engines))) as (_gw, url),
        aiohttp.ClientSession() as s,
    ):
        results = await asyncio.gather(*(_post(s, url) for _ in range(5)))
        stats = (await _stats(s, url))["admission"]
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    assert [status for status, _, _ in results] == [200] * 5
    assert engines[0].completed == 5
    queued = sum(stats["queued"].values())
    assert queued >= 3  # one slot: most of the burst waited in the gateway
    assert stats["exits"]["standard"]["dispatched"] == queued
    assert stats["queue_depth"]["standard"] == 0 and stats["waiting"] == 0
    assert 'inferplane_admission_decisions_total{decision="queued"' in text
    assert 'inferplane_admission_queue_seconds_count{exit="dispatched",priority="standard"}' in text


async def test_burst_over_a_small_queue_loses_nothing_and_refusals_say_why() -> None:
    n = 12
    async with fake_engines(1, token_delay_s=0.02) as engines:
        config = _one_slot(fleet_config(engines), queue=QueueConfig(max_items=2))
        async with running_gateway(config) as (_gw, url), aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(_post(s, url) for _ in range(n)))
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert len(ok) + len(refused) == n and refused and len(ok) >= 3
    assert engines[0].completed == len(ok)
    for status, headers, body in refused:
        assert status == 429
        assert headers["X-Inferplane-Reason"] == "queue_full"
        assert int(headers["Retry-After"]) >= 1
        assert orjson.loads(body)["error"]["code"] == "queue_full"


async def test_key_quota_refusal_names_the_quota() -> None:
    async with fake_engines(1) as engines:
        base = fleet_config(engines)
        auth = {"keys": [{"key_sha256": hash_api_key("sk-ci"), "tenant": "t", "name": "ci"}]}
        gateway = base.gateway.model_copy(
            update={"auth": type(base.gateway.auth).model_validate(auth)}
        )
        quotas = QuotasConfig(keys={"ci": QuotaLimits(requests_per_min=2)})
        config = base.model_copy(
            update={"gateway": gateway, "admission": AdmissionConfig(quotas=quotas)}
        )
        async with running_gateway(config) as (_gw, url), aiohttp.ClientSession() as s:
            hdrs = {"Authorization": "Bearer sk-ci"}
            results = [await _post(s, url, headers=hdrs) for _ in range(3)]
    assert [r[0] for r in results] == [200, 200, 429]
    _, headers, body = results[2]
    assert headers["X-Inferplane-Reason"] == "quota_requests_per_min"
    assert 1 <= int(headers["Retry-After"]) <= 60
    error = orjson.loads(body)["error"]
    assert error["code"] == "quota_requests_per_min" and "key 'ci'" in error["message"]


async def test_client_leaving_the_queue_frees_its_place() -> None:
    async with (
        fake_engines(1, token_delay_s=0.05) as engines,
        running_gateway(_one_slot(fleet_config(engines))) as (gw, url),
        aiohttp.ClientSession() as s,
    ):
        first = asyncio.ensure_future(_post(s, url))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(_post(s, url))
        for _ in range(100):
            if gw.gate.core.queue:
                break
            await asyncio.sleep(0.01)
        assert len(gw.gate.core.queue) == 1
        waiting.cancel()
        await asyncio.sleep(0.1)
        assert (await first)[0] == 200
        stats = (await _stats(s, url))["admission"]
    assert stats["exits"]["standard"].get("cancelled") == 1
    assert stats["queue_depth"]["standard"] == 0
    assert engines[0].completed == 1


async def test_finished_calls_teach_admission_their_output_length() -> None:
    """Each call the gateway relays ends with its completion tokens in admission's output
    lengths: 5-token answers under a 256-token prior pull the model's estimate down."""
    async with (
        fake_engines(1) as engines,
        running_gateway(fleet_config(engines)) as (gw, url),
        aiohttp.ClientSession() as s,
    ):
        outputs = gw.gate.core.outputs
        assert outputs.natural_mean("m") == 256
        for _ in range(8):
            status, _, _ = await _post(s, url)
            assert status == 200
        assert engines[0].completed == 8
    # 4 pseudo-calls at 256 and 8 calls of 5 tokens (no max_tokens: none cut), decayed
    assert 80 < outputs.natural_mean("m") < 100
