"""The autoscaler's arithmetic of whole replicas: capacity of a fleet, the cheapest way to buy
a gap, growing to a need and shrinking to one (costliest per token first).

Kept apart from :mod:`inferplane.core.autoscaler`, which decides *how much* capacity a pool
needs; this module decides *which* replicas make it. Pure functions of the pool's policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferplane.core.autoscaler import GpuOption, PoolPolicy

__all__ = ["capacity", "cheapest_for", "grow", "shrink"]


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
