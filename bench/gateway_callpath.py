"""The gateway's per-call CPU without sockets: where the policy's microseconds go.

``bench/gateway_overhead.py`` measures the whole gateway on loopback, where the front server,
the upstream client and the kernel's TCP work are part of every request, and it needs the
shared bench lock. This bench runs one process: a ``Gateway`` built on the overhead bench's
fleet config (one endpoint, cache, admission, routing, reliability and accounting as
configured by default), whose proxy talks to an in-memory engine answering the overhead
bench's JSON, driven through ``Gateway._generate`` with an in-memory request. What it
measures is the per-call work of the control plane alone: context, cache lookup, admission,
planning (routing), dispatch, the answer's accounting and metrics.

- total: CPU seconds (``time.process_time``) per call over ``--calls`` sequential calls,
  the minimum over ``--reps`` repetitions (the least disturbed by other processes);
- stages: a second pass with each stage wrapped in a timer (the wrappers cost about a
  microsecond each, so stage figures are upper bounds and do not add up to the total).

``--sockets`` measures the whole gateway instead (front server, upstream client and loopback
sockets in one process; ``bench/gateway_loopback.py``).

``--baseline-src DIR`` also measures the gateway of another source tree (e.g. ``git archive
<commit> inferplane | tar -x -C DIR``), alternating with the current one ``--rounds`` times,
and reports the median ratio per round. Only ratios within one run mean anything.

    python bench/gateway_callpath.py [--calls 3000] [--reps 7] [--rounds 3] [--sockets]
        [--conns 64] [--baseline-src DIR] [--out bench/results/gateway-callpath.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from gateway_overhead import WHOLE_ANSWER

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gateway-callpath.json"

CONFIG = {
    "gateway": {"log_requests": False, "scrape_interval_s": 0.1, "health_interval_s": 1000},
    "routing": {"predictor": {"priors": {"h100": {"max_num_seqs": 4096}}}},
    "endpoints": [
        {"name": "b0", "url": "http://127.0.0.1:9", "kind": "openai", "gpu": "h100",
         "price_per_hour_usd": 2.0, "models": ["m"]},
    ],
}  # fmt: skip
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
ANSWER = WHOLE_ANSWER  # the trivial backend's, as bench/gateway_overhead.py serves it
CHAT = "/v1/chat/completions"


class _Request:
    """What ``_generate`` reads of an aiohttp request."""

    def __init__(self) -> None:
        from multidict import CIMultiDict, CIMultiDictProxy

        headers = {"Host": "x", "Content-Type": "application/json"}
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self.content_length = len(BODY)
        self.app: dict[str, Any] = {}

    async def read(self) -> bytes:
        return BODY


class _Answer:
    """An engine's whole JSON answer, as the upstream client returns it."""

    status = 200
    headers: ClassVar[dict[str, str]] = {"Content-Type": "application/json"}

    async def read(self) -> bytes:
        return ANSWER

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None


class _Engine:
    """The upstream client's ``post``, answered in memory."""

    async def post(self, url: str, **kwargs: Any) -> _Answer:
        return _Answer()


# ---- role: measure (runs in the tree under test) --------------------------------------------


