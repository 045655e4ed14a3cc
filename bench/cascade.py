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
``--timeout-x`` (4) times a call's duration on a full healthy engine. The engines are
configured with a small ``max_num_seqs`` (``--max-num-seqs``, 16; vLLM's
``--max-num-seqs``): with the default 256 an H100 serves ~220 calls/s of this shape and
70% of eight of them is far beyond what one 2-core machine can stream through a Python
gateway and clients (at the old settings, 12 calls/s, the fleet ran at ~3% of capacity,
which is why nothing collapsed). A smaller batch keeps the knee and lets the rate be real.

* on: the fleet config's ``reliability`` defaults (outlier ejection, retry budget with
  back-off, stream resumption, hedging of critical calls);
* on-nohedge: the same without hedging (``--modes on,on-nohedge,off`` to compare);
* off: plain retries on the next endpoint before the first byte, no ejection, no budget,
  no resumption, no hedging.

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

    .venv/bin/python bench/cascade.py [--duration-s 90] [--load 0.7] [--time-scale 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from inferplane.config import parse_config
from inferplane.engine import profiles as engine_profiles
from inferplane.engine import server as engine_server
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import load_profile
from inferplane.gateway import priors as gateway_priors
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.priors import prior_from_profile

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
                    await resp.read()
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
    """The fleet config's ``reliability`` section: the defaults, no hedging, or all off."""
    if mode == "on":
        return {}
    if mode == "on-nohedge":
        return {"hedge": {"enabled": False}}
    return {"breaker": {"enabled": False}, "retry": {"enabled": False},
            "resumption": {"enabled": False}, "hedge": {"enabled": False}}  # fmt: skip


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
    return {
        "capacity_calls_per_s": round(capacity, 2), "rate_calls_per_s": round(rate, 2),
        "full_batch_call_s": round(call_s, 3), "client_timeout_s": round(timeout, 2),
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


async def run(mode: str, args: argparse.Namespace, op: dict[str, float]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    _engine_size(args.max_num_seqs)
    rng = random.Random(args.seed)
    spec = EngineSpec(model=MODEL, gpu=GPU, count=8, time_scale=args.time_scale, seed=args.seed)
    async with Fleet([spec]) as fleet:
        cfg = parse_config({
            "gateway": {"auth": {"mode": "anonymous"}, "log_requests": False,
                        "retries_before_first_byte": 2,
                        "timeouts": {"inter_token_s": args.stall_s}},
            "reliability": _reliability(mode),
            "endpoints": [e.endpoint_config() for e in fleet.engines],
        })  # fmt: skip
        gw = Gateway(cfg)
        runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        result = Run()
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:
            t0 = loop.time()
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
                rec = Record(loop.time(), critical=rng.random() < 0.5)
                result.records.append(rec)
                prompt = f"Session {rng.randrange(10**6)}: summarise the incident report."
                tasks.append(asyncio.create_task(
                    _call(session, url, rec, args.max_tokens, prompt, op["client_timeout_s"], loop)
                ))  # fmt: skip
                # open loop on absolute times: a lagging loop catches up, the rate holds
                next_call_s += rng.expovariate(op["rate_calls_per_s"])
                await asyncio.sleep(max(0.0, next_call_s - (loop.time() - t0)))
            await asyncio.gather(*tasks)
            await _sample(session, gw, fleet, result, loop.time() - t0)
        assert gw.proxy is not None
        counts = dict(gw.proxy.reliability.counts)
        await runner.cleanup()
    return _summary(mode, result, counts, t0, args, [e.name for e in fleet.engines])


def _windows(run_: Run, t0: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    recs, width, out = run_.records, args.window_s, []
    for start in range(0, int(args.duration_s), int(width)):
        lo, hi = t0 + start, t0 + start + width
        arrived = [r for r in recs if lo <= r.start_s < hi]
        done = [r for r in recs if r.ok and lo <= r.end_s < hi]
        retries = sum(r.client_retries for r in arrived)
        load = [d for t, d in run_.load_samples if start <= t < start + width]
        out.append({
            "t_s": start, "goodput_per_s": round(len(done) / width, 2),
            "p99_ttft_ms": _pct([r.ttft_s for r in arrived if r.ok], 0.99),
            "client_retries_share": round(retries / max(1, len(arrived)), 3),
            "max_queue_per_engine": [max(w for w, _, _ in col) for col in zip(*load, strict=True)]
            if load else [],
        })  # fmt: skip
    return out


def _waste(run_: Run, recs: list[Record], args: argparse.Namespace) -> dict[str, Any]:
    """Tokens the engines worked on beyond what the completed calls needed, in GPU-s."""
    generated = sum(c[0] for c in run_.counters.values())
    prefilled = sum(c[1] for c in run_.counters.values())
    completed = [r for r in recs if r.ok]
    needed_out = len(completed) * args.max_tokens
    prompt_tokens = prefilled / max(1, len(recs) + sum(r.client_retries for r in recs))
    wasted_out = max(0.0, generated - needed_out)
    wasted_in = max(0.0, prefilled - len(completed) * prompt_tokens)
    prior = prior_from_profile(load_profile(MODEL, GPU))  # real GPU time (time scale 1)
    running = [n for _, d in run_.load_samples for (_, n, _) in d if n > 0]
    batch = statistics.mean(running) if running else 1.0
    per_token_s = (prior.decode_base_s + prior.decode_per_seq_s * batch) / batch
    gpu_s = wasted_out * per_token_s + wasted_in / prior.prefill_tokens_per_s
    return {
        "engine_generated_tokens": round(generated), "needed_tokens": needed_out,
        "wasted_decode_tokens": round(wasted_out), "wasted_prefill_tokens": round(wasted_in),
        "mean_batch": round(batch, 2), "wasted_gpu_s": round(gpu_s, 3),
    }  # fmt: skip


def _saturated(run_: Run, names: list[str], skip: set[int]) -> list[str]:
    """Healthy engines that went past llm-d's saturation (waiting/5 or KV use/0.8 >= 1)."""
    out = []
    for i, name in enumerate(names):
        if i in skip:
            continue
        if any(max(d[i][0] / 5, d[i][2] / 0.8) >= 1.0 for _, d in run_.load_samples):
            out.append(name)
    return out


def _summary(
    mode: str, run_: Run, counts: dict[str, int], t0: float, args: argparse.Namespace,
    names: list[str],
) -> dict[str, Any]:  # fmt: skip
    recs = run_.records
    crit = [r for r in recs if r.critical]
    gateway_retries = counts.get("retry_replay", 0) + counts.get("retry_resume", 0)
    hedges = counts.get("hedges", 0)
    client_retries = sum(r.client_retries for r in recs)
    interrupted = [r for r in recs if r.interrupted]
    return {
        "mode": mode,
        "calls": len(recs),
        "completed": sum(r.ok for r in recs),
        "critical_success": round(sum(r.ok for r in crit) / max(1, len(crit)), 4),
        "critical_first_try": round(
            sum(r.ok and r.client_retries == 0 for r in crit) / max(1, len(crit)), 4
        ),
        "retries_share": round((client_retries + gateway_retries + hedges) / max(1, len(recs)), 4),
        "client_retries": client_retries,
        "client_timeouts": sum(r.client_timeouts for r in recs),
        "gateway_retries": gateway_retries,
        "hedges": hedges,
        "hedge_wins": counts.get("hedge_wins", 0),
        "streams_cut_by_crash": run_.cut_by_crash,
        "gateway_resumed_streams": counts.get("resumptions", 0),
        "client_interrupted_calls": len(interrupted),
        "interrupted_completed": sum(r.ok for r in interrupted),
        "completed_with_token_errors": sum(r.ok and not r.tokens_ok for r in recs),
        "tokens_lost": sum(r.lost_tokens for r in recs if r.ok),
        "tokens_duplicated": sum(r.duplicated_tokens for r in recs if r.ok),
        "wasted_client_tokens": sum(r.wasted_tokens for r in recs),
        "ejections": _ejections(counts),
        "healthy_engines_saturated": _saturated(run_, names, skip={0, 1}),
        "p50_ttft_ms": _pct([r.ttft_s for r in recs if r.ok], 0.5),
        "p99_ttft_ms": _pct([r.ttft_s for r in recs if r.ok], 0.99),
        **_waste(run_, recs, args),
        "windows": _windows(run_, t0, args),
        "gateway_counts": counts,
    }


def _ejections(counts: dict[str, int]) -> int:
    opened = ("consecutive_failures", "failure_rate", "latency_outlier", "probe_failed")
    return sum(counts.get(f"breaker_{trigger}", 0) for trigger in opened)


def _pct(values: list[float | None], q: float) -> int | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return round(vals[min(len(vals) - 1, int(q * len(vals)))] * 1000)


_KEYS = [
    "calls", "completed", "critical_success", "critical_first_try", "retries_share",
    "client_retries", "client_timeouts", "gateway_retries", "hedges", "hedge_wins",
    "streams_cut_by_crash", "gateway_resumed_streams", "client_interrupted_calls",
    "interrupted_completed", "completed_with_token_errors", "tokens_lost", "tokens_duplicated",
    "wasted_client_tokens", "engine_generated_tokens", "wasted_decode_tokens",
    "wasted_prefill_tokens", "wasted_gpu_s", "ejections", "healthy_engines_saturated",
    "p50_ttft_ms", "p99_ttft_ms",
]  # fmt: skip


def _table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'metric':28s}" + "".join(f"{r['mode']:>14s}" for r in results)]
    for key in _KEYS:
        cells = [len(r[key]) if isinstance(r[key], list) else r[key] for r in results]
        lines.append(f"{key:28s}" + "".join(f"{c!s:>14s}" for c in cells))
    for r in results:
        lines += ["", f"[{r['mode']}] window  goodput/s  p99 TTFT ms  retries  max queue e0..e7"]
        for w in r["windows"]:
            queue = " ".join(f"{q:>2}" for q in w["max_queue_per_engine"])
            lines.append(
                f"      t={w['t_s']:>3}s {w['goodput_per_s']:>9} {w['p99_ttft_ms']!s:>12}"
                f" {w['client_retries_share']:>8}  {queue}"
            )
    return "\n".join(lines)


def targets(r: dict[str, Any]) -> list[str]:
    """One PASS/MISS line per issue-6 target for run ``r``."""
    healthy_sat = r["healthy_engines_saturated"]
    streams_ok = (
        r["client_interrupted_calls"] == r["interrupted_completed"]
        and r["tokens_lost"] == 0 and r["tokens_duplicated"] == 0
        and r["completed_with_token_errors"] == 0
    )  # fmt: skip
    rows = [
        (r["critical_success"] >= 0.99,
         f"critical task success {r['critical_success']:.2%} >= 99%"),
        (r["retries_share"] <= 0.10,
         f"retries (client + gateway + hedges) {r['retries_share']:.1%} of calls <= 10%"),
        (not healthy_sat, f"healthy engines past saturation: {healthy_sat or 'none'}"),
        (streams_ok,
         f"interrupted streams completed: {r['streams_cut_by_crash']} cut by the crash, "
         f"{r['gateway_resumed_streams']} resumed by the gateway, clients saw "
         f"{r['client_interrupted_calls']} break(s), {r['interrupted_completed']} of them "
         f"completed; tokens lost {r['tokens_lost']}, duplicated {r['tokens_duplicated']}"),
    ]  # fmt: skip
    return [f"[{r['mode']}] {'PASS' if ok else 'MISS'}  {text}" for ok, text in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--load", type=float, default=0.7, help="share of the fleet's capacity")
    parser.add_argument("--rate", type=float, default=0.0, help="calls/s (0: from --load)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--timeout-x", type=float, default=4.0)
    parser.add_argument("--client-timeout-s", type=float, default=0.0, help="0: --timeout-x")
    parser.add_argument("--stall-s", type=float, default=2.0)
    parser.add_argument("--slow-at-s", type=float, default=15.0)
    parser.add_argument("--crash-at-s", type=float, default=45.0)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default="on,off")
    args = parser.parse_args()
    op = operating_point(args)
    print("operating point:", op)
    results = [asyncio.run(run(mode, args, op)) for mode in args.modes.split(",")]
    print(_table(results))
    lines = [line for r in results if r["mode"] != "off" for line in targets(r)]
    print("\n" + "\n".join(lines))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = {"args": vars(args), "operating_point": op, "targets": lines, "results": results}
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
