"""Decode protection on the 70B fleet of bench/overload_live.py, in the simulator (issue 8).

Admission holds lower classes while the pool's predicted TPOT is over what critical
deadlines need (``core.headroom``). That hold took critical chat from 90% to 99% at 2x on
this fleet (one Llama-3-70B replica on 4 x H100, one on 4 x A100: a 2048-token prefill
chunk stalls every decode for 0.55 s), and it must keep doing so when it is loosened for
the 16-slot peers fleet. This runs the live bench's scenario (same mix, same seed) in the
calibrated simulator, inferplane admission only, and prints critical SLO attainment and
good tasks per GPU-hour per load; ``--fcfs`` adds the FCFS baseline for the ratio.

    nice -n 10 python bench/decode_hold_sim.py [--loads 2,5] [--duration-s 300] [--fcfs]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overload
import overload_live as live

from inferplane.core.admission_config import PerClass
from inferplane.sim.calibrated import CalibratedSimulation
from inferplane.sim.scenario import Scenario


def with_share(sc: Scenario, tpot_share: str, slot_share: str = "") -> Scenario:
    """``sc`` with ``tpot_share`` / ``slot_share`` ("standard,sheddable") in its admission
    config ("": as is)."""
    update: dict[str, PerClass] = {}
    for name, text in (("tpot_share", tpot_share), ("slot_share", slot_share)):
        if text:
            std, shed = (float(x) for x in text.split(","))
            top = math.inf if name == "tpot_share" else 0.0
            update[name] = PerClass(critical=top, standard=std, sheddable=shed)
    if not update:
        return sc
    head = sc.admission.headroom.model_copy(update=update)
    return sc.model_copy(update={"admission": sc.admission.model_copy(update={"headroom": head})})


def run(
    users_x: float,
    policy: str,
    duration_s: float,
    seed: int,
    tpot_share: str = "",
    slot_share: str = "",
) -> dict[str, Any]:
    """One (load, policy) run of the live fleet's scenario in the simulator."""
    sc = overload.scenario(users_x, duration_s, seed, live.MIX)
    sc = with_share(sc, tpot_share, slot_share)
    start = time.perf_counter()
    result = CalibratedSimulation(sc, live.fleet_config(), Path("."), policy).run()
    gpu_h = len(live.GPUS) * live.TP * (sc.duration_s + sc.drain_s) / 3600
    spend = result.accounting.fleet_spend_usd + result.extra_spend_usd
    out = overload.summarise_records(result.records, sc, gpu_h, spend)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--loads", default="2,5")
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fcfs", action="store_true", help="also run FCFS (the baseline)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tpot-share", default="", help="standard,sheddable (default: the config's)")
    p.add_argument("--slot-share", default="", help="standard,sheddable (default: the config's)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    policies = ["inferplane"] + (["fcfs"] if args.fcfs else [])
    jobs = [(float(x), pol) for x in args.loads.split(",") for pol in policies]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(
                run,
                live.BASE * x,
                pol,
                args.duration_s,
                args.seed,
                args.tpot_share,
                args.slot_share,
            )
            for x, pol in jobs
        ]
        results = [f.result() for f in futures]
    doc: dict[str, Any] = {"duration_s": args.duration_s, "seed": args.seed, "runs": {}}
    for (x, pol), s in zip(jobs, results, strict=True):
        crit = s["classes"]["chat-critical"]
        att = {k: round(c["slo_attainment"] or 0.0, 4) for k, c in s["classes"].items()}
        print(
            f"{x:g}x {pol:<10} critical {100 * (crit['slo_attainment'] or 0):.1f}% "
            f"({crit['ended']} ended) good tasks/GPU-h {s['good_tasks_per_gpu_hour']:.0f} "
            f"$/good task {s['cost_per_good_task_usd']} classes {att} ({s['wall_s']} s)",
            flush=True,
        )
        doc["runs"][f"{x:g}x {pol}"] = s
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
