"""The Redis store against the real server: the same answers as the in-memory store for the
same calls, quotas exact across processes under concurrent load, one workflow ledger seen
(and updated atomically) by two clients."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest
import redis

from inferplane.core.state import BucketSpec, BucketTake, Ejection, WorkflowDelta
from inferplane.state.memory import MemoryStore
from inferplane.state.redis import RedisStore
from tests.state.conftest import SHARED_URL, require_redis

pytestmark = pytest.mark.redis


async def test_same_answers_as_memory_for_a_random_call_sequence(redis_store: RedisStore) -> None:
    mem = MemoryStore()
    rng = random.Random(7)
    specs = [BucketSpec("a", 10.0, 0.5), BucketSpec("b", 300.0, 5.0)]
    now = 1_000.0
    for _ in range(120):
        now += rng.choice([0.0, 0.0, 0.3, 1.7])
        takes = [BucketTake(s, rng.choice([1.0, 3.0, 40.0])) for s in rng.sample(specs, 2)]
        if rng.random() < 0.2:
            takes = [BucketTake(takes[0].bucket, -rng.random() * 20)]
            await mem.charge(takes, now)
            await redis_store.charge(takes, now)
            continue
        got, want = await redis_store.take(takes, now), await mem.take(takes, now)
        assert got.admitted == want.admitted and got.refused_index == want.refused_index
        assert got.wait_s == pytest.approx(want.wait_s)
        for s in specs:
            assert await redis_store.bucket(s, now) == pytest.approx(await mem.bucket(s, now))
    for i in range(6):
        d = WorkflowDelta("t", steps_expected=5, in_flight=rng.choice([1, -1]),
                          dispatched_step=rng.choice([None, 1, 2, 2, 3]),
                          tokens=rng.randint(0, 99), cost_usd=0.25, steps_done=i % 2)  # fmt: skip
        got_wf = await redis_store.workflow_update("w", d, now + i, 600.0)
        assert got_wf == await mem.workflow_update("w", d, now + i, 600.0)
    assert await redis_store.workflow_get("w", now) == await mem.workflow_get("w", now)


async def test_ejections_routes_and_cache(redis_store: RedisStore) -> None:
    now = time.time()
    await redis_store.eject(Ejection("a", now + 100, "errors"))
    await redis_store.eject(Ejection("a", now + 50, "latency"))
    await redis_store.eject(Ejection("b", now - 1))
    found = await redis_store.ejections(now)
    assert set(found) == {"a"} and found["a"].until_s == pytest.approx(now + 100)
    assert found["a"].reason == "latency"
    await redis_store.record_route("e1", [11, 12, 13], now + 60)
    await redis_store.record_route("e2", [11], now - 1)
    assert await redis_store.match_routes([11, 12, 14], ["e1", "e2", "e3"], now) == {
        "e1": 2, "e2": 0, "e3": 0,
    }  # fmt: skip
    await redis_store.cache_put("k", b"\x00body", now + 60)
    assert await redis_store.cache_get("k", now) == b"\x00body"
    await redis_store.cache_put("gone", b"x", now - 1)
    assert await redis_store.cache_get("gone", now) is None


async def test_route_records_are_capped_per_endpoint(prefix: str) -> None:
    store = RedisStore(SHARED_URL, prefix=prefix, max_route_keys=2, op_timeout_s=2.0)
    try:
        now = time.time()
        await store.record_route("e", [1], now + 10)
        await store.record_route("e", [2, 3], now + 20)
        assert (await store.match_routes([2, 3], ["e"], now))["e"] == 2
        assert (await store.match_routes([1], ["e"], now))["e"] == 0  # soonest to expire went
    finally:
        await store.clear()
        await store.close()


_CLIENT = """
import asyncio, sys, time
from inferplane.core.admission_config import QuotaLimits, QuotasConfig
from inferplane.state.quota_client import SharedQuotas
from inferplane.state.redis import RedisStore

async def main(prefix: str, n: int) -> None:
    store = RedisStore(prefix=prefix, op_timeout_s=5.0, connect_timeout_s=5.0)
    quotas = SharedQuotas(store, QuotasConfig(tenants={"acme": QuotaLimits(requests_per_min=100)}))
    await store.ping()
    print("ready", flush=True)
    start = float(sys.stdin.readline())  # both processes start together
    await asyncio.sleep(max(0.0, start - time.time()))
    admitted = 0
    for _ in range(n // 10):  # waves of 10 concurrent calls, so the two interleave
        refusals = await asyncio.gather(
            *(quotas.try_acquire("acme", None, 10, time.time()) for _ in range(10))
        )
        admitted += sum(r is None for r in refusals)
    print(admitted, flush=True)
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@pytest.mark.slow
def test_two_processes_admit_at_most_the_quota(prefix: str) -> None:
    require_redis()
    cmd = [sys.executable, "-c", _CLIENT, prefix, "150"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(cmd, **pipes) for _ in range(2)]  # type: ignore[call-overload]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        start = time.time() + 0.2
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start!r}\n")
            p.stdin.flush()
        admitted = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
        elapsed_s = time.time() - start
        assert all(p.returncode == 0 for p in procs)
        # 300 calls against 100/min: exactly the bucket, plus what refilled meanwhile
        assert 100 <= sum(admitted) <= 100 + int(elapsed_s * 100 / 60), admitted
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        client = redis.Redis.from_url(SHARED_URL)
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)


async def test_two_clients_share_one_workflow_ledger(redis_store: RedisStore) -> None:
    other = RedisStore(SHARED_URL, prefix=redis_store.prefix, op_timeout_s=2.0)
    try:
        now = time.time()
        first = WorkflowDelta("acme", steps_expected=40, in_flight=1, dispatched_step=1)
        await redis_store.workflow_update("wf", first, now, 60.0)
        seen = await other.workflow_get("wf", now)
        assert seen is not None and seen.steps_expected == 40 and seen.in_flight == 1
        step = WorkflowDelta("acme", tokens=10, steps_done=1, cost_usd=0.5)
        await asyncio.gather(
            *(s.workflow_update("wf", step, now, 60.0)
              for _ in range(20) for s in (redis_store, other))
        )  # fmt: skip
        a, b = await redis_store.workflow_get("wf", now), await other.workflow_get("wf", now)
        assert a == b and a is not None
        assert (a.steps_done, a.tokens, a.cost_usd) == (40, 400, pytest.approx(20.0))
        assert await other.workflow_end("wf") and await redis_store.workflow_get("wf", now) is None
    finally:
        await other.close()


async def test_idle_buckets_and_workflows_expire_in_redis(redis_store: RedisStore) -> None:
    spec = BucketSpec("fast", 2.0, 100.0)  # full again after 20 ms: kept ~1 s
    await redis_store.take([BucketTake(spec, 1)], time.time())
    ttl_ms = await redis_store.conn.execute("PTTL", redis_store.prefix + "b:fast")
    assert 0 < ttl_ms <= 1100
    await redis_store.workflow_update("w", WorkflowDelta("t"), time.time(), 30.0)
    wf_ttl = await redis_store.conn.execute("PTTL", redis_store.prefix + "wf:w")
    assert 25_000 < wf_ttl <= 30_000
    assert json.dumps(await redis_store.clear()) in {"2"}
