"""The example scenarios stay valid: they load, their fleets model, their sources build."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplane.config import load_config
from inferplane.sim.fleet import Fleet
from inferplane.sim.scenario import load_scenario
from inferplane.sim.sources import build_sources

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
SCENARIOS = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("fleet"))


def test_there_are_examples() -> None:
    assert len(SCENARIOS) >= 2


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_example_scenario_is_runnable(path: Path) -> None:
    scenario = load_scenario(path)
    config = load_config(path.parent / scenario.fleet)
    fleet = Fleet(config, scenario.seed, 0.1)
    sources = build_sources(scenario, path.parent, config, fleet, scenario.seed)
    assert len(sources) == len(scenario.workload)
    for source, info in sources:
        first = source.next_arrival()
        assert first is not None, info.name
        limit = max(fleet.context_limit_tokens(t) for t in info.targets)
        assert 0 < len(first[1].prompt_token_ids) + first[1].max_tokens <= limit
