"""The shared-state interface: what gateway workers and replicas must agree on.

One gateway process can keep everything in its own memory; many behind one Service cannot:
a quota of 100 requests/min enforced by four workers separately lets 400 through, and a
workflow's progress seen by one replica is unknown to the next. This module names the few
things that must be shared, as values and one protocol with two backends (in-memory,
embedded and default; Redis, shared), and holds the pure rules both backends apply so they
agree exactly (the Redis backend runs the same rules as Lua scripts):

* **token buckets** (quotas): take several buckets all-or-nothing, or charge them without
  a check (settlement, refunds, replay after an outage). A bucket holds ``capacity`` and
  refills at ``refill_per_s``; a take needs ``min(amount, capacity)`` in it, so a call larger
  than the bucket runs into debt instead of never fitting (as :mod:`inferplane.core.quotas`);
* **workflow ledger records** (:class:`~inferplane.core.workflows.WorkflowRecord`) updated
  by deltas, idle ones expiring;
* **endpoint ejections** with an absolute expiry;
* **approximate-routing records**: which endpoint was sent which prefix blocks, until when;
* a **response cache** of opaque bytes with a TTL.

Pure: times are passed in (``now``, ``expires_at_s``: wall-clock seconds the caller reads).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferplane.core.workflows import WorkflowRecord

__all__ = [
    "BucketLevel",
    "BucketSpec",
    "BucketTake",
    "Ejection",
    "StateStore",
    "StoreMode",
    "TakeResult",
    "WorkflowDelta",
    "after_take",
    "apply_workflow_delta",
    "bucket_ttl_s",
    "decide_take",
    "level_at",
    "match_length",
]

_EPS = 1e-9


class StoreMode(enum.Enum):
    """Where a store's answers come from."""

    LOCAL = "local"  # in-memory only, by configuration
    SHARED = "shared"  # the shared store answers
    DEGRADED = "degraded"  # the shared store failed: local answers, journalled for replay
    RECONCILING = "reconciling"  # the shared store is back: replaying the journal


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A token bucket: its key, size and refill rate (a quota of ``capacity`` per minute
    refills at ``capacity / 60`` per second)."""

    key: str
    capacity: float
    refill_per_s: float

    def __post_init__(self) -> None:
        if self.capacity <= 0 or self.refill_per_s <= 0:
            raise ValueError(f"bucket {self.key!r}: capacity and refill must be positive")


@dataclass(frozen=True, slots=True)
class BucketTake:
    bucket: BucketSpec
    amount: float  # may be negative in a charge (a refund)


@dataclass(frozen=True, slots=True)
class BucketLevel:
    """A bucket's stored state: its level at ``at_s`` (may be negative: debt)."""

    level: float
    at_s: float


@dataclass(frozen=True, slots=True)
class TakeResult:
    """A take's answer: admitted, or which take (index) refused and how long until it fits."""

    admitted: bool
    refused_index: int | None = None
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkflowDelta:
    """A change to one workflow's ledger record (all fields are increments or facts)."""

    tenant: str
    steps_expected: int | None = None
    in_flight: int = 0  # +1 on admit, -1 on finish
    dispatched_step: int | None = None  # a step reached an endpoint (again: a retry)
    tokens: int = 0
    cost_usd: float = 0.0
    steps_done: int = 0


@dataclass(frozen=True, slots=True)
class Ejection:
    """An endpoint taken out of rotation until ``until_s`` (wall clock), and why."""

    endpoint: str
    until_s: float
    reason: str = ""


# ---- the rules both backends apply -----------------------------------------------------------


def level_at(spec: BucketSpec, stored: BucketLevel | None, now: float) -> float:
    """The bucket's level at ``now``: refilled since it was stored, capped at capacity."""
    if stored is None:
        return spec.capacity
    return min(spec.capacity, stored.level + spec.refill_per_s * max(0.0, now - stored.at_s))


