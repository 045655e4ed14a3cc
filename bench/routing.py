"""Prefix-aware routing under KV memory pressure: inferplane precise vs approximate vs
least-loaded vs round-robin, on one seeded multi-tenant shared-prefix workload (issue 4).

The llm-d benchmark shape (REFERENCE §6: many customers, each with a long shared prefix,
more prefixes than one pod's KV cache holds), scaled to what a 2-core machine can emulate:
8 emulated engines serving Llama-3-70B on 2 x H100 (about 9K tokens of KV cache each, so an
engine holds ~4 tenants' prefixes), ``--tenants`` tenants each with a ~2K-token system
prompt, short questions, Poisson arrivals at ``--rate`` calls/s, streaming.

Policies (engines restarted with empty caches for each, same seed, same calls):

- ``precise``: the gateway subscribed to every engine's KV events (default routing);
- ``approximate``: the same gateway without KV events: the prefix index only holds what it
  routed (speculative ``record_route``), like SGLang's and vllm-router's cache-aware trees;
- ``least-loaded``: the gateway with only the load axis weighted;
- ``round-robin``: the client rotates over the engines directly (no gateway).

Reported per policy: TTFT p50/p90/p99 (client-side, first streamed token), completed
calls/s, errors, and the prefix-cache hit rate the engines themselves count
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``). Three processes on
loopback: the engine fleet, the gateway (``inferplane serve``) and this client.

    python bench/routing.py [--duration-s 20] [--rate 6] [--tenants 16] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "routing.json"
MODEL, GPU, TP, ENGINES = "llama-3-70b", "h100", 2, 8
POLICIES = ("precise", "approximate", "least-loaded", "round-robin")
_HITS = re.compile(r"^vllm:prefix_cache_(hits|queries)_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)
_KV = re.compile(r"^vllm:kv_cache_usage_perc(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)
BLOCK_TOKENS = 16  # the engines' KV block size (profiles.yaml)
KV_HIGH, KV_LOW = 0.9, 0.3  # issue 4: no replica above 90% while another sits under 30%


# ---- role: fleet (child process) -------------------------------------------------------------


def run_fleet(kv_events: bool, time_scale: float) -> None:
    """Start the engines, print their endpoint configs as one JSON line, run until stdin ends."""
    import uvloop

    from inferplane.engine.fleet import EngineSpec, Fleet

    async def main() -> None:
        spec = EngineSpec(model=MODEL, gpu=GPU, tensor_parallel=TP, count=ENGINES,
                          time_scale=time_scale, kv_events=kv_events, seed=1)  # fmt: skip
        async with Fleet([spec]) as fleet:
            print(json.dumps([e.endpoint_config() for e in fleet.engines]), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    uvloop.run(main())


# ---- the workload -----------------------------------------------------------------------------


def tenant_prompt(tenant: int, num_words: int) -> str:
    """A tenant's long system prompt: its own deterministic words (~1 token each)."""
    rng = random.Random(f"tenant-{tenant}")
    words = ["policy", "record", "customer", "clause", "account", "region", "ledger", "audit"]
    return " ".join(f"{rng.choice(words)}{rng.randrange(1000)}" for _ in range(num_words))


