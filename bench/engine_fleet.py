"""Benchmark: 16 emulated 8B/H100 engines in one process, saturated with streams.

The engines run in this process on one (uv)loop, exactly as ``inferplane up`` and the
tests run them. The load generator runs in a SEPARATE process (so it does not steal the
engines' loop): aiohttp, many concurrent closed-loop streaming /v1/completions calls
per engine, counting the token chunks it receives.

For each time scale it reports:
* streamed tok/s: token chunks the clients received per second, in the window;
* engine tok/s: tokens the engine models generated per second (from their counters);
* lag %: per engine, the total lateness of the driver's wake-ups (loop time minus the
  model's scheduled event time) over the window, as a share of the window; mean and max
  over the engines. The model keeps its own timeline (steps run back to back), so lag
  is how late tokens leave the engine compared to when the modelled GPU made them;
* mean / max lateness of a due wake-up in ms, and the engine process's CPU use.

Target (issue 2): lag under 5% for 16 saturated engines at time scale 10.

    .venv/bin/python bench/engine_fleet.py [--engines 16] [--streams-per-engine 64]
        [--duration-s 20] [--warmup-model-s 2] [--scales 1,10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from inferplane.engine.fleet import EngineSpec, Fleet, new_event_loop

RESULTS = Path(__file__).parent / "results" / "engine-fleet.json"
MODEL = "llama-3-8b"
_TOKEN_MARK = b'"finish_reason":null'  # every token chunk has it, the final chunk not


@dataclass(frozen=True, slots=True)
class Row:
    time_scale: float
    engines: int
    streams: int
    window_s: float
    streamed_tok_s: float
    engine_tok_s: float
    lag_pct_mean: float
    lag_pct_max: float
    lateness_mean_ms: float
    lateness_max_ms: float
    engine_cpu_pct: float
    requests_done: int
    probe_lag_pct: float  # idle timers in a third process: the machine's scheduling noise
    tokens_per_cpu_s: float  # engine tokens per CPU-second of the engine process
    load_avg_1m: float


# -- load generator (child process) -------------------------------------------------------


async def _stream_loop(
    session: aiohttp.ClientSession, url: str, seed: int, stop_at: float, counts: dict[str, Any]
) -> None:
    shared = " ".join(f"ctx{i}" for i in range(150))
    rng = random.Random(seed)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        body = {
            "model": MODEL,
            "prompt": f"{shared} user {seed} turn {n} " * 2,
            "max_tokens": rng.randint(32, 256),
            "ignore_eos": True,
            "stream": True,
        }
        try:
            async with session.post(url + "/v1/completions", json=body) as resp:
                tail = b""
                async for data in resp.content.iter_any():  # one wake-up per read, not per line
                    buf = tail + data
                    tail = buf[1 - len(_TOKEN_MARK) :]  # too short to hold a whole mark
                    now = time.monotonic()
                    if counts["start"] <= now < counts["end"]:
                        counts["tokens"] += buf.count(_TOKEN_MARK)
                    if now >= stop_at:
                        return
            counts["done"] += 1
        except (TimeoutError, aiohttp.ClientError):
            counts["errors"] += 1
            await asyncio.sleep(0.05)


async def _load(urls: list[str], streams: int, start: float, end: float) -> dict[str, Any]:
    counts: dict[str, Any] = {"start": start, "end": end, "tokens": 0, "done": 0, "errors": 0}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loops = [
            _stream_loop(session, url, i * 1000 + j, end + 0.5, counts)
            for i, url in enumerate(urls)
            for j in range(streams)
        ]
        await asyncio.gather(*loops)
    return counts


def _load_process(
    urls: list[str], streams: int, warmup_s: float, window_s: float, out: Any
) -> None:
    """Starts the load, measures the window after ``warmup_s``, puts the counts in ``out``.

    The load runs at a lower CPU priority (nice 10): on a small shared machine it must
    not take the engines' core, only what they leave.
    """
    os.nice(10)
    loop = new_event_loop()
    start = time.monotonic() + warmup_s
    out.put(("window", start, start + window_s))
    try:
        out.put(loop.run_until_complete(_load(urls, streams, start, start + window_s)))
    finally:
        loop.close()


async def _probe(start: float, end: float, timers: int = 16, period_s: float = 0.1) -> float:
    """Mean lag % of idle timers over the window: the machine's own scheduling noise."""
    loop = asyncio.get_running_loop()
    lateness = [0.0] * timers

    async def tick(i: int) -> None:
        due = loop.time() + period_s * (1 + i / timers)
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            if time.monotonic() >= end:
                return
            if time.monotonic() >= start:
                lateness[i] += now - due
            due = now + period_s

    await asyncio.gather(*(tick(i) for i in range(timers)))
    return 100 * sum(lateness) / timers / (end - start)


