"""The gateway's routing brain: the long-lived state the policy core routes with, fed live.

``inferplane.core.routing.route`` is pure; what makes it smart is the state passed in, and
that state must outlive a call and learn from each one. This module owns it for one gateway:

* the :class:`LatencyPredictor`, started from the engine profile of each emulated endpoint
  (:mod:`inferplane.gateway.priors`) and fed every dispatch, first token (measured TTFT)
  and finish (measured time per output token);
* the :class:`AffinityTable`: workflow id -> the endpoint that served its last step;
* the :class:`PrefixIndex`, fed two ways: precisely by the KV events of endpoints whose
  config has ``kv_events`` (one :class:`KVEventSubscriber` for all of them), and
  speculatively by every route (``record_route``), so a burst of calls sharing a prefix
  lands together before the engine's events arrive;
* the prompt's block keys. They must be the keys of the very tokens the engine caches,
  so they are computed only for models served by emulated endpoints, whose tokenizer is
  the built-in one (chat template for chat calls; token ids or text for completions). For
  a real engine without a tokenizer the call carries no keys and routing falls back to
  workflow affinity (an approximate text-keyed index would never match precise events).

Counters of what the index predicted (calls routed onto a cached prefix, tokens expected
cached) sit next to what engines reported (``cached_tokens`` in usage) in ``stats()``, and
every keyed route is audited against the endpoint holding most of the prompt's blocks
(``routed_<PrefixOutcome>``): a call that left the holder says whether the holder was
filtered out (its state) or outscored (both endpoints' per-axis scores and reasons, for
the first misses and then one in ``_EXPLAIN_EVERY``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferplane.config import FleetConfig
from inferplane.core.affinity import AffinityTable
from inferplane.core.predictor import LatencyEstimate, LatencyPredictor
from inferplane.core.prefix_index import IndexSource, PrefixIndex, PrefixIndexConfig, block_keys
from inferplane.core.routing import route
from inferplane.core.types import CallContext, EndpointView, RouteDecision
from inferplane.gateway.context import ApiKind
from inferplane.gateway.kv_subscriber import KVEventSubscriber, KVSource, LinkState
from inferplane.gateway.priors import prior_for_endpoint
from inferplane.tokenizer import TemplateError, get_tokenizer

#: Prompts longer than this many tokens are not keyed (bounds the per-call hashing work).
MAX_KEYED_TOKENS = 262_144
_MAX_TRACKED = 100_000  # calls in flight whose usage is matched against the prediction
_MAX_MISS_SAMPLES = 16  # explained prefix misses kept for /v1/stats
_EXPLAIN_EVERY = 64  # past the first misses, one in this many is explained
#: A workflow with no call for this long no longer counts as live on its endpoint.
LIVE_WORKFLOW_IDLE_S = 30.0

log = logging.getLogger("inferplane.gateway.router")


class PrefixOutcome(enum.Enum):
    """How a keyed call's primary compares with the endpoint holding most of its blocks."""

    ON_BEST_HOLDER = "on_best_holder"  # the primary holds as many leading blocks as any
    NO_HOLDER = "no_holder"  # no endpoint of the model holds any block
    HOLDER_NOT_CANDIDATE = "holder_not_candidate"  # filtered (state, ejected, excluded)
    HOLDER_OUTSCORED = "holder_outscored"  # ranked below the primary


@dataclass(frozen=True, slots=True)
class PromptKeys:
    """A prompt's exact token count and its block keys (empty when unknown)."""

    num_tokens: int | None
    keys: tuple[int, ...]


_NO_KEYS = PromptKeys(None, ())


def prompt_token_ids(path: str, body: Mapping[str, Any]) -> list[int] | None:
    """The token ids an emulated engine computes for this body, or None when it would not
    accept it (the engine answers that error itself)."""
    tokenizer = get_tokenizer()
    try:
        if path == ApiKind.CHAT:
            continue_final = body.get("continue_final_message") is True
            add_generation = body.get("add_generation_prompt", not continue_final)
            return tokenizer.apply_chat_template(
                body.get("messages") or [],
                add_generation_prompt=add_generation is True,
                continue_final_message=continue_final,
            )
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            add_special = body.get("add_special_tokens", True) is not False
            return tokenizer.encode(prompt, add_special_tokens=add_special)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
    except (TemplateError, ValueError, TypeError):
        return None
    return None


@dataclass(slots=True)
class _PrefixCounters:
    calls_keyed: int = 0  # calls routed with block keys
    calls_on_cached_prefix: int = 0  # ... whose primary held some of their blocks
    predicted_cached_tokens: int = 0
    reported_prompt_tokens: int = 0  # usage of keyed calls, as engines reported it
    reported_cached_tokens: int = 0


