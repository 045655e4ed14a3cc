"""Issue 9's emulated targets judged over several runs of ``bench/autoscale_emulated.py``.

One run per arm decides less than it seems on the emulated fleet: the queue rule's cost
follows whether its one engine carries the burst at full KV, which changes from run to run
on the same seed (at 157c672: $0.00186 and then $0.00136 per successful task). This script
reads the per-arm results of several runs (each a ``--tag`` of the bench, any seeds) and
judges the targets on the runs pooled, so the verdict is not one draw:

* attainment pooled: calls within the SLO over calls sent, all runs together;
* cost per successful task pooled: all spend over all successful tasks (every call within
  the SLO; runs from before 2026-12-06, which counted completed tasks, are refused), and
  per completed task beside it;
* GPU-hours and spend: the runs' sums (the ratio to the peak fleet's over the same runs is
  the ratio of the means);

with each run's figures and how many runs pass each target on their own. A run counts
only with every arm it is compared in (a run without the queue-hpa arm is left out of that
comparison). Writes ``bench/results/autoscale-emulated-<out>.json`` and ``.md``.

Run: ``python bench/autoscale_emulated_pooled.py --tags lead-157c672,lead-157c672-r2 --out X``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoscale_emulated_report import tasks, usd, verdicts

RESULTS = Path(__file__).parent / "results"
ARMS = ("inferplane", "queue-hpa", "queue-hpa-open", "peak")


def load_runs(tags: list[str], results: Path = RESULTS) -> dict[str, dict[str, dict[str, Any]]]:
    """``{tag: {arm: result}}`` for every arm saved under each tag."""
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for tag in tags:
        stem = "autoscale-emulated" + (f"-{tag}" if tag else "")
        by = {
            a: json.loads(p.read_text())
            for a in ARMS
            if (p := results / f"{stem}-{a}.json").exists()
        }
        if by:
            runs[tag] = by
    return runs


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's runs as one: attainment and cost per successful task over all of them."""
    calls = sum(r["calls"] for r in results)
    met = sum((r["slo_attainment"] or 0.0) * r["calls"] for r in results)
    spend = sum(r["spend_usd"] for r in results)
    missing = [r["arm"] for r in results if "tasks_in_slo" not in r]
    if missing:  # runs before 2026-12-06 counted completed tasks as successful
        raise ValueError(f"{missing[0]}: a run without tasks_in_slo cannot be pooled")
    ok = sum(r["tasks_in_slo"] for r in results)
    done = sum(r["tasks_ok"] for r in results)
    hours = [r["gpu_hours"] for r in results]
    costs = [c for r in results if (c := r["cost_per_successful_task_usd"]) is not None]
    return {
        "arm": results[0]["arm"], "runs": len(results), "calls": calls,
        "slo_attainment": met / calls if calls else None,
        "tasks_in_slo": ok, "tasks_ok": done,
        "tasks_failed": sum(r["tasks_failed"] for r in results),
        "gpu_hours": sum(hours), "spend_usd": spend,
        "cost_per_successful_task_usd": spend / ok if ok else None,
        "cost_per_completed_task_usd": spend / done if done else None,
        "gpu_hours_range": [min(hours), max(hours)],
        "cost_range": [min(costs), max(costs)] if costs else None,
        "attainment_range": [min(r["slo_attainment"] or 0.0 for r in results),
                             max(r["slo_attainment"] or 0.0 for r in results)],
    }  # fmt: skip


def compare(runs: dict[str, dict[str, dict[str, Any]]], other: str) -> tuple[str, int, int]:
    """The pooled verdict of inferplane against ``other`` over the runs holding both, and how
    many of those runs pass alone."""
    both = [by for by in runs.values() if "inferplane" in by and other in by]
    if not both:
        return f"(no run holds inferplane and {other})", 0, 0
    # one comparison in, one verdict out (``verdicts`` names each arm it compares against)
    alone = [verdicts({"inferplane": by["inferplane"], other: by[other]})[0] for by in both]
    passed = sum(v.startswith("PASS") for v in alone)
    pool = {"inferplane": pooled([by["inferplane"] for by in both]),
            other: pooled([by[other] for by in both])}  # fmt: skip
    return verdicts(pool)[0], passed, len(both)


def table(runs: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["| run | arm | calls | SLO attainment | GPU-hours | cost / successful task "
             "| cost / completed task | tasks in SLO/completed/failed | max engines |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for tag, by in runs.items():
        seed = next(iter(by.values()))["args"].get("seed")
        lines += [_row(f"{tag} (seed {seed})", r, f"{r['gpu_hours']:.3f}", r["max_replicas"])
                  for arm in ARMS if (r := by.get(arm)) is not None]  # fmt: skip
    for arm in ARMS:
        if arm_runs := [by[arm] for by in runs.values() if arm in by]:
            p = pooled(arm_runs)
            lines.append(
                _row(f"**pooled ({p['runs']} runs)**", p, f"{p['gpu_hours']:.3f} (sum)", "")
            )
    return "\n".join(lines)


def _row(label: str, r: dict[str, Any], hours: str, engines: object) -> str:
    return (
        f"| {label} | {r['arm']} | {r['calls']} | {100 * (r['slo_attainment'] or 0):.2f}% | "
        f"{hours} | {usd(r['cost_per_successful_task_usd'])} | "
        f"{usd(r['cost_per_completed_task_usd'])} | {tasks(r)} | {engines} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tags", required=True, help="comma-separated tags of the runs")
    parser.add_argument("--out", required=True, help="tag of the pooled report")
    args = parser.parse_args()
    runs = load_runs(args.tags.split(","))
    if not runs:
        raise SystemExit(f"no results under the tags {args.tags}")
    text = table(runs)
    lines = []
    for other in ("peak", "queue-hpa", "queue-hpa-open"):
        line, passed, n = compare(runs, other)
        lines.append(f"{line} [pooled over {n} runs; {passed} of {n} pass alone]")
    print(text + "\n\n" + "\n".join(lines))
    stem = RESULTS / f"autoscale-emulated-{args.out}"
    doc = {"tags": list(runs), "table": text, "verdicts": lines,
           "pooled": {a: pooled([by[a] for by in runs.values() if a in by])
                      for a in ARMS if any(a in by for by in runs.values())}}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    stem.with_suffix(".md").write_text(
        "# Autoscaling on the emulated fleet, several runs pooled\n\n"
        f"`python bench/autoscale_emulated_pooled.py --tags {args.tags} --out {args.out}`\n\n"
        f"{text}\n\n" + "\n".join(f"- {v}" for v in lines) + "\n"
    )


if __name__ == "__main__":
    main()
