"""The gateway keeps what its autoscaler learned in ``autoscale.state_path``: a restarted
controller starts from it, a changed value is written (atomically) and an unchanged one is
not, and a malformed file is ignored rather than stopping the loop."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from inferplane.core.autoscale_knowledge import PoolKnowledge, knowledge
from inferplane.core.types import EndpointInfo, EndpointState, EndpointView, EngineKind
from inferplane.gateway.autoscale import AutoscaleConfig, AutoscaleController, PoolScaleConfig
from inferplane.gateway.autoscale_store import LearnedStore

MODEL = "llama-3-8b"


def _controller(path: Path) -> tuple[AutoscaleController, Counter, Counter]:
    registry = CollectorRegistry()
    requests = Counter(
        "inferplane_requests", "r", ("model", "priority", "status"), registry=registry
    )
    tokens = Counter("inferplane_tokens", "t", ("model", "kind"), registry=registry)
    pool = PoolScaleConfig(model=MODEL, gpus=("h100",), max_replicas=4)
    config = AutoscaleConfig(enabled=True, pools=(pool,), state_path=str(path))
    info = EndpointInfo("e0", "http://127.0.0.1:1", EngineKind.VLLM, (MODEL,), "h100", 2.0, "r")
    view = EndpointView(info, EndpointState.READY)  # one replica serving
    return AutoscaleController(config, registry, lambda now: [view], []), requests, tokens


def test_the_store_round_trips_and_writes_only_a_change(tmp_path: Path) -> None:
    store = LearnedStore(tmp_path / "sub" / "learned.json")
    assert store.load() == {}  # a first start
    learned = {MODEL: PoolKnowledge(1.6, 2.0, 70.0)}
    assert store.save(learned) is True
    assert store.save(dict(learned)) is False
    assert LearnedStore(store.path).load() == learned
    assert [p.name for p in store.path.parent.iterdir()] == ["learned.json"]  # no temp left


def test_a_malformed_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "learned.json"
    for content in (b"{not json", b'{"llama-3-8b": {"utilisation": -2}}'):
        path.write_bytes(content)
        with caplog.at_level(logging.WARNING, "inferplane.gateway.autoscale"):
            ctl, _, _ = _controller(path)
        assert knowledge(ctl.state) == {}
        assert "ignoring learned values" in caplog.text
        caplog.clear()


async def test_a_restarted_controller_starts_from_what_the_last_one_learned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "learned.json"
    ctl, requests, tokens = _controller(path)
    await ctl.tick(0.0)  # the counters' baseline
    capacity = ctl.autoscaler.policies[MODEL].options[0].tokens_per_s
    for _ in range(100):  # 1.4x the replica's modelled throughput, every call answered 200
        requests.labels(MODEL, "standard", "200").inc()
        tokens.labels(MODEL, "prompt").inc(1.4 * capacity * 15.0 / 100)
    await ctl.tick(15.0)
    learned = knowledge(ctl.state)[MODEL]
    assert learned.utilisation == pytest.approx(1.4)
    assert orjson.loads(path.read_bytes())[MODEL]["utilisation"] == pytest.approx(1.4)

    again, _, _ = _controller(path)  # a deploy restarts the gateway
    assert knowledge(again.state)[MODEL] == learned
