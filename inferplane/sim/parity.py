"""Comparing the live gateway's decisions with the simulator's on one trace.

Per call: the endpoint each body chose and whether it admitted the call. With a sequential
trace (each call ends before the next starts) the state both routers see is the same, so
every choice must match. With overlapping calls, small timing differences (HTTP and event
loop latency in the live path) change the load a router sees at some decisions; a changed
choice then moves a prefix to another endpoint and later calls follow it there, so a
per-call comparison counts one divergence many times. The relabelling-free measure is the
pairwise co-location agreement (the Rand index of the two partitions of calls by endpoint):
the share of call pairs that both bodies put on the same endpoint, or both on different
ones. Adjusted for chance (ARI), 1 means the same grouping and 0 what two unrelated random
routers would agree on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb


@dataclass(frozen=True, slots=True)
class Agreement:
    """How two bodies' routing of the same calls compares."""

    num_calls: int
    same_choice: int  # calls both sent to the same endpoint (or both refused)
    rand_index: float  # share of call pairs grouped alike
    adjusted_rand_index: float  # the same, 0 for chance agreement

    @property
    def same_choice_share(self) -> float:
        return self.same_choice / self.num_calls if self.num_calls else 1.0


def rand_agreement(a: Sequence[str | None], b: Sequence[str | None]) -> Agreement:
    """Agreement of two labellings of the same calls (None: refused, a group of its own)."""
    if len(a) != len(b):
        raise ValueError("both bodies must have routed the same calls")
    n = len(a)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    if n < 2:
        return Agreement(n, same, 1.0, 1.0)
    pairs = comb(n, 2)
    both = sum(comb(c, 2) for c in Counter(zip(a, b, strict=True)).values())
    in_a = sum(comb(c, 2) for c in Counter(a).values())
    in_b = sum(comb(c, 2) for c in Counter(b).values())
    rand = (pairs + 2 * both - in_a - in_b) / pairs
    expected = in_a * in_b / pairs
    top = (in_a + in_b) / 2
    ari = 1.0 if top == expected else (both - expected) / (top - expected)
    return Agreement(n, same, rand, ari)
