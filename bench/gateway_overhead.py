"""What the gateway costs: throughput and added latency, direct vs through the gateway.

Three processes on loopback: a trivial fast OpenAI backend (aiohttp on uvloop), the gateway
(``inferplane serve``, request log off) and one load generator (aiohttp client on uvloop).
The same generator measures, against the backend directly and through the gateway:

- saturation throughput (closed loop, ``--concurrency`` workers), non-streaming requests/s
  and streaming chunks/s;
- latency at half of the gateway's saturation rate (open loop, fixed rate), p50 and p99,
  so "added latency" is measured where the machine is not queueing.

Runs are interleaved (direct, gateway, direct, gateway, ...) and ratios are taken per round,
because absolute rates drift on shared machines; the table reports medians over rounds. One
extra round runs the gateway on the standard asyncio loop instead of uvloop, to show what the
event-loop choice is worth. Results go to bench/results/gateway-overhead.json.

The stack this chose: uvloop; in front, the gateway's own HTTP/1.1 front server
(``inferplane/gateway/server.py``, asyncio Protocol) answers the two generation routes and
hands every other connection to aiohttp's server (which keeps the other routes, and any odd
request: chunked bodies, HTTP/1.0, malformed heads); for engine calls the gateway's own
HTTP/1.1 client (``inferplane/gateway/upstream.py``) rather than aiohttp's. Measured to
choose: a bare pass-through proxy on aiohttp's server took 615 us of CPU per request with
aiohttp's client and 233 us with the lean one (same run, interleaved); the front server took
the whole gateway from 301 to 246 us per request against the aiohttp server (same run,
``--baseline-src``). With the policy removed (front server and client only) a pass-through
cost 77 us per request where the whole gateway cost 284 (same run): the rest is the per-call
work (context, admission, routing, reliability, accounting, metrics). uvloop against
asyncio's loop is the extra round above.

    python bench/gateway_overhead.py [--rounds 3] [--duration-s 4] [--concurrency 64]
        [--baseline-src DIR]

``--baseline-src`` also runs the gateway of another source tree (e.g. ``git archive <commit>
inferplane | tar -x -C DIR``) in every round, interleaved with the current one, so a change
is measured against its parent on the same machine at the same moments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gateway-overhead.json"
STREAM_CHUNKS = 16


# ---- role: backend --------------------------------------------------------------------------

#: The trivial backend's whole (non-streamed) answer.
WHOLE_ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


def run_backend(port: int) -> None:
    import uvloop
    from aiohttp import web

    whole = WHOLE_ANSWER
    chunk = (
        b'data: {"id":"x","object":"chat.completion.chunk",'
        b'"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
    )
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16}}\n\n'

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(STREAM_CHUNKS):
            await resp.write(chunk)
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(usage)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None,
                loop=uvloop.new_event_loop())  # fmt: skip


# ---- role: load generator -------------------------------------------------------------------

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
STREAM_BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": True}
).encode()


async def _one(session: Any, url: str, stream: bool) -> tuple[float, int]:
    start = time.perf_counter()
    chunks = 0
    async with session.post(url, data=STREAM_BODY if stream else BODY,
                            headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        if stream:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunks += 1
        else:
            await resp.read()
    return time.perf_counter() - start, chunks


async def load(url: str, mode: str, stream: bool, duration_s: float, concurrency: int,
               rate: float) -> dict[str, Any]:  # fmt: skip
    import aiohttp

    latencies: list[float] = []
    chunks = 0
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(20):  # warm-up and connection set-up
            await _one(session, url, stream)
        end = time.perf_counter() + duration_s

        async def worker() -> None:
            nonlocal chunks, errors
            while time.perf_counter() < end:
                try:
                    lat, n = await _one(session, url, stream)
                except Exception:
                    errors += 1
                    continue
                latencies.append(lat)
                chunks += n

        async def paced(delay: float) -> None:
            nonlocal chunks, errors
            await asyncio.sleep(delay)
            try:
                lat, n = await _one(session, url, stream)
            except Exception:
                errors += 1
                return
            latencies.append(lat)
            chunks += n

        t0 = time.perf_counter()
        if mode == "closed":
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            count = int(rate * duration_s)
            await asyncio.gather(*(paced(i / rate) for i in range(count)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "errors": errors,
        "rps": n / elapsed,
        "chunks_per_s": chunks / elapsed,
        "p50_ms": 1e3 * latencies[n // 2] if n else None,
        "p99_ms": 1e3 * latencies[min(n - 1, int(n * 0.99))] if n else None,
    }


def run_load(args: argparse.Namespace) -> None:
    import uvloop

    result = uvloop.run(load(args.url, args.mode, args.stream, args.duration_s,
                             args.concurrency, args.rate))  # fmt: skip
    print(json.dumps(result))


# ---- orchestration --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout_s: float = 60.0) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _start_gateway(
    backend_port: int, loop: str, src: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    cfg = Path(tempfile.mkdtemp()) / "fleet.yaml"
    cfg.write_text(
        "gateway: {log_requests: false, scrape_interval_s: 0.1}\n"
        # The trivial backend has no batch-slot limit: without this prior the gateway would
        # admit it as a 256-slot GPU and hold standard calls beyond their share in its queue.
        "routing: {predictor: {priors: {h100: {max_num_seqs: 4096}}}}\n"
        "endpoints:\n"
        f"  - {{name: b0, url: 'http://127.0.0.1:{backend_port}', kind: openai, gpu: h100,"
        " price_per_hour_usd: 2.0, models: [m]}\n"
    )
    env = {**os.environ, "INFERPLANE_EVENT_LOOP": loop}
    if src is not None:  # that tree's package first (``-m`` also looks in the cwd)
        env["PYTHONPATH"] = src
    cmd = [sys.executable, "-m", "inferplane.cli", "serve", "-c", str(cfg), "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=src, stderr=subprocess.DEVNULL)
    _wait_http(f"http://127.0.0.1:{port}/ready")
    return proc, port


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


WATCHED: dict[str, int] = {}  # role -> pid, whose CPU time each run records
BASELINE: dict[str, Any] = {}  # the --baseline-src gateway: pid and url


def _measure(url: str, mode: str, stream: bool, args: argparse.Namespace, rate: float = 0.0
             ) -> dict[str, Any]:  # fmt: skip
    before = {role: _cpu_s(pid) for role, pid in WATCHED.items()}
    result = _run_load(url, mode, stream, args, rate)
    for role, pid in WATCHED.items():
        used = _cpu_s(pid) - before[role]
        result[f"{role}_cpu_us_per_req"] = 1e6 * used / max(1, result["requests"])
    return result


def _run_load(url: str, mode: str, stream: bool, args: argparse.Namespace, rate: float
              ) -> dict[str, Any]:  # fmt: skip
    cmd = [sys.executable, __file__, "--role", "load", "--url", url, "--mode", mode,
           "--duration-s", str(args.duration_s), "--concurrency", str(args.concurrency),
           "--rate", str(rate)] + (["--stream"] if stream else [])  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _round(direct: str, via: str, args: argparse.Namespace, earlier: list[dict[str, Any]]
           ) -> dict[str, Any]:  # fmt: skip
    res: dict[str, Any] = {}
    res["direct_rps"] = _measure(direct, "closed", False, args)
    res["gateway_rps"] = _measure(via, "closed", False, args)
    if BASELINE:
        current = WATCHED["gateway"]
        WATCHED["gateway"] = BASELINE["pid"]
        res["baseline_rps"] = _measure(BASELINE["url"], "closed", False, args)
        WATCHED["gateway"] = current
    res["direct_stream"] = _measure(direct, "closed", True, args)
    res["gateway_stream"] = _measure(via, "closed", True, args)
    # Half of the lowest gateway saturation seen so far: rates drift on a shared machine and
    # latency must be measured below saturation, not at a momentary peak.
    half = 0.5 * min(r["gateway_rps"]["rps"] for r in [*earlier, res])
    res["half_rate"] = half
    res["direct_half"] = _measure(direct, "open", False, args, half)
    res["gateway_half"] = _measure(via, "open", False, args, half)
    return res


def orchestrate(args: argparse.Namespace) -> None:
    backend_port = _free_port()
    backend = subprocess.Popen([sys.executable, __file__, "--role", "backend", "--port",
                                str(backend_port)])  # fmt: skip
    procs = [backend]
    WATCHED["backend"] = backend.pid
    try:
        _wait_http(f"http://127.0.0.1:{backend_port}/health")
        direct = f"http://127.0.0.1:{backend_port}/v1/chat/completions"
        rounds: list[dict[str, Any]] = []
        gateways: dict[str, str] = {}
        for loop in ("uvloop", "asyncio"):
            proc, port = _start_gateway(backend_port, loop)
            procs.append(proc)
            gateways[loop] = f"http://127.0.0.1:{port}/v1/chat/completions"
        WATCHED["gateway"] = procs[1].pid
        if args.baseline_src:
            proc, port = _start_gateway(backend_port, "uvloop", src=args.baseline_src)
            procs.append(proc)
            BASELINE.update(pid=proc.pid, url=f"http://127.0.0.1:{port}/v1/chat/completions")
        for i in range(args.rounds):
            rounds.append({"loop": "uvloop", **_round(direct, gateways["uvloop"], args, rounds)})
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        WATCHED["gateway"] = procs[2].pid
        BASELINE.clear()
        asyncio_round = {"loop": "asyncio", **_round(direct, gateways["asyncio"], args, [])}
        report(rounds, asyncio_round, args)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    def med(fn: Any) -> float:
        return float(statistics.median(fn(r) for r in rounds))

    return {
        "direct_rps": med(lambda r: r["direct_rps"]["rps"]),
        "gateway_rps": med(lambda r: r["gateway_rps"]["rps"]),
        "rps_ratio": med(lambda r: r["gateway_rps"]["rps"] / r["direct_rps"]["rps"]),
        "direct_chunks_per_s": med(lambda r: r["direct_stream"]["chunks_per_s"]),
        "gateway_chunks_per_s": med(lambda r: r["gateway_stream"]["chunks_per_s"]),
        "chunks_ratio": med(
            lambda r: r["gateway_stream"]["chunks_per_s"] / r["direct_stream"]["chunks_per_s"]
        ),
        "half_rate_rps": med(lambda r: r["half_rate"]),
        "direct_p50_ms": med(lambda r: r["direct_half"]["p50_ms"]),
        "gateway_p50_ms": med(lambda r: r["gateway_half"]["p50_ms"]),
        "added_p50_ms": med(lambda r: r["gateway_half"]["p50_ms"] - r["direct_half"]["p50_ms"]),
        "direct_p99_ms": med(lambda r: r["direct_half"]["p99_ms"]),
        "gateway_p99_ms": med(lambda r: r["gateway_half"]["p99_ms"]),
        "added_p99_ms": med(lambda r: r["gateway_half"]["p99_ms"] - r["direct_half"]["p99_ms"]),
        "gateway_cpu_us_per_req": med(lambda r: r["gateway_rps"]["gateway_cpu_us_per_req"]),
        "backend_cpu_us_per_req": med(lambda r: r["direct_rps"]["backend_cpu_us_per_req"]),
        "gateway_cpu_us_per_chunk": med(
            lambda r: r["gateway_stream"]["gateway_cpu_us_per_req"] / STREAM_CHUNKS
        ),
        "errors": float(
            sum(v["errors"] for r in rounds for v in r.values() if isinstance(v, dict))
        ),
    }


def report(rounds: list[dict[str, Any]], asyncio_round: dict[str, Any],
           args: argparse.Namespace) -> None:  # fmt: skip
    s = _summary(rounds)
    a = _summary([asyncio_round])
    lines = [
        f"gateway overhead ({args.rounds} interleaved rounds, {args.duration_s:g} s runs, "
        f"{args.concurrency} concurrent, {os.cpu_count()} CPUs; medians)",
        f"{'metric':<34}{'direct':>12}{'gateway':>12}{'ratio / added':>16}",
        f"{'non-stream requests/s':<34}{s['direct_rps']:>12.0f}{s['gateway_rps']:>12.0f}"
        f"{s['rps_ratio']:>15.2f}x",
        f"{'stream chunks/s (16 per request)':<34}{s['direct_chunks_per_s']:>12.0f}"
        f"{s['gateway_chunks_per_s']:>12.0f}{s['chunks_ratio']:>15.2f}x",
        f"{'p50 ms at {:.0f} req/s (half sat.)'.format(s['half_rate_rps']):<34}"
        f"{s['direct_p50_ms']:>12.2f}{s['gateway_p50_ms']:>12.2f}{s['added_p50_ms']:>+15.2f} ms",
        f"{'p99 ms at half saturation':<34}{s['direct_p99_ms']:>12.2f}"
        f"{s['gateway_p99_ms']:>12.2f}{s['added_p99_ms']:>+15.2f} ms",
        f"{'CPU us/request (backend; gateway)':<34}{s['backend_cpu_us_per_req']:>12.0f}"
        f"{s['gateway_cpu_us_per_req']:>12.0f}"
        f"{s['gateway_cpu_us_per_req'] / s['backend_cpu_us_per_req']:>15.2f}x",
        f"{'gateway on asyncio loop: req/s':<34}{a['direct_rps']:>12.0f}{a['gateway_rps']:>12.0f}"
        f"{a['rps_ratio']:>15.2f}x",
        f"{'asyncio loop: gateway CPU us/req':<34}{'':>12}{a['gateway_cpu_us_per_req']:>12.0f}"
        f"{a['gateway_cpu_us_per_req'] / s['gateway_cpu_us_per_req']:>15.2f}x",
        *_baseline_lines(rounds, args),
        f"targets: ratio >= 0.5 ({'PASS' if s['rps_ratio'] >= 0.5 else 'FAIL'}), "
        f"added p50 < 2 ms ({'PASS' if s['added_p50_ms'] < 2.0 else 'FAIL'}); "
        f"errors: {s['errors']:.0f}",
    ]
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": s, "asyncio_loop": a, "rounds": rounds,
                                   "asyncio_round": asyncio_round, "table": lines},
                                  indent=2))  # fmt: skip


def _baseline_lines(rounds: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Rows for the --baseline-src gateway, measured in the same rounds."""
    if not args.baseline_src:
        return []

    def med(fn: Any) -> float:
        return float(statistics.median(fn(r) for r in rounds))

    rps = med(lambda r: r["baseline_rps"]["rps"])
    ratio = med(lambda r: r["baseline_rps"]["rps"] / r["direct_rps"]["rps"])
    cpu = med(lambda r: r["baseline_rps"]["gateway_cpu_us_per_req"])
    now = med(lambda r: r["gateway_rps"]["gateway_cpu_us_per_req"])
    # Per round, then the median: the two gateways ran moments apart, under the same load.
    paired = med(
        lambda r: (
            r["gateway_rps"]["gateway_cpu_us_per_req"] / r["baseline_rps"]["gateway_cpu_us_per_req"]
        )
    )
    return [
        f"{'baseline gateway: req/s':<34}{'':>12}{rps:>12.0f}{ratio:>15.2f}x",
        f"{'baseline: gateway CPU us/req':<34}{cpu:>12.0f}{now:>12.0f}{paired:>15.2f}x",
        f"  (baseline: {args.baseline_src}; CPU row: baseline, current, median per round of"
        " current/baseline)",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["orchestrate", "backend", "load"], default="orchestrate")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--url", default="")
    p.add_argument("--mode", choices=["closed", "open"], default="closed")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--baseline-src", default=None, help="source tree of a gateway to compare")
    p.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    args = p.parse_args()
    if args.role == "backend":
        run_backend(args.port)
    elif args.role == "load":
        run_load(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
