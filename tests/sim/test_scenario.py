"""Scenario validation: shorthands, defaults and errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferplane.sim.scenario import LengthDist, ScenarioError, load_scenario, parse_scenario


def _base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "fleet": "fleet.yaml",
        "duration_s": 10,
        "workload": [{"name": "chat", "kind": "chat", "rate_rps": 1}],
    }
    data.update(over)
    return data


def test_valid_scenario_and_defaults() -> None:
    sc = parse_scenario(_base())
    assert sc.policies == ("inferplane",)
    assert sc.workload[0].kind == "chat"
    assert sc.sample_every_s() == pytest.approx(0.1)


def test_length_shorthands() -> None:
    assert LengthDist.model_validate(512).modes[0].sigma == 0
    d = LengthDist.model_validate({"median": 13, "p99": 251})
    assert d.modes[0].median == 13
    assert 1.2 < d.modes[0].sigma < 1.35  # ln(251/13) / 2.326


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({"duration_s": -1}, "duration_s"),
        ({"policies": ["least-loaded", "nope"]}, "nope"),
        ({"workload": [{"name": "x", "kind": "chat"}]}, "workload.0.chat.rate_rps"),
        ({"workload": [{"name": "x", "kind": "warp"}]}, "workload.0"),
        ({"faults": [{"kind": "crash", "at_s": 1}]}, "faults.0.crash.endpoints"),
        ({"typo_key": 1}, "typo_key"),
        (
            {"workload": [{"name": "a", "kind": "agentic", "calls_per_task": [5, 2]}]},
            "calls_per_task",
        ),
    ],
)
def test_errors_name_the_field(over: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(_base(**over), "s.yaml")
    assert fragment in str(info.value)
    assert "s.yaml" in str(info.value)


def test_load_scenario_reports_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2", encoding="utf-8")
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(bad)
