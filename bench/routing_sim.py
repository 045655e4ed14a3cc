"""The agentic routing workload of ``bench/routing.py`` in the simulator, for sweeping
routing knobs over seeds before spending live time (issue 4).

The scenario mirrors the live bench: 8 x Llama-3-70B on 2 x H100 (``--tp 2``, ~9K tokens of
KV each) or 4 x H100 (``--tp 4``), four agent kinds (one workload source each, so four
system prompts of ~1,200 tokens), 4-10 calls per session, tool results of ~80-400 tokens,
~24 output tokens, exponential tool pauses of ~1 s, ``--session-rate`` sessions/s over
``--duration-s``. Reported per policy and seed: TTFT p50/p90, the prompt tokens the
engines served from cache, and the KV balance of issue 4 (samples in the load window with
one engine above 90% KV and another under 30%).

    python bench/routing_sim.py [--seeds 7,8] [--set claim_uncached_weight=2,4,8]

``--set knob=v1,v2`` sweeps one ``routing`` config knob (dotted for nested keys, e.g.
``weights.kv_claim``); each value is one row per seed. Sim runs take seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

KV_HIGH, KV_LOW = 0.9, 0.3


def scenario_files(workdir: Path, args: argparse.Namespace, routing: dict[str, Any]) -> Path:
    """Write the fleet and scenario files (JSON is YAML); returns the scenario path."""
    endpoints = [
        {"name": f"e{i}", "url": f"http://127.0.0.1:{9100 + i}", "gpu": args.gpu,
         "tensor_parallel": args.tp, "price_per_hour_usd": 2.99 * args.tp, "region": "r",
         "models": ["llama-3-70b"]}
        for i in range(args.engines)
    ]  # fmt: skip
    fleet = {"gateway": {"auth": {"mode": "anonymous"}}, "endpoints": endpoints}
    if routing:
        fleet["routing"] = routing
    (workdir / "fleet.yaml").write_text(json.dumps(fleet))
    per_kind_per_h = args.session_rate * 3600.0 / args.kinds
    sources = [
        {"name": f"kind{k}", "kind": "agentic", "users": 1,
         "tasks_per_user_per_hour": per_kind_per_h, "calls_per_task": [4, 10],
         "system_prompt_tokens": 1200, "first_input_tokens": {"median": 45, "p99": 50},
         "tool_result_tokens": {"median": 230, "p99": 420},
         "output_tokens": {"median": 22, "p99": 24}, "tool_pause_s": 1.0,
         "priority": "standard", "slo": {"ttft_s": 2.0, "e2e_s": 60}}
        for k in range(args.kinds)
    ]  # fmt: skip
    scenario = {"name": "agentic-bench", "fleet": "fleet.yaml", "duration_s": args.duration_s,
                "drain_s": 30, "seed": 7, "policies": args.policies.split(","),
                "workload": sources}  # fmt: skip
    path = workdir / "scenario.yaml"
    path.write_text(json.dumps(scenario))
    return path


def summarise(policy: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """TTFT, cached share and KV balance of one policy's run."""
    overall = policy["summary"]["overall"]
    series = policy["timeseries"]
    times = series["time_s"]
    usages = list(series["kv_usage"].values())
    rows = [
        [u[i] for u in usages if i < len(u)] for i, t in enumerate(times) if 2.0 <= t <= duration_s
    ]
    imbal = sum(1 for r in rows if r and max(r) > KV_HIGH and min(r) < KV_LOW)
    return {
        "ttft_p50_s": overall["ttft_s"]["p50"],
        "ttft_p90_s": overall["ttft_s"]["p90"],
        "cached": overall.get("cached_prompt_share"),
        "imbal": imbal,
        "samples": len(rows),
        "kv_max": max((max(r) for r in rows if r), default=0.0),
    }


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def nested(knob: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    parts = knob.split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", default="7,8")
    p.add_argument("--session-rate", type=float, default=6.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--kinds", type=int, default=4)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--gpu", default="h100")
    p.add_argument("--policies", default="inferplane,round-robin")
    p.add_argument("--set", action="append", default=[], help="knob=v1,v2 (routing config)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    from inferplane.sim.cli import simulate

    points: list[dict[str, Any]] = [{}]
    for spec in args.set:
        knob, values = spec.split("=", 1)
        points = [{**pt, knob: parse_value(v)} for pt in points for v in values.split(",")]
    rows: list[dict[str, Any]] = []
    for point in points:
        routing: dict[str, Any] = {}
        for knob, value in point.items():
            _merge(routing, nested(knob, value))
        per_policy: dict[str, list[dict[str, Any]]] = {}
        for seed in (int(s) for s in args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                path = scenario_files(Path(tmp), args, routing)
                doc, _ = simulate(path, seed=seed)
            for name, pol in doc["policies"].items():
                row = {"point": point, "policy": name, "seed": seed,
                       **summarise(pol, args.duration_s)}  # fmt: skip
                rows.append(row)
                per_policy.setdefault(name, []).append(row)
                print(_line(row), flush=True)
        for name, rs in per_policy.items():
            print(_mean_line(point, name, rs), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def _line(r: dict[str, Any]) -> str:
    return (f"{json.dumps(r['point']):<40} {r['policy']:<12} seed {r['seed']}: p50"
            f" {_fmt(r['ttft_p50_s'])} p90 {_fmt(r['ttft_p90_s'])} cached {_fmt(r['cached'])}"
            f" imbal {r['imbal']}/{r['samples']} kvmax {r['kv_max']:.2f}")  # fmt: skip


def _mean_line(point: dict[str, Any], name: str, rs: list[dict[str, Any]]) -> str:
    def mean(key: str) -> float:
        vals = [r[key] for r in rs if r[key] is not None]
        return statistics.fmean(vals) if vals else float("nan")

    return (
        f"MEAN {json.dumps(point):<35} {name:<12} p90 {mean('ttft_p90_s'):.3f} cached"
        f" {mean('cached'):.3f} imbal {mean('imbal'):.1f}/{mean('samples'):.0f}"
    )


if __name__ == "__main__":
    main()
