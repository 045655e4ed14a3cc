"""Numbers out of a run: percentiles, SLO attainment, goodput, spend, per class and overall.

A *class* is a workload source (``chat``, ``agents``...): its calls share a priority and an
SLO. A call meets its SLO when it succeeded and its time to first token and end-to-end time
are within the class's budgets; attainment counts every call that ended (unfinished calls,
still in flight when the run stopped, are left out). Goodput is calls that met their SLO per
second of the run. Everything here is plain data ready for JSON; the report rounds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from inferplane.sim.records import CallRecord, Outcome, RunResult
from inferplane.sim.scenario import Scenario, Slo

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Linear-interpolated percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    k = (len(sorted_values) - 1) * pct / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _dist(values: list[float]) -> dict[str, float | None]:
    values.sort()
    out: dict[str, float | None] = {f"p{p}": percentile(values, p) for p in PERCENTILES}
    out["mean"] = math.fsum(values) / len(values) if values else None
    return out


def meets_slo(record: CallRecord, slo: Slo) -> bool:
    if record.outcome is not Outcome.SUCCESS:
        return False
    ttft, e2e = record.ttft_s, record.e2e_s
    if slo.ttft_s is not None and (ttft is None or ttft > slo.ttft_s):
        return False
    return not (slo.e2e_s is not None and (e2e is None or e2e > slo.e2e_s))


def summarise_calls(records: Sequence[CallRecord], slo: Slo, window_s: float) -> dict[str, Any]:
    """Counts, latency percentiles, SLO attainment and throughput of a set of calls."""
    outcomes = {o.value: 0 for o in Outcome}
    ttft: list[float] = []
    e2e: list[float] = []
    met = ended = completion = prompt = cached = 0
    for r in records:
        outcomes[r.outcome.value] += 1
        if r.outcome is Outcome.UNFINISHED:
            continue
        ended += 1
        if r.outcome is Outcome.SUCCESS:
            if r.ttft_s is not None:
                ttft.append(r.ttft_s)
            if r.e2e_s is not None:
                e2e.append(r.e2e_s)
            completion += r.completion_tokens
            prompt += r.prompt_tokens
            cached += r.cached_tokens
        met += meets_slo(r, slo)
    return {
        "calls": len(records),
        "outcomes": outcomes,
        "success_rate": outcomes["success"] / ended if ended else None,
        "slo_attainment": met / ended if ended else None,
        "goodput_rps": met / window_s if window_s > 0 else None,
        "output_tokens_per_s": completion / window_s if window_s > 0 else None,
        "prompt_tokens": prompt,
        "cached_prompt_share": cached / prompt if prompt else None,
        "ttft_s": _dist(ttft),
        "e2e_s": _dist(e2e),
    }


def summarise_run(result: RunResult, scenario: Scenario) -> dict[str, Any]:
    """The JSON-ready summary of one policy's run."""
    slos = {s.name: s.slo for s in scenario.workload}
    window = scenario.duration_s
    classes = {
        name: summarise_calls([r for r in result.records if r.source == name], slo, window)
        for name, slo in slos.items()
    }
    met = sum(
        meets_slo(r, slos[r.source]) for r in result.records if r.outcome is not Outcome.UNFINISHED
    )
    ended = sum(r.outcome is not Outcome.UNFINISHED for r in result.records)
    acc = result.accounting
    spend = acc.fleet_spend_usd + result.extra_spend_usd
    successes = result.tasks["success"]
    overall = summarise_calls(result.records, Slo(), window)
    overall["slo_attainment"] = met / ended if ended else None
    overall["goodput_rps"] = met / window
    return {
        "overall": overall,
        "classes": classes,
        "tasks": dict(result.tasks),
        "spend_usd": spend,
        "spend_split_usd": {
            "busy": acc.busy_usd, "idle": acc.idle_usd, "warming": acc.warming_usd,
            "wasted": acc.wasted_usd, "retry": acc.retry_usd, "scale_out": result.extra_spend_usd,
        },
        "cost_per_successful_task_usd": spend / successes if successes else None,
        "rejections": dict(result.rejections),
        "counters": dict(result.counters),
        "end_s": result.end_s,
    }  # fmt: skip


def timeseries(result: RunResult, scenario: Scenario) -> dict[str, Any]:
    """Sampled fleet state plus goodput per sample window, for the report's plots."""
    samples = result.samples
    times = [s.time_s for s in samples]
    slos = {s.name: s.slo for s in scenario.workload}
    good = [0] * len(times)
    step = scenario.sample_every_s()
    for r in result.records:
        if r.finish_s is not None and meets_slo(r, slos[r.source]):
            i = min(len(times) - 1, int(r.finish_s // step) + 1)
            good[i] += 1
    kv = {
        name: [s.kv_usage[i] if i < len(s.kv_usage) else 0.0 for s in samples]
        for i, name in enumerate(result.endpoints)
    }
    cost = [s.spend_usd / s.successful_tasks if s.successful_tasks else None for s in samples]
    return {
        "time_s": times,
        "num_waiting": [s.num_waiting for s in samples],
        "num_running": [s.num_running for s in samples],
        "num_in_flight": [s.num_in_flight for s in samples],
        "goodput_rps": [g / step for g in good],
        "spend_usd": [s.spend_usd for s in samples],
        "cost_per_successful_task_usd": cost,
        "kv_usage": kv,
    }
