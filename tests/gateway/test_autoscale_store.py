"""The gateway keeps what its autoscaler learned (``autoscale.learned_store``: a file, or the
real Redis on 127.0.0.1:6379): a restarted controller starts from it, a changed value is
written and an unchanged one is not, rows of other pools survive, and a malformed, stale or
unwritable store is logged and the loop goes on."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from inferplane.config import parse_config
from inferplane.core.autoscale_knowledge import PoolKnowledge, knowledge
from inferplane.core.types import EndpointInfo, EndpointState, EndpointView, EngineKind
from inferplane.gateway.autoscale import AutoscaleConfig, AutoscaleController, PoolScaleConfig
from inferplane.gateway.autoscale_store import (
    MAX_AGE_S,
    FileLearnedStore,
    LearnedStore,
    RedisLearnedStore,
)
from tests.state.conftest import SHARED_URL, require_redis

MODEL = "llama-3-8b"


def _controller(store: LearnedStore) -> tuple[AutoscaleController, Counter, Counter]:
    registry = CollectorRegistry()
    requests = Counter(
        "inferplane_requests", "r", ("model", "priority", "status"), registry=registry
    )
    tokens = Counter("inferplane_tokens", "t", ("model", "kind"), registry=registry)
    pool = PoolScaleConfig(model=MODEL, gpus=("h100",), max_replicas=4)
    config = AutoscaleConfig(enabled=True, pools=(pool,))
    info = EndpointInfo("e0", "http://127.0.0.1:1", EngineKind.VLLM, (MODEL,), "h100", 2.0, "r")
    view = EndpointView(info, EndpointState.READY)  # one replica serving
    ctl = AutoscaleController(config, registry, lambda now: [view], [], store=store)
    return ctl, requests, tokens


def _learned(ctl: AutoscaleController) -> dict[str, PoolKnowledge]:
    return knowledge(ctl.state, ctl.autoscaler.policies)


async def _loaded_ticks(ctl: AutoscaleController, requests: Counter, tokens: Counter) -> None:
    await ctl.tick(0.0)  # the counters' baseline
    capacity = ctl.autoscaler.policies[MODEL].options[0].tokens_per_s
    for _ in range(100):  # 1.4x the replica's modelled throughput, every call answered 200
        requests.labels(MODEL, "standard", "200").inc()
        tokens.labels(MODEL, "prompt").inc(1.4 * capacity * 15.0 / 100)
    await ctl.tick(15.0)


async def _restart_keeps_what_was_learned(make: Callable[[], LearnedStore]) -> None:
    ctl, requests, tokens = _controller(make())
    await ctl.restore()  # a first start: nothing kept
    assert ctl.state.pools == {}
    await _loaded_ticks(ctl, requests, tokens)
    learned = _learned(ctl)[MODEL]
    assert learned.utilisation == pytest.approx(1.4)
    again, _, _ = _controller(make())  # a deploy restarts it
    await again.restore()
    assert _learned(again)[MODEL] == learned
    for c in (ctl, again):
        assert c.store is not None
        await c.store.close()


async def test_a_restarted_controller_starts_from_its_file(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    await _restart_keeps_what_was_learned(lambda: FileLearnedStore(path))
    pools = orjson.loads(path.read_bytes())["pools"]
    assert pools[MODEL]["utilisation"] == pytest.approx(1.4)


async def test_a_restarted_controller_starts_from_redis() -> None:
    require_redis()
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    try:
        await _restart_keeps_what_was_learned(lambda: RedisLearnedStore(SHARED_URL, prefix=prefix))
    finally:
        store = RedisLearnedStore(SHARED_URL, prefix=prefix)
        await store._conn.execute("DEL", store.key)
        await store.close()


async def test_the_file_writes_only_a_change_and_keeps_other_pools(tmp_path: Path) -> None:
    store = FileLearnedStore(tmp_path / "sub" / "learned.json")
    assert await store.load() == {}
    other = {"other-model": PoolKnowledge(1.3, 0.0, None, 500.0)}
    assert await store.save(other) is True
    learned = {MODEL: PoolKnowledge(1.6, 1.9, 70.0, 7000.0)}
    assert await store.save(learned) is True
    assert await store.save(dict(learned)) is False
    assert await FileLearnedStore(store.path).load() == {**other, **learned}
    assert os.listdir(store.path.parent) == ["learned.json"]  # no temp file left


async def test_redis_keeps_a_row_per_pool_and_drops_stale_ones() -> None:
    require_redis()
    store = RedisLearnedStore(SHARED_URL, prefix=f"test:{uuid.uuid4().hex[:12]}:")
    try:
        assert await store.load() == {}
        learned = {MODEL: PoolKnowledge(1.6, 1.9, 70.0, 7000.0), "b": PoolKnowledge(1.2)}
        assert await store.save(learned) is True
        assert await store.save(dict(learned)) is False
        stale = orjson.dumps({"utilisation": 3.0, "saved_at_unix": time.time() - MAX_AGE_S - 9})
        await store._conn.execute("HSET", store.key, "b", stale)
        assert await store.load() == {MODEL: learned[MODEL]}
    finally:
        await store._conn.execute("DEL", store.key)
        await store.close()


@pytest.mark.parametrize(
    "doc",
    [b"{not json", b'{"pools": {}}',
     orjson.dumps({"saved_at_unix": time.time(), "pools": {MODEL: {"utilisation": -2.0}}}),
     orjson.dumps({"saved_at_unix": time.time() - MAX_AGE_S - 60.0,
                   "pools": {MODEL: {"utilisation": 1.5}}})],
)  # fmt: skip
async def test_a_malformed_or_stale_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, doc: bytes
) -> None:
    path = tmp_path / "learned.json"
    path.write_bytes(doc)
    ctl, _, _ = _controller(FileLearnedStore(path))
    with caplog.at_level(logging.WARNING, "inferplane.gateway.autoscale"):
        await ctl.restore()
    assert ctl.state.pools == {}
    assert "ignoring learned values" in caplog.text


async def test_an_unwritable_store_is_logged_once_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "learned.json"
    path.mkdir()  # a directory where the file should be: every write fails
    ctl, requests, tokens = _controller(FileLearnedStore(path))
    with caplog.at_level(logging.WARNING, "inferplane.gateway.autoscale"):
        await ctl.restore()
        await _loaded_ticks(ctl, requests, tokens)  # two writes that fail
    assert _learned(ctl)[MODEL].utilisation > 1.0 and len(ctl.decisions) == 1
    assert caplog.text.count("cannot keep learned values") == 1
    assert os.listdir(tmp_path) == ["learned.json"]  # no temp file left


def test_the_store_is_a_config_choice_checked_at_start() -> None:
    endpoint = {"name": "e", "url": "http://127.0.0.1:1", "kind": "vllm", "models": [MODEL],
                "gpu": "h100", "price_per_hour_usd": 2.0}  # fmt: skip
    base = {"endpoints": [endpoint]}
    pool = {"model": MODEL, "gpus": ["h100"]}
    assert parse_config(base).autoscale.learned_store.value == "memory"  # the default
    with pytest.raises(ValueError, match="learned_store: file needs state_path"):
        parse_config({**base, "autoscale": {"pools": [pool], "learned_store": "file"}})
    with pytest.raises(ValueError, match="learned_store: file needs state_path"):
        parse_config({**base, "autoscale": {"pools": [pool], "state_path": "/tmp/x.json"}})
    with pytest.raises(ValueError, match=r"learned_store: redis needs state\.backend: redis"):
        parse_config({**base, "autoscale": {"pools": [pool], "learned_store": "redis"}})
    ok = parse_config({**base, "state": {"backend": "redis"},
                       "autoscale": {"pools": [pool], "learned_store": "redis"}})  # fmt: skip
    assert ok.autoscale.learned_store.value == "redis"
