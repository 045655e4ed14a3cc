"""The overhead rows: a trivial backend direct and through each gateway, same client.

The backend is ``bench/gateway_overhead.py``'s (instant answers, 16-chunk streams). The
client is the scoreboard's closed loop (64 concurrent), run against the backend directly
and through a gateway back to back, so each ratio compares neighbouring measurements.
Latencies here are at saturation, not at a fixed rate.

With ``rounds`` above 1 every gateway is measured once per round (started, measured, stopped,
in turn), and a row keeps the round whose plain ratio is the median, with every round's
figures under ``rounds``: one 4 s sample per gateway moved the direct figure by 2x within
five minutes on a shared machine (``bench/results/overhead-peers-lead-f4b32f8.md``).
``overhead_verdicts`` judges issue 8's target both ways: inferplane's requests/s against the
faster Rust router's and LiteLLM's (medians over rounds), and the ratios to direct.
"""

from __future__ import annotations

import argparse
import statistics
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
    samples: dict[str, list[dict[str, Any]]] = {}
    try:
        time.sleep(1.5)
        for _ in range(max(1, int(getattr(args, "rounds", 1)))):
            for spec in specs:
                if spec.label in not_run:
                    continue
                row = _measure_one(spec, endpoint, direct, args, workdir, not_run)
                if row is not None:
                    samples.setdefault(spec.label, []).append(row)
    finally:
        backend.terminate()
        backend.wait(10)
    return [_median_row(label, rows) for label, rows in samples.items()]


def _measure_one(
    spec: gw.GatewaySpec,
    endpoint: dict[str, Any],
    direct: str,
    args: argparse.Namespace,
    workdir: Path,
    not_run: dict[str, str],
) -> dict[str, Any] | None:
    """One gateway started, measured direct-then-through (plain, then streaming), stopped."""
    try:
        running = gw.start(spec, [endpoint], workdir)
    except gw.PeerUnavailable as exc:
        not_run[spec.label] = str(exc)
        return None
    try:
        row: dict[str, Any] = {"gateway": spec.label}
        for stream in (False, True):
            d = _closed(direct, None, stream, args, workdir)
            g = _closed(running.url, running.api_key, stream, args, workdir)
            row["stream" if stream else "plain"] = {
                "direct": d,
                "gateway": g,
                "ratio": g["calls_s"] / d["calls_s"] if d["calls_s"] else None,
            }
    finally:
        running.stop()
    print(f"  overhead {spec.label}: {row['plain']['ratio']}", file=sys.stderr, flush=True)
    return row


def _median_row(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose plain ratio is the median, with every round's figures beside it."""
    ranked = sorted(rows, key=lambda r: r["plain"]["ratio"] or 0.0)
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["rounds"] = [
        {
            tag: {"ratio": r[tag]["ratio"], "calls_s": r[tag]["gateway"]["calls_s"],
                  "direct_calls_s": r[tag]["direct"]["calls_s"]}
            for tag in ("plain", "stream")
        }
        for r in rows
    ]  # fmt: skip
    row["gateway"] = label
    return row


def _medians(row: dict[str, Any]) -> tuple[float, float]:
    """(requests/s through the gateway, ratio to direct), plain, medians over rounds."""
    rounds = row.get("rounds") or [
        {"plain": {"calls_s": row["plain"]["gateway"]["calls_s"], "ratio": row["plain"]["ratio"]}}
    ]
    calls = statistics.median([float(r["plain"]["calls_s"]) for r in rounds])
    ratio = statistics.median([float(r["plain"]["ratio"] or 0.0) for r in rounds])
    return calls, ratio


#: Issue 8's overhead target: inferplane at least this share of the faster Rust router, and
#: at least this multiple of LiteLLM.
ROUTER_SHARE = 0.8
LITELLM_MULTIPLE = 10.0


def overhead_verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """PASS/MISS lines for the best inferplane row against the peers, both ways."""
    figures = {r["gateway"]: _medians(r) for r in rows}
    ours = {k: v for k, v in figures.items() if k.startswith("inferplane")}
    routers = {k: v for k, v in figures.items() if k.startswith(("sglang-router", "vllm-router"))}
    if not ours:
        return ["- overhead: no inferplane row"]
    name, (calls, ratio) = max(ours.items(), key=lambda kv: kv[1][0])
    out = []
    if routers:
        peer, (p_calls, p_ratio) = max(routers.items(), key=lambda kv: kv[1][0])
        for what, mine, theirs, fmt in (
            ("req/s", calls, p_calls, ".0f"),
            ("ratio to direct", ratio, p_ratio, ".3f"),
        ):
            share = mine / theirs if theirs else 0.0
            verdict = "PASS" if share >= ROUTER_SHARE else "MISS"
            out.append(
                f"- {verdict}: {name} vs {peer} by {what}: {mine:{fmt}} vs {theirs:{fmt}} = "
                f"{share:.2f}x (target >= {ROUTER_SHARE}x)"
            )
    lite = figures.get("litellm")
    if lite is not None:
        multiple = calls / lite[0] if lite[0] else float("inf")
        verdict = "PASS" if multiple >= LITELLM_MULTIPLE else "MISS"
        out.append(
            f"- {verdict}: {name} vs litellm by req/s: {calls:.0f} vs {lite[0]:.0f} = "
            f"{multiple:.0f}x (target >= {LITELLM_MULTIPLE:.0f}x)"
        )
    return out


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
