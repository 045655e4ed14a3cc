"""The report of the routing benchmark (``bench/routing.py``): one table per workload, the
per-policy detail lines (calls per engine, errors and 429s, sessions) and PASS/MISS for the
three targets of issue 4 (precise routing against the others)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from routing_client import KV_HIGH, KV_LOW

MODEL, GPU, TP, ENGINES = "llama-3-70b", "h100", 2, 8


def verdicts(results: dict[str, dict[str, Any]]) -> list[str]:
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
        oracle = pr["oracle_hit_rate"]
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


def _title(workload: str, args: argparse.Namespace) -> str:
    tp = getattr(args, "tp", TP)
    fleet = (f"{ENGINES} x {MODEL} on {tp}x{GPU} (emulated, time scale {args.time_scale:g}),"
             f" seed {args.seed}, {os.cpu_count()} CPUs")  # fmt: skip
    if workload == "prefix":
        return (f"prefix workload: {args.tenants} tenants x ~{args.prefix_words}-word prefix,"
                f" {args.rate:g} calls/s for {args.duration_s:g} s; {fleet}")  # fmt: skip
    return (f"agentic workload: {args.session_rate:g} sessions/s for {args.duration_s:g} s,"
            f" {args.agent_steps} steps, {args.agent_kinds} agent kinds x"
            f" ~{args.agent_system_words}-word system prompt, tool results {args.tool_words}"
            f" words, tool pause ~{args.tool_pause_s:g} s; {fleet}")  # fmt: skip


def table(workload: str, results: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1e3 * v:.0f}"

    lines = [
        _title(workload, args),
        f"{'policy':<14}{'TTFT p50 ms':>12}{'p90 ms':>9}{'p99 ms':>9}{'done/s':>8}"
        f"{'errors':>7}{'hit':>7}{'oracle':>7}{'LRU':>7}{'KV max':>7}{'spread':>7}{'imbal':>9}"
        f"{'lag':>6}",
    ]
    for policy, r in results.items():
        lines.append(
            f"{policy:<14}{ms(r['ttft_p50_s']):>12}{ms(r['ttft_p90_s']):>9}"
            f"{ms(r['ttft_p99_s']):>9}{r['completed_per_s']:>8.2f}{r['errors']:>7}"
            f"{r['prefix_hit_rate']:>7.1%}{r['oracle_hit_rate']:>7.1%}{r['lru_hit_rate']:>7.1%}"
            f"{r['kv_max_usage']:>7.0%}"
            f"{r['kv_spread_max']:>7.0%}{r['kv_imbalanced_samples']:>4}/{r['kv_samples']:<4}"
            f"{r['fleet_lag_mean']:>6.0%}"
        )
    for policy, r in results.items():
        lines.append(
            f"  {policy}: calls per engine {r['engine_requests']}, preemptions"
            f" {r['preemptions']}, uncached prefill tokens per engine max/mean"
            f" {_max_over_mean(r['engine_uncached_tokens']):.2f}"
        )
        if r["error_kinds"] or r["rejected_429"]:
            lines.append(
                f"  {policy}: errors {r['error_kinds']}; retried refusals {r['rejected_429']},"
                f" calls that succeeded on a retry {r['retried_ok']}"
            )
        routed = _routed(r.get("gateway_prefix") or {})
        if routed:
            lines.append(f"  {policy}: keyed calls vs the best prefix holder: {routed}")
        if r.get("endpoint_state_changes"):
            lines.append(f"  {policy}: endpoint state changes {r['endpoint_state_changes']}")
        counts = (r.get("gateway_prefix") or {}).get("reliability_counts")
        if counts:
            lines.append(f"  {policy}: reliability counts {counts}")
        for reason in r.get("breaker_reasons") or ():
            lines.append(f"  {policy}: breaker {reason}")
        if "sessions" in r:
            lines.append(
                f"  {policy}: {r['sessions_ok']}/{r['sessions']} sessions completed; failed at"
                f" step {r['sessions_failed_at_step']}"
            )
    return lines + verdicts(results)


def _routed(prefix: dict[str, Any]) -> str:
    """The gateway's ``routed_*`` counters (/v1/stats), and what it predicted cached."""
    counts = {k.removeprefix("routed_"): v for k, v in prefix.items() if k.startswith("routed_")}
    if not counts:
        return ""
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    predicted, prompt = prefix.get("predicted_cached_tokens"), prefix.get("reported_prompt_tokens")
    if predicted is not None and prompt:
        text += f"; index predicted {predicted / prompt:.1%} of prompt tokens cached"
    return text


def _max_over_mean(values: list[int]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 0.0
