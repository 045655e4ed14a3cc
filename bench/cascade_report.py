"""The cascade benchmark's report: per-window series, wasted work, the table, PASS/MISS.

Split from ``bench/cascade.py`` (which runs the scenario) so each file stays readable; the
functions read the run's records and samples and the gateway's reliability counters.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from inferplane.engine.profiles import load_profile
from inferplane.gateway.priors import prior_from_profile

MODEL = "llama-3-8b"
GPU = "h100"


def _windows(run_: Any, t0: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    recs, width, out = run_.records, args.window_s, []
    for start in range(0, int(args.duration_s), int(width)):
        lo, hi = t0 + start, t0 + start + width
        arrived = [r for r in recs if lo <= r.start_s < hi]
        done = [r for r in recs if r.ok and lo <= r.end_s < hi]
        retries = sum(r.client_retries for r in arrived)
        load = [d for t, d in run_.load_samples if start <= t < start + width]
        out.append({
            "t_s": start, "goodput_per_s": round(len(done) / width, 2),
            "p99_ttft_ms": _pct([r.ttft_s for r in arrived if r.ok], 0.99),
            "client_retries_share": round(retries / max(1, len(arrived)), 3),
            "max_queue_per_engine": [max(w for w, _, _ in col) for col in zip(*load, strict=True)]
            if load else [],
        })  # fmt: skip
    return out


def _waste(run_: Any, recs: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Tokens the engines worked on beyond what the completed calls needed, in GPU-s."""
    generated = sum(c[0] for c in run_.counters.values())
    prefilled = sum(c[1] for c in run_.counters.values())
    completed = [r for r in recs if r.ok]
    needed_out = len(completed) * args.max_tokens
    prompt_tokens = prefilled / max(1, len(recs) + sum(r.client_retries for r in recs))
    wasted_out = max(0.0, generated - needed_out)
    wasted_in = max(0.0, prefilled - len(completed) * prompt_tokens)
    prior = prior_from_profile(load_profile(MODEL, GPU))  # real GPU time (time scale 1)
    running = [n for _, d in run_.load_samples for (_, n, _) in d if n > 0]
    batch = statistics.mean(running) if running else 1.0
    per_token_s = (prior.decode_base_s + prior.decode_per_seq_s * batch) / batch
    gpu_s = wasted_out * per_token_s + wasted_in / prior.prefill_tokens_per_s
    return {
        "engine_generated_tokens": round(generated), "needed_tokens": needed_out,
        "wasted_decode_tokens": round(wasted_out), "wasted_prefill_tokens": round(wasted_in),
        "mean_batch": round(batch, 2), "wasted_gpu_s": round(gpu_s, 3),
    }  # fmt: skip


def _saturated(run_: Any, names: list[str], skip: set[int]) -> list[str]:
    """Healthy engines that went past llm-d's saturation (waiting/5 or KV use/0.8 >= 1)."""
    out = []
    for i, name in enumerate(names):
        if i in skip:
            continue
        if any(max(d[i][0] / 5, d[i][2] / 0.8) >= 1.0 for _, d in run_.load_samples):
            out.append(name)
    return out


def summary(
    mode: str, run_: Any, counts: dict[str, int], t0: float, args: argparse.Namespace,
    names: list[str],
) -> dict[str, Any]:  # fmt: skip
    recs = run_.records
    crit = [r for r in recs if r.critical]
    gateway_retries = counts.get("retry_replay", 0) + counts.get("retry_resume", 0)
    hedges = counts.get("hedges", 0)
    client_retries = sum(r.client_retries for r in recs)
    interrupted = [r for r in recs if r.interrupted]
    return {
        "mode": mode,
        "calls": len(recs),
        "completed": sum(r.ok for r in recs),
        "critical_success": round(sum(r.ok for r in crit) / max(1, len(crit)), 4),
        "critical_first_try": round(
            sum(r.ok and r.client_retries == 0 for r in crit) / max(1, len(crit)), 4
        ),
        "retries_share": round((client_retries + gateway_retries + hedges) / max(1, len(recs)), 4),
        "client_retries": client_retries,
        "client_timeouts": sum(r.client_timeouts for r in recs),
        "gateway_retries": gateway_retries,
        "hedges": hedges,
        "hedge_wins": counts.get("hedge_wins", 0),
        "streams_cut_by_crash": run_.cut_by_crash,
        "gateway_resumed_streams": counts.get("resumptions", 0),
        "client_interrupted_calls": len(interrupted),
        "interrupted_completed": sum(r.ok for r in interrupted),
        "completed_with_token_errors": sum(r.ok and not r.tokens_ok for r in recs),
        "tokens_lost": sum(r.lost_tokens for r in recs if r.ok),
        "tokens_duplicated": sum(r.duplicated_tokens for r in recs if r.ok),
        "wasted_client_tokens": sum(r.wasted_tokens for r in recs),
        "ejections": _ejections(counts),
        **_slow_engine(run_, args, names),
        "healthy_engines_saturated": _saturated(run_, names, skip={0, 1}),
        "p50_ttft_ms": _pct([r.ttft_s for r in recs if r.ok], 0.5),
        "p99_ttft_ms": _pct([r.ttft_s for r in recs if r.ok], 0.99),
        **_waste(run_, recs, args),
        "windows": _windows(run_, t0, args),
        "gateway_counts": counts,
    }


