"""The gateway keeps what its autoscaler learned in ``autoscale.state_path``: a restarted
controller starts from it, a changed value is written durably and an unchanged one is not,
rows of other pools survive, and a malformed, stale or unwritable file is logged and the loop
goes on."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from inferplane.core.autoscale_knowledge import PoolKnowledge, knowledge
from inferplane.core.types import EndpointInfo, EndpointState, EndpointView, EngineKind
from inferplane.gateway.autoscale import AutoscaleConfig, AutoscaleController, PoolScaleConfig
from inferplane.gateway.autoscale_store import MAX_AGE_S, LearnedStore

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


def _learned(ctl: AutoscaleController) -> dict[str, PoolKnowledge]:
    return knowledge(ctl.state, ctl.autoscaler.policies)


def test_the_store_round_trips_writes_only_a_change_and_keeps_other_pools(
    tmp_path: Path,
) -> None:
    store = LearnedStore(tmp_path / "sub" / "learned.json")
    assert store.load() == {}  # a first start
    other = {"other-model": PoolKnowledge(1.3, 0.0, None, 500.0)}
    assert store.save(other) is True
    learned = {MODEL: PoolKnowledge(1.6, 1.9, 70.0, 7000.0)}
    assert store.save(learned) is True
    assert store.save(dict(learned)) is False
    assert LearnedStore(store.path).load() == {**other, **learned}
    assert [p.name for p in store.path.parent.iterdir()] == ["learned.json"]  # no temp left


@pytest.mark.parametrize(
    "doc",
    [b"{not json", b'{"pools": {}}',
     orjson.dumps({"saved_at_unix": time.time(), "pools": {MODEL: {"utilisation": -2.0}}}),
     orjson.dumps({"saved_at_unix": time.time() - MAX_AGE_S - 60.0,
                   "pools": {MODEL: {"utilisation": 1.5}}})],
)  # fmt: skip
def test_a_malformed_or_stale_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, doc: bytes
) -> None:
    path = tmp_path / "learned.json"
    path.write_bytes(doc)
    with caplog.at_level(logging.WARNING, "inferplane.gateway.autoscale"):
        ctl, _, _ = _controller(path)
    assert ctl.state.pools == {}
    assert "ignoring learned values" in caplog.text


async def _loaded_ticks(ctl: AutoscaleController, requests: Counter, tokens: Counter) -> None:
    await ctl.tick(0.0)  # the counters' baseline
    capacity = ctl.autoscaler.policies[MODEL].options[0].tokens_per_s
    for _ in range(100):  # 1.4x the replica's modelled throughput, every call answered 200
        requests.labels(MODEL, "standard", "200").inc()
        tokens.labels(MODEL, "prompt").inc(1.4 * capacity * 15.0 / 100)
    await ctl.tick(15.0)


async def test_a_restarted_controller_starts_from_what_the_last_one_learned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "learned.json"
    ctl, requests, tokens = _controller(path)
    await _loaded_ticks(ctl, requests, tokens)
    learned = _learned(ctl)[MODEL]
    assert learned.utilisation == pytest.approx(1.4)
    assert orjson.loads(path.read_bytes())["pools"][MODEL]["utilisation"] == pytest.approx(1.4)

    again, _, _ = _controller(path)  # a deploy restarts the gateway
    assert _learned(again)[MODEL] == learned


async def test_an_unwritable_path_is_logged_once_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "learned.json"
    path.mkdir()  # a directory where the file should be: every write fails
    with caplog.at_level(logging.WARNING, "inferplane.gateway.autoscale"):
        ctl, requests, tokens = _controller(path)
        await _loaded_ticks(ctl, requests, tokens)
        await _loaded_ticks(ctl, requests, tokens)
    assert _learned(ctl)[MODEL].utilisation > 1.0 and len(ctl.decisions) == 1
    assert caplog.text.count("cannot keep learned values") == 1
    assert os.listdir(tmp_path) == ["learned.json"]  # no temp file left
