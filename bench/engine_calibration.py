"""Calibration of the engine model against cited vLLM measurements and the roofline.

For Llama-3-8B on H100, H200, A100 (80 GB SXM) and Llama-3-70B with tensor parallelism on
H100 (TP4) and H200 (TP2) it prints, and writes to bench/results/engine-calibration.json:

* prefill time of 1K and 4K tokens and decode step time at B=1 and B=64 (1K context each),
  from the performance model and from its roofline (MFU = 1, eta = 1, no overhead);
* TTFT and ITL at light load (one request, 1000 tokens in, 200 out), run through the
  whole EngineModel;
* saturated output throughput: 1000 ShareGPT-shaped requests offered at once, the way
  vLLM's serving benchmark runs with ``--request-rate inf``; also run on the roofline
  profile, the bound for the same scheduler and workload.

Checks (PASS/FAIL): within 25% of the cited measurement for 8B on H100 (saturation) and on
A100 (B=1 decode), and never faster than the roofline anywhere. The cited targets and why
they were chosen are printed with the table. Run: ``python bench/engine_calibration.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferplane.engine.model import EngineModel
from inferplane.engine.perf import PerfModel
from inferplane.engine.profiles import EngineProfile, load_profile
from inferplane.engine.types import EngineEvent, EngineRequest, RequestFinished, TokensGenerated

RESULTS = Path(__file__).parent / "results" / "engine-calibration.json"
SETUPS = [
    ("llama-3-8b", "h100"),
    ("llama-3-8b", "h200"),
    ("llama-3-8b", "a100"),
    ("llama-3-70b", "h100"),
    ("llama-3-70b", "h200"),
]
TOLERANCE = 0.25
NUM_SATURATION_REQUESTS = 1000

# Cited measurements (REFERENCE §2) and how they map onto our setups.
H100_SATURATION_TOK_S = 8088.0
H100_SATURATION_WHY = (
    "8B/H100 saturation target 8,088 out tok/s: vLLM v0.6.0 (multi-step scheduling, bf16, "
    "ShareGPT, 1xH100). Chosen over v0.5.4's 3,032 because current vLLM keeps v0.6's CPU "
    "overhead fixes (a 2025 vLLM V1 ShareGPT run of 1000 prompts reports 6,583, inside the "
    "same 25% band), and over MLPerf's 5,103 because that one is FP8."
)
A100_40G_B1_TOK_S = 75.0
A100_40G_BW, A100_80G_BW = 1.555e12, 2.039e12
A100_B1_TOK_S = A100_40G_B1_TOK_S * A100_80G_BW / A100_40G_BW
A100_B1_WHY = (
    f"8B/A100 B=1 target {A100_B1_TOK_S:.0f} tok/s: the cited 75 tok/s on A100-40G is 77% of "
    f"its 1.555 TB/s bandwidth bound; at the same efficiency the A100-80G SXM "
    f"(2.039 TB/s) gives 75 x 2.039/1.555 = {A100_B1_TOK_S:.0f} tok/s."
)
WORKLOAD_WHY = (
    "Saturation workload: ShareGPT-shaped, as vLLM's benchmarks use (1000 prompts; the "
    "ShareGPT V3 set averages ~230 prompt / ~200 output Llama-3 tokens; prompts <= 1024, "
    "prompt + output <= 2048): lognormal lengths (sigma 1.0) whose means after clipping land "
    "there, max_tokens = sampled length with ignore_eos, all offered at t=0. Throughput is "
    "output tokens / makespan (as vLLM reports it), so the long-output tail matters: other "
    "seeds of the same shape move it by about +-5%."
)


def roofline_profile(profile: EngineProfile) -> EngineProfile:
    """The same engine with an ideal GPU: the bound for the same scheduler and workload."""
    return dataclasses.replace(
        profile,
        mfu=1.0,
        eta=1.0,
        step_overhead_s=0.0,
        step_overhead_per_seq_s=0.0,
        tp_efficiency=1.0,
        allreduce_latency_s=0.0,
    )


def sharegpt_like(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) pairs shaped like vLLM's ShareGPT sampling."""
    shape: list[tuple[int, int]] = []
    while len(shape) < n:
        prompt = int(rng.lognormvariate(math.log(280) - 0.5, 1.0))
        output = int(rng.lognormvariate(math.log(212) - 0.5, 1.0))
        if prompt < 4 or output < 4 or prompt > 1024 or prompt + output > 2048:
            continue
        shape.append((prompt, output))
    return shape


