"""Engine model speed: CPU per engine step of one clock-free EngineModel, this tree vs another.

One Llama-3-8B on H100 serves a seeded stream (Poisson arrivals, a shared 1,500-token system
prompt plus 200-2,000 own tokens, 50-300 output tokens, ``ignore_eos``, as the simulator
sends) with ``emit_tokens=False``; the caller advances it every ``--advance-ms`` of virtual
time: 7 ms is today's simulator cadence at 64 engines (every call advances every engine),
100 ms a batched one (engines advanced at scrape or KV-publish ticks only). Prompts are built
before timing; the timed part is submit + advance. Each round runs this tree and the
baseline tree in fresh subprocesses, interleaved; the median CPU microseconds per step and
their ratio are printed and written to bench/results/engine-model-speed.json.
Run: ``python bench/engine_model_speed.py --baseline-src /tmp/base [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "engine-model-speed.json"


def one(advance_s: float, sim_s: float, rate_rps: float) -> dict[str, Any]:
    """One timed run in this interpreter (whatever ``inferplane`` it imports)."""
    from inferplane.engine.model import EngineModel
    from inferplane.engine.profiles import load_profile
    from inferplane.engine.types import EngineRequest

    rng = random.Random(1)
    system = tuple(rng.randrange(16, 32_000) for _ in range(1500))
    arrivals, t = [], 0.0
    while t < sim_s + 1:
        t += rng.expovariate(rate_rps)
        body = tuple(rng.randrange(16, 32_000) for _ in range(rng.randrange(200, 2000)))
        arrivals.append((t, system + body, rng.randrange(50, 300)))
    model = EngineModel(load_profile("llama-3-8b", "h100"), seed=1)
    now, i, finished = 0.0, 0, 0
    cpu0 = time.process_time()
    while now < sim_s:
        now += advance_s
        finished += sum(
            type(e).__name__ == "RequestFinished" for e in model.advance(now, emit_tokens=False)
        )
        while arrivals[i][0] <= now:
            model.submit(EngineRequest(f"r{i}", arrivals[i][1], arrivals[i][2], 0, True), now)
            i += 1
    cpu_s = time.process_time() - cpu0
    steps = model.stats().num_steps
    return {
        "cpu_s": cpu_s,
        "steps": steps,
        "us_per_step": 1e6 * cpu_s / steps,
        "finished": finished,
        "tokens": model.stats().generation_tokens_total,
    }


def _sub(src: Path, advance_s: float, sim_s: float, rate_rps: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, __file__, "--one", str(advance_s), str(sim_s), str(rate_rps)]
    out = subprocess.run(args, env=env, cwd=src, check=True, capture_output=True, text=True)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=False)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sim-seconds", type=float, default=120.0)
    parser.add_argument("--rate-rps", type=float, default=6.0)
    parser.add_argument("--one", nargs=3, type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(*args.one)))
        return 0
    if args.baseline_src is None:
        parser.error("--baseline-src is required")
    here, base = Path(__file__).resolve().parent.parent, args.baseline_src.resolve()
    table, raw = [], {}
    for advance_ms in (7.0, 100.0):
        runs: dict[str, list[dict[str, Any]]] = {"new": [], "old": []}
        for _ in range(args.rounds):
            for side, src in (("new", here), ("old", base)):
                runs[side].append(_sub(src, advance_ms / 1000, args.sim_seconds, args.rate_rps))
        same = all(r == runs["new"][0]["tokens"] for r in [x["tokens"] for x in runs["old"]])
        med = {s: sorted(r["us_per_step"] for r in runs[s])[args.rounds // 2] for s in runs}
        table.append((advance_ms, runs["new"][0]["steps"], med["new"], med["old"], same))
        raw[str(advance_ms)] = runs
    print(
        f"EngineModel, llama-3-8b@h100, {args.rate_rps:g} rps, {args.sim_seconds:g} virtual s, "
        f"median of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f}"
    )
    print("| advance every | steps | new us/step | old us/step | new/old | same tokens |")
    print("|---|---|---|---|---|---|")
    for ms, steps, new, old, same in table:
        print(f"| {ms:g} ms | {steps} | {new:.1f} | {old:.1f} | {new / old:.2f}x | {same} |")
    document = {
        "baseline": str(base),
        "rate_rps": args.rate_rps,
        "sim_seconds": args.sim_seconds,
        "load_average_1m": os.getloadavg()[0],
        "runs": raw,
        "table": [
            dict(
                zip(
                    ("advance_ms", "steps", "new_us_per_step", "old_us_per_step", "same_tokens"),
                    row,
                    strict=True,
                )
            )
            for row in table
        ],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
