"""The autoscaler's arithmetic of whole replicas: capacity of a fleet, the cheapest way to buy
a gap, growing to a need and shrinking to one (costliest per token first), and the plan that
turns a need into desired replicas (scale up at once; down only below the window's peak need,
outside the tolerance band and the cooldown).

Kept apart from :mod:`inferplane.core.autoscaler`, which decides *how much* capacity a pool
needs; this module decides *which* replicas make it. Pure functions of the pool's policy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferplane.core.autoscaler import GpuOption, PoolPolicy

__all__ = ["ScaleAction", "capacity", "cheapest_for", "grow", "plan", "shrink"]


class ScaleAction(enum.Enum):
    HOLD = "hold"
    UP = "up"
    DOWN = "down"


def capacity(policy: PoolPolicy, replicas: Mapping[str, int]) -> float:
    """Tokens/s the replicas serve (a GPU type the policy does not know serves nothing)."""
    total = 0.0
    for gpu, n in replicas.items():
        option = policy.option(gpu)
        total += n * (option.tokens_per_s if option is not None else 0.0)
    return total


def cheapest_for(policy: PoolPolicy, gap: float) -> GpuOption:
    """The option that buys ``gap`` tokens/s for the least money per hour (whole replicas)."""

    def cost(o: GpuOption) -> tuple[float, float, float]:
        n = max(1, math.ceil(gap / o.tokens_per_s))
        return n * o.price_per_hour_usd, o.usd_per_million_tokens, o.cold_start_s

    return min(policy.options, key=cost)


def grow(policy: PoolPolicy, current: Mapping[str, int], need: float) -> dict[str, int]:
    """Add the cheapest replicas for the gap until capacity reaches ``need`` (and min)."""
    desired = dict(current)
    while sum(desired.values()) < policy.max_replicas:
        gap = need - capacity(policy, desired)
        if gap <= 0 and sum(desired.values()) >= policy.min_replicas:
            break
        option = cheapest_for(policy, max(gap, 0.0))
        desired[option.gpu] = desired.get(option.gpu, 0) + 1
    return desired


def shrink(policy: PoolPolicy, current: Mapping[str, int], need: float) -> dict[str, int]:
    """Drop the costliest-per-token replicas while capacity stays at ``need`` and bounds hold."""
    desired = dict(current)

    def per_token(gpu: str) -> float:
        option = policy.option(gpu)
        return math.inf if option is None else option.usd_per_million_tokens

    for gpu in sorted(desired, key=per_token, reverse=True):
        option = policy.option(gpu)
        size = 0.0 if option is None else option.tokens_per_s
        while desired[gpu] > 0 and sum(desired.values()) > policy.min_replicas:
            over_max = sum(desired.values()) > policy.max_replicas
            # Keep a tolerance band above the need: shrinking must not invite a scale-up.
            left = capacity(policy, desired) - size
            if not over_max and left < need * (1 + policy.down_tolerance):
                break
            desired[gpu] -= 1
    return {g: n for g, n in desired.items() if n > 0}


def plan(
    policy: PoolPolicy,
    current: dict[str, int],
    need: float,
    window_need: float,
    last_up_s: float | None,
    now: float,
) -> tuple[dict[str, int], ScaleAction, str]:
    """Desired replicas for ``need`` now and ``window_need`` (the largest need over the
    scale-down window), the action and why."""
    have = capacity(policy, current)
    total = sum(current.values())
    if total < policy.min_replicas or (need > have and total < policy.max_replicas):
        desired = grow(policy, current, need)
        if sum(desired.values()) > total:
            return desired, ScaleAction.UP, f"need {need:.0f} > capacity {have:.0f} tok/s"
    if total > policy.max_replicas:
        return shrink(policy, current, math.inf), ScaleAction.DOWN, "above max_replicas"
    cooling = last_up_s is not None and now - last_up_s < policy.scale_down_cooldown_s
    if window_need < have * (1 - policy.down_tolerance) and not cooling:
        desired = shrink(policy, current, window_need)
        if sum(desired.values()) < total:
            why = f"peak need over {policy.scale_down_window_s:.0f} s {window_need:.0f} tok/s"
            return desired, ScaleAction.DOWN, why
    return dict(current), ScaleAction.HOLD, "within tolerance" if not cooling else "cooling down"
