"""The resilient store over a private redis-server that the tests kill, restart and pause:
calls keep succeeding, the degradation is counted, and the shared state converges."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from inferplane.core.state import BucketSpec, BucketTake, Ejection, StoreMode, WorkflowDelta
from inferplane.state.redis import RedisStore
from inferplane.state.resilient import ResilientStore
from tests.state.conftest import PrivateRedis

pytestmark = pytest.mark.redis

QUOTA = BucketSpec("q:tenant:acme:requests_per_min", 1000.0, 1000.0 / 60)


def _store(server: PrivateRedis, **kw: float) -> tuple[ResilientStore, list[StoreMode]]:
    modes: list[StoreMode] = []
    shared = RedisStore(server.url, prefix="t:", op_timeout_s=0.5, connect_timeout_s=0.5)
    store = ResilientStore(
        shared, op_timeout_s=0.5, on_mode=lambda old, new, why: modes.append(new), **kw
    )
    return store, modes


async def _burst(store: ResilientStore, n: int, now: float) -> int:
    results = await asyncio.gather(*(store.take([BucketTake(QUOTA, 1)], now) for _ in range(n)))
    return sum(r.admitted for r in results)


async def test_redis_killed_mid_load_then_restarted_empty(private_redis: PrivateRedis) -> None:
    store, modes = _store(private_redis)
    now = time.time()
    assert await _burst(store, 20, now) == 20 and store.mode is StoreMode.SHARED
    wf = WorkflowDelta("acme", steps_expected=3, in_flight=1, dispatched_step=1)
    await store.workflow_update("wf", wf, now, 300.0)

    load = asyncio.create_task(_burst(store, 200, now))
    private_redis.kill()  # mid-load: calls in flight fail over, none is lost
    assert await load == 200
    assert await _burst(store, 30, now) == 30
    stats = store.stats()
    assert store.mode is StoreMode.DEGRADED and sum(stats.degradations.values()) >= 1
    assert stats.local_ops >= 30
    done = WorkflowDelta("acme", in_flight=-1, tokens=40, steps_done=1)
    local_wf = await store.workflow_update("wf", done, now + 1, 300.0)
    await store.eject(Ejection("gpu-3", now + 600, "errors"))
    assert (await store.ejections(now))["gpu-3"].reason == "errors"
    assert await store.maintain(now) is StoreMode.DEGRADED  # still down: stays local

    private_redis.start()  # a fresh server: it lost everything
    assert await store.maintain(now + 2) is StoreMode.SHARED
    assert modes == [StoreMode.DEGRADED, StoreMode.RECONCILING, StoreMode.SHARED]
    assert store.stats().journal_size == 0 and store.stats().reconciles == 1
    shared = store.shared
    # the restarted store holds at least what was taken while it was away (refill aside)
    level = await shared.bucket(QUOTA, now + 2)
    taken_while_down = 1000.0 - level
    assert 230 - 1e-6 <= taken_while_down <= 250  # 230 local + at most the 20 lost in flight
    assert await shared.workflow_get("wf", now + 2) == local_wf
    assert local_wf.steps_done == 1 and local_wf.steps_expected == 3  # mirrored before
    assert set(await shared.ejections(now)) == {"gpu-3"}
    await store.close()


async def test_slow_redis_times_out_then_deltas_replay_onto_kept_state(
    private_redis: PrivateRedis,
) -> None:
    store, _ = _store(private_redis)
    now = time.time()
    await store.workflow_update("wf", WorkflowDelta("acme", in_flight=1), now, 300.0)
    assert await _burst(store, 10, now) == 10
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)  # alive but not answering
    try:
        assert await _burst(store, 15, now) == 15
        assert store.stats().degradations.get("timeout", 0) >= 1
        await store.workflow_update("wf", WorkflowDelta("acme", tokens=7), now + 1, 300.0)
        assert await store.maintain(now) is StoreMode.DEGRADED
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    assert await store.maintain(now) is StoreMode.SHARED
    # all 25 are counted; the 15 sent to the paused server may count twice (they reached it
    # and their replies were lost): errors lean to refusing, never to over-admitting
    level = await store.shared.bucket(QUOTA, now)
    assert 1000.0 - 25.0 - 15.0 - 1e-6 <= level <= 1000.0 - 25.0 + 1e-6
    rec = await store.shared.workflow_get("wf", now)
    assert rec is not None and (rec.in_flight, rec.tokens) == (1, 7)
    await store.close()


async def test_degraded_share_limits_each_replica_to_its_part(
    private_redis: PrivateRedis,
) -> None:
    store, _ = _store(private_redis, degraded_share=0.25)
    private_redis.kill()
    admitted = await _burst(store, 400, time.time())
    assert admitted == 250  # a quarter of the 1000/min quota
    assert store.mode is StoreMode.DEGRADED
    await store.close()


async def test_journal_is_bounded_and_counts_what_it_dropped(
    private_redis: PrivateRedis,
) -> None:
    store, _ = _store(private_redis, max_journal=100)
    private_redis.kill()
    now = time.time()
    for i in range(150):
        await store.workflow_update(f"wf{i}", WorkflowDelta("t", tokens=1), now, 300.0)
    stats = store.stats()
    assert stats.journal_size <= 100 and stats.journal_dropped == 50
    await store.close()
