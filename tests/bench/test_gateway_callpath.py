"""The in-process call-path bench drives real calls through the gateway and times each
stage (a broken wiring shows as a missing stage or a failed call)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gateway_callpath as cp

STAGES = {
    "context", "cache lookup", "admission call", "admission", "plan (routing)", "proxy (all)",
    "  dispatch: accounting", "  dispatch: router", "  finish: accounting+metrics",
    "  finish: first token", "  finish: router", "  finish: admission",
}  # fmt: skip


async def test_every_stage_is_timed_and_calls_succeed() -> None:
    result = await cp._measure(calls=50, reps=1, stages=True)
    assert result["us_per_call"] > 0
    assert set(result["stages_us"]) == STAGES
    assert all(us > 0 for us in result["stages_us"].values())
