"""From the load generator's records to one scoreboard row per gateway and workload (pure).

Definitions (the report repeats them):
* success: a call whose stream ended with ``[DONE]`` and carried tokens; a task succeeds
  when every call succeeded within its deadline (an agent stops at its first failed call;
  tasks still running at the cut-off count as failed);
* goodput: successful tasks per second of the arrival window;
* cost per successful task: the fleet's spend over the window in modelled GPU time
  (engines x price per hour x window / time scale) over the successful tasks;
* TTFT percentiles over the calls that got a first token (from the first attempt's send);
* prefix hit rate: prompt tokens found cached over prompt tokens queried, summed over the
  engines' ``vllm:prefix_cache_*`` counters;
* rejected: calls whose final answer was 429; failed: any other unsuccessful call;
  broken: streams that started and ended without ``[DONE]``; unfinished: tasks cut off
  at the end of the drain time (their open call counts against the success rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Row:
    gateway: str
    workload: str
    tasks: int
    tasks_ok: int
    goodput_tasks_s: float
    cost_per_task_usd: float | None
    calls: int
    calls_ok: int
    success_rate: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    output_tok_s: float
    prefix_hit_rate: float | None
    rejected: int
    failed: int
    broken: int
    streams_started: int
    streams_completed: int
    retries: int
    unfinished: int  # tasks still running at the cut-off (their open call is not in calls)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunInfo:
    gateway: str
    workload: str
    tasks_offered: int
    window_s: float
    fleet_usd_per_hour: float
    time_scale: float


def summarize(info: RunInfo, result: dict[str, Any], prefix: tuple[float, float] | None) -> Row:
    """One row from a load generator result and the engines' (hits, queries) token counts."""
    fields = list(result["fields"])
    recs = [dict(zip(fields, r, strict=True)) for r in result["records"]]
    tasks_ok = sum(1 for t in result["tasks"] if t[3])
    ttfts = [r["ttft_s"] for r in recs if r["ttft_s"] is not None]
    ok = [r for r in recs if r["ok"]]
    started = [r for r in recs if r["status"] == 200 and r["ttft_s"] is not None]
    spend = info.fleet_usd_per_hour * info.window_s / info.time_scale / 3600.0
    hits = None if not prefix or prefix[1] <= 0 else prefix[0] / prefix[1]
    rejected = sum(1 for r in recs if not r["ok"] and r["status"] == 429)
    unfinished = int(result.get("unfinished_tasks", 0))
    return Row(
        gateway=info.gateway,
        workload=info.workload,
        tasks=info.tasks_offered,
        tasks_ok=tasks_ok,
        goodput_tasks_s=tasks_ok / info.window_s,
        cost_per_task_usd=spend / tasks_ok if tasks_ok else None,
        calls=len(recs),
        calls_ok=len(ok),
        success_rate=len(ok) / (len(recs) + unfinished) if recs or unfinished else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        tbt_p99_s=result.get("tbt_p99_s"),
        output_tok_s=sum(r["tokens"] for r in ok) / max(result["elapsed_s"], 1e-9),
        prefix_hit_rate=hits,
        rejected=rejected,
        failed=len(recs) - len(ok) - rejected,
        broken=sum(1 for r in recs if r["broken"]),
        streams_started=len(started),
        streams_completed=sum(1 for r in started if r["ok"]),
        retries=sum(r["attempts"] - 1 for r in recs),
        unfinished=unfinished,
    )


def prefix_counts(metrics_text: str) -> tuple[float, float]:
    """(hit tokens, queried tokens) from one engine's Prometheus text."""
    hits = queries = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries
