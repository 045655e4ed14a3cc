"""One endpoint's spend meter: running integrals that make per-request cost O(1) per event.

An endpoint costs ``price_per_s`` for every second of wall time. While ``n >= 1`` requests
are in flight, each owns ``1/n`` of that second, so the meter keeps ``share_s``, the integral
of ``1/n dt`` over busy time: a request that starts when it reads ``x`` and ends when it
reads ``y`` used ``y - x`` endpoint-seconds. Time with nothing in flight is kept per
endpoint state (idle when ready, warming when cold or loading). Pure and mutable; the
accountant (``inferplane.core.accounting``) owns one per endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferplane.core.types import EndpointInfo, EndpointState


@dataclass(slots=True)
class SpendMeter:
    """Integrals of one endpoint since the start of the window (times in seconds)."""

    price_per_s: float
    gpus: float
    state: EndpointState
    last_s: float
    n: int = 0  # requests in flight
    share_s: float = 0.0  # integral of 1/n dt over the time n >= 1
    start_sum: float = 0.0  # sum of share_s at the start of each open request
    busy_s: float = 0.0
    unbusy_s: dict[EndpointState, float] = field(
        default_factory=lambda: dict.fromkeys(EndpointState, 0.0)
    )

    @classmethod
    def for_endpoint(cls, info: EndpointInfo, start_s: float, state: EndpointState) -> SpendMeter:
        return cls(info.price_per_hour_usd / 3600.0, float(info.tensor_parallel), state, start_s)

    def advance(self, now: float) -> None:
        """Integrate up to ``now``; a ``now`` before the last event is clamped to it."""
        t = max(now, self.last_s)
        dt = t - self.last_s
        if self.n > 0:
            self.share_s += dt / self.n
            self.busy_s += dt
        else:
            self.unbusy_s[self.state] += dt
        self.last_s = t

    def begin(self) -> float:
        """A request starts now (after ``advance``); returns its starting share reading."""
        self.n += 1
        self.start_sum += self.share_s
        return self.share_s

    def end(self, start_share_s: float) -> float:
        """A request that started at ``start_share_s`` ends now; returns its share-seconds."""
        self.n -= 1
        self.start_sum = self.start_sum - start_share_s if self.n else 0.0
        return self.share_s - start_share_s

    def pending(self, now: float) -> tuple[float, float]:
        """(busy, unbusy) seconds between the last event and ``now``, without advancing."""
        dt = max(0.0, now - self.last_s)
        return (dt, 0.0) if self.n > 0 else (0.0, dt)

    def open_share_s(self, now: float) -> float:
        """Share-seconds accrued by the requests now in flight (not yet charged)."""
        share_now = self.share_s + (max(0.0, now - self.last_s) / self.n if self.n else 0.0)
        return max(0.0, self.n * share_now - self.start_sum)