def _slow_engine(run_: Any, args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """How fast the gateway stopped sending to the slowed engine (``names[0]``): attempts it
    got per second before, after the slowdown in all and until its breaker first opened."""
    slow, at_s = names[0], args.slow_at_s
    before = sum(1 for t, n in run_.dispatches if n == slow and t < at_s)
    after = [t for t, n in run_.dispatches if n == slow and t >= at_s]
    total_after = sum(1 for t, _ in run_.dispatches if t >= at_s)
    opened = next((t for t, state in run_.slow_states if t >= at_s and state != "closed"), None)
    return {
        "slow_attempts_per_s_before": round(before / max(at_s, 1e-9), 2),
        "slow_attempts_after": len(after),
        "slow_share_after": round(len(after) / max(1, total_after), 4),
        "slow_attempts_to_ejection": sum(1 for t in after if opened is None or t < opened),
        "slow_ejected_after_s": None if opened is None else round(opened - at_s, 1),
    }


def _ejections(counts: dict[str, int]) -> int:
    opened = ("consecutive_failures", "failure_rate", "latency_outlier", "probe_failed")
    return sum(counts.get(f"breaker_{trigger}", 0) for trigger in opened)


def _pct(values: list[float | None], q: float) -> int | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return round(vals[min(len(vals) - 1, int(q * len(vals)))] * 1000)


_KEYS = [
    "calls", "completed", "critical_success", "critical_first_try", "retries_share",
    "client_retries", "client_timeouts", "gateway_retries", "hedges", "hedge_wins",
    "streams_cut_by_crash", "gateway_resumed_streams", "client_interrupted_calls",
    "interrupted_completed", "completed_with_token_errors", "tokens_lost", "tokens_duplicated",
    "wasted_client_tokens", "engine_generated_tokens", "wasted_decode_tokens",
    "wasted_prefill_tokens", "wasted_gpu_s", "ejections", "slow_attempts_per_s_before",
    "slow_attempts_after", "slow_share_after", "slow_attempts_to_ejection",
    "slow_ejected_after_s", "healthy_engines_saturated",
    "p50_ttft_ms", "p99_ttft_ms",
]  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'metric':28s}" + "".join(f"{r['mode']:>14s}" for r in results)]
    for key in _KEYS:
        cells = [len(r[key]) if isinstance(r[key], list) else r[key] for r in results]
        lines.append(f"{key:28s}" + "".join(f"{c!s:>14s}" for c in cells))
    for r in results:
        lines += ["", f"[{r['mode']}] window  goodput/s  p99 TTFT ms  retries  max queue e0..e7"]
        for w in r["windows"]:
            queue = " ".join(f"{q:>2}" for q in w["max_queue_per_engine"])
            lines.append(
                f"      t={w['t_s']:>3}s {w['goodput_per_s']:>9} {w['p99_ttft_ms']!s:>12}"
                f" {w['client_retries_share']:>8}  {queue}"
            )
    return "\n".join(lines)


def targets(r: dict[str, Any]) -> list[str]:
    """One PASS/MISS line per issue-6 target for run ``r``."""
    healthy_sat = r["healthy_engines_saturated"]
    # Every stream the crash cut must reach its client whole, without the client seeing a
    # break (a client retry from scratch would not be a completed stream).
    streams_ok = (
        r["client_interrupted_calls"] == 0
        and r["tokens_lost"] == 0 and r["tokens_duplicated"] == 0
        and r["completed_with_token_errors"] == 0
    )  # fmt: skip
    rows = [
        (r["critical_success"] >= 0.99,
         f"critical task success {r['critical_success']:.2%} >= 99%"),
        (r["retries_share"] <= 0.10,
         f"retries (client + gateway + hedges) {r['retries_share']:.1%} of calls <= 10%"),
        (not healthy_sat, f"healthy engines past saturation: {healthy_sat or 'none'}"),
        (streams_ok,
         f"interrupted streams completed: {r['streams_cut_by_crash']} cut by the crash, "
         f"{r['gateway_resumed_streams']} resumed by the gateway, clients saw "
         f"{r['client_interrupted_calls']} break(s); tokens lost {r['tokens_lost']}, "
         f"duplicated {r['tokens_duplicated']}"),
    ]  # fmt: skip
    return [f"[{r['mode']}] {'PASS' if ok else 'MISS'}  {text}" for ok, text in rows]
