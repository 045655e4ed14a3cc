"""Markdown report of the live overload bench next to its simulator twin (issue 5).

Reads a live results file (``bench/overload_live.py``) and, if given, the simulator twin's
(``bench/overload_live_sim.py``, same fleet, mix, seed and window) and writes: the setting
and what the 99% criterion means for the number of critical calls; per load, the per-class
table and the verdicts; a side-by-side of the judged figures live vs simulator; and, for
every policy but FCFS, the causes of its critical misses (``overload_trace``'s split).

    python bench/overload_report.py bench/results/overload-live-h4.json \
        --sim bench/results/overload-live-sim-h4.json --out bench/results/overload-live-h4.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overload

LOAD_ORDER = ("1x", "2x", "5x")
POLICY_ORDER = ("inferplane", "fcfs", "priority-shed")


def _ordered(doc: dict[str, Any]) -> dict[str, Any]:
    """Runs in load and policy order, only loads with a FCFS baseline."""
    runs: dict[str, Any] = {}
    for load in sorted(doc["runs"], key=lambda k: float(k.rstrip("x"))):
        r = doc["runs"][load]
        if "fcfs" in r:
            runs[load] = {p: r[p] for p in POLICY_ORDER if p in r}
    return {**doc, "runs": runs}


def tables(doc: dict[str, Any], wait_label: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        overload.print_tables(_ordered(doc), wait_label=wait_label)
    return buf.getvalue()


def _crit(s: dict[str, Any]) -> str:
    c = s["classes"]["chat-critical"]
    met = round((c["slo_attainment"] or 0.0) * c["ended"])
    return f"{100 * (c['slo_attainment'] or 0):.1f}% ({c['ended'] - met}/{c['ended']} missed)"


def side_by_side(live: dict[str, Any], sim: dict[str, Any] | None) -> str:
    head = ("load", "policy", "critical live", "critical sim", "tasks/GPU-h vs FCFS live",
            "sim", "cost vs FCFS live", "sim", "live targets", "sim targets")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for load, runs in _ordered(live)["runs"].items():
        for policy, s in runs.items():
            v = live["verdicts"][load][policy]
            t = sim["runs"].get(load, {}).get(policy) if sim else None
            sv = sim["verdicts"].get(load, {}).get(policy) if sim and t else None
            lines.append(
                f"| {load} | {policy} | {_crit(s)} | {_crit(t) if t else '-'} | "
                f"{_x(v['tasks_vs_fcfs'])} | {_x(sv['tasks_vs_fcfs']) if sv else '-'} | "
                f"{_x(v['cost_vs_fcfs'])} | {_x(sv['cost_vs_fcfs']) if sv else '-'} | "
                f"{_verdict(v, policy)} | {_verdict(sv, policy) if sv else '-'} |"
            )
    return "\n".join(lines) + "\n"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _verdict(v: dict[str, Any], policy: str) -> str:
    if policy == "fcfs":
        return "(baseline)"
    t = str(v["targets"])
    if t == "met":
        return "PASS (all met)"
    return "n/a (1x)" if t.startswith("n/a") else "MISS: " + t.removeprefix("missed: ")


def miss_causes(live: dict[str, Any]) -> str:
    """Per policy but FCFS: causes of its critical misses, and each miss's first attempt
    (endpoint, answer length asked, tokens received, client-seen TPOT)."""
    lines = []
    for load, runs in _ordered(live)["runs"].items():
        for policy, s in runs.items():
            if policy == "fcfs":
                continue
            misses = s.get("critical_misses", [])
            causes = Counter(m["cause"] for m in misses)
            firsts = [_first(m) for m in misses if m["attempts"]]
            if len(firsts) > 10:  # many: where they went
                ends = Counter(m["attempts"][0]["endpoint"] for m in misses if m["attempts"])
                firsts = [f"{n} on {ep}" for ep, n in sorted(ends.items())]
            lines.append(f"- {load} {policy}: {dict(causes) or 'none'}; first tries: "
                         f"{', '.join(firsts) or '-'}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _first(miss: dict[str, Any]) -> str:
    a = miss["attempts"][0]
    tokens = f"{a['tokens']}/{miss['max_tokens']} tok" if "tokens" in a else "?"
    tpot = f" at {1000 * a['tpot_s']:.0f} ms/tok" if a.get("tpot_s") else ""
    return f"{a['endpoint']} t={miss['arrival_s']:.0f}s {tokens}{tpot}"


def setting(live: dict[str, Any]) -> str:
    runs = [(load, p, s) for load, r in _ordered(live)["runs"].items() for p, s in r.items()]
    lines = [f"Window {live['duration_s']:g} s + drain, time scale {live['time_scale']:g}, "
             f"seed {live['seed']}, 1x = users_x {live['base_users_x']:g}, "
             f"{live['model']} on {', '.join(live['replicas'])}.", ""]  # fmt: skip
    for load, policy, s in runs:
        n = s["classes"]["chat-critical"]["ended"]
        lines.append(f"- {load} {policy}: commit {s.get('commit', '?')}, wall {s['wall_s']:.0f} s, "
                     f"1-min load at the end {s['load_avg_1m']:.2f}; {n} critical calls ended "
                     f"(99% allows {int(n * 0.01)} misses)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("live", type=Path)
    parser.add_argument("--sim", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--notes", type=Path, help="markdown to put after the title")
    args = parser.parse_args()
    live = json.loads(args.live.read_text(encoding="utf-8"))
    sim = json.loads(args.sim.read_text(encoding="utf-8")) if args.sim else None
    parts = ["# Live overload bench (issue 5)\n"]
    if args.notes:
        parts.append(args.notes.read_text(encoding="utf-8"))
    parts += ["## Setting\n", setting(live), "## Live, per class\n",
              tables(live, "TTFT p99 s"), "## Judged: live vs simulator twin\n",
              side_by_side(live, sim), "## Critical misses (live), by cause\n",
              miss_causes(live)]  # fmt: skip
    if sim:
        parts += ["## Simulator twin, per class\n", tables(sim, "queue p99 s")]
    args.out.write_text("\n".join(parts), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
