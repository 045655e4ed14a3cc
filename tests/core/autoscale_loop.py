"""A closed loop around the core autoscaler, shared by its tests.

Poisson calls arrive per tick on one GPU type; the replicas the loop asks for serve a cold
start later, and the ones it lets go stop at once. Deterministic per seed.
"""

from __future__ import annotations

import random

from inferplane.core.autoscaler import (
    Autoscaler,
    AutoscalerState,
    GpuOption,
    PoolPolicy,
    PoolSignal,
    ScaleDecision,
)

TOKENS_PER_CALL = 1000.0
TICK_S = 5.0


def h100(cold_start_s: float) -> GpuOption:
    return GpuOption(
        "h100", price_per_hour_usd=4.0, tokens_per_s=10_000.0, cold_start_s=cold_start_s
    )


def pool_policy(option: GpuOption, **kw: object) -> PoolPolicy:
    """Pool ``m`` on ``option`` alone, 1-40 replicas, ticking every ``TICK_S``; ``kw`` overrides."""
    base: dict[str, object] = {
        "pool": "m", "options": (option,), "min_replicas": 1, "max_replicas": 40, "tick_s": TICK_S,
    }  # fmt: skip
    base.update(kw)
    return PoolPolicy(**base)  # type: ignore[arg-type]


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (inter-arrival times summed; small means only)."""
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n, t = n + 1, t + rng.expovariate(1.0)
    return n


class ClosedLoop:
    """The autoscaler deciding for pool ``m`` on ``option``, tick after tick."""

    def __init__(
        self, scaler: Autoscaler, seed: int, option: GpuOption, cold_start: bool = True
    ) -> None:
        self.scaler, self.option = scaler, option
        self.cold_start_s = option.cold_start_s if cold_start else 0.0
        self.rng = random.Random(seed)
        self.state = AutoscalerState()
        self.serving, self.starting = 1, list[float]()  # starting: ready-at times
        self.now = 0.0

    def step(self, calls_per_s: float, exact: bool = False) -> ScaleDecision:
        self.now += TICK_S
        self.serving += sum(1 for at in self.starting if at <= self.now)
        self.starting = [at for at in self.starting if at > self.now]
        mean = calls_per_s * TICK_S
        n = round(mean) if exact else poisson(self.rng, mean)
        gpu = self.option.gpu
        starting = {gpu: len(self.starting)} if self.starting else {}
        signal = PoolSignal(
            pool="m", now_s=self.now, window_s=TICK_S, tokens=n * TOKENS_PER_CALL, requests=n,
            serving={gpu: self.serving}, starting=starting,
        )  # fmt: skip
        (d,), self.state = self.scaler.decide([signal], self.state)
        have = self.serving + len(self.starting)
        if d.desired_total > have:
            self.starting += [self.now + self.cold_start_s] * (d.desired_total - have)
        elif d.desired_total < have:
            self.serving = max(0, self.serving - (have - d.desired_total))
        return d

    def run(self, rates: list[float], exact: bool = False) -> list[ScaleDecision]:
        return [self.step(r, exact) for r in rates]

    @property
    def ready_tokens_per_s(self) -> float:
        return self.serving * self.option.tokens_per_s
