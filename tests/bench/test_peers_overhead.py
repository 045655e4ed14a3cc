"""The overhead section's pure parts: the median round kept per gateway, and the verdicts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from peerlib.overhead import _median_row, overhead_verdicts


def _round(label: str, direct: float, through: float) -> dict[str, Any]:
    leg = {
        "direct": {"calls_s": direct, "p50_s": 0.001, "p99_s": 0.002},
        "gateway": {"calls_s": through, "p50_s": 0.002, "p99_s": 0.004},
        "ratio": through / direct,
    }
    return {"gateway": label, "plain": leg, "stream": leg}


def test_the_kept_round_is_the_median_by_ratio_and_every_round_is_listed() -> None:
    rows = [_round("x", 1000, 500), _round("x", 1000, 100), _round("x", 1000, 900)]
    row = _median_row("x", rows)
    assert row["plain"]["ratio"] == 0.5
    assert [r["plain"]["calls_s"] for r in row["rounds"]] == [500, 100, 900]


def test_verdicts_judge_both_ways_against_the_faster_router_and_litellm() -> None:
    rows = [
        _median_row("inferplane", [_round("inferplane", 3000, 1800)]),  # 0.6x of direct
        _median_row("inferplane workers=2", [_round("inferplane workers=2", 3000, 900)]),
        _median_row("sglang-router cache_aware", [_round("s", 1600, 1500)]),  # 0.94x
        _median_row("vllm-router cache_aware", [_round("v", 2600, 700)]),
        _median_row("litellm", [_round("l", 2400, 20)]),
    ]
    lines = overhead_verdicts(rows)
    assert lines[0].startswith("- PASS: inferplane vs sglang-router cache_aware by req/s")
    assert "1.20x" in lines[0]
    assert lines[1].startswith("- MISS: inferplane vs sglang-router cache_aware by ratio")
    assert lines[2].startswith("- PASS: inferplane vs litellm") and "90x" in lines[2]


def test_a_slow_inferplane_misses_and_no_peer_rows_give_no_router_line() -> None:
    slow = [
        _median_row("inferplane", [_round("inferplane", 3000, 100)]),
        _median_row("litellm", [_round("l", 2400, 20)]),
    ]
    assert overhead_verdicts(slow) == [
        "- MISS: inferplane vs litellm by req/s: 100 vs 20 = 5x (target >= 10x)"
    ]
    assert overhead_verdicts([]) == ["- overhead: no inferplane row"]
