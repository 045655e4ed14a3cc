"""The queue-length baseline of ``bench/autoscale_emulated.py``: an HPA on waiting calls.

production-stack's KEDA rule (REFERENCE section 5) as an HPA evaluates it, the simulator's
:class:`~inferplane.sim.scale_loop.QueueRule`: every tick, desired replicas = ceil(waiting
calls / 5 per replica), bounded by min and max, scale-up at once and scale-down following the
largest desired count of the stabilisation window. Waiting calls are the engines' scraped
queues plus the calls queued at the gateway's admission gate. It acts through the same
embedded fleet (cold starts, drains) as inferplane's loop, so only the rule differs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

from inferplane.core.autoscaler import PoolPolicy, ScaleAction, ScaleDecision
from inferplane.gateway.embedded_fleet import EmbeddedFleet
from inferplane.sim.scale_loop import QueueRule

if TYPE_CHECKING:
    from inferplane.gateway.app import Gateway

__all__ = ["QueueHpa"]


class QueueHpa:
    """Runs the queue rule on a live gateway and its embedded fleet."""

    def __init__(
        self, gateway: Gateway, fleet: EmbeddedFleet, policy: PoolPolicy, tick_s: float
    ) -> None:
        self.gateway, self.fleet, self.policy, self.tick_s = gateway, fleet, policy, tick_s
        self.rule = QueueRule()
        self.history: deque[tuple[float, int]] = deque()
        self.decisions: list[dict[str, object]] = []
        self.samples: list[dict[str, float]] = []  # every tick: what the rule saw
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    def waiting_calls(self) -> int:
        """The rule's input: waiting calls at the engines plus those queued at the gate."""
        return int(self.observe()["waiting"])

    def observe(self) -> dict[str, float]:
        """What the pool looks like now: the engines' scraped waiting and running calls,
        the gate's queue, and the calls the gateway has in flight at the engines."""
        views = [
            v
            for v in self.gateway.tracker.views(self.gateway.clock())
            if v.serves(self.policy.pool)
        ]
        engines = sum(v.load.num_waiting for v in views)
        gate = sum(self.gateway.gate.depth().values())
        return {
            "waiting": engines + gate, "engine_waiting": engines, "gate": gate,
            "engine_running": sum(v.load.num_running for v in views),
            "in_flight": sum(v.in_flight for v in views),
            "kv_use_max": round(max((v.load.kv_usage for v in views), default=0.0), 3),
        }  # fmt: skip

    async def tick(self) -> None:
        gpu = self.policy.options[0].gpu
        now = self.gateway.clock()
        seen = self.observe()
        waiting = int(seen["waiting"])
        self.samples.append({"t": round(now - self._t0, 1), **seen})
        want = self.rule.desired(self.policy, waiting, now, self.history)
        have = len(self.fleet.running(self.policy.pool, gpu))
        action = ScaleAction.UP if want > have else ScaleAction.DOWN if want < have else None
        if action is None:
            return
        decision = ScaleDecision(
            pool=self.policy.pool, action=action, desired={gpu: want}, current={gpu: have},
            demand_tokens_per_s=0.0, need_tokens_per_s=0.0, reason=f"{waiting} waiting calls",
        )  # fmt: skip
        t = round(now - self._t0, 1)
        self.decisions.append({"t": t, "desired": want, "reason": decision.reason})
        await self.fleet.apply(decision)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.tick()
            await asyncio.sleep(self.tick_s)

    def start(self) -> None:
        self._t0 = self.gateway.clock()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
