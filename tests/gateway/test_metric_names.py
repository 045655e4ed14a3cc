"""The Grafana dashboard and the metrics table name what ``/metrics`` really exposes.

One live gateway (fake engines on loopback, the autoscale loop on) is driven through a
served call, a stream, a retried call, a queued call and two refusals; then ``/metrics`` is
scraped once and

* every ``inferplane_*`` series a PromQL ``expr`` of ``deploy/grafana/*.json`` selects has
  samples under that name (``_bucket``/``_sum``/``_count``/``_total`` are wire names, so
  they are matched as written), every label it matches or groups by is on those samples,
  and every ``label="value"`` it matches exactly occurs;
* the table of ``docs/metrics.md`` lists exactly the families the gateway declares (its
  ``# TYPE`` lines, which carry the wire names), each with its type.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from inferplane.gateway.observability_config import AutoscaleConfig
from tests.gateway.fakes import FakeEngine, fleet_config, running_gateway, serving, until
from tests.gateway.test_admission_wiring import _one_slot

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
METRICS_DOC = ROOT / "docs" / "metrics.md"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MAX_BODY = 4096
#: Labels Prometheus adds when it scrapes (not the gateway's).
SCRAPE_LABELS = frozenset({"job", "instance"})
_SELECTOR = re.compile(r"\b(inferplane_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_DOC_ROW = re.compile(r"^\| `(inferplane_[a-z0-9_]+)` \| ([a-z]+)")


@dataclass
class HoldingEngine(FakeEngine):
    """A fake engine whose modes come from a script shared by the fleet (then ``ok``); while
    ``hold`` is clear, calls wait before answering."""

    script: list[str] = field(default_factory=list)
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    seen: int = 0

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        self.mode = self.script.pop(0) if self.script else "ok"
        await self.hold.wait()
        return await super()._generate(request)


@dataclass(frozen=True)
class Exposition:
    """One scrape: the label sets of each sample name, and the declared families' types."""

    samples: dict[str, list[dict[str, str]]]
    families: dict[str, str]  # wire name (as on its ``# TYPE`` line) -> type

    @classmethod
    def parse(cls, text: str) -> Exposition:
        samples: dict[str, list[dict[str, str]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(dict(sample.labels))
        families = {}
        for line in text.splitlines():
            if line.startswith("# TYPE inferplane_"):
                _, _, name, kind = line.split()
                families[name] = kind
        return cls(samples, families)


def _autoscale() -> AutoscaleConfig:
    replica = {"tokens_per_s": 1000.0, "cold_start_s": 1.0, "price_per_hour_usd": 1.0}
    pool = {"model": "m", "gpus": ["h100"], "replica": {"h100": replica}}
    return AutoscaleConfig.model_validate({"enabled": True, "tick_s": 0.05, "pools": [pool]})


async def _post(s: aiohttp.ClientSession, url: str, body: Any = CHAT) -> int:
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status


async def _drive(engines: list[HoldingEngine], gw: Any, url: str, s: aiohttp.ClientSession) -> str:
    """Calls that make every dashboard series exist; returns the scrape after them."""
    for e in engines:
        e.hold.set()
    engines[0].script.append("error500")  # the first call fails once, then is retried
    assert await _post(s, url) == 200
    assert await _post(s, url, {**CHAT, "stream": True}) == 200
    too_big = {**CHAT, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    assert await _post(s, url, too_big) == 413
    assert await _post(s, url, {**CHAT, "model": "nope"}) == 404
    for e in engines:  # both slots taken, the third call queues at the gateway
        e.hold.clear()
    before = sum(e.seen for e in engines)
    busy = [asyncio.ensure_future(_post(s, url)) for _ in engines]
    await until(lambda: sum(e.seen for e in engines) == before + len(engines))
    queued = asyncio.ensure_future(_post(s, url))
    await until(lambda: bool(gw.gate.core.queue))
    for e in engines:
        e.hold.set()
    assert await asyncio.gather(*busy, queued) == [200, 200, 200]
    text = ""
    for _ in range(200):  # until the autoscale loop has published a decision
        async with s.get(url + "/metrics") as r:
            text = await r.text()
        if "\ninferplane_desired_replicas{" in text:
            break
        await asyncio.sleep(0.02)
    return text


@pytest.fixture(scope="module")
def exposition() -> Exposition:
    async def run() -> str:
        async with serving([HoldingEngine(name=f"e{i}") for i in range(2)]) as engines:
            shared: list[str] = []
            for e in engines:
                e.script = shared
            base = fleet_config(list(engines), max_body_bytes=MAX_BODY)
            config = _one_slot(base).model_copy(update={"autoscale": _autoscale()})
            async with running_gateway(config) as (gw, url), aiohttp.ClientSession() as s:
                return await _drive(engines, gw, url, s)

    return Exposition.parse(asyncio.run(run()))


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def _dashboard_exprs() -> list[tuple[str, str]]:
    return [(p.name, e) for p in DASHBOARDS for e in _exprs(json.loads(p.read_text()))]


def test_there_is_a_dashboard_with_queue_time_and_autoscaler_error_panels() -> None:
    exprs = " ".join(e for _, e in _dashboard_exprs())
    assert DASHBOARDS and "inferplane_admission_queue_seconds_bucket" in exprs
    assert "inferplane_autoscale_errors_total" in exprs


@pytest.mark.parametrize(("dashboard", "expr"), _dashboard_exprs())
def test_dashboard_series_are_exposed_with_their_labels(
    exposition: Exposition, dashboard: str, expr: str
) -> None:
    selected = _SELECTOR.findall(expr)
    assert selected, f"{dashboard}: no inferplane_ series in {expr}"
    grouped = {g.strip() for by in _BY.findall(expr) for g in by.split(",")} - {"le", ""}
    on_some: set[str] = set()
    for name, matchers in selected:
        rows = exposition.samples.get(name)
        assert rows, f"{dashboard}: {name} has no samples in /metrics (expr: {expr})"
        labels = {k for row in rows for k in row}
        on_some |= labels
        for label, op, value in _MATCHER.findall(matchers or ""):
            if label in SCRAPE_LABELS:
                continue
            assert label in labels, f"{dashboard}: {name} has no label {label!r}"
            if op == "=":
                seen = sorted({row.get(label, "") for row in rows})
                assert value in seen, f"{dashboard}: {name}{{{label}={value!r}}} not in {seen}"
    missing = grouped - SCRAPE_LABELS - on_some
    assert not missing, f"{dashboard}: grouped by {missing}, on none of {selected}"


def _documented() -> dict[str, str]:
    rows = (_DOC_ROW.match(line) for line in METRICS_DOC.read_text().splitlines())
    return {m.group(1): m.group(2) for m in rows if m}


def test_the_metrics_table_lists_exactly_the_exposed_families(exposition: Exposition) -> None:
    documented = _documented()
    assert len(documented) > 20
    assert sorted(set(documented) - set(exposition.families)) == [], "documented, not exposed"
    assert sorted(set(exposition.families) - set(documented)) == [], "exposed, not documented"
    wrong = {n: (t, exposition.families[n]) for n, t in documented.items()
             if exposition.families[n] != t}  # fmt: skip
    assert not wrong, f"(documented type, exposed type): {wrong}"
