"""Candidate sets: which few endpoints of a large pool a call is scored against.

Scoring every endpoint of a 1,000-replica pool on every call costs the router time linear in
the pool; the choice it makes almost always lands on an endpoint that holds the call's prefix,
the workflow's previous endpoint, or one of the least loaded. ``candidates`` picks those,
power-of-d style (Mitzenmacher's "power of d choices"; Ray Serve's power-of-two router):

1. the prefix holders: the endpoints holding the deepest block of the prompt that any
   endpoint holds (found by bisection over the prompt's block keys, since an engine's prefix
   cache holds a block's ancestors with it), at most ``max_holders`` of them, drawn at
   random when more hold it (a system prompt held fleet-wide is not a preference);
2. the workflow's affinity endpoint, when it is in the pool;
3. ``d`` more endpoints drawn uniformly at random from the pool (without replacement).

The router then ranks only these (``route(call, candidates, ...)``). With ``d`` at least the
pool size, or a pool no larger than ``d`` plus the picks above, the answer is the pool itself
in its own order (the router sees exactly what it would without sampling). Pure: the RNG is
an argument, and the order of the result depends only on the pool order and the RNG.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol

from inferplane.core.types import EndpointView

__all__ = ["HolderIndex", "candidates", "deepest_held"]


class HolderIndex(Protocol):
    """What candidate selection needs of a prefix index (``PrefixIndex`` fits)."""

    def is_held(self, key: int) -> bool: ...

    def holders(self, key: int) -> list[str]: ...


def deepest_held(keys: Sequence[int], index: HolderIndex) -> int:
    """How many leading blocks of ``keys`` some endpoint holds (bisection; 0: none).

    Assumes holding block ``i`` implies some endpoint holds blocks ``< i`` (a prefix cache
    stores a chain with its ancestors); a hole only makes the answer shallower.
    """
    lo, hi = 0, len(keys)  # keys[:lo] held, keys[hi:] not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if index.is_held(keys[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def candidates(
    pool: Sequence[EndpointView],
    d: int,
    rng: random.Random,
    *,
    keys: Sequence[int] = (),
    index: HolderIndex | None = None,
    affinity_endpoint: str | None = None,
    max_holders: int = 4,
    positions: Mapping[str, int] | None = None,
) -> list[EndpointView]:
    """The endpoints of ``pool`` to route ``call`` over (module docstring), pool order kept.

    ``d`` <= 0 or ``d`` >= len(pool): the whole pool. Holders and affinity count on top of
    ``d``; the RNG is drawn from the same way whatever the index holds, for a given pool size
    and holder count. ``positions`` (name -> index in ``pool``) saves building that map per
    call when the caller keeps it.
    """
    n = len(pool)
    if d <= 0 or d >= n:
        return list(pool)
    position = positions if positions is not None else {v.name: i for i, v in enumerate(pool)}
    chosen: set[int] = set()
    if index is not None and keys:
        depth = deepest_held(keys, index)
        if depth:
            held = [position[h] for h in index.holders(keys[depth - 1]) if h in position]
            if len(held) > max_holders:
                held = rng.sample(held, max_holders)
            chosen.update(held)
    if affinity_endpoint is not None and affinity_endpoint in position:
        chosen.add(position[affinity_endpoint])
    if len(chosen) + d >= n:
        return list(pool)
    picked = 0
    while picked < d:  # rejection sampling: d + len(chosen) < n, so this ends quickly
        i = rng.randrange(n)
        if i not in chosen:
            chosen.add(i)
            picked += 1
    return [pool[i] for i in sorted(chosen)]
