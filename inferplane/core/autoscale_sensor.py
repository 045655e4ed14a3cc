"""The autoscaler's sense step for a body that sees calls one by one (the simulator, a bench).

A body tells the sensor about each call as it arrives (its tokens) and as it ends (within SLO
or not); every tick it asks for one :class:`PoolSignal` per pool and the window restarts. The
gateway, which already counts tokens and outcomes in its metrics registry, senses from those
instead (``inferplane.gateway.autoscale``); both produce the same signal for the same calls.

    sensor = PoolSensor()
    sensor.on_arrival("llama-3-8b", num_tokens=1200)
    sensor.on_finish("llama-3-8b", within_slo=True)
    signal = sensor.signal("llama-3-8b", now, serving={"h100": 2}, starting={"a100": 1})

Pure: no clock; the body passes ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferplane.core.autoscaler import PoolSignal

__all__ = ["PoolSensor"]


@dataclass(slots=True)
class _Window:
    started_s: float | None = None
    tokens: float = 0.0
    requests: int = 0
    finished: int = 0
    within_slo: int = 0


class PoolSensor:
    """Per-pool counts over the current window."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def _window(self, pool: str) -> _Window:
        window = self._windows.get(pool)
        if window is None:
            window = self._windows[pool] = _Window()
        return window

    def on_arrival(self, pool: str, num_tokens: float) -> None:
        """A call arrived for ``pool`` carrying ``num_tokens`` (prompt plus expected output; 0
        when the body counts work as it is served instead, with :meth:`on_served`)."""
        window = self._window(pool)
        window.tokens += num_tokens
        window.requests += 1

    def on_served(self, pool: str, num_tokens: float) -> None:
        """Tokens of work an engine did for ``pool`` (prompt not served from cache plus output).

        For a body that counts demand as work done rather than tokens sent: agentic calls
        resend a context that is mostly cached, so tokens sent overstate the work many times.
        """
        self._window(pool).tokens += num_tokens

    def on_finish(self, pool: str, within_slo: bool) -> None:
        window = self._window(pool)
        window.finished += 1
        window.within_slo += within_slo

    def signal(
        self,
        pool: str,
        now_s: float,
        serving: Mapping[str, int],
        starting: Mapping[str, int] | None = None,
        backlog_tokens: float = 0.0,
        default_window_s: float = 15.0,
        *,
        restart: bool = True,
    ) -> PoolSignal:
        """The window ending at ``now_s`` as a signal; the next window starts now (unless
        ``restart`` is False: a look at a window not yet due, which keeps counting)."""
        window = self._window(pool)
        started = window.started_s
        window_s = default_window_s if started is None else max(1e-9, now_s - started)
        attainment = window.within_slo / window.finished if window.finished else None
        out = PoolSignal(
            pool=pool,
            now_s=now_s,
            window_s=window_s,
            tokens=window.tokens,
            requests=window.requests,
            backlog_tokens=backlog_tokens,
            slo_attainment=attainment,
            serving=dict(serving),
            starting=dict(starting or {}),
        )
        if restart:
            self._windows[pool] = _Window(started_s=now_s)
        return out
