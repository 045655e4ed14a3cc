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

``--baseline-src DIR`` instead measures this tree against another checkout's ``inferplane``
(e.g. ``git archive`` of an older commit): ``--rounds`` interleaved pairs of first-token
runs, each in a fresh subprocess, and reports the per-call CPU and wall ratios (written to
bench/results/simulator-speed-ab-POLICY.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from inferplane.config import parse_config
from inferplane.sim import runner
from inferplane.sim.scenario import parse_scenario

RESULTS = Path(__file__).parent / "results" / "simulator-speed.json"
AB_RESULTS = Path(__file__).parent / "results" / "simulator-speed-ab.json"
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


#: ``--kv-batch-ms``: a what-if for the runner's owner, not the simulator's semantics. The
#: runner brings every engine up to date on every call (its KV feed is always current); with
#: this set, only at scrape time or when this much virtual time has passed since the last
#: catch-up (KV events reach the router up to that late), so engines leap over many steps.
KV_BATCH_S = 0.0


class _BatchedKVSimulation(runner.Simulation):
    _kv_caught_up_s = -float("inf")

    def _views(self, now: float) -> Any:
        if self.fleet.scrape_due(now) or now - self._kv_caught_up_s >= KV_BATCH_S:
            self._kv_caught_up_s = now
            for ep in self.fleet.endpoints:
                self._advance(ep, now)
        return self.fleet.views(now)


def run_once(sim_seconds: float, policy: str, emit_tokens: bool) -> dict[str, Any]:
    runner.EMIT_TOKENS = emit_tokens
    cls = _BatchedKVSimulation if KV_BATCH_S > 0 else runner.Simulation
    sim = cls(scenario(sim_seconds), fleet_config(), Path("."), policy)
    timed = _TimedPolicy(sim.policy)
    sim.policy = timed
    start, cpu_start = time.perf_counter(), time.process_time()
    result = sim.run()
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    calls = len(result.records)
    ok = sum(r.outcome is runner.Outcome.SUCCESS for r in result.records)
    return {
        "policy": policy,
        "mode": "every-token" if emit_tokens else "first-token",
        "route_share": timed.route_s / wall_s,
        "route_ms_per_call": 1000 * timed.route_s / max(1, timed.calls),
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "cpu_ms_per_call": 1000 * cpu_s / max(1, len(result.records)),
        "digest": hash(tuple((r.outcome.value, r.completion_tokens) for r in result.records)),
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


def _one_subprocess(src: Path, sim_seconds: float, policy: str) -> dict[str, Any]:
    """A first-token run of ``policy`` with ``src``'s inferplane, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    env["SIM_SPEED_KV_BATCH_S"] = str(KV_BATCH_S)
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(sim_seconds), "--policy", policy],
        env=env, cwd=src, check=True, capture_output=True, text=True,
    )  # fmt: skip
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def ab(baseline: Path, sim_seconds: float, rounds: int, policy: str) -> int:
    """Interleaved rounds: this tree, then the baseline tree; ratios of per-call cost."""
    here = Path(__file__).resolve().parent.parent
    pairs = []
    for i in range(rounds):
        new = _one_subprocess(here, sim_seconds, policy)
        old = _one_subprocess(baseline, sim_seconds, policy)
        pairs.append({"new": new, "old": old})
        print(f"round {i + 1}: cpu ms/call new {new['cpu_ms_per_call']:.2f} old "
              f"{old['cpu_ms_per_call']:.2f}; same records: {new['digest'] == old['digest']}",
              flush=True)  # fmt: skip
    head = ("tree", "calls", "cpu ms / call (median)", "wall s (median)", "calls / cpu s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    med: dict[str, dict[str, float]] = {}
    for side in ("new", "old"):
        rows = [p[side] for p in pairs]
        cpu = sorted(r["cpu_ms_per_call"] for r in rows)[len(rows) // 2]
        wall = sorted(r["wall_s"] for r in rows)[len(rows) // 2]
        med[side] = {"cpu_ms_per_call": cpu, "wall_s": wall}
        print(f"| {side} | {rows[0]['calls']} | {cpu:.2f} | {wall:.1f} | {1000 / cpu:.0f} |")
    ratio = med["new"]["cpu_ms_per_call"] / med["old"]["cpu_ms_per_call"]
    print(f"new / old CPU per call: {ratio:.2f}x; load average {os.getloadavg()[0]:.1f}")
    document = {"engines": NUM_ENGINES, "sim_seconds": sim_seconds, "baseline": str(baseline),
                "policy": policy, "kv_batch_s": KV_BATCH_S,
                "rounds": pairs, "median": med, "new_over_old_cpu_per_call": ratio,
                "load_average_1m": os.getloadavg()[0]}  # fmt: skip
    batch = f"-kv{1000 * KV_BATCH_S:g}ms" if KV_BATCH_S > 0 else ""
    out = AB_RESULTS.with_name(f"{AB_RESULTS.stem}-{policy}{batch}.json")
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-seconds", type=float, default=20.0)
    parser.add_argument("--baseline-src", type=Path, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policy", default="inferplane", help="the policy --baseline-src runs")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a subprocess of --ab
    parser.add_argument("--kv-batch-ms", type=float, default=0.0, help="see KV_BATCH_S")
    args = parser.parse_args()
    global KV_BATCH_S
    KV_BATCH_S = float(os.environ.get("SIM_SPEED_KV_BATCH_S", args.kv_batch_ms / 1000))
    if args.one is not None:
        run_once(1.0, "least-loaded", False)  # warm-up
        print(json.dumps(run_once(args.one, args.policy, False)))
        return 0
    if args.baseline_src is not None:
        return ab(args.baseline_src.resolve(), args.sim_seconds, args.rounds, args.policy)
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
