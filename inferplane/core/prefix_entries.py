"""The prefix index's per-endpoint records and entry bookkeeping (a base of ``PrefixIndex``).

Split out of :mod:`inferplane.core.prefix_index`: an endpoint's entries (own key -> flags,
in LRU order), its engine hash -> own key map, CPU tiers and guess expiries, and the
setting, unsetting and batch eviction of entries under ``max_entries``. Pure.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field, fields

from inferplane.core.prefix_blocks import EndpointIndexStats, IndexSource, PrefixIndexConfig

_COUNTERS = [f.name for f in fields(EndpointIndexStats)][3:]  # the counts after the sizes


@dataclass(slots=True, eq=False)
class Endpoint:
    """What the index knows of one endpoint's cache."""

    name: str
    bit: int
    source: IndexSource
    entries: OrderedDict[int, int] = field(default_factory=OrderedDict)  # key -> flags, LRU
    engine: dict[int, int] = field(default_factory=dict)  # engine hash -> own key
    tiers: dict[int, int] = field(default_factory=dict)  # engine hash -> tiers, if not GPU
    expiry: dict[int, float] = field(default_factory=dict)  # key -> expiry of a GUESS
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTERS, 0))


class EntryBook:
    """Entries of every endpoint and the holder masks by key; the index builds on it."""

    config: PrefixIndexConfig
    _endpoints: dict[str, Endpoint]
    _holders: dict[int, int]  # key -> bit mask of endpoints holding it
    _num_entries: int
    _evictions: int

    def _set(self, ep: Endpoint, key: int, flag: int, clear: int = 0) -> None:
        entries = ep.entries
        old = entries.get(key)
        if old is None:
            entries[key] = flag
            mask = self._holders.get(key)
            self._holders[key] = ep.bit if mask is None else mask | ep.bit
            self._num_entries += 1
            if self._num_entries > self.config.max_entries:
                self._evict()
        else:
            entries[key] = (old & ~clear) | flag
            entries.move_to_end(key)

    def _unset(self, ep: Endpoint, key: int, flag: int) -> None:
        entries = ep.entries
        old = entries.get(key)
        if old is None:
            return
        new = old & ~flag
        if new:
            entries[key] = new
            return
        del entries[key]
        ep.expiry.pop(key, None)
        self._num_entries -= 1
        self._unhold(key, ep.bit)

    def _unhold(self, key: int, bit: int) -> None:
        mask = self._holders.get(key, 0) & ~bit
        if mask:
            self._holders[key] = mask
        else:
            self._holders.pop(key, None)

    def _evict(self) -> None:
        """Evict a batch (max_entries / 1024, at least 1): each the LRU entry of the then
        largest endpoint. One heap build per batch, not an O(endpoints) scan per entry."""
        target = self.config.max_entries + 1 - max(1, self.config.max_entries >> 10)
        eps = self._endpoints.values()
        heap = [(-len(ep.entries), i, ep) for i, ep in enumerate(eps) if ep.entries]
        heapq.heapify(heap)  # ties: registration order, as max() over the dict would pick
        while self._num_entries > target and heap:
            size, i, victim = heap[0]
            key, _ = victim.entries.popitem(last=False)
            victim.expiry.pop(key, None)
            self._num_entries -= 1
            self._unhold(key, victim.bit)
            self._evictions += 1
            if size + 1 < 0:
                heapq.heapreplace(heap, (size + 1, i, victim))
            else:
                heapq.heappop(heap)
