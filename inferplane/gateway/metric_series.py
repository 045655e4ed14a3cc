"""Counters and histograms for the request path, exported through prometheus-client.

prometheus-client's ``Counter`` and ``Histogram`` take a lock and make several Python-level
calls per observation: about 26 interpreted calls per request in the gateway, the largest
share of what stayed interpreted once the call path was compiled. The gateway updates these
series from its one event-loop thread, so here an observation is plain arithmetic on a
slotted object (compiled with the call path), and prometheus-client's metric families are
built only when ``/metrics`` is scraped: the same names, labels, buckets and exposition
(``_total``, ``_bucket{le=...}``, ``_sum``, ``_count``) as its own classes give.

Only the event-loop thread may update a series (nothing else in the gateway does); a scrape
runs on that thread too, so it never sees half an observation.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["CounterChild", "CounterSeries", "HistogramChild", "HistogramSeries"]


class CounterChild:
    """One label set's count."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class HistogramChild:
    """One label set's bucket counts (not cumulative: bucket i holds bounds[i-1] < v <=
    bounds[i], the last one everything above the top bound) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # bisect_left: the first bound >= amount (prometheus counts v <= le)
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


def _key(labelnames: tuple[str, ...], values: Sequence[object]) -> tuple[str, ...]:
    if len(values) != len(labelnames):
        raise ValueError(f"expected {len(labelnames)} label values {labelnames}, got {values}")
    return tuple(str(v) for v in values)


class CounterSeries:
    """A labelled counter family: ``labels(*values).inc(n)``, exported as ``<name>_total``."""

    __slots__ = ("_children", "documentation", "labelnames", "name")

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: object) -> CounterChild:
        key = _key(self.labelnames, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = CounterChild()
        return child

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        return [family]


class HistogramSeries:
    """A labelled histogram family: ``labels(*values).observe(v)``."""

    __slots__ = ("_children", "_les", "bounds", "documentation", "labelnames", "name")

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram buckets must be distinct and ascending")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = bounds
        self._les = [str(floatToGoString(b)) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: object) -> HistogramChild:
        key = _key(self.labelnames, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramChild(self.bounds)
        return child

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            total, cumulative = 0, []
            for le, n in zip(self._les, child.counts, strict=True):
                total += n
                cumulative.append((le, float(total)))
            family.add_metric(list(key), cumulative, child.sum)
        return [family]
