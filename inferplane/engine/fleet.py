"""A fleet of emulated engines in one process, each on its own port.

A fleet is described by a few ``EngineSpec`` values (model, GPU, tensor parallelism,
count, time scale, KV events and their encoding, price...). Two ways to run it:

    async with Fleet([EngineSpec(count=4, time_scale=10)]) as fleet:   # on this loop
        fleet.engines[0].url, fleet.engines[0].kv_events_endpoint, ...

    with FleetThread([EngineSpec(count=2)]) as fleet:                  # sync callers
        fleet.engines[0].url                  # the engines run on a background loop
        fleet.call(lambda: fleet.engines[0].server.apply_faults(...))

Every engine gets its own aiohttp site on 127.0.0.1 (port 0: a free port, reported in
the handle), its own driver task, metrics registry and, when enabled, ZMQ sockets. The
handles expose the ``EngineServer`` for tests (driver, model, faults) and an
``endpoint_config()`` dict in the shape of the gateway's endpoint configuration.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from inferplane.engine.faults import FaultConfig
from inferplane.engine.kv_publisher import KVEncoding
from inferplane.engine.server import EngineConfig, EngineServer

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """``count`` identical engines. Non-zero ports are bases: engine i gets port + i."""

    model: str = "llama-3-8b"
    gpu: str = "h100"
    tensor_parallel: int | None = None
    count: int = 1
    time_scale: float = 1.0
    kv_events: bool = False
    kv_encoding: KVEncoding = KVEncoding.ARRAY
    price_per_hour_usd: float | None = None  # None: the GPU's list price x tensor parallel
    cold_start: bool = False
    served_model_name: str | None = None
    name_prefix: str | None = None  # endpoint names: f"{prefix}-{i}"
    region: str = "local"
    port: int = 0
    kv_events_port: int = 0
    kv_replay_port: int = 0
    seed: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)
    profile_overrides: tuple[tuple[str, float], ...] = ()  # e.g. (("max_num_seqs", 16),)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("count must be >= 1")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")


def _offset(base: int, index: int) -> int:
    return base + index if base else 0


@dataclass(frozen=True, slots=True)
class EngineHandle:
    """One running engine of a fleet."""

    name: str
    spec: EngineSpec
    server: EngineServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def model_name(self) -> str:
        return self.server.config.model_name

    @property
    def kv_events_endpoint(self) -> str | None:
        pub = self.server.publisher
        return None if pub is None else pub.pub_endpoint

    @property
    def kv_replay_endpoint(self) -> str | None:
        pub = self.server.publisher
        return None if pub is None else pub.replay_endpoint

    @property
    def topic(self) -> str:
        return self.server.topic

    @property
    def price_per_hour_usd(self) -> float:
        if self.spec.price_per_hour_usd is not None:
            return self.spec.price_per_hour_usd
        profile = self.server.model.profile
        return profile.gpu.price_per_hour_usd * profile.tensor_parallel

    def endpoint_config(self) -> dict[str, Any]:
        """This engine in the shape of the gateway's ``EndpointConfig``."""
        entry: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "kind": "vllm",
            "models": [self.model_name],
            "gpu": self.spec.gpu,
            "tensor_parallel": self.server.model.profile.tensor_parallel,
            "price_per_hour_usd": self.price_per_hour_usd,
            "region": self.spec.region,
            "max_model_len": self.server.model.max_model_len,
            "emulated": {
                "time_scale": self.spec.time_scale,
                "engine_model": self.spec.model if self.spec.served_model_name else None,
            },
        }
        if self.spec.profile_overrides:
            entry["emulated"]["overrides"] = dict(self.spec.profile_overrides)
        if self.kv_events_endpoint is not None:
            entry["kv_events"] = {
                "endpoint": self.kv_events_endpoint,
                "replay_endpoint": self.kv_replay_endpoint,
                "topic": self.topic,
            }
        return entry


def engine_configs(specs: Sequence[EngineSpec]) -> list[tuple[str, EngineSpec, EngineConfig]]:
    """The name and ``EngineConfig`` of every engine a fleet description expands to."""
    out: list[tuple[str, EngineSpec, EngineConfig]] = []
    for spec in specs:
        prefix = spec.name_prefix or f"{spec.model}-{spec.gpu}"
        for i in range(spec.count):
            config = EngineConfig(
                model=spec.model,
                gpu=spec.gpu,
                tensor_parallel=spec.tensor_parallel,
                served_model_name=spec.served_model_name,
                time_scale=spec.time_scale,
                seed=spec.seed + len(out),
                port=_offset(spec.port, i),
                kv_events=spec.kv_events,
                kv_events_port=_offset(spec.kv_events_port, i),
                kv_replay_port=_offset(spec.kv_replay_port, i),
                kv_encoding=spec.kv_encoding,
                cold_start=spec.cold_start,
                faults=spec.faults,
                profile_overrides=spec.profile_overrides,
            )
            out.append((f"{prefix}-{i}", spec, config))
    names = [name for name, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError("engine names must be unique; give the specs distinct name_prefix")
    return out


class Fleet:
    """Starts the engines of ``specs`` on the running loop; stops them on exit."""

    def __init__(self, specs: Sequence[EngineSpec]) -> None:
        self._configs = engine_configs(specs)
        self.engines: list[EngineHandle] = []

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    async def start(self) -> None:
        handles = [EngineHandle(n, s, EngineServer(c)) for n, s, c in self._configs]
        try:
            for handle in handles:
                await handle.server.start()
                self.engines.append(handle)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        engines, self.engines = self.engines, []
        await asyncio.gather(*(e.server.stop() for e in engines), return_exceptions=True)

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class FleetThread:
    """A ``Fleet`` on its own event loop in a daemon thread, for synchronous callers."""

    def __init__(self, specs: Sequence[EngineSpec], *, use_uvloop: bool = True) -> None:
        self._fleet = Fleet(specs)
        self._loop = new_event_loop() if use_uvloop else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def engines(self) -> list[EngineHandle]:
        return self._fleet.engines

    @property
    def urls(self) -> list[str]:
        return self._fleet.urls

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = 60.0) -> T:
        """Run ``coro`` on the fleet's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def call(self, fn: Callable[[], T], timeout_s: float | None = 60.0) -> T:
        """Run ``fn()`` on the fleet's loop thread (to touch engine state safely)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(invoke)
        return future.result(timeout_s)

    def start(self) -> FleetThread:
        self._thread.start()
        try:
            self.run(self._fleet.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.run(self._fleet.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FleetThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_until_stdin_closes(specs: Sequence[EngineSpec], out: Path) -> None:
    """Run the engines of ``specs``, write their endpoint configs to ``out`` (JSON) once they
    are up, and stop when stdin closes: a fleet in a child process that its parent stops by
    closing the pipe (the benchmarks' engine process)."""

    async def main() -> None:
        async with Fleet(specs) as fleet:
            endpoints = [e.endpoint_config() for e in fleet.engines]
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, out.write_text, json.dumps(endpoints))
            await loop.run_in_executor(None, sys.stdin.read)

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
