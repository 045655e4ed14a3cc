"""Turns a scenario's workload section into call sources bound to a fleet.

Each source gets its own RNG stream derived from the scenario seed and its position (so the
calls it generates do not depend on what the policy under test does), its own segment key
space (so prompts share prefixes only where the workload says so), the model targets it
asks for (resolved through the fleet config's routes) and the longest context those
targets take, so generated prompts fit the models they go to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from inferplane.config import FleetConfig
from inferplane.core.types import PriorityClass
from inferplane.sim.fleet import Fleet
from inferplane.sim.prompts import KeySpace
from inferplane.sim.scenario import (
    AgenticSource,
    ChatSource,
    CodeSource,
    LongContextSource,
    Scenario,
    ScenarioError,
    Slo,
    TraceSource,
)
from inferplane.sim.traces import TraceCalls
from inferplane.sim.workload import (
    AgenticTasks,
    CallSource,
    ChatCalls,
    CodeCalls,
    LongContextCalls,
    SourceBase,
)


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What the runner needs to know about the calls of one source."""

    name: str
    priority: PriorityClass
    tenant: str
    targets: tuple[str, ...]  # served models to try, in order
    timeout_s: float
    slo: Slo


def source_rng(seed: int, index: int, name: str) -> random.Random:
    """The RNG stream of one workload source (string seeds hash stably across runs)."""
    return random.Random(f"{seed}/workload/{index}/{name}")


def build_sources(
    scenario: Scenario, base_dir: Path, fleet_config: FleetConfig, fleet: Fleet, seed: int
) -> list[tuple[CallSource, SourceInfo]]:
    """One call source per workload entry, with its routing and client facts."""
    out: list[tuple[CallSource, SourceInfo]] = []
    default_model = fleet_config.model_names()[0]
    for i, src in enumerate(scenario.workload):
        requested = src.model or default_model
        targets = fleet_config.targets_for(requested)
        if not targets:
            raise ScenarioError(
                f"workload.{i}.model: no endpoint serves {requested!r} "
                f"(known: {', '.join(fleet_config.model_names())})"
            )
        limit = max(fleet.context_limit_tokens(t) for t in targets)
        base = SourceBase(
            src.name, source_rng(seed, i, src.name), KeySpace(i), scenario.demand, limit
        )
        source: CallSource
        if isinstance(src, ChatSource):
            source = ChatCalls(src, base)
        elif isinstance(src, CodeSource):
            source = CodeCalls(src, base)
        elif isinstance(src, LongContextSource):
            source = LongContextCalls(src, base)
        elif isinstance(src, AgenticSource):
            source = AgenticTasks(src, base)
        elif isinstance(src, TraceSource):
            source = TraceCalls(src, base_dir, base.keys, scenario.demand, limit)
        timeout_s = scenario.clients.timeout_s or fleet_config.gateway.timeouts.for_class(
            src.priority
        )
        info = SourceInfo(
            src.name, src.priority, src.tenant or src.name, targets, timeout_s, src.slo
        )
        out.append((source, info))
    return out
