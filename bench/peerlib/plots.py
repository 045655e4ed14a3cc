"""Plots of a scoreboard JSON (run with the matplotlib of the cache virtualenv).

    python bench/peerlib/plots.py bench/results/peers-<date>.json

Writes, next to the JSON, one PNG per metric: bars per workload, one bar per gateway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

METRICS = (
    ("goodput_tasks_s", "goodput (tasks within deadline / s)"),
    ("ttft_p90_s", "TTFT p90 (s)"),
    ("success_rate", "call success rate"),
    ("prefix_hit_rate", "prefix-cache hit rate"),
)


def main(path: Path) -> None:
    doc = json.loads(path.read_text())
    workloads = list(doc["workloads"])
    gateways: list[str] = []
    for w in workloads:
        for row in doc["workloads"][w]["rows"]:
            if row["gateway"] not in gateways:
                gateways.append(row["gateway"])
    width = 0.8 / max(1, len(gateways))
    for key, title in METRICS:
        fig, ax = plt.subplots(figsize=(10, 4))
        for gi, gateway in enumerate(gateways):
            xs, ys = [], []
            for wi, w in enumerate(workloads):
                row = next(
                    (r for r in doc["workloads"][w]["rows"] if r["gateway"] == gateway), None
                )
                if row is not None and row[key] is not None:
                    xs.append(wi + gi * width)
                    ys.append(row[key])
            ax.bar(xs, ys, width=width, label=gateway)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path.with_name(f"{path.stem}-{key}.png"), dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
