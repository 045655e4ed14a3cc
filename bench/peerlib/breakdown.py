"""Where goodput goes: every offered task of a scoreboard cell put in one outcome (pure).

    python bench/peerlib/breakdown.py bench/results/cache/raw/overload-inferplane.json ...

A task succeeds when every call met its deadline; otherwise its first failing call (agents
stop there) says why, in this order:
* ``cut off``: still running at the end of the drain time;
* ``429``: finally rejected (after the client's retries);
* ``error``: another non-200 answer or no answer (connection refused or reset);
* ``timeout``: the client's own per-attempt timeout (cascade);
* ``broken``: the stream started and ended without ``[DONE]``;
* ``late, retried``: served, past its deadline, after at least one retry (time spent on
  rejected or failed attempts and Retry-After waits);
* ``late, queued``: served on the first attempt, past its deadline, and the wait for the
  first token took more than half the deadline (it queued: gateway or engine);
* ``late, slow decode``: served on the first attempt, past its deadline, but the first
  token came within half the deadline (the batch decoded too slowly).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

OUTCOMES = (
    "ok",
    "cut off",
    "429",
    "error",
    "timeout",
    "broken",
    "late, retried",
    "late, queued",
    "late, slow decode",
)


def _why(rec: dict[str, Any]) -> str:
    if rec["status"] == 429 and not rec["ok"]:
        return "429"
    if rec["timed_out"]:
        return "timeout"
    if rec["broken"]:
        return "broken"
    if not rec["ok"]:
        return "error"
    if rec["attempts"] > 1:
        return "late, retried"
    deadline = rec.get("deadline_s")
    ttft = rec["ttft_s"]
    if deadline is not None and ttft is not None and ttft > 0.5 * deadline:
        return "late, queued"
    return "late, slow decode"


def breakdown(result: dict[str, Any], tasks_offered: int) -> dict[str, int]:
    """Offered tasks by outcome (the keys of ``OUTCOMES``; they sum to ``tasks_offered``)."""
    fields = list(result["fields"])
    failing: dict[str, dict[str, Any]] = {}
    for values in result["records"]:
        rec = dict(zip(fields, values, strict=True))
        if not rec["in_deadline"] and rec["task_id"] not in failing:
            failing[rec["task_id"]] = rec
    counts: Counter[str] = Counter()
    for task_id, _kind, _priority, success in result["tasks"]:
        if success:
            counts["ok"] += 1
        elif task_id in failing:
            counts[_why(failing[task_id])] += 1
        else:
            counts["error"] += 1  # a failed task without a failing call: not expected
    counts["cut off"] += max(0, tasks_offered - sum(counts.values()))
    return {k: counts.get(k, 0) for k in OUTCOMES}


def by_priority(result: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Priority class -> (tasks ok, tasks finished) over the tasks that finished."""
    out: dict[str, tuple[int, int]] = {}
    for _task_id, _kind, priority, success in result["tasks"]:
        ok, done = out.get(priority, (0, 0))
        out[priority] = (ok + int(bool(success)), done + 1)
    return out


def breakdown_lines(cells: list[tuple[str, dict[str, int]]]) -> list[str]:
    """A markdown table: one row per gateway, one column per outcome."""
    head = "| gateway | " + " | ".join(OUTCOMES) + " |"
    rule = "|---|" + "|".join("---" for _ in OUTCOMES) + "|"
    rows = [f"| {label} | " + " | ".join(str(c[k]) for k in OUTCOMES) + " |" for label, c in cells]
    return [head, rule, *rows]


def main() -> None:
    cells = []
    for path in sys.argv[1:]:
        result = json.loads(Path(path).read_text())
        offered = len(result["tasks"]) + int(result.get("unfinished_tasks", 0))
        cells.append((Path(path).stem, breakdown(result, offered)))
        print(Path(path).stem, by_priority(result))
    print("\n".join(breakdown_lines(cells)))


if __name__ == "__main__":
    main()
