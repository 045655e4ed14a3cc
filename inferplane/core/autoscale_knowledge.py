"""What the autoscaler has learned about a pool, kept across restarts of the loop.

Most of the loop's memory describes the situation now (the forecast's level, the needs in the
scale-down window, the burst on now) and is stale after a restart. Two things describe the
pool and its workload instead, and take a loaded window (a burst) to learn:

* the **learned utilisation** and its ceiling: the fraction of each replica's modelled
  throughput the pool serves within the SLO (:mod:`inferplane.core.autoscale_learn`);
* the **burst length**: how long the longest burst seen lasted
  (:mod:`inferplane.core.autoscale_burst`).

A loop that forgot them after every deploy would plan at ``target_utilisation`` and buy for
every burst as if it had no end until the next burst taught it again. :func:`knowledge` takes
them out of a state as plain values (a body stores them: a file, Redis) and :func:`resume`
puts them into a fresh state, clamped to the policy as it is now (an operator who lowered
``max_utilisation`` since is obeyed). :func:`parse` reads stored values back, refusing what
is malformed.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferplane.core.autoscale_learn import Learned
from inferplane.core.autoscale_policy import PoolPolicy
from inferplane.core.autoscale_state import AutoscalerState, PoolMemory

__all__ = ["PoolKnowledge", "as_json", "knowledge", "parse", "resume"]


@dataclass(frozen=True, slots=True)
class PoolKnowledge:
    """One pool's learned values (0 or None: not learned yet)."""

    utilisation: float = 0.0
    ceiling: float = 0.0
    burst_length_s: float | None = None


def knowledge(state: AutoscalerState) -> dict[str, PoolKnowledge]:
    """The learned values of every pool in ``state``."""
    return {
        pool: PoolKnowledge(m.learned.utilisation, m.learned.ceiling, m.episode.length_s)
        for pool, m in state.pools.items()
    }


def resume(
    state: AutoscalerState, learned: Mapping[str, PoolKnowledge], policies: Mapping[str, PoolPolicy]
) -> AutoscalerState:
    """``state`` with the learned values of the pools ``policies`` names put back, within the
    policy's bounds (a pool no policy names is left out)."""
    pools = dict(state.pools)
    for pool, k in learned.items():
        policy = policies.get(pool)
        if policy is None:
            continue
        memory = pools.get(pool, PoolMemory())
        episode = replace(memory.episode, length_s=k.burst_length_s)
        pools[pool] = replace(memory, learned=_bounded(k, policy), episode=episode)
    return AutoscalerState(pools)


def _bounded(k: PoolKnowledge, policy: PoolPolicy) -> Learned:
    most, target = policy.max_utilisation, policy.target_utilisation
    if most is None or most <= target or k.utilisation <= 0:
        return Learned()
    ceiling = min(most, k.ceiling) if k.ceiling > 0 else most
    ceiling = max(target, ceiling)
    return Learned(min(ceiling, max(target, k.utilisation)), ceiling)


def as_json(learned: Mapping[str, PoolKnowledge]) -> dict[str, dict[str, float | None]]:
    """Plain values to store, per pool."""
    return {
        pool: {"utilisation": k.utilisation, "ceiling": k.ceiling,
               "burst_length_s": k.burst_length_s}
        for pool, k in learned.items()
    }  # fmt: skip


def parse(stored: Any) -> dict[str, PoolKnowledge]:
    """Stored values (as :func:`as_json` wrote them) back; raises ValueError, naming the pool
    and field, on anything else."""
    if not isinstance(stored, dict):
        raise ValueError("learned autoscaler values: expected an object of pools")
    out = {}
    for pool, row in stored.items():
        if not isinstance(row, dict) or set(row) - {"utilisation", "ceiling", "burst_length_s"}:
            raise ValueError(f"learned autoscaler values: pool {pool!r}: unexpected fields")
        length = row.get("burst_length_s")
        values = (row.get("utilisation", 0.0), row.get("ceiling", 0.0), length or 0.0)
        if not all(_finite(v) for v in values):
            raise ValueError(f"learned autoscaler values: pool {pool!r}: non-negative numbers")
        out[str(pool)] = PoolKnowledge(
            float(values[0]), float(values[1]), None if length is None else float(length)
        )
    return out


def _finite(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
