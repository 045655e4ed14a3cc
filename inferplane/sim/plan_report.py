"""The capacity plan as a terminal table and a JSON document (see :mod:`inferplane.sim.plan`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from inferplane.sim.plan import FleetPoint, Plan

Found = dict[str, tuple[FleetPoint | None, list[FleetPoint]]]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plan_table(plan: Plan, found: Found) -> Table:
    """Every fleet simulated, per GPU type by size; the cheapest meeting the SLOs starred."""
    best = [p for p, _ in found.values() if p is not None]
    overall = min(best, key=lambda p: p.usd_per_hour) if best else None
    table = Table(title=f"capacity plan: {plan.name} ({plan.model})")
    for col in ("gpu", "replicas", "$/h", "success", "TTFT p90 s", "e2e p90 s", "out tok/s",
                "$/M tok", "SLO"):  # fmt: skip
        table.add_column(col, justify="left" if col == "gpu" else "right")
    for gpu, (cheapest, sweep) in found.items():
        for p in sweep:
            mark = "met" if p.meets_slo else "missed"
            if p is cheapest:
                mark = "cheapest" + (" overall" if p is overall else "")
            table.add_row(gpu, str(p.replicas), f"{p.usd_per_hour:.2f}",
                          f"{p.success_share:.1%}", _s(p.ttft_p90_s), _s(p.e2e_p90_s),
                          f"{p.output_tokens_per_s:.0f}", f"{p.usd_per_million_tokens:.2f}",
                          mark)  # fmt: skip
        if cheapest is None:
            table.add_row(gpu, f"> {plan.max_replicas}", "", "", "", "", "", "", "none meets")
    return table


def _point(p: FleetPoint) -> dict[str, Any]:
    return {
        "gpu": p.gpu, "replicas": p.replicas, "usd_per_hour": p.usd_per_hour,
        "success_share": p.success_share, "ttft_p90_s": p.ttft_p90_s, "e2e_p90_s": p.e2e_p90_s,
        "output_tokens_per_s": p.output_tokens_per_s, "meets_slo": p.meets_slo,
    }  # fmt: skip


def plan_document(plan: Plan, found: Found) -> dict[str, Any]:
    return {
        "plan": plan.name,
        "model": plan.model,
        "slo": plan.slo.model_dump(),
        "cheapest": {g: None if p is None else _point(p) for g, (p, _) in found.items()},
        "sweep": {g: [_point(p) for p in sweep] for g, (_, sweep) in found.items()},
    }
