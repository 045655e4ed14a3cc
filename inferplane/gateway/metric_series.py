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
from typing import Generic, TypeVar

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


ChildT = TypeVar("ChildT", CounterChild, HistogramChild)


class _Series(Generic[ChildT]):
    """A labelled family: one child per label set, registered for collection."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], ChildT] = {}
        registry.register(self)

    def labels(self, *values: object) -> ChildT:
        key = _key(self.labelnames, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        for key, child in list(self._children.items()):
            self._add(family, list(key), child)
        return [family]

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError

    def _add(self, family: Metric, labels: list[str], child: ChildT) -> None:
        raise NotImplementedError


class CounterSeries(_Series[CounterChild]):
    """A labelled counter family: ``labels(*values).inc(n)``, exported as ``<name>_total``."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: CounterChild) -> None:
        assert isinstance(family, CounterMetricFamily)
        family.add_metric(labels, child.value)


class HistogramSeries(_Series[HistogramChild]):
    """A labelled histogram family: ``labels(*values).observe(v)``."""

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
        self.bounds = bounds
        self._les = [str(floatToGoString(b)) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _family(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: HistogramChild) -> None:
        assert isinstance(family, HistogramMetricFamily)
        total, cumulative = 0, []
        for le, n in zip(self._les, child.counts, strict=True):
            total += n
            cumulative.append((le, float(total)))
        family.add_metric(labels, cumulative, child.sum)