def workload(args: argparse.Namespace) -> list[tuple[float, int, str]]:
    """(arrival offset s, tenant, question) for every call: Poisson arrivals, tenants uniform."""
    rng = random.Random(args.seed)
    calls: list[tuple[float, int, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(args.rate)
        if t >= args.duration_s:
            return calls
        calls.append((t, rng.randrange(args.tenants), f"question {rng.randrange(10**6)}?"))


def _messages(prompt: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": prompt}, {"role": "user", "content": question}]


def oracle_hit_rate(args: argparse.Namespace) -> float:
    """The hit rate of one infinite shared cache on this workload: the fraction of prompt
    tokens in full blocks whose chained prefix (every token up to the block's end) was
    already seen earlier in the run. No router can beat it."""
    from inferplane.tokenizer import apply_chat_template

    prompts = [tenant_prompt(i, args.prefix_words) for i in range(args.tenants)]
    seen: set[int] = set()
    hit_tokens = total_tokens = 0
    for _, tenant, question in workload(args):
        ids = apply_chat_template(_messages(prompts[tenant], question))
        total_tokens += len(ids)
        chain = 0
        for end in range(BLOCK_TOKENS, len(ids) + 1, BLOCK_TOKENS):
            chain = hash((chain, tuple(ids[end - BLOCK_TOKENS : end])))
            if chain in seen:
                hit_tokens += BLOCK_TOKENS
            seen.add(chain)
    return hit_tokens / total_tokens if total_tokens else 0.0


# ---- one policy ---------------------------------------------------------------------------------


async def _scrape_hits(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            for kind, value in _HITS.findall(await resp.text()):
                if kind == "hits":
                    hits += float(value)
                else:
                    queries += float(value)
    return hits, queries


async def _kv_usages(session: aiohttp.ClientSession, urls: list[str]) -> list[float]:
    async def one(url: str) -> float:
        async with session.get(url + "/metrics") as resp:
            match = _KV.search(await resp.text())
            return float(match.group(1)) if match else 0.0

    return list(await asyncio.gather(*(one(url) for url in urls)))


async def sample_kv(
    session: aiohttp.ClientSession, urls: list[str], period_s: float, out: list[list[float]]
) -> None:
    """Append every engine's KV usage to ``out`` every ``period_s`` until cancelled."""
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            out.append(await _kv_usages(session, urls))
        await asyncio.sleep(period_s)


def kv_summary(samples: list[list[float]]) -> dict[str, Any]:
    """Max usage, max/mean spread (max - min across engines), and the imbalanced samples
    (some engine above KV_HIGH while another is under KV_LOW)."""
    spreads = [max(row) - min(row) for row in samples if row]
    return {
        "kv_samples": len(spreads),
        "kv_max_usage": max((max(row) for row in samples if row), default=0.0),
        "kv_spread_max": max(spreads, default=0.0),
        "kv_spread_mean": sum(spreads) / len(spreads) if spreads else 0.0,
        "kv_imbalanced_samples": sum(
            1 for row in samples if row and max(row) > KV_HIGH and min(row) < KV_LOW
        ),
    }


def _has_text(payload: bytes) -> bool:
    """Whether an SSE chunk carries generated text (not just the role or usage)."""
    choices = json.loads(payload).get("choices") or []
    return any((c.get("delta") or {}).get("content") for c in choices)


async def _call(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float | None:
    """Stream one call; its TTFT in seconds, or None when it failed."""
    start = time.perf_counter()
    ttft: float | None = None
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            async for line in resp.content:
                if ttft is None and line.startswith(b"data: {") and _has_text(line[6:]):
                    ttft = time.perf_counter() - start
    except (aiohttp.ClientError, TimeoutError):
        return None
    # A reply whose few tokens all decode to no text: its first token came by the end.
    return time.perf_counter() - start if ttft is None else ttft


async def drive(targets: list[str], args: argparse.Namespace) -> dict[str, Any]:
    prompts = [tenant_prompt(i, args.prefix_words) for i in range(args.tenants)]
    calls = workload(args)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        before = await _scrape_hits(session, args.engine_urls)
        kv_rows: list[list[float]] = []
        sampler = asyncio.create_task(sample_kv(session, args.engine_urls, 0.5, kv_rows))
        start = time.perf_counter()
        tasks = []
        for i, (offset, tenant, question) in enumerate(calls):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": MODEL, "max_tokens": args.max_tokens, "stream": True,
                "messages": _messages(prompts[tenant], question),
            }  # fmt: skip
            tasks.append(asyncio.create_task(_call(session, targets[i % len(targets)], body)))
        ttfts = await asyncio.gather(*tasks)
        wall_s = time.perf_counter() - start
        sampler.cancel()
        after = await _scrape_hits(session, args.engine_urls)
    ok = sorted(t for t in ttfts if t is not None)
    queries = after[1] - before[1]
    return {
        "calls": len(calls),
        "errors": len(calls) - len(ok),
        "completed_per_s": len(ok) / wall_s,
        "ttft_p50_s": _pct(ok, 0.5),
        "ttft_p90_s": _pct(ok, 0.9),
        "ttft_p99_s": _pct(ok, 0.99),
        "prefix_hit_rate": (after[0] - before[0]) / queries if queries else 0.0,
        **kv_summary(kv_rows),
    }


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gateway_config(policy: str, endpoints: list[dict[str, Any]], port: int) -> str:
    routing: dict[str, Any] = {}
    if policy == "least-loaded":
        axes = ("kv_cache", "load", "headroom", "latency", "cost", "warm", "priority", "affinity")
        routing = {"weights": {a: (1.0 if a == "load" else 0.0) for a in axes}}
    config = {
        "gateway": {"port": port, "auth": {"mode": "anonymous"}, "log_requests": False},
        "endpoints": endpoints,
        "routing": routing,
    }
    path = Path(tempfile.mkdtemp()) / "fleet.json"
    path.write_text(json.dumps(config))  # JSON is YAML
    return str(path)


async def _wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(url + "/ready") as resp:
                    if resp.status == 200:
                        stats = await (await session.get(url + "/v1/stats")).json()
                        links = stats["routing"]["kv_events"].values()
                        if all(link["state"] == "connected" for link in links):
                            return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway did not become ready")


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--role", "fleet", "--time-scale", str(args.time_scale)]
    if policy == "precise":
        cmd.append("--kv-events")
    fleet = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs: list[subprocess.Popen[Any]] = []
    try:
        assert fleet.stdout is not None
        endpoints = json.loads(fleet.stdout.readline())
        args.engine_urls = [e["url"] for e in endpoints]
        if policy == "round-robin":
            targets = args.engine_urls
        else:
            port = _free_port()
            cfg = _gateway_config(policy, endpoints, port)
            serve = [sys.executable, "-m", "inferplane.cli", "serve", "-c", cfg, "--port",
                     str(port), "--log-level", "warning"]  # fmt: skip
            procs.append(subprocess.Popen(serve, stderr=subprocess.DEVNULL))
            targets = [f"http://127.0.0.1:{port}"]
            asyncio.run(_wait_ready(targets[0]))
        return asyncio.run(drive(targets, args))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        if fleet.stdin is not None:
            fleet.stdin.close()
        fleet.wait(20)


def verdicts(results: dict[str, dict[str, Any]], oracle: float) -> list[str]:
    """PASS/MISS lines for issue 4's three targets (precise routing against the others)."""
    lines: list[str] = []
    pr, rr = results.get("precise"), results.get("round-robin")
    if pr and rr and pr["ttft_p90_s"] is not None and rr["ttft_p90_s"] is not None:
        ratio = pr["ttft_p90_s"] / rr["ttft_p90_s"]
        loaded = rr["ttft_p90_s"] > 2.0
        ok = ratio <= 0.1 and loaded
        lines.append(
            f"{'PASS' if ok else 'MISS'} P90 TTFT precise/round-robin = {ratio:.3f} (target"
            f" <= 0.1) at round-robin P90 {rr['ttft_p90_s']:.2f} s"
            f"{'' if loaded else ' (round-robin P90 under 2 s: load too low)'}"
        )
    if pr:
        ok = pr["prefix_hit_rate"] >= 0.9 * oracle
        lines.append(
            f"{'PASS' if ok else 'MISS'} precise hit rate {pr['prefix_hit_rate']:.1%} vs oracle"
            f" {oracle:.1%} (target >= 90% of oracle: {0.9 * oracle:.1%})"
        )
        ok = pr["kv_imbalanced_samples"] == 0
        lines.append(
            f"{'PASS' if ok else 'MISS'} precise KV balance: {pr['kv_imbalanced_samples']} of"
            f" {pr['kv_samples']} samples with one engine > {KV_HIGH:.0%} and another"
            f" < {KV_LOW:.0%} (target 0)"
        )
    return lines


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1e3 * v:.0f}"

    oracle = oracle_hit_rate(args)
    lines = [
        f"prefix-aware routing: {ENGINES} x {MODEL} on {TP}x{GPU} (emulated, time scale "
        f"{args.time_scale:g}), {args.tenants} tenants x ~{args.prefix_words}-word prefix, "
        f"{args.rate:g} calls/s for {args.duration_s:g} s, seed {args.seed}, {os.cpu_count()} CPUs",
        f"{'policy':<14}{'TTFT p50 ms':>12}{'p90 ms':>9}{'p99 ms':>9}{'done/s':>8}"
        f"{'errors':>7}{'hit':>7}{'oracle':>7}{'KV max':>7}{'spread':>7}{'imbal':>9}",
    ]
    for policy, r in results.items():
        lines.append(
            f"{policy:<14}{ms(r['ttft_p50_s']):>12}{ms(r['ttft_p90_s']):>9}"
            f"{ms(r['ttft_p99_s']):>9}{r['completed_per_s']:>8.2f}{r['errors']:>7}"
            f"{r['prefix_hit_rate']:>7.1%}{oracle:>7.1%}{r['kv_max_usage']:>7.0%}"
            f"{r['kv_spread_max']:>7.0%}{r['kv_imbalanced_samples']:>4}/{r['kv_samples']:<4}"
        )
    lines += verdicts(results, oracle)
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"args": {k: v for k, v in vars(args).items() if k != "engine_urls"},
               "oracle_hit_rate": oracle, "results": results, "table": lines}  # fmt: skip
    out.write_text(json.dumps(payload, indent=2))


def scan_rate(args: argparse.Namespace) -> None:
    """Short round-robin runs at rising rates; keep the first whose P90 TTFT passes 2 s."""
    duration_s = args.duration_s
    args.duration_s = args.scan_duration_s
    try:
        for rate in (float(r) for r in args.scan_rates.split(",")):
            args.rate = rate
            p90 = run_policy("round-robin", args)["ttft_p90_s"]
            print(f"scan: round-robin at {rate:g}/s: P90 {p90}", file=sys.stderr, flush=True)
            if p90 is not None and p90 > 2.0:
                return
    finally:
        args.duration_s = duration_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["orchestrate", "fleet"], default="orchestrate")
    p.add_argument("--kv-events", action="store_true")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--prefix-words", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--scan-rates", default="", help="e.g. 10,14,18: pick --rate first")
    p.add_argument("--scan-duration-s", type=float, default=10.0)
    args = p.parse_args()
    if args.role == "fleet":
        run_fleet(args.kv_events, args.time_scale)
        return
    if args.scan_rates:
        scan_rate(args)
    results = {}
    for policy in args.policies.split(","):
        results[policy] = run_policy(policy, args)
        print(f"{policy} done", file=sys.stderr, flush=True)
    report(results, args)


if __name__ == "__main__":
    main()
