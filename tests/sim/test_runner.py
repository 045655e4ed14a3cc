"""The runner end to end on tiny scenarios: determinism, conservation, leaping, faults."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from inferplane.config import load_config
from inferplane.engine.profiles import load_profile
from inferplane.engine.types import EngineState
from inferplane.sim.cli import simulate
from inferplane.sim.events import EventKind
from inferplane.sim.ledger import Call
from inferplane.sim.records import Outcome
from inferplane.sim.report import to_json
from inferplane.sim.runner import Simulation
from inferplane.sim.scenario import load_scenario

from .helpers import write_scenario


def _sim(path: Path, policy: str = "inferplane") -> Simulation:
    scenario = load_scenario(path)
    return Simulation(scenario, load_config(path.parent / scenario.fleet), path.parent, policy)


def test_same_seed_gives_byte_identical_json(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, duration_s=12)
    first = to_json(simulate(path)[0])
    second = to_json(simulate(path)[0])
    assert first == second
    other = to_json(simulate(path, seed=6)[0])
    assert other != first


def test_every_call_ends_exactly_once_and_every_task_once(tmp_path: Path) -> None:
    sim = _sim(write_scenario(tmp_path))
    result = sim.run()
    ids = [r.call_id for r in result.records]
    assert len(ids) == len(set(ids)) == sim._next_call_id
    assert sum(result.tasks.values()) == sum(r.step == 0 for r in result.records)
    assert result.accounting.num_requests + result.accounting.num_in_flight >= sum(
        r.outcome is not Outcome.UNFINISHED for r in result.records
    )
    for r in result.records:
        if r.outcome is Outcome.SUCCESS:
            assert r.first_token_s is not None and r.finish_s is not None
            assert r.arrival_s < r.first_token_s <= r.finish_s
            assert r.completion_tokens > 0
    agents = [r for r in result.records if r.source == "agents" and r.step > 0]
    assert agents and sum(r.cached_tokens for r in agents) > 0  # growing context is reused


def test_leaps_over_quiet_time(tmp_path: Path) -> None:
    path = write_scenario(
        tmp_path, duration_s=50_000, sample_interval_s=5_000, faults=[],
        workload=[{"name": "chat", "kind": "chat", "rate_rps": 2, "stop_s": 3}],
    )  # fmt: skip
    result = _sim(path).run()
    assert len(result.records) > 0
    assert all(r.outcome is Outcome.SUCCESS for r in result.records)
    assert result.counters["events"] < 5_000  # a 1 ms tick would need 50 million
    assert result.samples[-1].time_s == 50_000


def test_crash_fails_in_flight_calls_and_endpoint_returns_after_cold_start(
    tmp_path: Path,
) -> None:
    load_s = load_profile("llama-3-8b", "h100", 1).load_time_s
    crash_s = 5.0
    path = write_scenario(
        tmp_path, duration_s=crash_s + load_s + 15, drain_s=30, clients={"max_retries": 0},
        workload=[{"name": "chat", "kind": "chat", "rate_rps": 2, "prompt_tokens": 500,
                   "output_tokens": 2000}],
        faults=[{"kind": "crash", "at_s": crash_s, "endpoints": ["h100-0"],
                 "restart_after_s": 0}],
    )  # fmt: skip
    sim = _sim(path, "round-robin")
    result = sim.run()
    failed = [r for r in result.records if r.outcome is Outcome.FAILED]
    assert failed and {r.endpoint for r in failed} == {"h100-0"}
    assert all(r.arrival_s < crash_s and r.reason == "engine_error" for r in failed)
    on_crashed = [r for r in result.records if r.endpoint == "h100-0"]
    assert not [r for r in on_crashed if crash_s <= r.arrival_s < crash_s + load_s]
    back = [r for r in on_crashed if r.arrival_s >= crash_s + load_s]
    assert back and all(r.outcome is Outcome.SUCCESS for r in back)
    assert sim.fleet.by_name["h100-0"].engine.state is EngineState.READY
    assert result.tasks["failure"] == len(failed)


def test_timeouts_retry_then_give_up(tmp_path: Path) -> None:
    path = write_scenario(
        tmp_path, duration_s=10, drain_s=60, clients={"timeout_s": 0.05, "max_retries": 2,
                                                       "backoff_s": 0.01},
        workload=[{"name": "chat", "kind": "chat", "rate_rps": 1, "output_tokens": 500}],
        faults=[],
    )  # fmt: skip
    result = _sim(path).run()
    outcomes = Counter(r.outcome for r in result.records)
    assert outcomes[Outcome.TIMEOUT] == len(result.records) > 0
    assert all(r.attempts == 3 for r in result.records)
    assert result.counters["retries"] == 2 * len(result.records)


def test_region_outage_and_scale_out(tmp_path: Path) -> None:
    path = write_scenario(
        tmp_path, duration_s=40, drain_s=10, policies=["inferplane"],
        faults=[{"kind": "region_outage", "at_s": 2, "region": "west", "duration_s": 100},
                {"kind": "scale_out", "at_s": 0, "template": "h100-0", "count": 1}],
    )  # fmt: skip
    sim = _sim(path)
    result = sim.run()
    assert result.endpoints == ("h100-0", "h100-1", "h100-0+1")
    late = [r for r in result.records if r.arrival_s > 3 and r.endpoint is not None]
    assert late and all(r.endpoint != "h100-1" for r in late)
    assert any(r.endpoint == "h100-0+1" for r in late)  # the new replica warmed and served
    assert result.extra_spend_usd > 0


@pytest.mark.slow
def test_json_is_identical_across_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, policies=["inferplane", "cache-aware"], duration_s=8)
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"out{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        cmd = [sys.executable, "-m", "inferplane.cli", "simulate", str(path), "--out", str(out),
               "--quiet", "--no-html"]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, timeout=120)
        outputs.append((out / "result.json").read_bytes())
    assert outputs[0] == outputs[1]


def test_a_closed_call_is_not_kept_alive_by_its_pending_timeout(tmp_path: Path) -> None:
    """Timeouts (300 s by default) outlive most calls: the event must not hold the call (and
    its prompt), or a 1,000-GPU hour keeps every call of the last 300 s in memory."""
    sim = _sim(write_scenario(tmp_path, faults=[]))
    result = sim.run()
    assert all(r.outcome is Outcome.SUCCESS for r in result.records)
    pending = [p for _, kind, _, p in sim.q._heap if kind == EventKind.TIMEOUT]
    assert len(pending) == len(result.records)  # every call's timeout is still to come
    assert not any(isinstance(x, Call) for payload in pending for x in payload)
    assert not sim._open and not sim._by_engine_id