class _Timers:
    """CPU seconds per stage, through wrappers around the stage's callable."""

    def __init__(self) -> None:
        self.spent: collections.Counter[str] = collections.Counter()

    def sync(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock, spent = time.process_time, self.spent

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += clock() - start

        return timed

    def coro(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        clock, spent = time.process_time, self.spent

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                spent[name] += clock() - start

        return timed


def _wrappable(gw: Any) -> bool:
    """Whether the stages can be wrapped: a compiled (mypyc) tree's methods are read-only,
    so there the stage timings are left out (the total is still measured)."""
    try:
        gw.cache.lookup = gw.cache.lookup
    except AttributeError:
        return False
    return True


def _wrap_stages(gw: Any, timers: _Timers) -> None:
    import inferplane.gateway.app as app_module

    app_module.read_context = timers.coro("context", app_module.read_context)
    app_module.admission_call = timers.sync("admission call", app_module.admission_call)
    app_module.plan_call = timers.sync("plan (routing)", app_module.plan_call)
    gw.cache.lookup = timers.coro("cache lookup", gw.cache.lookup)
    gw.gate.enter = timers.coro("admission", gw.gate.enter)
    gw.proxy.forward = timers.coro("proxy (all)", gw.proxy.forward)
    gw.recorder.on_attempt = timers.sync("  dispatch: accounting", gw.recorder.on_attempt)
    gw.router.on_dispatch = timers.sync("  dispatch: router", gw.router.on_dispatch)
    gw.recorder.finish = timers.sync("  finish: accounting+metrics", gw.recorder.finish)
    gw.router.on_first_token = timers.sync("  finish: first token", gw.router.on_first_token)
    gw.router.on_finish = timers.sync("  finish: router", gw.router.on_finish)
    gw.gate.leave = timers.sync("  finish: admission", gw.gate.leave)


async def _measure(calls: int, reps: int, stages: bool) -> dict[str, Any]:
    from inferplane.config import parse_config
    from inferplane.core.types import EndpointState
    from inferplane.gateway.app import Gateway

    gw = Gateway(parse_config(CONFIG))
    gw.build_app()
    await gw.start()
    try:
        gw.tracker.set_state("b0", EndpointState.READY)
        gw.proxy._session = _Engine()
        gw.proxy.hedging._session = _Engine()
        request = _Request()
        for _ in range(2000):  # warm-up: caches, lazily built label children
            await gw._generate(request, CHAT)
        best = float("inf")
        for _ in range(reps):
            start = time.process_time()
            for _ in range(calls):
                await gw._generate(request, CHAT)
            best = min(best, (time.process_time() - start) / calls)
        out: dict[str, Any] = {"us_per_call": 1e6 * best}
        if stages and _wrappable(gw):
            timers = _Timers()
            _wrap_stages(gw, timers)
            per_rep: list[dict[str, float]] = []
            for _ in range(reps):
                timers.spent.clear()
                for _ in range(calls):
                    await gw._generate(request, CHAT)
                per_rep.append({k: 1e6 * v / calls for k, v in timers.spent.items()})
            out["stages_us"] = min(per_rep, key=lambda r: r.get("proxy (all)", 0.0))
        return out
    finally:
        await gw.stop()


def run_measure(args: argparse.Namespace) -> None:
    import uvloop

    if args.sockets:  # the whole gateway on loopback sockets (bench/gateway_loopback.py)
        from gateway_loopback import measure_sockets

        result = uvloop.run(measure_sockets(args.calls, args.reps, args.conns))
    else:
        result = uvloop.run(_measure(args.calls, args.reps, args.stages))
    print(json.dumps(result))


# ---- orchestration --------------------------------------------------------------------------


def _child(args: argparse.Namespace, src: str | None, stages: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "measure",
           "--calls", str(args.calls), "--reps", str(args.reps), "--conns", str(args.conns)] + (
        ["--stages"] if stages and not args.sockets else []) + (
        ["--sockets"] if args.sockets else [])  # fmt: skip
    env = dict(os.environ)
    if src is not None:  # that tree's package first
        env["PYTHONPATH"] = src
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env,
                         cwd=src or str(ROOT), timeout=600)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def orchestrate(args: argparse.Namespace) -> None:
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        row: dict[str, Any] = {"current": _child(args, None, stages=i == 0)}
        if args.baseline_src:
            row["baseline"] = _child(args, args.baseline_src, stages=i == 0)
        rounds.append(row)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    lines = _report(rounds, args)
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": rounds, "table": lines}, indent=2))


def _report(rounds: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    now = statistics.median(r["current"]["us_per_call"] for r in rounds)
    what = f"sockets, {args.conns} connections" if args.sockets else "call path"
    lines = [
        f"gateway {what} in-process ({args.rounds} rounds, {args.calls} calls x "
        f"{args.reps} reps, min per round, median over rounds)",
        f"{'CPU us per call (current)':<40}{now:>10.1f}",
    ]
    if args.baseline_src:
        base = statistics.median(r["baseline"]["us_per_call"] for r in rounds)
        ratio = statistics.median(
            r["current"]["us_per_call"] / r["baseline"]["us_per_call"] for r in rounds
        )
        lines.append(f"{'CPU us per call (baseline)':<40}{base:>10.1f}")
        lines.append(f"{'current / baseline (median per round)':<40}{ratio:>9.2f}x")
        lines.append(f"  (baseline: {args.baseline_src})")
    stages = rounds[0]["current"].get("stages_us", {})
    base_stages = rounds[0].get("baseline", {}).get("stages_us", {})
    if stages:
        lines.append(f"{'stage (wrapped; upper bounds)':<40}{'current':>10}{'baseline':>10}")
        for name, us in sorted(stages.items(), key=lambda kv: -kv[1]):
            base_us = base_stages.get(name)
            shown = f"{base_us:>10.1f}" if base_us is not None else f"{'':>10}"
            lines.append(f"{name:<40}{us:>10.1f}{shown}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--role", choices=["orchestrate", "measure"], default="orchestrate")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stages", action="store_true", help="(measure role) also time stages")
    p.add_argument("--sockets", action="store_true", help="whole gateway on loopback sockets")
    p.add_argument("--conns", type=int, default=64, help="(--sockets) client connections")
    p.add_argument("--baseline-src", default=None, help="source tree of a gateway to compare")
    p.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    args = p.parse_args()
    if args.role == "measure":
        run_measure(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
