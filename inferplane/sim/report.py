"""The simulator's outputs: a JSON result, a terminal summary table and the HTML report.

The JSON is byte-identical for the same scenario and seed: keys sorted, floats rounded to
six significant digits, no wall-clock fields. The terminal table puts the policies side by
side on the figures that decide between them (SLO attainment, tail latency, cost per
successful task). The HTML report (``inferplane.sim.plots``) adds the plots.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from inferplane.sim.records import RunResult
from inferplane.sim.scenario import Scenario
from inferplane.sim.summary import summarise_run, timeseries

SIGNIFICANT_DIGITS = 6


def clean(value: Any) -> Any:
    """JSON-safe and deterministic: rounded floats, None for NaN/inf, tuples as lists."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def build_result(scenario: Scenario, seed: int, results: Sequence[RunResult]) -> dict[str, Any]:
    """The whole result document: scenario facts and, per policy, summary and time series."""
    policies = {
        r.policy: {"summary": summarise_run(r, scenario), "timeseries": timeseries(r, scenario)}
        for r in results
    }
    document: dict[str, Any] = clean(
        {
            "scenario": scenario.name,
            "seed": seed,
            "duration_s": scenario.duration_s,
            "drain_s": scenario.drain_s,
            "classes": {
                s.name: {
                    "kind": s.kind,
                    "priority": s.priority.value,
                    "slo": s.slo.model_dump(),
                }
                for s in scenario.workload
            },
            "endpoints": list(results[0].endpoints) if results else [],
            "policies": policies,
        }
    )
    return document


def to_json(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, indent=1, allow_nan=False) + "\n"


def _fmt(value: Any, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}{suffix}"


def summary_table(document: dict[str, Any]) -> Table:
    """Policies side by side (overall figures)."""
    table = Table(title=f"scenario {document['scenario']} (seed {document['seed']})")
    columns = ("policy", "success", "SLO met", "TTFT p50", "TTFT p90", "e2e p90", "goodput/s",
               "$/task", "rejected")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for name, run in document["policies"].items():
        s = run["summary"]
        o = s["overall"]
        rejected = sum(s["rejections"].values())
        table.add_row(
            name, _fmt(o["success_rate"], 100, 1, "%"), _fmt(o["slo_attainment"], 100, 1, "%"),
            _fmt(o["ttft_s"]["p50"], 1, 3), _fmt(o["ttft_s"]["p90"], 1, 3),
            _fmt(o["e2e_s"]["p90"], 1, 2), _fmt(o["goodput_rps"], 1, 2),
            _fmt(s["cost_per_successful_task_usd"], 1, 4), str(rejected),
        )  # fmt: skip
    return table


def class_table(document: dict[str, Any]) -> Table:
    """SLO attainment and tails per class and policy."""
    table = Table(title="per class")
    for col in ("class", "policy", "calls", "SLO met", "TTFT p90", "e2e p90", "cached"):
        table.add_column(col, justify="left" if col in ("class", "policy") else "right")
    for cls in document["classes"]:
        for name, run in document["policies"].items():
            c = run["summary"]["classes"][cls]
            table.add_row(
                cls, name, str(c["calls"]), _fmt(c["slo_attainment"], 100, 1, "%"),
                _fmt(c["ttft_s"]["p90"], 1, 3), _fmt(c["e2e_s"]["p90"], 1, 2),
                _fmt(c["cached_prompt_share"], 100, 1, "%"),
            )  # fmt: skip
    return table


def print_summary(document: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(document))
    console.print(class_table(document))
