"""What the autoscaler has learned about a pool, kept across restarts of the loop.

Most of the loop's memory describes the situation now (the forecast's level, the needs in the
scale-down window, the burst on now) and is stale after a restart. Two things describe the
pool and its workload instead, and take a loaded window (a burst) to learn:

* the **learned utilisation** and its ceiling: the fraction of each replica's modelled
  throughput the pool serves within the SLO (:mod:`inferplane.core.autoscale_learn`);
* the **burst length**: how long the longest burst seen lasted
  (:mod:`inferplane.core.autoscale_burst`).

Only evidence is kept: a fraction at the target, or a ceiling at ``max_utilisation``, is the
policy's and is not stored, so a policy changed between two runs is obeyed.

A loop that forgot them after every deploy would plan at ``target_utilisation`` and buy for
every burst as if it had no end until the next burst taught it again. :func:`knowledge` takes
them out of a state as plain values (a body stores them: a file, Redis) and :func:`resume`
puts them into a fresh state within the policy as it is now (an operator who lowered
``max_utilisation`` since is obeyed; fractions of a modelled throughput that changed since are
rescaled to the new one). :func:`parse` reads stored values back, refusing what
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
    """One pool's learned values: only evidence, never a configured default (0 or None: not
    learned), with the modelled throughput of one replica they are fractions of."""

    utilisation: float = 0.0  # learned fraction of modelled throughput (0: the target)
    ceiling: float = 0.0  # the learned ceiling, under max_utilisation (0: max_utilisation)
    burst_length_s: float | None = None  # the longest burst seen
    replica_tokens_per_s: float = 0.0  # the policy's first option's, when learned (0: same)


def knowledge(
    state: AutoscalerState, policies: Mapping[str, PoolPolicy]
) -> dict[str, PoolKnowledge]:
    """What the pools of ``state`` that ``policies`` names have learned beyond their policy:
    a utilisation at or under the target, or a ceiling at ``max_utilisation``, is the policy
    speaking, not evidence, and is kept as 0 (so a changed policy is obeyed on resume)."""
    out = {}
    for pool, memory in state.pools.items():
        policy = policies.get(pool)
        if policy is None:
            continue
        learned, most, target = memory.learned, policy.max_utilisation, policy.target_utilisation
        utilisation = learned.utilisation if learned.utilisation > target else 0.0
        ceiling = learned.ceiling if most is not None and 0 < learned.ceiling < most else 0.0
        out[pool] = PoolKnowledge(
            utilisation, ceiling, memory.episode.length_s, policy.options[0].tokens_per_s
        )
    return out


def resume(
    state: AutoscalerState, learned: Mapping[str, PoolKnowledge], policies: Mapping[str, PoolPolicy]
) -> AutoscalerState:
    """``state`` with the learned values of the pools ``policies`` names put back within the
    policy as it is now (a pool no policy names is left out). Fractions learned against
    another modelled throughput are rescaled to this one (what a replica carried, in tokens/s,
    is the evidence); a burst shorter than a tick cannot have been learned and is dropped."""
    pools = dict(state.pools)
    for pool, k in learned.items():
        policy = policies.get(pool)
        if policy is None:
            continue
        memory = pools.get(pool, PoolMemory())
        length = k.burst_length_s
        length = length if length is not None and length >= policy.tick_s else None
        episode = replace(memory.episode, length_s=length)
        pools[pool] = replace(memory, learned=_bounded(k, policy), episode=episode)
    return AutoscalerState(pools)


def _bounded(k: PoolKnowledge, policy: PoolPolicy) -> Learned:
    most, target = policy.max_utilisation, policy.target_utilisation
    if most is None or most <= target:
        return Learned()
    modelled = policy.options[0].tokens_per_s
    scale = k.replica_tokens_per_s / modelled if k.replica_tokens_per_s > 0 else 1.0
    ceiling = most if k.ceiling <= 0 else max(target, min(most, k.ceiling * scale))
    utilisation = 0.0 if k.utilisation <= 0 else max(target, min(ceiling, k.utilisation * scale))
    return Learned(utilisation, ceiling)


_FIELDS = ("utilisation", "ceiling", "burst_length_s", "replica_tokens_per_s")


def as_json(learned: Mapping[str, PoolKnowledge]) -> dict[str, dict[str, float | None]]:
    """Plain values to store, per pool."""
    return {pool: {f: getattr(k, f) for f in _FIELDS} for pool, k in learned.items()}


def parse(stored: Any) -> dict[str, PoolKnowledge]:
    """Stored values (as :func:`as_json` wrote them) back; raises ValueError, naming the pool
    and field, on anything else."""
    if not isinstance(stored, dict):
        raise ValueError("learned autoscaler values: expected an object of pools")
    out = {}
    for pool, row in stored.items():
        if not isinstance(row, dict) or set(row) - set(_FIELDS):
            raise ValueError(f"learned autoscaler values: pool {pool!r}: unexpected fields")
        for name in _FIELDS:
            value = row.get(name, 0.0)
            if not (value is None and name == "burst_length_s") and not _non_negative(value):
                raise ValueError(
                    f"learned autoscaler values: pool {pool!r}: {name} must be a number >= 0"
                )
        length = row.get("burst_length_s")
        out[str(pool)] = PoolKnowledge(
            float(row.get("utilisation", 0.0)), float(row.get("ceiling", 0.0)),
            None if length is None or length <= 0 else float(length),
            float(row.get("replica_tokens_per_s", 0.0)),
        )  # fmt: skip
    return out


def _non_negative(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
