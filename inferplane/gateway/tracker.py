"""Endpoint tracking: what the gateway knows about each engine, as EndpointViews for the core.

Each endpoint has one :class:`EndpointState`, its latest scraped load and the gateway's own
count of requests outstanding there. Two loops per endpoint keep this fresh: a metrics scrape
every ``scrape_interval_s`` (vLLM, SGLang or TensorRT-LLM names, see ``exposition``) and a
health check every ``health_interval_s``. The health state machine:

- COLD -> READY on the first healthy check after the gateway starts (the fleet was up);
- COLD -> WARMING when an endpoint that was seen healthy comes back, then READY after
  ``warmup_s`` (the routing core gives warming endpoints a ramped share);
- READY/WARMING -> COLD after ``unhealthy_after`` failed checks, or at once when the proxy
  cannot even connect;
- DRAINING and EJECTED are set by an operator or the reliability layer and only left
  through :meth:`EndpointTracker.set_state`.

When a reliability layer is attached (``attach_reliability``), the views routing reads are
overlaid with its breakers: an ejected endpoint, or a half-open one whose probe slots are
taken, reads EJECTED, so routing skips it. The proxy reports each attempt's TTFT
(``record_ttft``); ``stats`` shows the median of the recent ones next to the breaker state.

Load older than ``stale_after_s`` is not trusted: the view then carries zero engine counts
(its ``observed_at_s`` still shows the age) so routing falls back to in-flight counts.

Views are built once and reused until something they show changes: every change of an
in-flight count, a scrape, a state, or the moment the oldest fresh load turns stale ends
them (a version number counts the changes). One call reads the views several times with
nothing changed in between (admission, routing, dispatch, the breaker's check), so it
builds them once; and the same view objects let the predictor reuse its predictions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from inferplane.config import EndpointConfig, GatewayConfig
from inferplane.core.types import EndpointInfo, EndpointLoad, EndpointState, EndpointView
from inferplane.gateway.exposition import parse_engine_metrics, scrapes_metrics

if TYPE_CHECKING:
    from inferplane.gateway.reliability import Reliability

log = logging.getLogger("inferplane.gateway.tracker")

StateListener = Callable[[str, EndpointState, float], None]

#: TTFTs kept per endpoint for ``recent_ttft_ms``.
_RECENT_TTFTS = 32


@dataclass(slots=True)
class _Tracked:
    """Mutable tracking record of one endpoint (owned by the tracker alone)."""

    info: EndpointInfo
    metrics_url: str
    health_url: str
    state: EndpointState = EndpointState.COLD
    state_since_s: float = 0.0
    load: EndpointLoad = field(default_factory=EndpointLoad)
    in_flight: int = 0
    failed_checks: int = 0
    seen_healthy: bool = False
    scrapes_ok: int = 0
    scrapes_failed: int = 0
    ttfts_s: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT_TTFTS))


@dataclass(slots=True, init=False)
class _ViewCache:
    """Views built at ``built_s`` for tracker version ``version`` (module docstring)."""

    version: int = -1
    built_s: float = math.inf  # a fresh cache answers no time at all
    #: When the oldest load still fresh at build time was observed (None: none was).
    oldest_fresh_s: float | None = None
    by_name: dict[str, EndpointView] = field(default_factory=dict)
    #: model (None: every endpoint) -> its endpoints' views, built on first ask
    pools: dict[str | None, list[EndpointView]] = field(default_factory=dict)

    # Written out (init=False): mypyc compiles it; a generated __init__ runs interpreted.
    def __init__(
        self,
        version: int = -1,
        built_s: float = math.inf,
        oldest_fresh_s: float | None = None,
        by_name: dict[str, EndpointView] | None = None,
        pools: dict[str | None, list[EndpointView]] | None = None,
    ) -> None:
        self.version = version
        self.built_s = built_s
        self.oldest_fresh_s = oldest_fresh_s
        self.by_name = {} if by_name is None else by_name
        self.pools = {} if pools is None else pools


class EndpointTracker:
    """Owns every endpoint's state, load and in-flight count; builds views for routing."""

    def __init__(
        self,
        endpoints: Sequence[EndpointConfig],
        gateway: GatewayConfig,
        clock: Callable[[], float],
        listener: StateListener | None = None,
    ) -> None:
        self._cfg = gateway
        self._clock = clock
        self._listener = listener
        self._version = 0  # counts every change a view shows
        now = clock()
        self._eps: dict[str, _Tracked] = {}
        for ep in endpoints:
            info = ep.info()
            self._eps[info.name] = _Tracked(
                info=info,
                metrics_url=info.url + ep.metrics_path,
                health_url=info.url + ep.health_path,
                state_since_s=now,
            )
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._reliability: Reliability | None = None
        self._cache = _ViewCache()

    def attach_reliability(self, reliability: Reliability) -> None:
        """Overlay the breakers of ``reliability`` on every view from now on."""
        self._reliability = reliability

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Check health once (so a healthy fleet is READY at once), then poll in background."""
        self._session = session
        await asyncio.gather(*(self._check_health(t) for t in self._eps.values()))
        for tracked in self._eps.values():
            self._tasks.append(asyncio.create_task(self._health_loop(tracked)))
            if scrapes_metrics(tracked.info.kind):
                self._tasks.append(asyncio.create_task(self._scrape_loop(tracked)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # ---- what others read and report --------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        return tuple(self._eps)

    def info(self, name: str) -> EndpointInfo:
        return self._eps[name].info

    def state(self, name: str) -> EndpointState:
        return self._eps[name].state

    def in_flight(self, name: str) -> int:
        return self._eps[name].in_flight

    def views(self, now: float, model: str | None = None) -> list[EndpointView]:
        """Snapshots of the endpoints (only those serving ``model`` when given)."""
        cache = self._current(now)
        pool = cache.pools.get(model)
        if pool is None:
            pool = cache.pools[model] = [
                v for v in cache.by_name.values() if model is None or model in v.info.models
            ]
        rel = self._reliability
        if rel is not None and rel.config.breaker.enabled:
            rel.maybe_sweep(now)
            return rel.board.overlay(pool)
        return list(pool)

    def view(self, name: str, now: float) -> EndpointView:
        """One endpoint's snapshot (as in :meth:`views`, without the breaker overlay)."""
        return self._current(now).by_name[name]

    def _current(self, now: float) -> _ViewCache:
        """The cached views, rebuilt when something they show changed since."""
        cache = self._cache
        oldest = cache.oldest_fresh_s
        if (
            cache.version != self._version
            or not now >= cache.built_s
            or (oldest is not None and now - oldest > self._cfg.stale_after_s)
        ):
            cache = self._cache = self._build(now)
        return cache

    def _build(self, now: float) -> _ViewCache:
        stale_after = self._cfg.stale_after_s
        cache = _ViewCache(self._version, now)
        for t in self._eps.values():
            load = t.load
            seen_s = load.observed_at_s
            if seen_s is not None:
                if now - seen_s > stale_after:
                    load = EndpointLoad(observed_at_s=seen_s)
                elif cache.oldest_fresh_s is None or seen_s < cache.oldest_fresh_s:
                    cache.oldest_fresh_s = seen_s
            view = EndpointView(t.info, t.state, load, t.in_flight, t.state_since_s)
            cache.by_name[t.info.name] = view
        return cache

    def observe_load(self, name: str, load: EndpointLoad) -> None:
        """``name``'s engine load as last read (by its scrape; tests set one directly)."""
        self._eps[name].load = load
        self._version += 1

    def acquire(self, name: str) -> None:
        self._eps[name].in_flight += 1
        self._version += 1

    def release(self, name: str) -> None:
        tracked = self._eps[name]
        tracked.in_flight = max(0, tracked.in_flight - 1)
        self._version += 1

    def record_ttft(self, name: str, ttft_s: float) -> None:
        """An attempt on ``name`` produced its first token after ``ttft_s``."""
        self._eps[name].ttfts_s.append(ttft_s)

    def recent_ttft_ms(self, name: str) -> float | None:
        """Median TTFT of the endpoint's recent attempts (None: none yet)."""
        ttfts = self._eps[name].ttfts_s
        return round(statistics.median(ttfts) * 1000, 1) if ttfts else None

    def report_connect_error(self, name: str, why: str = "connect error") -> None:
        """The proxy could not connect (or the engine said it is unavailable, HTTP 503): take
        the endpoint out until health says otherwise. An engine that restarted cold answers
        at once with an empty queue, so routing would otherwise rank it first until the next
        failed health checks."""
        tracked = self._eps[name]
        if tracked.state.accepts_work:
            self._set(tracked, EndpointState.COLD, self._clock(), why)

    def set_state(self, name: str, state: EndpointState) -> None:
        """Operator or reliability decision (e.g. DRAINING, EJECTED, back to READY)."""
        self._set(self._eps[name], state, self._clock(), "set explicitly")

    def stats(self, now: float) -> list[dict[str, object]]:
        """JSON-able per-endpoint tracking state for /v1/stats."""
        return [
            {
                "name": t.info.name,
                "gpu": t.info.gpu,
                "models": list(t.info.models),
                "price_per_hour_usd": t.info.price_per_hour_usd,
                "state": t.state.value,
                "state_for_s": round(now - t.state_since_s, 3),
                "in_flight": t.in_flight,
                "num_waiting": t.load.num_waiting,
                "num_running": t.load.num_running,
                "kv_usage": round(t.load.kv_usage, 4),
                "load_age_s": None if t.load.observed_at_s is None else round(t.load.age_s(now), 3),
                "scrapes_ok": t.scrapes_ok,
                "scrapes_failed": t.scrapes_failed,
                "breaker": self._breaker_state(t.info.name),
                "recent_ttft_ms": self.recent_ttft_ms(t.info.name),
            }
            for t in self._eps.values()
        ]

    def _breaker_state(self, name: str) -> str:
        rel = self._reliability
        return "closed" if rel is None else rel.breaker_state(name)

    # ---- loops -----------------------------------------------------------------------------

    def _set(self, t: _Tracked, state: EndpointState, now: float, why: str) -> None:
        if t.state is state:
            return
        log.info(
            "endpoint state",
            extra={"endpoint": t.info.name, "from": t.state.value, "to": state.value, "why": why},
        )
        t.state = state
        t.state_since_s = now
        self._version += 1
        if self._listener is not None:
            self._listener(t.info.name, state, now)

    async def _health_loop(self, t: _Tracked) -> None:
        while True:
            await asyncio.sleep(self._cfg.health_interval_s)
            await self._check_health(t)

    async def _check_health(self, t: _Tracked) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self._cfg.health_timeout_s)
        try:
            async with self._session.get(t.health_url, timeout=timeout) as resp:
                await resp.read()
                healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            healthy = False
        self._on_health(t, healthy, self._clock())

    def _on_health(self, t: _Tracked, healthy: bool, now: float) -> None:
        if t.state in (EndpointState.DRAINING, EndpointState.EJECTED):
            return
        if not healthy:
            t.failed_checks += 1
            if t.state.accepts_work and t.failed_checks >= self._cfg.unhealthy_after:
                self._set(t, EndpointState.COLD, now, "health check failed")
            return
        t.failed_checks = 0
        if t.state is EndpointState.COLD:
            came_back = t.seen_healthy and self._cfg.warmup_s > 0
            self._set(
                t, EndpointState.WARMING if came_back else EndpointState.READY, now, "healthy"
            )
        elif t.state is EndpointState.WARMING and now - t.state_since_s >= self._cfg.warmup_s:
            self._set(t, EndpointState.READY, now, "warm-up done")
        t.seen_healthy = True

    async def _scrape_loop(self, t: _Tracked) -> None:
        while True:
            await self._scrape(t)
            await asyncio.sleep(self._cfg.scrape_interval_s)

    async def _scrape(self, t: _Tracked) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=max(self._cfg.scrape_interval_s * 5, 0.5))
        try:
            async with self._session.get(t.metrics_url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                text = await resp.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeError):
            t.scrapes_failed += 1
            return
        sample = parse_engine_metrics(text, t.info.kind)
        old = t.load
        load = EndpointLoad(
            num_waiting=old.num_waiting if sample.num_waiting is None else sample.num_waiting,
            num_running=old.num_running if sample.num_running is None else sample.num_running,
            kv_usage=old.kv_usage if sample.kv_usage is None else sample.kv_usage,
            observed_at_s=self._clock(),
        )
        self.observe_load(t.info.name, load)
        t.scrapes_ok += 1
