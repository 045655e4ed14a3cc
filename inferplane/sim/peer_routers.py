"""Three more peers' routing rules for the simulator's side-by-side comparison (REFERENCE §5).

Each is written from the peer's published rule and default numbers, over the endpoints the
core deems eligible, with the core's types (``route(call, endpoints, now, rng)``):

- ``llm-d`` (Gateway API Inference Extension default scheduling profile): filter, then
  weighted scorers in [0, 1], then the max-score picker (ties at random). Default weights:
  prefix-cache 3, queue 2, KV-cache utilisation 2. The prefix-cache scorer is the default
  approximate one: the share of the prompt's blocks found, longest prefix first, in an
  LRU-bounded per-endpoint record of the blocks of prompts it routed there. Queue: min-max
  normalised waiting count from scraped metrics (1 for the shortest queue, 1 everywhere when
  all are equal). KV: ``1 - kv_usage`` from scraped metrics. The newer "sticky to the prefix
  holder until its TTFT is 18 s worse" profile and criticality shedding are not modelled
  here (shedding is the ``priority-shed`` admission gate).
- ``dynamo-kv`` (NVIDIA Dynamo KV router, default flags): cost = ``w`` x prompt blocks still
  to prefill given the worker's cached overlap + the worker's active blocks; the lowest cost
  wins (``w`` = 1, temperature 0; ties at random). The overlap comes from the KV-event-fed
  prefix index, as Dynamo's router reads its workers' KV events. Active blocks are what the
  router itself tracks: the prompt blocks of the calls it sent to a worker that are still in
  flight there (the oldest are dropped first when the worker's in-flight count shows that
  calls finished). Dynamo's optional busy threshold (503) is off by default and not modelled.
- ``litellm`` (LiteLLM router ``least-busy`` with its default cooldowns): the deployment with
  the fewest in-flight calls the router itself counts (ties at random), skipping deployments
  in cooldown. A deployment cools down for 5 s once more than 50% of its calls in the
  current minute failed, with at least 5 calls in that minute. When every deployment is
  cooling down there is no deployment to pick: the call is refused, as LiteLLM answers
  "no deployments available". (429-triggered cooldowns need an engine that answers 429; the
  simulated engines queue instead.)

Pure: no I/O, no clock; ``now`` and the RNG are passed in.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Sequence

from inferplane.core import routing
from inferplane.core.types import CallContext, EndpointView, RankedEndpoint, RouteDecision


def ranked_decision(
    order: Sequence[EndpointView], scores: Sequence[float], reason: str
) -> RouteDecision:
    """A decision listing ``order`` (primary first) with the score each was picked by."""
    ranked = tuple(RankedEndpoint(ep.name, s) for ep, s in zip(order, scores, strict=True))
    return RouteDecision(ranked, reason)


def no_endpoint(call: CallContext, why: str = "") -> RouteDecision:
    return RouteDecision((), f"no endpoint can serve model {call.model!r}{why}")


class RoutedBlocks:
    """Per-endpoint LRU sets of the prompt blocks routed there (an approximate prefix tree)."""

    def __init__(self, max_blocks_per_endpoint: int) -> None:
        self._trees: dict[str, OrderedDict[int, None]] = {}
        self._max_blocks = max_blocks_per_endpoint

    def match(self, name: str, keys: Sequence[int]) -> int:
        """Leading blocks of ``keys`` recorded on ``name``."""
        tree = self._trees.get(name)
        if not tree:
            return 0
        n = 0
        for key in keys:
            if key not in tree:
                break
            n += 1
        return n

    def insert(self, name: str, keys: Sequence[int]) -> None:
        tree = self._trees.setdefault(name, OrderedDict())
        for key in keys:
            if key in tree:
                tree.move_to_end(key)
            else:
                tree[key] = None
        while len(tree) > self._max_blocks:
            tree.popitem(last=False)


class LlmD:
    """llm-d's default scheduling profile: weighted prefix, queue and KV scorers, max score."""

    WEIGHT_PREFIX = 3.0
    WEIGHT_QUEUE = 2.0
    WEIGHT_KV = 2.0

    def __init__(self, max_blocks_per_endpoint: int = 200_000) -> None:
        self._routed = RoutedBlocks(max_blocks_per_endpoint)

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        keys = call.prompt_block_keys
        queues = [ep.load.num_waiting for ep in candidates]
        q_lo, q_hi = min(queues), max(queues)
        total = self.WEIGHT_PREFIX + self.WEIGHT_QUEUE + self.WEIGHT_KV
        keyed: list[tuple[float, float, EndpointView]] = []
        for ep, queue in zip(candidates, queues, strict=True):
            prefix = self._routed.match(ep.name, keys) / len(keys) if keys else 0.0
            queue_score = 1.0 if q_hi == q_lo else (q_hi - queue) / (q_hi - q_lo)
            kv_score = 1.0 - min(1.0, max(0.0, ep.load.kv_usage))
            score = (
                self.WEIGHT_PREFIX * prefix
                + self.WEIGHT_QUEUE * queue_score
                + self.WEIGHT_KV * kv_score
            ) / total
            keyed.append((-score, rng.random(), ep))
        keyed.sort(key=lambda item: (item[0], item[1]))
        choice = keyed[0][2]
        self._routed.insert(choice.name, keys)
        return ranked_decision([k[2] for k in keyed], [-k[0] for k in keyed], "llm-d: max score")

    def on_done(self, workflow_id: str | None, endpoint: str, success: bool, now: float) -> None:
        return None


