"""Simulator speed: simulated seconds per wall second on a 64-engine fleet.

A 64 x Llama-3-8B fleet (H100 and A100, two regions) serves a chat + agentic workload (chat
near-Poisson, agent tasks of 10-20 calls with a shared system prompt, growing context and
tool pauses) for a fixed stretch of simulated time, once per mode:

* ``first-token``: what the simulator runs (``emit_tokens=False``: the engine reports only
  each request's first token, enough for TTFT);
* ``every-token``: the engine reports every token as an event (what a naive simulator of the
  same engine would process), as the baseline measured in the same run.

Printed and written to bench/results/simulator-speed.json: wall seconds, simulated seconds
per wall second, calls simulated per wall second, events and engine steps per wall second,
and peak RSS. Absolute numbers drift with machine load; the ratio between the modes is the
figure to compare. The policy core's router is timed on its own (its share of wall time),
and the core's ``least_loaded`` baseline runs as a cheap-router reference.
Run: ``python bench/simulator_speed.py [--sim-seconds 20]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from inferplane.config import parse_config
from inferplane.sim import runner
from inferplane.sim.scenario import parse_scenario

RESULTS = Path(__file__).parent / "results" / "simulator-speed.json"
NUM_ENGINES = 64


def fleet_config() -> Any:
    endpoints = []
    for i in range(NUM_ENGINES):
        gpu, price = ("h100", 2.99) if i % 2 == 0 else ("a100", 1.79)
        endpoints.append(
            {"name": f"{gpu}-{i}", "url": f"http://127.0.0.1:{9000 + i}", "gpu": gpu,
             "price_per_hour_usd": price, "region": "east" if i < 32 else "west",
             "models": ["llama-3-8b"]}
        )  # fmt: skip
    return parse_config({"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints})


def scenario(sim_seconds: float) -> Any:
    return parse_scenario(
        {
            "name": "speed-64", "fleet": "(in memory)", "duration_s": sim_seconds,
            "drain_s": 0, "seed": 1, "policies": ["inferplane"],
            "workload": [
                {"name": "chat", "kind": "chat", "rate_rps": 120,
                 "prompt_tokens": {"median": 1020, "p99": 4142, "max_tokens": 6000}},
                {"name": "agents", "kind": "agentic", "users": 3000,
                 "tasks_per_user_per_hour": 6, "calls_per_task": [10, 20],
                 "system_prompt_tokens": 1500, "first_input_tokens": {"median": 800, "p99": 3000},
                 "tool_result_tokens": {"median": 300, "p99": 1500},
                 "output_tokens": {"median": 150, "p99": 600}, "tool_pause_s": 2.0},
            ],
        }
    )  # fmt: skip


class _TimedPolicy:
    """Wraps a policy to measure the wall time its route() takes (bench-side clock)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.route_s = 0.0
        self.calls = 0

    def route(self, *args: Any) -> Any:
        self.calls += 1
        start = time.perf_counter()
        try:
            return self.inner.route(*args)
        finally:
            self.route_s += time.perf_counter() - start

    def on_done(self, *args: Any) -> None:
        self.inner.on_done(*args)


def run_once(sim_seconds: float, policy: str, emit_tokens: bool) -> dict[str, Any]:
    runner.EMIT_TOKENS = emit_tokens
    sim = runner.Simulation(scenario(sim_seconds), fleet_config(), Path("."), policy)
    timed = _TimedPolicy(sim.policy)
    sim.policy = timed
    start = time.perf_counter()
    result = sim.run()
    wall_s = time.perf_counter() - start
    calls = len(result.records)
    ok = sum(r.outcome is runner.Outcome.SUCCESS for r in result.records)
    return {
        "policy": policy,
        "mode": "every-token" if emit_tokens else "first-token",
        "route_share": timed.route_s / wall_s,
        "route_ms_per_call": 1000 * timed.route_s / max(1, timed.calls),
        "wall_s": wall_s,
        "sim_s": result.end_s,
        "sim_s_per_wall_s": result.end_s / wall_s,
        "calls": calls,
        "calls_succeeded": ok,
        "calls_per_wall_s": calls / wall_s,
        "events_per_wall_s": result.counters["events"] / wall_s,
        "engine_steps_per_wall_s": result.counters["engine_wakes"] / wall_s,
        "output_tokens": sum(r.completion_tokens for r in result.records),
    }


RUNS = (("inferplane", False), ("inferplane", True), ("least-loaded", False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-seconds", type=float, default=20.0)
    args = parser.parse_args()
    run_once(2.0, "least-loaded", False)  # warm-up: imports, caches, prompt patterns
    rows = [run_once(args.sim_seconds, policy, emit) for policy, emit in RUNS]
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{NUM_ENGINES} engines, chat + agentic, {args.sim_seconds:.0f} simulated s")
    head = ("policy", "engine events", "wall s", "sim s / wall s", "calls / wall s",
            "events / wall s", "route ms / call", "routing share", "calls ok")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(
            f"| {r['policy']} | {r['mode']} | {r['wall_s']:.1f} | {r['sim_s_per_wall_s']:.2f} | "
            f"{r['calls_per_wall_s']:.0f} | {r['events_per_wall_s']:.0f} | "
            f"{r['route_ms_per_call']:.2f} | {100 * r['route_share']:.0f}% | "
            f"{r['calls_succeeded']}/{r['calls']} |"
        )
    token_ratio = rows[1]["wall_s"] / rows[0]["wall_s"]
    print(f"every-token / first-token wall time: {token_ratio:.2f}x; peak RSS "
          f"{peak_rss_mib:.0f} MiB")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "engines": NUM_ENGINES, "sim_seconds": args.sim_seconds, "runs": rows,
        "every_token_over_first_token_wall": token_ratio, "peak_rss_mib": peak_rss_mib,
    }  # fmt: skip
    RESULTS.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
