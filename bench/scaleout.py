"""Scale-out: gateway throughput with 1, 2 and 4 worker processes, and what a quota check
costs in Redis over in memory.

Throughput: the fast backend and the closed-loop load generator of
``bench/gateway_overhead.py`` (separate processes), and ``inferplane.gateway.workers`` with N
workers on one port (SO_REUSEPORT). Non-streaming requests/s, median over rounds, and the
scaling against one worker measured in the same round. On a 2-core machine the backend and
the load generator share the cores with the workers, so scaling stops at the core count:
the number to read is whether N workers use the cores one process cannot.

Quota check: sequential ``take`` of a tenant's requests/min and tokens/min buckets (one
atomic call), in memory, in Redis (the Lua script, 127.0.0.1:6379, through the store's own
RESP client) and in Redis through the resilient wrapper; p50 and p99 per call, the added
p50 over memory, and client CPU per call. Baseline in the same run: the same script through
redis-py's asyncio client (what the store used before its own client).

Per request through the gateway (the issue's target: Redis adds < 1 ms p50 on loopback):
two one-worker gateways in front of the same fast backend, both with a tenant quota, one
with ``state: memory`` and one with ``state: redis``; sequential calls (one at a time, so
latency is the gateway's path, not queueing), alternating between the two in short
batches within each round, plain calls and workflow calls (a workflow new to the gateway:
the shared record is read before admission and the ledger delta sent after). Added p50 =
Redis p50 - memory p50 of the same round; the table shows the median over rounds.
Results go to bench/results/scaleout.json.

    python bench/scaleout.py [--rounds 3] [--duration-s 4] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import gateway_overhead as go  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scaleout.json"


def _start_workers(
    backend_port: int, workers: int, extra: str = ""
) -> tuple[subprocess.Popen[bytes], int]:
    port = go._free_port()
    cfg = Path(tempfile.mkdtemp()) / "fleet.yaml"
    cfg.write_text(
        "gateway: {log_requests: false, scrape_interval_s: 0.1}\n"
        "endpoints:\n"
        f"  - {{name: b0, url: 'http://127.0.0.1:{backend_port}', kind: openai, gpu: h100,"
        " price_per_hour_usd: 2.0, models: [m]}\n" + extra
    )
    cmd = [sys.executable, "-m", "inferplane.gateway.workers", "-c", str(cfg), "--workers",
           str(workers), "--port", str(port), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        go._wait_http(f"http://127.0.0.1:{port}/ready", timeout_s=180.0)
    except RuntimeError:
        proc.terminate()
        proc.wait(30)
        raise
    time.sleep(0.5 * workers)  # let every worker see the endpoint ready
    return proc, port


def _start_single(backend_port: int, extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """One gateway process (``inferplane serve``): its pid is the gateway, for CPU time."""
    port = go._free_port()
    cfg = Path(tempfile.mkdtemp()) / "fleet.yaml"
    cfg.write_text(
        "gateway: {log_requests: false, scrape_interval_s: 0.1}\n"
        "endpoints:\n"
        f"  - {{name: b0, url: 'http://127.0.0.1:{backend_port}', kind: openai, gpu: h100,"
        " price_per_hour_usd: 2.0, models: [m]}\n" + extra
    )
    cmd = [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(cfg), "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        go._wait_http(f"http://127.0.0.1:{port}/ready", timeout_s=180.0)
    except RuntimeError:
        proc.terminate()
        proc.wait(30)
        raise
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


class _RedisPyTake:
    """Baseline: the store's take script through redis-py's asyncio client."""

    def __init__(self, prefix: str) -> None:
        import redis.asyncio as aioredis

        from inferplane.state.redis import _TAKE

        self.prefix = prefix
        self.client = aioredis.Redis(socket_timeout=1.0)
        self.script = self.client.register_script(_TAKE)

    async def take(self, takes: list[Any], now: float) -> Any:
        keys = [self.prefix + "b:" + t.bucket.key for t in takes]
        args = [repr(now), "1"]
        for t in takes:
            b = t.bucket
            args += [repr(float(b.capacity)), repr(float(b.refill_per_s)), repr(float(t.amount))]
        return await self.script(keys=keys, args=args)


async def quota_latency(num_calls: int) -> dict[str, dict[str, float]]:
    from inferplane.core.state import BucketSpec, BucketTake
    from inferplane.state.memory import MemoryStore
    from inferplane.state.redis import RedisStore
    from inferplane.state.resilient import ResilientStore

    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    redis_store = RedisStore(prefix=prefix, op_timeout_s=1.0)
    resilient = ResilientStore(RedisStore(prefix=prefix, op_timeout_s=1.0), op_timeout_s=1.0)
    baseline = _RedisPyTake(prefix)
    takes = [BucketTake(BucketSpec("q:tenant:t:rpm", 1e12, 1e10), 1.0),
             BucketTake(BucketSpec("q:tenant:t:tpm", 1e12, 1e10), 300.0)]  # fmt: skip
    stores: dict[str, Any] = {
        "memory": MemoryStore(), "redis": redis_store, "redis_resilient": resilient,
        "redis_py_baseline": baseline,
    }  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for name, store in stores.items():
        for _ in range(200):  # warm-up: connection, script load
            await store.take(takes, time.time())
        lat: list[float] = []
        cpu0 = time.process_time()
        for _ in range(num_calls):
            t0 = time.perf_counter()
            await store.take(takes, time.time())
            lat.append(time.perf_counter() - t0)
        cpu_us = 1e6 * (time.process_time() - cpu0) / num_calls
        lat.sort()
        out[name] = {"p50_us": 1e6 * lat[len(lat) // 2], "p99_us": 1e6 * lat[int(len(lat) * 0.99)],
                     "cpu_us": cpu_us}  # fmt: skip
    await redis_store.clear()
    await redis_store.close()
    await resilient.close()
    await baseline.client.aclose()
    return out


_QUOTA_YAML = (
    "admission: {quotas: {default_tenant: {requests_per_min: 1.0e9, tokens_per_min: 1.0e12}}}\n"
)
_BATCHES = 10


async def _sequential(url: str, num_calls: int, workflow: bool, tag: str) -> list[float]:
    """Latency of ``num_calls`` calls made one after another (after 5 unmeasured)."""
    import aiohttp

    lat: list[float] = []
    async with aiohttp.ClientSession() as session:
        for i in range(-5, num_calls):
            headers = {"Content-Type": "application/json"}
            if workflow:  # step 5 of a workflow this gateway has not seen: a shared read
                headers.update({"X-Workflow-Id": f"{tag}-{i}", "X-Workflow-Step": "5",
                                "X-Workflow-Steps": "10"})  # fmt: skip
            t0 = time.perf_counter()
            async with session.post(url, data=go.BODY, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status} from {url}")
            if i >= 0:
                lat.append(time.perf_counter() - t0)
    return lat


def _pct(lat: list[float], q: float) -> float:
    lat = sorted(lat)
    return 1e6 * lat[min(len(lat) - 1, int(len(lat) * q))]


def request_latency(args: argparse.Namespace) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Sequential calls through a memory-state and a Redis-state gateway, interleaved."""
    import redis

    backend_port = go._free_port()
    backend = subprocess.Popen([sys.executable, go.__file__, "--role", "backend",
                                "--port", str(backend_port)])  # fmt: skip
    prefix = f"bench:scaleout:{uuid.uuid4().hex[:8]}:"
    redis_yaml = f"state: {{backend: redis, key_prefix: '{prefix}', op_timeout_s: 0.5}}\n"
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    rounds: list[dict[str, float]] = []
    check: dict[str, Any] = {}
    per_batch = max(1, args.latency_calls // _BATCHES)
    try:
        go._wait_http(f"http://127.0.0.1:{backend_port}/health")
        procs["memory"] = _start_single(backend_port, _QUOTA_YAML)
        procs["redis"] = _start_single(backend_port, _QUOTA_YAML + redis_yaml)
        redis_pid = int(redis.Redis().info("server")["process_id"])
        urls = {k: f"http://127.0.0.1:{port}/v1/chat/completions" for k, (_, port) in procs.items()}
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for kind in ("plain", "workflow"):
                lat: dict[str, list[float]] = {"memory": [], "redis": []}
                cpu = {"memory": 0.0, "redis": 0.0, "redis_server": 0.0}
                for b in range(_BATCHES):
                    order = ("memory", "redis") if b % 2 == 0 else ("redis", "memory")
                    for name in order:
                        tag = f"{r}-{b}-{name}"
                        pid = procs[name][0].pid
                        cpu0, srv0 = go._cpu_s(pid), go._cpu_s(redis_pid)
                        lat[name] += asyncio.run(
                            _sequential(urls[name], per_batch, kind == "workflow", tag)
                        )
                        cpu[name] += go._cpu_s(pid) - cpu0
                        if name == "redis":  # shared server: others' use counts too
                            cpu["redis_server"] += go._cpu_s(redis_pid) - srv0
                calls = _BATCHES * (per_batch + 5)
                for name, cpu_s in cpu.items():
                    row[f"{kind}_{name}_cpu_us"] = 1e6 * cpu_s / calls
                for name, values in lat.items():
                    row[f"{kind}_{name}_p50_us"] = _pct(values, 0.5)
                    row[f"{kind}_{name}_p99_us"] = _pct(values, 0.99)
                row[f"{kind}_added_p50_us"] = row[f"{kind}_redis_p50_us"] - row[
                    f"{kind}_memory_p50_us"]  # fmt: skip
            rounds.append(row)
        stats_url = f"http://127.0.0.1:{procs['redis'][1]}/v1/stats"
        with urllib.request.urlopen(stats_url, timeout=5) as resp:
            stats = json.loads(resp.read())
        check = {"state": stats["state"], "workflow_sync": stats["admission"].get("workflow_sync")}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(30)
        backend.terminate()
        backend.wait(10)
        client = redis.Redis()
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    return rounds, check


def report_latency(rounds: list[dict[str, float]], check: dict[str, Any]) -> dict[str, Any]:
    print(f"\nPer request through the gateway, sequential calls ({len(rounds)} rounds, median)")
    print(
        "| call | memory p50 (us) | redis p50 (us) | added p50 (us) | memory p99 | redis p99 "
        "| gateway CPU/req memory (us) | redis (us) | redis-server CPU/req (us) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    out: dict[str, Any] = {"check": check}
    for kind in ("plain", "workflow"):
        med = {k.removeprefix(kind + "_"): statistics.median(r[k] for r in rounds)
               for k in rounds[0] if k.startswith(kind + "_")}  # fmt: skip
        out[kind] = med
        verdict = "PASS" if med["added_p50_us"] < 1000 else "MISS"
        print(f"| {kind} | {med['memory_p50_us']:.0f} | {med['redis_p50_us']:.0f} | "
              f"{med['added_p50_us']:.0f} ({verdict} < 1000) | {med['memory_p99_us']:.0f} | "
              f"{med['redis_p99_us']:.0f} | {med['memory_cpu_us']:.0f} | "
              f"{med['redis_cpu_us']:.0f} | {med['redis_server_cpu_us']:.0f} |")  # fmt: skip
    sync = check.get("workflow_sync") or {}
    print(f"redis gateway: state {check.get('state', {}).get('mode')}, "
          f"ledger updates {sync.get('updates')}, misses {sync.get('hydration_misses')}, "
          f"read timeouts {sync.get('hydration_timeouts')}")  # fmt: skip
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
    report_quota(quota)
    return summary


def report_quota(quota: dict[str, dict[str, float]]) -> None:
    mem_p50 = quota["memory"]["p50_us"]
    print("\nQuota check (tenant requests/min + tokens/min, one atomic take), per call")
    print("| store | p50 (us) | p99 (us) | added p50 over memory (us) | client CPU (us) |")
    print("|---|---:|---:|---:|---:|")
    for name, q in quota.items():
        print(f"| {name} | {q['p50_us']:.1f} | {q['p99_us']:.1f} | {q['p50_us'] - mem_p50:.1f} "
              f"| {q['cpu_us']:.1f} |")  # fmt: skip
    base, ours = quota["redis_py_baseline"], quota["redis"]
    print(f"store client vs redis-py (same run): p50 {ours['p50_us'] / base['p50_us']:.2f}x, "
          f"CPU {ours['cpu_us'] / base['cpu_us']:.2f}x")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--quota-calls", type=int, default=5000)
    p.add_argument("--latency-calls", type=int, default=1000,
                   help="sequential calls per gateway, call kind and round")  # fmt: skip
    p.add_argument("--skip-throughput", action="store_true")
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    quota = asyncio.run(quota_latency(args.quota_calls))
    lat_rounds, check = request_latency(args)
    latency = report_latency(lat_rounds, check)
    rounds = [] if args.skip_throughput else throughput(args, counts)
    if rounds:
        summary = report(rounds, counts, quota)
    else:
        report_quota(quota)
        summary = {"quota_check": quota}
    summary["request_latency"] = latency
    summary["load_avg"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = {"rounds": rounds, "latency_rounds": lat_rounds, "summary": summary}
    RESULTS.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
