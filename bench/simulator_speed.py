"""Simulator speed: simulated calls per wall second on a 64- and a 1,000-engine fleet.

A fleet of Llama-3-8B replicas (H100 and A100 alternating, two regions) serves a chat +
agentic workload (chat near-Poisson, agent tasks of 10-20 calls with a shared system prompt,
growing context and tool pauses) scaled with the fleet: per 64 engines, 120 chat calls/s and
3,000 agent users (about 75 calls/s), so ~3 calls/s per engine at every size. The simulator
runs as ``inferplane simulate`` runs it (``CalibratedSimulation``, the core's router and
admission, KV events into the prefix index), once per mode, each run in a fresh process
(so each has its own peak RSS):

* ``fast``: the scenario's default ``speed`` knobs (a sync per scrape interval, routing over
  prefix holders + 16 sampled endpoints, admission's pool capacity kept incrementally);
* ``exact``: ``speed: {sync_s: 0, route_candidates: 0}``: every call catches every engine
  up, rebuilds every view and scores the whole pool (what the simulator did before the
  knobs), as the baseline measured in the same run.

``--baseline-src DIR`` adds a row per fleet size for another checkout's ``inferplane`` (e.g.
``git archive`` of an older commit), run with this file in a fresh process, in
``--baseline-mode`` (``exact`` by default; ``fast`` compares two trees' fast modes over the
fast runs' stretch); its scenario has no ``speed`` section when that tree does not know one.

``--compiled DIR`` adds a row per fleet size run on a copy of this tree at DIR with the
simulator's hot path compiled by mypyc (``SIM_MODULES``: the policy core, the engine model,
the simulator's non-mixin modules; built there first with ``--build-compiled``, from a
commit's ``git archive`` as ``bench/gateway_compile.py`` builds the gateway's). Compiled
modules shadow their sources; the records must not change (each row carries the sha256 of
its records, samples and counters: compare them).

``--paired N`` measures the way load on a shared machine least distorts: the plain fast run
and the other side (``--compiled``, else ``--baseline-src`` in ``--baseline-mode``) at the
same time, one per core (``taskset`` when present), N rounds with the cores swapped each
round; the ratio per round of CPU ms per call is the figure.

Printed, and written to bench/results/simulator-speed.json: calls, wall and CPU seconds,
calls and events per wall second, CPU ms per call (over the run, and over its second half:
"2nd half", when the engines' caches are fuller), engine wakes, syncs, peak RSS, and the
wall minutes one simulated hour would take at the row's pace (``60 * wall_s / sim_s``: a
floor, as a fleet that has warmed up costs more per call than the run's first seconds).
Each row's JSON also holds its course: every tenth of the run (in simulated time), the CPU
seconds spent, calls ended and resident memory, so a long run shows whether
memory levels off once the caches are full (``--sim-seconds 300 --exact-seconds 0``).
Absolute numbers drift with machine load (2 shared cores); CPU ms per call drifts least;
compare rows of one run. Run:
``python bench/simulator_speed.py [--engines 64,1000] [--sim-seconds 20] [--exact-seconds 5]``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "simulator-speed.json"
EXACT = {"sync_s": 0, "route_candidates": 0}
#: What ``--build-compiled`` compiles (mypyc builds each; the simulator's mixin classes
#: ``runner``, ``sync``, ``upkeep``, ``calibrated``, ``autoscale`` and the pydantic config
#: modules stay interpreted).
SIM_MODULES = (
    *(f"core/{m}" for m in (
        "predictor", "filters", "capacity", "headroom", "admission", "admission_stats",
        "admission_deadline", "admission_decisions", "quotas", "breaker", "breaker_types",
        "latency_outliers", "throttle", "accounting", "accounting_types", "spend_meter",
        "candidates", "scoring_context", "scorers", "affinity", "retry", "queueing",
        "queue_items", "cache", "prompt_reuse", "kv_claims", "slowstart", "resumption",
        "workflows", "workflow_sync", "types", "prefix_blocks", "prefix_entries",
        "prefix_index", "kv_events", "routing",
    )),
    *(f"engine/{m}" for m in (
        "model", "scheduler", "kvcache", "perf", "decode_leap", "generation", "sequence",
        "types",
    )),
    *(f"sim/{m}" for m in (
        "capacity", "views", "fleet", "kvfeed", "events", "ledger", "prompts", "workload",
        "records", "gate", "calibration", "baselines", "peer_routers", "sources",
    )),
)  # fmt: skip


def fleet_config(num_engines: int) -> Any:
    from inferplane.config import parse_config

    endpoints = []
    for i in range(num_engines):
        gpu, price = ("h100", 2.99) if i % 2 == 0 else ("a100", 1.79)
        endpoints.append(
            {"name": f"{gpu}-{i}", "url": f"http://127.0.0.1:{9000 + i}", "gpu": gpu,
             "price_per_hour_usd": price, "region": "east" if i < num_engines // 2 else "west",
             "models": ["llama-3-8b"]}
        )  # fmt: skip
    return parse_config({"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints})


def scenario(sim_seconds: float, num_engines: int, speed: dict[str, Any] | None) -> Any:
    from inferplane.sim.scenario import Scenario, parse_scenario

    scale = num_engines / 64
    data: dict[str, Any] = {
        "name": f"speed-{num_engines}", "fleet": "(in memory)", "duration_s": sim_seconds,
        "drain_s": 0, "seed": 1, "policies": ["inferplane"],
        "sample_interval_s": 10.0,
        "workload": [
            {"name": "chat", "kind": "chat", "rate_rps": 120 * scale,
             "prompt_tokens": {"median": 1020, "p99": 4142, "max_tokens": 6000}},
            {"name": "agents", "kind": "agentic", "users": round(3000 * scale),
             "tasks_per_user_per_hour": 6, "calls_per_task": [10, 20],
             "system_prompt_tokens": 1500, "first_input_tokens": {"median": 800, "p99": 3000},
             "tool_result_tokens": {"median": 300, "p99": 1500},
             "output_tokens": {"median": 150, "p99": 600}, "tool_pause_s": 2.0},
        ],
    }  # fmt: skip
    if speed is not None and "speed" in Scenario.model_fields:
        data["speed"] = speed
    return parse_scenario(data)


def rss_mib() -> float:
    """This process's resident memory now (Linux ``/proc/self/statm``; 0 where absent)."""
    try:
        pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Course:
    """The run's course, read from the simulator's progress calls: at its start, every
    ``every_s`` simulated seconds and at its end, the CPU seconds spent, the calls ended and
    the resident memory."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.next_s = every_s, every_s
        self.cpu_start = 0.0
        self.ended: Callable[[], int] = lambda: 0  # calls ended so far
        self.points: list[dict[str, float]] = []

    def start(self, ended: Callable[[], int]) -> None:
        """The run starts now; ``ended`` counts its calls ended so far."""
        self.ended, self.cpu_start = ended, time.process_time()
        self.point(0.0)

    def __call__(self, now_s: float) -> None:
        if now_s < self.next_s:
            return
        while self.next_s <= now_s:
            self.next_s += self.every_s
        self.point(now_s)

    def point(self, now_s: float) -> None:
        self.points.append({
            "sim_s": round(now_s, 3), "cpu_s": round(time.process_time() - self.cpu_start, 3),
            "calls_ended": self.ended(), "rss_mib": round(rss_mib(), 1),
        })  # fmt: skip

    def late_cpu_ms_per_call(self) -> float | None:
        """CPU per call over the run's second half (the fleet's caches fuller than early)."""
        end = self.points[-1]
        half = next(p for p in self.points if p["sim_s"] >= end["sim_s"] / 2)
        return None if half is end else ms_per_call(half, end)


def ms_per_call(a: dict[str, float], b: dict[str, float]) -> float:
    """CPU ms per call ended between two points of a course."""
    return 1000 * (b["cpu_s"] - a["cpu_s"]) / max(1.0, b["calls_ended"] - a["calls_ended"])


def run_once(sim_seconds: float, num_engines: int, speed: dict[str, Any] | None) -> dict[str, Any]:
    """One simulated run in this process; its figures, with its course every tenth."""
    from inferplane.sim.calibrated import CalibratedSimulation
    from inferplane.sim.records import Outcome

    course = Course(sim_seconds / 10)
    sim = CalibratedSimulation(
        scenario(sim_seconds, num_engines, speed), fleet_config(num_engines), ROOT, "inferplane",
        progress=course,
    )  # fmt: skip
    start, cpu_start = time.perf_counter(), time.process_time()
    course.start(lambda: len(sim.ledger.records))
    result = sim.run()
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    course.point(result.end_s)
    calls = len(result.records)
    digest = hashlib.sha256(repr((result.records, result.samples, result.counters)).encode())
    ttfts = sorted(r.ttft_s for r in result.records if r.ttft_s is not None)
    return {
        "engines": num_engines,
        "sim_s": result.end_s,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "calls": calls,
        "calls_succeeded": sum(r.outcome is Outcome.SUCCESS for r in result.records),
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "cpu_ms_per_call": 1000 * cpu_s / max(1, calls),
        "calls_per_wall_s": calls / wall_s,
        "events_per_wall_s": result.counters["events"] / wall_s,
        "engine_wakes": result.counters["engine_wakes"],
        "syncs": result.counters.get("syncs"),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_min_per_sim_hour": 60 * wall_s / max(1e-9, result.end_s),
        "late_cpu_ms_per_call": course.late_cpu_ms_per_call(),
        "rss_end_mib": rss_mib(),
        "course": course.points,
        "records_sha256_16": digest.hexdigest()[:16],
    }


def _command(src: Path, sim_seconds: float, engines: int, mode: str, cpu: int | None) -> Any:
    cmd = [sys.executable, __file__, "--one", str(sim_seconds), "--engines", str(engines),
           "--mode", mode]  # fmt: skip
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    return subprocess.Popen(cmd, env=env, cwd=src, stdout=subprocess.PIPE, text=True)


def _row(proc: Any, label: str) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{label}: exit {proc.returncode}")
    row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    row["mode"] = label
    return row


def _label(src: Path, mode: str) -> str:
    return mode if src == ROOT else f"baseline {mode} ({src.name})"


def subprocess_row(src: Path, sim_seconds: float, engines: int, mode: str) -> dict[str, Any]:
    """``run_once`` with ``src``'s inferplane in a fresh interpreter."""
    return _row(_command(src, sim_seconds, engines, mode, None), _label(src, mode))


