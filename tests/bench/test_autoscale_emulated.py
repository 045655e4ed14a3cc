"""The emulated autoscaling bench's load driver reaches the gateway with every call it has
open (a cap on the client's connections would queue calls in the driver, where no engine and
no scaling rule sees them), and every arm gets the same tasks at the same times."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import autoscale_emulated
from autoscale_emulated import Driver, client_session, has_content, task_arrivals
from autoscale_emulated_report import CallResult, rate_factor


async def test_the_driver_does_not_cap_its_connections() -> None:
    session = client_session(120.0)
    try:
        assert session.connector is not None
        assert session.connector.limit == 0  # aiohttp's default is 100
        assert session.timeout.total == 120.0
    finally:
        await session.close()


def _args(**kw: float) -> argparse.Namespace:
    base = {"seed": 1, "tasks_per_s": 0.5, "duration_s": 300.0, "burst_at": 0.35, "burst_s": 60.0}
    return argparse.Namespace(**{**base, **kw})


def test_every_arm_gets_the_same_task_schedule_and_the_burst_is_in_it() -> None:
    """Drawn up front from the seed alone: the same starts for the same seed, others for
    another; the 60 s burst from 105 s carries ~5x the tasks of the minute before it."""
    starts = task_arrivals(_args())
    assert starts == task_arrivals(_args())
    assert starts != task_arrivals(_args(seed=2))
    assert starts == sorted(starts) and starts[0] > 0 and starts[-1] < 300.0
    before = sum(45.0 <= t < 105.0 for t in starts)
    burst = sum(105.0 <= t < 165.0 for t in starts)
    assert burst > 3 * before > 0
    assert 0.7 < len(starts) / sum(rate_factor(t + 0.5, _args()) * 0.5 for t in range(300)) < 1.3


class _CannedDriver(Driver):
    """The driver with its HTTP call replaced: the first task's second call is late."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__("http://unused", args)
        self.headers: list[dict[str, str]] = []

    async def call(self, session: Any, messages: Any, headers: Any) -> CallResult:
        self.headers.append(headers)
        late = headers["X-Workflow-Id"] == "t0" and headers["X-Workflow-Step"] == "2"
        return CallResult(0.0, 4.0 if late else 0.5, 5.0, True, 100)


async def test_a_task_succeeds_only_with_every_call_in_slo_and_calls_state_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task completed with one call past the TTFT SLO is completed, not successful
    (DESIGN.md: its calls succeed within their deadlines); every call states the SLO."""

    async def no_pause(_s: float) -> None:
        return None

    monkeypatch.setattr(autoscale_emulated.asyncio, "sleep", no_pause)
    driver = _CannedDriver(_args(slo_ttft_s=3.0, slo_e2e_s=30.0))
    for n in range(3):
        await driver.task(None, n)  # type: ignore[arg-type]
    assert (driver.tasks_ok, driver.tasks_in_slo, driver.tasks_failed) == (3, 2, 0)
    assert all(h["X-TTFT-Budget-Ms"] == "3000" and h["X-Deadline-Ms"] == "30000"
               for h in driver.headers)  # fmt: skip


def test_ttft_is_the_first_chunk_with_a_token_not_the_role_chunk() -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    token = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3}}
    assert not has_content(role) and not has_content(usage) and has_content(token)
