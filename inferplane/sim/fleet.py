"""The simulated fleet: one clock-free engine model per endpoint of a fleet config.

Each endpoint of the config (the file ``inferplane serve`` takes) becomes an ``EngineModel``
with the profile ``load_profile(first served model, gpu, tensor_parallel)``. The fleet builds
the ``EndpointView`` snapshots the policy core routes on, the way the gateway does: engine
load as last *scraped* (refreshed every scrape interval, so routing sees data as stale as the
live gateway would), plus the simulator's own in-flight counts, which are always current.
"""

from __future__ import annotations

import dataclasses

from inferplane.config import EndpointConfig, FleetConfig
from inferplane.core.types import EndpointInfo, EndpointLoad, EndpointState, EndpointView
from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import available_gpus, available_models, load_profile
from inferplane.engine.types import EngineState

_VIEW_STATE = {
    EngineState.READY: EndpointState.READY,
    EngineState.LOADING: EndpointState.COLD,
    EngineState.COLD: EndpointState.COLD,
}


class FleetError(ValueError):
    """A fleet config the simulator cannot model (unknown model or GPU profile)."""


class SimEndpoint:
    """One replica: its config, its engine model and the simulator's bookkeeping."""

    __slots__ = (
        "_changed",
        "_draining",
        "_in_flight",
        "_stopped_s",
        "config",
        "engine",
        "index",
        "info",
        "load",
        "provisioned_s",
        "wake_at_s",
    )

    def __init__(
        self,
        index: int,
        config: EndpointConfig,
        engine: EngineModel,
        provisioned_s: float,
        changed: set[int] | None = None,
    ) -> None:
        self.index = index
        self.config = config
        self.engine = engine
        info = config.info()
        if info.max_model_len is None:  # the gateway would learn it from /v1/models
            info = dataclasses.replace(info, max_model_len=engine.max_model_len)
        self.info: EndpointInfo = info
        self._in_flight = 0
        self.load = EndpointLoad()
        self.provisioned_s = provisioned_s
        self.wake_at_s: float | None = None  # the engine wake-up the event queue holds
        #: the fleet's set of changed endpoint indexes (a view reader empties it)
        self._changed: set[int] = set() if changed is None else changed
        self._draining = False
        self._stopped_s: float | None = None

    @property
    def in_flight(self) -> int:
        """Calls the simulator sent here that have not ended (always current)."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self._in_flight = value
        self._changed.add(self.index)

    @property
    def draining(self) -> bool:
        """Scale-down: takes no new work, finishes what it holds."""
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        self._changed.add(self.index)

    @property
    def stopped_s(self) -> float | None:
        """When it drained and went (None: still up): no views, no more spend."""
        return self._stopped_s

    @stopped_s.setter
    def stopped_s(self, value: float | None) -> None:
        self._stopped_s = value
        self._changed.add(self.index)

    def cost_s(self, now: float) -> float:
        """Seconds this replica has cost money by ``now`` (from start to stop)."""
        end = now if self.stopped_s is None else min(now, self.stopped_s)
        return max(0.0, end - self.provisioned_s)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def view_state(self) -> EndpointState:
        if self.draining:
            return EndpointState.DRAINING
        return _VIEW_STATE[self.engine.state]

    def view(self) -> EndpointView:
        """The router's snapshot of it now: last scraped load, current in-flight count."""
        return EndpointView(self.info, self.view_state, self.load, self.in_flight)

    def scrape(self, now: float) -> None:
        """Take the engine's load at ``now`` as the gateway's latest observation (read in
        closed form when it is only decoding quietly and was not advanced: ``load_at``)."""
        engine = self.engine
        self.load = EndpointLoad(*(engine.load_at(now) or engine.load()), now)