def _probe_process(start: float, end: float, out: Any) -> None:
    loop = new_event_loop()
    try:
        out.put(loop.run_until_complete(_probe(start, end)))
    finally:
        loop.close()


# -- engines (this process) ---------------------------------------------------------------


def _snapshot(fleet: Fleet) -> tuple[list[float], list[int], list[int], int, float]:
    lateness = [e.server.driver.total_lateness_s for e in fleet.engines]
    wakeups = [e.server.driver.num_due_wakeups for e in fleet.engines]
    tokens = [e.server.model.stats().generation_tokens_total for e in fleet.engines]
    return lateness, wakeups, tokens, sum(tokens), time.process_time()


async def run_scale(time_scale: float, args: argparse.Namespace) -> Row:
    spec = EngineSpec(count=args.engines, time_scale=time_scale)
    async with Fleet([spec]) as fleet:
        warmup_s = args.warmup_model_s * time_scale
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        load_args = (fleet.urls, args.streams_per_engine, warmup_s, args.duration_s, out)
        proc = ctx.Process(target=_load_process, args=load_args)
        proc.start()
        loop = asyncio.get_running_loop()
        _, start, end = await loop.run_in_executor(None, out.get)
        probe_out = ctx.Queue()
        probe = ctx.Process(target=_probe_process, args=(start, end, probe_out))
        probe.start()
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        late0, wake0, _, tok0, cpu0 = _snapshot(fleet)
        for engine in fleet.engines:
            engine.server.driver.max_lateness_s = 0.0
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        late1, wake1, _, tok1, cpu1 = _snapshot(fleet)
        window = args.duration_s
        max_late = max(e.server.driver.max_lateness_s for e in fleet.engines)
        counts = await loop.run_in_executor(None, out.get)
        await loop.run_in_executor(None, proc.join)
        probe_lag_pct = await loop.run_in_executor(None, probe_out.get)
        await loop.run_in_executor(None, probe.join)
    lags = [(b - a) / window for a, b in zip(late0, late1, strict=True)]
    wakes = sum(b - a for a, b in zip(wake0, wake1, strict=True))
    return Row(
        time_scale=time_scale,
        engines=args.engines,
        streams=args.engines * args.streams_per_engine,
        window_s=window,
        streamed_tok_s=counts["tokens"] / window,
        engine_tok_s=(tok1 - tok0) / window,
        lag_pct_mean=100 * sum(lags) / len(lags),
        lag_pct_max=100 * max(lags),
        lateness_mean_ms=1000
        * sum(b - a for a, b in zip(late0, late1, strict=True))
        / max(wakes, 1),
        lateness_max_ms=1000 * max_late,
        engine_cpu_pct=100 * (cpu1 - cpu0) / window,
        requests_done=counts["done"],
        probe_lag_pct=probe_lag_pct,
        tokens_per_cpu_s=(tok1 - tok0) / max(cpu1 - cpu0, 1e-9),
        load_avg_1m=os.getloadavg()[0],
    )


def _print(rows: list[Row]) -> None:
    header = (
        f"{'scale':>5} {'engines':>7} {'streams':>7} {'streamed tok/s':>14} {'engine tok/s':>12} "
        f"{'lag % mean':>10} {'lag % max':>9} {'late ms mean':>12} {'late ms max':>11} "
        f"{'cpu %':>6} {'tok/cpu-s':>9} {'done':>6} {'probe lag %':>11} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.time_scale:>5g} {r.engines:>7} {r.streams:>7} {r.streamed_tok_s:>14,.0f} "
            f"{r.engine_tok_s:>12,.0f} {r.lag_pct_mean:>10.2f} {r.lag_pct_max:>9.2f} "
            f"{r.lateness_mean_ms:>12.2f} {r.lateness_max_ms:>11.1f} {r.engine_cpu_pct:>6.0f} "
            f"{r.tokens_per_cpu_s:>9,.0f} {r.requests_done:>6} {r.probe_lag_pct:>11.2f} "
            f"{r.load_avg_1m:>5.1f}"
        )


async def main_async(args: argparse.Namespace) -> list[Row]:
    rows = []
    for scale in args.scales:
        rows.append(await run_scale(scale, args))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=int, default=16)
    parser.add_argument("--streams-per-engine", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--warmup-model-s", type=float, default=2.0,
                        help="warm-up before the window, model seconds (x time scale)")  # fmt: skip
    parser.add_argument("--scales", default="1,10")
    args = parser.parse_args()
    args.scales = [float(s) for s in args.scales.split(",")]
    loop = new_event_loop()
    try:
        rows = loop.run_until_complete(main_async(args))
    finally:
        loop.close()
    _print(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "engine_fleet",
        "cpus": os.cpu_count(),
        "target": "lag under 5% for 16 saturated engines at time scale 10",
        "rows": [asdict(r) for r in rows],
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
