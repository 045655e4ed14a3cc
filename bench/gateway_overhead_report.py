"""The table and JSON of ``bench/gateway_overhead.py``: medians over rounds, per gateway.

A round holds the direct runs (``direct_rps``, ``direct_stream``) and, per gateway tag
(``w1``, ``w2``: that many workers; ``baseline``; ``asyncio``), its own runs and the direct
run at its half-saturation rate. Ratios are taken per round, then the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

STREAM_CHUNKS = 16  # the trivial backend's chunks per stream (gateway_overhead.STREAM_CHUNKS)


def _views(rounds: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """Each round as one gateway saw it: the direct runs with that gateway's runs."""
    return [
        {"direct_rps": r["direct_rps"], "direct_stream": r["direct_stream"], **r[tag]}
        for r in rounds
    ]


def summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over rounds of one gateway's views (see ``_views``)."""

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
        "gateway_cpu_share": med(
            lambda r: r["gateway_rps"]["gateway_cpu_us_per_req"] * r["gateway_rps"]["rps"] / 1e6
        ),
        "load_cpu_us_per_req_direct": med(lambda r: r["direct_rps"]["load_cpu_us_per_req"]),
        "load_cpu_us_per_req_gateway": med(lambda r: r["gateway_rps"]["load_cpu_us_per_req"]),
        "load_cpu_share_direct": med(lambda r: r["direct_rps"]["load_cpu_share"]),
        "load_cpu_share_gateway": med(lambda r: r["gateway_rps"]["load_cpu_share"]),
        "machine_busy_cores_direct": med(lambda r: r["direct_rps"]["machine_busy_cores"]),
        "machine_busy_cores_gateway": med(lambda r: r["gateway_rps"]["machine_busy_cores"]),
        "backend_cpu_us_per_req": med(lambda r: r["direct_rps"]["backend_cpu_us_per_req"]),
        "gateway_cpu_us_per_chunk": med(
            lambda r: r["gateway_stream"]["gateway_cpu_us_per_req"] / STREAM_CHUNKS
        ),
        "errors": float(
            sum(v["errors"] for r in rounds for v in r.values() if isinstance(v, dict))
        ),
    }


def _rows(label: str, s: dict[str, float]) -> list[str]:
    return [
        f"{label}",
        f"{'  non-stream requests/s':<34}{s['direct_rps']:>12.0f}{s['gateway_rps']:>12.0f}"
        f"{s['rps_ratio']:>15.2f}x",
        f"{'  stream chunks/s (16 per request)':<34}{s['direct_chunks_per_s']:>12.0f}"
        f"{s['gateway_chunks_per_s']:>12.0f}{s['chunks_ratio']:>15.2f}x",
        f"{'  p50 ms at {:.0f} req/s (half sat.)'.format(s['half_rate_rps']):<34}"
        f"{s['direct_p50_ms']:>12.2f}{s['gateway_p50_ms']:>12.2f}{s['added_p50_ms']:>+15.2f} ms",
        f"{'  p99 ms at half saturation':<34}{s['direct_p99_ms']:>12.2f}"
        f"{s['gateway_p99_ms']:>12.2f}{s['added_p99_ms']:>+15.2f} ms",
        f"{'  CPU us/request (backend; gateway)':<34}{s['backend_cpu_us_per_req']:>12.0f}"
        f"{s['gateway_cpu_us_per_req']:>12.0f}"
        f"{s['gateway_cpu_us_per_req'] / s['backend_cpu_us_per_req']:>15.2f}x",
        f"{'  load generator CPU us/request':<34}{s['load_cpu_us_per_req_direct']:>12.0f}"
        f"{s['load_cpu_us_per_req_gateway']:>12.0f}",
        f"{'  cores busy: load gen. | gateway':<34}{s['load_cpu_share_direct']:>12.2f}"
        f"{s['load_cpu_share_gateway']:>12.2f}{s['gateway_cpu_share']:>16.2f}",
        f"{'  machine cores busy (all users)':<34}{s['machine_busy_cores_direct']:>12.2f}"
        f"{s['machine_busy_cores_gateway']:>12.2f}",
    ]


def baseline_tag(i: int) -> str:
    """The tag of the ``i``-th ``--baseline-src`` tree: baseline, baseline2, ..."""
    return "baseline" if i == 0 else f"baseline{i + 1}"


def _label(tag: str) -> str:
    if tag.startswith("w"):
        n = int(tag[1:])
        return f"gateway, {n} worker{'s' if n > 1 else ''} (uvloop)"
    if tag.startswith("baseline"):
        return f"{tag} gateway (--baseline-src #{tag[8:] or 1})"
    return {"asyncio": "1 worker, asyncio loop"}[tag]


def _judged(args: argparse.Namespace) -> str:
    """The tag the targets are judged on: as many workers as cores when measured (the Rust
    routers run a thread per core), else the most workers measured."""
    cores = os.cpu_count() or 1
    counts = [n for n in args.workers if n <= cores] or list(args.workers)
    return f"w{max(counts)}"


def report(
    rounds: list[dict[str, Any]], asyncio_round: dict[str, Any], args: argparse.Namespace
) -> None:
    """Print the table; write the JSON (summary per gateway, every round, the table)."""
    tags = [f"w{n}" for n in args.workers]
    tags += [baseline_tag(i) for i in range(len(args.baseline_src))]
    sums = {tag: summary(_views(rounds, tag)) for tag in tags}
    if asyncio_round:
        sums["asyncio"] = summary(_views([asyncio_round], "asyncio"))
    lines = [
        f"gateway overhead ({args.rounds} interleaved rounds, {args.duration_s:g} s runs, "
        f"{args.concurrency} concurrent, {os.cpu_count()} CPUs; medians)",
        f"{'metric':<34}{'direct':>12}{'gateway':>12}{'ratio / added':>16}",
    ]
    for tag, s in sums.items():
        lines += _rows(_label(tag), s)
    for i, src in enumerate(args.baseline_src):
        lines.append(f"  ({baseline_tag(i)}: {src}, {args.workers[0]} worker(s))")
    judged = _judged(args)
    s = sums[judged]
    lines.append(
        f"targets on {_label(judged)}: ratio >= 0.5 "
        f"({'PASS' if s['rps_ratio'] >= 0.5 else 'FAIL'}), added p50 < 2 ms "
        f"({'PASS' if s['added_p50_ms'] < 2.0 else 'FAIL'}); "
        f"errors: {sum(x['errors'] for x in sums.values()):.0f}"
    )
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"summary": sums[judged], "judged_on": judged, "summaries": sums, "rounds": rounds,
           "asyncio_round": asyncio_round, "table": lines}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2))
