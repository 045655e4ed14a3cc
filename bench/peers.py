"""The peer scoreboard: inferplane against sglang-router, vllm-router and LiteLLM, one run.

    python bench/peers.py [--quick] [--gateways inferplane,sglang-router,...]
        [--workloads shared_prefix,agentic,overload,cascade,crash] [--seed 0]

For every (workload, gateway) cell it starts a fresh emulated fleet (8 engines, in a
process of their own, KV events on), starts the gateway in front of it (peers from their
own virtualenvs under bench/results/cache/venvs, installed on first use), replays the
seeded workload with one load generator process (bench/peerlib/loadgen.py), reads the
engines' prefix-cache counters, and stops both. Capacity is measured first, straight at
the engines, in output tokens per second; workloads are sized against it. An overhead
section measures a trivial backend (bench/gateway_overhead.py's) direct and through each
gateway with the same closed-loop client. Output: bench/results/peers-<date>.md, .json and
PNG plots (matplotlib from its own cache virtualenv). A peer that cannot be installed or
started is reported as "not run: <reason>".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peerlib import gateways as gw
from peerlib import workloads as wl
from peerlib.breakdown import breakdown, breakdown_lines
from peerlib.overhead import measure_overhead, overhead_lines, overhead_verdicts
from peerlib.procs import FleetProc, children_cpu_s, cpu_s, run_load
from peerlib.report import (
    cpu_fields,
    cpu_lines,
    not_run_lines,
    offered_x,
    sizing_lines,
    table,
    target_lines,
)
from peerlib.stats import Row, RunInfo, summarize

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HERE = Path(__file__).resolve()
# inferplane:fit16 is a diagnostic row (admission headroom for the 16-slot engines);
# the targets are judged on the plain inferplane row.
DEFAULT_GATEWAYS = "inferplane,sglang-router,vllm-router,litellm"
QUICK_GATEWAYS = "inferplane,sglang-router"


# ---- roles run in child processes ----------------------------------------------------------


def role_fleet(args: argparse.Namespace) -> None:
    """Run the emulated fleet until stdin closes; write the endpoint configs to --out."""
    from inferplane.engine.fleet import EngineSpec, serve_until_stdin_closes

    spec = EngineSpec(
        count=args.engines,
        time_scale=args.time_scale,
        kv_events=True,
        name_prefix="e",
        seed=args.seed,
        profile_overrides=(("max_num_seqs", args.max_num_seqs),),  # vLLM --max-num-seqs
    )
    serve_until_stdin_closes([spec], Path(args.out))


def role_load(args: argparse.Namespace) -> None:
    import uvloop
    from peerlib import loadgen

    spec = json.loads(Path(args.spec).read_text())
    fn = loadgen.closed_loop if spec.get("mode") == "closed" else loadgen.run
    result = uvloop.run(fn(spec))
    Path(args.out).write_text(json.dumps(result))


# ---- orchestration helpers ----------------------------------------------------------------


def chat_bodies(scale: wl.Scale, seed: int, count: int = 64) -> list[dict[str, Any]]:
    """Closed-loop bodies with the chat mix of the workloads (for the capacity probe)."""
    import random

    rng = random.Random(f"{seed}:capacity")
    bodies = []
    for _ in range(count):
        call = wl._chat(rng, scale, (16, 128))[0]
        messages = [{"role": r, "content": c} for r, c in call.messages]
        bodies.append(
            {
                "model": "llama-3-8b",
                "messages": messages,
                "max_tokens": call.max_tokens,
                "stream": True,
                "ignore_eos": True,
            }
        )
    return bodies


def measure_capacity(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet = FleetProc(args, workdir)
    try:
        scale = wl.Scale(1.0, 1.0, args.time_scale, args.engines, args.quick)
        spec = {
            "mode": "closed",
            "urls": [u + "/v1/chat/completions" for u in fleet.urls],
            "bodies": chat_bodies(scale, args.seed),
            "concurrency": args.capacity_streams or args.max_num_seqs,
            "warmup_s": 5.0,
            "window_s": 10.0,
        }
        return run_load(spec, workdir, 120)
    finally:
        fleet.stop()


def run_cell(
    args: argparse.Namespace, spec: gw.GatewaySpec, workload: wl.Workload, workdir: Path
) -> tuple[Row, dict[str, Any]]:
    """One gateway on one workload: its row, where its offered tasks went, CPU used."""
    fleet = FleetProc(args, workdir)
    try:
        running = gw.start(spec, fleet.endpoints, workdir)
        try:
            drain_s = workload.drain_s or (10.0 if args.quick else 20.0)
            load = {
                "url": running.url,
                "api_key": running.api_key,
                "drain_s": drain_s,
                "engine_urls": fleet.urls,
                "workload": wl.to_json(workload),
            }
            before = (cpu_s(fleet.proc.pid), cpu_s(running.proc.pid), children_cpu_s())
            load_avg = os.getloadavg()[0]
            result = run_load(load, workdir, workload.duration_s + drain_s + 120)
            after = (cpu_s(fleet.proc.pid), cpu_s(running.proc.pid), children_cpu_s())
            used = [round(b - a, 1) for a, b in zip(before, after, strict=True)]
            result["cpu_s"] = dict(zip(("fleet", "gateway", "load"), used, strict=True))
            result["load_avg"] = [round(load_avg, 2), round(os.getloadavg()[0], 2)]
            result["gateway_counters"] = gw.gateway_counters(running)
            result["gateway_prefix"] = gw.gateway_prefix(running)
            raw = gw.CACHE / "raw" / f"{workload.name}-{spec.label.replace(' ', '-')}.json"
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text(json.dumps(result))
        finally:
            running.stop()
        prefix = fleet.prefix_counts()
        usd_h = sum(e["price_per_hour_usd"] for e in fleet.endpoints)
    finally:
        fleet.stop()
    counted = sum(1 for t in workload.tasks if t.counted)
    info = RunInfo(
        spec.label,
        str(workload.name),
        counted,
        workload.duration_s,
        usd_h,
        args.time_scale,
    )
    row = summarize(info, result, prefix)
    outcomes = breakdown(result, counted)
    print(
        f"  {spec.label:<28} goodput {row.goodput_tasks_s:6.2f}/s  ok {row.calls_ok}/{row.calls}"
        f"  ttft p90 {row.ttft_p90_s}  hit {row.prefix_hit_rate}  {outcomes}",
        file=sys.stderr,
        flush=True,
    )
    return row, {**outcomes, **cpu_fields(result)}


def install_all(specs: list[gw.GatewaySpec]) -> dict[str, str]:
    """Install every peer's virtualenv (in parallel); label -> reason for those that failed."""
    from concurrent.futures import ThreadPoolExecutor

    kinds = sorted({s.kind for s in specs if s.kind is not gw.GatewayKind.INFERPLANE})
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(gw.venv_python, k) for k in kinds}
    failed: dict[gw.GatewayKind, str] = {}
    for kind, fut in futures.items():
        exc = fut.exception()
        if exc is not None:
            failed[kind] = str(exc)
    return {s.label: failed[s.kind] for s in specs if s.kind in failed}


