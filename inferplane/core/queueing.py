"""The gateway's admission queue: strict priority bands, fair across tenants, EDF within.

Calls that cannot be dispatched at once wait here and are routed only when they leave
(late binding), so routing sees fresh state. The order of service:

1. bands by class, strictly: critical, then standard, then sheddable;
2. within a band, tenants by least attained service over weight (weighted fair share).
   Attained service is the tokens dispatched for the tenant in that band, halving every
   ``service_half_life_s``; a tenant whose flow becomes active is lifted to the least
   service among the active flows, so idle time banks no credit and one tenant's burst
   cannot starve the others;
3. within a tenant, per model, the least ``order_key_s`` first (earliest deadline first;
   admission folds workflow credit into the key). A head that ``can_dispatch`` refuses
   blocks its (tenant, model) flow for that dispatch only, so the pass is work-conserving
   across models without overtaking an earlier deadline of the same model.

Bounded by count and bytes. When full, the victim is the lowest class, then the least
``keep`` (workflow protection), then the newest; a new call that would itself be that
victim is refused and nothing is evicted. Every pushed call leaves exactly once, reported
as a :class:`QueueExit`: dispatched, evicted, expired or cancelled. Pure: ``now`` is passed
in, no clock, no I/O. Heaps use lazy deletion and are rebuilt when tombstones dominate.
The values it takes and reports (:class:`QueueItem`, :class:`QueueExit`, ...) live in
:mod:`inferplane.core.queue_items` and are re-exported here.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from inferplane.core.admission_config import QueueConfig
from inferplane.core.queue_items import ExitKind, PushResult, QueueExit, QueueItem, WorkAhead
from inferplane.core.types import PriorityClass

__all__ = ["ExitKind", "PushResult", "QueueExit", "QueueItem", "RequestQueue", "WorkAhead"]

_BANDS = sorted(PriorityClass, key=lambda p: p.rank)
_REBUILD_SLACK = 64


@dataclass(slots=True)
class _Entry:
    item: QueueItem
    seq: int
    enqueued_s: float
    alive: bool = True


_Heap = list[tuple[float, int, _Entry]]


@dataclass(slots=True)
class _Service:
    value: float = 0.0  # tokens, decayed to ``at_s``
    at_s: float = 0.0
    #: log2(value / weight) + at_s / half-life: every value decays by the same factor, so
    #: this orders tenants by decayed service over weight at any instant, without a clock.
    key: float = -math.inf

    def at(self, now: float, half_life_s: float) -> float:
        decay: float = 0.5 ** (max(0.0, now - self.at_s) / half_life_s)
        return self.value * decay

    def set(self, value: float, at_s: float, half_life_s: float, weight: float) -> None:
        self.value, self.at_s = value, at_s
        self.key = math.log2(value / weight) + at_s / half_life_s if value > 0 else -math.inf


@dataclass(slots=True)
class _Flow:
    """One (class, tenant, model) flow: a heap by (order key, seq)."""

    heap: _Heap = field(default_factory=list)
    live: int = 0


@dataclass(slots=True)
class _Band:
    flows: dict[str, dict[str, _Flow]] = field(default_factory=dict)  # tenant -> model -> flow
    live: dict[str, int] = field(default_factory=dict)  # tenant -> live items
    evict: _Heap = field(default_factory=list)  # (keep, -seq): first out first
    service: dict[str, _Service] = field(default_factory=dict)
    count: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    keys: list[float] = field(default_factory=list)  # live order keys, sorted


def _clean(heap: _Heap, live: int) -> None:
    """Drop dead heads; rebuild when tombstones outnumber live entries."""
    while heap and not heap[0][2].alive:
        heapq.heappop(heap)
    if len(heap) > 2 * live + _REBUILD_SLACK:
        heap[:] = [t for t in heap if t[2].alive]
        heapq.heapify(heap)


class RequestQueue:
    """Bounded multi-class fair queue (module docstring)."""

    def __init__(self, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self._bands = {p: _Band() for p in _BANDS}
        self._entries: dict[str, _Entry] = {}
        self._expiry: _Heap = []
        self._outbox: list[QueueExit] = []  # expired while dispatching, reported by expire()
        self._seq = 0
        self._bytes = 0

    # -- size ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def depth(self, priority: PriorityClass) -> int:
        return self._bands[priority].count

    def work_ahead(self, priority: PriorityClass, order_key_s: float | None = None) -> WorkAhead:
        """Calls queued in ``priority``'s band and above (served before a new call of it).

        With ``order_key_s``, of its own band only the calls keyed no later (EDF: a call
        with an earlier deadline overtakes the rest; their tokens pro rata, approximate
        across tenants' fair shares)."""
        calls = prompt = output = 0
        for p, b in self._bands.items():
            if p.rank > priority.rank or not b.count:
                continue
            n = b.count
            if p is priority and order_key_s is not None:
                n = bisect.bisect_right(b.keys, order_key_s)
            calls += n
            prompt += round(b.prompt_tokens * n / b.count)
            output += round(b.output_tokens * n / b.count)
        return WorkAhead(calls, prompt, output)

    def attained_service(self, tenant: str, priority: PriorityClass, now: float) -> float:
        """The tenant's decayed attained service (tokens) in a band."""
        svc = self._bands[priority].service.get(tenant)
        return 0.0 if svc is None else svc.at(now, self.config.service_half_life_s)

    # -- in -----------------------------------------------------------------------------

    def push(self, item: QueueItem, now: float) -> PushResult:
        """Queue ``item``, evicting worse calls if full; refused if it would be the victim."""
        if item.request_id in self._entries:
            return PushResult(False, reason="request id already queued")
        if item.size_bytes > self.config.max_bytes:
            return PushResult(False, reason="call larger than the queue's byte limit")
        victims = self._victims_for(item)
        if victims is None:
            return PushResult(False, reason="queue full of calls of equal or higher class")
        why = f"evicted for a {item.priority.value} call"
        evicted = tuple(self._remove(v, ExitKind.EVICTED, now, why) for v in victims)
        self._seq += 1
        entry = _Entry(item, self._seq, now)
        band = self._bands[item.priority]
        tenant, model = item.call.tenant, item.call.model
        if band.live.get(tenant, 0) == 0:
            self._activate(band, tenant, now)
        flow = band.flows.setdefault(tenant, {}).setdefault(model, _Flow())
        heapq.heappush(flow.heap, (item.order_key_s, entry.seq, entry))
        flow.live += 1
        heapq.heappush(band.evict, (item.keep, -entry.seq, entry))
        heapq.heappush(self._expiry, (item.expires_at_s, entry.seq, entry))
        band.live[tenant] = band.live.get(tenant, 0) + 1
        self._account(band, item, +1)
        self._entries[item.request_id] = entry
        return PushResult(True, evicted)

    def _victims_for(self, item: QueueItem) -> list[_Entry] | None:
        """Entries to evict so ``item`` fits (None: ``item`` itself would go first)."""
        need_n = len(self._entries) + 1 - self.config.max_items
        need_b = self._bytes + item.size_bytes - self.config.max_bytes
        new_key = (-item.priority.rank, item.keep)
        victims: list[_Entry] = []
        taken: list[tuple[_Band, tuple[float, int, _Entry]]] = []
        while need_n > 0 or need_b > 0:
            found = self._next_victim(taken)
            # Same class and keep: the new call is the newest, so it goes first.
            if found is None or (-found.item.priority.rank, found.item.keep) >= new_key:
                for band, t in taken:
                    heapq.heappush(band.evict, t)
                return None
            victims.append(found)
            need_n -= 1
            need_b -= found.item.size_bytes
        return victims  # their slots in the eviction heaps went with them

    def _next_victim(self, taken: list[tuple[_Band, tuple[float, int, _Entry]]]) -> _Entry | None:
        for priority in reversed(_BANDS):
            band = self._bands[priority]
            _clean(band.evict, band.count)
            if band.evict:
                t = heapq.heappop(band.evict)
                taken.append((band, t))
                return t[2]
        return None

    def _activate(self, band: _Band, tenant: str, now: float) -> None:
        """A flow becomes active: lift it to the least normalised service among active flows."""
        hl = self.config.service_half_life_s
        svc = band.service.setdefault(tenant, _Service(0.0, now))
        weight = self.config.weight_of(tenant)
        active = [
            band.service[t].at(now, hl) / self.config.weight_of(t)
            for t, n in band.live.items()
            if n > 0 and t in band.service
        ]
        floor = min(active) * weight if active else 0.0
        svc.set(max(svc.at(now, hl), floor), max(now, svc.at_s), hl, weight)
        if len(band.service) > 4 * (len(band.live) + _REBUILD_SLACK):
            self._prune(band, now)

    def _prune(self, band: _Band, now: float) -> None:
        """Forget inactive tenants' service (their next activation lifts them anyway)."""
        for tenant in [t for t in band.service if band.live.get(t, 0) == 0]:
            del band.service[tenant]

    # -- out ----------------------------------------------------------------------------

    def pop_next(
        self, now: float, can_dispatch: Callable[[QueueItem], bool] | None = None
    ) -> QueueExit | None:
        """Dispatch the next call (module docstring for the order); None if none can go.

        Calls already past ``expires_at_s`` are never dispatched: they are moved out and
        reported by the next :meth:`expire`.
        """
        budget = self.config.max_scan
        for priority in _BANDS:
            band = self._bands[priority]
            if band.count == 0:
                continue
            for tenant in self._tenant_order(band):
                heads = [self._live_head(f, now) for f in list(band.flows[tenant].values())]
                ordered = sorted(
                    (h for h in heads if h is not None),
                    key=lambda e: (e.item.order_key_s, e.seq),
                )
                for head in ordered:
                    if budget <= 0:
                        return None
                    budget -= 1
                    if can_dispatch is None or can_dispatch(head.item):
                        self.charge(tenant, priority, head.item.service_tokens, now)
                        return self._remove(head, ExitKind.DISPATCHED, now, "dispatched")
        return None

    @staticmethod
    def _tenant_order(band: _Band) -> Iterator[str]:
        """Active tenants, least normalised service first (lazily: usually one is enough)."""
        keyed = [(band.service[t].key, t) for t in band.live]  # a copy: flows may empty
        heapq.heapify(keyed)
        while keyed:
            yield heapq.heappop(keyed)[1]

    def _live_head(self, flow: _Flow, now: float) -> _Entry | None:
        """The flow's first live, unexpired entry (expired heads go to the outbox)."""
        heap = flow.heap
        while heap:
            entry = heap[0][2]
            if not entry.alive:
                heapq.heappop(heap)
            elif entry.item.expires_at_s <= now:
                self._outbox.append(self._remove(entry, ExitKind.EXPIRED, now, "deadline"))
            else:
                return entry
        return None

    def charge(self, tenant: str, priority: PriorityClass, tokens: float, now: float) -> None:
        """Add (or, correcting an estimate, subtract) attained service for a tenant."""
        band = self._bands[priority]
        hl = self.config.service_half_life_s
        svc = band.service.setdefault(tenant, _Service(0.0, now))
        svc.set(
            max(0.0, svc.at(now, hl) + tokens),
            max(now, svc.at_s),
            hl,
            self.config.weight_of(tenant),
        )

    def expire(self, now: float) -> list[QueueExit]:
        """Remove calls whose ``expires_at_s`` has come; includes those met while popping."""
        out, self._outbox = self._outbox, []
        while self._expiry and (
            not self._expiry[0][2].alive or self._expiry[0][2].item.expires_at_s <= now
        ):
            entry = heapq.heappop(self._expiry)[2]
            if entry.alive:
                out.append(self._remove(entry, ExitKind.EXPIRED, now, "deadline"))
        return out

    def next_expiry_s(self) -> float | None:
        """When the earliest waiting call expires (a simulator schedules its wake-up here)."""
        if self._outbox:
            return -math.inf
        while self._expiry and not self._expiry[0][2].alive:
            heapq.heappop(self._expiry)
        return self._expiry[0][0] if self._expiry else None

    def cancel(self, request_id: str, now: float, reason: str = "cancelled") -> QueueExit | None:
        """Remove a waiting call (the client went away); None if it is not queued."""
        entry = self._entries.get(request_id)
        return None if entry is None else self._remove(entry, ExitKind.CANCELLED, now, reason)

    def items(self) -> list[QueueItem]:
        """Every waiting call (any order)."""
        return [e.item for e in self._entries.values()]

    # -- internals ----------------------------------------------------------------------

    def _remove(self, entry: _Entry, kind: ExitKind, now: float, reason: str) -> QueueExit:
        entry.alive = False
        item = entry.item
        del self._entries[item.request_id]
        band = self._bands[item.priority]
        tenant = item.call.tenant
        band.live[tenant] -= 1
        if band.live[tenant] == 0:
            del band.live[tenant]
            del band.flows[tenant]
        else:
            flows = band.flows[tenant]
            flow = flows[item.call.model]
            flow.live -= 1
            if flow.live == 0:
                del flows[item.call.model]
            else:
                _clean(flow.heap, flow.live)
        self._account(band, item, -1)
        _clean(band.evict, band.count)
        _clean(self._expiry, len(self._entries))
        return QueueExit(item, kind, max(0.0, now - entry.enqueued_s), reason)

    def _account(self, band: _Band, item: QueueItem, sign: int) -> None:
        band.count += sign
        if sign > 0:
            bisect.insort(band.keys, item.order_key_s)
        else:
            del band.keys[bisect.bisect_left(band.keys, item.order_key_s)]
        band.prompt_tokens += sign * item.prefill_tokens
        band.output_tokens += sign * item.num_output_tokens
        self._bytes += sign * item.size_bytes
