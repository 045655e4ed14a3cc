"""``inferplane top``: the dashboard's numbers in a terminal, for people who live in a shell.

Polls a gateway's ``/v1/stats`` and ``/metrics`` (the same two sources as ``/dashboard``) and
redraws, in place, the fleet totals (cost per successful task, spend, tasks, goodput), one row
per endpoint (model, GPU, price, state, in flight, queue, KV use, busy share, spend), rejects
and retries by reason and the top workflows by spend. ``--once`` prints one frame and exits
(scripts, tests). Registered into the top-level parser through ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "fetch", "reason_counts", "register", "render"]

_REASON_RE = r'^{name}_total\{{reason="([^"]*)"\}} (\S+)$'


def register(subparsers: Any) -> None:
    top = subparsers.add_parser("top", help="a live terminal view of a running gateway")
    top.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    top.add_argument("--key", default=None, help="API key (when the gateway checks keys)")
    top.add_argument("--every", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(func=_top)


@dataclass(frozen=True, slots=True)
class Frame:
    """One poll: the stats body, the metrics text, and goodput since the previous poll."""

    stats: Mapping[str, Any]
    metrics: str
    goodput_tasks_per_s: float | None = None


def reason_counts(metrics: str, name: str) -> dict[str, float]:
    """``{reason: count}`` of a counter labelled by ``reason`` in Prometheus text."""
    pattern = re.compile(_REASON_RE.format(name=re.escape(name)), re.MULTILINE)
    return {m.group(1): float(m.group(2)) for m in pattern.finditer(metrics)}


def fetch(url: str, key: str | None, timeout_s: float = 5.0) -> tuple[dict[str, Any], str]:
    import orjson

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url.rstrip("/") + "/v1/stats", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        stats: dict[str, Any] = orjson.loads(r.read())
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
        metrics = r.read().decode("utf-8", "replace")
    return stats, metrics


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:.6f}"


def render(frame: Frame) -> Any:
    """A rich renderable of one frame."""
    from rich.console import Group
    from rich.table import Table

    stats, a = frame.stats, frame.stats["accounting"]
    tasks = a.get("tasks", {})
    kpis = Table.grid(padding=(0, 3))
    heads = ("cost/task", "spend", "tasks ok", "failed", "requests", "rejected", "in flight",
             "goodput/s")  # fmt: skip
    for _ in heads:
        kpis.add_column(justify="right")
    kpis.add_row(*(f"[dim]{h}[/]" for h in heads))
    goodput = frame.goodput_tasks_per_s
    kpis.add_row(
        _usd(a.get("cost_per_successful_task_usd")), _usd(a["fleet_spend_usd"]),
        str(tasks.get("success", 0)), str(tasks.get("failure", 0)), str(a["num_requests"]),
        str(a["num_rejected"]), str(stats["in_flight"]),
        "-" if goodput is None else f"{goodput:.3f}",
    )  # fmt: skip
    spend = {e["name"]: e for e in a.get("endpoints", ())}
    eps = Table(title="endpoints", title_justify="left", expand=True)
    for col in ("endpoint", "model", "GPU", "$/h", "state", "in flight", "running", "waiting",
                "KV", "busy", "spend"):  # fmt: skip
        eps.add_column(
            col, justify="right" if col not in ("endpoint", "model", "state") else "left"
        )
    for e in stats["endpoints"]:
        s = spend.get(e["name"], {})
        busy = s.get("busy_share")
        eps.add_row(
            e["name"], ",".join(e["models"]), e["gpu"], f"{e['price_per_hour_usd']:.2f}",
            _state(e["state"]), str(e["in_flight"]), str(e["num_running"]),
            str(e["num_waiting"]), f"{100 * e['kv_usage']:.0f}%",
            "-" if busy is None else f"{100 * busy:.0f}%", _usd(s.get("spend_usd")),
        )  # fmt: skip
    reasons = Table(title="rejects / retries by reason", title_justify="left")
    reasons.add_column("kind")
    reasons.add_column("reason")
    reasons.add_column("count", justify="right")
    for kind, name in (("reject", "inferplane_rejects"), ("retry", "inferplane_retries")):
        for reason, n in sorted(reason_counts(frame.metrics, name).items(), key=lambda x: -x[1]):
            reasons.add_row(kind, reason, f"{n:.0f}")
    wfs = Table(title="top workflows by spend", title_justify="left")
    for col in ("workflow", "tenant", "outcome", "steps", "cost"):
        wfs.add_column(col)
    for w in sorted(a.get("top_workflows", ()), key=lambda w: -w["cost_usd"])[:10]:
        steps = f"{w['steps_done']}" + (f"/{w['steps_expected']}" if w["steps_expected"] else "")
        wfs.add_row(w["workflow_id"], w["tenant"], w["outcome"], steps, _usd(w["cost_usd"]))
    return Group(kpis, eps, reasons, wfs)


def _state(state: str) -> str:
    color = {"ready": "green", "warming": "yellow", "cold": "yellow", "ejected": "red"}
    return f"[{color.get(state, 'dim')}]{state}[/]"


def _top(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    try:
        stats, metrics = fetch(args.url, args.key)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"inferplane top: cannot read {args.url}: {exc}", file=sys.stderr)
        return 1
    frame = Frame(stats, metrics)
    if args.once:
        console.print(render(frame))
        return 0
    with Live(render(frame), console=console, screen=False, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(max(0.2, args.every))
                try:
                    stats, metrics = fetch(args.url, args.key)
                except (urllib.error.URLError, OSError, ValueError):
                    continue
                frame = _next(frame, stats, metrics)
                live.update(render(frame), refresh=True)
        except KeyboardInterrupt:
            return 0


def _next(prev: Frame, stats: dict[str, Any], metrics: str) -> Frame:
    a0, a1 = prev.stats["accounting"], stats["accounting"]
    dt = a1["at_s"] - a0["at_s"]
    ok = a1["tasks"].get("success", 0) - a0["tasks"].get("success", 0)
    return Frame(stats, metrics, max(0, ok) / dt if dt > 0 else prev.goodput_tasks_per_s)
