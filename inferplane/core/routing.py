"""Baseline routing: least-loaded over the endpoints that can take the call.

This is the seam the gateway and the simulator call; the seven-axis pipeline of the routing
issue replaces the scoring behind the same ``route`` signature. Pure: the RNG only breaks
ties, so the same inputs and seed give the same decision.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from inferplane.core.types import (
    AxisScore,
    CallContext,
    EndpointView,
    RankedEndpoint,
    RouteDecision,
)


def eligible(call: CallContext, endpoints: Sequence[EndpointView]) -> list[EndpointView]:
    """Endpoints that serve the model, accept work and whose context fits the call."""
    out = []
    for ep in endpoints:
        if not ep.serves(call.model) or not ep.state.accepts_work:
            continue
        limit = ep.info.max_model_len
        if limit is not None and call.num_prompt_tokens + 1 > limit:
            continue
        out.append(ep)
    return out


def load_of(ep: EndpointView) -> float:
    """Outstanding work: the larger of what the gateway sent and what the engine reports."""
    engine_reported = ep.load.num_waiting + ep.load.num_running
    return float(max(ep.in_flight, engine_reported))


def route(
    call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
) -> RouteDecision:
    """Rank eligible endpoints by load (fewest outstanding first), ties broken at random."""
    candidates = eligible(call, endpoints)
    if not candidates:
        return RouteDecision((), f"no endpoint can serve model {call.model!r}")
    keyed = [(load_of(ep), rng.random(), ep) for ep in candidates]
    keyed.sort(key=lambda item: (item[0], item[1]))
    ranked = tuple(
        RankedEndpoint(
            ep.name,
            1.0 / (1.0 + load),
            (AxisScore("load", 1.0 / (1.0 + load), f"{load:.0f} outstanding"),),
        )
        for load, _, ep in keyed
    )
    return RouteDecision(ranked, "least-loaded")
