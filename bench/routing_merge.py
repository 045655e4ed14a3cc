"""Merge ``bench/routing.py`` results taken in separate runs (one policy per lock hold on a
shared machine) into one result with one table and the targets' PASS/MISS lines.

    python bench/routing_merge.py OUT.json RUN1.json RUN2.json ... [--args-from 2]

Each run's rows keep their own figures; the merged file lists every part (its args, which
policies it gave and its uptime before and after). A policy present in several parts is
taken from the last one given. The title line comes from the args of part
``--args-from`` (1-based; default the last part), so every part should share the
workload, seed, rate, duration, time scale and fleet: the script refuses parts that differ
in any of those.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_report import table

#: Args every part must share for its rows to be comparable.
SAME = ("workload", "tp", "time_scale", "duration_s", "seed", "session_rate", "rate",
        "tenants", "prefix_words", "agent_steps", "agent_kinds", "agent_system_words",
        "tool_words", "tool_pause_s", "agent_max_tokens")  # fmt: skip


def merge(parts: list[dict[str, Any]], args_from: int = -1) -> dict[str, Any]:
    base = parts[args_from]["args"]
    for part in parts:
        differ = [k for k in SAME if part["args"].get(k) != base.get(k)]
        if differ:
            raise SystemExit(f"parts differ in {differ}")
    workloads: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, wl in part["workloads"].items():
            workloads.setdefault(name, {}).update(wl["results"])
    ns = argparse.Namespace(**base)
    return {
        "args": base,
        "parts": [_part(p) for p in parts],
        "uptime": parts[0].get("uptime"),
        "uptime_after": parts[-1].get("uptime_after"),
        "workloads": {
            name: {"results": results, "table": table(name, results, ns)}
            for name, results in workloads.items()
        },
    }


def _part(part: dict[str, Any]) -> dict[str, Any]:
    policies = {name: list(wl["results"]) for name, wl in part["workloads"].items()}
    return {"args": part["args"], "uptime": part.get("uptime"),
            "uptime_after": part.get("uptime_after"), "policies": policies}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("parts", nargs="+")
    p.add_argument("--args-from", type=int, default=0, help="1-based part; 0: the last")
    a = p.parse_args()
    parts = [json.loads(Path(f).read_text()) for f in a.parts]
    merged = merge(parts, a.args_from - 1 if a.args_from else -1)
    for wl in merged["workloads"].values():
        print("\n".join(wl["table"]))
    Path(a.out).write_text(json.dumps(merged, indent=2))


if __name__ == "__main__":
    main()
