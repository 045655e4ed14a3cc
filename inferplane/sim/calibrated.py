"""The simulator with its router's latency predictor fed as the live gateway feeds its own.

The gateway seeds its predictor with each endpoint's profile prior and calibrates it on every
call's observed TTFT and time per output token (and tells it the prefill work it queued on
each endpoint). A simulator whose predictor is never fed routes and admits on blind
estimates: long critical answers land on slow decoders, deadline checks use the wrong speeds.
:class:`CalibratedSimulation` hooks the runner's dispatch, token, finish and timeout handlers
to :class:`~inferplane.sim.calibration.PredictorFeed`; ``inferplane simulate`` and
``inferplane plan`` run it. Policies other than the core's router are unaffected.
"""

from __future__ import annotations

from typing import Any

from inferplane.core.types import CallContext, EndpointView
from inferplane.engine.types import EngineEvent, RequestFinished, TokensGenerated
from inferplane.sim.baselines import Inferplane
from inferplane.sim.calibration import PredictorFeed
from inferplane.sim.fleet import SimEndpoint
from inferplane.sim.ledger import Call
from inferplane.sim.runner import Simulation

__all__ = ["CalibratedSimulation"]


class CalibratedSimulation(Simulation):
    """A :class:`Simulation` whose core router learns latencies like the gateway's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feed: PredictorFeed | None = None
        self._cached_at_route: dict[str, int] = {}  # engine id -> cached prompt tokens
        if isinstance(self.policy, Inferplane) and self.fleet.endpoints:
            block = self.fleet.endpoints[0].engine.profile.block_size
            self.feed = PredictorFeed(self.policy.predictor, self.policy.prefix_index, block)
            self.feed.set_priors([ep.info for ep in self.fleet.endpoints], {})

    def _dispatch(self, call: Call, now: float, views: list[EndpointView] | None) -> None:
        super()._dispatch(call, now, views)
        endpoint, ctx = call.endpoint, call.ctx
        if self.feed is None or endpoint is None or ctx is None:
            return
        if call.engine_id not in self._by_engine_id:  # refused by the engine
            return
        cached = self._cached_at_route.pop(call.engine_id, None)
        self.feed.dispatched(call.engine_id, ctx, endpoint.view(), now, cached)

    def _record_route(self, ep: SimEndpoint, ctx: CallContext, now: float) -> None:
        if self.feed is not None:  # what the endpoint held before this call's own guesses
            self._cached_at_route[ctx.request_id] = self.feed.cached_tokens(ctx, ep.name)
        super()._record_route(ep, ctx, now)

    def _handle(self, ep: SimEndpoint, events: list[EngineEvent]) -> list[EngineEvent]:
        others = super()._handle(ep, events)
        if self.feed is None:
            return others
        for ev in others:
            if type(ev) is TokensGenerated:
                call = self._by_engine_id.get(ev.request_id)
                if call is not None and call.first_token_s == ev.time_s:
                    self.feed.first_token(ev.request_id, ev.time_s)
        return others

    def _on_finished(self, ep: SimEndpoint, ev: RequestFinished) -> None:
        if self.feed is not None:
            self.feed.finished(ev.request_id, ev.time_s, ev.num_completion_tokens)
        super()._on_finished(ep, ev)

    def _on_timeout(self, payload: tuple[int, int]) -> None:
        call = self._open.get(payload[0])  # before the timeout may close it
        super()._on_timeout(payload)
        if call is None:
            return  # closed before: its last attempt's end was fed then
        if self.feed is not None and call.engine_id not in self._by_engine_id:
            self.feed.finished(call.engine_id, self.q.now_s, 0)