class DynamoKV:
    """Dynamo's KV router: lowest ``w`` x blocks to prefill + active blocks."""

    OVERLAP_WEIGHT = 1.0

    def __init__(
        self, prefix_index: routing.PrefixMatcher | None = None, block_size: int = 16
    ) -> None:
        self.prefix_index = prefix_index
        self._block_size = block_size
        self._active: dict[str, deque[int]] = {}  # endpoint -> prompt blocks of calls sent

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        keys = call.prompt_block_keys
        blocks = max(len(keys), -(-call.num_prompt_tokens // self._block_size))
        overlap: dict[str, int] = {}
        if self.prefix_index is not None and keys:
            overlap = self.prefix_index.match(keys, [ep.name for ep in candidates])
        keyed: list[tuple[float, float, EndpointView]] = []
        for ep in candidates:
            active = self._active.setdefault(ep.name, deque())
            while len(active) > ep.in_flight:
                active.popleft()  # calls that finished there (oldest first)
            prefill = max(0, blocks - overlap.get(ep.name, 0))
            cost = self.OVERLAP_WEIGHT * prefill + sum(active)
            keyed.append((cost, rng.random(), ep))
        keyed.sort(key=lambda item: (item[0], item[1]))
        choice = keyed[0][2]
        self._active[choice.name].append(blocks)
        return ranked_decision(
            [k[2] for k in keyed], [-k[0] for k in keyed], "dynamo-kv: lowest cost"
        )

    def on_done(self, workflow_id: str | None, endpoint: str, success: bool, now: float) -> None:
        return None


class LiteLLMLeastBusy:
    """LiteLLM's least-busy strategy with failure-rate cooldowns."""

    COOLDOWN_S = 5.0
    FAILURE_THRESHOLD = 0.5
    MIN_REQUESTS = 5
    WINDOW_S = 60.0

    def __init__(self) -> None:
        self._minute: dict[str, tuple[int, int, int]] = {}  # endpoint -> (minute, calls, fails)
        self._cool_until: dict[str, float] = {}

    def cooling(self, endpoint: str, now: float) -> bool:
        return self._cool_until.get(endpoint, -1.0) > now

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        warm = [ep for ep in candidates if not self.cooling(ep.name, now)]
        if not warm:
            return no_endpoint(call, f": all {len(candidates)} deployments cooling down")
        keyed = sorted(((ep.in_flight, rng.random(), ep) for ep in warm), key=lambda k: k[:2])
        order = [k[2] for k in keyed]
        return ranked_decision(order, [1.0 / (1 + k[0]) for k in keyed], "litellm: least busy")

    def on_done(self, workflow_id: str | None, endpoint: str, success: bool, now: float) -> None:
        minute = int(now // self.WINDOW_S)
        seen, calls, fails = self._minute.get(endpoint, (minute, 0, 0))
        if seen != minute:
            calls = fails = 0
        calls, fails = calls + 1, fails + (not success)
        self._minute[endpoint] = (minute, calls, fails)
        if calls >= self.MIN_REQUESTS and fails / calls > self.FAILURE_THRESHOLD:
            self._cool_until[endpoint] = now + self.COOLDOWN_S
