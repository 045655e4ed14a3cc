"""Redis backend against the real server on 127.0.0.1:6379: round trip, expiry, bounds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from inferplane.cache.redis_backend import RedisBackend
from inferplane.core.cache import CacheEntry, PayloadKind

pytestmark = pytest.mark.redis
URL = "redis://127.0.0.1:6379/0"


def entry(key: str, ttl_s: float = 60.0, tenant: str = "t", size: int = 20) -> CacheEntry:
    return CacheEntry(
        key, tenant, "m", PayloadKind.SSE, b"d" * size, 100.0, 100.0 + ttl_s, 0.25, 1.5, 9, "fp"
    )


@pytest.fixture
async def backend() -> AsyncIterator[RedisBackend]:
    # A namespace of its own: tests run in parallel and share the server.
    store = RedisBackend(URL, f"test-cache-{uuid.uuid4().hex}", max_entries=4, max_entry_bytes=500)
    try:
        yield store
    finally:
        await store.clear()
        await store.close()


async def test_round_trip_keeps_every_field(backend: RedisBackend) -> None:
    stored = entry("k1")
    assert await backend.put(stored)
    assert await backend.get("k1") == stored
    assert await backend.get("missing") is None
    await backend.delete("k1")
    assert await backend.get("k1") is None


async def test_entries_expire_by_redis_ttl(backend: RedisBackend) -> None:
    assert await backend.put(entry("short", ttl_s=0.15))
    assert await backend.put(entry("long", ttl_s=30.0))
    assert await backend.get("short") is not None
    await asyncio.sleep(0.4)
    assert await backend.get("short") is None
    assert await backend.get("long") is not None


async def test_store_is_bounded_and_drops_oldest_first(backend: RedisBackend) -> None:
    for i in range(7):
        assert await backend.put(entry(f"k{i}"))
    present = [i for i in range(7) if await backend.get(f"k{i}") is not None]
    assert present == [3, 4, 5, 6]
    assert backend.stats()["evictions"] == 3
    assert not await backend.put(entry("huge", size=2000))  # over max_entry_bytes


async def test_keys_are_namespaced_and_corrupt_values_are_misses(backend: RedisBackend) -> None:
    await backend.put(entry("k"))
    client = aioredis.Redis.from_url(URL)
    try:
        names = [n async for n in client.scan_iter(match=backend._prefix + "*")]
        assert names == [(backend._prefix + "k").encode()]
        await client.set(backend._prefix + "bad", b"\xffnot msgpack")
    finally:
        await client.aclose()
    assert await backend.get("bad") is None and backend.stats()["corrupt"] == 1


async def test_unreachable_redis_misses_instead_of_failing() -> None:
    down = RedisBackend("redis://127.0.0.1:1/0", "x", 10, 1000, timeout_s=0.2)
    try:
        assert await down.get("k") is None
        assert not await down.put(entry("k"))
        assert down.stats()["errors"] == 2
    finally:
        await down.close()