def _prompt(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(16, 32_000) for _ in range(n))


def _run(model: EngineModel) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    t = model.next_event_time()
    while t is not None:
        events += model.advance(t)
        t = model.next_event_time()
    return events


def _latencies(events: list[EngineEvent]) -> tuple[list[float], list[float]]:
    """TTFTs (from t=0 submit) and inter-token gaps, over all requests."""
    last: dict[str, float] = {}
    ttft: list[float] = []
    itl: list[float] = []
    for e in events:
        if isinstance(e, TokensGenerated):
            if e.request_id in last:
                itl.append(e.time_s - last[e.request_id])
            else:
                ttft.append(e.time_s)
            last[e.request_id] = e.time_s
    return ttft, itl


def light_load(profile: EngineProfile) -> dict[str, float]:
    model = EngineModel(profile)
    model.submit(EngineRequest("one", _prompt(random.Random(1), 1000), 200, ignore_eos=True), 0.0)
    ttft, itl = _latencies(_run(model))
    return {"ttft_ms": ttft[0] * 1e3, "itl_ms": statistics.mean(itl) * 1e3}


def saturation(profile: EngineProfile, shape: list[tuple[int, int]]) -> dict[str, float]:
    rng = random.Random(2)
    model = EngineModel(profile)
    for i, (n_in, n_out) in enumerate(shape):
        model.submit(EngineRequest(f"s{i}", _prompt(rng, n_in), n_out, ignore_eos=True), 0.0)
    events = _run(model)
    done = [e for e in events if isinstance(e, RequestFinished)]
    makespan_s = max(e.time_s for e in done)
    out_tokens = sum(e.num_completion_tokens for e in done)
    ttft, itl = _latencies(events)
    return {
        "output_tok_s": out_tokens / makespan_s,
        "total_tok_s": (out_tokens + sum(e.num_prompt_tokens for e in done)) / makespan_s,
        "duration_s": makespan_s,
        "median_ttft_ms": statistics.median(ttft) * 1e3,
        "median_itl_ms": statistics.median(itl) * 1e3,
        "preemptions": float(model.stats().num_preemptions),
    }


def measure(profile: EngineProfile, shape: list[tuple[int, int]]) -> dict[str, Any]:
    perf, roof = PerfModel(profile), PerfModel.roofline(profile)
    kernels = {
        "prefill_1k_ms": (perf.prefill_s(1024), roof.prefill_s(1024)),
        "prefill_4k_ms": (perf.prefill_s(4096), roof.prefill_s(4096)),
        "decode_b1_ms": (perf.decode_step_s(1, 1024), roof.decode_step_s(1, 1024)),
        "decode_b64_ms": (perf.decode_step_s(64, 1024), roof.decode_step_s(64, 1024)),
    }
    row: dict[str, Any] = {"setup": profile.name, "tensor_parallel": profile.tensor_parallel}
    for key, (model_s, roof_s) in kernels.items():
        row[key] = model_s * 1e3
        row[key.replace("_ms", "_roofline_ms")] = roof_s * 1e3
    light, light_roof = light_load(profile), light_load(roofline_profile(profile))
    row.update(light)
    row.update({f"{k.replace('_ms', '')}_roofline_ms": v for k, v in light_roof.items()})
    row["saturation"] = saturation(profile, shape)
    row["saturation_roofline"] = saturation(roofline_profile(profile), shape)
    row["knobs"] = {
        k: getattr(profile, k)
        for k in ("mfu", "eta", "step_overhead_s", "step_overhead_per_seq_s", "tp_efficiency")
    }
    return row


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_setup = {r["setup"]: r for r in rows}
    out: list[dict[str, Any]] = []

    def within(name: str, value: float, target: float) -> None:
        err = value / target - 1.0
        out.append(
            {"check": name, "model": value, "cited": target, "error": err,
             "pass": abs(err) <= TOLERANCE}
        )  # fmt: skip

    within(
        "8B/H100 saturated out tok/s",
        by_setup["llama-3-8b@h100"]["saturation"]["output_tok_s"],
        H100_SATURATION_TOK_S,
    )
    within("8B/A100 B=1 decode tok/s", 1e3 / by_setup["llama-3-8b@a100"]["itl_ms"], A100_B1_TOK_S)
    for r in rows:
        slower = [r[k] >= r[k.replace("_ms", "_roofline_ms")] for k in r if k.endswith("k_ms")]
        slower += [r["decode_b1_ms"] >= r["decode_b1_roofline_ms"]]
        slower += [r["decode_b64_ms"] >= r["decode_b64_roofline_ms"]]
        slower += [r["ttft_ms"] >= r["ttft_roofline_ms"], r["itl_ms"] >= r["itl_roofline_ms"]]
        sat, bound = r["saturation"]["output_tok_s"], r["saturation_roofline"]["output_tok_s"]
        slower.append(sat <= bound)
        out.append(
            {"check": f"{r['setup']} never beats the roofline", "model": sat, "cited": bound,
             "error": sat / bound - 1.0, "pass": all(slower)}
        )  # fmt: skip
    return out


