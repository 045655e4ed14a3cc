"""The overhead rows: a trivial backend direct and through each gateway, same client.

The backend is ``bench/gateway_overhead.py``'s (instant answers, 16-chunk streams). The
client is the scoreboard's closed loop (64 concurrent), run against the backend directly
and through a gateway back to back, so each ratio compares neighbouring measurements.
Latencies here are at saturation, not at a fixed rate.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peerlib import gateways as gw
from peerlib.procs import run_load

ROOT = Path(__file__).resolve().parents[2]


def _closed(
    url: str, key: str | None, stream: bool, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    body = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
    }
    spec = {
        "mode": "closed",
        "urls": [url],
        "bodies": [body],
        "concurrency": 64,
        "api_key": key,
        "warmup_s": 1.0,
        "window_s": 2.0 if args.quick else 4.0,
    }
    return run_load(spec, workdir, 60)


def measure_overhead(
    args: argparse.Namespace, specs: list[gw.GatewaySpec], not_run: dict[str, str], workdir: Path
) -> list[dict[str, Any]]:
    """Trivial backend: direct, then through each gateway (interleaved), same client."""
    port = gw.free_port()
    backend = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "gateway_overhead.py"),
            "--role",
            "backend",
            "--port",
            str(port),
        ]
    )
    direct = f"http://127.0.0.1:{port}/v1/chat/completions"
    endpoint = {
        "name": "b0",
        "url": f"http://127.0.0.1:{port}",
        "kind": "openai",
        "gpu": "h100",
        "price_per_hour_usd": 2.0,
        "models": ["llama-3-8b"],
    }
    rows = []
    try:
        time.sleep(1.5)
        for spec in specs:
            if spec.label in not_run:
                continue
            try:
                running = gw.start(spec, [endpoint], workdir)
            except gw.PeerUnavailable as exc:
                not_run[spec.label] = str(exc)
                continue
            try:
                row: dict[str, Any] = {"gateway": spec.label}
                for stream in (False, True):
                    d = _closed(direct, None, stream, args, workdir)
                    g = _closed(running.url, running.api_key, stream, args, workdir)
                    tag = "stream" if stream else "plain"
                    row[tag] = {
                        "direct": d,
                        "gateway": g,
                        "ratio": g["calls_s"] / d["calls_s"] if d["calls_s"] else None,
                    }
            finally:
                running.stop()
            rows.append(row)
            print(f"  overhead {spec.label}: {row['plain']['ratio']}", file=sys.stderr, flush=True)
    finally:
        backend.terminate()
        backend.wait(10)
    return rows


def overhead_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| gateway | req/s (direct) | ratio | added p50 ms | added p99 ms "
        "| stream req/s | stream ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, s = r["plain"], r["stream"]

        def added(key: str, m: dict[str, Any] = p) -> str:
            a, b = m["gateway"][key], m["direct"][key]
            return "-" if a is None or b is None else f"{1e3 * (a - b):+.1f}"

        out.append(
            f"| {r['gateway']} | {p['gateway']['calls_s']:.0f} ({p['direct']['calls_s']:.0f})"
            f" | {p['ratio'] or 0:.3f}x | {added('p50_s')} | {added('p99_s')} "
            f"| {s['gateway']['calls_s']:.0f} | {s['ratio'] or 0:.3f}x |"
        )
    return out
