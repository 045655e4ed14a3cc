"""The gate passes the prefix index's cached count to admission: a call whose prompt the
engines hold is priced for its new tokens only (the larger of it and the workflow estimate)."""

from __future__ import annotations

import pytest

from inferplane.core.admission_config import AdmissionConfig
from inferplane.core.types import CallContext
from inferplane.gateway.admission_gate import AdmissionGate
from inferplane.gateway.errors import ApiError
from inferplane.gateway.metrics import GatewayMetrics
from tests.core.test_admission import IDLE, NO_HEADROOM, StubPredictor, call


def _gate() -> AdmissionGate:
    # TTFT = 0.1 s + uncached prompt at 10k tok/s; TPOT 0.01 s
    return AdmissionGate(
        AdmissionConfig(headroom=NO_HEADROOM), StubPredictor(wait_s=0.1),
        lambda now, model: IDLE, lambda: 0.0, GatewayMetrics(),
    )  # fmt: skip


def _long(rid: str) -> CallContext:
    # 20k-token prompt, 10 output tokens, 1 s deadline: 2.1 s uncached, 0.19 s if 19k cached
    return call(rid, prompt=20_000, max_tokens=10, deadline_s=1.0)


async def test_an_uncached_long_prompt_is_refused_as_unreachable() -> None:
    with pytest.raises(ApiError) as err:
        await _gate().enter(_long("a"), None, 100)
    assert err.value.status == 429 and err.value.code == "deadline_unreachable"


async def test_the_cached_count_makes_the_same_call_fit() -> None:
    gate = _gate()
    assert await gate.enter(_long("b"), None, 100, num_cached_tokens=19_000) == 0.0
    gate.leave(_long("b"), num_tokens=10)
