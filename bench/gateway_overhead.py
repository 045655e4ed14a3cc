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

``--latency-rate R`` measures latency at R req/s for every gateway instead of at each one's
half saturation (a faster gateway is otherwise measured at a higher rate, so under more load
on the shared cores than a slower one).

``--workers 1,2`` (the default) runs one gateway per count (``inferplane serve --workers N``,
SO_REUSEPORT) in the same rounds; a gateway's CPU is its whole process tree's. One Python
process is capped at one core while the Rust routers run a thread per core, so the targets
are judged on as many workers as the machine has cores (2 here), the like-for-like
comparison; the 1-worker row stays to show the per-process cost.

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
        [--workers 1,2] [--latency-rate 0] [--no-asyncio-round] [--baseline-src DIR[,DIR]]
        [--out FILE]

``--baseline-src`` also runs the gateway of another source tree (e.g. ``git archive <commit>
inferplane | tar -x -C DIR``, or a compiled copy from ``bench/gateway_compile.py``) in every
round, interleaved with the current one, so a change is measured against its parent on the
same machine at the same moments; several trees, comma-separated, run as ``baseline``,
``baseline2``, ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway_overhead_report import baseline_tag, report

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

    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()

    async def list_models(request: web.Request) -> web.Response:
        # Routers that pass /v1/models through (vllm-router) are ready once it answers.
        return web.Response(body=models, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    app.router.add_get("/v1/models", list_models)
    # backlog as the gateway's (aiohttp's default 128 overflowed under the open-loop runs'
    # connection bursts: a dropped SYN is retried after 1, 3, 7... s and the run stalls)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=2048,
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

        t0, cpu0 = time.perf_counter(), time.process_time()
        if mode == "closed":
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            count = int(rate * duration_s)
            await asyncio.gather(*(paced(i / rate) for i in range(count)))
        elapsed = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "errors": errors,
        "rps": n / elapsed,
        "load_cpu_us_per_req": 1e6 * cpu_s / max(1, n),  # the load generator's own
        "load_cpu_share": cpu_s / elapsed,  # of one core: near 1, the generator is the cap
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
    backend_port: int, loop: str, src: str | None = None, workers: int = 1
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
           "--log-level", "warning", "--workers", str(workers)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=src, stderr=subprocess.DEVNULL)
    _wait_http(f"http://127.0.0.1:{port}/ready")
    return proc, port


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (``--workers``: the supervisor and
    every worker; the supervisor's own share is a few polls per second)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _cpu_s(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _machine_s() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hz, idle / hz


WATCHED: dict[str, int] = {}  # role -> pid, whose CPU time (with its children's) runs record


def _measure(url: str, mode: str, stream: bool, args: argparse.Namespace, rate: float = 0.0
             ) -> dict[str, Any]:  # fmt: skip
    before = {role: _tree_cpu_s(pid) for role, pid in WATCHED.items()}
    busy0, idle0 = _machine_s()
    result = _run_load(url, mode, stream, args, rate)
    busy1, idle1 = _machine_s()
    # Cores the whole machine (other users too) had busy and idle over the run, warm-up and
    # start-up included: idle near 0 means the run was bound by the machine's CPU.
    wall_s = (busy1 - busy0 + idle1 - idle0) / (os.cpu_count() or 1)
    result["machine_busy_cores"] = (busy1 - busy0) / wall_s if wall_s else None
    for role, pid in WATCHED.items():
        used = _tree_cpu_s(pid) - before[role]
        result[f"{role}_cpu_us_per_req"] = 1e6 * used / max(1, result["requests"])
    return result


def _run_load(url: str, mode: str, stream: bool, args: argparse.Namespace, rate: float
              ) -> dict[str, Any]:  # fmt: skip
    cmd = [sys.executable, __file__, "--role", "load", "--url", url, "--mode", mode,
           "--duration-s", str(args.duration_s), "--concurrency", str(args.concurrency),
           "--rate", str(rate)] + (["--stream"] if stream else [])  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _via(gateway: tuple[int, str], url_mode: str, stream: bool, args: argparse.Namespace,
         rate: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """One load run through ``gateway`` (pid, url), its process tree's CPU recorded."""
    WATCHED["gateway"] = gateway[0]
    try:
        return _measure(gateway[1], url_mode, stream, args, rate)
    finally:
        del WATCHED["gateway"]


def _round(direct: str, gateways: dict[str, tuple[int, str]], args: argparse.Namespace,
           earlier: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """direct, then each gateway (``w1``, ``w2``, ``baseline``...), back to back per mode."""
    res: dict[str, Any] = {"direct_rps": _measure(direct, "closed", False, args)}
    for tag, gateway in gateways.items():
        res[tag] = {"gateway_rps": _via(gateway, "closed", False, args)}
    res["direct_stream"] = _measure(direct, "closed", True, args)
    for tag, gateway in gateways.items():
        res[tag]["gateway_stream"] = _via(gateway, "closed", True, args)
    for tag, gateway in gateways.items():
        # Half of the lowest saturation seen so far for this gateway: rates drift on a shared
        # machine and latency must be measured below saturation, not at a momentary peak.
        half = 0.5 * min(r[tag]["gateway_rps"]["rps"] for r in [*earlier, res])
        if args.latency_rate > 0:  # one fixed rate for every gateway: latency like for like
            half = args.latency_rate
        res[tag]["half_rate"] = half
        res[tag]["direct_half"] = _measure(direct, "open", False, args, half)
        res[tag]["gateway_half"] = _via(gateway, "open", False, args, half)
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

        def start(tag: str, loop: str, src: str | None = None, workers: int = 1) -> None:
            proc, port = _start_gateway(backend_port, loop, src, workers)
            procs.append(proc)
            gateways[tag] = (proc.pid, f"http://127.0.0.1:{port}/v1/chat/completions")

        gateways: dict[str, tuple[int, str]] = {}
        for n in args.workers:
            start(f"w{n}", "uvloop", workers=n)
        for i, src in enumerate(args.baseline_src):
            start(baseline_tag(i), "uvloop", src=src, workers=args.workers[0])
        rounds: list[dict[str, Any]] = []
        for i in range(args.rounds):
            rounds.append(_round(direct, gateways, args, rounds))
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        asyncio_round: dict[str, Any] = {}
        if not args.no_asyncio_round:
            start("asyncio", "asyncio")
            asyncio_round = _round(direct, {"asyncio": gateways["asyncio"]}, args, [])
        report(rounds, asyncio_round, args)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


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
    p.add_argument("--workers", default="1,2", help="gateway worker counts, each a gateway")
    p.add_argument(
        "--latency-rate",
        type=float,
        default=0.0,
        help="req/s of the latency runs for every gateway (0: half saturation)",
    )
    p.add_argument("--no-asyncio-round", action="store_true", help="skip the asyncio-loop row")
    p.add_argument("--baseline-src", default="", help="source trees (comma-separated) of "
                   "gateways to compare: tags baseline, baseline2, ...")  # fmt: skip
    p.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    args = p.parse_args()
    args.workers = [int(n) for n in str(args.workers).split(",") if n]
    args.baseline_src = [d for d in str(args.baseline_src).split(",") if d]
    if args.role == "backend":
        run_backend(args.port)
    elif args.role == "load":
        run_load(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
