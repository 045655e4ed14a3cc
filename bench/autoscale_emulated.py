"""Autoscaling on the emulated fleet (issue 9): the gateway's loop vs a fixed peak-sized fleet.

A short, real-time version of ``bench/autoscale.py``: the gateway in front of an embedded
fleet of emulated Llama-3-8B H100 engines (``EmbeddedFleet``: engines started cold load
their weights before they answer ``/health``; drained ones finish their calls, then stop),
and a load driver in the same process sending agentic tasks (4-8 streamed calls each with a
workflow id, a shared system prompt and a growing context) whose arrival rate follows a
diurnal curve compressed into ``--duration-s`` (trough 0.4x, peak 1.6x of ``--tasks-per-s``)
with a 5x burst for ``--burst-s`` from ``--burst-at`` of the run. Every call states its SLO
(``X-TTFT-Budget-Ms``, ``X-Deadline-Ms``), as the simulator's calls do. Four arms, one after the
other, same seed:

* ``inferplane``: ``setup_autoscaling`` with the embedded fleet as actuator, one warm engine
  at start, ``min_replicas`` 1 and ``max_replicas`` ``--max-replicas``; ``--burst-prior``
  and ``--burst-memory-s`` set the loop's burst reserve (:mod:`inferplane.core.autoscale_reserve`);
  with ``--warm-seed`` the loop has run a day before (on that seed) and starts from what it
  learned then (``autoscale.learned_store``), as a deployed loop restarted by a deploy does;
* ``peak``: ``--peak-replicas`` warm engines and no loop (0: the loop's sizing rule applied
  to the peak work rate the inferplane arm measured);
* ``queue-hpa``: production-stack's KEDA rule on waiting calls as an HPA evaluates it
  (``bench/autoscale_hpa.py``), one warm engine at start, through the same embedded fleet;
* ``queue-hpa-open``: the same rule with the gateway's admission off (``fcfs``), as
  production-stack's router forwards every call: calls inferplane's admission would refuse
  wait at the engines, where the rule sees them.

``--arms`` picks the arms to run now; each arm's result is saved apart
(``autoscale-emulated[-TAG]-ARM.json``) and the report covers every arm saved under the tag,
so arms too long for one lock hold run in separate invocations.

Outlier ejection (the gateway's breaker) is off in every arm unless ``--outlier-ejection``:
the engines, gateway and load share this machine's CPUs, so a CPU-starved emulated engine
reads as a latency outlier and is ejected (a run of the peak arm lost one of its three
engines for 163 s that way); these engines never fail, and both arms get the same settings.

Reports replicas over time (started engines, warming and draining included: what is paid),
SLO attainment (streamed calls with a first token within ``--slo-ttft-s`` and done within
``--slo-e2e-s``, over calls sent), GPU-hours and cost per successful task, with the issue's
PASS/MISS lines. A task succeeds when every call of it met the SLO (DESIGN.md: its calls
succeed within their deadlines); cost per completed task, whatever its calls' latency (the
measure before 2026-12-06), is reported beside it. Writes
bench/results/autoscale-emulated[-TAG].json, .md and .png. The engines, the gateway and the
load share this machine's cores, so the numbers carry the machine's load (printed with them).

Run: ``python bench/autoscale_emulated.py [--duration-s 300] [--time-scale 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from inferplane.config import parse_config
from inferplane.core.autoscale_knowledge import as_json, knowledge
from inferplane.core.types import EndpointState
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.autoscale import (
    CONTROLLER_KEY,
    AutoscaleConfig,
    EmbeddedFleet,
    LearnedStoreKind,
    PoolScaleConfig,
    setup_autoscaling,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoscale_emulated_report import (
    CallResult,
    met_slo,
    plot,
    rate_factor,
    summarise,
    table,
    verdicts,
)
from autoscale_hpa import QueueHpa

RESULTS = Path(__file__).parent / "results"
POOL, GPU = "llama-3-8b", "h100"
TARGET_UTILISATION = 0.7
WORDS = ("alpha", "build", "commit", "deploy", "error", "file", "grep", "patch", "test", "trace")


def task_arrivals(args: argparse.Namespace) -> list[float]:
    """The tasks' start times, seconds into the run: a Poisson process at ``--tasks-per-s``
    x ``rate_factor`` (thinning), drawn up front from its own RNG seeded by ``--seed``, so
    every arm gets the same tasks at the same times. Drawn while the run went, from the RNG
    the tasks' contents also drew from, the schedule depended on each arm's timing: one run
    sent 2,038 calls in one arm and 1,788 in another (a lighter burst) on the same seed."""
    rng = random.Random(args.seed)
    peak = 1.6 * 5.0 * args.tasks_per_s
    starts: list[float] = []
    t = rng.expovariate(peak)
    while t < args.duration_s:
        if rng.random() * peak <= args.tasks_per_s * rate_factor(t, args):
            starts.append(t)
        t += rng.expovariate(peak)
    return starts


class Driver:
    """Agentic tasks against the gateway at the time-varying rate."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.calls: list[CallResult] = []
        self.tasks_ok = self.tasks_failed = 0
        self.tasks_in_slo = 0  # completed with every call within the SLO: successful
        self.refusals: list[str] = []  # the first refusals' messages, as the gateway gave them
        self._start = 0.0
        # Each call states the SLO it is judged by, as the simulator's calls carry theirs
        # (``bench/autoscale.py``): admission's deadline and shedding tests read them.
        self.budgets = {"X-TTFT-Budget-Ms": str(round(args.slo_ttft_s * 1000)),
                        "X-Deadline-Ms": str(round(args.slo_e2e_s * 1000))}  # fmt: skip

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._start = loop.time()
        pending: set[asyncio.Task[None]] = set()
        async with client_session(self.args.slo_e2e_s * 4) as session:
            for n, start_s in enumerate(task_arrivals(self.args)):
                await asyncio.sleep(max(0.0, self._start + start_s - loop.time()))
                task = asyncio.create_task(self.task(session, n))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, self._start + self.args.duration_s - loop.time()))
            await asyncio.gather(*pending, return_exceptions=True)

    async def task(self, session: aiohttp.ClientSession, n: int) -> None:
        """Task ``n``: its steps, prompts and tool pauses from its own RNG (the same in
        every arm, however the calls before it went)."""
        rng = random.Random(f"{self.args.seed}-task-{n}")
        steps = rng.randint(4, 8)
        messages: list[dict[str, str]] = [
            {"role": "system", "content": "You are a coding agent. " + "tools " * 400},
            {"role": "user", "content": text(rng, 300)},
        ]
        in_slo = True
        for step in range(1, steps + 1):
            headers = {**self.budgets, "X-Workflow-Id": f"t{n}", "X-Workflow-Step": str(step),
                       "X-Workflow-Steps": str(steps)}  # fmt: skip
            result = await self.call(session, messages, headers)
            self.calls.append(result)
            in_slo = in_slo and met_slo(result, self.args)
            if not result.ok:
                self.tasks_failed += 1
                return
            messages += [{"role": "assistant", "content": text(rng, 60)},
                         {"role": "user", "content": "tool result: " + text(rng, 800)}]  # fmt: skip
            await asyncio.sleep(rng.uniform(0.2, 1.0))
        self.tasks_ok += 1
        self.tasks_in_slo += in_slo

    async def call(
        self, session: aiohttp.ClientSession, messages: list[dict[str, str]], headers: Any
    ) -> CallResult:
        loop = asyncio.get_running_loop()
        start = loop.time()
        body = {"model": POOL, "messages": messages, "max_tokens": 128, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        ttft, work = None, 0
        try:
            async with session.post(
                self.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers
            ) as resp:
                if resp.status != 200:
                    err = orjson.loads(await resp.read() or b"{}").get("error") or {}
                    why = f"{resp.status} {err.get('code') or err.get('type') or ''}"
                    if len(self.refusals) < 50:
                        self.refusals.append(f"{start - self._start:.1f} s: {err.get('message')}")
                    return CallResult(start - self._start, None, None, False, 0, why)
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    if line.startswith(b"data: [DONE]"):
                        e2e = loop.time() - start
                        return CallResult(start - self._start, ttft, e2e, True, work)
                    chunk = orjson.loads(line[6:])
                    if "error" in chunk:
                        why = f"stream {(chunk['error'] or {}).get('code')}"
                        return CallResult(start - self._start, ttft, None, False, work, why)
                    if ttft is None and has_content(chunk):
                        ttft = loop.time() - start
                    usage = chunk.get("usage")
                    if usage:
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                        work = usage["prompt_tokens"] - (cached or 0) + usage["completion_tokens"]
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return CallResult(start - self._start, ttft, None, False, work, type(exc).__name__)
        return CallResult(start - self._start, ttft, None, False, work, "stream ended")


def has_content(chunk: dict[str, Any]) -> bool:
    """Whether a stream chunk carries a token: TTFT is the first such chunk, as in the
    peers' bench (``bench/peerlib``) and vLLM's serving benchmark. The emulated engine
    opens a chat stream with an empty role delta as soon as a call arrives, queued or not;
    counting it (as this bench did before 2026-12-06) timed the role chunk, so a call waiting
    at an engine read as answered in ~10 ms and only the gateway's queue showed in TTFT."""
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ())


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def client_session(total_s: float) -> aiohttp.ClientSession:
    """The driver's HTTP client: no cap on open connections. aiohttp's default (100) held
    every call past the 100th in the client's pool, where neither the gateway nor an engine
    saw it: the queue-hpa-open arm's engines ran 100 calls with a handful waiting while the
    rest queued in the driver (agents are independent clients; their calls reach the router)."""
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=total_s), connector=connector)


