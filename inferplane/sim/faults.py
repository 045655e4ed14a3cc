"""Fault scenarios as timed actions on the simulated fleet.

A scenario's faults (GPU slow-down, crash, region outage, scale-out) expand into a sorted
list of primitive actions: set a slow-down factor, crash an engine, start loading it again,
add a cold replica. The runner schedules each as a FAULT event, which sorts before engine
steps at the same instant, so a crash at t fails exactly what is in flight at t. A crashed
engine loses its cache and in-flight work (``EngineModel.reset``) and, once restarted,
pays its full cold start (weights load plus warm-up) before it takes traffic again.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from inferplane.sim.scenario import (
    CrashFault,
    Fault,
    RegionOutageFault,
    ScaleOutFault,
    SlowdownFault,
)


class ActionKind(enum.Enum):
    SLOW = "slow"  # set the slow-down factor of the endpoints
    CRASH = "crash"  # engines die: in-flight calls fail, cache lost, state cold
    RESTART = "restart"  # cold engines start loading their weights
    SCALE_OUT = "scale_out"  # new cold replicas of a template endpoint, loading at once


@dataclass(frozen=True, slots=True)
class FaultAction:
    """One primitive change to the fleet at ``at_s``."""

    at_s: float
    kind: ActionKind
    endpoints: tuple[str, ...] = ()  # for SCALE_OUT: the template, once per new replica
    factor: float = 1.0  # for SLOW
    label: str = ""  # the scenario fault it came from, for the report


class FaultError(ValueError):
    """A fault that names an endpoint or region the fleet does not have."""


def _check(names: Sequence[str], known: set[str], where: str) -> None:
    missing = [n for n in names if n not in known]
    if missing:
        raise FaultError(f"{where}: unknown endpoints {', '.join(missing)}")


def expand(faults: Sequence[Fault], endpoint_regions: dict[str, str]) -> list[FaultAction]:
    """Primitive actions of the scenario's faults, in time order (stable for equal times)."""
    known = set(endpoint_regions)
    actions: list[FaultAction] = []
    for i, fault in enumerate(faults):
        where = f"faults.{i}.{fault.kind}"
        label = f"{fault.kind}#{i}"
        if isinstance(fault, SlowdownFault):
            _check(fault.endpoints, known, where)
            actions.append(
                FaultAction(fault.at_s, ActionKind.SLOW, fault.endpoints, fault.factor, label)
            )
            if fault.duration_s is not None:
                end = fault.at_s + fault.duration_s
                actions.append(FaultAction(end, ActionKind.SLOW, fault.endpoints, 1.0, label))
        elif isinstance(fault, CrashFault):
            _check(fault.endpoints, known, where)
            actions.append(FaultAction(fault.at_s, ActionKind.CRASH, fault.endpoints, label=label))
            if fault.restart_after_s is not None:
                at = fault.at_s + fault.restart_after_s
                actions.append(FaultAction(at, ActionKind.RESTART, fault.endpoints, label=label))
        elif isinstance(fault, RegionOutageFault):
            names = tuple(n for n, r in endpoint_regions.items() if r == fault.region)
            if not names:
                raise FaultError(f"{where}: no endpoint in region {fault.region!r}")
            actions.append(FaultAction(fault.at_s, ActionKind.CRASH, names, label=label))
            end = fault.at_s + fault.duration_s
            actions.append(FaultAction(end, ActionKind.RESTART, names, label=label))
        elif isinstance(fault, ScaleOutFault):
            _check((fault.template,), known, where)
            templates = (fault.template,) * fault.count
            actions.append(FaultAction(fault.at_s, ActionKind.SCALE_OUT, templates, label=label))
    return sorted(actions, key=lambda a: a.at_s)
