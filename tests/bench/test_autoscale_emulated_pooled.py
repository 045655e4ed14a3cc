"""The emulated autoscaling bench's pooled verdicts: runs pool by calls and successful tasks,
not by averaging each run's ratios, and a run counts only where it holds both arms."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from autoscale_emulated_pooled import compare, load_runs, pooled


def _result(
    arm: str, calls: int, attainment: float, spend: float, ok: int, hours: float,
    completed: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    done = ok if completed is None else completed
    return {"arm": arm, "calls": calls, "slo_attainment": attainment, "spend_usd": spend,
            "tasks_in_slo": ok, "tasks_ok": done, "tasks_failed": 0, "gpu_hours": hours,
            "max_replicas": 2, "cost_per_successful_task_usd": spend / ok,
            "cost_per_completed_task_usd": spend / done, "args": {"seed": 1}}  # fmt: skip


def test_runs_pool_by_calls_and_successful_tasks() -> None:
    a = _result("queue-hpa", 100, 1.0, 0.10, 100, 0.1)
    b = _result("queue-hpa", 300, 0.9, 0.60, 200, 0.3, completed=250)
    p = pooled([a, b])
    assert p["slo_attainment"] == (100 + 270) / 400  # not the mean of 1.0 and 0.9
    assert p["cost_per_successful_task_usd"] == 0.70 / 300  # not the mean of the two costs
    assert p["cost_per_completed_task_usd"] == 0.70 / 350  # completed: in SLO or not
    assert p["gpu_hours"] == 0.1 + 0.3 and p["runs"] == 2
    assert p["cost_range"] == [0.001, 0.003]


def test_a_run_that_counted_completed_tasks_as_successful_is_not_pooled() -> None:
    old = _result("queue-hpa", 100, 1.0, 0.10, 100, 0.1)
    del old["tasks_in_slo"]
    with pytest.raises(ValueError, match="tasks_in_slo"):
        pooled([_result("queue-hpa", 100, 1.0, 0.10, 100, 0.1), old])


def test_a_cheap_lucky_run_does_not_decide_the_pooled_verdict(tmp_path: Path) -> None:
    runs = {
        "r1": {"inferplane": _result("inferplane", 100, 1.0, 0.20, 100, 0.2),
               "queue-hpa": _result("queue-hpa", 100, 0.9, 0.30, 90, 0.3)},
        "r2": {"inferplane": _result("inferplane", 100, 1.0, 0.20, 100, 0.2),
               "queue-hpa": _result("queue-hpa", 100, 1.0, 0.15, 100, 0.15)},
        "r3": {"inferplane": _result("inferplane", 100, 1.0, 0.20, 100, 0.2)},
    }  # fmt: skip
    for tag, by in runs.items():
        for arm, result in by.items():
            (tmp_path / f"autoscale-emulated-{tag}-{arm}.json").write_text(json.dumps(result))
    loaded = load_runs(["r1", "r2", "r3", "missing"], tmp_path)
    assert list(loaded) == ["r1", "r2", "r3"]
    line, passed, n = compare(loaded, "queue-hpa")
    assert (passed, n) == (1, 2)  # r2 alone is a MISS (equal attainment); r3 has no queue arm
    # pooled: 100% vs 95% at $0.0020 vs $0.00237 per successful task
    assert line.startswith("PASS") and "95.00%" in line
    line, passed, n = compare(loaded, "peak")
    assert n == 0 and "no run" in line