def write_outputs(doc: dict[str, Any], lines: list[str]) -> Path:
    stem = RESULTS / f"peers-{doc['date']}{doc['args'].get('tag') or ''}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    plotter = gw.VENVS / "matplotlib" / "bin" / "python"
    try:
        gw.VENVS.mkdir(parents=True, exist_ok=True)
        if not (plotter.parent.parent / ".installed").exists():
            subprocess.run([sys.executable, "-m", "venv", str(plotter.parent.parent)], check=True)
            subprocess.run(
                [str(plotter), "-m", "pip", "install", "-q", "matplotlib"],
                check=True,
                timeout=900,
                capture_output=True,
            )
            (plotter.parent.parent / ".installed").write_text("ok\n")
        subprocess.run(
            [
                str(plotter),
                str(HERE.parent / "peerlib" / "plots.py"),
                str(stem.with_suffix(".json")),
            ],
            check=True,
            timeout=120,
        )
        lines += ["", f"Plots: `{stem.name}-*.png`."]
    except (subprocess.SubprocessError, OSError) as exc:
        lines += ["", f"Plots not made: {exc}"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".md")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def header_lines(args: argparse.Namespace, capacity: dict[str, Any]) -> list[str]:
    return [
        f"# Peer scoreboard, {dt.date.today().isoformat()}{' (quick)' if args.quick else ''}",
        "",
        f"Fleet: {args.engines} emulated llama-3-8b/H100 engines, time scale {args.time_scale:g} "
        f"(each engine {args.time_scale:g}x slower than the modelled GPU), {args.max_num_seqs} "
        "batch slots each (vLLM --max-num-seqs; with the default 256 the fleet's ceiling is "
        "~5x what this machine can stream through a gateway, so the CPUs, not the fleet, "
        "would saturate), KV events on; a fresh "
        "fleet and gateway for every cell; one load generator process; seed "
        f"{args.seed}; machine: {subprocess.getoutput('nproc')} CPUs shared by engines, gateway "
        "and client.",
        "Capacity (chat mix straight at the engines, "
        f"{args.capacity_streams or args.max_num_seqs} streams/engine: every slot busy): "
        f"{capacity['tok_s']:.0f} output tok/s, {capacity['calls_s']:.1f} calls/s, TTFT p90 "
        f"{_fmt(capacity.get('ttft_p90_s'))} s, time per output token p50 "
        f"{_fmt(capacity.get('tbt_p50_s'))} s; workloads are sized against it in output tokens "
        f"(a load of 3 offers 3x these tok/s), and every call's deadline is {wl.DEADLINE_SLACK:g}x "
        "what it takes at capacity (TTFT p90 + extra prefill + max_tokens x time per token), so "
        "a fleet at capacity meets it and one far beyond does not.",
        "Settings: inferplane serve with defaults (+ KV events; health checks 5 s x 3 "
        "strikes, as bench/routing.py, since the starved emulated engines answer /health "
        "late; the engines' batch slots in its priors); rows `inferplane <knob>=<value>` are "
        "diagnostics, never judged; "
        "sglang-router / vllm-router --policy cache_aware (extra rows: other policies); "
        "LiteLLM proxy routing_strategy least-busy, default retries. Clients send "
        "X-Priority, X-Deadline-Ms and workflow headers to every gateway (only inferplane "
        "reads them); X-Deadline-Ms is what is left of the call's deadline on every attempt "
        "(a retry never extends it, gRPC's rule), with x-stainless-retry-count as the SDKs "
        "send it; they retry as the OpenAI SDKs do by default (3 attempts, Retry-After "
        "honoured) on shared_prefix and agentic, 4 attempts on overload, on timeout on "
        "cascade, never on crash; a started stream is never replayed by the client.",
        "Definitions: goodput = tasks whose every call succeeded within its deadline, per second "
        "of the arrival window; $/ok task = fleet spend in modelled GPU time over those tasks; "
        "TTFT from the first attempt; prefix hit = engines' cached / queried prompt tokens; "
        "429 = calls finally rejected; broken = streams cut without [DONE].",
    ]


