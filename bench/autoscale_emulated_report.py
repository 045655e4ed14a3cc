"""Tables, verdicts and the plot of ``bench/autoscale_emulated.py`` (kept apart: the bench
itself runs the arms). The targets are issue 9's: attainment within 1 point of the peak-sized
fleet at <= 0.6x its GPU-hours; better attainment than the queue-length loop at equal or lower
cost per successful task.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

__all__ = ["plot", "rate_factor", "table", "verdicts"]


def rate_factor(t: float, args: argparse.Namespace) -> float:
    """Diurnal curve (0.4x at the start, 1.6x mid-run) with the 5x burst on top."""
    diurnal = 1.0 + 0.6 * math.sin(2 * math.pi * (t / args.duration_s + 0.75))
    start = args.burst_at * args.duration_s
    return diurnal * (5.0 if start <= t < start + args.burst_s else 1.0)


def plot(results: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    xs = [float(t) for t in range(int(args.duration_s))]
    top.plot(xs, [args.tasks_per_s * rate_factor(t, args) for t in xs], color="black")
    top.set_ylabel("tasks / s (offered)")
    top.set_title(f"Emulated fleet (time scale {args.time_scale:g}): replicas over time")
    for r in results:
        ts = [p[0] for p in r["series"]]
        bottom.step(ts, [p[1] for p in r["series"]], where="post", label=f"{r['arm']} started")
        if r["arm"] == "inferplane":
            bottom.step(ts, [p[2] for p in r["series"]], where="post", label="inferplane ready",
                        linestyle="--")  # fmt: skip
    bottom.set_ylabel("engines")
    bottom.set_xlabel("time (s)")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


def table(results: list[dict[str, Any]]) -> str:
    peak = results[-1]
    lines = ["| arm | calls | SLO attainment | TTFT p90 | GPU-hours | x peak | spend "
             "| cost / successful task | tasks ok/failed | max engines |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        cost = r["cost_per_successful_task_usd"]
        lines.append(
            f"| {r['arm']} | {r['calls']} | {100 * (r['slo_attainment'] or 0):.2f}% | "
            f"{r['ttft_p90_s'] or 0:.2f} s | {r['gpu_hours']:.3f} | "
            f"{r['gpu_hours'] / peak['gpu_hours']:.2f} | ${r['spend_usd']:.3f} | "
            f"{'-' if cost is None else f'${cost:.5f}'} | {r['tasks_ok']}/{r['tasks_failed']} | "
            f"{r['max_replicas']} |"
        )
    return "\n".join(lines)


def verdicts(by: dict[str, dict[str, Any]]) -> list[str]:
    ip, peak, hpa = by.get("inferplane"), by.get("peak"), by.get("queue-hpa")
    out = []
    if ip and peak:
        gap = 100 * ((peak["slo_attainment"] or 0) - (ip["slo_attainment"] or 0))
        ratio = ip["gpu_hours"] / peak["gpu_hours"]
        out.append(f"{'PASS' if gap <= 1 and ratio <= 0.6 else 'MISS'}: attainment {gap:+.2f} "
                   f"points below peak (<= 1) at {ratio:.3f}x its GPU-hours (<= 0.6)")  # fmt: skip
    if ip and hpa:  # cost: all spend (failed tasks' partial work too) over tasks that succeeded
        a, b = ip["slo_attainment"] or 0, hpa["slo_attainment"] or 0
        ca, cb = ip["cost_per_successful_task_usd"], hpa["cost_per_successful_task_usd"]
        ok = a > b and ca is not None and (cb is None or ca <= cb)
        out.append(f"{'PASS' if ok else 'MISS'}: attainment {100 * a:.2f}% vs queue-hpa "
                   f"{100 * b:.2f}% at ${ca or 0:.5f} vs ${cb or 0:.5f} per successful task "
                   f"(better, at equal or lower cost per successful task); in total "
                   f"{ip['gpu_hours']:.3f} vs {hpa['gpu_hours']:.3f} GPU-hours, "
                   f"${ip['spend_usd']:.3f} vs ${hpa['spend_usd']:.3f}, tasks ok/failed "
                   f"{ip['tasks_ok']}/{ip['tasks_failed']} vs "
                   f"{hpa['tasks_ok']}/{hpa['tasks_failed']}")  # fmt: skip
    if ip and "queue-hpa-open" in by:  # the rule behind no admission, as production-stack runs
        again = verdicts({"inferplane": ip, "queue-hpa": by["queue-hpa-open"]})
        out += [v.replace("queue-hpa", "queue-hpa-open") for v in again]
    return out
