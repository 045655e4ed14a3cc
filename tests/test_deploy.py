"""docs/metrics.md, the Grafana dashboard and the KEDA example agree on metric names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from inferplane.gateway.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"\binferplane_[a-z0-9_]+")


def _documented() -> set[str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `inferplane_")]
    return {line.split("`")[1] for line in rows}


def _base(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_grafana_dashboard_uses_only_documented_metrics() -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "inferplane-gateway.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    used = {_base(n) for e in exprs for n in _NAME.findall(e)}
    docs = {_base(n) for n in _documented()}
    assert used <= docs, used - docs
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for needed in ("inferplane_ttft_seconds", "inferplane_cost_per_successful_task_usd",
                   "inferplane_rejects", "inferplane_desired_replicas"):  # fmt: skip
        assert needed in used


def test_documented_names_cover_the_gateway_registry() -> None:
    """Every series the gateway's own registry defines is in the table."""
    metrics = GatewayMetrics()
    names = {m.name for m in metrics.registry.collect()}
    assert names, "no metrics registered"
    documented = _documented()
    for name in names:
        assert name in documented or f"{name}_total" in documented, name


def test_keda_example_reads_a_documented_metric() -> None:
    obj = yaml.safe_load((ROOT / "deploy" / "keda" / "scaledobject.yaml").read_text())
    assert obj["kind"] == "ScaledObject"
    (trigger,) = obj["spec"]["triggers"]
    (name,) = set(_NAME.findall(trigger["metadata"]["query"]))
    assert name in _documented()
    assert obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