def pool_config(args: argparse.Namespace, state_path: str | None = None) -> AutoscaleConfig:
    pool = PoolScaleConfig(model=POOL, gpus=(GPU,), min_replicas=1,
                           max_replicas=args.max_replicas, target_utilisation=TARGET_UTILISATION,
                           scale_down_window_s=args.down_window_s,
                           scale_down_cooldown_s=args.down_window_s)  # fmt: skip
    return AutoscaleConfig(enabled=True, tick_s=args.tick_s, time_scale=args.time_scale,
                           pools=(pool,), state_path=state_path,
                           learned_store=LearnedStoreKind.MEMORY if state_path is None
                           else LearnedStoreKind.FILE)  # fmt: skip


def slo_wait_s(args: argparse.Namespace) -> float | None:
    """The queue wait the loop's burst reserve lets a burst build: ``--burst-slo-wait-s``,
    by default the TTFT SLO; negative: none (the reserve is the whole burst)."""
    wait_s = args.slo_ttft_s if args.burst_slo_wait_s is None else args.burst_slo_wait_s
    return None if wait_s < 0 else wait_s


async def run_arm(
    arm: str, replicas: int, args: argparse.Namespace, state_path: str | None = None
) -> dict[str, Any]:
    slots = EmbeddedFleet.plan(POOL, GPU, args.max_replicas, args.time_scale, prefix=arm)
    holder: list[Gateway] = []
    fleet = EmbeddedFleet(
        slots,
        lambda n, st: holder[0].tracker.set_state(n, st),
        lambda n: holder[0].tracker.in_flight(n),
    )
    config = parse_config(
        {"gateway": {"auth": {"mode": "anonymous"}, "log_requests": False,
                     "scrape_interval_s": 0.5, "health_interval_s": 0.5},
         "reliability": {"breaker": {"enabled": args.outlier_ejection}},
         "admission": {**json.loads(args.admission),
                       "mode": "fcfs" if arm == "queue-hpa-open" else "inferplane"},
         "endpoints": [fleet.endpoint_config(s) for s in slots]}
    )  # fmt: skip
    gateway = Gateway(config)
    holder.append(gateway)
    for slot in slots[:replicas]:
        await fleet.start_slot(slot.name, cold=False)
    app = gateway.build_app()
    if arm == "inferplane":
        overrides = {"burst_prior": args.burst_prior, "burst_memory_s": args.burst_memory_s,
                     "burst_prior_now": args.burst_prior_now,
                     "burst_length_s": args.burst_length_s or None,
                     "burst_min_serve_s": args.burst_min_serve_s,
                     "burst_slo_wait_s": slo_wait_s(args)}  # fmt: skip
        setup_autoscaling(app, gateway, pool_config(args, state_path), fleet, overrides)
    hpa = QueueHpa(gateway, fleet, pool_config(args).policies()[0], args.tick_s)
    runner, port = await start_server(app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        await _ready(gateway, [s.name for s in slots[:replicas]])
        if arm.startswith("queue-hpa"):
            hpa.start()
        driver = Driver(url, args)
        series: list[tuple[float, int, int, str]] = []  # (t, started, ready, states)
        pool_samples: list[dict[str, float]] = []
        sampler = asyncio.create_task(_sample(fleet, gateway, series, slots, hpa, pool_samples))
        started = time.monotonic()
        await driver.run()
        elapsed = time.monotonic() - started
        sampler.cancel()
        ctl = app[CONTROLLER_KEY]["ctl"] if arm == "inferplane" else None
        decisions = [] if ctl is None else ctl.snapshot()
        decisions = hpa.decisions if arm.startswith("queue-hpa") else decisions
        history = [] if ctl is None else ctl.history
        learned = {} if ctl is None else as_json(knowledge(ctl.state, ctl.autoscaler.policies))
    finally:
        await hpa.stop()
        await runner.cleanup()
        await fleet.stop()
    result = summarise(arm, driver, series, elapsed, decisions, args)
    start = ctl.history[0]["t"] - args.tick_s if ctl is not None and ctl.history else 0.0
    result["decision_history"] = [{**h, "t": round(h["t"] - start, 1)} for h in history]
    if arm.startswith("queue-hpa"):
        result["rule_samples"] = hpa.samples
    result["pool_samples"], result["refusals"] = pool_samples, driver.refusals
    if arm == "inferplane":
        result["learned_at_end"] = learned
    return result


async def warm_arm(args: argparse.Namespace, stem: str) -> dict[str, Any]:
    """The inferplane arm with a loop that has run before: a warm-up day on ``--warm-seed``
    (its own draws of the same day's shape: yesterday), whose learned values the loop keeps
    in a file (``autoscale.learned_store: file``), then the measured day on ``--seed``, the
    loop restarted from that file. The warm-up's result is saved apart (``-warmup.json``), not
    reported; the measured result carries the learned values it started from."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "learned.json")
        warm_args = argparse.Namespace(**{**vars(args), "seed": args.warm_seed})
        warmup = await run_arm("inferplane", 1, warm_args, path)
        (RESULTS / f"{stem}-warmup.json").write_text(json.dumps(warmup, indent=1))
        result = await run_arm("inferplane", 1, args, path)
    result["learned_at_start"] = warmup["learned_at_end"]
    return result


def imported_tree() -> dict[str, Any]:
    """Which inferplane this run imported, and how many of its modules are compiled: a copy
    built by ``make compiled`` runs only with PYTHONPATH pointing at it (else the
    virtualenv's editable install, pure Python, is what runs)."""
    import inferplane

    root = Path(inferplane.__file__).resolve().parent
    return {"path": str(root), "compiled_modules": sum(1 for _ in root.rglob("*.so"))}


async def _ready(gateway: Gateway, names: list[str]) -> None:
    """Wait for the gateway's health checks to see the warm engines ready."""
    for _ in range(600):
        if all(gateway.tracker.state(n) is EndpointState.READY for n in names):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"engines not ready: {names}")


async def _sample(
    fleet: EmbeddedFleet,
    gateway: Gateway,
    series: list[tuple[float, int, int, str]],
    slots: Any,
    hpa: QueueHpa,
    pool_samples: list[dict[str, float]],
) -> None:
    """Each second: engines started (paid for), engines ready, and every slot's state
    (first letter of the tracker's state; upper case when its engine runs, else lower);
    the pool as the queue rule sees it (waiting, running, gate queue, KV use) with it."""
    start = time.monotonic()
    while True:
        pool_samples.append({"t": round(time.monotonic() - start, 1), **hpa.observe()})
        states = [gateway.tracker.state(s.name) for s in slots]
        ready = sum(st is EndpointState.READY and s.name in fleet.servers
                    for s, st in zip(slots, states, strict=True))  # fmt: skip
        code = "".join(
            st.value[0].upper() if s.name in fleet.servers else st.value[0]
            for s, st in zip(slots, states, strict=True)
        )
        series.append((time.monotonic() - start, len(fleet.servers), ready, code))
        await asyncio.sleep(1.0)


async def main_async(args: argparse.Namespace) -> None:
    """Runs ``--arms`` (each one's result saved apart), then reports every arm saved under
    the tag: arms too long for one run may run in separate invocations."""
    RESULTS.mkdir(exist_ok=True)
    stem = "autoscale-emulated" + (f"-{args.tag}" if args.tag else "")
    for arm in [a for a in args.arms.split(",") if a and a != "none"]:
        load_before = os.getloadavg()
        if arm == "peak":
            ip_path = RESULTS / f"{stem}-inferplane.json"
            ip = json.loads(ip_path.read_text()) if ip_path.exists() else None
            per_replica = (ip or {}).get("replica_tokens_per_s", 1.0) * TARGET_UTILISATION
            work = (ip or {}).get("peak_work_tokens_per_s", 0.0)
            n = args.peak_replicas or max(1, math.ceil(work / per_replica))
            result = await run_arm("peak", min(n, args.max_replicas), args)
        elif arm == "inferplane" and args.warm_seed is not None:
            result = await warm_arm(args, stem)
        else:
            result = await run_arm(arm, 1, args)
        result.update(args=vars(args), load_before=load_before, load_after=os.getloadavg(),
                      tree=imported_tree())  # fmt: skip
        (RESULTS / f"{stem}-{arm}.json").write_text(json.dumps(result, indent=1))
    order = ("inferplane", "queue-hpa", "queue-hpa-open", "peak")
    by = {
        a: json.loads(p.read_text()) for a in order if (p := RESULTS / f"{stem}-{a}.json").exists()
    }
    results = [by[a] for a in order if a in by and a != "peak"] + (
        [by["peak"]] if "peak" in by else []
    )
    text = table(results)
    lines = verdicts(by)
    loads = [f"{r['arm']}: {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}" for r in results]
    print(text)
    print("load average (1 min) before -> after each arm: " + "; ".join(loads))
    print("\n".join(lines))
    doc = {"args": vars(args), "results": results, "verdicts": lines}
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (RESULTS / f"{stem}.md").write_text(
        f"# Autoscaling on the emulated fleet\n\n`python bench/autoscale_emulated.py` with "
        f"{vars(args)}; inferplane from {imported_tree()}\n\n{text}\n\n"
        "load average (1 min) before -> after each arm: "
        + "; ".join(loads)
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )
    plot(results, args, RESULTS / f"{stem}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--tasks-per-s", type=float, default=0.5, help="mean task arrival rate")
    parser.add_argument("--burst-at", type=float, default=0.35, help="fraction of the run")
    parser.add_argument(
        "--admission",
        default="{}",
        help="JSON merged into the gateway's admission config in every arm (a diagnostic, "
        "e.g. '{\"kv_threshold\": 0.95}'; the queue-hpa-open arm still runs fcfs)",
    )
    parser.add_argument("--burst-s", type=float, default=60.0)
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--tick-s", type=float, default=5.0)
    parser.add_argument("--down-window-s", type=float, default=30.0)
    parser.add_argument("--max-replicas", type=int, default=6)
    parser.add_argument("--peak-replicas", type=int, default=0, help="0: sized from the run")
    parser.add_argument("--slo-ttft-s", type=float, default=3.0)
    parser.add_argument("--slo-e2e-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--arms",
        default="inferplane,peak",
        help="comma-separated arms to run now: inferplane, peak, queue-hpa, queue-hpa-open "
        "(none: report only)",
    )
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument(
        "--burst-prior",
        type=float,
        default=8.0,
        help="burst factor (in work) the reserve covers before one is seen (1: none); a 5x "
        "burst of agentic task arrivals is more in work (tasks pile up; their contexts grow)",
    )
    parser.add_argument(
        "--burst-prior-now",
        type=float,
        default=5.0,
        help="burst over the demand now the reserve covers, at most one replica over need "
        "(1: none); the bench's burst is 5x the task arrivals",
    )
    parser.add_argument(
        "--burst-memory-s",
        type=float,
        default=None,
        help="half-life of the learned burst factor (None: twice --down-window-s)",
    )
    parser.add_argument(
        "--burst-length-s",
        type=float,
        default=60.0,
        help="the length a burst is expected to last before one is seen (0: unknown, bought "
        "for as usual); an operator's prior, as --burst-prior is: the bench's burst lasts "
        "--burst-s of task arrivals (60 s), its calls a little longer",
    )
    parser.add_argument(
        "--burst-min-serve-s",
        type=float,
        default=None,
        help="a replica bought during a burst must serve this much of it (None: its cold start)",
    )
    parser.add_argument(
        "--burst-slo-wait-s",
        type=float,
        default=None,
        help="queue wait the loop's burst reserve lets a burst build before a replica bought "
        "for it serves (None: --slo-ttft-s; negative: none, the reserve is the whole burst)",
    )
    parser.add_argument(
        "--warm-seed",
        type=int,
        default=None,
        help="the inferplane arm's loop first runs a day on this seed and keeps what it "
        "learned (autoscale.learned_store: file), as a loop that ran yesterday (None: a new loop)",
    )
    parser.add_argument(
        "--outlier-ejection", action="store_true", help="the breaker on (every arm alike)"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
