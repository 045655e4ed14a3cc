"""Prometheus metrics of one emulated engine, under vLLM's names (REFERENCE §1).

Each engine owns a ``CollectorRegistry`` (many engines share a process). Gauges and
counters are read from ``EngineModel.stats()`` when /metrics is scraped, so the engine's
hot path does nothing for them; the four latency histograms are fed per request / per
token through a small bisect-based histogram (cheaper than prometheus_client's
``Histogram.observe`` on a path taken for every streamed token).

Every sample carries ``model_name`` (the served model name), like vLLM.

Units: histogram times are REAL seconds measured on the server's event loop, i.e. what
a gateway or a client observes. An engine run at time scale 10 therefore reports a TTFT
ten times the modelled GPU's; divide by the time scale to get modelled seconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from inferplane.engine.types import EngineState, EngineStats, FinishReason

# Bucket bounds as vLLM exports them (seconds).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LatencyHistogram:
    """A cumulative-on-export histogram: ``observe`` is one bisect and two adds."""

    __slots__ = ("_counts", "bounds", "count", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self._counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class EngineMetrics:
    """The /metrics of one engine; ``stats`` is called at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name = model_name
        self._stats = stats
        self.ttft = LatencyHistogram(TTFT_BUCKETS_S)
        self.inter_token = LatencyHistogram(ITL_BUCKETS_S)
        self.e2e = LatencyHistogram(REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = LatencyHistogram(REQUEST_LATENCY_BUCKETS_S)
        self.finished: dict[FinishReason, int] = dict.fromkeys(FinishReason, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def on_finished(self, reason: FinishReason) -> None:
        self.finished[reason] += 1

    def render(self) -> bytes:
        """The Prometheus text exposition of this engine."""
        rendered: bytes = generate_latest(self.registry)
        return rendered

    # prometheus_client's collector protocol
    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield from self._gauges(stats)
        yield from self._counters(stats)
        yield from self._histograms()

    def _gauges(self, stats: EngineStats) -> Iterator[Metric]:
        labels = [self.model_name]
        for name, doc, value in (
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
            ("vllm:num_requests_running", "Requests in the running batch.", stats.num_running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", stats.kv_usage),
            ("vllm:gpu_cache_usage_perc", "Older name of kv_cache_usage_perc.", stats.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(labels, float(value))
            yield gauge
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            labels=["model_name", "block_size", "num_gpu_blocks"],
        )
        info.add_metric([self.model_name, str(stats.block_size), str(stats.num_gpu_blocks)], 1.0)
        yield info
        state = GaugeMetricFamily(
            "inferplane:engine_state", "1 for the engine's current state.", labels=["state"]
        )
        for member in EngineState:
            state.add_metric([member.value], 1.0 if member is stats.state else 0.0)
        yield state

    def _counters(self, stats: EngineStats) -> Iterator[Metric]:
        labels = [self.model_name]
        s = stats
        for name, doc, value in (
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens queried.",
                s.prefix_cache_queries_tokens,
            ),
            ("vllm:prefix_cache_hits", "Prompt tokens found cached.", s.prefix_cache_hits_tokens),
            ("vllm:num_preemptions", "Cumulative preemptions.", s.num_preemptions),
            ("vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens_total),
            ("vllm:generation_tokens", "Generation tokens processed.", s.generation_tokens_total),
        ):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(labels, float(value))
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason, count in self.finished.items():
            success.add_metric([self.model_name, reason.value], float(count))
        yield success

    def _histograms(self) -> Iterator[Metric]:
        for name, doc, hist in (
            ("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Time between tokens.", self.inter_token),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e),
            ("vllm:request_queue_time_seconds", "Time spent in the queue.", self.queue_time),
        ):
            family = HistogramMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], hist.cumulative_buckets(), sum_value=hist.sum)
            yield family
