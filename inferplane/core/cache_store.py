"""A bounded LRU of cache entries with per-entry expiry: the in-memory exact cache.

Bounded twice, by entry count and by bytes (payload plus a fixed overhead per entry), so a
burst of large answers cannot grow the gateway's memory past ``max_bytes``. Expired entries
are dropped when read and, cheaply, from the cold end when space is needed. ``now`` is an
argument: the store is pure and serves the gateway and the simulator alike.
"""

from __future__ import annotations

from collections import OrderedDict

from inferplane.core.cache import CacheEntry


class LruStore:
    """Entries by key, least recently used first; never over its bounds."""

    def __init__(self, max_entries: int, max_bytes: int, max_entry_bytes: int | None = None):
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("cache bounds must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes if max_entry_bytes is None else max_entry_bytes
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self.num_bytes = 0
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> CacheEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now >= entry.expires_s:
            self._drop(key)
            self.expirations += 1
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, entry: CacheEntry, now: float) -> bool:
        """Store (or replace) an entry; False when it is too large to keep at all."""
        size = entry.num_bytes
        if size > self.max_entry_bytes or size > self.max_bytes or now >= entry.expires_s:
            return False
        if entry.key in self._entries:
            self._drop(entry.key)
        self._make_room(size, now)
        self._entries[entry.key] = entry
        self.num_bytes += size
        return True

    def delete(self, key: str) -> None:
        if key in self._entries:
            self._drop(key)

    def _make_room(self, size: int, now: float) -> None:
        while self._entries and (
            len(self._entries) >= self.max_entries or self.num_bytes + size > self.max_bytes
        ):
            key, oldest = next(iter(self._entries.items()))
            self._drop(key)
            if now >= oldest.expires_s:
                self.expirations += 1
            else:
                self.evictions += 1

    def _drop(self, key: str) -> None:
        self.num_bytes -= self._entries.pop(key).num_bytes
