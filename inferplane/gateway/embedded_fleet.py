"""The autoscaler's embedded actuator: emulated engines started cold and drained on decisions.

Its engines are *slots*: endpoints of the gateway config with fixed ports, running or
stopped. Scaling up starts a slot's engine cold (it loads its weights before it answers
``/health``, a real cold start); scaling down marks the slot DRAINING through the callback
the gateway gives, waits for its calls to finish (bounded), stops it and marks it COLD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from inferplane.core.autoscaler import ScaleDecision
from inferplane.core.types import EndpointState
from inferplane.engine.server import EngineConfig, EngineServer

log = logging.getLogger("inferplane.gateway.autoscale")

__all__ = ["EmbeddedFleet", "Slot", "free_port"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One engine the embedded fleet may run: a gateway endpoint with a fixed port."""

    name: str
    pool: str
    gpu: str
    config: EngineConfig


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedFleet:
    """Starts (cold) and drains emulated engines to match decisions."""

    def __init__(
        self,
        slots: Sequence[Slot],
        set_state: Callable[[str, EndpointState], None],
        in_flight: Callable[[str], int],
        drain_timeout_s: float = 60.0,
    ) -> None:
        self.slots = {s.name: s for s in slots}
        self.servers: dict[str, EngineServer] = {}
        self.draining: set[str] = set()
        self._set_state = set_state
        self._in_flight = in_flight
        self._drain_timeout_s = drain_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def plan(pool: str, gpu: str, count: int, time_scale: float, prefix: str) -> list[Slot]:
        """``count`` slots on free loopback ports (cold starts on)."""
        return [
            Slot(
                f"{prefix}-{i}",
                pool,
                gpu,
                EngineConfig(
                    model=pool,
                    gpu=gpu,
                    time_scale=time_scale,
                    port=free_port(),
                    cold_start=True,
                    seed=i,
                ),
            )
            for i in range(count)
        ]

    def endpoint_config(self, slot: Slot) -> dict[str, Any]:
        """A slot in the shape of the gateway's endpoint config."""
        server = EngineServer(slot.config) if slot.name not in self.servers else None
        profile = (server or self.servers[slot.name]).model.profile
        return {
            "name": slot.name,
            "url": f"http://{slot.config.host}:{slot.config.port}",
            "kind": "vllm",
            "models": [slot.config.model_name],
            "gpu": slot.gpu,
            "tensor_parallel": profile.tensor_parallel,
            "price_per_hour_usd": profile.price_per_hour_usd,
        }

    def running(self, pool: str, gpu: str) -> list[str]:
        return [
            n for n, s in self.slots.items()
            if s.pool == pool and s.gpu == gpu and n in self.servers and n not in self.draining
        ]  # fmt: skip

    async def start_slot(self, name: str, *, cold: bool = True) -> None:
        slot = self.slots[name]
        server = EngineServer(replace(slot.config, cold_start=cold))
        await server.start()
        self.servers[name] = server

    async def apply(self, decision: ScaleDecision) -> None:
        for gpu in {*decision.desired, *decision.current}:
            have = self.running(decision.pool, gpu)
            want = decision.desired.get(gpu, 0)
            if want > len(have):
                idle = [
                    n for n, s in self.slots.items()
                    if s.pool == decision.pool and s.gpu == gpu and n not in self.servers
                ]  # fmt: skip
                for name in idle[: want - len(have)]:
                    log.info("scale up", extra={"endpoint": name, "pool": decision.pool})
                    await self.start_slot(name)
            for name in reversed(have[want:] if want < len(have) else []):
                self.draining.add(name)
                task = asyncio.create_task(self._drain(name))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _drain(self, name: str) -> None:
        log.info("drain", extra={"endpoint": name})
        self._set_state(name, EndpointState.DRAINING)
        waited = 0.0
        while self._in_flight(name) > 0 and waited < self._drain_timeout_s:
            await asyncio.sleep(0.05)
            waited += 0.05
        server = self.servers.pop(name, None)
        if server is not None:
            await server.stop()
        self.draining.discard(name)
        self._set_state(name, EndpointState.COLD)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        servers, self.servers = self.servers, {}
        await asyncio.gather(*(s.stop() for s in servers.values()), return_exceptions=True)