def _print(rows: list[dict[str, Any]], results: list[dict[str, Any]], mean_io: str) -> None:
    cols: list[tuple[str, str, Callable[[dict[str, Any]], object]]] = [
        ("setup", "{}", lambda r: r["setup"]),
        ("pf1K ms", "{:.1f}", lambda r: r["prefill_1k_ms"]),
        ("(roof)", "{:.1f}", lambda r: r["prefill_1k_roofline_ms"]),
        ("pf4K ms", "{:.1f}", lambda r: r["prefill_4k_ms"]),
        ("(roof)", "{:.1f}", lambda r: r["prefill_4k_roofline_ms"]),
        ("dec B1 ms", "{:.2f}", lambda r: r["decode_b1_ms"]),
        ("(roof)", "{:.2f}", lambda r: r["decode_b1_roofline_ms"]),
        ("dec B64 ms", "{:.2f}", lambda r: r["decode_b64_ms"]),
        ("(roof)", "{:.2f}", lambda r: r["decode_b64_roofline_ms"]),
        ("TTFT ms", "{:.1f}", lambda r: r["ttft_ms"]),
        ("ITL ms", "{:.2f}", lambda r: r["itl_ms"]),
        ("sat out tok/s", "{:.0f}", lambda r: r["saturation"]["output_tok_s"]),
        ("(roof)", "{:.0f}", lambda r: r["saturation_roofline"]["output_tok_s"]),
        ("sat p50 ITL ms", "{:.1f}", lambda r: r["saturation"]["median_itl_ms"]),
    ]
    table = [[h for h, _, _ in cols]] + [[f.format(get(r)) for _, f, get in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    print(f"\n{mean_io}\n")
    for c in results:
        verdict = "PASS" if c["pass"] else "FAIL"
        print(f"{verdict}  {c['check']}: model {c['model']:.1f} vs {c['cited']:.1f} "
              f"({c['error']:+.1%})")  # fmt: skip
    print(f"\n{H100_SATURATION_WHY}\n{A100_B1_WHY}\n{WORKLOAD_WHY}")


def main() -> int:
    shape = sharegpt_like(random.Random(0), NUM_SATURATION_REQUESTS)
    mean_in = statistics.mean(s[0] for s in shape)
    mean_out = statistics.mean(s[1] for s in shape)
    rows = [measure(load_profile(model, gpu), shape) for model, gpu in SETUPS]
    results = checks(rows)
    mean_io = (
        f"saturation workload: {len(shape)} requests, mean {mean_in:.0f} in / {mean_out:.0f} out"
    )
    _print(rows, results, mean_io)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "rows": rows,
        "checks": results,
        "workload": {"requests": len(shape), "mean_input": mean_in, "mean_output": mean_out},
        "targets": [H100_SATURATION_WHY, A100_B1_WHY, WORKLOAD_WHY],
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(c["pass"] for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
