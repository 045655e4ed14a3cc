"""Routing policies the simulator compares: the core's router and peers' published rules.

Every policy answers the core's question with the core's types, ``route(call, endpoints,
now, rng) -> RouteDecision``, over the endpoints the core deems eligible (serve the model,
accept work, context fits), so a comparison isolates the choice rule. Policies with memory
(round-robin's cursor, cache-aware's prefix trees) keep it in the policy object, one object
per simulated run. No I/O, no clock; the RNG is the only source of chance.

- ``inferplane``: ``inferplane.core.routing.route``, the live gateway's router, unchanged and
  wired as the gateway wires it: one latency predictor for the run, a workflow affinity
  table recording the endpoint of each workflow's last successful call, and the prefix
  index fed by the engines' KV events (:mod:`inferplane.sim.kvfeed`). ``fcfs`` and
  ``priority-shed`` route the same way; they differ in admission (:mod:`inferplane.sim.gate`).
- ``least-loaded``: the core's ``least_loaded`` baseline (fewest outstanding requests).
- ``round-robin``, ``random``, ``power-of-two``: SGLang / vllm-router policies of those names
  (load for power-of-two: router-counted in-flight requests).
- ``cache-aware``: SGLang / vllm-router ``cache_aware`` (REFERENCE §5): if the load gap is
  large (max - min > 64 and max > 1.5 x min) pick the least loaded; else if the best prefix
  match covers more than 30% of the request pick the worker holding it; else the least
  loaded. The per-worker approximate tree is kept here over prompt blocks instead of
  characters (the simulator has token ids, not text), LRU-bounded per worker.
- ``llm-d``, ``dynamo-kv``, ``litellm``: llm-d's default scorer weights, Dynamo's KV cost and
  LiteLLM's least-busy with cooldowns (:mod:`inferplane.sim.peer_routers`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from inferplane.config import FleetConfig
from inferplane.core import routing
from inferplane.core.affinity import AffinityTable
from inferplane.core.predictor import LatencyPredictor
from inferplane.core.routing_config import RoutingConfig
from inferplane.core.types import CallContext, EndpointView, RankedEndpoint, RouteDecision
from inferplane.gateway.priors import prior_for_endpoint
from inferplane.sim.peer_routers import (
    DynamoKV,
    LiteLLMLeastBusy,
    LlmD,
    RoutedBlocks,
    no_endpoint,
)

POLICY_NAMES: tuple[str, ...] = (
    "inferplane",
    "fcfs",
    "priority-shed",
    "least-loaded",
    "round-robin",
    "random",
    "power-of-two",
    "cache-aware",
    "llm-d",
    "dynamo-kv",
    "litellm",
)

#: Policies routed by the core's pipeline (they differ only in admission).
_CORE = frozenset({"inferplane", "fcfs", "priority-shed"})
#: Policies that read the prefix index fed by the engines' KV events (the runner feeds it):
#: the core's pipeline and Dynamo's KV router.
CORE_ROUTED = _CORE | {"dynamo-kv"}


class Policy(Protocol):
    """A router the simulator can drive, told how each call it routed ended."""

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision: ...

    def on_done(
        self, workflow_id: str | None, endpoint: str, success: bool, now: float
    ) -> None: ...


class _Stateless:
    """Policies that learn nothing from outcomes."""

    def on_done(self, workflow_id: str | None, endpoint: str, success: bool, now: float) -> None:
        return None


def _decision(order: Sequence[EndpointView], reason: str) -> RouteDecision:
    ranked = tuple(
        RankedEndpoint(ep.name, 1.0 / (1 + i)) for i, ep in enumerate(order)
    )  # primary first, the rest as fallbacks in order
    return RouteDecision(ranked, reason)


class Inferplane:
    """The policy core's routing pipeline, with the state the gateway gives it."""

    def __init__(
        self,
        workflow_ttl_s: float = 300.0,
        prefix_index: routing.PrefixMatcher | None = None,
        *,
        config: RoutingConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.predictor = LatencyPredictor(None if config is None else config.predictor)
        self.prefix_index = prefix_index
        max_entries = 100_000 if config is None else config.max_affinities
        self._affinity = AffinityTable(ttl_s=workflow_ttl_s, max_entries=max_entries)
        self._rng = rng  # its own tie-break stream (the gateway's), else the runner's

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        return routing.route(
            call, endpoints, now, rng if self._rng is None else self._rng,
            config=self.config, predictor=self.predictor,
            prefix_index=self.prefix_index if call.prompt_block_keys else None,
            affinity_endpoint=self._affinity.get(call.workflow_id, now),
        )  # fmt: skip

    def affinity_for(self, workflow_id: str | None, now: float) -> str | None:
        """The endpoint of the workflow's last successful call (within the TTL), if any."""
        return self._affinity.get(workflow_id, now)

    def on_done(self, workflow_id: str | None, endpoint: str, success: bool, now: float) -> None:
        if success and workflow_id is not None:
            self._affinity.record(workflow_id, endpoint, now)


def wired_like_gateway(
    fleet: FleetConfig, prefix_index: routing.PrefixMatcher | None = None
) -> Inferplane:
    """The core's router with the state a live gateway builds from the same fleet config.

    As ``inferplane.gateway.router.GatewayRouter`` does: the config's routing section, the
    latency prior of each emulated endpoint read off its engine profile at its time scale,
    the affinity table's TTL and size, and the tie-break RNG seeded with ``gateway.seed``.
    """
    cfg = fleet.routing
    policy = Inferplane(
        cfg.affinity_ttl_s, prefix_index, config=cfg, rng=random.Random(fleet.gateway.seed)
    )
    for ep in fleet.endpoints:
        prior = prior_for_endpoint(ep)
        if prior is not None:
            policy.predictor.set_prior(ep.name, prior)
    return policy


class LeastLoaded(_Stateless):
    """The core's least-loaded baseline."""

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        return routing.least_loaded(call, endpoints, now, rng)


class RoundRobin(_Stateless):
    """Each call to the next eligible endpoint after the previous pick, in fleet order."""

    def __init__(self) -> None:
        self._cursor = 0

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        i = self._cursor % len(candidates)
        self._cursor += 1
        return _decision(candidates[i:] + candidates[:i], "round-robin")


class RandomPick(_Stateless):
    """Uniformly at random among eligible endpoints."""

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        first = rng.randrange(len(candidates))
        return _decision(
            [candidates[first], *candidates[:first], *candidates[first + 1 :]], "random"
        )


class PowerOfTwo(_Stateless):
    """Two eligible endpoints at random; the one with fewer in-flight requests wins."""

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if len(candidates) < 2:
            return _decision(candidates, "power-of-two") if candidates else no_endpoint(call)
        a, b = rng.sample(candidates, 2)
        first, second = (a, b) if a.in_flight <= b.in_flight else (b, a)
        rest = [ep for ep in candidates if ep is not a and ep is not b]
        return _decision([first, second, *rest], "power-of-two")


class CacheAware(_Stateless):
    """SGLang's cache_aware rule over per-endpoint LRU sets of prompt block keys."""

    BALANCE_ABS = 64
    BALANCE_REL = 1.5
    MATCH_THRESHOLD = 0.3

    def __init__(self, max_blocks_per_endpoint: int = 200_000) -> None:
        self._blocks = RoutedBlocks(max_blocks_per_endpoint)

    def route(
        self, call: CallContext, endpoints: Sequence[EndpointView], now: float, rng: random.Random
    ) -> RouteDecision:
        candidates = routing.eligible(call, endpoints)
        if not candidates:
            return no_endpoint(call)
        by_load = sorted(candidates, key=lambda ep: (ep.in_flight, rng.random()))
        lo, hi = by_load[0].in_flight, by_load[-1].in_flight
        keys = call.prompt_block_keys
        if hi - lo > self.BALANCE_ABS and hi > self.BALANCE_REL * lo:
            choice, reason = by_load[0], "cache-aware: imbalanced, least loaded"
        else:
            best, matched = by_load[0], 0
            for ep in by_load:
                n = self._blocks.match(ep.name, keys)
                if n > matched:
                    best, matched = ep, n
            if keys and matched / len(keys) > self.MATCH_THRESHOLD:
                choice, reason = best, "cache-aware: prefix match"
            else:
                choice, reason = by_load[0], "cache-aware: low match, least loaded"
        self._blocks.insert(choice.name, keys)
        return _decision([choice, *[ep for ep in by_load if ep is not choice]], reason)


def make_policy(
    name: str, prefix_index: routing.PrefixMatcher | None = None, fleet: FleetConfig | None = None
) -> Policy:
    """A fresh policy object (its memory starts empty) for one simulated run.

    ``prefix_index`` is what the core's router and Dynamo's match prompts against (the
    policies in ``CORE_ROUTED``; the others keep their own memory or none). With ``fleet``
    the core's router is wired as the gateway wires it for that config
    (:func:`wired_like_gateway`).
    """
    if name in _CORE:
        if fleet is not None:
            return wired_like_gateway(fleet, prefix_index)
        return Inferplane(prefix_index=prefix_index)
    if name == "dynamo-kv":
        return DynamoKV(prefix_index)
    factories: dict[str, type[Policy]] = {
        "least-loaded": LeastLoaded,
        "round-robin": RoundRobin,
        "random": RandomPick,
        "power-of-two": PowerOfTwo,
        "cache-aware": CacheAware,
        "llm-d": LlmD,
        "litellm": LiteLLMLeastBusy,
    }
    if name not in factories:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return factories[name]()


def needs_block_keys(name: str) -> bool:
    """Whether the policy reads ``CallContext.prompt_block_keys`` (costly to compute)."""
    return name in ("cache-aware", "llm-d") or name in CORE_ROUTED
