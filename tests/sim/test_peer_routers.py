"""llm-d, Dynamo and LiteLLM baselines: each follows its published rule and default numbers."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from inferplane.config import load_config
from inferplane.core.types import (
    CallContext,
    EndpointInfo,
    EndpointLoad,
    EndpointState,
    EndpointView,
    EngineKind,
    PriorityClass,
)
from inferplane.sim.peer_routers import DynamoKV, LiteLLMLeastBusy, LlmD
from inferplane.sim.records import Outcome
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import load_scenario
from tests.sim.helpers import write_scenario


def _view(name: str, in_flight: int = 0, waiting: int = 0, kv: float = 0.0) -> EndpointView:
    info = EndpointInfo(name, f"http://{name}", EngineKind.VLLM, ("m",), "h100", 3.0, "r")
    load = EndpointLoad(waiting, 0, kv, 0.0)
    return EndpointView(info, EndpointState.READY, load, in_flight)


def _call(keys: tuple[int, ...] = (), num_tokens: int = 100) -> CallContext:
    return CallContext("r", "t", "m", PriorityClass.STANDARD, 0.0, num_tokens, 10,
                       prompt_block_keys=keys)  # fmt: skip


class _Index:
    """A prefix matcher with fixed matches per endpoint."""

    def __init__(self, blocks: dict[str, int]) -> None:
        self.blocks = blocks

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        return {n: min(len(keys), self.blocks.get(n, 0)) for n in endpoints}


def test_llm_d_weighs_prefix_3_queue_2_kv_2() -> None:
    policy, rng = LlmD(), random.Random(0)
    prefix = tuple(range(10))
    first = policy.route(_call(prefix), [_view("a"), _view("b")], 0.0, rng).primary
    assert first is not None
    other = "b" if first == "a" else "a"
    # The holder has the longest queue (queue score 0) and 40% KV in use: 3*1 + 0 + 2*0.6
    # beats the idle other's 0 + 2*1 + 2*1.
    views = [_view(first, waiting=4, kv=0.4), _view(other, waiting=0, kv=0.0)]
    decision = policy.route(_call(prefix), views, 0.0, rng)
    assert decision.primary == first
    assert decision.ranked[0].score == pytest.approx((3 * 1.0 + 0 + 2 * 0.6) / 7)
    assert decision.ranked[1].score == pytest.approx((0 + 2 * 1.0 + 2 * 1.0) / 7)
    # Without the prefix the shorter queue and freer cache win.
    assert policy.route(_call((77, 78)), views, 0.0, rng).primary == other


def test_dynamo_cost_is_blocks_to_prefill_plus_active_blocks() -> None:
    index = _Index({"a": 8})
    policy, rng = DynamoKV(index), random.Random(0)
    keys = tuple(range(10))  # 10 blocks: 2 to prefill on a, 10 on b
    views = [_view("a"), _view("b")]
    decision = policy.route(_call(keys, 160), views, 0.0, rng)
    assert decision.primary == "a" and [r.score for r in decision.ranked] == [-2.0, -10.0]
    # a now has 10 active blocks in flight: 2 + 10 = 12 > 10 on b.
    views = [_view("a", in_flight=1), _view("b")]
    assert policy.route(_call(keys, 160), views, 0.0, rng).primary == "b"
    # Once a's call finished (in-flight 0) its active blocks are gone again.
    views = [_view("a"), _view("b", in_flight=1)]
    assert policy.route(_call(keys, 160), views, 0.0, rng).primary == "a"


def test_litellm_least_busy_skips_deployments_in_cooldown() -> None:
    policy, rng = LiteLLMLeastBusy(), random.Random(0)
    views = [_view("a", in_flight=0), _view("b", in_flight=3)]
    assert policy.route(_call(), views, 0.0, rng).primary == "a"
    for i in range(4):  # 4 failures: fewer than 5 calls this minute, no cooldown yet
        policy.on_done(None, "a", False, 1.0 + i)
    assert not policy.cooling("a", 5.0)
    policy.on_done(None, "a", True, 5.0)  # 5 calls, 80% failed: cool down for 5 s
    assert policy.cooling("a", 9.9) and not policy.cooling("a", 10.1)
    assert policy.route(_call(), views, 6.0, rng).primary == "b"
    policy.on_done(None, "b", False, 6.0)
    assert policy.route(_call(), views, 6.0, rng).primary == "b"  # 1 call: below the minimum
    for t in (6.1, 6.2, 6.3, 6.4):
        policy.on_done(None, "b", False, t)
    refused = policy.route(_call(), views, 7.0, rng)
    assert refused.primary is None and "cooling down" in refused.reason
    # A new minute starts the count afresh.
    policy.on_done(None, "a", False, 61.0)
    assert not policy.cooling("a", 62.0)


def test_new_baselines_run_in_a_scenario(tmp_path: Path) -> None:
    folder = tmp_path
    path = write_scenario(folder, policies=["llm-d", "dynamo-kv", "litellm"])
    scenario = load_scenario(path)
    fleet = load_config(folder / "fleet.yaml")
    for name in scenario.policies:
        result = Simulation(scenario, fleet, folder, name).run()
        served = {r.endpoint for r in result.records if r.endpoint is not None}
        assert served == {"h100-0", "h100-1"}, name
        ok = sum(r.outcome is Outcome.SUCCESS for r in result.records)
        assert ok > 0.8 * len(result.records), name
