"""Prefix-aware routing under KV memory pressure: inferplane precise vs approximate vs
least-loaded vs round-robin, on seeded workloads (issue 4).

Two workloads (``--workload prefix|agentic|both``, see ``routing_workloads.py``):

- ``prefix``: the llm-d benchmark shape (REFERENCE §6: many customers, each with a long
  shared prefix, more prefixes than one pod's KV cache holds): ``--tenants`` tenants each
  with a ~2K-token system prompt, short questions, Poisson arrivals at ``--rate`` calls/s;
- ``agentic``: multi-turn agent sessions starting at ``--session-rate`` per second, each a
  chain of calls whose context grows (system prompt + task + answers + tool results), tool
  pauses between calls, and the workflow headers (X-Workflow-Id/-Step/-Steps).

Both are scaled to what a 2-core machine can emulate: 8 emulated engines serving
Llama-3-70B on 2 x H100 (about 9K tokens of KV cache each), streaming; ``--tp 4`` gives
them 4 x H100 (the profile's default: ~448K tokens each, no KV pressure).

Policies (engines restarted with empty caches for each, same seed, same calls):

- ``precise``: the gateway subscribed to every engine's KV events (default routing);
- ``approximate``: the same gateway without KV events: the prefix index only holds what it
  routed (speculative ``record_route``), like SGLang's and vllm-router's cache-aware trees;
- ``least-loaded``: the gateway with only the load axis weighted;
- ``round-robin``: the client rotates over the engines directly (no gateway).

Reported per policy: TTFT p50/p90/p99 (client-side, first streamed token), completed
calls/s, errors (and their kinds), the prefix-cache hit rate the engines themselves count
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``), the oracle hit rate
(one infinite cache) and the engines' KV usage (max, spread). Three processes on loopback:
the engine fleet, the gateway (``inferplane serve``) and this client.

    python bench/routing.py [--workload both] [--duration-s 30] [--rate 28] [--seed 7]
        [--session-rate 6] [--time-scale 2]

On a loaded machine the emulated engines fall behind real time: the ``lag`` column is the
share of the run for which the engines' output trailed their model (timer lateness over
elapsed time, mean over engines). ``--time-scale 2`` runs everything twice as slowly (the
workload's timeline too) and reports model time; the gateway's own timers (scrape
interval, speculative-insertion TTL) are not scaled, except the admission's
``workflows.abandon_after_s`` (a workflow's tool pauses are stretched too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_client import (
    CallResult,
    Send,
    measure,
    run_agentic,
    run_prefix,
)
from routing_gateway import gateway_counters, gateway_prefix, state_changes, wait_ready
from routing_report import ENGINES, GPU, MODEL, TP, table
from routing_workloads import (
    AgentShape,
    SentCall,
    agent_sessions,
    agent_system_prompt,
    lru_hit_rate,
    oracle_hit_rate,
    prefix_calls,
    prefix_messages,
    tenant_prompt,
)

from inferplane.core.admission_config import WorkflowConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "routing.json"
POLICIES = ("precise", "approximate", "least-loaded", "round-robin")
WORKLOADS = ("prefix", "agentic")


# ---- role: fleet (child process) -------------------------------------------------------------


def run_fleet(kv_events: bool, time_scale: float, tp: int = TP) -> None:
    """Start the engines, print their endpoint configs as one JSON line, then answer each
    stdin line with the engines' total timer lateness (how far the emulation trails real
    time); run until stdin ends."""
    import uvloop

    from inferplane.engine.fleet import EngineSpec, Fleet

    async def main() -> None:
        spec = EngineSpec(model=MODEL, gpu=GPU, tensor_parallel=tp, count=ENGINES,
                          time_scale=time_scale, kv_events=kv_events, seed=1)  # fmt: skip
        loop = asyncio.get_running_loop()
        async with Fleet([spec]) as fleet:
            print(json.dumps([e.endpoint_config() for e in fleet.engines]), flush=True)
            while await loop.run_in_executor(None, sys.stdin.readline):
                lateness = [e.server.driver.total_lateness_s for e in fleet.engines]
                print(json.dumps({"t": loop.time(), "lateness_s": lateness}), flush=True)

    uvloop.run(main())


class FleetProcess:
    """The engine fleet in a child process (its own cores' worth of event loop)."""

    def __init__(self, kv_events: bool, time_scale: float, tp: int = TP) -> None:
        cmd = [sys.executable, __file__, "--role", "fleet", "--time-scale", str(time_scale),
               "--tp", str(tp)]  # fmt: skip
        if kv_events:
            cmd.append("--kv-events")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoints: list[dict[str, Any]] = json.loads(self._line())

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def lateness(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()
        mark: dict[str, Any] = json.loads(self._line())
        return mark

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(20)


def lag_summary(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """The share of the run for which the engines' output trailed their model (mean, max)."""
    elapsed_s = after["t"] - before["t"]
    fractions = [
        (b - a) / elapsed_s for a, b in zip(before["lateness_s"], after["lateness_s"], strict=True)
    ]
    return {"fleet_lag_mean": sum(fractions) / len(fractions), "fleet_lag_max": max(fractions)}


# ---- the workloads ------------------------------------------------------------------------------


def agent_shape(args: argparse.Namespace) -> AgentShape:
    min_steps, max_steps = (int(x) for x in args.agent_steps.split("-"))
    lo, hi = (int(x) for x in args.tool_words.split("-"))
    return AgentShape(args.session_rate, args.duration_s, args.agent_kinds,
                      args.agent_system_words, min_steps, max_steps, (lo, hi),
                      args.tool_pause_s)  # fmt: skip


def workload_runner(
    name: str, args: argparse.Namespace, sent: list[list[SentCall]]
) -> Callable[[Send], Awaitable[list[CallResult]]]:
    """The coroutine that plays workload ``name`` through a ``send``; the agentic one
    records what it sent in ``sent`` (one list per session) for the oracle."""
    scale = args.time_scale
    if name == "prefix":
        prompts = [tenant_prompt(i, args.prefix_words) for i in range(args.tenants)]
        calls = prefix_calls(args.seed, args.rate, args.duration_s, args.tenants)
        return lambda send: run_prefix(send, calls, prompts, MODEL, args.max_tokens, scale)
    agents = agent_sessions(args.seed, agent_shape(args))
    kinds = [agent_system_prompt(k, args.agent_system_words) for k in range(args.agent_kinds)]
    max_tokens = args.agent_max_tokens
    return lambda send: run_agentic(send, agents, kinds, MODEL, max_tokens, sent, scale)


def prefix_sent(args: argparse.Namespace) -> list[SentCall]:
    """The prefix workload's calls as sent (at their arrival times; answers never reused)."""
    prompts = [tenant_prompt(i, args.prefix_words) for i in range(args.tenants)]
    calls = prefix_calls(args.seed, args.rate, args.duration_s, args.tenants)
    return [SentCall(prefix_messages(prompts[t], q), None, s, s) for s, t, q in calls]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gateway_config(
    policy: str, endpoints: list[dict[str, Any]], port: int, args: argparse.Namespace,
    workdir: Path,
) -> str:  # fmt: skip
    routing: dict[str, Any] = {}
    if policy == "least-loaded":
        axes = ("kv_cache", "load", "headroom", "latency", "cost", "warm", "priority", "affinity")
        routing = {"weights": {a: (1.0 if a == "load" else 0.0) for a in axes}}
    gateway: dict[str, Any] = {"port": port, "auth": {"mode": "anonymous"}, "log_requests": False}
    gateway["health_timeout_s"] = args.health_timeout_s
    gateway["unhealthy_after"] = args.unhealthy_after
    config: dict[str, Any] = {"gateway": gateway, "endpoints": endpoints, "routing": routing}
    # A workflow silent this long has died: model seconds, so a tool pause stretched by the
    # time scale does not read as an abandoned workflow.
    abandon_s = WorkflowConfig().abandon_after_s * args.time_scale
    config["admission"] = {"workflows": {"abandon_after_s": abandon_s}}
    if args.no_ejection:
        config["reliability"] = {"breaker": {"enabled": False}}
    path = workdir / "fleet.json"
    path.write_text(json.dumps(config))  # JSON is YAML
    return str(path)


def run_policy(policy: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """One policy on one workload with a fresh fleet (and gateway): its measured row."""
    fleet = FleetProcess(policy == "precise", args.time_scale, args.tp)
    gateway: subprocess.Popen[Any] | None = None
    workdir = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    log_path = workdir / "gateway.log"
    try:
        engine_urls = [e["url"] for e in fleet.endpoints]
        targets = engine_urls
        if policy != "round-robin":
            port = _free_port()
            cfg = _gateway_config(policy, fleet.endpoints, port, args, workdir)
            serve = [sys.executable, "-m", "inferplane.cli", "serve", "-c", cfg, "--port",
                     str(port), "--log-level", "info"]  # fmt: skip
            with log_path.open("w") as log:
                gateway = subprocess.Popen(serve, stderr=log)
            targets = [f"http://127.0.0.1:{port}"]
            asyncio.run(wait_ready(targets[0]))
        sent: list[list[SentCall]] = []
        load_before = os.getloadavg()[0]
        mark = fleet.lateness()
        runner = workload_runner(workload, args, sent)
        row = asyncio.run(measure(engine_urls, runner, targets, args.time_scale, args.retries))
        row.update(lag_summary(mark, fleet.lateness()))
        row["load_1m"] = [load_before, os.getloadavg()[0]]
        if workload == "agentic":
            calls = [c for session_calls in sent for c in session_calls]
            row["oracle_hit_rate"] = oracle_hit_rate(calls)
            row["lru_hit_rate"] = lru_hit_rate(calls, row["fleet_kv_blocks"])
            row["sessions"] = len(sent)
            row["sessions_ok"] = sum(
                1 for calls in sent if calls and all(c.answer is not None for c in calls)
            )  # a session stops at its first failure, so complete == all answered
            failed_at = Counter(len(calls) for calls in sent if calls and calls[-1].answer is None)
            row["sessions_failed_at_step"] = dict(sorted(failed_at.items()))
        if gateway is not None:
            row["gateway_metrics"] = asyncio.run(gateway_counters(targets[0]))
            row["gateway_prefix"] = asyncio.run(gateway_prefix(targets[0]))
            row["endpoint_state_changes"], row["breaker_reasons"] = state_changes(log_path)
        return row
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(10)
        fleet.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    args = parse_args()
    if args.role == "fleet":
        run_fleet(args.kv_events, args.time_scale, args.tp)
        return
    workloads = WORKLOADS if args.workload == "both" else (args.workload,)
    uptime = _uptime()
    scanned = scan_rate(args, workloads[0]) if args.scan_rates else None
    payload: dict[str, Any] = {"args": vars(args), "uptime": uptime, "workloads": {}}
    lines: list[str] = []
    for workload in workloads:
        prefix = prefix_sent(args) if workload == "prefix" else []
        refs: dict[int, dict[str, float]] = {}
        results = {}
        for policy in args.policies.split(","):
            if policy == "round-robin" and scanned is not None and workload == workloads[0]:
                results[policy] = scanned  # the scan's last run is this one (same rate, duration)
            else:
                results[policy] = run_policy(policy, workload, args)
            blocks = results[policy]["fleet_kv_blocks"]
            if prefix and blocks not in refs:  # the calls are fixed: once per fleet size
                refs[blocks] = {"oracle_hit_rate": oracle_hit_rate(prefix),
                                "lru_hit_rate": lru_hit_rate(prefix, blocks)}  # fmt: skip
            results[policy].update(refs.get(blocks, {}) if prefix else {})
            print(f"{workload}: {policy} done", file=sys.stderr, flush=True)
        rows = table(workload, results, args)
        payload["workloads"][workload] = {"results": results, "table": rows}
        lines += [*rows, ""]
    lines.append(f"uptime before: {payload['uptime']}; after: {_uptime()}")
    payload["uptime_after"] = _uptime()
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {os.getloadavg()}"


def scan_rate(args: argparse.Namespace, workload: str) -> dict[str, Any] | None:
    """Round-robin runs of ``workload`` at rising rates (``--rate`` for prefix,
    ``--session-rate`` for agentic); keep the first whose P90 TTFT passes 2 s (or the last).
    Each point is recorded in ``args.scan`` (so in the result's ``args``). When the scan runs
    at the full ``--duration-s``, its last row is returned: the round-robin row of the run
    that follows."""
    duration_s = args.duration_s
    args.duration_s = args.scan_duration_s or duration_s
    knob = "rate" if workload == "prefix" else "session_rate"
    args.scan = []
    row: dict[str, Any] | None = None
    try:
        for rate in (float(r) for r in args.scan_rates.split(",")):
            setattr(args, knob, rate)
            row = run_policy("round-robin", workload, args)
            p90 = row["ttft_p90_s"]
            args.scan.append({knob: rate, "duration_s": args.duration_s, "ttft_p90_s": p90,
                              "uptime": _uptime()})  # fmt: skip
            print(f"scan: round-robin {workload} at {rate:g}/s: P90 {p90}", file=sys.stderr,
                  flush=True)  # fmt: skip
            if p90 is not None and p90 > 2.0:
                break
    finally:
        args.duration_s = duration_s
    return row if args.scan_duration_s in (0.0, duration_s) else None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--role", choices=["orchestrate", "fleet"], default="orchestrate")
    p.add_argument("--kv-events", action="store_true")
    p.add_argument(
        "--time-scale", type=float, default=1.0,
        help="engines emulated this many times slower (a loaded machine lags less); the"
        " workload's timeline stretches to match, results are in model time",
    )  # fmt: skip
    p.add_argument("--workload", choices=[*WORKLOADS, "both"], default="prefix")
    p.add_argument(
        "--tp", type=int, default=TP, help="GPUs per engine (2: ~9K KV tokens, 4: ~448K)"
    )
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--retries", type=int, default=2, help="retries per call, like the OpenAI SDK")
    # The emulated fleet shares one event loop on a loaded machine: its /health can take over
    # the gateway's default 1 s, and 2 misses mark an endpoint COLD (then 10 s WARMING), so
    # by default the bench gives health checks 5 s and 3 strikes; pass 1 and 2 for the
    # gateway's defaults.
    p.add_argument("--health-timeout-s", type=float, default=5.0, help="gateway health timeout")
    p.add_argument("--no-ejection", action="store_true", help="gateway breaker off")
    p.add_argument("--unhealthy-after", type=int, default=3, help="failed checks before COLD")
    prefix = p.add_argument_group("prefix workload")
    prefix.add_argument("--rate", type=float, default=6.0, help="calls/s")
    prefix.add_argument("--tenants", type=int, default=16)
    prefix.add_argument("--prefix-words", type=int, default=1000)
    prefix.add_argument("--max-tokens", type=int, default=8)
    p.add_argument(
        "--scan-rates", default="",
        help="e.g. 10,14,18: first pick the rate (--rate, or --session-rate for agentic) at"
        " which round-robin's P90 TTFT passes 2 s",
    )  # fmt: skip
    p.add_argument(
        "--scan-duration-s", type=float, default=10.0,
        help="each scan run's duration; 0 or --duration-s: full runs, the last one reused",
    )  # fmt: skip
    agentic = p.add_argument_group("agentic workload")
    agentic.add_argument("--session-rate", type=float, default=2.0, help="sessions/s")
    agentic.add_argument("--agent-steps", default="4-10", help="calls per session, lo-hi")
    agentic.add_argument("--agent-kinds", type=int, default=4)
    agentic.add_argument("--agent-system-words", type=int, default=500)
    agentic.add_argument("--tool-words", default="40-200", help="tool result words, lo-hi")
    agentic.add_argument("--tool-pause-s", type=float, default=1.0, help="mean tool pause")
    agentic.add_argument("--agent-max-tokens", type=int, default=24)
    return p.parse_args()


if __name__ == "__main__":
    main()
