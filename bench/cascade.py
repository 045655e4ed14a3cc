"""Benchmark: a failure cascade on the emulated fleet, reliability features on vs off.

Eight emulated engines, one gateway and open-loop streaming clients run in this process.
Clients behave like naive SDKs: a call that errors, breaks, or takes longer than the client
timeout is retried from scratch, up to 3 times. Half the calls are critical. Scenario (same
seed both runs): at ``--slow-at-s`` one engine slows down 5x; at ``--crash-at-s`` a second
one crashes (every stream on it is cut) and restarts cold.

* on: outlier ejection, retry budget with back-off, stream resumption (the defaults);
* off: plain retries on the next endpoint before the first byte, no ejection, no budget,
  no resumption.

Reported per window: goodput (calls completed per second), p99 client-observed TTFT,
retries (client + gateway) as a share of calls, and the queue depth (waiting requests) of
each engine; at the end: calls and critical calls completed, interrupted streams, streams
with lost or repeated tokens (token chunks received != max_tokens, or usage disagreeing),
and wasted work (tokens generated then thrown away by client retries, plus prefill
recomputed by resumptions). Results go to bench/results/cascade.json.

    .venv/bin/python bench/cascade.py [--duration-s 40] [--rate 12] [--time-scale 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from inferplane.config import parse_config
from inferplane.engine.fleet import EngineSpec, Fleet
from inferplane.gateway.app import Gateway, start_server
from inferplane.gateway.proxy import Proxy
from inferplane.gateway.reliability_config import (
    BreakerSection,
    ReliabilityConfig,
    ResumptionSection,
    RetrySection,
)

MODEL = "llama-3-8b"
RESULTS = Path(__file__).parent / "results" / "cascade.json"


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
    interrupted: bool = False  # some try saw a broken or error-ended stream
    wasted_tokens: int = 0  # tokens received by tries that were then retried


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    queue_samples: list[tuple[float, list[int]]] = field(default_factory=list)


async def _one_try(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
    timeout_s: float, t0: float, loop: asyncio.AbstractEventLoop,
) -> tuple[bool, float | None, int, int | None, bool]:  # fmt: skip
    """(ok, ttft, token chunks, usage completion tokens, broken)."""
    chunks, usage, first, broken = 0, None, None, False
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    return False, None, 0, None, False
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
                return done and not broken, first, chunks, usage, broken or not done
    except (TimeoutError, aiohttp.ClientError):
        return False, first, chunks, usage, chunks > 0


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
        ok, ttft, chunks, usage, broken = await _one_try(
            session, url, body, headers, timeout_s, rec.start_s, loop
        )
        rec.interrupted |= broken
        if ok:
            rec.ok, rec.ttft_s, rec.end_s = True, ttft, loop.time()
            rec.tokens_ok = chunks == max_tokens and usage in (None, max_tokens)
            return
        rec.wasted_tokens += chunks
        if attempt < 3:
            rec.client_retries += 1
    rec.end_s = loop.time()


def _configs(mode: str) -> ReliabilityConfig:
    if mode == "on":
        return ReliabilityConfig(breaker=BreakerSection(base_ejection_s=10.0))
    return ReliabilityConfig(
        breaker=BreakerSection(enabled=False),
        retry=RetrySection(enabled=False),
        resumption=ResumptionSection(enabled=False),
    )


async def _admin(session: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with session.post(url + "/admin/faults", json=faults) as resp:
        await resp.read()


async def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    rng = random.Random(args.seed)
    spec = EngineSpec(model=MODEL, count=8, time_scale=args.time_scale, seed=args.seed)
    async with Fleet([spec]) as fleet:
        cfg = parse_config({
            "gateway": {"auth": {"mode": "anonymous"}, "log_requests": False,
                        "retries_before_first_byte": 2,
                        "timeouts": {"inter_token_s": args.stall_s}},
            "endpoints": [e.endpoint_config() for e in fleet.engines],
        })  # fmt: skip
        gw = Gateway(cfg)
        runner, port = await start_server(gw.build_app(), "127.0.0.1", 0)
        assert gw.session is not None
        gw.proxy = Proxy(
            gw.session, gw.tracker, cfg.gateway.timeouts, 2, gw.clock,
            reliability=_configs(mode), predictor=gw.router.predictor,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        result = Run()
        names = [e.name for e in fleet.engines]
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:
            t0 = loop.time()
            tasks: list[asyncio.Task[None]] = []
            slow_done = crash_done = False
            next_sample = 0.0
            while (now := loop.time() - t0) < args.duration_s:
                if not slow_done and now >= args.slow_at_s:
                    await _admin(session, fleet.engines[0].url, {"slowdown": 5.0})
                    slow_done = True
                if not crash_done and now >= args.crash_at_s:
                    await _admin(session, fleet.engines[1].url, {"restart": True})
                    crash_done = True
                if now >= next_sample:
                    depth = [gw.tracker.view(n, gw.clock()).load.num_waiting for n in names]
                    result.queue_samples.append((now, depth))
                    next_sample += 1.0
                rec = Record(loop.time(), critical=rng.random() < 0.5)
                result.records.append(rec)
                prompt = f"Session {rng.randrange(10**6)}: summarise the incident report."
                tasks.append(asyncio.create_task(
                    _call(session, url, rec, args.max_tokens, prompt, args.client_timeout_s, loop)
                ))  # fmt: skip
                await asyncio.sleep(rng.expovariate(args.rate))
            await asyncio.gather(*tasks)
        counts = dict(gw.proxy.reliability.counts)
        await runner.cleanup()
    return _summary(mode, result, counts, t0, args)


def _summary(
    mode: str, run_: Run, counts: dict[str, int], t0: float, args: argparse.Namespace
) -> dict[str, Any]:
    recs = run_.records
    windows = []
    width = args.window_s
    for start in range(0, int(args.duration_s), int(width)):
        lo, hi = t0 + start, t0 + start + width
        arrived = [r for r in recs if lo <= r.start_s < hi]
        done = [r for r in recs if r.ok and lo <= r.end_s < hi]
        ttfts = sorted(r.ttft_s for r in arrived if r.ok and r.ttft_s is not None)
        p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None
        retries = sum(r.client_retries for r in arrived)
        depth = [d for t, d in run_.queue_samples if start <= t < start + width]
        windows.append({
            "t_s": start, "goodput_per_s": round(len(done) / width, 2),
            "p99_ttft_ms": None if p99 is None else round(p99 * 1000),
            "client_retries_share": round(retries / max(1, len(arrived)), 3),
            "max_queue_per_engine": [max(col) for col in zip(*depth, strict=True)] if depth else [],
        })  # fmt: skip
    crit = [r for r in recs if r.critical]
    gateway_retries = counts.get("retry_replay", 0) + counts.get("retry_resume", 0)
    client_retries = sum(r.client_retries for r in recs)
    return {
        "mode": mode,
        "calls": len(recs),
        "completed": sum(r.ok for r in recs),
        "critical_success": round(sum(r.ok for r in crit) / max(1, len(crit)), 4),
        "retries_share": round((client_retries + gateway_retries) / max(1, len(recs)), 4),
        "client_retries": client_retries,
        "gateway_retries": gateway_retries,
        "resumptions": counts.get("resumptions", 0),
        "interrupted_calls": sum(r.interrupted for r in recs),
        "completed_with_token_errors": sum(r.ok and not r.tokens_ok for r in recs),
        "wasted_client_tokens": sum(r.wasted_tokens for r in recs),
        "ejections": _ejections(counts),
        "p50_ttft_ms": _pct([r.ttft_s for r in recs if r.ok and r.ttft_s], 0.5),
        "p99_ttft_ms": _pct([r.ttft_s for r in recs if r.ok and r.ttft_s], 0.99),
        "windows": windows,
        "gateway_counts": counts,
    }


def _ejections(counts: dict[str, int]) -> int:
    opened = ("consecutive_failures", "failure_rate", "latency_outlier", "probe_failed")
    return sum(counts.get(f"breaker_{trigger}", 0) for trigger in opened)


def _pct(values: list[float | None], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return round(vals[min(len(vals) - 1, int(q * len(vals)))] * 1000)


def _table(results: list[dict[str, Any]]) -> str:
    keys = ["calls", "completed", "critical_success", "retries_share", "client_retries",
            "gateway_retries", "resumptions", "interrupted_calls", "completed_with_token_errors",
            "wasted_client_tokens", "ejections", "p50_ttft_ms", "p99_ttft_ms"]  # fmt: skip
    lines = [f"{'metric':30s}" + "".join(f"{r['mode']:>12s}" for r in results)]
    for key in keys:
        lines.append(f"{key:30s}" + "".join(f"{r[key]!s:>12s}" for r in results))
    lines.append("")
    lines.append("per window: goodput/s | p99 TTFT ms | client retries share (on / off)")
    for w_on, w_off in zip(results[0]["windows"], results[-1]["windows"], strict=True):
        lines.append(
            f"t={w_on['t_s']:>3}s  {w_on['goodput_per_s']:>6} / {w_off['goodput_per_s']:<6}"
            f" {w_on['p99_ttft_ms']!s:>6} / {w_off['p99_ttft_ms']!s:<6}"
            f" {w_on['client_retries_share']:>6} / {w_off['client_retries_share']}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=12.0, help="calls per second")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--client-timeout-s", type=float, default=6.0)
    parser.add_argument("--stall-s", type=float, default=2.0)
    parser.add_argument("--slow-at-s", type=float, default=8.0)
    parser.add_argument("--crash-at-s", type=float, default=20.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results = [asyncio.run(run(mode, args)) for mode in ("on", "off")]
    print(_table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
