"""The scoreboard's markdown table and target check (pure: strings in, strings out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peerlib import workloads as wl
from peerlib.stats import Row

COLUMNS: tuple[tuple[str, str], ...] = (
    ("gateway", "gateway"),
    ("goodput_tasks_s", "goodput tasks/s"),
    ("cost_per_task_usd", "$/ok task"),
    ("success_rate", "call success"),
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p90_s", "TTFT p90 s"),
    ("ttft_p99_s", "TTFT p99 s"),
    ("tbt_p99_s", "TBT p99 s"),
    ("output_tok_s", "out tok/s"),
    ("prefix_hit_rate", "prefix hit"),
    ("rejected", "429"),
    ("failed", "failed"),
    ("broken", "broken"),
    ("unfinished", "cut off"),
    ("streams_completed", "streams done"),
    ("retries", "client retries"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("success_rate", "prefix_hit_rate"):
        return f"{100 * value:.1f}%"
    if key == "cost_per_task_usd":
        return f"{value:.5f}"
    if key == "output_tok_s":
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def table(rows: Sequence[Row]) -> list[str]:
    """A markdown table of ``rows`` (one workload), plus streams started in the last cell."""
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, rule]
    for row in rows:
        data = row.to_json()
        cells = [_fmt(key, data[key]) for key, _ in COLUMNS]
        cells[-2] = f"{row.streams_completed}/{row.streams_started}"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def not_run_lines(not_run: dict[str, str]) -> list[str]:
    return [f"- {label}: not run: {reason}" for label, reason in sorted(not_run.items())]


def _best_peer(rows: Sequence[Row], key: str, higher: bool) -> tuple[str, float] | None:
    peers = [(r.gateway, getattr(r, key)) for r in rows if not r.gateway.startswith("inferplane")]
    peers = [(g, v) for g, v in peers if v is not None]
    if not peers:
        return None
    return max(peers, key=lambda p: p[1]) if higher else min(peers, key=lambda p: p[1])


def target_lines(workload: str, rows: Sequence[Row]) -> list[str]:
    """The issue's targets for ``workload`` as ratios against the best peer in this run."""
    ours = next((r for r in rows if r.gateway == "inferplane"), None)
    if ours is None:
        return []
    out: list[str] = []
    if workload in ("agentic", "overload", "cascade"):
        best = _best_peer(rows, "goodput_tasks_s", higher=True)
        if best and best[1] > 0:
            ratio = ours.goodput_tasks_s / best[1]
            verdict = "PASS" if ratio >= 1.5 else "MISS"
            out.append(f"- goodput {ratio:.2f}x best peer ({best[0]}); target >= 1.5x: {verdict}")
        cost = _best_peer(rows, "cost_per_task_usd", higher=False)
        if cost and ours.cost_per_task_usd is not None:
            ratio = ours.cost_per_task_usd / cost[1]
            verdict = "PASS" if ratio <= 0.67 else "MISS"
            out.append(
                f"- cost/task {ratio:.2f}x best peer ({cost[0]}); target <= 0.67x: {verdict}"
            )
    elif workload == "shared_prefix":
        hit = _best_peer(rows, "prefix_hit_rate", higher=True)
        if hit and ours.prefix_hit_rate is not None:
            verdict = "PASS" if ours.prefix_hit_rate >= hit[1] else "MISS"
            out.append(
                f"- hit rate {100 * ours.prefix_hit_rate:.1f}% vs best peer "
                f"{100 * hit[1]:.1f}% ({hit[0]}): {verdict}"
            )
        p90 = _best_peer(rows, "ttft_p90_s", higher=False)
        if p90 and ours.ttft_p90_s is not None:
            verdict = "PASS" if ours.ttft_p90_s <= p90[1] else "MISS"
            out.append(
                f"- TTFT p90 {ours.ttft_p90_s:.3f} s vs best peer {p90[1]:.3f} s "
                f"({p90[0]}): {verdict}"
            )
    elif workload == "crash":
        verdict = (
            "PASS"
            if ours.broken == 0 and ours.streams_completed == ours.streams_started
            else "MISS"
        )
        out.append(
            f"- streams completed {ours.streams_completed}/{ours.streams_started}, "
            f"broken {ours.broken}; target all completed: {verdict}"
        )
    return out


def offered_x(workload: wl.Workload, scale: wl.Scale) -> float:
    """Output tokens asked for inside the window, at capacity pace, over capacity x window."""
    asked = sum(wl.tokens_in_window(t, workload.duration_s) for t in workload.tasks)
    return round(asked / (scale.capacity_tok_s * workload.duration_s), 3)


def sizing_lines(workload: wl.Workload, scale: wl.Scale) -> list[str]:
    """What the workload offered inside its window, and which tasks count."""
    counted = sum(1 for t in workload.tasks if t.counted)
    drain = workload.drain_s
    out = [
        f"Offered inside the window (at capacity pace): {offered_x(workload, scale):.2f}x "
        f"the fleet's output tok/s; {counted} of {len(workload.tasks)} tasks counted"
    ]
    if counted < len(workload.tasks):
        out[0] += (
            " (the others could not end by the cut-off even at capacity pace: they run "
            "for every gateway and score for none)"
        )
    if drain is not None:
        out[0] += f"; cut-off {drain:g} s after the window"
    return [out[0] + ".", ""]


def cpu_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The cell's CPU seconds per process and the machine's load average (start, end)."""
    cpu = result.get("cpu_s") or {}
    return {f"cpu_s_{k}": v for k, v in cpu.items()} | {"load_avg": result.get("load_avg")}


def cpu_lines(cells: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Who used the 2 CPUs during each cell (arrival window + drain)."""
    out = [
        "CPU seconds during each cell (fleet / gateway / load generator) and load average "
        "at its start -> end:",
        "",
    ]
    for label, c in cells:
        cpu = [c.get(f"cpu_s_{k}") for k in ("fleet", "gateway", "load")]
        avg = c.get("load_avg") or [None, None]
        out.append(f"- {label}: {cpu[0]} / {cpu[1]} / {cpu[2]} s; load {avg[0]} -> {avg[1]}")
    return out
