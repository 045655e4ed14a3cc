"""The live overload bench's fleet and workload in the simulator, for comparison (issue 5).

``bench/overload_live.py`` drives the real gateway and emulated engines; this runs the same
scenario (its ``BASE`` x load, its mix, seed and window) through ``CalibratedSimulation`` on
the same two-replica 70B fleet (1 x 4xH100, 1 x 4xA100), all three policies, and summarises
and judges it with the same functions, GPU-hours and spend (fleet price x run time), so a
live table and its simulator twin can be read side by side. Deterministic (virtual time):
no bench lock needed; run it under ``nice``.

    nice -n 10 python bench/overload_live_sim.py --duration-s 180 --loads 1,2,5 \
        --out bench/results/overload-live-sim-h4.json
    nice -n 10 python bench/overload_live_sim.py --scan 2,3,4,5 --duration-s 120  # FCFS knee
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overload
import overload_live as live

from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.records import Outcome
from inferplane.sim.summary import meets_slo

RESULTS = Path(__file__).parent / "results" / "overload-live-sim.json"


def run(load_x: float, policy: str, duration_s: float, seed: int) -> dict[str, Any]:
    """One policy at one load in the simulator, summarised as the live bench does."""
    sc = overload.scenario(live.BASE * load_x, duration_s, seed, live.MIX)
    started = time.perf_counter()
    cfg = live.fleet_config(mode=live.MODES[policy])
    result = CalibratedSimulation(sc, cfg, Path("."), policy).run()
    window_s = sc.duration_s + sc.drain_s
    gpu_h = len(live.GPUS) * live.TP * window_s / 3600
    spend = sum(price for _, price in live.GPUS) * window_s / 3600
    out = overload.summarise_records(result.records, sc, gpu_h, spend)
    out["rejections"] = dict(result.rejections)
    out["wall_s"] = time.perf_counter() - started
    crit = sc.workload[0].slo
    ended = [
        r for r in result.records
        if r.source == "chat-critical" and r.outcome is not Outcome.UNFINISHED
    ]  # fmt: skip
    out["critical_missed"] = sum(not meets_slo(r, crit) for r in ended)
    return out


def scan(args: argparse.Namespace) -> int:
    """FCFS in the simulator at several users_x on this fleet and mix: where it bends."""
    from inferplane.sim.runner import Simulation

    for ux in (float(x) for x in args.scan.split(",")):
        sc = overload.scenario(ux, args.duration_s, args.seed, live.MIX)
        result = Simulation(sc, live.fleet_config(), Path("."), "fcfs").run()
        gpu_h = len(live.GPUS) * live.TP * (sc.duration_s + sc.drain_s) / 3600
        s = overload.summarise_records(result.records, sc, gpu_h, 0.0)
        att = {k: round(c["slo_attainment"] or 0.0, 4) for k, c in s["classes"].items()}
        calls = sum(c["calls"] for c in s["classes"].values())
        print(f"users_x {ux:g}: {calls / sc.duration_s:.1f} calls/s {att} "
              f"good tasks/GPU-h {s['good_tasks_per_gpu_hour']:.0f}", flush=True)  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--loads", default="1,2,5")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scan", default="", help="users_x list: simulator FCFS knee scan")
    args = parser.parse_args()
    if args.scan:
        return scan(args)
    loads = [float(x) for x in args.loads.split(",")]
    jobs = [(x, p) for x in loads for p in overload.POLICIES]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run, x, p, args.duration_s, args.seed) for x, p in jobs]
        results = iter([f.result() for f in futures])
    doc: dict[str, Any] = {
        "duration_s": args.duration_s, "seed": args.seed, "base_users_x": live.BASE,
        "model": live.MODEL, "replicas": [f"{g} x{live.TP}" for g, _ in live.GPUS],
        "simulator": "CalibratedSimulation", "runs": {}, "verdicts": {},
    }  # fmt: skip
    for load_x in loads:
        key = f"{load_x:g}x"
        runs = {p: next(results) for p in overload.POLICIES}
        doc["runs"][key] = runs
        doc["verdicts"][key] = {
            p: overload.verdict(runs[p], runs["fcfs"], load_x) for p in overload.POLICIES
        }
    overload.print_tables(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
