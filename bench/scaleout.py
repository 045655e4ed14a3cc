"""Scale-out: gateway throughput with 1, 2 and 4 worker processes, and what a quota check
costs in Redis over in memory.

Throughput: the fast backend and the closed-loop load generator of
``bench/gateway_overhead.py`` (separate processes), and ``inferplane.gateway.workers`` with N
workers on one port (SO_REUSEPORT). Non-streaming requests/s, median over rounds, and the
scaling against one worker measured in the same round. On a 2-core machine the backend and
the load generator share the cores with the workers, so scaling stops at the core count:
the number to read is whether N workers use the cores one process cannot.

Quota check: sequential ``take`` of a tenant's requests/min and tokens/min buckets (one
atomic call), in memory, in Redis (the Lua script, 127.0.0.1:6379) and in Redis through the
resilient wrapper; p50 and p99 per call, and the added p50 over memory (target < 1 ms).
Results go to bench/results/scaleout.json.

    python bench/scaleout.py [--rounds 3] [--duration-s 4] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import gateway_overhead as go  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scaleout.json"


def _start_workers(backend_port: int, workers: int) -> tuple[subprocess.Popen[bytes], int]:
    port = go._free_port()
    cfg = Path(tempfile.mkdtemp()) / "fleet.yaml"
    cfg.write_text(
        "gateway: {log_requests: false, scrape_interval_s: 0.1}\n"
        "endpoints:\n"
        f"  - {{name: b0, url: 'http://127.0.0.1:{backend_port}', kind: openai, gpu: h100,"
        " price_per_hour_usd: 2.0, models: [m]}\n"
    )
    cmd = [sys.executable, "-m", "inferplane.gateway.workers", "-c", str(cfg), "--workers",
           str(workers), "--port", str(port), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    go._wait_http(f"http://127.0.0.1:{port}/ready")
    time.sleep(0.5 * workers)  # let every worker see the endpoint ready
    return proc, port


def throughput(args: argparse.Namespace, counts: list[int]) -> list[dict[str, float]]:
    backend_port = go._free_port()
    backend = subprocess.Popen([sys.executable, go.__file__, "--role", "backend",
                                "--port", str(backend_port)])  # fmt: skip
    rounds: list[dict[str, float]] = []
    try:
        go._wait_http(f"http://127.0.0.1:{backend_port}/health")
        for _ in range(args.rounds):
            row: dict[str, float] = {}
            for n in counts:
                proc, port = _start_workers(backend_port, n)
                try:
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    res = go._run_load(url, "closed", False, args, 0.0)
                    row[f"rps_{n}"] = res["rps"]
                    row[f"errors_{n}"] = res["errors"]
                finally:
                    proc.terminate()
                    proc.wait(30)
            rounds.append(row)
    finally:
        backend.terminate()
        backend.wait(10)
    return rounds


async def quota_latency(num_calls: int) -> dict[str, dict[str, float]]:
    from inferplane.core.state import BucketSpec, BucketTake, StateStore
    from inferplane.state.memory import MemoryStore
    from inferplane.state.redis import RedisStore
    from inferplane.state.resilient import ResilientStore

    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    redis_store = RedisStore(prefix=prefix, op_timeout_s=1.0)
    resilient = ResilientStore(RedisStore(prefix=prefix, op_timeout_s=1.0), op_timeout_s=1.0)
    takes = [BucketTake(BucketSpec("q:tenant:t:rpm", 1e12, 1e10), 1.0),
             BucketTake(BucketSpec("q:tenant:t:tpm", 1e12, 1e10), 300.0)]  # fmt: skip
    stores: dict[str, StateStore] = {
        "memory": MemoryStore(), "redis": redis_store, "redis_resilient": resilient,
    }  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for name, store in stores.items():
        for _ in range(200):  # warm-up: connection, script load
            await store.take(takes, time.time())
        lat: list[float] = []
        for _ in range(num_calls):
            t0 = time.perf_counter()
            await store.take(takes, time.time())
            lat.append(time.perf_counter() - t0)
        lat.sort()
        out[name] = {"p50_us": 1e6 * lat[len(lat) // 2], "p99_us": 1e6 * lat[int(len(lat) * 0.99)]}
    await redis_store.clear()
    await redis_store.close()
    await resilient.close()
    return out


def report(rounds: list[dict[str, float]], counts: list[int],
           quota: dict[str, dict[str, float]]) -> dict[str, Any]:  # fmt: skip
    base = [r["rps_1"] for r in rounds]
    print(f"\nGateway throughput, non-streaming, closed loop ({len(rounds)} rounds, median)")
    print("| workers | requests/s | vs 1 worker | errors |")
    print("|---:|---:|---:|---:|")
    summary: dict[str, Any] = {"throughput": {}, "quota_check": quota}
    for n in counts:
        rps = statistics.median(r[f"rps_{n}"] for r in rounds)
        ratio = statistics.median(r[f"rps_{n}"] / b for r, b in zip(rounds, base, strict=True))
        errors = sum(r[f"errors_{n}"] for r in rounds)
        summary["throughput"][n] = {"rps": rps, "vs_1": ratio, "errors": errors}
        print(f"| {n} | {rps:,.0f} | {ratio:.2f}x | {errors:.0f} |")
    mem_p50 = quota["memory"]["p50_us"]
    print("\nQuota check (tenant requests/min + tokens/min, one atomic take), per call")
    print("| store | p50 (us) | p99 (us) | added p50 over memory (us) |")
    print("|---|---:|---:|---:|")
    for name, q in quota.items():
        print(f"| {name} | {q['p50_us']:.1f} | {q['p99_us']:.1f} | {q['p50_us'] - mem_p50:.1f} |")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--quota-calls", type=int, default=5000)
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    quota = asyncio.run(quota_latency(args.quota_calls))
    rounds = throughput(args, counts)
    summary = report(rounds, counts, quota)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
