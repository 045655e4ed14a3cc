"""The in-memory state store: the embedded default, and the local side of the resilient one.

Exact for one process (one event loop: every method runs to completion without awaiting, so
a take is atomic). Bounded: buckets, workflows, route records and cache entries are each
capped, dropping the least recently used. Times are passed in; nothing here reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from inferplane.core.state import (
    BucketLevel,
    BucketSpec,
    BucketTake,
    Ejection,
    StoreMode,
    TakeResult,
    WorkflowDelta,
    after_take,
    apply_workflow_delta,
    decide_take,
    level_at,
    match_length,
)
from inferplane.core.workflows import WorkflowRecord

__all__ = ["MemoryStore"]


class MemoryStore:
    """Implements :class:`~inferplane.core.state.StateStore` in this process's memory."""

    def __init__(
        self,
        *,
        max_buckets: int = 100_000,
        max_workflows: int = 100_000,
        max_route_keys: int = 100_000,
        max_cache_entries: int = 10_000,
        max_cache_bytes: int = 64 << 20,
    ) -> None:
        self._max_buckets = max_buckets
        self._max_workflows = max_workflows
        self._max_route_keys = max_route_keys
        self._max_cache_entries = max_cache_entries
        self._max_cache_bytes = max_cache_bytes
        self._buckets: OrderedDict[str, BucketLevel] = OrderedDict()
        self._workflows: OrderedDict[str, tuple[WorkflowRecord, float]] = OrderedDict()
        self._ejections: dict[str, Ejection] = {}
        self._routes: dict[str, OrderedDict[int, float]] = {}
        self._cache: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._cache_bytes = 0

    @property
    def mode(self) -> StoreMode:
        return StoreMode.LOCAL

    # ---- buckets -------------------------------------------------------------------------

    async def take(self, takes: Sequence[BucketTake], now: float) -> TakeResult:
        levels = [level_at(t.bucket, self._buckets.get(t.bucket.key), now) for t in takes]
        result = decide_take(takes, levels)
        if result.admitted:
            self._apply(takes, levels, now)
        return result

    async def charge(self, takes: Sequence[BucketTake], now: float) -> None:
        levels = [level_at(t.bucket, self._buckets.get(t.bucket.key), now) for t in takes]
        self._apply(takes, levels, now)

    async def bucket(self, spec: BucketSpec, now: float) -> float:
        return level_at(spec, self._buckets.get(spec.key), now)

    def _apply(self, takes: Sequence[BucketTake], levels: Sequence[float], now: float) -> None:
        for take, level in zip(takes, levels, strict=True):
            old = self._buckets.get(take.bucket.key)
            at_s = now if old is None else max(old.at_s, now)
            self._buckets[take.bucket.key] = after_take(take.bucket, level, take.amount, at_s)
            self._buckets.move_to_end(take.bucket.key)
        while len(self._buckets) > self._max_buckets:
            self._buckets.popitem(last=False)

    # ---- workflows -----------------------------------------------------------------------

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord:
        old = await self.workflow_get(workflow_id, now)
        record = apply_workflow_delta(old, workflow_id, delta, now)
        self._put_workflow(record, now + ttl_s)
        return record

    async def workflow_put(self, record: WorkflowRecord, ttl_s: float) -> None:
        self._put_workflow(record, record.last_seen_s + ttl_s)

    def _put_workflow(self, record: WorkflowRecord, expires_at_s: float) -> None:
        self._workflows[record.workflow_id] = (record, expires_at_s)
        self._workflows.move_to_end(record.workflow_id)
        while len(self._workflows) > self._max_workflows:
            self._workflows.popitem(last=False)

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        found = self._workflows.get(workflow_id)
        if found is None:
            return None
        if found[1] <= now:
            del self._workflows[workflow_id]
            return None
        return found[0]

    async def workflow_end(self, workflow_id: str) -> bool:
        return self._workflows.pop(workflow_id, None) is not None

    # ---- ejections -----------------------------------------------------------------------

    async def eject(self, ejection: Ejection) -> None:
        old = self._ejections.get(ejection.endpoint)
        if old is not None and old.until_s >= ejection.until_s:
            ejection = replace(old, reason=ejection.reason or old.reason)
        self._ejections[ejection.endpoint] = ejection

    async def ejections(self, now: float) -> Mapping[str, Ejection]:
        for name in [n for n, e in self._ejections.items() if e.until_s <= now]:
            del self._ejections[name]
        return dict(self._ejections)

    # ---- approximate routing -------------------------------------------------------------

    async def record_route(self, endpoint: str, keys: Sequence[int], expires_at_s: float) -> None:
        held = self._routes.setdefault(endpoint, OrderedDict())
        for key in keys:
            held[key] = max(expires_at_s, held.get(key, expires_at_s))
            held.move_to_end(key)
        while len(held) > self._max_route_keys:
            held.popitem(last=False)

    async def match_routes(
        self, keys: Sequence[int], endpoints: Sequence[str], now: float
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for name in endpoints:
            held = self._routes.get(name)
            out[name] = 0 if held is None else match_length([held.get(k) for k in keys], now)
        return out

    # ---- response cache ------------------------------------------------------------------

    async def cache_get(self, key: str, now: float) -> bytes | None:
        found = self._cache.get(key)
        if found is None:
            return None
        if found[1] <= now:
            self._drop_cached(key)
            return None
        self._cache.move_to_end(key)
        return found[0]

    async def cache_put(self, key: str, value: bytes, expires_at_s: float) -> None:
        if len(value) > self._max_cache_bytes:
            return
        self._drop_cached(key)
        self._cache[key] = (value, expires_at_s)
        self._cache_bytes += len(value)
        while (
            len(self._cache) > self._max_cache_entries or self._cache_bytes > self._max_cache_bytes
        ):
            self._drop_cached(next(iter(self._cache)))

    def _drop_cached(self, key: str) -> None:
        found = self._cache.pop(key, None)
        if found is not None:
            self._cache_bytes -= len(found[0])

    # ---- lifecycle -----------------------------------------------------------------------

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
