"""Capacity planning: the search finds the smallest passing fleet; the command runs a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from inferplane.sim.cli import plan_command
from inferplane.sim.plan import FleetPoint, PlanError, cheapest, load_plan


def _point(gpu: str, n: int, needed: int) -> FleetPoint:
    return FleetPoint(gpu, n, 2.0 * n, 1.0, 0.1, 1.0, 100.0 * n, n >= needed)


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 17, 32])
def test_search_finds_the_smallest_passing_count_in_few_runs(needed: int) -> None:
    calls: list[int] = []

    def run(gpu: str, n: int) -> FleetPoint:
        calls.append(n)
        return _point(gpu, n, needed)

    best, sweep = cheapest("h100", 32, run)
    assert best is not None and best.replicas == needed
    assert len(calls) == len(set(calls)) <= 2 * (32).bit_length()
    assert [p.replicas for p in sweep] == sorted(calls)


def test_search_gives_up_at_the_replica_cap() -> None:
    best, sweep = cheapest("a100", 8, lambda g, n: _point(g, n, 100))
    assert best is None and [p.replicas for p in sweep] == [1, 2, 4, 8]


def _plan(folder: Path, **over: object) -> Path:
    plan = {
        "name": "t", "gpus": ["h100", "a100"], "max_replicas": 8,
        "slo": {"ttft_p90_s": 0.5, "min_success": 0.99}, "duration_s": 20, "drain_s": 30,
        "workload": [{"name": "chat", "kind": "chat", "rate_rps": 8,
                      "prompt_tokens": 1500, "output_tokens": 50}],
    }  # fmt: skip
    plan.update(over)
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


@pytest.mark.slow
def test_plan_command_reports_the_cheapest_fleet_per_gpu(tmp_path: Path) -> None:
    import argparse

    out = tmp_path / "plan.json"
    assert plan_command(argparse.Namespace(plan=_plan(tmp_path), out=out)) == 0
    doc = json.loads(out.read_text())
    for gpu in ("h100", "a100"):
        best = doc["cheapest"][gpu]
        assert best is not None and best["meets_slo"] and best["ttft_p90_s"] <= 0.5
        smaller = [p for p in doc["sweep"][gpu] if p["replicas"] < best["replicas"]]
        assert all(not p["meets_slo"] for p in smaller)
    # The slower GPU needs at least as many replicas for the same demand.
    assert doc["cheapest"]["a100"]["replicas"] >= doc["cheapest"]["h100"]["replicas"]


def test_bad_plan_is_a_clear_error(tmp_path: Path) -> None:
    import argparse

    with pytest.raises(PlanError, match="gpus"):
        load_plan(_plan(tmp_path, gpus=[]))
    bad = _plan(tmp_path, gpus=["tpu-v9"])
    assert plan_command(argparse.Namespace(plan=bad, out=None)) == 2
