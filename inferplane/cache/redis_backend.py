"""Cache entries in Redis, shared by every gateway replica.

Each entry is one string key ``{namespace}:v1:e:{key}`` holding the msgpack of the entry,
with the route's TTL as Redis expiry (so replicas, whose clocks differ, never judge freshness
themselves). The store is bounded in entries: a sorted set ``{namespace}:v1:index`` orders keys
by insertion (a Redis counter, not a clock) and a Lua script stores, indexes and trims the
oldest past ``max_entries`` in one atomic round trip. Answers over ``max_entry_bytes`` are not
stored. A Redis that is down or slow makes lookups miss and stores fail quietly (counted): the
cache must never fail a call.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from inferplane.core.cache import CacheEntry

_PUT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local seq = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], seq, ARGV[3])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('DEL', ARGV[5] .. old[i]) end
  return over
end
return 0
"""


class RedisBackend:
    """Entries in a Redis server; expiry and bounds enforced by Redis itself."""

    def __init__(
        self,
        url: str,
        namespace: str,
        max_entries: int,
        max_entry_bytes: int,
        timeout_s: float = 0.25,
        client: Any = None,
    ) -> None:
        self._redis: Any = client or aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._prefix = f"{namespace}:v1:e:"
        self._index = f"{namespace}:v1:index"
        self._seq = f"{namespace}:v1:seq"
        self._max_entries = max_entries
        self._max_entry_bytes = max_entry_bytes
        self._put_script = self._redis.register_script(_PUT)
        self._stats = {"gets": 0, "puts": 0, "evictions": 0, "errors": 0, "corrupt": 0}

    async def get(self, key: str) -> CacheEntry | None:
        self._stats["gets"] += 1
        try:
            raw = await self._redis.get(self._prefix + key)
        except (RedisError, OSError):
            self._stats["errors"] += 1
            return None
        if raw is None:
            return None
        entry = CacheEntry.decode(raw)
        if entry is None:
            self._stats["corrupt"] += 1
        return entry

    async def put(self, entry: CacheEntry) -> bool:
        raw = entry.encode()
        ttl_ms = int(1000 * (entry.expires_s - entry.created_s))
        if len(raw) > self._max_entry_bytes or ttl_ms < 1:
            return False
        try:
            evicted = await self._put_script(
                keys=[self._prefix + entry.key, self._index, self._seq],
                args=[raw, ttl_ms, entry.key, self._max_entries, self._prefix],
            )
        except (RedisError, OSError):
            self._stats["errors"] += 1
            return False
        self._stats["puts"] += 1
        self._stats["evictions"] += int(evicted)
        return True

    async def delete(self, key: str) -> None:
        try:
            await self._redis.delete(self._prefix + key)
            await self._redis.zrem(self._index, key)
        except (RedisError, OSError):
            self._stats["errors"] += 1

    async def clear(self) -> None:
        """Remove every key of this namespace (tests, and an operator's flush)."""
        async for name in self._redis.scan_iter(match=self._prefix + "*", count=500):
            await self._redis.delete(name)
        await self._redis.delete(self._index, self._seq)

    async def close(self) -> None:
        await self._redis.aclose()

    def stats(self) -> dict[str, int]:
        return dict(self._stats)