def decide_take(takes: Sequence[BucketTake], levels: Sequence[float]) -> TakeResult:
    """All-or-nothing: the first take whose bucket lacks ``min(amount, capacity)`` refuses."""
    for i, (take, level) in enumerate(zip(takes, levels, strict=True)):
        need = min(take.amount, take.bucket.capacity)
        if level + _EPS < need:
            return TakeResult(False, i, (need - level) / take.bucket.refill_per_s)
    return TakeResult(True)


def after_take(spec: BucketSpec, level: float, amount: float, at_s: float) -> BucketLevel:
    """The stored state after taking ``amount`` from a bucket at ``level``."""
    return BucketLevel(min(spec.capacity, level - amount), at_s)


def bucket_ttl_s(spec: BucketSpec) -> float:
    """How long an untouched bucket matters: after this it is full, as if absent."""
    return spec.capacity / spec.refill_per_s + 1.0


def apply_workflow_delta(
    old: WorkflowRecord | None, workflow_id: str, delta: WorkflowDelta, now: float
) -> WorkflowRecord:
    """The ledger record after ``delta`` (the rules of :class:`WorkflowLedger`)."""
    if old is None:
        old = WorkflowRecord(workflow_id, delta.tenant, 0, None, 0, 0, 0.0, 0, 0, now, now)
    max_step, retries = old.max_step, old.retries_used
    if delta.dispatched_step is not None:
        if delta.dispatched_step <= max_step:
            retries += 1
        max_step = max(max_step, delta.dispatched_step)
    return WorkflowRecord(
        workflow_id=workflow_id,
        tenant=old.tenant,
        steps_done=old.steps_done + max(0, delta.steps_done),
        steps_expected=old.steps_expected if delta.steps_expected is None else delta.steps_expected,
        max_step=max_step,
        tokens=old.tokens + max(0, delta.tokens),
        cost_usd=old.cost_usd + max(0.0, delta.cost_usd),
        retries_used=retries,
        in_flight=max(0, old.in_flight + delta.in_flight),
        first_seen_s=old.first_seen_s,
        last_seen_s=max(old.last_seen_s, now),
    )


def match_length(expiries: Sequence[float | None], now: float) -> int:
    """Leading run of prefix blocks still recorded (expiry after ``now``)."""
    n = 0
    for expiry in expiries:
        if expiry is None or expiry <= now:
            break
        n += 1
    return n


# ---- the protocol ----------------------------------------------------------------------------


class StateStore(Protocol):
    """What gateway workers share; implemented in memory, in Redis, and resiliently."""

    @property
    def mode(self) -> StoreMode: ...

    async def take(self, takes: Sequence[BucketTake], now: float) -> TakeResult:
        """Take every amount, or nothing if some bucket lacks it."""
        ...

    async def charge(self, takes: Sequence[BucketTake], now: float) -> None:
        """Take (or, negative, give back) without a check: settlement, refunds, replay."""
        ...

    async def bucket(self, spec: BucketSpec, now: float) -> float:
        """A bucket's level at ``now``."""
        ...

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord: ...

    async def workflow_put(self, record: WorkflowRecord, ttl_s: float) -> None:
        """Store a whole record (reconciliation after the shared store lost it)."""
        ...

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None: ...

    async def workflow_end(self, workflow_id: str) -> bool: ...

    async def eject(self, ejection: Ejection) -> None:
        """Eject until ``until_s``; an existing later expiry is kept."""
        ...

    async def ejections(self, now: float) -> Mapping[str, Ejection]:
        """Endpoints ejected at ``now``."""
        ...

    async def record_route(
        self, endpoint: str, keys: Sequence[int], expires_at_s: float
    ) -> None: ...

    async def match_routes(
        self, keys: Sequence[int], endpoints: Sequence[str], now: float
    ) -> dict[str, int]:
        """Per endpoint, how many leading ``keys`` were routed there and are unexpired."""
        ...

    async def cache_get(self, key: str, now: float) -> bytes | None: ...

    async def cache_put(self, key: str, value: bytes, expires_at_s: float) -> None: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
