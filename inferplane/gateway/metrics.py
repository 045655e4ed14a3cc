"""The gateway's own Prometheus metrics (prefix ``inferplane_``), one registry per app.

Latency histograms per model and priority class (TTFT, time between tokens, end to end),
request and reject counters, token counters, per-endpoint state and in-flight gauges, the
fleet spend from the accountant, KV-event links and prefix-routing figures. Gauges are
refreshed when /metrics is scraped (``refresh_*``), so the request path only pays for a few
histogram observations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from inferplane.core.types import EndpointState
from inferplane.gateway.metric_series import (
    CounterChild,
    CounterSeries,
    HistogramChild,
    HistogramSeries,
)

_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
_TBT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: One (model, class)'s children: TTFT, TBT, e2e; prompt, cached, completion tokens.
_RequestSeries = tuple[
    HistogramChild, HistogramChild, HistogramChild, CounterChild, CounterChild, CounterChild
]
_KV_KINDS = ("messages", "events_applied", "gaps", "gaps_healed", "messages_lost", "clears")


class GatewayMetrics:
    """All gateway series, registered in a private registry (tests run many gateways)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Label children cached per key: ``labels()`` is the costly part of an observation.
        # Bounded: models and priorities come from the config, statuses from HTTP.
        self._series: dict[tuple[str, str], _RequestSeries] = {}
        self._requests: dict[tuple[str, str, str], CounterChild] = {}
        self._admission: dict[tuple[str, str, str], CounterChild] = {}
        self._request_series(r)
        self._fleet_series(r)
        self._routing_series(r)
        self._admission_series(r)

    def _request_series(self, r: CollectorRegistry) -> None:
        """Latency per model and class; requests, rejects, retries, fallbacks, tokens."""
        lp = ("model", "priority")
        self.ttft = HistogramSeries(
            "inferplane_ttft_seconds", "Time to first token.", lp, buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )  # fmt: skip
        self.tbt = HistogramSeries(
            "inferplane_tbt_seconds", "Time between streamed tokens.", lp,
            buckets=_TBT_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.e2e = HistogramSeries(
            "inferplane_e2e_seconds", "End-to-end request latency.", lp,
            buckets=_LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.requests = CounterSeries(
            "inferplane_requests", "Requests finished, by outcome.",
            ("model", "priority", "status"), registry=r,
        )  # fmt: skip
        self.rejects = CounterSeries(
            "inferplane_rejects", "Requests refused by the gateway, by reason.", ("reason",),
            registry=r,
        )  # fmt: skip
        self.retries = CounterSeries(
            "inferplane_retries", "Attempts re-sent to another endpoint.", ("reason",), r
        )
        self.fallbacks = CounterSeries(
            "inferplane_fallbacks", "Calls served by a fallback model of their route.",
            ("route", "model"), registry=r,
        )  # fmt: skip
        self.tokens = CounterSeries(
            "inferplane_tokens", "Tokens served, by kind (prompt, cached, completion).",
            ("model", "kind"), registry=r,
        )  # fmt: skip

    def _fleet_series(self, r: CollectorRegistry) -> None:
        """Endpoint states and in-flight calls, spend, tasks and cost per successful task."""
        self.endpoint_state = Gauge(
            "inferplane_endpoint_state", "1 for the endpoint's current state.",
            ("endpoint", "state"), registry=r,
        )  # fmt: skip
        self.endpoint_in_flight = Gauge(
            "inferplane_endpoint_in_flight", "Gateway requests outstanding per endpoint.",
            ("endpoint",), registry=r,
        )  # fmt: skip
        self.spend = Gauge(
            "inferplane_spend_usd", "Fleet spend since start, by category.", ("category",),
            registry=r,
        )  # fmt: skip
        self.tasks = Gauge(
            "inferplane_tasks", "Tasks (workflows and single calls) by outcome.", ("outcome",),
            registry=r,
        )  # fmt: skip
        self.cost_per_success = Gauge(
            "inferplane_cost_per_successful_task_usd", "Fleet spend / successful tasks.",
            registry=r,
        )  # fmt: skip

    def _routing_series(self, r: CollectorRegistry) -> None:
        """KV-event subscriptions and prefix routing."""
        self.kv_connected = Gauge(
            "inferplane_kv_events_connected", "1 while the KV-event subscription is connected.",
            ("endpoint",), registry=r,
        )  # fmt: skip
        self.kv_counts = Gauge(
            "inferplane_kv_events", "KV-event subscription counters, by kind.",
            ("endpoint", "kind"), registry=r,
        )  # fmt: skip
        self.prefix = Gauge(
            "inferplane_prefix", "Prefix routing: calls keyed, calls routed onto a cached "
            "prefix, tokens predicted cached vs reported by engines, index size.",
            ("kind",), registry=r,
        )  # fmt: skip

    def _admission_series(self, r: CollectorRegistry) -> None:
        """Admission decisions and queue, response cache, shared-state mode."""
        self.admission = CounterSeries(
            "inferplane_admission_decisions", "Admission decisions and queue exits: decision "
            "(admitted, queued, rejected, dispatched, expired, evicted, cancelled) and reason.",
            ("decision", "reason", "priority"), registry=r,
        )  # fmt: skip
        self.queue_time = HistogramSeries(
            "inferplane_admission_queue_seconds", "Time queued calls waited, by class and exit.",
            ("priority", "exit"), buckets=_LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "inferplane_admission_queue_depth", "Calls waiting in the gateway queue, by class.",
            ("priority",), registry=r,
        )  # fmt: skip
        self.cache = Gauge(
            "inferplane_response_cache", "Response cache: lookups by outcome, hits, stores, "
            "bytes served and USD saved since start.", ("kind",), registry=r,
        )  # fmt: skip
        self.state_mode = Gauge(
            "inferplane_state_mode", "1 for the shared state's current mode.", ("mode",),
            registry=r,
        )  # fmt: skip
        self.state_degradations = Gauge(
            "inferplane_state_degradations_total", "Times the shared state fell back to "
            "local mode, by reason.", ("reason",), registry=r,
        )  # fmt: skip
        self.state_counts = {
            name: Gauge(f"inferplane_state_{name}", text, registry=r)
            for name, text in (
                ("local_ops_total", "Operations served locally while shared state was away."),
                ("reconciles_total", "Times local state was replayed into the shared store."),
                ("journal_size", "Local operations waiting to be replayed."),
            )
        }

    def count_admission(self, decision: str, reason: str, priority: str) -> None:
        key = (decision, reason, priority)
        child = self._admission.get(key)
        if child is None:
            child = self._admission[key] = self.admission.labels(decision, reason, priority)
        child.inc()

    def count_request(self, model: str, priority: str, status: str) -> None:
        key = (model, priority, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(model, priority, status)
        child.inc()

    def observe_request(
        self,
        model: str,
        priority: str,
        status: str,
        ttft_s: float | None,
        tbt_s: list[float] | None,
        e2e_s: float,
        tokens: tuple[int, int, int],
    ) -> None:
        """One finished request: counters and histograms, through cached label children."""
        self.count_request(model, priority, status)
        series = self._series.get((model, priority))
        if series is None:
            series = self._series[(model, priority)] = (
                self.ttft.labels(model, priority),
                self.tbt.labels(model, priority),
                self.e2e.labels(model, priority),
                self.tokens.labels(model, "prompt"),
                self.tokens.labels(model, "cached"),
                self.tokens.labels(model, "completion"),
            )
        ttft, tbt, e2e, prompt, cached, completion = series
        if ttft_s is not None:
            ttft.observe(ttft_s)
        if tbt_s:
            for gap in tbt_s:
                tbt.observe(gap)
        e2e.observe(e2e_s)
        num_prompt, num_cached, num_completion = tokens
        if num_prompt:
            prompt.inc(num_prompt)
        if num_cached:
            cached.inc(num_cached)
        if num_completion:
            completion.inc(num_completion)

    def refresh_endpoints(self, states: Iterable[tuple[str, EndpointState, int]]) -> None:
        for name, state, in_flight in states:
            for s in EndpointState:
                self.endpoint_state.labels(name, s.value).set(1.0 if s is state else 0.0)
            self.endpoint_in_flight.labels(name).set(in_flight)

    def refresh_routing(
        self, kv_events: Mapping[str, Mapping[str, Any]], prefix: Mapping[str, Any]
    ) -> None:
        """KV-event links (``GatewayRouter.kv_event_status``) and prefix-hit figures."""
        for name, row in kv_events.items():
            self.kv_connected.labels(name).set(1.0 if row["state"] == "connected" else 0.0)
            for kind in _KV_KINDS:
                self.kv_counts.labels(name, kind).set(row[kind])
        for kind, value in prefix.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.prefix.labels(kind).set(value)
        for kind, value in prefix.get("index", {}).items():
            self.prefix.labels(f"index_{kind}").set(value)

    def refresh_spend(
        self, spend_usd: Mapping[str, float], tasks: Mapping[str, int], cost_per_success: float
    ) -> None:
        for category, usd in spend_usd.items():
            self.spend.labels(category).set(usd)
        for outcome, count in tasks.items():
            self.tasks.labels(outcome).set(count)
        self.cost_per_success.set(cost_per_success)

    def refresh_admission(self, depth: Mapping[str, int]) -> None:
        for priority, n in depth.items():
            self.queue_depth.labels(priority).set(n)

    def refresh_cache(self, stats: Mapping[str, Any]) -> None:
        """From ``ResponseCache.stats()``: lookups by outcome and the savings."""
        for status, n in stats.get("lookups", {}).items():
            self.cache.labels(f"lookups_{status}").set(n)
        for kind in ("stores", "hits_exact", "hits_semantic", "bytes_served", "cost_usd_saved"):
            self.cache.labels(kind).set(stats.get(kind, 0))

    def refresh_state(
        self,
        mode: str,
        modes: Iterable[str],
        degradations: Mapping[str, int],
        counts: tuple[int, int, int],
    ) -> None:
        """The shared state: one-hot mode, degradations by reason, local ops, reconciles and
        journal size (zeros for an in-memory store)."""
        for m in modes:
            self.state_mode.labels(m).set(1.0 if m == mode else 0.0)
        for reason, n in degradations.items():
            self.state_degradations.labels(reason).set(n)
        for gauge, n in zip(self.state_counts.values(), counts, strict=True):
            gauge.set(n)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
