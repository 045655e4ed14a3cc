"""The HTML report: summary tables and matplotlib plots embedded as base64 PNG.

One self-contained file (no scripts, no external assets) that opens anywhere: TTFT and
end-to-end CDFs per class, goodput and queue depth over time, KV usage per endpoint, spend
and cost per successful task over time, SLO attainment per class and rejections by reason,
each with one series per policy. matplotlib is imported lazily (it is slow to import) with
the non-interactive Agg backend.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

from inferplane.sim.records import Outcome, RunResult

_MAX_KV_LINES = 16  # more endpoints than this: plot the mean and the max instead
_SMOOTH_SAMPLES = 10
_MAX_CDF_POINTS = 300  # a CDF drawn from more points looks the same and draws slower


def _figure_png(fig: Any) -> str:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _subplots(n: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _spread(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), first and last included."""
    return [round(i * (n - 1) / (k - 1)) for i in range(k)]


def _cdfs(results: Sequence[RunResult], classes: Sequence[str], metric: str) -> str:
    fig, axes = _subplots(len(classes), f"{metric} CDF per class (successful calls)")
    for ax, cls in zip(axes, classes, strict=True):
        for run in results:
            values = sorted(
                v
                for r in run.records
                if r.source == cls and r.outcome is Outcome.SUCCESS
                for v in [r.ttft_s if metric == "TTFT" else r.e2e_s]
                if v is not None
            )
            if values:
                n = len(values)
                picks = range(n) if n <= _MAX_CDF_POINTS else _spread(n, _MAX_CDF_POINTS)
                xs = [values[i] for i in picks]
                ys = [(i + 1) / n for i in picks]
                ax.plot(xs, ys, drawstyle="steps-post", label=run.policy)
        ax.set_title(cls)
        ax.set_xlabel("seconds")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _figure_png(fig)


def _over_time(document: dict[str, Any], keys: Sequence[tuple[str, str]]) -> str:
    fig, axes = _subplots(len(keys), "over time")
    for ax, (key, label) in zip(axes, keys, strict=True):
        for name, run in document["policies"].items():
            ts = run["timeseries"]
            ys = [float("nan") if y is None else y for y in ts[key]]
            if key == "goodput_rps":
                ys = _smooth(ys, _SMOOTH_SAMPLES)
            ax.plot(ts["time_s"], ys, label=name)
        ax.set_title(label + (f" ({_SMOOTH_SAMPLES}-sample mean)" if key == "goodput_rps" else ""))
        ax.set_xlabel("simulated s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _figure_png(fig)


def _smooth(ys: list[float], n: int) -> list[float]:
    """Trailing moving average over n samples (goodput per sample window is spiky)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= n:
            total -= ys[i - n]
        out.append(total / min(i + 1, n))
    return out


def _kv(document: dict[str, Any]) -> str:
    policies = document["policies"]
    fig, axes = _subplots(len(policies), "KV cache usage per endpoint")
    for ax, (name, run) in zip(axes, policies.items(), strict=True):
        ts = run["timeseries"]
        kv: dict[str, list[float]] = ts["kv_usage"]
        if len(kv) <= _MAX_KV_LINES:
            for endpoint, ys in kv.items():
                ax.plot(ts["time_s"], ys, label=endpoint, linewidth=0.8)
            ax.legend(fontsize=6)
        else:
            cols = list(zip(*kv.values(), strict=True))
            ax.plot(ts["time_s"], [sum(c) / len(c) for c in cols], label="mean")
            ax.plot(ts["time_s"], [max(c) for c in cols], label="max")
            ax.legend(fontsize=7)
        ax.set_title(name)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    return _figure_png(fig)


def _bars(document: dict[str, Any], title: str, groups: Sequence[str], value: Any) -> str:
    fig, axes = _subplots(1, title)
    ax = axes[0]
    policies = list(document["policies"])
    width = 0.8 / max(1, len(policies))
    for j, name in enumerate(policies):
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, [value(name, g) for g in groups], width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], list(groups))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    return _figure_png(fig)


def _table(document: dict[str, Any]) -> str:
    head = "<tr><th>policy</th><th>SLO met</th><th>TTFT p90 s</th><th>e2e p90 s</th>"
    head += "<th>spend $</th><th>$ / successful task</th><th>tasks ok / failed / cut</th></tr>"
    rows = []
    for name, run in document["policies"].items():
        s, o = run["summary"], run["summary"]["overall"]
        t = s["tasks"]
        cells = [
            name, _pct(o["slo_attainment"]), _num(o["ttft_s"]["p90"]), _num(o["e2e_s"]["p90"]),
            _num(s["spend_usd"]), _num(s["cost_per_successful_task_usd"], 5),
            f"{t['success']} / {t['failure']} / {t['cut']}",
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render_html(document: dict[str, Any], results: Sequence[RunResult]) -> str:
    """The whole report as one HTML page."""
    classes = list(document["classes"])
    pol = document["policies"]
    reasons = sorted({k for run in pol.values() for k in run["summary"]["rejections"]})
    images = [
        ("Time to first token", _cdfs(results, classes, "TTFT")),
        ("End-to-end latency", _cdfs(results, classes, "e2e")),
        ("Goodput, queues and spend", _over_time(document, [
            ("goodput_rps", "goodput (SLO-met calls / s)"), ("num_waiting", "queued in engines"),
            ("num_in_flight", "calls in flight"), ("spend_usd", "fleet spend $"),
            ("cost_per_successful_task_usd", "$ per successful task"),
        ])),
        ("KV cache", _kv(document)),
        ("SLO attainment per class", _bars(
            document, "SLO attainment", classes,
            lambda p, c: pol[p]["summary"]["classes"][c]["slo_attainment"] or 0.0,
        )),
    ]  # fmt: skip
    if reasons:
        images.append(("Rejections by reason", _bars(
            document, "rejected attempts", reasons,
            lambda p, r: pol[p]["summary"]["rejections"].get(r, 0),
        )))  # fmt: skip
    body = "".join(
        f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>"
        for t, b in images
    )
    title = html.escape(f"inferplane simulation: {document['scenario']}")
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1600px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
        "img{max-width:100%}"
    )
    facts = html.escape(
        f"seed {document['seed']}, {document['duration_s']} s simulated, "
        f"{len(document['endpoints'])} endpoints, policies: {', '.join(pol)}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{style}</style></head><body><h1>{title}</h1><p>{facts}</p>"
        f"{_table(document)}{body}</body></html>\n"
    )
