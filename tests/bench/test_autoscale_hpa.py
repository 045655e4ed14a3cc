"""The emulated bench's queue arm (``bench/autoscale_hpa.py``) is production-stack's KEDA rule:
desired replicas = ceil(waiting calls / 5), where waiting calls are the engines' scraped
``vllm:num_requests_waiting`` plus the calls queued at the gateway's gate. Calls an engine is
running (prefilling or decoding) are not waiting, however slow they are: the rule is blind to
an overload that shows as TTFT while the engine still admits every call into its batch. The
gateway and fleet here are stand-ins with the attributes the arm reads.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferplane.core.autoscaler import GpuOption, PoolPolicy, ScaleDecision
from inferplane.core.types import (
    EndpointInfo,
    EndpointLoad,
    EndpointState,
    EndpointView,
    EngineKind,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from autoscale_hpa import QueueHpa

POOL = "llama-3-8b"
H100 = GpuOption("h100", price_per_hour_usd=3.0, tokens_per_s=7_700.0, cold_start_s=46.0)


@dataclass
class _Tracker:
    loads: list[EndpointLoad]

    def views(self, now: float) -> list[EndpointView]:
        return [
            EndpointView(
                EndpointInfo(f"e{i}", "http://x", EngineKind.VLLM, (POOL,), "h100", 3.0, "local"),
                EndpointState.READY,
                load,
            )
            for i, load in enumerate(self.loads)
        ]


@dataclass
class _Gate:
    queued: int = 0

    def depth(self) -> dict[str, int]:
        return {"standard": self.queued}


@dataclass
class _Gateway:
    tracker: _Tracker
    gate: _Gate = field(default_factory=_Gate)
    now: float = 100.0

    def clock(self) -> float:
        return self.now


@dataclass
class _Fleet:
    serving: int = 1
    applied: list[ScaleDecision] = field(default_factory=list)

    def running(self, pool: str, gpu: str) -> list[str]:
        return [f"e{i}" for i in range(self.serving)]

    async def apply(self, decision: ScaleDecision) -> None:
        self.applied.append(decision)
        self.serving = decision.desired["h100"]


def _arm(loads: list[EndpointLoad], queued: int = 0) -> tuple[QueueHpa, _Fleet]:
    policy = PoolPolicy(pool=POOL, options=(H100,), min_replicas=1, max_replicas=6, tick_s=5.0)
    fleet = _Fleet(serving=len(loads))
    gateway: Any = _Gateway(_Tracker(loads), _Gate(queued))
    hpa = QueueHpa(gateway, fleet, policy, tick_s=5.0)  # type: ignore[arg-type]
    hpa.start = lambda: None  # type: ignore[method-assign]  # ticks are driven by the test
    return hpa, fleet


async def test_waiting_calls_at_the_engines_scale_the_pool_as_keda_would() -> None:
    hpa, fleet = _arm([EndpointLoad(num_waiting=12, num_running=30)])
    await hpa.tick()
    assert [d.desired for d in fleet.applied] == [{"h100": 3}]  # ceil(12 / 5)
    assert hpa.samples[-1]["engine_waiting"] == 12
    assert hpa.samples[-1]["engine_running"] == 30


async def test_running_calls_are_not_waiting_calls() -> None:
    # 60 calls in the engine's batch, 4 waiting: under the threshold, the rule holds 1
    # replica however long those calls take to their first token.
    hpa, fleet = _arm([EndpointLoad(num_waiting=4, num_running=60)])
    await hpa.tick()
    assert fleet.applied == []
    assert hpa.samples[-1]["waiting"] == 4
    assert hpa.samples[-1]["engine_running"] == 60


async def test_calls_queued_at_the_gate_count_as_waiting() -> None:
    hpa, fleet = _arm([EndpointLoad(num_waiting=2), EndpointLoad(num_waiting=3)], queued=6)
    await hpa.tick()
    assert hpa.samples[-1]["gate"] == 6
    assert [d.desired for d in fleet.applied] == [{"h100": 3}]  # ceil((2 + 3 + 6) / 5)
