"""The live overload bench's pure parts: the critical-miss trace (``bench/overload_trace.py``)
and its simulator twin (``bench/overload_live_sim.py``), which judges the same fleet and
workload as the live runs with the same summary."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import overload
import overload_live_sim
from overload_trace import Try, critical_misses, critical_split

from inferplane.core.types import PriorityClass
from inferplane.sim.records import CallRecord, Outcome
from inferplane.sim.scenario import Slo

SLO = Slo(ttft_s=2.0, e2e_s=30.0)


def _rec(call_id: int, first_s: float | None, finish_s: float, priority: str) -> CallRecord:
    outcome = Outcome.SUCCESS if first_s is not None else Outcome.REJECTED
    return CallRecord(
        call_id, "chat-critical", PriorityClass(priority), call_id, 0, 1, 10.0, first_s,
        finish_s, 100, 0, 50, "h100-0", outcome, 1,
    )  # fmt: skip


def test_critical_misses_name_where_the_time_went() -> None:
    late = Try(10.0, ok=True, status=200, headers_s=10.1, first_s=13.0, end_s=20.0)
    queued = Try(10.0, ok=True, status=200, headers_s=12.9, first_s=13.0, end_s=20.0)
    slow = Try(10.0, ok=False, status=200, headers_s=10.1, first_s=10.5, end_s=41.0,
               reason="timeout", max_tokens=900, tokens=611)  # fmt: skip
    good = Try(10.0, ok=True, status=200, headers_s=10.2, first_s=10.6, end_s=15.0)
    records = [
        _rec(1, 13.0, 20.0, "critical"),
        _rec(2, 13.0, 20.0, "critical"),
        _rec(3, 10.5, 41.0, "critical"),
        _rec(4, 10.6, 15.0, "critical"),
        _rec(5, 13.0, 20.0, "standard"),  # not critical: never listed
    ]
    tries = {1: [late], 2: [queued], 3: [slow], 4: [good], 5: [late]}
    listed = critical_misses(records, tries, SLO)
    misses = {m["call_id"]: m["cause"] for m in listed}
    assert misses == {
        1: "late first token: engine queue",
        2: "late first token: gateway queue",
        3: "slow decode (deadline)",
    }
    cut = next(m for m in listed if m["call_id"] == 3)
    assert cut["max_tokens"] == 900
    assert cut["attempts"][0]["tpot_s"] == 0.05  # 30.5 s over 610 tokens after the first
    split = critical_split(records, tries)
    assert split["calls"] == 3  # the successful critical calls' last tries
    assert split["gateway_wait_s"]["max"] == 2.9
    assert split["engine_wait_s"]["max"] == 2.9


def test_sim_twin_counts_critical_misses_as_its_attainment() -> None:
    runs = {p: overload_live_sim.run(2.0, p, 30.0, 3) for p in ("inferplane", "fcfs")}
    for s in runs.values():
        crit = s["classes"]["chat-critical"]
        assert crit["ended"] > 0
        assert crit["slo_attainment"] == 1 - s["critical_missed"] / crit["ended"]
    # Same seed, open-loop chat arrivals: both policies see the same critical calls.
    assert (
        runs["inferplane"]["classes"]["chat-critical"]["calls"]
        == runs["fcfs"]["classes"]["chat-critical"]["calls"]
    )
    v = overload.verdict(runs["inferplane"], runs["fcfs"], 2.0)
    assert v["critical_slo"] == runs["inferplane"]["classes"]["chat-critical"]["slo_attainment"]
