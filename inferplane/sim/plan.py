"""Capacity planning: the cheapest fleet per GPU type that meets SLOs at a given demand.

``inferplane plan plan.yaml`` takes a demand (a scenario's workload section, with its demand
knobs), SLO targets, a model and candidate GPU types. For each GPU type it simulates fleets
of that many replicas with the core's routing and admission (the ``inferplane`` policy, same
seed, same calls), growing the count by doubling until the SLOs hold and then bisecting to
the smallest count that meets them. Every fleet it simulated is a point of the
latency / cost / throughput triangle, so the answer is both the cheapest fleet per GPU type
(and overall) and the sweep around it.

The SLO targets are fleet-wide: TTFT p90, end-to-end p90 (over succeeded calls) and the
share of calls that succeeded. Prices default to the GPU's list price in the engine
profiles times the tensor parallelism.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferplane.config import parse_config, read_yaml_file, validate_yaml_tree
from inferplane.engine.profiles import load_profile
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.records import Outcome, RunResult
from inferplane.sim.scenario import ScenarioError, parse_scenario
from inferplane.sim.summary import percentile


class PlanError(ValueError):
    """A plan file that cannot be run; the message names the bad field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanSlo(_Frozen):
    """Fleet-wide targets a candidate fleet must meet."""

    ttft_p90_s: float | None = Field(default=None, gt=0)
    e2e_p90_s: float | None = Field(default=None, gt=0)
    min_success: float = Field(default=0.99, ge=0, le=1)


class Plan(_Frozen):
    """The plan file: model, candidate GPUs, SLOs and the demand to serve."""

    name: str = Field(default="plan", min_length=1)
    model: str = Field(default="llama-3-8b", min_length=1)
    gpus: tuple[str, ...] = Field(min_length=1)
    tensor_parallel: int | None = Field(default=None, ge=1)
    prices_per_hour_usd: dict[str, float] = Field(default_factory=dict)
    max_replicas: int = Field(default=64, ge=1, le=4096)
    slo: PlanSlo
    duration_s: float = Field(gt=0)
    drain_s: float = Field(default=60.0, ge=0)
    seed: int = 0
    workload: tuple[Any, ...] = Field(min_length=1)  # validated as a scenario's
    demand: dict[str, float] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """One simulated fleet: its size, cost and what it delivered."""

    gpu: str
    replicas: int
    usd_per_hour: float
    success_share: float
    ttft_p90_s: float | None
    e2e_p90_s: float | None
    output_tokens_per_s: float
    meets_slo: bool

    @property
    def usd_per_million_tokens(self) -> float:
        tokens_per_hour = self.output_tokens_per_s * 3600.0
        return math.inf if tokens_per_hour <= 0 else self.usd_per_hour / tokens_per_hour * 1e6


def load_plan(path: Path) -> Plan:
    data = read_yaml_file(path, PlanError, "plan")
    return validate_yaml_tree(data, Plan, PlanError, "plan", str(path))


def price_of(plan: Plan, gpu: str) -> float:
    if gpu in plan.prices_per_hour_usd:
        return plan.prices_per_hour_usd[gpu]
    try:
        profile = load_profile(plan.model, gpu, plan.tensor_parallel)
    except (KeyError, ValueError) as exc:
        raise PlanError(f"gpus: {gpu!r}: {exc}") from None
    return profile.gpu.price_per_hour_usd * profile.tensor_parallel


def _fleet(plan: Plan, gpu: str, replicas: int) -> dict[str, Any]:
    price = price_of(plan, gpu)
    extra = {} if plan.tensor_parallel is None else {"tensor_parallel": plan.tensor_parallel}
    endpoints = [
        {"name": f"{gpu}-{i}", "url": f"http://127.0.0.1:{9000 + i}", "gpu": gpu,
         "price_per_hour_usd": price, "models": [plan.model], **extra}
        for i in range(replicas)
    ]  # fmt: skip
    return {"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints}


def simulate_fleet(plan: Plan, gpu: str, replicas: int, base_dir: Path) -> FleetPoint:
    """Run the plan's demand on ``replicas`` replicas of ``gpu``; what the fleet delivered."""
    scenario = parse_scenario(
        {"name": plan.name, "fleet": "plan", "duration_s": plan.duration_s,
         "drain_s": plan.drain_s, "seed": plan.seed, "policies": ["inferplane"],
         "workload": list(plan.workload), "demand": plan.demand},
        "plan",
    )  # fmt: skip
    fleet = parse_config(_fleet(plan, gpu, replicas))
    result = CalibratedSimulation(scenario, fleet, base_dir, "inferplane").run()
    return _point(plan, gpu, replicas, result)


def _point(plan: Plan, gpu: str, replicas: int, result: RunResult) -> FleetPoint:
    ended = [r for r in result.records if r.outcome is not Outcome.UNFINISHED]
    ok = [r for r in ended if r.outcome is Outcome.SUCCESS]
    success = len(ok) / len(ended) if ended else 0.0
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    e2e = sorted(r.e2e_s for r in ok if r.e2e_s is not None)
    ttft_p90, e2e_p90 = percentile(ttft, 90), percentile(e2e, 90)
    slo = plan.slo
    meets = (
        bool(ok)
        and success >= slo.min_success
        and (slo.ttft_p90_s is None or (ttft_p90 is not None and ttft_p90 <= slo.ttft_p90_s))
        and (slo.e2e_p90_s is None or (e2e_p90 is not None and e2e_p90 <= slo.e2e_p90_s))
    )
    tokens = sum(r.completion_tokens for r in ok)
    return FleetPoint(
        gpu, replicas, replicas * price_of(plan, gpu), success, ttft_p90, e2e_p90,
        tokens / max(1e-9, result.end_s), meets,
    )  # fmt: skip


Simulate = Callable[[str, int], FleetPoint]


def cheapest(
    gpu: str, max_replicas: int, run: Simulate
) -> tuple[FleetPoint | None, list[FleetPoint]]:
    """The smallest fleet of ``gpu`` meeting the SLOs (None: not within ``max_replicas``),
    and every fleet simulated on the way (doubling, then bisection)."""
    seen: dict[int, FleetPoint] = {}

    def at(n: int) -> FleetPoint:
        if n not in seen:
            seen[n] = run(gpu, n)
        return seen[n]

    lo, hi = 0, 1  # lo: largest count known to miss; hi: candidate that may meet
    while not at(hi).meets_slo:
        if hi >= max_replicas:
            return None, sorted(seen.values(), key=lambda p: p.replicas)
        lo, hi = hi, min(2 * hi, max_replicas)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).meets_slo:
            hi = mid
        else:
            lo = mid
    return at(hi), sorted(seen.values(), key=lambda p: p.replicas)


def plan_fleets(
    plan: Plan, base_dir: Path
) -> dict[str, tuple[FleetPoint | None, list[FleetPoint]]]:
    """Per GPU type: the cheapest fleet meeting the SLOs and the sweep of fleets tried."""
    out: dict[str, tuple[FleetPoint | None, list[FleetPoint]]] = {}
    for gpu in plan.gpus:
        price_of(plan, gpu)  # an unknown GPU fails before any run
        try:
            out[gpu] = cheapest(
                gpu, plan.max_replicas, lambda g, n: simulate_fleet(plan, g, n, base_dir)
            )
        except ScenarioError as exc:
            raise PlanError(str(exc)) from None
    return out
