"""The caches as the simulator sees them: the same policy, with requests described, not sent.

A simulated call carries no text, so it says what the cache would see: its tenant and model,
an identity of its full request (two calls with the same identity are byte-identical), whether
it is deterministic, and, for the semantic cache, a *topic* (calls of one topic are paraphrases
of one question). Exact hits use the real :class:`LruStore` with the route's TTL and bounds;
semantic hits happen when the topic was answered before (same tenant and model) with the
probability ``semantic_recall`` (measure it with ``bench/cache.py`` for an embedding model and
threshold; false hits are the bench's business, not the model's). Pure: ``now`` and ``rng`` are
arguments, so a simulation stays reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from inferplane.core.cache import (
    CacheEntry,
    CacheLedger,
    CacheStatus,
    PayloadKind,
    sha256_hex,
)
from inferplane.core.cache_config import CacheConfig
from inferplane.core.cache_store import LruStore


@dataclass(frozen=True, slots=True)
class CachedCall:
    """One call, described for the cache model."""

    tenant: str
    model: str
    request_id: str  # identity of the full request: equal ids are identical requests
    deterministic: bool
    topic: str | None = None  # paraphrase group, for the semantic cache
    no_store: bool = False


class CacheModel:
    """Decides hits for simulated calls with the gateway's policy and bounds."""

    def __init__(self, config: CacheConfig, semantic_recall: float = 0.8) -> None:
        if not 0.0 <= semantic_recall <= 1.0:
            raise ValueError("semantic_recall must be within [0, 1]")
        self.config = config
        self.semantic_recall = semantic_recall
        self._exact = LruStore(config.max_entries, config.max_bytes, config.max_entry_bytes)
        self._topics = LruStore(config.semantic_max_rows, config.max_bytes)
        self.ledger = CacheLedger()

    def _eligible(self, call: CachedCall) -> bool:
        route = self.config.route(call.model)
        return (
            route.enabled
            and not call.no_store
            and (call.deterministic or route.allow_nondeterministic)
        )

    @staticmethod
    def _key(*parts: str) -> str:
        return sha256_hex("\x00".join(parts).encode())

    def lookup(self, call: CachedCall, now: float, rng: random.Random) -> CacheStatus:
        """Whether this call would be served from cache (and how)."""
        if not self._eligible(call):
            self.ledger.on_lookup(CacheStatus.BYPASS)
            return CacheStatus.BYPASS
        key = self._key(call.tenant, call.model, call.request_id)
        hit = self._exact.get(key, now)
        if hit is not None and hit.tenant == call.tenant:
            self.ledger.on_hit(hit, CacheStatus.HIT_EXACT)
            self.ledger.on_lookup(CacheStatus.HIT_EXACT)
            return CacheStatus.HIT_EXACT
        route = self.config.route(call.model)
        if route.semantic.enabled and call.topic is not None:
            topic = self._topics.get(self._key(call.tenant, call.model, call.topic), now)
            if topic is not None and rng.random() < self.semantic_recall:
                self.ledger.on_hit(topic, CacheStatus.HIT_SEMANTIC)
                self.ledger.on_lookup(CacheStatus.HIT_SEMANTIC)
                return CacheStatus.HIT_SEMANTIC
        self.ledger.on_lookup(CacheStatus.MISS)
        return CacheStatus.MISS

    def store(
        self,
        call: CachedCall,
        now: float,
        num_bytes: int,
        cost_usd: float = 0.0,
        gpu_seconds: float = 0.0,
    ) -> None:
        """Record a successful answer to a call that missed."""
        if not self._eligible(call):
            return
        route = self.config.route(call.model)
        key = self._key(call.tenant, call.model, call.request_id)
        entry = CacheEntry(
            key=key, tenant=call.tenant, model=call.model, kind=PayloadKind.JSON,
            payload=bytes(max(0, num_bytes)), created_s=now, expires_s=now + route.ttl_s,
            cost_usd=cost_usd, gpu_seconds=gpu_seconds,
        )  # fmt: skip
        self.ledger.stores += int(self._exact.put(entry, now))
        if route.semantic.enabled and call.topic is not None:
            topic_key = self._key(call.tenant, call.model, call.topic)
            self._topics.put(
                CacheEntry(
                    key=topic_key, tenant=call.tenant, model=call.model, kind=PayloadKind.JSON,
                    payload=b"", created_s=now, expires_s=now + route.ttl_s,
                    cost_usd=cost_usd, gpu_seconds=gpu_seconds,
                ),
                now,
            )  # fmt: skip