def orchestrate(args: argparse.Namespace) -> None:
    specs = [gw.parse_spec(s) for s in args.gateways.split(",") if s]
    kinds = [wl.WorkloadKind(w) for w in args.workloads.split(",") if w]
    gw.LOGS.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="peers-"))
    not_run = install_all(specs)
    for label, reason in not_run.items():
        print(f"not run: {label}: {reason}", file=sys.stderr, flush=True)
    capacity = measure_capacity(args, workdir)
    print(f"capacity: {capacity}", file=sys.stderr, flush=True)
    scale = wl.Scale(
        args.duration_s or (8.0 if args.quick else 40.0),
        capacity["tok_s"],
        args.time_scale,
        args.engines,
        args.quick,
        capacity.get("ttft_p90_s"),
        capacity.get("tbt_p50_s"),
    )
    doc: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "args": vars(args),
        "capacity": capacity,
        "workloads": {},
        "not_run": not_run,
    }
    lines = header_lines(args, capacity)
    for kind in kinds:
        workload = wl.build(kind, scale, args.seed)
        print(f"{kind}: {len(workload.tasks)} tasks", file=sys.stderr, flush=True)
        rows: list[Row] = []
        outcomes: list[tuple[str, dict[str, Any]]] = []
        for spec in specs:
            if spec.label in not_run:
                continue
            try:
                row, counts = run_cell(args, spec, workload, workdir)
                rows.append(row)
                outcomes.append((spec.label, counts))
            except gw.PeerUnavailable as exc:
                not_run[spec.label] = str(exc)
                print(f"not run: {spec.label}: {exc}", file=sys.stderr, flush=True)
        doc["workloads"][str(kind)] = {
            "title": workload.title,
            "tasks": len(workload.tasks),
            "tasks_counted": sum(1 for t in workload.tasks if t.counted),
            "calls": sum(len(t.calls) for t in workload.tasks),
            "offered_in_window_x": offered_x(workload, scale),
            "drain_s": workload.drain_s,
            "rows": [r.to_json() for r in rows],
            "outcomes": dict(outcomes),
        }
        lines += [
            "",
            f"## {kind}: {workload.title} ({len(workload.tasks)} tasks, {workload.duration_s:g} s)",
            "",
            *sizing_lines(workload, scale),
            *table(rows),
            "",
            *target_lines(str(kind), rows),
            "",
            "Where the offered tasks went (bench/peerlib/breakdown.py):",
            "",
            *breakdown_lines(outcomes),
            "",
            *cpu_lines(outcomes),
        ]
    if not args.skip_overhead:
        doc["overhead"] = measure_overhead(args, specs, not_run, workdir)
        lines += [
            "",
            "## overhead: trivial backend, 64 concurrent, closed loop (at saturation)",
            "",
            *overhead_lines(doc["overhead"]),
            *overhead_verdicts(doc["overhead"]),
        ]
    if not_run:
        lines += ["", "## not run", "", *not_run_lines(not_run)]
    path = write_outputs(doc, lines)
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--role", choices=["orchestrate", "fleet", "load"], default="orchestrate")
    p.add_argument("--out", default="")
    p.add_argument("--spec", default="")
    p.add_argument("--quick", action="store_true", help="short runs (~3 minutes) for iteration")
    p.add_argument(
        "--gateways",
        default=None,
        help=f"default: {DEFAULT_GATEWAYS} (--quick: {QUICK_GATEWAYS}); extra rows: "
        "sglang-router:round_robin, vllm-router:power_of_two, ...",
    )
    p.add_argument("--workloads", default=",".join(k.value for k in wl.WorkloadKind))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=None)
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=16,
        help="batch slots per engine (vLLM's --max-num-seqs); small, so that the fleet "
        "saturates at a token rate this machine's CPUs can stream through every gateway",
    )
    p.add_argument(
        "--capacity-streams",
        type=int,
        default=None,
        help="closed-loop streams per engine of the capacity probe (default: --max-num-seqs, "
        "every slot busy and none queued)",
    )
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--tag", default="", help="suffix of the result files (peers-<date><tag>)")
    args = p.parse_args()
    if args.gateways is None:
        args.gateways = QUICK_GATEWAYS if args.quick else DEFAULT_GATEWAYS
    if args.role == "fleet":
        role_fleet(args)
    elif args.role == "load":
        role_load(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
