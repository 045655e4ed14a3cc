"""The cache backend interface and its in-memory implementation (the default).

A backend keeps :class:`CacheEntry` values by key and forgets them when they expire; it
checks nothing else. The caller verifies on every read that the entry belongs to the tenant,
model and key it asked for (``inferplane.core.cache.entry_matches``), so a backend that
returned the wrong entry (a collision, a bug, a poisoned shared store) still cannot leak an
answer across tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from inferplane.core.cache import CacheEntry
from inferplane.core.cache_store import LruStore


class CacheBackend(Protocol):
    """Async storage of cache entries by key (expiry included)."""

    async def get(self, key: str) -> CacheEntry | None: ...

    async def put(self, entry: CacheEntry) -> bool: ...

    async def delete(self, key: str) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class MemoryBackend:
    """Entries in this process: a bounded LRU read against the gateway's clock."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        max_entry_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        self.store = LruStore(max_entries, max_bytes, max_entry_bytes)
        self._clock = clock

    async def get(self, key: str) -> CacheEntry | None:
        return self.store.get(key, self._clock())

    async def put(self, entry: CacheEntry) -> bool:
        return self.store.put(entry, self._clock())

    async def delete(self, key: str) -> None:
        self.store.delete(key)

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        s = self.store
        return {
            "entries": len(s),
            "bytes": s.num_bytes,
            "evictions": s.evictions,
            "expirations": s.expirations,
        }
