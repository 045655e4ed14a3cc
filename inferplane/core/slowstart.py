"""Slow start: how much new traffic a replica may take, given its lifecycle state.

A replica that has just become ready has cold caches (no prefixes in its KV cache, lazy
CUDA kernels, an empty page cache for later weights) and would be flattened if it took a
full share at once; a replica that is loading weights or draining must take none. Envoy's
slow start (REFERENCE §4) ramps the share of a newly ready host as

    weight = max(min_weight, (time since ready / window) ^ (1 / aggression))

so aggression 1 is linear, larger values ramp faster early. Cold, draining and ejected
replicas weigh 0; ready replicas 1; warming replicas follow the ramp and count as ready
once the window has passed. Pure: the time since the state change is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.core.types import EndpointState, EndpointView

__all__ = ["SlowStartConfig", "TrafficWeight", "ramp_weight", "traffic_weight", "weight_of"]


@dataclass(frozen=True, slots=True)
class SlowStartConfig:
    window_s: float = 30.0
    aggression: float = 1.0
    min_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.aggression <= 0:
            raise ValueError("slow start window_s and aggression must be > 0")
        if not 0.0 <= self.min_weight <= 1.0:
            raise ValueError("slow start min_weight must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class TrafficWeight:
    """A share multiplier in [0, 1] and why; ``ramp_done`` once warming is over."""

    weight: float
    reason: str
    ramp_done: bool = False


def ramp_weight(since_ready_s: float, config: SlowStartConfig) -> float:
    """Envoy's ramp: in [min_weight, 1], non-decreasing in ``since_ready_s``."""
    fraction = min(1.0, max(0.0, since_ready_s) / config.window_s)
    ramp: float = fraction ** (1.0 / config.aggression)
    return max(config.min_weight, ramp)


def traffic_weight(
    state: EndpointState, since_state_s: float, config: SlowStartConfig
) -> TrafficWeight:
    """The weight of an endpoint that has been in ``state`` for ``since_state_s``."""
    if state is EndpointState.READY:
        return TrafficWeight(1.0, "ready", ramp_done=True)
    if state is EndpointState.WARMING:
        weight = ramp_weight(since_state_s, config)
        done = since_state_s >= config.window_s
        return TrafficWeight(weight, f"warming {since_state_s:.1f}s: slow start {weight:.2f}", done)
    return TrafficWeight(0.0, f"{state.value}: takes no new work")


def weight_of(view: EndpointView, now: float, config: SlowStartConfig) -> TrafficWeight:
    """``traffic_weight`` of a view, timed from its ``state_since_s``."""
    return traffic_weight(view.state, now - view.state_since_s, config)
