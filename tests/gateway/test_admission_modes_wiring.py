"""The gateway runs the admission baseline its config names (``admission.mode``) with no
change of its own: FCFS lets a burst through that the full rule queues or refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from inferplane.core.admission_config import AdmissionMode, QueueConfig
from tests.gateway.fakes import fake_engines, fleet_config, running_gateway
from tests.gateway.test_admission_wiring import _one_slot, _post, _stats


async def _burst(mode: AdmissionMode, n: int) -> tuple[list[int], dict[str, Any], int]:
    async with fake_engines(1, token_delay_s=0.02) as engines:
        config = _one_slot(fleet_config(engines), mode=mode, queue=QueueConfig(max_items=1))
        async with running_gateway(config) as (_gw, url), aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(_post(s, url) for _ in range(n)))
            stats = (await _stats(s, url))["admission"]
        return [status for status, _, _ in results], stats, engines[0].completed


async def test_fcfs_mode_admits_a_burst_the_full_rule_refuses() -> None:
    statuses, stats, completed = await _burst(AdmissionMode.FCFS, 8)
    assert statuses == [200] * 8 and completed == 8
    assert sum(stats["queued"].values()) == 0
    full, full_stats, _ = await _burst(AdmissionMode.INFERPLANE, 8)
    assert 429 in full  # one slot and a one-call queue: the same burst is partly refused
    assert sum(full_stats["rejected"]["standard"].values()) >= 1