def engine_for(
    config: EndpointConfig, seed: int, start_state: EngineState, *, kv_events: bool = True
) -> EngineModel:
    """The engine model of one endpoint; a clear error when no profile matches it
    (``kv_events=False``: it reports no KV events, for a run that feeds no prefix index)."""
    model = config.models[0]
    if model not in available_models():
        known = ", ".join(available_models())
        raise FleetError(
            f"endpoint {config.name!r}: model {model!r} has no engine profile "
            f"(the simulator models the first served model; known: {known})"
        )
    if config.gpu not in available_gpus():
        known = ", ".join(available_gpus())
        raise FleetError(f"endpoint {config.name!r}: unknown gpu {config.gpu!r} (known: {known})")
    try:
        profile = load_profile(model, config.gpu, config.tensor_parallel)
    except ValueError as exc:
        raise FleetError(f"endpoint {config.name!r}: {exc}") from None
    # ignore_eos calls whose answers nobody reads: the same times and KV, no token hashing;
    # prompts are text tokens by construction (sim/prompts.py): no range check per call
    return EngineModel(
        profile, seed=seed, start_state=start_state, now=0.0, content_free=True,
        check_token_ids=False, kv_events=kv_events,
    )  # fmt: skip


class Fleet:
    """Every endpoint of the run, in config order, plus replicas added by scale-out."""

    def __init__(
        self, config: FleetConfig, seed: int, scrape_interval_s: float, *, kv_events: bool = True
    ) -> None:
        self.config = config
        #: whether the engines report KV events (off when no prefix index reads them: the
        #: engines skip building a ``BlockStored`` per cached block run, tokens and all)
        self.kv_events = kv_events
        self._seed = seed
        self.scrape_interval_s = scrape_interval_s
        self.endpoints: list[SimEndpoint] = []
        self.by_name: dict[str, SimEndpoint] = {}
        #: Indexes of endpoints whose view may have changed since a reader last took them
        #: (:class:`inferplane.sim.views.ViewBook` empties it).
        self.changed: set[int] = set()
        self._last_scrape_s = -float("inf")
        for ep in config.endpoints:
            self._add(ep, EngineState.READY, 0.0)

    def _add(self, config: EndpointConfig, state: EngineState, now: float) -> SimEndpoint:
        index = len(self.endpoints)
        engine_seed = (self._seed * 1_000_003 + index) & 0x7FFF_FFFF
        engine = engine_for(config, engine_seed, state, kv_events=self.kv_events)
        ep = SimEndpoint(index, config, engine, now, self.changed)
        self.changed.add(index)
        self.endpoints.append(ep)
        self.by_name[ep.name] = ep
        return ep

    def add_replica(
        self,
        template: str,
        now: float,
        *,
        gpu: str | None = None,
        price_per_hour_usd: float | None = None,
    ) -> SimEndpoint:
        """A new cold replica shaped like ``template`` (named ``template+N``).

        ``gpu`` (with its price) makes it a replica of the same models on another GPU type.
        """
        base = self.by_name[template].config
        n = 1
        while f"{base.name}+{n}" in self.by_name:
            n += 1
        update: dict[str, object] = {"name": f"{base.name}+{n}"}
        if gpu is not None:
            update["gpu"] = gpu
        if price_per_hour_usd is not None:
            update["price_per_hour_usd"] = price_per_hour_usd
        return self._add(base.model_copy(update=update), EngineState.COLD, now)

    def scrape_due(self, now: float) -> bool:
        """Whether :meth:`views` at ``now`` takes a fresh scrape."""
        return now - self._last_scrape_s >= self.scrape_interval_s

    def views(self, now: float) -> list[EndpointView]:
        """Snapshots for the router: scraped load (refreshed when due) and in-flight counts."""
        if now - self._last_scrape_s >= self.scrape_interval_s:
            self._last_scrape_s = now
            for ep in self.endpoints:
                ep.scrape(now)
        return [ep.view() for ep in self.endpoints if ep.stopped_s is None]

    def context_limit_tokens(self, model: str) -> int:
        """The longest context any endpoint serving ``model`` takes (0 if none serves it)."""
        limits = [ep.info.max_model_len or 0 for ep in self.endpoints if model in ep.info.models]
        return max(limits, default=0)

    def in_region(self, region: str) -> list[SimEndpoint]:
        return [ep for ep in self.endpoints if ep.info.region == region]
