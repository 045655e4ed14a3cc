"""Shared state that survives its store: Redis first, local memory while Redis is away.

A gateway must not stop serving because its shared store is slow or down. Every call goes
to the shared store with a short deadline; the first failure (timeout, refused connection,
server error) turns the store DEGRADED, counted by reason, and that call and every later
one is answered from local memory at once (no request waits on a dead store twice). While
degraded:

* quota buckets are local, each scaled by ``degraded_share`` (1/N for N replicas keeps the
  fleet-wide total within the quota; 1.0 favours availability), and what they admit is
  journalled per bucket;
* workflow deltas, ends and ejections are applied locally and journalled; workflow records
  and ejections read in shared mode are mirrored locally, so the local view starts warm;
* route records and the response cache are local and not replayed (both are hints that
  expire).

``maintain(now)``, called on an interval by the body, probes a degraded store; when it
answers, the store is RECONCILING: the journal is replayed (bucket consumption charged,
workflow deltas applied in order, or the whole local record written when the store lost it,
e.g. a restart without persistence; ejections re-applied), each entry dropped only once
the store took it, then SHARED again. A reply lost after the store applied a call can
count that call twice: errors lean to refusing, never to over-admitting.

The journal is bounded (``max_journal`` entries); past that the oldest workflow entries
are dropped and counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from inferplane.core.state import (
    BucketSpec,
    BucketTake,
    Ejection,
    StateStore,
    StoreMode,
    TakeResult,
    WorkflowDelta,
)
from inferplane.core.workflows import WorkflowRecord
from inferplane.state.memory import MemoryStore
from inferplane.state.resp import ReplyError

__all__ = ["ResilientStore", "StateStats"]

T = TypeVar("T")
ModeListener = Callable[[StoreMode, StoreMode, str], None]
_FAILURES: tuple[type[BaseException], ...] = (ReplyError, OSError, TimeoutError)


class _Unavailable(Exception):
    """The shared store failed this call (already counted)."""


@dataclass(frozen=True, slots=True)
class StateStats:
    """Counters of a resilient store, for metrics and /v1/stats."""

    mode: StoreMode
    degradations: Mapping[str, int]  # by reason: timeout, connection, error
    local_ops: int  # calls answered locally because the store was away
    reconciles: int  # completed replays
    replayed: int  # journal entries replayed
    journal_size: int
    journal_dropped: int


@dataclass(slots=True)
class _WorkflowJournal:
    tenant: str
    ttl_s: float
    deltas: list[tuple[WorkflowDelta, float]] = field(default_factory=list)


class ResilientStore:
    """A :class:`~inferplane.core.state.StateStore` over a shared one, with local fallback."""

    def __init__(
        self,
        shared: StateStore,
        local: MemoryStore | None = None,
        *,
        op_timeout_s: float = 0.05,
        degraded_share: float = 1.0,
        max_journal: int = 100_000,
        on_mode: ModeListener | None = None,
    ) -> None:
        if not 0 < degraded_share <= 1:
            raise ValueError("degraded_share must be in (0, 1]")
        self.shared = shared
        self.local = local or MemoryStore()
        self._timeout_s = op_timeout_s
        self._share = degraded_share
        self._max_journal = max_journal
        self._on_mode = on_mode
        self._mode = StoreMode.SHARED
        self._degradations: Counter[str] = Counter()
        self._local_ops = 0
        self._reconciles = 0
        self._replayed = 0
        self._dropped = 0
        self._buckets: dict[str, tuple[BucketSpec, float]] = {}
        self._workflows: OrderedDict[str, _WorkflowJournal] = OrderedDict()
        self._ended: dict[str, None] = {}
        self._ejected: dict[str, Ejection] = {}

    @property
    def mode(self) -> StoreMode:
        return self._mode

    @property
    def op_timeout_s(self) -> float:
        """How long one shared call may take before the store serves locally."""
        return self._timeout_s

    def stats(self) -> StateStats:
        return StateStats(
            self._mode,
            dict(self._degradations),
            self._local_ops,
            self._reconciles,
            self._replayed,
            self.journal_size(),
            self._dropped,
        )

    def journal_size(self) -> int:
        n_wf = sum(max(1, len(j.deltas)) for j in self._workflows.values())
        return len(self._buckets) + n_wf + len(self._ended) + len(self._ejected)

    # ---- plumbing ------------------------------------------------------------------------

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run one shared call if the store is up; raise ``_Unavailable`` to go local."""
        if self._mode is not StoreMode.SHARED:
            self._local_ops += 1
            raise _Unavailable
        try:
            async with asyncio.timeout(self._timeout_s):  # no task per call (as wait_for)
                return await make()
        except _FAILURES as exc:
            self._degrade(exc)
            self._local_ops += 1
            raise _Unavailable from exc

    def _degrade(self, exc: BaseException) -> None:
        if isinstance(exc, TimeoutError):
            reason = "timeout"
        elif isinstance(exc, OSError | ConnectionError) or "Connection" in type(exc).__name__:
            reason = "connection"
        else:
            reason = "error"
        self._degradations[reason] += 1
        if self._mode is StoreMode.SHARED:
            self._set_mode(StoreMode.DEGRADED, reason)

    def _set_mode(self, mode: StoreMode, reason: str) -> None:
        old, self._mode = self._mode, mode
        if self._on_mode is not None and old is not mode:
            self._on_mode(old, mode, reason)

    def _scaled(self, takes: Sequence[BucketTake]) -> list[BucketTake]:
        if self._share == 1.0:
            return list(takes)
        out: list[BucketTake] = []
        for t in takes:
            b = t.bucket
            spec = BucketSpec(b.key, b.capacity * self._share, b.refill_per_s * self._share)
            out.append(BucketTake(spec, t.amount))
        return out

    def _journal_buckets(self, takes: Sequence[BucketTake]) -> None:
        for t in takes:
            held = self._buckets.get(t.bucket.key)
            self._buckets[t.bucket.key] = (t.bucket, t.amount + (0.0 if held is None else held[1]))

    # ---- buckets -------------------------------------------------------------------------

    async def take(self, takes: Sequence[BucketTake], now: float) -> TakeResult:
        try:
            return await self._call(lambda: self.shared.take(takes, now))
        except _Unavailable:
            result = await self.local.take(self._scaled(takes), now)
            if result.admitted:
                self._journal_buckets(takes)
            return result

    async def charge(self, takes: Sequence[BucketTake], now: float) -> None:
        try:
            await self._call(lambda: self.shared.charge(takes, now))
        except _Unavailable:
            await self.local.charge(self._scaled(takes), now)
            self._journal_buckets(takes)

    async def bucket(self, spec: BucketSpec, now: float) -> float:
        try:
            return await self._call(lambda: self.shared.bucket(spec, now))
        except _Unavailable:
            return await self.local.bucket(self._scaled([BucketTake(spec, 0)])[0].bucket, now)

    # ---- workflows -----------------------------------------------------------------------

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord:
        try:
            record = await self._call(
                lambda: self.shared.workflow_update(workflow_id, delta, now, ttl_s)
            )
        except _Unavailable:
            self._journal_workflow(workflow_id, delta, now, ttl_s)
            return await self.local.workflow_update(workflow_id, delta, now, ttl_s)
        await self.local.workflow_put(record, ttl_s)  # mirror: warm if the store goes away
        return record

    def _journal_workflow(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> None:
        self._ended.pop(workflow_id, None)
        journal = self._workflows.get(workflow_id)
        if journal is None:
            journal = self._workflows[workflow_id] = _WorkflowJournal(delta.tenant, ttl_s)
        journal.deltas.append((delta, now))
        self._workflows.move_to_end(workflow_id)
        while self.journal_size() > self._max_journal and self._workflows:
            _, dropped = self._workflows.popitem(last=False)
            self._dropped += len(dropped.deltas)

    async def workflow_put(self, record: WorkflowRecord, ttl_s: float) -> None:
        await self.local.workflow_put(record, ttl_s)
        try:
            await self._call(lambda: self.shared.workflow_put(record, ttl_s))
        except _Unavailable:  # replayed as a whole record if the store lacks it
            self._workflows.setdefault(record.workflow_id, _WorkflowJournal(record.tenant, ttl_s))

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        try:
            return await self._call(lambda: self.shared.workflow_get(workflow_id, now))
        except _Unavailable:
            return await self.local.workflow_get(workflow_id, now)

    async def workflow_end(self, workflow_id: str) -> bool:
        local = await self.local.workflow_end(workflow_id)
        try:
            return await self._call(lambda: self.shared.workflow_end(workflow_id))
        except _Unavailable:
            self._workflows.pop(workflow_id, None)
            self._ended[workflow_id] = None
            return local

    # ---- ejections -----------------------------------------------------------------------

    async def eject(self, ejection: Ejection) -> None:
        await self.local.eject(ejection)
        try:
            await self._call(lambda: self.shared.eject(ejection))
        except _Unavailable:
            old = self._ejected.get(ejection.endpoint)
            if old is None or old.until_s < ejection.until_s:
                self._ejected[ejection.endpoint] = ejection

    async def ejections(self, now: float) -> Mapping[str, Ejection]:
        try:
            found = await self._call(lambda: self.shared.ejections(now))
        except _Unavailable:
            return await self.local.ejections(now)
        for ejection in found.values():
            await self.local.eject(ejection)
        return found

    # ---- approximate routing and cache (hints: local while degraded, never replayed) -----

    async def record_route(self, endpoint: str, keys: Sequence[int], expires_at_s: float) -> None:
        try:
            await self._call(lambda: self.shared.record_route(endpoint, keys, expires_at_s))
        except _Unavailable:
            await self.local.record_route(endpoint, keys, expires_at_s)

    async def match_routes(
        self, keys: Sequence[int], endpoints: Sequence[str], now: float
    ) -> dict[str, int]:
        try:
            return await self._call(lambda: self.shared.match_routes(keys, endpoints, now))
        except _Unavailable:
            return await self.local.match_routes(keys, endpoints, now)

    async def cache_get(self, key: str, now: float) -> bytes | None:
        try:
            return await self._call(lambda: self.shared.cache_get(key, now))
        except _Unavailable:
            return await self.local.cache_get(key, now)

    async def cache_put(self, key: str, value: bytes, expires_at_s: float) -> None:
        try:
            await self._call(lambda: self.shared.cache_put(key, value, expires_at_s))
        except _Unavailable:
            await self.local.cache_put(key, value, expires_at_s)

    # ---- recovery ------------------------------------------------------------------------

    async def ping(self) -> bool:
        return self._mode is StoreMode.SHARED

    async def maintain(self, now: float) -> StoreMode:
        """Probe a degraded store; when it answers, replay the journal and go back to it."""
        if self._mode is not StoreMode.DEGRADED:
            return self._mode
        try:
            await asyncio.wait_for(self.shared.ping(), self._timeout_s)
        except _FAILURES:
            return self._mode
        self._set_mode(StoreMode.RECONCILING, "store answers")
        try:
            while self.journal_size():
                await self._replay_one(now)
        except _FAILURES as exc:
            self._set_mode(StoreMode.DEGRADED, "replay failed")
            self._degrade(exc)
            return self._mode
        self._reconciles += 1
        self._set_mode(StoreMode.SHARED, "reconciled")
        return self._mode

    async def _replay_one(self, now: float) -> None:
        """Replay one journal entry; it leaves the journal only once the store took it."""
        t = self._timeout_s * 4
        if self._buckets:
            key = next(iter(self._buckets))
            spec, amount = self._buckets[key]
            await asyncio.wait_for(self.shared.charge([BucketTake(spec, amount)], now), t)
            held = self._buckets.pop(key)
            if held[1] != amount:  # more was taken locally meanwhile: keep the rest
                self._buckets[key] = (spec, held[1] - amount)
        elif self._ended:
            wid = next(iter(self._ended))
            await asyncio.wait_for(self.shared.workflow_end(wid), t)
            self._ended.pop(wid, None)
        elif self._workflows:
            await self._replay_workflow(next(iter(self._workflows)), t)
        elif self._ejected:
            endpoint = next(iter(self._ejected))
            await asyncio.wait_for(self.shared.eject(self._ejected[endpoint]), t)
            self._ejected.pop(endpoint, None)
        self._replayed += 1

    async def _replay_workflow(self, wid: str, timeout_s: float) -> None:
        journal = self._workflows[wid]
        last_now = journal.deltas[-1][1] if journal.deltas else 0.0
        if await asyncio.wait_for(self.shared.workflow_get(wid, last_now), timeout_s) is None:
            record = await self.local.workflow_get(wid, last_now)
            if record is not None:  # the store lost it: the local record is the best view
                await asyncio.wait_for(self.shared.workflow_put(record, journal.ttl_s), timeout_s)
            self._workflows.pop(wid, None)
            return
        while journal.deltas:
            delta, at_s = journal.deltas[0]
            await asyncio.wait_for(
                self.shared.workflow_update(wid, delta, at_s, journal.ttl_s), timeout_s
            )
            journal.deltas.pop(0)
        self._workflows.pop(wid, None)

    async def close(self) -> None:
        await self.shared.close()
        await self.local.close()
