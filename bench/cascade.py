"""Benchmark: a failure cascade on the emulated fleet, reliability features on vs off.

Eight emulated engines, one gateway and open-loop streaming clients run in this process.
Clients behave like naive SDKs: a call that errors, breaks, or takes longer than the client
timeout is retried from scratch, up to 3 times. Half the calls are critical. Scenario (same
seed every run): at ``--slow-at-s`` one engine slows down 5x; at ``--crash-at-s`` a second
one crashes (every stream on it is cut) and restarts cold (it loads its weights again: at
the default time scale it is still loading when the run ends).

Load and timeouts are derived, not tuned: the fleet's capacity is the call rate at which
every engine runs a full batch (``max_num_seqs`` sequences, each a prefill and
``--max-tokens`` decode steps at full batch, from the engine's own performance model at
its time scale); the offered rate is ``--load`` (70%) of it; the client timeout is
``--timeout-x`` (4) times a call's duration on a full healthy engine, and the gateway's
stall limit a third of that. The engines are configured with a small ``max_num_seqs``
(``--max-num-seqs``, 16; vLLM's ``--max-num-seqs``): with the default 256 an H100 serves
~220 calls/s of this shape, and 70% of eight of them is far beyond what one 2-core machine
can stream through a Python gateway and clients. (The earlier settings, 12 calls/s on
256-slot engines at time scale 4, ran the fleet at 1.5% of its capacity, which is why the
"off" run did not collapse.) A smaller batch keeps the knee and lets the rate be real.

* on: the fleet config's ``reliability`` defaults (outlier ejection, retry budget with
  back-off, stream resumption, hedging of critical calls);
* on-nohedge: the same without hedging (``--modes on,on-nohedge,off`` to compare);
* off: plain retries on the next endpoint before the first byte, no ejection, no budget,
  no resumption, no hedging.

Admission control is ``fcfs`` in every run by default, which isolates the reliability
layer (admission has its own benchmark, ``bench/overload.py``). Its defaults would not
fit these engines anyway: a standard call waits while the predicted wait exceeds 1 s, and
standard keeps 80% of an engine's slots free (measured on 256-slot engines), so on
engines slowed 20x and cut to 16 slots it would read a healthy fleet as full.
``--admission inferplane`` runs inferplane's rule with those two brought to these engines
(waits in engine time, 3 of 16 slots kept for critical).

Reported per window: goodput (calls completed per second), p99 client-observed TTFT,
retries (client + gateway) as a share of calls, and the queue depth (waiting requests) of
each engine; at the end: calls and critical calls completed, streams cut by the crash,
interrupted streams the clients saw and how many of them completed, tokens lost or
duplicated (token chunks received vs max_tokens, usage disagreeing), engines past
saturation (llm-d's: waiting/5 or KV use/0.8 >= 1), hedges, and wasted work: tokens the
engines generated (prefilled) beyond what the completed calls needed, from their own
counters, converted to GPU-seconds with the engine profile (decode priced at the mean batch
observed). Then one PASS/MISS line per issue-6 target for each run with reliability on.
Results go to bench/results/cascade.json.

    .venv/bin/python bench/cascade.py [--duration-s 90] [--load 0.7] [--modes on,off]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cascade_report import summary, table, targets

from inferplane.config import parse_config
from inferplane.engine import profiles as engine_profiles
from inferplane.engine import server as engine_server
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import load_profile
from inferplane.gateway import priors as gateway_priors
from inferplane.gateway.app import Gateway, start_server

MODEL = "llama-3-8b"
GPU = "h100"
RESULTS = Path(__file__).parent / "results" / "cascade.json"
_COUNTERS = (b"vllm:generation_tokens_total", b"vllm:prompt_tokens_total")


@dataclass
class Record:
    """One client call (all its client-side tries)."""

    start_s: float
    critical: bool
    ok: bool = False
    end_s: float = 0.0
    ttft_s: float | None = None
    client_retries: int = 0
    tokens_ok: bool = True
    lost_tokens: int = 0  # completed with fewer token chunks than asked
    duplicated_tokens: int = 0  # completed with more
    interrupted: bool = False  # some try saw a broken or error-ended stream
    client_timeouts: int = 0  # tries the client gave up on
    wasted_tokens: int = 0  # tokens received by tries that were then retried


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    # (t, per engine: (waiting, running, kv use))
    load_samples: list[tuple[float, list[tuple[int, int, float]]]] = field(default_factory=list)
    counters: dict[str, list[float]] = field(default_factory=dict)  # engine -> totals so far
    last_seen: dict[str, list[float]] = field(default_factory=dict)
    cut_by_crash: int = 0  # streams in flight on the engine that crashed
    dispatches: list[tuple[float, str]] = field(default_factory=list)  # (t, engine) per attempt
    slow_states: list[tuple[float, str]] = field(default_factory=list)  # (t, its breaker state)


_STATUSES: Counter[str] = Counter()  # refusals the clients got, "status code"


def _code_of(body: bytes) -> str:
    try:
        error = orjson.loads(body)["error"]
        return f"{error.get('code')}: {str(error.get('message'))[:240]}"
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return "?"


async def _one_try(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
    timeout_s: float, t0: float, loop: asyncio.AbstractEventLoop,
) -> tuple[bool, float | None, int, int | None, bool, bool]:  # fmt: skip
    """(ok, ttft, token chunks, usage completion tokens, broken, timed out): ``broken`` is a
    stream the gateway ended badly (an error event, cut without [DONE]), not one the
    client gave up on."""
    chunks, usage, first, broken = 0, None, None, False
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    _STATUSES[f"{resp.status} {_code_of(await resp.read())}"] += 1
                    return False, None, 0, None, False, False
                done = False
                async for line in resp.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b"data: {"):
                        obj = orjson.loads(line[6:])
                        if "error" in obj:
                            broken = True
                        for choice in obj.get("choices") or []:
                            if (choice.get("delta") or {}).get("content"):
                                chunks += 1
                                if first is None:
                                    first = loop.time() - t0
                        if obj.get("usage"):
                            usage = obj["usage"]["completion_tokens"]
                ok = done and not broken
                return ok, first, chunks, usage, not ok and chunks > 0, False
    except TimeoutError:
        return False, first, chunks, usage, False, True
    except aiohttp.ClientError:
        return False, first, chunks, usage, chunks > 0, False


async def _call(
    session: aiohttp.ClientSession, url: str, rec: Record, max_tokens: int, prompt: str,
    timeout_s: float, loop: asyncio.AbstractEventLoop,
) -> None:  # fmt: skip
    body = orjson.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip
    headers = {"Content-Type": "application/json",
               "X-Priority": "critical" if rec.critical else "standard"}  # fmt: skip
    for attempt in range(4):  # the first try and up to 3 retries
        ok, ttft, chunks, usage, broken, timed_out = await _one_try(
            session, url, body, headers, timeout_s, rec.start_s, loop
        )
        rec.interrupted |= broken
        rec.client_timeouts += timed_out
        if ok:
            rec.ok, rec.ttft_s, rec.end_s = True, ttft, loop.time()
            rec.tokens_ok = chunks == max_tokens and usage in (None, max_tokens)
            rec.lost_tokens = max(0, max_tokens - chunks)
            rec.duplicated_tokens = max(0, chunks - max_tokens)
            return
        rec.wasted_tokens += chunks
        if attempt < 3:
            rec.client_retries += 1
    rec.end_s = loop.time()


def _reliability(mode: str) -> dict[str, Any]:
    """The fleet config's ``reliability`` section: the defaults with hedging for critical
    calls turned on, the defaults (no hedging), or all off."""
    if mode == "on":
        return {"hedge": {"enabled": True}}
    if mode == "on-nohedge":
        return {"hedge": {"enabled": False}}
    return {"breaker": {"enabled": False}, "retry": {"enabled": False},
            "resumption": {"enabled": False}, "hedge": {"enabled": False}}  # fmt: skip


def _admission(args: argparse.Namespace) -> dict[str, Any]:
    """``fcfs``, or inferplane's rule with its absolute thresholds brought to these engines:
    the predicted-wait limits are seconds of engine time (x the time scale), and critical
    keeps 3 of 16 slots free (the default shares were measured on 256-slot engines)."""
    if args.admission == "fcfs":
        return {"mode": "fcfs"}
    ts = args.time_scale
    return {"mode": "inferplane", "headroom": {
        "slot_share": {"critical": 0.0, "standard": 0.2, "sheddable": 0.25},
        "max_wait_s": {"critical": float("inf"), "standard": 1.0 * ts, "sheddable": 0.5 * ts},
    }}  # fmt: skip


def _engine_size(max_num_seqs: int) -> None:
    """Engines (and the gateway's priors of them) configured with ``max_num_seqs``."""

    def sized(model: str, gpu: str, tp: int | None = None, **kw: Any) -> Any:
        overrides = {"max_num_seqs": max_num_seqs, **(kw.get("overrides") or {})}
        return load_profile(model, gpu, tp, overrides=overrides)

    for module in (engine_server, gateway_priors):  # the names they imported
        setattr(module, "load_profile", sized)  # noqa: B010


def operating_point(args: argparse.Namespace) -> dict[str, float]:
    """Capacity (calls/s at full batch on every engine), offered rate and client timeout."""
    profile = engine_profiles.load_profile(
        MODEL, GPU, overrides={"max_num_seqs": args.max_num_seqs}
    )
    perf, batch, prompt = PerfModel(profile), profile.max_num_seqs, 24
    context = prompt + args.max_tokens // 2
    call_s = perf.prefill_s(prompt) + args.max_tokens * perf.decode_step_s(batch, context)
    call_s *= args.time_scale
    capacity = 8 * batch / call_s
    rate = args.rate or args.load * capacity
    timeout = args.client_timeout_s or args.timeout_x * call_s
    # The gateway's stall limit also bounds the wait for the first token (an engine queue),
    # so a fixed 2 s (0.1 s of engine time at a time scale of 20) broke queued streams.
    stall = args.stall_s or timeout / 3
    return {
        "capacity_calls_per_s": round(capacity, 2), "rate_calls_per_s": round(rate, 2),
        "full_batch_call_s": round(call_s, 3), "client_timeout_s": round(timeout, 2),
        "stall_s": round(stall, 2),
    }  # fmt: skip


async def _admin(session: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with session.post(url + "/admin/faults", json=faults) as resp:
        await resp.read()


async def _scrape(session: aiohttp.ClientSession, url: str) -> list[float] | None:
    """The engine's (generated, prefilled) token counters; None while it is down."""
    try:
        async with asyncio.timeout(0.5), session.get(url + "/metrics") as resp:
            text = await resp.read()
    except (TimeoutError, aiohttp.ClientError):
        return None
    found = [0.0, 0.0]
    for line in text.splitlines():
        for i, name in enumerate(_COUNTERS):
            if line.startswith(name):
                found[i] += float(line.rsplit(b" ", 1)[1])
    return found


async def _sample(
    session: aiohttp.ClientSession, gw: Gateway, fleet: Fleet, result: Run, now: float
) -> None:
    """Queue depth, batch and KV use of every engine (as the gateway sees them), and their
    token counters (a restarted engine starts from zero: its increments are summed)."""
    views = [gw.tracker.view(e.name, gw.clock()) for e in fleet.engines]
    if gw.proxy is not None:
        result.slow_states.append((now, gw.proxy.reliability.breaker_state(views[0].name)))
    result.load_samples.append((now, [
        (v.load.num_waiting, v.load.num_running, v.load.kv_usage) for v in views
    ]))  # fmt: skip
    scraped = await asyncio.gather(*(_scrape(session, e.url) for e in fleet.engines))
    for engine, values in zip(fleet.engines, scraped, strict=True):
        if values is None:
            continue
        total = result.counters.setdefault(engine.name, [0.0, 0.0])
        last = result.last_seen.get(engine.name, [0.0, 0.0])
        for i, value in enumerate(values):
            total[i] += value - last[i] if value >= last[i] else value
        result.last_seen[engine.name] = values


def _watch_dispatches(gw: Gateway, result: Run, clock: Callable[[], float]) -> None:
    """Note every attempt the gateway sends (the tracker's acquire), with its time."""
    acquire = gw.tracker.acquire

    def counted(name: str) -> None:
        result.dispatches.append((clock(), name))
        acquire(name)

    gw.tracker.acquire = counted  # type: ignore[method-assign]


async def run(mode: str, args: argparse.Namespace, op: dict[str, float]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    _engine_size(args.max_num_seqs)
    _STATUSES.clear()
    rng = random.Random(args.seed)
    spec = EngineSpec(model=MODEL, gpu=GPU, count=8, time_scale=args.time_scale, seed=args.seed)
    async with Fleet([spec]) as fleet:
        names = [e.name for e in fleet.engines]  # the list is emptied when the fleet stops
        cfg = parse_config({
            "gateway": {"auth": {"mode": "anonymous"}, "log_requests": False,
                        "retries_before_first_byte": 2,
                        "timeouts": {"inter_token_s": op["stall_s"]}},
            "reliability": _reliability(mode),
            "admission": _admission(args),
            "endpoints": [e.endpoint_config() for e in fleet.engines],
        })  # fmt: skip
        gw = Gateway(cfg)
        runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        result = Run()
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:
            t0 = loop.time()
            _watch_dispatches(gw, result, lambda: loop.time() - t0)
            tasks: list[asyncio.Task[None]] = []
            slow_done = crash_done = False
            next_sample = next_call_s = 0.0
            while (now := loop.time() - t0) < args.duration_s:
                if not slow_done and now >= args.slow_at_s:
                    await _admin(session, fleet.engines[0].url, {"slowdown": 5.0})
                    slow_done = True
                if not crash_done and now >= args.crash_at_s:
                    await _sample(session, gw, fleet, result, now)  # counters before the crash
                    result.cut_by_crash = fleet.engines[1].server.driver.num_in_flight
                    await _admin(session, fleet.engines[1].url, {"restart": True})
                    crash_done = True
                if now >= next_sample:
                    tasks.append(asyncio.create_task(_sample(session, gw, fleet, result, now)))
                    next_sample += 1.0
                # Open loop on absolute times: every call that is due is sent now, so a
                # loop that lagged (a busy machine) still offers the same calls.
                while next_call_s <= min(now, args.duration_s):
                    rec = Record(loop.time(), critical=rng.random() < 0.5)
                    result.records.append(rec)
                    prompt = f"Session {rng.randrange(10**6)}: summarise the incident report."
                    tasks.append(asyncio.create_task(_call(
                        session, url, rec, args.max_tokens, prompt, op["client_timeout_s"], loop
                    )))  # fmt: skip
                    next_call_s += rng.expovariate(op["rate_calls_per_s"])
                wake_s = min(next_call_s, next_sample)
                await asyncio.sleep(max(0.0, wake_s - (loop.time() - t0)))
            await asyncio.gather(*tasks)
            await _sample(session, gw, fleet, result, loop.time() - t0)
        assert gw.proxy is not None
        counts = dict(gw.proxy.reliability.counts)
        await runner.cleanup()
    out = summary(mode, result, counts, t0, args, names)
    out["client_refusals"] = dict(_STATUSES)
    out["load_average_1m"] = round(os.getloadavg()[0], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--load", type=float, default=0.7, help="share of the fleet's capacity")
    parser.add_argument("--rate", type=float, default=0.0, help="calls/s (0: from --load)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--timeout-x", type=float, default=4.0)
    parser.add_argument("--client-timeout-s", type=float, default=0.0, help="0: --timeout-x")
    parser.add_argument("--stall-s", type=float, default=0.0, help="0: client timeout / 3")
    parser.add_argument("--slow-at-s", type=float, default=15.0)
    parser.add_argument("--crash-at-s", type=float, default=45.0)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default="on,off")
    parser.add_argument("--admission", default="fcfs", choices=["fcfs", "inferplane"])
    args = parser.parse_args()
    op = operating_point(args)
    print("operating point:", op)
    results = [asyncio.run(run(mode, args, op)) for mode in args.modes.split(",")]
    print(table(results))
    for r in results:
        print(f"[{r['mode']}] refusals seen by clients: {r['client_refusals']}; "
              f"load average (1 min) at the end: {r['load_average_1m']}")  # fmt: skip
    lines = [line for r in results if r["mode"] != "off" for line in targets(r)]
    print("\n" + "\n".join(lines))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = {"args": vars(args), "operating_point": op, "targets": lines, "results": results}
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
