"""Small fleets and scenarios for the simulator tests, written to a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FLEET = {
    "gateway": {"auth": {"mode": "anonymous"}},
    "endpoints": [
        {"name": "h100-0", "url": "http://127.0.0.1:9001", "gpu": "h100",
         "price_per_hour_usd": 3.0, "region": "east", "models": ["llama-3-8b"]},
        {"name": "h100-1", "url": "http://127.0.0.1:9002", "gpu": "h100",
         "price_per_hour_usd": 3.0, "region": "west", "models": ["llama-3-8b"]},
    ],
}  # fmt: skip


def write_scenario(folder: Path, **over: Any) -> Path:
    """A two-endpoint fleet and a short chat + agentic scenario (override any key)."""
    (folder / "fleet.yaml").write_text(yaml.safe_dump(FLEET), encoding="utf-8")
    scenario: dict[str, Any] = {
        "name": "t",
        "fleet": "fleet.yaml",
        "duration_s": 20,
        "drain_s": 20,
        "seed": 5,
        "policies": ["inferplane", "round-robin"],
        "workload": [
            {"name": "chat", "kind": "chat", "rate_rps": 3, "slo": {"ttft_s": 0.5}},
            {"name": "agents", "kind": "agentic", "users": 300, "tasks_per_user_per_hour": 6,
             "calls_per_task": [2, 4], "system_prompt_tokens": 300, "first_input_tokens": 200,
             "tool_result_tokens": 100, "output_tokens": 40, "tool_pause_s": 0.5},
        ],
        "faults": [{"kind": "crash", "at_s": 8, "endpoints": ["h100-1"], "restart_after_s": 1}],
    }  # fmt: skip
    scenario.update(over)
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    return path