class GatewayRouter:
    """Routing state of one gateway; used from its event loop only."""

    def __init__(self, fleet: FleetConfig, seed: int = 0) -> None:
        cfg = self.config = fleet.routing
        self.rng = random.Random(seed)
        self.predictor = LatencyPredictor(cfg.predictor)
        self.affinity = AffinityTable(cfg.affinity_ttl_s, cfg.max_affinities)
        self.index = PrefixIndex(PrefixIndexConfig(block_size=cfg.block_size))
        self._sources: list[KVSource] = []
        for ep in fleet.endpoints:
            prior = prior_for_endpoint(ep)
            if prior is not None:
                self.predictor.set_prior(ep.name, prior)
            if ep.kv_events is not None:
                kv = ep.kv_events
                self._sources.append(KVSource(ep.name, kv.endpoint, kv.replay_endpoint, kv.topic))
                self.index.add_endpoint(ep.name, IndexSource.PRECISE)
        self._keyed_models = frozenset(
            m for ep in fleet.endpoints if ep.emulated for m in ep.models
        )
        self.subscriber: KVEventSubscriber | None = None
        self._keys_of: dict[str, tuple[int, ...]] = {}  # dispatched call -> its keys
        self._counts = _PrefixCounters()
        self.outcomes: Counter[str] = Counter()  # PrefixOutcome value -> routes
        # Live workflows: id -> (endpoint of its last call, when), oldest first; and per
        # endpoint how many (a new session is placed by the contexts endpoints hold).
        self._live: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._live_counts: Counter[str] = Counter()
        self.miss_samples: deque[dict[str, Any]] = deque(maxlen=_MAX_MISS_SAMPLES)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the KV events of every endpoint that publishes them."""
        if self._sources and self.subscriber is None:
            self.subscriber = KVEventSubscriber(self.index)
            for source in self._sources:
                self.subscriber.add(source)

    async def stop(self) -> None:
        if self.subscriber is not None:
            await self.subscriber.close()
            self.subscriber = None

    # ---- one call ---------------------------------------------------------------------------

    def prompt_keys(self, path: str, body: Mapping[str, Any], models: Sequence[str]) -> PromptKeys:
        """Exact token count and block keys, when some target's tokenizer is known."""
        if not any(m in self._keyed_models for m in models):
            return _NO_KEYS
        ids = prompt_token_ids(path, body)
        if ids is None or len(ids) > MAX_KEYED_TOKENS:
            return _NO_KEYS
        return PromptKeys(len(ids), tuple(block_keys(ids, self.config.block_size)))

    def route(self, call: CallContext, views: Sequence[EndpointView], now: float) -> RouteDecision:
        decision = route(
            call,
            views,
            now,
            self.rng,
            config=self.config,
            predictor=self.predictor,
            prefix_index=self.index if call.prompt_block_keys else None,
            affinity_endpoint=self.affinity.get(call.workflow_id, now),
            live_workflows=self.live_workflows(now) if call.workflow_id else None,
        )
        if call.prompt_block_keys and decision.ranked:
            self._audit(call, views, decision, now)
        return decision

    def _audit(
        self, call: CallContext, views: Sequence[EndpointView], decision: RouteDecision, now: float
    ) -> None:
        """Count how the primary compares with the best prefix holder; explain a miss."""
        blocks = self.index.match(call.prompt_block_keys, [v.name for v in views])
        primary = decision.ranked[0].name
        holder = max(blocks, key=blocks.__getitem__)
        best = blocks[holder]
        if blocks.get(primary, 0) >= best:
            outcome = PrefixOutcome.NO_HOLDER if best == 0 else PrefixOutcome.ON_BEST_HOLDER
            self.outcomes[outcome.value] += 1
            return
        if all(r.name != holder for r in decision.ranked):
            outcome = PrefixOutcome.HOLDER_NOT_CANDIDATE
            state = next(v.state.value for v in views if v.name == holder)
            sample: dict[str, Any] = {"holder_state": state}
        else:
            outcome = PrefixOutcome.HOLDER_OUTSCORED
            sample = {}
        seen = self.outcomes[outcome.value] = self.outcomes[outcome.value] + 1
        if seen > _MAX_MISS_SAMPLES and seen % _EXPLAIN_EVERY:
            return  # explaining routes again: only the first misses, then a sample
        if outcome is PrefixOutcome.HOLDER_OUTSCORED:
            sample = self._explain_miss(call, views, primary, holder, now)
        sample.update(outcome=outcome.value, primary=primary, holder=holder, blocks=best)
        sample.update(primary_blocks=blocks.get(primary, 0), of=len(call.prompt_block_keys))
        self.miss_samples.append(sample)
        log.debug("prefix miss", extra=sample)

    def _explain_miss(
        self, call: CallContext, views: Sequence[EndpointView], primary: str, holder: str,
        now: float,
    ) -> dict[str, Any]:  # fmt: skip
        """Per-axis scores of the primary and the holder (routed again, explained; a
        separate RNG so the live decisions are unchanged)."""
        cfg = self.config.model_copy(update={"explain_top": len(views)})
        live = self.live_workflows(now) if call.workflow_id else None
        again = route(call, views, now, random.Random(0), config=cfg, predictor=self.predictor,
                      prefix_index=self.index, live_workflows=live,
                      affinity_endpoint=self.affinity.get(call.workflow_id, now))  # fmt: skip
        out: dict[str, Any] = {}
        for ranked in again.ranked:
            if ranked.name in (primary, holder):
                role = "primary_axes" if ranked.name == primary else "holder_axes"
                out[role] = {a.axis: [round(a.score, 3), a.reason] for a in ranked.axes}
                out[role.replace("axes", "score")] = round(ranked.score, 4)
        return out

    def on_dispatch(
        self, key: str, call: CallContext, view: EndpointView, now: float
    ) -> LatencyEstimate:
        """``call`` (tracked as ``key``) is sent to ``view``'s endpoint now; returns the
        prediction it is tracked against (the breaker judges the attempt by it too)."""
        name = view.name
        cached = 0
        keys = call.prompt_block_keys
        if keys:
            blocks = self.index.match(keys, (name,)).get(name, 0)
            cached = min(call.num_prompt_tokens, blocks * self.config.block_size)
            if key not in self._keys_of:  # the first attempt
                counts = self._counts
                counts.calls_keyed += 1
                counts.calls_on_cached_prefix += cached > 0
                counts.predicted_cached_tokens += cached
                while len(self._keys_of) >= _MAX_TRACKED:
                    del self._keys_of[next(iter(self._keys_of))]
            self.index.record_route(name, keys, now)
            self._keys_of[key] = keys
        self._track_workflow(call, name, now)
        uncached = max(0, call.num_prompt_tokens - cached)
        estimate = self.predictor.predict(view, call.model, uncached, now)
        self.predictor.on_dispatch(key, name, uncached, estimate, call.max_tokens)
        return estimate

    def _track_workflow(self, call: CallContext, endpoint: str, now: float) -> None:
        """The workflow's context now lives on ``endpoint``, until its last step or
        ``LIVE_WORKFLOW_IDLE_S`` without a call."""
        workflow = call.workflow_id
        if workflow is None:
            return
        old = self._live.pop(workflow, None)
        if old is not None:
            self._live_counts[old[0]] -= 1
        step, steps = call.workflow_step, call.workflow_steps
        if step is not None and steps is not None and step >= steps:
            return  # its last call: the context will not be asked for again
        self._live[workflow] = (endpoint, now)
        self._live_counts[endpoint] += 1
        while len(self._live) > _MAX_TRACKED:
            self._live_counts[self._live.popitem(last=False)[1][0]] -= 1

    def live_workflows(self, now: float) -> dict[str, int]:
        """Per endpoint, the live workflows whose last call it served."""
        live = self._live
        while live and now - next(iter(live.values()))[1] > LIVE_WORKFLOW_IDLE_S:
            self._live_counts[live.popitem(last=False)[1][0]] -= 1
        return {name: n for name, n in self._live_counts.items() if n > 0}

    def on_first_token(self, key: str, ttft_s: float, now: float) -> None:
        self.predictor.on_first_token(key, ttft_s, now)

    def on_finish(
        self,
        key: str,
        now: float,
        *,
        tpot_s: float | None,
        usage: tuple[int, int] | None = None,
    ) -> None:
        """The call ended; ``usage`` is (prompt, cached) tokens the engine reported."""
        self.predictor.on_finish(key, now, tpot_s=tpot_s)
        if self._keys_of.pop(key, None) is not None and usage is not None:
            self._counts.reported_prompt_tokens += usage[0]
            self._counts.reported_cached_tokens += usage[1]

    def remember_workflow(self, workflow_id: str | None, endpoint: str, now: float) -> None:
        if workflow_id is not None:
            self.affinity.record(workflow_id, endpoint, now)

    # ---- what it knows ----------------------------------------------------------------------

    def kv_event_status(self) -> dict[str, dict[str, Any]]:
        if self.subscriber is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name, status in self.subscriber.status().items():
            row = dataclasses.asdict(status)
            row["state"] = status.state.value
            row.pop("endpoint")
            out[name] = row
        return out

    def connected(self) -> dict[str, bool]:
        if self.subscriber is None:
            return {}
        return {n: s.state is LinkState.CONNECTED for n, s in self.subscriber.status().items()}

    def prefix_stats(self) -> dict[str, Any]:
        counts = dataclasses.asdict(self._counts)
        prompt = self._counts.reported_prompt_tokens
        counts["reported_hit_rate"] = (
            round(self._counts.reported_cached_tokens / prompt, 4) if prompt else None
        )
        counts["index"] = dataclasses.asdict(self.index.stats())
        for outcome in PrefixOutcome:  # flat numbers: they are exported as gauges too
            counts[f"routed_{outcome.value}"] = self.outcomes[outcome.value]
        counts["miss_samples"] = list(self.miss_samples)
        counts["keyed_models"] = sorted(self._keyed_models)
        return counts

    def stats(self) -> dict[str, Any]:
        """JSON-able routing state for /v1/stats."""
        return {
            "prefix": self.prefix_stats(),
            "kv_events": self.kv_event_status(),
            "affinities": len(self.affinity),
            "live_workflows": len(self._live),
            "predictor_pending": self.predictor.num_pending(),
        }
