"""What the gateway tells its latency predictor, told in virtual time.

The live gateway starts its predictor from each emulated endpoint's engine profile
(:func:`inferplane.gateway.priors.prior_from_profile`) and calibrates it online with every
call's observed TTFT and TPOT (``on_dispatch``, ``on_first_token``, ``on_finish``). A
simulated run whose predictor has neither sees every GPU as the default prior (an H100)
forever: routing and admission then cannot tell a slow decoder from a fast one, and a
critical call with a long answer lands on an A100 it cannot finish on in time (the misses
of ``bench/overload.py`` before this feed).

:class:`PredictorFeed` gives a simulated run the same inputs: priors for every endpoint of
the fleet at the start, then the three observations per call, with the uncached prompt
taken from the prefix index the router itself matches against. The simulator calls it at
dispatch, at a call's first token and when it finishes; ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inferplane.core.predictor import LatencyPredictor
from inferplane.core.routing import PrefixMatcher
from inferplane.core.types import CallContext, EndpointInfo, EndpointView
from inferplane.engine.profiles import load_profile
from inferplane.gateway.priors import prior_from_profile

__all__ = ["PredictorFeed"]


class PredictorFeed:
    """Priors from engine profiles and per-call observations for one run's predictor."""

    def __init__(
        self,
        predictor: LatencyPredictor,
        prefix_index: PrefixMatcher | None = None,
        block_size: int = 16,
        time_scale: float = 1.0,
    ) -> None:
        self.predictor = predictor
        self._index = prefix_index
        self._block_size = block_size
        self._time_scale = time_scale
        self._dispatched_s: dict[str, float] = {}
        self._first_s: dict[str, float] = {}

    def set_priors(self, endpoints: Iterable[EndpointInfo], model_of: Mapping[str, str]) -> int:
        """Give each endpoint the prior of the engine it runs (``model_of``: endpoint ->
        engine model); returns how many got one (unknown profiles keep the default)."""
        count = 0
        for info in endpoints:
            model = model_of.get(info.name) or (info.models[0] if info.models else "")
            try:
                profile = load_profile(model, info.gpu, info.tensor_parallel)
            except (KeyError, ValueError):
                continue
            self.predictor.set_prior(info.name, prior_from_profile(profile, self._time_scale))
            count += 1
        return count

    def cached_tokens(self, call: CallContext, endpoint: str) -> int:
        """Prompt tokens of ``call`` the index says ``endpoint`` holds (ask before the
        route's own guesses are recorded, as the gateway's ``on_dispatch`` does)."""
        if self._index is None or not call.prompt_block_keys:
            return 0
        blocks = self._index.match(call.prompt_block_keys, (endpoint,)).get(endpoint, 0)
        return min(call.num_prompt_tokens, blocks * self._block_size)

    def dispatched(
        self, key: str, call: CallContext, view: EndpointView, now: float, cached: int | None = None
    ) -> None:
        """``call`` (tracked as ``key``) was submitted to ``view``'s endpoint at ``now``, with
        ``cached`` prompt tokens held there (None: ask the index now)."""
        if cached is None:
            cached = self.cached_tokens(call, view.name)
        uncached = max(0, call.num_prompt_tokens - cached)
        estimate = self.predictor.predict(view, call.model, uncached, now)
        self.predictor.on_dispatch(key, view.name, uncached, estimate, call.max_tokens)
        self._dispatched_s[key] = now

    def first_token(self, key: str, now: float) -> None:
        sent_s = self._dispatched_s.get(key)
        if sent_s is None or key in self._first_s:
            return
        self._first_s[key] = now
        self.predictor.on_first_token(key, now - sent_s, now)

    def finished(self, key: str, now: float, num_output_tokens: int) -> None:
        """The call ended (any way); its decode speed calibrates TPOT when measurable."""
        self._dispatched_s.pop(key, None)
        first_s = self._first_s.pop(key, None)
        tpot_s = None
        if first_s is not None and num_output_tokens > 1 and now > first_s:
            tpot_s = (now - first_s) / (num_output_tokens - 1)
        self.predictor.on_finish(key, now, tpot_s=tpot_s)