def paired_rows(
    other: Path, label: str, mode: str, sim_seconds: float, engines: int, rounds: int
) -> list[dict[str, Any]]:
    """This tree's fast run and ``other``'s at once, one per core, cores swapped per round."""
    rows = []
    for r in range(rounds):
        cpus = (0, 1) if r % 2 == 0 else (1, 0)
        mine = _command(ROOT, sim_seconds, engines, "fast", cpus[0])
        theirs = _command(other, sim_seconds, engines, mode, cpus[1])
        pair = [_row(mine, "fast"), _row(theirs, label)]
        for row in pair:
            row["round"] = r + 1
        ratio = pair[1]["cpu_ms_per_call"] / pair[0]["cpu_ms_per_call"]
        print(f"round {r + 1}: {label} / fast CPU ms per call {ratio:.3f}", flush=True)
        rows += pair
    return rows


def build_compiled(out: Path, commit: str) -> None:
    """A copy of ``commit`` at ``out`` with ``SIM_MODULES`` compiled by mypyc."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gateway_compile import compile_modules, export  # bench/gateway_compile.py

    export(commit, out)
    took_s = compile_modules(out, list(SIM_MODULES))
    print(f"compiled {len(SIM_MODULES)} modules in {took_s:.0f} s into {out}", flush=True)


def _table(rows: list[dict[str, Any]]) -> None:
    head = ("engines", "mode", "sim s", "calls", "wall s", "calls / wall s", "events / wall s",
            "CPU ms / call", "2nd half", "syncs", "peak RSS MiB", "ok", "TTFT p50 s",
            "wall min / sim h", "records sha256")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        ttft = "-" if r["ttft_p50_s"] is None else f"{r['ttft_p50_s']:.3f}"
        per_hour = r.get("wall_min_per_sim_hour")
        hour = "-" if per_hour is None else f"{per_hour:.0f}"
        late = r.get("late_cpu_ms_per_call")
        late_ms = "-" if late is None else f"{late:.3f}"
        print(
            f"| {r['engines']} | {r['mode']} | {r['sim_s']:.0f} | {r['calls']} | "
            f"{r['wall_s']:.1f} | {r['calls_per_wall_s']:.0f} | {r['events_per_wall_s']:.0f} | "
            f"{r['cpu_ms_per_call']:.3f} | {late_ms} | {r['syncs']} | {r['peak_rss_mib']:.0f} | "
            f"{r['calls_succeeded']}/{r['calls']} | {ttft} | {hour} | "
            f"{r.get('records_sha256_16', '-')} |"
        )


def plot_courses(rows: list[dict[str, Any]], out: Path) -> None:
    """Resident memory and CPU per call (per course interval) against simulated time, one
    line per row with a course: whether memory levels off and calls get dearer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, cpu) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        points = r.get("course") or []
        if len(points) < 2:
            continue
        label = f"{r['engines']} engines, {r['mode']}"
        mem.plot([p["sim_s"] for p in points], [p["rss_mib"] / 1024 for p in points], label=label)
        pairs = list(itertools.pairwise(points))
        cpu.plot([b["sim_s"] for _, b in pairs], [ms_per_call(a, b) for a, b in pairs], label=label)
    mem.set(xlabel="simulated s", ylabel="resident memory, GiB", title="memory")
    cpu.set(xlabel="simulated s", ylabel="CPU ms per call ended", title="cost per call")
    for ax in (mem, cpu):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="64,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--sim-seconds", type=float, default=20.0, help="of each fast run")
    parser.add_argument("--exact-seconds", type=float, default=5.0, help="exact and baseline")
    parser.add_argument("--baseline-src", type=Path, help="another checkout to compare with")
    parser.add_argument("--baseline-mode", choices=("fast", "exact"), default="exact")
    parser.add_argument("--compiled", type=Path, help="a mypyc-compiled copy to compare with")
    parser.add_argument("--build-compiled", metavar="COMMIT", help="build --compiled first")
    parser.add_argument("--paired", type=int, default=0, help="rounds of paired runs")
    parser.add_argument("--no-exact", action="store_true", help="skip the exact rows")
    parser.add_argument("--mode", choices=("fast", "exact"), default="fast")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--plot", action="store_true", help="the courses as a PNG beside --out")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a subprocess run
    args = parser.parse_args()
    sizes = [int(n) for n in args.engines.split(",")]
    if args.one is not None:
        speed = EXACT if args.mode == "exact" else None
        print(json.dumps(run_once(args.one, sizes[0], speed)))
        return 0
    if args.build_compiled:
        if args.compiled is None:
            raise SystemExit("--build-compiled needs --compiled DIR")
        build_compiled(args.compiled.resolve(), args.build_compiled)
    rows = []
    for n in sizes:
        if args.paired > 0:
            rows += _paired(args, n)
            continue
        rows.append(subprocess_row(ROOT, args.sim_seconds, n, "fast"))
        if args.exact_seconds > 0:
            if not args.no_exact:
                rows.append(subprocess_row(ROOT, args.exact_seconds, n, "exact"))
            if args.sim_seconds != args.exact_seconds:  # the same stretch, for the ratio
                rows.append(subprocess_row(ROOT, args.exact_seconds, n, "fast"))
        if args.baseline_src is not None:
            mode = args.baseline_mode
            span = args.exact_seconds if mode == "exact" else args.sim_seconds
            rows.append(subprocess_row(args.baseline_src.resolve(), span, n, mode))
        if args.compiled is not None:
            row = _row(_command(args.compiled.resolve(), args.sim_seconds, n, "fast", None), "")
            row["mode"] = "compiled fast"
            rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    _table(rows)
    load = os.getloadavg()[0]
    print(f"load average (1 min) at the end: {load:.1f}")
    document = {"rows": rows, "load_average_1m": load, "argv": sys.argv[1:]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if args.plot:
        plot_courses(rows, args.out.with_suffix(".png"))
    return 0


def _paired(args: argparse.Namespace, engines: int) -> list[dict[str, Any]]:
    if args.compiled is not None:
        other, label, mode = args.compiled.resolve(), "compiled fast", "fast"
    elif args.baseline_src is not None:
        other, mode = args.baseline_src.resolve(), args.baseline_mode
        label = _label(other, mode)
    else:
        raise SystemExit("--paired needs --compiled or --baseline-src")
    return paired_rows(other, label, mode, args.sim_seconds, engines, args.paired)


if __name__ == "__main__":
    sys.exit(main())
